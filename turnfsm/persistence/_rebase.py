"""Where another run's commit lands under an open run (a pass while it is paused).

A run paused for a person (an approval) keeps its own buffers (the reply
whose calls wait, and the rest of what it said) out of the committed
history. A compaction of the session while it waits (`Driver.compact`)
commits only that history; when the paused run goes on, its brain takes the
history as that pass left it, at the first event fed after the pass. The log
says where: the commits of other runs between two of its events. Replay
does the same at the same events, so the run replays exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

from turnfsm.messages import MessageLog
from turnfsm.persistence._commits import _history_at
from turnfsm.persistence._records import Committed, Entry, EventRecorded

__all__ = ["rebase_points"]


def rebase_points(
    entries: Sequence[Entry], run_id: str, start: int, stop: int
) -> dict[int, MessageLog]:
    """The committed history run `run_id` takes before its event of each index.

    Only events that follow another run's commit are named; after the run's
    latest event, such a commit names the index of the next event (the one
    a resumed run is fed). The entries looked at are ``entries[start:stop]``:
    from the run's opening to its end (the end of the log for an open run).
    """
    points: dict[int, MessageLog] = {}
    foreign = False
    fed = 0
    for position in range(start, stop):
        entry = entries[position]
        if isinstance(entry, Committed) and entry.run_id != run_id:
            foreign = True
        elif isinstance(entry, EventRecorded) and entry.run_id == run_id:
            if foreign:
                points[entry.index] = _history_at(entries[:position])
                foreign = False
            fed = entry.index + 1
    if foreign:
        points[fed] = _history_at(entries[:stop])
    return points
