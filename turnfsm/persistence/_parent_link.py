"""`ParentLink`: where a sub-agent's run came from, as its log keeps it."""

from __future__ import annotations

from typing import final

import attrs

from turnfsm import _checks

__all__ = ["ParentLink"]


@final
@attrs.frozen(kw_only=True)
class ParentLink:
    """Where a child session's run came from: the parent's run and tool call.

    A sub-agent's run (see `Agent.as_tool`) opens in a session of its own,
    in its parent's store; its `RunOpened` carries this link back.

    Attributes:
        session_id: The parent's session.
        run_id: The parent's run that delegated.
        call_id: The parent's tool call whose result is the child's answer.
        depth: How deep the child is (1: a child of a top-level run).
    """

    session_id: str = attrs.field(validator=_checks.string(non_empty=True))
    run_id: str = attrs.field(validator=_checks.string(non_empty=True))
    call_id: str = attrs.field(validator=_checks.string(non_empty=True))
    depth: int = attrs.field(
        default=1, validator=_checks.integer(low=1, high=_checks.MAX_COUNT)
    )
