"""`turnfsm demo --model local`: the real model calls the tool and the run compacts.

The bundled Gemma 3 270M is a base model: it makes valid calls only because
the local server constrains its output with llama.cpp's grammars (the
``turnfsm-tools`` prompt format). The run is read back from the store it was
kept in: the calls are counted from the model's replies, the compactions
from the run's records, and the counts are printed for the CI log.

Skipped when the ``local`` extra is missing, unless TURNFSM_REQUIRE_LOCAL_MODEL
is set (CI sets it, so a broken install fails instead of skipping).
"""

from __future__ import annotations

import re
import time
import typing
from pathlib import Path

import anyio
import pytest

from tests.integration._local import require_local_extra
from turnfsm.cli import main
from turnfsm.core import ModelReplied
from turnfsm.persistence import RunRecord, Session, SQLiteStore

require_local_extra()

pytestmark = [pytest.mark.local_model, pytest.mark.slow, pytest.mark.timeout(300)]


def _run(path: Path, session_id: str) -> RunRecord:
    async def load() -> RunRecord:
        store = SQLiteStore(path)
        try:
            (run,) = (await Session.load(store, session_id)).runs
            return run
        finally:
            await store.aclose()

    return anyio.run(load)


def test_the_local_demo_makes_real_tool_calls_and_compacts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from turnfsm.cli._demo_model import LogName, log_text

    path = tmp_path / "demo.db"
    started = time.monotonic()
    log = tmp_path / "demo.jsonl"
    code = main(
        ["demo", "--model", "local", "--store", f"sqlite:///{path}", "--log", str(log)]
    )
    seconds = time.monotonic() - started
    out = capsys.readouterr().out
    assert code == 0, out
    assert "REAL local model: Gemma 3 270M on llama.cpp" in out
    # Loading the model takes seconds: the wait is announced and timed.
    assert "starting the local model (Gemma 3 270M on llama.cpp, a 1,024-token" in out
    assert re.search(r"^local model ready in \d+\.\d s$", out, re.MULTILINE), out
    assert "start --measured--> call_llm" in out
    # It answered, or used the demo's model calls for the local model.
    assert re.search(
        r"^(final answer \(\d+ model calls\): |stopped after 3 model calls, )",
        out,
        re.MULTILINE,
    ), out
    assert f"entries written to {log}" in out
    assert log.read_text().count("\n") >= 10
    found = re.search(r"^session (ses_\w+) stored in", out, re.MULTILINE)
    assert found is not None, out
    run = _run(path, found[1])

    calls = [
        call
        for event in run.events
        if isinstance(event, ModelReplied)
        for call in event.message.tool_calls
    ]
    compactions = [c for c in run.compactions if c.compacted]
    with capsys.disabled():
        print(
            f"\nturnfsm demo --model local: {len(calls)} tool calls, "
            f"{len(compactions)} compactions, {seconds:.1f} s"
        )
    assert len(calls) >= 1
    # Valid calls: the grammar kept the name to the schema's choices, so
    # the tool ran and returned a log.
    names = set(typing.get_args(LogName))
    for call in calls:
        assert call.name == "read_log"
        assert set(call.arguments) == {"name"}
        assert call.arguments["name"] in names
        assert log_text(str(call.arguments["name"])).count("\n") >= 1
    assert len(compactions) >= 1
    assert all(c.tokens_after < c.tokens_before for c in compactions)
    assert "[compaction] reason=threshold_exceeded (TruncatingCompactor)" in out
