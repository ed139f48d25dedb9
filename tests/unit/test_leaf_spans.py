"""serve_app.runtime.leaf_spans against the SDK itself: a store call's span made whole at its end
must be the span the SDK's `Tracer.start_span` would have made (what exporters see), and must
follow the provider's sampler."""

from __future__ import annotations

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import SpanKind, Status, StatusCode

from serve_app.runtime.leaf_spans import LeafSpans

ATTRIBUTES = {"db.system": "redis", "db.operation.name": "uncovered"}


def _provider(sampler: Sampler | None = None) -> tuple[TracerProvider, InMemorySpanExporter, LeafSpans]:
    exporter = InMemorySpanExporter()
    processor = SimpleSpanProcessor(exporter)
    provider = TracerProvider(sampler=sampler) if sampler else TracerProvider()
    provider.add_span_processor(processor)
    return provider, exporter, LeafSpans(provider, [processor], "serve_app")


def _fields(span) -> dict:
    """What an exporter reads of a finished span, its ids and times aside."""
    out = {
        "name": span.name,
        "kind": span.kind,
        "trace_id": span.context.trace_id,
        "parent": span.parent.span_id,
        "flags": span.context.trace_flags,
        "attributes": dict(span.attributes),
        "dropped": (span.dropped_attributes, span.dropped_events, span.dropped_links),
        "resource": span.resource,
        "scope": span.instrumentation_scope,
        "status": (span.status.status_code, span.status.description),
        "events": [(e.name, sorted(e.attributes)) for e in span.events],
        "links": list(span.links),
    }
    return out


def test_a_leaf_is_the_span_the_sdk_would_have_made():
    provider, exporter, leaves = _provider()
    tracer = provider.get_tracer("serve_app")
    with tracer.start_as_current_span("memory.context") as parent:
        sdk = tracer.start_span("SessionLog.uncovered", kind=SpanKind.CLIENT, attributes=ATTRIBUTES)
        sdk.end()
        leaf = leaves.open("SessionLog.uncovered", leaves.frozen(ATTRIBUTES), parent.get_span_context())
        assert leaf is not None
        leaves.close(leaf)
    sdk_span, leaf_span, _ = exporter.get_finished_spans()
    assert _fields(leaf_span) == _fields(sdk_span)
    assert leaf_span.context.span_id not in (sdk_span.context.span_id, parent.get_span_context().span_id)
    assert leaf_span.start_time <= leaf_span.end_time
    # and the OTLP encoder takes both alike
    encoded = encode_spans([sdk_span, leaf_span])
    (scope_spans,) = encoded.resource_spans[0].scope_spans
    assert [s.name for s in scope_spans.spans] == ["SessionLog.uncovered"] * 2


def test_a_failed_call_is_an_error_with_the_exception_event_the_sdk_records():
    provider, exporter, leaves = _provider()
    tracer = provider.get_tracer("serve_app")
    error = ConnectionError("server closed the connection")
    with tracer.start_as_current_span("memory.append") as parent:
        sdk = tracer.start_span("Facts.put", kind=SpanKind.CLIENT, attributes=ATTRIBUTES)
        sdk.record_exception(error)
        sdk.set_status(Status(StatusCode.ERROR, f"ConnectionError: {error}"))
        sdk.end()
        leaf = leaves.open("Facts.put", leaves.frozen(ATTRIBUTES), parent.get_span_context())
        leaves.close(leaf, error)
    sdk_span, leaf_span, _ = exporter.get_finished_spans()
    assert _fields(leaf_span) == _fields(sdk_span)
    assert leaf_span.events[0].attributes["exception.type"] == "ConnectionError"
    assert leaf_span.events[0].attributes["exception.message"] == "server closed the connection"


class _DropsStores(Sampler):
    """Samples everything but spans named like store calls, and tags what it keeps."""

    def should_sample(self, parent_context, trace_id, name, kind=None, attributes=None, links=None, trace_state=None):
        if name.startswith("Store."):
            return SamplingResult(Decision.DROP)
        return SamplingResult(Decision.RECORD_AND_SAMPLE, {**(attributes or {}), "sampled.by": "test"})

    def get_description(self) -> str:
        return "DropsStores"


def test_the_providers_sampler_decides_and_may_add_attributes():
    provider, exporter, leaves = _provider(_DropsStores())
    with provider.get_tracer("serve_app").start_as_current_span("memory.context") as parent:
        assert leaves.open("Store.read", leaves.frozen(ATTRIBUTES), parent.get_span_context()) is None
        leaf = leaves.open("Facts.current", leaves.frozen(ATTRIBUTES), parent.get_span_context())
        leaves.close(leaf)
    names = [s.name for s in exporter.get_finished_spans()]
    assert names == ["Facts.current", "memory.context"]
    assert exporter.get_finished_spans()[0].attributes == {**ATTRIBUTES, "sampled.by": "test"}
