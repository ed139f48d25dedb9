"""A Ray node and Serve started as `memserve up` starts them (head_node.serve_on_head), with one of
HAProxy's side ports taken between its choice and HAProxy's bind. Run by test_start_race.py in a
process of its own; prints what happened as JSON."""

from __future__ import annotations

import json
import socket
import sys
import tempfile
from pathlib import Path

import httpx
import yaml

from serve_app.deploy.head_node import serve_on_head, stop_node_processes
from serve_app.embedded.ports import free_listen_port, free_port

held: list[socket.socket] = []


def taking_the_first(host: str = "0.0.0.0") -> int:
    """A free port, as HAProxy's side ports are chosen; the first one is bound here right away, as
    another process may do before HAProxy gets to it."""
    port = free_listen_port(host)
    if not held:
        taker = socket.socket()
        taker.bind((host, port))
        taker.listen()
        held.append(taker)
    return port


def main() -> None:
    port = free_port()
    temp_dir = tempfile.mkdtemp(prefix="memserve-race-")
    config = Path(temp_dir) / "hello.yaml"
    config.write_text(
        yaml.safe_dump({"applications": [{"name": "hello", "route_prefix": "/", "import_path": "tests.serve.hello_app:app"}]})
    )
    outcome: dict = {}
    try:
        _, outcome["starts"] = serve_on_head(temp_dir, config, "127.0.0.1", port, choose_port=taking_the_first)
        outcome["answer"] = httpx.get(f"http://127.0.0.1:{port}/", timeout=10).text
    except Exception as exc:
        outcome["error"] = repr(exc)[:2000]
    finally:
        outcome["taken"] = held[0].getsockname()[1] if held else None
        outcome["killed"] = stop_node_processes(temp_dir)
    print(json.dumps(outcome), file=sys.stdout, flush=True)


if __name__ == "__main__":
    main()
