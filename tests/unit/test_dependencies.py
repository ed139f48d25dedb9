"""Every package the product imports is declared: a module-level import by the core dependencies (a
plain `pip install agent-memory-serve` must import every module), a lazy one at least by an extra."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("serve_app",)


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _imports(path: Path) -> tuple[set[str], set[str]]:
    """Top-level names imported at module level, and inside functions."""
    tree = ast.parse(path.read_text())
    top, lazy = set(), set()
    module_level = {id(node) for node in tree.body} | {
        id(child) for node in tree.body if isinstance(node, ast.If | ast.Try) for child in ast.walk(node)
    }
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        for name in names:
            (top if id(node) in module_level else lazy).add(name.split(".")[0])
    return top, lazy


def test_imports_are_declared():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {_name(r) for r in project["dependencies"]}
    extras = {_name(r) for group in project["optional-dependencies"].values() for r in group}
    distributions = {module: {d.lower().replace("_", "-") for d in dists} for module, dists in packages_distributions().items()}
    undeclared, lazy_only = [], []
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            top, lazy = _imports(path)
            for module, where in [(m, "module level") for m in top] + [(m, "lazily") for m in lazy - top]:
                if module in sys.stdlib_module_names or module in PRODUCT:
                    continue
                dists = distributions.get(module, {module})
                # A distribution installed as a dependency of a declared one (ray brings its own) counts
                # only if declared itself: the product imports it by name.
                if where == "module level" and not dists & core:
                    undeclared.append(f"{path.relative_to(ROOT)}: {module} ({', '.join(sorted(dists))})")
                elif not dists & (core | extras):
                    lazy_only.append(f"{path.relative_to(ROOT)}: {module} ({', '.join(sorted(dists))})")
    assert not undeclared, "imported at module level but not a core dependency:\n" + "\n".join(undeclared)
    assert not lazy_only, "imported lazily but declared nowhere:\n" + "\n".join(lazy_only)
