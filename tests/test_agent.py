"""An `Agent`'s settings: an unknown one is named with the setting meant."""

from __future__ import annotations

from typing import Any

import pytest

from turnfsm import Agent, ContextManager
from turnfsm.errors import ConfigError
from turnfsm.testing import ScriptedModel


@pytest.mark.parametrize(
    ("setting", "value", "hint"),
    [
        ("system", "Be brief.", "did you mean 'system_prompt'?"),
        ("max_turn", 3, "did you mean 'max_turns'?"),
        (
            "threshold",
            50,
            "it is a ContextManager setting: context=ContextManager(threshold=50)",
        ),
        (
            "max_messages",
            10,
            "it is a ContextManager setting: context=ContextManager(max_messages=10)",
        ),
        ("colour", "red", "see Driver"),
        # Other agent frameworks' names: "see Driver" named nothing.
        ("instructions", "Be brief.", "the system prompt is system_prompt='...'"),
        (
            "handoffs",
            [],
            "to hand the conversation over, run the other agent on this one's "
            "session (Agent(..., session=agent.session)); to hand it a task, "
            "tools=[other_agent.as_tool(name=..., description=...)]",
        ),
        (
            "checkpointer",
            None,
            "sessions are kept in a store: Agent(store='sessions.db'), and each "
            "run continues a Session",
        ),
        (
            "response_format",
            dict,
            "a structured answer's type is output_type=YourClass",
        ),
        (
            "temperature",
            0.2,
            "it is a model client's setting: model=OpenAIModel('...', temperature=...)",
        ),
        (
            "tool_choice",  # was "did you mean 'tool_timeout'?"
            "auto",
            "it is a model client's setting: model=OpenAIModel('...', tool_choice=...)",
        ),
        ("recursion_limit", 25, "the model calls a run may make are max_turns=..."),
        # Said "see Driver", though the docs map each (LangGraph's, the
        # OpenAI Agents SDK's).
        (
            "interrupt_before",
            ["tools"],
            "a run that pauses for approval before its tools run is "
            "machine=approval_machine(); answer it with agent.resume(...)",
        ),
        ("state_modifier", "Be brief.", "the system prompt is system_prompt='...'"),
        (
            "tool_use_behavior",
            "stop_on_first_tool",
            "what follows the tools is the machine's: a machine file whose "
            "tools_finished goes to done ends the run once they ran (machine=...)",
        ),
        (
            "strategy",  # the command line's --strategy; was "see Driver"
            "layered",
            "a compaction strategy is the context manager's compactor: "
            "context=ContextManager(compactor=strategy_named('layered')) "
            "(from turnfsm.context)",
        ),
        (
            "thread_id",
            "t1",
            "a conversation is a Session, given to each run: "
            "agent.run(..., session=await Session.open(agent.store, ID))",
        ),
        (
            "timeout",
            10,
            "each kind of call has its own: tool_timeout, model_timeout, "
            "compaction_timeout, effect_timeout, store_timeout",
        ),
    ],
)
def test_an_unknown_setting_is_named_with_the_one_meant(
    setting: str, value: Any, hint: str
) -> None:
    # A context manager's setting said "see Driver", which has none of them.
    with pytest.raises(ConfigError) as caught:
        Agent(model=ScriptedModel.of("ok"), **{setting: value})
    assert str(caught.value) == (
        f"invalid {setting}={value!r}: expected a known Agent setting ({hint})"
    )


def test_a_setting_of_both_the_agent_and_the_manager_is_the_agents() -> None:
    agent = Agent(model=ScriptedModel.of("ok"), context_window=9000)
    assert agent.run_sync("hi").ok


@pytest.mark.parametrize(
    ("name", "clients"),
    [
        ("gpt-4o", "model=OpenAIModel('gpt-4o')"),
        ("claude-sonnet-4-5", "model=AnthropicModel('claude-sonnet-4-5')"),
        (
            "my-llama",
            "model=OpenAIModel('my-llama') or model=AnthropicModel('my-llama')",
        ),
        # The command line's spelling: the client of its provider, the model
        # named without the prefix (it showed OpenAIModel('openai:gpt-4o-mini'),
        # which sends 'openai:gpt-4o-mini' as the model's name).
        ("openai:gpt-4o-mini", "model=OpenAIModel('gpt-4o-mini')"),
        ("anthropic:claude-x", "model=AnthropicModel('claude-x')"),
        (
            "http://127.0.0.1:8080/v1#gemma",
            "model=OpenAIModel('gemma', base_url='http://127.0.0.1:8080/v1')",
        ),
        (
            "http://127.0.0.1:8080/v1",
            "model=OpenAIModel('MODEL', base_url='http://127.0.0.1:8080/v1')",
        ),
        # The command line's --model local: the bundled model on its server
        # (it showed OpenAIModel('local') or AnthropicModel('local'), clients
        # of OpenAI's and Anthropic's own services).
        (
            "local",
            "model=OpenAIModel('local', base_url=server.base_url) for "
            "server = LlamaServer().start(), the bundled local model",
        ),
    ],
)
def test_a_models_name_given_as_the_model_shows_its_client(
    name: str, clients: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        Agent(model=name)
    assert (caught.value.field, caught.value.value) == ("model", name)
    assert str(caught.value) == (
        f"invalid model={name!r}: expected a ModelClient, not a model's name: "
        f"{clients} (from turnfsm.providers), or a client of your own "
        "(async complete())"
    )


def test_a_model_given_by_position_is_refused_naming_the_keyword() -> None:
    model = ScriptedModel.of("hi")
    with pytest.raises(ConfigError) as caught:
        Agent(model)  # type: ignore[arg-type]
    assert (caught.value.field, caught.value.value) == ("Agent", model)
    assert str(caught.value).endswith(
        ": expected keyword arguments (Agent(model=...)): Agent takes none by position"
    )


def test_a_sessions_id_given_as_the_session_shows_how_to_open_it() -> None:
    # The command line takes --session ID; run(session=...) takes a Session.
    agent = Agent(model=ScriptedModel.of("ok"))
    with pytest.raises(ConfigError) as caught:
        agent.run_sync("hi", session="ses_0123")  # type: ignore[arg-type]
    assert (caught.value.field, caught.value.value) == ("session", "ses_0123")
    # From synchronous code, the form synchronous code can write.
    assert str(caught.value) == (
        "invalid session='ses_0123': expected a Session or None, not a "
        "session's id: session=anyio.run(Session.open, agent.store, 'ses_0123') "
        "(the stored session, or a new one under that id)"
    )
    assert not agent.session.runs
    # What it names works for an id never used yet (LangGraph's new thread
    # id): agent.open_session, named before, raised SessionNotFound there.
    import anyio

    from turnfsm.persistence import Session

    async def follow() -> str:
        with pytest.raises(ConfigError) as awaited:  # from async code: awaited
            await agent.run("hi", session="ses_0123")  # type: ignore[arg-type]
        assert "session=await Session.open(agent.store, 'ses_0123')" in str(
            awaited.value
        )
        session = await Session.open(agent.store, "ses_0123")
        return (await agent.run("hi", session=session)).text

    assert anyio.run(follow) == "ok"


def _hook() -> Any:
    from turnfsm.hooks import ConsoleHook

    return ConsoleHook()


def _tool() -> Any:
    def read(path: str) -> str:
        """Read.

        Args:
            path: the file.
        """
        return path

    return read


@pytest.mark.parametrize(
    ("setting", "make", "hint"),
    [
        ("hooks", _hook, "a sequence of Hook (one goes in a list: hooks=[...])"),
        (
            "tools",
            _tool,
            "a sequence of tools or functions (one goes in a list: tools=[...])",
        ),
        (
            "context",
            lambda: 8000,
            "a ContextManager or None (a window of 8000 tokens: "
            "context=ContextManager(context_window=8000))",
        ),
    ],
)
def test_one_item_where_a_list_or_a_manager_belongs_shows_how(
    setting: str, make: Any, hint: str
) -> None:
    value = make()
    with pytest.raises(ConfigError) as caught:
        Agent(model=ScriptedModel.of("ok"), **{setting: value})
    assert str(caught.value) == f"invalid {setting}={value!r}: expected {hint}"


@pytest.mark.parametrize(
    ("make", "hint"),
    [
        (lambda: "mine.toml", "load it: machine=load_machine('mine.toml')"),
        (
            lambda: __import__("pathlib").Path("machines/mine.toml"),
            "load it: machine=load_machine('machines/mine.toml')",
        ),
        (
            lambda: __import__("turnfsm").approval_machine,
            "call it: machine=approval_machine()",
        ),
        (lambda: 42, "load a machine file with turnfsm.load_machine(path)"),
    ],
)
def test_a_machine_file_or_maker_given_as_the_machine_shows_the_call(
    make: Any, hint: str
) -> None:
    # A path, or approval_machine without its (), said only "expected a
    # MachineSpec (load a machine file with turnfsm.load_machine(path))".
    value = make()
    with pytest.raises(ConfigError) as caught:
        Agent(model=ScriptedModel.of("ok"), machine=value)
    assert str(caught.value) == (
        f"invalid machine={value!r}: expected a MachineSpec ({hint})"
    )


def test_a_stored_session_made_anew_by_its_id_names_session_open() -> None:
    # A web handler's habit: Session(user_id, store=...) on every request.
    # The second request's view read nothing of the first's log, and the
    # conflict said "another writer appended first", with none there.
    import anyio

    from turnfsm.errors import SessionConflict
    from turnfsm.persistence import MemoryStore, Session

    store = MemoryStore()
    agent = Agent(model=ScriptedModel.of("one", "two"), store=store)

    async def two_requests() -> list[str]:
        await agent.run("hi", session=Session("user-42", store=store))
        with pytest.raises(SessionConflict) as caught:
            await agent.run("again", session=Session("user-42", store=store))
        assert str(caught.value) == (
            "session 'user-42' is already stored (8 entries), but this writer "
            "took it for a new one: another writer started it first, or this "
            "view was made with Session('user-42', store=...), which reads "
            "nothing - reload the session and retry (await Session.open(store, "
            "'user-42') reads it)"
        )
        session = await Session.open(store, "user-42")
        await agent.run("again", session=session)
        return [m.text for m in session.history]

    assert anyio.run(two_requests) == ["hi", "one", "again", "two"]


def test_a_stale_view_of_a_session_names_the_call_that_reads_it_again() -> None:
    # A web handler keeps a Session between requests; another view (a run
    # resumed or abandoned through the agent) wrote since. It said "reload
    # the session and retry", not how.
    import anyio

    from turnfsm.errors import SessionConflict
    from turnfsm.persistence import MemoryStore, Session

    store = MemoryStore()
    agent = Agent(model=ScriptedModel.of("one", "two", "three"), store=store)

    async def two_views() -> None:
        kept = Session("user-7", store=store)
        await agent.run("hi", session=kept)
        other = await Session.open(store, "user-7")
        await agent.run("meanwhile", session=other)
        with pytest.raises(SessionConflict) as caught:
            await agent.run("again", session=kept)
        assert str(caught.value) == (
            "session 'user-7' changed under this writer: expected version 8, "
            "found 15; another writer appended first - reload the session and "
            "retry (await Session.open(store, 'user-7') reads it)"
        )

    anyio.run(two_views)


def test_two_requests_of_one_conversation_at_once_are_told_to_wait(
    tmp_path: Any,
) -> None:
    # Each request opens its own view of the conversation, as the error told
    # the first server to: the second was told to do just that again.
    import anyio

    from turnfsm.errors import SessionBusy
    from turnfsm.persistence import Session, SQLiteStore
    from turnfsm.testing import FakeModelClient, reply

    started = anyio.Event()

    async def slow(request: Any) -> Any:
        started.set()
        await anyio.sleep(0.2)
        return reply("ok")

    refused: list[SessionBusy] = []

    async def two_requests() -> None:
        async with SQLiteStore(tmp_path / "s.db") as store:
            agent = Agent(model=FakeModelClient(slow), store=store)

            async def request(text: str) -> None:
                session = await Session.open(store, "user-9")
                try:
                    await agent.run(text, session=session)
                except SessionBusy as exc:
                    refused.append(exc)

            async with anyio.create_task_group() as group:
                group.start_soon(request, "one")
                await started.wait()
                group.start_soon(request, "two")

    anyio.run(two_requests)
    (busy,) = refused
    assert str(busy) == (
        "session 'user-9' is running another run; wait for it to end (a "
        "conversation takes one run at a time), or, for another conversation, "
        "give this run a Session of its own (run(..., session=...): "
        "Session(store=agent.store) starts one, await Session.open(agent.store, "
        "ID) reopens a stored one)"
    )


def test_a_memory_store_named_in_an_error_does_not_print_its_logs() -> None:
    # Its repr held every entry of every session: one line of an error
    # could run to pages.
    from turnfsm.persistence import MemoryStore

    store = MemoryStore()
    Agent(model=ScriptedModel.of("ok"), store=store).run_sync("hi")
    assert repr(store) == "MemoryStore()"


def test_two_requests_at_once_on_the_agents_own_session_name_the_way_out() -> None:
    # A web server's first try: one module-level agent, `await agent.run(...)`
    # in each request. The second request was told to "give this run its
    # own Session", with no word of how.
    import anyio

    from turnfsm.errors import SessionBusy
    from turnfsm.persistence import Session
    from turnfsm.testing import FakeModelClient, reply

    async def slow(request: Any) -> Any:
        await anyio.sleep(0.05)
        return reply("ok")

    agent = Agent(model=FakeModelClient(slow))
    refused: list[SessionBusy] = []

    async def request(text: str) -> None:
        try:
            await agent.run(text)
        except SessionBusy as exc:
            refused.append(exc)

    async def two_at_once() -> None:
        async with anyio.create_task_group() as group:
            group.start_soon(request, "one")
            group.start_soon(request, "two")
        # What it names works: a conversation of its own.
        other = await agent.run("three", session=Session(store=agent.store))
        assert other.ok

    anyio.run(two_at_once)
    (busy,) = refused
    assert str(busy).endswith(
        "give this run a Session of its own (run(..., session=...): "
        "Session(store=agent.store) starts one, await Session.open(agent.store, "
        "ID) reopens a stored one)"
    )


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("final_output", "the answer is .text, or .output with an output_type"),
        ("new_items", "what the run did is agent.session.run(result.run_id)"),
    ],
)
def test_a_result_read_by_another_frameworks_name_says_where_it_is(
    name: str, hint: str
) -> None:
    # The OpenAI Agents SDK's result.final_output was a bare AttributeError.
    result = Agent(model=ScriptedModel.of("ok")).run_sync("hi")
    with pytest.raises(AttributeError) as caught:
        getattr(result, name)
    assert str(caught.value) == (
        f"'RunResult' object has no attribute {name!r}: {hint}"
    )
    with pytest.raises(AttributeError) as caught:
        result.nothing  # type: ignore[attr-defined]  # noqa: B018
    assert str(caught.value) == "'RunResult' object has no attribute 'nothing'"


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        (
            "invoke",
            "a task runs with agent.run_sync('...') (await agent.run('...') in "
            "async code); the conversation so far is the agent's session",
        ),
        (
            "ainvoke",
            "a task runs with await agent.run('...'); the conversation so far "
            "is the agent's session",
        ),
        (
            "stream",
            "a run streams with async with agent.run_stream('...') as stream: "
            "async for text in stream",
        ),
    ],
)
def test_an_agent_run_by_another_frameworks_name_says_how_it_runs(
    name: str, hint: str
) -> None:
    # LangGraph's agent.invoke({"messages": [...]}) was a bare AttributeError.
    agent = Agent(model=ScriptedModel.of("ok"))
    with pytest.raises(AttributeError) as caught:
        getattr(agent, name)
    assert str(caught.value) == f"'Agent' object has no attribute {name!r}: {hint}"
    with pytest.raises(AttributeError) as caught:
        agent.nothing  # type: ignore[attr-defined]  # noqa: B018
    assert str(caught.value) == "'Agent' object has no attribute 'nothing'"
    assert not hasattr(agent, "invoke")  # what duck typing asks still says no


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: ContextManager(strategy="summarizing"),  # type: ignore[call-arg]
            "invalid strategy='summarizing': expected a known ContextManager "
            "setting (a compaction strategy is the context manager's compactor: "
            "compactor=strategy_named('summarizing') (from turnfsm.context))",
        ),
        (
            lambda: ContextManager(compactor="layered"),  # type: ignore[arg-type]
            "invalid compactor='layered': expected a ContextCompactor (an async "
            "compact() method), not a strategy's name: "
            "compactor=strategy_named('layered') (from turnfsm.context)",
        ),
    ],
    ids=["strategy", "compactor-by-name"],
)
def test_a_strategy_by_name_says_how_to_make_its_compactor(
    make: Any, message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        make()
    assert str(caught.value) == message


def test_a_session_and_another_store_are_refused_naming_the_store(
    tmp_path: Any,
) -> None:
    # The runs went to the session's store, where this agent, and an agent
    # of the given store, found none of them (SessionNotFound).
    from turnfsm.persistence import MemoryStore, Session, SQLiteStore

    kept = SQLiteStore(tmp_path / "a.db")
    other = str(tmp_path / "b.db")
    with pytest.raises(ConfigError) as caught:
        Agent(
            model=ScriptedModel.of("ok"), session=Session("c1", store=kept), store=other
        )
    assert (caught.value.field, caught.value.value) == ("store", other)
    assert "the store session 'c1' is kept in" in str(caught.value)
    # Its own store, named again, is the same store.
    same = Agent(
        model=ScriptedModel.of("ok"),
        session=Session("c1", store=kept),
        store=str(tmp_path / "a.db"),
    )
    assert same.session.id == "c1"
    with pytest.raises(ConfigError):
        Agent(model=ScriptedModel.of("ok"), session=Session(), store=MemoryStore())


@pytest.mark.parametrize("call", ["resume", "abandon", "open_session"])
def test_no_session_id_is_refused_as_such(call: str) -> None:
    # None started a session under a new id, and SessionNotFound named that
    # id, which the caller never gave.
    import anyio

    agent = Agent(model=ScriptedModel.of("ok"))
    method = getattr(agent, call)
    args: tuple[Any, ...] = (None,) if call == "open_session" else (None, "run_x")
    with pytest.raises(ConfigError) as caught:
        anyio.run(lambda: method(*args))
    assert (caught.value.field, caught.value.value) == ("session_id", None)
