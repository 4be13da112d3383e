"""Per strategy: tokens kept, probes present, judged answers, re-reads, passes."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Final, TypeAlias, final

import attrs

from turnfsm import _checks, context
from turnfsm.context import ContextCompactor, ContextManager, strategy_named
from turnfsm.errors import ConfigError, ProviderError
from turnfsm.evals._probes import Probe, context_text, present
from turnfsm.evals._replay import ReplayedCall, ReplayedSession, replay_session
from turnfsm.messages import Message
from turnfsm.persistence import Session
from turnfsm.providers import ModelClient, ModelRequest, ModelResponse
from turnfsm.values import Usage

__all__ = [
    "REREAD_SPAN",
    "STRATEGIES",
    "EvalProgress",
    "Evaluation",
    "Progress",
    "StrategyResult",
    "evaluate",
    "reread_rate",
    "shipped_strategy",
]

STRATEGIES: Final = tuple(context.STRATEGIES)
"""The shipped strategies `turnfsm eval` runs by default, by name.

Every one of `turnfsm.context.STRATEGIES`, in its order.
"""

REREAD_SPAN: Final = 24
"""How many tool calls after a pass a repeated call counts as a re-read."""


_NOTE_CHARS: Final = 300
"""The longest reason a report's note quotes, in characters."""


def _shortened(text: str) -> str:
    """`text` on one line, at most `_NOTE_CHARS` characters ("..." ends a cut)."""
    line = " ".join(text.split())
    if len(line) <= _NOTE_CHARS:
        return line
    return line[: _NOTE_CHARS - 3] + "..."


def _first_failure(replays: Sequence[ReplayedSession]) -> str:
    """How the first run cut short in `replays` ended, and why ("": none was).

    In words, without the run's id: ``ended failed in the simulation (done
    in the log): ...``.
    """
    for replay in replays:
        for run_id in replay.cut_short:
            said = f"run {run_id} "
            for difference in replay.differences:
                if difference.startswith(said):  # run ids are fresh each replay
                    return difference[len(said) :]
    return ""


def shipped_strategy(name: str, summary_model: ModelClient) -> ContextCompactor:
    """The shipped compactor `name` (one of `STRATEGIES`), with its defaults.

    The summarising ones (``summarizing``, ``layered``) summarise with
    `summary_model` (`turnfsm.context.strategy_named`).

    Raises:
        ConfigError: `name` is not one of `STRATEGIES`.
    """
    return strategy_named(name, summary_model=summary_model)


def reread_rate(calls: Sequence[ReplayedCall]) -> tuple[int, int]:
    """Re-reads after passes: (repeated calls, tool calls within the span).

    A tool call counts when it comes within `REREAD_SPAN` tool calls after a
    compaction pass; it is a re-read when an identical call (the same name
    and arguments) came earlier in the session.
    """
    seen: set[str] = set()
    passes = 0
    left = 0
    repeats = counted = 0
    for call in calls:
        if call.passes > passes:
            passes, left = call.passes, REREAD_SPAN
        for tool in call.reply.tool_calls:
            key = f"{tool.name} {tool.arguments_json()}"
            if left:
                left -= 1
                counted += 1
                repeats += key in seen
            seen.add(key)
    return repeats, counted


@final
@attrs.frozen
class ProbeResult:
    """One probe against one strategy's final context."""

    probe: Probe
    present: bool
    answer: str | None  # the judge's answer; None without a judge (or n/a)


@final
@attrs.frozen(kw_only=True)
class StrategyResult:
    """One strategy over every session evaluated.

    Attributes:
        strategy: Its name (a shipped one's, or the ``MODULE:ATTR`` given).
        history_tokens: The sessions' whole histories, uncompacted.
        final_tokens: The sessions' final contexts (the last model call's
            messages), counted as the histories are: without what the
            request reserved beside them (system prompt, tool schemas,
            reply budget).
        passes: Compaction passes.
        summary_calls: Calls to the summary model.
        summary_usage: What those calls reported using.
        probes: Each probe against its session's final context.
        judged: Whether a judge answered the probes.
        rereads: (re-reads, tool calls within the span after a pass).
        failed_runs: Runs cut short under the strategy: fewer model calls
            than recorded (a real run would have failed there too, e.g.
            over the window).
        cost: Every call and summary at the chosen prices, in US dollars
            (None: no prices asked for).
        summary_cost: The summaries' part of `cost`.
        failure: How the first run cut short ended, in words with its
            error ("" when none was).
    """

    strategy: str
    history_tokens: int
    final_tokens: int
    passes: int
    summary_calls: int
    summary_usage: Usage
    probes: tuple[ProbeResult, ...]
    judged: bool
    rereads: tuple[int, int]
    failed_runs: int
    cost: Decimal | None = None
    summary_cost: Decimal | None = None
    failure: str = ""

    @property
    def present_share(self) -> float:
        """The share of probes present in the final contexts (0..1)."""
        return sum(p.present for p in self.probes) / max(1, len(self.probes))

    @property
    def judged_share(self) -> float | None:
        """The share of probes the judge answered right, or None (no judge)."""
        if not self.judged:
            return None
        right = sum(
            p.answer is not None and present(p.probe, p.answer) for p in self.probes
        )
        return right / max(1, len(self.probes))

    @property
    def score(self) -> float:
        """What the floor is checked against: the judged share, else present."""
        judged = self.judged_share
        return self.present_share if judged is None else judged


def _money(value: Decimal | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _total(values: Iterable[Decimal | None]) -> Decimal | None:
    known = [v for v in values if v is not None]
    return sum(known, Decimal(0)) if known else None


def _fraction(n: int, total: int) -> str:
    return f"{n}/{total} ({n / total:.0%})" if total else "-"


@final
@attrs.frozen(kw_only=True)
class Evaluation:
    """What `evaluate` measured: one `StrategyResult` per strategy.

    Attributes:
        sessions: The session ids evaluated.
        window: The context window each was replayed on.
        results: One per strategy, in the order given.
        caveats: What the figures cannot know.
    """

    sessions: tuple[str, ...]
    window: int
    results: tuple[StrategyResult, ...]
    caveats: tuple[str, ...]

    def below(self, floor: float) -> tuple[StrategyResult, ...]:
        """The strategies whose `StrategyResult.score` is under `floor` (0..1)."""
        return tuple(r for r in self.results if r.score < floor)

    def table(self) -> str:
        """The report: a markdown table, a row per strategy, then the caveats."""
        judged = any(r.judged for r in self.results)
        head = [
            "strategy",
            "tokens kept",
            "passes",
            "summary calls",
            "summary tokens in/out",
            "probes present",
        ]
        head += ["judge right"] if judged else []
        head += ["re-reads after a pass", "runs cut short"]
        priced = any(r.cost is not None for r in self.results)
        head += ["cost $", "summary cost $"] if priced else []
        line = self.window * 80 // 100
        rows = [
            f"Sessions: {', '.join(self.sessions)}; window {self.window:,} "
            f"(threshold line {line:,}).",
            "",
            "| " + " | ".join(head) + " |",
        ]
        rows.append(
            "|" + "|".join("---" if i == 0 else "---:" for i in range(len(head))) + "|"
        )
        for r in self.results:
            n = len(r.probes)
            cells = [
                r.strategy,
                f"{r.final_tokens:,} of {r.history_tokens:,} "
                + (
                    f"({r.final_tokens / r.history_tokens:.1%})"
                    if r.history_tokens
                    else "(-)"
                ),
                str(r.passes),
                str(r.summary_calls),
                f"{r.summary_usage.input_tokens:,}/{r.summary_usage.output_tokens:,}",
                _fraction(sum(p.present for p in r.probes), n),
            ]
            if judged:
                share = r.judged_share
                cells.append("-" if share is None else _fraction(round(share * n), n))
            cells += [_fraction(*r.rereads), str(r.failed_runs)]
            if priced:
                cells += [_money(r.cost), _money(r.summary_cost)]
            rows.append("| " + " | ".join(cells) + " |")
        failures = [
            f"{r.strategy}: {r.failed_runs} runs cut short; the first "
            + _shortened(r.failure)
            for r in self.results
            if r.failed_runs and r.failure
        ]
        notes = "\n".join(f"- {c}" for c in (*failures, *self.caveats))
        parts = ["\n".join(rows), self.probe_table(), notes]
        return "\n\n".join(p for p in parts if p)

    def probe_table(self) -> str:
        """Each probe by strategy: + present, - absent (then the judge's mark)."""
        if not self.results:
            return ""
        names = [r.strategy for r in self.results]
        rows = [
            "| session | kind | question | " + " | ".join(names) + " |",
            "|---|---|---|" + "|".join(":---:" for _ in names) + "|",
        ]
        for n, first in enumerate(self.results[0].probes):
            cells = []
            for r in self.results:
                mark = "+" if r.probes[n].present else "-"
                if r.judged:
                    answer = r.probes[n].answer
                    right = answer is not None and present(first.probe, answer)
                    mark += "/" + ("+" if right else "-")
                cells.append(mark)
            probe = first.probe
            rows.append(
                f"| {probe.session or '(all)'} | {probe.kind} | {probe.question} | "
                + " | ".join(cells)
                + " |"
            )
        return "\n".join(rows)


@final
@attrs.frozen(kw_only=True)
class EvalProgress:
    """Where an evaluation is: what `evaluate` tells its `progress` callback.

    Attributes:
        strategy: The strategy being measured.
        strategy_number: Its number (1-based) among `strategies`.
        strategies: How many strategies are measured.
        session: The session being replayed.
        session_number: Its number (1-based) among `sessions`.
        sessions: How many sessions are replayed.
        step: ``"replay"`` (the session's replay begins), ``"summary"``
            (a summary call returned), ``"probe"`` (the judge answered a
            probe) or ``"done"`` (the strategy is measured).
        count: The summary calls so far (``"summary"``), the probe's number
            (``"probe"``), else 0.
        total: The session's probes (``"probe"``), else 0.
    """

    strategy: str
    strategy_number: int
    strategies: int
    session: str = ""
    session_number: int = 0
    sessions: int = 0
    step: str = "replay"
    count: int = 0
    total: int = 0

    def __str__(self) -> str:
        where = f"strategy {self.strategy_number}/{self.strategies} {self.strategy}"
        if self.step == "done":
            return f"{where}: measured"
        where += f", session {self.session_number}/{self.sessions} {self.session}"
        if self.step == "summary":
            return f"{where}: summary call {self.count}"
        if self.step == "probe":
            return f"{where}: judge answered probe {self.count}/{self.total}"
        return f"{where}: replaying"


Progress: TypeAlias = Callable[[EvalProgress], None]
"""A callback `evaluate` tells where it is (`EvalProgress`)."""


@attrs.define(eq=False)
class _Counting:
    """A summary model that counts its calls and sums their usage."""

    model: ModelClient
    calls: int = 0
    usage: Usage = attrs.field(factory=Usage)
    answered: Callable[[int], None] | None = None

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        response = await self.model.complete(request)
        if response.usage is not None:
            self.usage += response.usage
        if self.answered is not None:
            self.answered(self.calls)
        return response

    @property
    def context_window(self) -> int | None:
        window = getattr(self.model, "context_window", None)
        return window if isinstance(window, int) else None


def _telling(tell: Progress, here: EvalProgress) -> Callable[[int], None]:
    return lambda calls: tell(attrs.evolve(here, step="summary", count=calls))


_CAVEATS: Final = (
    "The replies and tool results are the recorded ones: a model that saw "
    "the compacted context might have answered, and called tools, "
    "differently. The re-read rate counts the recorded run's repeated calls "
    "that fall within 24 tool calls after each strategy's passes.",
    "Probes present: every expected string occurs, as a whole word, in the "
    "session's final context (the last model call's messages).",
)


def _question(messages: Sequence[Message], probe: Probe) -> ModelRequest:
    lines = []
    for m in messages:
        lines.append(f"[{m.role.value.upper()}]: {context_text([m])}")
    prompt = (
        "Here is a conversation between a user and an assistant, with its tool "
        "calls and results:\n\n"
        + "\n".join(lines)
        + f"\n\nAnswer from the conversation alone, briefly: {probe.question}"
    )
    return ModelRequest(messages=[Message.user(prompt)], max_tokens=64, temperature=0.0)


async def _ask(
    judge: ModelClient, messages: Sequence[Message], probe: Probe
) -> str | None:
    try:
        return (await judge.complete(_question(messages, probe))).message.text
    except ProviderError:
        return None


_MODEL: Final = _checks.instance(ModelClient, "a ModelClient", awaited=("complete",))
_JUDGE: Final = _checks.instance(
    ModelClient, "a ModelClient", optional=True, awaited=("complete",)
)
_SETTINGS: Final = _checks.instance(
    ContextManager,
    "a ContextManager (its compactor and window are replaced)",
    optional=True,
)


def _check_strategies(strategies: object) -> None:
    """Refuse `strategies` that are not names to functions making a compactor.

    Raises:
        ConfigError: not a mapping, a name that is no text, or a compactor
            (or anything else) where a function of the summary model is due.
    """
    if not isinstance(strategies, Mapping):
        raise ConfigError(
            "strategies",
            strategies,
            "a mapping of names to functions of the summary model making a "
            "compactor ({'layered': lambda m: shipped_strategy('layered', m)})",
        )
    for name, make in strategies.items():
        if not isinstance(name, str) or not name:
            raise ConfigError("strategies", name, "a strategy name (text)")
        if not callable(make):
            raise ConfigError(
                f"strategies[{name!r}]",
                make,
                "a function of the summary model making the compactor "
                "(lambda m: ..., not a compactor made once: each replay "
                "needs its own)",
            )


async def evaluate(
    sessions: Sequence[Session],
    probes: Sequence[Probe],
    *,
    strategies: Mapping[str, Callable[[ModelClient], ContextCompactor]],
    window: int,
    summary_model: ModelClient,
    judge: ModelClient | None = None,
    settings: ContextManager | None = None,
    prices: str | None = None,
    caveats: Sequence[str] = (),
    progress: Progress | None = None,
) -> Evaluation:
    """Replay every session under each strategy and check the probes.

    Args:
        sessions: Stored sessions (e.g. the corpus `store_corpus` writes).
        probes: The probes; each is checked against the final context of its
            session (``Probe.session``), or of every session ("").
        strategies: Name -> a function of the summary model making the
            compactor (``lambda m: shipped_strategy("layered", m)``).
        window: The context window to replay on.
        summary_model: The model the summarising strategies call.
        judge: A model asked each probe's question over each final context
            (None: presence only).
        settings: The context policy's other settings (threshold, counter,
            message-count line, ...), its compactor and window replaced per
            strategy; None: the `ContextManager` defaults.
        prices: A known model's name (``gpt-4o``) whose prices cost each
            call and summary (None: no costs).
        caveats: Added to the report's own (e.g. what the summary model is).
        progress: Told where the evaluation is (`EvalProgress`): each
            session's replay, each summary call, each probe the judge
            answered, each strategy measured (None: nothing is told).

    Raises:
        ConfigError: `sessions` are not stored sessions (or one is given
            twice) or `probes` not probes, a probe names a session not
            evaluated, a session has no probe, `strategies` are not names of
            functions making a compactor, a model is no `ModelClient`,
            `settings` no `ContextManager`, `progress` not callable, `prices`
            names no model with known prices, or `window` is no window or too
            small for a session's pinned messages.
    """
    sessions = _checks.as_tuple(sessions, "sessions", "stored Sessions")
    _checks.check(sessions, "sessions", _checks.each(Session, "a stored Session"))
    _checks.check(window, "window", _checks.integer(low=1, high=_checks.MAX_TOKENS))
    probes = _checks.as_tuple(probes, "probes", "Probes")
    _checks.check(probes, "probes", _checks.each(Probe, "a Probe"))
    ids = [s.id for s in sessions]
    for n, sid in enumerate(ids):
        if sid in ids[:n]:  # its figures would count twice
            raise ConfigError(
                f"sessions[{n}]", sid, "each session once (it is given twice)"
            )
    for n, probe in enumerate(probes):
        if probe.session and probe.session not in ids:
            raise ConfigError(f"probe[{n}].session", probe.session, f"one of {ids}")
    for sid in ids:
        if not any(p.session in ("", sid) for p in probes):
            raise ConfigError(
                "probes",
                list(probes),
                f"at least one probe for each session (none for {sid!r})",
            )
    _check_strategies(strategies)
    _checks.check(summary_model, "summary_model", _MODEL)
    _checks.check(judge, "judge", _JUDGE)
    _checks.check(settings, "settings", _SETTINGS)
    _checks.check(progress, "progress", _checks.callable_(optional=True))
    results = []
    tell = progress or (lambda _where: None)
    for number, (name, make) in enumerate(strategies.items(), 1):
        here = EvalProgress(
            strategy=name,
            strategy_number=number,
            strategies=len(strategies),
            sessions=len(sessions),
        )
        counting = _Counting(summary_model)
        compactor = make(counting)
        replays: list[ReplayedSession] = []
        checked: list[ProbeResult] = []
        # The final contexts' messages, counted as the histories are: what
        # a request reserves beside them (system prompt, tool schemas,
        # reply budget) is no part of what a strategy kept.
        final_tokens = 0
        for index, session in enumerate(sessions, 1):
            here = attrs.evolve(
                here, session=session.id, session_number=index, step="replay"
            )
            tell(here)
            counting.answered = _telling(tell, here)
            manager = attrs.evolve(
                settings or ContextManager(), compactor=compactor, context_window=window
            )
            try:
                replay = await replay_session(
                    session, manager, summary_model=counting, prices=prices
                )
            except ConfigError as exc:  # the window is this function's `window`
                if exc.field != "context_window":
                    raise
                raise attrs.evolve(exc, field="window") from None
            replays.append(replay)
            final = replay.calls[-1].messages if replay.calls else ()
            final_tokens += manager.count(final) if final else 0
            text = context_text(final)
            mine = [p for p in probes if p.session in ("", session.id)]
            for asked, probe in enumerate(mine, 1):
                answer = await _ask(judge, final, probe) if judge else None
                checked.append(ProbeResult(probe, present(probe, text), answer))
                if judge is not None:
                    tell(attrs.evolve(here, step="probe", count=asked, total=len(mine)))
        tell(attrs.evolve(here, step="done", count=0, total=0))
        rereads = [reread_rate(r.calls) for r in replays]
        results.append(
            StrategyResult(
                strategy=name,
                history_tokens=sum(r.history_tokens for r in replays),
                final_tokens=final_tokens,
                passes=sum(len(r.passes) for r in replays),
                summary_calls=counting.calls,
                summary_usage=counting.usage,
                probes=tuple(checked),
                judged=judge is not None,
                rereads=(sum(a for a, _ in rereads), sum(b for _, b in rereads)),
                failed_runs=sum(len(r.cut_short) for r in replays),
                cost=_total(r.cost for r in replays),
                summary_cost=_total(r.summary_cost for r in replays),
                failure=_first_failure(replays),
            )
        )
    return Evaluation(
        sessions=tuple(ids),
        window=window,
        results=tuple(results),
        caveats=(*_CAVEATS, *caveats),
    )
