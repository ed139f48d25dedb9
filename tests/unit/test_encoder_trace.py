"""The traced one-text path of SentenceEncoder gives the eager model's vectors, and steps aside when it
cannot: documents (batches, eager) and queries (one text, traced) must stay comparable."""

from __future__ import annotations

import numpy as np
import pytest

from serve_app.encoding import sentence as encoder_module
from serve_app.encoding.sentence import SentenceEncoder
from serve_app.settings import Settings

TEXTS = [
    "",
    "ok",
    "What did Melanie paint for her art show in 2023?",
    "  leading and trailing spaces  ",
    "ticket T-4821 opened by user #77 at 09:15 UTC, priority P1",
    "Café, naïve, façade, 東京, Привет, مرحبا 🙂🎉",
    "word " * 400,  # past the model's window: truncated the same way on both paths
]


@pytest.fixture(scope="module")
def encoder() -> SentenceEncoder:
    return SentenceEncoder(threads=1, int8=Settings().embedding_int8)


def test_the_trace_is_used(encoder: SentenceEncoder):
    assert encoder.traced is not None


@pytest.mark.parametrize("text", TEXTS, ids=range(len(TEXTS)))
def test_one_text_traced_matches_the_eager_model(encoder: SentenceEncoder, text: str):
    traced = np.array(encoder.encode([text])[0], dtype=np.float32)
    eager = encoder._vectors([text])[0]
    assert traced.shape == eager.shape
    assert float(np.abs(traced - eager).max()) <= encoder_module.TRACE_TOLERANCE
    assert abs(float(np.linalg.norm(traced)) - 1.0) < 1e-5


def test_a_query_scores_documents_as_the_eager_model_does(encoder: SentenceEncoder):
    """The vectors that matter are compared: a traced query against eagerly embedded documents."""
    documents = np.array(encoder.encode(TEXTS[1:6]))  # a batch: eager
    query = "which art did Melanie show?"
    traced_scores = documents @ np.array(encoder.encode([query])[0])
    eager_scores = documents @ encoder._vectors([query])[0]
    assert np.argsort(-traced_scores).tolist() == np.argsort(-eager_scores).tolist()
    assert np.allclose(traced_scores, eager_scores, atol=1e-5)


def test_a_trace_that_differs_is_not_used(monkeypatch, encoder: SentenceEncoder):
    monkeypatch.setattr(encoder_module, "TRACE_TOLERANCE", -1.0)  # no trace can pass the probe check
    assert encoder._trace() is None


def test_without_the_trace_single_texts_take_the_eager_path(monkeypatch, encoder: SentenceEncoder):
    monkeypatch.setattr(encoder, "traced", None)
    text = TEXTS[2]
    assert np.array_equal(np.array(encoder.encode([text])[0], dtype=np.float32), encoder._vectors([text])[0])


def test_a_memory_of_one_sentence_is_stored_under_its_own_vector(encoder: SentenceEncoder):
    texts = ["We adopted a puppy named Rex.", "ok", ""]
    documents = np.array(encoder.encode_documents(texts))
    assert np.allclose(documents, np.array(encoder.encode(texts)), atol=1e-6)


def test_a_memory_of_several_sentences_adds_the_mean_of_its_sentences(encoder: SentenceEncoder):
    text = "Hey Caroline, hope all's good! I had a quiet weekend. We went camping with my family two weeks ago."
    pieces = ["Hey Caroline, hope all's good!", "I had a quiet weekend.", "We went camping with my family two weeks ago."]
    # One batch, as encode_documents runs it (int8 activations are scaled per batch).
    whole, *each = encoder._vectors([text, *pieces])
    mean = np.array(each).mean(axis=0)
    expected = whole + mean / np.linalg.norm(mean)
    expected /= np.linalg.norm(expected)
    (got,) = encoder.encode_documents([text])
    assert np.allclose(got, expected, atol=1e-5) and abs(float(np.linalg.norm(got)) - 1.0) < 1e-5
    # In a batch with others, each text keeps its own sentences (to the batch's int8 scaling).
    batch = np.array(encoder.encode_documents(["ok", text, "Fine. Thanks."]))
    assert float(batch[1] @ np.array(got)) > 0.97 and float(batch[2] @ batch[1]) < 0.9
    assert encoder.encode_documents([]) == []


def test_a_batch_comes_back_in_its_order_whatever_the_passes(encoder: SentenceEncoder, monkeypatch):
    """Texts are regrouped by token count for the model; each vector returns to its text's place."""
    texts = [TEXTS[2], TEXTS[6], TEXTS[1], TEXTS[4], TEXTS[5]]
    alone = np.array([encoder._vectors([t])[0] for t in texts])
    monkeypatch.setattr(encoder, "batch_tokens", 1)  # every text its own pass: exactly the single vectors
    assert np.allclose(encoder._vectors(texts), alone, atol=1e-6)
    monkeypatch.undo()
    together = encoder._vectors(texts)  # 256 tokens at most each: one pass within the budget
    one_pass = encoder.model.encode(texts, normalize_embeddings=True, convert_to_numpy=True, batch_size=len(texts))
    assert np.allclose(together, one_pass, atol=1e-5)
    assert (together @ alone.T).argmax(axis=1).tolist() == list(range(len(texts)))


async def test_passes_run_at_once_give_each_caller_its_own_vectors(encoder: SentenceEncoder):
    """Two workers run two callers' passes at once (the Embedder's setting): every caller gets the
    vectors its texts get alone, whatever the other pass tokenizes meanwhile."""
    import asyncio

    two = SentenceEncoder(threads=1, int8=Settings().embedding_int8, trace_single=False, workers=2)
    calls = [
        ([TEXTS[2], TEXTS[4]], [False, False]),
        ([TEXTS[6], TEXTS[5], TEXTS[1]], [True, False, False]),
        (["Yes. No. Maybe so.", TEXTS[3]], [False, True]),
    ] * 4
    alone = [two.encode_documents(texts, plain) for texts, plain in calls]
    together = await asyncio.gather(*(two.encode_documents_async(texts, plain) for texts, plain in calls))
    assert two.executor._max_workers == 2
    for got, want in zip(together, alone, strict=True):
        assert np.allclose(np.array(got), np.array(want), atol=1e-6)
    # The same vectors as the one-worker encoder's: only where passes run changes.
    assert np.allclose(np.array(alone[0]), np.array(encoder.encode_documents(*calls[0])), atol=1e-6)


def test_one_call_of_several_passes_runs_them_on_the_pool(monkeypatch):
    """A call whose texts make several passes runs them on the pass pool (so one big batch keeps
    both cores busy), and each text gets the vector its pass gives it."""
    import threading

    two = SentenceEncoder(threads=1, int8=Settings().embedding_int8, trace_single=False, workers=2, batch_tokens=64)
    one = SentenceEncoder(threads=1, int8=Settings().embedding_int8, trace_single=False, batch_tokens=64)
    texts = [TEXTS[2], TEXTS[4], TEXTS[5], TEXTS[6], "Yes. No. Maybe so.", TEXTS[3], TEXTS[1]]
    ran_on: list[str] = []
    real_pass = two._pass

    def recording(group):
        ran_on.append(threading.current_thread().name)
        return real_pass(group)

    monkeypatch.setattr(two, "_pass", recording)
    together = two._vectors(texts)
    assert len(ran_on) > 1 and all(name.startswith("encoder-pass") for name in ran_on)
    assert np.allclose(together, one._vectors(texts), atol=1e-6)
