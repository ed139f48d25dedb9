"""Copy configs/cluster.yaml into the RayService's serveConfigV2 (one source; a test checks drift).

python kuberay/sync_serve_config.py
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEGIN = "# SERVE-CONFIG-BEGIN (generated from configs/cluster.yaml; do not edit here)"
END = "# SERVE-CONFIG-END"


def render(rayservice: str, cluster_yaml: str, indent: str = "    ") -> str:
    body = "\n".join((indent + line) if line.strip() else "" for line in cluster_yaml.rstrip().splitlines())
    pattern = re.compile(re.escape(indent + BEGIN) + r".*?" + re.escape(indent + END), re.S)
    if not pattern.search(rayservice):
        raise SystemExit("serveConfigV2 markers not found in kuberay/rayservice.yaml")
    return pattern.sub(lambda _: f"{indent}{BEGIN}\n{body}\n{indent}{END}", rayservice)


def main() -> None:
    target = ROOT / "kuberay" / "rayservice.yaml"
    target.write_text(render(target.read_text(), (ROOT / "configs" / "cluster.yaml").read_text()))


if __name__ == "__main__":
    main()
