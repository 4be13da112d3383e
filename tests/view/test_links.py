"""What the page links and marks: the diagram's edges, pinned messages, the originals.

Each fired edge of a run's diagram links to the first step that went along
it; each turn's context marks the messages the run's pin rules (and hand
pins) keep; a pass's replacement links to the originals it names, and the
pass says what it cost by the prompt cache.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from tests.view.dom import Node, parse
from turnfsm import Agent
from turnfsm.cli import main
from turnfsm.context import ContextManager, PinRules, SummarizingCompactor
from turnfsm.messages import Message
from turnfsm.persistence import MemoryStore, Session
from turnfsm.testing import FakeModelClient, ScriptedModel, reply, tool_call
from turnfsm.tokens import HeuristicTokenCounter
from turnfsm.view import render_report

from .test_view import _demo


def _report(session: Session) -> Node:
    return parse(render_report(session, turns=None))


def test_each_fired_edge_links_to_the_first_step_along_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "s.db"
    session_id = _demo(db, capsys)
    assert main(["report", session_id, "-o", "run.html", "--store", str(db)]) == 0
    doc = parse(Path("run.html").read_text())
    diagram = doc.find("section", "diagram")
    targets = {
        a.attrs["xlink:href"]
        for a in diagram.find("div", "svg").find_all("a")
        if "xlink:href" in a.attrs
    }
    steps = diagram.find("ol", "path").find_all("li")
    # One link per edge the run went along, and only those.
    edges = {li.attrs["data-edge"] for li in steps}
    assert len(targets) == len(edges) == 8
    for target in targets:
        anchor = target.removeprefix("#")
        (step,) = [li for li in steps if li.attrs.get("id") == anchor]
        along = [li for li in steps if li.attrs["data-edge"] == step.attrs["data-edge"]]
        assert along[0] is step  # the first step along that edge
    # The step fired most: start --measured--> call_llm, once per model call.
    measured = [li for li in steps if li.text().startswith("start \u2014measured")]
    measured = [
        li
        for li in measured
        if li.text().endswith("call_llm") or "call_llm (" in li.text()
    ]
    assert len({li.attrs["data-edge"] for li in measured}) == 1
    assert len(measured) == 6


def _pinned_run(rules: PinRules) -> Session:
    model = ScriptedModel.of(reply("", tool_call("note", "c1", text="x")), "ok, noted")

    def note(text: str) -> str:
        """Take a note.

        Args:
            text: the note.
        """
        return "noted"

    store = MemoryStore()
    agent = Agent(
        model=model,
        tools=[note],
        store=store,
        system_prompt="Be brief.",
        context=ContextManager(context_window=8_000, pins=rules),
    )
    messages = [
        Message.user("the task: keep notes"),
        Message.assistant("will do").pin(),
        Message.user("take a note"),
    ]
    assert anyio.run(agent.run, messages).ok
    return anyio.run(Session.load, store, agent.session.id)


def _pinned_texts(doc: Node, turn: int) -> list[str]:
    context = doc.find("details", "turn").find("div", "context")
    if turn:
        context = doc.find_all("details", "turn")[turn].find("div", "context")
    return [m.find("pre", "text").text() for m in context.find_all("div", "pinned")]


def test_a_turn_s_context_marks_what_the_run_s_pin_rules_keep() -> None:
    doc = _report(_pinned_run(PinRules()))
    # The system prompt is sent apart from the messages; the first and the
    # latest user message are pinned by the rules, the reply by hand.
    assert _pinned_texts(doc, 0) == [
        "the task: keep notes",
        "will do",
        "take a note",
    ]
    # The call in flight and its result pair with no pinned message: not pinned.
    assert len(doc.find_all("details", "turn")[1].find_all("div", "msg")) == 6


def test_with_the_rules_off_only_hand_pins_are_marked() -> None:
    rules = PinRules(system_prompt=False, first_user=False, latest_user=False)
    doc = _report(_pinned_run(rules))
    assert _pinned_texts(doc, 0) == ["will do"]
    assert _pinned_texts(doc, 1) == ["will do"]
    marks = doc.find_all("span", "pin")
    assert [m.text() for m in marks] == ["pinned", "pinned"]


def read(path: str) -> str:
    """Read a file.

    Args:
        path: the file.
    """
    return f"contents of {path}\n" + "a line of the file\n" * 120


def _summarized() -> Session:
    """Four runs, one file read each: a later one summarizes the earlier ones."""
    script = []
    for i in range(4):
        script += [reply("", tool_call("read", f"c{i}", path=f"f{i}.py")), f"read f{i}"]
    summaries = FakeModelClient(lambda _r: "## Active Task\nRead the files.")
    store = MemoryStore()
    agent = Agent(
        model=ScriptedModel.of(*script),
        tools=[read],
        store=store,
        context=ContextManager(
            SummarizingCompactor(model=summaries, keep_recent_turns=1),
            context_window=3_000,
            threshold=60,
            counter=HeuristicTokenCounter(),
            prices="claude-sonnet-4-5",
        ),
    )
    for i in range(4):
        assert anyio.run(agent.run, f"read f{i}.py").ok
    return anyio.run(Session.load, store, agent.session.id)


def test_a_summary_links_to_the_originals_it_replaced_and_the_pass_says_its_cost() -> (
    None
):
    session = _summarized()
    runs = [r for r in session.runs if r.compactions]
    assert runs
    run = runs[0]
    assert run.compactions[0].verdict.value == "compacted"
    doc = _report(session)
    first = doc.find("details", "pass")
    linked = first.find("p", "replaces").find_all("a")
    before = first.find("div", "before")
    removed = {m.attrs["id"] for m in before.find_all("div", "removed")}
    assert linked
    assert {a.attrs["href"].removeprefix("#") for a in linked} <= removed
    # Each link goes to the original, as the log keeps it.
    record = run.compactions[0]
    for a in linked:
        message_id = a.text()
        assert message_id in record.covers
        assert message_id not in record.replacement
    cost = first.find("p", "cost").text()
    assert cost.startswith("By the prompt cache: invalidates ")
    assert "$" in cost
