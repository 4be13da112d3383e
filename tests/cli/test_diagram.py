"""`turnfsm diagram`: diagrams beside their machines, and the path runs took.

The demo's run is known: six model calls, five rounds of tools, one pass for
the threshold line and one emergency pass, then done. Drawn from the store
(replayed) or from a trace (its span events), its edges carry those counts;
over several runs they add up.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import anyio
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

import turnfsm
from tests.core.test_render import X, dot_edges, mermaid_edges
from tests.delegation import ALONE, LEAD, delegating_store, family
from tests.helpers import REPO_ROOT, load_turn_spec, restamp
from tests.test_diagrams import svg_texts
from turnfsm.agent import Agent
from turnfsm.cli import main
from turnfsm.cli._demo import TASK, THRESHOLD, WINDOW, build_demo_agent
from turnfsm.cli._diagram import default_out
from turnfsm.cli._stores import close_store
from turnfsm.hooks import Hook, RunStartInfo, TransitionInfo
from turnfsm.messages import Message
from turnfsm.persistence import Session, SQLiteStore, machine_digest
from turnfsm.providers import ModelRequest
from turnfsm.testing import FakeModelClient, reply, tool_call
from turnfsm.tracing._otlp_json import OTLPJSONFileExporter

Capture = pytest.CaptureFixture[str]

# The demo run's fired edges, by label (as the DOT draws them) and count.
DEMO_PATH = {
    "run_started": 1,
    "measured": 6,
    "model_replied [has_tool_calls]": 5,
    "tools_finished": 5,
    "measured [is_over_threshold_line and not is_compaction_limit_reached"
    " and not is_threshold_line_spent] / threshold_exceeded": 1,
    "measured [is_over_emergency_line] / emergency": 1,
    "compaction_result": 2,
    "model_replied": 1,
}
COUNT = re.compile(rf"^(.*) {X}(\d+)(?:, max ([\d,]+) tokens)?$")


def fired(drawn_labels: list[str]) -> dict[str, tuple[int, int | None]]:
    """``{label: (count, tokens)}`` of the edges drawn as fired."""
    out = {}
    for label in drawn_labels:
        match = COUNT.match(label)
        if match is not None:
            tokens = int(match[3].replace(",", "")) if match[3] else None
            out[match[1]] = (int(match[2]), tokens)
    return out


def counts(path: Path) -> dict[str, int]:
    text = path.read_text()
    drawn = mermaid_edges(text) if path.suffix == ".mmd" else dot_edges(text)
    return {label: n for label, (n, _) in fired([e.label for e in drawn]).items()}


def demo_agent(store: Path) -> Agent:
    """The demo's agent (its simulated model, tools and window) on `store`."""
    return build_demo_agent(io.StringIO(), store=SQLiteStore(store))


# -- plain diagrams: where they go ----------------------------------------


def test_diagrams_go_beside_the_machines_wherever_you_stand(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Capture
) -> None:
    project = tmp_path / "project"
    shutil.copytree(REPO_ROOT / "machines", project / "machines")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)

    assert main(["diagram", str(project / "machines")]) == 0

    assert (project / "diagrams" / "turn.mmd").is_file()
    assert not (elsewhere / "diagrams").exists()
    out = capsys.readouterr().out
    assert f"wrote {project / 'diagrams' / 'turn.mmd'}\n" in out
    monkeypatch.chdir(project)
    assert main(["diagram", "machines", "--check"]) == 0
    assert main(["diagram", "machines", "--out", "other"]) == 0
    assert "wrote other/turn.mmd\n" in capsys.readouterr().out


def test_check_names_the_command_that_redraws_the_same_machines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Capture
) -> None:
    # It said "stale: ... (run `turnfsm diagram`)", which draws the shipped
    # machines into ./diagrams and leaves these as they were; and a diagram
    # never drawn was "stale".
    shutil.copytree(REPO_ROOT / "machines", tmp_path / "machines")
    monkeypatch.chdir(tmp_path)
    assert main(["diagram", "machines", "--out", "d", "--check"]) == 1
    err = capsys.readouterr().err
    assert "missing: d/turn.mmd (run `turnfsm diagram machines --out d`)\n" in err
    assert main(["diagram", "machines", "--out", "d"]) == 0
    with (tmp_path / "d" / "turn.mmd").open("a") as changed:
        changed.write("%% changed\n")
    capsys.readouterr()
    assert main(["diagram", "machines", "--out", "d", "--check"]) == 1
    assert capsys.readouterr().err == (
        "stale: d/turn.mmd (run `turnfsm diagram machines --out d`)\n"
    )
    assert main(["diagram", "--check", "--out", "my dir"]) == 1
    assert "(run `turnfsm diagram --out 'my dir'`)" in capsys.readouterr().err


def test_check_finds_a_diagram_that_is_not_utf8_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Capture
) -> None:
    # It ended in a UnicodeDecodeError traceback.
    shutil.copytree(REPO_ROOT / "machines", tmp_path / "machines")
    monkeypatch.chdir(tmp_path)
    assert main(["diagram", "machines", "--out", "d"]) == 0
    (tmp_path / "d" / "turn.mmd").write_bytes(b"\xff")
    capsys.readouterr()
    assert main(["diagram", "machines", "--out", "d", "--check"]) == 1
    assert capsys.readouterr().err == (
        "stale: d/turn.mmd (run `turnfsm diagram machines --out d`)\n"
    )


def test_the_shipped_machines_of_an_installed_turnfsm_draw_into_the_cwd() -> None:
    packaged = Path(turnfsm.__file__).parent / "_machines"

    assert default_out(packaged) == Path("diagrams")
    assert default_out(REPO_ROOT / "machines") == REPO_ROOT / "diagrams"


# -- the path of stored runs ------------------------------------------------


@pytest.fixture(scope="module")
def two_demos(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """A store with two demo sessions (one run each)."""
    store = tmp_path_factory.mktemp("store") / "sessions.db"
    ids = []
    for _ in range(2):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(["demo", "--store", str(store)]) == 0
        match = re.search(r"session (ses_\w+) stored in", out.getvalue())
        assert match is not None
        ids.append(match[1])
    return store, ids[0], ids[1]


def test_a_stored_run_is_drawn_with_exactly_the_edges_it_fired(
    tmp_path: Path, two_demos: tuple[Path, str, str], capsys: Capture
) -> None:
    store, first, _ = two_demos
    out = tmp_path / "path.dot"

    assert main(["diagram", "--run", first, "--store", str(store), "-o", str(out)]) == 0

    # the cwd is tmp_path: the path is shown relative to it
    assert capsys.readouterr().out == "wrote path.dot (1 run, 22 transitions)\n"
    drawn = fired([e.label for e in dot_edges(out.read_text())])
    assert {label: n for label, (n, _) in drawn.items()} == DEMO_PATH
    emergency = drawn["measured [is_over_emergency_line] / emergency"][1]
    threshold = drawn[
        "measured [is_over_threshold_line and not is_compaction_limit_reached"
        " and not is_threshold_line_spent] / threshold_exceeded"
    ][1]
    assert emergency is not None
    assert threshold is not None
    # The estimates that sent the run to compact: over the emergency line
    # (95 % of the window), over the threshold line but under the emergency one.
    assert emergency >= WINDOW * 95 // 100
    assert WINDOW * THRESHOLD // 100 < threshold < WINDOW * 95 // 100
    assert f'label="turn: 1 run ({first}); edge width' in out.read_text()


def test_runs_of_two_sessions_add_up(
    tmp_path: Path, two_demos: tuple[Path, str, str], capsys: Capture
) -> None:
    store, first, second = two_demos
    out = tmp_path / "both.mmd"
    args = ["--run", first, "--run", f"{second}", "--run", first, "--store", str(store)]

    assert main(["diagram", *args, "-o", str(out)]) == 0

    assert "(2 runs, 44 transitions)" in capsys.readouterr().out
    assert counts(out) == {label: 2 * n for label, n in DEMO_PATH.items()}


def test_the_runs_of_one_session_add_up(tmp_path: Path, capsys: Capture) -> None:
    agent = demo_agent(tmp_path / "one.db")

    async def twice() -> list[str]:
        try:
            return [(await agent.run(TASK)).run_id for _ in range(2)]
        finally:
            await close_store(agent.store)

    runs = anyio.run(twice)
    session, store = agent.session.id, str(tmp_path / "one.db")
    drawn = {}
    for name, given in [
        ("first", [f"{session}:{runs[0]}"]),
        ("second", [f"{session}:{runs[1]}"]),
        ("session", [session]),
    ]:
        out = tmp_path / f"{name}.dot"
        options = [a for run in given for a in ("--run", run)]
        assert main(["diagram", *options, "--store", store, "-o", str(out)]) == 0
        drawn[name] = counts(out)

    assert "(2 runs, " in capsys.readouterr().out
    assert drawn["first"] == DEMO_PATH
    labels = drawn["first"].keys() | drawn["second"].keys()
    assert drawn["session"] == {
        label: drawn["first"].get(label, 0) + drawn["second"].get(label, 0)
        for label in labels
    }


@pytest.mark.skipif(shutil.which("dot") is None, reason="needs Graphviz's dot")
def test_the_svg_of_a_run_carries_the_counts(
    tmp_path: Path, two_demos: tuple[Path, str, str]
) -> None:
    import xml.etree.ElementTree as ET

    store, first, _ = two_demos
    out = tmp_path / "path.svg"

    assert main(["diagram", "--run", first, "--store", str(store), "-o", str(out)]) == 0

    _, edges = svg_texts(ET.fromstring(out.read_text()))
    drawn = fired([label for _, _, label in edges])
    assert {label: n for label, (n, _) in drawn.items()} == DEMO_PATH
    png = tmp_path / "path.png"
    assert main(["diagram", "--run", first, "--store", str(store), "-o", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_machine_file_of_another_digest_is_refused(
    tmp_path: Path, two_demos: tuple[Path, str, str], capsys: Capture
) -> None:
    store, first, _ = two_demos
    edited = tmp_path / "turn.toml"
    text = (REPO_ROOT / "machines" / "turn.toml").read_text()
    edited.write_text(
        text.replace('error = "provider_error"', 'error = "context_exceeded"')
    )
    approval = REPO_ROOT / "machines" / "approval.toml"
    base = [
        "diagram",
        "--run",
        first,
        "--store",
        str(store),
        "-o",
        str(tmp_path / "x.dot"),
    ]

    assert main([*base, "--machine", str(edited)]) == 2
    err = capsys.readouterr().err
    assert "expected the machine it ran on" in err
    assert f"ran on 'turn' {machine_digest(load_turn_spec())}" in err
    assert main([*base, "--machine", str(approval)]) == 2
    err = capsys.readouterr().err
    assert f"left out {first}:" in err
    assert "it ran on 'turn'" in err
    assert main([*base, "--machine", str(REPO_ROOT / "machines" / "turn.toml")]) == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--run", "ses_nope"], "expected a session in"),
        (["--run", "{first}:run_nope"], "expected a run of the session in"),
        (
            ["--run", "{first}", "-o", "{tmp}/x.txt"],
            "a file ending .svg, .png, .dot or .mmd",
        ),
        (
            # Refused before the runs are read: it said which runs the
            # machine left out first.
            ["--run", "{first}", "--machine", "approval", "-o", "{tmp}/x.txt"],
            "a file ending .svg, .png, .dot or .mmd",
        ),
        (
            # Named as the option, as `turnfsm run` names it.
            ["--run", "{first}", "--machine", "trun"],
            "invalid --machine='trun': expected a machine file, or a shipped "
            "machine's name (trun does not exist",
        ),
        (["--run", "{first}", "-o", None], "expected the file to draw into"),
        (["--run", "{first}", "--check"], "not both"),
        (["--run", "{first}", "--out", "d"], "not both"),
        (["--trace", "{tmp}/missing.jsonl"], "missing.jsonl does not exist"),
        ([], "the machine file to draw (no run given)"),
    ],
    ids=[
        "session",
        "run",
        "suffix",
        "suffix-before-the-runs",
        "misspelt-machine",
        "no-output",
        "check",
        "out",
        "missing-trace",
        "nothing",
    ],
)
def test_what_cannot_be_drawn_exits_2_with_one_line(
    tmp_path: Path,
    two_demos: tuple[Path, str, str],
    capsys: Capture,
    args: list[str | None],
    message: str,
) -> None:
    store, first, _ = two_demos
    given = [a.format(first=first, tmp=tmp_path) for a in args if a is not None]
    if None not in args and "-o" not in given:
        given += ["-o", str(tmp_path / "x.dot")]
    if None in args:
        given.remove("-o")

    assert main(["diagram", *given, "--store", str(store)]) == 2

    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1


def test_a_trace_file_or_run_that_cannot_be_read_is_named_as_its_option(
    tmp_path: Path, capsys: Capture
) -> None:
    # They said "invalid line 1='hello\n'" (which of the --trace files?) and
    # "invalid session_id=''", a field the command line has not.
    notes = tmp_path / "notes.txt"
    notes.write_text("hello\n")
    out = str(tmp_path / "x.mmd")
    assert main(["diagram", "--trace", str(notes), "-o", out]) == 2
    assert capsys.readouterr().err.startswith(
        f"turnfsm diagram: invalid --trace={str(notes)!r}: expected an OTLP/JSON "
        "trace file (invalid line 1="
    )
    store = str(tmp_path / "s.db")
    assert main(["diagram", "--run", ":", "--store", store, "-o", out]) == 2
    assert capsys.readouterr().err == (
        "turnfsm diagram: invalid --run=':': expected SESSION or SESSION:RUN\n"
    )


@pytest.mark.parametrize(
    ("data", "byte"),
    [(b"\xff\xfe", "0xff"), (gzip.compress(b"{}\n"), "0x8b")],
    ids=["not-utf8", "gzip"],
)
def test_a_trace_file_that_is_not_utf8_is_refused_in_one_line(
    tmp_path: Path, capsys: Capture, data: bytes, byte: str
) -> None:
    # It ended in a UnicodeDecodeError traceback.
    trace = tmp_path / "trace.jsonl"
    trace.write_bytes(data)
    assert main(["diagram", "--trace", str(trace), "-o", str(tmp_path / "x.mmd")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"turnfsm diagram: invalid --trace={str(trace)!r}: expected an OTLP/JSON "
        f"trace file (invalid line 1='byte {byte}': expected UTF-8 text; a "
        "compressed file (gzip, say) is decompressed first"
    )
    assert err.count("\n") == 1


def test_without_graphviz_svg_is_refused(
    tmp_path: Path,
    two_demos: tuple[Path, str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: Capture,
) -> None:
    store, first, _ = two_demos
    monkeypatch.setattr(shutil, "which", lambda _name: None)

    assert (
        main(
            [
                "diagram",
                "--run",
                first,
                "--store",
                str(store),
                "-o",
                str(tmp_path / "x.svg"),
            ]
        )
        == 2
    )
    assert "Graphviz's dot is not on the PATH" in capsys.readouterr().err


def test_a_drawing_dot_cannot_finish_is_given_up_and_the_others_are_drawn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Capture
) -> None:
    # dot takes many minutes over a machine of thousands of phases: the
    # command seemed to hang, with no bound.
    import time

    from turnfsm.cli import _diagram

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "dot").write_text("#!/bin/sh\nexec sleep 30\n")
    (bin_dir / "dot").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setattr(_diagram, "DOT_TIMEOUT", 0.2)
    machines = tmp_path / "machines"
    machines.mkdir()
    for name in ("a", "b"):
        shutil.copy(REPO_ROOT / "machines" / "turn.toml", machines / f"{name}.toml")
    out = tmp_path / "diagrams"

    began = time.monotonic()
    status = main(["diagram", str(machines), "--out", str(out)])

    assert time.monotonic() - began < 10
    assert status == 1
    assert sorted(p.name for p in out.iterdir()) == ["a.mmd", "b.mmd"]
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"turnfsm diagram: invalid --out={str(out / name)!r}: expected a drawing "
        "Graphviz's dot makes within 0.2 s: it was stopped, the machine being too "
        "large for it; use the .mmd, or write the .dot (--machine FILE -o NAME.dot) "
        "and run dot on it yourself"
        for name in ("a.svg", "b.svg")
    ]


def test_a_machine_alone_is_drawn_plain(tmp_path: Path, capsys: Capture) -> None:
    out = tmp_path / "turn.dot"

    assert (
        main(
            [
                "diagram",
                "--machine",
                str(REPO_ROOT / "machines" / "turn.toml"),
                "-o",
                str(out),
            ]
        )
        == 0
    )

    assert capsys.readouterr().out == "wrote turn.dot\n"  # relative to the cwd
    assert X not in out.read_text()
    assert "label=" in out.read_text()


# -- the path of traced runs -------------------------------------------------


class TransitionEvents(Hook):
    """What the tracing hook records: each transition as a span event."""

    def __init__(self, provider: TracerProvider) -> None:
        self.tracer = provider.get_tracer("turnfsm")
        self.spans: dict[str, Any] = {}

    def on_run_start(self, info: RunStartInfo) -> None:
        attributes = {
            "turnfsm.run.id": info.run_id,
            "gen_ai.conversation.id": info.session_id,
            "turnfsm.machine.name": "turn",
            "turnfsm.machine.digest": machine_digest(load_turn_spec()),
        }
        self.spans[info.run_id] = self.tracer.start_span(
            "invoke_agent demo", attributes=attributes
        )

    def on_transition(self, info: TransitionInfo) -> None:
        step = info.step
        span = self.spans[info.run_id]
        attributes: dict[str, Any] = {
            "turnfsm.transition.from": step.source,
            "turnfsm.transition.to": step.dest,
            "turnfsm.transition.trigger": step.trigger,
            "turnfsm.transition.index": step.index,
            "turnfsm.transition.guards": list(step.guards),
        }
        if step.reason is not None:
            attributes["turnfsm.transition.reason"] = step.reason.value
        span.add_event("turnfsm.transition", attributes)
        if step.dest in ("done", "failed"):
            span.end()


def test_a_traced_run_is_drawn_like_its_stored_self(
    tmp_path: Path, capsys: Capture
) -> None:
    trace = tmp_path / "trace.jsonl"
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(OTLPJSONFileExporter(trace)))
    agent = demo_agent(tmp_path / "s.db")

    async def run() -> str:
        try:
            hooks = [TransitionEvents(provider)]
            result = await agent.driver.run(TASK, session=agent.session, hooks=hooks)
        finally:
            await close_store(agent.store)
        return result.session_id

    session = anyio.run(run)
    provider.shutdown()
    traced, twice, stored = (tmp_path / n for n in ("a.dot", "b.mmd", "c.dot"))

    assert main(["diagram", "--trace", str(trace), "-o", str(traced)]) == 0
    both = ["--trace", str(trace), "--trace", str(trace)]
    assert main(["diagram", *both, "-o", str(twice)]) == 0
    from_store = ["--run", session, "--store", str(tmp_path / "s.db")]
    assert main(["diagram", *from_store, "-o", str(stored)]) == 0

    assert counts(traced) == counts(stored) == DEMO_PATH
    assert counts(twice) == {label: 2 * n for label, n in DEMO_PATH.items()}
    assert 'label="turn: 1 run (trace.jsonl);' in traced.read_text()


def otlp(events: list[dict[str, Any]], run: dict[str, str]) -> str:
    def kv(key: str, value: Any) -> dict[str, Any]:
        if isinstance(value, int):
            return {"key": key, "value": {"intValue": str(value)}}
        return {"key": key, "value": {"stringValue": value}}

    span = {
        "traceId": "1" * 32,
        "spanId": "2" * 16,
        "name": "invoke_agent x",
        "attributes": [kv(k, v) for k, v in run.items()],
        "events": [
            {
                "name": "turnfsm.transition",
                "attributes": [kv(f"turnfsm.transition.{k}", v) for k, v in e.items()],
            }
            for e in events
        ],
    }
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]})


MEASURED = {"from": "start", "to": "call_llm", "trigger": "measured", "index": 6}


def test_runs_on_two_machines_name_the_machine_to_pick(
    tmp_path: Path, capsys: Capture
) -> None:
    """A demo and a manual pass (`sessions compact`) ran on turn and compaction."""
    store = str(tmp_path / "sessions.db")
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert main(["demo", "--quiet", "--store", store]) == 0
        session = main(["sessions", "list", "--store", store])
    listed = re.search(r"^(ses_\w+) ", out.getvalue(), re.MULTILINE)
    assert session == 0
    assert listed is not None
    assert main(["sessions", "compact", listed[1], "--store", store]) == 0
    base = ["diagram", "--run", listed[1], "--store", store, "-o", "x.dot"]
    capsys.readouterr()

    assert main(base) == 2
    err = capsys.readouterr().err
    assert "the runs ran on compaction, turn" in err
    assert "--machine turn" in err
    assert "SESSION:RUN" in err
    assert main([*base, "--machine", "turn"]) == 0


@pytest.mark.parametrize(
    ("events", "run", "message"),
    [
        (
            [MEASURED],
            {"turnfsm.machine.name": "turn", "turnfsm.machine.digest": "0"},
            "ran on 'turn' 0, not on",
        ),
        (
            [{**MEASURED, "index": 7}],
            {"turnfsm.machine.name": "turn"},
            "#7 start --measured--> call_llm",
        ),
        ([{**MEASURED, "index": 99}], {"turnfsm.machine.name": "turn"}, "#99 start"),
        ([MEASURED], {"turnfsm.machine.name": "mine"}, "the machine file of 'mine'"),
        ([MEASURED], {}, "the runs ran on None"),
        ([], {}, "expected a trace with turnfsm.transition span events"),
        (
            [{**MEASURED, "from": "call_llm"}],
            {"turnfsm.machine.name": "turn"},
            "#6 call_llm --measured--> call_llm",
        ),
    ],
    ids=[
        "digest",
        "other-trigger",
        "no-such-index",
        "unshipped",
        "unnamed",
        "empty",
        "other-source",
    ],
)
def test_a_trace_of_another_machine_is_refused(
    tmp_path: Path,
    capsys: Capture,
    events: list[dict[str, Any]],
    run: dict[str, str],
    message: str,
) -> None:
    trace = tmp_path / "t.json"
    trace.write_text(otlp(events, {"turnfsm.run.id": "run_x", **run}))

    assert main(["diagram", "--trace", str(trace), "-o", str(tmp_path / "x.dot")]) == 2

    assert message in capsys.readouterr().err


def test_a_trace_without_a_machine_name_draws_with_machine(
    tmp_path: Path, capsys: Capture
) -> None:
    trace = tmp_path / "t.json"
    trace.write_text(otlp([MEASURED, MEASURED], {"turnfsm.run.id": "run_x"}))
    out = tmp_path / "x.dot"

    turn = str(REPO_ROOT / "machines" / "turn.toml")
    assert (
        main(["diagram", "--trace", str(trace), "--machine", turn, "-o", str(out)]) == 0
    )

    assert counts(out) == {"measured": 2}


def test_a_log_that_does_not_replay_is_refused(
    tmp_path: Path, two_demos: tuple[Path, str, str], capsys: Capture
) -> None:
    store, first, _ = two_demos
    log = tmp_path / "log.jsonl"
    assert (
        main(["sessions", "export", first, "--store", str(store), "--out", str(log)])
        == 0
    )
    lines = log.read_text().splitlines()
    for number, line in enumerate(lines):  # the first pass looks like no pass
        entry = json.loads(line)
        data = entry.get("data", {})
        if data.get("decision", "").startswith("compact:"):
            data["event"]["estimate"] = 10
            lines[number] = json.dumps(entry)
            break
    log.write_text("\n".join(restamp(lines)) + "\n")  # as one who knows the format
    other = tmp_path / "other.db"
    assert main(["sessions", "import", str(log), "--store", str(other)]) == 0
    capsys.readouterr()

    given = ["--run", first, "--store", str(other), "-o", str(tmp_path / "x.dot")]
    assert main(["diagram", *given]) == 2

    assert "diverges at event" in capsys.readouterr().err


# -- sub-agents: each child session's path beside the run that delegated ----

LEAF_PATH = {"run_started": 1, "measured": 1, "model_replied": 1}
MID_PATH = {
    "run_started": 1,
    "measured": 2,
    "model_replied [has_tool_calls]": 1,
    "tools_finished": 1,
    "model_replied": 1,
}


@pytest.fixture(scope="module")
def delegated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Session]]:
    """A store whose ``ses_lead`` delegated twice, one child once more."""
    store = delegating_store(tmp_path_factory.mktemp("store") / "sessions.db")
    return store, family(store)


def test_each_sub_agent_is_drawn_beside_the_run_naming_its_call(
    tmp_path: Path, delegated: tuple[Path, list[Session]], capsys: Capture
) -> None:
    store, (mid, leaf, solo) = delegated
    lead_run = mid.runs[0].opened.parent.run_id  # type: ignore[union-attr]

    assert main(["diagram", "--run", LEAD, "--store", str(store), "-o", "x.dot"]) == 0

    made = {
        mid.id: f"call call_mid of {LEAD}:{lead_run}",
        leaf.id: f"call call_leaf of {mid.id}:{mid.runs[0].run_id}",
        solo.id: f"call call_solo of {LEAD}:{lead_run}",
    }
    assert capsys.readouterr().out.splitlines() == [
        "wrote x.dot (1 run, 6 transitions)",
        f"wrote x.{mid.id}.dot (sub-agent for {made[mid.id]}: 1 run, 6 transitions)",
        f"wrote x.{leaf.id}.dot (sub-agent for {made[leaf.id]}: 1 run, 3 transitions)",
        f"wrote x.{solo.id}.dot (sub-agent for {made[solo.id]}: 1 run, 3 transitions)",
    ]
    assert counts(tmp_path / "x.dot") == MID_PATH
    expected = {mid.id: MID_PATH, leaf.id: LEAF_PATH, solo.id: LEAF_PATH}
    for child, path in expected.items():
        drawn = tmp_path / f"x.{child}.dot"
        assert counts(drawn) == path
        assert f'label="turn: sub-agent {child} for {made[child]} (1 run);' in (
            drawn.read_text()
        )


@pytest.mark.parametrize(("depth", "files"), [("0", 1), ("1", 3), ("2", 4)])
def test_depth_bounds_the_sub_agents_drawn(
    tmp_path: Path,
    delegated: tuple[Path, list[Session]],
    depth: str,
    files: int,
    capsys: Capture,
) -> None:
    store, _ = delegated
    args = ["diagram", "--run", LEAD, "--store", str(store), "--depth", depth]

    assert main([*args, "-o", "lead.mmd"]) == 0

    assert len(capsys.readouterr().out.splitlines()) == files
    assert len(list(tmp_path.glob("lead*.mmd"))) == files


def test_the_run_s_own_diagram_is_the_same_with_its_sub_agents_or_without(
    tmp_path: Path, delegated: tuple[Path, list[Session]], capsys: Capture
) -> None:
    store, _ = delegated
    args = ["diagram", "--run", LEAD, "--store", str(store)]

    assert main([*args, "-o", "with.dot"]) == 0
    assert main([*args, "--depth", "0", "-o", "without.dot"]) == 0

    assert (tmp_path / "with.dot").read_text() == (tmp_path / "without.dot").read_text()
    assert capsys.readouterr().out.splitlines()[-1] == (
        "wrote without.dot (1 run, 6 transitions)"
    )


def test_a_run_that_delegated_nothing_writes_one_file(
    tmp_path: Path, delegated: tuple[Path, list[Session]], capsys: Capture
) -> None:
    store, _ = delegated

    assert main(["diagram", "--run", ALONE, "--store", str(store), "-o", "a.mmd"]) == 0

    assert capsys.readouterr().out == "wrote a.mmd (1 run, 3 transitions)\n"
    assert [p.name for p in tmp_path.iterdir()] == ["a.mmd"]


def test_a_sub_agent_on_a_machine_of_its_own_is_drawn_on_its_logged_machine(
    tmp_path: Path, capsys: Capture
) -> None:
    text = (REPO_ROOT / "machines" / "turn.toml").read_text()
    copy = tmp_path / "mine.toml"
    copy.write_text(text.replace('name = "turn"', 'name = "mine"', 1))
    mine = turnfsm.load_machine(copy)
    leaf = Agent(model=FakeModelClient(lambda _request: "done"), machine=mine)
    store = tmp_path / "s.db"

    async def delegate() -> None:
        sessions = SQLiteStore(store)

        def answer(request: ModelRequest) -> Message:
            if request.messages[-1].tool_results:
                return reply("ok")
            return reply("", tool_call("leaf", "call_1", task="go"))

        lead = Agent(
            model=FakeModelClient(answer),
            tools=[leaf.as_tool(name="leaf", description="Answer")],
            session=Session("ses_top", store=sessions),
        )
        try:
            assert (await lead.run("go")).outcome == "done"
        finally:
            await sessions.aclose()

    anyio.run(delegate)

    assert (
        main(["diagram", "--run", "ses_top", "--store", str(store), "-o", "t.mmd"]) == 0
    )

    out, err = capsys.readouterr()
    assert err == ""
    lines = out.splitlines()
    assert lines[0] == "wrote t.mmd (1 run, 6 transitions)"
    (child,) = list(tmp_path.glob("t.*.mmd"))
    assert re.fullmatch(r"t\.ses_\w+\.mmd", child.name)
    # Drawn on the machine the sub-agent ran on, as its log keeps it (no
    # --machine was given, and "mine" is no shipped machine).
    assert "mine" in child.read_text()


def test_a_negative_depth_is_refused(capsys: Capture) -> None:
    args = ["diagram", "--run", LEAD, "--depth", "-1", "-o", "z.dot"]

    assert main(args) == 2

    assert capsys.readouterr().err == (
        "turnfsm diagram: invalid --depth=-1: expected an int >= 0\n"
    )
