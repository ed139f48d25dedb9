"""The application builder that Serve configs name as `import_path` (serve_app.app:build_app)."""

from __future__ import annotations

from typing import Any

from ray.serve import Application

from serve_app.settings import Settings


def build_llm(settings: Settings) -> Application:
    """The vLLM deployment of ray.serve.llm for `llm_config` (imports vLLM: ray-serve-llm mode only)."""
    from ray.serve.llm import LLMConfig, build_llm_deployment

    return build_llm_deployment(LLMConfig(**settings.llm_config))


def build_app(args: dict[str, Any] | None = None) -> Application:
    """Compose ingress, embedder, memorizer (and the LLM in ray-serve-llm mode).

    `args` are Settings fields; the environment fills the rest.
    """
    from deployments.embedder import Embedder
    from deployments.ingress import Ingress
    from deployments.memorizer import Memorizer

    settings = Settings(**(args or {}))
    overrides = settings.model_dump(exclude_unset=True)
    embedder = Embedder.bind(overrides)
    llm = build_llm(settings) if settings.llm_mode == "ray-serve-llm" else None
    memorizer = Memorizer.bind(embedder, overrides, llm)
    return Ingress.bind(embedder, memorizer, overrides)
