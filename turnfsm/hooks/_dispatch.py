"""Calls hooks: only the methods a hook overrides; a raising hook is detached.

A hook that returns what would be ignored (an awaitable, a `pre_compact`
answer that is not a `PreCompact`, or that pins a message the pass does not
have) is treated as one that raised `InvalidReturn`: detached and logged, or
re-raised with `strict`, marked as the run's crash (`is_crash`), so that no
model call or compaction pass it was raised in takes it for its own failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Final, final

import attrs

from turnfsm import _checks, _deprecated
from turnfsm.errors import InvalidReturn
from turnfsm.hooks._check import check_hooks
from turnfsm.hooks._hook import DEPRECATED_METHODS, HOOK_METHODS, Hook
from turnfsm.hooks._infos import (
    CompactionDone,
    CompactionInfo,
    PreCompact,
    PreCompactInfo,
    ToolCallEnd,
    ToolCallInfo,
)
from turnfsm.messages import Message
from turnfsm.persistence import CompactionRecord

__all__ = ["HookDispatcher"]

logger = logging.getLogger("turnfsm.hooks")


def _hook_list(value: Iterable[Hook]) -> list[Hook]:
    return list(check_hooks(value))


@final
@attrs.define(eq=False)
class HookDispatcher:
    """Fans each call out to the hooks that override the method.

    Its hooks are checked as the driver checks them (`check_hooks`), and
    `strict` is a bool: what it is given wrong raises `ConfigError` here.
    """

    hooks: list[Hook] = attrs.field(converter=_hook_list)
    strict: bool = attrs.field(default=False, validator=_checks.boolean())
    _table: dict[str, list[Hook]] = attrs.field(init=False, factory=dict)
    _compaction: bool = attrs.field(init=False, default=False)

    def __attrs_post_init__(self) -> None:
        hooks = self.hooks
        if not hooks:  # the usual run: nothing to look up, nothing to detach
            self._table = dict(_NO_HOOKS)
            return
        for name in HOOK_METHODS:
            base = getattr(Hook, name)
            self._table[name] = [
                h for h in hooks if getattr(type(h), name, base) is not base
            ]
        for name in DEPRECATED_METHODS:
            for hook in self._table[name]:
                _deprecated.warn(
                    f"{type(hook).__name__}.{name}",
                    "on_compaction_pass(record), which every pass calls with "
                    "its CompactionRecord",
                    stacklevel=5,
                )
        self._compaction = any(self._table[n] for n in _COMPACTION_METHODS)

    def compaction_pass(self, record: CompactionRecord, session_id: str) -> None:
        """Tell the hooks about one pass: `on_compaction_pass`, then the old methods."""
        if not self._compaction:
            return
        self.call("on_compaction_pass", record)
        if record.compacted and self._table["on_compaction_done"]:
            self.call("on_compaction_done", _done(record, session_id))
        if self._table["post_compact"] or self._table["on_compaction"]:
            info = _info(record)
            if record.compacted:
                self.call("on_compaction", info)
            self.call("post_compact", info)

    def wants(self, name: str) -> bool:
        """Whether any hook overrides `name` (lets the driver skip building records)."""
        return bool(self._table[name])

    def call(self, name: str, info: Any) -> None:
        """Call `name(info)` on every hook that overrides it."""
        # `_invoke`, inlined: this runs a dozen times a turn for a tracer.
        for hook in tuple(self._table[name]):
            try:
                answer = getattr(hook, name)(info)
                if answer is not None:
                    _check_answer(hook, name, answer, info)
            except _HOOK_FAULTS as exc:
                self._raised(hook, name, exc)

    async def tool_call(
        self,
        info: ToolCallInfo,
        run: Callable[[], Awaitable[tuple[Message, Exception | None]]],
        *,
        clock: Callable[[], float],
    ) -> Message:
        """Run one tool call between its `on_tool_start` and `on_tool_end` calls.

        Args:
            info: The call, as the hooks hear of it.
            run: Runs the call; returns its result and the exception the
                tool raised, if any (the result then says it failed).
            clock: Seconds on the run's clock (a durable run's is the
                workflow's), for the call's `duration`.

        Returns:
            The call's result. What `run` raises (a cancellation) is raised,
            and `on_tool_end` hears it as the call's `error`; so is what a
            strict hook raises in `on_tool_start`, and the tool does not run.
        """
        started = clock()
        result: Message | None = None
        raised: Exception | None = None
        error: BaseException | None = None
        try:
            # Inside, so that a hook that began something (a span made
            # current) ends it even when a strict one after it raised.
            self.call("on_tool_start", info)
            result, raised = await run()
            return result
        except BaseException as exc:
            error = exc
            raise
        finally:
            end = ToolCallEnd(
                call=info,
                result=result,
                error=error,
                raised=raised,
                duration=clock() - started,
            )
            self.call("on_tool_end", end)

    def pre_compact(self, info: PreCompactInfo) -> PreCompact:
        """Merge every hook's answer: any veto wins; guidance and pins add up."""
        veto = False
        instructions: list[str] = []
        context: list[str] = []
        pin: list[str] = []
        for hook in tuple(self._table["pre_compact"]):
            answer = self._invoke(hook, "pre_compact", info)
            if not isinstance(answer, PreCompact):
                continue
            veto = veto or answer.veto
            if answer.instructions:
                instructions.append(answer.instructions)
            if answer.additional_context:
                context.append(answer.additional_context)
            pin.extend(answer.pin)
        return PreCompact(
            veto=veto,
            instructions="\n\n".join(instructions) or None,
            additional_context="\n\n".join(context) or None,
            pin=pin,
        )

    def _invoke(self, hook: Hook, name: str, info: Any) -> Any:
        try:
            answer = getattr(hook, name)(info)
            if answer is not None:
                _check_answer(hook, name, answer, info)
            return answer
        except _HOOK_FAULTS as exc:
            self._raised(hook, name, exc)
            return None

    def _raised(self, hook: Hook, name: str, exc: BaseException) -> None:
        """Re-raise `exc` as the run's crash (`strict`), or log it and detach `hook`.

        A hook that calls ``sys.exit()`` or raises `GeneratorExit` raised
        too: the run goes on without it unless hooks are strict. A
        `KeyboardInterrupt` is the user's Ctrl-C, whoever's code it came in.
        """
        if self.strict:
            if isinstance(exc, Exception):
                _as_crash(exc)
            raise exc
        logger.exception("hook %r raised in %s; detaching it", hook, name)
        self._detach(hook)

    def _detach(self, hook: Hook) -> None:
        for hooks in self._table.values():
            if hook in hooks:
                hooks.remove(hook)

    @classmethod
    def of(cls, hooks: Iterable[Hook], *, strict: bool = False) -> HookDispatcher:
        """Return a dispatcher over `hooks`.

        Raises:
            ConfigError: `hooks` as `check_hooks` refuses them, or a
                `strict` that is not a bool.
        """
        return cls(hooks, strict)


_HOOK_FAULTS: Final = (Exception, SystemExit, GeneratorExit, asyncio.CancelledError)
"""What a hook may raise that is its own fault, not the process's signal.

A hook is called synchronously, so no cancel of the run can reach it: a
`CancelledError` out of one is its own (it awaited nothing; it raised it).
"""

_COMPACTION_METHODS = ("on_compaction_pass", *DEPRECATED_METHODS)

_NO_HOOKS: Final[dict[str, list[Hook]]] = {name: [] for name in HOOK_METHODS}
"""The table of a dispatcher with no hooks, copied (its lists stay empty:
hooks are only ever removed from a table, never added)."""


def _as_crash(exc: Exception) -> None:
    """Mark a strict hook's error as the run's crash (``is_crash``), never another's.

    Raised inside a model call or a compaction pass, it would be read as
    theirs: a ConnectionError retried as the model's, a RuntimeError failing
    the pass. What reads outside failures there lets an error with
    ``is_crash`` through, and the run crashes on it, as on one raised
    anywhere else.
    """
    # A frozen error's too; not one whose class has an `is_crash` property.
    with contextlib.suppress(AttributeError):
        object.__setattr__(exc, "is_crash", True)


def _check_answer(hook: Hook, name: str, answer: object, info: Any) -> None:
    """Refuse what a hook returns that would be ignored: `InvalidReturn`.

    Hooks are called synchronously: an awaitable (an ``async def`` hook, a
    lambda returning a coroutine) never runs. Only `pre_compact` answers,
    and only a `PreCompact` is read: a veto given any other way is none. A
    pin names a message of the pass (`PreCompactInfo.messages`): one naming
    no such message would pin nothing, a typo the pass would hide.
    """
    expected = "a PreCompact or None" if name == "pre_compact" else "None"
    if inspect.isawaitable(answer):
        if inspect.iscoroutine(answer):
            answer.close()  # it never runs: no "never awaited" warning
        expected += " (hooks are called synchronously: an awaitable never runs)"
    elif isinstance(answer, PreCompact) and name == "pre_compact":
        unknown = _unknown_pins(answer.pin, info)
        if not unknown:
            return
        expected = (
            "a PreCompact pinning messages of the pass, by their ids in"
            f" info.messages: no message has the id {unknown!r}"
        )
    elif name != "pre_compact":
        return  # what an observer returns (nothing reads it)
    text = repr(answer)
    raise InvalidReturn(
        f"hook {type(hook).__name__}.{name}",
        text if len(text) <= 200 else text[:197] + "...",
        expected,
    )


def _unknown_pins(pins: tuple[str, ...], info: PreCompactInfo) -> str | None:
    """The first of `pins` that names no message of the pass, if any."""
    if not pins:
        return None
    ids = {m.id for m in info.messages}
    return next((p for p in pins if p not in ids), None)


def _done(record: CompactionRecord, session_id: str) -> CompactionDone:
    return CompactionDone(
        session_id=session_id,
        run_id=record.run_id,
        turn=record.turn,
        trigger=record.reason,
        strategy=record.strategy,
        covers=record.covers,
        replacement=record.replacement,
        tokens_before=record.tokens_before,
        tokens_after=record.tokens_after,
        usage=record.usage,
    )


def _info(record: CompactionRecord) -> CompactionInfo:
    return CompactionInfo(
        run_id=record.run_id,
        reason=record.reason,
        turn=record.turn,
        tokens_before=record.tokens_before,
        tokens_after=record.tokens_after,
        messages_before=len(record.covers),
        messages_after=len(record.replacement),
        compacted=record.compacted,
        vetoed=record.vetoed,
        outcome=record.verdict,
        strategy=record.strategy,
        usage=record.usage,
    )
