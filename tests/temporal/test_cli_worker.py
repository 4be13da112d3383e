"""``turnfsm worker`` and ``turnfsm demo --durable`` as a user runs them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import anyio
import pytest

from turnfsm import Agent
from turnfsm.cli._agents import load_agents
from turnfsm.errors import ConfigError, TemporalUnreachable
from turnfsm.persistence import Session, SQLiteStore
from turnfsm.testing import ScriptedModel

pytestmark = pytest.mark.timeout(120)

AGENT = Agent(model=ScriptedModel.of("x"), name="cli-test")


def make_agents() -> list[Agent]:
    return [AGENT]


def _turnfsm(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "turnfsm", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=90,
        check=False,
    )


def _started(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    """``turnfsm ARGS`` running, its output piped (stop it with a signal)."""
    return subprocess.Popen(
        [sys.executable, "-m", "turnfsm", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_a_worker_serves_the_demo_to_demo_durable(
    temporal_address: str, tmp_path: Path
) -> None:
    queue = f"cli-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "TURNFSM_STORE": str(tmp_path / "worker.db")}
    worker = _started(
        "worker", "--task-queue", queue, "--address", temporal_address, env=env
    )
    try:
        assert worker.stdout is not None
        first = worker.stdout.readline()
        assert f"serving turnfsm on task queue {queue!r}" in first
        client_env = {**os.environ, "TURNFSM_STORE": str(tmp_path / "client.db")}
        durable = _turnfsm(
            "demo",
            "--durable",
            "--task-queue",
            queue,
            "--address",
            temporal_address,
            env=client_env,
        )
        local = _turnfsm("demo", "--quiet", env=client_env)
    finally:
        worker.send_signal(signal.SIGINT)
        out, err = worker.communicate(timeout=30)
    assert durable.returncode == 0, durable.stderr
    answer = durable.stdout.strip().splitlines()[-1]
    assert answer.startswith("final answer (6 model calls)")
    assert answer == local.stdout.strip().splitlines()[-1]
    assert worker.returncode == 0, err
    assert "stopped" in out

    # The run's log is in the worker's store.
    async def stored() -> list[str]:
        store = SQLiteStore(tmp_path / "worker.db")
        [info] = await store.list_sessions()
        session = await Session.load(store, info.id)
        return [r.outcome for r in session.runs]

    assert anyio.run(stored) == ["done"]


def test_a_bad_address_or_agent_is_named(tmp_path: Path) -> None:
    env = {**os.environ, "TURNFSM_STORE": str(tmp_path / "w.db")}
    bad = _turnfsm("worker", "--task-queue", "q", "--address", "127.0.0.1:9", env=env)
    assert bad.returncode == 2
    assert "--address='127.0.0.1:9'" in bad.stderr
    assert "(none answered there: Connection refused); start one" in bad.stderr
    missing = _turnfsm("worker", "--task-queue", "q", "--agent", "nosuch:x", env=env)
    assert missing.returncode == 2
    assert "--agent='nosuch:x'" in missing.stderr
    need = _turnfsm("worker", env=env)
    assert need.returncode == 2
    assert "--task-queue" in need.stderr


def test_a_server_lost_before_the_worker_serves_is_named(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The server answered the address check, then went away (restarting)
    # before the worker's own start-up check, which the SDK fails with a
    # RuntimeError: one line naming the address, no traceback.
    pytest.importorskip("temporalio")
    from turnfsm.cli import _worker
    from turnfsm.temporal import _worker as temporal_worker

    class Lost:
        async def run(self) -> None:
            raise RuntimeError(
                "Worker validation failed: Namespace default was not found or "
                "otherwise could not be described: Status { code: Unavailable, "
                'message: "tcp connect error", source: Some(tonic::transport::'
                'Error(Transport, ConnectError(ConnectError("tcp connect error", '
                "127.0.0.1:7233, Os { code: 111, kind: ConnectionRefused, "
                'message: "Connection refused" })))) }'
            )

    async def checked(address: str, namespace: str) -> object:
        return object()

    monkeypatch.setattr(_worker, "_connect", checked)
    monkeypatch.setattr(temporal_worker, "create_worker", lambda *_: Lost())
    monkeypatch.setattr("turnfsm.temporal.create_worker", lambda *_: Lost())
    status = _worker.run_worker_command(
        "q",
        address="127.0.0.1:7233",
        namespace="default",
        agent=f"{__name__}:make_agents",
        store=None,
    )
    out, err = capsys.readouterr()
    assert status == 1, err
    assert err == (
        "turnfsm worker: lost the Temporal server at 127.0.0.1:7233 (Connection "
        "refused); start it again, then the worker (its runs are kept by the "
        "server and go on then)\n"
    )
    assert "stopped" not in out


def test_an_unknown_namespace_is_named_before_serving(
    temporal_address: str, tmp_path: Path
) -> None:
    env = {**os.environ, "TURNFSM_STORE": str(tmp_path / "w.db")}
    where = ("--address", temporal_address, "--namespace", "nosuch")
    for command in (("worker", "--task-queue", "q"), ("demo", "--durable")):
        refused = _turnfsm(*command, *where, env=env)
        assert refused.returncode == 2, refused.stderr
        assert refused.stdout == ""
        assert refused.stderr == (
            f"turnfsm {command[0]}: invalid --namespace='nosuch': expected a "
            f"namespace of the Temporal server at {temporal_address} (it has "
            "none of that name); create it (temporal operator namespace create "
            "--namespace nosuch) or give another\n"
        )


def test_a_worker_refuses_a_store_it_cannot_use_before_serving(
    tmp_path: Path,
) -> None:
    pytest.importorskip("psycopg")
    env = {**os.environ, "TURNFSM_STORE": str(tmp_path / "w.db")}
    store = "postgresql://app:s3cret@127.0.0.1:9/agents"  # nobody listens there
    refused = _turnfsm(
        "worker",
        "--task-queue",
        "q",
        "--address",
        "127.0.0.1:9",
        "--store",
        store,
        env=env,
    )
    assert refused.returncode == 2, refused.stderr
    assert refused.stdout == ""
    assert refused.stderr.startswith(
        "turnfsm worker: cannot use postgresql://app@127.0.0.1:9/agents as a "
        "turnfsm session store: connecting failed: "
    )
    assert len(refused.stderr.splitlines()) == 1


def _demo_whose_wait_raises(
    monkeypatch: pytest.MonkeyPatch, raised: BaseException, *, polled: bool = True
) -> int:
    """`turnfsm demo --durable`, its run started, `raised` while it is awaited.

    `polled`: whether a worker asked the queue for work lately.
    """
    import turnfsm.temporal
    from turnfsm.cli import _worker

    class Run:
        session_id = "ses_1"
        workflow_id = "turnfsm-ses_1"

        async def result(self) -> None:
            raise raised

    async def connect(address: str, namespace: str) -> object:
        return object()

    async def start(*args: object, **kwargs: object) -> Run:
        return Run()

    async def asked(client: object, namespace: str, task_queue: str) -> bool:
        return polled

    monkeypatch.setattr(_worker, "_connect", connect)
    monkeypatch.setattr(_worker, "_polled", asked)
    monkeypatch.setattr(turnfsm.temporal, "start_durable", start)
    return _worker.run_durable_demo(
        "q", address="127.0.0.1:7233", namespace="default", quiet=True
    )


def test_demo_durable_with_no_worker_says_how_to_start_one(
    temporal_address: str, tmp_path: Path
) -> None:
    queue = f"cli-{uuid.uuid4().hex[:8]}"  # no worker ever polled it
    env = {**os.environ, "TURNFSM_STORE": str(tmp_path / "client.db")}
    demo = _started(
        "demo",
        "--durable",
        "--task-queue",
        queue,
        "--address",
        temporal_address,
        env=env,
    )
    try:
        assert demo.stdout is not None
        started = demo.stdout.readline()
        hint = demo.stdout.readline()
    finally:
        demo.send_signal(signal.SIGINT)
        _, err = demo.communicate(timeout=30)
    assert "waiting for a worker..." in started
    assert hint == (
        f"no worker has asked {queue!r} for work lately: start one (turnfsm "
        f"worker --task-queue {queue} --address {temporal_address}, in another "
        "terminal) and the run goes on there\n"
    )
    assert demo.returncode == 130
    assert f"goes on when a worker serves {queue!r}" in err


def test_demo_durable_quiet_with_no_worker_says_how_to_start_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # With --quiet it waited for a worker without a word, for as long as
    # it took: five minutes, then a timeout, in one user's try.
    assert (
        _demo_whose_wait_raises(monkeypatch, KeyboardInterrupt(), polled=False) == 130
    )
    said = capsys.readouterr()
    assert said.out == ""
    assert said.err.startswith(
        "no worker has asked 'q' for work lately: start one (turnfsm worker "
        "--task-queue q --address 127.0.0.1:7233, in another terminal) and the "
        "run goes on there\n"
    )


def test_demo_durable_says_when_its_worker_stops_mid_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Its worker killed mid-run, it waited for another without a word, for
    # ever: the queue is looked at while it waits, and its going unpolled
    # is said once, as at the start.
    pytest.importorskip("temporalio")
    import turnfsm.temporal
    from turnfsm.cli import _worker

    looks = iter([True, True, False, False, True])
    waits = 0

    class Run:
        session_id = "ses_1"
        workflow_id = "turnfsm-ses_1"

        async def result(self) -> None:
            nonlocal waits
            waits += 1
            if waits == 5:
                raise KeyboardInterrupt
            await anyio.sleep(3600)

    async def connect(address: str, namespace: str) -> object:
        return object()

    async def start(*args: object, **kwargs: object) -> Run:
        return Run()

    async def asked(client: object, namespace: str, task_queue: str) -> bool:
        return next(looks)

    monkeypatch.setattr(_worker, "_connect", connect)
    monkeypatch.setattr(_worker, "_polled", asked)
    monkeypatch.setattr(_worker, "WATCH", 0.01)
    monkeypatch.setattr(turnfsm.temporal, "start_durable", start)
    status = _worker.run_durable_demo(
        "q", address="127.0.0.1:7233", namespace="default", quiet=True
    )
    assert status == 130
    err = capsys.readouterr().err
    assert err.count("no worker has asked 'q' for work lately") == 1
    assert err.startswith(
        "no worker has asked 'q' for work lately: start one (turnfsm worker "
        "--task-queue q --address 127.0.0.1:7233, in another terminal) and the "
        "run goes on there\n"
    )


def test_demo_durable_says_the_server_was_lost_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    service = pytest.importorskip("temporalio.service")
    lost = service.RPCError("tcp connect error", service.RPCStatusCode.UNAVAILABLE, b"")
    assert _demo_whose_wait_raises(monkeypatch, lost) == 1
    assert capsys.readouterr().err == (
        "turnfsm demo: lost the Temporal server at 127.0.0.1:7233 (tcp connect "
        "error); the run of session ses_1 is kept by the server and goes on when "
        "it is back (turnfsm sessions show it in the worker's store)\n"
    )


def test_demo_durable_says_a_server_down_mid_wait_was_lost_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    lost = TemporalUnreachable(
        address="127.0.0.1:7233", session_id="ses_1", reason="tcp connect error"
    )
    assert _demo_whose_wait_raises(monkeypatch, lost) == 1
    assert capsys.readouterr().err == (
        "turnfsm demo: lost the Temporal server at 127.0.0.1:7233 (tcp connect "
        "error); the run of session ses_1 is kept by the server and goes on when "
        "it is back (turnfsm sessions show it in the worker's store)\n"
    )


def test_demo_durable_interrupted_says_the_run_goes_on(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("temporalio")
    assert _demo_whose_wait_raises(monkeypatch, KeyboardInterrupt()) == 130
    assert capsys.readouterr().err == (
        "\nturnfsm demo: interrupted; the durable run of session ses_1 goes on "
        "when a worker serves 'q' (cancel it with: temporal workflow cancel -w "
        "turnfsm-ses_1)\n"
    )


def test_load_agents_reads_an_agent_a_list_or_a_factory() -> None:
    here = __name__
    assert load_agents(f"{here}:AGENT") == [AGENT]
    assert load_agents(f"{here}:make_agents") == [AGENT]
    for spec, why in [
        ("no_colon", "MODULE:ATTR"),
        (f"{here}:nothing_here", "defines"),
        (f"{here}:pytestmark", "Agent"),
    ]:
        with pytest.raises(ConfigError, match=why):
            load_agents(spec)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=str)
def test_a_worker_stops_gracefully_on_sigterm_or_a_closed_terminal(
    temporal_address: str, tmp_path: Path, signum: signal.Signals
) -> None:
    # SIGHUP (its terminal closed) killed the worker on the spot, not shut
    # down as Ctrl-C and SIGTERM do.
    queue = f"cli-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "TURNFSM_STORE": str(tmp_path / "worker.db")}
    worker = _started(
        "worker", "--task-queue", queue, "--address", temporal_address, env=env
    )
    assert worker.stdout is not None
    assert "serving turnfsm" in worker.stdout.readline()
    worker.send_signal(signum)
    out, err = worker.communicate(timeout=30)

    assert worker.returncode == 0, err
    assert "turnfsm worker: stopped" in out
