"""Offline validation of the Kubernetes manifests in kuberay/: built-in kinds and the RayService.

KubeRay's CRD accepts unknown keys, so a misspelt `enableInTreeAutoScaling` would deploy silently
with a default; here it is an error that names the key (Serve configs: `serve_config.py`).
"""

from __future__ import annotations

import copy
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

KUBERNETES_VERSION = "1.32.0"


def strict_openapi(schema: dict[str, Any]) -> dict[str, Any]:
    """Copy of an OpenAPI v3 schema where every object with declared properties rejects other keys."""
    schema = copy.deepcopy(schema)

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    visit(schema)
    return schema


@lru_cache(maxsize=4)
def rayservice_schema(crd_path: str, version: str = "v1") -> dict[str, Any]:
    crd = yaml.safe_load(Path(crd_path).read_text())
    for entry in crd["spec"]["versions"]:
        if entry["name"] == version:
            return strict_openapi(entry["schema"]["openAPIV3Schema"])
    raise ValueError(f"{crd_path} has no version {version}")


def rayservice_errors(doc: dict[str, Any], crd_path: str | Path) -> list[str]:
    """Every violation of the strict RayService schema, as 'path: message'."""
    from jsonschema import Draft7Validator

    validator = Draft7Validator(rayservice_schema(str(crd_path), doc.get("apiVersion", "ray.io/v1").split("/")[-1]))
    return [
        f"{'.'.join(str(p) for p in error.absolute_path) or '<root>'}: {error.message}"
        for error in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))
    ]


def kubernetes_errors(doc: dict[str, Any], version: str = KUBERNETES_VERSION) -> list[str]:
    """Violations of the strict Kubernetes schema of a built-in kind (unknown keys included)."""
    import kubernetes_validate

    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = ".".join(str(p) for p in exc.path)
        return [f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')} {path}: {exc.message}"]
    return []
