from __future__ import annotations

import copy
import itertools
import json
import os
import pickle
import re
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from turnfsm.errors import InvalidMessage
from turnfsm.messages import (
    PINNED,
    ImagePart,
    Joined,
    Message,
    MessageLog,
    OpenCalls,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    _values,
    check_history,
    new_message_id,
)


def test_an_unknown_role_names_the_field_and_value() -> None:
    with pytest.raises(InvalidMessage) as caught:
        Message(role="robot", parts="hi")  # type: ignore[arg-type]
    assert (caught.value.field, caught.value.value) == ("role", "robot")
    assert "expected one of system, user, assistant, tool" in str(caught.value)
    with pytest.raises(InvalidMessage):
        Message(role=3, parts="hi")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("role", "part", "reason"),
    [
        ("user", ToolCallPart(id="c", name="f"), "needs role 'assistant'"),
        ("assistant", ToolResultPart(call_id="c", content="x"), "needs role 'tool'"),
        ("tool", TextPart(text="x"), "holds only tool results"),
    ],
    ids=["call-on-user", "result-on-assistant", "text-on-tool"],
)
def test_parts_must_fit_the_role(role: str, part: object, reason: str) -> None:
    with pytest.raises(InvalidMessage, match=reason) as caught:
        Message(role=role, parts=[part])  # type: ignore[arg-type, list-item]
    assert caught.value.field == "parts"


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: TextPart(text=3), "text"),
        (lambda: ToolCallPart(id="", name="f"), "tool_call.id"),
        (lambda: ToolCallPart(id="c", name=""), "tool_call.name"),
        (lambda: ToolCallPart(id="c", name="f", arguments=[1]), "tool_call.arguments"),
        (lambda: ToolResultPart(call_id="", content="x"), "tool_result.call_id"),
        (lambda: ToolResultPart(call_id="c", content=None), "tool_result.content"),
        (lambda: ImagePart(url=""), "image.url"),
        (lambda: Message(role="user", parts=[object()]), "parts"),
        (lambda: Message(role="user", parts="x", id=""), "id"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_bad_parts_name_their_field(build: object, field: str) -> None:
    with pytest.raises(InvalidMessage) as caught:
        build()  # type: ignore[operator]
    assert caught.value.field == field


def test_constructors_and_views() -> None:
    call = ToolCallPart(id="c1", name="read", arguments={"path": "a.md", "n": 2})
    msg = Message.assistant("reading", tool_calls=[call])
    assert (msg.role, msg.text, msg.tool_calls) == (Role.ASSISTANT, "reading", (call,))
    assert Message.assistant(tool_calls=[call]).parts == (call,)
    result = Message.tool_result("c1", "body", is_error=True)
    assert result.tool_results == (
        ToolResultPart(call_id="c1", content="body", is_error=True),
    )
    assert call.arguments_json() == '{"n":2,"path":"a.md"}'
    assert Message.system("s").role is Role.SYSTEM
    assert Message.user("a").id != Message.user("a").id  # fresh, stable ids


texts = st.text(max_size=20)
parts_for = {
    Role.USER: st.lists(
        st.one_of(
            st.builds(TextPart, text=texts.filter(str.strip)),  # a user says something
            st.builds(
                ImagePart,
                url=st.just("data:image/png;base64,AA"),
                media_type=st.sampled_from([None, "image/png"]),
            ),
        ),
        min_size=1,
        max_size=3,
    ),
    Role.ASSISTANT: st.lists(
        st.one_of(
            st.builds(TextPart, text=texts),
            st.builds(
                ToolCallPart,
                id=st.just("c1"),
                name=st.just("f"),
                arguments=st.dictionaries(
                    st.text(min_size=1, max_size=5), st.integers()
                ),
            ),
        ),
        min_size=1,
        max_size=3,
    ),
    Role.TOOL: st.lists(
        st.builds(
            ToolResultPart, call_id=st.just("c1"), content=texts, is_error=st.booleans()
        ),
        min_size=1,
        max_size=2,
    ),
}
messages = st.sampled_from(list(parts_for)).flatmap(
    lambda role: parts_for[role].map(lambda parts: Message(role=role, parts=parts))
)


@given(messages)
def test_to_dict_round_trips_through_json(message: Message) -> None:
    again = Message.from_dict(json.loads(json.dumps(message.to_dict())))
    assert again == message
    assert again.id == message.id


@given(messages)
def test_parts_read_alike_from_any_iterable(message: Message) -> None:
    # A tuple is taken as it is (no copy); a list or a generator is read
    # into one: the same message whichever way the parts come.
    parts = message.parts
    for given_parts in (parts, list(parts), (p for p in parts)):
        again = Message(role=message.role, parts=given_parts, id=message.id)
        assert again == message
        assert type(again.parts) is tuple


@pytest.mark.parametrize(
    "parts",
    [
        (TextPart(text="hi"), "hi"),
        ("hi",),
        (None,),
        b"hi",
        {"text": "hi"},
        3,
    ],
    ids=["tuple-with-a-str", "tuple-of-a-str", "tuple-of-none", "bytes", "dict", "int"],
)
def test_parts_that_are_not_parts_are_refused(parts: object) -> None:
    with pytest.raises(InvalidMessage) as caught:
        Message(role="user", parts=parts)  # type: ignore[arg-type]
    assert caught.value.field == "parts"


def test_from_dict_reports_missing_and_unknown_fields() -> None:
    with pytest.raises(InvalidMessage) as caught:
        Message.from_dict({"role": "user", "parts": []})
    assert caught.value.field == "id"
    with pytest.raises(InvalidMessage) as caught:
        Message.from_dict({"id": "m", "role": "user", "parts": [{"type": "audio"}]})
    assert caught.value.field == "parts[0].type"


def test_check_history_rejects_a_result_for_no_call() -> None:
    call = Message.assistant(tool_calls=[ToolCallPart(id="c1", name="f")])
    ok = check_history([call, Message.tool_result("c1", "x")])
    assert len(ok) == 2
    with pytest.raises(InvalidMessage) as caught:
        check_history(
            [call, Message.tool_result("c1", "x"), Message.tool_result("c1", "again")]
        )
    assert (caught.value.field, caught.value.value) == ("tool_result.call_id", "c1")
    with pytest.raises(InvalidMessage):
        check_history(["not a message"])  # type: ignore[list-item]


def test_message_log_appends_without_changing_earlier_views() -> None:
    a, b, c = Message.user("a"), Message.user("b"), Message.user("c")
    base = MessageLog([a])
    one = base.append(b)
    two = base.append(c)  # a branch: must not see b
    assert (list(base), list(one), list(two)) == ([a], [a, b], [a, c])
    assert one.extend([]) is one
    assert one[-1] is b
    assert one[0:1] == (a,)
    with pytest.raises(IndexError):
        one[2]
    assert MessageLog([a, b]) == one
    assert one != two
    assert one.__eq__("x") is NotImplemented
    assert hash(MessageLog([a, b])) == hash(one)
    assert one.store_key[1] == 2
    assert isinstance(one.memo, dict)
    assert "MessageLog" in repr(one)


def test_joined_is_a_view_of_several_sequences() -> None:
    a, b, c = Message.user("a"), Message.user("b"), Message.user("c")
    joined = Joined(MessageLog([a]), (), (b, c))
    assert len(joined) == 3
    assert list(joined) == [a, b, c]
    assert joined[1] is b
    assert joined[-1] is c
    assert joined[0:2] == (a, b)
    assert joined == [a, b, c]
    assert joined != [a]
    assert joined.__eq__(3) is NotImplemented
    with pytest.raises(IndexError):
        joined[3]
    assert "Joined" in repr(joined)


def _asks(*ids: str) -> Message:
    return Message.assistant(tool_calls=[ToolCallPart(id=i, name="f") for i in ids])


def test_open_calls_checks_a_prefix_step_by_step() -> None:
    asks = _asks("c1", "c2", "c1")
    state = OpenCalls().then([Message.user("go"), asks])
    assert (state.ids, state.is_closed) == (("c1", "c2", "c1"), False)
    state = state.then([Message.tool_result("c1", "x")])
    assert state.ids == ("c2", "c1")
    assert state.then([]) is state
    closed = state.then(
        [Message.tool_result("c1", "y"), Message.tool_result("c2", "z")]
    )
    assert closed == OpenCalls()
    closed.require_closed()
    with pytest.raises(InvalidMessage) as caught:
        state.require_closed()
    assert (caught.value.field, caught.value.value) == ("tool_call.id", "c2")


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        ([Message.tool_result("c1", "x")], ("tool_result.call_id", "c1")),
        (
            [_asks("c1"), Message.tool_result("c2", "x")],
            ("tool_result.call_id", "c2"),
        ),
        ([_asks("c1"), Message.user("between")], ("tool_call.id", "c1")),
        ([_asks("c1"), _asks("c2")], ("tool_call.id", "c1")),
    ],
    ids=["no-call", "wrong-id", "user-between", "reply-between"],
)
def test_open_calls_names_the_call_id_of_a_broken_pair(
    messages: list[Message], expected: tuple[str, str]
) -> None:
    with pytest.raises(InvalidMessage) as caught:
        OpenCalls.of(messages)
    assert (caught.value.field, caught.value.value) == expected


def test_open_calls_memoises_message_log_prefixes() -> None:
    one = MessageLog([Message.user("a")])
    four = one.append(_asks("c1"), Message.tool_result("c1", "x"), Message.user("b"))
    assert OpenCalls.of(four).is_closed
    assert OpenCalls.of(four) is OpenCalls.of(four)  # remembered
    assert OpenCalls.of(one).is_closed  # a shorter view of the same list
    assert OpenCalls.of(four[0:2]).ids == ("c1",)  # a tuple: checked afresh
    assert four.memo["open_calls"].lengths == [0, 1, 4]
    assert list(four.items_from(2)) == list(four[2:])


def test_message_ids_are_unique_and_keep_their_form() -> None:
    ids = [new_message_id() for _ in range(10_000)]
    ids += [Message.user("hi").id for _ in range(1_000)]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"msg_[0-9a-f]{24}", i) for i in ids)


def test_a_spent_id_counter_draws_new_random_digits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = new_message_id()
    prefix, _ = _values._ids
    monkeypatch.setattr(_values, "_ids", (prefix, itertools.count(0xFFFFFFFF)))
    last = new_message_id()
    after = new_message_id()
    assert last == f"{prefix}ffffffff"
    assert after[:20] != prefix
    assert after.endswith("00000000")
    assert len({before, last, after}) == 3


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_process_makes_ids_of_its_own() -> None:
    new_message_id()  # the parent's counter has moved on
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its first id, to the parent
        os.write(write, new_message_id().encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 64).decode()
    os.close(read)
    os.waitpid(pid, 0)
    mine = new_message_id()
    assert re.fullmatch(r"msg_[0-9a-f]{24}", child)
    assert child[:20] != mine[:20]


def test_metadata_and_arguments_do_not_change_in_place() -> None:
    given = {"source": "cli"}
    message = Message(role="user", parts="hi", metadata=given)
    given["source"] = "changed"  # the caller's dict is not the message's
    changes: list[Callable[[Any], object]] = [
        lambda d: d.__setitem__("x", float("nan")),
        lambda d: d.__delitem__("source"),
        lambda d: d.__ior__({"x": 1}),
        lambda d: d.clear(),
        lambda d: d.pop("source"),
        lambda d: d.popitem(),
        lambda d: d.setdefault("x", object()),
        lambda d: d.update(x=1),
    ]
    for change in changes:
        with pytest.raises(InvalidMessage, match="metadata does not change"):
            change(message.metadata)
    assert message.metadata == {"source": "cli"}
    assert Message.user("hi").pin().metadata == {PINNED: "true"}
    for copied in (copy.deepcopy(message), pickle.loads(pickle.dumps(message))):
        assert copied == message
        assert copied.metadata == {"source": "cli"}
        metadata: Any = copied.metadata
        with pytest.raises(InvalidMessage):
            metadata.clear()
    assert json.loads(json.dumps(message.to_dict()))["metadata"] == {"source": "cli"}

    arguments: dict[str, Any] = {"path": "a"}
    call = ToolCallPart(id="c1", name="read", arguments=arguments)
    arguments["path"] = "b"
    for change in changes:
        with pytest.raises(InvalidMessage, match="arguments does not change"):
            change(call.arguments)
    assert call.arguments == {"path": "a"}
    assert pickle.loads(pickle.dumps(call)) == call
    assert ToolCallPart(id="c2", name="read").arguments == {}


def test_nested_metadata_and_arguments_do_not_change_in_place() -> None:
    given: dict[str, Any] = {"tags": ["a"], "where": {"path": ["x"]}}
    message = Message(role="user", parts="hi", metadata=given)
    given["tags"].append("caller")  # the caller's lists are not the message's
    call = ToolCallPart(id="c1", name="add", arguments=given)
    nested: list[tuple[Any, str]] = [
        (message.metadata["tags"], "metadata"),
        (message.metadata["where"]["path"], "metadata"),
        (call.arguments["tags"], "tool_call.arguments"),
        (call.arguments["where"]["path"], "tool_call.arguments"),
    ]
    changes: list[Callable[[Any], object]] = [
        lambda v: v.append("x"),
        lambda v: v.extend(["x"]),
        lambda v: v.insert(0, "x"),
        lambda v: v.__setitem__(0, "x"),
        lambda v: v.__delitem__(0),
        lambda v: v.__iadd__(["x"]),
        lambda v: v.__imul__(2),
        lambda v: v.pop(),
        lambda v: v.remove("a"),
        lambda v: v.clear(),
        lambda v: v.sort(),
        lambda v: v.reverse(),
    ]
    for value, field in nested:
        for change in changes:
            with pytest.raises(InvalidMessage, match=f"{field} does not change"):
                change(value)
    with pytest.raises(InvalidMessage, match="arguments does not change"):
        call.arguments["where"]["path"] = "y"
    assert message.metadata == {"tags": ["a"], "where": {"path": ["x"]}}
    assert call.arguments["tags"] == ["a", "caller"]
    for copied in (copy.deepcopy(call), pickle.loads(pickle.dumps(call))):
        assert copied == call
        with pytest.raises(InvalidMessage):
            copied.arguments["tags"].append("x")
    assert json.loads(call.arguments_json()) == {
        "tags": ["a", "caller"],
        "where": {"path": ["x"]},
    }


@pytest.mark.parametrize("as_given", [tuple, list, iter], ids=["tuple", "list", "iter"])
def test_an_assistant_message_takes_its_calls_from_any_iterable(
    as_given: Callable[[list[ToolCallPart]], Any],
) -> None:
    calls = [ToolCallPart(id="c1", name="f"), ToolCallPart(id="c2", name="g")]
    with_text = Message.assistant("on it", tool_calls=as_given(calls))
    assert with_text.parts == (TextPart(text="on it"), *calls)
    assert Message.assistant(tool_calls=as_given(calls)).parts == tuple(calls)


@pytest.mark.parametrize(
    "tool_calls",
    ["c1", b"c1", {"id": "c1"}, 3, (ToolCallPart(id="c1", name="f"), "c2")],
    ids=["str", "bytes", "dict", "int", "tuple-with-a-str"],
)
def test_tool_calls_that_are_not_calls_are_refused(tool_calls: object) -> None:
    with pytest.raises(InvalidMessage) as caught:
        Message.assistant("", tool_calls=tool_calls)  # type: ignore[arg-type]
    assert caught.value.field.startswith("tool_calls")
