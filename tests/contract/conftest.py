"""Shared fixtures of the store contract tests: the real bundled embedding model, in process."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def encoder():
    from serve_app.encoding.sentence import SentenceEncoder
    from serve_app.settings import Settings

    return SentenceEncoder(threads=1, int8=Settings().embedding_int8)


@pytest.fixture(scope="session")
def embed(encoder):
    """EmbedMany over the real model, as the Embedder deployment serves it: memories' vectors."""
    return encoder.encode_documents_async
