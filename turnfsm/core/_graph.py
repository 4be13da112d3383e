"""The checks of a machine's graph, on the entries that resolved.

Reachability, dead ends, (phase, trigger) groups that can fall through,
termination (every cycle bounded), model calls and compaction passes that
skip their limits, and phases `run_cancelled` cannot stop.

Each problem is reported with its subject: the phase it is about (for its
line in ``[states]``) or the transition (for its ``[[transitions]]`` entry).
The spec may be partial (the loader leaves out what did not resolve): an
unknown `initial` is an empty one, and skips the reachability check.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Final, TypeAlias

from turnfsm.core._spec import MachineSpec, TransitionSpec

__all__ = ["SHOWN_STEPS", "Report", "check_graph", "checks_first", "reachable"]

Report: TypeAlias = Callable[[str, str | TransitionSpec], None]
"""Takes a problem's message and its subject: a phase's name or a transition."""

COMPACTION_FEEDS: Final = frozenset({"compaction_result", "compaction_noop"})
_RESULT: Final = "compaction_result"
_COUNTERS: Final = {"has_output_retries_left": "record_rejection"}
"""A retry counter's guard -> the action that spends it (nothing resets one)."""

_COUNTERS_IN_A_ROW: Final = {"has_overflow_retries_left": "count_overflow"}
"""A guard on a count in a row -> the action that spends it.

A reply starts such a count again (the reducers in `_RESETS_PASSES`), so
it bounds only the cycles with no reply, as the compaction limit does.
"""


def reachable(spec: MachineSpec) -> tuple[set[str], dict[str, set[str]]]:
    """The phases reachable from `initial` (none if it is unknown), and the exits.

    A phase's exits are the phases its transitions go to, but on
    `run_cancelled`, which every live phase has (a phase that only a cancel
    leaves is a dead end). A phase is reached by any transition, a wildcard's
    too (a fail phase of its own that only a cancel enters).
    """
    edges: dict[str, set[str]] = {p: set() for p in spec.phases}
    moves: dict[str, set[str]] = {p: set() for p in spec.phases}
    for t in spec.transitions:
        if t.dest is not None:
            for src in t.sources:
                moves[src].add(t.dest)
                if t.trigger != "run_cancelled":
                    edges[src].add(t.dest)
    if spec.initial not in edges:
        return set(), edges
    seen = {spec.initial}
    stack = [spec.initial]
    while stack:
        for nxt in moves[stack.pop()] - seen:
            seen.add(nxt)
            stack.append(nxt)
    return seen, edges


def check_graph(spec: MachineSpec, problem: Report, *, recorded: bool = False) -> None:
    """Reachability, dead ends, fall-through groups, termination and limits.

    A `recorded` machine (a session's log kept it) is not refused for a
    transition that never fires, and its overflow retries bound its cycles
    as they did when its runs began: its runs are read as they ran.
    """
    seen, edges = reachable(spec)
    has_initial = spec.initial in edges
    terminal = set(spec.terminal)
    for phase in spec.phases:
        if phase not in seen and has_initial:
            problem(f"phase {phase!r} is unreachable from {spec.initial!r}", phase)
        if phase not in terminal and not edges[phase]:
            problem(f"phase {phase!r} is a dead end: no transition leaves it", phase)
    groups: dict[tuple[str, str], list[TransitionSpec]] = {}
    for t in spec.transitions:
        for src in t.sources:
            groups.setdefault((src, t.trigger), []).append(t)
    for (src, trigger), group in groups.items():
        if all(t.is_guarded for t in group):
            problem(
                f"phase {src!r} on {trigger!r} can fall through: end the group "
                "with a transition without conditions",
                group[-1],
            )
    if not recorded:
        _check_never_fires(groups, problem)
    _check_termination(spec, groups, problem, recorded=recorded)
    _check_model_calls(spec, groups, problem, recorded=recorded)
    _check_compaction_counts(spec, groups, problem, recorded=recorded)
    _check_cancellation(spec, groups, problem)


def _check_never_fires(
    groups: Mapping[tuple[str, str], Sequence[TransitionSpec]], problem: Report
) -> None:
    """Report each transition that an earlier one without conditions shadows.

    For one phase and one trigger the first passing transition wins, so one
    after a transition without conditions never fires there; it is reported
    when that holds in every phase it names (a wildcard after a transition
    for one phase still fires in the others).
    """
    shadowed: dict[int, tuple[TransitionSpec, list[tuple[str, TransitionSpec]]]] = {}
    for (src, _trigger), group in groups.items():
        first = next((t for t in group if not t.is_guarded), None)
        if first is None:
            continue
        for t in group[group.index(first) + 1 :]:
            shadowed.setdefault(id(t), (t, []))[1].append((src, first))
    for t, where in shadowed.values():
        if len(where) < len(t.sources):
            continue  # it fires in some phase it names
        src, first = where[0]
        into = f"into {first.dest!r}" if first.dest is not None else "staying there"
        problem(
            f"phase {src!r} on {t.trigger!r}: this transition never fires, as the"
            f" one without conditions before it ({into}) takes every"
            f" {t.trigger!r} there: move it before that one, or remove it",
            t,
        )


# A model call is only ever made on a fresh size: right after a measurement
# that checked the turn limit and the emergency line first, or right after a
# compaction pass (whose result the manager fitted under the window). A
# measurement never compacts once the compaction passes are spent: an earlier
# transition fails the run first, or the compaction is `unless` the limit.
_SIZED_TRIGGERS: Final = frozenset({"measured", "compaction_result"})
_EMERGENCY: Final = "is_over_emergency_line"
_TURN_LIMIT: Final = "is_turn_limit_reached"
_MEASURED_GUARDS: Final = (
    (_TURN_LIMIT, "a terminal phase"),
    (_EMERGENCY, "a compact or terminal phase"),
)
_COMPACTION_LIMIT: Final = "is_compaction_limit_reached"
_COUNT_COMPACTION: Final = "count_compaction"
_NO_PROGRESS: Final = "is_no_progress"
_ADOPTS: Final = "record_compaction"
"""The action that makes a pass's result the conversation."""
_FLUSH: Final = "flush_inbox"
_INJECTED: Final = "message_injected"


def _phases_emitting(spec: MachineSpec, kind: str) -> set[str]:
    return {s.name for s in spec.states if s.decision == kind}


def _is_limit_checked(
    group: list[TransitionSpec], index: int, terminal: set[str]
) -> bool:
    """Whether `group[index]` is never taken once the compaction limit is reached.

    Either it is guarded `unless` the limit, or earlier transitions into a
    terminal phase take every such event first (`checks_first`).
    """
    return _COMPACTION_LIMIT in group[index].unless or checks_first(
        group, index, _COMPACTION_LIMIT, terminal, terminal
    )


def checks_first(
    group: list[TransitionSpec],
    index: int,
    guard: str,
    targets: set[str],
    terminal: set[str],
) -> bool:
    """Whether earlier transitions take every `guard` event before `group[index]`.

    One into `targets`, guarded by `guard` and by no condition the later one
    does not share, takes each such event, but for its unless guards the
    later one lacks: an event one of those holds on must be taken by another
    transition before `group[index]`, into `targets` or a terminal phase
    (the stock file fails the run on the emergency line once the passes are
    spent, then compacts on it `unless` they are; the two may come in either
    order). One narrowed further (the turn limit only while a message waits)
    lets the others through.
    """
    t = group[index]
    shared = {guard, *t.conditions}
    outs = targets | terminal

    def takes(e: TransitionSpec, into: set[str], also: str | None = None) -> bool:
        return (
            e.dest in into
            and guard in e.conditions
            and set(e.conditions) <= (shared if also is None else {also, *shared})
        )

    for e in group[:index]:
        if takes(e, targets) and all(
            any(
                takes(other, outs, also=u) and set(other.unless) <= set(t.unless)
                for other in group[:index]
            )
            for u in set(e.unless) - set(t.unless)
        ):
            return True
    return False


def _check_model_calls(
    spec: MachineSpec,
    groups: Mapping[tuple[str, str], list[TransitionSpec]],
    problem: Report,
    *,
    recorded: bool = False,
) -> None:
    calls = _phases_emitting(spec, "call_llm")
    compacts = _phases_emitting(spec, "compact")
    terminal = set(spec.terminal)
    for (src, trigger), group in groups.items():
        for index, t in enumerate(group):
            if (
                not recorded
                and t.dest is None
                and src in calls
                and trigger not in _SIZED_TRIGGERS
                # The run's start comes only to the initial phase.
                and (
                    src == spec.initial
                    if trigger == "run_started"
                    else trigger not in _EXTERNAL_TRIGGERS
                )
            ):
                # Staying makes the phase's decision again: another call (or,
                # on the run's start, its first).
                problem(
                    f"phase {src!r} on {trigger!r} stays in it for "
                    + ("its first" if trigger == "run_started" else "another")
                    + " model call, unmeasured: a model call must follow "
                    "'measured' or 'compaction_result' (give it a dest that "
                    'measures the request: a phase with decision = "measure")',
                    t,
                )
                continue
            if t.dest in compacts and trigger == "measured":
                if not _is_limit_checked(group, index, terminal):
                    problem(
                        f"phase {src!r} on 'measured' enters {t.dest!r} without "
                        f"first checking {_COMPACTION_LIMIT!r} (into a terminal phase)",
                        t,
                    )
                continue
            if t.dest not in calls:
                continue
            if trigger not in _SIZED_TRIGGERS:
                problem(
                    f"phase {src!r} on {trigger!r} enters {t.dest!r} unmeasured: a "
                    "model call must follow 'measured' or 'compaction_result'",
                    t,
                )
                continue
            if trigger != "measured":
                continue
            for guard, kind in _MEASURED_GUARDS:
                # Failing (or finishing) on the emergency line keeps the
                # request under it as well as a compaction does.
                targets = terminal | (compacts if guard == _EMERGENCY else set())
                if guard in t.unless:
                    continue  # it never fires on that event
                if not checks_first(group, index, guard, targets, terminal):
                    problem(
                        f"phase {src!r} on 'measured' enters {t.dest!r} without "
                        f"first checking {guard!r}: put before it a 'measured'"
                        f" transition with conditions = [{guard!r}] into {kind},"
                        f" or add {guard!r} to its unless",
                        t,
                    )


def _check_compaction_counts(
    spec: MachineSpec,
    groups: Mapping[tuple[str, str], list[TransitionSpec]],
    problem: Report,
    *,
    recorded: bool = False,
) -> None:
    """Every way on out of a compact phase counts the pass (max_compactions).

    Staying in it on a pass's outcome (a transition with no `dest`) makes
    another pass, and counts too. A `recorded` machine is read as its runs
    ran: one that stayed uncounted loaded before this rule.
    """
    compacts = _phases_emitting(spec, "compact")
    terminal = set(spec.terminal)
    for (src, trigger), group in groups.items():
        if src not in compacts:
            continue
        for t in group:
            if t.dest in terminal or _COUNT_COMPACTION in t.actions:
                continue
            if t.dest is None and (recorded or trigger in _EXTERNAL_TRIGGERS):
                continue
            where = (
                "stays in it for another pass"
                if t.dest is None
                else f"leaves for {t.dest!r}"
            )
            problem(
                f"phase {src!r} on {trigger!r} {where} without counting the "
                f"pass: add {_COUNT_COMPACTION!r} to its actions",
                t,
            )


def _check_cancellation(
    spec: MachineSpec,
    groups: Mapping[tuple[str, str], list[TransitionSpec]],
    problem: Report,
) -> None:
    """`run_cancelled` ends the run, unconditionally, from every live phase."""
    fails = _phases_emitting(spec, "fail")
    terminal = set(spec.terminal)
    missing = []
    for phase in spec.phases:
        group = groups.get((phase, "run_cancelled"), [])
        head = group[0] if group else None
        stops = head is not None and not head.is_guarded and head.dest in fails
        if phase not in terminal and not stops:
            missing.append(phase)
    if missing:
        problem(
            f"'run_cancelled' cannot stop the run in "
            f"{', '.join(map(repr, missing))}: give every non-terminal phase a "
            "'run_cancelled' transition without conditions into a fail phase "
            '(source = "*")',
            missing[0],
        )


# Triggers fed a bounded number of times from outside: once per run
# (run_started) or once per call of inject() / cancel(). A transition on one
# of them that stays in its phase is not a step of a cycle.
_EXTERNAL_TRIGGERS: Final = frozenset(
    {"run_started", "message_injected", "run_cancelled"}
)
_COUNTS_TURN: Final = "record_reply"
_RESETS_PASSES: Final = frozenset({"record_reply", "record_rejection"})
"""The reducers that start the counts in a row (passes, overflow retries) again.

Each records a reply and counts a turn.
"""

_CYCLE_STARTS: Final = 64
"""How many phases of a cycle the search for its shortest one starts from."""

SHOWN_STEPS: Final = 12
"""How many steps a problem names of an unbounded cycle, or of a way calls came."""

_Node: TypeAlias = tuple[str, bool]
"""A phase, and for a model-call phase whether it was entered on `measured`."""


def _check_termination(
    spec: MachineSpec,
    groups: Mapping[tuple[str, str], list[TransitionSpec]],
    problem: Report,
    *,
    recorded: bool = False,
) -> None:
    """Every cycle passes a model call, a retry counter or a decreasing measure.

    The bounds: a model call entered on `measured` (which checks the turn
    limit first, see `_check_model_calls`) and left by a reply that counts the
    turn, at most max_turns times; an edge guarded by a retry counter that
    nothing resets (the output re-asks) and that it spends; and, in a row,
    an edge guarded by the overflow retries that it spends (at most
    max_overflow_retries times), a compact phase entered after the
    compaction-limit check (every way on out of it counts the pass, at most
    max_compactions times), and a compaction feed after the no-progress
    guard, which strictly lowers the estimate. The counts in a row bound
    only the cycles with no reply: a reply starts them again, and adds to
    the estimate, so a cycle through one must be bounded by something else.
    The reply counts a turn, so a cycle through it that also takes a step
    on `measured` only under the turn limit (a model call entered on it,
    or a pass whose result goes straight to the model) ends at max_turns;
    any other is refused (`_reset_cycles`). A model call phase is split in two nodes,
    entered on `measured` or otherwise, so that only the first kind's
    counting exits are bounded.

    A `recorded` machine (a session's log kept it) bounds by its overflow
    retries as by a counter nothing resets: its runs may have counted them
    over the whole run, as turnfsm did before a reply started the count
    again (`RunOpened.overflow_retries_in_a_row`), and they replay so. A
    run that counts them in a row began only on a machine that passed the
    whole check (a `Driver` checks a recorded machine again), and every
    machine that passes it passes this one too.
    """
    counters, in_a_row = (
        ({**_COUNTERS, **_COUNTERS_IN_A_ROW}, {})
        if recorded
        else (_COUNTERS, _COUNTERS_IN_A_ROW)
    )
    calls = _phases_emitting(spec, "call_llm")
    compacts = _phases_emitting(spec, "compact")
    terminal = set(spec.terminal)
    edges: dict[_Node, list[tuple[str, _Node]]] = {}
    # The same graph with the limit-checked entries into a compact phase kept,
    # and the steps that start the count of passes again (a reply's).
    full: dict[_Node, list[tuple[str, _Node]]] = {}
    resets: list[tuple[_Node, str, _Node]] = []
    # Each step -> whether every transition taking it does so only under the
    # turn limit (see `_reset_cycles`).
    turn_checked: dict[tuple[_Node, str, _Node], bool] = {}
    # The graph with the compaction results after the no-progress guard kept,
    # and the steps that add to the conversation (see `_growing_cycles`).
    shrinking: dict[_Node, list[tuple[str, _Node]]] = {}
    grows: dict[tuple[_Node, str, _Node], str] = {}
    # Each step -> whether every transition taking it counts a turn (a reply).
    counts_turn: dict[tuple[_Node, str, _Node], bool] = {}
    for phase in spec.phases:
        full[(phase, False)] = []
        if phase in calls:
            full[(phase, True)] = []
    edges = {node: [] for node in full}
    shrinking = {node: [] for node in full}
    entered = {state.name: set(state.on_enter) for state in spec.states}
    unadopted: set[tuple[str, str]] = set()  # results let through, not adopted
    # The phases that take an injected message in at once, staying put: a
    # hook may inject one at every step, so entering one adds to the
    # conversation (the stay itself is fed from outside, no step of a cycle).
    takes_in = {
        src
        for (src, trigger), group in groups.items()
        if trigger == _INJECTED
        and any(t.dest is None and _FLUSH in t.actions for t in group)
    }
    for (src, trigger), group in groups.items():
        for index, t in enumerate(group):
            dest = t.dest
            if dest is None:
                if trigger in _EXTERNAL_TRIGGERS:
                    continue
                dest = src
            if dest in terminal or _spends_a_counter(t, counters):
                continue
            # Bounded by a count in a row: on a cycle with no reply.
            in_a_row_limited = _spends_a_counter(t, in_a_row) or (
                dest in compacts and _is_limit_checked(group, index, terminal)
            )
            # A pass the no-progress guard let through lowered the estimate
            # (the driver holds a pass of the user's to the sizes it says).
            # A result lowers it only once adopted: one left unrecorded comes
            # round at the same size, saving the same again, for ever.
            guarded = (
                src in compacts
                and trigger in COMPACTION_FEEDS
                and checks_first(group, index, _NO_PROGRESS, terminal, terminal)
            )
            shrinks = guarded and (
                recorded or trigger != _RESULT or _ADOPTS in t.actions
            )
            if guarded and not shrinks:
                unadopted.add((src, trigger))
            limited = in_a_row_limited or shrinks
            adds = _what_adds(t, src, dest, entered, takes_in, compacts)
            # Only a real entry on `measured` passed the turn-limit check.
            target = (dest, t.dest in calls and trigger == "measured")
            under_turn_limit = trigger == "measured" and _is_turn_checked(
                group, index, terminal
            )
            for node in [(src, False), (src, True)] if src in calls else [(src, False)]:
                step = (trigger, target)
                if node[1] and _COUNTS_TURN in t.actions:
                    continue
                if not limited and step not in edges[node]:
                    edges[node].append(step)
                # A no-op past the guard said it saved tokens, which a pass
                # that changed nothing says only once: it bounds any cycle.
                if not in_a_row_limited and not (shrinks and trigger != _RESULT):
                    if step not in shrinking[node]:
                        shrinking[node].append(step)
                    # Any transition taking the step may be the one that adds.
                    if adds and not recorded:
                        grows.setdefault((node, trigger, target), adds)
                key = (node, *step)
                turn_checked[key] = turn_checked.get(key, True) and under_turn_limit
                counts_turn[key] = counts_turn.get(key, True) and bool(
                    _RESETS_PASSES & set(t.actions)
                )
                if step not in full[node]:
                    full[node].append(step)
                    if _RESETS_PASSES & set(t.actions):
                        resets.append((node, trigger, target))
    order = {p: i for i, p in enumerate(spec.phases)}
    adjacent = {n: [d for _, d in out] for n, out in edges.items()}
    named = []
    for component in _cycles(adjacent):
        # The shortest cycle through one of the component's first phases: a
        # search from each is linear, so a cap keeps a cycle of thousands of
        # phases from costing a search per phase.
        starts = sorted(component, key=lambda n: (order[n[0]], n[1]))
        cycle = min(
            (_cycle_from(n, component, edges) for n in starts[:_CYCLE_STARTS]),
            key=lambda c: (len(c), [order[p] for p, _ in c]),
        )
        named.append((order[cycle[0][0]], cycle))
    named.extend(_reset_cycles(spec, full, resets, edges, turn_checked))
    growing = _growing_cycles(spec, shrinking, grows, edges, turn_checked, counts_turn)
    named.extend((order, cycle) for order, cycle, _ in growing)
    adding = {id(cycle): what for _, cycle, what in growing}
    for _, cycle in sorted(named):
        steps = [f"{phase} -[{trigger}]->" for phase, trigger in cycle]
        if len(steps) > SHOWN_STEPS:  # a generated machine's: its start is enough
            steps[SHOWN_STEPS:] = [f"... ({len(cycle) - SHOWN_STEPS} more steps) ->"]
        path = " ".join(steps)
        why = (
            f" ({adding[id(cycle)]}, undoing what a pass saved: bound it "
            f"another way, such as {_COMPACTION_LIMIT!r} checked on the way into "
            "its compact phase)"
            if id(cycle) in adding
            else ""
        )
        kept = next((step for step in cycle if step in unadopted), None)
        if kept is not None and not why:
            why = (
                f" (its {kept[1]!r} out of {kept[0]!r} passes the no-progress "
                f"guard without {_ADOPTS!r}: the next pass finds the same "
                "conversation and saves the same again)"
            )
        problem(
            f"cycle {path} {cycle[0][0]} is not bounded by a model call, a retry "
            f"counter or the no-progress guard{why}",
            cycle[0][0],
        )


def _is_turn_checked(
    group: list[TransitionSpec], index: int, terminal: set[str]
) -> bool:
    """Whether `group[index]` is never taken once the turn limit is reached."""
    t = group[index]
    return _TURN_LIMIT in t.unless or checks_first(
        group, index, _TURN_LIMIT, terminal, terminal
    )


def _spends_a_counter(t: TransitionSpec, counters: Mapping[str, str]) -> bool:
    """Whether `t` is taken only while one of `counters` is left, and spends it.

    Such a step is taken at most that counter's limit of times in a run (in
    a row, for `_COUNTERS_IN_A_ROW`). A guard alone bounds nothing: a step
    that does not spend its counter can be taken for ever.
    """
    return any(counters.get(guard) in t.actions for guard in t.conditions)


def _reset_cycles(
    spec: MachineSpec,
    full: Mapping[_Node, list[tuple[str, _Node]]],
    resets: Sequence[tuple[_Node, str, _Node]],
    bounded_elsewhere: Mapping[_Node, list[tuple[str, _Node]]],
    turn_checked: Mapping[tuple[_Node, str, _Node], bool],
) -> list[tuple[int, list[tuple[str, str]]]]:
    """The cycles bounded by a count in a row that a reply's reset leaves unbounded.

    A step that starts the counts in a row again, on a cycle of `full`,
    makes that cycle's compact entries, no-progress feeds and overflow
    retries no bound. The step counts a turn, so a cycle that also takes a
    `measured` step only under the turn limit (`turn_checked`: the entries
    into a model call on it, and any other whose group checks the limit
    first, such as a compaction whose result goes straight to the model) is
    bounded by max_turns: those steps are left out. The cycles without a
    step bounded in a row are found with `bounded_elsewhere`; the ones
    found here go through one, and are named from their resetting step.
    """
    order = {p: i for i, p in enumerate(spec.phases)}
    full = {
        node: [
            (trigger, dest)
            for trigger, dest in out
            if not dest[1] and not turn_checked[(node, trigger, dest)]
        ]
        for node, out in full.items()
    }
    components = _cycles({n: [d for _, d in out] for n, out in full.items()})
    where = {node: i for i, c in enumerate(components) for node in c}
    plain = _cycles({n: [d for _, d in out] for n, out in bounded_elsewhere.items()})
    named_already = {node: i for i, c in enumerate(plain) for node in c}
    named: list[tuple[int, list[tuple[str, str]]]] = []
    seen: set[int] = set()
    for src, trigger, dest in resets:
        home = where.get(src)
        if home is None or where.get(dest) != home or home in seen:
            continue
        if (trigger, dest) in bounded_elsewhere[src] and named_already.get(
            src, -1
        ) == named_already.get(dest, -2):
            continue  # on a cycle with no compact entry, named already
        seen.add(home)
        component = components[home]
        back = [] if dest == src else _cycle_from(dest, component, full, until=src)
        cycle = [(src[0], trigger), *back]
        named.append((order[src[0]], cycle))
    return named


def _what_adds(
    t: TransitionSpec,
    src: str,
    dest: str,
    entered: Mapping[str, set[str]],
    takes_in: set[str],
    compacts: set[str],
) -> str:
    """What `t` (out of `src`, into `dest`) adds to the conversation, in words.

    Empty when it adds nothing: no message of its signal, no tool results,
    no injected messages taken in (by its actions, its phase's `on_enter`,
    or a `message_injected` there that takes them in at once: `takes_in`),
    no messages of a step other than a compaction pass adopted as the
    conversation (a `compaction_result` of an effect of one's own, out of
    a phase that is not in `compacts`: it may put back what a pass cut).
    """
    if t.message is not None:
        return f"its {t.trigger!r} adds the signal's {t.message!r} to the conversation"
    if {"record_results", "record_review"} & set(t.actions):
        return f"its {t.trigger!r} adds tool results to the conversation"
    if _FLUSH in t.actions:
        return f"its {t.trigger!r} takes in the messages injected meanwhile"
    if t.dest is not None and _FLUSH in entered.get(t.dest, ()):
        return f"its {t.trigger!r} enters {t.dest!r}, which takes in injected messages"
    if dest in takes_in:
        return (
            f"its {t.trigger!r} enters {dest!r}, where {_INJECTED!r} takes in "
            "injected messages at once"
        )
    if _ADOPTS in t.actions and src not in compacts:
        return (
            f"its {t.trigger!r} adopts the messages of a step that is no "
            "compaction pass as the conversation"
        )
    return ""


def _growing_cycles(
    spec: MachineSpec,
    shrinking: Mapping[_Node, list[tuple[str, _Node]]],
    grows: Mapping[tuple[_Node, str, _Node], str],
    bounded_elsewhere: Mapping[_Node, list[tuple[str, _Node]]],
    turn_checked: Mapping[tuple[_Node, str, _Node], bool],
    counts_turn: Mapping[tuple[_Node, str, _Node], bool],
) -> list[tuple[int, list[tuple[str, str]], str]]:
    """The cycles bounded by the no-progress guard that add to the conversation.

    `shrinking` holds every step but those bounded by another count (retries,
    passes in a row), so its cycles are bounded by the passes after the
    no-progress guard, or by the turn limit. A step on one of them that adds
    a message (tool results, injected messages, a signal's message) raises
    the estimate those passes lowered, so the guard bounds nothing there: a
    pass that saves what the message added, then the message again. The turn
    limit still bounds a cycle that counts a turn (a reply) and takes a step
    only under the limit (`_reset_cycles`): a cycle is refused when it lacks
    one of the two, so it is looked for without each in turn. The cycles
    without a pass are found with `bounded_elsewhere`; the ones found here go
    through one, and are named from their adding step, with what it adds
    (`_what_adds`).
    """
    order = {p: i for i, p in enumerate(spec.phases)}
    plain = _cycles({n: [d for _, d in out] for n, out in bounded_elsewhere.items()})
    named_already = {node: i for i, c in enumerate(plain) for node in c}
    named: list[tuple[int, list[tuple[str, str]], str]] = []
    for without in (turn_checked, counts_turn):
        graph = {
            node: [(t, d) for t, d in out if not without[(node, t, d)]]
            for node, out in shrinking.items()
        }
        components = _cycles({n: [d for _, d in out] for n, out in graph.items()})
        where = {node: i for i, c in enumerate(components) for node in c}
        seen: set[int] = set()
        for (src, trigger, dest), what in grows.items():
            home = where.get(src)
            if (
                home is None
                or where.get(dest) != home
                or home in seen
                or (trigger, dest) not in graph[src]
            ):
                continue
            if named_already.get(src, -1) == named_already.get(dest, -2):
                continue  # on a cycle that no pass bounds, named already
            seen.add(home)
            back = (
                []
                if dest == src
                else _cycle_from(dest, components[home], graph, until=src)
            )
            named.append((order[src[0]], [(src[0], trigger), *back], what))
        if named:
            return named  # the first search's names: one per cycle
    return named


def _cycle_from(
    first: _Node,
    component: set[_Node],
    edges: Mapping[_Node, list[tuple[str, _Node]]],
    *,
    until: _Node | None = None,
) -> list[tuple[str, str]]:
    """A shortest path from `first` back to it (or to `until`), per step."""
    goal = first if until is None else until
    came_from: dict[_Node, tuple[_Node, str]] = {}
    queue = [first]
    for node in queue:
        for trigger, dest in edges[node]:
            if (
                dest in component
                and dest not in (first, goal)
                and dest not in came_from
            ):
                came_from[dest] = (node, trigger)
                queue.append(dest)
    last, via = next((n, t) for n in queue for t, d in edges[n] if d == goal)
    steps = [(last[0], via)]
    while last != first:
        last, via = came_from[last]
        steps.append((last[0], via))
    return steps[::-1]


def _cycles(edges: Mapping[_Node, list[_Node]]) -> list[set[_Node]]:
    """Return the strongly connected components that contain a cycle (Tarjan).

    Iterative, with an explicit stack of (node, its successors left), so a
    machine of thousands of phases in one cycle needs no deep recursion.
    """
    index: dict[_Node, int] = {}
    low: dict[_Node, int] = {}
    stack: list[_Node] = []
    on_stack: set[_Node] = set()
    out: list[set[_Node]] = []

    def enter(v: _Node) -> tuple[_Node, Iterator[_Node]]:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        return v, iter(edges[v])

    for root in sorted(edges):
        if root in index:
            continue
        work = [enter(root)]
        while work:
            v, successors = work[-1]
            for w in successors:
                if w not in index:
                    work.append(enter(w))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:  # every successor seen: v is done, as a return from visit(v)
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[v])
                if low[v] == index[v]:
                    out.extend(_component(v, stack, on_stack, edges))
    return out


def _component(
    v: _Node,
    stack: list[_Node],
    on_stack: set[_Node],
    edges: Mapping[_Node, list[_Node]],
) -> list[set[_Node]]:
    """Pop the component rooted at `v`; return it if it holds a cycle."""
    comp: set[_Node] = set()
    while True:
        w = stack.pop()
        on_stack.discard(w)
        comp.add(w)
        if w == v:
            break
    return [comp] if len(comp) > 1 or v in edges[v] else []
