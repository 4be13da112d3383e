"""The log keeps a run's context settings; `simulate` makes them again by default."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest

from tests.helpers import restamp
from tests.simulate import user_compactor
from tests.simulate._runs import measured
from turnfsm import Agent
from turnfsm.cli._demo import STRATEGIES, TASK, build_demo_agent
from turnfsm.context import (
    CompactBase,
    ContextCompactor,
    ContextManager,
    PinRules,
    TruncatingCompactor,
)
from turnfsm.driver import pin_rules
from turnfsm.errors import CONTEXT_OVERFLOW, ConfigError, ProviderError
from turnfsm.messages import Message
from turnfsm.persistence import (
    CompactionRecord,
    ContextSettings,
    MemoryStore,
    Session,
    SQLiteStore,
    dump_session,
    load_session,
)
from turnfsm.simulate import simulate, stored_context
from turnfsm.simulate._simulate import CAVEATS
from turnfsm.testing import ScriptedModel, reply, tool_call
from turnfsm.tokens import HeuristicTokenCounter


def _pass(p: CompactionRecord) -> tuple[object, ...]:
    return (p.turn, p.reason, p.verdict, p.tokens_before, p.tokens_after)


def _read(path: str) -> str:
    """Read a file.

    Args:
        path: the file's path.
    """
    return f"# {path}\n" + "".join(f"line {n} of {path}\n" for n in range(60))


async def _run(context: ContextManager, store: MemoryStore | None = None) -> Session:
    """Six file reads in one run, on a small window: it compacts."""
    calls = [
        reply(f"Reading {i}.", tool_call("_read", f"call_{i}", path=f"f{i}.py"))
        for i in range(6)
    ]
    store = store or MemoryStore()
    agent = Agent(
        model=ScriptedModel.of(*calls, "all six read"),
        tools=[_read],
        context=context,
        store=store,
        system_prompt="Hi.",
    )
    assert (await agent.run("read them")).ok
    return await Session.load(store, agent.session.id)


def _reproduced(stored: Session, sim: object) -> None:
    (run,) = stored.runs
    assert run.compactions, "the run compacted"
    assert [c.tokens for c in sim.calls] == measured(run)  # type: ignore[attr-defined]
    assert [_pass(p) for p in sim.passes] == [  # type: ignore[attr-defined]
        _pass(p) for p in run.compactions
    ]
    assert sim.differences == ()  # type: ignore[attr-defined]


def _named(stored: Session, sim: object) -> None:
    """The passes name the same compactor as the log."""
    assert [p.strategy for p in sim.passes] == [  # type: ignore[attr-defined]
        p.strategy for p in stored.runs[0].compactions
    ]


@pytest.mark.anyio
async def test_the_demos_run_opens_with_its_context_settings() -> None:
    store = MemoryStore()
    agent = build_demo_agent(io.StringIO(), store=store)
    assert (await agent.run(TASK)).ok
    (run,) = (await Session.load(store, agent.session.id)).runs
    assert run.opened.context == ContextSettings(
        strategy="truncating",
        strategy_kind="shipped",
        strategy_settings={
            "preserve_recent": 2,
            "min_messages": 3,
            "compact_newest_exchange": True,
        },
        window=8_000,
        threshold=80,
        threshold_tokens=None,
        auto_compact=True,
        target="threshold",
        target_pct=70,
        counter="ConservativeTokenCounter",
        counter_settings={"message_tokens": 4, "image_tokens": 1_600},
        max_messages=50,
        max_failures=3,
        use_reported_usage=False,
        calibrate=False,
        pins={"system_prompt": True, "first_user": True, "latest_user": True},
    )


@pytest.mark.anyio
@pytest.mark.parametrize("strategy", STRATEGIES)
async def test_the_demo_simulated_with_no_settings_reproduces_its_figures(
    strategy: str,
) -> None:
    store = MemoryStore()
    agent = build_demo_agent(io.StringIO(), store=store, strategy=strategy)
    assert (await agent.run(TASK)).ok
    stored = await Session.load(store, agent.session.id)
    sim = await simulate(stored)  # no context: the one the log keeps
    _reproduced(stored, sim)
    _named(stored, sim)
    assert sim.caveats == CAVEATS  # nothing stood in for a setting
    assert stored_context(stored).compactor == agent.driver.context.compactor  # type: ignore[union-attr]


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("compactor", "strategy", "kind", "settings"),
    [
        (user_compactor.mine, "tests.simulate.user_compactor:mine", "import", {}),
        (
            user_compactor.Keep(recent=2),
            "tests.simulate.user_compactor:Keep",
            "import",
            {"recent": 2},
        ),
        (
            TruncatingCompactor(preserve_recent=2, min_messages=3),
            "truncating",
            "shipped",
            {"preserve_recent": 2, "min_messages": 3, "compact_newest_exchange": False},
        ),
    ],
    ids=["module-level instance", "importable attrs class", "shipped"],
)
async def test_a_compactor_that_can_be_made_again_is_named_so_and_reproduces(
    compactor: ContextCompactor,
    strategy: str,
    kind: str,
    settings: dict[str, object],
) -> None:
    context = ContextManager(
        compactor,
        context_window=2_000,
        threshold=60,
        compact_target=CompactBase.CONTEXT,
        compact_target_pct=40,
        counter=HeuristicTokenCounter(),
        max_messages=0,
    )
    stored = await _run(context)
    recorded = stored.runs[0].opened.context
    assert recorded is not None
    assert (recorded.strategy, recorded.strategy_kind) == (strategy, kind)
    assert dict(recorded.strategy_settings) == settings
    assert (recorded.target, recorded.target_pct) == ("context", 40)
    assert recorded.counter == "HeuristicTokenCounter"
    again = stored_context(stored)
    assert isinstance(again.counter, HeuristicTokenCounter)
    assert (again.window, again.threshold, again.max_messages) == (2_000, 60, 0)
    assert again.compact_target is CompactBase.CONTEXT
    sim = await simulate(stored)
    _reproduced(stored, sim)
    _named(stored, sim)
    assert sim.caveats == CAVEATS


@pytest.mark.anyio
async def test_a_compactor_known_only_by_its_class_name_must_be_given() -> None:
    class Local(user_compactor.KeepRecent):
        """Defined in a function: it cannot be imported again."""

    context = ContextManager(Local(), context_window=3_000, threshold=60)
    stored = await _run(context)
    recorded = stored.runs[0].opened.context
    assert recorded is not None
    assert (recorded.strategy, recorded.strategy_kind) == ("Local", "class")
    with pytest.raises(ConfigError) as caught:
        await simulate(stored)
    assert (caught.value.field, caught.value.value) == ("compactor", "Local")
    assert "--compactor MODULE:ATTR" in str(caught.value)
    # Given one (the same shrinking), the rest of the recorded settings hold.
    given = stored_context(stored, compactor=user_compactor.mine)
    assert (given.window, given.threshold) == (3_000, 60)
    _reproduced(stored, await simulate(stored, context=given))


@pytest.mark.anyio
async def test_a_compactor_the_log_names_by_module_that_is_not_there_says_so(
    tmp_path: Path,
) -> None:
    # Simulated from another directory (its module not importable), it was
    # refused saying "the log names only its class", though the log names
    # MODULE:ATTR; now the message names it and what to do.
    stored = await _run(ContextManager(user_compactor.mine, context_window=3_000))

    def moved(data: dict[str, Any]) -> None:
        data["context"]["strategy"] = "gone_away_module:mine"

    elsewhere = await load_session(_edited_log(stored, tmp_path / "log.jsonl", moved))
    with pytest.raises(ConfigError) as caught:
        await simulate(elsewhere)
    assert (caught.value.field, caught.value.value) == (
        "compactor",
        "gone_away_module:mine",
    )
    message = str(caught.value)
    assert "only its class" not in message
    assert "gone_away_module:mine, which cannot be imported here" in message
    assert "PYTHONPATH" in message


def _edited_log(
    stored: Session, path: Path, edit: Callable[[dict[str, Any]], object]
) -> str:
    """`stored`'s log as JSON lines, the data of each `RunOpened` changed by `edit`."""
    dump_session(stored, str(path))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for line in lines:
        if line.get("type") == "RunOpened":
            edit(line["data"])
    # Edited by one who knows the format: the digests are made again.
    return "".join(line + "\n" for line in restamp(list(map(json.dumps, lines))))


def _without_settings(stored: Session, path: Path) -> str:
    """`stored`'s log as written before runs kept their context settings."""

    def drop(data: dict[str, Any]) -> None:
        assert data.pop("context")["strategy"] == "truncating"

    return _edited_log(stored, path, drop)


@pytest.mark.anyio
async def test_a_log_written_before_the_settings_were_kept_still_loads(
    tmp_path: Path,
) -> None:
    stored = await _run(
        ContextManager(
            TruncatingCompactor(
                preserve_recent=2, min_messages=3, compact_newest_exchange=True
            ),
            context_window=3_000,
            threshold=60,
        )
    )
    old = await load_session(_without_settings(stored, tmp_path / "log.jsonl"))
    assert old.runs[0].opened.context is None
    sim = await simulate(old)
    assert any("TruncatingCompactor with its defaults" in c for c in sim.caveats)
    assert stored_context(old).window == 3_000


@pytest.mark.anyio
async def test_the_settings_survive_the_sqlite_store(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    context = ContextManager(user_compactor.Keep(recent=2), context_window=3_000)
    agent = Agent(model=ScriptedModel.of("hi"), context=context, store=store)
    assert (await agent.run("hello")).ok
    loaded = await Session.load(store, agent.session.id)
    await store.aclose()
    recorded = loaded.runs[0].opened.context
    assert recorded is not None
    assert recorded == agent.session.runs[0].opened.context
    assert recorded.strategy == "tests.simulate.user_compactor:Keep"


# The settings a `ContextSettings` needs, all valid.
GOOD_SETTINGS: dict[str, object] = {
    "strategy": "truncating",
    "strategy_kind": "shipped",
    "window": 8_000,
    "threshold": 80,
    "counter": "ConservativeTokenCounter",
}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("strategy", ""),
        ("strategy_kind", "guessed"),
        ("strategy_settings", {"a": object()}),
        ("window", -1),
        ("threshold", 101),
        ("target", "half"),
        ("counter", 3),
        ("pins", {"first_user": object()}),
    ],
)
def test_bad_settings_are_refused_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError) as caught:
        ContextSettings(**{**GOOD_SETTINGS, field: value})  # type: ignore[arg-type]
    assert caught.value.field.startswith(field)


@pytest.mark.anyio
async def test_the_pin_rules_are_kept_and_simulated_again() -> None:
    rules = PinRules(first_user=False, latest_user=False)
    context = ContextManager(
        TruncatingCompactor(
            preserve_recent=2, min_messages=3, compact_newest_exchange=True
        ),
        context_window=3_000,
        threshold=60,
        pins=rules,
    )
    stored = await _run(context)
    recorded = stored.runs[0].opened.context
    assert recorded is not None
    assert dict(recorded.pins) == {
        "system_prompt": True,
        "first_user": False,
        "latest_user": False,
    }
    assert stored_context(stored).pins == rules
    _reproduced(stored, await simulate(stored))


@pytest.mark.anyio
async def test_pin_rules_this_version_does_not_know_are_refused(
    tmp_path: Path,
) -> None:
    stored = await _run(ContextManager(user_compactor.mine, context_window=3_000))

    def add_a_rule(data: dict[str, Any]) -> None:
        data["context"]["pins"]["every_tool_result"] = True

    edited = await load_session(_edited_log(stored, tmp_path / "log.jsonl", add_a_rule))
    with pytest.raises(ConfigError) as caught:
        stored_context(edited)
    assert caught.value.field == "session"
    assert "every_tool_result" in str(caught.value)


@pytest.mark.parametrize(
    ("pins", "expected"),
    [
        ({"every_tool_result": True}, "pin rules among first_user, latest_user"),
        ({"first_user": "yes"}, "pin rules that are bools"),
    ],
)
def test_pin_rules_are_made_again_or_refused_naming_the_field(
    pins: dict[str, object], expected: str
) -> None:
    assert pin_rules(None) == PinRules()
    off = ContextSettings(**GOOD_SETTINGS, pins={"latest_user": False})  # type: ignore[arg-type]
    assert pin_rules(off) == PinRules(latest_user=False)
    settings = ContextSettings(**GOOD_SETTINGS, pins=pins)  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as caught:
        pin_rules(settings)
    assert caught.value.field == "pins"
    assert expected in str(caught.value)


@pytest.mark.anyio
async def test_a_strategy_changed_between_runs_is_logged_as_it_is_at_each_start() -> (
    None
):
    # One manager opens every run of an agent; a mutable strategy may change
    # in between, and each run's log keeps the settings it opened with.
    compactor = user_compactor.Tunable(keep=2)
    store = MemoryStore()
    agent = Agent(
        model=ScriptedModel.of("one", "two", "three"),
        context=ContextManager(compactor, context_window=3_000, threshold=60),
        store=store,
    )
    assert (await agent.run("first")).ok
    compactor.keep = 5
    assert (await agent.run("second")).ok
    assert (await agent.run("third")).ok

    stored = await Session.load(store, agent.session.id)
    kept = [run.opened.context for run in stored.runs]
    assert [dict(c.strategy_settings) for c in kept if c is not None] == [
        {"keep": 2},
        {"keep": 5},
        {"keep": 5},
    ]
    assert kept[1] is not None
    assert kept[1].strategy == "tests.simulate.user_compactor:Tunable"


async def _one_run() -> Session:
    """A stored session of one run: a reply, no pass."""
    store = MemoryStore()
    agent = Agent(model=ScriptedModel.of("hi"), store=store)
    assert (await agent.run("hello")).ok
    return await Session.load(store, agent.session.id)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("compactor", "words"),
    [
        (5, "a ContextCompactor"),
        (0, "a ContextCompactor"),  # was taken as "none given"
        (TruncatingCompactor, "an instance, TruncatingCompactor(), not the class"),
        ("truncating", "compactor=strategy_named('truncating')"),
    ],
    ids=["int", "falsy", "class", "strategy-name"],
)
async def test_a_bad_compactor_given_is_refused_as_the_callers(
    compactor: object, words: str
) -> None:
    # It was refused as the stored log's fault: "invalid session=ContextSettings(...)".
    stored = await _one_run()
    with pytest.raises(ConfigError) as caught:
        stored_context(stored, compactor=compactor)  # type: ignore[arg-type]
    assert (caught.value.field, caught.value.value) == ("compactor", compactor)
    assert words in str(caught.value)


@pytest.mark.parametrize(
    ("session", "words"),
    [
        ("ses_1", "session=await Session.load(store, 'ses_1')"),
        (None, "a stored Session"),
        (5, "a stored Session"),
    ],
    ids=["id", "none", "int"],
)
def test_what_is_not_a_session_is_refused_naming_it(
    session: object, words: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        stored_context(session)  # type: ignore[arg-type]
    assert (caught.value.field, caught.value.value) == ("session", session)
    assert words in str(caught.value)


@pytest.mark.anyio
async def test_a_run_id_that_is_not_an_id_is_refused_naming_it() -> None:
    stored = await _one_run()
    with pytest.raises(ConfigError) as caught:
        stored_context(stored, run_id=[])  # type: ignore[arg-type]
    assert (caught.value.field, caught.value.value) == ("run_id", [])


@pytest.mark.anyio
async def test_a_run_whose_answers_its_output_type_refused_reproduces() -> None:
    # The output type is not kept: every reply was taken, the run ended done
    # in the simulation after one call, where the log failed after three.
    @attrs.define
    class City:
        name: str
        population: int

    store = MemoryStore()
    agent = Agent(
        model=ScriptedModel.of("not json", "still not json", "nope"),
        store=store,
        output_type=City,
    )
    assert (await agent.run("city?")).outcome == "failed"
    stored = await Session.load(store, agent.session.id)
    sim = await simulate(stored)
    assert sim.differences == ()
    assert len(sim.calls) == 3


@pytest.mark.anyio
async def test_a_run_the_provider_refused_as_too_long_reproduces() -> None:
    # The refusal was not given again: the simulation made no pass where the
    # log made one, and a run that stalled on it failed for a missing reply.
    store = MemoryStore()
    history = [
        Message.user(f"note {i}: " + "word " * 20)
        if i % 2 == 0
        else Message.assistant(f"ok {i}")
        for i in range(12)
    ]
    agent = Agent(
        model=ScriptedModel.of(
            ProviderError("prompt is too long", kind=CONTEXT_OVERFLOW), "fits now"
        ),
        store=store,
    )
    assert (await agent.run([*history, Message.user("and now?")])).text == "fits now"
    stored = await Session.load(store, agent.session.id)
    assert [c.reason for c in stored.runs[0].compactions] == ["overflow"]
    sim = await simulate(stored)
    assert sim.differences == ()
    assert [p.reason for p in sim.passes] == ["overflow"]


@pytest.mark.anyio
async def test_a_run_whose_reply_was_over_the_window_reproduces() -> None:
    # The log does not keep the refused reply: the simulation asked for a
    # reply it did not have, and failed where the log's run stalled.
    store = MemoryStore()
    history = [
        Message.user(f"note {i}: " + "word " * 10)
        if i % 2 == 0
        else Message.assistant(f"ok {i}")
        for i in range(40)
    ]
    agent = Agent(
        model=ScriptedModel.of("word " * 1_500, "fits now"),
        store=store,
        context=ContextManager(context_window=2_500),
    )
    await agent.run([*history, Message.user("and now?")])
    stored = await Session.load(store, agent.session.id)
    sim = await simulate(stored)
    assert sim.differences == ()
    assert [p.reason for p in sim.passes] == [
        c.reason for c in stored.runs[0].compactions
    ]
