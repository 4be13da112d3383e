"""Pins: the messages no compaction pass may drop, alter or move.

A message is pinned three ways, and `pinned_ids` is the one place that
reads them all:

- by its own metadata (`Message.pin`: the caller's, or a pre-compact hook's
  ids, passed in as `also`);
- by a rule of the context settings (`PinRules`): the system prompt, the
  first user message, the latest user request;
- by being in flight: a tool call whose result is not among the messages
  (one awaiting approval, or not back yet).

Pins are pair-safe: a pinned call pins the messages holding its results, a
pinned result pins the message holding its call (and so on, to a fixpoint).

Every shipped strategy keeps the pinned messages through `keep_pinned`; the
manager checks every pass's result with `pin_loss`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from operator import attrgetter
from typing import Literal, final

import attrs

from turnfsm import _checks
from turnfsm.context._pairs import pair_tool_traffic
from turnfsm.context._pass_count import same_messages
from turnfsm.context._transcript import is_summary, turn_starts
from turnfsm.errors import PinnedMessageLost
from turnfsm.messages import Message, Role

__all__ = ["PinRules", "keep_pinned", "pin_loss", "pinned_ids"]


@final
@_checks.keyword_checked
@attrs.frozen(kw_only=True)
class PinRules:
    """Which messages the context settings pin, besides the ones pinned by hand.

    Each rule is on by default and switchable off. Summaries are never
    pinned by a rule (a later pass folds them into the next summary).

    Attributes:
        system_prompt: Pin the leading system messages.
        first_user: Pin the first user message (the task as first stated).
        latest_user: Pin the latest user message (the request being worked on).

    Raises:
        ConfigError: On construction, naming the field, when a rule is not a
            bool.
    """

    system_prompt: bool = attrs.field(default=True, validator=_checks.boolean())
    first_user: bool = attrs.field(default=True, validator=_checks.boolean())
    latest_user: bool = attrs.field(default=True, validator=_checks.boolean())


def pinned_ids(
    messages: Sequence[Message],
    rules: PinRules | None = None,
    also: Iterable[str] = (),
) -> frozenset[str]:
    """Return the ids of the pinned messages of `messages`.

    Pinned: the messages that carry `turnfsm.messages.PINNED`, those whose id
    is in `also`, those a rule of `rules` pins, and those holding a tool
    call whose result is not in `messages` (a call in flight); then, to a
    fixpoint, every message holding a call or a result paired with a pinned
    message's. A message holding a lone result (one answering no call
    before it) is never pinned: no provider takes that result, and every
    pass drops it.

    Args:
        messages: The conversation a pass is handed.
        rules: The context settings' rules (None: `PinRules()`, all on).
        also: More ids to pin (a pre-compact hook's); ids of no message are
            ignored.
    """
    rules = PinRules() if rules is None else rules
    wanted = set(also)
    ids = [m.id for m in messages]
    # Most messages carry no metadata at all: test that before reading it.
    pinned = {m.id for m in messages if (m.metadata and m.pinned) or m.id in wanted}
    if rules.system_prompt:
        pinned.update(ids[: _leading_system(messages)])
    users = turn_starts(messages)
    if users and rules.first_user:
        pinned.add(ids[users[0]])
    if users and rules.latest_user:
        pinned.add(ids[users[-1]])
    traffic = pair_tool_traffic(messages)
    pinned.update(ids[ref.message] for ref in traffic.lone_calls)
    # By index, not by a list of id pairs: no object made per pair.
    pairs = traffic.pairs
    grew = bool(pinned)
    while grew:
        grew = False
        for call, _, result, _ in pairs:
            call_id, result_id = ids[call], ids[result]
            if (call_id in pinned) != (result_id in pinned):
                pinned.add(call_id)
                pinned.add(result_id)
                grew = True
    # A result that answers no call before it cannot be sent: every pass
    # drops it, so the message holding it cannot stay word for word.
    pinned.difference_update(ids[r.message] for r in traffic.lone_results)
    return frozenset(pinned)


_id = attrgetter("id")


def keep_pinned(
    original: Sequence[Message], proposed: Sequence[Message], pinned: frozenset[str]
) -> tuple[Message, ...]:
    """Return `proposed` with every pinned message of `original` kept, in place.

    A pinned message that `proposed` altered is put back as it was; one it
    dropped is put back after the messages that came before it (a summary
    that replaced the messages around it comes first, but after the pinned
    system messages the conversation opens with). Nothing else moves.

    Args:
        original: The conversation the pass was handed.
        proposed: The strategy's result.
        pinned: The ids to keep (`pinned_ids`).
    """
    if not pinned:
        return tuple(proposed)
    if len(proposed) == len(original):
        ids = list(map(_id, original))
        same = same_messages(proposed, original)  # a layer that changed nothing
        if (same or list(map(_id, proposed)) == ids) and len(set(ids)) == len(ids):
            if same:  # every pinned message is in place as it was
                return tuple(proposed)
            # The same messages in place (a layer that only changes contents).
            kept = list(proposed)
            for at in [at for at, id_ in enumerate(ids) if id_ in pinned]:
                kept[at] = original[at]
            return tuple(kept)
    # Where each message of `proposed` stood (the last place of a repeated
    # id): only those are looked up, so only those are kept.
    wanted = set(map(_id, proposed))
    index = {m.id: i for i, m in enumerate(original) if m.id in wanted}
    pending = [i for i, m in enumerate(original) if m.id in pinned]
    pending.reverse()  # a stack: the earliest pinned message on top
    placed: set[int] = set()
    out: list[Message] = []

    def flush(before: int) -> None:
        while pending and pending[-1] < before:
            i = pending.pop()
            if i not in placed:
                placed.add(i)
                out.append(original[i])

    # The system messages the conversation opens with stay first: a new
    # message before them would leave them pinned no more (`_system_shift`).
    lead = _leading_system(original)
    for message in proposed:
        i = index.get(message.id)
        if i is None:  # a new message: a summary, a marker
            flush(lead)
            out.append(message)
            continue
        if i in placed:
            continue
        flush(i)
        if message.id in pinned:
            message = original[i]
            if pending and pending[-1] == i:
                pending.pop()
        placed.add(i)
        out.append(message)
    flush(len(original))
    return tuple(out)


def pin_loss(
    original: Sequence[Message],
    proposed: Sequence[Message],
    pinned: frozenset[str],
    *,
    strategy: str,
    rules: PinRules | None = None,
) -> PinnedMessageLost | None:
    """Return how `proposed` lost a pinned message of `original`, or None.

    The first pinned message (in `original`'s order) that `proposed` drops,
    alters (role, parts or metadata) or moves out of order with the other
    pinned messages; then, with `rules`, a new user message (not a summary)
    that `proposed` puts before the first user message or after the latest
    one, which the rule would pin on the next pass in its place.

    Args:
        original: The conversation the pass was handed.
        proposed: The pass's result.
        pinned: The pinned ids (`pinned_ids`).
        strategy: The compactor's class name, for the error.
        rules: The pin rules `pinned` was found with (None: the rules are
            not checked).
    """
    lost = _dropped(original, proposed, pinned, strategy)
    if lost is None and rules is not None:
        return _rule_shift(original, proposed, rules, strategy)
    return lost


def _dropped(
    original: Sequence[Message],
    proposed: Sequence[Message],
    pinned: frozenset[str],
    strategy: str,
) -> PinnedMessageLost | None:
    """`pin_loss` of the pinned messages themselves."""
    if not pinned:
        return None
    where = {m.id: (i, m) for i, m in enumerate(proposed)}
    last = -1
    for message in original:
        if message.id not in pinned:
            continue
        found = where.get(message.id)
        what: Literal["dropped", "altered", "moved"] | None = None
        if found is None:
            what = "dropped"
        else:
            at, kept = found
            if kept.to_dict() != message.to_dict():
                what = "altered"
            elif at < last:
                what = "moved"
            last = at
        if what is not None:
            return PinnedMessageLost(
                message_id=message.id,
                role=message.role.value,
                strategy=strategy,
                what=what,
            )
    return None


def _rule_shift(
    original: Sequence[Message],
    proposed: Sequence[Message],
    rules: PinRules,
    strategy: str,
) -> PinnedMessageLost | None:
    """How `proposed` would move a rule's pin to another message, or None.

    The first and the latest user message are pinned by position: a user
    message (not a summary) that a pass puts before the first one, or after
    the latest one, would be the message the rule pins on the next pass,
    and the one pinned now could then be dropped. So are the system
    messages the conversation opens with (`_system_shift`). Run after
    `_dropped`: the messages the rules pin are in `proposed`, in order.
    """
    if rules.system_prompt:
        lost = _system_shift(original, proposed, strategy)
        if lost is not None:
            return lost
    if not (rules.first_user or rules.latest_user):
        return None
    before = turn_starts(original)
    if not before:
        return None
    after = turn_starts(proposed)
    if not after:  # the pinned ones dropped: `pin_loss` says so
        return None
    checks: list[tuple[Message, Message, Literal["preceded", "followed"]]] = []
    if rules.first_user:
        checks.append((original[before[0]], proposed[after[0]], "preceded"))
    if rules.latest_user:
        checks.append((original[before[-1]], proposed[after[-1]], "followed"))
    for pinned, now, what in checks:
        if now.id != pinned.id:
            return PinnedMessageLost(
                message_id=pinned.id,
                role=pinned.role.value,
                strategy=strategy,
                what=what,
                by=now.id,
            )
    return None


def _system_shift(
    original: Sequence[Message], proposed: Sequence[Message], strategy: str
) -> PinnedMessageLost | None:
    """A message `proposed` puts before a leading system message, or None.

    Only the system messages the conversation opens with are pinned: one a
    pass put a message (a summary, a note) in front of is pinned no more,
    and the next pass could drop it.
    """
    lead = _leading_system(original)
    if not lead:
        return None
    last = original[lead - 1].id
    for message in proposed:
        if message.id == last:
            return None
        if message.role is not Role.SYSTEM or is_summary(message):
            return PinnedMessageLost(
                message_id=last,
                role=Role.SYSTEM.value,
                strategy=strategy,
                what="preceded",
                by=message.id,
            )
    return None  # dropped: `_dropped` says so


def _leading_system(messages: Sequence[Message]) -> int:
    """How many system messages (not summaries) `messages` opens with."""
    count = 0
    for message in messages:
        if message.role is not Role.SYSTEM or is_summary(message):
            break
        count += 1
    return count
