"""The local server stops itself when the process that started it dies.

`LlamaServer` runs llama.cpp's server in a session of its own; a script
killed without stopping it (SIGKILL, SIGTERM with no handler) would leave it
running, holding its port and memory. The server watches the process id
`LlamaServer` gives it and ends when that process is gone. Checked here
without llama.cpp, on real processes.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from turnfsm.providers._llama_serve import PARENT_ENV, watch_parent


def test_the_watch_calls_back_once_the_parent_is_another() -> None:
    gone = threading.Event()
    not_the_parent = os.getppid() + 1_000_000
    watch_parent(not_the_parent, gone.set, interval=0.01)
    assert gone.wait(5)


def test_the_watch_waits_while_the_parent_lives() -> None:
    gone = threading.Event()
    watch_parent(os.getppid(), gone.set, interval=0.01)
    assert not gone.wait(0.2)


def test_a_server_whose_starter_is_killed_stops(tmp_path: Path) -> None:
    marker = tmp_path / "gone"
    server = textwrap.dedent(
        f"""
        import os, time
        from turnfsm.providers._llama_serve import PARENT_ENV, watch_parent

        def gone():
            open({str(marker)!r}, "w").write("gone")
            os._exit(0)

        watch_parent(int(os.environ[PARENT_ENV]), gone, interval=0.05)
        time.sleep(30)
        """
    )
    starter = textwrap.dedent(
        f"""
        import os, subprocess, sys, time
        env = {{**os.environ, {PARENT_ENV!r}: str(os.getpid())}}
        child = subprocess.Popen(
            [sys.executable, "-c", {server!r}], start_new_session=True, env=env
        )
        print(child.pid, flush=True)
        time.sleep(30)
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    process = subprocess.Popen(
        [sys.executable, "-c", starter], stdout=subprocess.PIPE, text=True, env=env
    )
    assert process.stdout is not None
    child = int(process.stdout.readline())
    try:
        time.sleep(0.3)
        assert not marker.exists()
        process.kill()  # as SIGKILL: no finally, no stop()
        process.wait()
        deadline = time.monotonic() + 10
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.read_text() == "gone"
    finally:
        process.stdout.close()
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


def test_llama_server_tells_the_server_its_own_process_id(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _command, seen = _started(monkeypatch, tmp_path)
    assert seen["env"][PARENT_ENV] == str(os.getpid())
    assert seen["start_new_session"] is True


def _started(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **settings: Any
) -> tuple[list[str], dict[str, Any]]:
    """The command and the options `LlamaServer(**settings).start()` runs with."""
    from turnfsm.providers import LlamaServer, _local

    seen: list[tuple[list[str], dict[str, Any]]] = []

    class Started(Exception):
        pass

    def popen(command: list[str], **options: Any) -> None:
        seen.append((command, options))
        raise Started

    monkeypatch.setattr(_local.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(_local.subprocess, "Popen", popen)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    with pytest.raises(Started):
        LlamaServer(model_path=model, port=9, **settings).start()
    [started] = seen
    return started


def test_llama_server_reads_prompts_on_its_n_threads_too(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # llama.cpp's server reads a prompt on every core unless told: n_threads=1
    # still used both cores of a busy 2-core machine, its threads waiting for
    # each other (a 500-token prompt took 2-3x as long as on one thread).
    command, _options = _started(monkeypatch, tmp_path, n_threads=1)
    options = dict(itertools.pairwise(command))
    assert options["--n_threads"] == "1"
    assert options["--n_threads_batch"] == "1"


def test_a_window_past_the_bundled_models_context_is_refused(tmp_path: Path) -> None:
    # n_ctx=200000 started a server that died allocating 195 GiB, and the
    # error quoted its log: a Python traceback from numpy.
    from turnfsm.errors import ConfigError
    from turnfsm.providers import LlamaServer

    with pytest.raises(ConfigError) as refused:
        LlamaServer(n_ctx=200_000)
    assert str(refused.value) == (
        "invalid n_ctx=200000: expected an int in 1..32,768, the bundled "
        "Gemma 3 270M's trained context"
    )
    assert LlamaServer(n_ctx=32_768).n_ctx == 32_768
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    mine = LlamaServer(model_path=tmp_path / "m.gguf", n_ctx=200_000)
    assert mine.n_ctx == 200_000


def test_a_model_path_that_is_no_gguf_file_is_refused_at_once(tmp_path: Path) -> None:
    # The server was started, died, and the error quoted its log: a traceback.
    from turnfsm.errors import ConfigError
    from turnfsm.providers import LlamaServer

    missing = tmp_path / "nope.gguf"
    with pytest.raises(ConfigError) as refused:
        LlamaServer(model_path=missing)
    assert str(refused.value) == (
        f"invalid model_path={missing!r}: expected a GGUF model file "
        "(it does not exist)"
    )
    text = tmp_path / "notes.txt"
    text.write_text("not a model")
    with pytest.raises(ConfigError) as refused:
        LlamaServer(model_path=text)
    assert str(refused.value).endswith(
        "expected a GGUF model file (it does not start as one: b'not ')"
    )
    with pytest.raises(ConfigError) as refused:
        LlamaServer(model_path=tmp_path)
    assert str(refused.value).endswith("expected a GGUF model file (it is a directory)")
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF\x03\x00\x00\x00")
    assert LlamaServer(model_path=model).model_path == model


def _server_running(
    monkeypatch: pytest.MonkeyPatch, script: str
) -> list[subprocess.Popen[bytes]]:
    """Start `script` in place of llama.cpp's server; the processes started."""
    from turnfsm.providers import _local

    started: list[subprocess.Popen[bytes]] = []
    real = subprocess.Popen

    def popen(command: list[str], **options: Any) -> subprocess.Popen[bytes]:
        started.append(real([sys.executable, "-c", script], **options))
        return started[-1]

    monkeypatch.setattr(_local.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(_local.subprocess, "Popen", popen)
    return started


def _logs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the servers' logs go in this test."""
    import tempfile

    logs = tmp_path / "logs"
    logs.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(logs))
    return logs


def test_a_server_that_exits_says_why_in_a_few_lines_and_keeps_its_log(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A bare RuntimeError quoted up to 4,000 characters of the log (a
    # traceback's frames mostly); the log itself was gone.
    from turnfsm.errors import ModelServerFailed
    from turnfsm.providers import LlamaServer

    noise = "".join(f"print('llm_load_print_meta: key {n} = 1')\n" for n in range(200))
    script = (
        noise
        + "print('gguf_init_from_reader: failed to read header')\n"
        + "print('Traceback (most recent call last):')\n"
        + "print('  File \"x.py\", line 1, in <module>')\n"
        + "print('    raise ValueError(\"failed\")')\n"
        + "print('ValueError: Failed to load model from file: m.gguf')\n"
        + "raise SystemExit(1)\n"
    )
    started = _server_running(monkeypatch, script)
    logs = _logs(tmp_path, monkeypatch)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    port = _free_port()
    server = LlamaServer(model_path=model, port=port)
    with pytest.raises(ModelServerFailed) as failed:
        server.start()
    error = failed.value
    assert isinstance(error, RuntimeError)  # as it was
    assert error.lines == (
        "gguf_init_from_reader: failed to read header",
        "ValueError: Failed to load model from file: m.gguf",
    )
    assert str(error) == (
        f"the llama.cpp server of {model} on port {port} exited with status 1 "
        "before it answered; its log says:\n"
        "  gguf_init_from_reader: failed to read header\n"
        "  ValueError: Failed to load model from file: m.gguf\n"
        f"(its whole log: {error.log_path})"
    )
    assert Path(error.log_path).parent == logs
    whole = Path(error.log_path).read_text()
    assert "key 0 = 1" in whole
    assert whole.endswith("m.gguf\n")
    assert started[0].poll() == 1
    assert server.pid is None


def test_a_server_that_does_not_answer_in_time_is_stopped_and_says_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from turnfsm.errors import ModelServerFailed
    from turnfsm.providers import LlamaServer

    script = (
        "import time\n"
        + "".join(f"print('loading layer {n}', flush=True)\n" for n in range(10))
        + "time.sleep(60)\n"
    )
    started = _server_running(monkeypatch, script)
    _logs(tmp_path, monkeypatch)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    with pytest.raises(ModelServerFailed) as failed:
        LlamaServer(model_path=model, port=_free_port(), startup_timeout=1).start()
    error = failed.value
    assert "did not answer within startup_timeout=1s, and was stopped" in str(error)
    # Nothing said why: its last lines.
    assert error.lines == tuple(f"loading layer {n}" for n in range(4, 10))
    assert Path(error.log_path).exists()
    assert started[0].poll() is not None  # stopped


def test_a_server_that_started_leaves_no_log_behind(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from turnfsm.providers import LlamaServer

    port = _free_port()
    script = textwrap.dedent(
        f"""
        import http.server
        class Models(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b'{{"data": []}}')
        http.server.HTTPServer(("127.0.0.1", {port}), Models).serve_forever()
        """
    )
    _server_running(monkeypatch, script)
    logs = _logs(tmp_path, monkeypatch)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    server = LlamaServer(model_path=model, port=port, startup_timeout=30).start()
    assert len(list(logs.iterdir())) == 1  # its log, while it runs
    server.stop()
    assert not list(logs.iterdir())


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
