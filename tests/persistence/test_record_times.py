"""An entry's time (`at`) is a number, or nothing is written.

`Session.reset_breaker(at=...)` stamps the reset with a time of the caller's:
one that is not a finite number is refused before anything is written (a
string or None written to SQLite left a session that no longer loaded,
while the writing process went on appending). The records with an `at`
refuse what the log cannot read back, however they are built; what logs
already hold, NaN and the infinities among it, still loads.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest

from turnfsm import Agent
from turnfsm.core import Budget, RunStarted
from turnfsm.errors import ConfigError
from turnfsm.messages import Message
from turnfsm.persistence import (
    BreakerChanged,
    EventRecorded,
    RunEnded,
    RunOpened,
    Session,
    SQLiteStore,
)
from turnfsm.testing import ScriptedModel

pytestmark = pytest.mark.anyio

NOT_TIMES = ["x", None, True, [1.0], 10**400]
NOT_TIME_IDS = ["str", "none", "bool", "list", "int-past-float"]


async def _session_with_a_run(store: SQLiteStore) -> Session:
    agent = Agent(model=ScriptedModel(["x", "y"]), store=store)
    await agent.run("hi")
    assert agent.session is not None
    return agent.session


@pytest.mark.parametrize(
    "at", [*NOT_TIMES, math.nan, math.inf], ids=[*NOT_TIME_IDS, "nan", "inf"]
)
async def test_reset_breaker_refuses_an_at_that_is_not_a_finite_number(
    tmp_path: Path, at: object
) -> None:
    async with SQLiteStore(tmp_path / "s.db") as store:
        session = await _session_with_a_run(store)
        version = session.version

        with pytest.raises(ConfigError) as info:
            await session.reset_breaker(at=at)  # type: ignore[arg-type]  # misuse on purpose

        assert info.value.field == "at"
        assert info.value.value is at
        assert session.version == version  # nothing written, nor projected
        loaded = await Session.load(store, session.id)  # and the session loads
        assert loaded.version == version


@pytest.mark.parametrize("at", [0.0, 1_700_000_000, 1_700_000_000.5, -1.0])
async def test_reset_breaker_takes_an_int_or_a_float(tmp_path: Path, at: float) -> None:
    async with SQLiteStore(tmp_path / "s.db") as store:
        session = await _session_with_a_run(store)
        await session.reset_breaker(at=at)
        loaded = await Session.load(store, session.id)

    last = loaded.entries[-1]
    assert isinstance(last, BreakerChanged)
    assert last.at == at


RECORDS: dict[str, Callable[[object], object]] = {
    "RunOpened": lambda at: RunOpened(
        run_id="r",
        machine="turn",
        digest="d",
        budget=Budget(),
        at=at,  # type: ignore[arg-type]  # misuse on purpose
    ),
    "EventRecorded": lambda at: EventRecorded(
        run_id="r",
        index=0,
        event=RunStarted(input=(Message.user("hi"),)),
        phase="call_llm",
        decision="call_llm",
        at=at,  # type: ignore[arg-type]  # misuse on purpose
    ),
    "RunEnded": lambda at: RunEnded(
        run_id="r",
        outcome="done",
        phase="done",
        at=at,  # type: ignore[arg-type]  # misuse on purpose
    ),
    "BreakerChanged": lambda at: BreakerChanged(
        run_id="",
        open=False,
        failures=0,
        at=at,  # type: ignore[arg-type]  # misuse on purpose
    ),
}


@pytest.mark.parametrize("record", sorted(RECORDS))
@pytest.mark.parametrize("at", NOT_TIMES, ids=NOT_TIME_IDS)
def test_a_record_refuses_an_at_the_log_cannot_read_back(
    record: str, at: object
) -> None:
    with pytest.raises(ConfigError) as info:
        RECORDS[record](at)

    assert info.value.field == "at"
    assert info.value.value is at


@pytest.mark.parametrize(
    "at", [math.nan, math.inf, -math.inf, 5], ids=["nan", "inf", "-inf", "int"]
)
async def test_a_log_holding_any_time_it_was_ever_given_still_loads(
    tmp_path: Path, at: float
) -> None:
    # Logs hold such times: a run's clock was not always checked, and a
    # reset took any `at`. The log has read them back; it still does.
    path = tmp_path / "s.db"
    async with SQLiteStore(path) as store:
        session = await _session_with_a_run(store)
        await session.append(BreakerChanged(run_id="", open=False, failures=0, at=at))
        version = session.version

    async with SQLiteStore(path) as store:
        loaded = await Session.load(store, session.id)

    assert loaded.version == version
    last = loaded.entries[-1]
    assert isinstance(last, BreakerChanged)
    assert type(last.at) is float
    assert last.at == at or (math.isnan(at) and math.isnan(last.at))
