"""The OpenAI-compatible endpoints on a service without an LLM (llm_mode none), with the openai SDK:
a clear 4xx in OpenAI's error shape naming llm_mode, and an empty model list."""

from __future__ import annotations

import httpx
import openai
import pytest

from .conftest import KEY_LOCAL


def test_chat_without_an_llm_is_a_400_naming_llm_mode(service_url):
    client = openai.OpenAI(base_url=f"{service_url}/v1", api_key=KEY_LOCAL, max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="any", messages=[{"role": "user", "content": "hi"}])
    assert refused.value.code == "llm_not_configured" and "llm_mode" in refused.value.message
    assert client.models.list().data == []


def test_chat_errors_take_openais_shape(service_url):
    headers = {"Authorization": f"Bearer {KEY_LOCAL}"}
    invalid = httpx.post(f"{service_url}/v1/chat/completions", headers=headers, json={"model": "m", "messages": []})
    assert invalid.status_code == 422
    error = invalid.json()["error"]
    assert error["type"] == "invalid_request_error" and "messages" in error["message"]
    unauthorized = httpx.post(f"{service_url}/v1/chat/completions", json={"model": "m", "messages": [{"role": "user"}]})
    assert unauthorized.status_code == 401 and unauthorized.json()["error"]["type"] == "authentication_error"
    # The rest of the API keeps its own shape.
    assert "detail" in httpx.get(f"{service_url}/v1/sessions/nope", headers=headers).json()
