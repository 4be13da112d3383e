from __future__ import annotations

from collections.abc import Callable, Sequence

import anyio
import anyio.lowlevel
import attrs
import pytest

from turnfsm.context import (
    CompactBase,
    CompactionContext,
    CompactionProposal,
    CompactionRequest,
    ContextManager,
    MaskingCompactor,
    PinRules,
    TruncatingCompactor,
)
from turnfsm.core import (
    Budget,
    CompactionCircuitOpened,
    CompactionNoop,
    CompactionOverflowed,
    CompactionResult,
    CompactorFailed,
    CompactReason,
    PassEvent,
)
from turnfsm.errors import CompactionCircuitOpen, ConfigError
from turnfsm.messages import Message, ToolCallPart
from turnfsm.tokens import HeuristicTokenCounter, default_counter
from turnfsm.values import ErrorInfo, PassPayback

COUNTER = HeuristicTokenCounter()

Reply = Callable[[Sequence[Message], int, CompactionContext], CompactionProposal]


class Scripted:
    """A compactor that answers with `reply` and records what it was given."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.seen: list[tuple[tuple[Message, ...], int, CompactionContext]] = []

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        self.seen.append((tuple(messages), target, ctx))
        return self.reply(messages, target, ctx)


def keep_last(k: int) -> Reply:
    def reply(
        messages: Sequence[Message], _target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        kept = messages[-k:]
        return CompactionProposal.compacted(kept, ctx.tokens_before, 1)  # a bad hint

    return reply


def as_is(
    messages: Sequence[Message], _target: int, ctx: CompactionContext
) -> CompactionProposal:
    return CompactionProposal.unchanged(messages, ctx.tokens_before)


def sized(n: int, chars: int = 400) -> list[Message]:
    return [Message.user(f"{i}:" + "x" * chars, id=f"m{i}-{chars}") for i in range(n)]


NO_PINS = PinRules(system_prompt=False, first_user=False, latest_user=False)


def manager(
    compactor: Scripted | TruncatingCompactor, **kwargs: object
) -> ContextManager:
    # The scripted strategies here drop messages at will (sizing is what is
    # tested): no rule pins; pins have their own tests (test_pins.py).
    kwargs.setdefault("pins", NO_PINS)
    return ContextManager(compactor=compactor, counter=COUNTER, **kwargs)  # type: ignore[arg-type]  # kwargs are checked at run time


def run(
    mgr: ContextManager,
    messages: Sequence[Message],
    *,
    reason: CompactReason = CompactReason.THRESHOLD_EXCEEDED,
    reserved: int = 0,
    tokens_before: int | None = None,
) -> PassEvent:
    async def go() -> PassEvent:
        return await mgr.compact(
            CompactionRequest(
                messages=messages,
                turn=1,
                reason=reason,
                reserved=reserved,
                tokens_before=tokens_before,
            )
        )

    return anyio.run(go)


# -- settings and arithmetic -------------------------------------------------


def test_defaults() -> None:
    mgr = ContextManager()

    assert isinstance(mgr.compactor, MaskingCompactor)
    assert type(mgr.counter) is type(default_counter())
    # No window of its own: an agent gives it the model's; alone, 200,000.
    assert mgr.context_window is None
    assert (mgr.window, mgr.threshold, mgr.compact_target_pct) == (
        200_000,
        80,
        70,
    )
    assert mgr.auto_compact
    assert mgr.compact_target is CompactBase.THRESHOLD
    assert (mgr.max_messages, mgr.max_failures) == (50, 3)
    assert (mgr.threshold_line, mgr.emergency_line, mgr.target_tokens) == (
        160_000,
        190_000,
        112_000,
    )


@pytest.mark.parametrize(
    ("kwargs", "target"),
    [
        ({"compact_target": CompactBase.CONTEXT, "compact_target_pct": 50}, 100_000),
        ({"compact_target": "context", "compact_target_pct": 50}, 100_000),
        ({"compact_target_pct": 100}, 160_000),
        ({"context_window": 8_000, "compact_target_pct": 1}, 64),
        ({"context_window": 999, "threshold": 33}, 230),  # line 329
        ({"threshold": 0}, 0),
        ({"context_window": 0}, 0),
    ],
)
def test_target_tokens(kwargs: dict[str, object], target: int) -> None:
    mgr = ContextManager(**kwargs)  # type: ignore[arg-type]  # checked at run time

    assert mgr.target_tokens == target


def test_lines_for_the_worked_example() -> None:
    mgr = ContextManager(context_window=8_000, threshold=80)

    assert (mgr.threshold_line, mgr.emergency_line) == (6_400, 7_600)
    reasons = {e: mgr.reason_for(e) for e in (5_500, 6_400, 6_401, 7_599, 7_600)}
    assert reasons == {
        5_500: None,
        6_400: None,
        6_401: CompactReason.THRESHOLD_EXCEEDED,
        7_599: CompactReason.THRESHOLD_EXCEEDED,
        7_600: CompactReason.EMERGENCY,
    }


def test_auto_compact_off_keeps_only_the_emergency_line() -> None:
    mgr = ContextManager(context_window=8_000, auto_compact=False)

    assert mgr.reason_for(6_500) is None
    assert mgr.reason_for(7_700) is CompactReason.EMERGENCY


def test_window_zero_disables_both_lines() -> None:
    assert ContextManager(context_window=0).reason_for(10**9) is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("context_window", -1),
        ("context_window", 1.5),
        ("context_window", "200000"),
        ("context_window", True),
        ("threshold", 0.8),
        ("threshold", 101),
        ("threshold", -1),
        ("threshold", True),
        ("compact_target_pct", 0),
        ("compact_target_pct", 101),
        ("compact_target_pct", 0.7),
        ("compact_target", "window"),
        ("compact_target", 1),
        ("auto_compact", "yes"),
        ("max_messages", -1),
        ("max_messages", 1.5),
        ("max_messages", True),
        ("max_failures", 0),
        ("max_failures", True),
        ("counter", object()),
        ("compactor", object()),
    ],
    # The same ids in every process (an object's repr names its address).
    ids=lambda v: (
        v if isinstance(v, str) else "object()" if type(v) is object else repr(v)
    ),
)
def test_bad_settings_raise_config_error_naming_the_field(
    field: str, value: object
) -> None:
    with pytest.raises(ConfigError) as info:
        ContextManager(**{field: value})  # type: ignore[arg-type]  # bad on purpose

    assert info.value.field == field
    assert info.value.value is value
    assert str(info.value).startswith(f"invalid {field}=")


@pytest.mark.parametrize("threshold", [0, 1, 100])
def test_threshold_edges_are_accepted(threshold: int) -> None:
    assert ContextManager(threshold=threshold).threshold == threshold


def test_count_limit_edges_are_accepted() -> None:
    assert ContextManager(max_messages=0).max_messages == 0
    assert ContextManager(max_failures=1).max_failures == 1


def test_compactor_may_be_positional() -> None:
    compactor = TruncatingCompactor(preserve_recent=2)

    mgr = ContextManager(compactor, context_window=1_000, counter=COUNTER)

    assert mgr.compactor is compactor
    assert mgr == ContextManager(
        compactor=compactor, context_window=1_000, counter=COUNTER
    )


def test_count_uses_the_managers_counter() -> None:
    messages = sized(3)

    assert manager(TruncatingCompactor()).count(messages) == COUNTER.count(messages)


# -- compact: the verdict ------------------------------------------------------


def test_empty_input_is_no_action_without_calling_the_compactor() -> None:
    compactor = Scripted(as_is)

    decision = run(manager(compactor), [])

    assert decision == CompactionNoop(before=0, after=0)
    assert compactor.seen == []


def test_compacted_is_recounted_by_the_manager() -> None:
    messages = sized(10)
    before = COUNTER.count(messages)
    after = COUNTER.count(messages[-3:])

    decision = run(manager(Scripted(keep_last(3))), messages)

    # With no prices, the pass's cache figures are its tokens: the first
    # message changed, so all of it is invalidated and the kept three
    # rewritten.
    assert decision == CompactionResult(
        messages=messages[-3:],
        before=before,
        after=after,
        payback=PassPayback(
            invalidated_tokens=before,
            rewritten_tokens=after,
            removed_tokens=before - after,
        ),
    )


def test_every_size_includes_the_reserved_budget() -> None:
    messages = sized(10)
    before = COUNTER.count(messages) + 40
    after = COUNTER.count(messages[-3:]) + 40

    decision = run(manager(Scripted(keep_last(3))), messages, reserved=40)

    assert isinstance(decision, CompactionResult)
    assert (decision.before, decision.after) == (before, after)
    assert decision.before - decision.after == before - after


def test_compactor_sees_target_context_and_counter() -> None:
    compactor = Scripted(keep_last(3))
    mgr = manager(compactor, context_window=100_000, threshold=50)
    messages = sized(10)

    async def go() -> PassEvent:
        return await mgr.compact(
            CompactionRequest(
                messages=messages,
                turn=7,
                reason=CompactReason.OVERFLOW,
                instructions=["keep names"],
                additional_context=["user is Ada"],
                reserved=1_000,
            )
        )

    anyio.run(go)

    [(seen, target, ctx)] = compactor.seen
    assert seen == tuple(messages)
    assert target == 35_000 - 1_000
    assert ctx == CompactionContext(
        tokens_before=COUNTER.count(messages),
        reason=CompactReason.OVERFLOW,
        context_window=100_000,
        turn=7,
        counter=COUNTER,
        instructions=("keep names",),
        additional_context=("user is Ada",),
    )


def test_target_never_goes_below_zero() -> None:
    compactor = Scripted(keep_last(1))

    run(manager(compactor, context_window=1_000_000), sized(3), reserved=900_000)

    assert compactor.seen[0][1] == 0


def test_same_count_and_no_saving_is_no_action() -> None:
    messages = sized(8)
    before = COUNTER.count(messages)

    decision = run(manager(Scripted(as_is)), messages)

    assert decision == CompactionNoop(before=before, after=before)


@pytest.mark.parametrize(
    "reply",
    [
        as_is,
        lambda m, t, c: CompactionProposal.compacted(list(m), 0, 0),
        lambda m, t, c: CompactionProposal.compacted(
            [Message.from_dict(x.to_dict()) for x in m], 0, 0
        ),
    ],
    ids=["unchanged", "compacted-as-is", "equal-copies"],
)
def test_the_input_given_back_is_no_action_whatever_the_count_says(
    reply: Reply,
) -> None:
    """The driver's size of the request (its meter) above the manager's count.

    A counter whose `count` disagrees with its `units` makes the driver's
    figure and the manager's differ: the input given back must still be no
    action, never a committed pass that saved what the counters disagree by.
    """
    messages = sized(8)
    before = COUNTER.count(messages) + 500

    decision = run(manager(Scripted(reply)), messages, tokens_before=before)

    assert decision == CompactionNoop(before=before, after=before)


def test_same_count_but_smaller_is_compacted() -> None:
    messages = sized(4)
    shorter = [*messages[:3], Message.user("tiny")]

    decision = run(
        manager(Scripted(lambda m, t, c: CompactionProposal.unchanged(shorter, 0))),
        messages,
    )

    assert isinstance(decision, CompactionResult)
    assert decision.messages == tuple(shorter)
    assert decision.after == COUNTER.count(shorter)


def test_fewer_but_bigger_messages_are_compacted_with_nothing_saved() -> None:
    messages = sized(4, chars=10)
    merged = [Message.user("y" * 1_000)]

    decision = run(
        manager(Scripted(lambda m, t, c: CompactionProposal.compacted(merged, 0, 0))),
        messages,
    )

    assert isinstance(decision, CompactionResult)
    assert decision.after > decision.before
    assert decision.after > decision.before  # nothing saved


def test_result_over_the_window_minus_reserved_overflows() -> None:
    messages = sized(10)
    kept = messages[-3:]
    after = COUNTER.count(kept)

    decision = run(
        manager(Scripted(keep_last(3)), context_window=after + 50),
        messages,
        reserved=51,
    )

    assert decision == CompactionOverflowed(
        used=after + 51, limit=after + 50, before=COUNTER.count(messages) + 51
    )


def test_result_exactly_fitting_the_window_minus_reserved_is_compacted() -> None:
    messages = sized(10)
    after = COUNTER.count(messages[-3:])

    decision = run(
        manager(Scripted(keep_last(3)), context_window=after + 50),
        messages,
        reserved=50,
    )

    assert isinstance(decision, CompactionResult)


def test_window_zero_never_overflows() -> None:
    decision = run(manager(Scripted(keep_last(3)), context_window=0), sized(10))

    assert isinstance(decision, CompactionResult)


def boom(
    messages: Sequence[Message], target: int, ctx: CompactionContext
) -> CompactionProposal:
    raise RuntimeError("summary model down")


class Unreadable(Exception):
    """An exception whose message cannot be read: its ``__str__`` raises."""

    def __str__(self) -> str:
        raise AttributeError("no such field")


def unreadable(
    messages: Sequence[Message], target: int, ctx: CompactionContext
) -> CompactionProposal:
    raise Unreadable


def _raise(exc: Exception) -> CompactionProposal:
    raise exc


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (boom, "RuntimeError: summary model down"),
        (
            unreadable,
            "Unreadable: (its message could not be read: str() raised AttributeError)",
        ),
        (lambda m, t, c: CompactionProposal.failed("rate limited", 0), "rate limited"),
        (
            lambda m, t, c: CompactionProposal.failed("", 0),
            "compactor reported a failure",
        ),
        (
            lambda m, t, c: CompactionProposal.compacted([], 0, 0),
            "compactor returned an empty message list",
        ),
        (
            lambda m, t, c: "not an outcome",
            "compactor returned str, not a CompactionProposal",
        ),
        (
            lambda m, t, c: CompactionProposal.compacted([m[0], "hi"], 0, 0),  # type: ignore[list-item]  # bad on purpose
            "compactor returned messages[1]='hi' (str), not a Message",
        ),
        (
            lambda m, t, c: CompactionProposal.compacted(
                [m[0], Message.assistant("", id="blank"), *m[-2:]], 0, 0
            ),
            "the compactor's result holds message 'blank' (assistant) with nothing "
            "in it; a provider refuses an empty message, so a pass adds none",
        ),
        (
            lambda m, t, c: CompactionProposal.failed(ValueError("down"), 0),  # type: ignore[arg-type]  # bad on purpose
            "ConfigError: invalid error=ValueError('down'): expected a string, or None",
        ),
        (
            lambda m, t, c: (
                m[0].metadata.update(x=float("nan")),
                CompactionProposal.compacted(m, 0, 0),
            )[1],
            "InvalidMessage: invalid message metadata={}: metadata does not change; "
            "make a new one with attrs.evolve(message, metadata={...})",
        ),
        (
            lambda m, t, c: _raise(CompactionCircuitOpen(failures=-1)),
            "compactor raised CompactionCircuitOpen: invalid failures=-1: "
            "expected an int >= 0",
        ),
        (
            lambda m, t, c: _raise(CompactionCircuitOpen(failures=None)),  # type: ignore[arg-type]  # bad on purpose
            "compactor raised CompactionCircuitOpen: invalid failures=None: "
            "expected an int >= 0",
        ),
    ],
    ids=[
        "raises",
        "raises-unreadable",
        "failed",
        "failed-blank",
        "empty",
        "wrong-type",
        "not-messages",
        "empty-message",
        "error-not-text",
        "changes-metadata",
        "open-circuit-negative",
        "open-circuit-no-count",
    ],
)
def test_compactor_failure_is_a_compactor_error_at_the_size_before(
    reply: Reply, error: str
) -> None:
    messages = sized(5)
    before = COUNTER.count(messages)

    decision = run(manager(Scripted(reply)), messages, reserved=7)

    assert decision == CompactorFailed(
        used=before + 7,
        limit=200_000,
        error=ErrorInfo(type="CompactorError", message=error),
    )


def test_an_open_circuit_is_circuit_open() -> None:
    def refuse(
        m: Sequence[Message], t: int, c: CompactionContext
    ) -> CompactionProposal:
        raise CompactionCircuitOpen(failures=3)

    decision = run(manager(Scripted(refuse)), sized(5), reason=CompactReason.EMERGENCY)

    assert decision == CompactionCircuitOpened(failures=3)


class Cancelling:
    """A compactor that cancels its caller's scope, then hits a checkpoint."""

    def __init__(self) -> None:
        self.scope: anyio.CancelScope | None = None

    async def compact(
        self, messages: Sequence[Message], target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        assert self.scope is not None
        self.scope.cancel()
        await anyio.lowlevel.checkpoint()  # the cancellation is raised here
        raise AssertionError("unreachable")


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_cancellation_is_never_caught(backend: str) -> None:
    compactor = Cancelling()
    mgr = ContextManager(compactor=compactor, counter=COUNTER)
    decisions: list[PassEvent] = []

    async def main() -> bool:
        with anyio.CancelScope() as scope:
            compactor.scope = scope
            decision = await mgr.compact(
                CompactionRequest(
                    messages=sized(3), turn=1, reason=CompactReason.MANUAL
                )
            )
            decisions.append(decision)
        return scope.cancelled_caught

    assert anyio.run(main, backend=backend)
    assert decisions == []


def test_base_exceptions_propagate() -> None:
    class Stop(BaseException):
        pass

    def stop(m: Sequence[Message], t: int, c: CompactionContext) -> CompactionProposal:
        raise Stop

    with pytest.raises(Stop):
        run(manager(Scripted(stop)), sized(3))


def test_negative_reserved_is_rejected() -> None:
    with pytest.raises(ConfigError) as info:
        run(manager(Scripted(as_is)), sized(3), reserved=-1)

    assert info.value.field == "reserved"


@pytest.mark.parametrize("value", ["hello", 5, {"id": "m1"}])
def test_messages_that_are_not_a_sequence_are_rejected_whole(value: object) -> None:
    with pytest.raises(ConfigError) as info:
        CompactionRequest(messages=value)  # type: ignore[arg-type]

    assert (info.value.field, info.value.value) == ("messages", value)


# -- tokens_before: the caller's count ------------------------------------------


def test_a_given_tokens_before_is_trusted_and_not_recounted() -> None:
    messages = sized(10)
    compactor = Scripted(keep_last(3))
    after = COUNTER.count(messages[-3:]) + 5

    decision = run(manager(compactor), messages, reserved=5, tokens_before=99_999)

    assert isinstance(decision, CompactionResult)
    assert (decision.before, decision.after) == (99_999, after)
    assert decision.before - decision.after == 99_999 - after
    # The compactor is handed the count of the messages alone.
    assert compactor.seen[0][2].tokens_before == 99_999 - 5


def test_a_given_tokens_before_is_the_compactor_error_size() -> None:
    decision = run(manager(Scripted(boom)), sized(3), reserved=5, tokens_before=1_234)

    assert isinstance(decision, CompactorFailed)
    assert decision.used == 1_234


@pytest.mark.parametrize("value", [4, -1, 5.0, True, "100"])
def test_tokens_before_below_reserved_or_not_an_int_is_rejected(
    value: object,
) -> None:
    with pytest.raises(ConfigError) as info:
        run(
            manager(Scripted(as_is)),
            sized(3),
            reserved=5,
            tokens_before=value,  # type: ignore[arg-type]  # bad on purpose
        )

    assert info.value.field == "tokens_before"
    assert info.value.value is value


def test_tokens_before_equal_to_reserved_is_accepted() -> None:
    decision = run(manager(Scripted(as_is)), sized(3), reserved=5, tokens_before=5)

    assert isinstance(decision, CompactionNoop)


# -- budget(): the sizing policy as the brain's Budget ----------------------------


def test_budget_takes_the_lines_from_the_manager() -> None:
    mgr = ContextManager(context_window=8_000, threshold=70, auto_compact=False)

    assert mgr.budget() == Budget(
        context_window=8_000, threshold=70, auto_compact=False, max_messages=50
    )
    assert mgr.budget(max_turns=7, max_overflow_retries=0) == Budget(
        context_window=8_000,
        threshold=70,
        auto_compact=False,
        max_messages=50,
        max_turns=7,
        max_overflow_retries=0,
    )


def test_budget_takes_the_message_line_from_the_manager() -> None:
    assert ContextManager(max_messages=3).budget().max_messages == 3
    assert ContextManager(max_messages=0).budget().max_messages == 0


@pytest.mark.skipif(
    "max_compactions" not in attrs.fields_dict(Budget),
    reason="Budget has no max_compactions yet",
)
def test_budget_passes_extra_limits_through() -> None:
    mgr = ContextManager(context_window=8_000)

    budget = mgr.budget(max_compactions=3)

    assert budget == Budget(context_window=8_000, max_compactions=3, max_messages=50)


def test_budget_checks_the_run_limits_through_budget() -> None:
    with pytest.raises(ConfigError) as info:
        ContextManager().budget(max_turns=0)
    assert info.value.field == "max_turns"

    with pytest.raises(TypeError):
        ContextManager().budget(context_window=1)  # the manager owns the window


# -- no reason (the lines decide) and a manual pass ----------------------------


def fits(
    mgr: ContextManager, messages: Sequence[Message], reserved: int = 0
) -> PassEvent:
    async def go() -> PassEvent:
        return await mgr.compact(
            CompactionRequest(messages=messages, turn=2, reserved=reserved)
        )

    return anyio.run(go)


def test_under_the_lines_is_no_action_without_a_pass() -> None:
    messages = sized(4)
    size = COUNTER.count(messages)
    compactor = Scripted(keep_last(1))
    mgr = manager(compactor, context_window=2 * size, threshold=50)  # line: size

    decision = fits(mgr, messages)

    assert decision == CompactionNoop(before=size, after=size)
    assert compactor.seen == []


def test_under_the_lines_reports_the_reserved_budget_too() -> None:
    messages = sized(4)
    size = COUNTER.count(messages)
    mgr = manager(Scripted(keep_last(1)), context_window=10 * size)

    decision = fits(mgr, messages, reserved=9)

    assert decision == CompactionNoop(before=size + 9, after=size + 9)


@pytest.mark.parametrize(
    ("window_of", "reason"),
    [
        (lambda size: size * 100 // 80 - 10, CompactReason.THRESHOLD_EXCEEDED),
        (lambda size: size, CompactReason.EMERGENCY),
    ],
    ids=["threshold", "emergency"],
)
def test_over_a_line_compacts_with_its_reason(
    window_of: Callable[[int], int], reason: CompactReason
) -> None:
    messages = sized(10)
    compactor = Scripted(keep_last(1))
    window = window_of(COUNTER.count(messages))

    decision = fits(manager(compactor, context_window=window), messages)

    assert isinstance(decision, CompactionResult)
    assert compactor.seen[0][2].reason is reason


def test_reserved_counts_toward_the_lines() -> None:
    messages = sized(4)
    size = COUNTER.count(messages)
    mgr = manager(Scripted(keep_last(1)), context_window=2 * size, threshold=50)

    assert isinstance(fits(mgr, messages, reserved=0), CompactionNoop)
    assert isinstance(fits(mgr, messages, reserved=1), CompactionResult)


def test_auto_compact_off_ignores_the_threshold_line() -> None:
    messages = sized(10)
    size = COUNTER.count(messages)
    mgr = manager(Scripted(keep_last(1)), context_window=size * 100 // 90)

    assert isinstance(fits(mgr, messages), CompactionResult)
    assert isinstance(
        fits(attrs.evolve(mgr, auto_compact=False), messages), CompactionNoop
    )


def test_manual_bypasses_the_lines() -> None:
    messages = sized(10)
    compactor = Scripted(keep_last(2))
    mgr = manager(compactor)  # 200k window: far under the lines

    async def go() -> PassEvent:
        return await mgr.compact(
            CompactionRequest(
                messages=messages, turn=4, reason=CompactReason.MANUAL, reserved=3
            )
        )

    decision = anyio.run(go)

    assert isinstance(decision, CompactionResult)
    assert compactor.seen[0][2].reason is CompactReason.MANUAL
    assert compactor.seen[0][1] == 112_000 - 3


def test_default_truncator_end_to_end() -> None:
    messages = sized(12)
    mgr = ContextManager(counter=COUNTER, context_window=COUNTER.count(messages))

    decision = fits(mgr, messages)

    assert isinstance(decision, CompactionResult)
    assert decision.messages == (messages[0], *messages[8:])
    assert mgr.reason_for(decision.before) is CompactReason.EMERGENCY


def test_truncator_that_cannot_cut_is_no_action() -> None:
    messages = sized(5)
    mgr = ContextManager(
        TruncatingCompactor(), counter=COUNTER, context_window=COUNTER.count(messages)
    )

    decision = fits(mgr, messages)

    assert isinstance(decision, CompactionNoop)
    assert mgr.reason_for(decision.before) is CompactReason.EMERGENCY
    assert mgr.strategy == "TruncatingCompactor"


# -- results must be valid conversations ------------------------------------------


def call(*ids: str, id: str) -> Message:
    calls = [ToolCallPart(id=i, name="read", arguments={"path": i}) for i in ids]
    return Message.assistant("", tool_calls=calls, id=id)


def result(call_id: str, id: str) -> Message:
    return Message.tool_result(call_id, f"result of {call_id}", id=id)


U0 = Message.user("task " * 30, id="u0")
A1 = call("tc_1", id="a1")
T2 = result("tc_1", id="t2")
A3 = call("tc_2", "tc_3", id="a3")
T4 = result("tc_2", id="t4")
T5 = result("tc_3", id="t5")
A6 = Message.assistant("done", id="a6")
U7 = Message.user("next", id="u7")
TOOLS = [U0, A1, T2, A3, T4, T5, A6, U7]


def answer(messages: Sequence[Message]) -> Reply:
    def reply(
        _m: Sequence[Message], _target: int, ctx: CompactionContext
    ) -> CompactionProposal:
        return CompactionProposal.compacted(messages, ctx.tokens_before, 0)

    return reply


@pytest.mark.parametrize(
    ("returned", "error"),
    [
        (
            [U0, A3, T4, A6, T5],
            "the compactor's result breaks tool call 'tc_3': message 'a6' "
            "(assistant) comes between the call (in message 'a3') and its result "
            "(in message 't5')",
        ),
        (
            [U0, T2, A1, A6],
            "the compactor's result breaks tool call 'tc_1': the result in "
            "message 't2' answers no call",
        ),
        (
            [U0, A1, T2, result("tc_1", id="again"), A6],
            "the compactor's result breaks tool call 'tc_1': the result in "
            "message 'again' answers no call",
        ),
        (
            [U0, A6, result("tc_9", id="new"), U7],
            "the compactor's result breaks tool call 'tc_9': the result in "
            "message 'new' answers no call",
        ),
        (
            [U0, A3, T4, A6],
            "the compactor's result breaks tool call 'tc_3': the call in "
            "message 'a3' has no result",
        ),
        (
            [U0, A6, call("tc_8", id="new"), U7],
            "the compactor's result breaks tool call 'tc_8': the call in "
            "message 'new' has no result",
        ),
        ([U0, A6, U7, U7], "the compactor's result repeats message id 'u7'"),
        (
            [U0, A6, Message.user("x", id="a6")],
            "the compactor's result repeats message id 'a6'",
        ),
        (
            [U0, U7, A6],
            "the compactor's result moves message 'a6' after message 'u7', which "
            "was said later; a pass keeps the messages it keeps in their order",
        ),
        (
            [Message.user("summary", id="s"), A6, Message.user("x", id="u0")],
            "the compactor's result moves message 'u0' after message 'a6', which "
            "was said later; a pass keeps the messages it keeps in their order",
        ),
    ],
    ids=[
        "message-between",
        "result-before-call",
        "result-twice",
        "result-inserted",
        "result-dropped",
        "call-inserted",
        "message-twice",
        "id-reused",
        "moved",
        "changed-and-moved",
    ],
)
def test_a_result_that_is_not_a_valid_conversation_is_a_compactor_error(
    returned: list[Message], error: str
) -> None:
    decision = run(manager(Scripted(answer(returned))), TOOLS, reserved=3)

    assert decision == CompactorFailed(
        used=COUNTER.count(TOOLS) + 3,
        limit=200_000,
        error=ErrorInfo(type="CompactorError", message=error),
    )


def test_a_valid_result_is_compacted() -> None:
    kept = [U0, A3, T4, T5, A6, U7]

    decision = run(manager(Scripted(answer(kept))), TOOLS)

    assert isinstance(decision, CompactionResult)
    assert decision.messages == tuple(kept)


def test_orphans_the_input_already_had_may_survive() -> None:
    lone_result = result("tc_0", id="lone-result")
    lone_call = call("tc_9", id="lone-call")
    messages = [U0, lone_result, *TOOLS[1:], lone_call]
    kept = [U0, lone_result, A6, U7, lone_call]

    decision = run(manager(Scripted(answer(kept))), messages)

    assert isinstance(decision, CompactionResult)
    assert decision.messages == tuple(kept)


def test_more_orphans_than_the_input_had_are_rejected() -> None:
    lone_call = call("tc_9", id="lone-call")
    messages = [*TOOLS, lone_call]
    kept = [U0, A1, A6, U7, lone_call]  # tc_1 lost its result

    decision = run(manager(Scripted(answer(kept))), messages)

    assert isinstance(decision, CompactorFailed)
    assert decision.error.message == (
        "the compactor's result breaks tool call 'tc_1': the call in message "
        "'a1' has no result"
    )


def test_a_split_pair_is_rejected_even_if_the_input_had_one() -> None:
    messages = [U0, A1, U7, T2, A6]  # the input already splits tc_1
    decision = run(manager(Scripted(answer([U0, A1, U7, T2]))), messages)

    assert isinstance(decision, CompactorFailed)
    assert "breaks tool call 'tc_1': message 'u7' (user) comes between" in (
        decision.error.message
    )


def test_ids_the_input_already_repeated_may_survive() -> None:
    messages = [U0, U7, A6, U7]
    decision = run(manager(Scripted(answer([U0, U7, U7]))), messages)

    assert isinstance(decision, CompactionResult)


def test_a_result_keeps_order_around_summaries_and_changed_messages() -> None:
    summary = Message.user("[summary of a1..t5]", id="summary")
    changed = Message.assistant("(shortened)", id="a6")
    kept = [U0, summary, changed, U7]

    decision = run(manager(Scripted(answer(kept))), TOOLS)

    assert isinstance(decision, CompactionResult)
    assert decision.messages == tuple(kept)


def test_an_absolute_threshold_line_is_the_managers_and_the_brains() -> None:
    mgr = ContextManager(context_window=200_000, threshold_tokens=150_000)
    assert mgr.threshold_line == 150_000
    assert mgr.target_tokens == 150_000 * 70 // 100
    assert mgr.reason_for(150_000) is None
    assert mgr.reason_for(150_001) is CompactReason.THRESHOLD_EXCEEDED
    assert mgr.budget().threshold_tokens == 150_000
    with pytest.raises(ConfigError, match="threshold_tokens"):
        ContextManager(context_window=1_000, threshold_tokens=5_000)


class HalfTokens:
    """A counter of yours that answers in fractions of tokens."""

    def count(self, messages: Sequence[Message]) -> int:
        return COUNTER.count(messages) + 0.5  # type: ignore[return-value]

    def count_text(self, text: str) -> int:
        return COUNTER.count_text(text)


def test_the_managers_count_names_a_counter_that_returns_no_count() -> None:
    manager = ContextManager(counter=HalfTokens())

    with pytest.raises(ConfigError) as caught:
        manager.count([Message.user("hello")])

    assert (caught.value.field, caught.value.value) == ("counter", 6.5)
    assert "from HalfTokens.count" in str(caught.value)
    with pytest.raises(ConfigError, match=r"from HalfTokens\.count"):
        manager.payback([Message.user("a")], [Message.user("b")])


@pytest.mark.parametrize(
    ("setting", "value", "expected"),
    [
        ("threshold", 0.5, "an int percentage in 0..100 (50, not 0.5)"),
        ("threshold", 0.8, "an int percentage in 0..100 (80, not 0.8)"),
        # Not a fraction: no fraction's hint (it said "(80, not 0.8)").
        ("threshold", 150, "an int percentage in 0..100"),
        ("threshold", 80.0, "an int percentage in 0..100 (80, not 80.0)"),
        ("compact_target_pct", 0.7, "an int percentage in 1..100 (70, not 0.7)"),
        ("compact_target_pct", 0, "an int percentage in 1..100"),
    ],
)
def test_a_percentage_out_of_range_is_shown_as_a_whole_one_only_when_it_is_one(
    setting: str, value: object, expected: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        ContextManager(**{setting: value})
    assert str(caught.value) == f"invalid {setting}={value!r}: expected {expected}"
    # One error: the traceback showed the plain refusal too, "During handling
    # of the above exception, another exception occurred".
    assert caught.value.__context__ is None
