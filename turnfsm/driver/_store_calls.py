"""A run's calls to its session store, each under the driver's `store_timeout`.

A run waits on its store at every append, at its start (leases, reading the
log again) and at its end. The shipped stores bound their own waits (SQLite
its ``busy_timeout``, PostgreSQL its pool's ``timeout``); a store a user
plugs in may not, and a run must not wait on it for ever. So each call is
given `store_timeout` seconds: one that has not returned by then is given
up, and the run stops with `StoreUnusable` (in doubt for a write: it may
still have been written, and reading the session again tells).

An answer that comes in time is kept, even when the store took a shield
around its own write (SQLite does): only a call the deadline cancelled is
given up. The shipped stores are called as they are: a deadline costs a
cancel scope per call (about 7 µs, two or three calls a tool turn), and
theirs are bounded already.

Reading a session outside a run (an agent reopening one to resume, abandon
or compact a run of it) is bounded the same way (`read_session`).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Final, TypeVar

import anyio

from turnfsm.driver._cancels import cancel_requested
from turnfsm.errors import StoreUnusable
from turnfsm.persistence import Session, SessionStore, store_label

__all__ = ["read_session", "store_call"]

T = TypeVar("T")


async def store_call(
    call: Awaitable[T],
    *,
    seconds: float | None,
    store: object,
    method: str,
    writes: bool = False,
) -> T:
    """Await `call`, a call of `store`'s `method`, for at most `seconds`.

    Args:
        call: The call, not yet awaited.
        seconds: The limit (None: no limit).
        store: The store called, named by the error.
        method: The method called, named by the error.
        writes: Whether the call writes: one given up is then in doubt.

    Raises:
        StoreUnusable: The call did not return within `seconds`; whatever
            it raised once cancelled is its cause. Or it raised a cancellation
            error while nothing cancelled the run (its cause).
    """
    try:
        if seconds is None or _bounded(type(store)):
            return await call
        scope = anyio.CancelScope(deadline=anyio.current_time() + seconds)
        try:
            with scope:
                return await call
        except Exception as raised:
            if not scope.cancel_called:
                raise
            cause: BaseException | None = raised
        else:
            cause = None
    except anyio.get_cancelled_exc_class() as raised:
        if cancel_requested():
            raise
        # The store awaited something cancelled elsewhere: let out, its
        # cancel would be taken for the run's. Unusable for now, as a store
        # that does not answer is (a write in doubt), and the run resumes.
        raise StoreUnusable(
            store_label(store),
            f"its {method} raised {type(raised).__name__} though nothing cancelled it",
            in_doubt=writes,
        ) from raised
    raise StoreUnusable(
        store_label(store),
        f"its {method} did not return within store_timeout={seconds} s",
        in_doubt=writes,
    ) from cause


async def read_session(
    store: SessionStore,
    session_id: str,
    *,
    seconds: float | None,
    must_exist: bool = False,
) -> Session:
    """Read session `session_id` from `store`, for at most `seconds` (`store_call`).

    Args:
        store: The store to read.
        session_id: The session to read.
        seconds: The limit (None: no limit).
        must_exist: Read with `Session.load` (a missing session is an
            error) instead of `Session.open` (a new one under that id).

    Raises:
        StoreUnusable: the store's ``load`` did not return within `seconds`.
        SessionNotFound: `must_exist`, and `store` holds no such session.
    """
    read = Session.load if must_exist else Session.open
    return await store_call(
        read(store, session_id), seconds=seconds, store=store, method="load"
    )


def _bounded(kind: type) -> bool:
    """Whether stores of class `kind` bound their own waits (the shipped ones)."""
    known = _BOUNDED.get(kind)
    if known is None:
        known = _BOUNDED[kind] = kind.__module__.startswith(_SHIPPED)
    return known


_SHIPPED: Final = "turnfsm.persistence."
"""The package of the shipped stores, each of which bounds its own waits."""

_BOUNDED: Final[dict[type, bool]] = {}
"""`_bounded`'s answers, by class."""
