"""What crosses Temporal's wire: a run's start, its options, its result.

Every payload is plain JSON built by `turnfsm.serde` (the one converter of
records), so Temporal's default JSON converter carries it unchanged and a
workflow's history reads as turnfsm's own log formats.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any, Final, final

import attrs

from turnfsm import _checks, serde
from turnfsm.core import Pause
from turnfsm.driver import RunResult
from turnfsm.errors import ConfigError, TurnFSMError
from turnfsm.messages import Message
from turnfsm.values import Usage

__all__ = ["DurableOptions", "RunSpec", "result_from_json", "result_to_json"]

WORKFLOW: Final = "turnfsm.run"
"""The workflow type's name."""

NO_LIMIT: Final = timedelta(days=1)
"""The start-to-close timeout of an activity whose effect has no limit."""

MARGIN: Final = 30.0
"""Seconds an activity may take beyond its effect's own limit (its set-up)."""


def _seconds(name: str) -> Any:
    return _checks.number(name, above=0)


@final
@attrs.frozen(kw_only=True)
class DurableOptions:
    """How a durable run's activities are scheduled (chosen when it starts).

    The effects' own limits (`Driver.model_timeout`, `tool_timeout`,
    `compaction_timeout`, `effect_timeout`) still bound each effect inside
    its activity; these options bound the activities around them.

    Attributes:
        heartbeat_timeout: Seconds an activity may go without a heartbeat
            (each beats every third of it) before Temporal counts its worker
            lost and runs it again elsewhere.
        retry_initial: Seconds before an activity lost with its worker (or
            failed outside its effect) is tried again.
        retry_max: The longest wait between such attempts.
        log_timeout: Seconds a session-log activity (load, append) may take.
        task_timeout: Seconds a workflow task may take before Temporal hands
            it to another worker (how soon a run whose worker died goes on).
    """

    heartbeat_timeout: float = attrs.field(
        default=10.0, validator=_seconds("heartbeat_timeout")
    )
    retry_initial: float = attrs.field(default=1.0, validator=_seconds("retry_initial"))
    retry_max: float = attrs.field(default=30.0, validator=_seconds("retry_max"))
    log_timeout: float = attrs.field(default=60.0, validator=_seconds("log_timeout"))
    task_timeout: float = attrs.field(default=10.0, validator=_seconds("task_timeout"))

    def to_json(self) -> dict[str, Any]:
        """Return the options as JSON."""
        return attrs.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DurableOptions:
        """Read options written by `to_json`."""
        return cls(**data)


@final
@attrs.frozen(kw_only=True)
class RunSpec:
    """A durable run's start: which agent, which session, which run, what input.

    The client chooses the run id, so the workflow and the session's log name
    the same run from the first step.
    """

    agent: str
    session_id: str
    run_id: str
    input: tuple[Message, ...]
    options: DurableOptions = attrs.field(factory=DurableOptions)

    def to_json(self) -> dict[str, Any]:
        """Return the start as JSON."""
        return {
            "agent": self.agent,
            "session_id": self.session_id,
            "run_id": self.run_id,
            "input": serde.to_json(self.input),
            "options": self.options.to_json(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunSpec:
        """Read a start written by `to_json`.

        Raises:
            ConfigError: a field is missing or of the wrong type.
        """
        try:
            return cls(
                agent=data["agent"],
                session_id=data["session_id"],
                run_id=data["run_id"],
                input=serde.from_json(tuple[Message, ...], data["input"]),
                options=DurableOptions.from_json(data.get("options", {})),
            )
        except (KeyError, TypeError) as exc:
            raise ConfigError("run", data, f"a durable run's start ({exc})") from None


def result_to_json(result: RunResult[Any]) -> dict[str, Any]:
    """Return what a run ended with as JSON (without its parsed `output`)."""
    return {
        "outcome": result.outcome,
        "text": result.text,
        "error": serde.error_to_json(result.error) if result.error else None,
        "usage": serde.to_json(result.usage),
        "compaction_usage": serde.to_json(result.compaction_usage),
        "session_id": result.session_id,
        "run_id": result.run_id,
        "turns": result.turns,
        "waiting": serde.to_json(result.waiting) if result.waiting else None,
    }


def result_from_json(data: Mapping[str, Any], *, output: Any = None) -> RunResult[Any]:
    """Read a result written by `result_to_json`; `output` is the parsed answer."""
    error: TurnFSMError | None = (
        serde.error_from_json(data["error"]) if data["error"] is not None else None
    )
    waiting = data.get("waiting")
    return RunResult(
        outcome=data["outcome"],
        text=data["text"],
        error=error,
        usage=serde.from_json(Usage, data["usage"]),
        compaction_usage=serde.from_json(Usage, data["compaction_usage"]),
        session_id=data["session_id"],
        run_id=data["run_id"],
        turns=data["turns"],
        waiting=serde.from_json(Pause, waiting) if waiting is not None else None,
        output=output,
    )
