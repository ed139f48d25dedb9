"""The LLM serving path for real on CPU (vLLM, a tiny random-weight Qwen2): `ray-serve-llm` mode (the
ray.serve.llm OpenAI application beside the memory service, as configs/cluster.yaml deploys them)
and `openai` mode (a standalone vLLM server), both reached with the openai SDK.

A random model's words prove nothing, so the tests assert on what the service sent the model (a
recording proxy in front of each endpoint keeps every request) and on what it stored.
"""

from __future__ import annotations

import os
import time
import uuid

import httpx
import openai
import pytest
import yaml

from serve_app.core.compression import SummaryState
from serve_app.core.tokenizer import count_chat
from serve_app.deploy.local_ray import ray_temp_dir, start_ray, wait_running
from serve_app.embedded.ports import free_port
from serve_app.llm.client import ChatCall, LLMError, OpenAIChatClient
from serve_app.llm.prompts import extraction_messages, parse_extraction, response_format
from serve_app.services.summarizer import Summarizer

from .conftest import MODEL_ID, ROOT, STREAM_BATCHING_INTERVAL_MS, tiny_llm_config
from .recording_proxy import RecordingProxy

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]},
    },
}


class Stack:
    def __init__(self, port: int, serve_proxy: RecordingProxy, openai_proxy: RecordingProxy):
        self.port = port
        self.urls = {"ray-serve-llm": f"http://127.0.0.1:{port}", "openai": f"http://127.0.0.1:{port}/oa"}
        self.proxies = {"ray-serve-llm": serve_proxy, "openai": openai_proxy}


def _args(**more) -> dict:
    return {
        "llm_model": MODEL_ID,
        "llm_timeout_s": 60,
        "llm_input_tokens": 120,
        "summary_max_tokens": 64,
        "llm_extract_max_tokens": 300,
        "extraction_max_facts": 1,
        "compaction_trigger_tokens": 100_000,
        "memorizer_sweep_interval_s": 0.5,
        "chat_max_completion_tokens": 8,
        **more,
    }


@pytest.fixture(scope="module")
def stack(backends, tiny_model, data_root, openai_server):
    import ray
    from ray import serve
    from ray.serve.llm import build_openai_app

    from serve_app.app import build_app

    os.environ.update(backends.app_env)
    # Logical CPUs: the LLM application and two memory services on two cores (they idle most of the time).
    start_ray(ray_temp_dir(data_root / "llm"), num_cpus=8)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    started = time.monotonic()
    serve.run(build_openai_app({"llm_configs": [tiny_llm_config(tiny_model)]}), name="llm", route_prefix="/llm", blocking=False)
    serve_proxy = RecordingProxy(f"http://127.0.0.1:{port}/llm/v1").start()
    openai_proxy = RecordingProxy(openai_server.base_url).start()
    memory = build_app(_args(llm_mode="ray-serve-llm", llm_base_url=serve_proxy.base_url, milvus_collection="llm_app"))
    serve.run(memory, name="memserve", route_prefix="/", blocking=False)
    # The same service in openai mode, on its own Redis database (its own memorizer lanes).
    redis_db1 = backends.env["REDIS_URL"].rsplit("/", 1)[0] + "/1"
    oa = _args(llm_mode="openai", llm_base_url=openai_proxy.base_url, milvus_collection="llm_oa", redis_url=redis_db1)
    serve.run(build_app(oa), name="memserve-oa", route_prefix="/oa", blocking=False)
    wait_running(["llm", "memserve", "memserve-oa"], timeout_s=600)
    print(f"\nthe LLM application and both memory services running in {time.monotonic() - started:.1f}s")
    yield Stack(port, serve_proxy, openai_proxy)
    serve.shutdown()
    ray.shutdown()
    serve_proxy.stop()
    openai_proxy.stop()


def _wait(client: httpx.Client, session: str, check, timeout_s: float = 300) -> dict:
    deadline = time.monotonic() + timeout_s
    info = {}
    while time.monotonic() < deadline:
        info = client.get(f"/v1/sessions/{session}").json()
        if check(info):
            return info
        time.sleep(0.3)
    raise AssertionError(f"timed out: {info}")


def _log(base: str, session: str) -> list[dict]:
    return httpx.get(f"{base}/v1/sessions/{session}/messages", params={"limit": 1000}).json()["messages"]


def _sdk(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused-on-loopback", max_retries=0, timeout=300)


def test_cluster_llm_application_is_a_valid_llm_config():
    from ray.serve.llm import LLMConfig

    cluster = yaml.safe_load((ROOT / "configs" / "cluster.yaml").read_text())
    apps = {app["name"]: app for app in cluster["applications"]}
    (llm,) = apps["llm"]["args"]["llm_configs"]
    config = LLMConfig(**llm)  # a wrong field fails here
    memory = apps["memserve"]["args"]
    assert config.model_loading_config.model_id == memory["llm_model"]
    assert config.engine_kwargs["max_model_len"] == memory["llm_context_window"]
    assert memory["llm_base_url"].endswith(apps["llm"]["route_prefix"] + "/v1")


def test_summary_and_extraction_through_the_llm_application(stack):
    session, user = "s-" + uuid.uuid4().hex[:8], "u-" + uuid.uuid4().hex[:6]
    turns = [f"Order ORD-{700 + i} costs ${i}.75, due 2024-09-{i + 1:02d}." for i in range(8)]
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
    with httpx.Client(base_url=stack.urls["ray-serve-llm"], timeout=300) as client:
        client.post(f"/v1/sessions/{session}/messages", json={"user_id": user, "messages": messages}).raise_for_status()
        info = _wait(client, session, lambda i: i["extracted_upto_seq"] == 8 and i["memorized_upto_seq"] == 8)
        assert info["extracted_upto_seq"] == 8  # guided JSON from vLLM parsed and validated
        compressed = client.post(f"/v1/sessions/{session}/compress").json()
        assert compressed["compacted"] and not compressed["degraded"]
        # The random model's summary is noise; verification pins every item it dropped.
        for i in range(compressed["covers_upto_seq"]):
            assert f"ORD-{700 + i}" in compressed["summary"] and f"${i}.75" in compressed["summary"]
    sent = stack.proxies["ray-serve-llm"].chat_requests()
    assert any(r.get("response_format", {}).get("type") == "json_schema" for r in sent)  # extraction went this way


async def test_guided_json_from_the_llm_application_follows_the_schema(stack):
    """The extraction call as the memorizer sends it, straight to the ray.serve.llm application:
    guided decoding closes the JSON by itself and it follows the schema. The memorizer skips output
    that does not after a few attempts, so a moved extraction cursor alone does not show this."""
    client = OpenAIChatClient(f"{stack.urls['ray-serve-llm']}/llm/v1", MODEL_ID, timeout_s=300)
    try:
        turns = [{"seq": 1, "role": "user", "content": "I moved to Lyon and I prefer Go now."}]
        schema = response_format(1, min_facts=1)  # minItems 1: an empty list proves nothing
        result = await client.chat(ChatCall(extraction_messages([], turns), max_tokens=300, seed=0, response_format=schema))
        assert result.finish_reason == "stop", result
        facts, rejected = parse_extraction(result.text, 1)
        assert len(facts) + rejected == 1, result.text
    finally:
        await client.close()


async def test_timeout_falls_back_to_the_extractive_summary(stack):
    base = f"{stack.urls['ray-serve-llm']}/llm/v1"
    assert (await OpenAIChatClient(base, MODEL_ID, timeout_s=300).chat(ChatCall([{"role": "user", "content": "hi"}], 4))).text
    hasty = OpenAIChatClient(base, MODEL_ID, timeout_s=0.001)
    with pytest.raises(LLMError):
        await hasty.chat(ChatCall([{"role": "user", "content": "Say hi."}], max_tokens=8))
    turn = [{"seq": 1, "role": "user", "content": "Order ORD-9 for $3.50"}]
    outcome = await Summarizer(hasty, summary_max_tokens=32).summarize(SummaryState(), "", turn, 1)
    assert outcome.degraded and outcome.mode == "fallback" and "ORD-9" in outcome.text


@pytest.mark.parametrize("mode", ["ray-serve-llm", "openai"])
def test_chat_stores_the_turns_and_sends_the_model_working_memory(stack, mode):
    base, proxy = stack.urls[mode], stack.proxies[mode]
    user, session = "u-" + uuid.uuid4().hex[:6], "s-" + uuid.uuid4().hex[:8]
    client = _sdk(base)
    raw = client.chat.completions.with_raw_response.create(
        model="anything",
        messages=[{"role": "system", "content": "You are terse."}, {"role": "user", "content": "My locker code is 4417."}],
        user=user,
        extra_headers={"X-Session-Id": session},
        max_completion_tokens=6,
    )
    answer = raw.parse()
    assert raw.headers["x-memory-session-id"] == session
    assert answer.memory["session_id"] == session and answer.memory["alignment"] == "new"
    sent = proxy.last_asking("My locker code is 4417.")
    assert sent["model"] == MODEL_ID and sent["messages"][0]["content"].startswith("You are terse.")
    assert sent["messages"][-1] == {"role": "user", "content": "My locker code is 4417."}
    assert answer.usage.prompt_tokens == count_chat(sent["messages"], add_generation_prompt=True)  # counted as vLLM counts
    assert answer.usage.prompt_tokens == answer.memory["prompt_tokens"]
    log = _log(base, session)
    assert [m["role"] for m in log] == ["user", "assistant"] and log[1]["content"] == (answer.choices[0].message.content or "")
    assert answer.memory["stored_seqs"] == [1, 2]

    # A new session of the same user: the earlier turn comes back from long-term memory.
    _wait(httpx.Client(base_url=base), session, lambda i: i["memorized_upto_seq"] >= 1)
    later = client.chat.completions.create(
        model="anything",
        messages=[{"role": "user", "content": "What is my locker code?"}],
        user=user,
        metadata={"session_id": "s-" + uuid.uuid4().hex[:8]},
        max_completion_tokens=4,
    )
    assert later.memory["recalled"] and later.memory["memory_tokens"] > 0, later.memory
    assert "4417" in proxy.last_asking("What is my locker code?")["messages"][0]["content"]


def test_each_history_rule_stores_what_it_says(stack):
    base = stack.urls["ray-serve-llm"]
    client = _sdk(base)
    user, session = "u-" + uuid.uuid4().hex[:6], "s-" + uuid.uuid4().hex[:8]

    def ask(messages, headers=None, **more):
        return client.chat.completions.create(
            model="m", messages=messages, user=user, extra_headers={"X-Session-Id": session, **(headers or {})},
            max_completion_tokens=4, **more,
        )  # fmt: skip

    first = ask([{"role": "user", "content": "Plan a trip to Oslo."}])
    a1 = first.choices[0].message.content or ""
    history = [{"role": "user", "content": "Plan a trip to Oslo."}, {"role": "assistant", "content": a1}]

    resent = ask([*history, {"role": "user", "content": "In May, for three days."}])  # the whole history again
    assert resent.memory["alignment"] == "continues" and resent.memory["stored_seqs"] == [3, 4]
    a2 = resent.choices[0].message.content or ""
    history += [{"role": "user", "content": "In May, for three days."}, {"role": "assistant", "content": a2}]

    key = {"Idempotency-Key": uuid.uuid4().hex}
    keyed = ask([*history, {"role": "user", "content": "ok"}], key)
    retry = ask([*history, {"role": "user", "content": "ok"}], key)  # the client's retry: nothing new, the same answer
    assert retry.memory["alignment"] == "retried" and retry.memory["stored_seqs"] == keyed.memory["stored_seqs"] == [5, 6]
    assert retry.choices[0].message.content == keyed.choices[0].message.content
    assert len(_log(base, session)) == 6
    history += [{"role": "user", "content": "ok"}, {"role": "assistant", "content": keyed.choices[0].message.content or ""}]

    dropped = ask([*history[2:], {"role": "user", "content": "ok"}])  # oldest turns dropped; the same words again
    assert dropped.memory["alignment"] == "continues" and dropped.memory["stored_seqs"] == [7, 8]
    history += [{"role": "user", "content": "ok"}, {"role": "assistant", "content": dropped.choices[0].message.content or ""}]

    edited = [*history[:2], {"role": "user", "content": "In June instead."}]  # an edited second turn
    diverged = ask(edited)
    assert diverged.memory["alignment"] == "diverged" and diverged.memory["stored_seqs"] == [9, 10]
    log = _log(base, session)
    assert [m["content"] for m in log if m["role"] == "user"] == [
        "Plan a trip to Oslo.", "In May, for three days.", "ok", "ok", "In June instead."
    ]  # fmt: skip

    quiet = ask([*edited, {"role": "user", "content": "never stored"}], store=False)
    assert quiet.memory["stored_seqs"] == [] and len(_log(base, session)) == 10


@pytest.mark.parametrize("mode", ["ray-serve-llm", "openai"])
async def test_streamed_chat_stores_the_answer_before_done(stack, mode):
    base = stack.urls[mode]
    user, session = "u-" + uuid.uuid4().hex[:6], "s-" + uuid.uuid4().hex[:8]
    client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="-", max_retries=0, timeout=300)
    started = time.perf_counter()
    first_token_s = None
    text, memory = [], None
    stream = await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Count to three."}], user=user, stream=True,
        extra_headers={"X-Session-Id": session}, max_completion_tokens=8,
    )  # fmt: skip
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first_token_s = first_token_s or time.perf_counter() - started
            text.append(chunk.choices[0].delta.content)
        memory = getattr(chunk, "memory", None) or memory
    assert memory is not None and memory["stored_seqs"] == [1, 2]
    log = _log(base, session)  # read right after [DONE]: the answer is already there
    assert [m["role"] for m in log] == ["user", "assistant"] and log[1]["content"] == "".join(text)

    # Time to the first token through the service, against the same endpoint with the same prompt.
    prompt = stack.proxies[mode].last_asking("Count to three.")
    direct = openai.AsyncOpenAI(base_url=stack.proxies[mode].base_url, api_key="-", max_retries=0, timeout=300)
    started = time.perf_counter()
    direct_first = None
    async for chunk in await direct.chat.completions.create(
        model=MODEL_ID, messages=prompt["messages"], max_tokens=8, stream=True
    ):
        if chunk.choices and chunk.choices[0].delta.content and direct_first is None:
            direct_first = time.perf_counter() - started
    print(
        f"\n{mode}: time to first token through the service {first_token_s * 1000:.0f} ms, the same prompt to the "
        f"endpoint directly {direct_first * 1000:.0f} ms (stream_batching_interval_ms {STREAM_BATCHING_INTERVAL_MS})"
    )


def test_an_abandoned_stream_keeps_the_user_turn_and_no_partial_answer(stack):
    base = stack.urls["ray-serve-llm"]
    user, session = "u-" + uuid.uuid4().hex[:6], "s-" + uuid.uuid4().hex[:8]
    body = {"model": "m", "messages": [{"role": "user", "content": "Write a long story."}], "user": user,
            "stream": True, "max_completion_tokens": 400, "min_tokens": 400}  # fmt: skip
    with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, headers={"X-Session-Id": session}, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                break  # the first chunk, then the client goes away
    time.sleep(3)
    log = _log(base, session)
    assert [m["role"] for m in log] == ["user"]
    health = httpx.get(f"{base}/healthz")
    assert health.status_code == 200, health.text


def test_tools_pass_through_and_a_tool_call_is_stored_with_its_result(stack):
    """tools and a named tool_choice reach the model as sent (vLLM 0.32's Hermes structural tags do not
    make random weights write a parsable call, so the call itself comes from the agent here); the
    assistant's call and the result sent next are stored as turns and reach the model together."""
    base = stack.urls["ray-serve-llm"]
    user, session = "u-" + uuid.uuid4().hex[:6], "s-" + uuid.uuid4().hex[:8]
    client = _sdk(base)
    named = {"type": "function", "function": {"name": "get_weather"}}
    client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Weather in Oslo?"}], user=user, max_completion_tokens=8,
        extra_headers={"X-Session-Id": session}, tools=[WEATHER], tool_choice=named,
    )  # fmt: skip
    sent = stack.proxies["ray-serve-llm"].last_asking("Weather in Oslo?")
    assert sent["tools"] == [WEATHER] and sent["tool_choice"] == named

    call = {"id": "call_oslo", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    turns = [
        {"role": "user", "content": "Weather in Bergen?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_oslo", "content": '{"temp_c": 4}'},
    ]
    tool_session = "s-" + uuid.uuid4().hex[:8]
    answered = client.chat.completions.create(
        model="m", messages=turns, user=user, extra_headers={"X-Session-Id": tool_session},
        max_completion_tokens=4, tools=[WEATHER],
    )  # fmt: skip
    log = _log(base, tool_session)
    assert [m["role"] for m in log] == ["user", "assistant", "tool", "assistant"]
    assert log[1]["tool_calls"][0]["function"]["name"] == "get_weather" and log[2]["tool_call_id"] == "call_oslo"
    prompt = [r for r in stack.proxies["ray-serve-llm"].chat_requests() if r["messages"][-1]["role"] == "tool"][-1]
    assert [m["role"] for m in prompt["messages"][-2:]] == ["assistant", "tool"]  # the call and its result, together
    assert answered.usage.prompt_tokens == count_chat(prompt["messages"], add_generation_prompt=True, tools=[WEATHER])


def test_the_readmes_openai_example_runs_as_printed(stack, capsys):
    """The README's chat example, word for word, against this service in openai mode (its URL and
    the tiny model's name put in place of memserve up's defaults)."""
    readme = (ROOT / "README.md").read_text()
    start = readme.index("```python\nfrom openai import OpenAI")
    code = readme[start + len("```python\n") : readme.index("```", start + 10)]
    assert 'base_url="http://127.0.0.1:8000/v1"' in code and 'model="tiny-qwen"' in code
    exec(compile(code.replace("http://127.0.0.1:8000/v1", f"{stack.urls['openai']}/v1"), "README.md", "exec"), {})
    printed = capsys.readouterr().out
    assert "'session_id': 'gym-1'" in printed and "'stored_seqs': [1, 2]" in printed
    assert stack.proxies["openai"].last_asking("What is my locker code?")["stream"] is True
