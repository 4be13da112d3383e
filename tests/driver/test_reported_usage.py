"""Seed 004's trigger: `ContextManager(use_reported_usage=True)`.

After a reply that reports its input tokens, the next measurement is that
report plus the manager's count of what was added since, plus the reply
budget; a run's first measurement and the one after a compaction are the
estimate.
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.profiles import sized
from turnfsm.context import ContextManager, LayeredCompactor, TruncatingCompactor
from turnfsm.core import CompactionResult, Measured, ModelReplied, ToolsFinished
from turnfsm.driver import Driver, RunResult, Session
from turnfsm.errors import InvalidReturn
from turnfsm.messages import Message, Role
from turnfsm.persistence import RunRecord
from turnfsm.providers import ModelRequest, ModelResponse
from turnfsm.testing import (
    ExtractiveSummaryModel,
    FakeModelClient,
    reply,
    tool_call,
)
from turnfsm.tokens import HeuristicTokenCounter
from turnfsm.values import Usage

pytestmark = pytest.mark.anyio

COUNTER = HeuristicTokenCounter()
WINDOW = 10_000  # threshold 80: the threshold line is 8,000 tokens
SYSTEM = "You read files and answer briefly."


def read_file(path: str) -> str:
    """Read a file.

    Args:
        path: the file.
    """
    return f"{path}: " + "log line 12345\n" * 30


def model(reported: Sequence[int | None], *, tool_calls: int = 2) -> FakeModelClient:
    """Per run: `tool_calls` replies that read a file, then a final answer.

    The i-th reply of a run reports ``Usage(input_tokens=reported[i])`` (the
    last one repeats; None: no usage at all).
    """

    def handle(request: ModelRequest) -> ModelResponse:
        messages = list(request.messages)
        last_user = max(i for i, m in enumerate(messages) if m.role is Role.USER)
        done = sum(m.role is Role.TOOL for m in messages[last_user:])
        if done < tool_calls:
            call = tool_call("read_file", f"c{done + 1}", path=f"f{done + 1}")
            message = reply("", call)
        else:
            message = reply("final")
        n = reported[min(done, len(reported) - 1)]
        if n is None:
            return ModelResponse(message=message)
        return ModelResponse(
            message=message, usage=Usage(input_tokens=n, output_tokens=3)
        )

    return FakeModelClient(handle)


def manager(*, use_reported_usage: bool) -> ContextManager:
    return ContextManager(
        TruncatingCompactor(),
        context_window=WINDOW,
        threshold=80,
        counter=COUNTER,
        use_reported_usage=use_reported_usage,
    )


def seed(turns: int = 4, size: int = 400) -> list[Message]:
    out: list[Message] = []
    for i in range(turns):
        out.append(Message.user(f"question {i} " + "q" * size))
        out.append(Message.assistant(f"answer {i} " + "a" * size))
    out.append(Message.user("read f1 and f2, then answer"))
    return out


def driver(
    client: FakeModelClient, *, use_reported_usage: bool, budget: int | None = 64
) -> Driver:
    return Driver(
        model=client,
        tools=[read_file],
        system_prompt=SYSTEM,
        context=manager(use_reported_usage=use_reported_usage),
        max_output_tokens=budget,
    )


def measures(run: RunRecord) -> list[int]:
    return [e.estimate for e in run.events if isinstance(e, Measured)]


def expected_from_reports(
    run: RunRecord, context: ContextManager, budget: int | None
) -> list[int | None]:
    """Per Measured of `run`: report + count(added since) + budget, or None.

    None where there is no report to stand on (the run's first measurement,
    or right after a compaction).
    """
    out: list[int | None] = []
    report: int | None = None
    added: list[Message] = []
    for event in run.events:
        if isinstance(event, ModelReplied):
            if event.usage is not None and event.usage.input_tokens:
                report, added = event.usage.input_tokens, [event.message]
            else:
                added.append(event.message)
        elif isinstance(event, ToolsFinished):
            added.extend(event.results)
        elif isinstance(event, CompactionResult):
            report, added = None, []
        elif isinstance(event, Measured):
            out.append(
                None
                if report is None
                else report + context.count(added) + (budget or 0)
            )
    return out


async def run_once(d: Driver, session: Session | None = None) -> RunResult:
    result = await d.run(seed(), session=session or Session())
    assert result.ok, result.error
    return result


@pytest.mark.parametrize("budget", [64, None])
async def test_after_a_reply_the_measure_is_the_report_plus_what_was_added(
    budget: int | None,
) -> None:
    n = 1_234
    d = driver(model([n]), use_reported_usage=True, budget=budget)
    session = Session()
    await run_once(d, session)
    (run,) = session.runs
    got = measures(run)
    assert len(got) == 3  # before each of the 3 model calls
    expected = expected_from_reports(run, d.context, budget)  # type: ignore[arg-type]
    assert expected[0] is None
    assert got[1:] == expected[1:]
    # Spelled out for the first report: the reply and its tool result.
    replied = next(e for e in run.events if isinstance(e, ModelReplied))
    finished = next(e for e in run.events if isinstance(e, ToolsFinished))
    assert got[1] == n + COUNTER.count([replied.message, *finished.results]) + (
        budget or 0
    )


async def test_a_session_s_first_measure_is_the_estimate_then_the_last_report() -> None:
    """A run starts from the estimate when the session has no report yet, and
    from the session's last report (plus what came after it) when it has one."""
    reported = driver(model([6_000]), use_reported_usage=True)
    estimated = driver(model([6_000]), use_reported_usage=False)
    with_report, without = Session(), Session()
    for _ in range(2):
        await run_once(reported, with_report)
        await run_once(estimated, without)
    first, second = with_report.runs
    assert measures(first)[0] == measures(without.runs[0])[0]
    assert measures(first)[0] < 6_000 < measures(first)[1]
    assert measures(second)[0] > 6_000 > measures(without.runs[1])[0]
    assert [r.compactions for r in with_report.runs] == [(), ()]


async def test_the_second_measure_differs_from_the_estimate() -> None:
    reported = driver(model([5]), use_reported_usage=True)
    estimated = driver(model([5]), use_reported_usage=False)
    a, b = Session(), Session()
    await run_once(reported, a)
    await run_once(estimated, b)
    first_a, first_b = measures(a.runs[0]), measures(b.runs[0])
    assert first_a[0] == first_b[0]
    assert first_a[1] < first_b[1]  # 5 reported tokens stand in for the history


async def test_a_large_report_crosses_the_threshold_and_compacts() -> None:
    client = model([9_000, 400])
    d = driver(client, use_reported_usage=True)
    session = Session()
    await run_once(d, session)
    (run,) = session.runs
    got = measures(run)
    # The estimate alone stays far under the threshold line...
    twin = Session()
    await run_once(driver(model([9_000, 400]), use_reported_usage=False), twin)
    assert max(measures(twin.runs[0])) < 8_000
    assert twin.runs[0].compactions == ()
    # ...but the report puts the second measure over it, and the run compacts.
    assert got[0] < 8_000 < got[1]
    (record,) = run.compactions
    assert record.reason.value == "threshold_exceeded"
    assert record.compacted
    # After the compaction the measure falls back to the estimate: the
    # compacted request as the manager counted it.
    assert got[2] == record.tokens_after
    assert got[2] < 8_000
    # The next reply's report is used again.
    expected = expected_from_reports(run, d.context, 64)  # type: ignore[arg-type]
    assert expected[2] is None
    assert got[3] == expected[3]
    assert expected[3] is not None
    assert len(client.requests) == 3


async def test_without_use_reported_usage_the_estimate_is_always_used() -> None:
    small = Session()
    await run_once(driver(model([5]), use_reported_usage=False), small)
    large = Session()
    await run_once(driver(model([50_000]), use_reported_usage=False), large)
    none = Session()
    await run_once(driver(model([None]), use_reported_usage=True), none)
    assert measures(small.runs[0]) == measures(large.runs[0])
    # With no report at all, the new trigger measures the same estimate.
    assert measures(small.runs[0]) == measures(none.runs[0])
    assert large.runs[0].compactions == ()
    got = measures(small.runs[0])
    assert got == sorted(got)  # the estimate grows with the conversation
    assert got[0] < got[1] < got[2]


async def test_a_reply_without_usage_leaves_the_estimate() -> None:
    session = Session()
    d = driver(model([None]), use_reported_usage=True)
    await run_once(d, session)
    (run,) = session.runs
    assert all(x is None for x in expected_from_reports(run, d.context, 64))  # type: ignore[arg-type]
    twin = Session()
    await run_once(driver(model([None]), use_reported_usage=False), twin)
    assert measures(run) == measures(twin.runs[0])


# -- the pass a report triggers -------------------------------------------------
# The manager judges the pass with its own counter (one unit for before and
# after); the report calibrates the target, so a target-driven compactor
# shrinks what the provider counts instead of finding it already small.


async def test_the_pass_is_sized_in_the_managers_unit() -> None:
    """The report triggers the pass; the pass is judged by the manager's count.

    Before and after are then in one unit (the no-progress guard compares
    them); the report only calibrates the pass's target.
    """
    session = Session()
    await run_once(driver(model([9_000, 400]), use_reported_usage=True), session)
    (run,) = session.runs
    (record,) = run.compactions
    assert record.tokens_before < measures(run)[1]
    assert record.compacted
    assert record.tokens_after < record.tokens_before


async def test_a_large_report_makes_a_layered_compactor_compact_not_stall() -> None:
    d = Driver(
        model=model([9_000, 400]),
        tools=[read_file],
        context=ContextManager(
            LayeredCompactor(model=ExtractiveSummaryModel()),
            context_window=WINDOW,
            threshold=80,
            counter=COUNTER,
            use_reported_usage=True,
        ),
    )
    session = Session()
    result = await d.run(seed(), session=session)
    # Today: CompactionStalled (used == limit): the pass was handed the
    # estimate (~1,000 tokens, under the target), so it changed nothing.
    assert result.ok, result.error
    assert [c.verdict for c in session.runs[0].compactions] == ["compacted"]


@pytest.mark.parametrize("field", ["input_tokens", "output_tokens"])
@pytest.mark.parametrize("bogus", [100_000_001, 2**63, 10**40])
async def test_a_report_past_any_window_fails_its_run_and_spares_the_next(
    field: str, bogus: int
) -> None:
    """An overflowed count is refused where it is read, naming the model."""
    calls = 0

    def handle(request: ModelRequest) -> ModelResponse:
        nonlocal calls
        calls += 1
        usage = Usage(**{field: bogus if calls == 1 else 40})  # type: ignore[arg-type]
        return ModelResponse(message=reply(f"answer {calls}"), usage=usage)

    d = driver(FakeModelClient(handle), use_reported_usage=True)
    session = Session()
    first = await d.run("hello", session=session)

    assert isinstance(first.error, InvalidReturn)
    assert first.error.source == "model FakeModelClient"
    assert first.error.value == f"usage {field}={bogus}"
    assert first.error.expected == "at most 100,000,000 tokens for one call"
    assert list(session.history) == []  # nothing of the failed run committed
    # The bogus count is nowhere in the session: the next run is measured as
    # usual, not as a conversation no pass can shrink.
    second = await d.run("hello again", session=session)
    assert second.ok, second.error
    assert session.runs[1].compactions == ()


# -- a report no request held to the window can have ------------------------
# The driver sends a request only when its measure fits the window, so the
# provider's count can exceed the window only by what the counter
# undercounts, which a calibrating manager corrects up to
# CALIBRATION_CEILING times. A report past that is not this request's size.


def final_reporting(reports: Sequence[int]) -> FakeModelClient:
    """Answers at once; the i-th call reports ``reports[i]`` input tokens."""
    calls = 0

    def handle(request: ModelRequest) -> ModelResponse:
        nonlocal calls
        n = reports[min(calls, len(reports) - 1)]
        calls += 1
        return ModelResponse(
            message=reply(f"answer {calls}"), usage=Usage(input_tokens=n)
        )

    return FakeModelClient(handle)


@given(bogus=st.integers(WINDOW * 4 + 1, 100_000_000))
@settings(max_examples=sized(25), deadline=None)
def test_a_report_past_what_the_window_allows_is_refused_and_spares_the_next(
    bogus: int,
) -> None:
    async def body() -> None:
        d = driver(final_reporting([bogus, 40, 40]), use_reported_usage=True)
        session = Session()
        first = await d.run("hello", session=session)
        assert isinstance(first.error, InvalidReturn)
        assert first.error.source == "model FakeModelClient"
        assert first.error.value == f"usage input_tokens={bogus}"
        assert "10,000 window" in first.error.expected
        assert list(session.history) == []  # nothing of the failed run
        for text in ("hello again", "and again"):
            later = await d.run(text, session=session)
            assert later.ok, later.error

    anyio.run(body)


async def test_a_report_within_what_the_window_allows_is_still_read() -> None:
    """Four times the window: a counter a calibration could still correct."""
    session = Session()
    d = driver(final_reporting([WINDOW * 4, 40]), use_reported_usage=True)
    first = await d.run("hello", session=session)
    assert first.ok, first.error


async def test_a_stored_report_past_what_the_window_allows_is_not_carried() -> None:
    """A session logged by a run that did not read reports stays usable."""
    session = Session()
    plain = driver(final_reporting([10_000_000]), use_reported_usage=False)
    assert (await plain.run("hello", session=session)).ok
    d = driver(final_reporting([40]), use_reported_usage=True)
    later = await d.run("hello again", session=session)
    assert later.ok, later.error
    assert session.runs[1].compactions == ()


@given(report=st.integers(0, WINDOW * 4))
@settings(max_examples=sized(25), deadline=None)
def test_no_report_a_run_ends_with_stalls_the_next_runs(report: int) -> None:
    """A possible report the next run's pass finds nothing to cut for is dropped.

    It was the previous run's; the pass finds the conversation small by the
    manager's count, so the model is asked, and its new report stands.
    """

    async def body() -> None:
        d = driver(final_reporting([report, 40, 40]), use_reported_usage=True)
        session = Session()
        first = await d.run("hello", session=session)
        assert first.ok, first.error
        for text in ("hello again", "and again"):
            later = await d.run(text, session=session)
            assert later.ok, later.error
        assert [r.text for r in session.history][-1] == "answer 3"
        for run in session.runs[1:]:
            assert [c.verdict for c in run.compactions] in ([], ["noop"])
        assert session.runs[2].compactions == ()  # the new report stands

    anyio.run(body)


async def test_a_carried_report_the_pass_finds_nothing_for_is_dropped_once() -> None:
    session = Session()
    d = driver(final_reporting([9_500, 40]), use_reported_usage=True)
    assert (await d.run("hello", session=session)).ok
    second = await d.run("hello again", session=session)
    assert second.ok, second.error
    (record,) = session.runs[1].compactions
    assert record.verdict == "noop"
    # From the carried-over size down to the manager's count of the request.
    assert record.tokens_before > 9_500 > record.tokens_after
    got = measures(session.runs[1])
    assert got[0] > 9_500 > got[1] == record.tokens_after
