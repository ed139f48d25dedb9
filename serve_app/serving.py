"""Deploy a Serve config file onto a local Ray, the way `serve run config.yaml` does.

Configs are validated strictly first: Ray's ServeDeploySchema silently drops unknown keys, so a
misspelt `max_ongoing_request` would otherwise deploy with the default.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel


class ConfigError(ValueError):
    pass


def _unknown_keys(model: type[BaseModel], data: Any, where: str) -> list[str]:
    """Keys of `data` that `model` (recursively) does not define."""
    if not isinstance(data, dict):
        return []
    problems = []
    fields = model.model_fields
    for key, value in data.items():
        field = fields.get(key) or next((f for f in fields.values() if f.alias == key), None)
        if field is None:
            problems.append(f"{where}.{key}")
            continue
        for candidate in _models_in(field.annotation):
            if isinstance(value, list):
                for i, item in enumerate(value):
                    problems += _unknown_keys(candidate, item, f"{where}.{key}[{i}]")
            else:
                problems += _unknown_keys(candidate, value, f"{where}.{key}")
    return problems


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found = []
    for arg in get_args(annotation):
        found += _models_in(arg)
    return found


def load_serve_config(path: str | Path, *, host: str | None = None, port: int | None = None):
    """Parse and strictly validate a Serve config file; optionally override the HTTP host and port."""
    from ray.serve.schema import ServeDeploySchema

    raw = yaml.safe_load(Path(path).read_text())
    problems = _unknown_keys(ServeDeploySchema, raw, Path(path).name)
    if problems:
        raise ConfigError(f"unknown keys in {path}: {', '.join(problems)}")
    raw.setdefault("http_options", {})
    if host is not None:
        raw["http_options"]["host"] = host
    if port is not None:
        raw["http_options"]["port"] = port
    return ServeDeploySchema.model_validate(raw)


def ray_temp_dir(data_dir: Path) -> str:
    """A short per-data-dir Ray temp dir (Unix socket paths are limited to ~107 bytes)."""
    digest = hashlib.sha1(str(data_dir.resolve()).encode()).hexdigest()[:10]
    return f"/tmp/memserve-ray-{digest}"


def start_ray(temp_dir: str, *, num_cpus: int | None = None, metrics_port: int | None = None) -> None:
    import ray

    os.environ.setdefault("RAY_TMPDIR", temp_dir)
    # Inherited by every Ray worker: glibc's default of 8 arenas per core lets the torch replicas'
    # resident memory creep up under load (bench/memory.py); two arenas keep it flat.
    os.environ.setdefault("MALLOC_ARENA_MAX", "2")
    kwargs: dict[str, Any] = {"namespace": "serve", "include_dashboard": False, "_temp_dir": temp_dir, "log_to_driver": True}
    if num_cpus:
        kwargs["num_cpus"] = num_cpus
    if metrics_port:
        kwargs["_metrics_export_port"] = metrics_port
    ray.init(**kwargs)


def deploy_config(config, timeout_s: float = 180.0) -> None:
    """Start Serve with the config's HTTP options and deploy its applications; wait until RUNNING."""
    from ray.serve._private import api as serve_api
    from ray.serve.config import gRPCOptions

    client = serve_api.serve_start(
        http_options=config.http_options.model_dump(),
        grpc_options=gRPCOptions(**config.grpc_options.model_dump()),
        proxy_location=config.proxy_location,
    )
    client.deploy_apps(config, _blocking=False)
    wait_running([app.name for app in config.applications], timeout_s)


def wait_running(app_names: list[str], timeout_s: float) -> None:
    from ray import serve
    from ray.serve.schema import ApplicationStatus

    deadline = time.monotonic() + timeout_s
    status = None
    while time.monotonic() < deadline:
        status = serve.status()
        states = {name: status.applications.get(name) for name in app_names}
        if all(s is not None and s.status == ApplicationStatus.RUNNING for s in states.values()):
            return
        failed = {n: s.message for n, s in states.items() if s is not None and s.status == ApplicationStatus.DEPLOY_FAILED}
        if failed:
            raise RuntimeError(f"deployment failed: {failed}")
        time.sleep(0.5)
    raise TimeoutError(f"applications not RUNNING after {timeout_s}s: {status}")
