"""``turnfsm approve | reject | resume | abandon SESSION [RUN]``: answer a paused run.

Each works from the store alone, in any process: the session's log keeps the
run and the machine it began on. Going on needs a model, and the tools the
run calls when they are your own: ``--agent MODULE:ATTR`` (your agent), or
``--model`` and ``--tools``. ``abandon`` needs neither.
"""

from __future__ import annotations

import contextlib
import shlex
import sys
from typing import TextIO, final

import attrs

from turnfsm.cli._run import (
    REPORTED,
    AgentOptions,
    Crashed,
    StoreStopped,
    answer_hint,
    call_text,
    cli_store,
    cli_words,
    close_model,
    console_for,
    interruptible,
    left_open_words,
    load_cli_session,
    open_driver,
    raise_if_crashed,
    report_interrupted,
    report_result,
    run_async,
    show_command,
    waiting_for,
)
from turnfsm.cli._stores import where
from turnfsm.core import Event, ToolCallsReviewed
from turnfsm.driver import Driver, RunResult, Tool, read_session
from turnfsm.errors import (
    ConfigError,
    SessionBusy,
    SessionNotFound,
    SubagentWaiting,
    busy_words,
)
from turnfsm.hooks import ConsoleHook, DecisionInfo, Hook, TransitionInfo
from turnfsm.persistence import (
    RunRecord,
    Session,
    SessionStore,
    holder_of,
    parent_of,
)

__all__ = ["ANSWERS", "AnswerCommand", "run_answer"]

ANSWERS = ("approve", "reject", "resume", "abandon")
"""The commands that answer a paused (or unfinished) run."""


@final
@attrs.frozen(kw_only=True)
class AnswerCommand:
    """What ``turnfsm approve | reject | resume | abandon`` was asked to do.

    `calls` are the call ids ``reject`` refuses (empty: every call the run
    waits on); `reason` is the reviewer's word (``reject``, ``abandon``).
    """

    action: str
    session_id: str
    run_id: str | None = None
    calls: tuple[str, ...] = ()
    reason: str | None = None
    force: bool = False


def run_answer(
    command: AnswerCommand,
    options: AgentOptions,
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Answer the run; print the calls it waits on, then how it went on.

    Returns as ``turnfsm run`` does: 0 done, 1 failed or cancelled, 3 paused
    again; 2 when the answer was refused (nothing was written). Errors go to
    `err` (None: standard error).
    """
    stream = out or sys.stdout
    errors = err or sys.stderr
    name = f"turnfsm {command.action}"
    try:
        return run_async(_answer, command, options, stream)
    except Crashed as crash:
        return crash.report(stream, errors)
    except StoreStopped as stopped:
        return stopped.report(name, options, stream, errors)
    except SessionBusy as exc:
        said = busy_words(exc, "--force")
        hint = " (--force takes it over)" if exc.alive is False else ""
        print(f"{name}: {said}{hint}", file=errors)
        return 2
    except REPORTED as exc:
        print(f"{name}: {cli_words(exc, options)}", file=errors)
        return 2


async def _answer(command: AnswerCommand, options: AgentOptions, out: TextIO) -> int:
    if options.agent is not None:  # your agent: loaded once, its store first
        with open_driver(options) as (driver, own):
            return await _answer_with(command, options, out, driver, own)
    return await _answer_with(command, options, out, None, None)


async def _answer_with(
    command: AnswerCommand,
    options: AgentOptions,
    out: TextIO,
    agent_driver: Driver | None,
    own: SessionStore | None,
) -> int:
    # The run is read first (from --store, else your agent's own store when
    # it has one, else the CLI's): without --agent, its machine comes from
    # the log.
    # A store of your agent's is given its store_timeout (the CLI's own
    # stores bound their waits themselves).
    seconds = agent_driver.store_timeout if agent_driver is not None else None
    async with cli_store(options.store, own) as store:
        session = await load_cli_session(store, command.session_id, seconds=seconds)
        run = _open_run(session, command.run_id, store, options)
        # A sub-agent's paused run is answered through its callers' runs:
        # the answer goes down to it, and every caller goes on.
        inner, paused = session, run
        if command.action != "abandon":  # abandon ends the run it is given
            inner, paused = await _paused_subagent(store, run, seconds) or (
                session,
                run,
            )
            caller = await _top_caller(store, inner, paused, seconds)
            if caller is not None:
                session, run = caller
        _show_waiting(paused, out)
        if paused is not run:
            print(
                f"it is a sub-agent's run: its caller, run {run.run_id} of "
                f"session {session.id}, goes on with it",
                file=out,
            )
        with contextlib.ExitStack() as stack:
            driver = agent_driver
            if driver is None:
                driver, _ = stack.enter_context(
                    open_driver(
                        options,
                        machine=session.machine(run.opened.digest),
                        need_model=command.action != "abandon",
                    )
                )
            started = [r.run_id for r in session.runs].index(run.run_id)
            resume = shlex.join(["turnfsm", "resume", session.id, *options.flags()])
            left = left_open_words(
                session.id,
                where(store),
                options,
                resume=resume,
                lease_ttl=driver.lease_ttl,
            )
            console = console_for(out)
            try:
                result = await interruptible(
                    lambda: _go_on(
                        command, driver, session, run, console, paused, resume
                    ),
                    out,
                    left=left,
                    console=console,
                )
            except Exception as exc:
                raise_if_crashed(exc, session, started, store)
                raise
            finally:
                await close_model(driver)
        name = f"turnfsm {command.action}"
        if result is None:  # Ctrl-C or SIGTERM: the run is logged interrupted
            return report_interrupted(
                session.id, where(store), options, out, resume=resume, command=name
            )
        abandoned = command.action == "abandon"
        return report_result(
            result, where(store), options, out, abandoned=abandoned, command=name
        )


def _open_run(
    session: Session, run_id: str | None, store: SessionStore, options: AgentOptions
) -> RunRecord:
    waiting = session.open_runs()
    if run_id is not None:
        for run in waiting:
            if run.run_id == run_id:
                return run
        runs = ", ".join(r.run_id for r in waiting) or "none"
        raise ConfigError(
            "RUN",
            run_id,
            f"a paused or unfinished run of session {session.id} (open: {runs})",
        )
    if not waiting:
        raise ConfigError(
            "SESSION",
            session.id,
            f"a session with a paused or unfinished run (in {where(store)}, "
            f"it has none: `{show_command(session.id, store, options)}` lists "
            "its runs)",
        )
    return waiting[-1]


def _show_waiting(run: RunRecord, out: TextIO) -> None:
    if run.waiting is None:
        if run.outcome == "interrupted":  # its end is in the log
            print(
                f"run {run.run_id} was interrupted (Ctrl-C, or a cancelled task)",
                file=out,
            )
        else:
            print(
                f"run {run.run_id} is unfinished (its process ended, or is still "
                "running it)",
                file=out,
            )
        return
    calls = run.waiting.calls
    waits = waiting_for(run.waiting).removeprefix("waiting ")
    print(f"run {run.run_id} waits in {run.waiting.phase} {waits}", file=out)
    for call in calls:
        print(f"  {call.id}  {call_text(call.name, call.arguments)}", file=out)


async def _paused_subagent(
    store: SessionStore, run: RunRecord, seconds: float | None
) -> tuple[Session, RunRecord] | None:
    """The paused sub-agent run that `run` stopped for, and its session."""
    error = run.error
    if run.outcome != "interrupted" or not isinstance(error, SubagentWaiting):
        return None
    try:
        child = await read_session(
            store, error.session_id, seconds=seconds, must_exist=True
        )
    except SessionNotFound:
        return None
    paused = next((r for r in child.open_runs() if r.run_id == error.run_id), None)
    return None if paused is None else (child, paused)


async def _top_caller(
    store: SessionStore, inner: Session, paused: RunRecord, seconds: float | None
) -> tuple[Session, RunRecord] | None:
    """The outermost caller whose run waits on the sub-agent run `paused`.

    Raises:
        ConfigError: its caller waits on another sub-agent first.
    """
    if paused.outcome != "paused":
        return None
    paused_id = inner.id
    top: tuple[Session, RunRecord] | None = None
    while (link := parent_of(inner)) is not None:
        try:
            caller = await read_session(
                store, link.session_id, seconds=seconds, must_exist=True
            )
        except SessionNotFound:
            break
        run = next((r for r in caller.open_runs() if r.run_id == link.run_id), None)
        error = run.error if run is not None else None
        if run is None or not isinstance(error, SubagentWaiting):
            break
        if error.run_id != paused.run_id:
            # Its caller stopped for another sub-agent of the same batch: that
            # one is answered first (through the caller), then this one.
            raise ConfigError(
                "SESSION",
                paused_id,
                f"the sub-agent run its caller waits on first: session "
                f"{error.session_id} (answer it, then this one)",
            )
        top, inner = (caller, run), caller
    return top


async def _go_on(
    command: AnswerCommand,
    driver: Driver,
    session: Session,
    run: RunRecord,
    console: ConsoleHook,
    paused: RunRecord,
    resume: str,
) -> RunResult:
    if command.action == "abandon":
        reason = command.reason or "abandoned from the command line"
        return await driver.abandon(
            session, run.run_id, reason=reason, force=command.force
        )
    if paused.waiting is None and command.action != "resume":
        # Not paused: no answer applies to it, whoever holds it (--force
        # takes over nothing an answer could go on with). Another process
        # may be carrying it on: its lease says who, which `turnfsm resume`
        # would be refused for too.
        held = await holder_of(session, session.store)
        raise _not_paused(command, paused, resume, held)
    event = _event(command, paused)
    if paused is run:  # a sub-agent's tools are inside its caller's tool
        _check_tools(driver, run, command)
    return await driver.resume(
        session,
        run.run_id,
        event,
        hooks=[_GoesOn(console.out, command.action), console],
        force=command.force,
    )


class _GoesOn(Hook):
    """Says the run goes on once it does: taken, checked, its answer handled.

    Printed before, it preceded the refusal of a command that lost the
    session to another one (two ``turnfsm approve`` at once).
    """

    def __init__(self, out: TextIO, action: str) -> None:
        self.out, self.action, self.said = out, action, False

    def on_transition(self, info: TransitionInfo) -> None:
        """The answer moved the run on."""
        self._say()

    def on_decision(self, info: DecisionInfo) -> None:
        """The run carries on its step in flight (an unfinished run)."""
        self._say()

    def _say(self) -> None:
        if not self.said:
            self.said = True
            print(f"{self.action}: the run goes on", file=self.out)


def _target(command: AnswerCommand) -> str:
    """The session and run the command named, as they are typed again."""
    return shlex.join([command.session_id, *filter(None, [command.run_id])])


def _not_paused(
    command: AnswerCommand, run: RunRecord, resume: str, held: SessionBusy | None
) -> ConfigError:
    """The refusal of an answer to `run`, which is unfinished, not paused.

    `resume` carries it on once no other process holds it; `held` names the
    process that does (its lease is live), and how to take the run over.
    """
    said = (
        f"a paused run to {command.action}: run {run.run_id} is unfinished, "
        f"and `{resume}` carries it on"
    )
    if held is not None:
        said += f"; {busy_words(held, f'`{resume} --force`')}"
    if command.run_id is None:
        return ConfigError("SESSION", command.session_id, said)
    return ConfigError("RUN", command.run_id, said)


def _event(command: AnswerCommand, run: RunRecord) -> Event | None:
    pause = run.waiting
    if command.action == "resume":
        if pause is not None:  # refused before "the run goes on" is printed
            raise ConfigError(
                "RUN",
                run.run_id,
                f"an unfinished run to resume (it is paused in {pause.phase}: "
                f"answer it with {answer_hint(pause, _target(command))})",
            )
        return None
    assert pause is not None  # `_not_paused` refused an unfinished run
    if not pause.takes_review:  # a pause phase of your own machine file
        raise ConfigError(
            "RUN",
            run.run_id,
            f"a run paused for a review of its tool calls to {command.action} "
            f"(it waits in {pause.phase}, for no review: answer it with "
            f"{answer_hint(pause, _target(command))})",
        )
    if command.action == "approve":
        return ToolCallsReviewed.approve_all()
    waiting = [call.id for call in pause.calls]
    for call_id in command.calls:
        if call_id not in waiting:
            raise ConfigError(
                "--call", call_id, f"a call the run waits on ({', '.join(waiting)})"
            )
    reason = command.reason or "rejected from the command line"
    return ToolCallsReviewed.reject(
        dict.fromkeys(command.calls or tuple(waiting), reason)
    )


def _check_tools(driver: Driver, run: RunRecord, command: AnswerCommand) -> None:
    """Refuse before anything is written when an approved call's tool is missing."""
    if run.waiting is None:
        return
    rejected = set(command.calls) if command.calls else None
    if command.action == "reject" and rejected is None:
        return  # every call is rejected: no tool runs
    approved = [c for c in run.waiting.calls if c.id not in (rejected or ())]
    known = {
        tool.name if isinstance(tool, Tool) else Tool.from_function(tool).name
        for tool in driver.tools
    }
    missing = sorted({c.name for c in approved} - known)
    if missing:
        calls = " ".join(f"--call {c.id}" for c in approved if c.name not in known)
        raise ConfigError(
            "--tools",
            None,
            f"the tools the run calls ({', '.join(missing)}): give your agent "
            "with --agent MODULE:ATTR, or --tools MODULE:FUNC,..., or reject "
            f"the calls to them (turnfsm reject {command.session_id} {calls})",
            missing=True,
        )
