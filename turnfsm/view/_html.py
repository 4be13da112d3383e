"""A session as HTML: its runs, their paths, plots, turns and passes.

Every piece of text from the log goes through one function, `_e`
(`html.escape`): a message holding HTML or a script is shown as text.
The only markup not built here is Graphviz's SVG of the machine, whose
labels Graphviz escapes itself.
"""

from __future__ import annotations

import html
import json
import shlex
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from typing import Final, TypeVar

import attrs

from turnfsm import _checks
from turnfsm.context import PinRules, pinned_ids, replaced_ids
from turnfsm.core import emergency_line, threshold_line
from turnfsm.driver import pin_rules
from turnfsm.errors import (
    Cancelled,
    ConfigError,
    SessionBusy,
    SubagentWaiting,
    busy_words,
)
from turnfsm.messages import ImagePart, Message
from turnfsm.persistence import (
    CompactionRecord,
    RunRecord,
    Session,
    TurnRecord,
    Verdict,
)
from turnfsm.view._paths import Diagram, edge_anchor, run_path
from turnfsm.view._subagents import below, delegated_by, sub_agent_list

__all__ = [
    "Links",
    "command_words",
    "more_button",
    "page",
    "pass_diff",
    "pass_rows",
    "path_section",
    "turn_detail",
    "turn_rows",
]

T = TypeVar("T")

_FULL_CONTEXTS: Final = 5_000
"""Most message renderings the turns' contexts may take in full in a report."""

_FULL_CONTEXT_CHARS: Final = 2_000_000
"""Most characters of text the turns' contexts may take in full in a report."""

_PLOT_POINTS: Final = 1_500
"""Most points a plot's line has (longer runs keep each stretch's peak)."""


def _e(value: object) -> str:
    """`value` as HTML text: the one way log content reaches the page."""
    return html.escape(str(value), quote=True)


@attrs.frozen(kw_only=True)
class Links:
    """How the page links to the live server (None: a self-contained report).

    Attributes:
        turn: ``(run index, turn) -> URL`` of a turn's details.
        more: ``(kind, run index, first) -> URL`` of the next page of a
            run's turns or passes (kind: ``turns`` or ``passes``).
        compaction: ``(run index, pass) -> URL`` of a pass's diff.
        path: ``run index -> URL`` of the run's path and diagram.
        answer: The URL the approve / reject form posts to (None: no form).
        token: The page's token, sent with the form.
        page_size: Turns listed before the "more" button.
        notice: A line to show on top (the last answer's outcome).
        unread: Why the sessions below cannot be read ("": they can).
        child: ``session id -> URL`` of a sub-agent session's page (None
            where it has none to show).
        held: Who holds the session's open run, when a live process or a
            durable run's workflow does (None: no one, or not known).
    """

    turn: Callable[[int, int], str]
    more: Callable[[str, int, int], str]
    compaction: Callable[[int, int], str]
    path: Callable[[int], str]
    answer: str | None = None
    token: str = ""
    page_size: int = 100
    notice: str = ""
    unread: str = ""
    child: Callable[[str], str | None] = lambda _session_id: None
    held: SessionBusy | None = None


def _asset(name: str) -> str:
    return resources.files("turnfsm.view").joinpath(name).read_text(encoding="utf-8")


def page(
    session: Session,
    *,
    where: str,
    links: Links | None = None,
    recent: int | None = None,
    sub_agents: Sequence[Session] = (),
    sub_agent_pages: int | None = None,
    commands: Sequence[str] = (),
) -> str:
    """Return the whole page of `session` (a report when `links` is None).

    `commands` are the options the commands the page gives take after
    their ids (``--store s.db``): those that find the session's store.

    A report replays each run's path now; the live page loads it. A report
    with `recent` holds only each run's last `recent` turns and the passes
    made during them, and says how many it left out (None: all of them).

    `sub_agents` are sessions below `session` (`descendants` reads them),
    each before its own (others are left out): a run lists those its tool
    calls started. A report
    holds the first `sub_agent_pages` of them (None: all) as pages of their
    own further down, linked from those lists, and says how many it left out.
    """
    runs = session.runs
    sub_agents = below(session.id, sub_agents)
    shown = sub_agents[:sub_agent_pages] if links is None else []
    full = links is None and _contexts_fit((session, *shown), recent)
    page_of = _pages(links, shown)
    connect = "'self'" if links is not None else "'none'"
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:; "
        f"connect-src {connect}; form-action 'self'\">",
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>turnfsm session {_e(session.id)}</title>",
        f"<style>{_asset('view.css')}</style>",
        "</head><body>",
        f'<header><h1>Session <code>{_e(session.id)}</code></h1><p class="meta">'
        f"{session.version} log entries, {len(runs)} run(s), "
        f"{len(session.history)} messages in its history; in {_e(where)}</p>",
    ]
    out += filter(None, [delegated_by(session, page_of)])
    if links is not None and links.notice:
        out.append(f'<pre class="notice">{_e(links.notice)}</pre>')
    if links is not None and links.unread:
        out.append(
            '<p class="warn unread">A sub-agent session of this one cannot be '
            f"read, so its sub-agent sessions are not shown: {_e(links.unread)}</p>"
        )
    if session.breaker_open:
        out.append(
            '<p class="warn">The compaction circuit breaker is open after '
            f"{session.compaction_failures} failure(s) in a row: passes make no "
            "model call (<code>turnfsm sessions reset-breaker</code> closes it).</p>"
        )
    out.append('<nav><ol class="runs-index">')
    for n, run in enumerate(runs):
        out.append(
            f'<li><a href="#run-{n}">{_e(run.run_id)}</a> '
            f'<span class="outcome {_e(run.outcome)}">{_e(run.outcome)}</span> '
            f"{len(run.turns)} turn(s), {len(run.compactions)} pass(es)</li>"
        )
    out.append("</ol></nav></header><main>")
    for n, run in enumerate(runs):
        rows = sub_agent_list(session, run, n, sub_agents, page_of)
        out += _run(
            session,
            run,
            n,
            links,
            full=full,
            recent=recent,
            rows=rows,
            commands=commands,
        )
    if links is None:
        out += _sub_agent_pages(shown, sub_agents, len(runs), full, recent, commands)
    out.append("</main>")
    out.append(f"<script>{_asset('view.js')}</script></body></html>")
    return "\n".join(out)


def _contexts_fit(sessions: Sequence[Session], recent: int | None) -> bool:
    """Whether a report may write out in full the contexts of the turns it holds.

    Both their messages and their text are bounded: one large message (a
    long tool result) kept in the context of many turns would otherwise be
    written out once for each. Over either bound, each turn shows what it
    added to the one before.
    """
    runs = [(s, run) for s in sessions for run in s.runs]
    count = sum(
        t.keep + len(t.added) for _s, run in runs for t in _last(run.turns, recent)
    )
    if count > _FULL_CONTEXTS:
        return False
    chars = 0
    for session, run in runs:
        sizes: dict[str, int] = {}
        for index in range(_first(len(run.turns), recent), len(run.turns)):
            for message_id in run.context(index):
                size = sizes.get(message_id)
                if size is None:
                    size = sizes[message_id] = _text_size(session, message_id)
                chars += size
                if chars > _FULL_CONTEXT_CHARS:
                    return False
    return True


def _text_size(session: Session, message_id: str) -> int:
    """About how many characters of text the message `message_id` shows."""
    try:
        message = session.message(message_id)
    except KeyError:
        return 0
    return len(message.text) + sum(len(r.content) for r in message.tool_results)


def _first(total: int, recent: int | None) -> int:
    """The index of the first of the last `recent` of `total` items (None: 0)."""
    return 0 if recent is None else max(0, total - recent)


def _last(items: Sequence[T], recent: int | None) -> Sequence[T]:
    return items[_first(len(items), recent) :]


def _left_out(kind: str, first: int, total: int) -> list[str]:
    """The note that says a report holds only the last of a run's `kind`."""
    if not first:
        return []
    return [
        f'<p class="left-out">This report holds the last {total - first} of '
        f"{total} {kind}: the first {first} are left out (the plot above shows "
        "every one; <code>turnfsm report --turns all</code> writes every one "
        "in full; <code>turnfsm view</code> shows every one, loading each as "
        "it is opened).</p>"
    ]


def _run(
    session: Session,
    run: RunRecord,
    n: int,
    links: Links | None,
    *,
    full: bool,
    recent: int | None = None,
    rows: Sequence[str] = (),
    commands: Sequence[str] = (),
) -> list[str]:
    out = [
        f'<section class="run" id="run-{n}" data-run="{_e(run.run_id)}">',
        f'<h2>Run <code>{_e(run.run_id)}</code> <span class="outcome '
        f'{_e(run.outcome)}">{_e(run.outcome)}</span></h2>',
    ]
    out += _outcome(session, run, links, commands)
    if run.continued:
        out.append(
            f'<p class="meta">Its durable run\'s workflow continued as new '
            f"{run.continued} time(s): a fresh Temporal history each time; the run "
            "went on.</p>"
        )
    out += rows  # the sub-agents its tool calls started
    count = len(run.compactions)
    total = len(run.turns)
    first_turn = _first(total, recent)
    # The passes it holds: those made during the turns it holds.
    first_pass = next(
        (k for k, r in enumerate(run.compactions) if r.turn >= first_turn), count
    )
    if links is None:
        out += path_section(
            run_path(session, run),
            n,
            run.run_id,
            first_turn=first_turn,
            first_pass=first_pass,
        )
    else:  # replayed by the server (it takes a while on a long run): loaded
        out.append(
            f'<section class="diagram" id="diagram-{n}" data-load="'
            f'{_e(links.path(n))}"><h3>Path</h3><p>drawing the path...</p></section>'
        )
    out += _plot(run, n, first_pass=first_pass)
    out.append(f'<section class="passes"><h3>Compaction passes ({count})</h3>')
    out += _left_out("passes", first_pass, count)
    out.append(f'<div class="pass-list" id="passes-{n}">')
    out += pass_rows(session, run, n, first_pass, count, links=links)
    out.append("</div></section>")
    out.append(f'<section class="turns"><h3>Turns ({total})</h3>')
    out += _left_out("turns", first_turn, total)
    out.append(f'<div class="turn-list" id="turns-{n}">')
    out += turn_rows(session, run, n, first_turn, total, links=links, full=full)
    out.append("</div></section></section>")
    return out


def _pages(
    links: Links | None, shown: Sequence[Session]
) -> Callable[[str], str | None]:
    """``session id -> address`` of a sub-agent's page: the live one, or a section."""
    if links is not None:
        return links.child
    held = {s.id for s in shown}
    return lambda session_id: f"#session-{session_id}" if session_id in held else None


def _row_of(session_id: str) -> Callable[[str], str | None]:
    """The address of `session_id`'s row in its parent's list, whatever is asked."""
    return lambda _parent: f"#sub-{session_id}"


def _sub_agent_pages(
    shown: Sequence[Session],
    every: Sequence[Session],
    first_run: int,
    full: bool,
    recent: int | None,
    commands: Sequence[str],
) -> list[str]:
    """A report's sections of the sub-agent sessions `shown`, each with its runs.

    Their runs are numbered on from `first_run`, so that every id on the page
    is its own; a session's header links back to its row in its parent's list.
    """
    out: list[str] = []
    n = first_run
    for child in shown:
        out.append(
            f'<section class="sub-agent-session" id="session-{_e(child.id)}">'
            f"<h2>Sub-agent session <code>{_e(child.id)}</code></h2>"
            + delegated_by(child, _row_of(child.id))
            + f'<p class="meta">{child.version} log entries, {len(child.runs)} '
            "run(s)</p>"
        )
        for run in child.runs:
            rows = sub_agent_list(child, run, n, every, _pages(None, shown))
            out += _run(
                child,
                run,
                n,
                None,
                full=full,
                recent=recent,
                rows=rows,
                commands=commands,
            )
            n += 1
        out.append("</section>")
    left = len(every) - len(shown)
    if left:
        out.append(
            f'<p class="left-out">This report holds the pages of {len(shown)} of '
            f"{len(every)} sub-agent sessions: the other {left} are left out "
            "(<code>turnfsm report --sub-agents all</code> holds every one; "
            "<code>turnfsm view</code> shows every one).</p>"
        )
    return out


def _no_reply(run: RunRecord) -> str:
    """What a run with no turn asked of its model: nothing, or calls with no reply."""
    failed = run.failed_calls
    if failed:
        return f"no model reply: {failed} call{'s' * (failed > 1)} failed"
    return "no model reply" if run.cut_short else "no model call"


def more_button(links: Links, kind: str, n: int, start: int, total: int) -> str:
    """The button that loads the next page of a run's turns or passes."""
    return (
        f'<button class="more" data-src="{_e(links.more(kind, n, start))}" '
        f'data-into="{kind}-{n}">more {kind} ({total - start} not loaded)</button>'
    )


def _outcome(
    session: Session, run: RunRecord, links: Links | None, commands: Sequence[str]
) -> list[str]:
    usage = run.usage
    out = [
        '<dl class="summary">',
        f"<dt>outcome</dt><dd>{_e(run.outcome)} in phase {_e(run.phase)}</dd>",
        f"<dt>machine</dt><dd>{_e(run.opened.machine)} ({_e(run.opened.digest)})</dd>",
        f"<dt>usage</dt><dd>none: {_e(_no_reply(run))}</dd>"
        if not run.turns
        else "<dt>usage</dt><dd>not reported by the provider</dd>"
        if run.usage_unreported
        else f"<dt>usage</dt><dd>{_e(usage.describe())} (reported)</dd>",
    ]
    if run.text:
        out.append(f'<dt>answer</dt><dd><pre class="answer">{_e(run.text)}</pre></dd>')
    if run.error is not None:
        out.append(
            f'<dt>error</dt><dd class="error"><code>{_e(type(run.error).__name__)}'
            f"</code>: {_e(run.error)}</dd>"
        )
    out.append("</dl>")
    held = links.held if links is not None else None
    if held is not None and run.is_open and held.run_id == run.run_id:
        # Its process or workflow is live: the form and the commands below
        # would be refused.
        words = shlex.join([session.id, *commands])
        said = busy_words(held, f"turnfsm resume|abandon {words} --force")
        out.append(f'<div class="paused"><p>{_e(said)}</p></div>')
    elif isinstance(run.error, SubagentWaiting):
        out += _waits_on_subagent(session, run, run.error, links, commands)
    elif run.outcome == "paused" and run.waiting is not None:
        calls = run.waiting.calls
        out.append(
            f'<div class="paused"><p>Paused in <code>{_e(run.waiting.phase)}</code>, '
            f"waiting on {len(calls)} tool call(s):</p><ul>"
        )
        for call in calls:
            out.append(
                f"<li><code>{_e(call.id)}</code> <b>{_e(call.name)}</b>"
                f"<pre>{_e(_json(call.arguments))}</pre></li>"
            )
        out.append("</ul>")
        target = _words(session.id, run.run_id, *commands)
        if run.waiting.takes_review:
            out += _answer_form(run, links)
            out.append(
                f"<p>Answer it: <code>turnfsm approve|reject|abandon {target}"
                "</code></p></div>"
            )
        else:  # a pause of a machine file of your own that takes only signals
            accepts = ", ".join(f"<code>{_e(a)}</code>" for a in run.waiting.answers)
            out.append(
                f"<p>It takes no review of its tool calls, but one of {accepts}: "
                "answer it with <code>Agent.resume</code>, or end it: "
                f"<code>turnfsm abandon {target}</code></p></div>"
            )
    elif run.outcome in ("interrupted", "running"):
        # An interrupted run ended in its log, saying why (from outside, a
        # sub-agent waiting, a store down); one still running did not end
        # there (its process died, or goes on).
        error = run.error
        if run.outcome == "interrupted" and (
            error is None or isinstance(error, Cancelled)
        ):
            how = (
                "The run was interrupted from outside (Ctrl-C, or a cancelled "
                "task); its log keeps what it finished"
            )
        elif run.outcome == "interrupted":
            how = (
                f"The run was interrupted: {_e(str(error))}; its log keeps what "
                "it finished"
            )
        else:
            how = (
                "The run did not end in its log (its process stopped, or it is "
                "still going)"
            )
        out.append(
            f'<div class="paused"><p>{how}. Carry it on: <code>turnfsm resume '
            f"{_words(session.id, run.run_id, *commands)}</code>, or end it: "
            f"<code>turnfsm abandon {_words(session.id, run.run_id, *commands)}"
            "</code></p></div>"
        )
    return out


def command_words(commands: object) -> tuple[str, ...]:
    """`commands` (the options a page's commands take) checked, as a tuple.

    Raises:
        ConfigError: it is not a sequence of strings (a string alone is not).
    """
    words = _checks.as_tuple(commands, "commands", "strings (command-line words)")
    _checks.check(words, "commands", _checks.each(str, "a string"))
    return words


def _words(*words: str) -> str:
    """`words` as a command line takes them (quoted for the shell), escaped."""
    return _e(shlex.join(words))


def _answer_form(run: RunRecord, links: Links | None) -> list[str]:
    """The approve / reject buttons of the live page (none in a report)."""
    if links is None or links.answer is None:
        return []
    return [
        f'<form method="post" action="{_e(links.answer)}" class="answer">'
        f'<input type="hidden" name="token" value="{_e(links.token)}">'
        f'<input type="hidden" name="run" value="{_e(run.run_id)}">'
        '<button name="action" value="approve">Approve</button> '
        '<button name="action" value="reject">Reject</button></form>'
    ]


def _waits_on_subagent(
    session: Session,
    run: RunRecord,
    waiting: SubagentWaiting,
    links: Links | None,
    commands: Sequence[str],
) -> list[str]:
    """A run stopped by its sub-agent's pause: what it waits on, how to answer."""
    out = [
        f'<div class="paused"><p>Stopped until its sub-agent '
        f"<code>{_e(waiting.tool)}</code> is answered: session "
        f"<code>{_e(waiting.session_id)}</code>, run <code>{_e(waiting.run_id)}"
        f"</code>, paused in <code>{_e(waiting.phase)}</code> on "
        f"{len(waiting.calls)} tool call(s): "
        + ", ".join(f"<code>{_e(c)}</code>" for c in waiting.calls)
        + ". The answer goes to the sub-agent, then this run goes on.</p>"
    ]
    out += _answer_form(run, links)
    out.append(
        f"<p>Answer it: <code>turnfsm approve|reject "
        f"{_words(session.id, run.run_id, *commands)}</code></p></div>"
    )
    return out


def _json(value: object) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def path_section(
    diagram: Diagram,
    n: int,
    run_id: str,
    *,
    first_turn: int = 0,
    first_pass: int = 0,
) -> list[str]:
    """The `n`-th run's path: its machine drawn with it, its transitions listed.

    Steps link to their turn or pass, except those before `first_turn` /
    `first_pass`, which a report left out. Each edge of the drawing that
    fired links to the first step that went along it; opening that step
    marks every step along the same edge.
    """
    out = [f'<section class="diagram" id="diagram-{n}"><h3>Path</h3>']
    if diagram.svg is not None:
        out.append(f'<div class="svg">{diagram.svg}</div>')
    elif diagram.mermaid:
        out.append(
            "<p>Graphviz is not installed: the diagram as Mermaid text.</p>"
            f'<pre class="mermaid-text">{_e(diagram.mermaid)}</pre>'
        )
    if diagram.problem:
        out.append(f'<p class="warn">{_e(diagram.problem)}</p>')
    out.append(
        f'<details class="path-steps"><summary>{len(diagram.steps)} transitions '
        'fired</summary><ol class="path">'
    )
    firsts: set[int] = set()
    left_out = 0
    for k, step in enumerate(diagram.steps):
        first = step.edge not in firsts
        firsts.add(step.edge)
        if k >= _PLOT_POINTS and not first:  # an edge's first step is always listed
            left_out += 1
            continue
        tokens = "" if step.estimate is None else f" ({step.estimate} tokens)"
        trigger = _e(step.trigger)
        if step.turn is not None:
            if step.turn >= first_turn:
                trigger = f'<a href="#turn-{n}-{step.turn}">{trigger}</a>'
        elif step.compaction is not None and step.compaction >= first_pass:
            trigger = f'<a href="#pass-{n}-{step.compaction}">{trigger}</a>'
        anchor = f' id="{_e(edge_anchor(run_id, step.edge))}"' if first else ""
        out.append(
            f'<li value="{step.event + 1}" data-edge="{step.edge}"{anchor}>'
            f"<code>{_e(step.source)}</code> "
            f"&#8212;{trigger}&#8594; <code>{_e(step.dest)}</code>{tokens}"
            "</li>"
        )
    if left_out:
        out.append(f"<li>... {left_out} more</li>")
    out.append("</ol></details></section>")
    return out


# -- the plot -----------------------------------------------------------

_W: Final = 900
_H: Final = 260
_PAD: Final = 48
_RIGHT: Final = 80  # room for the lines' names
_NUDGE: Final = {"window": -3.0, "threshold": 4.0, "emergency": 11.0}
"""Where each line's name sits from its line (window and emergency are close)."""


def _plot(run: RunRecord, n: int, *, first_pass: int = 0) -> list[str]:
    """The plot of `run`'s tokens; pass markers from `first_pass` on link to a diff."""
    budget = run.opened.budget
    window = budget.context_window
    turns = run.turns
    estimates = [t.estimate for t in turns]
    reported = [t.usage.input_tokens if t.usage else None for t in turns]
    known = [v for v in (*estimates, *reported) if v is not None]
    passes = [p.tokens_before for p in run.compactions]
    top = max([window, *known, *passes, 1]) * 1.05
    count = max(len(turns), 1)

    def x(turn: float) -> float:
        return _PAD + (_W - _PAD - _RIGHT) * (turn + 0.5) / count

    def y(tokens: float) -> float:
        return _H - _PAD + -(_H - 2 * _PAD) * tokens / top

    out = [
        f'<section class="plot" id="plot-{n}"><h3>Tokens sent per model call</h3>',
        f'<svg class="plot" viewBox="0 0 {_W} {_H}" role="img" '
        f'aria-label="tokens per model call of run {_e(run.run_id)}">',
        f'<line class="axis" x1="{_PAD}" y1="{_H - _PAD}" x2="{_W - _RIGHT}" '
        f'y2="{_H - _PAD}"/>',
    ]
    if window:
        lines = (
            ("window", window),
            (
                "threshold",
                threshold_line(window, budget.threshold, budget.threshold_tokens),
            ),
            ("emergency", emergency_line(window)),
        )
        for name, tokens in lines:
            if (
                name == "threshold"
                and not budget.threshold
                and budget.threshold_tokens is None
            ):
                continue
            out.append(
                f'<line class="limit {name}" x1="{_PAD}" x2="{_W - _RIGHT}" '
                f'y1="{y(tokens):.1f}" y2="{y(tokens):.1f}"><title>{name} line: '
                f"{tokens} tokens</title></line>"
                f'<text class="limit-label {name}" x="{_W - _RIGHT + 4}" '
                f'y="{y(tokens) + _NUDGE[name]:.1f}">{name}</text>'
            )
    for k, record in enumerate(run.compactions):
        at = x(record.turn - 0.5)
        line = (
            f'<line class="pass {_e(record.reason.value)}" '
            f'x1="{at:.1f}" x2="{at:.1f}" y1="{_PAD / 2}" y2="{_H - _PAD}">'
            f"<title>pass {k + 1} after turn {record.turn}: {_e(record.reason.value)}"
            f", {_e(record.verdict.value)}, {record.tokens_before} &#8594; "
            f"{record.tokens_after} tokens</title></line>"
        )
        # A pass a report left out has no diff to link to.
        out.append(f'<a href="#pass-{n}-{k}">{line}</a>' if k >= first_pass else line)
    for name, values in (("estimate", estimates), ("reported", reported)):
        points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in _thin(values))
        if points:
            out.append(f'<polyline class="series {name}" points="{points}"/>')
    label = f"{len(turns)} model call(s)"
    out.append(
        f'<text class="axis-label" x="{_PAD}" y="{_H - _PAD / 3:.0f}">{label}; '
        f"top: {int(top)} tokens</text>"
        '<text class="legend estimate" x="200" y="16">estimated</text>'
        '<text class="legend reported" x="290" y="16">reported by the provider</text>'
        '<text class="legend passes" x="470" y="16">compaction pass</text>'
    )
    out.append("</svg>")
    out.append(
        f'<p class="plot-note">Window {window}, threshold line '
        f"{threshold_line(window, budget.threshold, budget.threshold_tokens)}, "
        f"emergency line {emergency_line(window)} tokens; {len(run.compactions)} "
        "pass(es).</p></section>"
    )
    return out


def _thin(values: Sequence[int | None]) -> list[tuple[int, int]]:
    """The known `values` by index, at most `_PLOT_POINTS`: each stretch's peak."""
    known = [(i, v) for i, v in enumerate(values) if v is not None]
    if len(known) <= _PLOT_POINTS:
        return known
    size = -(-len(known) // _PLOT_POINTS)
    return [
        max(known[k : k + size], key=lambda p: p[1]) for k in range(0, len(known), size)
    ]


# -- the passes ----------------------------------------------------------


def pass_rows(
    session: Session,
    run: RunRecord,
    n: int,
    start: int,
    stop: int,
    *,
    links: Links | None = None,
) -> list[str]:
    """The passes ``start..stop`` of `run` (the `n`-th), one folded diff each.

    On the live page (`links` given) at most a page of them, each loading its
    diff when opened, then a button for the next page.
    """
    total = len(run.compactions)
    if links is not None:
        stop = min(stop, start + links.page_size)
    out: list[str] = []
    for k in range(start, min(stop, total)):
        record = run.compactions[k]
        out.append(f'<details class="pass" id="pass-{n}-{k}"')
        if links is None:
            out.append(">" + _pass_summary(record, k))
            out += pass_diff(session, run, n, k)
        else:
            out.append(
                f' data-src="{_e(links.compaction(n, k))}">{_pass_summary(record, k)}'
                '<div class="detail">loading...</div>'
            )
        out.append("</details>")
    if links is not None and stop < total:
        out.append(more_button(links, "passes", n, stop, total))
    return out


def _pass_summary(record: CompactionRecord, k: int) -> str:
    return (
        f"<summary>Pass {k + 1}, after turn {record.turn}: <b>"
        f"{_e(record.verdict.value)}</b> ({_e(record.reason.value)}, "
        f"{_e(record.strategy or 'no compactor')}) {record.tokens_before} &#8594; "
        f"{record.tokens_after} tokens</summary>"
    )


def pass_diff(session: Session, run: RunRecord, n: int, k: int) -> list[str]:
    """What pass `k` of `run` (the `n`-th) covered and what replaced it, side by side.

    Each side shows its messages as they were: the covered ones as the pass
    was given them, the others as it made them, so a message it changed
    under its id (a digested tool result) is marked changed on both sides. A
    replacement that names what it replaces links to each of them, pinned
    ones are marked.
    """
    record = run.compactions[k]
    given, made = _passed(session, record)
    kept = set(record.covers) & set(record.replacement)
    # Kept under its id but changed by the pass (a digested tool result).
    changed = {i for i in kept if i in given and i in made and given[i] != made[i]}
    kept -= changed
    removed = [i for i in record.covers if i not in kept and i not in changed]
    added = [i for i in record.replacement if i not in kept and i not in changed]
    said, after = _pass_meta(record, len(removed), len(added), len(changed), len(kept))
    out = [f'<div class="detail"><p class="pass-meta">{_e(said)}</p>']
    if record.payback is not None:
        out.append(
            f'<p class="pass-meta cost">By the prompt cache: '
            f"{_e(record.payback.describe())}.</p>"
        )
    out.append('<div class="diff"><div class="before"><h4>Covered (before)</h4>')
    pinned = _pinned(run, given, record.covers)
    for message_id in record.covers:
        mark = _mark(message_id, kept, changed, "removed")
        anchor = _original(n, k, message_id) if mark == "removed" else None
        out.append(
            _message(
                given, message_id, mark, pinned=message_id in pinned, anchor=anchor
            )
        )
    out.append("</div>")
    if after is not None:
        out.append(f'<div class="after"><h4>{after}</h4>')
        for message_id in record.replacement:
            mark = _mark(message_id, kept, changed, "added")
            out.append(_message(made, message_id, mark, pinned=message_id in pinned))
            if mark == "added":
                out += _replaces(made.get(message_id), n, k, set(removed))
        out.append("</div>")
    out.append("</div></div>")
    return out


def _pass_meta(
    record: CompactionRecord, removed: int, added: int, changed: int, kept: int
) -> tuple[str, str | None]:
    """What a pass replaced, in words; the heading of what it made (None: none)."""
    usage = ""
    if record.usage is not None:
        usage = f", its model calls: {_e(record.usage.describe())}"
    covered = len(record.covers)
    if record.compacted:
        return (
            f"{covered} message(s) covered, {len(record.replacement)} in their "
            f"place: {removed} removed, {added} new, {changed} changed, {kept} "
            f"kept; saved {record.tokens_saved} tokens (estimated){usage}."
        ), "In their place (after)"
    # The conversation went on as it was, whatever the pass made; what it
    # made is shown when the log keeps it (a result the brain refused).
    said = (
        f"{covered} message(s) covered, none replaced: "
        f"{_NOT_REPLACED[record.verdict]}, so the conversation went on as it "
        f"was{usage}."
    )
    if tuple(record.replacement) == tuple(record.covers):
        return said, None
    return said, "What the pass made (not taken)"


_NOT_REPLACED: Final = {
    Verdict.NOOP: "the pass changed nothing",
    Verdict.VETOED: "a hook vetoed the pass",
    Verdict.OVERFLOW: "what the pass made was still over the window",
    Verdict.FAILED: "the pass failed",
    Verdict.CIRCUIT_OPEN: "the circuit breaker was open, so no pass ran",
    Verdict.STALLED: "the pass saved too little, and was refused",
}
"""Why a pass that did not compact replaced nothing, by its verdict."""


def _mark(message_id: str, kept: set[str], changed: set[str], other: str) -> str:
    if message_id in changed:
        return "changed"
    return "kept" if message_id in kept else other


def _passed(
    session: Session, record: CompactionRecord
) -> tuple[dict[str, Message], dict[str, Message]]:
    """What the pass was given and what it made, by id, as they were then."""
    try:
        given, made = session.passed(record)
    except KeyError:  # a message the log does not hold: the originals it has
        found = _found(session, [*record.covers, *record.replacement])
        return found, found
    return {m.id: m for m in given}, {m.id: m for m in made}


def _original(n: int, k: int, message_id: str) -> str:
    """The id of a message a pass removed, shown in that pass's diff."""
    return f"was-{n}-{k}-{message_id}"


def _replaces(message: Message | None, n: int, k: int, removed: set[str]) -> list[str]:
    """Links from a replacement to the originals it names (those this pass removed)."""
    names = replaced_ids(message) if message is not None else ()
    if not names:
        return []
    links = [
        f'<a href="#{_e(_original(n, k, i))}"><code>{_e(i)}</code></a>'
        if i in removed
        else f"<code>{_e(i)}</code>"
        for i in names
    ]
    return [
        f'<p class="replaces">replaces {len(names)} message(s): {", ".join(links)}</p>'
    ]


# -- the turns ----------------------------------------------------------


def turn_rows(
    session: Session,
    run: RunRecord,
    n: int,
    start: int,
    stop: int,
    *,
    links: Links | None = None,
    full: bool = True,
) -> list[str]:
    """The rows of turns ``start..stop`` of `run` (the `n`-th): one each.

    In a report (`links` None) each row holds the turn's details; on the
    live page at most a page of rows, each loading its details when
    opened, then a button for the next page.
    """
    total = len(run.turns)
    if links is not None:
        stop = min(stop, start + links.page_size)
    out: list[str] = []
    for index in range(start, min(stop, total)):
        turn = run.turns[index]
        summary = _turn_summary(session, turn, index)
        if links is None:
            out.append(f'<details class="turn" id="turn-{n}-{index}">{summary}')
            out += turn_detail(session, run, index, full=full)
            out.append("</details>")
        else:
            src = _e(links.turn(n, index))
            out.append(
                f'<details class="turn" id="turn-{n}-{index}" data-src="{src}">'
                f'{summary}<div class="detail">loading...</div></details>'
            )
    if links is not None and stop < total:
        out.append(more_button(links, "turns", n, stop, total))
    return out


def _turn_summary(session: Session, turn: TurnRecord, index: int) -> str:
    reported = turn.usage.input_tokens if turn.usage else None
    counts = f"{_maybe(turn.estimate)} estimated, {_maybe(reported)} reported"
    try:
        reply = _first_line(session.message(turn.output))
    except KeyError:
        reply = "(the reply is not in the log)"
    return (
        f'<summary>Turn {index + 1}: <span class="counts">{counts}</span> '
        f'<span class="reply-line">{_e(reply)}</span></summary>'
    )


def _maybe(value: int | None) -> str:
    return "-" if value is None else str(value)


def _first_line(message: Message) -> str:
    lines = message.text.strip().splitlines()
    shown = lines[0][:100] if lines else ""
    calls = [call.name for call in message.tool_calls]
    if calls:
        shown = f"{shown} [calls {', '.join(calls)}]".strip()
    return shown


def turn_detail(
    session: Session, run: RunRecord, index: int, *, full: bool = True
) -> list[str]:
    """What the model saw on `run`'s turn `index`, and its reply.

    With `full`, every message of the context; else the messages added
    since the previous turn (the rest is named: kept from it).
    """
    turn = run.turns[index]
    ids = run.context(index)
    found = _found(session, [turn.output])
    # As the model saw them: a pass may have rewritten one under its id.
    found.update((m.id, m) for m in session.seen(run.run_id, index))
    pinned = _pinned(run, found, ids)
    out = ['<div class="detail">']
    if full or index == 0:
        out.append(f'<h4>Context: {len(ids)} message(s)</h4><div class="context">')
        out += [_message(found, i, "", pinned=i in pinned) for i in ids]
    else:
        out.append(
            f"<h4>Context: the first {turn.keep} message(s) of turn {index}'s, then "
            f'{len(turn.added)} more</h4><div class="context">'
        )
        out += [_message(found, i, "", pinned=i in pinned) for i in turn.added]
    out.append('</div><h4>Reply</h4><div class="reply">')
    out.append(_message(found, turn.output, "reply"))
    out.append("</div></div>")
    return out


def _found(session: Session, ids: Sequence[str]) -> dict[str, Message]:
    """The messages of `ids` the log holds, by id: each looked up once."""
    found: dict[str, Message] = {}
    for message_id in ids:
        try:
            found[message_id] = session.message(message_id)
        except KeyError:
            continue
    return found


def _pinned(
    run: RunRecord, found: Mapping[str, Message], ids: Sequence[str]
) -> frozenset[str]:
    """Which of `ids` (a conversation; its messages in `found`) the run's pins keep."""
    try:
        rules = pin_rules(run.opened.context)
    except ConfigError:  # rules this version does not know: the defaults
        rules = PinRules()
    return pinned_ids([found[i] for i in ids if i in found], rules)


def _url(image: ImagePart) -> str:
    """An image's URL as the page names it: an inline (data:) one by its head."""
    url = image.url
    if url.startswith("data:") and len(url) > 64:
        return f"{url.partition(',')[0][:64]},... ({len(url)} characters)"
    return url


def _message(
    found: Mapping[str, Message],
    message_id: str,
    mark: str,
    *,
    pinned: bool = False,
    anchor: str | None = None,
) -> str:
    message = found.get(message_id)
    if message is None:
        return (
            f'<div class="msg missing {mark}" data-id="{_e(message_id)}">'
            f"message <code>{_e(message_id)}</code> is not in the log</div>"
        )
    role = message.role.value
    tags = "".join(
        f'<span class="tag">{_e(key)}={_e(value)}</span>'
        for key, value in message.metadata.items()
    )
    classes = f"msg {role} {mark}" + (" pinned" if pinned else "")
    where = "" if anchor is None else f' id="{_e(anchor)}"'
    out = [
        f'<div class="{_e(classes.strip())}"{where} data-id="{_e(message.id)}">'
        f'<div class="msg-head"><span class="role">{_e(role)}</span> '
        f'<code class="id">{_e(message.id)}</code>{tags}'
        + (' <span class="pin">pinned</span>' if pinned else "")
        + (f' <span class="mark">{mark}</span>' if mark else "")
        + "</div>"
    ]
    if message.text:
        out.append(f'<pre class="text">{_e(message.text)}</pre>')
    for part in message.parts:
        if isinstance(part, ImagePart):  # named, never fetched
            out.append(f'<div class="image">image <code>{_e(_url(part))}</code></div>')
    for call in message.tool_calls:
        out.append(
            f'<div class="call">calls <b>{_e(call.name)}</b> '
            f"<code>{_e(call.id)}</code><pre>{_e(_json(call.arguments))}</pre></div>"
        )
    for result in message.tool_results:
        error = " error" if result.is_error else ""
        out.append(
            f'<div class="result{error}">result of <code>{_e(result.call_id)}</code>'
            f"{' (error)' if error else ''}<pre>{_e(result.content)}</pre></div>"
        )
    out.append("</div>")
    return "".join(out)
