"""One protocol for every bench: which seeds a bench may be designed and tuned on, which it holds out, and a record of
every look at held-out figures.

A design decision (a constant, a weight, a rule kept or dropped) is made on ``training`` seeds only. ``held_out``
seeds are drawn once, here, and a bench runs on them only when ``bench NAME --held-out`` asks; the command then
appends the run (commit, time, command line, seeds, figures) to ``docs/data/held_out_log.jsonl``, so each look at
held-out data is on the record and a later change judged on them can be seen to have been. Seeds once looked at for a
decision move to ``training``; fresh ones replace them (benchmarks/README.md, "Held-out seeds").
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HELD_OUT_LOG = ROOT / "docs" / "data" / "held_out_log.jsonl"


@dataclass(frozen=True)
class Seeds:
    training: tuple[int, ...]
    held_out: tuple[int, ...]


# Every seed a design decision has ever seen is training, including the earlier "held-out" ones (routing's 1-42, autoscaling's trace seeds 1-6, LoRA's 101): they took part in keep-or-drop decisions. The held-out sets below
# were drawn for this protocol and no decision has looked at them.
SEEDS = {
    "routing": Seeds(training=tuple(range(1, 43)), held_out=tuple(range(1001, 1021))),
    "autoscale": Seeds(training=(1, 2, 3, 4, 5, 6), held_out=(2001, 2002, 2003)),
    "lora": Seeds(training=(1, 2, 3, 101), held_out=(3001, 3002, 3003, 3004, 3005)),
    "economics": Seeds(training=(0, 1), held_out=(4001, 4002, 4003)),
    "pd": Seeds(training=(1, 2, 3), held_out=(5001, 5002, 5003)),
    "placement": Seeds(training=(1, 2, 3), held_out=(6001, 6002, 6003)),
    # Fidelity's training points are fixed (benchmarks/serving/fidelity POINTS); a held-out seed draws load points.
    # 7001-7004 were looked at once (2026-12-07) and then steered the API server's model: training now.
    "fidelity": Seeds(training=(7001, 7002, 7003, 7004), held_out=(7005, 7006, 7007, 7008)),
}


def seeds_for(bench: str, *, held_out: bool) -> tuple[int, ...]:
    """The seeds a run of ``bench`` uses: its training seeds, or (``--held-out``) its held-out ones."""
    try:
        entry = SEEDS[bench]
    except KeyError:
        raise ValueError(f"bench {bench!r} has no seed sets (benchmarks/protocol.py)") from None
    return entry.held_out if held_out else entry.training


def is_held_out(bench: str, seed: int) -> bool:
    return bench in SEEDS and seed in SEEDS[bench].held_out


def _commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    sha = head.stdout.strip() or "unknown"
    return f"{sha}+dirty" if dirty.stdout.strip() else sha


def record_look(bench: str, *, argv: list[str], figures: dict, log: Path | None = None) -> dict:
    """Append one look at held-out figures to the log (``HELD_OUT_LOG`` unless given) and return the entry."""
    log = log or HELD_OUT_LOG
    entry = {
        "bench": bench,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": _commit(),
        "argv": argv,
        # The seeds the run used where it says (a quick run may use some of them), else the bench's held-out set.
        "held_out_seeds": list(
            figures.get("held_out_seeds_used") or (SEEDS[bench].held_out if bench in SEEDS else [])
        ),
        "figures": figures,
    }
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as out:
        out.write(json.dumps(entry, sort_keys=False, default=str) + "\n")
    return entry
