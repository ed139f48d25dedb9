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


def test_builtin_kinds_validate_against_strict_kubernetes_schemas(rendered):
    errors = [e for doc in rendered if doc["kind"] != "RayService" for e in kubernetes_errors(doc)]
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
        assert container["readinessProbe"]
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
    from serve_app.embedded.launchers import _ephemeral_low

    env = throughput_env()
    ports = [int(env[var]) for var in SIDE_PORT_VARS if var in env]
    assert ports and all(1024 <= port < _ephemeral_low() for port in ports)
