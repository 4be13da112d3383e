"""A reply's tool calls are renamed when the conversation used their ids before."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from turnfsm.messages import Message, MessageLog, ToolCallPart, unique_call_ids


def ask(*ids: str) -> Message:
    return Message.assistant(
        "", tool_calls=[ToolCallPart(id=i, name="t", arguments={}) for i in ids]
    )


def answered(*ids: str) -> list[Message]:
    return [ask(*ids), *(Message.tool_result(i, "ok") for i in ids)]


def test_new_distinct_ids_keep_the_reply_itself() -> None:
    reply = ask("a", "b")
    assert unique_call_ids(reply, MessageLog(answered("c"))) is reply
    text = Message.assistant("hi")
    assert unique_call_ids(text, answered("a")) is text


def test_an_id_used_before_or_twice_is_renamed() -> None:
    history = MessageLog(answered("call_0", "call_0_2"))
    original = ask("call_0", "call_1", "call_1")
    reply = unique_call_ids(original, history, ())
    # call_0_2 is taken: the next try is from the reply's place (3 messages
    # before it, so call_0_5).
    assert [c.id for c in reply.tool_calls] == ["call_0_5", "call_1", "call_1_2"]
    assert reply.id == original.id  # the same message, its calls renamed
    assert [c.name for c in reply.tool_calls] == ["t", "t", "t"]


def test_a_log_keeps_its_ids_and_extends_them() -> None:
    log = MessageLog(answered("a"))
    assert [c.id for c in unique_call_ids(ask("a"), log).tool_calls] == ["a_2"]
    longer = log.extend(answered("b"))
    assert [c.id for c in unique_call_ids(ask("b"), longer).tool_calls] == ["b_2"]
    # The shorter view still knows only its own ids.
    assert unique_call_ids(ask("b"), log).tool_calls[0].id == "b"


@given(
    st.lists(st.lists(st.sampled_from("abc"), min_size=1, max_size=3), max_size=6),
    st.lists(st.sampled_from(["a", "b", "c", "a_2"]), min_size=1, max_size=4),
)
def test_every_id_is_new_and_distinct(
    earlier: list[list[str]], asked: list[str]
) -> None:
    history: list[Message] = []
    for ids in earlier:
        history.extend(answered(*dict.fromkeys(ids)))
    reply = unique_call_ids(ask(*asked), MessageLog(history))
    ids = [c.id for c in reply.tool_calls]
    before = {c.id for m in history for c in m.tool_calls}
    assert len(set(ids)) == len(ids)
    assert before.isdisjoint(ids)
    assert all(new.startswith(old) for new, old in zip(ids, asked, strict=True))


@given(
    st.lists(st.lists(st.sampled_from("abc"), min_size=1, max_size=3), max_size=6),
    st.lists(st.sampled_from(["a", "b", "c", "a_2"]), min_size=1, max_size=4),
    st.integers(min_value=0, max_value=20),
    st.booleans(),
)
def test_a_reply_is_kept_exactly_when_its_ids_are_new_in_every_part(
    earlier: list[list[str]], asked: list[str], cut: int, pending_log: bool
) -> None:
    # History and pending, the pending part a log or a plain list.
    messages: list[Message] = []
    for ids in earlier:
        messages.extend(answered(*dict.fromkeys(ids)))
    tail = messages[cut:]
    pending = MessageLog(tail) if pending_log else tail
    reply = ask(*asked)
    renamed = unique_call_ids(reply, MessageLog(messages[:cut]), pending)
    before = {c.id for m in messages for c in m.tool_calls}
    new = len(set(asked)) == len(asked) and before.isdisjoint(asked)
    assert (renamed is reply) is new
    ids = [c.id for c in renamed.tool_calls]
    assert len(set(ids)) == len(ids)
    assert before.isdisjoint(ids)
