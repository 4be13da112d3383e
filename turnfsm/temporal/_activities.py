"""The activities: each effect with a side effect, and the session log's I/O.

A workflow (`turnfsm.temporal._workflow`) runs the brain; everything that
meets the outside world runs here, in a worker, with the agent the worker
was given (`create_worker`):

- ``turnfsm.effect`` carries out one decision with its effect (a model
  call, a compaction pass, a custom effect) through `carry_out`, the loop's
  own way of running effects, and returns the event;
- ``turnfsm.tool`` runs one tool call (its id is the idempotency key:
  `turnfsm.driver.current_tool_call`);
- ``turnfsm.load`` / ``turnfsm.append`` read and extend the session's log.

An effect activity first appends the log entries the workflow made since
its last write (they ride in its input): the store holds every event
before the effect it led to starts, as in-process. Appends are
idempotent: an attempt run again after its worker died finds its entries
already in the log and goes on.

Retries: Temporal's policy retries the model call on a transient error
(tenacity is off inside the activity, so the two never stack) and every
activity lost with its worker. A bug in an effect is not retried: the
activity fails for good and the run is logged as crashed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import attrs
from temporalio import activity
from temporalio.exceptions import ApplicationError

from turnfsm import _checks, serde
from turnfsm.agent import Agent
from turnfsm.core import Compact, Event, ModelFailed, Perform, Snapshot, TurnMachine
from turnfsm.driver import (
    Driver,
    EffectContext,
    RetryPolicy,
    carry_out,
    effect_key,
    run_tool_with_hooks,
)
from turnfsm.errors import (
    DURABLE_OWNER,
    ConfigError,
    ContinuedAsNew,
    EffectFailed,
    PayloadTooLarge,
    RunCrashed,
    SessionBusy,
    SessionConflict,
    StoreUnusable,
    TurnFSMError,
)
from turnfsm.messages import Message, ToolCallPart
from turnfsm.persistence import (
    Entry,
    LeasingStore,
    MemoryStore,
    RunEnded,
    RunOpened,
    Session,
    SessionStore,
    store_label,
)
from turnfsm.temporal._payloads import (
    fitting,
    payload_size,
    surely_within,
    workflow_id_of,
)

__all__ = [
    "ACTIVITIES",
    "CRASHED",
    "NOT_SERVED",
    "STOPPING",
    "TRANSIENT",
    "TURNFSM_ERROR",
    "agent_named",
    "append_once",
    "failure_error",
    "not_retried",
    "register",
    "result_past",
    "serves",
    "too_large_result",
]

TRANSIENT: Final = "turnfsm.transient"
"""An `ApplicationError` type: the model call failed transiently (retried);
its details hold the `ModelFailed` event."""

TURNFSM_ERROR: Final = "turnfsm.error"
"""An `ApplicationError` type: its details hold a turnfsm error (not retried)."""

logger = logging.getLogger("turnfsm.driver")

CRASHED: Final = "turnfsm.crashed"
"""An `ApplicationError` type: an effect raised (a bug; not retried)."""

STOPPING: Final = "turnfsm.stopping"
"""An `ApplicationError` type: a local activity's worker is stopping (not
retried: the workflow runs the step again as an activity the server
schedules)."""

_ONE_ATTEMPT: Final = RetryPolicy(max_attempts=1)

_AGENTS: dict[tuple[str, str], Agent] = {}
"""The agents this process serves, by (task queue, `Driver.name`)."""


def register(agents: Sequence[Agent], *, task_queue: str) -> None:
    """Serve `agents` on `task_queue` in this process (`create_worker` does this).

    A workflow finds its agent by the queue it runs on and the agent's name;
    registering another agent of the same name on the same queue replaces
    the first (a worker made again). A workflow on a queue no worker of
    this process serves (a `temporalio.worker.Replayer`'s) gets the agent
    of that name registered last.

    Raises:
        ConfigError: an item is not an `Agent`, or two share a name.
    """
    names: set[str] = set()
    for agent in agents:
        if not isinstance(agent, Agent):
            raise ConfigError("agents", agent, "Agents")
        name = agent.driver.name
        if name in names:
            raise ConfigError("agents", name, "one agent per name (Driver.name)")
        names.add(name)
    for agent in agents:
        key = (task_queue, agent.driver.name)
        _AGENTS.pop(key, None)  # the last registered comes last
        _AGENTS[key] = agent


def _served(name: str, task_queue: str) -> Agent | None:
    """The agent `name` served on `task_queue` (see `register`), or None."""
    agent = _AGENTS.get((task_queue, name))
    if agent is None:
        named = [a for (_, n), a in _AGENTS.items() if n == name]
        return named[-1] if named else None
    return agent


def serves(driver: Driver, task_queue: str) -> bool:
    """Whether the agent of `driver` (that very driver) is served on `task_queue`."""
    agent = _served(driver.name, task_queue)
    return agent is not None and agent.driver is driver


def agent_named(name: str, task_queue: str) -> Agent:
    """Return the agent `name` served on `task_queue`.

    Raises:
        ApplicationError: no worker of this process serves it (not retried):
            a `ConfigError` naming the agent, as the run's result raises it.
    """
    agent = _served(name, task_queue)
    if agent is None:
        known = ", ".join(sorted({n for q, n in _AGENTS if q == task_queue}))
        raise not_retried(
            ConfigError(
                "agent",
                name,
                f"an agent the workers on task queue {task_queue!r} serve (they"
                f" serve {known or 'none'}): run a worker with it (turnfsm"
                " worker --agent MODULE:ATTR), or start the run on its queue",
            )
        )
    return agent


async def append_once(
    store: SessionStore, session_id: str, entries: Sequence[Entry], version: int
) -> int:
    """Append `entries` at `version`, or find them there already; return the version.

    An attempt run again (its worker died after the write, before Temporal
    heard of it) finds some or all of its entries in the log: it appends
    the rest. Anything else at that position is a real conflict.

    Raises:
        SessionConflict: another writer's entries are at `version`.
        StoreUnusable: the store holds less of the log than the run wrote
            there (another store than the one the run began in): nothing
            is written, where it would be a log with a gap.
    """
    try:
        return await store.append(session_id, entries, expected_version=version)
    except SessionConflict as conflict:
        stored = await store.load(session_id)
        if len(stored) < version:
            raise StoreUnusable(
                path=store_label(store),
                reason=(
                    f"it holds {len(stored)} entries of session {session_id!r}, "
                    f"where its durable run has written {version}: this worker "
                    "keeps sessions in another store than the workers that ran "
                    "the run before. The workers of a task queue must share one "
                    "store (a PostgreSQL URL, or one SQLite file they all "
                    "reach); a MemoryStore loses its sessions when its worker "
                    "stops"
                ),
            ) from conflict
        there = stored[version:]
        if len(there) > len(entries) or any(
            serde.envelope(a) != serde.envelope(b)
            for a, b in zip(there, entries, strict=False)
        ):
            raise
        rest = entries[len(there) :]
        if not rest:
            return len(stored)
        return await store.append(session_id, rest, expected_version=len(stored))


def _store(request: Mapping[str, Any]) -> SessionStore:
    """The store of the request's session: its ``store`` agent's, else its agent's."""
    name = request.get("store") or request["agent"]
    return agent_named(name, activity.info().task_queue).store


_HELD_FOR: Final = float(_checks.MAX_SECONDS)
"""Seconds a durable run's lease lasts: until its workflow lets it go.

The longest a lease may last.
"""


def _holder(store: SessionStore, session_id: str) -> LeasingStore | None:
    """The store, if the activity's workflow holds `session_id`'s lease in it.

    A durable run holds its own session (not a child's it reads) for as
    long as its workflow runs, paused or not, so that no process resumes
    or abandons the run in-process meanwhile. A `MemoryStore` lives in the
    worker's process: nothing else can reach it.
    """
    if isinstance(store, MemoryStore) or not isinstance(store, LeasingStore):
        return None
    workflow_id = activity.info().workflow_id
    return store if workflow_id == workflow_id_of(session_id) else None


def _owner() -> str:
    return f"{DURABLE_OWNER}{activity.info().workflow_id}"


async def _hold(store: SessionStore, session_id: str) -> None:
    """Take the session's lease for the workflow (again, on a retry: it holds it).

    Raises:
        ApplicationError: a live process holds the session (`SessionBusy`,
            not retried).
    """
    holder = _holder(store, session_id)
    if holder is None:
        return
    try:
        await holder.acquire_lease(session_id, _owner(), ttl=_HELD_FOR)
    except SessionBusy as exc:
        raise not_retried(exc) from None


async def _write(
    store: SessionStore, session_id: str, log: Mapping[str, Any] | None
) -> None:
    """Write the entries the workflow made (a conflict is not retried).

    The run's first write takes the session for the workflow, before
    anything is written; once the run has ended (not paused, nor stopped
    to continue in a new workflow run), the workflow lets it go.
    """
    if not log or not log["entries"]:
        return
    entries: list[Entry] = [serde.open_envelope(e, Entry) for e in log["entries"]]
    if any(isinstance(e, RunOpened) for e in entries):
        await _hold(store, session_id)
    try:
        await append_once(store, session_id, entries, log["version"])
    except SessionConflict as exc:
        raise not_retried(exc) from None
    except StoreUnusable as exc:
        if not isinstance(exc.__cause__, SessionConflict):
            raise  # the store down: retried, as an activity lost with its store
        raise not_retried(exc) from None  # another store than the run's
    if any(_lets_go(e) for e in entries):
        holder = _holder(store, session_id)
        if holder is not None:
            await holder.release_lease(session_id, _owner())


def _lets_go(entry: Entry) -> bool:
    """Whether `entry` ends the run for good: not paused, nor continued as new."""
    return (
        isinstance(entry, RunEnded)
        and entry.outcome != "paused"
        and not isinstance(entry.error, ContinuedAsNew)
    )


@attrs.define
class _Beat:
    """Whether an activity's heartbeat lapsed: the loop held past its timeout."""

    timeout: float | None
    last: float = attrs.field(factory=time.monotonic)
    lapsed: bool = False

    def tick(self) -> None:
        now = time.monotonic()
        if self.timeout is not None and now - self.last > self.timeout:
            self.lapsed = True  # Temporal took the worker for lost meanwhile
        self.last = now


@contextlib.asynccontextmanager
async def _beating() -> AsyncIterator[_Beat]:
    """Heartbeat every third of the activity's heartbeat timeout while it runs.

    Yields whether the heartbeat lapsed: something held the worker's event
    loop past the timeout (a blocking call in an async tool), so Temporal
    scheduled the activity again though its worker was not lost.
    """
    info = activity.info()
    timeout = info.heartbeat_timeout
    if timeout is None or timeout <= timedelta(0):
        yield _Beat(None)
        return
    beat = _Beat(timeout.total_seconds())
    period = timeout.total_seconds() / 3

    async def beats() -> None:
        while True:  # not at once: a short activity sends none
            await asyncio.sleep(period)
            beat.tick()
            activity.heartbeat()

    task = asyncio.create_task(beats())
    try:
        yield beat
    finally:
        beat.tick()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


_HELD: Final[collections.OrderedDict[tuple[str, str], asyncio.Future[Any]]] = (
    collections.OrderedDict()
)
"""The tool calls of this process whose heartbeat lapsed, by workflow and
activity id: the run that went on, for the attempt Temporal scheduled again
to take its result instead of running the tool a second time."""

_RUNNING: Final[dict[tuple[str, str], asyncio.Future[Any]]] = {}
"""The tool calls running in this process, by workflow and activity id: an
attempt scheduled again meanwhile (the first held the loop) waits for it."""

_HELD_KEPT: Final = 64
"""Lapsed tool calls remembered (the oldest are forgotten)."""


def not_retried(exc: TurnFSMError) -> ApplicationError:
    """The failure that carries a typed error as a value (not retried)."""
    return ApplicationError(
        str(exc),
        serde.error_to_json(exc),
        type=TURNFSM_ERROR,
        non_retryable=True,
    )


def failure_error(cause: BaseException | None) -> TurnFSMError:
    """The typed error a failed run's workflow stands for (its failure's cause).

    A typed error the run raised (`not_retried`) comes back as itself; a
    crash (`CRASHED`, or anything else) as `RunCrashed` naming it.
    """
    if isinstance(cause, ApplicationError) and cause.details:
        detail = cause.details[0]
        if cause.type == TURNFSM_ERROR:
            return serde.error_from_json(detail)
        if isinstance(detail, Mapping) and {"type", "message"} <= set(detail):
            return RunCrashed(type=str(detail["type"]), message=str(detail["message"]))
    return RunCrashed(type=type(cause).__name__, message=str(cause))


def _crashed(exc: Exception) -> ApplicationError:
    return ApplicationError(
        f"{type(exc).__name__}: {exc}",
        {"type": type(exc).__name__, "message": str(exc)},
        type=CRASHED,
        non_retryable=True,
    )


@activity.defn(name="turnfsm.load")
async def load_log(request: dict[str, Any]) -> dict[str, Any]:
    """Return the session's log (every entry as its envelope), a part at a time.

    From entry ``start``, as many as ``budget`` bytes take (one at least;
    all of them without a budget); ``more`` says whether entries are left.
    """
    store = _store(request)
    session_id = request["session_id"]
    async with _beating():
        entries = await store.load(session_id)
        envelopes = [serde.envelope(e) for e in entries[request.get("start", 0) :]]
        budget = request.get("budget")
        read: dict[str, Any] = {"entries": envelopes}
        if budget is not None:
            kept = fitting(envelopes, budget)
            read = {"entries": envelopes[:kept], "more": kept < len(envelopes)}
        if not read.get("more") and (held := await _held_by(store, session_id)):
            read["held"] = held  # with the last part, which the workflow keeps
    return read


async def _held_by(store: SessionStore, session_id: str) -> dict[str, Any] | None:
    """Who else holds the workflow's own session, while their lease is live.

    A process running a run of it: the workflow's run is then refused
    naming that process (its log shows the run open), not as if the run
    were paused or its process dead.
    """
    holder = _holder(store, session_id)
    lease = None if holder is None else await holder.lease_of(session_id)
    if lease is None or lease.owner == _owner() or lease.expires_at <= time.time():
        return None
    return {"owner": lease.owner, "since": lease.since, "until": lease.expires_at}


@activity.defn(name="turnfsm.append")
async def append_log(request: dict[str, Any]) -> None:
    """Append the entries the workflow made (idempotent: `append_once`)."""
    store = _store(request)
    async with _beating():
        await _write(store, request["session_id"], request["log"])


@activity.defn(name="turnfsm.effect")
async def run_effect(request: dict[str, Any]) -> dict[str, Any]:
    """Write the log so far, then carry out the decision the snapshot holds."""
    agent = agent_named(request["agent"], activity.info().task_queue)
    store = _store(request)
    session_id, run_id = request["session_id"], request["run_id"]
    async with _beating() as beat:
        await _write(store, session_id, request.get("log"))
        driver = agent.driver
        snapshot = serde.from_json(Snapshot, request["snapshot"])
        decision = TurnMachine.from_snapshot(driver.machine, snapshot).decision
        key = effect_key(decision)
        if key != request["key"]:
            raise ApplicationError(
                f"the snapshot decides {key!r}, not {request['key']!r}",
                type=CRASHED,
                non_retryable=True,
            )
        # A compaction pass reads the breaker and the recorded summaries; a
        # custom effect may read anything: they get the session's log.
        needs_log = isinstance(decision, Compact | Perform)
        session = await Session.open(store, session_id) if needs_log else None
        run = driver.resources(
            run_id,
            session=session,
            session_id=session_id,
            output=driver._output,
            retry=_ONE_ATTEMPT if key == "call_llm" else None,
        )
        info = activity.info()
        if key == "call_llm" and info.attempt > 1:
            # Temporal's retry of the model call: the hooks hear its number
            # and its wait, as of an in-process retry.
            run = attrs.evolve(
                run,
                first_attempt=info.attempt,
                first_wait=_waited(info, driver.retry),
            )
        ctx = EffectContext(run=run, snapshot=snapshot)

        async def work() -> dict[str, Any]:
            return await _carry_out(driver, ctx, decision, key, run_id, request)

        what = "the model call" if key == "call_llm" else f"effect {key!r}"
        return await _once(beat, f"{what} (run {run_id})", work)


async def _carry_out(
    driver: Driver,
    ctx: EffectContext,
    decision: Any,
    key: str,
    run_id: str,
    request: Mapping[str, Any],
) -> dict[str, Any]:
    """Carry the effect's decision out; the event it ends with, as JSON."""
    try:
        event = await carry_out(driver.effect_settings, ctx, decision)
    except TurnFSMError as exc:
        raise not_retried(exc) from None
    except Exception as exc:
        if key not in driver.effects:  # a built-in effect's bug
            raise _crashed(exc) from exc
        # An effect of the user's: the run fails with a typed error, as
        # in-process (its traceback in the worker's log).
        logger.error("run %s: effect %r raised", run_id, key, exc_info=exc)
        failed = EffectFailed(effect=key, type=type(exc).__name__, message=str(exc))
        raise not_retried(failed) from None
    data = _answer(event, driver.retry)
    limit = request.get("payload_limit")
    if limit is not None and (size := payload_size(data)) > limit:
        # Refused as a result, the activity would be run again and again
        # (a model call each time): the run fails after this attempt.
        too_large = PayloadTooLarge(effect=key, size=size, limit=limit, returned=True)
        raise not_retried(too_large)
    return data


_RETRY_WAIT: Final = "retry_wait"
"""The heartbeat detail a failed model call's attempt leaves: the wait it chose."""


def _waited(info: activity.Info, policy: RetryPolicy) -> float:
    """The seconds the retry before attempt `info.attempt` waited.

    What the attempt before chose and left in its heartbeat (a provider's
    Retry-After among them), else the policy's backoff, Temporal's wait (an
    attempt that timed out, or was lost with its worker, left none).
    """
    for detail in reversed(info.heartbeat_details):
        if not isinstance(detail, Mapping) or detail.get("attempt") != info.attempt - 1:
            continue
        wait = detail.get(_RETRY_WAIT)
        if isinstance(wait, int | float) and not isinstance(wait, bool):
            return float(wait)
    return policy.backoff(info.attempt - 1)


def _answer(event: Event, policy: RetryPolicy) -> dict[str, Any]:
    """The event as JSON; a transient model failure is raised for Temporal to retry.

    Only while the run's `RetryPolicy` allows, as the in-process retry
    does: attempts are left (`max_attempts`), and the wait before the next
    one (the provider's Retry-After, else Temporal's backoff, which the
    activity's retry policy takes from `initial_wait` and `max_wait`) ends
    within `max_total` of the first attempt. Else the failure goes to the
    brain, with the attempts Temporal made and the time since the first.
    """
    if isinstance(event, ModelFailed) and event.error.retryable:
        info = activity.info()
        since = (datetime.now(UTC) - info.scheduled_time).total_seconds()
        since = max(0.0, since)
        wait = event.error.retry_after
        message = event.error.message
        if info.attempt < policy.max_attempts:
            past = (
                None
                if wait is None
                else policy.past_budget(message, wait, elapsed=since)
            )
            then = policy.backoff(info.attempt) if wait is None else wait
            if past is not None:
                message = past
            elif policy.allows_wait(then, elapsed=since):
                # Kept for the next attempt, which tells the hooks how long
                # it waited (an activity's; a local one's goes without).
                activity.heartbeat({_RETRY_WAIT: then, "attempt": info.attempt})
                raise ApplicationError(
                    message,
                    serde.to_json(event),
                    type=TRANSIENT,
                    next_retry_delay=timedelta(seconds=wait) if wait else None,
                )
        error = attrs.evolve(
            event.error,
            message=message,
            attempts=info.attempt,
            elapsed=round(since, 3),
        )
        event = ModelFailed(error=error)
    data: dict[str, Any] = serde.to_json(event)  # type: ignore[assignment]
    return data


@activity.defn(name="turnfsm.tool")
async def run_tool(request: dict[str, Any]) -> dict[str, Any]:
    """Run one tool call of the batch in flight; return its result message."""
    agent = agent_named(request["agent"], activity.info().task_queue)
    session_id = request["session_id"]
    call = serde.from_json(ToolCallPart, request["call"])
    wait = request.get("wait_for_tool")
    if wait is not None:
        _served_here(agent, call, wait)
    async with _beating() as beat:
        await _write(_store(request), session_id, request.get("log"))

        async def work() -> dict[str, Any]:
            return await _call_tool(agent, request, session_id, call)

        return await _once(beat, f"tool {call.name!r} (call {call.id})", work)


NOT_SERVED: Final = "turnfsm.not_served"
"""An `ApplicationError` type: this worker's agent lacks a tool the run offers
(retried: another worker on the queue may have it)."""


def _served_here(agent: Agent, call: ToolCallPart, wait: float) -> None:
    """Refuse, for `wait` seconds, a call of a tool this worker's agent lacks.

    The run's workflow has the tool: workers of one queue serving other
    builds of the agent (a rolling deploy) may lack it. The refusal is
    retried, and Temporal gives the call to a worker that has the tool;
    past `wait` seconds since the call was first scheduled it is answered
    here, as a call of a tool there is not.

    Raises:
        ApplicationError: of type `NOT_SERVED`, within the wait.
    """
    if call.name in agent.driver._tools:
        return
    info = activity.info()
    waited = (datetime.now(UTC) - info.scheduled_time).total_seconds()
    said = (
        f"tool {call.name!r} (call {call.id}) of agent {agent.driver.name!r}: "
        f"the run's workflow has it, the agent this worker on queue "
        f"{info.task_queue!r} serves does not (workers serving another build "
        "of the agent)"
    )
    if waited >= wait:
        logger.warning(
            "%s; after %.0f s and %d attempts, answered as a call of a tool "
            "there is not",
            said,
            waited,
            info.attempt,
        )
        return
    raise ApplicationError(
        f"{said}; Temporal tries it again, on a worker that has it", type=NOT_SERVED
    )


async def _once(
    beat: _Beat, what: str, work: Callable[[], Awaitable[dict[str, Any]]]
) -> dict[str, Any]:
    """`work`'s answer, carried out once in this process for its activity.

    An attempt that holds the worker's event loop past the heartbeat
    timeout is timed out by Temporal and scheduled again, though its worker
    was not lost: that cancel does not stop it, and the next attempt takes
    its answer (waiting for it if it runs still) instead of carrying the
    work out again. A failed attempt is not kept: the next one carries the
    work out again.
    """
    info = activity.info()
    # Ids count from 1 in each workflow run (a session's runs share its
    # workflow id), and a local activity's apart from the server's.
    key = (
        f"{info.workflow_id}:{info.workflow_run_id}",
        ("local:" if info.is_local else "") + info.activity_id,
    )
    # Kept for every later attempt: one scheduled while the loop was held
    # times out too (its heartbeat clock runs before it reaches Python).
    earlier = _HELD.get(key) or _RUNNING.get(key)
    if earlier is not None:
        data: dict[str, Any] = await asyncio.shield(earlier)
        return data
    task = asyncio.ensure_future(work())
    task.add_done_callback(_seen)
    _RUNNING[key] = task
    try:
        if info.is_local:
            await _unless_stopping(task)
        data = await asyncio.shield(task)
    except asyncio.CancelledError:
        beat.tick()
        if not (beat.lapsed and _timed_out()):
            task.cancel()  # a cancel of the run's (or the worker stopping)
            raise
        _keep_for_retry(key, task, what, beat)
        raise
    finally:
        _RUNNING.pop(key, None)
    beat.tick()
    if beat.lapsed:  # Temporal carries it out again: it takes this answer
        _keep_for_retry(key, task, what, beat)
    return data


async def _unless_stopping(task: asyncio.Future[Any]) -> None:
    """Wait for `task`, unless the worker stops first: then cancel it and fail.

    A local activity keeps its worker's workflow task open, and a worker
    stopping waits for it (Temporal does not cancel it). It fails, not
    retried, for the workflow to run the step again as an activity the
    server schedules, which a worker that goes on carries out.
    """
    stopping = asyncio.ensure_future(activity.wait_for_worker_shutdown())
    try:
        await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if not task.done():
        task.cancel()
        raise ApplicationError(
            "the worker is stopping", type=STOPPING, non_retryable=True
        )


def _timed_out() -> bool:
    """Whether Temporal cancelled the activity for its lapsed heartbeat."""
    details = activity.cancellation_details()
    return (
        details is not None
        and not details.cancel_requested
        and not details.worker_shutdown
        and (details.timed_out or details.not_found)
    )


def _keep_for_retry(
    key: tuple[str, str], task: asyncio.Future[Any], what: str, beat: _Beat
) -> None:
    """Keep `task` for the attempt Temporal schedules again; say why."""
    logger.warning(
        "%s held the worker's event loop past the heartbeat timeout (%s s), "
        "so Temporal scheduled it again; it is not carried out again. "
        "Await in async code (a blocking call belongs in a plain def "
        "tool, run in a thread), or raise DurableOptions.heartbeat_timeout",
        what,
        beat.timeout,
    )
    _HELD[key] = task
    while len(_HELD) > _HELD_KEPT:
        _HELD.popitem(last=False)


def _seen(future: asyncio.Future[Any]) -> None:
    """Retrieve an attempt's outcome, so an error nobody awaits is not logged."""
    if not future.cancelled():
        future.exception()


async def _call_tool(
    agent: Agent, request: Mapping[str, Any], session_id: str, call: ToolCallPart
) -> dict[str, Any]:
    """Run the request's tool call; its result message as JSON."""
    driver = agent.driver
    run = driver.resources(request["run_id"], session=None, session_id=session_id)
    try:
        result = await run_tool_with_hooks(run, call, turn=_turn(request))
    except Exception as exc:  # tool errors are results: this is a hook's bug
        raise _crashed(exc) from exc
    data: dict[str, Any] = serde.to_json(result)  # type: ignore[assignment]
    limit = request.get("result_limit")
    if limit is not None and result_past(result, limit):
        too_large = too_large_result(call, result, limit)
        data = serde.to_json(too_large)  # type: ignore[assignment]
    return data


def result_past(result: Message, limit: int) -> bool:
    """Whether a tool result's JSON is over `limit` bytes (measured if it may be)."""
    text = sum(len(r.content) for r in result.tool_results)
    if surely_within(text, 1, limit):
        return False
    return payload_size(serde.to_json(result)) > limit


def too_large_result(
    call: ToolCallPart, result: Message, limit: int, *, batch: bool = False
) -> Message:
    """The error result that stands for `result`, past what a durable run carries.

    `limit` is half of `DurableOptions.payload_limit`: what one result may
    take, or (`batch`) all the results of its batch together.
    """
    size = payload_size(serde.to_json(result))
    what = "with the other results of its batch, " if batch else ""
    return Message.tool_result(
        call.id,
        f"tool {call.name!r} returned {size:,} bytes, {what}more than a durable "
        f"run's activity can carry ({limit:,} bytes: half of "
        "DurableOptions.payload_limit, Temporal's limit for one payload); "
        "ask it for less (a narrower query, one page)",
        is_error=True,
        id=result.id,
    )


def _turn(request: Mapping[str, Any]) -> int:
    """The turn of a tool call's request (its conversation stays in the workflow).

    A request scheduled by an earlier version of the workflow carries the
    whole snapshot instead.
    """
    if "turn" in request:
        turn: int = request["turn"]
        return turn
    snapshot: Snapshot = serde.from_json(Snapshot, request["snapshot"])
    return snapshot.turns


ACTIVITIES: Final = (load_log, append_log, run_effect, run_tool)
"""Every activity a worker serving durable runs registers."""
