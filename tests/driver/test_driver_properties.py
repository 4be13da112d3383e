"""Whatever the window, threshold, tool outputs, extras, injections, compactor and
machine file: no request over the window and no invalid conversation is ever
sent or committed, every run ends with an answer or a typed error, every run
replays exactly, and the session always takes its next run."""

from __future__ import annotations

import functools
import json
import math
import re
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import anyio
import anyio.lowlevel
import attrs
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.hand_written_machines import HAND_WRITTEN
from tests.profiles import heavy, sized
from turnfsm._resources import load_machine, machines_dir
from turnfsm.context import (
    CompactionContext,
    CompactionProposal,
    ContextManager,
    LayeredCompactor,
    SummarizingCompactor,
    TruncatingCompactor,
)
from turnfsm.core import (
    Event,
    MachineSpec,
    Pause,
    Perform,
    Signal,
    ToolCallsReviewed,
    finishes_before_an_answer,
)
from turnfsm.driver import (
    Driver,
    Effect,
    EffectContext,
    RetryPolicy,
    RunControl,
    RunResult,
    Session,
    Tool,
    replay,
    subagent_tool,
)
from turnfsm.errors import (
    CONTEXT_OVERFLOW,
    ConfigError,
    InvalidMessage,
    PinnedTooLarge,
    ProviderError,
    TurnFSMError,
)
from turnfsm.hooks import DecisionInfo, Hook, OutcomeInfo
from turnfsm.messages import Message, check_history
from turnfsm.persistence import SQLiteStore, descendants
from turnfsm.providers import ModelRequest, ModelResponse
from turnfsm.testing import FakeModelClient, reply, tool_call
from turnfsm.tokens import HeuristicTokenCounter, Meter
from turnfsm.values import Usage

COUNTER = HeuristicTokenCounter()

FINAL = {False: "final", True: '{"result": 7}'}
"""The model's last answer, by whether the run asks a structured (int) one."""


@functools.cache
def machine(name: str) -> MachineSpec:
    """The stock machine, one with `start` renamed, the approval machine,
    ``reviewed``: the review machine whose review is the sub-agent ``critic``,
    and the machines written by hand (`HAND_WRITTEN`)."""
    if name == "renamed":
        text = (machines_dir() / "turn.toml").read_text()
        return MachineSpec.from_toml(re.sub(r"\bstart\b", "begin", text))
    if name == "reviewed":
        text = (machines_dir() / "review.toml").read_text()
        text = text.replace(
            'await_review      = { effect = "review" }',
            'await_review      = { subagent = "critic" }',
        )
        assert "subagent" in text
        text += (
            "\n[subagents.critic]\n"
            'machine = "turn.toml"\nsignal = "revise"\nkey = "feedback"\n'
            'routes = { approved = "APPROVED" }\ntask = "Check {reply}"\n'
        )
        return MachineSpec.from_toml(text)
    if name in HAND_WRITTEN:
        return MachineSpec.from_toml(HAND_WRITTEN[name], source=name)
    return load_machine(machines_dir() / f"{name}.toml")


MACHINES = ["turn", "renamed", "approval", *sorted(HAND_WRITTEN)]


def input_size(request: ModelRequest) -> int:
    extras = [request.system or ""]
    if request.tools:
        extras.append(json.dumps([attrs.asdict(t) for t in request.tools]))
    if request.output is not None:  # a structured answer's schema is input too
        extras.append(json.dumps(attrs.asdict(request.output)))
    return Meter(COUNTER).measure(
        list(request.messages), extras=[e for e in extras if e]
    )


def request_size(request: ModelRequest) -> int:
    return input_size(request) + (request.max_tokens or 0)


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, object]:
    return {
        "window": draw(st.sampled_from([0, 300, 800, 1_500, 4_000])),
        "threshold": draw(st.integers(0, 100)),
        "auto_compact": draw(st.booleans()),
        "system": draw(st.text(alphabet="abc ", max_size=600)),
        "outputs": draw(st.lists(st.integers(0, 3_000), min_size=0, max_size=6)),
        "parallel": draw(st.integers(1, 3)),
        "overflow_on": draw(st.sets(st.integers(0, 6), max_size=2)),
        "inject_on": draw(st.sets(st.integers(0, 6), max_size=2)),
        # A provider error the run cannot retry, and the user's cancel.
        "fail_on": draw(st.sets(st.integers(0, 6), max_size=1)),
        "cancel_on": draw(st.none() | st.integers(0, 6)),
        "preserve_recent": draw(st.integers(1, 4)),
        "min_messages": draw(st.integers(2, 6)),
        "reply_budget": draw(st.sampled_from([None, 50])),
        # The provider's own count, as a multiple of the estimate; with
        # `calibrate` the manager learns it from the reported usage.
        "calibrate": draw(st.booleans()),
        "true_ratio": draw(st.sampled_from([0.6, 0.8, 1.0, 1.25])),
        # The message-count line (0: off) and the run's limits on passes.
        "max_messages": draw(st.sampled_from([0, 4, 8, 50])),
        "max_compactions": draw(st.sampled_from([1, 2, 20])),
        "max_overflow_retries": draw(st.sampled_from([0, 1, 2])),
        # A structured answer (an int), and how many answers before the
        # first that fits it.
        "structured": draw(st.booleans()),
        "misfits": draw(st.integers(0, 3)),
    }


CANCEL_POINTS = ("model", "tool", "compaction", "decision", "outcome", "child")
"""Where a drawn cancel lands: in the `cancel_on`-th model call, tool call or
compaction pass of the run, before (a hook's ``on_decision``) or after (its
``on_outcome``) the `cancel_on`-th step's effect, or in a sub-agent's
`cancel_on`-th model call (the parent's tool batch or sub-agent phase)."""


@st.composite
def wider_scenarios(draw: st.DrawFn) -> dict[str, object]:
    """`scenarios`, with sub-agents, a SQLite store and cancels anywhere.

    ``delegate_on``: the model calls whose tool batch also calls the
    sub-agent tool ``helper``; ``child_fails``: the sub-agents' model refuses
    (a provider error), so their calls get error results (a sub-agent
    phase's run fails); ``sqlite``: the session lives in a SQLite file;
    ``reopen``: a paused run is resumed on its session read again from its
    store; ``sync_tools``: the session's tool is sync (it runs, and cancels,
    in a worker thread).
    """
    s = draw(scenarios())
    s["cancel_in"] = draw(st.sampled_from(CANCEL_POINTS))
    # Mostly a cancel, early enough to land before the run ends.
    s["cancel_on"] = draw(st.integers(0, 3) | st.integers(0, 6) | st.none())
    s["delegate_on"] = draw(st.sets(st.integers(0, 3), max_size=3))
    s["child_fails"] = draw(st.sampled_from([False, False, True]))
    s["sqlite"] = draw(st.booleans())
    s["reopen"] = draw(st.booleans())
    s["sync_tools"] = draw(st.booleans())
    return s


def _approval(waiting: Pause, signals: Sequence[str]) -> Event:
    if waiting.takes_review:
        # The second call of each reply (c1_1, c2_1, ...) is rejected.
        rejected = {c.id: "not that one" for c in waiting.calls if c.id.endswith("_1")}
        if rejected:
            return ToolCallsReviewed.reject(rejected)
        return ToolCallsReviewed.approve_all()
    signals = [t for t in waiting.accepts if t in signals]
    return Signal("approved" if "approved" in signals else signals[0])


def run_all(
    driver: Driver,
    session: Session,
    control: RunControl,
    input: str | Message = "start",
    reopen: Callable[[Session], Awaitable[Session]] | None = None,
) -> RunResult:
    """Run `input`, approving every pause, within 10 s.

    A pause that takes a review of its calls gets its calls approved but
    the second of each reply; one
    that takes signals only gets ``approved`` if it takes that, else the
    first it takes. With `reopen`, each pause is resumed on the session it
    gives (the session read again from its store, as another process would).
    """

    async def go() -> RunResult:
        nonlocal session
        with anyio.fail_after(10):
            result = await driver.run(input, session=session, control=control)
            while result.outcome == "paused":
                assert result.waiting is not None
                if reopen is not None:
                    session = await reopen(session)
                result = await driver.resume(
                    session,
                    result.run_id,
                    _approval(result.waiting, driver.machine.signals),
                    control=control,
                )
        return result

    return anyio.run(go)


@pytest.mark.parametrize("name", MACHINES)
@settings(
    max_examples=sized(200), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(s=scenarios())
def test_no_request_exceeds_the_window_and_every_run_terminates(
    name: str, s: dict[str, object]
) -> None:
    keeps_the_promises(machine(name), s)


# 100 examples a machine: about 0.1 s each (a SQLite file, sub-agent runs),
# some 40 s in all under the ci profile.
@pytest.mark.parametrize("name", [*MACHINES, "reviewed"])
@heavy(100, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(s=wider_scenarios())
def test_the_promises_hold_with_sub_agents_a_sqlite_file_and_cancels_anywhere(
    name: str, s: dict[str, object], tmp_path: Path
) -> None:
    keeps_the_promises(machine(name), s, tmp_path)


def approve_after_one_revision() -> Effect:
    """A reviewer (a user's effect) that asks for one revision, then approves."""
    reviews = [0]

    async def review(ctx: EffectContext, decision: Perform) -> Event:
        reviews[0] += 1
        if reviews[0] == 1:
            return Signal("revise", {"feedback": "Shorter, please."})
        # Data with the approval too: a changed machine may add it to the
        # conversation (a signal without the data it adds fails the run, typed).
        return Signal("approved", {"feedback": "Good."})

    return review


@attrs.define
class Cancels:
    """The user's cancel of scenario `s`: at its `cancel_on`-th `cancel_in` point.

    Each point counts its own kind (model calls, tool calls, passes, steps,
    the sub-agents' model calls) over the first run only (`disarm`).
    """

    s: dict[str, object]
    control: RunControl = attrs.field(factory=RunControl)
    seen: dict[str, int] = attrs.field(factory=dict)
    armed: bool = True

    def at(self, point: str) -> None:
        """Count one `point`; cancel the run if it is the drawn one."""
        n = self.seen[point] = self.seen.get(point, -1) + 1
        where = self.s.get("cancel_in", "model")
        if self.armed and where == point and n == self.s["cancel_on"]:
            self.control.cancel("stop")

    def disarm(self) -> None:
        self.armed = False

    def around(
        self, compactor: TruncatingCompactor
    ) -> TruncatingCompactor | CancellingCompactor:
        """`compactor`, whose passes are cancel points when one is drawn there."""
        if self.s.get("cancel_in") == "compaction":
            return CancellingCompactor(compactor, self)
        return compactor

    def hooks(self) -> list[Hook]:
        """The hooks whose steps are cancel points when one is drawn there."""
        where = self.s.get("cancel_in")
        return [h(self) for h in (CancelBefore, CancelAfter) if h.point == where]


@attrs.frozen
class CancellingCompactor:
    """`inner`, each pass of which first counts a ``compaction`` cancel point."""

    inner: TruncatingCompactor
    cancels: Cancels

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        self.cancels.at("compaction")
        await anyio.lowlevel.checkpoint()  # where a cancel interrupts the pass
        return await self.inner.compact(messages, target, ctx)


class CancelBefore(Hook):
    """Counts a ``decision`` cancel point before each step's effect."""

    point = "decision"

    def __init__(self, cancels: Cancels) -> None:
        self.cancels = cancels

    def on_decision(self, info: DecisionInfo) -> None:
        self.cancels.at("decision")


class CancelAfter(Hook):
    """Counts an ``outcome`` cancel point after each step's effect."""

    point = "outcome"

    def __init__(self, cancels: Cancels) -> None:
        self.cancels = cancels

    def on_outcome(self, info: OutcomeInfo) -> None:
        self.cancels.at("outcome")


def sub_agent(s: dict[str, object], cancels: Cancels, sizes: list[int]) -> Driver:
    """The sub-agent of the ``helper`` tool and of the ``critic`` phase.

    A helper's task gets one tool call (as large as the largest output),
    then an answer; a critic's (its task begins ``Check``) asks for one
    revision, then approves. It has the session's window and threshold, and
    its passes and tool calls are cancel points too. Its requests' sizes go
    to `sizes`; with ``child_fails`` its model refuses every call.
    """
    reviews = [0]

    def handler(request: ModelRequest) -> ModelResponse:
        sizes.append(request_size(request))
        check_history(request.messages)
        cancels.at("child")
        if s.get("child_fails"):
            raise ProviderError("refused", kind="bad_request")
        if any(m.text.startswith("Check") for m in request.messages):
            reviews[0] += 1
            return ModelResponse(
                message=reply("APPROVED." if reviews[0] > 1 else "No: shorter.")
            )
        if request.messages[-1].tool_results:
            return ModelResponse(message=reply("looked"))
        size = max(s["outputs"], default=60)  # type: ignore[call-overload]
        return ModelResponse(message=reply("", tool_call("dump", size=size)))

    async def dump(size: int) -> str:
        """Return `size` characters."""
        cancels.at("tool")
        await anyio.lowlevel.checkpoint()
        return "z" * size

    return Driver(
        model=FakeModelClient(handler),
        tools=[dump],
        context=ContextManager(
            cancels.around(TruncatingCompactor()),
            context_window=int(s["window"]),  # type: ignore[call-overload]
            threshold=int(s["threshold"]),  # type: ignore[call-overload]
            counter=COUNTER,
        ),
        max_turns=4,
        retry=RetryPolicy(max_attempts=1),
    )


def reloads_the_same(spec: MachineSpec, session: Session, path: Path | None) -> None:
    """The session, and its sub-agents' sessions, reload as they are and replay.

    With `path` (the session's SQLite file), it is reopened on a connection
    of its own and must give back the same log, history and runs as the
    session the driver wrote through.
    """

    async def read() -> tuple[Session, list[Session]]:
        if path is None:
            store = session.store
            return await Session.load(store, session.id), await descendants(
                store, session.id
            )
        async with SQLiteStore(path) as fresh:
            return await Session.load(fresh, session.id), await descendants(
                fresh, session.id
            )

    loaded, below = anyio.run(read)
    assert [m.id for m in loaded.history] == [m.id for m in session.history]
    if path is not None:
        assert loaded.entries == session.entries
        assert list(loaded.history) == list(session.history)
        assert loaded.runs == session.runs
    for run in loaded.runs:
        assert replay(spec, loaded, run.run_id).ok, run.run_id
    # Every run ended: none left to go on, a sub-agent's neither.
    assert not loaded.open_runs(), loaded.open_runs()
    event(f"{len(below)} sub-agent sessions")
    for kid in below:
        check_history(kid.history)
        assert not kid.open_runs(), (kid.id, kid.open_runs())
        for run in kid.runs:
            assert replay(None, kid, run.run_id).ok, (kid.id, run.run_id)


def keeps_the_promises(
    spec: MachineSpec, s: dict[str, object], where: Path | None = None
) -> None:
    """Run scenario `s` (see `scenarios`) on `spec`; assert what every machine keeps.

    No request over the window or with a broken tool pair, a run that ends
    done (with the model's answer, when it was asked) or failed (with a typed
    error), every message of a done run committed and none of a failed one,
    no injection lost, the session taking its next run, and every run
    replaying exactly. A phase running the
    effect ``review`` gets `approve_after_one_revision`; a sub-agent phase,
    `sub_agent`. A `wider_scenarios` scenario also delegates to `sub_agent`
    as a tool, cancels anywhere (`Cancels`), and keeps the session in a
    SQLite file in `where`, reloaded after each run (`reloads_the_same`).
    """
    window = int(s["window"])  # type: ignore[call-overload]
    outputs: list[int] = s["outputs"]  # type: ignore[assignment]
    sizes: list[int] = []
    true_sizes: list[int] = []  # what the provider counts, reply budget included
    child_sizes: list[int] = []
    ratio = float(s["true_ratio"])  # type: ignore[arg-type]
    cancels = Cancels(s)
    control = cancels.control
    delegate_on: set[int] = s.get("delegate_on", set())  # type: ignore[assignment]
    injected: list[Message] = []
    said: list[Message] = []  # every message the model said, in order
    answers = [0]  # the final answers that did not fit the structured type

    def handler(request: ModelRequest) -> ModelResponse:
        sizes.append(request_size(request))
        true_input = math.ceil(input_size(request) * ratio)
        true_sizes.append(true_input + (request.max_tokens or 0))
        usage = Usage(input_tokens=true_input)
        check_history(request.messages)
        turn = len(sizes) - 1
        if turn in s["inject_on"]:  # type: ignore[operator]
            note = Message.user(f"note {turn}")
            if "message_injected" in spec.triggers:
                injected.append(note)
                control.inject(note)
            else:  # refused at the call, the run goes on
                with pytest.raises(InvalidMessage, match="takes no injected"):
                    control.inject(note)
        cancels.at("model")
        if turn in s["overflow_on"]:  # type: ignore[operator]
            raise ProviderError("too long", kind=CONTEXT_OVERFLOW)
        if turn in s["fail_on"]:  # type: ignore[operator]
            raise ProviderError("refused", kind="bad_request")
        if turn < len(outputs):
            calls = [
                tool_call("dump", f"c{turn}_{i}", size=outputs[turn])
                for i in range(int(s["parallel"]))  # type: ignore[call-overload]
            ]
            if turn in delegate_on:
                calls.append(tool_call("helper", f"c{turn}_h", task=f"look {turn}"))
            message = reply("", *calls)
        elif s["structured"] and answers[0] < int(s["misfits"]):  # type: ignore[call-overload]
            answers[0] += 1
            message = reply("no number")
        else:
            message = reply(FINAL[bool(s["structured"])])
        said.append(message)
        return ModelResponse(message=message, usage=usage)

    async def dump(size: int) -> str:
        """Return `size` characters."""
        cancels.at("tool")
        await anyio.lowlevel.checkpoint()  # where a cancel interrupts the batch
        return "y" * size

    def dump_in_a_thread(size: int) -> str:
        """Return `size` characters."""
        cancels.at("tool")  # a cancel from the tool's worker thread
        return "y" * size

    model = FakeModelClient(handler)
    reviewed = {state.effect for state in spec.states} & {"review"}
    tools: list[Tool | Callable[..., object]] = [dump]
    if s.get("sync_tools"):
        tools = [Tool.from_function(dump_in_a_thread, name="dump")]
    subagents: dict[str, Driver] = {}
    if delegate_on or spec.subagents:
        child = sub_agent(s, cancels, child_sizes)
        subagents = {sub.name: child for sub in spec.subagents}
        if delegate_on:
            tools.append(subagent_tool(child, name="helper", description="Look."))
    build = functools.partial(
        Driver,
        model=model,
        tools=tools,
        system_prompt=str(s["system"]) or None,
        context=ContextManager(
            cancels.around(
                TruncatingCompactor(
                    preserve_recent=int(s["preserve_recent"]),  # type: ignore[call-overload]
                    min_messages=int(s["min_messages"]),  # type: ignore[call-overload]
                )
            ),
            context_window=window,
            threshold=int(s["threshold"]),  # type: ignore[call-overload]
            auto_compact=bool(s["auto_compact"]),
            counter=COUNTER,
            calibrate=bool(s["calibrate"]),
            max_messages=int(s["max_messages"]),  # type: ignore[call-overload]
        ),
        max_turns=10,
        max_compactions=int(s["max_compactions"]),  # type: ignore[call-overload]
        max_overflow_retries=int(s["max_overflow_retries"]),  # type: ignore[call-overload]
        max_output_tokens=s["reply_budget"],  # type: ignore[arg-type]
        retry=RetryPolicy(max_attempts=1),
        machine=spec,
        effects={e: approve_after_one_revision() for e in reviewed},
        subagents=subagents,
        hooks=cancels.hooks(),
        strict_hooks=True,
        output_type=int if s["structured"] else None,
    )
    reasks = all(
        "output_rejected" in spec.accepts(state.name)
        for state in spec.states
        if state.decision == "call_llm"
    )
    calls = any(state.decision == "call_llm" for state in spec.states)
    if s["structured"] and not calls:  # refused up front: no answer to read
        with pytest.raises(ConfigError, match="no output type with machine"):
            build()
        return
    if s["structured"] and not reasks:  # refused up front: it cannot re-ask
        with pytest.raises(ConfigError, match="output_rejected"):
            build()
        return
    if s["structured"] and finishes_before_an_answer(spec):
        # Refused up front: a run could end done with no answer to read.
        with pytest.raises(ConfigError, match="end done only on the model's"):
            build()
        return
    driver = build()
    path = where / f"{uuid.uuid4().hex}.db" if s.get("sqlite") and where else None
    stores = [SQLiteStore(path)] if path else []
    session = Session(store=stores[0]) if stores else Session()
    sessions = [session]

    async def reopen(old: Session) -> Session:
        """The paused session read again: from its file on a connection of its own."""
        if path is not None:
            stores.append(SQLiteStore(path))
        new = await Session.load(stores[-1] if stores else old.store, old.id)
        assert new.entries == old.entries
        assert new.runs == old.runs
        sessions.append(new)
        return new

    start = Message.user("start")
    reopening = reopen if s.get("reopen") else None
    try:
        result = run_all(driver, session, control, start, reopening)
    except PinnedTooLarge:
        # What rides every request and the pinned messages reach the
        # window's emergency line: refused before the run writes anything.
        assert window
        assert not sessions[-1].runs
        assert not sessions[-1].history
        event("the first run refused: its pins do not fit")
        return
    session = sessions[-1]
    cancels.disarm()
    event(f"{result.outcome}, a cancel drawn in {s.get('cancel_in', 'model')}")
    if path is not None:
        reloads_the_same(spec, session, path)
    assert result.outcome in ("done", "failed", "cancelled"), result
    covered = {i for run in session.runs for c in run.compactions for i in c.covers}
    kept = {m.id for m in session.history} | covered
    if result.outcome == "done":
        # The model's last word is the answer (a machine may end after its
        # tools, its last word a tool call's empty text, but not when the
        # run asks a structured answer: that one is always read).
        assert result.text == (said[-1].text if said else ""), result.text
        if s["structured"]:
            assert (result.text, result.output) == (FINAL[True], 7), result
        # An injection made before the last call reached the model, or a
        # compaction pass (on the record) covered it: never lost silently.
        seen = {m.id for r in model.requests for m in r.messages}
        assert all(m.id in seen | covered for m in injected), injected
        lost = [m.id for m in [start, *said] if m.id not in kept]
        assert not lost, f"done, but {lost} were not committed"
    else:
        assert isinstance(result.error, TurnFSMError), result.error
        # A tool call left without its result is refused at load, never met
        # in a run (nor is a message the run's own step broke).
        assert not isinstance(result.error, InvalidMessage), result.error
        if not covered:
            assert not any(m.id in kept for m in [start, *said]), (
                "failed, but committed what the run said"
            )
    if window and not s["calibrate"]:
        assert all(size <= window for size in sizes), (sizes, window)
    if window and s["calibrate"]:
        # Calibrated on what the provider reported: its own count is never
        # over the window once it reported (from the first call when the
        # estimate errs high).
        checked = true_sizes if ratio <= 1 else true_sizes[1:]
        assert all(size <= window for size in checked), (true_sizes, window)
    check_history(session.history)
    # The session takes its next run, which keeps what the first committed
    # (or what a compaction pass stands for).
    before = [m.id for m in session.history]
    if reopening is not None:  # taken by the session read again, too
        session = anyio.run(reopen, session)
    after: RunResult | None
    try:
        after = run_all(driver, session, RunControl(), "next", reopening)
    except PinnedTooLarge:
        after = None
    if after is None:
        # The scale the first run learned (the provider counts more than the
        # estimate) brings what rides every request to the emergency line:
        # no request could be sent, so the run is refused before it writes.
        assert s["calibrate"]
        assert ratio > 1
        assert [m.id for m in sessions[-1].history] == before
        event("the next run refused: its pins no longer fit")
    else:
        assert after.outcome in ("done", "failed", "cancelled"), after
        assert after.ok or isinstance(after.error, TurnFSMError), after.error
    session = sessions[-1]
    check_history(session.history)
    covered = {i for run in session.runs for c in run.compactions for i in c.covers}
    kept = {m.id for m in session.history} | covered
    assert all(i in kept for i in before), "the next run lost what was committed"
    reloads_the_same(spec, session, path)
    if window:  # the sub-agents' windows are the session's
        assert all(size <= window for size in child_sizes), (child_sizes, window)
    for store in stores:
        anyio.run(store.aclose)


# -- a careless compactor ---------------------------------------------------


@attrs.frozen
class Careless:
    """Drops, moves, duplicates and inserts messages, as told by `plan`."""

    plan: tuple[tuple[str, int, int], ...]

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        out = list(messages)
        for op, a, b in self.plan:
            if not out:
                break
            i, j = a % len(out), b % len(out)
            if op == "drop":
                del out[i]
            elif op == "move":
                out.insert(j, out.pop(i))
            elif op == "dup":
                out.insert(j, out[i])
            elif op == "insert_user":
                out.insert(j, Message.user("inserted"))
            elif op == "insert_result":
                call = next((m for m in out if m.tool_calls), None)
                cid = call.tool_calls[0].id if call else "ghost"
                out.insert(j, Message.tool_result(cid, "forged"))
        return CompactionProposal.compacted(out, ctx.tokens_before, 0)


plans = st.lists(
    st.tuples(
        st.sampled_from(["drop", "move", "dup", "insert_user", "insert_result"]),
        st.integers(0, 40),
        st.integers(0, 40),
    ),
    max_size=4,
).map(tuple)


@heavy(10_000)
@given(
    plan=plans,
    tools=st.lists(st.integers(1, 3), min_size=1, max_size=4),
    size=st.integers(50, 400),
)
def test_a_careless_compactor_never_gets_an_invalid_history_sent_or_committed(
    plan: tuple[tuple[str, int, int], ...], tools: list[int], size: int
) -> None:
    counter = {"n": 0}

    def handler(request: ModelRequest) -> ModelResponse:
        check_history(request.messages)  # never an invalid request
        n = counter["n"] = counter["n"] + 1
        if n <= len(tools):
            calls = [tool_call("dump", f"c{n}_{i}") for i in range(tools[n - 1])]
            return ModelResponse(message=reply("", *calls))
        return ModelResponse(message=reply("final"))

    async def dump() -> str:
        """Return a lot."""
        return "y" * size * 4

    driver = Driver(
        model=FakeModelClient(handler),
        tools=[dump],
        context=ContextManager(
            Careless(plan), context_window=2_000, threshold=20, counter=COUNTER
        ),
        max_turns=8,
        retry=RetryPolicy(max_attempts=1),
        tool_timeout=None,
        model_timeout=None,
        compaction_timeout=None,
    )
    session = Session()

    async def go() -> None:
        result = await driver.run("start", session=session)
        assert result.outcome in ("done", "failed")
        check_history(session.history)  # never an invalid commit
        nxt = await Driver(model=FakeModelClient(lambda r: "ok")).run(
            "next", session=session
        )
        assert nxt.ok

    anyio.run(go)


# -- a compactor that asks the agent's own model ------------------------------


@attrs.frozen
class WholeTranscript:
    """Asks the agent's model to summarise `copies` copies of the whole input.

    A compactor of a user's: it sizes nothing, so its request may be over
    the window; `own` is how it names the agent's model (None, or the
    client itself).
    """

    copies: int
    reply_budget: int
    own: object = None

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        assert ctx.model_call is not None
        text = "\n".join(m.text for m in messages) * self.copies
        request = ModelRequest(
            messages=[Message.user(text or "nothing")], max_tokens=self.reply_budget
        )
        response = await ctx.model_call(request, self.own)  # type: ignore[arg-type]
        kept = [messages[0], Message.user(response.message.text), messages[-1]]
        return CompactionProposal.compacted(kept, ctx.tokens_before, 0)


def summarisers(draw: st.DrawFn, model: FakeModelClient) -> object:
    """A compactor whose summary calls go to the agent's own model."""
    kind = draw(st.sampled_from(["user", "user-named", "summarizing", "layered"]))
    if kind == "summarizing":
        return SummarizingCompactor(keep_recent_turns=1)
    if kind == "layered":
        return LayeredCompactor(preserved_turns=1, trim_turns=1)
    own = model if kind == "user-named" else None
    return WholeTranscript(draw(st.integers(1, 4)), draw(st.integers(0, 400)), own=own)


@settings(
    max_examples=sized(200), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(data=st.data())
def test_no_summary_request_to_the_agents_model_exceeds_the_window(
    data: st.DataObject,
) -> None:
    window = data.draw(st.sampled_from([1_200, 2_000, 3_000]), label="window")
    words = data.draw(st.lists(st.integers(100, 400), min_size=3, max_size=8))
    system = data.draw(st.sampled_from([None, "You are terse. " * 20]))
    # The provider's own count, as a multiple of the estimate, which a
    # calibrating manager learns: the summarisers' requests still fit.
    ratio = data.draw(st.sampled_from([1.0, 1.25, 2.0]))
    calibrate = data.draw(st.booleans())
    sizes: list[int] = []
    # Summary requests as the provider counts them, once it has said how it
    # counts (a calibrating manager learns it from the first reply's usage).
    counted: list[int] = []
    replied: list[bool] = []

    def handler(request: ModelRequest) -> ModelResponse:
        sizes.append(request_size(request))
        provider = math.ceil(input_size(request) * ratio)
        usage = Usage(input_tokens=provider)
        if request.temperature is None:  # a turn (or a careless summary call)
            replied.append(True)
            return ModelResponse(message=reply("noted " * 40), usage=usage)
        if replied:
            counted.append(provider + (request.max_tokens or 0))
        return ModelResponse(message=reply("the user asked questions"), usage=usage)

    model = FakeModelClient(handler)
    driver = Driver(
        model=model,
        system_prompt=system,
        context=ContextManager(
            summarisers(data.draw, model),  # type: ignore[arg-type]
            context_window=window,
            threshold=60,
            counter=COUNTER,
            calibrate=calibrate,
        ),
        retry=RetryPolicy(max_attempts=1),
    )
    session = Session()
    for n in words:
        result = run_all(driver, session, RunControl(), f"question {n} " + "q " * n)
        assert result.outcome in ("done", "failed")
        if not result.ok:
            assert isinstance(result.error, TurnFSMError)
            break
    assert all(size <= window for size in sizes), (sizes, window)
    if calibrate:  # and as the provider counts them
        assert all(size <= window for size in counted), (counted, window)
