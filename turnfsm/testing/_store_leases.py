"""The owner-lease checks of the store conformance suite (for a `LeasingStore`).

Each check gets a fresh store. Expiry is checked with a lease of
`SHORT` seconds and a wait a little longer than that.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final

import anyio

from turnfsm.errors import ConfigError, LeaseLost, SessionBusy
from turnfsm.persistence import Lease

__all__ = ["LEASE_CHECKS", "SHORT"]

SHORT: Final = 0.2
"""The time to live, in seconds, of the leases the suite lets expire."""

_LONG: Final = 60.0


def _fail(check: str, what: str) -> AssertionError:
    return AssertionError(f"leases ({check}): {what}")


async def _busy(store: Any, session: str, owner: str, check: str) -> SessionBusy:
    try:
        await store.acquire_lease(session, owner, ttl=_LONG)
    except SessionBusy as exc:
        return exc
    raise _fail(check, f"{owner!r} took a live lease held by another owner")


async def _acquire_and_refuse(store: Any) -> None:
    check = "acquire"
    first = await store.acquire_lease("s_lease", "owner-a", ttl=_LONG)
    if not isinstance(first, Lease) or (first.session_id, first.owner) != (
        "s_lease",
        "owner-a",
    ):
        raise _fail(check, f"acquire_lease returned {first!r}")
    if abs(first.expires_at - first.since - _LONG) > 1:
        raise _fail(check, f"the lease does not last ttl seconds: {first!r}")
    again = await store.acquire_lease("s_lease", "owner-a", ttl=_LONG)
    if again.owner != "owner-a" or again.since != first.since:
        raise _fail(check, f"the owner's own acquire changed its lease: {again!r}")
    busy = await _busy(store, "s_lease", "owner-b", check)
    if (busy.session_id, busy.owner, busy.alive) != ("s_lease", "owner-a", True):
        raise _fail(check, f"SessionBusy does not name the live owner: {busy!r}")
    if busy.since is None or abs(busy.since - first.since) > 1e-3:
        raise _fail(check, f"SessionBusy does not say since when: {busy!r}")
    held = await store.lease_of("s_lease")
    if held is None or held.owner != "owner-a":
        raise _fail(check, f"lease_of gave {held!r} after a refused acquire")
    if await store.lease_of("s_free") is not None:
        raise _fail(check, "lease_of a session nobody holds must be None")


async def _expired_and_forced(store: Any) -> None:
    check = "takeover"
    await store.acquire_lease("s_lease", "owner-a", ttl=SHORT)
    await anyio.sleep(SHORT * 2)
    taken = await store.acquire_lease("s_lease", "owner-b", ttl=_LONG)
    if taken.owner != "owner-b":
        raise _fail(check, f"an expired lease was not taken over: {taken!r}")
    forced = await store.acquire_lease("s_lease", "owner-c", ttl=_LONG, force=True)
    held = await store.lease_of("s_lease")
    if forced.owner != "owner-c" or held is None or held.owner != "owner-c":
        raise _fail(check, f"force did not take a live lease over: {held!r}")


async def _renew_and_release(store: Any) -> None:
    check = "renew"
    first = await store.acquire_lease("s_lease", "owner-a", ttl=SHORT)
    renewed = await store.renew_lease("s_lease", "owner-a", ttl=_LONG)
    if renewed.since != first.since or renewed.expires_at <= first.expires_at:
        raise _fail(check, f"renew_lease gave {renewed!r} after {first!r}")
    await store.acquire_lease("s_lease", "owner-b", ttl=_LONG, force=True)
    try:
        await store.renew_lease("s_lease", "owner-a", ttl=_LONG)
    except LeaseLost as exc:
        if (exc.session_id, exc.owner, exc.holder) != ("s_lease", "owner-a", "owner-b"):
            raise _fail(check, f"LeaseLost names the wrong owners: {exc!r}") from None
    else:
        raise _fail(check, "renewing a lease another owner took was accepted")
    await store.release_lease("s_lease", "owner-a")  # not its own: nothing
    held = await store.lease_of("s_lease")
    if held is None or held.owner != "owner-b":
        raise _fail(check, f"a release by another owner dropped the lease: {held!r}")
    await store.release_lease("s_lease", "owner-b")
    if await store.lease_of("s_lease") is not None:
        raise _fail(check, "the owner's release left its lease")
    free = await store.acquire_lease("s_lease", "owner-a", ttl=_LONG)
    if free.owner != "owner-a":
        raise _fail(check, f"a released lease could not be taken: {free!r}")


async def _race(store: Any) -> None:
    check = "race"
    winners: list[str] = []
    losers: list[SessionBusy] = []

    async def acquire(owner: str) -> None:
        try:
            await store.acquire_lease("s_race", owner, ttl=_LONG)
            winners.append(owner)
        except SessionBusy as exc:
            losers.append(exc)

    async with anyio.create_task_group() as group:
        for n in range(5):
            group.start_soon(acquire, f"owner-{n}")
    if len(winners) != 1:
        raise _fail(check, f"{len(winners)} of 5 concurrent acquirers won")
    if any(busy.owner != winners[0] for busy in losers):
        raise _fail(check, "a loser's SessionBusy does not name the winner")


async def _bad_arguments(store: Any) -> None:
    check = "arguments"
    for owner, ttl in (("", 1.0), (5, 1.0), ("owner", 0), ("owner", float("nan"))):
        try:
            await store.acquire_lease("s_lease", owner, ttl=ttl)
        except ConfigError:
            continue
        raise _fail(check, f"an owner of {owner!r} with ttl={ttl!r} was accepted")
    if await store.lease_of("s_lease") is not None:
        raise _fail(check, "a refused acquire left a lease")


LEASE_CHECKS: Final[tuple[Callable[[Any], Awaitable[None]], ...]] = (
    _acquire_and_refuse,
    _expired_and_forced,
    _renew_and_release,
    _race,
    _bad_arguments,
)
"""The lease checks, in order; each takes a fresh `LeasingStore`."""
