"""A run stopped by its sub-agent's pause: its page says what it waits on, and answers.

The live page of the caller's session shows the sub-agent's session, run and
the calls it waits on, with Approve and Reject; approving from the page
hands the answer to the sub-agent and both runs go on.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from tests.cli import approval_agent
from tests.view.dom import parse
from tests.view.test_view import _get, _load, _post, _serve
from turnfsm.cli import main
from turnfsm.persistence import SQLiteStore, child_sessions

MANAGER = "tests.cli.approval_agent:manager"


@pytest.fixture(autouse=True)
def _fresh_effects() -> None:
    approval_agent.DELETED.clear()


def _stopped(db: Path) -> tuple[str, str]:
    assert main(["run", "clean up", "--agent", MANAGER, "--store", str(db)]) == 3

    async def ids() -> tuple[str, str]:
        async with SQLiteStore(db) as store:
            infos = await store.list_sessions()
            for info in infos:
                children = await child_sessions(store, info.id)
                if children:
                    return info.id, children[0].id
        raise AssertionError("no caller with a sub-agent")

    return anyio.run(ids)


def test_approve_on_the_caller_s_page_resumes_the_sub_agent_and_the_caller(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "s.db"
    parent, kid = _stopped(db)
    capsys.readouterr()
    for url in _serve(parent, db, agent=MANAGER):
        doc = parse(_get(url)[1])
        waiting = doc.find("div", "paused")
        text = waiting.text()
        assert "Stopped until its sub-agent cleaner is answered" in text
        assert kid in text
        assert "paused in await_approval on 2 tool call(s): c1, c2" in text
        form = waiting.find("form", "answer")
        fields = {i.attrs["name"]: i.attrs["value"] for i in form.find_all("input")}
        status, _location = _post(form.attrs["action"], {**fields, "action": "approve"})
        assert status == 303
        assert sorted(approval_agent.DELETED) == ["/etc/hosts", "/tmp/cache.db"]
        after = parse(_get(url)[1])
        assert after.find("span", "done")
        assert not after.find_all("form")
    (run,) = _load(db, parent).runs
    assert run.outcome == "done"
    assert run.text.startswith("The cleaner said: Report: deleted ")
    assert [r.outcome for r in _load(db, kid).runs] == ["done"]
