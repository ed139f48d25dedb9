"""The application builder that Serve configs name as `import_path` (serve_app.app:build_app)."""

from __future__ import annotations

from typing import Any

from ray.serve import Application

from serve_app.settings import Settings


def build_app(args: dict[str, Any] | None = None) -> Application:
    """Compose ingress, embedder and memorizer. The LLM, when there is one, is another application
    (ray.serve.llm's) or another endpoint: reached over HTTP, never bound in here.

    `args` are Settings fields; the environment fills the rest.
    """
    from serve_app.deployments.embedder import Embedder
    from serve_app.deployments.ingress import Ingress
    from serve_app.deployments.memorizer import Memorizer

    settings = Settings(**(args or {}))
    overrides = settings.model_dump(exclude_unset=True)
    embedder = Embedder.bind(overrides)
    memorizer = Memorizer.bind(embedder, overrides)
    return Ingress.bind(embedder, memorizer, overrides)
