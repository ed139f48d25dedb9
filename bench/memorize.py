"""Turns made searchable per second, over HTTP: long turns and short ones, each kind on a fresh user.

    python -m bench.memorize --url http://127.0.0.1:8000 --data-dir .memserve

Long turns are the BEAM messages (`../shared/data/beam`) of at least `--min-chars` characters, in
conversation order; short turns are LoCoMo's (`../shared/data/locomo`), one or two sentences. Each
kind is appended to `--sessions` sessions of its own user, up to 100 messages a request as
bench.beam appends them, and timed from the first append until every session is memorized
(`memorized_upto_seq`): what an agent that writes these turns waits before it can recall them. With
`--data-dir` (memserve up's), the CPU the service's processes spent meanwhile is divided by the turns.
Run it on an otherwise idle machine: the figure is the service's, not the machine's spare capacity.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from itertools import islice
from pathlib import Path

import httpx
from tqdm import tqdm

from bench.beam import APPEND_BATCH
from bench.beam_data import conversation_folders, default_data_dir, load_conversation
from bench.common import wait_memorized
from bench.load import cpu_seconds, service_cpu_used
from bench.locomo_data import turns_of


def long_turns(data: Path, count: int, min_chars: int) -> list[str]:
    """The first `count` BEAM messages of at least `min_chars` characters, conversation by conversation."""
    found = (m.content for folder in conversation_folders(data) for m in load_conversation(folder).messages)
    return list(islice((text for text in found if len(text) >= min_chars), count))


def short_turns(data: Path, count: int) -> list[str]:
    texts = (t.content for path in sorted(data.glob("*.json")) for t in turns_of(json.loads(path.read_text())))
    return list(islice((text for text in texts if text.strip()), count))


def memorize(client: httpx.Client, texts: list[str], sessions: int, data_dir: Path | None, kind: str) -> dict:
    """Append `texts` round-robin to `sessions` sessions of a fresh user; time until all are memorized."""
    user = f"memorize-{kind}-{uuid.uuid4().hex[:6]}"
    by_session: dict[str, list[str]] = {}
    for i, text in enumerate(texts):
        by_session.setdefault(f"{user}-s{i % sessions}", []).append(text)
    before = cpu_seconds(data_dir)
    started = time.perf_counter()
    last: dict[str, int] = {}
    with tqdm(total=len(texts), desc=f"append {kind}", unit="turn", leave=False) as bar:
        for session, turns in by_session.items():
            for start in range(0, len(turns), APPEND_BATCH):
                chunk = turns[start : start + APPEND_BATCH]
                messages = [{"role": "user" if (start + j) % 2 == 0 else "assistant", "content": t} for j, t in enumerate(chunk)]
                response = client.post(f"/v1/sessions/{session}/messages", json={"user_id": user, "messages": messages})
                response.raise_for_status()
                last[session] = response.json()["seqs"][-1]
                bar.update(len(chunk))
    wait_memorized(client, last, timeout_s=3600)
    seconds = time.perf_counter() - started
    after = cpu_seconds(data_dir)
    used = service_cpu_used(before, after)
    chars = sum(len(t) for t in texts)
    return {
        "turns": len(texts),
        "chars": chars,
        "seconds": seconds,
        "turns_per_s": len(texts) / seconds,
        "chars_per_s": chars / seconds,
        "service_cpu_ms_per_turn": 1000 * sum(used.values()) / len(texts) if data_dir else None,
        "cpu_s": {group: round(s, 2) for group, s in sorted(used.items(), key=lambda kv: -kv[1]) if s > 0},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--data-dir", type=Path, help="memserve up's data dir: the service's CPU per turn.")
    parser.add_argument("--beam", type=Path, default=default_data_dir())
    parser.add_argument("--locomo", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo")
    parser.add_argument("--kinds", nargs="+", default=["long", "short"], choices=["long", "short"])
    parser.add_argument("--long", type=int, default=300, help="Long turns to make searchable.")
    parser.add_argument("--short", type=int, default=1000, help="Short turns to make searchable.")
    parser.add_argument("--min-chars", type=int, default=2000, help="A long turn has at least this many characters.")
    parser.add_argument("--sessions", type=int, default=10, help="Sessions each kind's turns are spread over.")
    parser.add_argument("--json", dest="json_out", type=Path, default=Path("bench/out/memorize.json"))
    args = parser.parse_args()

    served = args.data_dir if args.data_dir and args.data_dir.exists() else None
    texts = {
        "long": lambda: long_turns(args.beam, args.long, args.min_chars),
        "short": lambda: short_turns(args.locomo, args.short),
    }
    results = {}
    with httpx.Client(base_url=args.url, timeout=120) as client:
        for kind in args.kinds:
            results[kind] = memorize(client, texts[kind](), args.sessions, served, kind)
    print(f"\n{'kind':<6}{'turns':>7}{'chars/turn':>12}{'seconds':>9}{'turns/s':>9}{'chars/s':>10}{'CPU ms/turn':>13}  largest")
    for kind, r in results.items():
        cpu = f"{r['service_cpu_ms_per_turn']:.0f}" if r["service_cpu_ms_per_turn"] is not None else "-"
        largest = " | ".join(f"{g} {s:.0f} s" for g, s in list(r["cpu_s"].items())[:3])
        print(f"{kind:<6}{r['turns']:>7}{r['chars'] / r['turns']:>12,.0f}{r['seconds']:>9.1f}{r['turns_per_s']:>9.2f}"
              f"{r['chars_per_s']:>10,.0f}{cpu:>13}  {largest}")  # fmt: skip
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps({"results": results, "args": {k: str(v) for k, v in vars(args).items()}}, indent=2))
    print(f"\nwrote {args.json_out}")


if __name__ == "__main__":
    main()
