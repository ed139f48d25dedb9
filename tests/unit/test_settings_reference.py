"""Every setting says what it is for: the configuration reference (docs/configuration.md) is built
from `Settings` at every `mkdocs build`, so a setting without a description is a blank row there."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from serve_app.settings import Settings

_HOOK = Path(__file__).resolve().parents[2] / "docs" / "hooks" / "reference.py"
_spec = importlib.util.spec_from_file_location("memserve_docs_reference", _HOOK)
reference = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reference)  # the hook mkdocs.yml runs, loaded by path: docs/ is no package


def test_every_setting_has_a_description():
    missing = [name for name, field in Settings.model_fields.items() if not (field.description or "").strip()]
    assert not missing, f"settings without a description (Field(..., description=...)): {missing}"


def test_the_reference_names_every_setting_with_its_environment_variables():
    rows = {row.name: row for row in reference.settings_rows()}
    assert list(rows) == list(Settings.model_fields)
    assert rows["session_ttl_s"].env == ["MEMSERVE_SESSION_TTL_S"]
    assert rows["redis_url"].env == ["REDIS_URL", "MEMSERVE_REDIS_URL"]
    assert rows["session_ttl_s"].default == "604800"
    assert rows["ui_secret"].default == '""' and rows["llm_api_key"].default == '""'
    assert rows["llm_mode"].type == "'none' | 'openai' | 'ray-serve-llm'"
