"""The memorizer's autoscaling arithmetic, and the Serve policy that feeds it recorded stats."""

from __future__ import annotations

from types import SimpleNamespace

from serve_app.core.memorizer_scaling import BacklogTarget, desired_memorizers
from serve_app.deploy.autoscaling import MemorizerBacklogPolicy

TARGET = BacklogTarget(sessions_per_replica=32, target_lag_s=5)


def test_no_work_asks_for_no_replicas_beyond_the_minimum():
    assert desired_memorizers(0, 0.0, 3, TARGET) == 0


def test_the_count_asks_for_a_replica_per_share_of_waiting_sessions():
    assert desired_memorizers(1, 0.1, 1, TARGET) == 1
    assert desired_memorizers(32, 0.1, 1, TARGET) == 1
    assert desired_memorizers(33, 0.1, 1, TARGET) == 2
    assert desired_memorizers(100, 0.1, 1, TARGET) == 4


def test_lag_over_the_target_adds_replicas_even_when_few_sessions_wait():
    assert desired_memorizers(3, 12.0, 1, TARGET) >= 2  # few sessions, but long ones
    assert desired_memorizers(3, 20.0, 2, TARGET) == 8  # four times the target lag: four times the replicas
    assert desired_memorizers(3, 4.0, 2, TARGET) == 1  # within the target: the count decides


def test_stale_lag_without_waiting_sessions_adds_nothing():
    assert desired_memorizers(0, 60.0, 2, TARGET) == 0


def test_the_policy_reads_the_largest_report_of_the_replicas():
    policy = MemorizerBacklogPolicy(sessions_per_replica=10, target_lag_s=5)
    ctx = SimpleNamespace(
        current_num_replicas=2,
        aggregated_metrics={"waiting_sessions": {"r1": 5.0, "r2": 45.0}, "lag_s": {"r1": 1.0, "r2": 2.0}},
    )
    desired, state = policy(ctx)
    assert desired == 5 and state["waiting_sessions"] == 45.0


def test_the_policy_with_no_reports_yet_asks_for_nothing():
    desired, _ = MemorizerBacklogPolicy()(SimpleNamespace(current_num_replicas=1, aggregated_metrics={}))
    assert desired == 0
