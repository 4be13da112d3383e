"""The checks that a machine keeps what was said, and every step's outcome goes on.

A machine file decides where each event's messages join the run's pending
messages, and when pending is committed or dropped. These checks refuse a
machine that would lose what was said or stop a run on an outcome it has no
transition for:

- every outcome a built-in step can return has a transition out of the
  phase that asked for it (a run would otherwise stop there, on an event the
  machine does not take), and the initial phase takes ``run_started``;
- a phase that pauses takes an answer (a review or a signal);
- a transition on an event that brings messages records them, unless it
  fails the run (the reply, the tool results, the input, an injection);
- pending is committed only on the way into a finish phase, which always
  commits it; it is dropped only on the way into a fail phase; and injected
  messages join pending only where the next request is not built yet (a
  measuring phase), so a request in flight is the one the log records;
- a reply's tool calls are run before the run goes on: from a phase they
  reach unanswered (a review, a pause, an effect of the user's), only a
  run_tools phase or a fail phase follows, and an injected message never
  takes the run away from them but to fail it.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Collection, Mapping
from typing import Final

from turnfsm.core._graph import SHOWN_STEPS, Report, checks_first, reachable
from turnfsm.core._guards import GUARDS
from turnfsm.core._reducers import ACCEPTS
from turnfsm.core._spec import MachineSpec, TransitionSpec

__all__ = [
    "NO_ANSWERS",
    "OUTCOMES",
    "PLACED",
    "RECORDS",
    "check_conversation",
    "finishes_before_an_answer",
]

OUTCOMES: Final[Mapping[str, tuple[str, ...]]] = {
    "measure": ("measured",),
    "call_llm": ("model_replied", "context_overflowed", "model_failed"),
    "run_tools": ("tools_finished",),
    "compact": (
        "compaction_result",
        "compaction_noop",
        "compaction_overflowed",
        "compactor_failed",
        "compaction_circuit_opened",
    ),
}
"""A built-in decision -> the triggers of the events its step may return."""

RECORDS: Final[Mapping[str, tuple[str, str]]] = {
    "run_started": ("record_start", "the run's input"),
    "model_replied": ("record_reply", "the model's reply"),
    "output_rejected": ("record_rejection", "the rejected reply"),
    "tools_finished": ("record_results", "the tool results"),
    "tool_calls_reviewed": ("record_review", "the reviewer's results"),
    "message_injected": ("record_injection", "the injected message"),
}
"""A trigger whose event brings messages -> the reducer that keeps them."""

PLACED: Final[Mapping[str, tuple[str, str]]] = {
    "commit_pending": ("finish", "commits the run's messages"),
    "discard_pending": ("fail", "drops the run's messages"),
    "flush_inbox": ("measure", "adds the injected messages to the request"),
}
"""A reducer -> the kind of phase it may run on the way into, and what it does."""


def check_conversation(
    spec: MachineSpec, problem: Report, *, guessed: Collection[int] = ()
) -> None:
    """Refuse a machine that loses what was said or stops on a step's outcome.

    `guessed` are the transitions (by `id`) whose misspelt dest was read as
    the phase it is closest to: whether they end the run is only a guess.
    """
    kinds = {s.name: s.decision for s in spec.states}
    accepts: dict[str, set[str]] = {p: set() for p in spec.phases}
    for t in spec.transitions:
        for source in t.sources:
            accepts[source].add(t.trigger)
    _check_outcomes(spec, kinds, accepts, problem)
    # A phase of no kind (its decision is not a name) has its own problem.
    unknown = {s.name for s in spec.states if s.decision is None and s.effect is None}
    for t in spec.transitions:
        _check_records(t, kinds, problem)
        for reducer in t.actions:
            placed = PLACED.get(reducer)
            if placed is not None:
                into = {t.dest} if t.dest is not None else set(t.sources)
                if any(kinds.get(p) != placed[0] for p in into - unknown):
                    problem(_misplaced(reducer, placed), t)
    for state in spec.states:
        for reducer in state.on_enter:
            placed = PLACED.get(reducer)
            if (
                placed is not None
                and state.name not in unknown
                and state.decision != placed[0]
            ):
                problem(_misplaced(reducer, placed), state.name)
    _check_commits(spec, kinds, problem)
    _check_taken(spec, kinds, accepts, problem)
    _check_heard(spec, kinds, problem, guessed)
    _check_answered(spec, kinds, problem)
    told = _check_calls_run(spec, kinds, problem)
    _check_injections_wait(spec, kinds, problem, told)


_CALLS: Final = "has_tool_calls"
_ADOPTS: Final = "record_compaction"

_ENDS: Final = frozenset({"finish", "fail"})
"""The decisions of the phases that end a run."""


def _check_injections_wait(
    spec: MachineSpec,
    kinds: Mapping[str, str | None],
    problem: Report,
    told: Collection[int],
) -> None:
    """Refuse an injected message that moves a run on while its step is under way.

    A message may be injected while a phase's step (a model call, a pass,
    a batch of tools, an effect of yours) runs; the step's outcome then comes
    to the phase the message moved the run to, which does not take it, and
    the run would crash. A paused phase has no step under way (the message
    is its answer), and a phase that ends the run takes no outcome.
    """
    for t in spec.transitions:
        dest = t.dest
        if (
            t.trigger != "message_injected"
            or dest is None
            or kinds.get(dest) in _ENDS
            or id(t) in told  # a reply's calls left open: said as such
        ):
            continue
        moved = [
            p for p in t.sources if p != dest and kinds.get(p) not in ("pause", *_ENDS)
        ]
        if moved:
            problem(_injected_moves_on(moved[0], dest), t)


def _injected_moves_on(source: str, dest: str) -> str:
    return (
        f"phase {source!r} on 'message_injected' leaves for {dest!r} while its"
        " step is under way: the step's outcome would come to a phase that does"
        " not take it, and the run would crash; leave out its dest (the message"
        " waits in the inbox until the run measures again) or go to a fail phase"
    )


_LEAVES_CALLS_OPEN: Final = frozenset({"measure", "call_llm", "compact", "finish"})
"""The decisions the brain refuses to take with a reply's calls unanswered."""


def _check_answered(
    spec: MachineSpec, kinds: Mapping[str, str | None], problem: Report
) -> None:
    """A reply's tool calls go where they are answered (or the run fails).

    A transition on ``model_replied`` into a phase that measures, calls the
    model, compacts or finishes must be taken only on a reply without calls:
    ``has_tool_calls`` in its `unless`, or checked first by a transition into
    a phase that answers them (a run that got there with calls open fails).
    """
    fails = {p for p, k in kinds.items() if k == "fail"}
    answering = {p for p, k in kinds.items() if k not in _LEAVES_CALLS_OPEN}
    groups: dict[str, list[TransitionSpec]] = {}
    for t in spec.transitions:
        if t.trigger == "model_replied":
            for source in t.sources:
                groups.setdefault(source, []).append(t)
    for source, group in groups.items():
        for i, t in enumerate(group):
            into = t.dest or source
            if kinds.get(into) not in _LEAVES_CALLS_OPEN or _CALLS in t.unless:
                continue
            if any(
                g not in GUARDS
                for e in group[: i + 1]
                for g in (*e.conditions, *e.unless)
            ):
                break  # an unknown guard may be the check: one typo, one problem
            if checks_first(group, i, _CALLS, answering, fails):
                continue
            problem(
                f"phase {source!r} on 'model_replied' enters {into!r} with the"
                " reply's tool calls unanswered: put before it a transition on"
                f" 'model_replied' with conditions = [{_CALLS!r}] into a phase"
                " that answers them (a run_tools phase, or one that pauses for a"
                f" review), or add {_CALLS!r} to its unless",
                t,
            )


def _check_calls_run(
    spec: MachineSpec, kinds: Mapping[str, str | None], problem: Report
) -> set[int]:
    """A reply's tool calls are run (or the run fails) before the run goes on.

    A reply with calls may enter a phase that is no run_tools phase: one that
    pauses for a review, or runs an effect of the user's (a review, a check,
    a sub-agent). What answers the calls there is a review that rejects
    them; the others are still open. So a transition out of such a phase
    (or one reached from it before a run_tools phase) into a phase that
    measures, calls the model, compacts or finishes would send the calls on
    unanswered, and the run would fail there: only `tools_finished` (the
    calls ran) goes on, or a transition into a fail phase.

    An injected message is the same, from any phase that holds the calls (a
    run_tools phase too): it comes between two steps, and a transition on it
    that leaves the phase drops the step the phase was about to take.

    Returns:
        The transitions (by `id`) on an injected message found to leave
        calls open.
    """
    told: set[int] = set()
    fails = {p for p, k in kinds.items() if k == "fail"}
    answering = {
        p for p, k in kinds.items() if k not in _LEAVES_CALLS_OPEN and p not in fails
    }
    effects = {s.name for s in spec.states if s.decision is None and not s.subagent}

    def may_come(phase: str, t: TransitionSpec) -> bool:
        effect = phase in effects and not t.is_wildcard
        return _may_come(kinds[phase], t.trigger, effect=effect)

    # Each phase a reply's calls may reach unanswered -> the phase they came
    # from, and whether that is the model-call phase that replied.
    ways: dict[str, tuple[str, bool]] = {}
    for source, group in _groups(spec, "model_replied").items():
        for i, t in enumerate(group):
            if t.dest in answering and t.dest not in ways and _may_carry(group, i):
                ways[t.dest] = (source, True)
    leaving: dict[str, list[TransitionSpec]] = {}  # each phase's, in file order
    for t in spec.transitions:
        for source in t.sources:
            leaving.setdefault(source, []).append(t)
    reached = deque(ways)
    while reached:  # and the phases reached from them before the calls ran
        phase = reached.popleft()
        for t in leaving.get(phase, ()):
            if may_come(phase, t) and t.dest in answering and t.dest not in ways:
                ways[t.dest] = (phase, False)
                reached.append(t.dest)
    for t in spec.transitions:
        dest = t.dest
        if dest is None or t.trigger == "run_cancelled":
            continue
        into = kinds.get(dest)
        if into not in _LEAVES_CALLS_OPEN:
            continue
        held = next(
            (p for p in t.sources if p in ways and p != dest and may_come(p, t)),
            None,
        )
        if held is None:
            continue
        if t.trigger != "message_injected":
            problem(_leaves_calls(held, t, _way(ways, held)), t)
        elif into != "finish":  # an injection into finish: its own problem
            problem(_injected_leaves_calls(held, dest), t)
            told.add(id(t))
    return told


_STEPS_OWN: Final = frozenset(
    {"run_started", "output_rejected", *(t for ts in OUTCOMES.values() for t in ts)}
)
"""The triggers only a built-in step feeds (`tools_finished`: the calls ran)."""

NO_ANSWERS: Final = _STEPS_OWN - {"tools_finished"}
"""The triggers no answer to a paused run has: a run's start, a step's outcome.

A paused phase makes no step; tool results brought from outside
(`tools_finished`) answer the calls it waits on.
"""


def _may_come(kind: str | None, trigger: str, *, effect: bool = False) -> bool:
    """Whether `trigger` may come, with a reply's calls open, in a phase of `kind`.

    An injection comes anywhere; a review or a signal comes in a phase that
    pauses or runs an effect; a built-in step's outcome comes only out of
    its own step (a ``source = "*"`` transition on one names phases it never
    comes in), or out of an `effect` of the user's (which may return any
    event) named as the transition's source; `tools_finished` means the
    calls ran.
    """
    if trigger == "message_injected":
        return True
    if effect:
        return trigger != "tools_finished"
    return kind != "run_tools" and trigger not in _STEPS_OWN


def _groups(spec: MachineSpec, trigger: str) -> dict[str, list[TransitionSpec]]:
    """The transitions on `trigger` out of each phase, in file order."""
    groups: dict[str, list[TransitionSpec]] = {}
    for t in spec.transitions:
        if t.trigger == trigger:
            for source in t.sources:
                groups.setdefault(source, []).append(t)
    return groups


def _may_carry(group: list[TransitionSpec], index: int) -> bool:
    """Whether `group[index]` (on ``model_replied``) may take a reply with calls.

    Not when ``has_tool_calls`` is in its `unless`, or an earlier transition
    of its group takes every reply with calls first.
    """
    t = group[index]
    into = {e.dest for e in group[:index] if e.dest is not None}
    if _CALLS in t.unless:
        return False
    return not checks_first(group, index, _CALLS, into, set())


def _way(ways: Mapping[str, tuple[str, bool]], phase: str) -> tuple[str, ...]:
    """The way a reply's calls came to `phase`, from the phase that replied."""
    way = [phase]
    while True:
        before, replied = ways[way[-1]]
        way.append(before)
        if replied:
            return tuple(reversed(way))


def _injected_leaves_calls(source: str, dest: str) -> str:
    return (
        f"phase {source!r} on 'message_injected' leaves for {dest!r} with the"
        " reply's tool calls unanswered: the message comes before the phase's"
        " step, so the calls would never run and the run would fail; leave out"
        " its dest (the message waits until the run measures again) or go to a"
        " fail phase"
    )


def _leaves_calls(source: str, t: TransitionSpec, way: tuple[str, ...]) -> str:
    shown = [repr(p) for p in way]
    if len(way) > SHOWN_STEPS + 1:  # a generated machine's: its ends are enough
        skipped = len(way) - SHOWN_STEPS - 1
        shown[SHOWN_STEPS:] = [f"... ({skipped} more) -> {source!r}"]
    came = " -> ".join(shown)
    return (
        f"phase {source!r} on {t.trigger!r} enters {t.dest!r} with the reply's"
        f" tool calls unanswered: a reply with tool calls comes to {source!r}"
        f" ({came}) and no run_tools phase runs them on the way, so the run"
        " would fail there (a review answers only the calls it rejects): go"
        " into a run_tools phase first, which runs only the calls still open"
        " (none when every call was rejected), or a fail phase; or send the reply's"
        " tool calls to a run_tools phase (a 'model_replied' transition with"
        f" conditions = [{_CALLS!r}] before the one into {way[1]!r})"
    )


def _check_heard(
    spec: MachineSpec,
    kinds: Mapping[str, str | None],
    problem: Report,
    guessed: Collection[int],
) -> None:
    """No run ends done with an injected message left unheard in its inbox.

    A message injected away from a measure phase waits in the inbox until
    `flush_inbox` moves it on. A transition into a finish phase from a phase
    where one may wait must come after a transition of its group that goes
    elsewhere whenever one waits (``has_injected_messages``, with no guard
    the finish transition lacks), or have the guard in its `unless`.
    """
    holds = _may_hold_injections(spec)
    unheard = _unheard_from(spec, kinds)
    on_enter = {s.name: s.on_enter for s in spec.states}
    groups: dict[tuple[str, str], list[TransitionSpec]] = {}
    for t in spec.transitions:
        for source in t.sources:
            groups.setdefault((source, t.trigger), []).append(t)
    for (source, _trigger), group in groups.items():
        if source not in holds:
            continue
        for i, t in enumerate(group):
            if (
                kinds.get(t.dest or "") != "finish"
                or t.trigger in _OWN_PROBLEM
                or id(t) in guessed
            ):
                continue
            if _HEARD in t.unless:  # what fires instead comes after it
                hearing = [
                    e
                    for e in group[i + 1 :]
                    if e.dest is not None and kinds.get(e.dest) != "finish"
                ]
            else:
                hearing = [e for e in group[:i] if _hears(e, t, kinds)]
            if any(_flushes(e, on_enter) or e.dest not in unheard for e in hearing):
                continue
            if hearing:
                e = hearing[0]
                problem(
                    f"phase {source!r} on {t.trigger!r}: when a message waits, the"
                    f" run goes on to {e.dest!r} and the next model call without"
                    " moving it into the request, so the model never hears it and"
                    " the run loops until max_turns: add 'flush_inbox' to the"
                    " on_enter of the measure phase on the way (the stock file's"
                    " 'start' has it)",
                    e,
                )
                continue
            if _HEARD in t.unless:
                continue
            problem(
                f"phase {source!r} on {t.trigger!r} ends the run in {t.dest!r} "
                "though a message injected there may wait, never heard: put "
                f"before it a transition on {t.trigger!r} with conditions = "
                f"[{_HEARD!r}] into another phase (the stock file's goes to "
                "'start', where the model hears it)",
                t,
            )


def _check_taken(
    spec: MachineSpec,
    kinds: Mapping[str, str | None],
    accepts: Mapping[str, set[str]],
    problem: Report,
) -> None:
    """No run ends done or pauses with an injected message waiting outside it.

    A message injected while the run is in a phase with no
    ``message_injected`` transition waits, outside the run, until a phase
    takes it. So every phase a transition leaves for a finish phase takes
    one, and so does every pause phase, in a machine that takes injected
    messages at all (in one that takes none, `RunControl.inject` refuses
    them); otherwise the run could end done, or pause and go on once
    answered (under another control), with the message never heard nor kept.
    """
    if not any("message_injected" in taken for taken in accepts.values()):
        return
    told: set[str] = set()
    for t in spec.transitions:
        if kinds.get(t.dest or "") != "finish" or t.trigger in _OWN_PROBLEM:
            continue
        for source in t.sources:
            if "message_injected" in accepts[source] or source in told:
                continue
            told.add(source)
            problem(
                f"phase {source!r} takes no injected message, but ends the run"
                f" in {t.dest!r} on {t.trigger!r}: a message injected while the"
                f" run is in {source!r} waits for a phase that takes it, and the"
                " run would end done without it, never heard nor kept; give"
                f" {source!r} a 'message_injected' transition (the stock file's"
                ' source = "*" one, with actions = ["record_injection"])',
                source,
            )
    for state in spec.states:
        name = state.name
        if state.decision != "pause" or "message_injected" in accepts[name]:
            continue
        problem(
            f"pause phase {name!r} takes no injected message: a message injected"
            f" before the run pauses there waits for a phase that takes it, and"
            " the run pauses, and goes on once answered, without it, never"
            f" heard nor kept; give {name!r} a 'message_injected' transition"
            ' (the stock file\'s source = "*" one, with actions ='
            ' ["record_injection"])',
            name,
        )


_HEARD: Final = "has_injected_messages"

_OWN_PROBLEM: Final = frozenset({"message_injected", "run_cancelled"})
"""Triggers whose transition into a finish phase is refused on its own."""


def _hears(
    earlier: TransitionSpec, t: TransitionSpec, kinds: Mapping[str, str | None]
) -> bool:
    """Whether `earlier` fires, away from a finish phase, whenever a message waits."""
    return (
        _HEARD in earlier.conditions
        and set(earlier.conditions) <= {*t.conditions, _HEARD}
        and set(earlier.unless) <= set(t.unless)
        and earlier.dest is not None
        and kinds.get(earlier.dest) != "finish"
    )


def _unheard_from(spec: MachineSpec, kinds: Mapping[str, str | None]) -> set[str]:
    """The phases from which a model call or the end comes before any flush.

    A waiting message entering one of them is not moved into the request
    (`flush_inbox`, in a transition's actions or its phase's `on_enter`)
    before the model is called or the run finishes.
    """
    on_enter = {s.name: s.on_enter for s in spec.states}
    into: dict[str, list[str]] = {}  # dest -> sources, on transitions not flushing
    for e in spec.transitions:
        if e.dest is None or e.trigger in _OWN_PROBLEM or _flushes(e, on_enter):
            continue
        for source in e.sources:
            into.setdefault(e.dest, []).append(source)
    found = {p for p in spec.phases if kinds.get(p) in ("call_llm", "finish")}
    stack = list(found)
    while stack:
        for source in into.get(stack.pop(), ()):
            if source not in found:
                found.add(source)
                stack.append(source)
    return found


def _flushes(t: TransitionSpec, on_enter: Mapping[str, tuple[str, ...]]) -> bool:
    """Whether `t` moves what waits into the request (its actions or dest's entry)."""
    return "flush_inbox" in t.actions or (
        t.dest is not None and "flush_inbox" in on_enter.get(t.dest, ())
    )


def _may_hold_injections(spec: MachineSpec) -> set[str]:
    """The phases an injected message may wait in, not yet moved on."""
    on_enter = {s.name: s.on_enter for s in spec.states}
    holds: set[str] = set()
    taken: dict[str, list[TransitionSpec]] = {}
    for t in spec.transitions:
        if t.trigger == "message_injected":
            for source in t.sources:
                taken.setdefault(source, []).append(t)
    for source, group in taken.items():
        # Each may take the injection, up to the first without conditions:
        # one guarded that flushes leaves the rest to the next. One that
        # stays in its phase (no dest) does not enter it: no on_enter runs.
        for t in group:
            if "flush_inbox" not in t.actions and (
                t.dest is None or "flush_inbox" not in on_enter.get(t.dest, ())
            ):
                holds.add(t.dest or source)
            if not t.is_guarded:
                break
    changed = True
    while changed:  # what waits is carried along until a flush moves it on
        changed = False
        for t in spec.transitions:
            if t.dest is None or t.dest in holds:
                continue
            if "flush_inbox" in t.actions or "flush_inbox" in on_enter.get(t.dest, ()):
                continue
            if any(source in holds for source in t.sources):
                holds.add(t.dest)
                changed = True
    return holds


def _check_outcomes(
    spec: MachineSpec,
    kinds: Mapping[str, str | None],
    accepts: Mapping[str, set[str]],
    problem: Report,
) -> None:
    if spec.initial in accepts and "run_started" not in accepts[spec.initial]:
        problem(
            f"the initial phase {spec.initial!r} has no 'run_started' transition:"
            " no run could start",
            spec.initial,
        )
    no_kind = any(s.decision is None and s.effect is None for s in spec.states)
    if spec.initial in accepts and "finish" not in kinds.values() and not no_kind:
        # Every run would fail, and what was said would never be kept.
        problem(
            "no phase emits finish: no run could end done and keep what was"
            ' said; add one (done = { decision = "finish", on_enter ='
            ' ["commit_pending"] }), with a transition into it and its name in'
            " terminal",
            spec.initial,
        )
    answers = {"tool_calls_reviewed", *spec.signals}
    # A reachable phase asks for its step when a transition enters it or
    # stays in it; an initial phase left on `run_started` never does (an
    # unreachable one is a problem of its own).
    seen, _edges = reachable(spec)
    entered = {t.dest for t in spec.transitions if t.dest is not None}
    entered.update(
        s
        for t in spec.transitions
        if t.dest is None and t.trigger != "run_started"
        for s in t.sources
    )
    for phase, kind in kinds.items():
        if phase not in entered or phase not in seen:
            continue
        taken = accepts[phase]
        missing = [t for t in OUTCOMES.get(kind or "", ()) if t not in taken]
        if missing:
            problem(
                f"phase {phase!r} emits {kind} but has no transition on "
                f"{', '.join(map(repr, missing))}: each outcome of its step needs "
                "one, or a run stops on it",
                phase,
            )
        if kind == "pause" and not taken & answers:
            problem(
                f"phase {phase!r} pauses but takes no answer: give it a "
                "'tool_calls_reviewed' or a signal transition",
                phase,
            )


def _check_records(
    t: TransitionSpec, kinds: Mapping[str, str | None], problem: Report
) -> None:
    if t.trigger == "message_injected" and kinds.get(t.dest or "") == "finish":
        # Fed while a step runs: its outcome, a reply among them, would never
        # be heard, and what it said never kept.
        problem(
            "a 'message_injected' transition cannot end the run done: it comes"
            " while a step runs, whose outcome would be lost",
            t,
        )
    record = RECORDS.get(t.trigger)
    if record is None or record[0] in t.actions:
        return
    if any(t.trigger not in ACCEPTS.get(a, (t.trigger,)) for a in t.actions):
        return  # a reducer of another event in its place: its own problem
    if t.dest is not None and kinds.get(t.dest) == "fail":
        return  # the run fails: its messages are dropped anyway
    reducer, what = record
    problem(
        f"a {t.trigger!r} transition that does not fail the run must keep "
        f"{what}: add {reducer!r} to its actions",
        t,
    )


def _check_commits(
    spec: MachineSpec, kinds: Mapping[str, str | None], problem: Report
) -> None:
    """Every way into a finish phase commits the run's messages; none into a fail.

    A pass's result adopted (`record_compaction`) is a commit: taken on the
    way into a fail phase, a failed run would keep what it did.
    """
    for t in spec.transitions:
        if _ADOPTS in t.actions and t.dest is not None and kinds.get(t.dest) == "fail":
            problem(
                f"{_ADOPTS!r} commits a pass's result, but this transition ends "
                f"the run in fail phase {t.dest!r}, and a failed run commits "
                f"nothing: take {_ADOPTS!r} out of its actions",
                t,
            )
    for state in spec.states:
        if state.decision != "finish" or "commit_pending" in state.on_enter:
            continue
        into = [t for t in spec.transitions if t.dest == state.name]
        if not into or any("commit_pending" not in t.actions for t in into):
            problem(
                f"finish phase {state.name!r} does not commit the run's messages:"
                " add 'commit_pending' to its on_enter (a run that ends done"
                " keeps what was said)",
                state.name,
            )


def _misplaced(reducer: str, placed: tuple[str, str]) -> str:
    kind, does = placed
    return (
        f"{reducer!r} {does}: it may run only on the way into a {kind} phase"
        f" (its on_enter, or a transition into it)"
    )


_UNANSWERED: Final[Mapping[str, str]] = {
    "run_started": "the run's input",
    "tools_finished": "the tool results",
    "tool_calls_reviewed": "the reviewer's results",
    "output_rejected": "a rejected answer and its re-ask",
}
"""A trigger whose event leaves the model's last word unanswered -> what came."""

_KEPT: Final = "(what came before)"
"""After a transition whose event adds nothing the model must answer."""


@functools.lru_cache(maxsize=64)  # asked again by each run given an output type
def finishes_before_an_answer(
    spec: MachineSpec,
) -> tuple[tuple[str, TransitionSpec, str], ...]:
    """Each way into a finish phase a run may take without the model's answer.

    A run's answer is the last reply, when the model said its final word:
    a reply without tool calls. A transition into a finish phase after the
    input, tool results, a review's results or a re-ask with no such reply
    since (a `tools_finished` transition straight into `done`, a turn limit
    that ends the run done) ends it done with nothing to read as the answer.
    Each is given once, in file order, as (the phase it leaves, the
    transition, what the model did not answer). The steps that add nothing
    the model must answer (a measure, a failed call, a compaction, an
    injection that waits, a signal) keep what came before them. A
    transition's guards are read as passing: only a reply's
    ``has_tool_calls`` is told apart.
    """
    kinds = {s.name: s.decision for s in spec.states}
    # Each phase's ways out: the transition, and what the model has not
    # answered after it (None: it answered; `_KEPT`: what it had not before).
    leaving: dict[str, list[tuple[TransitionSpec, tuple[str | None, ...]]]] = {}
    for t in spec.transitions:
        if t.trigger == "run_cancelled" or t.trigger == "model_replied":
            continue
        kept: tuple[str | None, ...] = (_UNANSWERED.get(t.trigger, _KEPT),)
        for source in t.sources:
            leaving.setdefault(source, []).append((t, kept))
    for source, group in _groups(spec, "model_replied").items():
        for i, t in enumerate(group):
            calls = _may_carry(group, i)
            leaving.setdefault(source, []).append(
                (t, (None, "a reply with tool calls") if calls else (None,))
            )
    # (phase, what the model has not answered there; None: it answered).
    start: tuple[str, str | None] = (spec.initial, _UNANSWERED["run_started"])
    seen = {start}
    todo = [start]
    found: dict[int, tuple[str, TransitionSpec, str]] = {}
    while todo:
        phase, waiting = todo.pop()
        for t, after in leaving.get(phase, ()):
            dest = t.dest or phase
            for told in after:
                what = waiting if told == _KEPT else told
                if what is not None and kinds.get(dest) == "finish":
                    found.setdefault(id(t), (phase, t, what))
                if (dest, what) not in seen:
                    seen.add((dest, what))
                    todo.append((dest, what))
    order = {id(t): i for i, t in enumerate(spec.transitions)}
    return tuple(found[k] for k in sorted(found, key=order.__getitem__))
