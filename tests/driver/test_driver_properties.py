"""Whatever the window, threshold, tool outputs and extras: no request over the
window is ever sent, and every run ends with an answer or a typed error."""

from __future__ import annotations

import json

import anyio
import attrs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from turnfsm.context import ContextManager, TruncatingCompactor
from turnfsm.driver import Driver, RetryPolicy, Session
from turnfsm.errors import CONTEXT_OVERFLOW, ProviderError, TurnFSMError
from turnfsm.providers import ModelRequest, ModelResponse
from turnfsm.testing import reply, tool_call
from turnfsm.tokens import HeuristicTokenCounter, Meter

COUNTER = HeuristicTokenCounter()


def request_size(request: ModelRequest) -> int:
    extras = [request.system or ""]
    if request.tools:
        extras.append(json.dumps([attrs.asdict(t) for t in request.tools]))
    return Meter(COUNTER).measure(
        list(request.messages), extras=[e for e in extras if e]
    )


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
        "preserve_recent": draw(st.integers(1, 4)),
        "min_messages": draw(st.integers(2, 6)),
    }


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(scenarios())
def test_no_request_exceeds_the_window_and_every_run_terminates(
    s: dict[str, object],
) -> None:
    window = int(s["window"])  # type: ignore[call-overload]
    outputs: list[int] = s["outputs"]  # type: ignore[assignment]
    sizes: list[int] = []

    def handler(request: ModelRequest) -> ModelResponse:
        sizes.append(request_size(request))
        turn = len(sizes) - 1
        if turn in s["overflow_on"]:  # type: ignore[operator]
            raise ProviderError("too long", kind=CONTEXT_OVERFLOW)
        if turn < len(outputs):
            calls = [
                tool_call("dump", f"c{turn}_{i}", size=outputs[turn])
                for i in range(int(s["parallel"]))
            ]  # type: ignore[call-overload]
            return ModelResponse(message=reply("", *calls))
        return ModelResponse(message=reply("final"))

    def dump(size: int) -> str:
        """Return `size` characters."""
        return "y" * size

    from turnfsm.testing import FakeModelClient

    driver = Driver(
        model=FakeModelClient(handler),
        tools=[dump],
        system_prompt=str(s["system"]) or None,
        context=ContextManager(
            TruncatingCompactor(
                preserve_recent=int(s["preserve_recent"]),  # type: ignore[call-overload]
                min_messages=int(s["min_messages"]),  # type: ignore[call-overload]
            ),
            context_window=window,
            threshold=int(s["threshold"]),  # type: ignore[call-overload]
            auto_compact=bool(s["auto_compact"]),
            counter=COUNTER,
        ),
        max_turns=10,
        retry=RetryPolicy(max_attempts=1),
    )

    async def go() -> None:
        with anyio.fail_after(10):
            result = await driver.run("start", session=Session())
        assert result.outcome in ("done", "failed")
        if result.outcome == "done":
            assert result.error is None
            assert result.text == "final"
        else:
            assert isinstance(result.error, TurnFSMError)

    anyio.run(go)
    if window:
        assert all(size <= window for size in sizes), (sizes, window)
