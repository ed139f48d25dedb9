"""The documentation site builds with warnings as errors: a broken link or anchor, a page missing
from the navigation, a missing image or snippet, or a reference generator that fails stops the build.
The READMEs link into docs/ from outside the site, so their links are checked against the build."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
READMES = ("README.md", "bench/README.md", "kuberay/README.md")
LINK = re.compile(r"\]\(([^)\s#]+)(?:#([^)\s]+))?\)")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("docs") / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", "mkdocs.yml", "--site-dir", str(site)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return site


def test_the_site_builds_strict_with_its_generated_references(site):
    configuration = (site / "configuration" / "index.html").read_text()
    assert "MEMSERVE_SESSION_TTL_S" in configuration and 'id="llm_api_key"' in configuration
    reference = (site / "api" / "reference" / "index.html").read_text()
    assert "/v1/context" in reference and 'id="schema-contextrequestin"' in reference
    assert (site / "api" / "openapi.json").is_file()
    chat = (site / "api" / "chat" / "index.html").read_text()
    assert "tiny-qwen" in chat and "--8&lt;--" not in chat  # the README's example, included whole


@pytest.mark.parametrize("readme", READMES)
def test_the_readmes_links_reach_a_file_and_its_anchor(site, readme):
    source = ROOT / readme
    broken = []
    for target, anchor in LINK.findall(source.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path = (source.parent / target).resolve()
        if not path.exists():
            broken.append(f"{target}: no such file")
            continue
        if anchor and path.suffix == ".md" and path.is_relative_to(ROOT / "docs"):
            page = path.relative_to(ROOT / "docs").with_suffix("")
            html = site / (page.parent if page.name == "index" else page) / "index.html"
            if f'id="{anchor}"' not in html.read_text():
                broken.append(f"{target}#{anchor}: no such anchor")
    assert not broken, f"{readme}: {broken}"
