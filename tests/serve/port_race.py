"""A local Ray and Serve started as `memserve up` starts them, with one of HAProxy's side ports taken
between its choice and HAProxy's bind. Run by test_start_race.py in a process of its own (one Ray per
process); prints what happened as JSON."""

from __future__ import annotations

import json
import socket
import sys
import tempfile

import httpx
from ray.serve.schema import ServeDeploySchema

from serve_app.deploy.local_ray import start_serving, stop_ray
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
    config = ServeDeploySchema.model_validate(
        {
            "http_options": {"host": "127.0.0.1", "port": port},
            "applications": [{"name": "hello", "route_prefix": "/", "import_path": "tests.serve.hello_app:app"}],
        }
    )
    outcome: dict = {}
    try:
        temp_dir = tempfile.mkdtemp(prefix="memserve-race-")
        outcome["starts"] = start_serving(temp_dir, config, choose_port=taking_the_first, timeout_s=60)
        outcome["answer"] = httpx.get(f"http://127.0.0.1:{port}/", timeout=10).text
    except Exception as exc:
        outcome["error"] = repr(exc)[:2000]
    finally:
        outcome["taken"] = held[0].getsockname()[1] if held else None
        stop_ray()
    print(json.dumps(outcome), file=sys.stdout, flush=True)


if __name__ == "__main__":
    main()
