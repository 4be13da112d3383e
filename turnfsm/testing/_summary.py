"""`ExtractiveSummaryModel`: a deterministic stand-in for a summary model.

It answers turnfsm's summary prompt (`turnfsm.context.SUMMARY_SECTIONS`)
without a language model: under Critical Context it lists every line of the
previous summary's facts and of the new turns that holds a fact (a number,
or a word in capitals past the start of its sentence), newest last, up to
`max_facts`. Good enough to prove mechanics (tests, the simulated demo,
`bench/retention.py`); a real model writes real summaries.
"""

from __future__ import annotations

import re
from typing import Final, final

import attrs

from turnfsm.context._transcript import SUMMARY_SECTIONS
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


def _facts(text: str) -> list[str]:
    facts: list[str] = []
    for raw in text.splitlines():
        line = _LABEL.sub("", raw.strip()).lstrip("- ").strip()
        if line.startswith(("##", "[SUMMARY OF PART")) or line in ("", "None"):
            continue
        if _FACT.search(line):
            facts.append(line[:160])
    return facts


def _write(facts: list[str]) -> str:
    body = dict.fromkeys(SUMMARY_SECTIONS, "None")
    if facts:
        body["Critical Context"] = "\n".join(f"- {f}" for f in facts)
        body["Active Task"] = facts[-1]
    return "\n".join(f"## {name}\n{body[name]}" for name in SUMMARY_SECTIONS)


@final
@attrs.define(eq=False, kw_only=True)
class ExtractiveSummaryModel:
    """A `ModelClient` that writes extractive summaries in the 13-section form.

    Attributes:
        max_facts: The most fact lines a summary keeps (the newest).
        requests: Every request it was sent, in order.
    """

    max_facts: int = 40
    requests: list[ModelRequest] = attrs.field(factory=list, init=False)

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Summarise the prompt in `request` (its last message)."""
        self.requests.append(request)
        prompt = request.messages[-1].text
        parts = _sections(prompt)
        if not parts:  # the re-ask for a shorter summary: keep the first lines
            facts = _facts(prompt)[: self.max_facts // 2]
        else:
            facts = _facts(parts.get("PREVIOUS SUMMARY:", ""))
            for marker in ("NEW TURNS TO INCORPORATE:", "CONVERSATION:"):
                facts += _facts(parts.get(marker, ""))
            facts += _facts(parts.get("ADDITIONAL CONTEXT:", ""))
        kept = list(dict.fromkeys(facts))[-self.max_facts :]
        text = _write(kept)
        # Stay within the reply budget, as a model cut at max_tokens would.
        while kept and request.max_tokens and len(text) * 2 // 3 > request.max_tokens:
            kept = kept[1:]
            text = _write(kept)
        usage = Usage(input_tokens=len(prompt) // 4, output_tokens=len(text) // 4)
        return ModelResponse(message=Message.assistant(text), usage=usage)
