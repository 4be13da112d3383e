"""The view in a real browser: headless Chromium opens the demo's report and
the live page, and the DOM it builds holds the path, the plot and a pass's
diff (on the live page, loaded on demand). The docs' screenshot script runs
too, into the test's directory (the repository is not changed).

Needs Debian's ``chromium`` (CI installs it).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT
from tests.view.dom import parse
from tests.view.test_view import _check_report, _demo
from turnfsm.cli import main
from turnfsm.persistence import SQLiteStore
from turnfsm.view import ViewServer

Capture = pytest.CaptureFixture[str]
CHROMIUM = shutil.which("chromium")

pytestmark = [
    pytest.mark.skipif(
        CHROMIUM is None, reason="Debian's chromium is not installed (apt)"
    ),
    pytest.mark.timeout(240),
]

_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


def _dom(url: str, profile: Path) -> str:
    """The DOM Chromium built of `url`, once its scripts and fetches settled."""
    done = subprocess.run(
        [
            str(CHROMIUM),
            *_FLAGS,
            f"--user-data-dir={profile}",
            "--virtual-time-budget=5000",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )
    return done.stdout


def test_chromium_opens_the_demo_s_report(tmp_path: Path, capsys: Capture) -> None:
    db = tmp_path / "s.db"
    session_id = _demo(db, capsys)
    report = tmp_path / "run.html"
    assert main(["report", session_id, "-o", str(report), "--store", str(db)]) == 0
    doc = parse(_dom(report.as_uri() + "?open=pass-0-0", tmp_path / "profile"))
    _check_report(doc)
    assert "open" in doc.find("details", "pass").attrs  # the script ran


def test_an_address_with_a_broken_anchor_still_opens_what_it_asks(
    tmp_path: Path, capsys: Capture
) -> None:
    # An anchor that is no percent-encoding (#%E0%A4%A) stopped the page's
    # script: ?open= opened nothing, and clicking a path edge went nowhere.
    db = tmp_path / "s.db"
    session_id = _demo(db, capsys)
    report = tmp_path / "run.html"
    assert main(["report", session_id, "-o", str(report), "--store", str(db)]) == 0
    url = report.as_uri() + "?open=pass-0-0#%E0%A4%A"
    doc = parse(_dom(url, tmp_path / "profile"))
    assert "open" in doc.find("details", "pass").attrs


def test_chromium_opens_the_live_page_and_loads_a_pass_s_diff(
    tmp_path: Path, capsys: Capture
) -> None:
    db = tmp_path / "s.db"
    session_id = _demo(db, capsys)
    with ViewServer(lambda: SQLiteStore(db), session_id) as server:
        url = server.url.replace("/?", "/?open=pass-0-0,turn-0-5&")
        doc = parse(_dom(url, tmp_path / "profile"))
    # The first pass and the last turn were opened, and their details fetched.
    _check_report(doc)
    opened = [d for d in doc.find_all("details") if "open" in d.attrs]
    assert [d.attrs["id"] for d in opened] == ["pass-0-0", "turn-0-5"]
    assert all("loading..." not in d.text() for d in opened)
    assert "Audit done" in opened[1].find("div", "reply").text()


def test_the_docs_screenshot_script_draws_the_report(tmp_path: Path) -> None:
    out = tmp_path / "view.png"
    env = {**os.environ, "PYTHON": sys.executable}
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")])
    )
    done = subprocess.run(
        ["bash", str(REPO_ROOT / "scripts" / "docs-view-screenshot"), str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=200,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(rf"wrote {re.escape(str(out))}\n", done.stdout)
    assert out.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
