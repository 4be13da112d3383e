"""The one converter: every record round-trips through plain JSON."""

from __future__ import annotations

import enum
import inspect
import json
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, final

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.generators import histories
from turnfsm import errors, serde
from turnfsm.core import (
    DECISION_TYPES,
    EVENT_TYPES,
    Budget,
    Compact,
    CompactReason,
    Decision,
    Event,
    Fail,
    Failure,
    Finish,
    Measured,
    ModelReplied,
    Snapshot,
)
from turnfsm.errors import (
    CompactionStalled,
    ConfigError,
    CorruptRecord,
    MaxTurnsExceeded,
    ProviderError,
    RunFailed,
    StoreError,
    TurnFSMError,
)
from turnfsm.messages import (
    ImagePart,
    Joined,
    JSONValue,
    Message,
    MessageLog,
    Role,
    TextPart,
    ToolCallPart,
)
from turnfsm.values import ErrorInfo, Usage

# -- strategies ---------------------------------------------------------------

TEXTS = st.text(max_size=8)
INTS = st.integers(0, 2**40)
FLOATS = st.floats(min_value=0, allow_nan=False, allow_infinity=False)
NAMES = TEXTS.filter(str.strip)
"""Names (a signal, a phase, an effect) must not be blank."""
NAMED = ("name", "phase", "effect")
SCALARS = st.one_of(st.none(), st.booleans(), INTS, TEXTS)
"""JSON-native values, for fields typed `Any` (they come back as they went)."""

IMAGES = st.builds(
    Message,
    role=st.just(Role.USER),
    parts=st.tuples(
        st.builds(
            ImagePart,
            url=st.just("data:image/png;base64,AAAA"),
            media_type=st.none() | st.just("image/png"),
        ),
        st.builds(TextPart, text=NAMES),  # a user's text is not blank
    ),
    id=st.just("img"),
    metadata=st.dictionaries(TEXTS, TEXTS, max_size=2),
)
CONVERSATIONS = histories(max_messages=4)
MESSAGES = st.one_of(CONVERSATIONS.flatmap(st.sampled_from), IMAGES)
TOOL_CALLS = st.builds(
    ToolCallPart,
    id=st.sampled_from(["call_a", "call_b"]),
    name=st.just("tool"),
    arguments=st.dictionaries(TEXTS, SCALARS, max_size=2),
)


def _error_classes() -> list[type[TurnFSMError]]:
    found = []
    for name in errors.__all__:
        obj = getattr(errors, name)
        if inspect.isclass(obj) and issubclass(obj, TurnFSMError) and attrs.has(obj):
            found.append(obj)
    return found


ERROR_CLASSES = _error_classes()
LEAF_ERRORS = [c for c in ERROR_CLASSES if c is not RunFailed]


def values_of(tp: Any) -> st.SearchStrategy[Any]:
    """Return a strategy for values of the (resolved) field type `tp`."""
    simple: dict[Any, st.SearchStrategy[Any]] = {
        str: TEXTS,
        int: INTS,
        bool: st.booleans(),
        float: FLOATS,
        Any: SCALARS,
        type(None): st.none(),
        Message: MESSAGES,
        MessageLog: CONVERSATIONS.map(MessageLog),
        ToolCallPart: TOOL_CALLS,
        Usage: st.deferred(lambda: USAGES),
        ErrorInfo: st.deferred(lambda: records(ErrorInfo)),
        Budget: st.deferred(lambda: BUDGETS),
        Failure: st.deferred(lambda: FAILURES),
        TurnFSMError: st.deferred(
            lambda: st.sampled_from(LEAF_ERRORS).flatmap(records)
        ),
    }
    if tp in simple:
        return simple[tp]
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is not Mapping and "JSONValue" in repr(tp):  # messages.JSONValue
        return st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=2))
    if origin in (typing.Union, types.UnionType):
        return st.one_of([values_of(a) for a in args])
    if origin is tuple:
        return st.lists(values_of(args[0]), max_size=3).map(tuple)
    if origin is Mapping:
        return st.dictionaries(TEXTS, values_of(args[1]), max_size=2)
    if origin is Literal:
        return st.sampled_from(args)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return st.sampled_from(list(tp))
    if isinstance(tp, type) and attrs.has(tp):
        return records(tp)
    raise AssertionError(f"no strategy for {tp!r}")


def records(cls: type, **overrides: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Build `cls` from strategies for its attrs fields (by their init names)."""
    hints = typing.get_type_hints(cls)
    fields = {
        f.alias: overrides[f.alias]
        if f.alias in overrides
        else NAMES
        if f.alias in NAMED and hints[f.name] is str
        else values_of(hints[f.name])
        for f in attrs.fields(cls)
        if f.init
    }
    return st.builds(cls, **fields)


BUDGETS = records(
    Budget,
    **{
        f.alias: st.integers(0, 100) if f.name == "threshold" else st.integers(1, 10**6)
        for f in attrs.fields(Budget)
        if f.type in (int, "int")
    },
    # An absolute threshold line lies inside the window (set apart below).
    threshold_tokens=st.none(),
) | st.builds(
    Budget,
    context_window=st.just(10**6),
    threshold_tokens=st.integers(1, 10**6),
)
USAGES = st.builds(
    lambda fresh, read, written, out: Usage(
        input_tokens=fresh + read + written,
        output_tokens=out,
        cache_read_tokens=read,
        cache_write_tokens=written,
    ),
    INTS,
    INTS,
    INTS,
    INTS,
)
"""Usage: its cached tokens are a part of its input."""
_FAILURE_KINDS = sorted(attrs.fields(Failure).kind.validator.options)  # type: ignore[union-attr]
FAILURES = st.deferred(lambda: records(Failure, kind=st.sampled_from(_FAILURE_KINDS)))


def _conversation(kinds: list[int]) -> list[Message]:
    """A whole conversation: text turns and answered (parallel) tool calls."""
    out: list[Message] = []
    for n, kind in enumerate(kinds):
        if kind == 0:
            out.append(Message.user(f"u{n}", id=f"m{len(out)}"))
        elif kind == 1:
            out.append(Message.assistant(f"a{n}", id=f"m{len(out)}"))
        else:
            calls = [ToolCallPart(id=f"c{n}_{k}", name="tool") for k in range(kind - 1)]
            out.append(Message.assistant(tool_calls=calls, id=f"m{len(out)}"))
            for call in calls:
                out.append(Message.tool_result(call.id, "ok", id=f"m{len(out)}"))
    return out


WHOLE = st.lists(st.integers(0, 3), max_size=4).map(_conversation).map(MessageLog)
SNAPSHOTS = records(
    Snapshot,
    history=WHOLE,
    pending=WHOLE,
    schema_version=st.just(Snapshot(phase="x").schema_version),
)


def json_round_trip(value: Any, cls: Any) -> Any:
    return serde.from_json(cls, json.loads(json.dumps(serde.to_json(value))))


def error_key(exc: BaseException) -> tuple[object, ...]:
    """Errors compare by identity: compare their type and args (nested too)."""
    return (
        type(exc),
        tuple(error_key(a) if isinstance(a, BaseException) else a for a in exc.args),
    )


# -- round trips ---------------------------------------------------------------


def test_the_type_tuples_list_every_member_of_the_unions() -> None:
    assert set(EVENT_TYPES) == set(typing.get_args(Event))
    assert set(DECISION_TYPES) == set(typing.get_args(Decision))


@pytest.mark.parametrize("cls", EVENT_TYPES, ids=lambda c: c.__name__)
@given(data=st.data())
def test_every_event_round_trips_as_itself_and_as_an_event(
    cls: type, data: st.DataObject
) -> None:
    event = data.draw(records(cls))

    assert json_round_trip(event, cls) == event
    assert json_round_trip(event, Event) == event
    assert serde.to_json(event)["type"] == cls.__name__  # type: ignore[call-overload,index]


@pytest.mark.parametrize("cls", DECISION_TYPES, ids=lambda c: c.__name__)
@given(data=st.data())
def test_every_decision_round_trips(cls: type, data: st.DataObject) -> None:
    decision = data.draw(records(cls))

    assert json_round_trip(decision, cls) == decision
    assert json_round_trip(decision, Decision) == decision


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda c: c.__name__)
@given(data=st.data())
def test_every_error_round_trips_as_the_same_class(
    cls: type[TurnFSMError], data: st.DataObject
) -> None:
    error = data.draw(records(cls))

    back = json_round_trip(error, TurnFSMError)
    again = serde.error_from_json(json.loads(json.dumps(serde.error_to_json(error))))

    assert type(back) is cls
    assert error_key(back) == error_key(error)
    assert error_key(again) == error_key(error)


@given(MESSAGES)
def test_a_message_round_trips_in_its_own_form(message: Message) -> None:
    assert serde.to_json(message) == message.to_dict()
    assert json_round_trip(message, Message) == message
    assert json_round_trip(message, Message).metadata == message.metadata


@given(CONVERSATIONS)
def test_a_message_log_and_a_joined_view_are_lists_of_messages(
    messages: list[Message],
) -> None:
    log = MessageLog(messages)
    joined = Joined(log, tuple(messages))

    assert serde.to_json(log) == [m.to_dict() for m in messages]
    assert json_round_trip(log, MessageLog) == log
    assert json_round_trip(joined, MessageLog) == MessageLog([*messages, *messages])
    assert json_round_trip(tuple(messages), tuple[Message, ...]) == tuple(messages)


@given(SNAPSHOTS)
def test_a_snapshot_round_trips_in_its_to_dict_form(snapshot: Snapshot) -> None:
    assert serde.to_json(snapshot) == json.loads(json.dumps(snapshot.to_dict()))
    assert json_round_trip(snapshot, Snapshot) == snapshot


@given(st.one_of(BUDGETS, FAILURES, records(ErrorInfo), USAGES))
def test_budgets_failures_error_infos_and_usage_round_trip(value: object) -> None:
    assert json_round_trip(value, type(value)) == value


def test_a_usage_without_cache_counts_is_stored_and_read_as_before() -> None:
    # A log written before the cache's counts were kept apart reads as none
    # cached, and a usage with none cached is written as it was then.
    older = {"input_tokens": 1200, "output_tokens": 40}
    assert serde.from_json(Usage, older) == Usage(input_tokens=1200, output_tokens=40)
    assert serde.to_json(Usage(input_tokens=1200, output_tokens=40)) == older
    cached = Usage(input_tokens=1200, output_tokens=40, cache_read_tokens=1000)
    assert serde.to_json(cached) == {**older, "cache_read_tokens": 1000}
    # Printed as the log has it: the cache's counts only when there are any.
    assert repr(Usage(input_tokens=1200, output_tokens=40)) == (
        "Usage(input_tokens=1200, output_tokens=40)"
    )
    assert repr(cached) == (
        "Usage(input_tokens=1200, output_tokens=40, cache_read_tokens=1000)"
    )


def test_a_usage_whose_cached_tokens_exceed_its_input_is_refused_by_name() -> None:
    with pytest.raises(ConfigError) as info:
        Usage(input_tokens=10, cache_read_tokens=8, cache_write_tokens=5)
    assert "cache_read_tokens + cache_write_tokens" in str(info.value)
    assert "13" in str(info.value)
    with pytest.raises(CorruptRecord):
        serde.from_json(Usage, {"input_tokens": 1, "cache_read_tokens": 2})


@final
@attrs.frozen(kw_only=True)
class _Entry:
    """A record shaped like the persistence layer's entries."""

    run_id: str
    event: Event
    decision: Decision | None = None
    events: tuple[Event, ...] = ()
    messages: tuple[Message, ...] = ()
    error: TurnFSMError | None = attrs.field(default=None, eq=False)
    usage: Usage | None = None
    info: ErrorInfo | None = None
    outcome: Literal["done", "failed"] = "done"
    tags: Mapping[str, str] = attrs.field(factory=dict, hash=False)
    arguments: Mapping[str, JSONValue] = attrs.field(factory=dict, hash=False)
    at: float = 0.0
    _secret: int = 0


@final
@attrs.frozen(kw_only=True)
class _Other:
    """A second record, to make a union of plain records."""

    note: str


@given(records(_Entry))
def test_a_plain_attrs_record_of_records_round_trips(entry: _Entry) -> None:
    back = json_round_trip(entry, _Entry)

    assert back == entry
    assert (back.error is None) == (entry.error is None)
    if entry.error is not None:
        assert error_key(back.error) == error_key(entry.error)


def test_a_plain_record_keys_fields_by_init_name() -> None:
    data = serde.to_json(_Entry(run_id="r", event=Measured(estimate=1), secret=3))

    assert isinstance(data, dict)
    assert data["secret"] == 3
    assert "_secret" not in data


@given(st.one_of(records(_Entry), records(_Other)))
def test_a_union_of_plain_records_is_tagged_with_the_class_name(
    value: _Entry | _Other,
) -> None:
    wrapped = serde.to_json(_Holder(item=value))

    assert isinstance(wrapped, dict)
    assert wrapped["item"]["type"] == type(value).__name__  # type: ignore[index,call-overload]
    assert json_round_trip(_Holder(item=value), _Holder).item == value


@final
@attrs.frozen(kw_only=True)
class _Holder:
    item: _Entry | _Other


# -- the JSON form ----------------------------------------------------------------


def test_an_error_is_a_value_tagged_with_its_class_name() -> None:
    assert serde.error_to_json(CompactionStalled(used=5, limit=9)) == {
        "type": "CompactionStalled",
        "used": 5,
        "limit": 9,
    }


def test_the_providers_words_on_an_error_leave_older_records_as_they_were() -> None:
    quoting = CompactionStalled(used=5, limit=9, provider_message="too long")

    written = serde.error_to_json(quoting)
    older = serde.error_from_json({"type": "CompactionStalled", "used": 5, "limit": 9})

    assert written["provider_message"] == "too long"
    assert isinstance(older, CompactionStalled)
    assert older.provider_message == ""
    back = json_round_trip(quoting, TurnFSMError)
    assert isinstance(back, CompactionStalled)
    assert back.provider_message == "too long"


def test_the_window_checks_words_on_an_error_leave_older_records_as_they_were() -> None:
    said = "the reply makes the conversation 9 tokens, over the 5 window"
    quoting = CompactionStalled(used=5, limit=5, window_check=said)

    written = serde.error_to_json(quoting)

    assert written["window_check"] == said
    assert "window_check" not in serde.error_to_json(CompactionStalled(used=5, limit=9))
    back = json_round_trip(quoting, TurnFSMError)
    assert isinstance(back, CompactionStalled)
    assert back.window_check == said
    assert f"(the window check said: {said})" in str(back)


def test_a_snapshot_keeps_its_older_form_until_an_overflow_is_kept() -> None:
    older = Snapshot(phase="start").to_dict()
    refused = ErrorInfo(type=errors.CONTEXT_OVERFLOW, message="too long", status=400)
    snapshot = Snapshot(phase="start", overflow=refused)

    assert "overflow" not in older
    assert Snapshot.from_dict(older).overflow is None
    assert Snapshot.from_dict(snapshot.to_dict()) == snapshot
    assert json_round_trip(snapshot, Snapshot) == snapshot


def test_an_error_field_named_type_is_keyed_type_underscore() -> None:
    data = serde.error_to_json(CorruptRecord(type="Snapshot", path="v", reason="r"))

    assert data == {
        "type": "CorruptRecord",
        "type_": "Snapshot",
        "path": "v",
        "reason": "r",
    }
    assert serde.error_from_json(data).args == ("Snapshot", "v", "r")


def test_a_decision_carries_its_error_as_a_value() -> None:
    fail = Fail(error=RunFailed(error=MaxTurnsExceeded(max_turns=3)))

    assert serde.to_json(fail) == {
        "type": "Fail",
        "error": {
            "type": "RunFailed",
            "error": {"type": "MaxTurnsExceeded", "max_turns": 3},
        },
    }


def test_enums_are_their_values_and_dumps_is_compact_and_sorted() -> None:
    compact = Compact(
        reason=next(iter(CompactReason)), history=MessageLog(), pending=MessageLog()
    )

    data = serde.to_json(compact)

    assert isinstance(data, dict)
    assert type(data["reason"]) is str
    assert serde.dumps(Measured(estimate=1)) == '{"estimate":1,"type":"Measured"}'
    assert serde.loads(Decision, serde.dumps(compact)) == compact


def test_dumps_writes_text_that_encodes_to_utf8_whatever_a_message_holds() -> None:
    # A lone surrogate (a file name that was not UTF-8) was written as it is:
    # the text failed with UnicodeEncodeError where it was written (a file, a
    # database's text column), as a store of one's own built on dumps does.
    message = Message.user("caf\udce9.txt \ud800 \x00 \u00fc \u65e5 \U0001f389")

    text = serde.dumps(message)

    assert "\\udce9" in text
    assert "\u00fc \u65e5 \U0001f389" in text  # the rest as it is
    assert serde.loads(Message, text.encode("utf-8")) == message


def test_error_info_keeps_the_retry_after_of_a_provider_error() -> None:
    exc = ProviderError(message="slow down", retryable=True, retry_after=2.5)

    info = ErrorInfo.from_exception(exc, retryable=True)

    assert info.retry_after == 2.5
    assert ErrorInfo.from_exception(ValueError("x")).retry_after is None
    assert json_round_trip(info, ErrorInfo) == info


def test_an_error_outside_turnfsm_errors_has_no_json_form() -> None:
    class Mine(TurnFSMError):
        pass

    with pytest.raises(ConfigError) as caught:
        serde.error_to_json(Mine())

    assert caught.value.field == "error.type"


def test_store_errors_form_one_branch() -> None:
    assert issubclass(CorruptRecord, StoreError)
    assert issubclass(CorruptRecord, ValueError)


# -- corrupt input --------------------------------------------------------------


def corrupt(cls: Any, data: object) -> CorruptRecord:
    with pytest.raises(CorruptRecord) as caught:
        serde.from_json(cls, data)
    return caught.value


def test_an_unknown_tag_names_the_tag() -> None:
    error = corrupt(Event, {"type": "Teleported"})

    assert (error.type, error.path) == ("Event", "type")
    assert "'Teleported'" in error.reason


def test_a_missing_field_is_named() -> None:
    error = corrupt(Event, {"type": "ModelReplied"})

    assert (error.path, error.reason) == ("message", "missing")


def test_a_field_the_record_does_not_have_is_named() -> None:
    # It was read and dropped: written back, the record lost it without a word.
    error = corrupt(Event, {"type": "Measured", "estimate": 5, "confidence": 0.9})
    assert (error.path, error.reason) == ("confidence", "not a field of this record")

    usage = {**serde.to_json(Usage(input_tokens=1, output_tokens=2)), "cost": 3}
    error = corrupt(Usage, usage)
    assert (error.path, error.reason) == ("cost", "not a field of this record")


@pytest.mark.parametrize("bad", ["5", 5.5, True, None])
def test_a_value_of_the_wrong_json_type_is_rejected(bad: object) -> None:
    error = corrupt(Measured, {"type": "Measured", "estimate": bad})

    assert error.path == "estimate"
    assert "expected an integer" in error.reason


def test_the_path_reaches_into_nested_records() -> None:
    good = serde.to_json(Measured(estimate=1))
    reply = serde.to_json(ModelReplied(message=Message.assistant("hi", id="m")))
    assert isinstance(reply, dict)
    broken = {**reply, "message": {**reply["message"], "parts": "hi"}}  # type: ignore[dict-item]
    data = {"run_id": "r", "event": good, "events": [good, good, good, broken]}

    error = corrupt(_Entry, data)

    assert (error.type, error.path) == ("_Entry", "events[3].message.parts")
    assert "expected an array" in error.reason


def test_an_invalid_message_is_a_corrupt_record_naming_its_field() -> None:
    message = {"id": "m", "role": "robot", "parts": []}

    error = corrupt(Message, message)

    assert error.path == "role"


def test_an_unknown_error_type_is_corrupt_inside_a_record() -> None:
    data = {"type": "Fail", "error": {"type": "Gremlins"}}

    error = corrupt(Decision, data)

    assert error.path == "error.type"
    with pytest.raises(ConfigError) as caught:
        serde.error_from_json({"type": "Gremlins"})
    assert caught.value.field == "error.type"


def test_an_error_with_a_bad_field_is_corrupt() -> None:
    error = corrupt(TurnFSMError, {"type": "CompactionStalled", "used": 5})

    assert (error.type, error.path, error.reason) == (
        "TurnFSMError",
        "limit",
        "missing",
    )


def test_a_corrupt_snapshot_is_a_corrupt_record() -> None:
    data = Snapshot(phase="start").to_dict()
    del data["phase"]

    error = corrupt(Snapshot, data)

    assert error.path == "phase"


def test_text_that_is_not_json_is_corrupt() -> None:
    with pytest.raises(CorruptRecord) as caught:
        serde.loads(Event, "{not json")

    assert caught.value.type == "Event"


# -- envelopes ---------------------------------------------------------------------


def test_an_envelope_names_the_version_and_the_type() -> None:
    snapshot = Snapshot(phase="start", history=[Message.user("hi", id="u")])

    box = serde.envelope(snapshot)

    assert box == {
        "v": serde.SCHEMA_VERSION,
        "type": "Snapshot",
        "data": serde.to_json(snapshot),
    }
    assert serde.open_envelope(json.loads(json.dumps(box))) == snapshot
    assert serde.open_envelope(box, Snapshot) == snapshot


def test_an_envelope_picks_the_member_of_a_union() -> None:
    box = serde.envelope(Finish(text="ok"))

    assert serde.open_envelope(box, Decision) == Finish(text="ok")
    assert serde.open_envelope(
        serde.envelope(_Other(note="n")), _Entry | _Other
    ) == _Other(note="n")
    error = serde.open_envelope(serde.envelope(MaxTurnsExceeded(max_turns=2)))
    assert isinstance(error, MaxTurnsExceeded)


@pytest.mark.parametrize("version", [0, 2, "1", True, None])
def test_an_unknown_envelope_version_is_rejected(version: object) -> None:
    box = {**serde.envelope(Finish(text="ok")), "v": version}

    with pytest.raises(CorruptRecord) as caught:
        serde.open_envelope(box)

    assert caught.value.path == "v"
    assert f"version {version!r}" in caught.value.reason


def test_an_envelope_of_an_unexpected_type_is_rejected() -> None:
    box = serde.envelope(Finish(text="ok"))

    with pytest.raises(CorruptRecord) as caught:
        serde.open_envelope(box, Event)

    assert caught.value.path == "type"


@pytest.mark.parametrize(
    ("estimate", "path"), [("1", "data.estimate"), (-1, "data")], ids=["type", "value"]
)
def test_a_corrupt_envelope_payload_is_named_under_data(
    estimate: object, path: str
) -> None:
    data = {"type": "Measured", "estimate": estimate}
    box = {"v": 1, "type": "Measured", "data": data}

    with pytest.raises(CorruptRecord) as caught:
        serde.open_envelope(box)

    # A validator runs in __init__, after every field was read: it names the
    # record (and its message the field).
    assert caught.value.path == path
    assert "estimate" in str(caught.value)
