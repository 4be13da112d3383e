"""`turnfsm report` and `turnfsm view`: a session's runs, paths, turns and passes.

The report is one self-contained page; the live view serves the same behind
a token (403 without it) and answers a paused run from the page. Every text
from the log is escaped: a tool result holding a script is shown as text.
"""

from __future__ import annotations

import io
import re
import socket
import sqlite3
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from importlib import resources
from pathlib import Path

import anyio
import pytest

from tests.cli import approval_agent
from tests.view.dom import Node, parse
from turnfsm import Agent
from turnfsm.cli import main
from turnfsm.cli._run import AgentOptions
from turnfsm.cli._view import run_view
from turnfsm.context import (
    CompactionContext,
    CompactionProposal,
    ContextManager,
    TruncatingCompactor,
)
from turnfsm.errors import ConfigError, ProviderError
from turnfsm.messages import ImagePart, Message, Role, TextPart
from turnfsm.persistence import MemoryStore, RunEnded, Session, SQLiteStore
from turnfsm.providers import ModelRequest
from turnfsm.testing import FakeModelClient, ScriptedModel, reply, tool_call
from turnfsm.tokens import HeuristicTokenCounter
from turnfsm.view import ViewServer, render_report

Capture = pytest.CaptureFixture[str]
CAREFUL = "tests.cli.approval_agent:careful"
HOSTILE = '</pre><script>alert("owned")</script><img src=x onerror=alert(1)>'


@pytest.fixture(autouse=True)
def _fresh_effects() -> Iterator[None]:
    approval_agent.DELETED.clear()
    yield
    approval_agent.DELETED.clear()


def _demo(db: Path, capsys: Capture) -> str:
    assert main(["demo", "--store", str(db)]) == 0
    found = re.search(r"session (ses_\w+) stored", capsys.readouterr().out)
    assert found is not None
    return found.group(1)


def _load(db: Path, session_id: str) -> Session:
    async def load() -> Session:
        async with SQLiteStore(db) as store:
            return await Session.load(store, session_id)

    return anyio.run(load)


def shout(text: str) -> str:
    """Say something back.

    Args:
        text: what to say.
    """
    return HOSTILE


def _hostile(db: Path) -> str:
    """A session whose task, tool call, tool result and answer hold markup."""

    def plan(request: ModelRequest) -> Message:
        if any(m.tool_results for m in request.messages):
            return reply(HOSTILE)
        return reply("", tool_call("shout", "c1", text=HOSTILE))

    async def run() -> str:
        async with SQLiteStore(db) as store:
            agent = Agent(model=FakeModelClient(plan), tools=[shout], store=store)
            return (await agent.run(HOSTILE)).session_id

    return anyio.run(run)


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _post(url: str, form: dict[str, str]) -> tuple[int, str]:
    data = urllib.parse.urlencode(form).encode()

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: object, **kwargs: object) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(url, data=data, timeout=60) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Location") or exc.read().decode()


def _scripts_are_only_the_view_s_own(doc: Node) -> None:
    own = resources.files("turnfsm.view").joinpath("view.js").read_text()
    scripts = doc.find_all("script")
    assert [s.text() for s in scripts] == [own]
    assert not doc.find_all("img")
    assert not [n for n in doc.walk() if any(a.startswith("on") for a in n.attrs)]


# -- escaping -----------------------------------------------------------


def test_a_tool_result_holding_a_script_is_shown_as_text(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    session = _load(db, _hostile(db))
    doc = parse(render_report(session))
    _scripts_are_only_the_view_s_own(doc)
    results = [n for n in doc.find_all("div", "result") if HOSTILE in n.text()]
    assert results, "the tool result is on the page, as text"
    assert HOSTILE in doc.find("pre", "answer").text()  # the final answer too
    task = [m for m in doc.find_all("div", "user") if HOSTILE in m.text()]
    assert task


def test_an_image_a_message_held_is_shown_by_its_url_as_text(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    url = "https://example.com/receipt.png?<b>x</b>"

    async def run() -> str:
        async with SQLiteStore(db) as store:
            agent = Agent(model=FakeModelClient(lambda _r: "A receipt."), store=store)
            photo = Message(
                role=Role.USER,
                parts=(TextPart(text="What is this?"), ImagePart(url=url)),
            )
            return (await agent.run([photo])).session_id

    doc = parse(render_report(_load(db, anyio.run(run))))
    _scripts_are_only_the_view_s_own(doc)
    (asked,) = {m.text() for m in doc.find_all("div", "user") if "What is" in m.text()}
    assert f"image {url}" in asked


def test_the_live_page_escapes_what_it_loads_on_demand(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    session_id = _hostile(db)
    with ViewServer(lambda: SQLiteStore(db), session_id) as server:
        status, page = _get(server.url)
        assert status == 200
        _scripts_are_only_the_view_s_own(parse(page))
        status, fragment = _get(server.turn_url(0, 1))
    assert status == 200
    doc = parse(fragment)
    assert not doc.find_all("script")
    assert not doc.find_all("img")
    assert any(HOSTILE in n.text() for n in doc.find_all("div", "result"))


# -- the report of the demo's session -------------------------------------


def test_the_demo_s_report_holds_the_path_the_plot_and_a_pass_diff(
    tmp_path: Path, capsys: Capture
) -> None:
    db = tmp_path / "s.db"
    session_id = _demo(db, capsys)
    assert main(["report", session_id, "-o", "run.html", "--store", str(db)]) == 0
    out = capsys.readouterr().out
    assert out == (
        f"wrote run.html (session {session_id}: 1 run(s), 6 turn(s), 2 pass(es))\n"
    )
    doc = parse(Path("run.html").read_text())
    _check_report(doc)
    assert not doc.find_all("link")  # nothing fetched: style and script inline
    assert len(doc.find_all("details", "turn")) == 6
    assert doc.find("pre", "answer").text().startswith("Audit done")


def test_a_report_to_dash_goes_to_standard_output_as_an_export_does(
    tmp_path: Path, capsys: Capture
) -> None:
    # `-o -` wrote a file named `-`.
    db = tmp_path / "s.db"
    session_id = _demo(db, capsys)
    assert main(["report", session_id, "-o", "-", "--store", str(db)]) == 0
    said = capsys.readouterr()
    assert not Path("-").exists()
    _check_report(parse(said.out))
    assert said.err == (
        f"wrote the report to standard output (session {session_id}: 1 run(s), "
        "6 turn(s), 2 pass(es))\n"
    )


def _check_report(doc: Node) -> None:
    """The path (drawn and listed), the plot with its lines, a pass's diff."""
    diagram = doc.find("section", "diagram")
    assert diagram.find_all("svg") or diagram.find_all("pre", "mermaid-text")
    steps = [li.text() for li in diagram.find("ol", "path").find_all("li")]
    assert steps[0].startswith("start")
    assert any("compact" in s and "compaction_result" in s for s in steps)
    assert steps[-1].startswith("call_llm \u2014model_replied\u2192 done")
    # Each reply's step links to its turn, each pass's end to the pass.
    links = [a.attrs["href"] for a in diagram.find("ol", "path").find_all("a")]
    assert links == [
        *(f"#turn-0-{k}" for k in range(4)),
        "#pass-0-0",
        "#turn-0-4",
        "#pass-0-1",
        "#turn-0-5",
    ]
    plot = doc.find("svg", "plot")
    limits = {c for n in plot.find_all("line", "limit") for c in n.classes}
    assert {"window", "threshold", "emergency"} <= limits
    assert plot.find_all("polyline", "estimate")
    assert plot.find_all("polyline", "reported")
    reasons = [n.classes for n in plot.find_all("line", "pass")]
    assert [r - {"pass"} for r in reasons] == [{"threshold_exceeded"}, {"emergency"}]
    first = doc.find("details", "pass")
    assert "compacted" in first.find("summary").text()
    assert "6911 \u2192 1900 tokens" in first.find("summary").text()
    before, after = first.find("div", "before"), first.find("div", "after")
    assert before.find_all("div", "removed")
    assert before.find_all("div", "kept")
    assert len(after.find_all("div", "msg")) < len(before.find_all("div", "msg"))


def test_a_log_changed_after_it_was_written_is_said_not_to_replay(
    tmp_path: Path, capsys: Capture
) -> None:
    """A run whose log says another final answer than its replies made: the
    report and the live page say where its replay stops, as `turnfsm replay`
    and `turnfsm diagram --run` do, rather than draw it as a sound run."""
    db = tmp_path / "s.db"
    sid = _hostile(db)
    with sqlite3.connect(db) as raw:
        raw.execute(
            'UPDATE turnfsm_entries SET body = replace(body, \'"outcome":'
            '"done"\', \'"outcome":"failed"\') WHERE kind = \'RunEnded\''
        )
    assert main(["replay", "--session", sid, "--store", str(db)]) == 1
    said = capsys.readouterr().out
    assert "changed or damaged" in said
    report = render_report(_load(db, sid))
    assert "the replay stopped" in report
    assert "changed or damaged" in report
    with ViewServer(lambda: SQLiteStore(db), sid) as server:
        status, text = _get(server.url.replace("/?", "/path?r=0&"))
    assert status == 200
    assert "the replay stopped" in text
    assert "changed or damaged" in text


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["report", "ses_nope", "-o", "run.html"], "no session 'ses_nope'"),
        (
            ["report", "ses_x", "-o", "run.html", "--store", "nope://x"],
            "store='nope://x'",
        ),
        (["report", "ses_x", "-o", "run.html", "--turns", "0"], "--turns='0'"),
        (["report", "ses_x", "-o", "run.html", "--turns", "-3"], "--turns='-3'"),
        (["report", "ses_x", "-o", "run.html", "--turns", "many"], "--turns='many'"),
    ],
)
def test_a_report_that_cannot_be_made_writes_nothing(
    argv: list[str], expected: str, capsys: Capture
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("turnfsm report: ")
    assert expected in err
    assert not Path("run.html").exists()


# -- a long session's report ------------------------------------------------


def read(path: str) -> str:
    """Read a file.

    Args:
        path: the file.
    """
    return f"contents of {path}: " + "lorem ipsum " * 40


def _long(db: Path, turns: int) -> str:
    """A session of one run of `turns` model calls that compacts every few."""

    def plan(request: ModelRequest) -> Message:
        calls.append(request)
        if len(calls) >= turns:
            return reply("done")
        return reply("", tool_call("read", path=f"f{len(calls)}.py"))

    calls: list[ModelRequest] = []

    async def run() -> str:
        async with SQLiteStore(db) as store:
            agent = Agent(
                model=FakeModelClient(plan),
                tools=[read],
                store=store,
                context=ContextManager(
                    TruncatingCompactor(
                        preserve_recent=2, min_messages=3, compact_newest_exchange=True
                    ),
                    context_window=8_000,
                ),
                max_turns=turns + 5,
            )
            return (await agent.run("read every file")).session_id

    return anyio.run(run)


def _ids(doc: Node, tag: str, kind: str) -> list[str]:
    return [n.attrs["id"] for n in doc.find_all(tag, kind)]


def test_a_report_holds_the_last_turns_and_their_passes_and_says_what_it_left_out(
    tmp_path: Path,
) -> None:
    db = tmp_path / "s.db"
    session = _load(db, _long(db, 80))
    (run,) = session.runs
    assert len(run.turns) == 80
    first = 40
    kept = [k for k, r in enumerate(run.compactions) if r.turn >= first]
    assert 0 < len(kept) < len(run.compactions)  # passes before and after

    page = render_report(session, turns=40)
    doc = parse(page)
    assert _ids(doc, "details", "turn") == [f"turn-0-{i}" for i in range(first, 80)]
    # No link in the page points at a turn or a pass it left out.
    targets = set(re.findall(r'href="#([^"]+)"', page))
    assert any(t.startswith("turn-") for t in targets)
    assert targets <= set(re.findall(r'id="([^"]+)"', page))
    assert _ids(doc, "details", "pass") == [f"pass-0-{k}" for k in kept]
    notes = [n.text() for n in doc.find_all("p", "left-out")]
    left = len(run.compactions) - len(kept)
    assert notes[0].startswith(
        f"This report holds the last {len(kept)} of {len(run.compactions)} "
        f"passes: the first {left} are left out"
    )
    assert notes[1].startswith(
        "This report holds the last 40 of 80 turns: the first 40 are left out"
    )
    # The plot still marks every pass; only those held link to their diff.
    plot = doc.find("svg", "plot")
    assert len(plot.find_all("line", "pass")) == len(run.compactions)
    assert [a.attrs["href"] for a in plot.find_all("a")] == [
        f"#pass-0-{k}" for k in kept
    ]
    # The turns it holds are what the whole report holds for them.
    whole = parse(render_report(session, turns=None))
    assert not whole.find_all("p", "left-out")
    assert _ids(whole, "details", "turn") == [f"turn-0-{i}" for i in range(80)]
    theirs = {n.attrs["id"]: n.text() for n in whole.find_all("details", "turn")}
    for node in doc.find_all("details", "turn"):
        assert node.text() == theirs[node.attrs["id"]]


def test_a_report_of_a_short_session_holds_everything_and_says_nothing_left_out(
    tmp_path: Path,
) -> None:
    db = tmp_path / "s.db"
    session = _load(db, _long(db, 12))
    assert render_report(session) == render_report(session, turns=None)
    assert "left-out" not in render_report(session, turns=12)


def dump(n: int) -> str:
    """Dump a table.

    Args:
        n: which one.
    """
    return ("x" * 99 + "\n") * 3_000 if n == 0 else f"table {n}"


def test_a_large_message_in_every_context_is_written_once_in_a_report(
    tmp_path: Path,
) -> None:
    """A 300 KB tool result that stays in the context of 20 turns made a 6 MB
    report (it was written out again in every turn's context): the turns then
    show what each added, as a long session's report does."""

    def plan(request: ModelRequest) -> Message:
        done = sum(1 for m in request.messages if m.tool_results)
        if done < 20:
            return reply("", tool_call("dump", f"c{done}", n=done))
        return reply("done")

    async def run() -> Session:
        agent = Agent(
            model=FakeModelClient(plan),
            tools=[dump],
            context=ContextManager(context_window=2_000_000),
        )
        result = await agent.run("dump them")
        assert result.outcome == "done", result.error
        assert not agent.session.runs[0].compactions
        return agent.session

    report = render_report(anyio.run(run))
    assert len(report) < 1_000_000
    assert "then 2 more" in report


@pytest.mark.parametrize("turns", [0, -1, True, 2.5, "10"])
def test_render_report_refuses_a_turn_count_that_is_no_count(turns: object) -> None:
    with pytest.raises(ConfigError) as caught:
        render_report(Session(), turns=turns)  # type: ignore[arg-type]
    assert "turns=" in str(caught.value)


@pytest.mark.parametrize(
    ("given", "field"),
    [
        ({"session": "ses_x"}, "session"),
        ({"where": None}, "where"),
        ({"where": 5}, "where"),
        ({"sub_agents": "ses_x"}, "sub_agents"),
        ({"sub_agents": ["ses_x"]}, "sub_agents[0]"),
    ],
)
def test_render_report_refuses_what_is_no_session_or_no_place(
    given: dict[str, object], field: str
) -> None:
    """A session's id given for the session, or a store's name that is no
    text: a typed error naming it, not an AttributeError from inside, or a
    page saying it is stored "in None"."""
    arguments: dict[str, object] = {"session": Session(), **given}
    with pytest.raises(ConfigError) as caught:
        render_report(**arguments)  # type: ignore[arg-type]
    assert caught.value.field == field


def test_turnfsm_report_says_how_many_turns_and_passes_it_left_out(
    tmp_path: Path, capsys: Capture
) -> None:
    db = tmp_path / "s.db"
    session_id = _long(db, 80)
    (run,) = _load(db, session_id).runs
    left = sum(1 for r in run.compactions if r.turn < 40)
    assert left
    argv = ["report", session_id, "-o", "run.html", "--store", str(db)]
    assert main([*argv, "--turns", "40"]) == 0
    assert capsys.readouterr().out == (
        f"wrote run.html (session {session_id}: 1 run(s), 80 turn(s), "
        f"{len(run.compactions)} pass(es)); it holds each run's last 40 turns and "
        f"their passes: 40 turn(s) and {left} pass(es) left out (--turns all keeps "
        "every one)\n"
    )
    assert len(parse(Path("run.html").read_text()).find_all("details", "turn")) == 40
    assert main([*argv, "--turns", "all"]) == 0
    assert capsys.readouterr().out == (
        f"wrote run.html (session {session_id}: 1 run(s), 80 turn(s), "
        f"{len(run.compactions)} pass(es))\n"
    )
    assert len(parse(Path("run.html").read_text()).find_all("details", "turn")) == 80


# -- the live page ------------------------------------------------------------


def test_the_live_page_serves_with_its_token_and_refuses_without(
    tmp_path: Path, capsys: Capture
) -> None:
    db = tmp_path / "s.db"
    session_id = _demo(db, capsys)
    with ViewServer(lambda: SQLiteStore(db), session_id, page_size=2) as server:
        assert server.url.startswith("http://127.0.0.1:")
        status, page = _get(server.url)
        assert status == 200
        doc = parse(page)
        _check_live(doc)
        base = server.url.split("?")[0]
        for url in (
            base,
            base + "?token=wrong",
            base + "turn?r=0&n=0",
            server.turn_url(0, 0).replace(server.token, server.token[:-1]),
        ):
            assert _get(url)[0] == 403, url
        assert _post(base + "answer", {"action": "approve", "run": "r"})[0] == 403
        # With its token: this server answers no run; a huge form is refused.
        own = {"token": server.token, "action": "approve", "run": "r"}
        assert _post(base + "answer", own) == (403, "this page cannot answer runs")
        assert _post(base + "answer", {**own, "run": "r" * 5_000})[0] == 413
        status, fragment = _get(server.turn_url(0, 5))
        assert status == 200
        assert "Audit done" in parse(fragment).find("div", "reply").text()
        more = parse(page).find("button", "more").attrs["data-src"]
        status, rows = _get(more)
        assert status == 200
        assert len(parse(rows).find_all("details", "turn")) == 2
        assert _get(server.turn_url(0, 6))[0] == 400
        assert _get(server.turn_url(0, 6).replace("/turn", "/nope"))[0] == 404
    assert _load(db, session_id).version == 36  # nothing written


def test_the_live_page_says_an_address_it_does_not_serve_is_no_page(
    tmp_path: Path,
) -> None:
    # A browser's /favicon.ico, a mistyped address or ../ were answered
    # "400 no such run or turn", as if a run had been asked for.
    session_id = _hostile(tmp_path / "s.db")
    with ViewServer(lambda: SQLiteStore(tmp_path / "s.db"), session_id) as server:
        base = f"http://127.0.0.1:{server.port}"
        for path in ("/favicon.ico", "/index.html", "/../../etc/passwd", "/nope"):
            url = f"{base}{path}?token={server.token}"
            assert _get(url) == (404, "no such page"), path
        # A page it serves, asked for a run it does not hold, is still a 400.
        assert _get(f"{base}/turn?token={server.token}") == (
            400,
            "no such run or turn",
        )


def _check_live(doc: Node) -> None:
    """The live page: the plot; the path and the passes' diffs load on demand."""
    path = doc.find("section", "diagram").attrs["data-load"]
    status, drawn = _get(path)
    assert status == 200
    assert parse(drawn).find("ol", "path").find_all("li")
    assert doc.find("svg", "plot").find_all("line", "pass")
    passes = doc.find_all("details", "pass")
    assert [p.attrs["data-src"].count("/pass?") for p in passes] == [1, 1]
    assert len(doc.find_all("details", "turn")) == 2  # a page of turns, then "more"


@pytest.mark.parametrize(
    ("given", "field"),
    [
        ({"port": 70_000}, "port"),
        ({"port": "80"}, "port"),
        ({"page_size": 0}, "page_size"),
        ({"answer": "approve"}, "answer"),
        ({"commands": "--store s.db"}, "commands"),
        ({"commands": ["--store", 5]}, "commands[1]"),
    ],
)
def test_a_view_server_refuses_bad_settings(
    given: dict[str, object], field: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        ViewServer(lambda: SQLiteStore("s.db"), "ses_x", **given)  # type: ignore[arg-type]
    assert refused.value.field == field


def _paused(db: Path) -> str:
    argv = ["run", "clean up", "--agent", CAREFUL, "--store", str(db)]
    assert main(argv) == 3
    assert approval_agent.DELETED == []
    sessions = [s.id for s in anyio.run(_list, db)]
    assert len(sessions) == 1
    return sessions[0]


async def _list(db: Path) -> tuple[object, ...]:
    async with SQLiteStore(db) as store:
        return await store.list_sessions()  # type: ignore[return-value]


def _serve(
    session_id: str,
    db: Path | None,
    agent: str = CAREFUL,
) -> Iterator[str]:
    out = io.StringIO()
    stop = threading.Event()
    options = AgentOptions(agent=agent, store=None if db is None else str(db))
    status: list[int] = []
    thread = threading.Thread(
        target=lambda: status.append(
            run_view(session_id, options, open_browser=False, out=out, stop=stop)
        )
    )
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while "serving" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
        found = re.search(r"at (http://127\.0\.0\.1:\d+/\?token=\S+)", out.getvalue())
        assert found is not None, out.getvalue()
        yield found.group(1)
    finally:
        stop.set()
        thread.join(30)
    assert status == [0]
    assert out.getvalue().endswith("stopped\n")


def test_approve_on_the_live_page_resumes_the_paused_run(
    tmp_path: Path, capsys: Capture
) -> None:
    db = tmp_path / "s.db"
    session_id = _paused(db)
    capsys.readouterr()
    for url in _serve(session_id, db):
        doc = parse(_get(url)[1])
        paused = doc.find("div", "paused")
        assert "waiting on 2 tool call(s)" in paused.text()
        form = paused.find("form", "answer")
        fields = {i.attrs["name"]: i.attrs["value"] for i in form.find_all("input")}
        assert fields["token"] in url
        action = form.attrs["action"]
        # Without the token, nothing runs and nothing is written.
        refused = {**fields, "token": "nope", "action": "approve"}
        assert _post(action.split("?")[0], refused)[0] == 403
        assert approval_agent.DELETED == []
        status, location = _post(action, {**fields, "action": "approve"})
        assert status == 303
        assert location == url
        # The two approved calls run side by side: in either order.
        assert sorted(approval_agent.DELETED) == ["/etc/hosts", "/tmp/cache.db"]
        after = parse(_get(url)[1])
        assert after.find("span", "done")
        assert "approve" in after.find("pre", "notice").text()
        assert not after.find_all("form")
    run = _load(db, session_id).runs[-1]
    assert run.outcome == "done"
    assert run.text.startswith("Report: deleted /tmp/cache.db")


def test_reject_on_the_live_page_is_logged_as_rejected_in_the_view(
    tmp_path: Path, capsys: Capture
) -> None:
    # The rejection was logged "rejected from the command line".
    db = tmp_path / "s.db"
    session_id = _paused(db)
    capsys.readouterr()
    for url in _serve(session_id, db):
        form = parse(_get(url)[1]).find("div", "paused").find("form", "answer")
        fields = {i.attrs["name"]: i.attrs["value"] for i in form.find_all("input")}
        assert _post(form.attrs["action"], {**fields, "action": "reject"})[0] == 303
    assert approval_agent.DELETED == []
    results = [
        part.content
        for message in _load(db, session_id).history
        for part in message.tool_results
    ]
    assert results == ["rejected by the reviewer: rejected in the view"] * 2


def test_view_reads_the_session_from_the_store_of_the_agent_it_is_given(
    tmp_path: Path, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`turnfsm run --agent A` says to answer with `--agent A`; given to
    `turnfsm view` as to `turnfsm approve`, it finds the session in the
    agent's own store (it read the command line's store, which has none)."""
    own = tmp_path / "own.db"
    monkeypatch.setattr(approval_agent, "OWN_STORE", [own])
    monkeypatch.setenv("TURNFSM_STORE", str(tmp_path / "cli.db"))
    agent = "tests.cli.approval_agent:careful_in_its_store"
    assert main(["run", "clean up", "--agent", agent]) == 3
    (session,) = anyio.run(_list, own)
    capsys.readouterr()
    for url in _serve(session.id, None, agent):  # type: ignore[attr-defined]
        form = parse(_get(url)[1]).find("div", "paused").find("form", "answer")
        fields = {i.attrs["name"]: i.attrs["value"] for i in form.find_all("input")}
        status, _ = _post(form.attrs["action"], {**fields, "action": "approve"})
        assert status == 303
    assert sorted(approval_agent.DELETED) == ["/etc/hosts", "/tmp/cache.db"]
    assert not (tmp_path / "cli.db").exists()


def test_view_refuses_an_agent_that_does_not_load_before_serving(
    capsys: Capture,
) -> None:
    """A bad `--agent` was found only when Approve was clicked."""
    argv = ["view", "ses_x", "--agent", "tests.cli.no_such_module:agent"]
    assert main([*argv, "--no-open"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "turnfsm view: invalid --agent='tests.cli.no_such_module:agent'"
    )


@pytest.mark.parametrize(
    ("owner", "said"),
    [
        (
            "temporal:wf-desk",
            "is held by its durable run, Temporal workflow 'wf-desk'",
        ),
        ("host-b:4242", "is held by 'host-b:4242'"),
    ],
    ids=["a workflow", "a live process"],
)
def test_a_run_another_holder_has_is_not_offered_an_answer(
    tmp_path: Path, capsys: Capture, owner: str, said: str
) -> None:
    # The page offered Approve and Reject, which the held session refused.
    db = tmp_path / "s.db"
    session_id = _paused(db)
    capsys.readouterr()

    async def hold() -> None:
        async with SQLiteStore(db) as store:
            await store.acquire_lease(session_id, owner, ttl=600, force=True)

    anyio.run(hold)
    for url in _serve(session_id, db):
        paused = parse(_get(url)[1]).find("div", "paused")
        assert said in paused.text()
        take_over = f"turnfsm resume|abandon {session_id} --agent {CAREFUL} --store"
        assert f"take it over with {take_over} {db} --force" in paused.text()
        assert not paused.find_all("form")
    assert approval_agent.DELETED == []


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["ses_nope"], "no session 'ses_nope'"),
        (["ses_nope", "--port", "70000"], "invalid --port=70000"),
        (["ses_nope", "--store", "nope://x"], "invalid --store='nope://x'"),
        # The page's commands build the agent from these: they were found
        # out only when Approve was clicked.
        (["ses_nope", "--model", "bogus"], "invalid --model='bogus'"),
        (["ses_nope", "--model", "Local"], "(did you mean local?)"),
        (["ses_nope", "--model", "local", "--window", "-3"], "invalid --window=-3"),
    ],
)
def test_view_refuses_what_it_cannot_serve(
    argv: list[str], expected: str, capsys: Capture
) -> None:
    assert main(["view", *argv, "--no-open"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("turnfsm view: ")
    assert expected in err


def test_view_on_a_port_in_use_names_the_port(tmp_path: Path, capsys: Capture) -> None:
    # It said "turnfsm view: address already in use", naming no port.
    db = tmp_path / "s.db"
    session_id = _demo(db, capsys)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["view", session_id, "--store", str(db), "--port", str(port)]
        assert main([*argv, "--no-open"]) == 2
    assert capsys.readouterr().err == (
        f"turnfsm view: invalid --port={port}: expected a port no other program uses\n"
    )


# -- outcomes -------------------------------------------------------------


def _refused(request: ModelRequest) -> Message:
    raise ProviderError(message="<b>quota</b> exhausted", retryable=False)


def _failed() -> Session:
    agent = Agent(model=FakeModelClient(_refused))
    agent.run_sync("hello")
    return agent.session


def _interrupted() -> Session:
    """A session whose run never ended in its log (its process died)."""
    agent = Agent(model=FakeModelClient(lambda request: "hi there"))
    agent.run_sync("hello")
    entries = [e for e in agent.session.entries if not isinstance(e, RunEnded)]

    async def cut() -> Session:
        store = MemoryStore()
        await store.append("ses_cut", entries, expected_version=0)
        return await Session.load(store, "ses_cut")

    return anyio.run(cut)


def _cut_off() -> Session:
    """A session whose run was interrupted from outside, in its tool."""

    async def slow() -> str:
        """Take a while."""
        await anyio.sleep(60)
        return "done"

    agent = Agent(
        model=ScriptedModel.of(reply("", tool_call("slow", "c1"))), tools=[slow]
    )

    async def cut() -> None:
        with anyio.move_on_after(0.2):
            await agent.run("hello")

    anyio.run(cut)
    return agent.session


def _waiting() -> Session:
    agent = approval_agent.careful()
    agent.run_sync("clean up")
    return agent.session


def _waiting_for_a_signal() -> Session:
    agent = approval_agent.signalled()
    agent.run_sync("clean up")
    return agent.session


@pytest.mark.parametrize(
    ("make", "outcome", "shown"),
    [
        (_failed, "failed", ["ProviderError: ", "<b>quota</b> exhausted"]),
        (
            _interrupted,
            "running",
            [
                "The run did not end in its log",
                "turnfsm resume ses_cut run_",
                "turnfsm abandon",
            ],
        ),
        # It said "The run did not end in its log" of a run whose log ends it.
        (
            _cut_off,
            "interrupted",
            [
                "The run was interrupted from outside (Ctrl-C, or a cancelled task); "
                "its log keeps what it finished. Carry it on: turnfsm resume ses_",
                "turnfsm abandon ses_",
            ],
        ),
        (
            _waiting,
            "paused",
            [
                "waiting on 2 tool call(s)",
                "c1 delete_file",
                '"path": "/etc/hosts"',
                "turnfsm approve|reject|abandon ses_",
            ],
        ),
        (
            _waiting_for_a_signal,
            "paused",
            [
                "waiting on 2 tool call(s)",
                "It takes no review of its tool calls, but one of go_on,",
                "answer it with Agent.resume, or end it: turnfsm abandon ses_",
            ],
        ),
    ],
)
def test_a_report_says_how_each_run_ended(
    make: Callable[[], Session], outcome: str, shown: list[str]
) -> None:
    doc = parse(render_report(make()))
    run = doc.find("section", "run")
    assert run.find("h2").find("span", "outcome").text() == outcome
    text = " ".join(run.text().split())
    for expected in shown:
        assert " ".join(expected.split()) in text
    if make is _waiting_for_a_signal:
        assert "approve" not in text
    assert not doc.find_all("form")  # a report answers nothing


class _TooLittle:
    """A compactor that drops two messages of a conversation far over the window."""

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        return CompactionProposal.compacted([messages[0], *messages[3:]], 0, 0)


def test_a_pass_that_did_not_compact_is_shown_replacing_nothing(
    tmp_path: Path, capsys: Capture
) -> None:
    # A pass whose result was still over the window was shown as "40
    # message(s) covered, 40 in their place: ... saved 265 tokens", beside a
    # column "In their place (after)" repeating what it covered.
    db = tmp_path / "s.db"
    manager = ContextManager(
        _TooLittle(),
        context_window=4_000,
        threshold=60,
        counter=HeuristicTokenCounter(),
    )

    async def overflowed() -> str:
        async with SQLiteStore(db) as store:
            agent = Agent(model=ScriptedModel.of(), context=manager, store=store)
            said = [Message.user(f"question {i} " + "q" * 500) for i in range(40)]
            result = await agent.run(said)
            (record,) = agent.session.runs[-1].compactions
            assert (record.verdict, result.outcome) == ("overflow", "failed")
            assert record.tokens_before > record.tokens_after
            assert record.tokens_saved == 0  # it said 265, of what was not taken
            return agent.session.id

    session_id = anyio.run(overflowed)
    assert main(["sessions", "show", session_id, "--store", str(db)]) == 0
    assert "  (40 messages, none replaced, _TooLittle)\n" in capsys.readouterr().out
    assert main(["report", session_id, "-o", "run.html", "--store", str(db)]) == 0
    doc = parse(Path("run.html").read_text())
    (shown,) = doc.find_all("details", "pass")
    assert shown.find("p", "pass-meta").text() == (
        "40 message(s) covered, none replaced: what the pass made was still over "
        "the window, so the conversation went on as it was."
    )
    assert not shown.find_all("div", "after")


def test_two_answers_at_once_each_say_their_own_errors_and_leave_stderr_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each answer swapped the process's standard error for its own buffer:
    # two that overlapped left it pointing at a finished answer's buffer
    # (every later error of the command lost) and took each other's lines.
    import sys

    from turnfsm.cli import _view

    first_in = threading.Event()
    second_in = threading.Event()

    def answering(command: object, options: object, **streams: object) -> int:
        err = streams.get("err") or sys.stderr
        if command.run_id == "run_a":  # type: ignore[attr-defined]
            first_in.set()
            assert second_in.wait(10)
        else:
            second_in.set()
            time.sleep(0.2)  # the first one ends while this one goes on
        print(f"refused {command.run_id}", file=err)  # type: ignore[attr-defined,call-overload]
        return 2

    monkeypatch.setattr(_view, "run_answer", answering)
    answer = _view._answerer("ses_x", AgentOptions())
    said: dict[str, str] = {}
    before = sys.stderr
    first = threading.Thread(target=lambda: said.update(a=answer("approve", "run_a")))
    first.start()
    assert first_in.wait(10)
    second = threading.Thread(target=lambda: said.update(b=answer("reject", "run_b")))
    second.start()
    first.join(10)
    second.join(10)
    assert sys.stderr is before
    assert said == {
        "a": "refused run_a\n(exit status 2)",
        "b": "refused run_b\n(exit status 2)",
    }


def test_the_commands_a_page_gives_are_quoted_for_the_shell() -> None:
    # A session id with a space, a quote or $(...) was printed bare: the
    # command copied from the page named another session, or ran $(...).
    from turnfsm import approval_machine

    odd = "ses $(touch owned) it's"

    async def paused() -> Session:
        store = MemoryStore()
        agent = Agent(
            model=ScriptedModel.of(reply("", tool_call("shout", "c1", text="hi"))),
            tools=[shout],
            machine=approval_machine(),
            session=Session(odd, store=store),
        )
        assert (await agent.run("go")).outcome == "paused"
        return await Session.load(store, odd)

    session = anyio.run(paused)
    run = session.runs[0].run_id
    text = parse(render_report(session)).find("div", "paused").text()
    assert (
        f"turnfsm approve|reject|abandon 'ses $(touch owned) it'\"'\"'s' {run}" in text
    )


def test_a_report_is_not_written_over_a_session_store(
    tmp_path: Path, capsys: Capture
) -> None:
    # `-o` naming the store's own file wrote the page over it: every session
    # of the store lost.
    db = tmp_path / "s.db"
    session_id = _hostile(db)
    before = db.read_bytes()
    assert main(["report", session_id, "--store", str(db), "-o", str(db)]) == 2
    assert capsys.readouterr().err == (
        f"turnfsm report: invalid -o={str(db)!r}: expected a file that is no "
        "SQLite database (it holds one, a session store's, say: writing over "
        "it would lose what it holds)\n"
    )
    assert db.read_bytes() == before
    assert _load(db, session_id).runs


def test_stopping_the_view_waits_for_an_answer_going_on(
    tmp_path: Path, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ctrl-C while an Approve carried its run on printed "stopped" and the
    # process ended under the run: left unfinished, its session held.
    from turnfsm.cli import _view

    db = tmp_path / "s.db"
    session_id = _paused(db)
    capsys.readouterr()
    going, release = threading.Event(), threading.Event()

    def slow(action: str, run_id: str) -> str:
        going.set()
        assert release.wait(30)
        return "approved"

    monkeypatch.setattr(_view, "_answerer", lambda *_args: slow)
    out = io.StringIO()
    stop = threading.Event()
    options = AgentOptions(agent=CAREFUL, store=str(db))
    served = threading.Thread(
        target=run_view,
        args=(session_id, options),
        kwargs={"open_browser": False, "out": out, "stop": stop},
    )
    served.start()
    deadline = time.monotonic() + 30
    while "serving" not in out.getvalue() and time.monotonic() < deadline:
        time.sleep(0.05)
    url = re.search(r"at (http://\S+)", out.getvalue()).group(1)  # type: ignore[union-attr]
    run = _load(db, session_id).runs[-1].run_id
    token = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)["token"][0]
    form = {"token": token, "run": run, "action": "approve"}
    answered: list[tuple[int, str]] = []
    poster = threading.Thread(
        target=lambda: answered.append(_post(url.replace("/?", "/answer?"), form))
    )
    poster.start()
    assert going.wait(30)
    stop.set()
    time.sleep(1)
    assert served.is_alive()  # it waits for the answer
    assert f"waiting for the answer to run(s) {run} to end" in out.getvalue()
    release.set()
    served.join(30)
    poster.join(30)
    assert not served.is_alive()
    assert out.getvalue().endswith("stopped\n")
    assert [status for status, _ in answered] == [303]


def test_the_commands_a_page_gives_find_the_store_it_was_read_from(
    tmp_path: Path, capsys: Capture
) -> None:
    # Under `--store x.db` the pages said `turnfsm approve|reject|abandon S
    # RUN`, which looks in the default store: "no session".
    db = tmp_path / "s.db"
    session_id = _paused(db)
    out = tmp_path / "report.html"
    assert main(["report", session_id, "--store", str(db), "-o", str(out)]) == 0
    said = parse(out.read_text()).find("div", "paused").text()
    assert f" --store {db}" in said
    for url in _serve(session_id, db):
        said = parse(_get(url)[1]).find("div", "paused").text()
        assert f" --agent {CAREFUL} --store {db}" in said
    capsys.readouterr()
    with pytest.raises(ConfigError) as refused:
        render_report(Session(), commands=[None])  # type: ignore[list-item]
    assert refused.value.field == "commands[0]"
