from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import anyio
import pytest

from turnfsm.context import (
    STRATEGIES,
    CompactionContext,
    CompactionProposal,
    TruncatingCompactor,
    strategy_named,
)
from turnfsm.errors import ConfigError
from turnfsm.messages import Message, Role
from turnfsm.testing import ExtractiveSummaryModel, check_compactor
from turnfsm.tokens import HeuristicTokenCounter

Reply = Callable[[Sequence[Message], CompactionContext], object]


class Custom:
    """A compactor whose answer is a plain function of its input."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        return self.reply(messages, ctx)  # type: ignore[return-value]  # bad on purpose


def check(compactor: object) -> None:
    anyio.run(check_compactor, compactor)


@pytest.mark.parametrize(
    "compactor",
    [
        TruncatingCompactor(),
        TruncatingCompactor(preserve_recent=1, min_messages=2),
        TruncatingCompactor(preserve_recent=9, min_messages=3),
        TruncatingCompactor(preserve_recent=20),
    ],
    ids=["default", "smallest", "nine-recent", "nothing-to-cut"],
)
def test_truncating_compactor_conforms(compactor: TruncatingCompactor) -> None:
    check(compactor)


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_every_shipped_strategy_conforms(name: str) -> None:
    check(strategy_named(name, summary_model=ExtractiveSummaryModel()))


def test_conforms_with_an_explicit_counter() -> None:
    async def go() -> None:
        await check_compactor(TruncatingCompactor(), counter=HeuristicTokenCounter())

    anyio.run(go)


def test_unchanged_is_allowed() -> None:
    check(Custom(lambda m, c: CompactionProposal.unchanged(m, c.tokens_before)))


def keep(select: Callable[[Sequence[Message]], Sequence[Message]]) -> Custom:
    return Custom(lambda m, c: CompactionProposal.compacted(select(m), 0, 0))


def pop_last(messages: Sequence[Message]) -> object:
    assert isinstance(messages, list)
    kept = tuple(messages)
    messages.pop()
    return CompactionProposal.compacted(kept, 0, 0)


def wedge(messages: Sequence[Message]) -> Sequence[Message]:
    """Put a summary right after the first tool call, before its result."""
    out = list(messages)
    for i, message in enumerate(out[:-1]):
        if message.tool_calls and out[i + 1].role is Role.TOOL:
            out.insert(i + 1, Message.user("[summary] the earlier turns, briefly"))
            break
    return out


_flip = itertools.count()


def flaky(messages: Sequence[Message], ctx: CompactionContext) -> object:
    return CompactionProposal.compacted(messages, 0, next(_flip))


@pytest.mark.parametrize(
    ("compactor", "problem"),
    [
        (object(), "object is not a ContextCompactor"),
        (Custom(lambda m, c: None), "returned None, not a CompactionProposal"),
        (
            Custom(lambda m, c: CompactionProposal.failed("down", 0)),
            "Custom on 'one message': failed on a well-formed history: down",
        ),
        (keep(lambda m: []), "returned an empty message list"),
        (keep(lambda m: ["hi"]), "returned something that is not a Message"),  # type: ignore[list-item]  # bad on purpose
        (
            keep(lambda m: [Message(role=Role.ASSISTANT, parts=())]),
            "returned a message with no parts",
        ),
        (
            keep(lambda m: [x for x in m if x.role is not Role.TOOL]),
            "on 'tool pairs': left a tool call of 'a' without its result",
        ),
        (
            keep(lambda m: [x for x in m if "c" not in {c.id for c in x.tool_calls}]),
            "on 'tool pairs': left a tool result of 'c' without its call",
        ),
        (
            keep(lambda m: [m[0], m[2], m[1], *m[3:]] if len(m) > 2 else m),
            "on 'three messages': moved a message it kept out of its order",
        ),
        (
            keep(lambda m: m[-2:]),
            "on 'three messages': lost a pinned message .* dropped the pinned system",
        ),
        (
            keep(wedge),
            "on 'tool pairs': .*breaks tool call 'a': message .* \\(user\\) comes "
            "between the call .* and its result",
        ),
        (
            keep(lambda m: [Message.user("[summary] earlier", id="sum"), *m]),
            "on 'one message': lost a pinned message .* put the user message sum "
            "before the pinned first user message",
        ),
        (Custom(lambda m, c: pop_last(m)), "changed the list it was given"),
        (Custom(flaky), "gave two different answers to the same input"),
    ],
    ids=[
        "not-a-compactor",
        "wrong-type",
        "failed",
        "empty-list",
        "not-messages",
        "empty-message",
        "drops-results",
        "drops-calls",
        "moves-a-message",
        "drops-pins",
        "wedges-a-message",
        "summary-before-the-task",
        "mutates-input",
        "nondeterministic",
    ],
)
def test_violations_are_reported(compactor: object, problem: str) -> None:
    with pytest.raises(AssertionError, match=problem):
        check(compactor)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tokens_after", -1),
        ("tokens_after", float("nan")),
        ("tokens_before", "many"),
        ("tokens_before", True),
        ("tokens_after", None),
    ],
)
def test_a_proposal_refuses_sizes_that_are_no_token_counts(
    field: str, value: object
) -> None:
    # A compactor's self-reported sizes were taken as they came: a NaN or a
    # string reached the proposal, and whatever read it.
    sizes: dict[str, object] = {"tokens_before": 10, "tokens_after": 5, field: value}
    with pytest.raises(ConfigError) as caught:
        CompactionProposal(messages=[Message.user("hi")], **sizes)  # type: ignore[arg-type]  # bad on purpose
    assert (caught.value.field, caught.value.value) == (field, value)


class _TwoArguments:
    """A compact() that cannot take the target: compact(messages, ctx)."""

    async def compact(
        self, messages: Sequence[Message], ctx: CompactionContext
    ) -> CompactionProposal:
        return CompactionProposal.unchanged(messages, ctx.tokens_before)


@pytest.mark.parametrize(
    ("compactor", "problem"),
    [
        (TruncatingCompactor, "an instance, TruncatingCompactor\\(\\), not the class"),
        (
            _TwoArguments(),
            "_TwoArguments is not a ContextCompactor.*cannot be called as "
            "compact\\(messages, target, ctx\\)",
        ),
    ],
    ids=["the-class", "wrong-arguments"],
)
def test_a_compactor_that_cannot_be_called_so_fails_naming_why(
    compactor: object, problem: str
) -> None:
    # Both raised a bare TypeError from inside the check ("compact() takes 3
    # positional arguments but 4 were given", "missing 1 required
    # positional argument: 'ctx'"), not the AssertionError the check promises.
    with pytest.raises(AssertionError, match=problem):
        check(compactor)


def _boom(messages: Sequence[Message], ctx: CompactionContext) -> object:
    raise ValueError("boom")


def test_a_compactor_that_raises_fails_naming_the_case() -> None:
    # Its ValueError came out of the check as it was, naming no case.
    with pytest.raises(
        AssertionError, match="Custom on 'one message': raised ValueError: boom"
    ):
        check(Custom(_boom))
