"""`ray-serve-llm` mode: the app's DAG with the real ray.serve.llm deployment (vLLM, tiny Qwen2)."""

from __future__ import annotations

import os
import time
import uuid

import httpx
import pytest
import yaml

from serve_app.deploy.local_ray import ray_temp_dir, start_ray, wait_running
from serve_app.embedded.launchers import free_port
from serve_app.llm.client import ChatCall, LLMError, ServeLLMClient
from serve_app.services.summarizer import Summarizer

from .conftest import MODEL_ID, ROOT, tiny_llm_config

APP = "memserve-llm"


@pytest.fixture(scope="module")
def llm_app(backends, tiny_model, data_root):
    import ray
    from ray import serve

    from serve_app.app import build_app

    os.environ.update(backends.env)
    # Logical CPUs: the LLM placement group wants a whole CPU beside the memory deployments.
    start_ray(ray_temp_dir(data_root / "llm"), num_cpus=4)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    args = {
        "llm_mode": "ray-serve-llm",
        "llm_model": MODEL_ID,
        "llm_config": tiny_llm_config(tiny_model),
        "llm_timeout_s": 20,
        "llm_input_tokens": 120,
        "summary_max_tokens": 64,
        "llm_extract_max_tokens": 300,
        "extraction_max_facts": 1,
        "compaction_trigger_tokens": 100_000,
        "memorizer_sweep_interval_s": 0.5,
        "milvus_collection": "llm_dag",
    }
    started = time.monotonic()
    serve.run(build_app(args), name=APP, route_prefix="/", blocking=False)
    wait_running([APP], timeout_s=600)
    print(f"\napp with the LLM deployment running in {time.monotonic() - started:.1f}s")
    yield f"http://127.0.0.1:{port}"
    serve.shutdown()
    ray.shutdown()


def _llm_handle():
    from ray import serve

    status = serve.status().applications[APP]
    (name,) = [d for d in status.deployments if d.startswith("LLM")]
    return serve.get_deployment_handle(name, app_name=APP), name


def _wait(client: httpx.Client, session: str, check, timeout_s: float = 300) -> dict:
    deadline = time.monotonic() + timeout_s
    info = {}
    while time.monotonic() < deadline:
        info = client.get(f"/v1/sessions/{session}").json()
        if check(info):
            return info
        time.sleep(0.5)
    raise AssertionError(f"timed out: {info}")


def test_cluster_llm_section_is_a_valid_llm_config():
    from ray.serve.llm import LLMConfig

    cluster = yaml.safe_load((ROOT / "configs" / "cluster.yaml").read_text())
    args = cluster["applications"][0]["args"]
    config = LLMConfig(**args["llm_config"])  # a wrong field fails here
    assert config.model_loading_config.model_id == args["llm_model"]
    assert config.engine_kwargs["enable_prefix_caching"] is True


def test_summary_and_extraction_through_the_dag(llm_app):
    session, user = "s-" + uuid.uuid4().hex[:8], "u-" + uuid.uuid4().hex[:6]
    turns = [f"Order ORD-{700 + i} costs ${i}.75, due 2024-09-{i + 1:02d}." for i in range(8)]
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
    with httpx.Client(base_url=llm_app, timeout=300) as client:
        client.post(f"/v1/sessions/{session}/messages", json={"user_id": user, "messages": messages}).raise_for_status()
        info = _wait(client, session, lambda i: i["extracted_upto_seq"] == 8 and i["memorized_upto_seq"] == 8)
        assert info["extracted_upto_seq"] == 8  # guided JSON from vLLM parsed and validated
        compressed = client.post(f"/v1/sessions/{session}/compress").json()
        assert compressed["compacted"] and not compressed["degraded"]
        # The random model's summary is noise; verification pins every item it dropped.
        for i in range(compressed["covers_upto_seq"]):
            assert f"ORD-{700 + i}" in compressed["summary"] and f"${i}.75" in compressed["summary"]


async def test_handle_streaming_and_timeout_fallback(llm_app):
    handle, _ = _llm_handle()
    client = ServeLLMClient(handle, MODEL_ID, timeout_s=300)
    result = await client.chat(ChatCall([{"role": "user", "content": "Say hi."}], max_tokens=8))
    assert result.completion_tokens > 0 and result.finish_reason in ("stop", "length")

    hasty = ServeLLMClient(handle, MODEL_ID, timeout_s=0.001)
    with pytest.raises(LLMError):
        await hasty.chat(ChatCall([{"role": "user", "content": "Say hi."}], max_tokens=8))
    summarizer = Summarizer(hasty, summary_max_tokens=32)
    from serve_app.core.compression import SummaryState

    outcome = await summarizer.summarize(SummaryState(), "", [{"seq": 1, "role": "user", "content": "Order ORD-9 for $3.50"}], 1)
    assert outcome.degraded and outcome.mode == "fallback" and "ORD-9" in outcome.text


def test_engine_stopped_and_back(llm_app):
    """Kill the LLM replica: every API call still answers, compaction degrades, and is redone after."""
    import ray
    from ray import serve

    _, name = _llm_handle()
    replicas = [a for a in ray.util.list_named_actors(all_namespaces=True) if name in a["name"] and "SERVE_REPLICA" in a["name"]]
    assert replicas
    session, user = "s-" + uuid.uuid4().hex[:8], "u-" + uuid.uuid4().hex[:6]
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"Invoice INV-{i} of ${i}.10"} for i in range(8)]
    with httpx.Client(base_url=llm_app, timeout=300) as client:
        for actor in replicas:
            ray.kill(ray.get_actor(actor["name"], namespace=actor["namespace"]), no_restart=False)
        client.post(f"/v1/sessions/{session}/messages", json={"user_id": user, "messages": messages}).raise_for_status()
        compressed = client.post(f"/v1/sessions/{session}/compress")
        assert compressed.status_code == 200, compressed.text
        body = compressed.json()
        assert body["degraded"], "the engine takes far longer than llm_timeout_s to come back"
        assert "INV-0" in body["summary"]  # the extractive summary stood in
        ctx = client.post("/v1/context", json={"user_id": user, "session_id": session, "max_tokens": 1024})
        assert ctx.status_code == 200 and "summary_degraded" in ctx.json()["degraded"]
        info = _wait(client, session, lambda i: not i["summary_degraded"], timeout_s=600)  # redone by the memorizer
        assert info["covers_upto_seq"] == body["covers_upto_seq"]
        summary = client.get(f"/v1/sessions/{session}/messages", params={"limit": 1}).json()["summary"]
        assert "INV-0" in summary and "$0.10" in summary
        assert serve.status().applications[APP].status == "RUNNING"
