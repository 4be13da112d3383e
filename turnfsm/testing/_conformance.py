"""`check_compactor`: the contract every `ContextCompactor` must keep.

Run it from a test against your own compactor (wrapped in ``anyio.run`` or an
async test)::

    anyio.run(check_compactor, MyCompactor())

It feeds a fixed set of well-formed conversations (plain chat, sequential,
parallel and reused tool calls, calls in the first message, a call still
pending, an orphan result) at a few targets and checks each proposal.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, cast

from turnfsm import _checks
from turnfsm.context import (
    CompactionContext,
    CompactionProposal,
    ContextCompactor,
    PinRules,
    pair_tool_traffic,
    pairing_problem,
    pin_loss,
    pinned_ids,
)
from turnfsm.core import CompactReason
from turnfsm.errors import ConfigError
from turnfsm.messages import Message, MessageLog, Part, ToolCallPart, ToolResultPart
from turnfsm.tokens import TokenCounter, default_counter

__all__ = ["check_compactor"]


def _call(*ids: str) -> Message:
    calls = [ToolCallPart(id=i, name="lookup", arguments={"q": i}) for i in ids]
    return Message.assistant(f"calling {', '.join(ids)}", tool_calls=calls)


def _results(*ids: str) -> Message:
    parts = [ToolResultPart(call_id=i, content=f"result of {i} " * 8) for i in ids]
    return Message(role="tool", parts=parts)


def _chat(n: int) -> list[Message]:
    out = [Message.system("You are a careful assistant. " * 4)]
    for i in range(1, n):
        text = f"turn {i}: " + "words " * 30
        out.append(Message.user(text) if i % 2 else Message.assistant(text))
    return out


def _with(base: list[Message], changes: dict[int, Message]) -> tuple[Message, ...]:
    out = list(base)
    for index, message in changes.items():
        out[index] = message
    return tuple(out)


_CASES: Final[dict[str, tuple[Message, ...]]] = {
    "one message": (Message.user("hello"),),
    "three messages": tuple(_chat(3)),
    "plain chat": tuple(_chat(16)),
    "tool pairs": _with(
        _chat(16),
        {
            3: _call("a"),
            4: _results("a"),
            9: _call("b"),
            10: _results("b"),
            12: _call("c"),
            13: _results("c"),
        },
    ),
    "parallel calls": _with(
        _chat(16),
        {
            5: _call("p", "q"),
            6: _results("q"),
            7: _results("p"),
            11: _call("r", "s"),
            12: _results("s", "r"),
        },
    ),
    "reused ids": _with(
        _chat(16),
        {
            2: _call("t"),
            3: _results("t"),
            9: _call("t"),
            10: _call("t"),
            11: _results("t"),
            12: _results("t"),
        },
    ),
    "first message calls": _with(
        _chat(16), {0: _call("boot", "env"), 2: _results("env"), 13: _results("boot")}
    ),
    "pending call": _with(
        _chat(16), {6: _call("d"), 7: _results("d"), 15: _call("pending")}
    ),
    "orphan result": _with(_chat(16), {4: _results("ghost"), 12: _results("lost")}),
}


def _fail(compactor: object, case: str, problem: str) -> AssertionError:
    return AssertionError(f"{type(compactor).__name__} on {case!r}: {problem}")


async def _compact(
    compactor: ContextCompactor,
    case: str,
    messages: Sequence[Message],
    target: int,
    ctx: CompactionContext,
) -> object:
    """Its proposal; an exception it raises fails the check, naming the case."""
    try:
        return await compactor.compact(messages, target, ctx)
    except Exception as exc:
        raise _fail(
            compactor,
            case,
            f"raised {type(exc).__name__}: {exc} on a well-formed history "
            "(a run counts that a failed pass)",
        ) from exc


def _shape(messages: Sequence[Message]) -> list[tuple[str, tuple[Part, ...]]]:
    """What must be deterministic: roles and parts (fresh ids are allowed)."""
    return [(m.role.value, m.parts) for m in messages]


def _lone_by_id(messages: Sequence[Message]) -> dict[tuple[str, str], int]:
    """Count lone calls and lone results per (kind, call id)."""
    traffic = pair_tool_traffic(messages)
    counts: dict[tuple[str, str], int] = {}
    for kind, refs in (("call", traffic.lone_calls), ("result", traffic.lone_results)):
        for ref in refs:
            part = messages[ref.message].parts[ref.part]
            if isinstance(part, ToolCallPart):
                call_id = part.id
            elif isinstance(part, ToolResultPart):
                call_id = part.call_id
            else:  # pragma: no cover - pairing only reports tool parts
                raise TypeError(f"not a tool part: {part!r}")
            counts[kind, call_id] = counts.get((kind, call_id), 0) + 1
    return counts


def _check_pairs(
    compactor: object, case: str, given: Sequence[Message], out: Sequence[Message]
) -> None:
    """Raise unless `out` keeps the tool pairs as a `ContextManager` requires.

    `out` may have no lone call or result that `given` did not have, and,
    where `given` is a conversation the manager takes as it is, no message
    between a call and its result (the manager's own rule).
    """
    before = _lone_by_id(given)
    for (kind, call_id), n in _lone_by_id(out).items():
        if n > before.get((kind, call_id), 0):
            other = "result" if kind == "call" else "call"
            raise _fail(
                compactor,
                case,
                f"left a tool {kind} of {call_id!r} without its {other}",
            )
    # Some conversations here have a message between a call and its result
    # already: the manager would refuse any result of theirs.
    if pairing_problem(given, given) is None:
        problem = pairing_problem(out, given)
        if problem is not None:
            raise _fail(compactor, case, problem)


def _check_messages(
    compactor: object, case: str, given: Sequence[Message], proposal: object
) -> CompactionProposal:
    """Check one proposal on its own; return it typed."""
    if not isinstance(proposal, CompactionProposal):
        raise _fail(compactor, case, f"returned {proposal!r}, not a CompactionProposal")
    if proposal.is_failed:
        raise _fail(
            compactor, case, f"failed on a well-formed history: {proposal.error}"
        )
    out = proposal.messages
    if not out:
        raise _fail(compactor, case, "returned an empty message list")
    if not all(isinstance(m, Message) for m in out):
        raise _fail(compactor, case, "returned something that is not a Message")
    if any(not m.parts for m in out):
        raise _fail(compactor, case, "returned a message with no parts")
    _check_pairs(compactor, case, given, out)
    place = {m.id: i for i, m in enumerate(given)}
    kept = [place[m.id] for m in out if m.id in place]
    if kept != sorted(kept):
        raise _fail(compactor, case, "moved a message it kept out of its order")
    return proposal


async def _check_case(
    compactor: ContextCompactor,
    counter: TokenCounter,
    case: str,
    history: tuple[Message, ...],
    target: int,
) -> None:
    pinned = pinned_ids(history)  # what a ContextManager pins by default
    ctx = CompactionContext(
        tokens_before=counter.count(history),
        reason=CompactReason.THRESHOLD_EXCEEDED,
        context_window=0,
        turn=1,
        counter=counter,
        pinned=pinned,
    )
    given = list(history)
    first = _check_messages(
        compactor, case, history, await _compact(compactor, case, given, target, ctx)
    )
    if given != list(history):
        raise _fail(compactor, case, "changed the list it was given")
    lost = pin_loss(
        history,
        first.messages,
        pinned,
        strategy=type(compactor).__name__,
        rules=PinRules(),
    )
    if lost is not None:
        raise _fail(compactor, case, f"lost a pinned message (ctx.pinned): {lost}")
    again = _check_messages(
        compactor,
        case,
        history,
        await _compact(compactor, case, MessageLog(history), target, ctx),
    )
    if (_shape(first.messages), first.tokens_after) != (
        _shape(again.messages),
        again.tokens_after,
    ):
        raise _fail(compactor, case, "gave two different answers to the same input")


_COMPACTOR: Final = _checks.instance(
    ContextCompactor,
    "a ContextCompactor (an async compact(messages, target, ctx) method)",
    awaited=("compact",),
)
"""How `ContextManager` checks its compactor, before any call."""


async def check_compactor(
    compactor: object, *, counter: TokenCounter | None = None
) -> None:
    """Check that `compactor` keeps the `ContextCompactor` contract.

    For each built-in conversation, at a target of half its size and of 0,
    the compactor must return a `CompactionProposal` that is not failed, holds
    at least one message and no message without parts, splits no tool
    call/result pair (a call still pending, or an orphan result, that the
    input already had may stay), puts no message between a call and its
    result (the `ContextManager` refuses such a pass: `pairing_problem`),
    keeps what it keeps in its order, keeps
    the pinned messages (`ctx.pinned` holds what a `ContextManager` pins by
    default, as `pinned_ids` finds them) word for word, puts no user message
    (but a summary) before the first user message or after the latest one,
    leaves the list it
    was given as it was, and
    is the same (roles, parts and `tokens_after`) when asked twice. Returning
    a conversation unchanged is allowed, e.g. when it is too short to shrink.

    Args:
        compactor: The object to check.
        counter: The counter handed to the compactor in its context
            (default: `turnfsm.tokens.default_counter()`).

    Raises:
        AssertionError: A rule is broken; the message names the compactor,
            the conversation and the rule.
    """
    try:  # what a ContextManager takes: the same check, word for word
        _checks.check(compactor, "compactor", _COMPACTOR)
    except ConfigError as exc:
        name = (
            compactor.__name__
            if isinstance(compactor, type)
            else type(compactor).__name__
        )
        raise AssertionError(f"{name} is not a ContextCompactor: {exc}") from None
    checked = cast(ContextCompactor, compactor)
    counter = default_counter() if counter is None else counter
    for case, history in _CASES.items():
        size = counter.count(history)
        for target in (size // 2, 0):
            await _check_case(checked, counter, case, history, target)
