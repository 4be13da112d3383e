"""`ExtractiveSummaryModel`: a deterministic stand-in for a summary model.

It answers turnfsm's summary prompt (`turnfsm.context.SUMMARY_SECTIONS`)
without a language model: under Critical Context it lists the lines of the
previous summary and of the new turns that hold a fact (a number, or a word
in capitals past the start of its sentence), up to `max_facts` and within
the request's reply budget. As the prompt asks, the previous summary's
facts are kept first, then what the user and the assistant said, then tool
output (the newest of it). Good enough to prove mechanics (tests, the simulated demo,
`bench/retention.py`); a real model writes real summaries.
"""

from __future__ import annotations

import re
from typing import Final, final

import attrs

from turnfsm import _checks
from turnfsm.context import SUMMARY_SECTIONS
from turnfsm.messages import Message
from turnfsm.providers import ModelRequest, ModelResponse
from turnfsm.values import Usage

__all__ = ["ExtractiveSummaryModel"]

_MARKERS: Final = (
    "PREVIOUS SUMMARY:",
    "NEW TURNS TO INCORPORATE:",
    "CONVERSATION:",
    "ADDITIONAL CONTEXT:",
    "ADDITIONAL INSTRUCTIONS:",
    "Write the summary under exactly these headings",
)
_FACT: Final = re.compile(r"\d|(?<=[a-z,;:] )[A-Z][a-zA-Z]+")
_LABEL: Final = re.compile(r"^\[(USER|ASSISTANT|SYSTEM|TOOL RESULT [^\]]*)\]:\s*")


def _sections(prompt: str) -> dict[str, str]:
    """Split the prompt at its markers: marker -> the text after it."""
    found = sorted((prompt.find(m), m) for m in _MARKERS if prompt.find(m) >= 0)
    out: dict[str, str] = {}
    for k, (start, marker) in enumerate(found):
        end = found[k + 1][0] if k + 1 < len(found) else len(prompt)
        out[marker] = prompt[start + len(marker) : end]
    return out


_SECTION_RANKS: Final = {"## Key Decisions": 0, "## Critical Context": 2}


def _facts(text: str, *, kept: bool = False) -> list[tuple[int, str]]:
    """The fact lines of `text`, each with its rank (lower: kept longer).

    What the user and the assistant said ranks 1 (0 once in a summary, under
    Key Decisions), tool output 2 (also under Critical Context): as the
    prompt asks, facts stated in the conversation outlive the bulk of tool
    output.
    """
    facts: list[tuple[int, str]] = []
    # In a summary only its two fact sections are read; in a transcript,
    # every block by its label.
    rank: int | None = None if kept else 1
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("## "):
            rank = _SECTION_RANKS.get(stripped)
            continue
        label = _LABEL.match(stripped)
        if label is not None:
            rank = 2 if label.group(1).startswith("TOOL RESULT") else 1
        if rank is None:
            continue
        line = _LABEL.sub("", stripped).lstrip("- ").strip()
        if line.startswith(("[SUMMARY OF PART", "[Tool calls:")) or line in (
            "",
            "None",
        ):
            continue
        if _FACT.search(line):
            facts.append((rank, line[:240]))
    return facts


def _keep(facts: list[tuple[int, str]], count: int) -> list[tuple[int, str]]:
    """The `count` facts that outlive the others, in their original order.

    Stated facts (ranks 0 and 1) are kept oldest first, tool output newest
    first: a decision made early still holds; old tool output is stale.
    """
    unique = list(dict.fromkeys(facts))
    order = sorted(
        range(len(unique)),
        key=lambda i: (unique[i][0], i if unique[i][0] < 2 else -i),
    )
    return [unique[i] for i in sorted(order[:count])]


def _write(facts: list[tuple[int, str]]) -> str:
    body = dict.fromkeys(SUMMARY_SECTIONS, "None")
    stated = [f for rank, f in facts if rank < 2]
    output = [f for rank, f in facts if rank == 2]
    if stated:
        body["Key Decisions"] = "\n".join(f"- {f}" for f in stated)
    if output:
        body["Critical Context"] = "\n".join(f"- {f}" for f in output)
    if facts:
        body["Active Task"] = facts[-1][1]
    return "\n".join(f"## {name}\n{body[name]}" for name in SUMMARY_SECTIONS)


@final
@_checks.keyword_checked
@attrs.define(eq=False, kw_only=True)
class ExtractiveSummaryModel:
    """A `ModelClient` that writes extractive summaries in the 13-section form.

    Attributes:
        max_facts: The most fact lines a summary keeps: an int >= 1.
        requests: Every request it was sent, in order.

    Raises:
        ConfigError: `max_facts` is not an int in 1..1,000,000 (a bool is
            not one).
    """

    max_facts: int = attrs.field(
        default=40, validator=_checks.integer(low=1, high=_checks.MAX_COUNT)
    )
    requests: list[ModelRequest] = attrs.field(factory=list, init=False)

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Summarise the prompt in `request` (its last message)."""
        self.requests.append(request)
        prompt = request.messages[-1].text
        parts = _sections(prompt)
        if not parts:  # the re-ask for a shorter summary: the same, fewer facts
            facts = _facts(prompt, kept=True)
            limit = max(1, len(facts) // 2)
        else:
            facts = _facts(parts.get("PREVIOUS SUMMARY:", ""), kept=True)
            for marker in ("NEW TURNS TO INCORPORATE:", "CONVERSATION:"):
                facts += _facts(parts.get(marker, ""))
            facts += _facts(parts.get("ADDITIONAL CONTEXT:", ""))
            limit = self.max_facts
        kept = _keep(facts, limit)
        text = _write(kept)
        # Stay within the reply budget, as a model cut at max_tokens would.
        while kept and request.max_tokens and len(text) // 3 > request.max_tokens:
            limit = len(kept) - 1
            kept = _keep(facts, limit)
            text = _write(kept)
        usage = Usage(input_tokens=len(prompt) // 4, output_tokens=len(text) // 4)
        return ModelResponse(message=Message.assistant(text), usage=usage)
