"""OpenTelemetry tracing of one process: off unless `Settings.tracing`, then spans go where the
standard `OTEL_*` variables say (OTLP by default), or to JSON-lines files (`tracing_spans_dir`).

Off, nothing of OpenTelemetry is imported and a traced call costs one test of a module global: the
packages come with the `otel` extra, and a deployment without them must run as before. Context
crosses Serve deployment calls as an explicit W3C carrier (`carrier()` on the caller, `span(...,
parent=carrier)` on the callee): Ray's own tracing hook wraps every actor method, Serve's included,
and would make the spans Ray's, not the request's.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from serve_app.settings import Settings

# OpenTelemetry's types, named without importing it (the `otel` extra may be absent).
Link = Any
Tracer = Any
SpanExporter = Any

TRACER_NAME = "serve_app"
SERVICE_NAME = "memserve"
LOGGER_NAME = "ray.serve"  # the logger Serve writes its structured (JSON) replica logs from

Carrier = dict[str, str]
"""W3C trace context (`traceparent`, `tracestate`) as handle calls and HTTP headers carry it."""
Kind = Literal["internal", "server", "client", "consumer"]


class TracingConfigError(ValueError):
    """Tracing is on but cannot be set up as configured (an exporter that is not installed, say)."""


class _NoSpan:
    """What `span` yields when tracing is off: every method of a span, doing nothing."""

    def is_recording(self) -> bool:
        return False

    def set_attribute(self, key: str, value: Any) -> None:
        pass

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        pass

    def add_event(self, name: str, attributes: Mapping[str, Any] | None = None) -> None:
        pass

    def update_name(self, name: str) -> None:
        pass

    def set_status(self, status: Any, description: str | None = None) -> None:
        pass

    def record_exception(self, exception: BaseException) -> None:
        pass


NO_SPAN = _NoSpan()
_OFF = nullcontext(NO_SPAN)


class _State:
    tracer: Tracer | None = None
    provider: Any = None
    leaves: Any = None  # leaf_spans.LeafSpans: store calls' spans
    log_filter: logging.Filter | None = None
    # OpenTelemetry's, looked up once at configure: they are on every traced call's path.
    kinds: dict[str, Any] = {}
    current_span: Callable[[], Any] = staticmethod(lambda: NO_SPAN)


_state = _State()
_in_store: contextvars.ContextVar[bool] = contextvars.ContextVar("memserve_in_store_span", default=False)


def enabled() -> bool:
    return _state.tracer is not None


def provider() -> Any:
    """This process's tracer provider (None when off), for libraries that make spans of their own."""
    return _state.provider


def _kinds() -> dict[str, Any]:
    from opentelemetry.trace import SpanKind

    return {"internal": SpanKind.INTERNAL, "server": SpanKind.SERVER, "client": SpanKind.CLIENT, "consumer": SpanKind.CONSUMER}


def span(
    name: str,
    *,
    kind: Kind = "internal",
    attributes: Mapping[str, Any] | None = None,
    parent: Mapping[str, str] | None = None,
    root: bool = False,
    links: Sequence[Link] = (),
) -> AbstractContextManager[Any]:
    """A span made current for the block. `parent`: a carrier from another process (the caller's
    context; without one the current context is the parent); `root`: start a trace of its own,
    whatever is current (work that outlives the request that asked for it, which `links` name)."""
    tracer = _state.tracer
    if tracer is None:
        return _OFF
    context = None
    if root:
        from opentelemetry.context import Context

        context = Context()
    elif parent:
        from opentelemetry import propagate

        context = propagate.extract(parent)
    return tracer.start_as_current_span(name, context=context, kind=_state.kinds[kind], attributes=attributes, links=links)


def carrier() -> Carrier | None:
    """The current context for a call to another deployment; None when tracing is off."""
    if _state.tracer is None:
        return None
    from opentelemetry import propagate

    out: Carrier = {}
    propagate.inject(out)
    return out


def inject(headers: dict[str, str], span: Any = None) -> None:
    """Add `traceparent` (and `tracestate`) of `span`, else of the current span, to HTTP headers."""
    if _state.tracer is None:
        return
    from opentelemetry import propagate, trace

    propagate.inject(headers, context=trace.set_span_in_context(span) if span is not None else None)


def current_link() -> list[Link]:
    """A link to the current span, for work it asks for that runs in a trace of its own."""
    if _state.tracer is None:
        return []
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    return [trace.Link(context)] if context.is_valid else []


def start_span(name: str, *, kind: Kind = "internal", attributes: Mapping[str, Any] | None = None) -> Any:
    """A span that is not made current, ended by the caller: one that lives across the yields of an
    async generator, where a current context would leak into whatever resumes it."""
    tracer = _state.tracer
    if tracer is None:
        return NO_SPAN
    return tracer.start_span(name, kind=_state.kinds[kind], attributes=attributes)


def end_span(span: Any, error: BaseException | None = None) -> None:
    if span is NO_SPAN:
        return
    if error is not None:
        from opentelemetry.trace import Status, StatusCode

        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
    span.end()


def traced_store(system: str) -> Callable[[type], type]:
    """Give every public coroutine method of a store class a client span (`db.system`, and the
    method as `db.operation.name`), inside a traced operation only: the memorizer polls its lanes
    several times a second, and a trace of each poll would bury the traces of the work. A store
    method that calls another gets one span, the outer: the inner calls are the store's business.
    The span is a leaf, never made current and made whole at its end (`leaf_spans`): a context
    request makes several, and the SDK's mutable span for each would be most of what it costs."""

    def decorate(cls: type) -> type:
        for klass in reversed(cls.__mro__[:-1]):
            for name, fn in vars(klass).items():
                if name.startswith("_") or not inspect.iscoroutinefunction(fn) or not inspect.isfunction(fn):
                    continue
                setattr(cls, name, _store_call(fn, system, cls.__name__))
        return cls

    return decorate


def _store_call(fn: Callable[..., Any], system: str, owner: str) -> Callable[..., Any]:
    name = f"{owner}.{fn.__name__}"
    attributes = {"db.system": system, "db.operation.name": fn.__name__}
    frozen: list[Any] = []  # the attributes validated once, on the first traced call

    @functools.wraps(fn)
    async def call(*args: Any, **kwargs: Any) -> Any:
        leaves = _state.leaves
        if leaves is None or _in_store.get():
            return await fn(*args, **kwargs)
        parent = _state.current_span()
        if not parent.is_recording():
            return await fn(*args, **kwargs)
        if not frozen:
            frozen.append(leaves.frozen(attributes))
        leaf = leaves.open(name, frozen[0], parent.get_span_context())
        if leaf is None:
            return await fn(*args, **kwargs)
        token = _in_store.set(True)
        try:
            result = await fn(*args, **kwargs)
        except BaseException as error:
            leaves.close(leaf, error)
            raise
        else:
            leaves.close(leaf)
            return result
        finally:
            _in_store.reset(token)

    return call


class TraceIdsFilter(logging.Filter):
    """Adds `trace_id` and `span_id` to a record logged while a span is current: Serve's JSON log
    formatter writes every extra attribute of a record, so they land in the structured logs."""

    def filter(self, record: logging.LogRecord) -> bool:
        from opentelemetry import trace

        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            record.trace_id = format(context.trace_id, "032x")
            record.span_id = format(context.span_id, "016x")
        return True


def _otlp_exporter() -> SpanExporter:
    protocol = (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf"
    )
    try:
        if protocol == "http/protobuf":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        elif protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        else:
            raise TracingConfigError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: this service exports http/protobuf or grpc")
    except ImportError as exc:
        package = "opentelemetry-exporter-otlp-proto-" + ("grpc" if protocol == "grpc" else "http")
        raise TracingConfigError(
            f"tracing is on and exports OTLP over {protocol}, but {package} is not installed "
            "(pip install 'agent-memory-serve[otel]' brings the http/protobuf exporter)"
        ) from exc
    return OTLPSpanExporter()  # endpoint, headers, timeout, compression: the OTEL_EXPORTER_OTLP_* variables


def _processors(settings: Settings) -> list[Any]:
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    if settings.tracing_spans_dir:
        from serve_app.runtime.span_files import span_file_exporter

        return [BatchSpanProcessor(span_file_exporter(settings.tracing_spans_dir))]
    processors = []
    for name in (os.environ.get("OTEL_TRACES_EXPORTER") or "otlp").split(","):
        name = name.strip().lower()
        if name == "otlp":
            processors.append(BatchSpanProcessor(_otlp_exporter()))
        elif name == "console":
            processors.append(BatchSpanProcessor(ConsoleSpanExporter()))
        elif name != "none":
            raise TracingConfigError(f"OTEL_TRACES_EXPORTER={name!r}: this service knows otlp, console and none")
    return processors


def configure(settings: Settings, component: str, *, exporter: SpanExporter | None = None) -> bool:
    """Set up this process's tracer provider when tracing is on (once per process); whether it is on.

    `component`: the deployment, a resource attribute (`memserve.deployment`). `exporter`: spans go
    there, synchronously, instead (tests). The sampler is the SDK's, from `OTEL_TRACES_SAMPLER`."""
    if not settings.tracing or os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if _state.tracer is not None:
        return True
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    except ImportError as exc:
        raise TracingConfigError(
            "tracing is on (MEMSERVE_TRACING) but opentelemetry-sdk is not installed: pip install 'agent-memory-serve[otel]'"
        ) from exc
    resource = Resource.create({"memserve.deployment": component})
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": SERVICE_NAME}))
    from serve_app.runtime.leaf_spans import LeafSpans

    provider = TracerProvider(resource=_hashed_once(resource))
    processors = [SimpleSpanProcessor(exporter)] if exporter is not None else _processors(settings)
    for processor in processors:
        provider.add_span_processor(processor)
    _state.leaves = LeafSpans(provider, processors, TRACER_NAME)
    _state.kinds = _kinds()
    _state.current_span = trace.get_current_span
    _state.provider = provider
    _state.tracer = provider.get_tracer(TRACER_NAME)
    _state.log_filter = TraceIdsFilter()
    logging.getLogger(LOGGER_NAME).addFilter(_state.log_filter)
    if _global_provider_unset():
        trace.set_tracer_provider(provider)  # so that libraries' own instrumentation joins the same traces
    return True


def _hashed_once(resource: Any) -> Any:
    """The same resource, its hash computed once: the OTLP encoder groups every span of a batch by
    resource, and the SDK's `Resource.__hash__` dumps all its attributes as JSON each time; a
    process's resource never changes after start."""
    from opentelemetry.sdk.resources import Resource

    class _Resource(Resource):
        def __init__(self, attributes: Any, schema_url: str | None) -> None:
            super().__init__(attributes, schema_url)
            self._hash = super().__hash__()

        def __hash__(self) -> int:
            return self._hash

    return _Resource(resource.attributes, resource.schema_url)


def _global_provider_unset() -> bool:
    from opentelemetry import trace

    return isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def shutdown() -> None:
    """Flush what is left and turn tracing off in this process."""
    provider, _state.provider, _state.tracer, _state.leaves = _state.provider, None, None, None
    if _state.log_filter is not None:
        logging.getLogger(LOGGER_NAME).removeFilter(_state.log_filter)
        _state.log_filter = None
    if provider is not None:
        provider.shutdown()

