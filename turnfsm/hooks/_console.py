"""`ConsoleHook`: a run printed as it happens, for a person watching it."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time
from collections.abc import Iterator
from typing import Any, Final, TextIO, final

import anyio

from turnfsm import _checks
from turnfsm.core import CompactReason, Measure, ModelReplied, emergency_line
from turnfsm.core import threshold_line as _threshold_line
from turnfsm.errors import ConfigError, ProviderError
from turnfsm.hooks._hook import Hook
from turnfsm.hooks._infos import (
    DecisionInfo,
    ModelCallEnd,
    ModelCallInfo,
    OutcomeInfo,
    RunEndInfo,
    RunStartInfo,
    TextDeltaInfo,
    ToolCallEnd,
    ToolCallInfo,
    TransitionInfo,
)
from turnfsm.persistence import CompactionRecord

__all__ = ["ConsoleHook"]

_ARGUMENTS_WIDTH = 120


_TEXT_STREAM: Final = (
    "a text stream with a write() method (sys.stdout, an open text file, "
    "io.StringIO), or None"
)


def _check_out(out: object) -> None:
    """Refuse an `out` the hook cannot print text to.

    A string or a number has no ``write``; a binary stream (``io.BytesIO``,
    a file opened ``"wb"``) has one that refuses text: each failed at the
    hook's first line, inside the run, and the hook was detached.
    """
    if out is None:
        return
    mode = getattr(out, "mode", "")
    binary = isinstance(out, io.RawIOBase | io.BufferedIOBase) or (
        isinstance(mode, str) and "b" in mode
    )
    if binary:
        raise ConfigError(
            "out",
            out,
            f"{_TEXT_STREAM}: this stream is binary (open the file in text mode)",
        )
    if isinstance(out, str | bytes) or not callable(getattr(out, "write", None)):
        hint = " (open the file: out=open(path, 'w'))" if isinstance(out, str) else ""
        raise ConfigError("out", out, f"{_TEXT_STREAM}{hint}")


@final
class ConsoleHook(Hook):
    """Prints a run as it happens: phases, measurements, tool calls, compactions.

    One line per step, in plain text:

    ```text
      start --measured--> call_llm
    [call_llm] CallLLM
    [tool] read_log({"name": "app.log"})
    [tool] read_log -> 1571 characters
    [tool] read_log -> error: tool 'read_log' failed: FileNotFoundError: ...
    [measure] request = 1851 tokens (estimated), threshold line 6400, ...
    [compaction] reason=threshold_exceeded (TruncatingCompactor): 6818 -> 2026 ...
    [model] attempt 1 failed: [rate_limit] HTTP 429: slow down
    [model] attempt 2, 2.0 s later
    ```

    On a terminal it also keeps a live status line at the bottom (the phase,
    the last measured tokens, the tool calls so far, the time), drawn with
    ``rich``; piped or redirected, it prints the plain lines only. When its
    stream fails (the reader went away, ``| head -1``; a full disk), it
    prints nothing more and the run goes on to its end.

    Example:
        ```python
        agent = Agent(model=my_model, tools=[search], hooks=[ConsoleHook()])
        ```

    Args:
        out: Where to print (default: standard output when the run starts).
        replies: Also print the model's replies: as they stream in, or
            whole when they arrive (a model that does not stream).
        live: Keep the live status line: None (the default) on a terminal
            only (not when ``TERM=dumb`` or ``NO_COLOR`` is set), True or
            False to choose.

    Raises:
        ConfigError: `out` is not a text stream (a binary one, a file's
            name), or `replies` or `live` is not True or False.
    """

    def __init__(
        self,
        out: TextIO | None = None,
        *,
        replies: bool = False,
        live: bool | None = None,
    ) -> None:
        _check_out(out)
        _checks.check(replies, "replies", _checks.boolean())
        _checks.check(live, "live", _checks.boolean(optional=True))
        self._out = out
        self.replies = replies
        self._live_wanted = live
        self._live: Any = None
        self._console: Any = None
        self._gone = False
        self._streamed = False
        self._pending = ""
        self._window = 0
        self._threshold = 0
        self._phase = "start"
        self._tokens: int | None = None
        self._tools = 0
        self._turns = 0
        self._started = time.monotonic()

    @property
    def out(self) -> TextIO:
        """The stream the lines go to."""
        return self._out if self._out is not None else sys.stdout

    # -- printing ------------------------------------------------------------

    def print(self, line: str) -> None:
        """Print one line (above the live status line, when there is one)."""
        if self._gone:
            return
        with self._reader_gone():
            if self._console is not None:
                self._flush_pending()
                self._console.print(line, markup=False, highlight=False, soft_wrap=True)
            else:
                print(line, file=self.out, flush=True)

    def write(self, text: str) -> None:
        """Print `text` as it comes (a streamed reply: no line end of its own)."""
        if self._gone:
            return
        with self._reader_gone():
            if self._console is None:  # as print(): no stream (stdout closed)
                print(text, end="", file=self.out, flush=True)
                return
            # Under the live line, whole lines only: the rest waits for its end.
            self._pending += text
            *lines, self._pending = self._pending.split("\n")
            for line in lines:
                self._console.print(line, markup=False, highlight=False, soft_wrap=True)

    @contextlib.contextmanager
    def _reader_gone(self) -> Iterator[None]:
        """Print nothing more once the stream fails (``| head``, a full disk).

        The run goes on to its end, and is kept, as it would with no hook;
        only its printing stops (a reader gone is not the run's failure).
        """
        try:
            yield
        except OSError:  # BrokenPipeError, or ENOSPC on a file
            self._gone = True

    def _flush_pending(self) -> None:
        if self._pending and self._console is not None:
            pending, self._pending = self._pending, ""
            self._console.print(pending, markup=False, highlight=False, soft_wrap=True)

    def _wants_live(self) -> bool:
        if self._live_wanted is not None:
            return self._live_wanted
        if os.environ.get("TERM") == "dumb" or os.environ.get("NO_COLOR"):
            return False
        isatty = getattr(self.out, "isatty", None)
        return bool(isatty is not None and isatty())

    def _status(self) -> str:
        tokens = "-" if self._tokens is None else str(self._tokens)
        window = f" of {self._window}" if self._window else ""
        elapsed = time.monotonic() - self._started
        return (
            f"{self._phase} | {tokens}{window} tokens | {self._turns} model "
            f"call(s) | {self._tools} tool call(s) | {elapsed:.0f} s"
        )

    # -- the hook ------------------------------------------------------------

    def on_run_start(self, info: RunStartInfo) -> None:
        """Remember the window and lines; start the live status line."""
        budget = info.budget
        if budget is not None:
            self._window = budget.context_window
            self._threshold = _threshold_line(
                budget.context_window, budget.threshold, budget.threshold_tokens
            )
        self._started = time.monotonic()
        if self._live is None and self._wants_live():
            from rich.console import Console
            from rich.live import Live

            self._console = Console(file=self.out, highlight=False)
            # The line is drawn anew at each refresh, so that its seconds
            # go on while a model call or a tool is waited on.
            self._live = Live(
                get_renderable=self._status,
                console=self._console,
                transient=True,
                refresh_per_second=4,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._live.start()

    def on_run_end(self, info: RunEndInfo) -> None:
        """Stop the live status line (it leaves no trace)."""
        self.stop()

    def stop(self) -> None:
        """Stop the live status line now, showing the cursor again.

        The run's end stops it; a program that exits before its run ends
        (``os._exit``) stops it first, or leaves the terminal with the line
        drawn and no cursor.
        """
        self._flush_pending()
        if self._live is not None:
            with self._reader_gone():
                self._live.stop()
        self._live = None
        self._console = None

    def on_transition(self, info: TransitionInfo) -> None:
        """Print ``source --trigger--> dest`` (and the reason or error)."""
        step = info.step
        self._phase = step.dest
        if step.source == step.dest and step.trigger != "run_started":
            return
        why = f" ({step.reason.value})" if step.reason else ""
        why += f" ({step.error})" if step.error else ""
        self.print(f"  {step.source} --{step.trigger}--> {step.dest}{why}")

    def on_decision(self, info: DecisionInfo) -> None:
        """Print each decision but a measurement: ``[phase] Decision``."""
        if isinstance(info.decision, Measure):
            return
        self.print(f"[{info.phase}] {type(info.decision).__name__}")

    def on_model_call_start(self, info: ModelCallInfo) -> None:
        """Count the model calls (the status line shows them); print a retry."""
        if info.purpose == "turn" and info.attempt <= 1:
            self._turns += 1
        elif info.purpose == "turn":
            self.print(f"[model] attempt {info.attempt}, {info.waited:.1f} s later")

    def on_model_call_end(self, info: ModelCallEnd) -> None:
        """Print a model call attempt that failed, ending the text it streamed.

        The retry policy may try again, streaming from the beginning: its
        reply starts on a line of its own, after this one.
        """
        error = info.error
        if info.call.purpose != "turn" or not isinstance(error, Exception):
            return  # a reply, or Ctrl-C / a cancelled run: the run says so
        if self._streamed:
            self.write("\n")
            self._streamed = False
        self.print(f"[model] attempt {info.call.attempt} failed: {_failure(error)}")

    def on_text_delta(self, info: TextDeltaInfo) -> None:
        """Print a streamed piece of a reply (with `replies`)."""
        if self.replies:
            self.write(info.text)
            self._streamed = True

    def on_outcome(self, info: OutcomeInfo) -> None:
        """Print measurements, and (with `replies`) a reply that did not stream."""
        event = info.event
        if isinstance(event, ModelReplied) and self.replies:
            if self._streamed:
                self.write("\n")
            elif event.message.text:
                self.write(event.message.text + "\n")
            self._streamed = False
        estimate = getattr(event, "estimate", None)
        if estimate is None:
            return
        self._tokens = estimate
        source = getattr(event, "source", "estimated")
        line = f"[measure] request = {estimate} tokens ({source})"
        if self._window:
            line += (
                f", threshold line {self._threshold}, emergency line "
                f"{emergency_line(self._window)}, window {self._window}"
            )
        self.print(line)

    def on_tool_start(self, info: ToolCallInfo) -> None:
        """Print the tool call: ``[tool] name({"argument": value})``."""
        self._tools += 1
        arguments = json.dumps(info.call.arguments, ensure_ascii=False, sort_keys=True)
        if len(arguments) > _ARGUMENTS_WIDTH:
            arguments = arguments[: _ARGUMENTS_WIDTH - 3] + "..."
        self.print(f"[tool] {info.call.name}({arguments})")

    def on_tool_end(self, info: ToolCallEnd) -> None:
        """Print how the tool call ended: its result's size, or what went wrong.

        An error result (the tool raised, timed out, is unknown, or its
        arguments were refused) is printed in its own words, on one line,
        shortened past the width of a call's arguments.
        """
        name = info.call.call.name
        if info.error is not None:
            self.print(f"[tool] {name} {_stopped(info.error)}")
            return
        result = info.result
        parts = result.tool_results if result is not None else ()
        errors = [" ".join(p.content.split()) for p in parts if p.is_error]
        if errors:
            said = "; ".join(errors)
            if len(said) > _ARGUMENTS_WIDTH:
                said = said[: _ARGUMENTS_WIDTH - 3] + "..."
            self.print(f"[tool] {name} -> error: {said}")
            return
        size = sum(len(part.content) for part in parts)
        self.print(f"[tool] {name} -> {size} characters")

    def on_compaction_pass(self, record: CompactionRecord) -> None:
        """Print each real compaction: reason, strategy, tokens before -> after."""
        if not record.compacted:
            return
        tag = "EMERGENCY " if record.reason is CompactReason.EMERGENCY else ""
        spent = ""
        if record.usage is not None:
            spent = f", summary model {record.usage.describe()} (reported)"
        self.print(
            f"[compaction] {tag}reason={record.reason.value} ({record.strategy}): "
            f"{record.tokens_before} -> {record.tokens_after} tokens (estimated), "
            f"{len(record.covers)} -> {len(record.replacement)} messages{spent}"
        )


def _failure(error: Exception) -> str:
    """What a failed model call attempt said, in its own words."""
    if isinstance(error, ProviderError):
        # Not its text as a run's failure, which says the retries are over.
        return f"[{error.kind}] {error.message}"
    return f"{type(error).__name__}: {error}"


def _stopped(error: BaseException) -> str:
    """How a tool call that gave no result ended, in the user's words."""
    if isinstance(error, anyio.get_cancelled_exc_class() | KeyboardInterrupt):
        return "interrupted"  # Ctrl-C, a cancelled run or its deadline
    return f"raised {type(error).__name__}"
