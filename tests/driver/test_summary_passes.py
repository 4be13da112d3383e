"""Summary passes under the driver: model calls, usage, the breaker, faults."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.driver.test_driver_properties import input_size
from tests.profiles import sized
from turnfsm import default_machine
from turnfsm.context import (
    CompactionProposal,
    ContextManager,
    LayeredCompactor,
    PinRules,
    SummarizingCompactor,
    TruncatingCompactor,
)
from turnfsm.driver import Driver, RetryPolicy, RunControl, Session, replay
from turnfsm.errors import (
    CompactionCircuitOpen,
    CompactionFailed,
    ConfigError,
    ContextExceeded,
    ProviderError,
)
from turnfsm.hooks import CircuitInfo, Hook, ModelCallInfo
from turnfsm.messages import SUMMARY_COVERS, Message, Role
from turnfsm.persistence import (
    BreakerChanged,
    CompactionRecord,
    MemoryStore,
    SQLiteStore,
    SummaryRecorded,
)
from turnfsm.providers import ModelRequest, ModelResponse
from turnfsm.testing import ExtractiveSummaryModel, FakeModelClient, reply, tool_call
from turnfsm.tokens import HeuristicTokenCounter
from turnfsm.values import Usage

pytestmark = pytest.mark.anyio

COUNTER = HeuristicTokenCounter()


def history(turns: int, size: int = 900) -> list[Message]:
    out: list[Message] = []
    for i in range(turns):
        out.append(Message.user(f"question {i}: the code is {1000 + i} " + "q" * size))
        out.append(Message.assistant(f"answer {i} " + "a" * size))
    return out


def manager(
    compactor: object, *, window: int = 4_000, **options: object
) -> ContextManager:
    return ContextManager(
        compactor,  # type: ignore[arg-type]
        context_window=window,
        threshold=60,
        counter=COUNTER,
        **options,  # type: ignore[arg-type]
    )


def agent_model(*texts: str) -> FakeModelClient:
    """The agent's model: answers in order; never asked for a summary here."""
    answers = iter(texts)

    def handle(request: ModelRequest) -> ModelResponse:
        assert request.temperature is None, "a summary request reached the agent model"
        return ModelResponse(
            message=Message.assistant(next(answers)),
            usage=Usage(input_tokens=10, output_tokens=2),
        )

    return FakeModelClient(handle)


class Recorder(Hook):
    def __init__(self) -> None:
        self.done: list[CompactionRecord] = []
        self.opened: list[CircuitInfo] = []

    def on_compaction_pass(self, record: CompactionRecord) -> None:
        if record.compacted:
            self.done.append(record)

    def on_circuit_opened(self, info: CircuitInfo) -> None:
        self.opened.append(info)


async def test_a_summary_pass_commits_one_summary_and_accounts_its_usage() -> None:
    summary_model = ExtractiveSummaryModel()
    hook = Recorder()
    driver = Driver(
        model=agent_model("final"),
        context=manager(
            SummarizingCompactor(model=summary_model, keep_recent_turns=2),
            # The first turn is summarised here, not kept by a pin.
            pins=PinRules(first_user=False),
        ),
        hooks=[hook],
    )
    session = Session()
    result = await driver.run(history(6), session=session)
    assert result.ok, result.error
    assert len(summary_model.requests) == 1
    first = session.history[0]
    assert first.role is Role.SYSTEM
    assert SUMMARY_COVERS in first.metadata
    (summary,) = [e for e in session.entries if isinstance(e, SummaryRecorded)]
    assert summary.message_id == first.id
    assert "1000" in summary.content  # a fact of the first turn survived
    (record,) = session.runs[0].compactions
    assert record.compacted
    assert record.strategy == "SummarizingCompactor"
    assert record.usage is not None
    assert record.usage.input_tokens > 0
    assert result.compaction_usage == record.usage
    assert result.usage == Usage(input_tokens=10, output_tokens=2)  # the agent's alone
    (done,) = hook.done
    assert done == record  # the hook hears the very record the log keeps
    assert done.run_id == result.run_id
    assert done.reason.value == "threshold_exceeded"
    assert done.strategy == "SummarizingCompactor"
    assert done.tokens_after < done.tokens_before
    assert done.covers == record.covers


class BrokenOnSummaries(Hook):
    def on_model_call_start(self, info: ModelCallInfo) -> None:
        if info.purpose == "summary":
            raise RuntimeError("the hook broke")


async def test_a_strict_hook_that_raises_in_a_summary_call_crashes_the_run() -> None:
    # It was taken for the compactor's failure: the pass was logged failed
    # (a step towards opening the session's breaker), the run ended failed
    # blaming the compaction, and the hook's error never surfaced.
    summary_model = ExtractiveSummaryModel()
    driver = Driver(
        model=agent_model("final"),
        context=manager(
            SummarizingCompactor(model=summary_model, keep_recent_turns=2),
            pins=PinRules(first_user=False),
        ),
        hooks=[BrokenOnSummaries()],
        strict_hooks=True,
    )
    session = Session()
    with pytest.raises(RuntimeError, match="the hook broke"):
        await driver.run(history(6), session=session)
    (run,) = session.runs
    assert run.outcome == "failed"
    assert str(run.error) == "run crashed on RuntimeError: the hook broke"
    assert run.compactions == ()
    assert session.compaction_failures == 0
    assert summary_model.requests == []


async def test_without_its_own_model_the_summariser_borrows_the_agents() -> None:
    summaries = ExtractiveSummaryModel()

    async def handle(request: ModelRequest) -> ModelResponse:
        if request.temperature == 0.3:  # the summary call
            assert request.tools == ()
            return await summaries.complete(request)
        return ModelResponse(message=Message.assistant("final"))

    driver = Driver(
        model=FakeModelClient(handle),
        context=manager(SummarizingCompactor(keep_recent_turns=2)),
    )
    result = await driver.run(history(6))
    assert result.ok, result.error
    assert len(summaries.requests) == 1


async def test_a_transient_summary_error_is_retried_by_the_runs_policy() -> None:
    summaries = ExtractiveSummaryModel()
    calls = 0

    async def flaky(request: ModelRequest) -> ModelResponse:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ProviderError("overloaded", retryable=True, kind="server", status=529)
        return await summaries.complete(request)

    driver = Driver(
        model=agent_model("final"),
        context=manager(
            SummarizingCompactor(model=FakeModelClient(flaky), keep_recent_turns=2)
        ),
        retry=RetryPolicy(max_attempts=3, initial_wait=0.0, max_wait=0.0),
    )
    result = await driver.run(history(6))
    assert result.ok, result.error
    assert calls == 2


def failing(kind: str) -> FakeModelClient:
    async def handle(request: ModelRequest) -> ModelResponse:
        if kind == "error":
            raise ProviderError("summary model down", retryable=False, kind="server")
        if kind == "timeout":
            await anyio.sleep(10)
        if kind == "empty":
            return ModelResponse(message=Message.assistant("  "))
        return ModelResponse(message=Message.assistant("word " * 3_000))  # oversized

    return FakeModelClient(handle)


@pytest.mark.parametrize("kind", ["error", "timeout", "empty", "oversized"])
async def test_a_failing_summary_model_opens_the_breaker_at_the_third_failure(
    kind: str, tmp_path: Path
) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    hook = Recorder()
    driver = Driver(
        model=agent_model(*["unused"] * 10),
        context=manager(
            SummarizingCompactor(
                model=failing(kind), keep_recent_turns=2, max_summary_tokens=100
            )
        ),
        hooks=[hook],
        model_timeout=0.2,
        retry=RetryPolicy(max_attempts=1),
    )
    session = Session(store=store)
    seed = history(6)
    for n in (1, 2, 3):
        result = await driver.run(seed, session=session)
        assert result.outcome == "failed"
        assert isinstance(result.error, CompactionFailed), result.error
        assert list(session.history) == []  # nothing committed, nothing lost
        assert session.compaction_failures == n
    assert len(hook.opened) == 1
    assert hook.opened[0].failures == 3
    opened = [e for e in session.entries if isinstance(e, BreakerChanged)]
    assert [(e.open, e.failures) for e in opened] == [(True, 3)]

    # A restart keeps it open: a proactive pass fails fast, no model call.
    reopened = await Session.load(store, session.id)
    assert reopened.compaction_failures == 3
    calls_before = len(driver.context.compactor.model.requests)  # type: ignore[union-attr]
    result = await driver.run(seed, session=reopened)
    assert isinstance(result.error, CompactionCircuitOpen)
    assert len(driver.context.compactor.model.requests) == calls_before  # type: ignore[union-attr]
    assert len(hook.opened) == 1  # emitted once, on the transition

    # The operator resets it; the next pass calls the model again.
    await reopened.reset_breaker()
    assert reopened.compaction_failures == 0
    again = await Session.load(store, session.id)
    assert again.compaction_failures == 0
    await store.aclose()


async def test_success_resets_the_count() -> None:
    answers = iter(["", "## Active Task\nok 1"])

    async def sometimes(request: ModelRequest) -> ModelResponse:
        return ModelResponse(message=Message.assistant(next(answers)))

    driver = Driver(
        model=agent_model("x", "final"),
        context=manager(
            SummarizingCompactor(model=FakeModelClient(sometimes), keep_recent_turns=2)
        ),
    )
    session = Session()
    assert (await driver.run(history(6), session=session)).outcome == "failed"
    assert session.compaction_failures == 1
    result = await driver.run(history(6), session=session)
    assert result.ok, result.error
    assert session.compaction_failures == 0


async def test_the_breaker_is_per_session_with_one_manager() -> None:
    shared = manager(
        SummarizingCompactor(model=failing("error"), keep_recent_turns=2),
        max_failures=1,
    )
    driver = Driver(model=agent_model(*["x"] * 5), context=shared)
    one, two = Session(), Session()
    await driver.run(history(6), session=one)
    assert one.compaction_failures == 1
    result = await driver.run(history(6), session=two)
    assert isinstance(result.error, CompactionFailed)  # tried: its breaker was closed
    result = await driver.run(history(6), session=one)
    assert isinstance(result.error, CompactionCircuitOpen)


async def test_an_overflow_with_the_breaker_open_gets_the_deterministic_layers() -> (
    None
):
    summaries = ExtractiveSummaryModel()
    overflowed = False

    async def agent(request: ModelRequest) -> ModelResponse:
        nonlocal overflowed
        if not overflowed:
            overflowed = True
            raise ProviderError(
                "prompt is too long", kind="context_overflow", status=400
            )
        return ModelResponse(message=Message.assistant("final"))

    layered = LayeredCompactor(model=summaries, max_tool_result_chars=100)
    driver = Driver(
        model=FakeModelClient(agent),
        context=manager(layered, window=200_000, max_failures=1),
        tools=[],
    )
    session = Session(store=MemoryStore())
    # Open the breaker by hand: one failed pass recorded in the log.
    session._failures = 1  # the state one failed pass leaves
    big = [
        Message.user("read it"),
        Message.assistant(tool_calls=[tool_call("read_file", "c1", path="a")]),
        Message.tool_result("c1", "z" * 5_000),
        Message.assistant("read"),
        Message.user("and?"),
    ]
    result = await driver.run(big, session=session)
    assert result.ok, result.error
    assert summaries.requests == []
    (record,) = session.runs[0].compactions
    assert record.reason.value == "overflow"
    assert record.compacted


async def test_summaries_survive_a_reopen_and_stop_a_repeat(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    summary_model = ExtractiveSummaryModel()
    driver = Driver(
        model=agent_model("one", "two"),
        context=manager(SummarizingCompactor(model=summary_model, keep_recent_turns=2)),
    )
    session = Session(store=store)
    assert (await driver.run(history(6), session=session)).ok
    reopened = await Session.load(store, session.id)
    assert reopened.latest_summary is not None
    assert dict(reopened.summary_texts) == dict(session.summary_texts)
    assert reopened.history[0].id == reopened.latest_summary.message_id
    await store.aclose()


async def test_a_tool_heavy_single_run_is_summarised_not_stalled() -> None:
    """The newcomer's case: one long tool-using run in a 3,000-token window."""
    script = [
        reply("", tool_call("read_file", f"c{i}", path=f"log{i}.txt"))
        for i in range(12)
    ]
    script.append(reply("the code was 4242"))
    answers = iter(script)

    def agent(request: ModelRequest) -> ModelResponse:
        return ModelResponse(message=next(answers))

    def read_file(path: str) -> str:
        return f"{path}: code 4242 " + "log line\n" * 100

    driver = Driver(
        model=FakeModelClient(agent),
        tools=[read_file],
        context=manager(
            SummarizingCompactor(
                model=ExtractiveSummaryModel(),
                keep_recent_turns=2,
                compact_newest_exchange=True,  # one run: one exchange
            ),
            window=3_000,
        ),
        max_turns=20,
    )
    session = Session()
    result = await driver.run("read the logs and find the code", session=session)
    assert result.ok, result.error
    records = [c for r in session.runs for c in r.compactions]
    assert records
    assert all(c.compacted for c in records)
    # The request stays first; the summary of what followed it comes next.
    assert session.history[0].text == "read the logs and find the code"
    assert session.history[1].metadata.get(SUMMARY_COVERS)
    assert any(m.text == "read the logs and find the code" for m in session.history)
    assert isinstance(records[0], CompactionRecord)


async def test_a_stall_names_what_is_big_and_still_replays() -> None:
    """The newcomer's stall: the error says which tool result filled the window."""
    calls = 0

    def agent(request: ModelRequest) -> ModelResponse:
        nonlocal calls
        calls += 1
        return ModelResponse(
            message=reply("", tool_call("read_file", f"c{calls}", path="big.log"))
        )

    def read_file(path: str) -> str:
        return f"{path}: " + "log line 12345\n" * 400

    session = Session()
    driver = Driver(
        model=FakeModelClient(agent),
        tools=[read_file],
        # The truncator alone cannot cut one exchange: the run stalls.
        context=ContextManager(
            TruncatingCompactor(), context_window=3_000, counter=COUNTER
        ),
    )
    result = await driver.run("go", session=session)
    error = result.error
    assert isinstance(error, ContextExceeded)
    biggest = error.largest[0]
    assert (biggest.kind, biggest.tool) == ("tool_result", "read_file")
    where = f"largest: tool result of read_file (call {biggest.call_id}) in turn 1"
    assert where in str(error)
    assert "MaskingCompactor caps, digests and cuts them to fit" in str(error)
    ended = session.runs[0]
    assert ended.error == error
    report = replay(default_machine(), session, ended.run_id)
    assert report.ok, report


# -- the message-count line never fails a run ---------------------------------


def tiny_pairs(count: int) -> list[Message]:
    out: list[Message] = []
    for i in range(count):
        out += [Message.user(f"q{i}"), Message.assistant(f"a{i}")]
    return out


def tool_turn(turn: int, steps: int = 13) -> list[Message]:
    """One user message, `steps` tool calls with their results, an answer."""
    out = [Message.user(f"task {turn}: read the logs")]
    for i in range(steps):
        call_id = f"t{turn}c{i}"
        out.append(reply("", tool_call("read_file", call_id, path=f"log{i}.txt")))
        out.append(Message.tool_result(call_id, f"log{i}.txt: " + "log line\n" * 40))
    out.append(Message.assistant(f"done with task {turn}"))
    return out


async def test_a_message_count_pass_that_cuts_nothing_lets_the_run_finish() -> None:
    """52 tiny messages over the default line of 50: nothing to cut, no stall."""
    driver = Driver(
        model=FakeModelClient(lambda r: "final"),
        context=ContextManager(LayeredCompactor(model=ExtractiveSummaryModel())),
    )
    session = Session()
    messages = tiny_pairs(26)

    result = await driver.run(messages, session=session)

    assert (result.outcome, result.error) == ("done", None)
    (record,) = session.runs[0].compactions
    assert (record.reason.value, record.verdict) == ("message_count", "noop")
    assert len(record.covers) == len(messages) == 52


async def test_a_summary_model_that_is_down_fails_no_run_on_the_message_line() -> None:
    """Passes for the message-count line fail, then the breaker opens: runs go on."""
    down = FakeModelClient(lambda r: "")  # an empty summary is a failed pass
    agent_model = FakeModelClient(lambda r: "ok")
    driver = Driver(
        model=agent_model,
        context=ContextManager(
            SummarizingCompactor(model=down, keep_recent_turns=1),
            context_window=100_000,
            max_messages=4,
        ),
    )
    session = Session()

    results = [await driver.run(f"question {i}", session=session) for i in range(6)]

    assert [(r.outcome, r.error) for r in results] == [("done", None)] * 6
    verdicts = [c.verdict.value for r in session.runs for c in r.compactions]
    assert verdicts == ["failed", "failed", "failed", "circuit_open"]
    assert session.breaker_open
    assert [m.text for m in session.history][-2:] == ["question 5", "ok"]
    assert len(session.history) == 12  # nothing was cut, nothing lost
    assert len(agent_model.requests) == 6


class Bloating:
    """A user's compactor: fewer messages, and a summary far bigger than them."""

    async def compact(self, messages, target, ctx):  # type: ignore[no-untyped-def]
        summary = Message.system(
            "[summary] " + "padding " * 2_270,
            metadata={SUMMARY_COVERS: messages[-3].id},
        )
        kept = [*messages[:2], summary, *messages[-2:]]
        return CompactionProposal.compacted(kept, ctx.tokens_before, 1)


async def test_a_message_count_pass_that_reaches_the_emergency_line_is_not_kept() -> (
    None
):
    # The pass made a 51-token conversation 2,874 tokens, over the emergency
    # line (2,850): it was committed, and every later run failed on it.
    manager = ContextManager(Bloating(), context_window=3_000, max_messages=6)
    model = FakeModelClient(lambda r: "ok")
    driver = Driver(model=model, context=manager)
    session = Session()

    results = [await driver.run(f"question {i}", session=session) for i in range(5)]

    assert [(r.outcome, r.error) for r in results] == [("done", None)] * 5
    records = [c for r in session.runs for c in r.compactions]
    assert [(c.reason.value, c.verdict.value) for c in records] == [
        ("message_count", "overflow")
    ] * 2
    assert records[0].tokens_after >= manager.emergency_line
    assert [m.text for m in session.history] == [
        text for i in range(5) for text in (f"question {i}", "ok")
    ]
    # The model was asked with the request as it was.
    assert [len(request.messages) for request in model.requests] == [1, 3, 5, 7, 9]


async def test_long_tool_turns_over_the_message_line_finish() -> None:
    """Two tool-using turns of 28 messages and a question: over the line of 50."""
    messages = [*tool_turn(0), *tool_turn(1), Message.user("what now?")]
    driver = Driver(
        model=FakeModelClient(lambda r: "final"),
        context=ContextManager(SummarizingCompactor(model=ExtractiveSummaryModel())),
    )
    session = Session()

    result = await driver.run(messages, session=session)

    assert (result.outcome, result.error) == ("done", None)
    records = [c for r in session.runs for c in r.compactions]
    assert records
    assert {c.reason.value for c in records} == {"message_count"}
    assert session.history[-1].text == "final"


class WholeTranscript:
    """A user's compactor: asks `own` (the agent's model) about everything."""

    def __init__(self, own: object = None) -> None:
        self.own = own

    async def compact(self, messages, target, ctx):  # type: ignore[no-untyped-def]
        text = "\n".join(m.text for m in messages) * 3
        request = ModelRequest(messages=[Message.user(text)], max_tokens=100)
        response = await ctx.model_call(request, self.own)
        kept = [messages[0], Message.user(response.message.text), messages[-1]]
        return CompactionProposal.compacted(kept, ctx.tokens_before, 0)


@pytest.mark.parametrize("named", [False, True], ids=["model-none", "model-named"])
async def test_a_summary_call_over_the_window_is_refused_unsent(named: bool) -> None:
    def handle(request: ModelRequest) -> ModelResponse:
        return ModelResponse(message=Message.assistant("final"))

    model = FakeModelClient(handle)
    driver = Driver(
        model=model,
        context=manager(WholeTranscript(model if named else None), window=4_000),
    )
    result = await driver.run(history(6))

    assert not result.ok
    assert isinstance(result.error, CompactionFailed)
    assert model.requests == []  # neither the turn nor the summary was sent
    cause = result.error.cause
    assert "exceeds the 4000 window; it was not sent" in cause
    assert "[context_overflow]" in cause


async def test_a_calibrating_run_borrows_its_model_for_summaries_that_fit() -> None:
    """The provider counts twice the estimate; the manager calibrates.

    The summariser is told the agent's window in the manager's tokens (half
    of it, here), and each summary request is held to the window as the
    provider counts it: each is sent, and each fits as the provider counts.
    """

    def handle(request: ModelRequest) -> ModelResponse:
        size = COUNTER.count(list(request.messages))
        usage = Usage(input_tokens=size * 2 + 1, output_tokens=3)
        if request.temperature == 0.3:  # the summary call
            return ModelResponse(message=reply("the user asked questions"), usage=usage)
        return ModelResponse(message=reply("answer " * 150), usage=usage)

    model = FakeModelClient(handle)
    driver = Driver(
        model=model,
        context=manager(
            SummarizingCompactor(keep_recent_turns=1), window=3_000, calibrate=True
        ),
    )
    session = Session()
    for i in range(8):
        result = await driver.run(f"question {i} " + "q " * 40, session=session)
        assert result.ok, result.error
    summaries = [r for r in model.requests if r.temperature == 0.3]
    assert summaries
    for request in summaries:
        counted = COUNTER.count(list(request.messages)) * 2 + 1  # the provider's
        assert counted + (request.max_tokens or 0) <= 3_000


async def test_a_calibrating_runs_summary_fits_the_window_as_counted() -> None:
    """The provider counts 1.25 times the estimate of every request.

    The turns were held to the window in calibrated tokens; the summary
    request was sized and held to it in the counter's: 953 estimated input
    tokens and a 309-token reply budget fit 1,500, and the provider counted
    1,501. The summariser is now told the window in the counter's tokens,
    and its requests are held to it as the provider counts them.
    """
    outputs = [0, 0, 10, 185, 2375, 1282]
    counted: list[tuple[bool, int]] = []
    control = RunControl()

    def handle(request: ModelRequest) -> ModelResponse:
        provider = math.ceil(input_size(request) * 1.25)  # tool schemas included
        summary = request.temperature is not None
        counted.append((summary, provider + (request.max_tokens or 0)))
        usage = Usage(input_tokens=provider)
        if summary:
            return ModelResponse(message=reply("what was done"), usage=usage)
        turn = len([c for c in counted if not c[0]]) - 1
        if turn == 4:
            control.inject(Message.user("note 4"))
        if turn < len(outputs):
            call = tool_call("dump", f"c{turn}_0", size=outputs[turn])
            return ModelResponse(message=reply("", call), usage=usage)
        return ModelResponse(message=reply("final"), usage=usage)

    async def dump(size: int) -> str:
        """Return `size` characters.

        Args:
            size: how many.
        """
        return "y" * size

    driver = Driver(
        model=FakeModelClient(handle),
        tools=[dump],
        context=ContextManager(
            SummarizingCompactor(keep_recent_turns=1),
            context_window=1_500,
            threshold=0,
            auto_compact=False,
            counter=COUNTER,
            calibrate=True,
        ),
        max_turns=10,
        retry=RetryPolicy(max_attempts=1),
    )
    result = await driver.run("start", session=Session(), control=control)

    assert result.ok, result.error
    assert any(summary for summary, _ in counted)  # a pass summarised
    assert all(size <= 1_500 for _, size in counted), counted


class Asks:
    """A user's compactor that calls `ctx.model_call` with what it is given."""

    def __init__(self, request: object, model: object) -> None:
        self.request = request
        self.model = model

    async def compact(self, messages, target, ctx):  # type: ignore[no-untyped-def]
        await ctx.model_call(self.request, self.model)
        return CompactionProposal.unchanged(messages, ctx.tokens_before)


@pytest.mark.parametrize(
    ("request_", "model", "expected"),
    [
        ("summarise", None, "invalid request='summarise': expected a ModelRequest"),
        (
            ModelRequest(messages=[Message.user("x")]),
            "gpt-4o",
            "invalid model='gpt-4o': expected a ModelClient (async complete()), "
            "or None: the agent's own",
        ),
    ],
    ids=["request-not-a-request", "model-a-name"],
)
async def test_a_summary_call_given_the_wrong_things_names_them(
    request_: object, model: object, expected: str
) -> None:
    agent_model = FakeModelClient(lambda request: "never")
    driver = Driver(model=agent_model, context=manager(Asks(request_, model)))

    result = await driver.run(history(6))

    assert isinstance(result.error, CompactionFailed)
    assert result.error.cause == f"ConfigError: {expected}"
    assert agent_model.requests == []


class Windowed:
    """A summary model of its own that states its window."""

    def __init__(self, window: object) -> None:
        self.context_window = window
        self.requests: list[ModelRequest] = []

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        return ModelResponse(message=reply("a summary"))


def summarised_by(model: Windowed) -> Driver:
    """An agent on a 4,000-token window whose passes ask `model`."""
    return Driver(
        model=FakeModelClient(lambda request: "final"),
        context=manager(WholeTranscript(model), window=4_000),
    )


async def test_a_summary_call_over_its_own_models_window_is_refused_unsent() -> None:
    summary_model = Windowed(1_000)
    result = await summarised_by(summary_model).run(history(6))

    assert isinstance(result.error, CompactionFailed), result.error
    assert summary_model.requests == []  # refused unsent
    cause = result.error.cause
    assert "exceeds the 1000 window of Windowed; it was not sent" in cause
    assert "[context_overflow]" in cause


@given(window=st.integers(1, 40_000), turns=st.integers(5, 8))
@settings(max_examples=sized(30), deadline=None)
def test_a_summary_model_is_sent_only_what_its_window_holds(
    window: int, turns: int
) -> None:
    """Whatever the window it states, no request over it reaches it."""
    summary_model = Windowed(window)
    anyio.run(summarised_by(summary_model).run, history(turns))
    for request in summary_model.requests:
        size = COUNTER.count(list(request.messages)) + (request.max_tokens or 0)
        assert size <= window


async def test_a_summary_model_stating_no_window_is_sent_its_request() -> None:
    summary_model = Windowed(None)
    await summarised_by(summary_model).run(history(6))
    assert len(summary_model.requests) == 1


async def test_a_summary_model_stating_a_bad_window_is_named() -> None:
    summary_model = Windowed("big")
    result = await summarised_by(summary_model).run(history(6))
    assert isinstance(result.error, CompactionFailed), result.error
    assert "model.context_window='big'" in result.error.cause
    assert summary_model.requests == []


@pytest.mark.parametrize(
    ("half", "said"),
    [
        (
            [Message.assistant(tool_calls=[tool_call("lookup", "c1")])],
            "invalid message tool_call.id='c1': a tool call with no result",
        ),
        (
            [Message.user("summarise:"), Message.tool_result("c1", "42")],
            "invalid message tool_result.call_id='c1': a tool result for no open",
        ),
    ],
    ids=["call-without-result", "result-without-call"],
)
@pytest.mark.parametrize("named", [False, True], ids=["model-none", "model-named"])
async def test_a_summary_call_with_half_a_tool_pair_is_refused_unsent(
    half: list[Message], said: str, named: bool
) -> None:
    # A provider refuses such a request (and a retry policy would send it
    # again): the pass fails naming the half, and nothing is sent.
    summary_model = Windowed(None)
    agent_model = FakeModelClient(lambda request: "final")
    request = ModelRequest(messages=[*half, Message.user("Summarise.")])
    driver = Driver(
        model=agent_model,
        context=manager(Asks(request, summary_model if named else None)),
    )

    result = await driver.run(history(6))

    assert isinstance(result.error, CompactionFailed), result.error
    assert summary_model.requests == agent_model.requests == []
    assert result.error.cause.startswith(f"InvalidMessage: {said}")
    assert "the summary request was not sent" in result.error.cause


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -5}, "max_tokens"),
        ({"max_tokens": 1.5}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"temperature": -1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"system": 5}, "system"),
    ],
)
def test_a_request_with_a_setting_no_provider_takes_is_refused_when_made(
    settings: dict[str, object], field: str
) -> None:
    # A summary request of a compactor's went out as it was, and the
    # provider refused it (a negative budget slipped under the window check).
    with pytest.raises(ConfigError) as got:
        ModelRequest(messages=[Message.user("Summarise.")], **settings)  # type: ignore[arg-type]
    assert got.value.field == field
    value = settings[field]
    assert got.value.value is value or got.value.value != got.value.value


class CancelledElsewhere:
    """A compactor that awaits a future something else cancelled."""

    async def compact(self, messages, target, ctx):  # type: ignore[no-untyped-def]
        future = asyncio.get_running_loop().create_future()
        future.cancel()
        await future
        return CompactionProposal.unchanged(messages, ctx.tokens_before)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_pass_that_raises_a_cancel_nobody_asked_for_fails(
    anyio_backend: str,
) -> None:
    # The run ended "interrupted from outside (Ctrl-C, or a cancelled
    # task)", and the caller's task got a CancelledError though nothing
    # cancelled it; resuming the run raised it again.
    model = FakeModelClient(lambda request: "final")
    driver = Driver(model=model, context=manager(CancelledElsewhere()))
    session = Session()

    result = await driver.run(history(6), session=session)

    assert isinstance(result.error, CompactionFailed), result.error
    assert "CancelledElsewhere raised CancelledError" in result.error.cause
    assert "nothing cancelled the pass" in result.error.cause
    assert not session.open_runs()
