"""`simulate`: a stored session's runs again, replies and tool results held fixed.

The runs go through a real `Driver` (the same brain, the same effects, the
same context manager code), on a stand-in model that gives back the
recorded replies in order and tool effects that give back the recorded
results by call id. The stored session is never written to: the simulation
runs in a `MemoryStore`.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any, Final, cast, final

import anyio
import anyio.lowlevel
import attrs

from turnfsm import _checks, tokens
from turnfsm._lines import window_to_send
from turnfsm._prices import priced
from turnfsm.context import (
    STRATEGIES,
    ContextCompactor,
    ContextManager,
    MaskingCompactor,
    first_change,
    strategy_named,
)
from turnfsm.core import (
    CallLLM,
    CompactionResult,
    CompactorFailed,
    ContextOverflowed,
    Event,
    MachineSpec,
    Measured,
    ModelReplied,
    OutputRejected,
    RunCancelled,
    RunTools,
    Signal,
    ToolCallsReviewed,
    ToolsFinished,
)
from turnfsm.driver import (
    Driver,
    EffectContext,
    RunControl,
    Tool,
    call_model,
    pin_rules,
    request_extras,
)
from turnfsm.driver import compact as builtin_compact
from turnfsm.errors import (
    CONTEXT_CHECK,
    REPLY_OVER_WINDOW,
    Cancelled,
    ConfigError,
    PinnedTooLarge,
    ProviderError,
    ReserveTooLarge,
    RunCrashed,
    TurnFSMError,
)
from turnfsm.messages import Message
from turnfsm.persistence import (
    CompactionRecord,
    ContextSettings,
    MemoryStore,
    RunRecord,
    Session,
)
from turnfsm.providers import (
    ModelClient,
    ModelPrices,
    ModelRequest,
    ModelResponse,
)
from turnfsm.tokens import TokenCounter, default_counter
from turnfsm.values import Usage

__all__ = ["SimulatedCall", "Simulation", "simulate", "stored_context"]

CAVEATS: Final[tuple[str, ...]] = (
    "the replies and tool results are the recorded ones: under other settings "
    "the model would have answered differently, so later calls are what the "
    "recorded run would have sent, not what a new run would do",
    "tokens are the context manager's estimates, not the provider's count",
)

_GOES_ON: Final = ("paused", "interrupted")

_PASS_DEADLINE: Final = 1800.0
"""Seconds a simulated pass may take: far past a working summary model's."""
"""The outcomes a simulated run can go on from: answered as its log says."""

_SUMMARY: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "turnfsm_simulate_summary", default=False
)


@final
@attrs.frozen(kw_only=True)
class SimulatedCall:
    """One model call of a simulated run.

    Attributes:
        run_id: The run.
        turn: The call's number within the run (1-based).
        tokens: The request's estimated size, as the run measured it before
            the call (reply budget and system prompt included).
        messages: The context the model would see.
        reply: The recorded reply it is given.
        cached_tokens: The tokens of the prefix shared with the previous
            call: what a prompt cache would serve.
        cache_break: Whether a compaction pass rewrote the previous call's
            context (the cache serves less than the previous call sent).
        cost: The call's price in US dollars at the chosen model's prices
            (None: no prices asked for).
        output_tokens: The reply's tokens: what the provider reported for
            it, else the estimate.
    """

    run_id: str
    turn: int
    tokens: int
    messages: tuple[Message, ...] = attrs.field(repr=False)
    reply: Message = attrs.field(repr=False)
    cached_tokens: int
    cache_break: bool
    cost: Decimal | None = None
    output_tokens: int = 0


@final
@attrs.frozen(kw_only=True)
class Simulation:
    """What simulating a stored session found.

    Attributes:
        session_id: The stored session.
        calls: Every model call of every run, in order.
        passes: Every compaction pass, in order.
        caveats: What the simulation cannot know.
        differences: Where a simulated run ended otherwise than the stored
            one (another outcome, recorded replies left over), in words.
        prices: The model whose prices cost the calls, or None.
        summary_cost: The price of the summaries' model calls (None: no
            prices asked for).
        pass_costs: The price of each pass's summary calls, in the order
            of `passes` (None each: no prices asked for).
        between_runs: The runs that are one manual pass made between runs
            (`Agent.compact`, `turnfsm sessions compact`), by id.
    """

    session_id: str
    calls: tuple[SimulatedCall, ...]
    passes: tuple[CompactionRecord, ...]
    caveats: tuple[str, ...] = CAVEATS
    differences: tuple[str, ...] = ()
    prices: str | None = None
    summary_cost: Decimal | None = None
    pass_costs: tuple[Decimal | None, ...] = ()
    between_runs: tuple[str, ...] = ()

    @property
    def tokens_sent(self) -> int:
        """The tokens of every call's request, summed."""
        return sum(c.tokens for c in self.calls)

    @property
    def summary_calls(self) -> int:
        """The passes that called a model for a summary."""
        return sum(1 for p in self.passes if p.usage is not None)

    @property
    def declined(self) -> int:
        """The passes the context manager declined: they would not pay back in time."""
        return sum(1 for p in self.passes if p.payback and p.payback.declined)

    @property
    def cache_breaks(self) -> int:
        """The calls whose prompt cache a pass broke."""
        return sum(1 for c in self.calls if c.cache_break)

    @property
    def cost(self) -> Decimal | None:
        """The price of every call and summary, or None without prices."""
        if self.prices is None:
            return None
        total = sum((c.cost or Decimal(0) for c in self.calls), Decimal(0))
        return total + (self.summary_cost or Decimal(0))

    @property
    def totals(self) -> Mapping[str, Any]:
        """Tokens sent, passes (compacted, declined), summary calls, breaks, cost."""
        return {
            "calls": len(self.calls),
            "tokens_sent": self.tokens_sent,
            "passes": len(self.passes),
            "compacted": sum(1 for p in self.passes if p.compacted),
            "declined": self.declined,
            "summary_calls": self.summary_calls,
            "cache_breaks": self.cache_breaks,
            "cost": self.cost,
        }

    def table(self) -> str:
        """The per-call table, the passes and the totals, as the CLI prints them."""
        priced = self.prices is not None
        head = f"{'run':<24} {'call':>4} {'tokens':>7} {'cached':>7} {'break':>5}"
        lines = [head + (f" {'cost $':>10}" if priced else "")]
        for c in self.calls:
            row = (
                f"{c.run_id:<24} {c.turn:>4} {c.tokens:>7} {c.cached_tokens:>7} "
                f"{'yes' if c.cache_break else '':>5}"
            )
            lines.append(row + (f" {_money(c.cost):>10}" if priced else ""))
        lines.append("")
        lines.append(f"passes: {len(self.passes)}")
        costs = self.pass_costs or (None,) * len(self.passes)
        for p, cost in zip(self.passes, costs, strict=True):
            # A pass in turn t (t calls made) comes after call t, which the
            # table numbers from 1: one before any call comes before call 1.
            # A manual pass is a run of its own, made between runs.
            if p.run_id in self.between_runs:
                when = "between runs"
            else:
                when = f"after call {p.turn}" if p.turn else "before call 1"
            lines.append(
                f"  {p.run_id} {when}: {p.reason} -> {p.verdict} "
                f"({p.strategy or 'no compactor'}, "
                f"{p.tokens_before} -> {p.tokens_after} tokens"
                + (f", summary ${_money(cost)})" if p.usage and priced else ")")
            )
            if p.payback is not None and p.payback.priced:
                lines.append(f"    cache: {p.payback.describe()}")
        t = self.totals
        lines.append("")
        lines.append(
            f"totals: {t['calls']} calls, {t['tokens_sent']} tokens sent, "
            f"{t['passes']} passes ({t['compacted']} compacted"
            + (f", {t['declined']} declined" if t["declined"] else "")
            + "), "
            f"{t['summary_calls']} summary calls, {t['cache_breaks']} cache breaks"
            + (f", cost ${_money(self.cost)} at {self.prices} prices" if priced else "")
        )
        lines.append("")
        lines.extend(f"note: {c}" for c in self.caveats)
        lines.extend(f"differs: {d}" for d in self.differences)
        return "\n".join(line.rstrip() for line in lines)


def _money(value: Decimal | None) -> str:
    return "" if value is None else f"{value:.6f}"


@final
@attrs.frozen(kw_only=True)
class _Recorded:
    """What a stored run's log says the model replied and the tools returned."""

    replies: tuple[tuple[Message, Usage | None], ...]
    results: Mapping[str, Message]
    answers: tuple[Event, ...] = ()
    """What answered the run's pauses (a review, a signal, an abandon), in order."""
    rejected: Mapping[str, OutputRejected] = attrs.field(factory=dict)
    """The replies the run's output type refused, by their message's id."""
    refusals: tuple[tuple[int, ContextOverflowed], ...] = ()
    """The calls refused as too long, by the provider or by the window check of
    a reply: (the replies before each, its event)."""


def _recorded(run: RunRecord) -> _Recorded:
    replies: list[tuple[Message, Usage | None]] = []
    results: dict[str, Message] = {}
    answers: list[Event] = []
    rejected: dict[str, OutputRejected] = {}
    refusals: list[tuple[int, ContextOverflowed]] = []
    for event in run.events:
        if isinstance(event, ModelReplied | OutputRejected):
            replies.append((event.message, event.usage))
            if isinstance(event, OutputRejected):
                rejected[event.message.id] = event
        elif isinstance(event, ContextOverflowed) and (
            event.error.type != CONTEXT_CHECK
            or event.error.message.startswith(REPLY_OVER_WINDOW)
        ):
            # The provider's, or the run's own of a reply the log does not
            # keep: given again at its place among the calls (the request's
            # own check refuses again by itself).
            refusals.append((len(replies), event))
        elif isinstance(event, ToolsFinished):
            for message in event.results:
                for part in message.tool_results:
                    results[part.call_id] = message
        elif isinstance(event, ToolCallsReviewed | Signal | RunCancelled):
            answers.append(event)
    return _Recorded(
        replies=tuple(replies),
        results=results,
        answers=tuple(answers),
        rejected=rejected,
        refusals=tuple(refusals),
    )


async def _answered(
    driver: Driver, sim: Session, run_id: str, answers: Sequence[Event], result: Any
) -> Any:
    """`result`, the run's pauses answered again as its log says, in order.

    A pause the next recorded answer does not fit (the simulated run paused
    elsewhere) is left as it is; an interruption the log abandoned since is
    abandoned again.
    """
    pending = list(answers)
    while result.outcome in _GOES_ON and pending:
        answer = pending.pop(0)
        try:
            if isinstance(answer, RunCancelled):
                result = await driver.abandon(sim, run_id, reason=answer.reason)
            else:
                result = await driver.resume(sim, run_id, answer)
        except ConfigError:  # not an answer this pause takes
            break
    return result


@final
class _ReplayModel:
    """Gives back the current run's recorded replies, in order."""

    def __init__(self, summary_model: ModelClient | None) -> None:
        self.summary_model = summary_model
        self.replies: list[tuple[Message, Usage | None]] = []
        self.given = 0  # the current run's calls answered so far
        self.run_id = ""
        self.missing: ConfigError | None = None
        self.stop: _Stop | None = None
        self.failed: list[CompactorFailed] = []

    def start(
        self,
        run_id: str,
        replies: Sequence[tuple[Message, Usage | None]],
        stop: _Stop | None = None,
        failed: Sequence[CompactorFailed] = (),
    ) -> None:
        """Answer run `run_id`'s calls with its recorded `replies` from now on.

        With `stop` (the log stops inside the run), a call past them
        interrupts the run there, as it was. `failed` are the run's passes
        that failed, in order: a summary the log does not hold is asked of
        such a pass, and fails as it did.
        """
        self.run_id = run_id
        self.replies = list(replies)
        self.given = 0
        self.stop = stop
        self.failed = list(failed)

    async def complete(self, request: ModelRequest) -> ModelResponse:
        if _SUMMARY.get():
            if self.summary_model is None and self.failed:
                # The recorded pass failed here (its summary model was down):
                # the simulated one fails the same way, with the same words.
                error = self.failed.pop(0).error
                raise ProviderError(error.message, retryable=False, status=error.status)
            if self.summary_model is None:
                self.missing = ConfigError(
                    "summary_model",
                    None,
                    "a model for the summaries the strategy asks for: in run "
                    f"{self.run_id} a pass needs a summary the log does not "
                    "hold (its conversation differs from the recorded one)",
                    missing=True,
                )
                raise self.missing
            return await self.summary_model.complete(request)
        if not self.replies and self.stop is not None:
            await self.stop.here()
        if not self.replies:
            # The simulated run asks for more calls than the log recorded:
            # it ends there, as a failed call (the report says so).
            raise ProviderError(
                f"no recorded reply for call {self.given + 1} (the log holds "
                f"{self.given}: the recorded run ended before it)",
                retryable=False,
            )
        message, usage = self.replies.pop(0)
        self.given += 1
        return ModelResponse(message=message, usage=usage)


@final
class _Reserved:
    """The context manager's counter, with the stored run's reserved tokens.

    The stored log keeps the size of each request (its messages, the system
    prompt, the tool schemas, the reply budget) but not the system prompt or
    the schemas themselves: the simulation's request carries one stand-in
    text, counted as what the stored run reserved beside its messages before
    the call the simulated run is about to make. The reply budget may change
    within a run (one resumed with another ``--max-tokens``), so the figure
    is the one the log shows for that call.
    """

    TEXT: Final = "\x00turnfsm simulate: the stored run's reserved tokens"

    def __init__(
        self,
        inner: TokenCounter,
        reserved: Sequence[int],
        model: _ReplayModel,
        free: str = "",
    ) -> None:
        self.inner = inner
        self.reserved = reserved
        self.model = model
        self.free = free  # the stand-in tools' schemas: in the reserved figure

    def count(self, messages: Sequence[Message]) -> int:
        return self.inner.count(messages)

    def count_text(self, text: str) -> int:
        if text == self.TEXT:
            return self.reserved[min(self.model.given, len(self.reserved) - 1)]
        if self.free and text == self.free:
            return 0
        return self.inner.count_text(text)


def _stand_in_tools(run: RunRecord, answers: Sequence[Event]) -> list[Tool]:
    """A tool for each one `run` called, when a review answered its pauses.

    A paused run goes on with a review only when it has the tools of the
    calls the review lets run; none of these runs (the recorded results
    stand in for them), and their schemas count as nothing beside what the
    stored run reserved.
    """
    if not any(isinstance(a, ToolCallsReviewed) for a in answers):
        return []
    names = sorted(
        {
            call.name
            for event in run.events
            if isinstance(event, ModelReplied | OutputRejected)
            for call in event.message.tool_calls
        }
    )
    return [
        Tool(
            name=name,
            description="recorded",
            parameters={"type": "object"},
            fn=_not_run,
        )
        for name in names
    ]


def _not_run(**_arguments: object) -> str:  # pragma: no cover - never called
    raise AssertionError("a simulated tool call gets its recorded result")


class _SeededSession:
    """The simulated session as a pass sees it, with the stored summaries."""

    def __init__(self, session: Session, summaries: Mapping[str, str]) -> None:
        self._session = session
        self._summaries = summaries

    @property
    def compaction_failures(self) -> int:
        return self._session.compaction_failures

    @property
    def summary_texts(self) -> Mapping[str, str]:
        return {**self._summaries, **self._session.summary_texts}


@final
class _Stop:
    """Where a run stopped from outside in its log stops in the simulation.

    The log holds nothing past that point (no reply, no tool result): the
    simulated run stops there as the recorded one did, interrupted, or
    cancelled through its `control` with the logged reason.
    """

    def __init__(self, cancel: RunCancelled | None) -> None:
        self.scope = anyio.CancelScope()
        self.cancel = cancel
        self.control = RunControl() if cancel is not None else None

    async def here(self) -> None:
        if self.control is not None and self.cancel is not None:
            self.control.cancel(self.cancel.reason)
            await anyio.sleep_forever()
        self.scope.cancel()
        await anyio.lowlevel.checkpoint()


def _stop(run: RunRecord, answers: Sequence[Event]) -> _Stop | None:
    """How `run` was stopped from outside, when it was: its log may stop mid-step.

    Interrupted (Ctrl-C, a cancelled task), crashed, or never ended in its
    log (its process died), or ended since by abandoning it; or cancelled
    (`RunControl.cancel`), by the last of its `answers`.
    """
    if run.outcome == "cancelled" and answers and isinstance(answers[-1], RunCancelled):
        return _Stop(answers[-1])
    if run.cut_short or isinstance(run.error, Cancelled):
        return _Stop(None)
    return None


def _effects(
    record: _Recorded,
    stored: Mapping[str, str],
    stop: _Stop | None,
    model: _ReplayModel,
) -> dict[str, Any]:
    recorded = record.results
    refusals = list(record.refusals)

    async def call_llm(ctx: EffectContext, decision: CallLLM) -> Event:
        window = ctx.window
        if (
            refusals
            and refusals[0][0] == model.given
            # The request's own check comes first, as in the model call.
            and (
                not window or ctx.measure(decision.history, decision.pending) <= window
            )
        ):
            # Refused as too long here, as the log says: by the provider, or
            # by the window check of a reply the log does not keep.
            return refusals.pop(0)[1]
        # The run's output type is not kept: a reply it refused is refused
        # again as the log says, with the same re-ask.
        event = await call_model(ctx, decision)
        if type(event) is not ModelReplied:
            return event
        refused = record.rejected.get(event.message.id)
        if refused is None:
            return event
        return OutputRejected(
            message=event.message, errors=refused.errors, usage=event.usage
        )

    async def run_tools(ctx: EffectContext, decision: RunTools) -> Event:
        results: list[Message] = []
        for call in decision.calls:
            result = recorded.get(call.id)
            if result is None and stop is not None:
                await stop.here()
            if result is None:
                raise ConfigError(
                    "session",
                    ctx.run_id,
                    f"a recorded result for tool call {call.id!r}",
                )
            if result not in results:
                results.append(result)
        return ToolsFinished(results=results)

    async def compact(ctx: EffectContext, decision: Any) -> Event:
        session = ctx.run.session
        run = ctx.run
        if session is not None:
            seeded = cast(Session, _SeededSession(session, stored))
            run = attrs.evolve(run, session=seeded)
        token = _SUMMARY.set(True)
        try:
            return await builtin_compact(attrs.evolve(ctx, run=run), decision)
        finally:
            _SUMMARY.reset(token)

    effects: dict[str, Any] = {"run_tools": run_tools, "compact": compact}
    if record.rejected or refusals:
        effects["call_llm"] = call_llm
    return effects


def _reserved(
    session: Session,
    run: RunRecord,
    counter: TokenCounter,
    rewritten: dict[str, Message],
    before: int,
) -> list[int]:
    """What the stored run reserved beside its messages, before each call.

    The size measured right before a call (no pass in between), less the
    messages the call saw, is the system prompt, the tool schemas and the
    reply budget it was sent with. A call measured only before a pass takes
    the figure of the call before it (the first call: of the next one, else
    `before`, the previous run's last). A run with no call (a pass made
    between runs, by an agent that may send other extras) reserved its
    first pass's size less the messages it covered. `rewritten` carries
    what earlier runs' passes rewrote under their ids, and is updated with
    this run's.
    """
    first = next(iter(run.compactions), None)
    if not run.turns and first is not None and first.covers:
        covered = [rewritten.get(i) or session.message(i) for i in first.covers]
        before = max(0, first.tokens_before - counter.count(covered))
    direct: list[int | None] = []
    last: int | None = None
    for event in run.events:
        if isinstance(event, Measured):
            last = event.estimate
        elif isinstance(event, CompactionResult):
            last = None  # the call is measured by the pass, not by the log
        elif isinstance(event, ModelReplied | OutputRejected):
            direct.append(last)
            last = None
    seen = _rewrites(run, rewritten)
    figures: list[int | None] = []
    for index, ids in enumerate(run.contexts()):
        estimate = direct[index] if index < len(direct) else None
        if estimate is None:
            figures.append(None)
            continue
        view = seen[index] if index < len(seen) else rewritten
        messages = [view.get(i) or session.message(i) for i in ids]
        figures.append(max(0, estimate - counter.count(messages)))
    known = next((f for f in figures if f is not None), before)
    out: list[int] = []
    for figure in figures:
        known = known if figure is None else figure
        out.append(known)
    return out or [before]


def stored_context(
    session: Session,
    *,
    compactor: ContextCompactor | None = None,
    run_id: str | None = None,
) -> ContextManager:
    """The context manager a run of `session` ran with, as its log keeps it.

    The log keeps each run's context settings (`ContextSettings`): the
    compactor (a shipped strategy and its settings, or a compactor that can
    be imported again), the window, the lines, the target and the counter.
    A log written before they were kept has each run's window and lines and
    the name of each pass's compactor: that kind with its default settings
    stands in (the default `MaskingCompactor` when no pass ran).

    Args:
        session: A stored session.
        compactor: The compactor in the recorded one's place (None: the
            recorded one, made again).
        run_id: The run (None: the session's first).

    Raises:
        ConfigError: `session` is not a Session (a session's id is shown
            loaded) or has no runs; `run_id` is not an id or not one of its
            runs; `compactor` is not a `ContextCompactor` instance (refused
            as `ContextManager` refuses it, naming the value given); or the
            recorded compactor cannot be made again (field ``compactor``:
            only its class name is known; give the context to simulate
            under).
    """
    _check_session(session)
    return _stored(session, compactor, run_id)[0]


def _check_session(value: object) -> None:
    """Refuse `value` unless it is a Session; a session's id is shown loaded."""
    if isinstance(value, Session):
        return
    if isinstance(value, str):
        raise ConfigError(
            "session",
            value,
            "a stored Session, not a session's id: "
            f"session=await Session.load(store, {value!r})",
        )
    raise ConfigError("session", value, "a stored Session")


_COMPACTOR: Final = cast(
    _checks.Check, attrs.fields(ContextManager).compactor.validator
)
"""How `ContextManager` checks its compactor: the same check, word for word."""


def _stored(
    session: Session,
    compactor: ContextCompactor | None = None,
    run_id: str | None = None,
) -> tuple[ContextManager, tuple[str, ...]]:
    """A run's context manager, and what standing in for it loses."""
    if compactor is not None:
        # The caller's own argument: refused as theirs, before `_rebuilt`
        # reads any error of the manager's as the log's fault.
        _checks.check(compactor, "compactor", _COMPACTOR)
    if not session.runs:
        raise ConfigError("session", session.id, "a session with at least one run")
    if run_id is not None and not session.has_run(_checks.check_id("run_id", run_id)):
        raise ConfigError("run_id", run_id, f"a run of session {session.id}")
    run = session.runs[0] if run_id is None else session.run(run_id)
    settings = run.opened.context
    if settings is not None:
        return _rebuilt(settings, compactor)
    budget = run.opened.budget
    names = [p.strategy for r in session.runs for p in r.compactions if p.strategy]
    kind: ContextCompactor = MaskingCompactor()
    for cls in STRATEGIES.values():
        if names and cls.__name__ == names[0]:
            kind = cls()
    manager = ContextManager(
        kind if compactor is None else compactor,
        context_window=budget.context_window or None,
        threshold=budget.threshold or 80,
        threshold_tokens=budget.threshold_tokens,
        auto_compact=budget.auto_compact,
        max_messages=budget.max_messages,
    )
    if compactor is not None:
        return manager, ()
    return manager, (
        "the log keeps the compactor's kind, not its settings: "
        f"{type(kind).__name__} with its defaults stands in",
    )


def _rebuilt(
    settings: ContextSettings, compactor: ContextCompactor | None
) -> tuple[ContextManager, tuple[str, ...]]:
    counter, notes = _counter(settings)
    compactor = _compactor(settings) if compactor is None else compactor
    try:
        manager = ContextManager(
            compactor,
            context_window=settings.window,
            threshold=settings.threshold,
            threshold_tokens=settings.threshold_tokens,
            auto_compact=settings.auto_compact,
            compact_target=settings.target,
            compact_target_pct=settings.target_pct,
            counter=counter,
            max_messages=settings.max_messages,
            max_failures=settings.max_failures,
            use_reported_usage=settings.use_reported_usage,
            calibrate=settings.calibrate,
            pins=pin_rules(settings),
        )
    except ConfigError as exc:  # a log written by hand, or by a newer turnfsm
        raise ConfigError(
            "session", settings, f"context settings that make a context manager ({exc})"
        ) from None
    return manager, notes


_GIVEN: Final = (
    "a compactor to simulate under (--compactor MODULE:ATTR, or context= "
    "in the library)"
)
_UNREBUILDABLE: Final = (
    f"{_GIVEN}: the log names only its class, which cannot be imported again"
)


def _compactor(settings: ContextSettings) -> ContextCompactor:
    """The compactor `settings` name, made again with its recorded settings."""
    kind, spec = settings.strategy_kind, settings.strategy
    made: object
    try:
        if kind == "shipped" and spec in STRATEGIES:
            recorded: dict[str, Any] = dict(settings.strategy_settings)
            made = strategy_named(spec, **recorded)
        elif kind == "import" and ":" in spec:
            found = _import(spec)
            if isinstance(found, type):
                made = found(**settings.strategy_settings)
            else:
                made = found
        else:
            raise ConfigError("compactor", spec, _UNREBUILDABLE)
    except (ImportError, AttributeError) as exc:
        # The log names it by MODULE:ATTR: not importable from here.
        raise ConfigError(
            "compactor",
            spec,
            f"{_GIVEN}: the log names {spec}, which cannot be imported here "
            f"({exc}; run from the directory that holds it, or set PYTHONPATH)",
        ) from None
    except (TypeError, ConfigError) as exc:
        if isinstance(exc, ConfigError) and exc.field == "compactor":
            raise
        raise ConfigError("compactor", spec, f"{_UNREBUILDABLE} ({exc})") from None
    if not isinstance(made, ContextCompactor):
        raise ConfigError(
            "compactor", spec, f"{_UNREBUILDABLE} (it is a {type(made).__name__})"
        )
    return made


def _import(spec: str) -> object:
    module, _, attr = spec.partition(":")
    value: object = importlib.import_module(module)
    for part in attr.split("."):
        value = getattr(value, part)
    return value


def _counter(settings: ContextSettings) -> tuple[TokenCounter, tuple[str, ...]]:
    """The counter `settings` name (a shipped one), else the default, said so."""
    cls = getattr(tokens, settings.counter, None)
    if isinstance(cls, type) and settings.counter in tokens.__all__:
        try:
            made = cls(**settings.counter_settings)
        except (TypeError, ConfigError):
            made = None
        if isinstance(made, TokenCounter):
            return made, ()
    return default_counter(), (
        f"the run counted with {settings.counter}, which simulate cannot make "
        "again: the default counter stands in",
    )


def _machine(session: Session, run: RunRecord) -> MachineSpec:
    kept = session.machine(run.opened.digest)
    if kept is None:
        raise ConfigError(
            "machine",
            None,
            f"the machine of run {run.run_id} (not kept in its log)",
            missing=True,
        )
    return kept


_check_summary_model: Final = _checks.instance(
    ModelClient, "a ModelClient, or None", optional=True, awaited=("complete",)
)


async def simulate(
    session: Session,
    *,
    context: ContextManager | Mapping[str, ContextManager] | None = None,
    machine: MachineSpec | None = None,
    summary_model: ModelClient | None = None,
    prices: str | None = None,
) -> Simulation:
    """Re-run `session`'s runs under other settings, replies and results held fixed.

    The k-th model call of a run gets that run's k-th recorded reply; a
    tool call gets its recorded result by call id; a summary whose request
    is the recorded one (same conversation, same plan) is the recorded
    summary. Each call reserves beside its messages what the recorded call
    did (the system prompt, the tool schemas and the reply budget, which may
    differ from run to run). The stored session is never written to.

    A simulated run that ends otherwise than the log says (another outcome,
    another error, recorded replies left over) is listed in
    `Simulation.differences`; under each run's own settings (no `context`),
    so is one that made another number of compaction passes.

    Args:
        session: A stored session (e.g. from `Session.load`).
        context: The context manager to simulate every run under, or one
            per run id (None: the one each run ran with, made again from
            the settings its log keeps, `stored_context`).
        machine: The machine to run on (None: the one kept in the log).
        summary_model: Answers the summaries a strategy asks for that were
            not recorded (None: such a summary is an error). A slow one is
            waited for: a pass is cut short only after 30 minutes (a model
            that hangs fails its pass, and the simulation ends).
        prices: A known model's name (``gpt-4o``) whose prices cost each
            call (None: no costs): the uncached part of a call at the cache
            write price where the provider prices writes apart (Anthropic),
            the cached part at the cached-input price. A `context` without
            prices of its own prices its passes' cache figures with them.

    Returns:
        The `Simulation`: per call tokens, cache use and cost; the passes.

    Raises:
        ConfigError: `session` is not a Session or has no runs, `prices`
            names no model with known prices, `context` names no context
            manager for a run, no `context` is given and a run's compactor
            cannot be made again (field ``compactor``), `summary_model` is
            not a model client, a run needs a
            reply, a tool result or a summary that was not recorded (the
            field is named), or a run's pinned messages and what its calls
            reserved do not fit the window (field ``context_window``).
    """
    _check_session(session)
    runs = session.runs
    if not runs:
        raise ConfigError("session", session.id, "a session with at least one run")
    _checks.check(prices, "prices", _checks.string(non_empty=True, optional=True))
    _checks.check(summary_model, "summary_model", _check_summary_model)
    price: ModelPrices | None = None
    if prices is not None:
        price = priced(prices)
    managers, caveats = _managers(session, context, price)
    model = _ReplayModel(summary_model)
    notes: list[str] = []
    sim = Session(session.id, store=MemoryStore())
    stored = dict(session.summary_texts)
    rewritten: dict[str, Message] = {}
    before = 0
    for run in runs:
        record = _recorded(run)
        budget = run.opened.budget
        manager = managers[run.run_id]
        stop = _stop(run, record.answers)
        answers = record.answers
        if stop is not None and stop.cancel is not None:
            answers = answers[:-1]  # the control cancels where the log stops
        reserved = _reserved(session, run, manager.counter, rewritten, before)
        before = reserved[-1]
        tools = _stand_in_tools(run, record.answers)
        schemas = request_extras(None, [t.schema for t in tools])
        counter = _Reserved(
            manager.counter, reserved, model, schemas[0] if schemas else ""
        )
        try:
            driver = Driver(
                model=model,
                machine=machine if machine is not None else _machine(session, run),
                system_prompt=_Reserved.TEXT if any(reserved) else None,
                tools=tools,
                context=attrs.evolve(manager, counter=counter),
                max_output_tokens=None,
                max_turns=budget.max_turns,
                max_overflow_retries=budget.max_overflow_retries,
                max_compactions=budget.max_compactions,
                max_output_retries=budget.max_output_retries,
                # A slow summary model is measured, not cut short: a deadline
                # far past any pass a working model makes, so that one that
                # hangs still ends the simulation.
                model_timeout=None,
                compaction_timeout=_PASS_DEADLINE,
                effect_timeout=None,
                effects=_effects(record, stored, stop, model),
            )
        except ReserveTooLarge as exc:
            raise ConfigError(
                "context_window",
                manager.context_window,
                f"a window of at least {window_to_send(exc.reserved)} tokens, "
                f"whose emergency line (95 %) is over the {exc.reserved} tokens "
                f"its calls reserved: run {run.run_id}'s pinned messages come "
                "beside them",
            ) from None
        failed = [e for e in run.events if isinstance(e, CompactorFailed)]
        model.start(run.run_id, record.replies, stop, failed)
        try:
            result: Any = None
            with stop.scope if stop is not None else contextlib.nullcontext():
                if run.input:
                    result = await driver.run(
                        list(run.input),
                        session=sim,
                        run_id=run.run_id,
                        control=None if stop is None else stop.control,
                    )
                else:  # a pass outside any run (`Agent.compact`)
                    result = await driver.compact(sim, run_id=run.run_id)
            if result is None:  # interrupted where its log stops
                result = sim.run(run.run_id)
            result = await _answered(driver, sim, run.run_id, answers, result)
        except PinnedTooLarge as exc:
            raise _too_small(exc, manager, run.run_id) from None
        if model.missing is not None:
            raise model.missing
        passes = len(sim.run(run.run_id).compactions) if context is None else None
        notes.extend(
            _differences(
                run,
                result.error,
                _Ended(
                    outcome=result.outcome, unused=len(model.replies), passes=passes
                ),
            )
        )
        if result.outcome in _GOES_ON and run is not runs[-1]:
            # Nothing the log holds answers it: ended, so the runs after it
            # can open (a paused run keeps its session). A crashed one ended
            # so in its log too: that is no difference.
            await driver.abandon(
                sim, run.run_id, reason=f"{result.outcome} in the simulation"
            )
            if not isinstance(run.error, RunCrashed):
                notes.append(
                    f"run {run.run_id} was abandoned in the simulation, "
                    f"{result.outcome} with no recorded answer, so that the runs "
                    "after it could go on"
                )
    simulation = _report(session, sim, price, prices)
    caveats = (*caveats, *_crashes(runs))
    return attrs.evolve(simulation, caveats=caveats, differences=tuple(notes))


def _crashes(runs: Sequence[RunRecord]) -> list[str]:
    """What each run that crashed in its log crashed on, and how it is simulated."""
    return [
        f"run {run.run_id} crashed in its log on {run.error.type}: "
        f"{run.error.message}; it is simulated up to where its log stops, as "
        "the crash stopped it"
        for run in runs
        if isinstance(run.error, RunCrashed)
    ]


def _too_small(
    exc: PinnedTooLarge, manager: ContextManager, run_id: str
) -> TurnFSMError:
    """The window a run cannot start in, named (`exc`: the counter is at fault)."""
    if exc.counter:
        return exc
    return ConfigError(
        "context_window",
        manager.context_window,
        f"a window of at least {window_to_send(exc.used)} tokens, whose "
        f"emergency line (95 %) is over the {exc.used} tokens of run {run_id}'s "
        f"pinned messages ({exc.pinned}) and what its calls reserved beside "
        f"them ({exc.reserved})",
    )


def _managers(
    session: Session,
    context: ContextManager | Mapping[str, ContextManager] | None,
    price: ModelPrices | None,
) -> tuple[dict[str, ContextManager], tuple[str, ...]]:
    """The context manager of each run, by run id, and the caveats they bring."""
    caveats: list[str] = list(CAVEATS)
    managers: dict[str, ContextManager] = {}
    for run in session.runs:
        if context is None:
            manager, stand_ins = _stored(session, run_id=run.run_id)
            caveats += [c for c in stand_ins if c not in caveats]
        elif isinstance(context, ContextManager):
            manager = context
        elif isinstance(context, Mapping) and isinstance(
            context.get(run.run_id), ContextManager
        ):
            manager = context[run.run_id]
        else:
            raise ConfigError(
                "context",
                context,
                f"a ContextManager, or one per run id (none for run {run.run_id})",
            )
        if price is not None and manager.prices is None:
            manager = attrs.evolve(manager, prices=price)
        managers[run.run_id] = manager
    if any(m.use_reported_usage for m in managers.values()):
        caveats.append(
            "the provider's reported counts are the recorded ones, for the "
            "recorded requests: after a pass the log does not hold, the "
            "measurements that use them are what the recorded run reported"
        )
    return managers, tuple(caveats)


@final
@attrs.frozen(kw_only=True)
class _Ended:
    """How a simulated run ended: outcome, replies left, passes (None: not compared)."""

    outcome: str
    unused: int
    passes: int | None


def _differences(
    run: RunRecord, error: BaseException | None, ended: _Ended
) -> list[str]:
    """What a simulated run did that the stored one did not, in words."""
    notes = []
    why = "" if error is None else f": {error}"
    # A log with no end for a run (its process died), or a run that crashed
    # (its log holds nothing of what raised), is simulated as interrupted
    # where the log stops.
    crashed = isinstance(run.error, RunCrashed)
    stopped = crashed or run.outcome == "running"
    recorded = "interrupted" if stopped else run.outcome
    if ended.outcome != recorded:
        was = "crashed" if crashed else run.outcome
        notes.append(
            f"run {run.run_id} ended {ended.outcome} in the simulation "
            f"({was} in the log){why}"
        )
    elif (
        error is not None
        and type(error) is not type(run.error)
        and not stopped  # no end in the log, or the crash: no error to compare
    ):
        logged = "no error" if run.error is None else type(run.error).__name__
        notes.append(
            f"run {run.run_id} ended {ended.outcome} with {type(error).__name__} "
            f"in the simulation ({logged} in the log){why}"
        )
    if ended.passes is not None and ended.passes != len(run.compactions):
        notes.append(
            f"run {run.run_id} made {ended.passes} compaction passes in the "
            f"simulation ({len(run.compactions)} in the log)"
        )
    if ended.unused:
        notes.append(
            f"run {run.run_id} ended with {ended.unused} recorded replies unused"
        )
    return notes


def _report(
    stored: Session,
    sim: Session,
    price: ModelPrices | None,
    name: str | None,
) -> Simulation:
    calls: list[SimulatedCall] = []
    passes: list[CompactionRecord] = []
    # A recorded summary reused costs what it cost when it was made.
    spent = {
        p.replacement: p.usage
        for r in stored.runs
        for p in r.compactions
        if p.usage is not None
    }
    previous: tuple[Message, ...] = ()
    # A pass may keep a message's id and change its text (a masked tool
    # result): the context a call saw holds the text of the latest pass.
    rewritten: dict[str, Message] = {}
    counter = default_counter()
    summary_cost = Decimal(0) if price is not None else None
    for run in sim.runs:
        passes.extend(
            p
            if p.usage is not None
            else attrs.evolve(p, usage=spent.get(p.replacement))
            for p in run.compactions
        )
        estimates = _estimates(run)
        contexts = _rewrites(run, rewritten)
        for index, turn in enumerate(run.turns):
            seen = contexts[index] if index < len(contexts) else rewritten
            messages = tuple(seen.get(i) or sim.message(i) for i in run.context(index))
            shared = first_change(previous, messages)
            cached = counter.count(messages[:shared]) if shared else 0
            tokens = estimates[index] if index < len(estimates) else 0
            reply = sim.message(turn.output)
            out = turn.usage.output_tokens if turn.usage else counter.count([reply])
            calls.append(
                SimulatedCall(
                    run_id=run.run_id,
                    turn=index + 1,
                    tokens=tokens,
                    messages=messages,
                    reply=reply,
                    cached_tokens=min(cached, tokens),
                    cache_break=bool(previous) and shared < len(previous),
                    cost=None
                    if price is None
                    else price.cost(
                        tokens,
                        min(cached, tokens),
                        out,
                        written_tokens=max(0, tokens - cached),
                    ),
                    output_tokens=out,
                )
            )
            previous = (*messages, reply)
    pass_costs: list[Decimal | None] = []
    for p in passes:
        cost = None
        if price is not None:
            cost = price.usage_cost(p.usage)
            summary_cost = (summary_cost or Decimal(0)) + cost
        pass_costs.append(cost)
    return Simulation(
        session_id=sim.id,
        calls=tuple(calls),
        passes=tuple(passes),
        prices=name,
        summary_cost=summary_cost,
        pass_costs=tuple(pass_costs),
        # A run with no input is a pass outside any run (`simulate`).
        between_runs=tuple(r.run_id for r in sim.runs if not r.input),
    )


def _rewrites(
    run: RunRecord, rewritten: dict[str, Message]
) -> list[dict[str, Message]]:
    """The messages passes rewrote under their ids, as of each model call.

    `rewritten` carries what earlier runs' passes rewrote, and is updated
    with this run's.
    """
    out: list[dict[str, Message]] = []
    for event in run.events:
        if isinstance(event, CompactionResult):
            rewritten.update((m.id, m) for m in event.messages)
        elif isinstance(event, ModelReplied | OutputRejected):
            out.append(dict(rewritten))
    return out


def _estimates(run: RunRecord) -> list[int]:
    """The size measured before each model call of `run`, in order."""
    out: list[int] = []
    last = 0
    for event in run.events:
        if isinstance(event, Measured):
            last = event.estimate
        elif isinstance(event, ModelReplied | OutputRejected):
            out.append(last)
    return out
