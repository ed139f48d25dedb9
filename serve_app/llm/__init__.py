"""LLM access for summarization and extraction: one protocol, three modes (ray-serve-llm, openai, none).

Nothing here imports vLLM at module level: CPU-only replicas import this package freely.
"""
