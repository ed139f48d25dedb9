"""`openai` mode against vLLM's OpenAI server (tiny Qwen2): prompts, guided JSON, outage and redo."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from serve_app.core.records import FACT_CATEGORIES
from serve_app.llm.client import ChatCall, LLMError, OpenAIChatClient
from serve_app.llm.prompts import extraction_messages, parse_extraction, response_format
from serve_app.services.compaction import Redo
from serve_app.services.sweep import MemorizerSweep
from serve_app.settings import Settings
from serve_app.stores.bundle import Stores
from tests.lanes import BothLanes

from .conftest import MODEL_ID
from .endpoint_gate import EndpointGate


@pytest.fixture
async def stores(backends):
    connected = await Stores.connect(Settings(**backends.env, milvus_collection="llm_openai"))
    yield connected
    await connected.close()


@pytest.fixture(scope="module")
def embed():
    from sentence_transformers import SentenceTransformer

    from serve_app.encoding.sentence import bundled_model_path

    model = SentenceTransformer(bundled_model_path(), device="cpu")

    async def encode(texts, plain=None):
        return model.encode(texts, normalize_embeddings=True).tolist()

    return encode


def _settings() -> Settings:
    return Settings(
        milvus_collection="llm_openai",
        compaction_trigger_tokens=64,
        llm_mode="openai",
        llm_model=MODEL_ID,
        llm_input_tokens=120,
        summary_max_tokens=64,
        llm_extract_max_tokens=300,
        extraction_max_facts=1,
        llm_timeout_s=120,
    )


async def test_guided_extraction_returns_schema_valid_json(openai_server):
    client = OpenAIChatClient(openai_server.base_url, MODEL_ID, timeout_s=120)
    try:
        turns = [{"seq": 1, "role": "user", "content": "I moved to Lyon and I prefer Go now."}]
        # Exactly one fact: a random model emits valid JSON of that shape only if guided decoding
        # follows the schema (minItems 1 keeps an empty list from passing for proof).
        schema = response_format(1, min_facts=1)
        call = ChatCall(extraction_messages([], turns), max_tokens=300, seed=0, response_format=schema)
        result = await client.chat(call)
        assert result.finish_reason == "stop", result  # guided decoding closes the JSON by itself
        facts, rejected = parse_extraction(result.text, 1)  # schema-valid, validated by pydantic
        assert len(facts) + rejected == 1, result.text
        assert all(f.category in FACT_CATEGORIES and f.key and f.value for f in facts)
    finally:
        await client.close()


@pytest.fixture
def gated_endpoint(openai_server) -> Iterator[EndpointGate]:
    """The session's vLLM server behind a gate: an outage of it is the gate closing."""
    gate = EndpointGate(openai_server.port).start()
    yield gate
    gate.stop()


async def test_summary_outage_fallback_and_redo(gated_endpoint, stores, embed):
    settings = _settings()
    client = OpenAIChatClient(gated_endpoint.base_url, MODEL_ID, timeout_s=120)
    memorizer = BothLanes(MemorizerSweep(stores, embed, settings, client))
    session, user = "s-" + uuid.uuid4().hex[:8], "u-" + uuid.uuid4().hex[:6]
    turns = [f"Order ORD-{100 + i} costs ${i}.25 and ships 2024-03-{i + 1:02d}." for i in range(10)]
    messages = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": t, "created_at": "2024-03-01T00:00:00+00:00"}
        for i, t in enumerate(turns)
    ]
    await stores.log.append("local", session, user, messages[:6])

    report = await memorizer.memorize("local", session)
    assert report.compaction.compacted and report.compaction.summary.mode == "llm"
    meta = await stores.log.meta("local", session)
    assert not meta.summary_degraded
    covered = messages[: meta.covers_upto_seq]
    for item in ("ORD-100", "$0.25", "2024-03-01"):
        if any(item in m["content"] for m in covered):
            assert item in meta.summary  # the random model drops them; pinning puts them back
    assert meta.extracted_upto_seq == 6

    gated_endpoint.close()  # the endpoint is down: refused, open connections closed
    try:
        with pytest.raises(LLMError):
            await client.chat(ChatCall([{"role": "user", "content": "hi"}], max_tokens=4))
        await stores.log.append("local", session, user, messages[6:])
        report = await memorizer.memorize("local", session)
        assert report.compaction.degraded and report.compaction.summary.mode == "fallback"
        assert report.extraction_failed
        meta = await stores.log.meta("local", session)
        assert meta.summary_degraded and meta.extracted_upto_seq == 6  # no skipped work
        assert ("local", session) in await stores.log.llm_pending(limit=10_000)
    finally:
        gated_endpoint.open()  # back on the same address

    report = await memorizer.memorize("local", session)
    assert report.redone is Redo.REDONE
    meta = await stores.log.meta("local", session)
    assert not meta.summary_degraded and meta.extracted_upto_seq == 10
    assert all(item in meta.summary for item in ("ORD-100", "$0.25"))
    assert ("local", session) not in await stores.log.llm_pending(limit=10_000)
    await client.close()
