"""The reference tables of the docs, generated from the code so they cannot drift.

A page holds a generated table between two marker comments::

    <!-- generated: guards -->
    ...
    <!-- end generated -->

and this module writes what goes between them, from the tables the code
itself uses: the machine file's vocabulary (the guards, reducers and errors
the loader accepts, the reducers tied to one event, the decisions and their
built-in effects, the built-in triggers), the tree of `turnfsm.errors`, and
the ``--help`` of every command of the CLI. Each description is the summary
line of the docstring of what it describes.

Run it from the repository root::

    python -m tests.docs_tables          # rewrite the stale tables
    python -m tests.docs_tables --check  # exit 1, naming them, if any is stale

``scripts/check`` runs the check, and tests/test_docs_tables.py asserts it.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from turnfsm import core, driver, errors
from turnfsm.cli import _parser as cli_parser  # the parser `turnfsm` runs
from turnfsm.core._conversation_checks import PLACED  # where they may run
from turnfsm.core._events import trigger_name
from turnfsm.core._reducers import ACCEPTS  # what the loader checks by
from turnfsm.core._spec import DECISION_KINDS

REPO_ROOT = Path(__file__).resolve().parent.parent

PAGES = (
    "docs/concepts/machine.md",
    "docs/reference/cli.md",
    "docs/reference/errors.md",
)
"""The pages that hold generated tables, relative to the repository root."""

REGION = re.compile(
    r"^(?P<indent>[ ]*)<!-- generated: (?P<name>[\w-]+) -->\n"
    r"(?P<body>.*?)^(?P=indent)<!-- end generated -->$",
    re.MULTILINE | re.DOTALL,
)
"""A generated region; one inside a list item is indented as the item is."""
HELP_WIDTH = 80
"""The terminal width the CLI's help is shown at."""


# -- text from docstrings ---------------------------------------------------


def summary(obj: object) -> str:
    """The summary line of `obj`'s docstring, as Markdown on one line."""
    doc = inspect.getdoc(obj)
    if not doc:
        raise ValueError(f"{obj!r} has no docstring to describe it with")
    first = doc.split("\n\n", 1)[0]
    text = " ".join(first.split())
    return re.sub(r"``([^`]+)``", r"`\1`", text).replace("|", r"\|")


def table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def code(name: str) -> str:
    """`name` as inline code."""
    return f"`{name}`"


def ref(name: str, target: str) -> str:
    """A link to the API reference of `target`, shown as `name`."""
    return f"[`{name}`][{target}]"


def in_source_order(table_: Mapping[str, Callable[..., Any]]) -> list[str]:
    """The names of `table_`, in the order their functions are defined."""
    return sorted(table_, key=lambda name: inspect.getsourcelines(table_[name])[1])


# -- the machine file's vocabulary -------------------------------------------


def guards() -> str:
    """Every guard a machine file may name, and when it passes."""
    rows = [(code(n), summary(core.GUARDS[n])) for n in in_source_order(core.GUARDS)]
    return table(("guard", "passes when"), rows)


def reducers() -> str:
    """Every reducer a machine file may name, and what it does."""
    rows = [
        (code(n), summary(core.REDUCERS[n])) for n in in_source_order(core.REDUCERS)
    ]
    return table(("reducer", "what it does to the snapshot"), rows)


def failure_errors() -> dict[str, type[errors.TurnFSMError]]:
    """The error class each failure name ends a run with."""
    found: dict[str, type[errors.TurnFSMError]] = {}
    for name in core.FAILURES:
        error = core.Failure(kind=name).to_error()
        found[name] = type(error)
    return found


def failures() -> str:
    """Every `error` a transition into a fail phase may name."""
    rows = [
        (code(name), ref(cls.__name__, f"turnfsm.errors.{cls.__name__}"))
        for name, cls in failure_errors().items()
    ]
    return table(("error", "the run ends with"), rows)


def _triggers_in_order(names: frozenset[str]) -> list[str]:
    order = [trigger_name(cls) for cls in core.EVENT_TYPES]
    return sorted(names, key=order.index)


def accepts() -> str:
    """The reducers and errors that read one kind of event, and the others."""
    groups: dict[str, list[str]] = {}
    triggers: dict[str, frozenset[str]] = {}
    for name, accepted in ACCEPTS.items():
        key = ",".join(sorted(accepted))
        groups.setdefault(key, []).append(name)
        triggers[key] = accepted
    rows = [
        (
            ", ".join(map(code, names)),
            ", ".join(map(code, _triggers_in_order(triggers[key]))),
        )
        for key, names in groups.items()
    ]
    tied = {*ACCEPTS, *PLACED}
    free_reducers = [n for n in in_source_order(core.REDUCERS) if n not in tied]
    free_errors = [n for n in core.FAILURES if n not in ACCEPTS]
    kept = ", ".join(
        f"{code(name)} only on the way into a {kind} phase"
        for name, (kind, _does) in PLACED.items()
    )
    others = (
        f"The others ({', '.join(map(code, free_reducers))}, and the errors "
        f"{', '.join(map(code, free_errors))}) are not tied to one event and "
        f"may appear anywhere; {kept} (its `on_enter`, or a transition into it)."
    )
    return table(("reducer or error", "only on"), rows) + "\n\n" + others


def decision_classes() -> dict[str, type]:
    """The decision class each decision kind of a machine file emits."""
    by_kind = {
        re.sub(r"(?<=[a-z])(?=[A-Z])", "_", cls.__name__).lower(): cls
        for cls in core.DECISION_TYPES
    }
    missing = DECISION_KINDS - by_kind.keys()
    if missing:
        raise ValueError(f"no decision class for the decisions {sorted(missing)}")
    return {k: cls for k, cls in by_kind.items() if k in DECISION_KINDS}


def decisions() -> str:
    """Every built-in decision a phase may emit, and the effect doing it."""
    rows = []
    for kind, cls in decision_classes().items():
        effect = driver.BUILTIN_EFFECTS.get(kind)
        done_by = (
            ref(effect.__name__, f"turnfsm.driver.{effect.__name__}")
            + ": "
            + summary(effect)
            if effect is not None
            else "none: the driver ends the run"
        )
        rows.append(
            (code(kind), ref(cls.__name__, f"turnfsm.core.{cls.__name__}"), done_by)
        )
    return table(("decision", "the brain emits", "built-in effect"), rows)


def triggers() -> str:
    """Every built-in trigger: the event that fires it, and when it comes."""
    rows = [
        (
            code(trigger_name(cls)),
            ref(cls.__name__, f"turnfsm.core.{cls.__name__}"),
            summary(cls),
        )
        for cls in core.EVENT_TYPES
        if cls is not core.Signal
    ]
    return table(("trigger", "event", "fed when"), rows)


# -- the errors' tree ---------------------------------------------------------


def error_tree() -> str:
    """The tree of `turnfsm.errors`, one line per error from its docstring."""
    classes = [
        obj
        for name in errors.__all__
        if isinstance(obj := getattr(errors, name), type)
        and issubclass(obj, errors.TurnFSMError)
    ]
    lines: list[str] = []

    def walk(cls: type, depth: int) -> None:
        also = [
            b.__name__
            for b in cls.__bases__
            if not issubclass(b, errors.TurnFSMError) and b is not Exception
        ]
        extra = f" (also {', '.join(also)})" if also else ""
        name = ref(cls.__name__, f"turnfsm.errors.{cls.__name__}")
        lines.append(f"{'    ' * depth}- {name}{extra}: {summary(cls)}")
        for sub in classes:
            if sub.__bases__[0] is cls:
                walk(sub, depth + 1)

    walk(errors.TurnFSMError, 0)
    if len(lines) != len(classes):
        raise ValueError("an error class is not under TurnFSMError's first bases")
    return "\n".join(lines)


# -- the CLI's help -----------------------------------------------------------


@contextlib.contextmanager
def _columns(width: int) -> Iterator[None]:
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(width)
    try:
        yield
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The subcommands of `parser`, by name (none: empty)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _subparser(path: Sequence[str]) -> argparse.ArgumentParser:
    parser = cli_parser()
    for name in path:
        parser = subcommands(parser)[name]
    return parser


def cli_help(*command: str) -> Callable[[], str]:
    """The ``--help`` of ``turnfsm COMMAND...``, as a text block."""

    def render() -> str:
        with _columns(HELP_WIDTH):
            text = _subparser(command).format_help()
        return f"```text\n{text.rstrip()}\n```"

    render.__doc__ = f"The help of `turnfsm {' '.join(command)}`."
    return render


def cli_usages(*commands: str) -> Callable[[], str]:
    """The usage lines of several subcommands that share a section."""

    def render() -> str:
        with _columns(HELP_WIDTH):
            text = "".join(_subparser([c]).format_usage() for c in commands)
        return f"```text\n{text.rstrip()}\n```"

    return render


GENERATORS: Mapping[str, Callable[[], str]] = {
    "decisions": decisions,
    "triggers": triggers,
    "guards": guards,
    "reducers": reducers,
    "failures": failures,
    "accepts": accepts,
    "errors": error_tree,
    "cli": cli_help(),
    "cli-demo": cli_help("demo"),
    "cli-worker": cli_help("worker"),
    "cli-replay": cli_help("replay"),
    "cli-simulate": cli_help("simulate"),
    "cli-run": cli_help("run"),
    "cli-answers": cli_usages("approve", "reject", "resume", "abandon"),
    "cli-diagram": cli_help("diagram"),
    "cli-report": cli_help("report"),
    "cli-view": cli_help("view"),
    "cli-check": cli_help("check"),
    "cli-eval": cli_help("eval"),
    "cli-sessions": cli_help("sessions"),
    "cli-sessions-reset-breaker": cli_help("sessions", "reset-breaker"),
}
"""Table name (the marker's) -> what it holds."""


# -- pages ----------------------------------------------------------------------


def regenerate(text: str, where: str) -> str:
    """`text` with every generated region written afresh."""

    def fill(match: re.Match[str]) -> str:
        name = match.group("name")
        if name not in GENERATORS:
            known = ", ".join(GENERATORS)
            raise ValueError(f"{where}: unknown generated table {name!r} ({known})")
        indent = match.group("indent")
        body = "\n".join(
            indent + line if line else line for line in GENERATORS[name]().splitlines()
        )
        return (
            f"{indent}<!-- generated: {name} -->\n\n{body}\n\n"
            f"{indent}<!-- end generated -->"
        )

    return REGION.sub(fill, text)


def regions(text: str) -> list[str]:
    """The names of the generated regions of `text`, in order."""
    return [m.group("name") for m in REGION.finditer(text)]


def problems(root: Path) -> list[str]:
    """What is stale or missing in the pages under `root` (empty: all fresh)."""
    found: list[str] = []
    seen: list[str] = []
    for page in PAGES:
        path = root / page
        text = path.read_text(encoding="utf-8")
        seen += regions(text)
        fresh = regenerate(text, page)
        for name, old, new in zip(
            regions(text), REGION.finditer(text), REGION.finditer(fresh), strict=True
        ):
            if old.group(0) != new.group(0):
                found.append(f"{page}: the generated table {name!r} is stale")
    for name in GENERATORS:
        if seen.count(name) != 1:
            found.append(
                f"the generated table {name!r} is on {seen.count(name)} pages' "
                f"markers, expected once in {', '.join(PAGES)}"
            )
    return found


def write(root: Path) -> list[str]:
    """Rewrite the stale pages under `root`; return those rewritten."""
    written = []
    for page in PAGES:
        path = root / page
        text = path.read_text(encoding="utf-8")
        fresh = regenerate(text, page)
        if fresh != text:
            path.write_text(fresh, encoding="utf-8")
            written.append(page)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """Rewrite the generated tables, or with ``--check`` only report stale ones."""
    parser = argparse.ArgumentParser(prog="python -m tests.docs_tables")
    parser.add_argument("--check", action="store_true", help="only report")
    parser.add_argument("--root", type=Path, default=REPO_ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.check:
        found = problems(args.root)
        for line in found:
            print(line, file=sys.stderr)
        if found:
            print("run `python -m tests.docs_tables` to regenerate", file=sys.stderr)
            return 1
        return 0
    for page in write(args.root):
        print(f"wrote {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
