"""The turnfsm runs in a trace, and the transitions each one fired.

The tracing hook records each fired transition as a ``turnfsm.transition``
span event on the run's turn span (or its run span), and each run as an
``invoke_agent {agent}`` span carrying the run's id, session and machine.
`traced_runs` reads them back from the spans of an OTLP/JSON file
(`load_otlp_json`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final, final

import attrs

from turnfsm import _checks
from turnfsm.errors import ConfigError
from turnfsm.tracing._otlp_json import (
    AttributeValue,
    ExportedSpan,
    SpanEvent,
)

__all__ = ["TRANSITION_EVENT", "TracedRun", "TracedTransition", "traced_runs"]

TRANSITION_EVENT: Final = "turnfsm.transition"
"""The name of the span event that records one fired transition."""

_RUN_ID: Final = "turnfsm.run.id"


@final
@attrs.frozen(kw_only=True)
class TracedTransition:
    """One ``turnfsm.transition`` span event: a transition a run fired."""

    source: str
    dest: str
    trigger: str
    index: int
    guards: tuple[str, ...] = ()
    reason: str | None = None
    estimate: int | None = None
    time_unix_nano: int = 0


@final
@attrs.frozen(kw_only=True)
class TracedRun:
    """A run found in a trace: its root span's ids and machine, and its path.

    A transition whose span has no run span above it in the file goes to a
    run of its trace with every field but `trace_id` unknown (None).
    """

    trace_id: str
    run_id: str | None
    session_id: str | None
    machine: str | None
    digest: str | None
    transitions: tuple[TracedTransition, ...]


def _text(attributes: Mapping[str, AttributeValue], key: str) -> str | None:
    value = attributes.get(key)
    return value if isinstance(value, str) else None


def _required(event: SpanEvent, key: str, where: str) -> AttributeValue:
    # Only the guards may be left out: a transition without guards passed none.
    value = event.attributes.get(
        f"turnfsm.transition.{key}", () if key == "guards" else None
    )
    expected = {"index": int, "guards": tuple}.get(key, str)
    if type(value) is not expected or (
        isinstance(value, tuple) and not all(isinstance(g, str) for g in value)
    ):
        what = {int: "an integer", tuple: "a string array"}.get(expected, "a string")
        raise ConfigError(f"{where} turnfsm.transition.{key}", value, what)
    return value


def _transition(span: ExportedSpan, event: SpanEvent) -> TracedTransition:
    where = f"span {span.span_id}: {TRANSITION_EVENT}"
    source, dest, trigger, index, guards = (
        _required(event, key, where)
        for key in ("from", "to", "trigger", "index", "guards")
    )
    estimate = event.attributes.get("turnfsm.estimate")
    assert isinstance(index, int)
    assert isinstance(guards, tuple)
    return TracedTransition(
        source=str(source),
        dest=str(dest),
        trigger=str(trigger),
        index=index,
        guards=tuple(str(g) for g in guards),
        reason=_text(event.attributes, "turnfsm.transition.reason"),
        estimate=estimate if type(estimate) is int else None,
        time_unix_nano=event.time_unix_nano,
    )


_SPAN: Final = "ExportedSpan values (what load_otlp_json returns)"
_SPANS: Final = _checks.each(
    ExportedSpan, "an ExportedSpan (what load_otlp_json returns)"
)


def traced_runs(spans: Sequence[ExportedSpan]) -> tuple[TracedRun, ...]:
    """Return the runs whose transitions `spans` recorded, in order of appearance.

    A run is the span with a ``turnfsm.run.id`` attribute (the
    ``invoke_agent`` span) nearest above the span that carries the
    ``turnfsm.transition`` event, or that span itself. Each run's
    transitions are sorted by time.

    Raises:
        ConfigError: `spans` is not a sequence of `ExportedSpan` values, or
            a transition event lacks an attribute it must carry.
    """
    spans = _checks.as_tuple(spans, "spans", _SPAN)
    _checks.check(spans, "spans", _SPANS)
    by_id = {(s.trace_id, s.span_id): s for s in spans}
    found: dict[tuple[str, str | None], list[TracedTransition]] = {}
    roots: dict[tuple[str, str | None], ExportedSpan] = {}
    for span in spans:
        for event in span.events:
            if event.name != TRANSITION_EVENT:
                continue
            root: ExportedSpan | None = span
            while root is not None and _RUN_ID not in root.attributes:
                parent = root.parent_span_id
                root = by_id.get((span.trace_id, parent)) if parent else None
            key = (span.trace_id, root.span_id if root is not None else None)
            if root is not None:
                roots[key] = root
            found.setdefault(key, []).append(_transition(span, event))
    runs = []
    for key, transitions in found.items():
        a = roots[key].attributes if key in roots else {}
        runs.append(
            TracedRun(
                trace_id=key[0],
                run_id=_text(a, _RUN_ID),
                session_id=_text(a, "gen_ai.conversation.id"),
                machine=_text(a, "turnfsm.machine.name"),
                digest=_text(a, "turnfsm.machine.digest"),
                transitions=tuple(sorted(transitions, key=lambda t: t.time_unix_nano)),
            )
        )
    return tuple(runs)
