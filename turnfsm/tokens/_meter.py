"""`Meter`: measures a whole request incrementally as the conversation grows.

Theory of operation. An `IncrementalCounter` prices a request as
`tokens(sum of units)`, and each message's units are cached by the counter, so
re-measuring only has to add up units. A `MessageLog` only ever grows, and all
views of one backing list share `log.memo`; the meter keeps there, per
counter, the cumulative sums of units over the backing list. Measuring a log
of n messages is then one list index when the sums reach n, and costs only the
new messages when the log grew: O(k) for k appended messages, not O(n) cache
lookups. A branched log (two different appends to one base) gets its own
backing list, and so its own sums. Like the logs it reads, a meter is meant
for one thread at a time.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Final, final

import attrs

from turnfsm.messages import Message, MessageLog
from turnfsm.tokens._protocol import IncrementalCounter, TokenCounter

__all__ = ["Meter"]

_MEMO_TAG: Final = "units"
_MAX_EXTRAS: Final = 64


@final
@attrs.define(eq=False)
class Meter:
    """Measures requests made of message sequences plus extra texts.

    Example:
        ```python
        meter = Meter(default_counter())
        size = meter.measure(history, pending, extras=[system_prompt])
        ```

    Attributes:
        counter: The counter to price messages and extras with.
    """

    counter: TokenCounter = attrs.field(on_setattr=attrs.setters.frozen)
    _incremental: IncrementalCounter | None = attrs.field(init=False, repr=False)
    _memo_key: Hashable | None = attrs.field(init=False, repr=False)
    # Extras (a system prompt, tool schemas) ride every request unchanged:
    # price each distinct text once.
    _extra_units: dict[str, int] = attrs.field(init=False, repr=False, factory=dict)

    @_incremental.default
    def _incremental_view(self) -> IncrementalCounter | None:
        counter = self.counter
        return counter if isinstance(counter, IncrementalCounter) else None

    @_memo_key.default
    def _key(self) -> Hashable | None:
        # Keyed by the counter's value: equal counters price messages alike,
        # so they may share sums. An unhashable counter gets no sums.
        key = (_MEMO_TAG, self.counter)
        try:
            hash(key)
        except TypeError:
            return None
        return key

    def measure(self, *parts: Sequence[Message], extras: Sequence[str] = ()) -> int:
        """Return the token estimate of `parts` sent as one request with `extras`.

        The parts are concatenated in order; each extra text (a system
        prompt, tool schemas) rides the same request. For an
        `IncrementalCounter` the units of everything are summed and
        converted once, so the result equals
        `counter.tokens(sum(units) + sum(text_units))`, which is
        `counter.count(concatenation)` when there are no extras. For a plain
        `TokenCounter` it is `counter.count(concatenation)` plus
        `counter.count_text(e)` for each extra.

        Args:
            *parts: Message sequences, e.g. the history and pending logs.
            extras: Texts that ride the request besides the messages.

        Returns:
            The estimated token count of the request.
        """
        counter = self._incremental
        if counter is None:
            messages = [m for part in parts for m in part]
            total = self.counter.count(messages)
            return total + sum(self.counter.count_text(e) for e in extras)
        units = sum(self._units_of_extra(counter, e) for e in extras)
        for part in parts:
            if isinstance(part, MessageLog) and self._memo_key is not None:
                units += self._log_units(counter, part, self._memo_key)
            else:
                units += sum(counter.units(m) for m in part)
        return counter.tokens(units)

    def _units_of_extra(self, counter: IncrementalCounter, text: str) -> int:
        cache = self._extra_units
        units = cache.get(text)
        if units is None:
            if len(cache) >= _MAX_EXTRAS:
                cache.clear()
            units = cache[text] = counter.text_units(text)
        return units

    @staticmethod
    def _log_units(counter: IncrementalCounter, log: MessageLog, key: Hashable) -> int:
        memo = log.memo
        sums: list[int] | None = memo.get(key)
        if sums is None:
            sums = memo[key] = [0]
        n = len(log)
        done = len(sums) - 1
        if done < n:
            total = sums[done]
            for i in range(done, n):
                total += counter.units(log[i])
                sums.append(total)
        return sums[n]
