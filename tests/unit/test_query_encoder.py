"""The ingress's query encoder: a traced artifact built by a subprocess, loaded with torch and
tokenizers alone, and exactly as good as the eager model; anything off falls back to the eager one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from serve_app.encoding import query as qe
from serve_app.encoding.sentence import TRACE_TOLERANCE, SentenceEncoder
from serve_app.settings import Settings

INT8 = Settings().embedding_int8
TEXTS = [
    "",
    "ok",
    "What did Melanie paint for her art show in 2023?",
    "  leading and trailing spaces  \n",
    "ticket T-4821 opened by user #77 at 09:15 UTC, priority P1",
    "Café, naïve, façade, 東京, Привет, مرحبا 🙂🎉",
    "UPPER case Words Stay As The Tokenizer Wants",
    "word " * 400,
]


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cache")
    os.environ["MEMSERVE_CACHE_DIR"] = str(root)
    yield root
    os.environ.pop("MEMSERVE_CACHE_DIR", None)


@pytest.fixture(scope="module")
def traced(cache: Path) -> qe.QueryEncoder:
    encoder = qe.load_query_encoder(int8=INT8)
    assert isinstance(encoder, qe.QueryEncoder), "the artifact did not build or load"
    return encoder


@pytest.fixture(scope="module")
def eager() -> SentenceEncoder:
    return SentenceEncoder(threads=1, int8=INT8, trace_single=False)


def test_the_artifact_is_built_once_under_the_cache_dir(traced: qe.QueryEncoder, cache: Path):
    built = list((cache / "query-encoder").iterdir())
    assert len(built) == 1 and {p.name for p in built[0].iterdir()} == {"model.pt", "batch.pt", "meta.json"}
    assert isinstance(qe.load_query_encoder(int8=INT8), qe.QueryEncoder)  # loads what is there
    assert len(list((cache / "query-encoder").iterdir())) == 1


@pytest.mark.parametrize("text", TEXTS, ids=range(len(TEXTS)))
def test_vectors_match_the_eager_sentence_transformer(traced: qe.QueryEncoder, eager: SentenceEncoder, text: str):
    got = np.array(traced.encode([text])[0], dtype=np.float32)
    want = eager._vectors([text])[0]
    assert float(np.abs(got - want).max()) <= TRACE_TOLERANCE


async def test_encode_one_runs_off_the_loop(traced: qe.QueryEncoder, eager: SentenceEncoder):
    got = await traced.encode_one(TEXTS[2])
    assert float(np.abs(np.array(got) - eager._vectors([TEXTS[2]])[0]).max()) <= TRACE_TOLERANCE


def test_the_ingress_process_does_not_import_transformers(traced: qe.QueryEncoder, cache: Path):
    code = (
        "import sys; from serve_app.encoding.query import load_query_encoder, QueryEncoder;"
        f"e = load_query_encoder(int8={INT8}); e.encode(['hello']);"
        "print(type(e).__name__, 'transformers' in sys.modules, 'sentence_transformers' in sys.modules)"
    )
    env = {**os.environ, "MEMSERVE_CACHE_DIR": str(cache)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout.split()
    assert out == ["QueryEncoder", "False", "False"]


def test_an_artifact_whose_vectors_differ_is_refused(traced: qe.QueryEncoder, tmp_path: Path):
    artifact = qe.artifact_dir(qe.bundled_model_path(), INT8)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "model.pt").symlink_to(artifact / "model.pt")
    meta = json.loads((artifact / "meta.json").read_text())
    meta["probes"][0]["vector"] = [v + 0.01 for v in meta["probes"][0]["vector"]]
    (bad / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="differs from the eager model"):
        qe.QueryEncoder(bad, qe.bundled_model_path())


def test_a_failed_build_falls_back_to_the_eager_encoder(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("MEMSERVE_CACHE_DIR", str(tmp_path))
    no_tokenizer = tmp_path / "model-without-files"
    no_tokenizer.mkdir()
    monkeypatch.setattr(qe, "SentenceEncoder", lambda *a, **k: "eager fallback")
    assert qe.load_query_encoder(str(no_tokenizer), INT8) == "eager fallback"


def test_a_second_builder_leaves_the_first_artifact_alone(traced: qe.QueryEncoder, tmp_path: Path):
    out = tmp_path / "artifact"
    qe.build(qe.bundled_model_path(), INT8, out)
    first = (out / "meta.json").read_text()
    qe.build(qe.bundled_model_path(), INT8, out)
    assert (out / "meta.json").read_text() == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifact"]  # no staging directory left


def test_the_embedders_document_encoder_gives_the_eager_vectors_without_transformers(traced: qe.QueryEncoder, cache: Path):
    """The Embedder's traced batch model (documents.py): a memory's vector, sentences and passes
    included, as the eager model gives it, from a process that never imports transformers."""
    texts = [t for t in TEXTS if t.strip()] + ["First sentence. A second, longer one follows here! Third?" * k for k in (1, 3)]
    plain = [i % 3 == 0 for i in range(len(texts))]
    code = (
        "import json, sys; from serve_app.encoding.documents import load_document_encoder;"
        f"e = load_document_encoder(int8={INT8}, workers=2);"
        f"v = e.encode_documents({texts!r}, {plain!r});"
        "print(json.dumps([type(e).__name__, 'transformers' in sys.modules, 'sentence_transformers' in sys.modules, v]))"
    )
    env = {**os.environ, "MEMSERVE_CACHE_DIR": str(cache)}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    name, transformers, sentence_transformers, vectors = json.loads(run.stdout.strip().splitlines()[-1])
    assert (name, transformers, sentence_transformers) == ("DocumentEncoder", False, False)
    want = SentenceEncoder(threads=1, int8=INT8, trace_single=False, workers=2).encode_documents(texts, plain)
    assert float(np.abs(np.array(vectors) - np.array(want)).max()) <= TRACE_TOLERANCE


def test_a_batch_artifact_whose_vectors_differ_is_refused_and_the_eager_encoder_serves(
    traced: qe.QueryEncoder, tmp_path: Path, monkeypatch
):
    from serve_app.encoding import documents

    artifact = qe.artifact_dir(qe.bundled_model_path(), INT8)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "batch.pt").symlink_to(artifact / "batch.pt")
    meta = json.loads((artifact / "meta.json").read_text())
    meta["batch_probe_vectors"][1] = [v + 0.01 for v in meta["batch_probe_vectors"][1]]
    (bad / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="differs from the eager model"):
        documents.DocumentEncoder(bad, qe.bundled_model_path())
    monkeypatch.setattr(documents, "ensure_artifact", lambda *_: bad)
    monkeypatch.setattr(documents, "SentenceEncoder", lambda *a, **k: "eager fallback")
    assert documents.load_document_encoder(int8=INT8) == "eager fallback"
