"""Client spans of store calls, made as the finished spans that span processors receive.

A context request makes several, and the SDK's `Tracer.start_span` path (a mutable `Span` with
its lock, a copy of the attributes, the start hooks, and a second copy as a `ReadableSpan` at its
end) would be the larger part of what tracing costs a request. A store call's span is a leaf: nothing
is added to it while it is open, nothing is ever its child, it is never made current. So it is
made once, at its end, as the `ReadableSpan` that `Span.end` would have handed the processors,
with the same sampler decision, ids, resource and scope, and with attributes frozen once per store
method. Only `on_end` of the processors this service installed is called: they are the SDK's batch
and simple processors, whose `on_start` does nothing.
"""

from __future__ import annotations

import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from time import time_ns
from typing import Any

# OpenTelemetry's types, named without importing it: it comes with the `otel` extra, imported once
# tracing is configured, and every module of the service must import without it.
BoundedAttributes = Any
SpanContext = Any
SpanProcessor = Any
TracerProvider = Any


@dataclass(slots=True)
class OpenLeaf:
    """A leaf span between the start of its call and its end: what the finished span needs."""

    name: str
    context: SpanContext
    parent: SpanContext
    attributes: BoundedAttributes
    start_time: int


class LeafSpans:
    """Makes finished client spans for calls that have no children, under the current span."""

    def __init__(self, provider: TracerProvider, processors: Sequence[SpanProcessor], scope: str) -> None:
        from opentelemetry import trace
        from opentelemetry.attributes import BoundedAttributes
        from opentelemetry.sdk.trace import Event, ReadableSpan
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        self._sampler = provider.sampler
        self._ids = provider.id_generator
        self._resource = provider.resource
        self._processors = tuple(processors)
        self._scope = InstrumentationScope(scope, "")  # as `TracerProvider.get_tracer(scope)` names it
        self._bounded, self._event, self._readable, self._trace = BoundedAttributes, Event, ReadableSpan, trace
        self._unset = trace.Status(trace.StatusCode.UNSET)
        # W3C level 2's random-trace-id flag: SDKs older than it have none (the `otel` extra takes 1.30 on)
        self._random_flag = getattr(trace.TraceFlags, "RANDOM_TRACE_ID", 0)

    def frozen(self, attributes: Mapping[str, Any]) -> BoundedAttributes:
        """Attributes validated once and shared by every span of one call site."""
        return self._bounded(attributes=attributes, immutable=True)

    def open(self, name: str, attributes: BoundedAttributes, parent: SpanContext) -> OpenLeaf | None:
        """A span for a call starting now under `parent` (the current, recording span); None when the
        sampler drops it."""
        trace = self._trace
        result = self._sampler.should_sample(None, parent.trace_id, name, trace.SpanKind.CLIENT, attributes, ())
        if not result.decision.is_recording():
            return None
        if len(result.attributes) != len(attributes):  # the sampler added attributes of its own
            attributes = self.frozen({**attributes, **result.attributes})
        flags = trace.TraceFlags.SAMPLED if result.decision.is_sampled() else trace.TraceFlags.DEFAULT
        flags |= parent.trace_flags & self._random_flag  # the parent's trace id, so its flag
        span_id, flags, state = self._ids.generate_span_id(), trace.TraceFlags(flags), result.trace_state
        context = trace.SpanContext(parent.trace_id, span_id, is_remote=False, trace_flags=flags, trace_state=state)
        return OpenLeaf(name, context, parent, attributes, time_ns())

    def close(self, leaf: OpenLeaf, error: BaseException | None = None) -> None:
        """End the span now and hand it to the processors; an error is its status and an
        `exception` event, as the SDK's `record_exception` writes one."""
        end_time = time_ns()
        events: tuple[Any, ...] = ()
        status = self._unset
        if error is not None:
            events = (self._event("exception", _exception_attributes(error), end_time),)
            status = self._trace.Status(self._trace.StatusCode.ERROR, f"{type(error).__name__}: {error}")
        span = self._readable(
            leaf.name,
            leaf.context,
            leaf.parent,
            self._resource,
            leaf.attributes,
            events,
            kind=self._trace.SpanKind.CLIENT,
            status=status,
            start_time=leaf.start_time,
            end_time=end_time,
            instrumentation_scope=self._scope,
        )
        for processor in self._processors:
            processor.on_end(span)


def _exception_attributes(error: BaseException) -> dict[str, str]:
    module, qualname = type(error).__module__, type(error).__qualname__
    return {
        "exception.type": f"{module}.{qualname}" if module and module != "builtins" else qualname,
        "exception.message": str(error),
        "exception.stacktrace": "".join(traceback.format_exception(error)),
        "exception.escaped": "False",
    }
