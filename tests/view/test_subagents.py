"""The view of a session that delegated: each run lists its sub-agents' sessions.

A report holds their pages further down (bounded, saying what it left out);
the live server serves them, and no other session, behind the same token.
"""

from __future__ import annotations

import shutil
import sqlite3
from collections import Counter
from pathlib import Path
from typing import ClassVar

import pytest

from tests.delegation import ALONE, LEAD, LEAF_USAGE, delegating_store, family
from tests.view.dom import Node, parse
from tests.view.test_view import _get
from turnfsm.cli import main
from turnfsm.errors import ConfigError
from turnfsm.persistence import Session, SQLiteStore
from turnfsm.view import ViewServer, render_report

Capture = pytest.CaptureFixture[str]


@pytest.fixture(scope="module")
def delegated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Session]]:
    store = delegating_store(tmp_path_factory.mktemp("store") / "sessions.db")
    return store, family(store)


def rows(table: Node) -> list[dict[str, str]]:
    """Each row of a "Sub-agents" table: its cells' text, and the session's link."""
    out = []
    for row in table.find_all("tr", "sub-agent"):
        cells = [c.text() for c in row.find_all("td")]
        links = row.find_all("a")
        out.append(
            {
                "call": cells[0],
                "session": cells[1],
                "outcome": cells[2],
                "turns": cells[3],
                "usage": cells[4],
                "href": links[0].attrs["href"] if links else "",
            }
        )
    return out


def ids(doc: Node) -> Counter[str]:
    """The ids the view gives (Graphviz's own, inside each drawing, left out)."""
    every = Counter(n.attrs["id"] for n in doc.walk() if "id" in n.attrs)
    for drawing in doc.find_all("div", "svg"):
        every -= Counter(n.attrs["id"] for n in drawing.walk() if "id" in n.attrs)
    return every


# -- the report ---------------------------------------------------------------


def test_a_report_lists_each_run_s_sub_agents_and_holds_their_pages(
    delegated: tuple[Path, list[Session]], capsys: Capture
) -> None:
    store, (mid, leaf, solo) = delegated

    assert main(["report", LEAD, "-o", "r.html", "--store", str(store)]) == 0

    assert capsys.readouterr().out == (
        f"wrote r.html (session {LEAD}: 1 run(s), 2 turn(s), 0 pass(es)); "
        "the pages of 3 of its 3 sub-agent session(s)\n"
    )
    doc = parse(Path("r.html").read_text())
    assert [i for i, n in ids(doc).items() if n > 1] == []  # every id its own
    lead_run = doc.find("section", "run")
    leaf_usage = f"{LEAF_USAGE.input_tokens} in / {LEAF_USAGE.output_tokens} out"
    assert rows(lead_run.find("table", "sub-agents")) == [
        {
            "call": "call_mid",
            "session": mid.id,
            "outcome": "done",
            "turns": "2",
            "usage": f"{sum(r.usage.input_tokens for r in mid.runs)} in / 0 out",
            "href": f"#session-{mid.id}",
        },
        {
            "call": "call_solo",
            "session": solo.id,
            "outcome": "done",
            "turns": "1",
            "usage": leaf_usage,
            "href": f"#session-{solo.id}",
        },
    ]
    sections = {s.attrs["id"]: s for s in doc.find_all("section", "sub-agent-session")}
    assert list(sections) == [f"session-{s.id}" for s in (mid, leaf, solo)]
    # The child's page: its own runs, its own sub-agents, a link back to its row.
    page = sections[f"session-{mid.id}"]
    assert [r["href"] for r in rows(page.find("table", "sub-agents"))] == [
        f"#session-{leaf.id}"
    ]
    back = page.find("p", "delegated")
    assert "call_mid" in back.text()
    assert back.find("a").attrs["href"] == f"#sub-{mid.id}"
    assert f"sub-{mid.id}" in ids(doc)
    leaf_page = sections[f"session-{leaf.id}"]
    assert leaf_page.find("pre", "answer").text() == "leaf done"
    assert leaf_page.find_all("details", "turn")
    assert not leaf_page.find_all("table", "sub-agents")


@pytest.mark.parametrize("held", [0, 1])
def test_a_report_holds_a_bounded_number_of_sub_agent_pages_and_says_so(
    delegated: tuple[Path, list[Session]], held: int, capsys: Capture
) -> None:
    store, (mid, _leaf, solo) = delegated
    args = ["report", LEAD, "-o", "r.html", "--store", str(store)]

    assert main([*args, "--sub-agents", str(held)]) == 0

    assert capsys.readouterr().out.endswith(
        f"the pages of {held} of its 3 sub-agent session(s), {3 - held} left out "
        "(--sub-agents all)\n"
    )
    doc = parse(Path("r.html").read_text())
    assert len(doc.find_all("section", "sub-agent-session")) == held
    assert (
        doc.find_all("p", "left-out")[-1]
        .text()
        .startswith(
            f"This report holds the pages of {held} of 3 sub-agent sessions: "
            f"the other {3 - held} are left out"
        )
    )
    # A session without a page is listed, not linked.
    linked = [r["href"] for r in rows(doc.find("table", "sub-agents"))]
    assert linked == [f"#session-{mid.id}" if held else "", ""]
    assert solo.id in doc.find("table", "sub-agents").text()


def test_a_session_that_delegated_nothing_shows_no_sub_agents(
    delegated: tuple[Path, list[Session]],
) -> None:
    _store, below = delegated
    alone = _load(delegated[0], ALONE)

    doc = parse(render_report(alone, sub_agents=below))

    assert not doc.find_all("section", "sub-agents")
    assert not doc.find_all("section", "sub-agent-session")
    assert not doc.find_all("p", "delegated")


def test_bad_sub_agent_bounds_are_refused(
    delegated: tuple[Path, list[Session]], capsys: Capture
) -> None:
    store, below = delegated
    with pytest.raises(ConfigError, match="sub_agent_pages"):
        render_report(below[0], sub_agent_pages=-1)
    args = ["report", LEAD, "-o", "r.html", "--store", str(store)]

    assert main([*args, "--sub-agents", "some"]) == 2

    assert capsys.readouterr().err == (
        "turnfsm report: invalid --sub-agents='some': expected a whole number "
        "of sessions from 0 up, or all\n"
    )
    assert not Path("r.html").exists()


def _load(store: Path, session_id: str) -> Session:
    import anyio

    async def load() -> Session:
        async with SQLiteStore(store) as sessions:
            return await Session.load(sessions, session_id)

    return anyio.run(load)


# -- the live page ----------------------------------------------------------


def test_the_live_page_serves_the_sub_agents_pages_below_it_and_no_other(
    delegated: tuple[Path, list[Session]],
) -> None:
    store, (mid, leaf, solo) = delegated
    with ViewServer(lambda: SQLiteStore(store), LEAD) as server:
        assert server.child_url(leaf.id) is not None  # known before a page is
        status, text = _get(server.url)
        assert status == 200
        listed = rows(parse(text).find("table", "sub-agents"))
        assert [r["call"] for r in listed] == ["call_mid", "call_solo"]
        assert [r["href"] for r in listed] == [
            server.child_url(mid.id),
            server.child_url(solo.id),
        ]

        status, text = _get(listed[0]["href"])
        assert status == 200
        child = parse(text)
        assert mid.id in child.find("h1").text()
        assert child.find("p", "delegated").find("a").attrs["href"] == server.url
        (grandchild,) = rows(child.find("table", "sub-agents"))
        assert grandchild["call"] == "call_leaf"

        status, text = _get(grandchild["href"])
        assert status == 200
        leaf_page = parse(text)
        # Its turns load from its own log, as the served session's do.
        turn = leaf_page.find("details", "turn").attrs["data-src"]
        status, detail = _get(turn)
        assert status == 200
        assert parse(detail).find("div", "reply").text().count("leaf done") == 1
        path = leaf_page.find("section", "diagram").attrs["data-load"]
        assert _get(path)[0] == 200
        assert not leaf_page.find_all("form")  # a sub-agent's page answers nothing

        base = server.url.split("?")[0]
        token = server.token
        for refused in (f"s={ALONE}", f"s={LEAD}", "s="):
            assert _get(f"{base}session?{refused}&token={token}")[0] == 404
        assert _get(f"{base}turn?r=0&n=0&s={ALONE}&token={token}")[0] == 404
        assert _get(f"{base}session?s={leaf.id}")[0] == 403
        assert _get(f"{base}session?s={leaf.id}&token=wrong")[0] == 403
        assert server.child_url(ALONE) is None


class _Counting:
    """A store that counts the sessions read from it."""

    loads: ClassVar[Counter[str]] = Counter()

    def __init__(self, inner: SQLiteStore) -> None:
        self.inner = inner

    async def append(self, session_id: str, entries: object, **kw: object) -> int:
        return await self.inner.append(session_id, entries, **kw)  # type: ignore[arg-type]

    async def load(self, session_id: str) -> object:
        _Counting.loads[session_id] += 1
        return await self.inner.load(session_id)

    async def list_sessions(self) -> object:
        return await self.inner.list_sessions()

    async def aclose(self) -> None:
        await self.inner.aclose()


def test_the_live_page_reads_again_only_the_sessions_that_changed(
    tmp_path: Path,
) -> None:
    # Every reload after any session of the store changed read every
    # session of the store again: with 20,000 of them, 18 seconds a reload.
    import anyio

    from tests.view.test_view import _hostile

    db = tmp_path / "s.db"
    served = _hostile(db)

    async def copy(first: int, stop: int) -> None:
        async with SQLiteStore(db) as store:
            entries = await store.load(served)
            for i in range(first, stop):
                await store.append(f"ses_other_{i}", entries, expected_version=0)

    anyio.run(copy, 0, 20)
    _Counting.loads.clear()
    opener = lambda: _Counting(SQLiteStore(db))  # noqa: E731
    with ViewServer(opener, served) as server:  # type: ignore[arg-type]
        assert _get(server.url)[0] == 200
        assert _Counting.loads["ses_other_0"] == 1
        anyio.run(copy, 20, 21)  # one more session
        _Counting.loads.clear()
        assert _get(server.url)[0] == 200
        assert set(_Counting.loads) == {"ses_other_20"}


def test_the_view_of_a_session_whose_sub_agent_s_session_is_damaged_shows_the_rest(
    delegated: tuple[Path, list[Session]], tmp_path: Path
) -> None:
    # The whole page was an HTTP 500 (CorruptRecord); `report` and
    # `sessions show` show the session and say which sub-agent cannot be read.
    store, (mid, _leaf, _solo) = delegated
    db = tmp_path / "damaged.db"
    shutil.copy(store, db)
    with sqlite3.connect(db) as connection:
        connection.execute(
            "UPDATE turnfsm_entries SET body = '{oops' WHERE session_id = ?"
            " AND seq = 3",
            (mid.id,),
        )
    with ViewServer(lambda: SQLiteStore(db), LEAD) as server:
        status, text = _get(server.url)
        assert status == 200
        doc = parse(text)
        assert (
            doc.find("p", "unread")
            .text()
            .startswith(
                "A sub-agent session of this one cannot be read, so its sub-agent "
                "sessions are not shown: "
                f"corrupt Entry record at sessions['{mid.id}'].entries[3]: "
            )
        )
        assert doc.find_all("section", "run")
        assert server.child_url(mid.id) is None
