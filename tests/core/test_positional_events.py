"""Every event is built positionally as well as by keyword, in a documented order."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from tests.helpers import reply, user
from turnfsm.core import (
    EVENT_TYPES,
    CompactionCircuitOpened,
    CompactionNoop,
    CompactionOverflowed,
    CompactionResult,
    CompactorFailed,
    ContextOverflowed,
    ErrorInfo,
    Event,
    Measured,
    MessageInjected,
    ModelFailed,
    ModelReplied,
    OutputRejected,
    RunCancelled,
    RunStarted,
    Signal,
    ToolCallsReviewed,
    ToolsFinished,
    Usage,
)
from turnfsm.errors import ConfigError
from turnfsm.serde import from_json, to_json
from turnfsm.values import PassPayback

ERR = ErrorInfo(type="APIError", message="down")
USAGE = Usage(input_tokens=3, output_tokens=1)
PAYBACK = PassPayback(
    invalidated_tokens=9, rewritten_tokens=4, removed_tokens=5, cost=0.1, saving=0.01
)
REPLY = reply("hi", id="m-reply")
USER = user("steer", id="m-user")
ASK = user("ask again", id="m-ask")
FEEDBACK = user("cite the source", id="m-feedback")

# (event class, positional arguments, the same event built by keyword): every
# field given, in the order each class's docstring lists.
POSITIONAL: list[tuple[type[Event], tuple[Any, ...], Event]] = [
    (RunStarted, ((USER,),), RunStarted(input=(USER,))),
    (Measured, (120, "calibrated"), Measured(estimate=120, source="calibrated")),
    (ModelReplied, (REPLY, USAGE), ModelReplied(message=REPLY, usage=USAGE)),
    (
        OutputRejected,
        (REPLY, ("bad",), ASK, USAGE),
        OutputRejected(message=REPLY, errors=("bad",), feedback=ASK, usage=USAGE),
    ),
    (ModelFailed, (ERR, USAGE), ModelFailed(error=ERR, usage=USAGE)),
    (ContextOverflowed, (ERR, USAGE), ContextOverflowed(error=ERR, usage=USAGE)),
    (ToolsFinished, ((USER,),), ToolsFinished(results=(USER,))),
    (ToolCallsReviewed, ((USER,),), ToolCallsReviewed(results=(USER,))),
    (
        CompactionResult,
        ((USER,), 9, 4, USAGE, PAYBACK),
        CompactionResult(
            messages=(USER,), before=9, after=4, usage=USAGE, payback=PAYBACK
        ),
    ),
    (
        CompactionNoop,
        (9, 9, True, USAGE, PAYBACK),
        CompactionNoop(before=9, after=9, vetoed=True, usage=USAGE, payback=PAYBACK),
    ),
    (
        CompactionOverflowed,
        (9, 8, USAGE, 7),
        CompactionOverflowed(used=9, limit=8, usage=USAGE, before=7),
    ),
    (
        CompactorFailed,
        (9, 8, ERR, USAGE),
        CompactorFailed(used=9, limit=8, error=ERR, usage=USAGE),
    ),
    (CompactionCircuitOpened, (3,), CompactionCircuitOpened(failures=3)),
    (MessageInjected, (USER,), MessageInjected(message=USER)),
    (RunCancelled, ("not today",), RunCancelled(reason="not today")),
    (
        Signal,
        ("revise", {"feedback": "cite the source"}, FEEDBACK),
        Signal(name="revise", data={"feedback": "cite the source"}, message=FEEDBACK),
    ),
]

IDS = [cls.__name__ for cls, _, _ in POSITIONAL]

# The least each class takes positionally: its fields without a default.
REQUIRED: list[tuple[type[Event], tuple[Any, ...], Event]] = [
    (RunStarted, ((),), RunStarted(input=())),
    (Measured, (0,), Measured(estimate=0)),
    (ModelReplied, (REPLY,), ModelReplied(message=REPLY)),
    (
        OutputRejected,
        (REPLY, ("bad",)),
        OutputRejected(message=REPLY, errors=("bad",)),
    ),
    (ModelFailed, (ERR,), ModelFailed(error=ERR)),
    (ContextOverflowed, (ERR,), ContextOverflowed(error=ERR)),
    (ToolsFinished, ((),), ToolsFinished(results=())),
    (ToolCallsReviewed, (), ToolCallsReviewed()),
    (CompactionResult, ((), 1, 0), CompactionResult(messages=(), before=1, after=0)),
    (CompactionNoop, (1, 1), CompactionNoop(before=1, after=1)),
    (CompactionOverflowed, (2, 1), CompactionOverflowed(used=2, limit=1)),
    (CompactorFailed, (2, 1, ERR), CompactorFailed(used=2, limit=1, error=ERR)),
    (CompactionCircuitOpened, (0,), CompactionCircuitOpened(failures=0)),
    (MessageInjected, (USER,), MessageInjected(message=USER)),
    (RunCancelled, (), RunCancelled()),
    (Signal, ("approved",), Signal(name="approved")),
]


def test_the_tables_cover_every_event_class() -> None:
    assert [cls for cls, _, _ in POSITIONAL] == list(EVENT_TYPES)
    assert [cls for cls, _, _ in REQUIRED] == list(EVENT_TYPES)


@pytest.mark.parametrize(("cls", "args", "by_keyword"), POSITIONAL, ids=IDS)
def test_an_event_built_positionally_equals_one_built_by_keyword(
    cls: type[Event], args: tuple[Any, ...], by_keyword: Event
) -> None:
    assert cls(*args) == by_keyword  # type: ignore[arg-type]


def _without_new_ids(event: Event) -> Event:
    """The event with the ids its defaults make (a re-ask's) left out."""
    if isinstance(event, OutputRejected):
        return attrs.evolve(event, feedback=attrs.evolve(event.feedback, id="-"))
    return event


@pytest.mark.parametrize(("cls", "args", "by_keyword"), REQUIRED, ids=IDS)
def test_an_event_takes_its_required_fields_positionally(
    cls: type[Event], args: tuple[Any, ...], by_keyword: Event
) -> None:
    built = cls(*args)  # type: ignore[arg-type]

    assert _without_new_ids(built) == _without_new_ids(by_keyword)


@pytest.mark.parametrize(("cls", "args", "by_keyword"), POSITIONAL, ids=IDS)
def test_the_positional_order_is_the_documented_one(
    cls: type[Event], args: tuple[Any, ...], by_keyword: Event
) -> None:
    names = [field.name for field in attrs.fields(cls)]
    documented = ", ".join(f"`{name}`" for name in names)

    assert f"Fields, in positional order: {documented}." in (cls.__doc__ or "")
    assert len(args) == len(names)


@pytest.mark.parametrize(("cls", "args", "by_keyword"), POSITIONAL, ids=IDS)
def test_an_event_built_positionally_serialises_like_one_built_by_keyword(
    cls: type[Event], args: tuple[Any, ...], by_keyword: Event
) -> None:
    data = to_json(cls(*args))  # type: ignore[arg-type]

    assert data == to_json(by_keyword)
    assert from_json(Event, data) == by_keyword


@pytest.mark.parametrize(("cls", "args", "by_keyword"), POSITIONAL, ids=IDS)
def test_a_positional_argument_too_many_is_a_type_error(
    cls: type[Event], args: tuple[Any, ...], by_keyword: Event
) -> None:
    with pytest.raises(TypeError):
        cls(*args, None)  # type: ignore[arg-type]


def test_a_positional_value_is_checked_like_a_keyword_one() -> None:
    with pytest.raises(ConfigError, match="estimate"):
        Measured(-1)
