"""The recall tool: the model reads back what a compaction replaced."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.helpers import request_text
from tests.tracing._spans import Traced
from turnfsm import Agent, recall_tool
from turnfsm.context import (
    ContextManager,
    SummarizingCompactor,
    TruncatingCompactor,
    call_handle,
    replaced_ids,
)
from turnfsm.core import Budget, RunStarted
from turnfsm.driver import Session, Tool, current_session, replay
from turnfsm.driver._recall import session_scope
from turnfsm.driver._tools import run_tool_call
from turnfsm.errors import ConfigError, ToolError
from turnfsm.hooks import Hook, ToolCallEnd
from turnfsm.messages import ImagePart, Message, Role, TextPart
from turnfsm.persistence import EventRecorded, MemoryStore, RunOpened, event_messages
from turnfsm.providers import ModelRequest, ModelResponse
from turnfsm.testing import FakeModelClient, reply, tool_call
from turnfsm.tokens import HeuristicTokenCounter
from turnfsm.tracing import attributes as A

pytestmark = pytest.mark.anyio

COUNTER = HeuristicTokenCounter()
SECRET = "vault code 4711-ZEBRA"
NOTE = re.compile(r"\[recall (\S+?)\]")


def read_vault() -> str:
    """Read the vault's log."""
    return f"vault log: {SECRET}\n" + "padding line of the vault log\n" * 60


def summary_model() -> FakeModelClient:
    # A summary that keeps the task, not the tool's output.
    return FakeModelClient(
        lambda _r: "## Active Task\nAnswer questions about the vault."
    )


def covered(session: Session, message: Message) -> set[str]:
    """The ids `message` replaces, and what those replaced, and so on."""
    out: set[str] = set()
    todo = list(replaced_ids(message))
    while todo:
        mid = todo.pop()
        if mid not in out:
            out.add(mid)
            todo.extend(replaced_ids(session.message(mid)))
    return out


class Spans(Hook):
    def __init__(self) -> None:
        self.ends: list[ToolCallEnd] = []

    def on_tool_end(self, info: ToolCallEnd) -> None:
        self.ends.append(info)


def recalling_model(seen: list[ModelRequest]) -> FakeModelClient:
    """The agent's model: reads the vault, chats, then answers by recall only."""

    def handle(request: ModelRequest) -> ModelResponse | Message:
        seen.append(request)
        last = request.messages[-1]
        if last.role is Role.USER and last.text == "read the vault log":
            return reply("", tool_call("read_vault", "call_read"))
        if last.role is Role.TOOL and last.tool_results[0].call_id == "call_read":
            return reply("I read the vault log.")
        if last.role is Role.USER and last.text.startswith("chat"):
            return reply("noted: " + "n" * 1000)
        if last.role is Role.USER and last.text == "what is the vault code?":
            assert SECRET not in request_text(request), "the answer is still in context"
            notes = NOTE.findall(request_text(request))
            assert notes, "no recall note in the context"
            return reply("", tool_call("recall", "call_recall", ids=[notes[0]]))
        if last.role is Role.TOOL:
            content = last.tool_results[0].content
            found = re.search(r"vault code (\S+)", content)
            assert found is not None, content
            return reply(f"The vault code is {found.group(1)}.")
        raise AssertionError(f"unexpected request ending with {last!r}")

    return FakeModelClient(handle)


def vault_agent(model: FakeModelClient, **options: Any) -> Agent:
    """An agent that reads the vault and recalls, summarising on a small window."""
    return Agent(
        model=model,
        tools=[read_vault, recall_tool(max_chars=2_500)],
        context=ContextManager(
            SummarizingCompactor(model=summary_model(), keep_recent_turns=1),
            context_window=2_000,
            threshold=60,
            counter=COUNTER,
        ),
        **options,
    )


async def read_then_chat(agent: Agent) -> None:
    """Read the vault log, then chat twice: enough for a pass to summarise it."""
    for text in (
        "read the vault log",
        "chat 0: " + "c" * 1000,
        "chat 1: " + "c" * 1000,
    ):
        assert (await agent.run(text)).ok


async def test_the_model_answers_from_a_summarised_tool_result_by_recall() -> None:
    seen: list[ModelRequest] = []
    spans = Spans()
    agent = vault_agent(recalling_model(seen), hooks=[spans], store=MemoryStore())
    await read_then_chat(agent)
    result = await agent.run("what is the vault code?")
    assert result.ok, result.error
    assert result.text == "The vault code is 4711-ZEBRA."

    session = agent.session
    compacted = [c for run in session.runs for c in run.compactions if c.compacted]
    assert compacted, "no summary pass ran"
    # The summary names what it covers, and the tool's original is among it.
    summary = next(m for m in session.history if replaced_ids(m))
    read_result = next(
        m for m in session.history_before(session.runs[1].run_id) if m.role is Role.TOOL
    )
    assert read_result.id in covered(session, summary)
    assert read_result.id not in {m.id for m in session.history if not replaced_ids(m)}
    # The recall call is a tool call like any other: logged, observed, replayed.
    recall_end = next(e for e in spans.ends if e.call.call.name == "recall")
    assert recall_end.result is not None
    assert SECRET in recall_end.result.tool_results[0].content
    last_run = session.runs[-1]
    assert any(
        p.call_id == "call_recall" and SECRET in p.content
        for m in session.history
        for p in m.tool_results
    )
    for run in session.runs:
        assert replay(None, session, run.run_id).ok
    assert last_run.outcome == "done"


async def test_a_recall_call_is_traced_like_any_tool_call() -> None:
    traced = Traced.create(capture_content=True)
    agent = vault_agent(recalling_model([]), hooks=[traced.hook], store=MemoryStore())
    await read_then_chat(agent)
    assert (await agent.run("what is the vault code?")).ok
    (span,) = [s for s in traced.spans if s.name == "execute_tool recall"]
    assert span.attributes is not None
    assert SECRET in str(span.attributes[A.TOOL_CALL_RESULT])


async def test_replay_reuses_the_recorded_recall_result() -> None:
    seen: list[ModelRequest] = []
    store = MemoryStore()
    agent = vault_agent(recalling_model(seen), store=store)
    await read_then_chat(agent)
    result = await agent.run("what is the vault code?")
    assert result.ok
    # A fresh process: the session from the store, no tools, no model.
    reopened = await Session.load(store, agent.session.id)
    report = replay(None, reopened, result.run_id)
    assert report.ok
    assert report.events == len(reopened.run_entries(result.run_id))


# -- the tool on its own ------------------------------------------------------


def read(path: str) -> str:
    """Read a file."""
    return f"contents of {path}: " + f"{path} line\n" * 40


async def archived_session() -> Session:
    """Three exchanges with a tool call each; a pass dropped the first two."""
    script = []
    for name in ("alpha", "beta", "gamma"):
        script += [
            reply("", tool_call("read", f"call_{name}", path=f"{name}.txt")),
            f"done {name}",
        ]
    replies = iter(script)
    agent = Agent(
        model=FakeModelClient(lambda _r: next(replies)),
        tools=[read],
        context=ContextManager(
            TruncatingCompactor(preserve_recent=2, min_messages=2),
            context_window=100_000,
            counter=COUNTER,
        ),
        store=MemoryStore(),
    )
    for name in ("alpha", "beta", "gamma"):
        assert (await agent.run(f"read {name}")).ok
    assert (await agent.compact()).ok
    (record,) = agent.session.runs[-1].compactions
    assert record.compacted
    return agent.session


def ids_of(session: Session, role: Role, text: str) -> str:
    """The first message of `session` said by `role` whose text holds `text`."""
    for entry in session.entries:
        for m in (
            event_messages(entry.event) if isinstance(entry, EventRecorded) else ()
        ):
            said = m.text + "".join(p.content for p in m.tool_results)
            said += "".join(c.id for c in m.tool_calls)
            if m.role is role and text in said:
                return m.id
    raise AssertionError(f"no {role} message with {text!r}")


async def ask(
    session: Session | None, tool: Tool | None = None, **arguments: object
) -> Message:
    call = tool_call("recall", "call_ask", **arguments)
    tool = tool or recall_tool()
    with session_scope(session):
        return await run_tool_call(call, {tool.name: tool}, limit=None)


def answer(result: Message) -> str:
    (part,) = result.tool_results
    assert not part.is_error, part.content
    return part.content


async def test_a_result_comes_with_its_call_and_a_call_with_its_result() -> None:
    session = await archived_session()
    result_id = ids_of(session, Role.TOOL, "alpha.txt line")
    call_id = ids_of(session, Role.ASSISTANT, "call_alpha")
    noted = call_handle(tool_call("read", "call_alpha", path="alpha.txt"))
    for wanted in (result_id, call_id, "call_alpha", noted):
        text = answer(await ask(session, ids=[wanted]))
        assert f"[{call_id}] assistant: called read" in text
        assert f"[{result_id}] tool: result of read for call_alpha" in text
        assert text.startswith("recalled 2 messages")


async def test_a_range_spells_out_every_message_in_order() -> None:
    session = await archived_session()
    first = ids_of(session, Role.USER, "read alpha")
    last = ids_of(session, Role.ASSISTANT, "done beta")
    text = answer(await ask(session, ids=[f"{first}..{last}"]))
    said = re.findall(r"^\[(\S+)\]", text, flags=re.M)
    assert said[0] == first
    assert said[-1] == last
    assert len(said) == 8  # two exchanges: user, call, result, reply each
    # Either order of the ends names the same range.
    assert answer(await ask(session, ids=[f"{last}..{first}"])) == text


async def test_an_image_comes_back_as_what_was_said() -> None:
    photo = ImagePart(url="https://example.com/receipt.png", media_type="image/png")
    inline = ImagePart(url="data:image/jpeg;base64," + "A" * 5_000)
    said = Message(
        role=Role.USER,
        parts=(TextPart(text="Here is the receipt."), photo, inline),
        id="u_photo",
    )
    session = Session(store=MemoryStore())
    await session.append(
        RunOpened(
            run_id="run_1",
            machine="turn",
            digest="d",
            budget=Budget(context_window=0, threshold=0),
            at=0.0,
        ),
        EventRecorded(
            run_id="run_1",
            index=0,
            event=RunStarted(input=(said,)),
            phase="start",
            decision="measure",
            at=0.0,
        ),
    )

    text = answer(await ask(session, ids=["u_photo"]))

    assert text == (
        "recalled 1 message\n[u_photo] user: Here is the receipt.\n"
        "[image https://example.com/receipt.png]\n"
        "[image data:image/jpeg;base64,... (5023 characters)]"
    )


async def test_unknown_ids_are_said_not_raised() -> None:
    session = await archived_session()
    text = answer(await ask(session, ids=["msg_nope", "x..y"]))
    assert text.startswith("recalled nothing")
    assert "no message of this conversation has the id msg_nope, x, y" in text


async def test_another_sessions_messages_are_unknown() -> None:
    one, other = await archived_session(), await archived_session()
    foreign = ids_of(other, Role.TOOL, "alpha.txt line")
    text = answer(await ask(one, ids=[foreign]))
    assert f"has the id {foreign}" in text
    assert "alpha.txt line" not in text


async def test_the_answer_stays_within_max_chars_and_says_what_was_cut() -> None:
    session = await archived_session()
    first = ids_of(session, Role.USER, "read alpha")
    last = ids_of(session, Role.ASSISTANT, "done beta")
    tool = recall_tool(max_chars=900)
    text = answer(await ask(session, tool, ids=[f"{first}..{last}"]))
    assert len(text) <= 900
    assert "not shown" in text
    assert "over the 900 character limit" in text
    # One exchange bigger than the limit on its own: each message's head.
    small = recall_tool(max_chars=500)
    text = answer(await ask(session, small, ids=["call_alpha"]))
    assert len(text) <= 500
    assert "characters cut]" in text
    assert "called read" in text
    assert "result of read for call_alpha" in text


async def test_search_finds_replaced_messages_only_best_first() -> None:
    session = await archived_session()
    text = answer(await ask(session, query="beta.txt line"))
    assert "result of read for call_beta" in text
    assert "call_alpha" not in text
    # What the working history still holds as it was said is not searched.
    assert "gamma" not in answer(await ask(session, query="gamma"))
    assert answer(await ask(session, query="no such words")) == "recalled nothing"
    # The limit bounds the matches (pairs come along).
    text = answer(await ask(session, query="line", limit=1))
    assert text.count("tool: result of read") == 1


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        ({}, "give ids (or ranges first..last) or a query"),
        ({"ids": []}, "ids"),
        ({"query": ""}, "query"),
        ({"query": "x", "limit": 0}, "limit"),
        ({"query": "x", "limit": 51}, "limit"),
        ({"query": "x", "limit": "3"}, "limit"),
        ({"ids": "msg_a"}, "ids"),
        ({"query": "x", "since": 3}, "since"),
    ],
)
async def test_bad_arguments_are_an_error_result_naming_them(
    arguments: dict[str, object], says: str
) -> None:
    session = await archived_session()
    result = await ask(session, **arguments)
    (part,) = result.tool_results
    assert part.is_error
    assert says in part.content


async def test_outside_a_run_it_says_so() -> None:
    assert current_session() is None
    (part,) = (await ask(None, query="x")).tool_results
    assert part.is_error
    assert "recall has no conversation to read" in part.content


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"max_chars": 499}, "max_chars"),
        ({"max_chars": "8000"}, "max_chars"),
        ({"max_chars": True}, "max_chars"),
        ({"name": ""}, "name"),
    ],
)
def test_bad_settings_fail_when_the_tool_is_made(
    options: dict[str, object], field: str
) -> None:
    with pytest.raises(ConfigError, match=field):
        recall_tool(**options)  # type: ignore[arg-type]


def test_a_bad_name_is_a_tool_error() -> None:
    with pytest.raises(ToolError, match="has space"):
        recall_tool(name="has space")


async def test_a_wide_exchange_still_fits_the_limit() -> None:
    # One call with many results: each head is tiny, the whole is still bounded.
    calls = [tool_call("read", f"call_{i}", path=f"f{i}.txt") for i in range(60)]
    replies = iter([reply("", *calls), "done"])
    agent = Agent(
        model=FakeModelClient(lambda _r: next(replies)),
        tools=[read],
        store=MemoryStore(),
    )
    assert (await agent.run("read them all")).ok
    text = answer(await ask(agent.session, recall_tool(max_chars=500), ids=["call_0"]))
    assert len(text) <= 500
    assert text.endswith("over the 500 character limit]")


async def test_a_summarys_note_recalls_what_it_stands_for_when_replies_repeat() -> None:
    # A second summary stands for the first and an exchange after it; its
    # last message says what earlier ones said ("Noted."), so a note's end
    # names several messages. The note still brings back exactly what its
    # summary covers: not the first summary's messages, not the messages
    # still in context.
    replies = iter(
        [
            reply("", tool_call("read", "call_alpha", path="alpha.txt")),
            "Noted.",
            "Noted.",
            reply("", tool_call("read", "call_beta", path="beta.txt")),
            "Noted.",
            "Noted.",
        ]
    )
    agent = Agent(
        model=FakeModelClient(lambda _r: next(replies)),
        tools=[read],
        context=ContextManager(
            SummarizingCompactor(model=summary_model(), keep_recent_turns=1),
            counter=COUNTER,
        ),
        store=MemoryStore(),
    )
    for text in ("read alpha", "thanks"):
        assert (await agent.run(text)).ok
    assert (await agent.compact()).ok
    for text in ("read beta", "thanks again"):
        assert (await agent.run(text)).ok
    assert (await agent.compact()).ok
    session = agent.session
    for summary in [m for m in session.history if replaced_ids(m)]:
        (note,) = NOTE.findall(summary.text)
        text = answer(await ask(session, ids=[note], limit=50))
        said = re.findall(r"^\[(\S+)\]", text, flags=re.M)
        assert sorted(said) == sorted(replaced_ids(summary)), text
        # The earlier summary it stands for names its own messages the same way.
        for inner in [session.message(m) for m in said]:
            if replaced_ids(inner):
                (inner_note,) = NOTE.findall(inner.text)
                text = answer(await ask(session, ids=[inner_note], limit=50))
                again = re.findall(r"^\[(\S+)\]", text, flags=re.M)
                assert sorted(again) == sorted(replaced_ids(inner)), text


async def test_ids_past_the_limit_are_named_not_dropped() -> None:
    session = await archived_session()
    asked = ["call_alpha", "msg_nope1", "msg_nope2", "msg_nope3", "msg_nope4"]
    text = answer(await ask(session, ids=[*asked, "call_beta"]))
    assert "result of read for call_alpha" in text
    assert "call_beta" in text
    assert "1 more id past the limit of 5, not looked up: call_beta" in text
    # With room for it, it comes back.
    text = answer(await ask(session, ids=[*asked, "call_beta"], limit=6))
    assert "result of read for call_beta" in text
    assert "past the limit" not in text
