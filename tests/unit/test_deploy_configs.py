"""Offline validation of configs/ and kuberay/: strict schemas, one source for serveConfigV2, no drift."""

from __future__ import annotations

import copy
import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from serve_app.deploy.manifests import kubernetes_errors, rayservice_errors
from serve_app.deploy.serve_config import ConfigError, load_serve_config

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
CRD = Path(os.environ.get("MEMSERVE_RAYSERVICE_CRD", ROOT.parent / "shared" / "schemas" / "ray.io_rayservices.yaml"))
needs_crd = pytest.mark.skipif(not CRD.exists(), reason=f"RayService CRD schema not found at {CRD}")


@pytest.fixture(scope="module")
def rendered() -> list[dict]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    out = subprocess.run([kubectl, "kustomize", str(ROOT / "kuberay")], check=True, capture_output=True, text=True).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def _import_target(import_path: str):
    module, _, attr = import_path.partition(":")
    return getattr(importlib.import_module(module), attr)


def _deployment_names(app) -> set[str]:
    """Names of every deployment bound into an application graph."""
    from ray.serve.deployment import Application

    names: set[str] = set()

    def walk(node) -> None:
        if isinstance(node, Application):
            bound = node._bound_deployment
            names.add(bound._name)
            for arg in [*bound.init_args, *bound.init_kwargs.values()]:
                walk(arg)
        elif isinstance(node, (list, tuple)):
            for item in node:
                walk(item)
        elif isinstance(node, dict):
            for item in node.values():
                walk(item)

    walk(app)
    return names


def _vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_serve_configs_are_strictly_valid_and_match_the_app(path):
    config = load_serve_config(path)
    for app_config in config.applications:
        if app_config.import_path.startswith("ray.serve.llm") and not _vllm_installed():
            continue  # ray.serve.llm imports vLLM: built for real in tests/llm, where vLLM is installed
        target = _import_target(app_config.import_path)
        args = dict(app_config.args)
        app = target(args) if callable(target) else target
        built = _deployment_names(app)
        for deployment in app_config.deployments:
            assert deployment.name in built, f"{path.name}: deployment {deployment.name} is not in {app_config.import_path}"


def test_misspelt_serve_key_fails_naming_it(tmp_path):
    raw = yaml.safe_load((ROOT / "configs" / "local.yaml").read_text())
    raw["applications"][0]["deployments"][0]["max_ongoing_request"] = 5
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match="max_ongoing_request"):
        load_serve_config(bad)


def test_kustomize_renders_every_part(rendered):
    kinds = sorted(f"{d['kind']}/{d['metadata']['name']}" for d in rendered)
    assert "RayService/memserve" in kinds
    for name in ("memserve-redis", "memserve-postgres", "memserve-milvus"):
        assert f"StatefulSet/{name}" in kinds and f"Service/{name}" in kinds


def _builtin(doc: dict) -> bool:
    return doc["kind"] != "RayService" and not doc["apiVersion"].startswith("monitoring.coreos.com/")


def test_builtin_kinds_validate_against_strict_kubernetes_schemas(rendered):
    errors = [e for doc in rendered if _builtin(doc) for e in kubernetes_errors(doc)]
    assert errors == []


@needs_crd
def test_rayservice_validates_against_the_strict_crd(rendered):
    (rayservice,) = [d for d in rendered if d["kind"] == "RayService"]
    assert rayservice_errors(rayservice, CRD) == []


@needs_crd
def test_misspelt_rayservice_key_fails_naming_it(rendered):
    (rayservice,) = [copy.deepcopy(d) for d in rendered if d["kind"] == "RayService"]
    cluster = rayservice["spec"]["rayClusterConfig"]
    cluster["enableInTreeAutoScaling"] = cluster.pop("enableInTreeAutoscaling")
    errors = rayservice_errors(rayservice, CRD)
    assert any("enableInTreeAutoScaling" in e for e in errors), errors


def test_serve_config_v2_is_configs_cluster_yaml(rendered):
    (rayservice,) = [d for d in rendered if d["kind"] == "RayService"]
    embedded = yaml.safe_load(rayservice["spec"]["serveConfigV2"])
    assert embedded == yaml.safe_load((ROOT / "configs" / "cluster.yaml").read_text()), (
        "serveConfigV2 drifted from configs/cluster.yaml: run python kuberay/sync_serve_config.py"
    )
    load_serve_config(ROOT / "configs" / "cluster.yaml")


def test_cluster_shape(rendered):
    (rayservice,) = [d for d in rendered if d["kind"] == "RayService"]
    cluster = rayservice["spec"]["rayClusterConfig"]
    assert cluster["enableInTreeAutoscaling"] is True
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    groups = {g["groupName"]: g for g in cluster["workerGroupSpecs"]}
    gpu = groups["gpu"]["template"]["spec"]["containers"][0]["resources"]
    assert gpu["limits"]["nvidia.com/gpu"] == 1
    for group in groups.values():
        assert group["minReplicas"] <= group["maxReplicas"]
        container = group["template"]["spec"]["containers"][0]
        assert container["resources"]["requests"] and container["resources"]["limits"]
        # KubeRay injects a probe on RayService workers (raylet and Serve proxy); ours would replace it.
        assert "readinessProbe" not in container
    envs = [e for g in groups.values() for e in g["template"]["spec"]["containers"][0]["env"]]
    secrets_inlined = [e for e in envs if "PASSWORD" in e["name"] and "value" in e]
    assert secrets_inlined == []


def test_sync_tool_is_idempotent():
    before = (ROOT / "kuberay" / "rayservice.yaml").read_text()
    subprocess.run([sys.executable, str(ROOT / "kuberay" / "sync_serve_config.py")], check=True)
    assert (ROOT / "kuberay" / "rayservice.yaml").read_text() == before


def test_the_private_serve_calls_that_deploy_a_config_are_where_this_ray_has_them():
    """`deploy_config` uses Serve's private serve_start and deploy_apps (the public way is the
    dashboard's REST API): an upgrade of Ray that moves or changes them fails here, not in `up`."""
    import inspect
    import re

    import ray
    from ray.serve._private import api as serve_api
    from ray.serve._private.client import ServeControllerClient

    pinned = re.search(r'"ray\[serve\]==([\d.]+)"', (ROOT / "pyproject.toml").read_text())
    assert pinned and ray.__version__ == pinned.group(1), "Ray is pinned: check deploy_config before moving the pin"
    start = inspect.signature(serve_api.serve_start).parameters
    assert {"http_options", "grpc_options", "proxy_location"} <= start.keys()
    assert list(inspect.signature(ServeControllerClient.deploy_apps).parameters) == ["self", "config", "_blocking"]
    assert inspect.signature(serve_api.serve_start).return_annotation in (ServeControllerClient, "ServeControllerClient")


def test_side_ports_of_a_local_ray_stay_out_of_the_ephemeral_range():
    """HAProxy binds them after Ray starts: an outgoing connection must not have taken one meanwhile."""
    from serve_app.deploy.local_ray import SIDE_PORT_VARS, throughput_env
    from serve_app.embedded.ports import ephemeral_low

    env = throughput_env()
    ports = [int(env[var]) for var in SIDE_PORT_VARS if var in env]
    assert ports and all(1024 <= port < ephemeral_low() for port in ports)


def test_only_a_taken_side_port_is_a_reason_to_start_again():
    """HAProxy's bind failure on a port Ray chose for it is retried; on the HTTP port (the user's) it is not."""
    from serve_app.deploy.local_ray import taken_side_port

    failure = (
        "HAProxy crashed during startup: [ALERT]    (17973) : Binding [/tmp/haproxy-serve/x/haproxy.cfg:95] for proxy "
        "stats: cannot bind socket (Address already in use) for [0.0.0.0:{port}]"
    )
    assert taken_side_port(RuntimeError(failure.format(port=31415)), {31415, 20001}) == 31415
    assert taken_side_port(RuntimeError(failure.format(port=8000)), {31415, 20001}) is None
    assert taken_side_port(RuntimeError("deployment failed: {'memserve': 'ImportError'}"), {31415}) is None


def test_a_start_is_tried_again_only_for_a_taken_side_port_and_each_failed_one_is_stopped():
    """The retry of `memserve up` (head_node.serve_on_head) and of the in-process start alike."""
    from serve_app.deploy.local_ray import BIND_ATTEMPTS, starts_until_bound

    taken = "cannot bind socket (Address already in use) for [0.0.0.0:{port}]"

    def run(failures: list[str]) -> tuple[list[str], int | Exception]:
        calls: list[str] = []
        ports = iter(range(31000, 31100))

        def start() -> set[int]:
            calls.append("start")
            return {next(ports)}

        def serve() -> None:
            calls.append("serve")
            if failures:
                raise RuntimeError(failures.pop(0).format(port=30999 + calls.count("start")))

        try:
            return calls, starts_until_bound(start, serve, lambda: calls.append("stop"))
        except RuntimeError as exc:
            return calls, exc

    calls, starts = run([taken])
    assert (calls, starts) == (["start", "serve", "stop", "start", "serve"], 2)
    calls, error = run(["deployment failed: ImportError"])
    assert calls == ["start", "serve", "stop"] and "ImportError" in str(error)
    calls, error = run([taken] * BIND_ATTEMPTS)
    assert calls.count("start") == BIND_ATTEMPTS and calls[-1] == "stop" and isinstance(error, RuntimeError)


def test_memserve_ups_ray_node_has_ports_of_its_own_a_token_and_no_monitors(monkeypatch):
    """Another Ray may run on the machine (the tests beside a benchmark): none of Ray's fixed default
    ports; the node's token is in its environment, not in a file another node would read; no
    autoscaler monitor or log monitor, which a node without drivers on one machine has no use for."""
    from serve_app.deploy import head_node
    from serve_app.deploy.head_node import NODE_MARKER, node_env, start_argv

    argv = start_argv("/tmp/memserve-ray-x", 23456, num_cpus=None, metrics_port=None)
    flags = dict(zip(argv, argv[1:], strict=False))
    at = argv.index("start")
    assert argv[at + 1] == "--head" and flags["--port"] == "23456" and flags["--node-ip-address"] == "127.0.0.1"
    assert "--no-monitor" in argv and flags["--include-log-monitor"] == "false" and flags["--include-dashboard"] == "false"
    for flag in ("--dashboard-agent-listen-port", "--ray-client-server-port"):
        assert int(flags[flag]) not in (52365, 10001)
    assert "--block" not in argv, "the node outlives the command that starts it"
    own = [int(flags[f]) for f in ("--port", "--dashboard-agent-listen-port", "--ray-client-server-port")]
    low, high = int(flags["--min-worker-port"]), int(flags["--max-worker-port"])
    assert high - low >= 1000 and all(not low <= port <= high for port in own)
    # A machine whose ephemeral range starts low leaves no room below it: Ray's own range then.
    monkeypatch.setattr(head_node, "ephemeral_low", lambda: 1024)
    assert "--min-worker-port" not in head_node.start_argv("/tmp/memserve-ray-x", 23456, num_cpus=None, metrics_port=None)
    env = node_env("/tmp/memserve-ray-x", {"RAY_SERVE_HAPROXY_STATS_PORT": "20001"}, "secret")
    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN"] == "secret" and "RAY_AUTH_TOKEN_PATH" not in env
    assert env[NODE_MARKER] == "/tmp/memserve-ray-x" and env["RAY_SERVE_HAPROXY_STATS_PORT"] == "20001"


def test_a_ray_node_that_did_not_start_is_started_again_and_not_forever(tmp_path, monkeypatch):
    """`ray start` failing (a raylet that exits before it registers, one start in ten beside a
    Milvus server) costs another start; a `ray` that always fails ends the start with its words."""
    from serve_app.deploy import head_node

    count = tmp_path / "count"
    fake_ray = tmp_path / "ray"  # a test double of the `ray` CLI: the real one cannot be made to fail on demand
    second_passes = f'[ "$(wc -l < {count})" -ge 2 ] && exit 0'
    fake_ray.write_text(f'#!/bin/sh\necho x >> {count}\n{second_passes}\necho "raylet timed out" >&2\nexit 1\n')
    fake_ray.chmod(0o755)
    monkeypatch.setattr(head_node, "RAY", [str(fake_ray)])
    node = head_node.start_head(str(tmp_path / "ray-temp"))
    assert count.read_text().count("x") == 2 and node.auth_token and node.gcs_address.startswith("127.0.0.1:")
    count.write_text("")
    fake_ray.write_text('#!/bin/sh\necho "raylet timed out" >&2\nexit 1\n')
    with pytest.raises(head_node.NodeError, match="raylet timed out"):
        head_node.start_head(str(tmp_path / "ray-temp"))


def test_a_nodes_processes_are_stopped_and_one_that_ignores_sigterm_is_killed(tmp_path):
    """What carries the node's marker stops (the GCS, after the rest), a process that ignores SIGTERM
    is killed after the grace period, and a process without the marker is left alone."""
    import shutil
    import subprocess
    import sys

    from serve_app.deploy.head_node import NODE_MARKER, stop_node_processes

    temp = str(tmp_path / "node")
    env = {**os.environ, NODE_MARKER: temp}
    gcs = tmp_path / "gcs_server"  # the GCS is found by its name
    shutil.copy("/bin/sleep", gcs)
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
    procs = [
        subprocess.Popen([str(gcs), "60"], env=env),
        subprocess.Popen(["sleep", "60"], env=env),
        subprocess.Popen([sys.executable, "-c", stubborn], env=env, stdout=subprocess.PIPE, text=True),
    ]
    other = subprocess.Popen(["sleep", "60"])
    try:
        assert procs[2].stdout.readline().strip() == "ready"
        assert stop_node_processes(temp, grace_s=1) == 1
        assert all(p.wait(5) is not None for p in procs)
        assert other.poll() is None
        assert stop_node_processes(temp, grace_s=1, killed_only=False) == 0
    finally:
        for p in (*procs, other):
            p.kill()
            p.wait()


def test_memserve_up_refuses_a_bad_config_whole_before_it_starts_anything(tmp_path):
    """The config is checked in a child (Serve's schema imports Serve): its whole message reaches
    the user, pydantic's field path included, and `up` exits 2 with no data dir made."""
    import subprocess
    import sys

    bad = tmp_path / "bad.yaml"
    bad.write_text("applications:\n  - name: memserve\n    import_path: serve_app.app:build_app\n    route_prefix: 5\n")
    data = tmp_path / "data"
    argv = [sys.executable, "-m", "serve_app.cli", "up", "--data-dir", str(data), "--config", str(bad)]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "applications.0.route_prefix" in run.stdout and "valid string" in run.stdout
    assert not data.exists()


class RayTimingOut:
    """A test double of the `ray` module for ray.init's startup timeout, which a real Ray gives about
    one start in ten beside a Milvus server and cannot be made to give on demand; every Serve test
    starts the real one through the same function."""

    TIMEOUT = "The current node timed out during startup. This could happen because some of the raylet failed to startup"

    def __init__(self, failures: int, error: str = TIMEOUT):
        self.failures, self.error, self.inits, self.shutdowns = failures, error, 0, 0

    def init(self, **kwargs) -> None:
        self.inits += 1
        if self.inits <= self.failures:
            raise Exception(self.error)

    def shutdown(self) -> None:
        self.shutdowns += 1


def test_a_ray_node_that_timed_out_during_startup_is_started_again():
    """Only a node that never came up is started again, and not forever."""
    from serve_app.deploy.local_ray import NODE_ATTEMPTS, _init_node

    once = RayTimingOut(failures=1)
    _init_node(once, {})
    assert (once.inits, once.shutdowns) == (2, 1)

    always = RayTimingOut(failures=NODE_ATTEMPTS)
    with pytest.raises(Exception, match="timed out during startup"):
        _init_node(always, {})
    assert always.inits == NODE_ATTEMPTS

    other = RayTimingOut(failures=1, error="Invalid argument: num_cpus")
    with pytest.raises(Exception, match="Invalid argument"):
        _init_node(other, {})
    assert (other.inits, other.shutdowns) == (1, 0)


def test_a_ray_node_whose_gcs_never_wrote_its_port_is_started_again():
    """The GCS can be gone before it writes the port it listens on: the node never came up either."""
    from serve_app.deploy.local_ray import _init_node

    gcs = RayTimingOut(
        failures=1,
        error="Timed out waiting for file /tmp/memserve-ray-343b5c27da/session_2026-12-07_17-51-31_801978_20536/"
        "gcs_server_port_64cad47351ea8be8a4d88b8dcdec59b8d479db07f4e6ae850a2968eb",
    )
    _init_node(gcs, {})
    assert gcs.inits == 2


def test_what_a_failed_ray_start_left_running_is_stopped_reaper_first(tmp_path):
    """Ray's own reaper, left running by a failed ray.init, is stopped; a process started before the
    attempt, and one that is not Ray's, are not."""
    import os
    import subprocess
    import sys

    import ray

    from serve_app.deploy.local_ray import child_pids, stop_leftovers_of_a_failed_start

    reaper_code = os.path.join(os.path.dirname(ray.__file__), "_private", "ray_process_reaper.py")
    earlier = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", reaper_code])
    before = child_pids()
    # A session of its own: a reaper that read EOF would signal its own process group only.
    reaper = subprocess.Popen([sys.executable, "-u", reaper_code], stdin=subprocess.PIPE, start_new_session=True)
    not_ray = subprocess.Popen(["sleep", "60"])
    try:
        assert stop_leftovers_of_a_failed_start(before) == 1
        assert reaper.poll() is not None
        assert earlier.poll() is None and not_ray.poll() is None
    finally:
        for proc in (earlier, reaper, not_ray):
            proc.kill()
            proc.wait()


def _one(rendered: list[dict], kind: str, name: str | None = None) -> dict:
    (doc,) = [d for d in rendered if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    return doc


def _groups(rendered: list[dict]) -> dict[str, dict]:
    cluster = _one(rendered, "RayService")["spec"]["rayClusterConfig"]
    return {"head": cluster["headGroupSpec"], **{g["groupName"]: g for g in cluster["workerGroupSpecs"]}}


def _kuberay_pod_labels(group: str) -> dict[str, str]:
    """The labels KubeRay puts on every pod of a group (the RayCluster's name is generated)."""
    node_type = "head" if group == "head" else "worker"
    return {"ray.io/is-ray-node": "yes", "ray.io/node-type": node_type, "ray.io/group": "headgroup" if group == "head" else group}


def test_no_rayservice_field_kuberay_ignores(rendered):
    spec = _one(rendered, "RayService")["spec"]
    assert not {"serviceUnhealthySecondThreshold", "deploymentUnhealthySecondThreshold"} & set(spec)


def test_gcs_fault_tolerance_uses_the_redis_service_with_its_secret(rendered):
    options = _one(rendered, "RayService")["spec"]["rayClusterConfig"]["gcsFaultToleranceOptions"]
    redis = _one(rendered, "Service", "memserve-redis")
    host, port = options["redisAddress"].removeprefix("redis://").split(":")
    assert host == redis["metadata"]["name"] and int(port) in {p["port"] for p in redis["spec"]["ports"]}
    assert options["redisPassword"]["valueFrom"]["secretKeyRef"] == {"name": "memserve-secrets", "key": "redis-password"}


def test_disruption_budget_selects_only_the_cpu_workers(rendered):
    budget = _one(rendered, "PodDisruptionBudget")
    wanted = budget["spec"]["selector"]["matchLabels"]
    matched = [g for g in _groups(rendered) if wanted.items() <= _kuberay_pod_labels(g).items()]
    assert matched == ["cpu"] and budget["spec"]["maxUnavailable"] == 1


def test_gpu_group_matches_the_llm_app(rendered):
    llm = yaml.safe_load((ROOT / "configs" / "cluster.yaml").read_text())["applications"][0]["args"]["llm_configs"][0]
    groups = _groups(rendered)
    gpu = groups["gpu"]
    scaling = llm["deployment_config"]["autoscaling_config"]
    assert (gpu["minReplicas"], gpu["maxReplicas"]) == (scaling["min_replicas"], scaling["max_replicas"])
    spec = gpu["template"]["spec"]
    container = spec["containers"][0]
    assert spec["nodeSelector"] and llm["accelerator_type"] in next(iter(spec["nodeSelector"].values()))
    assert container["resources"]["requests"]["ephemeral-storage"]
    # The weights come from the pre-pulled volume, read-only: model_source is a path inside it.
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"] if "persistentVolumeClaim" in v}
    mounts = [m for m in container["volumeMounts"] if m["name"] in claims]
    assert any(llm["model_loading_config"]["model_source"].startswith(m["mountPath"] + "/") and m["readOnly"] for m in mounts)
    assert {c for c in claims.values()} <= {d["metadata"]["name"] for d in rendered if d["kind"] == "PersistentVolumeClaim"}
    # Only the GPU group carries the CUDA image.
    images = {name: g["template"]["spec"]["containers"][0]["image"] for name, g in groups.items()}
    assert images["gpu"] != images["head"] == images["cpu"]
    pull = _one(rendered, "Job", "memserve-model-pull")["spec"]["template"]["spec"]["containers"][0]
    assert [e["valueFrom"]["secretKeyRef"]["name"] for e in pull["env"] if e["name"] == "HF_TOKEN"] == ["memserve-hf"]


def test_pod_monitor_scrapes_every_ray_pod_on_a_declared_port(rendered):
    monitor = _one(rendered, "PodMonitor")
    wanted = monitor["spec"]["selector"]["matchLabels"]
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [_one(rendered, "Namespace")["metadata"]["name"]]
    (port,) = [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]]
    for name, group in _groups(rendered).items():
        assert wanted.items() <= _kuberay_pod_labels(name).items(), name
        ports = {p["name"]: p["containerPort"] for p in group["template"]["spec"]["containers"][0].get("ports", [])}
        assert ports.get(port) == 8080, name  # Ray's metrics export port under KubeRay


def _declared_service_metrics() -> set[str]:
    """The metric names the service declares (ray.util.metrics), as Prometheus sees them."""
    import re

    sources = [*(ROOT / "serve_app").rglob("*.py")]
    pattern = re.compile(r"metrics\.(Counter|Gauge|Histogram)\(\s*\"(memserve_[a-z_]+)\"")
    names = set()
    for source in sources:
        for kind, name in pattern.findall(source.read_text()):
            suffixes = {"Counter": ["_total"], "Gauge": [""], "Histogram": ["_bucket", "_sum", "_count"]}[kind]
            names |= {f"ray_{name}{suffix}" for suffix in suffixes}
    return names


def test_every_alert_queries_a_metric_the_service_or_ray_exports(rendered):
    import re

    from tests.serve.test_metrics import _NOT_METRICS, dashboard_metrics

    rules = [r for group in _one(rendered, "PrometheusRule")["spec"]["groups"] for r in group["rules"]]
    assert {"MemserveMemorizationLagHigh", "MemserveHigh5xxRate", "MemserveSummaryFallbacks"} <= {r["alert"] for r in rules}
    # Serve's own metrics: those the dashboard queries, which tests/serve/test_metrics.py finds exported.
    known = _declared_service_metrics() | {m for m in dashboard_metrics() if m.startswith("ray_serve_")}
    for rule in rules:
        expr = re.sub(r"\[[^\]]*\]", "", re.sub(r"\{[^}]*\}", "", rule["expr"]))
        used = {w for w in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr) if w not in _NOT_METRICS and w.startswith("ray_")}
        assert used and used <= known, (rule["alert"], used - known)


def test_every_autoscaling_config_is_one_ray_accepts_and_the_memorizer_follows_its_backlog():
    from ray.serve.config import AutoscalingConfig

    from serve_app.deploy.autoscaling import MemorizerBacklogPolicy

    config = yaml.safe_load((ROOT / "configs" / "cluster.yaml").read_text())
    found = {}
    for app in config["applications"]:
        for deployment in app.get("deployments", []):
            if "autoscaling_config" in deployment:
                found[deployment["name"]] = AutoscalingConfig(**deployment["autoscaling_config"])
    assert {"Ingress", "Embedder", "Memorizer"} <= set(found)
    policy = found["Memorizer"].policy
    assert policy.get_policy() is MemorizerBacklogPolicy
    assert MemorizerBacklogPolicy(**policy.policy_kwargs).target.target_lag_s == 5


def test_session_logs_go_to_a_redis_cluster_with_replicas_that_confirm_writes(rendered):
    """A failover to an asynchronous replica loses acknowledged turns unless one confirmed them."""
    config = _one(rendered, "ConfigMap", "memserve-config")["data"]
    (rayservice,) = [d for d in rendered if d["kind"] == "RayService"]
    env = {
        e["name"]: e.get("value")
        for e in rayservice["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]
    }
    host = env["REDIS_URL"].rsplit("@", 1)[1].split(":")[0]
    nodes = _one(rendered, "StatefulSet", host)
    args = nodes["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--cluster-enabled") + 1] == "yes" and args[args.index("--appendfsync") + 1] == "always"
    create = " ".join(_one(rendered, "Job", f"{host}-create")["spec"]["template"]["spec"]["containers"][0]["command"])
    replicas_each = int(create.split("--cluster-replicas")[1].split()[0])
    assert nodes["spec"]["replicas"] == 3 * (1 + replicas_each)
    assert config["MEMSERVE_REDIS_CLUSTER"] == "true"
    assert 1 <= int(config["MEMSERVE_REDIS_CONFIRM_REPLICAS"]) <= replicas_each
