#!/usr/bin/env python3
"""Seconds from a fresh clone to the first streamed token of `make run`: clone the repository's HEAD into a
temporary directory, run `make run` there (a new .venv from requirements/run.txt), run the curl example it prints
and stop the clock at the first content chunk. Prints one JSON line. Standard library only: it runs before any
virtual environment exists.

    python3 scripts/fresh_clone_first_token.py [--repo PATH] [--keep]
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 600


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _curl_example(proc: subprocess.Popen, started: float) -> str:
    """The curl command of `make run`'s banner (the lines after "try it:" up to a blank line)."""
    lines, capturing = [], False
    for line in proc.stdout:
        sys.stderr.write(f"[{time.monotonic() - started:6.1f} s] {line}")
        if line.startswith("try it:"):
            capturing = True
        elif capturing and not line.strip():
            return "".join(lines)
        elif capturing:
            lines.append(line)
        if time.monotonic() - started > TIMEOUT_S:
            break
    raise SystemExit(f"make run exited or printed no curl example (rc={proc.poll()})")


def _first_token(curl: str) -> None:
    stream = subprocess.Popen(["bash", "-c", curl], stdout=subprocess.PIPE, text=True)
    try:
        for line in stream.stdout:
            if line.startswith("data: {") and json.loads(line[6:]).get("choices", [{}])[0].get("delta", {}).get(
                "content"
            ):
                return
        raise SystemExit("the curl example streamed no token")
    finally:
        stream.kill()
        stream.wait()


def measure(repo: Path, keep: bool = False) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="infercap-fresh-"))
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DJANGO_", "DATABASE_URL", "REDIS_URL", "VIRTUAL_ENV"))
    }
    env["PORT"] = str(_free_port())
    started = time.monotonic()
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(repo), str(workdir / "infercap")], check=True)
    proc = subprocess.Popen(
        ["make", "run"],
        cwd=workdir / "infercap",
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        _first_token(_curl_example(proc, started))
        seconds = time.monotonic() - started
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        if not keep:
            subprocess.run(["rm", "-rf", str(workdir)], check=False)
    return {"fresh_clone_to_first_token_s": round(seconds, 1), "clone": str(workdir / "infercap")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", default=str(ROOT), help="the repository to clone (its HEAD)")
    parser.add_argument("--keep", action="store_true", help="keep the clone")
    args = parser.parse_args()
    print(json.dumps(measure(Path(args.repo), keep=args.keep)))


if __name__ == "__main__":
    main()
