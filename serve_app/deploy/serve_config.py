"""Serve config files, validated strictly: Ray's ServeDeploySchema silently drops unknown keys, so a
misspelt `max_ongoing_request` would otherwise deploy with the default. Here it is an error that
names the key.
"""

from __future__ import annotations

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
