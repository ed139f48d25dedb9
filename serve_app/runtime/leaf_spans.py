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

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

_UNSET = Status(StatusCode.UNSET)


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
        self._sampler = provider.sampler
        self._ids = provider.id_generator
        self._resource = provider.resource
        self._processors = tuple(processors)
        self._scope = InstrumentationScope(scope, "")  # as `TracerProvider.get_tracer(scope)` names it

    @staticmethod
    def frozen(attributes: Mapping[str, Any]) -> BoundedAttributes:
        """Attributes validated once and shared by every span of one call site."""
        return BoundedAttributes(attributes=attributes, immutable=True)

    def open(self, name: str, attributes: BoundedAttributes, parent: SpanContext) -> OpenLeaf | None:
        """A span for a call starting now under `parent` (the current, recording span); None when the
        sampler drops it."""
        result = self._sampler.should_sample(None, parent.trace_id, name, SpanKind.CLIENT, attributes, ())
        if not result.decision.is_recording():
            return None
        if len(result.attributes) != len(attributes):  # the sampler added attributes of its own
            attributes = self.frozen({**attributes, **result.attributes})
        flags = TraceFlags.SAMPLED if result.decision.is_sampled() else TraceFlags.DEFAULT
        if parent.trace_flags.random_trace_id:
            flags |= TraceFlags.RANDOM_TRACE_ID
        span_id, state = self._ids.generate_span_id(), result.trace_state
        context = SpanContext(parent.trace_id, span_id, is_remote=False, trace_flags=TraceFlags(flags), trace_state=state)
        return OpenLeaf(name, context, parent, attributes, time_ns())

    def close(self, leaf: OpenLeaf, error: BaseException | None = None) -> None:
        """End the span now and hand it to the processors; an error is its status and an
        `exception` event, as the SDK's `record_exception` writes one."""
        end_time = time_ns()
        events: tuple[Event, ...] = ()
        status = _UNSET
        if error is not None:
            events = (Event("exception", _exception_attributes(error), end_time),)
            status = Status(StatusCode.ERROR, f"{type(error).__name__}: {error}")
        span = ReadableSpan(
            leaf.name,
            leaf.context,
            leaf.parent,
            self._resource,
            leaf.attributes,
            events,
            kind=SpanKind.CLIENT,
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
