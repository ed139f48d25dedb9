"""The second-stage ranking: its features, its order and the explained view of it (pure)."""

import json
import math
from dataclasses import dataclass, replace

import pytest

from serve_app.core.ranking import FusionParams, Scored, explain, fuse
from serve_app.core.rerank import FEATURES, SHIPPED_MODEL, RerankModel, SecondStage, features, reordered, rerank

DENSE = [Scored("a", 0.80), Scored("b", 0.60), Scored("c", 0.40)]
KEYWORD = [Scored("b", 9.0, coverage=0.9), Scored("d", 3.0, coverage=0.5)]


@dataclass
class Memory:
    session_id: str
    text: str
    role: str = "assistant"


def memory(session: str, length: int, role: str = "assistant") -> Memory:
    return Memory(session, "x" * length, role)


ABOUT = {"a": memory("s1", 10), "b": memory("s1", 200, "user"), "c": memory("s2", 50), "d": memory("s1", 0)}
PARAMS = FusionParams(min_similarity=-1)


def only(feature: str, weight: float = 1.0) -> RerankModel:
    """A model that looks at one feature alone."""
    n = len(FEATURES)
    weights = tuple(weight if name == feature else 0.0 for name in FEATURES)
    return RerankModel(mean=(0.0,) * n, scale=(1.0,) * n, weight=weights, bias=0.0, low=(-1e9,) * n, high=(1e9,) * n)


def test_features_follow_their_definitions():
    fused = fuse(DENSE, KEYWORD, PARAMS)
    assert [f.id for f in fused] == ["b", "d", "a", "c"]
    rows = {
        f.id: dict(zip(FEATURES, row, strict=True)) for f, row in zip(fused, features(fused, DENSE, KEYWORD, ABOUT), strict=True)
    }
    assert rows["b"]["fused"] == 1.0 and rows["a"]["fused"] < 1.0
    assert rows["b"]["similarity"] == pytest.approx(0.60 - 0.80)
    assert rows["d"]["similarity"] == pytest.approx(0.40 - 0.80)  # keyword-only: the dense side's worst
    assert rows["a"]["dense_rank"] == pytest.approx(1 / 20) and rows["d"]["dense_rank"] == 0.0
    assert rows["b"]["keyword_share"] == 1.0 and rows["d"]["keyword_share"] == pytest.approx(3 / 9)
    assert rows["a"]["keyword_share"] == 0.0 and rows["a"]["keyword_rank"] == 0.0 and rows["a"]["coverage"] == 0.0
    assert rows["d"]["coverage"] == 0.5
    assert rows["b"]["length"] == pytest.approx(math.log1p(200))
    # s1 holds b, d, a in fused order; c is alone in s2
    assert [rows[i]["session_above"] for i in "bdac"] == pytest.approx([0.0, math.log1p(1), math.log1p(2), 0.0])
    assert [rows[i]["user_turn"] for i in "bdac"] == [1.0, 0.0, 0.0, 0.0]


def test_the_model_decides_the_order_and_its_probability_is_the_score():
    fused = fuse(DENSE, KEYWORD, PARAMS)
    by_length = rerank(fused, DENSE, KEYWORD, ABOUT, only("length"))
    assert [f.id for f in by_length] == ["b", "c", "a", "d"]
    assert all(0.0 < f.score < 1.0 for f in by_length)
    assert [f.score for f in by_length] == sorted((f.score for f in by_length), reverse=True)
    first_stage = {f.id: f.score for f in fused}
    assert {f.id: f.fused_score for f in by_length} == first_stage
    # the fused score alone keeps the fusion's order
    assert [f.id for f in rerank(fused, DENSE, KEYWORD, ABOUT, only("fused"))] == [f.id for f in fused]


def test_equal_probabilities_keep_the_fused_order():
    fused = fuse(DENSE, KEYWORD, PARAMS)
    blind = only("length", 0.0)
    assert [f.id for f in rerank(fused, DENSE, KEYWORD, ABOUT, blind)] == [f.id for f in fused]


def test_no_candidates_no_work():
    assert rerank([], [], [], {}) == []


def test_the_shipped_model_prefers_a_turn_that_says_something():
    """Two candidates tied on everything but length: the shipped weights favour the longer text."""
    dense = [Scored("short", 0.5), Scored("long", 0.5)]
    fused = fuse(dense, [], PARAMS)
    about = {"short": memory("s", 7), "long": memory("s", 160)}
    assert SHIPPED_MODEL.short.weight[FEATURES.index("length")] > 0
    scored = {f.id: f.score for f in rerank(fused, dense, [], about)}
    assert scored["long"] > scored["short"]


def test_explained_verdicts_follow_the_second_stage():
    params = FusionParams(min_similarity=0.5, min_keyword_share=0.5)
    verdicts = explain(DENSE, KEYWORD, params)
    kept = [v.fused for v in verdicts if v.kept]
    ranked = rerank(kept, DENSE, KEYWORD, ABOUT, only("length"))
    out = reordered(verdicts, ranked, limit=1)
    assert [v.fused.id for v in out[: len(ranked)]] == [f.id for f in ranked]
    assert out[0].kept and all(not v.kept and v.reason == "beyond_limit" for v in out[1 : len(ranked)])
    stopped = [v for v in verdicts if not v.kept]
    assert out[len(ranked) :] == stopped and all(v.reason.endswith("_floor") for v in stopped)
    assert {v.fused.id for v in out} == {v.fused.id for v in verdicts}


def test_the_model_does_not_extrapolate_past_what_it_was_fitted_on():
    """A memory far longer than any turn of the fitting data scores as the longest of those did."""
    model = SHIPPED_MODEL.long
    longest = round(math.exp(model.high[FEATURES.index("length")]) - 1)
    dense = [Scored("m", 0.5)]
    fused = fuse(dense, [], PARAMS)

    def score(length: int, model: RerankModel = model) -> float:
        return rerank(fused, dense, [], {"m": memory("s", length)}, model)[0].score

    assert score(20_000) == pytest.approx(score(longest)) and score(longest) > score(longest // 4)
    unbounded = replace(model, low=(-1e9,) * len(FEATURES), high=(1e9,) * len(FEATURES))
    assert score(20_000, unbounded) > 1.5 * score(longest, unbounded)  # what the bounds prevent


def test_a_model_file_reads_back_as_the_same_models_and_a_file_of_one_model_serves_both_kinds(tmp_path):
    path = tmp_path / "model.json"
    path.write_text(json.dumps(SHIPPED_MODEL.to_dict()))
    assert SecondStage.from_file(path) == SHIPPED_MODEL
    path.write_text(json.dumps(SHIPPED_MODEL.long.to_dict()))
    assert SecondStage.from_file(path) == SecondStage(SHIPPED_MODEL.long, SHIPPED_MODEL.long)


def test_a_list_of_long_memories_is_ranked_by_the_long_model():
    """By the list's median length: a list of chat turns by one model, one of passages of long turns by the other."""
    dense = [Scored("a", 0.5), Scored("b", 0.4), Scored("c", 0.3)]
    fused = fuse(dense, [], PARAMS)
    stage = SecondStage(only("length", 1.0), only("length", -1.0))
    chat = {"a": memory("s", 40), "b": memory("s", 120), "c": memory("s", 2000)}
    plans = {"a": memory("s", 40), "b": memory("s", 600), "c": memory("s", 2000)}
    assert [f.id for f in rerank(fused, dense, [], chat, stage)] == ["c", "b", "a"]  # the short model
    assert [f.id for f in rerank(fused, dense, [], plans, stage)] == ["a", "b", "c"]  # the long model


@pytest.mark.parametrize(
    "change, message",
    [
        ({"features": [*FEATURES[:-1], "neighbour"]}, "fitted on the features"),
        ({"weight": [1.0, 2.0]}, "weight needs"),
        ({"scale": [0.0] * len(FEATURES)}, "scales must be positive"),
    ],
)
def test_a_model_fitted_on_other_features_or_malformed_is_refused(change, message):
    with pytest.raises(ValueError, match=message):
        RerankModel.from_dict({**SHIPPED_MODEL.short.to_dict(), **change})


def test_settings_refuse_a_model_file_that_is_not_one(tmp_path):
    from serve_app.settings import Settings

    broken = tmp_path / "broken.json"
    broken.write_text('{"features": []}')
    with pytest.raises(ValueError, match="is not a second-stage model file"):
        Settings(recall_rerank_model=str(broken))
    with pytest.raises(ValueError, match="is not a second-stage model file"):
        Settings(recall_rerank_model=str(tmp_path / "missing.json"))
    assert Settings().rerank_model() is SHIPPED_MODEL
