"""serve_app.runtime.tracing with the SDK's in-memory exporter: off costs no span, on the spans nest
as the request did, a carrier carries the context to another process's span, logs get the ids,
and the LLM call has the GenAI attributes and sends `traceparent` upstream."""

from __future__ import annotations

import contextvars
import json
import logging
import sys

import httpx
import pytest
from openai import AsyncOpenAI
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from serve_app.llm.client import OpenAIChatClient
from serve_app.runtime import tracing
from serve_app.runtime.span_files import read_spans
from serve_app.settings import Settings


@tracing.traced_store("redis")
class _Store:
    def __init__(self) -> None:
        self.calls = 0

    async def read(self, key: str) -> str:
        self.calls += 1
        return key

    async def read_twice(self, key: str) -> str:
        return await self.read(key) + await self.read(key)

    def sync_method(self) -> int:
        return 1


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    assert tracing.configure(Settings(tracing=True), "Test", exporter=exporter)
    yield exporter
    tracing.shutdown()


def _hex(span_id: int) -> str:
    return format(span_id, "016x")


async def test_off_by_default_nothing_is_made():
    assert not tracing.configure(Settings(), "Test")
    assert not tracing.enabled()
    with tracing.span("x") as span:
        assert span is tracing.NO_SPAN and not span.is_recording()
    assert tracing.carrier() is None and tracing.current_link() == []
    assert await _Store().read("k") == "k"


def test_the_sdk_switch_wins(monkeypatch):
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert not tracing.configure(Settings(tracing=True), "Test")


async def test_store_spans_nest_in_the_operation_and_only_there(spans):
    store = _Store()
    await store.read("outside")  # no operation around it: the memorizer's polls make no traces
    with tracing.span("memory.context"):
        assert await store.read_twice("k") == "kk"
    assert store.calls == 3
    finished = {s.name: s for s in spans.get_finished_spans()}
    assert set(finished) == {"memory.context", "_Store.read_twice"}  # the inner reads are the store's business
    call = finished["_Store.read_twice"]
    assert call.parent.span_id == finished["memory.context"].context.span_id
    assert call.attributes["db.system"] == "redis" and call.attributes["db.operation.name"] == "read_twice"
    assert call.kind.name == "CLIENT"
    assert _Store.sync_method(store) == 1


async def test_a_store_call_that_fails_ends_its_span_as_an_error_and_raises(spans):
    @tracing.traced_store("postgresql")
    class Broken:
        async def write(self) -> None:
            raise ConnectionError("server closed the connection")

    with tracing.span("memory.append"), pytest.raises(ConnectionError):
        await Broken().write()
    (call,) = [s for s in spans.get_finished_spans() if s.name == "Broken.write"]
    assert call.status.status_code.name == "ERROR" and "ConnectionError" in call.status.description
    assert [e.name for e in call.events] == ["exception"] and call.end_time is not None


async def test_a_carrier_makes_the_callee_span_a_child_in_another_context(spans):
    with tracing.span("ingress", kind="server") as caller:
        carrier = tracing.carrier()
    assert carrier is not None and carrier["traceparent"].split("-")[2] == _hex(caller.get_span_context().span_id)

    def callee() -> None:  # a fresh context, as in another replica's process
        with tracing.span("Memorizer.compress", kind="server", parent=carrier):
            pass

    contextvars.Context().run(callee)
    finished = {s.name: s for s in spans.get_finished_spans()}
    child = finished["Memorizer.compress"]
    assert child.context.trace_id == finished["ingress"].context.trace_id
    assert child.parent.span_id == finished["ingress"].context.span_id and child.parent.is_remote


async def test_a_root_span_starts_its_own_trace_and_links_the_asker(spans):
    with tracing.span("Memorizer.poke"):
        links = tracing.current_link()
        with tracing.span("memory.memorize", root=True, links=links):
            pass
    finished = {s.name: s for s in spans.get_finished_spans()}
    run, poke = finished["memory.memorize"], finished["Memorizer.poke"]
    assert run.parent is None and run.context.trace_id != poke.context.trace_id
    assert [link.context.span_id for link in run.links] == [poke.context.span_id]


def test_logs_carry_the_ids_of_the_current_span(spans):
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger(tracing.LOGGER_NAME)
    handler = Keep()
    logger.addHandler(handler)
    try:
        with tracing.span("memory.context") as span:
            logger.warning("inside")
        logger.warning("outside")
    finally:
        logger.removeHandler(handler)
    inside, outside = records
    assert inside.trace_id == format(span.get_span_context().trace_id, "032x")
    assert inside.span_id == _hex(span.get_span_context().span_id)
    assert not hasattr(outside, "trace_id")


def test_serves_json_log_lines_carry_the_ids(spans):
    """The formatter Serve writes replica logs with (`logging_config.encoding: JSON`)."""
    from ray._common.formatters import JSONFormatter

    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    logger = logging.getLogger(tracing.LOGGER_NAME)
    handler = Keep()
    handler.setFormatter(JSONFormatter())
    logger.addHandler(handler)
    try:
        with tracing.span("memory.context") as span:
            logger.warning("recall unavailable")
    finally:
        logger.removeHandler(handler)
    line = json.loads(lines[0])
    assert line["message"] == "recall unavailable"
    assert line["trace_id"] == format(span.get_span_context().trace_id, "032x")


async def test_the_llm_call_has_genai_attributes_and_sends_traceparent(spans):
    seen: list[httpx.Request] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        body = {
            "id": "cmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": "tiny-qwen",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
        }
        return httpx.Response(200, json=body)

    llm = OpenAIChatClient("http://llm.test:8001/v1", "tiny-qwen")
    transport = httpx.AsyncClient(transport=httpx.MockTransport(upstream))
    llm.client = AsyncOpenAI(base_url="http://llm.test:8001/v1", api_key="none", max_retries=0, http_client=transport)
    with tracing.span("memory.compress"):
        result = await llm.chat(tracing_call())
    assert result.text == "ok"
    (call,) = [s for s in spans.get_finished_spans() if s.name == "chat tiny-qwen"]
    version, trace_id, parent_id, _flags = seen[0].headers["traceparent"].split("-")
    assert (version, trace_id, parent_id) == ("00", format(call.context.trace_id, "032x"), _hex(call.context.span_id))
    attributes = call.attributes
    assert attributes["gen_ai.operation.name"] == "chat" and attributes["gen_ai.request.model"] == "tiny-qwen"
    assert attributes["gen_ai.request.temperature"] == 0.0 and attributes["gen_ai.request.max_tokens"] == 64
    assert attributes["gen_ai.usage.input_tokens"] == 12 and attributes["gen_ai.usage.output_tokens"] == 3
    assert attributes["gen_ai.response.finish_reasons"] == ("stop",) and attributes["server.address"] == "llm.test"
    assert call.kind.name == "CLIENT"
    assert "traceparent" not in json.loads(seen[0].content)  # a header, not a field of the request body


async def test_a_streamed_llm_call_is_one_span_over_the_stream(spans):
    seen: list[httpx.Request] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        chunk = {"id": "cmpl-2", "object": "chat.completion.chunk", "created": 0, "model": "tiny-qwen"}
        events = [
            chunk | {"choices": [{"index": 0, "delta": {"content": "o"}, "finish_reason": None}]},
            chunk | {"choices": [{"index": 0, "delta": {"content": "k"}, "finish_reason": "stop"}]},
            chunk | {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}},
        ]
        body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})

    llm = OpenAIChatClient("http://llm.test:8001/v1", "tiny-qwen")
    transport = httpx.AsyncClient(transport=httpx.MockTransport(upstream))
    llm.client = AsyncOpenAI(base_url="http://llm.test:8001/v1", api_key="none", max_retries=0, http_client=transport)
    with tracing.span("POST /v1/chat/completions") as outer:
        chunks = [c async for c in llm.stream({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})]
    assert len(chunks) == 3
    (call,) = [s for s in spans.get_finished_spans() if s.name == "chat tiny-qwen"]
    assert call.parent.span_id == outer.get_span_context().span_id
    assert seen[0].headers["traceparent"].split("-")[2] == _hex(call.context.span_id)
    assert call.attributes["gen_ai.usage.output_tokens"] == 2 and call.attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert [event.name for event in call.events] == ["gen_ai.first_chunk"]


def tracing_call():
    from serve_app.llm.client import ChatCall

    return ChatCall(messages=[{"role": "user", "content": "hi"}], max_tokens=64)


def test_an_unknown_exporter_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "zipkin-ish")
    with pytest.raises(tracing.TracingConfigError, match="OTEL_TRACES_EXPORTER='zipkin-ish'"):
        tracing.configure(Settings(tracing=True), "Test")
    assert not tracing.enabled()


def test_otlp_without_the_extra_names_the_extra(monkeypatch):
    monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    with pytest.raises(tracing.TracingConfigError, match=r"agent-memory-serve\[otel\]"):
        tracing.configure(Settings(tracing=True), "Test")
    assert not tracing.enabled()


def test_spans_dir_writes_json_lines(tmp_path):
    assert tracing.configure(Settings(tracing=True, tracing_spans_dir=str(tmp_path)), "Embedder")
    try:
        with tracing.span("outer"):
            with tracing.span("inner", attributes={"memory.recalled": 2}):
                pass
    finally:
        tracing.shutdown()  # flushes the batch
    by_name = {s["name"]: s for s in read_spans(tmp_path)}
    assert by_name["inner"]["parent_span_id"] == by_name["outer"]["span_id"]
    assert by_name["inner"]["attributes"] == {"memory.recalled": 2}
    assert by_name["outer"]["resource"]["memserve.deployment"] == "Embedder"
    assert by_name["outer"]["resource"]["service.name"] == "memserve"


def test_the_resource_is_hashed_once_and_encodes_as_the_sdks_own(spans, monkeypatch):
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource

    with tracing.span("one"):
        pass
    with tracing.span("two"):
        pass
    finished = spans.get_finished_spans()
    ours = finished[0].resource
    plain = Resource(ours.attributes, ours.schema_url)
    assert ours == plain and hash(ours) == hash(plain)
    assert ours.attributes["memserve.deployment"] == "Test"
    monkeypatch.setattr(Resource, "__hash__", lambda _: pytest.fail("the resource was hashed again"))
    encoded = encode_spans(finished)
    assert len(encoded.resource_spans) == 1 and len(encoded.resource_spans[0].scope_spans[0].spans) == 2
