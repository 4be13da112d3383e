"""Every boundary validates (issue 11, item 7).

A table of the public constructors and parsers: for each, valid base
arguments and, per field, a strategy of bad values (wrong type, out of range,
NaN and the infinities). Each bad value must raise a `TurnFSMError` naming
the field: never a raw exception, never silent acceptance. Corrupted JSON fed
to the parsers raises a `TurnFSMError` too.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.profiles import sized
from turnfsm import Agent, Driver, serde
from turnfsm._checks import MAX_COUNT, MAX_TOKENS
from turnfsm.context import (
    ContextManager,
    LayeredCompactor,
    SummarizingCompactor,
    TokenSplitter,
    ToolResultDigest,
    TruncatingCompactor,
)
from turnfsm.core import (
    Budget,
    CallLLM,
    CompactionCircuitOpened,
    CompactionNoop,
    CompactionOverflowed,
    CompactionResult,
    CompactorFailed,
    ContextOverflowed,
    Fail,
    Failure,
    Finish,
    Measured,
    MessageInjected,
    ModelFailed,
    ModelReplied,
    Perform,
    RunCancelled,
    RunStarted,
    RunTools,
    Signal,
    Snapshot,
    ToolsFinished,
    TurnMachine,
)
from turnfsm.driver import RetryPolicy
from turnfsm.errors import ConfigError, InvalidMessage, InvalidReturn, TurnFSMError
from turnfsm.messages import (
    ImagePart,
    Message,
    MessageLog,
    TextPart,
    ToolCallPart,
    ToolResultPart,
)
from turnfsm.persistence import RunEnded, SQLiteStore, open_store
from turnfsm.providers import ModelRequest, ModelResponse, ToolSchema
from turnfsm.testing import ScriptedModel
from turnfsm.tokens import ConservativeTokenCounter, RatioTokenCounter, TiktokenCounter
from turnfsm.values import ErrorInfo, Usage

from turnfsm import default_machine  # isort: skip

BAD_EXAMPLES = settings(
    max_examples=sized(12),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

# -- strategies of bad values ----------------------------------------------------
NONFINITE = st.sampled_from([math.nan, math.inf, -math.inf])
JUNK = st.one_of(
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=1),
    st.builds(object),
)


def not_str(*, none: bool = True, empty: bool = False) -> st.SearchStrategy[Any]:
    """Values that are not strings (plus ``""`` / blanks when one is required)."""
    out = [st.integers(), st.floats(allow_nan=True), st.booleans(), JUNK]
    if none:
        out.append(st.none())
    if empty:
        out.append(st.sampled_from(["", "  "]))
    return st.one_of(out)


def bad_int(
    low: int | None = 0, high: int | None = None, *, none: bool = True
) -> st.SearchStrategy[Any]:
    """Ints out of range, floats (whole ones too), NaN / inf, bools, text."""
    out = [
        st.floats(allow_nan=True, allow_infinity=True),
        NONFINITE,
        st.booleans(),
        st.text(max_size=3),
        JUNK,
    ]
    if low is not None:
        out.append(st.integers(max_value=low - 1))
    if high is not None:
        out.append(st.integers(min_value=high + 1))
    if none:
        out.append(st.none())
    return st.one_of(out)


def bad_number(
    low: float | None = None, above: float | None = None, *, none: bool = True
) -> st.SearchStrategy[Any]:
    """NaN, the infinities, numbers under the bound, bools, text."""
    out = [NONFINITE, st.booleans(), st.text(max_size=3), JUNK]
    if low is not None:
        out.append(st.floats(max_value=low, exclude_max=True, allow_nan=False))
    if above is not None:
        out.append(st.floats(max_value=above, allow_nan=False))
    if none:
        out.append(st.none())
    return st.one_of(out)


def not_bool(*, none: bool = True) -> st.SearchStrategy[Any]:
    out = [st.integers(), st.sampled_from(["no", "yes", ""]), st.floats(), JUNK]
    if none:
        out.append(st.none())
    return st.one_of(out)


def not_a(*, none: bool = True) -> st.SearchStrategy[Any]:
    """Values that are no turnfsm object at all."""
    out = [st.integers(), st.text(max_size=3), st.floats(), JUNK]
    if none:
        out.append(st.none())
    return st.one_of(out)


NOT_MAPPING = st.one_of(
    st.integers(), st.text(max_size=3), st.lists(st.integers(), max_size=2), st.none()
)
NOT_MESSAGES = st.one_of(
    st.integers(),
    st.just(b"x"),
    st.lists(st.one_of(st.integers(), st.text(max_size=2), st.none()), min_size=1),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=1),
)
NOT_STR_MAP = st.one_of(
    st.integers(),
    st.lists(st.integers(), max_size=1),
    st.dictionaries(st.text(max_size=2), st.integers(), min_size=1, max_size=1),
    st.dictionaries(st.integers(), st.text(max_size=2), min_size=1, max_size=1),
)

NOT_MAPPING_KEYS = st.one_of(
    st.integers(),
    st.lists(st.integers(), max_size=1),
    st.dictionaries(st.integers(), st.text(max_size=2), min_size=1, max_size=1),
)
NOT_JSON_MAPPING = st.dictionaries(
    st.text(max_size=2),
    st.one_of(
        st.builds(object),
        st.just({1, 2}),
        st.just(b"x"),
        NONFINITE,
    ),
    min_size=1,
    max_size=1,
)
"""Mappings with a value JSON cannot carry (an object, a set, bytes, NaN)."""

# -- the table -----------------------------------------------------------------
MODEL = ScriptedModel.of("ok")
USER = Message.user("hi", id="u1")
CALL = ToolCallPart(id="c1", name="t")
INFO = ErrorInfo(type="X", message="m")


def _run(input: Any) -> Any:
    return anyio.run(Driver(model=ScriptedModel.of("ok")).run, input)


def _from_dict(factory: Callable[[Any], Any], base: dict[str, Any]) -> Any:
    """A parser called with `base` updated by the bad field."""

    def parse(**fields: Any) -> Any:
        return factory({**base, **fields})

    return parse


SNAPSHOT_DICT = Snapshot(phase="start", history=[USER]).to_dict()
MESSAGE_DICT = USER.to_dict()


@attrs.frozen
class Case:
    name: str
    build: Callable[..., Any]
    base: dict[str, Any]
    bad: dict[str, st.SearchStrategy[Any]]
    named: dict[str, str | tuple[str, ...]] = attrs.field(factory=dict)
    """The field names an error may give, where they differ from the argument's."""


CASES = [
    Case("TextPart", TextPart, {"text": "x"}, {"text": not_str()}),
    Case(
        "ToolCallPart",
        ToolCallPart,
        {"id": "c", "name": "t"},
        {
            "id": not_str(empty=True),
            "name": not_str(empty=True),
            "arguments": st.one_of(
                NOT_MAPPING,
                st.just({1: 2}),
                st.just({"a": object()}),
                st.just({"a": {1}}),
            ),
        },
        {"id": "tool_call.id", "name": "tool_call.name", "arguments": "tool_call"},
    ),
    Case(
        "ToolResultPart",
        ToolResultPart,
        {"call_id": "c", "content": "x"},
        {
            "call_id": not_str(empty=True),
            "content": not_str(),
            "is_error": not_bool(),
        },
        {
            "call_id": "tool_result.call_id",
            "content": "tool_result.content",
            "is_error": "tool_result.is_error",
        },
    ),
    Case(
        "ImagePart",
        ImagePart,
        {"url": "data:,"},
        {"url": not_str(empty=True), "media_type": not_str(none=False, empty=True)},
        {"url": "image.url", "media_type": "image.media_type"},
    ),
    Case(
        "Message",
        Message,
        {"role": "user", "parts": "hi", "id": "m"},
        {
            "role": st.one_of(not_a(), st.sampled_from(["bot", "USER", ""])),
            "parts": st.one_of(NOT_MESSAGES, st.none(), st.sampled_from(["", " ", ()])),
            "id": not_str(empty=True),
            "metadata": st.one_of(NOT_MAPPING_KEYS, NOT_JSON_MAPPING),
        },
    ),
    Case("Message.user", Message.user, {"text": "x"}, {"text": not_str(empty=True)}),
    Case("Message.system", Message.system, {"text": "x"}, {"text": not_str()}),
    Case(
        "Message.assistant",
        Message.assistant,
        {"text": "x"},
        {"text": not_str(), "tool_calls": NOT_MESSAGES},
    ),
    Case(
        "Message.tool_result",
        Message.tool_result,
        {"call_id": "c", "content": "x"},
        {"call_id": not_str(empty=True), "content": not_str(), "is_error": not_bool()},
        {"call_id": "call_id", "content": "content", "is_error": "is_error"},
    ),
    Case(
        "Message.from_dict",
        _from_dict(Message.from_dict, MESSAGE_DICT),
        {},
        {
            "parts": st.one_of(
                st.text(max_size=3),
                st.integers(),
                st.lists(st.one_of(st.text(max_size=2), st.integers()), min_size=1),
                st.just([{"type": "text", "text": 5}]),
                st.just([{"type": "tool_result", "call_id": "c", "content": "x"}]),
                st.just([{"type": "zzz"}]),
            ),
            "role": not_a(),
            "id": not_str(empty=True),
            "metadata": st.one_of(NOT_MAPPING_KEYS, NOT_JSON_MAPPING),
        },
    ),
    Case(
        "Usage",
        Usage,
        {},
        {"input_tokens": bad_int(), "output_tokens": bad_int()},
    ),
    Case(
        "ErrorInfo",
        ErrorInfo,
        {"type": "X", "message": "m"},
        {
            "type": not_str(),
            "message": not_str(),
            "retryable": not_bool(),
            "status": bad_int(none=False),
            "retry_after": bad_number(low=0, none=False),
        },
    ),
    Case("RunStarted", RunStarted, {"input": [USER]}, {"input": NOT_MESSAGES}),
    Case("Measured", Measured, {"estimate": 1}, {"estimate": bad_int()}),
    Case(
        "ModelReplied",
        ModelReplied,
        {"message": Message.assistant("ok")},
        {"message": not_a(), "usage": not_a(none=False)},
    ),
    Case("ModelFailed", ModelFailed, {"error": INFO}, {"error": not_a()}),
    Case("ContextOverflowed", ContextOverflowed, {"error": INFO}, {"error": not_a()}),
    Case("ToolsFinished", ToolsFinished, {"results": []}, {"results": NOT_MESSAGES}),
    Case(
        "CompactionResult",
        CompactionResult,
        {"messages": [USER], "before": 2, "after": 1},
        {
            "messages": NOT_MESSAGES,
            "before": bad_int(),
            "after": bad_int(),
            "usage": not_a(none=False),
        },
    ),
    Case(
        "CompactionNoop",
        CompactionNoop,
        {"before": 2, "after": 1},
        {"before": bad_int(), "after": bad_int(), "vetoed": not_bool()},
    ),
    Case(
        "CompactionOverflowed",
        CompactionOverflowed,
        {"used": 2, "limit": 1},
        {"used": bad_int(), "limit": bad_int()},
    ),
    Case(
        "CompactorFailed",
        CompactorFailed,
        {"used": 2, "limit": 1, "error": INFO},
        {"used": bad_int(), "limit": bad_int(), "error": not_a()},
    ),
    Case(
        "CompactionCircuitOpened",
        CompactionCircuitOpened,
        {"failures": 1},
        {"failures": bad_int()},
    ),
    Case("MessageInjected", MessageInjected, {"message": USER}, {"message": not_a()}),
    Case("RunCancelled", RunCancelled, {}, {"reason": not_str()}),
    Case(
        "Signal",
        Signal,
        {"name": "go"},
        {"name": not_str(empty=True), "data": NOT_STR_MAP},
    ),
    Case(
        "CallLLM",
        CallLLM,
        {"history": MessageLog(), "pending": MessageLog(), "turn": 1},
        {"history": not_a(), "pending": not_a(), "turn": bad_int()},
    ),
    Case("RunTools", RunTools, {"calls": [CALL]}, {"calls": NOT_MESSAGES}),
    Case("Finish", Finish, {"text": "x"}, {"text": not_str()}),
    Case("Fail", Fail, {"error": ConfigError("a", 1, "b")}, {"error": not_a()}),
    Case(
        "Perform",
        Perform,
        {"effect": "e", "phase": "p"},
        {"effect": not_str(empty=True), "phase": not_str(empty=True)},
    ),
    Case(
        "Budget",
        Budget,
        {},
        {
            "context_window": bad_int(0, MAX_TOKENS),
            "threshold": bad_int(0, 100),
            "auto_compact": not_bool(),
            "max_turns": bad_int(1, MAX_COUNT),
            "max_overflow_retries": bad_int(0, MAX_COUNT),
            "max_compactions": bad_int(1, MAX_COUNT),
            "max_messages": bad_int(0, MAX_COUNT),
            "max_output_retries": bad_int(0, MAX_COUNT),
        },
    ),
    Case(
        "Failure",
        Failure,
        {"kind": "cancelled"},
        {
            "kind": not_a(),
            "used": bad_int(),
            "limit": bad_int(),
            "detail": not_str(),
            "retryable": not_bool(),
            "status": bad_int(none=False),
        },
    ),
    Case(
        "Snapshot",
        Snapshot,
        {"phase": "start"},
        {
            "phase": not_str(empty=True),
            "budget": not_a(),
            "history": NOT_MESSAGES,
            "pending": NOT_MESSAGES,
            "inbox": NOT_MESSAGES,
            "estimate": bad_int(none=False),
            "turns": bad_int(),
            "overflow_retries": bad_int(),
            "compactions": bad_int(),
            "compact_reason": not_a(none=False),
            "message_line_spent": not_bool(),
            "last_reply": not_a(none=False),
            "failure": not_a(none=False),
            "is_started": not_bool(),
            "schema_version": bad_int(),
        },
    ),
    Case(
        "Snapshot.from_dict",
        _from_dict(Snapshot.from_dict, SNAPSHOT_DICT),
        {},
        {
            "phase": not_str(empty=True),
            "budget": st.one_of(NOT_MAPPING, st.just({"threshold": 500})),
            "history": st.one_of(
                NOT_MESSAGES, st.just([{**MESSAGE_DICT, "parts": ["junk"]}])
            ),
            "pending": NOT_MESSAGES,
            "inbox": NOT_MESSAGES,
            "estimate": bad_int(none=False),
            "turns": bad_int(),
            "overflow_retries": bad_int(),
            "compact_reason": st.one_of(not_a(none=False), st.just("zzz")),
            "message_line_spent": not_bool(),
            "last_reply": st.one_of(not_a(none=False), st.just({"role": "user"})),
            "failure": st.one_of(not_a(none=False), st.just({"kind": "zzz"})),
            "is_started": not_bool(),
            "schema_version": bad_int(),
        },
        # An error inside a nested value names the field inside.
        {"budget": ("budget", "threshold"), "failure": ("failure", "kind")},
    ),
    Case(
        "TurnMachine.start",
        TurnMachine.start,
        {"spec": default_machine()},
        {"spec": not_a(), "budget": not_a(none=False), "history": NOT_MESSAGES},
    ),
    Case(
        "TurnMachine.from_snapshot",
        TurnMachine.from_snapshot,
        {"spec": default_machine(), "snapshot": Snapshot(phase="start")},
        {"spec": not_a(), "snapshot": st.one_of(not_a(), st.just(Snapshot(phase="x")))},
        {"snapshot": ""},
    ),
    Case(
        "RetryPolicy",
        RetryPolicy,
        {},
        {
            "max_attempts": bad_int(1, MAX_COUNT),
            "initial_wait": bad_number(low=0),
            "max_wait": bad_number(low=0),
            "max_total": bad_number(low=0),
            "jitter": not_bool(),
        },
    ),
    Case(
        "ContextManager",
        ContextManager,
        {},
        {
            "compactor": not_a(),
            # None is the model's window.
            "context_window": bad_int(0, MAX_TOKENS, none=False),
            "threshold": bad_int(0, 100),
            "auto_compact": not_bool(),
            "compact_target": not_a(),
            "compact_target_pct": bad_int(1, 100),
            "counter": not_a(),
            "use_reported_usage": not_bool(),
            "max_failures": bad_int(1, MAX_COUNT),
            "max_messages": bad_int(0, MAX_COUNT),
        },
    ),
    Case(
        "RatioTokenCounter",
        RatioTokenCounter,
        {"chars_per_token": 4.0},
        {"chars_per_token": bad_number(above=0)},
    ),
    Case(
        "TruncatingCompactor",
        TruncatingCompactor,
        {},
        {"preserve_recent": bad_int(1), "min_messages": bad_int(2)},
    ),
    Case(
        "TokenSplitter",
        TokenSplitter,
        {},
        {"preserve_recent": bad_int(1), "min_messages": bad_int(2)},
    ),
    Case(
        "SummarizingCompactor",
        SummarizingCompactor,
        {},
        {
            "model": not_a(none=False),
            "keep_recent_turns": bad_int(),
            "max_summary_tokens": bad_int(1),
            "summary_window": bad_int(1, none=False),
            "summary_role": not_a(),
            "temperature": bad_number(low=0),
            "digest_min_chars": bad_int(1, none=False),
        },
    ),
    Case(
        "LayeredCompactor",
        LayeredCompactor,
        {},
        {
            "model": not_a(none=False),
            "max_tool_result_chars": bad_int(1),
            "trim_turns": bad_int(),
            "preserved_turns": bad_int(),
            "max_summary_tokens": bad_int(1),
            "digest_min_chars": bad_int(1, none=False),
        },
    ),
    Case(
        "ToolResultDigest",
        ToolResultDigest,
        {},
        {"min_chars": bad_int(1), "keep_recent_turns": bad_int()},
    ),
    Case(
        "TiktokenCounter",
        TiktokenCounter,
        {},
        {
            "encoding": st.one_of(not_a(), st.just("no_such_encoding")),
            "message_tokens": bad_int(),
            "image_tokens": bad_int(),
        },
    ),
    Case(
        "ConservativeTokenCounter",
        ConservativeTokenCounter,
        {},
        {"message_tokens": bad_int(), "image_tokens": bad_int()},
    ),
    Case(
        "ToolSchema",
        ToolSchema,
        {"name": "t", "description": "d", "parameters": {}},
        {
            "name": not_str(empty=True),
            "description": not_str(),
            "parameters": NOT_MAPPING,
        },
    ),
    Case(
        "ModelRequest",
        ModelRequest,
        {"messages": [USER]},
        {"messages": NOT_MESSAGES, "tools": NOT_MESSAGES},
    ),
    Case(
        "ModelResponse",
        ModelResponse,
        {"message": Message.assistant("ok")},
        {
            "message": st.one_of(not_a(), st.just(USER)),
            "usage": not_a(none=False),
            "model": not_str(none=False),
        },
        {"message": ""},
    ),
    Case(
        "Driver",
        Driver,
        {"model": MODEL},
        {
            "model": not_a(),
            "tools": st.one_of(st.integers(), st.just("tool"), st.just([123])),
            "system_prompt": not_str(none=False),
            "context": not_a(none=False),
            "context_window": bad_int(0, MAX_TOKENS),
            "max_turns": bad_int(1, MAX_COUNT),
            "max_overflow_retries": bad_int(0, MAX_COUNT),
            "max_compactions": bad_int(1, MAX_COUNT),
            "tool_timeout": bad_number(above=0, none=False),
            "model_timeout": bad_number(above=0, none=False),
            "compaction_timeout": bad_number(above=0, none=False),
            "effect_timeout": bad_number(above=0, none=False),
            "retry": not_a(),
            "hooks": st.one_of(st.integers(), st.just("hook"), st.just([5])),
            "strict_hooks": not_bool(),
            "machine": not_a(),
            "effects": st.one_of(st.integers(), st.just({"measure": 5})),
            "max_output_tokens": bad_int(1, MAX_TOKENS, none=False),
            "max_output_retries": bad_int(0, MAX_COUNT),
            "clock": not_a(),
            "name": not_str(empty=True),
            "tracing": not_bool(none=False),
        },
    ),
    Case(
        "Agent",
        Agent,
        {"model": MODEL},
        {
            "max_turns": bad_int(1, MAX_COUNT),
            "model_timeout": bad_number(above=0, none=False),
            "system_prompt": not_str(none=False),
            "modle": st.just(MODEL),
            "session": not_a(none=False),
            "store": st.one_of(st.integers(), JUNK, st.sampled_from(["", "zzz://x"])),
        },
    ),
    Case(
        "Driver.run",
        _run,
        {"input": "hi"},
        {"input": st.one_of(NOT_MESSAGES, st.just([]))},
    ),
    Case(
        "SQLiteStore",
        SQLiteStore,
        {"path": "s.db"},
        {
            "path": not_str(empty=True),
            "synchronous": not_a(),
            "busy_timeout": bad_number(low=0),
        },
    ),
    Case(
        "open_store",
        open_store,
        {"spec": "memory:"},
        {
            "spec": st.one_of(
                st.integers(), JUNK, st.none(), st.sampled_from(["", "zzz://x", "x:"])
            )
        },
        {"spec": "store"},
    ),
]


def _provider_cases() -> list[Case]:
    cases = []
    try:
        from turnfsm.providers import OpenAIModel
    except ImportError:  # pragma: no cover - the SDK extra is missing
        pass
    else:
        cases.append(
            Case(
                "OpenAIModel",
                OpenAIModel,
                {"model": "m", "api_key": "k"},
                {
                    "model": not_str(empty=True),
                    "timeout": bad_number(above=0, none=False),
                    "max_tokens": bad_int(1, none=False),
                    "temperature": bad_number(low=0, none=False),
                    "base_url": not_str(none=False, empty=True),
                    "parallel_tool_calls": not_bool(none=False),
                    "context_window": bad_int(1, MAX_TOKENS, none=False),
                },
            )
        )
    try:
        from turnfsm.providers import AnthropicModel
    except ImportError:  # pragma: no cover - the SDK extra is missing
        pass
    else:
        cases.append(
            Case(
                "AnthropicModel",
                AnthropicModel,
                {"model": "m", "api_key": "k"},
                {
                    "model": not_str(empty=True),
                    "timeout": bad_number(above=0, none=False),
                    "max_tokens": bad_int(1),
                    "base_url": not_str(none=False, empty=True),
                    "context_window": bad_int(1, MAX_TOKENS, none=False),
                },
            )
        )
    from turnfsm.providers import LlamaServer

    cases.append(
        Case(
            "LlamaServer",
            LlamaServer,
            {},
            {
                "model_path": not_a(none=False),
                "n_ctx": bad_int(1),
                "n_threads": bad_int(1),
                "port": bad_int(1, 65535, none=False),
                "chat_format": not_str(empty=True),
                "startup_timeout": bad_number(above=0),
            },
        )
    )
    return cases


CASES += _provider_cases()
FIELDS = [(case, field) for case in CASES for field in case.bad]


@pytest.mark.parametrize(
    ("case", "field"), FIELDS, ids=[f"{c.name}.{f}" for c, f in FIELDS]
)
@BAD_EXAMPLES
@given(data=st.data())
def test_a_bad_value_raises_a_turnfsm_error_naming_the_field(
    case: Case, field: str, data: st.DataObject
) -> None:
    value = data.draw(case.bad[field], label=field)
    with pytest.raises(TurnFSMError) as raised:
        case.build(**{**case.base, field: value})
    error = raised.value
    named = case.named.get(field, field)
    names = (named,) if isinstance(named, str) else named
    assert any(n in getattr(error, "field", "") or n in str(error) for n in names)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_base_arguments_are_valid(
    case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The table's bases are accepted, so each bad field is what fails."""
    monkeypatch.chdir(tmp_path)  # SQLiteStore's makes its file (s.db)
    case.build(**case.base)


# -- corrupted JSON ----------------------------------------------------------------
RECORDS: list[tuple[type, object]] = [
    (Message, USER),
    (Snapshot, Snapshot(phase="start", history=[USER])),
    (
        RunEnded,
        RunEnded(
            run_id="r",
            outcome="failed",
            phase="failed",
            error=InvalidReturn("a", "b", "c"),
        ),
    ),
    (Budget, Budget()),
    (ModelReplied, ModelReplied(message=Message.assistant("ok"), usage=Usage())),
]


def _corrupt(data: Any, draw: st.DrawFn) -> Any:
    """Replace one value somewhere in `data` with junk."""
    if isinstance(data, dict) and data:
        key = draw(st.sampled_from(sorted(data)))
        if draw(st.booleans()):
            return {**data, key: _corrupt(data[key], draw)}
        junk = draw(st.one_of(st.integers(), st.text(max_size=2), st.lists(st.none())))
        return {**data, key: junk}
    if isinstance(data, list) and data:
        i = draw(st.integers(0, len(data) - 1))
        return [*data[:i], _corrupt(data[i], draw), *data[i + 1 :]]
    return draw(st.one_of(st.just({}), st.just([1]), st.just("x"), st.floats()))


@pytest.mark.parametrize(
    ("cls", "value"), RECORDS, ids=[c.__name__ for c, _ in RECORDS]
)
@BAD_EXAMPLES
@given(data=st.data())
def test_corrupted_json_raises_a_turnfsm_error_or_reads_a_valid_value(
    cls: type, value: object, data: st.DataObject
) -> None:
    text = serde.dumps(value)
    if data.draw(st.booleans(), label="truncate"):
        bad: str | object = text[: data.draw(st.integers(0, len(text) - 1))]
    else:
        bad = json.dumps(_corrupt(json.loads(text), data.draw))
    try:
        read = serde.loads(cls, bad)  # type: ignore[arg-type]
    except TurnFSMError:
        return
    # A corruption may still be a valid value (a text replaced by a text);
    # then it is one, of the right class.
    assert isinstance(read, cls)


# -- the cases, one by one ---------------------------------------------------
def test_message_user_with_a_number_is_an_invalid_message() -> None:
    with pytest.raises(InvalidMessage, match="text=5"):
        Message.user(5)  # type: ignore[arg-type]


def test_message_from_dict_with_parts_a_string_is_an_invalid_message() -> None:
    with pytest.raises(InvalidMessage, match="parts"):
        Message.from_dict({**MESSAGE_DICT, "parts": "abc"})


def test_a_tool_result_is_error_must_be_a_bool() -> None:
    with pytest.raises(InvalidMessage, match="is_error='no'"):
        ToolResultPart(call_id="c", content="x", is_error="no")  # type: ignore[arg-type]


def test_a_snapshot_with_a_corrupted_part_is_a_config_error() -> None:
    data = Snapshot(phase="start", history=[USER]).to_dict()
    data["history"][0]["parts"] = ["junk"]
    with pytest.raises(ConfigError, match="history"):
        Snapshot.from_dict(data)


def test_snapshot_fields_of_the_wrong_type_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="turns='3'"):
        Snapshot.from_dict({**SNAPSHOT_DICT, "turns": "3"})
    with pytest.raises(ConfigError, match="snapshot"):
        Snapshot.from_dict([1])  # type: ignore[arg-type]


def test_from_snapshot_with_an_unknown_phase_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="phase='nope'"):
        TurnMachine.from_snapshot(default_machine(), Snapshot(phase="nope"))


def test_measured_with_a_float_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"estimate=1\.5"):
        Measured(estimate=1.5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tools", [123]),
        ("hooks", 5),
        ("system_prompt", 123),
        ("model_timeout", math.nan),
        ("max_output_tokens", -5),
    ],
)
def test_driver_settings_fail_at_construction(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=field):
        Driver(model=MODEL, **{field: value})


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (
            lambda: Driver(model=MODEL, prices=3),
            "ModelPrices (known_prices), a model with known prices, or None",
        ),
        (lambda: Driver(model=MODEL, tracing=3), "True, False or None"),
        (lambda: Driver(model=MODEL, system_prompt=3), "a string or None"),
        (lambda: Driver(model=MODEL, context=3), "a ContextManager or None"),
        (
            lambda: SummarizingCompactor(model="gpt"),
            "a ModelClient (None: the agent's own)",
        ),
    ],
    ids=["prices", "tracing", "system_prompt", "context", "summary-model"],
)
def test_an_optional_setting_says_once_that_none_is_taken(
    make: Callable[[], object], expected: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        make()
    assert str(raised.value).endswith(f": expected {expected}")


def test_an_unknown_agent_keyword_is_named_with_a_suggestion() -> None:
    with pytest.raises(ConfigError) as raised:
        Agent(modle=MODEL)
    assert raised.value.field == "modle"
    assert "did you mean 'model'?" in str(raised.value)
    assert "Driver.__init__" not in str(raised.value)


def test_an_agent_without_a_model_says_so() -> None:
    with pytest.raises(ConfigError, match="model"):
        Agent()


@pytest.mark.parametrize("value", [None, [], [1], 5], ids=repr)
def test_run_input_must_be_messages_and_not_empty(value: object) -> None:
    model = ScriptedModel.of("ok")
    agent = Agent(model=model)
    with pytest.raises(InvalidMessage, match="input"):
        anyio.run(agent.run, value)
    assert model.requests == []


class _NoneModel:
    async def complete(self, request: object) -> None:
        return None


@pytest.mark.anyio
async def test_a_model_returning_the_wrong_type_fails_the_run_naming_it() -> None:
    result = await Agent(model=_NoneModel()).run("hi")
    assert result.outcome == "failed"
    assert isinstance(result.error, InvalidReturn)
    assert result.error.source == "model _NoneModel"
    assert result.error.value == "None"


@pytest.mark.anyio
async def test_an_effect_returning_none_fails_the_run_naming_it() -> None:
    async def measure(_ctx: object, _decision: object) -> None:
        return None

    agent = Agent(model=ScriptedModel.of("ok"), effects={"measure": measure})
    result = await agent.run("hi")
    assert result.outcome == "failed"
    assert isinstance(result.error, InvalidReturn)
    assert result.error.source == "effect 'measure'"
    ended = [e for e in agent.session.entries if isinstance(e, RunEnded)]
    assert [e.outcome for e in ended] == ["failed"]
    assert isinstance(ended[-1].error, InvalidReturn)


def test_a_sqlite_store_path_must_be_a_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="path=5"):
        SQLiteStore(5)  # type: ignore[arg-type]
