"""A run whose session another process takes over, or ends, while it runs.

The run stops with exit status 1, naming its session and the ``turnfsm
sessions show`` (with the store the run used) that says what the other
process did; an answer to a run that is not paused is refused first for that.
"""

from __future__ import annotations

import io
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from tests.cli import approval_agent
from turnfsm import Agent
from turnfsm.cli import main
from turnfsm.cli._run import AgentOptions, StoreStopped, raise_if_crashed
from turnfsm.cli._stores import store_option
from turnfsm.errors import SessionConflict
from turnfsm.persistence import STORE_ENV, Session, SQLiteStore
from turnfsm.testing import FakeModelClient, reply, tool_call

Capture = pytest.CaptureFixture[str]
AGENTS = "tests.cli.approval_agent"

# A short tool ends before the run's next lease renewal (a 30 s lease renews
# every 10 s); a long one waits past one (a 0.3 s lease renews every 0.1 s).
TIMINGS = pytest.mark.parametrize(
    ("ttl", "after"), [(30.0, 0.0), (0.3, 0.6)], ids=["before", "after-renewal"]
)


@pytest.fixture(autouse=True)
def own_store(tmp_path: Path) -> Iterator[Path]:
    store = tmp_path / "own.db"
    approval_agent.OWN_STORE[:] = approval_agent.STORE_FILES[:] = [store]
    yield store
    approval_agent.OWN_STORE.clear()
    approval_agent.STORE_FILES.clear()
    approval_agent.TAKEN_AFTER[:] = [0.0]
    approval_agent.LEASE_TTL[:] = [30.0]


def _stopped(
    capsys: Capture, agent: str, ttl: float, after: float
) -> tuple[str, str, str]:
    approval_agent.LEASE_TTL[:] = [ttl]
    approval_agent.TAKEN_AFTER[:] = [after]
    assert main(["run", "tidy up", "--agent", f"{AGENTS}:{agent}"]) == 1
    captured = capsys.readouterr()
    found = re.search(r"session (ses_\w+) stored in", captured.out)
    assert found is not None, captured.out
    return found.group(1), captured.out, captured.err


@TIMINGS
def test_a_run_abandoned_from_another_shell_says_it_was_ended_there(
    capsys: Capture, own_store: Path, ttl: float, after: float
) -> None:
    # It said the other process "goes on with it", though it had ended the
    # run; and `sessions show` looked in the default store, not the agent's.
    session_id, out, err = _stopped(capsys, "abandoned_in_its_store", ttl, after)
    show = shlex.join(["turnfsm", "sessions", "show", session_id])
    seen = f"; see what it did: {show} --store {own_store}\n"
    if "nobody holds it now" in err:
        assert (
            "run stopped: another process took its session over and has let it "
            "go: it ended the run (finished or abandoned it), or removed the "
            f"session{seen}"
        ) in out
    else:  # a renewal found the abandoning process holding the session
        assert "took the session over" in err
        assert f"run stopped: another process took its session over{seen}" in out
    assert "run it again" not in out + err
    assert main(["sessions", "show", session_id, "--store", str(own_store)]) == 0
    assert "took over" in capsys.readouterr().out  # the abandon's reason


@TIMINGS
def test_a_run_taken_over_in_its_agents_store_names_that_store(
    capsys: Capture, own_store: Path, ttl: float, after: float
) -> None:
    session_id, out, err = _stopped(capsys, "taken_over_in_its_store", ttl, after)
    assert "'elsewhere:1:x' took the session over" in err
    assert (
        "run stopped: another process took its session over; see what it did: "
        f"turnfsm sessions show {session_id} --store {own_store}\n"
    ) in out


def test_the_store_option_names_no_store_a_command_opens_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    default, other = tmp_path / "default.db", tmp_path / "other.db"
    monkeypatch.setenv(STORE_ENV, str(default))
    assert store_option(SQLiteStore(default), None) == []
    assert store_option(SQLiteStore(other), None) == ["--store", str(other)]
    given = "postgresql://app:s3cret@db/agents"
    assert store_option(SQLiteStore(other), given) == [
        "--store",
        "postgresql://app:PASSWORD@db/agents",
    ]


def test_a_write_conflict_after_the_run_began_is_never_to_be_run_again(
    tmp_path: Path,
) -> None:
    # A store that keeps no leases finds another writer at the run's next
    # append: the run began (its tools may have run), so it stops as one
    # taken over would, with exit status 1; it said "run it again" (status 2).
    path = tmp_path / "s.db"

    async def begun() -> Session:
        agent = Agent(model=FakeModelClient(lambda r: reply("done")), store=str(path))
        await agent.run("go")
        async with SQLiteStore(path) as store:
            return await Session.load(store, agent.session.id)

    session = anyio.run(begun)
    conflict = SessionConflict(session.id, 5, 7)
    store = SQLiteStore(path)
    with pytest.raises(StoreStopped) as stopped:
        raise_if_crashed(conflict, session, 0, store)
    out, err = io.StringIO(), io.StringIO()
    assert stopped.value.report("turnfsm run", AgentOptions(), out, err) == 1
    assert err.getvalue() == (
        f"turnfsm run: session {session.id!r} changed under this run: another "
        "writer appended to its log (version 7, where the run expected 5), and "
        "nothing more of the run was written\n"
    )
    assert (
        "run stopped: another process wrote to its session while it ran; see "
        f"what it did: turnfsm sessions show {session.id} --store {path}\n"
    ) in out.getvalue()


@pytest.mark.parametrize("force", [[], ["--force"]], ids=["plain", "force"])
@pytest.mark.parametrize("action", ["approve", "reject"])
def test_an_answer_to_an_unfinished_run_held_elsewhere_says_it_is_not_paused(
    capsys: Capture, tmp_path: Path, action: str, force: list[str]
) -> None:
    # Given --force, it still said the session was held and to take it over
    # with --force; an answer cannot apply to a run that is not paused,
    # whoever holds it, as the command says once the lease has run out.
    started = anyio.Event()

    async def slow(n: int) -> str:
        """Work slowly.

        Args:
            n: Which.
        """
        started.set()
        await anyio.sleep(60)
        return "done"

    store = str(tmp_path / "s.db")

    async def cut_off() -> tuple[str, str]:
        agent = Agent(
            model=FakeModelClient(lambda r: reply("", tool_call("slow", "c1", n=1))),
            tools=[slow],
            store=store,
        )
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(agent.run, "go")
            await started.wait()
            tasks.cancel_scope.cancel()  # interrupted: an unfinished run
        async with SQLiteStore(store) as db:
            await db.acquire_lease(agent.session.id, "elsewhere:1:abc", ttl=600)
        (run,) = agent.session.runs
        return agent.session.id, run.run_id

    session_id, run_id = anyio.run(cut_off)
    agent = f"{AGENTS}:careful"
    argv = [action, session_id, "--agent", agent, "--store", store]
    assert main([*argv, *force]) == 2

    out, err = capsys.readouterr()
    resume = f"turnfsm resume {session_id} --agent {agent} --store {store}"
    assert err.startswith(
        f"turnfsm {action}: invalid SESSION={session_id!r}: expected a paused run "
        f"to {action}: run {run_id} is unfinished, and `{resume}` carries it on; "
        f"session {session_id!r} (run {run_id!r}) is held by 'elsewhere:1:abc'"
    )
    assert f"take it over with `{resume} --force` only if" in err
    assert "goes on" not in out
    assert "--force takes it over" not in err


def test_an_answer_to_a_session_with_no_open_run_names_its_agents_store(
    capsys: Capture, own_store: Path
) -> None:
    # `sessions show` takes no --agent: without the agent's store it looked
    # in the default one, where the session is not.
    agent = f"{AGENTS}:careful_in_its_store"
    assert main(["run", "Free disk.", "--agent", agent]) == 3
    found = re.search(r"session (ses_\w+) stored in", capsys.readouterr().out)
    assert found is not None
    session_id = found.group(1)
    assert main(["abandon", session_id, "--agent", agent]) == 0
    capsys.readouterr()

    assert main(["approve", session_id, "--agent", agent]) == 2

    show = f"turnfsm sessions show {session_id} --store {own_store}"
    assert f"it has none: `{show}` lists its runs)" in capsys.readouterr().err
