"""Absurd machine files and values are refused, typed, where they enter.

Two tables. Machine files: each is loaded with `load_machine` (one
`DefinitionError` problem, on its line) and checked with ``turnfsm check`` in
a child process (exit status 1, the problem printed as ``FILE:LINE: ...``,
no traceback); a definition given as a dict (`MachineSpec.from_dict`) names
its field instead. Values: each constructor raises the turnfsm error of its
family (`ConfigError` for settings, `InvalidMessage` for messages) naming the
field and the value; a commit of unknown messages writes nothing. What is no
mistake (a model's empty reply, a bound itself) is accepted.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest

from tests.helpers import REPO_ROOT, turn_toml_text
from turnfsm import Agent, Driver, load_machine
from turnfsm._checks import MAX_COUNT, MAX_JSON_DEPTH, MAX_TOKENS
from turnfsm.context import ContextManager
from turnfsm.core import Budget, MachineSpec, ModelReplied
from turnfsm.driver import RetryPolicy, Tool
from turnfsm.errors import ConfigError, DefinitionError, InvalidMessage
from turnfsm.messages import ImagePart, Message, TextPart, ToolCallPart
from turnfsm.persistence import (
    Committed,
    EventRecorded,
    MemoryStore,
    RunOpened,
    Session,
)
from turnfsm.testing import ScriptedModel

STOCK = turn_toml_text()
END = STOCK.count("\n") + 2
"""The line of a line added at the end of the stock file (after a blank one)."""


def at_end(line: str) -> bytes:
    return f"{STOCK}\n{line}\n".encode()


def chain(phases: int, *, bounded: bool) -> bytes:
    """The stock machine with `phases` custom phases in a row after the tools."""
    text = STOCK.replace(
        'terminal = ["done", "failed"]\n',
        'terminal = ["done", "failed"]\nsignals = ["stepped"]\n',
    )
    states = "".join(f'p{i} = {{ effect = "step" }}\n' for i in range(phases))
    text = text.replace("done              = {", states + "done              = {")
    text = text.replace(
        'source = "run_tools"\ndest = "start"', 'source = "run_tools"\ndest = "p0"'
    )
    for i in range(phases):
        dest = f"p{i + 1}" if i + 1 < phases else "start" if bounded else "p0"
        text += (
            f'\n[[transitions]]\ntrigger = "stepped"\nsource = "p{i}"\n'
            f'dest = "{dest}"\n'
        )
    return text.encode()


P0 = STOCK[: STOCK.index("done              = {")].count("\n") + 2
"""The line of ``p0`` in a `chain` (its ``signals`` line comes first)."""


@attrs.frozen
class FileCase:
    name: str
    content: bytes
    line: int
    message: str
    """The problem's message, or its start when it ends with ``...``."""


def _unbounded(phases: int) -> str:
    steps = " ".join(f"p{i} -[stepped]->" for i in range(12))
    return (
        f"cycle {steps} ... ({phases - 12} more steps) -> p0 is not bounded by a"
        " model call, a retry counter or the no-progress guard"
    )


FILES = [
    FileCase(
        "a-5001-digit-integer",
        at_end("x = " + "7" * 5001),
        END,
        "a number of 5,001 digits (a machine file's numbers have at most 100)",
    ),
    FileCase(
        "10000-deep-arrays",
        at_end("x = " + "[" * 10_000 + "]" * 10_000),
        END,
        "arrays and inline tables nested more than 32 deep",
    ),
    FileCase(
        "10000-deep-inline-tables",
        at_end("x = " + "{a = " * 10_000 + "1" + "}" * 10_000),
        END,
        "arrays and inline tables nested more than 32 deep",
    ),
    FileCase(
        "a-10000-part-dotted-key",
        at_end("x" + ".a" * 10_000 + " = 1"),
        END,
        "a dotted key of more than 32 parts",
    ),
    FileCase(
        "a-10000-part-table-header",
        at_end("[x" + ".a" * 10_000 + "]"),
        END,
        "a dotted key of more than 32 parts",
    ),
    FileCase(
        "deep-in-sum-not-in-parts",
        at_end("[" + ".".join("h" * 20) + "]\n" + ".".join("k" * 20) + " = 1"),
        END + 1,
        "h.h.h.h.h.h.h.h.h.h.h.h.h.h.h.h.h.h.h.h.k.k.k.k.k.k.k.k.k.k.k.k:"
        " nested more than 32 deep",
    ),
    FileCase(
        "not-utf-8",
        at_end("# caf\xe9").replace(b"caf\xc3\xa9", b"caf\xe9"),
        END,
        "not UTF-8 text: byte 0xe9 cannot be read (a machine file is TOML, which"
        " is UTF-8)",
    ),
    FileCase(
        "an-unterminated-string",
        at_end('x = "open'),
        END,
        "not valid TOML: Illegal character '\\n' (at line ...",
    ),
    FileCase(
        "a-duplicate-key",
        at_end("x = 1\nx = 2"),
        END + 1,
        "not valid TOML: Cannot overwrite a value (at line ...",
    ),
    FileCase(
        "an-invalid-escape",
        at_end('x = "\\q"'),
        END,
        "not valid TOML: Unescaped '\\' in a string (at line ...",
    ),
    FileCase(
        "a-bad-value",
        at_end("x = yes"),
        END,
        "not valid TOML: Invalid value (at line ...",
    ),
    FileCase(
        "an-unclosed-array-at-the-end",
        at_end("x = [1,"),
        END,
        "not valid TOML: Invalid value (at end of document)",
    ),
    FileCase(
        "an-unbounded-cycle-of-1000-phases",
        chain(1_000, bounded=False),
        P0,
        _unbounded(1_000),
    ),
    FileCase(
        "an-unbounded-cycle-of-5000-phases",
        chain(5_000, bounded=False),
        P0,
        _unbounded(5_000),
    ),
]


def _matches(message: str, expected: str) -> bool:
    if expected.endswith("..."):
        return message.startswith(expected[:-3])
    return message == expected


@pytest.mark.parametrize("case", FILES, ids=[c.name for c in FILES])
def test_a_bad_machine_file_is_one_problem_on_its_line(
    case: FileCase, tmp_path: Path
) -> None:
    path = tmp_path / "m.toml"
    path.write_bytes(case.content)

    with pytest.raises(DefinitionError) as raised:
        load_machine(path)

    (problem,) = raised.value.problems
    assert problem.line == case.line
    assert _matches(problem.message, case.message), problem.message
    assert str(raised.value) == f"{path}:{case.line}: {problem.message}"


def turnfsm_check(path: Path) -> subprocess.CompletedProcess[str]:
    """``turnfsm check PATH`` in a child process, on this checkout."""
    paths = [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]
    return subprocess.run(
        [sys.executable, "-m", "turnfsm", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)},
        check=False,
    )


@pytest.mark.parametrize("case", FILES, ids=[c.name for c in FILES])
def test_turnfsm_check_prints_the_problem_and_fails(
    case: FileCase, tmp_path: Path
) -> None:
    path = tmp_path / "m.toml"
    path.write_bytes(case.content)

    done = turnfsm_check(path)

    assert (done.returncode, done.stdout) == (1, "")
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.splitlines()
    prefix = f"{path}:{case.line}: "
    assert line.startswith(prefix), line
    assert _matches(line.removeprefix(prefix), case.message), line


@pytest.mark.parametrize("phases", [1_000, 5_000])
def test_a_machine_of_thousands_of_phases_loads_and_checks(
    phases: int, tmp_path: Path
) -> None:
    path = tmp_path / "big.toml"
    path.write_bytes(chain(phases, bounded=True))

    spec = load_machine(path)
    done = turnfsm_check(path)

    assert len(spec.states) == phases + 7
    assert (done.returncode, done.stderr) == (0, "")
    transitions = len(spec.transitions)
    assert (
        done.stdout == f"{path}: ok ({phases + 7} phases, {transitions} transitions)\n"
    )


@pytest.mark.parametrize(
    "content",
    [b"\xef\xbb\xbf" + STOCK.encode(), STOCK.replace("\n", "\r\n").encode()],
    ids=["a-byte-order-mark", "crlf-line-ends"],
)
def test_what_editors_save_is_no_mistake(content: bytes, tmp_path: Path) -> None:
    # A file saved with a byte-order mark (as some Windows editors do) was
    # refused: "m.toml:1: not valid TOML: Invalid statement".
    path = tmp_path / "m.toml"
    path.write_bytes(content)

    spec = load_machine(path)
    done = turnfsm_check(path)

    assert (
        spec.to_dict() == load_machine(REPO_ROOT / "machines" / "turn.toml").to_dict()
    )
    assert (done.returncode, done.stderr) == (0, "")


BASE: dict[str, Any] = tomllib.loads(STOCK)


def definition(**changes: Any) -> dict[Any, Any]:
    out: dict[Any, Any] = dict(BASE)
    out.update(changes)
    return out


def with_state(name: object) -> dict[Any, Any]:
    states: dict[Any, Any] = dict(BASE["states"])
    states[name] = {"decision": "measure"}
    return definition(states=states)


def nested(depth: int) -> list[Any]:
    """`depth` lists, each the only item of the one around it."""
    out: list[Any] = []
    for _ in range(depth - 1):
        out = [out]
    return out


DICTS: list[tuple[str, Any, str]] = [
    ("a-list", [], "a machine definition is a table of keys and values, not a list"),
    ("none", None, "a machine definition is a table of keys and values, not None"),
    ("an-int-state-name", with_state(5), "states: key 5 is not a string"),
    (
        "a-5001-digit-integer",
        definition(name=10**5000),
        "name: an integer of 16,610 bits is out of TOML's range (64 bits)",
    ),
    (
        "10000-deep",
        definition(name=nested(10_000)),
        "name" + "[0]" * 31 + ": nested more than 32 deep",
    ),
]


@pytest.mark.parametrize(
    ("data", "message"), [d[1:] for d in DICTS], ids=[d[0] for d in DICTS]
)
def test_a_definition_that_is_no_table_of_names_is_refused(
    data: Any, message: str
) -> None:
    with pytest.raises(DefinitionError) as raised:
        MachineSpec.from_dict(data, source="d")

    assert [(p.message, p.line) for p in raised.value.problems] == [(message, None)]
    assert str(raised.value) == f"d: {message}"


# -- values ------------------------------------------------------------------------


def tool(parameters: Any) -> Tool:
    return Tool(name="t", description="d", parameters=parameters, fn=print)


def schema(default: object) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"a": {"type": "string", "default": default}},
    }


def holding_itself() -> dict[str, Any]:
    loop: dict[str, Any] = {"type": "object"}
    loop["properties"] = {"a": loop}
    return loop


MODEL = ScriptedModel.of("ok")
SENTINEL = object()
DEEP = nested(MAX_JSON_DEPTH + 5)


@attrs.frozen
class ValueCase:
    name: str
    build: Callable[[], object]
    error: type[ConfigError] | type[InvalidMessage]
    field: str
    value: object


VALUES = [
    ValueCase(
        "Tool-parameters-None",
        lambda: tool(None),
        ConfigError,
        "Tool('t').parameters",
        None,
    ),
    ValueCase(
        "Tool-parameters-a-list",
        lambda: tool([]),
        ConfigError,
        "Tool('t').parameters",
        [],
    ),
    ValueCase(
        "Tool-schema-with-a-set",
        lambda: tool(schema({1, 2})),
        ConfigError,
        "Tool('t').parameters.properties.a.default",
        {1, 2},
    ),
    ValueCase(
        "Tool-schema-with-an-object",
        lambda: tool(schema(SENTINEL)),
        ConfigError,
        "Tool('t').parameters.properties.a.default",
        SENTINEL,
    ),
    ValueCase(
        "Tool-schema-with-nan",
        lambda: tool(schema(math.nan)),
        ConfigError,
        "Tool('t').parameters.properties.a.default",
        math.nan,
    ),
    ValueCase(
        "Tool-schema-with-an-int-key",
        lambda: tool({"type": "object", 5: "x"}),
        ConfigError,
        "Tool('t').parameters",
        5,
    ),
    ValueCase(
        "Tool-schema-holding-itself",
        lambda: tool(holding_itself()),
        ConfigError,
        "Tool('t').parameters.properties.a",
        None,
    ),
    ValueCase(
        "Tool-schema-too-deep",
        lambda: tool({"type": "object", "default": DEEP}),
        ConfigError,
        "Tool('t').parameters.default" + "[0]" * (MAX_JSON_DEPTH - 1),
        None,
    ),
    ValueCase(
        "user-message-without-parts",
        lambda: Message(role="user", parts=()),
        InvalidMessage,
        "parts",
        (),
    ),
    ValueCase(
        "system-message-without-parts",
        lambda: Message(role="system", parts=[]),
        InvalidMessage,
        "parts",
        (),
    ),
    ValueCase(
        "tool-message-without-parts",
        lambda: Message(role="tool", parts=[]),
        InvalidMessage,
        "parts",
        (),
    ),
    ValueCase("user-text-empty", lambda: Message.user(""), InvalidMessage, "text", ""),
    ValueCase(
        "user-text-blank",
        lambda: Message.user(" \n\t"),
        InvalidMessage,
        "text",
        " \n\t",
    ),
    ValueCase(
        "user-text-part-empty",
        lambda: Message(role="user", parts=[TextPart(text="")]),
        InvalidMessage,
        "parts[0].text",
        "",
    ),
    ValueCase(
        "user-image-and-a-blank-text",
        lambda: Message(
            role="user", parts=[ImagePart(url="data:,"), TextPart(text="  ")]
        ),
        InvalidMessage,
        "parts[1].text",
        "  ",
    ),
    ValueCase(
        "user-message-from-a-dict-empty",
        lambda: Message.from_dict(
            {"id": "m", "role": "user", "parts": [], "metadata": {}}
        ),
        InvalidMessage,
        "parts",
        (),
    ),
    ValueCase(
        "metadata-an-object",
        lambda: Message.user("x", metadata={"a": SENTINEL}),
        InvalidMessage,
        "metadata.a",
        SENTINEL,
    ),
    ValueCase(
        "metadata-a-set",
        lambda: Message.user("x", metadata={"k": {"a": [1, {2}]}}),
        InvalidMessage,
        "metadata.k.a[1]",
        {2},
    ),
    ValueCase(
        "metadata-nan",
        lambda: Message.user("x", metadata={"a": math.inf}),
        InvalidMessage,
        "metadata.a",
        math.inf,
    ),
    ValueCase(
        "metadata-an-int-key",
        lambda: Message.user("x", metadata={1: "x"}),
        InvalidMessage,
        "metadata",
        1,
    ),
    ValueCase(
        "metadata-just-past-the-depth-bound",
        lambda: Message.user("x", metadata={"a": nested(MAX_JSON_DEPTH)}),
        InvalidMessage,
        "metadata.a" + "[0]" * (MAX_JSON_DEPTH - 1),
        None,
    ),
    ValueCase(
        "metadata-bytes",
        lambda: Message.user("x", metadata={"a": b"x"}),
        InvalidMessage,
        "metadata.a",
        b"x",
    ),
    ValueCase(
        "tool-call-arguments-too-deep",
        lambda: ToolCallPart(id="c", name="t", arguments={"a": DEEP}),
        InvalidMessage,
        "tool_call.arguments.a" + "[0]" * (MAX_JSON_DEPTH - 1),
        None,
    ),
    ValueCase(
        "Budget-context_window-10**40",
        lambda: Budget(context_window=10**40),
        ConfigError,
        "context_window",
        10**40,
    ),
    ValueCase(
        "Budget-max_turns-10**30",
        lambda: Budget(max_turns=10**30),
        ConfigError,
        "max_turns",
        10**30,
    ),
    ValueCase(
        "Budget-max_compactions-past-the-bound",
        lambda: Budget(max_compactions=MAX_COUNT + 1),
        ConfigError,
        "max_compactions",
        MAX_COUNT + 1,
    ),
    ValueCase(
        "ContextManager-context_window-10**40",
        lambda: ContextManager(context_window=10**40),
        ConfigError,
        "context_window",
        10**40,
    ),
    ValueCase(
        "ContextManager-max_messages-past-the-bound",
        lambda: ContextManager(max_messages=MAX_COUNT + 1),
        ConfigError,
        "max_messages",
        MAX_COUNT + 1,
    ),
    ValueCase(
        "Driver-context_window-10**40",
        lambda: Driver(model=MODEL, context_window=10**40),
        ConfigError,
        "context_window",
        10**40,
    ),
    ValueCase(
        "Driver-max_turns-10**30",
        lambda: Driver(model=MODEL, max_turns=10**30),
        ConfigError,
        "max_turns",
        10**30,
    ),
    ValueCase(
        "Driver-max_output_tokens-past-the-bound",
        lambda: Driver(model=MODEL, max_output_tokens=MAX_TOKENS + 1),
        ConfigError,
        "max_output_tokens",
        MAX_TOKENS + 1,
    ),
    ValueCase(
        "Driver-max_output_tokens-the-whole-window",
        lambda: Driver(
            model=MODEL,
            context=ContextManager(context_window=1_000),
            max_output_tokens=1_000,
        ),
        ConfigError,
        "max_output_tokens",
        1_000,
    ),
    ValueCase(
        "Driver-max_output_tokens-on-the-emergency-line",
        lambda: Driver(
            model=MODEL,
            context=ContextManager(context_window=1_000),
            max_output_tokens=950,
        ),
        ConfigError,
        "max_output_tokens",
        950,
    ),
    ValueCase(
        "Driver-max_output_tokens-over-the-window-no-manager",
        lambda: Driver(
            model=MODEL, context=None, context_window=1_000, max_output_tokens=5_000
        ),
        ConfigError,
        "max_output_tokens",
        5_000,
    ),
    ValueCase(
        "Agent-max_output_tokens-over-the-window",
        lambda: Agent(
            model=MODEL,
            context=ContextManager(context_window=1_000),
            max_output_tokens=4_000,
        ),
        ConfigError,
        "max_output_tokens",
        4_000,
    ),
    ValueCase(
        "Agent-max_turns-10**30",
        lambda: Agent(model=MODEL, max_turns=10**30),
        ConfigError,
        "max_turns",
        10**30,
    ),
    ValueCase(
        "RetryPolicy-max_attempts-10**30",
        lambda: RetryPolicy(max_attempts=10**30),
        ConfigError,
        "max_attempts",
        10**30,
    ),
]


def _same(a: object, b: object) -> bool:
    """Equal, or both NaN."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    return a is b or a == b


@pytest.mark.parametrize("case", VALUES, ids=[c.name for c in VALUES])
def test_a_bad_value_is_refused_naming_its_field_and_value(case: ValueCase) -> None:
    with pytest.raises(case.error) as raised:
        case.build()

    error = raised.value
    assert type(error) is case.error
    assert (error.field, _same(error.value, case.value)) == (case.field, True)
    assert case.field in str(error)


ACCEPTED: list[tuple[str, Callable[[], object]]] = [
    ("a-models-empty-reply", lambda: Message.assistant("")),
    (
        "a-reply-of-tool-calls-only",
        lambda: Message.assistant(tool_calls=[ToolCallPart(id="c", name="t")]),
    ),
    ("an-empty-tool-output", lambda: Message.tool_result("c", "")),
    ("an-empty-system-text", lambda: Message.system("")),
    ("an-image-alone", lambda: Message(role="user", parts=[ImagePart(url="data:,")])),
    ("metadata-of-json-values", lambda: Message.user("x", metadata={"k": [1, True]})),
    (
        "nan-in-a-models-arguments",
        lambda: ToolCallPart(id="c", name="t", arguments={"a": math.nan}),
    ),
    (
        "json-at-the-depth-bound",
        # 100 deep: the metadata mapping and 99 lists in it
        lambda: Message.user("x", metadata={"a": nested(MAX_JSON_DEPTH - 1)}),
    ),
    ("the-window-bound", lambda: Budget(context_window=MAX_TOKENS)),
    ("the-turns-bound", lambda: Driver(model=MODEL, max_turns=MAX_COUNT)),
    ("the-attempts-bound", lambda: RetryPolicy(max_attempts=MAX_COUNT)),
    ("the-manager-window-bound", lambda: ContextManager(context_window=MAX_TOKENS)),
    (
        "a-reply-budget-under-the-emergency-line",
        lambda: Driver(
            model=MODEL,
            context=ContextManager(context_window=1_000),
            max_output_tokens=949,
        ),
    ),
    (
        "a-reply-budget-on-an-unlimited-window",
        lambda: Driver(
            model=MODEL,
            context=ContextManager(context_window=0),
            max_output_tokens=MAX_TOKENS,
        ),
    ),
]


@pytest.mark.parametrize(
    "build", [a[1] for a in ACCEPTED], ids=[a[0] for a in ACCEPTED]
)
def test_what_is_no_mistake_is_accepted(build: Callable[[], object]) -> None:
    build()


def test_a_commit_of_unknown_messages_is_refused_and_writes_nothing() -> None:
    async def attempt() -> tuple[ConfigError, int, int]:
        store = MemoryStore()
        session = Session("s", store=store)
        reply = Message.assistant("ok", id="m1")
        await session.append(
            RunOpened(run_id="r", machine="turn", digest="d", budget=Budget(), at=0.0),
            EventRecorded(
                run_id="r",
                index=0,
                event=ModelReplied(message=reply),
                phase="done",
                decision="finish",
                at=0.0,
            ),
        )
        with pytest.raises(ConfigError) as raised:
            await session.append(
                Committed(run_id="r", keep=0, messages=["m1", "m-nope", "m-gone"])
            )
        return raised.value, session.version, len(await store.load("s"))

    error, version, stored = anyio.run(attempt)

    assert (error.field, error.value) == ("entries[0].messages", ["m-nope", "m-gone"])
    assert (version, stored) == (2, 2)
