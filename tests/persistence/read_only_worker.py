"""A process that reads, writes or keeps an SQLite store, for the read-only tests.

``read PATH``: opens it read only, lists and loads every session, asks for
each lease, tries every kind of write; prints what it found as JSON.
``write PATH``: opens it to write (as a run would); prints the refusal as
JSON. ``keep PATH``: appends ``s_live``, says ``ready`` and keeps the store
open (its last commits in its write-ahead log) until told ``more`` (one
more append) or ``close``. ``crash PATH``: appends ``s_log`` and ends
without closing, its commits left in the write-ahead log.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import anyio

from turnfsm.errors import StoreDirectoryUnusable, StoreError, StoreUnusable
from turnfsm.persistence import SQLiteStore
from turnfsm.testing import sample_entries


def _refusal(exc: StoreError) -> dict[str, Any]:
    where = exc.directory if isinstance(exc, StoreDirectoryUnusable) else None
    path = exc.path if isinstance(exc, StoreUnusable) else None
    return {
        "type": type(exc).__name__,
        "path": path,
        "directory": where,
        "said": str(exc),
    }


async def _read(path: str) -> dict[str, Any]:
    try:
        store = SQLiteStore(path, read_only=True)
    except StoreError as exc:
        return {"refused": _refusal(exc)}
    try:
        listed = await store.list_sessions()
        found = {i.id: [i.version, len(await store.load(i.id))] for i in listed}
        leases = [await store.lease_of(i.id) for i in listed]
        writes = {}
        for name, write in (
            ("append", store.append("x", sample_entries(), expected_version=0)),
            ("lease", store.acquire_lease("x", "me", ttl=30)),
            ("delete", store.delete_session("s_a")),
        ):
            try:
                await write
            except StoreError as exc:
                writes[name] = _refusal(exc)
            else:
                writes[name] = "WRITTEN"
        return {"sessions": found, "leases": [x is not None for x in leases], **writes}
    finally:
        await store.aclose()


def _write(path: str) -> dict[str, Any]:
    try:
        SQLiteStore(path)._handle.close()
    except StoreError as exc:
        return {"refused": _refusal(exc)}
    return {"opened": True}


async def _keep(path: str, crash: bool) -> None:
    store = SQLiteStore(path)
    name = "s_log" if crash else "s_live"
    version = await store.append(name, sample_entries(), expected_version=0)
    if crash:
        os._exit(0)
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() == "more":
            version = await store.append(
                name, sample_entries("run_2"), expected_version=version
            )
            print(f"more {version}", flush=True)
        else:
            break
    await store.aclose()


def main(argv: list[str]) -> None:
    mode, path = argv
    if mode == "read":
        print(json.dumps(anyio.run(_read, path)))
    elif mode == "write":
        print(json.dumps(_write(path)))
    else:
        anyio.run(_keep, path, mode == "crash")


if __name__ == "__main__":
    main(sys.argv[1:])
