"""``turnfsm sessions show``'s sub-agent lines: who delegated, and the children."""

from __future__ import annotations

from typing import TextIO

from turnfsm.cli._errors import terminal_text
from turnfsm.persistence import Session, SessionStore, child_sessions, parent_of
from turnfsm.values import Usage

__all__ = ["show_links"]


async def show_links(session: Session, store: SessionStore, out: TextIO) -> None:
    """Print the call that delegated `session`'s run, and its children's tree.

    Each child is indented under its parent, with its run's outcome, turns
    and usage, and the call it answered.
    """
    link = parent_of(session)
    if link is not None:
        print(
            f"\ndelegated by: session {terminal_text(link.session_id)} run "
            f"{terminal_text(link.run_id)} "
            f"call {terminal_text(link.call_id)} (depth {link.depth})",
            file=out,
        )
    lines: list[str] = []
    await _tree(store, session.id, 1, {session.id}, lines)
    if not lines:
        return
    print(f"\nsub-agent sessions ({len(lines)}):", file=out)
    for line in lines:
        print(line, file=out)


async def _tree(
    store: SessionStore, session_id: str, level: int, seen: set[str], lines: list[str]
) -> None:
    for child in await child_sessions(store, session_id):
        if child.id in seen:  # a damaged store's loop: shown once
            continue
        seen.add(child.id)
        link = parent_of(child)
        run = child.runs[0]
        usage = sum((r.usage for r in child.runs), start=Usage())
        turns = sum(len(r.turns) for r in child.runs)
        said = (
            f"usage {usage.describe()}"
            if not turns or any(r.reported_calls for r in child.runs)
            else "usage not reported"
        )
        call = terminal_text(link.call_id) if link else "?"  # the model's id
        lines.append(
            f"{'  ' * level}{terminal_text(child.id)}  {run.outcome}  "
            f"{turns} turn(s)  {said}  for call {call}"
        )
        await _tree(store, child.id, level + 1, seen, lines)
