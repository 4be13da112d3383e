"""Arize Phoenix as a real OTLP receiver: start it, export to it, query it back.

Phoenix runs from its own venv (`scripts/phoenix install`), inside a private
network namespace, reachable only on 127.0.0.1 (see `scripts/phoenix`). Tests
use the session fixture `phoenix` (tests/integration/conftest.py), which
yields a `Phoenix`; export with the OpenTelemetry SDK to
`Phoenix.otlp_http_endpoint` (http/protobuf) or `Phoenix.otlp_grpc_endpoint`
(gRPC, `insecure=True`), flush, then read the spans back with `spans()`:

    project = unique_project("demo")
    provider = TracerProvider(resource=Resource.create({PROJECT_ATTRIBUTE: project}))
    provider.add_span_processor(
        BatchSpanProcessor(OTLPSpanExporter(endpoint=phoenix.otlp_http_endpoint))
    )
    ...  # make spans
    provider.force_flush()
    tree = spans(phoenix, project, min_count=2)

Phoenix groups spans into projects by the resource attribute
`openinference.project.name` (`PROJECT_ATTRIBUTE`; spans without it land in
the project "default"); give each test its own project with `unique_project`,
as one Phoenix serves the whole test session.

What Phoenix keeps of a span, and so what `spans()` can give back:

- `kind` is Phoenix's OpenInference span kind (`"LLM"`, `"TOOL"`, `"AGENT"`,
  ..., `"UNKNOWN"`), taken from the span's `openinference.span.kind`
  attribute or derived from its `gen_ai.*` ones: seen with Phoenix 20.26,
  `gen_ai.operation.name` `invoke_agent` gives `"AGENT"`, `execute_tool`
  `"TOOL"`, and `chat` with `gen_ai.request.model` `"LLM"`; other spans are
  `"UNKNOWN"`. The OpenTelemetry SpanKind (INTERNAL, CLIENT...) is not
  stored: assert it on the SDK side (the in-memory exporter).
- `attributes` are the span's own (lists stay lists), plus those Phoenix
  derives from `gen_ai.*` (`llm.model_name`, `llm.token_count.prompt`,
  `tool.name`...): assert a subset. Resource attributes (`service.name`) are
  not returned.

Skipped when Phoenix is not installed, unless TURNFSM_REQUIRE_PHOENIX=1 (CI
sets it): then the tests fail instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest

from tests.helpers import REPO_ROOT

__all__ = [
    "PHOENIX_SCRIPT",
    "PROJECT_ATTRIBUTE",
    "Phoenix",
    "by_name",
    "phoenix_unavailable",
    "phoenix_version",
    "require_phoenix",
    "running_phoenix",
    "spans",
    "start_phoenix",
    "stop_phoenix",
    "unique_project",
]

PHOENIX_SCRIPT = REPO_ROOT / "scripts" / "phoenix"
"""The script that installs, starts and stops Phoenix."""

PROJECT_ATTRIBUTE = "openinference.project.name"
"""The resource attribute that names the Phoenix project a span belongs to."""

START_TIMEOUT = 150.0
"""Seconds to wait for `scripts/phoenix start`: ~15 s, over 30 s on a busy machine
(the script itself gives up after 120 s)."""


@dataclass(frozen=True)
class Phoenix:
    """A running Phoenix: where to export spans and where to read them back."""

    directory: Path
    """Holds Phoenix's SQLite database, its log (phoenix.log) and pid files."""
    url: str
    """The UI and the REST API, ``http://127.0.0.1:PORT``."""
    otlp_http_endpoint: str
    """The OTLP/HTTP traces endpoint (the full URL, ending in ``/v1/traces``)."""
    otlp_grpc_endpoint: str
    """The OTLP/gRPC endpoint, ``http://127.0.0.1:PORT`` (plaintext)."""
    version: str
    """The Phoenix release, e.g. ``20.26.1``."""
    pid: int
    """The supervisor process (scripts/phoenix-netns.py, in Phoenix's network
    namespace); Phoenix is its child."""


def phoenix_unavailable(reason: str) -> NoReturn:
    """Skip the test, or fail it when TURNFSM_REQUIRE_PHOENIX=1."""
    if os.environ.get("TURNFSM_REQUIRE_PHOENIX") == "1":
        pytest.fail(f"Phoenix is required (TURNFSM_REQUIRE_PHOENIX=1): {reason}")
    pytest.skip(f"no Phoenix: {reason}")


def _script(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(PHOENIX_SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, "TURNFSM_PHOENIX_OWNER_PID": str(os.getpid())},
    )


def phoenix_version() -> str | None:
    """Return the installed Phoenix version, or None when it is not installed."""
    done = _script("version")
    return done.stdout.strip() if done.returncode == 0 else None


def require_phoenix() -> str:
    """Return the installed Phoenix version; skip (or fail) when there is none."""
    version = phoenix_version()
    if version is None:
        phoenix_unavailable("not installed (run: scripts/phoenix install)")
    return version


def start_phoenix(directory: Path) -> Phoenix:
    """Start Phoenix with its database in `directory`; return when it answers.

    Phoenix stops with `stop_phoenix`, or by itself once this process is gone.

    Raises:
        RuntimeError: when `scripts/phoenix start` fails (its output attached).
    """
    version = require_phoenix()
    done = _script("start", str(directory), timeout=START_TIMEOUT)
    if done.returncode != 0:
        raise RuntimeError(f"scripts/phoenix start failed:\n{done.stderr}")
    found = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    return Phoenix(
        directory=directory,
        url=found["PHOENIX_URL"],
        otlp_http_endpoint=found["PHOENIX_OTLP_HTTP_ENDPOINT"],
        otlp_grpc_endpoint=found["PHOENIX_OTLP_GRPC_ENDPOINT"],
        version=version,
        pid=int((directory / "phoenix.pid").read_text()),
    )


def stop_phoenix(phoenix: Phoenix) -> None:
    """Stop `phoenix` (its directory is left in place)."""
    _script("stop", str(phoenix.directory))


@contextmanager
def running_phoenix(directory: Path) -> Iterator[Phoenix]:
    """Run Phoenix for the duration of a `with` block."""
    phoenix = start_phoenix(directory)
    try:
        yield phoenix
    finally:
        stop_phoenix(phoenix)


def unique_project(prefix: str = "test") -> str:
    """Return a fresh project name (``prefix-<12 hex>``), for one test's spans."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def spans(
    phoenix: Phoenix,
    project: str,
    *,
    trace_id: str | None = None,
    min_count: int = 1,
    timeout: float = 10.0,
) -> list[dict[str, Any]]:
    """Return the spans of `project` (of one trace, if given), oldest first.

    Phoenix stores spans a few hundred milliseconds after the exporter has
    flushed, so this polls until at least `min_count` spans are there.

    Each span is a dict with the keys ``name``, ``span_id``, ``parent_id``
    (None for a root), ``trace_id`` (hex, as OTLP has them), ``kind`` (the
    OpenInference kind, see the module docstring), ``attributes`` (flat, dotted
    keys), ``events`` (a list of ``{"name", "attributes", "timestamp"}``),
    ``status`` (``{"code": "UNSET" | "OK" | "ERROR", "message": str}``),
    ``start_time`` and ``end_time`` (ISO 8601 strings).

    Raises:
        AssertionError: when fewer than `min_count` spans arrive in `timeout`
            seconds (the message lists those that did).
    """
    deadline = time.monotonic() + timeout
    while True:
        found = [_span(raw) for raw in _query(phoenix, project, trace_id)]
        if len(found) >= min_count:
            return found
        if time.monotonic() > deadline:
            names = [span["name"] for span in found]
            raise AssertionError(
                f"{len(found)} span(s) in Phoenix project {project!r} after "
                f"{timeout} s, expected at least {min_count}: {names}"
            )
        time.sleep(0.05)


def by_name(found: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Index spans by name (the names must be unique)."""
    index = {span["name"]: span for span in found}
    assert len(index) == len(found), [span["name"] for span in found]
    return index


def _query(
    phoenix: Phoenix, project: str, trace_id: str | None
) -> list[dict[str, Any]]:
    # GET /v1/projects/{project}/spans: Phoenix's own span shape (parent_id,
    # span_kind, events); the .../spans/otlpv1 variant drops the kind.
    params: dict[str, str] = {"sort": "start_time", "order": "asc", "limit": "1000"}
    if trace_id is not None:
        params["trace_id"] = trace_id
    path = f"{phoenix.url}/v1/projects/{urllib.parse.quote(project, safe='')}/spans"
    out: list[dict[str, Any]] = []
    while True:
        url = f"{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                page = json.load(response)
        except urllib.error.HTTPError as error:
            if error.code == 404:  # the project appears with its first span
                return []
            raise
        out.extend(page["data"])
        if not page.get("next_cursor"):
            return out
        params["cursor"] = page["next_cursor"]


def _span(raw: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "name": raw["name"],
        "span_id": raw["context"]["span_id"],
        "parent_id": raw["parent_id"],
        "trace_id": raw["context"]["trace_id"],
        "kind": raw["span_kind"],
        "attributes": raw["attributes"],
        "events": raw["events"],
        "status": {"code": raw["status_code"], "message": raw["status_message"]},
        "start_time": raw["start_time"],
        "end_time": raw["end_time"],
    }
