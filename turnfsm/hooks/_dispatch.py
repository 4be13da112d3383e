"""Calls hooks: only the methods a hook overrides; a raising hook is detached."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import attrs

from turnfsm.hooks._hook import Hook, PreCompact, PreCompactInfo

__all__ = ["HookDispatcher"]

logger = logging.getLogger("turnfsm.hooks")

_METHODS = (
    "on_run_start",
    "on_transition",
    "on_decision",
    "on_outcome",
    "on_model_call_start",
    "on_model_call_end",
    "on_tool_start",
    "on_tool_end",
    "on_text_delta",
    "pre_compact",
    "post_compact",
    "on_compaction",
    "on_compaction_done",
    "on_circuit_opened",
    "on_run_end",
)


def _hook_list(value: Iterable[Hook]) -> list[Hook]:
    return list(value)


@attrs.define(eq=False)
class HookDispatcher:
    """Fans each call out to the hooks that override the method."""

    hooks: list[Hook] = attrs.field(converter=_hook_list)
    strict: bool = False
    _table: dict[str, list[Hook]] = attrs.field(init=False, factory=dict)

    def __attrs_post_init__(self) -> None:
        hooks = self.hooks
        if not hooks:  # the usual run: nothing to look up
            self._table = {name: [] for name in _METHODS}
            return
        for name in _METHODS:
            base = getattr(Hook, name)
            self._table[name] = [
                h for h in hooks if getattr(type(h), name, base) is not base
            ]

    def wants(self, name: str) -> bool:
        """Whether any hook overrides `name` (lets the driver skip building records)."""
        return bool(self._table[name])

    def call(self, name: str, info: Any) -> None:
        """Call `name(info)` on every hook that overrides it."""
        for hook in tuple(self._table[name]):
            self._invoke(hook, name, info)

    def pre_compact(self, info: PreCompactInfo) -> PreCompact:
        """Merge every hook's answer: any veto wins; guidance is concatenated."""
        veto = False
        instructions: list[str] = []
        context: list[str] = []
        for hook in tuple(self._table["pre_compact"]):
            answer = self._invoke(hook, "pre_compact", info)
            if not isinstance(answer, PreCompact):
                continue
            veto = veto or answer.veto
            if answer.instructions:
                instructions.append(answer.instructions)
            if answer.additional_context:
                context.append(answer.additional_context)
        return PreCompact(
            veto=veto,
            instructions="\n\n".join(instructions) or None,
            additional_context="\n\n".join(context) or None,
        )

    def _invoke(self, hook: Hook, name: str, info: Any) -> Any:
        try:
            return getattr(hook, name)(info)
        except Exception:
            if self.strict:
                raise
            logger.exception("hook %r raised in %s; detaching it", hook, name)
            self._detach(hook)
            return None

    def _detach(self, hook: Hook) -> None:
        for hooks in self._table.values():
            if hook in hooks:
                hooks.remove(hook)

    @classmethod
    def of(cls, hooks: Iterable[Hook], *, strict: bool = False) -> HookDispatcher:
        """Return a dispatcher over `hooks`."""
        return cls(list(hooks), strict)
