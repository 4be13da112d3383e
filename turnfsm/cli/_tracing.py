"""Tracing for the commands that run an agent: on when an OTLP endpoint is set."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from turnfsm.cli._errors import check_writable, explain
from turnfsm.errors import ConfigError

__all__ = ["traced", "wants_tracing"]

_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def wants_tracing(*, force: bool, file: str | None) -> bool:
    """Whether the command exports spans: asked for, or an endpoint is set."""
    return force or file is not None or any(os.environ.get(v) for v in _ENDPOINTS)


@contextmanager
def traced(
    *, force: bool, file: str | None, quiet: bool, command: str
) -> Iterator[None]:
    """Export the runs' spans while the block runs; flush them (bounded) after.

    OTLP goes to the environment's endpoint (``OTEL_EXPORTER_OTLP_*``; the
    local default with `force`); `file` also writes OTLP/JSON lines. A
    receiver that is down costs a warning and at most a few seconds at exit.
    """
    if not wants_tracing(force=force, file=file):
        yield
        return
    from turnfsm import tracing

    # One line per failed batch, not the exporter's retry chatter; nor a
    # line for every value cut to the attribute limit (as the docs say).
    logging.getLogger("opentelemetry.exporter").setLevel(logging.ERROR)
    logging.getLogger("opentelemetry.attributes").setLevel(logging.ERROR)
    logging.getLogger("turnfsm.tracing").setLevel(logging.ERROR)  # said below
    try:
        if file is not None:  # refused now, not lost silently after the run
            check_writable("--trace-file", file)
        # --trace: OTLP whatever the environment says; else its own choice
        # (an endpoint set, OTEL_TRACES_EXPORTER).
        setup = tracing.configure(file=file, otlp=True if force else None)
    except (ConfigError, ImportError, OSError) as exc:
        print(f"turnfsm {command}: tracing: {explain(exc)}", file=sys.stderr)
        raise SystemExit(2) from None
    try:
        yield
    finally:
        delivered = setup.shutdown(timeout=_flush_seconds())
        where = [w for w in (setup.endpoint, file) if w]
        if not delivered:
            print(
                f"turnfsm {command}: traces not delivered to {setup.endpoint} "
                "(is the receiver running?)",
                file=sys.stderr,
            )
        elif setup.undelivered:
            print(
                f"turnfsm {command}: traces not delivered to {setup.endpoint}: "
                f"it refused {setup.undelivered} batch(es) of spans (is it an "
                f"OTLP receiver taking {setup.protocol}?)",
                file=sys.stderr,
            )
        elif where and not quiet:
            print(f"traces exported to {', '.join(where)}", file=sys.stderr)
        logging.getLogger("turnfsm.tracing").setLevel(logging.NOTSET)


def _flush_seconds() -> float:
    try:
        return max(0.5, min(float(os.environ.get("OTEL_EXPORTER_OTLP_TIMEOUT", 3)), 10))
    except ValueError:
        return 3.0
