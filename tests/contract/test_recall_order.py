"""Recall's order against real PostgreSQL and Milvus Lite: the second stage over what fusion keeps,
or the fusion's own order with `recall_rerank` off; the explained view agrees with both."""

import json
import uuid

import pytest

from serve_app.core.keywords import memory_keywords, normalize
from serve_app.core.ranking import Scored, fuse
from serve_app.core.records import MemoryRow
from serve_app.core.rerank import FEATURES, RerankModel, rerank
from serve_app.services.recall import fusion_params, recall
from serve_app.settings import Settings
from serve_app.stores.bundle import Stores

TEXTS = [
    "We adopted a puppy named Rex from the shelter last week, he is a beagle mix.",
    "Thanks!",
    "Rex loves the park by the river, we walk him there every morning before work.",
    "The vet said Rex needs his second vaccine in March.",
    "Cool, a puppy!",
    "I started a pottery class on Tuesdays.",
    "My sister visited from Lisbon and brought pastries.",
    "Did the puppy sleep through the night?",
    "Yes, mostly, he only woke up once.",
    "We are thinking of a second dog, maybe a puppy again next year.",
]
QUERY = "what do we know about the puppy Rex?"


@pytest.fixture(scope="module")
async def world(backends, encoder):
    settings = Settings(**backends.env, milvus_collection="order_" + uuid.uuid4().hex[:8])
    stores = await Stores.connect(settings)
    user = "u-" + uuid.uuid4().hex[:6]
    vectors = await encoder.encode_async(TEXTS)
    rows = [
        MemoryRow(
            f"{user}-{i}", "t", user, f"s{i % 3}", i + 1, "user", "turn", text, 1_700_000_000_000 + i * 60_000,
            list(vectors[i]), keywords=memory_keywords(text),
        )
        for i, text in enumerate(TEXTS)
    ]  # fmt: skip
    await stores.vectors.upsert(rows)
    await stores.keywords.upsert(rows)
    await stores.vectors.flush()
    yield stores, settings, user, encoder
    await stores.close()


async def _first_stage(stores: Stores, settings: Settings, user: str, vector):
    dense = [
        Scored(i, s) for i, s, _ in await stores.vectors.search_dense_ids("t", user, vector, limit=settings.recall_candidates)
    ]
    found = await stores.keywords.search("t", user, normalize(QUERY), limit=settings.recall_candidates)
    keyword = [Scored(h.id, h.score, None, h.coverage) for h in found]
    details = {h.id: h for h in await stores.keywords.fetch("t", user, [f"{user}-{i}" for i in range(len(TEXTS))])}
    return dense, keyword, fuse(dense, keyword, fusion_params(settings)), details


async def test_the_second_stage_orders_what_fusion_keeps(world):
    stores, settings, user, encoder = world
    vector = (await encoder.encode_async([QUERY]))[0]

    async def embed_one(_: str):
        return vector

    dense, keyword, kept, details = await _first_stage(stores, settings, user, vector)
    expected = rerank(kept, dense, keyword, details)
    found = await recall(stores, embed_one, "t", user, QUERY, top_k=4, settings=settings)
    assert [h.id for h in found.hits] == [f.id for f in expected[:4]]
    assert [h.score for h in found.hits] == [round(f.score, 6) for f in expected[:4]]
    assert all(0 < h.score < 1 for h in found.hits)
    assert [f.id for f in expected] != [f.id for f in kept]  # the second stage changed the fusion's order here

    explained = await recall(stores, embed_one, "t", user, QUERY, top_k=4, settings=settings, explained=True)
    assert [h.id for h in explained.hits] == [h.id for h in found.hits]
    kept_verdicts = [v for v, _ in explained.verdicts if v.kept]
    assert [v.fused.id for v in kept_verdicts] == [h.id for h in found.hits]
    beyond = [v for v, _ in explained.verdicts if v.reason == "beyond_limit"]
    assert [v.fused.id for v in beyond] == [f.id for f in expected[4:]]
    assert all(v.fused.fused_score is not None for v in kept_verdicts + beyond)


async def test_with_the_second_stage_off_the_fusion_decides(world):
    stores, settings, user, encoder = world
    plain = settings.model_copy(update={"recall_rerank": False})
    vector = (await encoder.encode_async([QUERY]))[0]

    async def embed_one(_: str):
        return vector

    _, _, kept, _ = await _first_stage(stores, plain, user, vector)
    found = await recall(stores, embed_one, "t", user, QUERY, top_k=4, settings=plain)
    assert [h.id for h in found.hits] == [f.id for f in kept[:4]]
    assert [h.score for h in found.hits] == [round(f.score, 6) for f in kept[:4]]


async def test_a_model_fitted_elsewhere_orders_recall(world, tmp_path):
    """`recall_rerank_model`: a model file (as bench.rerank_fit --model-out writes one) replaces the
    shipped model; here one that reads the text's length alone, shortest first."""
    stores, settings, user, encoder = world
    n = len(FEATURES)
    shortest_first = RerankModel(
        mean=(0.0,) * n, scale=(1.0,) * n, weight=tuple(-1.0 if f == "length" else 0.0 for f in FEATURES), bias=0.0,
        low=(-1e9,) * n, high=(1e9,) * n,
    )  # fmt: skip
    path = tmp_path / "model.json"
    path.write_text(json.dumps(shortest_first.to_dict()))
    own = Settings(**{**settings.model_dump(), "recall_rerank_model": str(path)})
    vector = (await encoder.encode_async([QUERY]))[0]

    async def embed_one(_: str):
        return vector

    found = await recall(stores, embed_one, "t", user, QUERY, top_k=10, settings=own)
    lengths = [len(h.text) for h in found.hits]
    assert len(lengths) > 2 and lengths == sorted(lengths)
    shipped = await recall(stores, embed_one, "t", user, QUERY, top_k=10, settings=settings)
    assert [h.id for h in shipped.hits] != [h.id for h in found.hits]
