"""The `SessionStore` conformance suite: what every store must do, checked.

Run it against a fresh store of yours::

    await check_store(lambda: MyStore(...))

Each check gets a new store from the factory, so a store backed by a file
or a database can hand out a fresh file or schema each time. A failed check
raises `AssertionError` naming the check and what went wrong. The owner
lease checks (`turnfsm.testing._store_leases`) run when the store is a
`LeasingStore`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final

import attrs

from turnfsm import _checks
from turnfsm.errors import ConfigError, CorruptRecord
from turnfsm.persistence import (
    LeasingStore,
    LinkingStore,
    ParentLink,
    RunOpened,
    SessionStore,
)
from turnfsm.testing._store_leases import LEASE_CHECKS
from turnfsm.testing._store_refusals import (
    _bad_id,
    _conflict,
    _duplicate_key,
    _no_ghosts,
    _race,
)
from turnfsm.testing._store_samples import _odd_entries, _same, sample_entries

__all__ = ["check_store", "sample_entries"]

StoreFactory = Callable[[], "SessionStore | Awaitable[SessionStore]"]
Damage = Callable[[Any, str], Awaitable[None]]
"""``damage(store, session_id)``: break a stored session (a test's own hook)."""


async def _make(factory: StoreFactory) -> SessionStore:
    store = factory()
    if isinstance(store, Awaitable):
        store = await store
    if not isinstance(store, SessionStore):
        raise AssertionError(f"the factory made {store!r}, not a SessionStore")
    return store


async def _round_trip(store: SessionStore) -> None:
    entries = sample_entries()
    version = await store.append("s_round", entries[:3], expected_version=0)
    if version != 3:
        raise AssertionError(f"round trip: append returned version {version}, not 3")
    version = await store.append("s_round", entries[3:], expected_version=3)
    if version != len(entries):
        raise AssertionError(f"round trip: version {version}, not {len(entries)}")
    _same(await store.load("s_round"), entries, "round trip")


async def _unknown_is_empty(store: SessionStore) -> None:
    if await store.load("s_nobody") != ():
        raise AssertionError("an unknown session must load as ()")
    if await store.list_sessions() != ():
        raise AssertionError("a new store must list no sessions")


async def _isolation(store: SessionStore) -> None:
    a, b = sample_entries("run_a"), sample_entries("run_b")
    await store.append("s_b", b, expected_version=0)
    await store.append("s_a", a[:4], expected_version=0)
    _same(await store.load("s_a"), a[:4], "isolation")
    _same(await store.load("s_b"), b, "isolation")
    infos = await store.list_sessions()
    listed = [(s.id, s.version) for s in infos]
    if listed != [("s_a", 4), ("s_b", len(b))]:
        raise AssertionError(f"list_sessions: got {listed}")
    a_at, b_at = (s.updated_at for s in infos)
    if a_at is not None and b_at is not None and a_at < b_at:
        raise AssertionError(
            f"list_sessions: s_a, written after s_b, is listed as updated at "
            f"{a_at}, before s_b ({b_at})"
        )


async def _odd_text(store: SessionStore) -> None:
    sessions = ("s_\udcff", "\udcff\udc80", '"s_\\udcff"', "s_nul\x00", "s_plain")
    for n, session in enumerate(sessions):
        entries = _odd_entries(f"run_{n}_\udcff")
        await store.append(session, entries[:3], expected_version=0)
        await store.append(session, entries[3:], expected_version=3)
    for n, session in enumerate(sessions):
        _same(await store.load(session), _odd_entries(f"run_{n}_\udcff"), "odd text")
    listed = sorted(info.id for info in await store.list_sessions())
    if listed != sorted(sessions):
        raise AssertionError(f"odd text: listed {listed!r}, wrote {sorted(sessions)!r}")


async def _delegated(store: SessionStore) -> None:
    # The sessions whose first run names a parent, with that opening; not a
    # session whose later run does, nor one whose first run does not.
    link = ParentLink(session_id="s_\udcff", run_id="run_1", call_id="c_1", depth=1)
    plain = sample_entries("run_p")
    opened = plain[0]
    assert isinstance(opened, RunOpened)
    assert isinstance(store, LinkingStore)
    child = (attrs.evolve(opened, run_id="run_c", parent=link), *plain[1:])
    later = (*plain, attrs.evolve(opened, run_id="run_l", parent=link))
    written = {"s_plain": plain, "s_child \udcff": child, "s_later": later}
    for session_id, entries in written.items():
        await store.append(session_id, entries, expected_version=0)
    found = dict(await store.list_delegated())
    if found != {"s_child \udcff": child[0]}:
        raise AssertionError(
            f"list_delegated: got {found!r}, wanted the first run's opening "
            "of the one session whose first run names a parent"
        )


async def _lifecycle(store: SessionStore) -> None:
    # Optional: a store that holds resources is an async context manager
    # whose exit lets go of them (`aclose`).
    enter = getattr(store, "__aenter__", None)
    leave = getattr(store, "__aexit__", None)
    if enter is None or leave is None:
        return
    if await enter() is not store:
        raise AssertionError("lifecycle: `async with store as s` must bind the store")
    await leave(None, None, None)


_CHECKS = (
    _unknown_is_empty,
    _round_trip,
    _conflict,
    _race,
    _isolation,
    _bad_id,
    _duplicate_key,
    _no_ghosts,
    _odd_text,
)


async def _damaged(store: SessionStore, damage: Damage) -> None:
    entries = sample_entries()
    await store.append("s_sound", entries, expected_version=0)
    await store.append("s_damaged", entries, expected_version=0)
    await damage(store, "s_damaged")
    try:
        await store.load("s_damaged")
    except CorruptRecord as exc:
        if "s_damaged" not in exc.path:
            raise AssertionError(
                f"damaged: the error does not name the session: {exc!r}"
            ) from None
    else:
        raise AssertionError("damaged: a damaged session loaded without an error")
    listed = {info.id: info for info in await store.list_sessions()}
    if set(listed) != {"s_sound", "s_damaged"}:
        raise AssertionError(f"damaged: list_sessions gave {sorted(listed)}")
    _same(await store.load("s_sound"), entries, "damaged (the other session)")


_FACTORY: Final = _checks.Shape()
_DAMAGE: Final = _checks.Shape(("store", "session_id"))


def _unfit(value: object, shape: _checks.Shape) -> str | None:
    """Why `value` cannot be called as `shape` says, in parentheses (None: it can)."""
    if not callable(value):
        return ""
    why = _checks.cannot_take(value, shape)
    return None if why is None else f" ({why})"


def _check_arguments(factory: object, damage: object) -> None:
    """Refuse a `check_store` argument before any check runs.

    A store given for its factory is refused showing the factory (each
    check needs a fresh store), as `check_compactor` shows the instance
    for a class.
    """
    if not isinstance(factory, type) and isinstance(factory, SessionStore):
        name = type(factory).__name__
        raise ConfigError(
            "factory",
            factory,
            "a factory that makes a fresh, empty store (each check needs its "
            f"own), not a store: check_store(lambda: {name}(...))",
        )
    why = _unfit(factory, _FACTORY)
    if why is not None:
        raise ConfigError(
            "factory",
            factory,
            f"a function of no arguments that makes a fresh, empty store{why}",
        )
    why = None if damage is None else _unfit(damage, _DAMAGE)
    if why is not None:
        raise ConfigError(
            "damage",
            damage,
            "None, or a function of a store and a session id that breaks "
            f"that session{why}: async def damage(store, session_id)",
        )


async def check_store(factory: StoreFactory, *, damage: Damage | None = None) -> None:
    """Check that the stores `factory` makes behave as a `SessionStore` must.

    Checked: an unknown session loads empty; every kind of entry reads back
    equal, in order, across appends; an append at a stale version raises
    `SessionConflict` and writes nothing; of several concurrent writers
    expecting one version exactly one wins; sessions do not see each other's
    entries and are listed with their versions (a session written later,
    with a later `updated_at`, when the store gives one); a bad session id is a
    `ConfigError`; a repeated compaction key is a `DuplicateRecord` that
    writes nothing; a refused or empty append leaves no session behind; text
    and ids with lone surrogates, NULs and escapes read back exactly. A store
    that is an async context manager binds itself and closes on exit. A
    `LeasingStore` must also keep owner leases: one winner among concurrent
    acquirers, expired leases taken over, `force`, `SessionBusy` naming the
    live owner, `LeaseLost` on renewing a lost lease, release and lookup.
    A `LinkingStore` must list exactly the sessions whose first run names
    a parent, each with that run's opening.

    Args:
        factory: Makes a fresh, empty store (sync or async).
        damage: Optional ``async damage(store, session_id)`` that breaks a
            stored session the way a bad disk or a hand edit would (a row
            that is not JSON, a wrong counter); then loading it must raise
            `CorruptRecord` naming the session, while listing and the other
            sessions keep working.

    Raises:
        AssertionError: naming the first check that failed.
        ConfigError: before any check, `factory` is not callable with no
            arguments (a store given for it is shown as a factory:
            ``lambda: MyStore(...)``), or `damage` is neither None nor
            callable with a store and a session id.
    """
    _check_arguments(factory, damage)
    for check in _CHECKS:
        await check(await _make(factory))
    store = await _make(factory)
    await _lifecycle(store)
    if damage is not None:
        await _damaged(await _make(factory), damage)
    if isinstance(store, LeasingStore):
        for lease_check in LEASE_CHECKS:
            await lease_check(await _make(factory))
    if isinstance(store, LinkingStore):
        await _delegated(await _make(factory))
