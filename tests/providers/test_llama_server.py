"""The local server stops itself when the process that started it dies.

`LlamaServer` runs llama.cpp's server in a session of its own; a script
killed without stopping it (SIGKILL, SIGTERM with no handler) would leave it
running, holding its port and memory. The server watches the process id
`LlamaServer` gives it and ends when that process is gone. Checked here
without llama.cpp, on real processes.
"""

from __future__ import annotations

import contextlib
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
    from turnfsm.providers import LlamaServer, _local

    seen: dict[str, Any] = {}

    class Started(Exception):
        pass

    def popen(command: list[str], **options: Any) -> None:
        seen.update(options)
        raise Started

    monkeypatch.setattr(_local.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(_local.subprocess, "Popen", popen)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    with pytest.raises(Started):
        LlamaServer(model_path=model, port=9).start()
    assert seen["env"][PARENT_ENV] == str(os.getpid())
    assert seen["start_new_session"] is True


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
