"""A value kept per live object, by identity."""

from __future__ import annotations

import gc

import attrs

from turnfsm._identity import IdentityMap


@attrs.frozen
class Point:
    x: int


def test_equal_objects_keep_a_value_each() -> None:
    kept: IdentityMap[Point, str] = IdentityMap()
    a, b = Point(1), Point(1)
    assert a == b

    assert kept.put(a, "a") == "a"
    assert kept.get(b) is None
    kept.put(b, "b")

    assert (kept.get(a), kept.get(b)) == ("a", "b")


def test_a_value_goes_with_its_object_and_no_other() -> None:
    kept: IdentityMap[Point, str] = IdentityMap()
    a, b = Point(1), Point(1)
    kept.put(a, "a")
    kept.put(b, "b")

    del a
    gc.collect()

    assert len(kept) == 1
    assert kept.get(b) == "b"


def test_a_value_put_again_replaces_the_first() -> None:
    kept: IdentityMap[Point, str] = IdentityMap()
    a = Point(1)
    kept.put(a, "first")
    kept.put(a, "second")
    assert kept.get(a) == "second"

    del a
    gc.collect()
    assert len(kept) == 0
