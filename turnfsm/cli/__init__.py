"""The ``turnfsm`` command.

Its subcommands: demo, run, approve, sessions, report, view, replay, simulate,
diagram, eval, check.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import io
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

# Only what imports in a blink (no turnfsm package with its dependencies): the
# program's Ctrl-C handling starts in `script()`, and a Ctrl-C while this
# module imports would end it with a traceback.
from turnfsm.cli._errors import (
    INTERRUPTED_STATUS,
    stdout_to_devnull,
    stdout_unless_closed,
    stop_signals,
)

__all__ = ["main", "script"]

_STORE_HELP = (
    "where sessions are kept: a file path, sqlite:///PATH, a postgresql:// URL "
    "or memory: (default: $TURNFSM_STORE, else sessions.db in the user data dir)"
)

_ID_HELP = "the session's id (as `turnfsm sessions list` shows it)"


class _Parser(argparse.ArgumentParser):
    """A parser that names the choice a misspelt one is close to.

    ``--strategy summarising`` listed the choices only; the one meant is
    named too, as for a mistyped option.
    """

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as exc:
            import difflib

            from turnfsm.cli._strategies import not_offered

            choices = [str(c) for c in action.choices or ()]
            close = difflib.get_close_matches(str(value), choices, n=1)
            why = (
                not_offered(str(value)) if "--strategy" in action.option_strings else ""
            )
            if close:
                why = f"did you mean {close[0]!r}?"
            if not why:
                raise
            raise argparse.ArgumentError(action, f"{exc.message} ({why})") from None


class _Subcommand(_Parser):
    """A subcommand's parser: it refuses the arguments it does not know itself.

    Left to the program's parser, a mistyped option was reported with the
    program's usage, not the subcommand's, and no hint
    (``turnfsm: error: unrecognized arguments: --modle``).
    """

    def parse_known_args(  # type: ignore[override]  # argparse's stub overloads
        self, args: Sequence[str] | None = None, namespace: Any = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """Parse `args`; a usage error names any argument left unknown."""
        parsed, unknown = super().parse_known_args(args, namespace)
        if unknown:
            self.error(
                f"unrecognized arguments: {' '.join(unknown)}{_hint(self, unknown)}"
            )
        return parsed, unknown


def _hint(parser: argparse.ArgumentParser, unknown: list[str]) -> str:
    """`` (did you mean --model?)`` for the first unknown option like a known one."""
    import difflib

    known = [o for action in parser._actions for o in action.option_strings]
    for word in unknown:
        if word.startswith("--"):
            option = word.partition("=")[0]
            close = difflib.get_close_matches(option, known, n=1)
            if close:
                return f" (did you mean {close[0]}?)"
    return ""


def _percent(text: str) -> int:
    """A percentage as a whole number: ``80``; ``0.8`` names the 80 it meant."""
    try:
        return int(text)
    except ValueError:
        pass
    expected = "expected an int percentage in 0..100"
    try:
        fraction = float(text)
    except ValueError:
        fraction = 0.0
    if 0 < fraction <= 1:
        meant = f"{round(fraction * 100)}, not {text}"
        raise argparse.ArgumentTypeError(f"{expected} ({meant})")
    raise argparse.ArgumentTypeError(f"{expected}, not {text!r}")


def _path(text: str) -> str:
    """A file or directory an option names: refused when blank.

    An empty path is the current directory to the file system: ``--log ""``
    failed naming no file, and ``turnfsm check ""`` checked the directory.
    """
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a path, not {text!r}")
    return text


def _session_id(text: str) -> str:
    """A session id an argument names: refused when blank.

    It was refused later, as ``invalid session_id=''``: a name the user
    never typed.
    """
    if not text.strip():
        raise argparse.ArgumentTypeError(
            f"expected a session id (as `turnfsm sessions list` shows it), not {text!r}"
        )
    return text


def _named(what: str) -> Callable[[str], str]:
    """A name an option gives Temporal (a task queue, a namespace): refused when blank.

    A blank task queue was refused later, as ``invalid task_queue=''`` (a
    name the user never typed); a blank namespace reached the server.
    """

    def name(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"expected {what}, not {text!r}")
        return text

    return name


def _trace_options() -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(add_help=False)
    group = options.add_argument_group(
        "tracing",
        "spans are exported over OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is set "
        "(OTEL_EXPORTER_OTLP_PROTOCOL: http/protobuf or grpc)",
    )
    group.add_argument(
        "--trace",
        action="store_true",
        help="export spans over OTLP even with no endpoint set "
        "(default endpoint: http://localhost:4318)",
    )
    group.add_argument(
        "--trace-file",
        type=_path,
        metavar="FILE",
        help="also write the spans to FILE as OTLP/JSON lines "
        "(`turnfsm diagram --trace FILE` draws the path they took)",
    )
    return options


def _parser() -> argparse.ArgumentParser:
    from turnfsm import __version__
    from turnfsm.cli._strategies import DEMO_STRATEGIES, spoken

    parser = _Parser(
        prog="turnfsm", description="LLM agent loops on a declarative Turn FSM."
    )
    parser.add_argument("--version", action="version", version=f"turnfsm {__version__}")
    sub: Any = parser.add_subparsers(
        dest="command", required=True, parser_class=_Subcommand
    )
    traced = _trace_options()
    demo = sub.add_parser(
        "demo",
        parents=[traced],
        help="run the demo agent on a simulated model",
        description="Run the demo agent, which audits five log files through "
        "a read_log tool, printing each phase, measurement and compaction. On "
        "the simulated model (no network, key or server) its 8,000-token "
        "window makes it cross the threshold line, compact, and reach the "
        "emergency line once before it finishes. The session is stored "
        "(--store). Exit status: 0 done, 1 failed, 2 could not start, 130 "
        "interrupted by Ctrl-C.",
    )
    demo.add_argument("--quiet", action="store_true", help="print only the answer")
    demo.add_argument(
        "--model",
        choices=["simulated", "local"],
        default="simulated",
        help="simulated (default) or local: the bundled llama.cpp model",
    )
    demo.add_argument(
        "--log",
        type=_path,
        metavar="FILE",
        help="write the session's log to FILE (JSON lines)",
    )
    demo.add_argument("--store", metavar="SPEC", help=_STORE_HELP)
    default = "truncating"
    demo.add_argument(
        "--strategy",
        choices=DEMO_STRATEGIES,
        default=default,
        help="the compactor: "
        + spoken(tuple(n + " (default)" * (n == default) for n in DEMO_STRATEGIES)),
    )
    demo.add_argument(
        "--durable",
        action="store_true",
        help="run as a Temporal workflow on a `turnfsm worker` (see --task-queue)",
    )
    _temporal_options(demo, required=False)
    worker = sub.add_parser(
        "worker",
        parents=[traced],
        help="serve durable runs (Temporal workflows) on a task queue",
        description="Serve durable runs (Temporal workflows) of your agent "
        "(--agent; default: the demo agent) on a task queue of a Temporal "
        "server, until stopped with Ctrl-C. Needs the temporal extra.",
    )
    _temporal_options(worker, required=True)
    worker.add_argument(
        "--agent",
        metavar="MODULE:ATTR",
        help="the Agent(s) to serve: an Agent, a list, or a function making them "
        "(default: the demo agent)",
    )
    worker.add_argument("--store", metavar="SPEC", help=_STORE_HELP)
    replay = sub.add_parser(
        "replay",
        help="replay a session log's runs and check every decision",
        description="Feed each run of a session log (or of a stored session, "
        "--session) to a fresh machine and check that it makes every recorded "
        "decision again. Exit status: 0 every run replays exactly, 1 one "
        "diverges (the first diverging event is named), 2 the log or the "
        "machine cannot be read.",
    )
    replay.add_argument(
        "log",
        nargs="?",
        type=_path,
        help="a session log written by `turnfsm demo --log` or `turnfsm "
        "sessions export` (- reads it from standard input; or give --session "
        "ID to read one from a store)",
    )
    replay.add_argument(
        "--session", metavar="ID", type=_session_id, help="replay a stored session"
    )
    replay.add_argument("--store", metavar="SPEC", help=_STORE_HELP)
    replay.add_argument("--run", help="replay only this run id")
    replay.add_argument(
        "--machine",
        type=_path,
        help="replay on this machine file (default: the machine each run's "
        "log keeps, else the shipped machine of its name)",
    )
    _simulate_parser(sub)
    agent_options = _agent_options()
    run = sub.add_parser(
        "run",
        parents=[traced, agent_options],
        help="run one task: on a model, or on your own agent",
        description="Run one task with your own agent (--agent MODULE:ATTR) or "
        "one built of --model and the options below, printing the phases, the "
        "tool calls and the replies as they happen. Exit status: 0 done, "
        "1 failed, 2 could not start, 3 paused (answer it with `turnfsm "
        "approve`), 130 interrupted by Ctrl-C, SIGTERM or SIGHUP (carry it on with "
        "`turnfsm resume`).",
    )
    run.add_argument("task", help="what the agent should do")
    run.add_argument(
        "--session",
        metavar="ID",
        type=_session_id,
        help="continue this stored session (default: a new one)",
    )
    _answer_parsers(sub, agent_options, traced)
    _sessions_parser(sub)
    _view_parsers(sub, agent_options, traced)
    _diagram_parser(sub)
    _eval_parser(sub)
    check = sub.add_parser(
        "check",
        help="validate machine files",
        description="Load each machine file (and the *.toml files of each "
        "directory) and print every problem, with its line. Exit status: 0 "
        "every file loads, 1 one has problems (or a directory has no machine "
        "file).",
    )
    check.add_argument(
        "paths",
        nargs="+",
        type=_path,
        metavar="PATH",
        help="a machine file (TOML), or a directory: its *.toml files",
    )
    return parser


def _agent_options() -> argparse.ArgumentParser:
    from turnfsm.cli._strategies import AGENT_STRATEGIES

    options = argparse.ArgumentParser(add_help=False)
    group = options.add_argument_group(
        "the agent",
        "your own agent (--agent), or one built of --model and the rest",
    )
    group.add_argument(
        "--agent",
        metavar="MODULE:ATTR",
        help="your own Agent (or a function making one): its model, tools, "
        "machine and context; e.g. myapp.agents:support",
    )
    group.add_argument(
        "--model",
        help="openai:MODEL | anthropic:MODEL | local | http(s)://BASE_URL[#MODEL]",
    )
    group.add_argument(
        "--tools",
        metavar="MODULE:FUNC,...",
        help="the tools: functions, by MODULE:FUNC, comma-separated",
    )
    group.add_argument(
        "--machine",
        type=_path,
        metavar="FILE",
        help="the machine file, or a shipped one by its name: approval (review "
        "needs a reviewer of your own: build an Agent on it and give --agent) "
        "(default: the stock one; for a paused run, the one it began on, from "
        "the store)",
    )
    group.add_argument(
        "--strategy",
        choices=AGENT_STRATEGIES,
        help="the compactor (default: the context manager's own, masking)",
    )
    group.add_argument("--system", metavar="TEXT", help="the system prompt")
    group.add_argument(
        "--window",
        type=int,
        metavar="N",
        help="the context window in tokens (default: the model's)",
    )
    group.add_argument(
        "--n-ctx",
        type=int,
        default=None,
        metavar="N",
        help="the local model's server window (default: --window, else 4096)",
    )
    group.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        metavar="N",
        help="reply budget per model call (default 256; not with --agent)",
    )
    group.add_argument(
        "--max-turns",
        type=int,
        default=None,
        metavar="N",
        help="model calls per run (default 50; 3 with --model local; not with --agent)",
    )
    group.add_argument(
        "--model-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="how long one model call may take before it is retried or the "
        "run fails (default 300; not with --agent)",
    )
    group.add_argument("--store", metavar="SPEC", help=_STORE_HELP)
    return options


def _answer_parsers(
    sub: Any, agent_options: argparse.ArgumentParser, traced: argparse.ArgumentParser
) -> None:
    helps = {
        "approve": "approve every tool call a paused run waits on; it goes on",
        "reject": "reject a paused run's tool calls (the model hears why); it goes on",
        "resume": "carry on a run whose process ended (it runs no finished tool again)",
        "abandon": "end a paused or unfinished run as failed; the session "
        "takes new runs",
    }
    for action, text in helps.items():
        if action == "abandon":
            needs = (
                "It needs no model: only the store (--store, or your agent's "
                "own with --agent MODULE:ATTR)."
            )
        else:
            needs = (
                "Going on needs the model (and your tools): --agent "
                "MODULE:ATTR, or --model and --tools."
            )
        # The run goes on: its rest is traced as `turnfsm run` traced it.
        going_on = [] if action == "abandon" else [traced]
        answer = sub.add_parser(
            action,
            parents=[agent_options, *going_on],
            help=text,
            description=f"{text[0].upper()}{text[1:]}. Shows the calls the run "
            f"waits on first. The run and its machine come from the store. {needs}",
        )
        answer.add_argument(
            "session_id", metavar="SESSION", type=_session_id, help=_ID_HELP
        )
        answer.add_argument(
            "run_id",
            metavar="RUN",
            nargs="?",
            help="the run (default: the session's paused or unfinished one)",
        )
        if action == "reject":
            answer.add_argument(
                "--call",
                dest="calls",
                action="append",
                default=[],
                metavar="ID",
                help="reject only this call (repeat it; default: every call)",
            )
        if action == "reject":
            answer.add_argument(
                "--reason", metavar="TEXT", help="why (the model reads it)"
            )
        if action == "abandon":
            answer.add_argument(
                "--reason",
                metavar="TEXT",
                help="why (kept in the log as the run's error)",
            )
        answer.add_argument(
            "--force",
            action="store_true",
            help="take the session over though another process holds it "
            "(only if that process is known to be gone)",
        )


def _view_parsers(
    sub: Any, agent_options: argparse.ArgumentParser, traced: argparse.ArgumentParser
) -> None:
    report = sub.add_parser(
        "report",
        help="write a session's view as one HTML file (no network needed)",
        description="Write a stored session's view as one self-contained HTML "
        "file: for each run, the machine's diagram with the path it took, the "
        "tokens sent per model call against the window and its lines, what the "
        "model saw on every turn with its reply, and each compaction pass as "
        "a diff of what it covered and what replaced it.",
    )
    report.add_argument(
        "session_id", metavar="SESSION", type=_session_id, help=_ID_HELP
    )
    report.add_argument(
        "-o",
        "--output",
        type=_path,
        metavar="FILE",
        required=True,
        help="the HTML file to write ('-': standard output)",
    )
    report.add_argument(
        "--turns",
        metavar="N",
        help="hold each run's last N turns with their details and the passes "
        "made during them, and say how many were left out ('all': every one; "
        "default: 200)",
    )
    report.add_argument(
        "--sub-agents",
        metavar="N",
        help="hold the pages of the first N sub-agent sessions (its runs' "
        "sub-agents, and theirs), each linked from its run's list, and say how "
        "many were left out ('all': every one; default: 20)",
    )
    report.add_argument("--store", metavar="SPEC", help=_STORE_HELP)
    view = sub.add_parser(
        "view",
        parents=[agent_options, traced],
        help="serve a session's view in the browser (on this machine only)",
        description="Serve a stored session's view (as `turnfsm report` writes "
        "it) on 127.0.0.1 at a free port, behind a random token in its address, "
        "and open it in the browser; it runs until stopped (Ctrl-C). A paused "
        "run gets approve and reject buttons that do what `turnfsm approve` and "
        "`turnfsm reject` do: going on needs the model (and your tools): "
        "--agent MODULE:ATTR, or --model and --tools.",
    )
    view.add_argument("session_id", metavar="SESSION", type=_session_id, help=_ID_HELP)
    view.add_argument(
        "--port",
        type=int,
        default=0,
        metavar="N",
        help="the port (default: a free one)",
    )
    view.add_argument(
        "--no-open",
        action="store_true",
        help="do not open a browser: print the address only (on a server)",
    )


def _temporal_options(parser: argparse.ArgumentParser, *, required: bool) -> None:
    parser.add_argument(
        "--task-queue",
        metavar="Q",
        type=_named("a task queue's name"),
        required=required,
        default=None if required else "turnfsm-demo",
        help="the Temporal task queue" + ("" if required else " (turnfsm-demo)"),
    )
    parser.add_argument(
        "--address",
        default="127.0.0.1:7233",
        help="the Temporal server (default 127.0.0.1:7233)",
    )
    parser.add_argument(
        "--namespace",
        type=_named("a namespace's name"),
        default="default",
        help="the Temporal namespace (default)",
    )


def _diagram_parser(sub: Any) -> None:
    diagram = sub.add_parser(
        "diagram",
        help="render machine files to diagrams, or draw the path runs took",
        description="Render every machine file of a directory (Mermaid, and SVG "
        "with Graphviz); or, with --run / --trace, draw one machine into -o FILE "
        "with the path its runs took: each transition by how often it fired and "
        "the most tokens estimated then, summed over every run given.",
    )
    diagram.add_argument(
        "machines",
        nargs="?",
        type=_path,
        default=None,
        help="directory of *.toml machine files (default: shipped)",
    )
    diagram.add_argument(
        "--out",
        type=_path,
        default=None,
        help="output directory (default: diagrams/ beside the machines directory;"
        " ./diagrams for the shipped machines of an installed turnfsm)",
    )
    diagram.add_argument(
        "--check", action="store_true", help="fail if the committed diagrams are stale"
    )
    diagram.add_argument(
        "--run",
        action="append",
        default=[],
        metavar="SESSION[:RUN]",
        help="draw the path of a stored run (of every run of a session without "
        ":RUN); repeat it to add runs up",
    )
    diagram.add_argument(
        "--trace",
        action="append",
        type=_path,
        default=[],
        metavar="FILE",
        help="draw the paths of the runs in an OTLP/JSON trace file (one export "
        "request, or one per line); repeat it to add files up",
    )
    diagram.add_argument("--store", metavar="SPEC", help=_STORE_HELP)
    diagram.add_argument(
        "--machine",
        type=_path,
        metavar="FILE",
        help="the machine file the runs ran on (default: the shipped machine "
        "they name; its digest must match theirs)",
    )
    diagram.add_argument(
        "-o",
        "--output",
        type=_path,
        metavar="FILE",
        help="the file to draw into: .svg or .png (Graphviz), .dot or .mmd",
    )
    diagram.add_argument(
        "--depth",
        type=int,
        default=None,
        metavar="N",
        help="with --run: draw the runs' sub-agents this many levels down, each "
        "into a file of its own beside -o FILE (default 3; 0: none)",
    )


def _eval_parser(sub: Any) -> None:
    from turnfsm.cli._strategies import EVAL_STRATEGIES

    evaluate = sub.add_parser(
        "eval",
        help="measure what each compaction strategy keeps of stored sessions",
        description="Replay stored sessions under each compaction strategy (the "
        "recorded replies and tool results held fixed) and report per strategy "
        "the tokens kept, the passes, the summary calls, the probes still in "
        "the final context (and a judge model's answers), and the re-read "
        "rate. Without SESSION: the shipped corpus (a coding agent session "
        "and a long chat, with their probes). Exit status: 0 measured, 1 a "
        "strategy under --floor, 2 could not start.",
    )
    evaluate.add_argument(
        "sessions",
        nargs="*",
        metavar="SESSION",
        type=_session_id,
        help="a stored session's id (default: the shipped corpus)",
    )
    evaluate.add_argument(
        "--probes",
        type=_path,
        metavar="FILE",
        help="the probes (TOML or JSON; required with SESSION)",
    )
    evaluate.add_argument(
        "--strategy",
        dest="strategies",
        action="append",
        default=[],
        metavar="NAME",
        help=f"{', '.join(EVAL_STRATEGIES)}, or your compactor as MODULE:ATTR; "
        "repeat it (default: every shipped one)",
    )
    evaluate.add_argument(
        "--window",
        type=int,
        default=16_384,
        metavar="N",
        help="the context window to replay on (default 16384)",
    )
    evaluate.add_argument(
        "--summary-model",
        metavar="MODEL",
        help="the summarising strategies' model: openai:MODEL, anthropic:MODEL, "
        "local or a URL (default: a deterministic stand-in, no language model)",
    )
    evaluate.add_argument(
        "--judge",
        metavar="MODEL",
        help="also ask MODEL each probe's question over each final context",
    )
    evaluate.add_argument(
        "--floor",
        type=float,
        metavar="X",
        help="exit 1 when a strategy keeps under this share of the probes "
        "(0..1; the judge's answers when --judge is given)",
    )
    evaluate.add_argument(
        "--prices",
        metavar="MODEL",
        help="cost every call and summary at a known model's prices (gpt-4o)",
    )
    evaluate.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="say on stderr which strategy, session and probe it is on, "
        "and each summary call (default: when stderr is a terminal)",
    )
    evaluate.add_argument("--store", metavar="SPEC", help=_STORE_HELP)


def _sessions_parser(sub: Any) -> None:
    sessions = sub.add_parser(
        "sessions",
        help="list, show, compact, export, import, rm, reset-breaker",
        description="Without an action, lists the sessions (as `list` does).",
    )
    # Without an action: `list` (`main` fills it in). `--store` before the
    # action has a name of its own: an action's default would overwrite it.
    sessions.add_argument(
        "--store", metavar="SPEC", dest="sessions_store", help=_STORE_HELP
    )
    sessions.add_argument(
        "--limit",
        metavar="N",
        dest="sessions_limit",
        help="without an action: list the newest N sessions (as `list --limit N`)",
    )
    actions = sessions.add_subparsers(dest="action", required=False)
    store = argparse.ArgumentParser(add_help=False)
    store.add_argument("--store", metavar="SPEC", help=_STORE_HELP)
    listing = actions.add_parser(
        "list",
        parents=[store],
        help="the sessions, newest first: id, start and last activity times, "
        "entries, runs, last outcome",
    )
    listing.add_argument(
        "--limit",
        metavar="N",
        help="list the newest N sessions ('all': every one; default: 100)",
    )
    show = actions.add_parser(
        "show", parents=[store], help="a session's history, runs and compactions"
    )
    show.add_argument("session_id", metavar="ID", type=_session_id, help=_ID_HELP)
    export = actions.add_parser(
        "export", parents=[store], help="write a session's log (import reads it)"
    )
    export.add_argument("session_id", metavar="ID", type=_session_id, help=_ID_HELP)
    export.add_argument(
        "--format",
        choices=["jsonl", "json"],
        default="jsonl",
        help="jsonl: a header and one entry per line (default); json: one document",
    )
    export.add_argument(
        "-o",
        "--output",
        "--out",
        dest="out",
        type=_path,
        metavar="FILE",
        help="write to FILE (default, or -: stdout)",
    )
    load = actions.add_parser(
        "import", parents=[store], help="read an exported log into the store"
    )
    load.add_argument(
        "file", type=_path, metavar="FILE", help="an exported log (- for stdin)"
    )
    rm = actions.add_parser("rm", parents=[store], help="delete a session")
    rm.add_argument("session_id", metavar="ID", type=_session_id, help=_ID_HELP)
    rm.add_argument("--yes", action="store_true", help="do not ask first")
    rm.add_argument(
        "--force",
        action="store_true",
        help="delete it even while a run in another process holds it (that run "
        "stops at its next write)",
    )
    compact = actions.add_parser(
        "compact",
        parents=[store],
        help="compact a session now, outside any run (the operator's /compact)",
    )
    compact.add_argument("session_id", metavar="ID", type=_session_id, help=_ID_HELP)
    compact.add_argument(
        "--agent",
        metavar="MODULE:ATTR",
        help="the agent whose context manager compacts (default: the default "
        "one, MaskingCompactor: it caps and digests tool results, then "
        "truncates, and calls no model)",
    )
    compact.add_argument(
        "--force",
        action="store_true",
        help="take the session over from a process that holds it but is known "
        "to be gone (killed mid-pass: its lease lasts until it expires)",
    )
    reset = actions.add_parser(
        "reset-breaker",
        parents=[store],
        help="close a session's compaction circuit breaker (the operator's reset)",
    )
    reset.add_argument("session_id", metavar="ID", type=_session_id, help=_ID_HELP)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status.

    A reader that goes away (``turnfsm eval | head``) ends the command
    quietly with status 141, as a process stopped by SIGPIPE does. One
    started with it closed (``>&-``) fails as a full disk does.
    """
    stdout_unless_closed()
    _escape_what_stdout_cannot_encode()
    try:
        return _main(argv)
    except BrokenPipeError:
        stdout_to_devnull()
        return 141


def _escape_what_stdout_cannot_encode() -> None:
    r"""Have standard output write what its encoding lacks as escapes.

    A log holds any text: a file name that was not UTF-8 is a lone surrogate
    (``\udce9``), which a terminal in a UTF-8 locale refuses, and a Windows
    console's code page holds no Japanese. Such a character is printed as its
    escape, as standard error does, instead of failing the command. A stream
    that already has a way (Python's C locale writes surrogates back as the
    bytes they came from) keeps it.
    """
    stdout = sys.stdout
    if isinstance(stdout, io.TextIOWrapper) and stdout.errors == "strict":
        with contextlib.suppress(OSError, ValueError):
            stdout.reconfigure(errors="backslashreplace")


def script() -> None:
    """The ``turnfsm`` program: run :func:`main` and exit with its status.

    When the command used a Temporal client, the process ends without the
    interpreter's teardown, once its output is flushed: the Temporal SDK's
    background threads can abort a finalizing interpreter ("Fatal Python
    error: PyGILState_Release"), which would turn a finished command into a
    crash. So does a command Ctrl-C stopped: the teardown would wait for the
    threads of the tools it interrupted; and one whose run ended with a plain
    tool still running in its thread past its timeout (it says so on stderr,
    and runs the exit handlers first: traces are sent). Ctrl-C outside a run
    (while the SDKs import, say) ends the program with status 130 and one
    line, not a traceback; a run handles its own Ctrl-C first.
    """
    _stop_as_ctrl_c()
    try:
        status = main()
    except KeyboardInterrupt:
        print("\nturnfsm: interrupted", file=sys.stderr)
        status = INTERRUPTED_STATUS
    # Ctrl-C: a sync tool's worker thread cannot be stopped, and the
    # interpreter's teardown would wait for it (a second Ctrl-C there prints
    # a traceback); the run was logged interrupted and its store closed.
    if status == INTERRUPTED_STATUS or _TEMPORAL_BRIDGE in sys.modules:
        _flush()
        os._exit(status)
    left = _threads_left()
    if left:
        # A sync tool past its timeout goes on in its thread, and the teardown
        # would wait for it: the run ended and was logged, so nothing waits.
        print(
            f"turnfsm: not waiting for {left} thread{'' if left == 1 else 's'} "
            "still running (such as a plain tool past its timeout, which goes "
            "on until it returns); the command is done",
            file=sys.stderr,
        )
        atexit._run_exitfuncs()  # what the teardown would run: traces sent
        _flush()
        os._exit(status)
    sys.exit(status)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()


def _threads_left(grace: float = 0.5) -> int:
    """How many threads the interpreter's teardown would wait for, after `grace` s.

    A worker thread that has just finished its last call ends within the
    grace; one still running a tool does not.
    """
    ends = time.monotonic() + grace
    left = 0
    for thread in threading.enumerate():
        if thread is threading.main_thread() or thread.daemon:
            continue
        thread.join(max(0.0, ends - time.monotonic()))
        left += thread.is_alive()
    return left


_TEMPORAL_BRIDGE = "temporalio.bridge.temporal_sdk_bridge"


def _stop_as_ctrl_c() -> None:
    """Have SIGTERM and SIGHUP stop a command as Ctrl-C does.

    ``kill``, a service stopped or a terminal closed ended the program on
    the spot, in the middle of what it held (a compaction pass holds its
    session until its lease runs out); as Ctrl-C, what it holds is let go.
    An ignored SIGHUP (``nohup``) stays ignored; Ctrl-C is taken even when
    the program started with it ignored (a script's background job, which
    Python then leaves without its handler); a run takes all three its own
    way (see `turnfsm.cli._run.interruptible`).
    """
    for signum in stop_signals():
        if signal.getsignal(signum) in (signal.SIG_DFL, signal.SIG_IGN):
            signal.signal(signum, signal.default_int_handler)


def _main(argv: Sequence[str] | None) -> int:
    parser = _parser()
    given = sys.argv[1:] if argv is None else argv
    if not given:  # `turnfsm` alone: what it can do
        parser.print_help()
        return 0
    args = parser.parse_args(given)
    from turnfsm.errors import TurnFSMError

    try:
        with _store_wins(args):
            return _dispatch(args)
    except BrokenPipeError:
        raise
    except (TurnFSMError, OSError) as exc:  # one line, whichever command
        from turnfsm.cli._errors import fail

        name = " ".join(filter(None, [args.command, getattr(args, "action", None)]))
        return fail(name, exc)


@contextlib.contextmanager
def _store_wins(args: argparse.Namespace) -> Iterator[None]:
    """Make ``--store`` the store of every agent the command builds.

    ``--store`` wins over ``TURNFSM_STORE``: an agent module that `--agent`
    imports builds its `Agent` with the variable's store, opened then (a
    bad value failed the import, and a good one made a store file the
    command never used). The variable is as it was once the command ends.
    """
    store = getattr(args, "store", None)
    if not store:
        yield
        return
    from turnfsm.persistence import STORE_ENV

    was = os.environ.get(STORE_ENV)
    os.environ[STORE_ENV] = store
    try:
        yield
    finally:
        if was is None:
            os.environ.pop(STORE_ENV, None)
        else:
            os.environ[STORE_ENV] = was


_TRACED = ("demo", "run", "approve", "reject", "resume", "view", "worker")
"""The commands that run an agent, and so trace it (``--trace``, an endpoint set).

`turnfsm view` runs one when its Approve or Reject button carries a run on;
`turnfsm worker` runs the model and tool calls of durable runs."""


def _only_to_list(action: str, limit: str) -> None:
    """Refuse ``turnfsm sessions --limit N`` before an action that lists nothing.

    Raises:
        ConfigError: naming ``--limit``, its value and the action.
    """
    if action == "list":
        return
    from turnfsm.errors import ConfigError

    raise ConfigError(
        "--limit",
        limit,
        f"it only with `sessions` alone or `sessions list` (`sessions {action}` "
        "lists nothing)",
    )


def _dispatch(args: argparse.Namespace) -> int:
    carry_out = _command if args.command in ("demo", "run") else _other
    if args.command not in _TRACED:
        return carry_out(args)
    if args.command == "demo" and args.durable and (args.trace or args.trace_file):
        from turnfsm.errors import ConfigError

        # The run's calls are made (and traced) in the worker: here, the
        # option would export nothing, and --trace-file write no file.
        option = "--trace-file" if args.trace_file else "--trace"
        raise ConfigError(
            option,
            args.trace_file or True,
            "no tracing option with --durable: the worker makes the run's "
            f"spans, so give {option} to `turnfsm worker`",
        )
    from turnfsm.cli._tracing import traced

    with traced(
        force=args.trace,
        file=args.trace_file,
        quiet=getattr(args, "quiet", False),
        command=args.command,
    ):
        return carry_out(args)


def _command(args: argparse.Namespace) -> int:
    if args.command == "demo" and args.durable:
        from turnfsm.cli._worker import run_durable_demo

        return run_durable_demo(
            args.task_queue,
            address=args.address,
            namespace=args.namespace,
            quiet=args.quiet,
        )
    if args.command == "demo":
        from turnfsm.cli._demo import run_demo

        return run_demo(
            quiet=args.quiet,
            local=args.model == "local",
            log=args.log,
            store=args.store,
            strategy=args.strategy,
        )
    from turnfsm.cli._run import run_task

    return run_task(args.task, _options(args), session_id=args.session)


def _options(args: argparse.Namespace) -> Any:
    from turnfsm.cli._run import AgentOptions

    names = [f.name for f in AgentOptions.__attrs_attrs__]
    return AgentOptions(**{name: getattr(args, name) for name in names})


def _simulate_parser(sub: Any) -> None:
    from turnfsm.cli._strategies import AGENT_STRATEGIES, spoken

    simulate = sub.add_parser(
        "simulate",
        help="re-run a stored session's context policy under other settings",
        description="Re-run a stored session with its recorded replies and tool "
        "results held fixed, under the context settings its log keeps or the "
        "ones given, and print per model "
        "call the tokens that would be sent, each compaction pass, where the "
        "prompt cache would break and, with --prices, the cost. The model "
        "would have answered differently under other settings: the figures "
        "are what the recorded run would have sent. Exit status: 0 every run "
        "went as recorded, 1 a simulated run ended otherwise, 2 bad input.",
    )
    simulate.add_argument(
        "session_id", metavar="SESSION", type=_session_id, help=_ID_HELP
    )
    simulate.add_argument("--store", metavar="SPEC", help=_STORE_HELP)
    simulate.add_argument(
        "--strategy",
        metavar="NAME",
        help=f"the compactor, with its defaults: {spoken(AGENT_STRATEGIES)} "
        "(default: the compactor the session's log names, with its settings)",
    )
    simulate.add_argument(
        "--compactor",
        metavar="MODULE:ATTR",
        help="your compactor (or ContextManager, or a function making one)",
    )
    simulate.add_argument(
        "--newest-exchange",
        action="store_true",
        help="let the compactor cut inside the newest exchange (one long "
        "tool-using run)",
    )
    simulate.add_argument(
        "--window", type=int, metavar="TOKENS", help="the context window"
    )
    simulate.add_argument(
        "--threshold", type=_percent, metavar="PCT", help="the threshold line, in %%"
    )
    simulate.add_argument(
        "--machine",
        type=_path,
        metavar="FILE",
        help="the machine file to run on, or a shipped one by its name (approval)",
    )
    simulate.add_argument(
        "--prices",
        metavar="MODEL",
        help="cost each call at a known model's prices (gpt-4o, gpt-4o-mini, ...)",
    )
    simulate.add_argument(
        "--cache-payback",
        type=int,
        metavar="CALLS",
        help="with --prices: keep a pass at the threshold only when it pays "
        "back within CALLS calls (its prompt-cache cost against its saving)",
    )
    simulate.add_argument(
        "--summary-model",
        metavar="SPEC",
        help="answers the summaries the log does not hold: openai:MODEL, "
        "anthropic:MODEL, local, a base URL, or demo (the demo's model)",
    )


def _other(args: argparse.Namespace) -> int:
    if args.command in ("approve", "reject", "resume", "abandon"):
        from turnfsm.cli._answer import AnswerCommand, run_answer

        command = AnswerCommand(
            action=args.command,
            session_id=args.session_id,
            run_id=args.run_id,
            calls=tuple(getattr(args, "calls", ())),
            reason=getattr(args, "reason", None),
            force=args.force,
        )
        return run_answer(command, _options(args))
    if args.command == "replay":
        from turnfsm.cli._replay import run_replay

        return run_replay(
            args.log,
            run_id=args.run,
            machine=args.machine,
            store=args.store,
            session_id=args.session,
        )
    if args.command == "simulate":
        import attrs

        from turnfsm.cli._simulate import SimulateCommand, run_simulate

        given = vars(args)
        names = [f.name for f in attrs.fields(SimulateCommand)]
        return run_simulate(SimulateCommand(**{name: given[name] for name in names}))
    if args.command == "sessions":
        from turnfsm.cli._sessions import SessionsCommand, run_sessions

        options = vars(args)
        if options["action"] is None:  # `turnfsm sessions` alone lists
            options["action"] = "list"
        if options.get("store") is None:  # `turnfsm sessions --store X list`
            options["store"] = options["sessions_store"]
        if options["sessions_limit"] is not None:  # `turnfsm sessions --limit N`
            _only_to_list(options["action"], options["sessions_limit"])
            if options.get("limit") is None:
                options["limit"] = options["sessions_limit"]
        fields = SessionsCommand.__attrs_attrs__
        known = {f.name: options[f.name] for f in fields if f.name in options}
        return run_sessions(SessionsCommand(**known))
    if args.command == "report":
        from turnfsm.cli._view import run_report

        return run_report(
            args.session_id,
            args.output,
            store=args.store,
            turns=args.turns,
            sub_agents=args.sub_agents,
        )
    if args.command == "view":
        from turnfsm.cli._view import run_view

        return run_view(
            args.session_id,
            _options(args),
            port=args.port,
            open_browser=not args.no_open,
        )
    if args.command == "diagram":
        return _diagram_command(args)
    if args.command == "eval":
        from turnfsm.cli._eval import EvalCommand, run_eval

        names = [f.name for f in EvalCommand.__attrs_attrs__]
        return run_eval({name: getattr(args, name) for name in names})
    if args.command == "worker":
        from turnfsm.cli._worker import run_worker_command

        return run_worker_command(
            args.task_queue,
            address=args.address,
            namespace=args.namespace,
            agent=args.agent,
            store=args.store,
        )
    from turnfsm.cli._diagram import run_check

    return run_check(args.paths)


def _diagram_command(args: argparse.Namespace) -> int:
    from turnfsm.cli._diagram import run_diagram, run_overlay

    one = [args.run, args.trace, args.output, args.machine, args.store]
    one.append(args.depth is not None)
    if not any(one):
        return run_diagram(args.machines, args.out, check=args.check)
    if args.machines is not None or args.out is not None or args.check:
        print(
            "turnfsm diagram: --run, --trace, --machine and -o draw one file; "
            "MACHINES, --out and --check render a directory (not both)",
            file=sys.stderr,
        )
        return 2
    depth = {} if args.depth is None else {"depth": args.depth}
    return run_overlay(
        args.output,
        runs=args.run,
        traces=args.trace,
        machine=args.machine,
        store=args.store,
        **depth,
    )


if __name__ == "__main__":  # pragma: no cover
    script()
