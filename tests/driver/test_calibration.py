"""`ContextManager(calibrate=True)`: estimates scaled by what the provider reported.

The factor is the session's largest ratio of reported to estimated input
tokens (`Session.reported_ratio`), kept between a floor and a ceiling; it is
a projection of the log, so a new process measures with it, and a log
written before estimates were recorded still loads (and calibrates
nothing).
"""

from __future__ import annotations

import math

import pytest

from turnfsm import ContextManager, Driver
from turnfsm.context import (
    CALIBRATION_CEILING,
    CALIBRATION_FLOOR,
    CALIBRATION_HEADROOM,
    MaskingCompactor,
    TruncatingCompactor,
)
from turnfsm.core import Measured
from turnfsm.errors import ConfigError, InvalidReturn
from turnfsm.messages import Message
from turnfsm.persistence import EventRecorded, Session, SQLiteStore, TurnRecord
from turnfsm.providers import ModelRequest, ModelResponse
from turnfsm.serde import from_json, to_json
from turnfsm.testing import FakeModelClient, reply, tool_call
from turnfsm.tokens import HeuristicTokenCounter, RatioTokenCounter, default_counter
from turnfsm.values import Usage

COUNTER = HeuristicTokenCounter()


@pytest.mark.parametrize(
    ("calibrate", "ratio", "factor"),
    [
        (False, 0.6, 1.0),  # off: the estimate stands
        (True, None, 1.0),  # nothing reported yet
        (True, float("nan"), 1.0),
        (True, 0.6, 0.6 * CALIBRATION_HEADROOM),
        (True, 1.3, 1.3 * CALIBRATION_HEADROOM),  # the estimate read low: up
        (True, 0.01, CALIBRATION_FLOOR),
        (True, 50.0, CALIBRATION_CEILING),
    ],
)
def test_the_factor_is_the_observed_ratio_within_its_bounds(
    calibrate: bool, ratio: float | None, factor: float
) -> None:
    manager = ContextManager(calibrate=calibrate)
    assert manager.calibration_factor(ratio) == factor
    assert manager.calibrated(1_000, ratio) == math.ceil(1_000 * factor)


def test_the_calibrated_count_rounds_up() -> None:
    assert ContextManager(calibrate=True).calibrated(10, 0.6) == 7  # 6.12 up


def test_calibrate_must_be_a_bool() -> None:
    with pytest.raises(ConfigError, match="calibrate"):
        ContextManager(calibrate="yes")  # type: ignore[arg-type]


def test_a_turn_record_without_an_estimate_loads_and_calibrates_nothing() -> None:
    old = TurnRecord(
        run_id="run_1",
        turn=0,
        keep=0,
        added=("m1",),
        output="m2",
        usage=Usage(input_tokens=10, output_tokens=2),
    )
    stored = to_json(old)
    assert isinstance(stored, dict)
    del stored["estimate"]  # as a log written before estimates were recorded
    assert from_json(TurnRecord, stored) == old
    assert old.reported_ratio is None
    new = TurnRecord(
        run_id="run_1",
        turn=0,
        keep=0,
        added=("m1",),
        output="m2",
        usage=Usage(input_tokens=10, output_tokens=2),
        estimate=20,
    )
    assert from_json(TurnRecord, to_json(new)) == new
    assert new.reported_ratio == 0.5


def _driver(ratio: float, *, calibrate: bool = True) -> Driver:
    """A provider that counts `ratio` times turnfsm's estimate of the request."""
    seen: list[int] = []

    def handle(request: ModelRequest) -> ModelResponse:
        reported = math.ceil(COUNTER.count(list(request.messages)) * ratio)
        seen.append(reported)
        return ModelResponse(
            message=Message.assistant("noted"),
            usage=Usage(input_tokens=reported, output_tokens=1),
        )

    return Driver(
        model=FakeModelClient(handle),
        context=ContextManager(
            context_window=100_000, counter=COUNTER, calibrate=calibrate
        ),
    )


def _measured(session: Session) -> list[int]:
    run = session.runs[-1].run_id
    return [
        e.event.estimate
        for e in session.entries
        if isinstance(e, EventRecorded)
        and e.run_id == run
        and isinstance(e.event, Measured)
    ]


@pytest.mark.anyio
async def test_the_ratio_is_learned_and_a_new_process_measures_with_it(
    tmp_path: object,
) -> None:
    path = tmp_path / "s.db"  # type: ignore[operator]
    store = SQLiteStore(path)
    session = Session(store=store)
    assert (await _driver(0.5).run("remember 42 " * 40, session=session)).ok
    [turn] = session.runs[0].turns
    assert turn.estimate == COUNTER.count(list(session.history)[:1])
    assert turn.usage is not None
    assert session.reported_ratio == turn.usage.input_tokens / turn.estimate
    await store.aclose()

    store = SQLiteStore(path)  # another process: the same log
    again = await Session.load(store, session.id)
    assert again.reported_ratio == session.reported_ratio
    follow = Message.user("what was it?")
    assert (await _driver(0.5).run(follow, session=again)).ok
    estimate = COUNTER.count(list(again.history)[:3])
    assert again.reported_ratio is not None
    factor = again.reported_ratio * CALIBRATION_HEADROOM
    assert _measured(again)[0] == math.ceil(estimate * factor)
    await store.aclose()


@pytest.mark.anyio
async def test_without_calibrate_the_estimate_stands() -> None:
    session = Session()
    driver = _driver(0.5, calibrate=False)
    assert (await driver.run("remember 42 " * 40, session=session)).ok
    assert (await driver.run("and?", session=session)).ok
    assert _measured(session)[0] == COUNTER.count(list(session.history)[:3])


@pytest.mark.anyio
async def test_the_factor_is_the_largest_ratio_seen() -> None:
    session = Session()
    for ratio in (0.5, 0.8, 0.6):
        assert (await _driver(ratio).run("text " * 50, session=session)).ok
    ratios = [t.reported_ratio for run in session.runs for t in run.turns]
    assert session.reported_ratio == max(r for r in ratios if r is not None)
    assert session.reported_ratio == pytest.approx(0.8, abs=0.02)


@pytest.mark.anyio
@pytest.mark.parametrize("bogus", [40_001, 10_000_000])
async def test_a_report_past_what_the_window_allows_does_not_calibrate(
    bogus: int,
) -> None:
    """Refused where it is read: it never becomes the session's ratio."""
    calls = 0

    def handle(request: object) -> ModelResponse:
        nonlocal calls
        calls += 1
        tokens = bogus if calls == 1 else 40
        return ModelResponse(
            message=reply(f"answer {calls}"), usage=Usage(input_tokens=tokens)
        )

    d = Driver(
        model=FakeModelClient(handle),
        context=ContextManager(
            TruncatingCompactor(),
            context_window=10_000,
            counter=HeuristicTokenCounter(),
            calibrate=True,
        ),
    )
    session = Session()
    doc = "Read this: " + "word " * 2_400  # pinned, 30 % of the window
    first = await d.run(doc, session=session)
    assert isinstance(first.error, InvalidReturn)
    assert first.error.value == f"usage input_tokens={bogus}"
    assert session.reported_ratio is None
    for text in (doc, "again"):
        later = await d.run(text, session=session)
        assert later.ok, later.error


@pytest.mark.anyio
async def test_the_reply_is_held_to_the_window_as_the_request_is() -> None:
    """A provider that counts half: the request and the reply are measured alike.

    The request check is calibrated; the reply check was not, so a request
    the provider counted at half the window came back refused as over it,
    and the pass run for it, which measured calibrated, saved nothing: the
    run failed with `CompactionStalled` though it fitted.
    """
    window = 1_500
    counter = default_counter()
    provider: list[int] = []

    def handle(request: ModelRequest) -> ModelResponse:
        tokens = math.ceil(counter.count(list(request.messages)) * 0.5)
        provider.append(tokens)
        usage = Usage(input_tokens=tokens, output_tokens=1)
        if len(provider) == 1:
            return ModelResponse(
                message=reply("", tool_call("read_log", "c0")), usage=usage
            )
        if len(provider) == 2:
            return ModelResponse(
                message=reply("", tool_call("read_log", "c1")), usage=usage
            )
        return ModelResponse(message=reply("The disk is full."), usage=usage)

    def read_log() -> str:
        """Read the log."""
        return "😀" * 2_400 if len(provider) == 1 else ""

    driver = Driver(
        model=FakeModelClient(handle),
        tools=[read_log],
        context=ContextManager(
            MaskingCompactor(), context_window=window, counter=counter, calibrate=True
        ),
    )

    result = await driver.run("Audit the log.")

    assert result.ok, result.error
    assert all(tokens <= window for tokens in provider), provider


@pytest.mark.anyio
async def test_a_provider_counting_more_than_the_estimate_compacts_to_its_count() -> (
    None
):
    """A counter that reads low: the pass aims at the calibrated target.

    The lines read the calibrated size (twice the estimate), but the pass
    aimed at the manager's target in estimated tokens, which the estimate
    was already under: it cut nothing, and the run failed with
    `CompactionStalled` though it had thirty tool results to cut.
    """
    window = 4_000
    provider: list[int] = []

    def handle(request: ModelRequest) -> ModelResponse:
        tokens = 2 * COUNTER.count(list(request.messages))
        provider.append(tokens)
        usage = Usage(input_tokens=tokens, output_tokens=1)
        if len(provider) > 30:
            return ModelResponse(message=reply("done"), usage=usage)
        call = tool_call("look", f"c{len(provider)}")
        return ModelResponse(message=reply("", call), usage=usage)

    def look() -> str:
        """Look around."""
        return "lorem ipsum dolor sit amet " * 20

    driver = Driver(
        model=FakeModelClient(handle),
        tools=[look],
        max_turns=40,
        context=ContextManager(context_window=window, counter=COUNTER, calibrate=True),
    )

    result = await driver.run("Look around thirty times.")

    assert result.ok, result.error
    assert all(tokens <= window for tokens in provider), provider


@pytest.mark.anyio
async def test_a_ratio_learned_with_another_counter_does_not_scale_this_one() -> None:
    """A session continued with another counter measures with its own ratio.

    The ratio is the provider's count over the counter's estimate: one
    learned with a counter reading four times high scaled a counter that
    reads right down to a quarter, and the next run sent a request half as
    big again as its window.
    """
    window = 4_000
    provider: list[int] = []

    def handle(request: ModelRequest) -> ModelResponse:
        tokens = COUNTER.count(list(request.messages))
        provider.append(tokens)
        return ModelResponse(
            message=reply("noted"), usage=Usage(input_tokens=tokens, output_tokens=1)
        )

    def driver(counter: object, window: int) -> Driver:
        manager = ContextManager(
            context_window=window,
            counter=counter,  # type: ignore[arg-type]
            calibrate=True,
            max_messages=0,
        )
        return Driver(model=FakeModelClient(handle), context=manager)

    session = Session()
    high = driver(RatioTokenCounter(chars_per_token=1), 100_000)
    for _ in range(6):
        assert (await high.run("lorem ipsum dolor sit amet " * 150, session=session)).ok
    assert session.reported_ratio is not None
    assert session.reported_ratio < 0.3
    assert provider[-1] > window  # the conversation is over the next window
    provider.clear()

    result = await driver(COUNTER, window).run("and now?", session=session)

    assert result.ok, result.error
    assert provider, "no request was sent"
    assert all(tokens <= window for tokens in provider), provider
