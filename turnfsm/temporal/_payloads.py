"""What crosses Temporal's wire: a run's start, its options, its result.

Every payload is plain JSON built by `turnfsm.serde` (the one converter of
records: ``serde.to_json`` / ``serde.from_json``), so Temporal's default
JSON converter carries it unchanged and a workflow's history reads as
turnfsm's own log formats.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Final, final

import attrs

from turnfsm import _checks, serde
from turnfsm.core import Event, Pause
from turnfsm.driver import RunResult
from turnfsm.errors import ConfigError
from turnfsm.messages import Message
from turnfsm.persistence import ParentLink

__all__ = [
    "DurableOptions",
    "RunSpec",
    "RunStatus",
    "fitting",
    "payload_size",
    "run_result",
    "surely_within",
    "workflow_id_of",
]

WORKFLOW: Final = "turnfsm.run"
"""The workflow type's name."""

NO_LIMIT: Final = timedelta(days=1)
"""The start-to-close timeout of an activity whose effect has no limit."""

MARGIN: Final = 30.0
"""Seconds an activity may take beyond its effect's own limit (its set-up)."""


def payload_size(value: object) -> int:
    """The bytes Temporal's JSON converter writes for `value` (compact, ASCII)."""
    return len(json.dumps(value, separators=(",", ":")))


def surely_within(chars: int, pieces: int, limit: int) -> bool:
    """Whether `chars` characters of text in `pieces` messages fit `limit` bytes.

    Without measuring: JSON escapes a character into 6 bytes at most (a
    backslash-u escape), and a message's other fields take less than 4 KB.
    """
    return 6 * chars + _MESSAGE_BYTES * pieces <= limit


_MESSAGE_BYTES: Final = 4096
"""Bytes of a message's JSON besides its text, at most (ids, role, keys)."""


def fitting(values: Sequence[object], budget: int) -> int:
    """How many of `values`, from the first, take at most `budget` bytes (one at least).

    What one payload can carry of a log: its entries' JSON, one after the other.
    """
    kept, used = 0, 0
    for value in values:
        used += payload_size(value) + 1
        if kept and used > budget:
            break
        kept += 1
    return kept


def workflow_id_of(session_id: str) -> str:
    """The id of the workflow running a session's open run (one at a time)."""
    return f"turnfsm-{session_id}"


MAX_TASK_TIMEOUT: Final = 120.0
"""Temporal's longest workflow task timeout, in seconds (its server's cap).

`start_durable` refuses a longer one; a run's options read back from its
workflow (started before this check) are taken as they were: the server
cut them to this.
"""


def _seconds(name: str) -> Any:
    return _checks.seconds(name, optional=False)


def _not_below_initial(inst: Any, _attr: object, value: float) -> None:
    """Temporal refuses a retry whose longest wait is under its first."""
    if value < inst.retry_initial:
        raise ConfigError(
            "retry_max",
            value,
            f"seconds >= retry_initial ({inst.retry_initial}): the longest wait"
            " between attempts is no shorter than the first (a retry_initial"
            " over the default retry_max takes a retry_max too)",
        )


@final
@_checks.keyword_checked
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
        retry_max: The longest wait between such attempts (at least
            `retry_initial`).
        log_timeout: Seconds a session-log activity (load, append) may take.
        task_timeout: Seconds a workflow task may take before Temporal hands
            it to another worker (how soon a run whose worker died goes on);
            at most 120, Temporal's own cap (`start_durable` refuses more).
        history_limit: Events a workflow run's history may reach before the
            run continues in a new workflow run (the same workflow id, a
            fresh history), resumed from its log at its next step; None:
            when the Temporal server suggests it. Temporal ends a workflow
            whose history outgrows the server's limits, and every activity
            of a run carries its conversation, so a long run needs this.
        payload_limit: The most bytes one activity's input or result may
            take: Temporal's limit for one payload (2 MB by default; a
            server's ``limit.blobSize.error``), less a margin. A payload
            past it would fail its workflow task again and again, so the
            run checks first: a tool result past half of it becomes an
            error result saying so, the log is written in parts, and a
            step whose conversation is past it fails the run
            (`PayloadTooLarge`). Left at its default on a server that takes
            less, a run takes the server's; chosen past it, the start is
            refused.
        local_activities: Run the model calls, compaction passes, custom
            effects and tool calls as Temporal local activities, in the
            worker that runs the workflow, instead of as activities the
            server schedules: about twice the turns per second, and a
            fraction of the server's work, for these costs. Steps chained
            in one workflow task keep the workflow's clock (the log's
            timestamps) where the task began. A signal, an update or a
            query (``cancel``, an approval, a message injected, the run's
            status) waits for the task to end: at most 80 % of
            `task_timeout`, Temporal's workflow-task heartbeat. The
            session's log is written only from finished workflow tasks,
            so it trails the run by up to a task, and is complete when the
            run pauses or ends. When a worker dies, the steps of its
            unfinished task run again on the next one (as an activity lost
            with its worker does), found out by the task timeout, not by a
            heartbeat; a worker that stops hands its step on at once. A
            tool must be served by the worker running the workflow. A
            workflow task keeps its worker's slot while its steps run, so
            a worker moves on at most its ``max_concurrent_workflow_tasks``
            sessions at once.
    """

    heartbeat_timeout: float = attrs.field(
        default=10.0, validator=_seconds("heartbeat_timeout")
    )
    retry_initial: float = attrs.field(default=1.0, validator=_seconds("retry_initial"))
    retry_max: float = attrs.field(
        default=30.0, validator=[_seconds("retry_max"), _not_below_initial]
    )
    log_timeout: float = attrs.field(default=60.0, validator=_seconds("log_timeout"))
    task_timeout: float = attrs.field(default=10.0, validator=_seconds("task_timeout"))
    history_limit: int | None = attrs.field(
        default=None, validator=_checks.integer("history_limit", low=1, optional=True)
    )
    payload_limit: int = attrs.field(
        default=2_000_000, validator=_checks.integer("payload_limit", low=4096)
    )
    local_activities: bool = attrs.field(
        default=False, validator=_checks.boolean("local_activities")
    )


@final
@attrs.frozen(kw_only=True)
class RunSpec:
    """A durable run's start: which agent, which session, which run, what input.

    The client chooses the run id, so the workflow and the session's log name
    the same run from the first step.

    Attributes:
        agent: The agent's name (`Driver.name`), as the worker serves it.
        session_id: The run's session.
        run_id: The run.
        input: The run's new messages.
        options: How its activities are scheduled.
        parent: A sub-agent's run: the call of its parent's run that started
            it (its `RunOpened` records it); None for a run started by hand.
        store: The agent whose store holds the session (a sub-agent's session
            is in its parent's store); None: this run's agent.
        resume: The run is open in the log (its workflow continued as new):
            resume it there, with no input.
        queued: What the run's steering had queued and the run had not
            taken yet (injected messages, a cancel) when it continued as new.
        status: Where the run was when it continued as new (what the
            ``status`` query answers until it takes its next step).
        machine: The digest of the machine the run's agent has where it
            was started (`machine_digest`): the workers' agent must have
            the same ("": not known, not checked).
    """

    agent: str
    session_id: str
    run_id: str
    input: tuple[Message, ...]
    options: DurableOptions = attrs.field(factory=DurableOptions)
    parent: ParentLink | None = None
    store: str | None = None
    resume: bool = False
    queued: tuple[Event, ...] = ()
    status: RunStatus | None = None
    machine: str = ""


@final
@attrs.frozen(kw_only=True)
class RunStatus:
    """Where a durable run is (the workflow's ``status`` query).

    Attributes:
        phase: The brain's phase.
        estimate: Its estimate of the next request, in tokens (None before
            the first measurement).
        decision: The last decision carried out (``call_llm``,
            ``compact:threshold``, ...).
        turn: Model calls made.
        outcome: ``running``, or the run's outcome; ``terminated`` when its
            workflow was terminated from outside (the run never ended), and
            ``failed`` when it failed before its run ended (refused).
        waiting: The tool calls and triggers a paused run waits for, or None.
        children: The session ids of the sub-agents' runs (child workflows)
            the run waits on now.
        children_waiting: Of those, and of theirs, the runs paused for an
            answer (`DurableRun.status` asks them; empty in the query's own
            answer): answer each on its own ``DurableRun(client, session_id)``.
    """

    phase: str
    estimate: int | None
    decision: str
    turn: int
    outcome: str
    waiting: Pause | None = None
    children: tuple[str, ...] = ()
    children_waiting: tuple[str, ...] = ()


def run_result(result: RunResult[Any]) -> Any:
    """A run's result as JSON, without its `output` (the client reads it again)."""
    return serde.to_json(attrs.evolve(result, output=None))
