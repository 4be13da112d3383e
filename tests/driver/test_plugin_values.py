"""A counter's or a clock's bad value is refused where it is read.

It never reaches the log: the stored session, with its earlier runs, still
loads, and the error names the counter or the clock and the value.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from turnfsm import Agent
from turnfsm.context import CompactionContext, CompactionProposal, ContextManager
from turnfsm.errors import CompactionStalled, ConfigError, RunCrashed
from turnfsm.messages import Message
from turnfsm.persistence import Session, SQLiteStore
from turnfsm.testing import ScriptedModel, reply, tool_call
from turnfsm.tokens import HeuristicTokenCounter

pytestmark = pytest.mark.anyio

HEURISTIC = HeuristicTokenCounter()


class TurnsBad:
    """Counts like the heuristic for its first `good` calls of `count`, then
    returns `bad(right count)`."""

    def __init__(self, good: int, bad: Callable[[int], object]) -> None:
        self.good = good
        self.bad = bad
        self.calls = 0

    def count(self, messages: Sequence[Message]) -> int:
        self.calls += 1
        right = HEURISTIC.count(messages)
        if self.calls <= self.good:
            return right
        return self.bad(right)  # type: ignore[return-value]

    def count_text(self, text: str) -> int:
        return HEURISTIC.count_text(text)


def echo(text: str) -> str:
    """Echo the text.

    Args:
        text: What to echo.
    """
    return text


async def _first_run(path: Path) -> str:
    """Commit one run to a new session in the store at `path`; its id."""
    store = SQLiteStore(path)
    agent = Agent(
        model=ScriptedModel.of("noted"),
        store=store,
        context=ContextManager(context_window=100_000),
    )
    assert (await agent.run("remember: the code is 42")).ok
    await store.aclose()
    return agent.session.id


async def _stored(path: Path, session_id: str) -> tuple[list[str], list[str]]:
    """The session as a fresh process reads it: (outcomes, history texts)."""
    store = SQLiteStore(path)
    session = await Session.load(store, session_id)
    await store.aclose()
    return [r.outcome for r in session.runs], [m.text for m in session.history]


@pytest.mark.parametrize("good", [0, 1, 3, 5], ids=lambda n: f"after-{n}")
async def test_a_counter_that_turns_to_floats_leaves_the_session_loadable(
    tmp_path: Path, good: int
) -> None:
    path = tmp_path / "s.db"
    session_id = await _first_run(path)
    store = SQLiteStore(path)
    counter = TurnsBad(good, lambda right: right + 0.5)
    agent = Agent(
        model=ScriptedModel.of(reply("", tool_call("echo", text="hi")), "done"),
        tools=[echo],
        session=await Session.load(store, session_id),
        context=ContextManager(context_window=100_000, counter=counter),
    )

    with pytest.raises(ConfigError) as caught:
        await agent.run("hello")
    await store.aclose()

    assert caught.value.field == "counter"
    assert isinstance(caught.value.value, float)
    assert "from TurnsBad.count" in str(caught.value)
    outcomes, history = await _stored(path, session_id)
    assert outcomes[0] == "done"
    assert outcomes[1:] in ([], ["failed"])
    assert history == ["remember: the code is 42", "noted"]


@pytest.mark.parametrize(
    "value",
    [None, "12", True, -10, 2.5, math.nan],
    ids=["none", "str", "bool", "negative", "float", "nan"],
)
async def test_a_counter_that_returns_no_count_is_named_with_the_value(
    value: object,
) -> None:
    agent = Agent(
        model=ScriptedModel.of("ok"),
        context=ContextManager(
            context_window=100_000, counter=TurnsBad(0, lambda _: value)
        ),
    )

    with pytest.raises(ConfigError) as caught:
        await agent.run("hello")

    assert caught.value.field == "counter"
    assert caught.value.value is value
    assert str(caught.value).endswith(
        "expected a token count: an int >= 0 (from TurnsBad.count)"
    )


@pytest.mark.parametrize(
    "clock",
    [
        lambda: None,
        lambda: "2024-01-01",
        lambda: datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC),
        lambda: math.nan,
        lambda: math.inf,
        lambda: True,
    ],
    ids=["none", "str", "datetime", "nan", "inf", "bool"],
)
async def test_a_clock_that_returns_no_time_leaves_the_session_loadable(
    tmp_path: Path, clock: Callable[[], object]
) -> None:
    path = tmp_path / "s.db"
    session_id = await _first_run(path)
    store = SQLiteStore(path)
    agent = await _timed_agent(store, session_id, clock)

    with pytest.raises(ConfigError) as caught:
        await agent.run("hello")
    await store.aclose()

    assert caught.value.field == "clock"
    value = clock()
    assert caught.value.value is value or caught.value.value == value
    assert "a finite int or float (from the clock" in str(caught.value)
    assert await _stored(path, session_id) == (
        ["done"],
        ["remember: the code is 42", "noted"],
    )


async def _timed_agent(
    store: SQLiteStore, session_id: str, clock: Callable[[], object]
) -> Agent:
    """An agent that goes on with the stored session, on `clock`."""
    return Agent(
        model=ScriptedModel.of("ok"),
        session=await Session.load(store, session_id),
        clock=clock,
        context=ContextManager(context_window=100_000),
    )


class GoesBad:
    """A clock that tells the time `good` times, then answers `bad()` until
    `mend()` is called."""

    def __init__(self, good: int, bad: Callable[[], object]) -> None:
        self.good = good
        self.bad = bad
        self.now = 1_700_000_000.0

    def __call__(self) -> object:
        self.good -= 1
        self.now += 1.0
        return self.now if self.good >= 0 else self.bad()

    def mend(self) -> None:
        self.good = 1_000_000


def _raises() -> float:
    raise RuntimeError("the clock's battery is flat")


BAD_READINGS = [lambda: None, lambda: math.nan, lambda: "noon", _raises]
BAD_IDS = ["none", "nan", "str", "raises"]


@pytest.mark.parametrize("bad", BAD_READINGS, ids=BAD_IDS)
@pytest.mark.parametrize("good", [1, 2, 3, 5], ids=lambda n: f"after-{n}")
async def test_a_clock_that_goes_bad_mid_run_ends_the_run_failed(
    tmp_path: Path, good: int, bad: Callable[[], object]
) -> None:
    path = tmp_path / "s.db"
    session_id = await _first_run(path)
    store = SQLiteStore(path)
    clock = GoesBad(good, bad)
    agent = Agent(
        model=ScriptedModel.of(reply("", tool_call("echo", text="hi")), "done"),
        tools=[echo],
        session=await Session.load(store, session_id),
        clock=clock,
        context=ContextManager(context_window=100_000),
    )

    with pytest.raises((ConfigError, RuntimeError)) as caught:
        await agent.run("hello")
    await store.aclose()

    if isinstance(caught.value, ConfigError):
        assert caught.value.field == "clock"
        assert "from the clock GoesBad" in str(caught.value)
    # The run that met the bad reading ended failed, naming the clock's
    # failure; the runs before it load as they were.
    store = SQLiteStore(path)
    session = await Session.load(store, session_id)
    outcomes = [r.outcome for r in session.runs]
    assert outcomes == ["done", "failed"]
    error = session.runs[-1].error
    assert isinstance(error, RunCrashed)
    assert error.type == type(caught.value).__name__
    assert error.message == str(caught.value)
    assert [m.text for m in session.history] == ["remember: the code is 42", "noted"]
    # ... and the session goes on.
    clock.mend()
    again = Agent(
        model=ScriptedModel.of("yes"),
        session=session,
        clock=clock,
        context=ContextManager(context_window=100_000),
    )
    assert (await again.run("still there?")).ok
    await store.aclose()
    assert await _stored(path, session_id) == (
        ["done", "failed", "done"],
        ["remember: the code is 42", "noted", "still there?", "yes"],
    )


@pytest.mark.parametrize("bad", BAD_READINGS, ids=BAD_IDS)
@pytest.mark.parametrize("good", [1, 2, 3, 5], ids=lambda n: f"after-{n}")
async def test_a_clock_that_goes_bad_mid_run_ends_the_run_in_memory(
    good: int, bad: Callable[[], object]
) -> None:
    clock = GoesBad(good, bad)
    agent = Agent(
        model=ScriptedModel.of(reply("", tool_call("echo", text="hi")), "done"),
        tools=[echo],
        clock=clock,
        context=ContextManager(context_window=100_000),
    )

    with pytest.raises((ConfigError, RuntimeError)):
        await agent.run("hello")

    assert [r.outcome for r in agent.session.runs] == ["failed"]
    clock.mend()
    again = Agent(
        model=ScriptedModel.of("yes"),
        session=agent.session,
        clock=clock,
        context=ContextManager(context_window=100_000),
    )
    assert (await again.run("still there?")).ok
    assert [r.outcome for r in agent.session.runs] == ["failed", "done"]


async def test_a_clock_giving_whole_seconds_is_a_clock(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    agent = Agent(
        model=ScriptedModel.of("ok"),
        store=SQLiteStore(path),
        clock=lambda: 1_700_000_000,
        context=ContextManager(context_window=100_000),
    )

    assert (await agent.run("hello")).ok

    outcomes, _ = await _stored(path, agent.session.id)
    assert outcomes == ["done"]


class HalfCount:
    """An incremental counter whose `count` says half of what its units sum to."""

    def count(self, messages: Sequence[Message]) -> int:
        return HEURISTIC.count(messages) // 2

    def count_text(self, text: str) -> int:
        return HEURISTIC.count_text(text)

    def units(self, message: Message) -> int:
        return HEURISTIC.units(message)

    def text_units(self, text: str) -> int:
        return HEURISTIC.text_units(text)

    def tokens(self, units: int) -> int:
        return HEURISTIC.tokens(units)


class AsIs:
    """A compactor with nothing to cut: it gives its input back."""

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        return CompactionProposal.compacted(list(messages), ctx.tokens_before, 0)


async def test_a_counter_at_odds_with_itself_commits_no_pass_that_changed_nothing() -> (
    None
):
    """The driver sizes requests by the units, the manager by `count`."""
    script = [reply("", tool_call("echo", f"c{i}", text="x" * 600)) for i in range(8)]
    agent = Agent(
        model=ScriptedModel.of(*script, "done"),
        tools=[echo],
        context=ContextManager(AsIs(), context_window=2_000, counter=HalfCount()),
    )

    result = await agent.run("hello")

    assert isinstance(result.error, CompactionStalled)  # not 20 passes in a row
    (run,) = agent.session.runs
    assert run.compactions  # the passes ran, and none committed anything
    assert {c.verdict for c in run.compactions} == {"noop"}
