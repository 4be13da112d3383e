"""OTLP/JSON trace files: the SDK's spans through our exporter and back."""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode

from turnfsm.errors import ConfigError
from turnfsm.tracing._otlp_json import (
    OTLPJSONFileExporter,
    encode_spans,
    load_otlp_json,
    parse_otlp_json,
)
from turnfsm.tracing._traced import TracedTransition, traced_runs

RUN = {
    "turnfsm.run.id": "run_1",
    "turnfsm.machine.name": "turn",
    "turnfsm.machine.digest": "abcd",
    "gen_ai.conversation.id": "ses_1",
}
STEPS = [
    ("start", "call_llm", "measured", 6, [], None, 1200),
    ("call_llm", "run_tools", "model_replied", 7, ["has_tool_calls"], None, 1200),
    ("start", "compact", "measured", 3, ["is_over_emergency_line"], "emergency", 7860),
]


def transition(step: tuple[Any, ...]) -> dict[str, Any]:
    source, dest, trigger, index, guards, reason, estimate = step
    attributes = {
        "turnfsm.transition.from": source,
        "turnfsm.transition.to": dest,
        "turnfsm.transition.trigger": trigger,
        "turnfsm.transition.index": index,
        "turnfsm.transition.guards": guards,
        "turnfsm.estimate": estimate,
    }
    if reason is not None:
        attributes["turnfsm.transition.reason"] = reason
    return attributes


def expected(step: tuple[Any, ...]) -> tuple[Any, ...]:
    source, dest, trigger, index, guards, reason, estimate = step
    return (source, dest, trigger, index, tuple(guards), reason, estimate)


def seen(t: TracedTransition) -> tuple[Any, ...]:
    return (t.source, t.dest, t.trigger, t.index, t.guards, t.reason, t.estimate)


@pytest.fixture
def provider() -> Iterator[TracerProvider]:
    provider = TracerProvider(resource=Resource.create({"service.name": "agent"}))
    yield provider
    provider.shutdown()


def record_run(provider: TracerProvider, run: dict[str, Any]) -> None:
    """A run as the tracing hook records it: transitions on turn spans."""
    tracer = provider.get_tracer("turnfsm", "0.1")
    with tracer.start_as_current_span("invoke_agent demo", attributes=run):
        for number, step in enumerate(STEPS):
            with tracer.start_as_current_span(f"turn {number}") as turn:
                turn.add_event("turnfsm.transition", transition(step))


def test_spans_written_by_the_exporter_read_back_as_the_same_transitions(
    tmp_path: Path, provider: TracerProvider
) -> None:
    path = tmp_path / "trace.jsonl"
    exporter = OTLPJSONFileExporter(path)
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    record_run(provider, RUN)
    record_run(provider, {**RUN, "turnfsm.run.id": "run_2"})
    provider.force_flush()

    lines = path.read_text().splitlines()
    assert len(lines) == 8  # SimpleSpanProcessor: one export, one line, per span
    runs = traced_runs(load_otlp_json(path))
    assert [r.run_id for r in runs] == ["run_1", "run_2"]
    for run in runs:
        assert (run.session_id, run.machine, run.digest) == ("ses_1", "turn", "abcd")
        assert [seen(t) for t in run.transitions] == [expected(s) for s in STEPS]


def test_events_on_the_run_span_itself_count_and_a_lost_parent_is_kept_apart(
    provider: TracerProvider,
) -> None:
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("turnfsm")
    with tracer.start_as_current_span("invoke_agent a", attributes=RUN) as run:
        run.add_event("turnfsm.transition", transition(STEPS[1]), timestamp=20)
        run.add_event("turnfsm.transition", transition(STEPS[0]), timestamp=10)
        run.add_event("something else")
    with (
        tracer.start_as_current_span("invoke_agent b", attributes=RUN),
        tracer.start_as_current_span("turn") as turn,
    ):
        turn.add_event("turnfsm.transition", transition(STEPS[2]))
    spans = memory.get_finished_spans()
    text = json.dumps(encode_spans([s for s in spans if s.name != "invoke_agent b"]))

    first, lost = traced_runs(parse_otlp_json(text))

    assert [seen(t) for t in first.transitions] == [
        expected(STEPS[0]),
        expected(STEPS[1]),
    ]
    assert first.run_id == "run_1"
    assert (lost.run_id, lost.machine, lost.digest) == (None, None, None)
    assert lost.trace_id == f"{spans[-1].context.trace_id:032x}"
    assert [seen(t) for t in lost.transitions] == [expected(STEPS[2])]


def _hex_ids(value: Any) -> Any:
    """The protobuf JSON mapping's base64 ids, as OTLP/JSON's hex."""
    if isinstance(value, dict):
        ids = ("traceId", "spanId", "parentSpanId")
        return {
            k: base64.b64decode(v).hex() if k in ids else _hex_ids(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_hex_ids(v) for v in value]
    return value


def test_the_encoding_is_the_otlp_protobuf_json_mapping(
    provider: TracerProvider,
) -> None:
    encoder = pytest.importorskip(
        "opentelemetry.exporter.otlp.proto.common.trace_encoder"
    )
    json_format = pytest.importorskip("google.protobuf.json_format")
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("turnfsm", "0.1", schema_url="https://x/1.0")
    other = TracerProvider(resource=Resource.create({"k": 1}))
    other.add_span_processor(SimpleSpanProcessor(memory))
    values: dict[str, Any] = {
        "s": "x",
        "b": True,
        "i": -3,
        "f": 1.5,
        "nan": math.nan,
        "inf": -math.inf,
    }
    with tracer.start_as_current_span("root", kind=SpanKind.CLIENT) as root:
        root.set_attributes({**values, "a": [1, 2], "strs": ["a", "b"]})
        root.add_event("e", {"n": 1})
        root.set_status(Status(StatusCode.ERROR, "boom"))
        link = Link(root.get_span_context(), {"why": "retry"})
        with tracer.start_as_current_span("child", links=[link]) as child:
            child.add_event("")
    other.get_tracer("plain").start_span("alone").end()
    spans: list[ReadableSpan] = list(memory.get_finished_spans())
    # Built by hand: a remote parent, AnyValue attributes, no scope.
    remote = SpanContext(trace_id=1, span_id=2, is_remote=True)
    spans.append(
        ReadableSpan(
            "by hand",
            context=SpanContext(trace_id=1, span_id=3, is_remote=False),
            parent=remote,
            resource=Resource({"r": "1"}, schema_url="https://x/r"),
            attributes={"b": b"\x00\xff", "m": {"k": [1, "x"]}, "none": None},
            start_time=1,
            end_time=2,
        )
    )

    ours = encode_spans(spans)
    theirs = json_format.MessageToDict(
        encoder.encode_spans(spans), use_integers_for_enums=True
    )

    assert ours == _hex_ids(theirs)
    back = parse_otlp_json(json.dumps(ours))
    assert [s.name for s in back] == ["child", "root", "alone", "by hand"]
    assert back[3].attributes == {"b": b"\x00\xff", "m": {"k": (1, "x")}, "none": None}
    root_back = back[1]
    assert root_back.kind == 3  # SPAN_KIND_CLIENT
    assert (root_back.status_code, root_back.status_message) == (2, "boom")
    assert root_back.scope == "turnfsm"
    assert root_back.resource["service.name"] == "agent"
    assert back[0].parent_span_id == root_back.span_id
    attributes = dict(root_back.attributes)
    nan = attributes.pop("nan")
    assert isinstance(nan, float)
    assert math.isnan(nan)
    del values["nan"]
    assert attributes == {**values, "a": (1, 2), "strs": ("a", "b")}
    other.shutdown()


def test_the_reader_takes_what_other_writers_write() -> None:
    # Pretty-printed, snake_case names, numbers for int64, every AnyValue kind.
    document = {
        "resource_spans": [
            {
                "resource": {"attributes": [{"key": "r", "value": {"intValue": 7}}]},
                "scope_spans": [
                    {
                        "scope": {"name": "s"},
                        "spans": [
                            {
                                "trace_id": "AB" * 16,
                                "span_id": "CD" * 8,
                                "name": "x",
                                "start_time_unix_nano": 5,
                                "attributes": [
                                    {"key": "b", "value": {"bytesValue": "AAE="}},
                                    {"key": "d", "value": {"doubleValue": "Infinity"}},
                                    {"key": "e", "value": {}},
                                    {
                                        "key": "k",
                                        "value": {
                                            "kvlistValue": {
                                                "values": [
                                                    {
                                                        "key": "z",
                                                        "value": {"boolValue": False},
                                                    }
                                                ]
                                            }
                                        },
                                    },
                                    {"key": "a", "value": {"arrayValue": {}}},
                                ],
                            }
                        ],
                    }
                ],
            }
        ]
    }
    text = json.dumps(document, indent=2) + "\n\n" + json.dumps({"resourceSpans": []})

    (span,) = parse_otlp_json(text)

    assert (span.trace_id, span.span_id) == ("ab" * 16, "cd" * 8)
    assert span.parent_span_id is None
    assert (span.start_time_unix_nano, span.end_time_unix_nano) == (5, 0)
    assert span.resource == {"r": 7}
    assert span.attributes == {
        "b": b"\x00\x01",
        "d": math.inf,
        "e": None,
        "k": {"z": False},
        "a": (),
    }


SPAN = {"traceId": "a" * 32, "spanId": "b" * 16}


def one(span: dict[str, Any]) -> str:
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]})


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{\n  nope", "line 2"),
        ("[1]", "an ExportTraceServiceRequest object"),
        ('{"resourceSpans": {}}', "resourceSpans"),
        (one({**SPAN, "traceId": "xyz"}), r"spans\[0\]\.traceId"),
        (one({**SPAN, "spanId": "g" * 16}), "16 hex digits"),
        (one({**SPAN, "kind": "SERVER"}), "an integer"),
        (one({**SPAN, "kind": True}), "an integer"),
        (one({**SPAN, "status": []}), "status"),
        (one({**SPAN, "attributes": [{"value": {}}]}), r"attributes\[0\]\.key"),
        (one({**SPAN, "attributes": [{"key": "k", "value": 3}]}), "AnyValue"),
        (
            one({**SPAN, "attributes": [{"key": "k", "value": {"boolValue": "no"}}]}),
            "boolValue",
        ),
        (
            one({**SPAN, "attributes": [{"key": "k", "value": {"doubleValue": "x"}}]}),
            "doubleValue",
        ),
    ],
    ids=[
        "json",
        "not-an-object",
        "not-a-list",
        "trace-id",
        "span-id",
        "kind-name",
        "kind-bool",
        "status",
        "key",
        "any-value",
        "bool",
        "double",
    ],
)
def test_what_is_not_otlp_json_is_named(text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_otlp_json(text)


@pytest.mark.parametrize(
    ("drop", "value", "match"),
    [
        ("turnfsm.transition.from", None, "turnfsm.transition.from"),
        ("turnfsm.transition.index", {"stringValue": "3"}, "an integer"),
        ("turnfsm.transition.guards", {"stringValue": "g"}, "a string array"),
        (
            "turnfsm.transition.guards",
            {"arrayValue": {"values": [{"intValue": "1"}]}},
            "a string array",
        ),
    ],
    ids=["from-missing", "index-string", "guards-string", "guards-ints"],
)
def test_a_transition_event_without_what_it_must_carry_is_named(
    drop: str, value: dict[str, Any] | None, match: str
) -> None:
    attributes = [
        {"key": k, "value": {"stringValue": v}}
        for k, v in (
            ("turnfsm.transition.from", "start"),
            ("turnfsm.transition.to", "call_llm"),
            ("turnfsm.transition.trigger", "measured"),
        )
    ] + [{"key": "turnfsm.transition.index", "value": {"intValue": "6"}}]
    attributes = [a for a in attributes if a["key"] != drop]
    if value is not None:
        attributes.append({"key": drop, "value": value})
    event = {"name": "turnfsm.transition", "attributes": attributes}
    spans = parse_otlp_json(one({**SPAN, "events": [event]}))

    with pytest.raises(ConfigError, match=match):
        traced_runs(spans)


def test_guards_may_be_left_out_and_an_odd_estimate_is_unknown() -> None:
    attributes = [
        {"key": "turnfsm.transition.from", "value": {"stringValue": "start"}},
        {"key": "turnfsm.transition.to", "value": {"stringValue": "call_llm"}},
        {"key": "turnfsm.transition.trigger", "value": {"stringValue": "measured"}},
        {"key": "turnfsm.transition.index", "value": {"intValue": "6"}},
        {"key": "turnfsm.estimate", "value": {"stringValue": "lots"}},
    ]
    event = {"name": "turnfsm.transition", "attributes": attributes}

    (run,) = traced_runs(parse_otlp_json(one({**SPAN, "events": [event]})))

    assert [seen(t) for t in run.transitions] == [
        ("start", "call_llm", "measured", 6, (), None, None)
    ]


def test_the_exporter_appends_and_stops_after_shutdown(
    tmp_path: Path, provider: TracerProvider
) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text(one(SPAN) + "\n")
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    provider.get_tracer("t").start_span("s").end()
    exporter = OTLPJSONFileExporter(path)

    assert exporter.export(memory.get_finished_spans()) is SpanExportResult.SUCCESS
    assert exporter.force_flush()
    exporter.shutdown()
    exporter.shutdown()

    assert exporter.export(memory.get_finished_spans()) is SpanExportResult.FAILURE
    assert [s.name for s in load_otlp_json(path)] == ["", "s"]


def test_the_exporter_reports_a_file_it_cannot_write(
    tmp_path: Path, provider: TracerProvider, caplog: pytest.LogCaptureFixture
) -> None:
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    provider.get_tracer("t").start_span("s").end()
    path = tmp_path / "gone" / "trace.jsonl"
    path.parent.mkdir()
    exporter = OTLPJSONFileExporter(path)
    path.parent.rmdir()  # after it was made: a missing one is refused then

    assert exporter.export(memory.get_finished_spans()) is SpanExportResult.FAILURE
    assert exporter.export(memory.get_finished_spans()) is SpanExportResult.FAILURE
    errors = [r for r in caplog.records if r.name == "turnfsm.tracing"]
    assert len(errors) == 1, "said once, not on each batch"
    assert f"spans cannot be written to {path}" in errors[0].getMessage()
    exporter.shutdown()


@pytest.mark.parametrize(
    ("path", "shown"),
    [("/nonexistent/dir/x.json", "/nonexistent/dir/x.json"), ("", ""), (5, "5")],
    ids=["missing directory", "empty", "not a path"],
)
def test_the_exporter_refuses_a_file_it_could_never_write(
    path: Any, shown: str
) -> None:
    # Was taken, and each export failed; `configure(file=...)` refused it.
    with pytest.raises(ConfigError) as caught:
        OTLPJSONFileExporter(path)
    assert caught.value.field == "path"
    assert str(caught.value.value) == shown


def test_the_exporter_refuses_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="a file, in a directory that exists"):
        OTLPJSONFileExporter(tmp_path)


@pytest.mark.parametrize(
    ("read", "given", "field", "said"),
    [
        (load_otlp_json, None, "path", "a path"),
        (parse_otlp_json, None, "text", "a str"),
        (parse_otlp_json, b"{}", "text", "decode it first"),
        (traced_runs, None, "spans", "a sequence of ExportedSpan"),
        (traced_runs, "spans", "spans", "a sequence of ExportedSpan"),
        (traced_runs, [5], "spans[0]", "an ExportedSpan"),
    ],
    ids=["no path", "no text", "bytes", "no spans", "a string of spans", "not a span"],
)
def test_readers_refuse_what_they_cannot_read(
    read: Any, given: Any, field: str, said: str
) -> None:
    # Were a TypeError or an AttributeError.
    with pytest.raises(ConfigError, match=said) as caught:
        read(given)
    assert caught.value.field == field


def test_a_missing_trace_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    with pytest.raises(FileNotFoundError) as caught:
        load_otlp_json(path)
    assert caught.value.filename == str(path)
