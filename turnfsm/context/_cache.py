"""The prompt cache's economics: what a compaction pass costs against what it saves.

Providers cache a request's prefix: a later request that begins with the same
tokens reads them at the cached price. A compaction pass rewrites the
conversation from its first changed message on, so the next call writes that
part to the cache again instead of reading it; every later call then sends
fewer tokens. `CacheRules` says, per provider, what a change invalidates,
the smallest prefix cached, and what a write costs when the catalogue gives
no write price; `pass_payback` works out one pass's figures (`PassPayback`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from enum import StrEnum
from types import MappingProxyType
from typing import Final, final

import attrs

from turnfsm import _checks
from turnfsm.messages import Message
from turnfsm.providers import ModelPrices
from turnfsm.tokens import TokenCounter
from turnfsm.values import PassPayback, Usage

__all__ = [
    "CACHE_RULES",
    "CacheRules",
    "Invalidates",
    "cache_rules_for",
    "first_change",
    "pass_payback",
]


class Invalidates(StrEnum):
    """What a change to a request's prompt invalidates in the provider's cache."""

    SUFFIX = "suffix"
    """Everything from the first changed message to the end; the system
    prompt, the tool schemas and the messages before it stay cached."""

    ALL = "all"
    """The whole request, system prompt and tool schemas included."""


_FACTOR = _checks.instance(Decimal, "a Decimal multiple of the input price")


@final
@_checks.keyword_checked
@attrs.frozen(kw_only=True)
class CacheRules:
    """A provider's prompt-cache rules, as the pass's figures use them.

    Attributes:
        provider: The provider's id (``anthropic``, ``openai``).
        invalidates: What a change to the prompt invalidates.
        min_prefix_tokens: The smallest request the provider caches: below
            it every token is paid at the input price.
        write_factor: A cache write's price as a multiple of the input
            price, when the catalogue gives no write price (1: writes cost
            the input price, as with automatic caching).
        read_factor: A cached read's price as a multiple of the input price,
            when the catalogue gives no cached price.
    """

    provider: str = attrs.field(validator=_checks.string(non_empty=True))
    invalidates: Invalidates = attrs.field(
        default=Invalidates.SUFFIX, converter=Invalidates
    )
    min_prefix_tokens: int = attrs.field(
        default=1024, validator=_checks.integer(low=0, high=_checks.MAX_TOKENS)
    )
    write_factor: Decimal = attrs.field(default=Decimal(1), validator=_FACTOR)
    read_factor: Decimal = attrs.field(default=Decimal(1), validator=_FACTOR)

    def prices(
        self, prices: ModelPrices, tokens: int
    ) -> tuple[Decimal, Decimal, Decimal]:
        """The input, cached-read and write prices of a request of `tokens`.

        Below `min_prefix_tokens` nothing is cached: all three are the
        input price. A price the catalogue does not give apart (the write
        price; the cached price, when it is the input price) comes from the
        rules' factors.
        """
        fresh, cached, write = prices.rates(tokens)
        if tokens < self.min_prefix_tokens:
            return fresh, fresh, fresh
        if prices.cache_write is None:
            write = fresh * self.write_factor
        if cached == fresh:
            cached = fresh * self.read_factor
        return fresh, cached, write


CACHE_RULES: Final[Mapping[str, CacheRules]] = MappingProxyType(
    {
        # Explicit cache breakpoints: a write costs 1.25x the input price,
        # a read 0.1x; a change invalidates the cache from that block on.
        "anthropic": CacheRules(
            provider="anthropic",
            min_prefix_tokens=1024,
            write_factor=Decimal("1.25"),
            read_factor=Decimal("0.1"),
        ),
        # Automatic caching of prefixes of 1,024 tokens and more: no write
        # premium, reads at the catalogue's cached price (0.5x when it has
        # none).
        "openai": CacheRules(
            provider="openai",
            min_prefix_tokens=1024,
            write_factor=Decimal(1),
            read_factor=Decimal("0.5"),
        ),
    }
)
"""The cache rules of the providers turnfsm knows, by provider id."""

_DEFAULT: Final = CacheRules(provider="other")


def cache_rules_for(prices: ModelPrices) -> CacheRules:
    """The cache rules of the provider `prices` belong to.

    A provider `CACHE_RULES` does not name gets rules with no premium and
    no discount beyond the catalogue's own prices (a prefix change
    invalidates from the first changed message on).
    """
    return CACHE_RULES.get(prices.provider, _DEFAULT)


def first_change(before: Sequence[Message], after: Sequence[Message]) -> int:
    """The index of the first message `after` does not share with `before`.

    A prompt cache serves the messages before it and breaks from it on.

    Args:
        before: The earlier conversation (a request, or what a pass was given).
        after: The later one.

    Returns:
        How many leading messages the two share (the shorter one's length
        when it is the start of the other).
    """
    index = 0
    for old, new in zip(before, after, strict=False):
        if old is not new and old != new:  # the same object: no field compare
            break
        index += 1
    return index


def _dollars(tokens: int, price: Decimal) -> Decimal:
    return tokens * price / 1_000_000


def pass_payback(
    before: Sequence[Message],
    after: Sequence[Message],
    *,
    counter: TokenCounter,
    reserved: int,
    prices: ModelPrices | None,
    rules: CacheRules | None = None,
    summary: Usage | None = None,
) -> PassPayback:
    """Work out what replacing `before` with `after` costs against what it saves.

    Args:
        before: The conversation the pass was given.
        after: The conversation it proposes.
        counter: The counter the sizes are measured with.
        reserved: The request's tokens beside its messages (system prompt,
            tool schemas, reply budget), which the pass leaves alone.
        prices: The model's prices (None: the token figures only).
        rules: The provider's cache rules (None: those of `prices`'
            provider).
        summary: What the pass's summary calls reported, priced as fresh
            input and output.

    Returns:
        The `PassPayback`: the tokens whose cache the pass invalidates and
        rewrites, the tokens it removes, and, with prices, its one-time
        cost, the saving per later call and the calls it takes to pay back.

    Raises:
        ConfigError: `counter` returned something other than an int >= 0.
    """

    def count(messages: Sequence[Message]) -> int:
        return _checks.token_count(counter.count(messages), counter, "count")

    return payback_of(
        before,
        after,
        count,
        sizes=(count(before) + reserved, count(after) + reserved),
        prices=prices,
        rules=rules,
        summary=summary,
    )


def payback_of(
    before: Sequence[Message],
    after: Sequence[Message],
    count: Callable[[Sequence[Message]], int],
    *,
    sizes: tuple[int, int],
    prices: ModelPrices | None,
    rules: CacheRules | None,
    summary: Usage | None,
) -> PassPayback:
    """`pass_payback` given the two requests' sizes, reserved budget included.

    For a caller that measured them already (the manager measures every
    pass's result); `count` measures a slice of either conversation.
    """
    size_before, size_after = sizes
    start = first_change(before, after)
    rules = (
        rules
        if rules is not None
        else (cache_rules_for(prices) if prices is not None else _DEFAULT)
    )
    if rules.invalidates is Invalidates.ALL:
        invalidated, rewritten = size_before, size_after
    else:
        invalidated = count(before[start:]) if start < len(before) else 0
        rewritten = count(after[start:]) if start < len(after) else 0
    removed = max(0, size_before - size_after)
    if prices is None:
        return PassPayback(
            invalidated_tokens=invalidated,
            rewritten_tokens=rewritten,
            removed_tokens=removed,
        )
    _, read_before, _ = rules.prices(prices, size_before)
    fresh_after, read_after, write_after = rules.prices(prices, size_after)
    used = summary or Usage()
    cost = (
        _dollars(rewritten, write_after - read_after)
        + _dollars(used.input_tokens, fresh_after)
        + _dollars(used.output_tokens, prices.output)
    )
    saving = _dollars(invalidated, read_before) - _dollars(rewritten, read_after)
    payback: int | None = None
    if cost <= 0:
        payback = 0
    elif saving > 0:
        payback = math.ceil(cost / saving)
    return PassPayback(
        invalidated_tokens=invalidated,
        rewritten_tokens=rewritten,
        removed_tokens=removed,
        cost=float(cost),
        saving=float(saving),
        payback_calls=payback,
    )
