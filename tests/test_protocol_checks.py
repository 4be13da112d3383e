"""The quick protocol check: the same answers as `isinstance`, remembered per class."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol, runtime_checkable

import anyio
import pytest

from turnfsm import ContextManager, Driver, _checks
from turnfsm.context import SummarizingCompactor, TruncatingCompactor
from turnfsm.errors import ConfigError
from turnfsm.persistence import MemoryStore, Session
from turnfsm.testing import ScriptedModel, check_compactor
from turnfsm.tokens import HeuristicTokenCounter


@runtime_checkable
class Speaks(Protocol):
    def speak(self) -> str: ...


class Dog:
    def speak(self) -> str:
        return "woof"


class Mute:
    pass


class Sometimes:
    """Speaks only when an instance is given the method."""


def test_a_class_with_the_members_is_remembered_and_its_instances_pass() -> None:
    assert _checks.is_instance(Dog(), Speaks)
    assert (Dog, Speaks) in _checks._CONFORMING
    assert _checks.is_instance(Dog(), Speaks)
    assert not _checks.is_instance(Mute(), Speaks)
    assert not _checks.is_instance(None, Speaks)
    assert (Mute, Speaks) not in _checks._CONFORMING


def test_an_instance_that_conforms_on_its_own_is_checked_each_time() -> None:
    talking = Sometimes()
    talking.speak = lambda: "hi"  # type: ignore[attr-defined]
    assert _checks.is_instance(talking, Speaks)
    # Its class does not have the member: another instance may lack it.
    assert (Sometimes, Speaks) not in _checks._CONFORMING
    assert not _checks.is_instance(Sometimes(), Speaks)


@pytest.mark.parametrize(
    ("value", "types"),
    [
        (Dog(), (int, Speaks)),
        (3, (int, Speaks)),
        ("x", (int, Speaks)),
        (Dog(), Dog),
        (Mute(), (Dog, Speaks)),
    ],
)
def test_answers_as_isinstance_does(
    value: object, types: type | tuple[type, ...]
) -> None:
    for _ in range(2):  # before and after anything is remembered
        assert _checks.is_instance(value, types) == isinstance(value, types)


def test_a_model_that_is_no_client_is_still_refused_after_a_good_one() -> None:
    Driver(model=ScriptedModel.of("hi"))
    with pytest.raises(ConfigError) as caught:
        Driver(model=Mute())  # type: ignore[arg-type]
    assert caught.value.field == "model"


class SyncModel:
    def complete(self, request: object) -> object:
        return None


class SyncCompactor:
    def compact(self, messages: object, target: int, ctx: object) -> object:
        return None


def _awaiting(fn: Callable[..., Awaitable[object]]) -> Callable[..., object]:
    @functools.wraps(fn)
    def wrapper(*args: object) -> object:
        return fn(*args)

    return wrapper


class WrappedCompactor:
    @_awaiting
    async def compact(self, messages: object, target: int, ctx: object) -> object:
        return None


def test_a_plain_def_where_an_async_one_is_awaited_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"its complete\(\) is a plain def") as got:
        Driver(model=SyncModel())  # type: ignore[arg-type]
    assert got.value.field == "model"
    with pytest.raises(ConfigError, match="write it as `async def compact`") as got:
        ContextManager(SyncCompactor())  # type: ignore[arg-type]
    assert got.value.field == "compactor"
    with pytest.raises(ConfigError, match=r"its complete\(\) is a plain def"):
        SummarizingCompactor(model=SyncModel())  # type: ignore[arg-type]
    with pytest.raises(AssertionError, match="async compact"):
        anyio.run(check_compactor, SyncCompactor())


def test_a_wrapped_async_method_passes() -> None:
    assert _checks.plain_method(WrappedCompactor(), ("compact",)) is None
    ContextManager(WrappedCompactor())  # type: ignore[arg-type]


class YieldingCompactor:
    async def compact(
        self, messages: object, target: int, ctx: object
    ) -> AsyncIterator[object]:
        yield None


class AsyncCounter:
    async def count(self, messages: object) -> int:
        return 1

    def count_text(self, text: str) -> int:
        return 1


class AsyncTextCounter:
    def count(self, messages: object) -> int:
        return 1

    async def count_text(self, text: str) -> AsyncIterator[int]:
        yield 1


def test_an_async_generator_where_an_answer_is_awaited_is_refused_as_one() -> None:
    with pytest.raises(ConfigError, match=r"its compact\(\) yields") as got:
        ContextManager(YieldingCompactor())  # type: ignore[arg-type]
    assert got.value.field == "compactor"
    assert "plain def" not in str(got.value)


def test_an_async_def_where_a_count_is_called_for_is_refused_by_name() -> None:
    for counter, method in [
        (AsyncCounter(), "count"),
        (AsyncTextCounter(), "count_text"),
    ]:
        with pytest.raises(
            ConfigError, match=f"write it as a plain `def {method}`"
        ) as got:
            ContextManager(counter=counter)  # type: ignore[arg-type]
        assert got.value.field == "counter"
        assert f"its {method}() is an async def" in str(got.value)


def test_a_class_given_where_an_instance_belongs_is_refused_naming_the_call() -> None:
    # A class has the protocol's methods, unbound: it was taken, and each
    # call of it failed (a compactor's pass with "missing argument 'ctx'").
    cases: list[tuple[Callable[[], object], str, str]] = [
        (
            lambda: ContextManager(TruncatingCompactor),
            "compactor",
            "TruncatingCompactor",
        ),
        (
            lambda: ContextManager(counter=HeuristicTokenCounter),
            "counter",
            "HeuristicTokenCounter",
        ),
        (lambda: Driver(model=ScriptedModel), "model", "ScriptedModel"),
        (lambda: Session(store=MemoryStore), "store", "MemoryStore"),
    ]
    for make, field, name in cases:
        with pytest.raises(
            ConfigError, match=rf"an instance, {name}\(\), not the class"
        ) as got:
            make()
        assert got.value.field == field


class TwoArgCompactor:
    async def compact(self, request: object) -> object:
        return None


class ModelWithContext:
    async def complete(self, request: object, context: object) -> object:
        return None


class CountsNothing:
    def count(self) -> int:
        return 0

    def count_text(self, text: str) -> int:
        return 0


class StoreWithoutVersion:
    async def append(self, session_id: str, entries: object) -> int:
        return 0

    async def load(self, session_id: str) -> tuple[object, ...]:
        return ()

    async def list_sessions(self) -> tuple[object, ...]:
        return ()


class Flexible:
    """Methods that take the calls in their own ways: they pass."""

    async def compact(self, *parts: object, **named: object) -> object:
        return None

    async def complete(self, request: object, retries: int = 0) -> object:
        return None


def test_a_method_that_cannot_take_its_call_is_refused_by_name() -> None:
    # Each failed at its first call instead: a compactor's pass failed the
    # run with "takes 2 positional arguments but 4 were given".
    cases: list[tuple[Callable[[], object], str, str]] = [
        (
            lambda: ContextManager(TwoArgCompactor()),
            "compactor",
            "its compact() cannot be called as compact(messages, target, ctx): "
            "too many positional arguments",
        ),
        (
            lambda: Driver(model=ModelWithContext()),
            "model",
            "its complete() cannot be called as complete(request): "
            "missing a required argument: 'context'",
        ),
        (
            lambda: SummarizingCompactor(model=ModelWithContext()),
            "model",
            "its complete() cannot be called as complete(request)",
        ),
        (
            lambda: ContextManager(counter=CountsNothing()),
            "counter",
            "its count() cannot be called as count(messages)",
        ),
        (
            lambda: Session(store=StoreWithoutVersion()),
            "store",
            "its append() cannot be called as append(session_id, entries, "
            "expected_version=...): got an unexpected keyword argument "
            "'expected_version'",
        ),
    ]
    for make, field, said in cases:
        with pytest.raises(ConfigError) as got:
            make()
        assert got.value.field == field
        assert said in str(got.value)
    ContextManager(Flexible())  # type: ignore[arg-type]
    Driver(model=Flexible())  # type: ignore[arg-type]


class NumberCompactor:
    compact = 5


class StringCounter:
    def __init__(self) -> None:
        self.count = "many"
        self.count_text = self.units = self.text_units = self.tokens = "many"


def test_a_method_that_is_no_callable_is_refused_by_name() -> None:
    # Each was taken, and failed at its first call instead: a compactor's
    # pass failed the run with "'int' object is not callable".
    cases: list[tuple[Callable[[], object], str, str]] = [
        (
            lambda: ContextManager(NumberCompactor()),
            "compactor",
            "its compact is an int",
        ),
        (
            lambda: ContextManager(counter=StringCounter()),
            "counter",
            "its count is a str",
        ),
    ]
    for make, field, said in cases:
        with pytest.raises(ConfigError) as got:
            make()
        assert got.value.field == field
        assert said in str(got.value)
        assert "not a method" in str(got.value)
