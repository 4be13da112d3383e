"""Per-turn orchestration overhead of the turnfsm driver vs a hand-written loop.

Both loops run in this process, on the same event loop, against the same
instant model (it answers at once with one tool call until the last turn)
and the same instant async tool. The hand-written loop is the baseline: it
calls the model, runs the tool, appends the messages - nothing else. The
difference per turn is what turnfsm costs: the Turn FSM, incremental token
measuring of the whole request, the tool-pair check, the session log (a
`MemoryStore`), the audit trail, the deadlines and one checkpoint per step.

    python bench/orchestration.py            # 10,000 turns for flatness
    python bench/orchestration.py 20000      # a custom long run

Reports, in one run:

- µs per tool turn with the Driver's default timeouts (tool 60 s, model
  300 s: one cancel scope each) and with no timeouts (best of 5 runs of
  2,000 turns);
- the floor under the tool turn's goal: bare `transitions` plus what anyio
  itself takes for the turn's two deadlines and two checkpoints;
- the cost of a whole 1-turn run (one Driver reused, a fresh Session each);
- a 1-turn run on a 10,000-message session by a new Driver each time (a
  server that builds its agent per request), as a ratio to the same run on
  a new session;
- flatness: the mean turn of the last 100 vs the first 100 of a long run;
- the ratio to the baseline loop;
- where the overhead goes: cProfile own time per module group (the time of
  stdlib / attrs / builtins calls is charged to the caller that made them),
  as shares applied to the unprofiled overhead. cProfile inflates code made
  of many small calls (transitions) more than the rest: read the split as
  proportions, the totals above as the measurement.

The machine is noisy when other work shares it: every figure is a best of
several runs, and the per-step numbers of the brain alone are measured in
isolation for reference.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import anyio
from opentelemetry import context as otel_context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.trace import set_span_in_context
from transitions import Machine

from turnfsm import Agent
from turnfsm._resources import default_machine
from turnfsm.context import ContextManager
from turnfsm.core import (
    Budget,
    Measured,
    ModelReplied,
    RunStarted,
    ToolsFinished,
    TurnMachine,
)
from turnfsm.driver import Driver, Session
from turnfsm.hooks import Hook
from turnfsm.messages import Message, MessageLog, ToolCallPart
from turnfsm.providers import ModelRequest, ModelResponse
from turnfsm.tracing import TracingHook
from turnfsm.tracing import attributes as A

GOAL_TURN_US = 80.0
GOAL_TURN_X = 2.5  # a tool turn, x bare `transitions` firing its 3 triggers
GOAL_BRAIN_X = 1.5  # the brain alone, x the same
GOAL_RUN_US = 150.0
GOAL_FLAT = 1.2
GOAL_TRACED = 1.5
GOAL_NEW_AGENT_US = 500.0
AGENTS = 500
TURNS = 2_000
REPEATS = 5
LONG_SESSION = 10_000  # messages of the session a 1-turn run is measured on
SHORT_RUNS = 300


class InstantModel:
    """Replies at once: a tool call for `turns - 1` turns, then a final answer.

    Each reply is a new message with a call id of its own, as a provider's
    client makes them (the same for the hand-written loop and the driver).
    """

    def __init__(self, turns: int) -> None:
        self.turns = turns
        self.calls = 0
        self.stamps: list[float] = []

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.stamps.append(time.perf_counter())
        self.calls += 1
        if self.calls < self.turns:
            call = ToolCallPart(id=f"call_{self.calls}", name="noop", arguments={})
            return ModelResponse(message=Message.assistant("", tool_calls=[call]))
        return ModelResponse(message=Message.assistant("done"))


async def noop() -> str:
    """Do nothing."""
    return "ok"


async def raw_loop(turns: int) -> InstantModel:
    """The baseline: the loop anyone would write by hand."""
    model = InstantModel(turns)
    # A MessageLog appends in O(1) and is handed to the request without a copy,
    # so the baseline stays flat too (a plain list would be copied per request).
    messages = MessageLog([Message.user("go")])
    tools = {"noop": noop}
    while True:
        reply = (await model.complete(ModelRequest(messages=messages))).message
        messages = messages.append(reply)
        if not reply.tool_calls:
            return model
        for call in reply.tool_calls:
            output = await tools[call.name]()
            messages = messages.append(Message.tool_result(call.id, output))


def _driver(
    model: InstantModel, turns: int, *, timeouts: bool, hooks: Sequence[Hook] = ()
) -> Driver:
    limits: dict[str, Any] = {} if timeouts else {"tool_timeout": None}
    if not timeouts:
        limits["model_timeout"] = None
    return Driver(
        model=model,
        tools=[noop],
        context=ContextManager(context_window=100_000_000, max_messages=0),
        max_turns=turns + 1,
        hooks=hooks,
        tracing=False,
        **limits,
    )


async def turnfsm_loop(
    turns: int, *, timeouts: bool = True, hooks: Sequence[Hook] = ()
) -> InstantModel:
    """The same work through Driver.run (a MemoryStore session, the log on)."""
    model = InstantModel(turns)
    driver = _driver(model, turns, timeouts=timeouts, hooks=hooks)
    result = await driver.run("go", session=Session())
    assert result.ok, result.error
    return model


class _Dropped(SpanExporter):
    """Takes every batch and sends it nowhere: the SDK's work, no network."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS


def tracing_hook() -> tuple[Hook, _Dropped, TracerProvider]:
    """A `TracingHook` on an SDK provider with a batch processor, metrics on."""
    exporter = _Dropped()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=1 << 20))
    meters = MeterProvider(metric_readers=[InMemoryMetricReader()])
    return (
        TracingHook(tracer_provider=provider, meter_provider=meters),
        exporter,
        provider,
    )


async def traced_ratio() -> tuple[float, float, float, int]:
    """Per-turn µs with tracing off, on, and the SDK's own share (interleaved).

    The SDK's share is `sdk_turn_us`: the same spans, events and metric
    records a traced tool turn makes, straight on the SDK.
    """
    hook, exporter, provider = tracing_hook()

    async def traced(turns: int) -> InstantModel:
        return await turnfsm_loop(turns, hooks=[hook])

    await traced(300)
    off = on = sdk = float("inf")
    for _ in range(3):  # interleaved, so drift hits both alike
        off = min(off, await _best_us(turnfsm_loop, TURNS))
        on = min(on, await _best_us(traced, TURNS))
        sdk = min(sdk, sdk_turn_us(TURNS))
    provider.shutdown()
    return off, on, sdk, exporter.spans


def sdk_turn_us(turns: int) -> float:
    """µs per turn of a traced tool turn's telemetry made on the SDK directly.

    What `TracingHook` emits per tool turn, with its attributes: a turn
    span, three ``turnfsm.transition`` events on it, a ``chat`` span and an
    ``execute_tool`` span (each made current while it runs), two operation
    durations and three phase durations. On the same kind of providers as
    `tracing_hook` (batch processor, metrics on), in a tight loop: a lower
    bound of what any hook over this SDK pays (inside a run, between the
    driver's steps, the same calls run slower: the caches are colder).
    """
    _, _, provider = tracing_hook()
    tracer = provider.get_tracer("bench")
    meter = MeterProvider(metric_readers=[InMemoryMetricReader()]).get_meter("b")
    duration = meter.create_histogram(A.METRIC_OPERATION_DURATION, unit="s")
    phases = meter.create_histogram(A.METRIC_PHASE_DURATION, unit="s")
    root = tracer.start_span(f"{A.OP_INVOKE_AGENT} bench")
    root_context = set_span_in_context(root)
    step = {
        A.TRANSITION_FROM: "call_llm",
        A.TRANSITION_TO: "run_tools",
        A.TRANSITION_TRIGGER: "model_replied",
        A.TRANSITION_INDEX: 3,
        A.TRANSITION_GUARDS: ("has_tool_calls",),
        A.ESTIMATE: 120,
        A.ESTIMATE_SOURCE: "estimated",
    }
    chat = {
        A.OPERATION_NAME: A.OP_CHAT,
        A.CONVERSATION_ID: "ses_1",
        A.ATTEMPT: 1,
        A.PURPOSE: "turn",
        A.PROVIDER_NAME: "bench",
    }
    tool = {
        A.OPERATION_NAME: A.OP_EXECUTE_TOOL,
        A.TOOL_NAME: "noop",
        A.TOOL_CALL_ID: "call_1",
        A.TOOL_TYPE: "function",
        A.CONVERSATION_ID: "ses_1",
    }
    labels = {A.OPERATION_NAME: A.OP_CHAT}

    def turn(number: int) -> None:
        span = tracer.start_span(
            f"{A.SPAN_TURN} {number}",
            context=root_context,
            attributes={A.TURN_NUMBER: number},
        )
        context = set_span_in_context(span)
        for phase in ("measure", "call_llm", "run_tools"):
            span.add_event(A.EVENT_TRANSITION, step)
            phases.record(1e-5, {A.PHASE: phase})
        for name, attributes in (("chat bench", chat), ("execute_tool noop", tool)):
            inner = tracer.start_span(name, context=context, attributes=attributes)
            token = otel_context.attach(set_span_in_context(inner))
            otel_context.detach(token)
            duration.record(1e-5, labels)
            inner.end()
        span.end()

    for number in range(300):
        turn(number)
    gc.collect()
    start = time.perf_counter()
    for number in range(turns):
        turn(number)
    elapsed = time.perf_counter() - start
    root.end()
    provider.shutdown()
    return elapsed / turns * 1e6


async def _best_us(loop: Callable[[int], Any], turns: int) -> float:
    best = float("inf")
    for _ in range(REPEATS):
        gc.collect()
        t0 = time.perf_counter()
        await loop(turns)
        best = min(best, (time.perf_counter() - t0) / turns * 1e6)
    return best


async def one_turn_run_us() -> float:
    """A whole run that makes one model call (no tool): open, 3 events, end."""
    driver = _driver(InstantModel(1), 1, timeouts=True)
    best = float("inf")
    for _ in range(REPEATS + 2):
        t0 = time.perf_counter()
        for _ in range(SHORT_RUNS):
            await driver.run("go", session=Session())
        best = min(best, (time.perf_counter() - t0) / SHORT_RUNS * 1e6)
    return best


def search(query: str, limit: int = 5) -> str:
    """Search the notes (a tool given as a function)."""
    return query


def lookup(key: str) -> str:
    """Look a key up (a tool given as a function)."""
    return key


def new_agent_us() -> tuple[float, float]:
    """A new `Agent` per request (two function tools), and a bare machine start.

    The baseline is `TurnMachine.start` on the stock machine: the least a
    run needs before its first event.
    """
    model = InstantModel(1)
    Agent(model=model, tools=[search, lookup])  # the first checks the schemas
    agent = machine = float("inf")
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        for _ in range(AGENTS):
            Agent(model=model, tools=[search, lookup])
        agent = min(agent, (time.perf_counter() - t0) / AGENTS * 1e6)
        t0 = time.perf_counter()
        for _ in range(AGENTS):
            TurnMachine.start(default_machine())
        machine = min(machine, (time.perf_counter() - t0) / AGENTS * 1e6)
    return agent, machine


def brain_only_us(turns: int) -> float:
    """The Turn FSM alone: three events per tool turn, no driver, no I/O.

    Each turn's reply and result are messages of their own (a message joins
    a conversation once), made before the clock starts.
    """
    best = float("inf")
    measured = Measured(estimate=100)
    for _ in range(REPEATS):
        steps = []
        for n in range(turns):
            call = ToolCallPart(id=f"c{n}", name="noop", arguments={})
            steps.append(
                (
                    ModelReplied(message=Message.assistant("", tool_calls=[call])),
                    ToolsFinished(results=[Message.tool_result(call.id, "ok")]),
                )
            )
        machine = TurnMachine.start(
            default_machine(),
            budget=Budget(context_window=100_000_000, max_turns=turns + 1),
        )
        machine.handle(RunStarted(input=[Message.user("go")]))
        t0 = time.perf_counter()
        for replied, finished in steps:
            machine.handle(measured)
            machine.handle(replied)
            machine.handle(finished)
        best = min(best, (time.perf_counter() - t0) / turns * 1e6)
    return best


def bare_transitions_us(turns: int) -> float:
    """The floor: `transitions` itself firing 3 triggers, with no-op callbacks."""

    class Model:
        pass

    model = Model()
    machine = Machine(
        model=model,
        states=["start", "call_llm", "run_tools"],
        initial="start",
        auto_transitions=False,
        send_event=True,
    )
    for trigger, source, dest in (
        ("measured", "start", "call_llm"),
        ("model_replied", "call_llm", "run_tools"),
        ("tools_finished", "run_tools", "start"),
    ):
        machine.add_transition(trigger, source, dest, before=[lambda event: None])
    events = [
        machine.events[t] for t in ("measured", "model_replied", "tools_finished")
    ]
    best = float("inf")
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        for _ in range(turns):
            for event in events:
                event.trigger(model)
        best = min(best, (time.perf_counter() - t0) / turns * 1e6)
    return best


async def anyio_floor_us(turns: int) -> float:
    """What anyio itself costs a tool turn with the default timeouts.

    Two cancel scopes with a deadline (the model call's and the tool's) and
    two checkpoints (one per step that waits: where a cancel lands and other
    tasks run), each as bare as anyio makes it, the checkpoint in the scope.
    """
    best = float("inf")
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        for _ in range(turns):
            for _ in range(2):
                with anyio.CancelScope(deadline=anyio.current_time() + 60):
                    await anyio.lowlevel.checkpoint()
        best = min(best, (time.perf_counter() - t0) / turns * 1e6)
    return best


def _flatness(model: InstantModel) -> tuple[float, float]:
    gaps = [b - a for a, b in zip(model.stamps, model.stamps[1:], strict=False)]
    return statistics.fmean(gaps[:100]) * 1e6, statistics.fmean(gaps[-100:]) * 1e6


# -- the profile split -------------------------------------------------------

GROUPS = ("transitions", "core", "messages", "tokens", "store", "driver", "anyio")
_OPEN_CALLS = {"of", "then", "_step", "require_closed"}


def _group(func: tuple[str, int, str]) -> str | None:
    path, _line, name = func
    path = path.replace("\\", "/")
    if "/transitions/" in path:
        return "transitions"
    if "/turnfsm/core/" in path:
        return "core"
    if path.endswith("/turnfsm/messages/_open_calls.py") and name in _OPEN_CALLS:
        return "messages"
    if "/turnfsm/tokens/" in path:
        return "tokens"
    if "/turnfsm/persistence/" in path:
        return "store"
    if any(f"/turnfsm/{p}/" in path for p in ("driver", "hooks", "providers")):
        return "driver"
    if any(p in path for p in ("/anyio/", "/asyncio/", "/sniffio/")):
        return "anyio"
    if path.endswith("orchestration.py"):
        return "bench"
    return None  # stdlib, attrs, builtins, other turnfsm modules: the caller's


def profile_split(turns: int) -> dict[str, float]:
    """Own time per group of a profiled run, as fractions of the whole."""
    profiler = cProfile.Profile()

    async def run() -> None:
        await turnfsm_loop(200)
        profiler.enable()
        await turnfsm_loop(turns)
        profiler.disable()

    anyio.run(run)
    stats: dict[Any, Any] = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    shares: dict[Any, dict[str, float]] = {}

    def share(func: Any, depth: int = 0) -> dict[str, float]:
        """Whose time `func`'s own time is: its group, or its callers' (by time)."""
        if func in shares:
            return shares[func]
        group = _group(func)
        callers = stats[func][4] if func in stats else {}
        total = sum(c[2] for c in callers.values())
        if group is not None or depth > 30 or not total:
            result = {group or "other": 1.0}
        else:
            result = {}
            for caller, c in callers.items():
                for g, f in share(caller, depth + 1).items():
                    result[g] = result.get(g, 0.0) + c[2] / total * f
        shares[func] = result
        return result

    own: dict[str, float] = {}
    for func, (_cc, _nc, tottime, _ct, _callers) in stats.items():
        for g, f in share(func).items():
            own[g] = own.get(g, 0.0) + tottime * f
    whole = sum(own.values())
    return {g: t / whole for g, t in own.items()}


# -- the report --------------------------------------------------------------


def _verdict(value: float, goal: float) -> str:
    return "OK" if value <= goal else "over the goal"


async def long_session_run_us(messages: int) -> tuple[float, float]:
    """A 1-turn run on a session of about `messages` messages, a new driver each.

    The pattern of a server that builds its agent per request: every run
    brings a new counter (equal to the last one's) to the same long session.
    Returns the best of a few runs and of the same on a new session.
    """
    turns = messages // 2
    session = Session()
    await _driver(InstantModel(turns), turns, timeouts=True).run("go", session=session)

    async def best(target: Callable[[], Session]) -> float:
        times = []
        for _ in range(REPEATS):
            driver = _driver(InstantModel(1), 1, timeouts=True)
            gc.collect()
            t0 = time.perf_counter()
            result = await driver.run("again", session=target())
            times.append(time.perf_counter() - t0)
            assert result.ok, result.error
        return min(times) * 1e6

    return await best(lambda: session), await best(Session)


async def measure(long_turns: int) -> dict[str, float]:
    await raw_loop(300)  # warm up every path
    await turnfsm_loop(300)
    await turnfsm_loop(300, timeouts=False)
    raw = await _best_us(raw_loop, TURNS)
    ours = await _best_us(turnfsm_loop, TURNS)

    async def untimed(turns: int) -> InstantModel:
        return await turnfsm_loop(turns, timeouts=False)

    bare = await _best_us(untimed, TURNS)
    run_us = await one_turn_run_us()
    anyio_us = await anyio_floor_us(TURNS)
    gc.collect()
    head, tail = _flatness(await turnfsm_loop(long_turns))
    return {
        "raw": raw,
        "ours": ours,
        "untimed": bare,
        "run": run_us,
        "anyio": anyio_us,
        "head": head,
        "tail": tail,
    }


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "turns",
        nargs="?",
        type=int,
        default=10_000,
        help="turns of the long run that measures flatness (default 10,000)",
    )
    long_turns = parser.parse_args(argv).turns
    m = anyio.run(measure, long_turns)
    raw, ours = m["raw"], m["ours"]
    overhead = ours - raw
    flat = m["tail"] / m["head"]
    floor = bare_transitions_us(TURNS)
    print(f"turnfsm orchestration, {TURNS:,}-turn runs (best of {REPEATS})")
    print(
        f"  per tool turn, default timeouts  {ours:7.1f} µs  "
        f"({_verdict(ours, GOAL_TURN_US)}, goal {GOAL_TURN_US:.0f}) = "
        f"{ours / floor:4.1f}x bare `transitions` "
        f"({_verdict(ours / floor, GOAL_TURN_X)}, goal {GOAL_TURN_X}x)"
    )
    print(f"  per tool turn, no timeouts       {m['untimed']:7.1f} µs")
    least = floor + m["anyio"]
    print(
        f"    the floor under the goal: bare `transitions` {floor:4.1f} + anyio's "
        f"2 deadline scopes and 2 checkpoints {m['anyio']:4.1f} = {least:4.1f} µs "
        f"= {least / floor:4.2f}x, leaving {GOAL_TURN_X * floor - least:5.1f} µs "
        "of the goal for the rest"
    )
    print(
        f"  a 1-turn run (open .. end)       {m['run']:7.1f} µs  "
        f"({_verdict(m['run'], GOAL_RUN_US)}, goal {GOAL_RUN_US:.0f})"
    )
    print(
        f"  flatness, {long_turns:,} turns       first-100 {m['head']:6.1f} -> "
        f"last-100 {m['tail']:6.1f} µs = {flat:4.2f}x "
        f"({_verdict(flat, GOAL_FLAT)}, goal {GOAL_FLAT})"
    )
    print(
        f"  baseline (hand-written loop)     {raw:7.1f} µs  -> ratio "
        f"{ours / raw:4.1f}x, overhead {overhead:6.1f} µs per turn"
    )
    agent, start = new_agent_us()
    print(
        f"  a new Agent per request (2 tools) {agent:6.1f} µs "
        f"({_verdict(agent, GOAL_NEW_AGENT_US)}, goal {GOAL_NEW_AGENT_US:.0f}); "
        f"bare TurnMachine.start {start:5.1f} µs -> {agent / start:4.1f}x"
    )
    long_run, fresh_run = anyio.run(long_session_run_us, LONG_SESSION)
    print(
        f"  a 1-turn run on a {LONG_SESSION:,}-message session, a new driver each "
        f"{long_run:8.1f} µs vs {fresh_run:6.1f} on a new session -> "
        f"{long_run / fresh_run:5.1f}x"
    )
    brain = brain_only_us(TURNS)
    print(
        f"  in isolation: the brain (3 events) {brain:5.1f} µs, bare "
        f"`transitions` firing 3 triggers {floor:5.1f} µs -> {brain / floor:4.2f}x "
        f"({_verdict(brain / floor, GOAL_BRAIN_X)}, goal {GOAL_BRAIN_X}x)"
    )
    off, on, sdk, spans = anyio.run(traced_ratio)
    print(
        f"  tracing on (batch processor, no network, metrics on) {on:7.1f} µs vs "
        f"off {off:7.1f} µs -> {on / off:4.2f}x "
        f"({_verdict(on / off, GOAL_TRACED)}, goal {GOAL_TRACED}); "
        f"{spans:,} spans exported"
    )
    print(
        f"    of the {on - off:5.1f} µs tracing adds to a turn, the SDK's own work "
        f"for the same spans, events and metrics, in a loop of its own (warm "
        f"caches: a lower bound), is {sdk:5.1f} µs: off + that = "
        f"{(off + sdk) / off:4.2f}x"
    )
    split = profile_split(TURNS)
    print(
        "  overhead split (cProfile own time by module, stdlib/attrs charged "
        "to the caller; shares of the unprofiled turn):"
    )
    labels = {
        "transitions": "transitions",
        "core": "core (brain minus transitions)",
        "messages": "messages (the OpenCalls check)",
        "tokens": "tokens (Meter, counter)",
        "store": "store (Session.append, MemoryStore, records)",
        "driver": "driver (loop, effects, hooks, tools)",
        "anyio": "anyio / asyncio (checkpoints, cancel scopes)",
    }
    baseline_share = split.get("bench", 0.0) + split.get("other", 0.0)
    for group in GROUPS:
        us = split.get(group, 0.0) * ours
        if group == "driver":
            # The driver's effects do the baseline's own work (model call,
            # tool call, result message): that is not overhead.
            us -= max(0.0, raw - baseline_share * ours)
        print(f"    {labels[group]:46} {us:6.1f} µs")


if __name__ == "__main__":
    main(sys.argv[1:])
