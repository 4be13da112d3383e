"""Per-turn orchestration overhead of the turnfsm driver vs a hand-written loop.

Both loops run in this process, on the same event loop, against the same
instant model (it answers at once with one tool call until the last turn)
and the same instant async tool. The hand-written loop is the baseline: it
calls the model, runs the tool, appends the messages - nothing else. The
difference per turn is what turnfsm costs: the Turn FSM, incremental token
measuring of the whole request, hooks dispatch, the audit trail, retries.

    python bench/orchestration.py            # 1,000 and 10,000 turns
    python bench/orchestration.py 2000       # custom turn counts

Prints µs per turn for both, the overhead, the ratio, and the mean turn
time of the first 100 vs the last 100 turns (flat means no growth with
history length).
"""

from __future__ import annotations

import gc
import statistics
import sys
import time

import anyio
from transitions import Machine

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
from turnfsm.messages import Message, MessageLog, ToolCallPart
from turnfsm.providers import ModelRequest, ModelResponse

TARGET_US = 30.0


class InstantModel:
    """Replies at once: a tool call for `turns - 1` turns, then a final answer."""

    def __init__(self, turns: int) -> None:
        self.turns = turns
        self.calls = 0
        self.stamps: list[float] = []
        self.call = Message.assistant(
            "", tool_calls=[ToolCallPart(id="c", name="noop", arguments={})]
        )
        self.final = Message.assistant("done")

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.stamps.append(time.perf_counter())
        self.calls += 1
        message = self.call if self.calls < self.turns else self.final
        return ModelResponse(message=message)


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


async def turnfsm_loop(turns: int) -> InstantModel:
    """The same work through Driver.run."""
    model = InstantModel(turns)
    driver = Driver(
        model=model,
        tools=[noop],
        context=ContextManager(context_window=10**12),
        max_turns=turns + 1,
        tool_timeout=None,
        model_timeout=None,
    )
    result = await driver.run("go", session=Session())
    assert result.ok, result.error
    return model


def brain_only_us(turns: int) -> float:
    """The Turn FSM alone: three events per tool turn, no driver, no I/O."""
    machine = TurnMachine.start(
        default_machine(), budget=Budget(context_window=10**12, max_turns=turns + 1)
    )
    machine.handle(RunStarted(input=[Message.user("go")]))
    call = InstantModel(turns).call
    measured = Measured(estimate=100)
    replied = ModelReplied(message=call)
    finished = ToolsFinished(results=[Message.tool_result("c", "ok")])
    t0 = time.perf_counter()
    for _ in range(turns):
        machine.handle(measured)
        machine.handle(replied)
        machine.handle(finished)
    return (time.perf_counter() - t0) / turns * 1e6


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
    t0 = time.perf_counter()
    for _ in range(turns):
        for event in events:
            event.trigger(model)
    return (time.perf_counter() - t0) / turns * 1e6


def _per_turn_us(model: InstantModel) -> tuple[float, float]:
    gaps = [b - a for a, b in zip(model.stamps, model.stamps[1:], strict=False)]
    head = statistics.fmean(gaps[:100]) * 1e6
    tail = statistics.fmean(gaps[-100:]) * 1e6
    return head, tail


async def measure(turns: int) -> None:
    await raw_loop(200)  # warm up both paths
    await turnfsm_loop(200)
    gc.collect()
    t0 = time.perf_counter()
    raw = await raw_loop(turns)
    t1 = time.perf_counter()
    ours = await turnfsm_loop(turns)
    t2 = time.perf_counter()
    raw_us = (t1 - t0) / turns * 1e6
    ours_us = (t2 - t1) / turns * 1e6
    overhead = ours_us - raw_us
    head, tail = _per_turn_us(ours)
    raw_head, raw_tail = _per_turn_us(raw)
    brain = brain_only_us(turns)
    floor = bare_transitions_us(turns)
    verdict = "OK" if overhead <= TARGET_US else "over target"
    print(
        f"{turns:>6} turns | raw loop {raw_us:7.1f} µs/turn | turnfsm {ours_us:7.1f} "
        f"µs/turn | overhead {overhead:6.1f} µs/turn ({verdict}, target "
        f"{TARGET_US:.0f}) | ratio {ours_us / raw_us:5.1f}x"
    )
    print(
        f"{'':>6}       | first-100 vs last-100 turns: turnfsm {head:6.1f} -> "
        f"{tail:6.1f} µs ({tail / head:4.2f}x), raw {raw_head:5.1f} -> "
        f"{raw_tail:5.1f} µs ({raw_tail / raw_head:4.2f}x)"
    )
    print(
        f"{'':>6}       | of the overhead: the Turn FSM alone {brain:6.1f} µs/turn "
        f"(3 events; bare `transitions` firing 3 triggers: {floor:5.1f}), "
        f"the driver {overhead - brain:6.1f} µs/turn"
    )


def main(argv: list[str]) -> None:
    counts = [int(a) for a in argv] or [1_000, 10_000]
    for turns in counts:
        anyio.run(measure, turns)


if __name__ == "__main__":
    main(sys.argv[1:])
