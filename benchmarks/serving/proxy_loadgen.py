"""The load generator of ``bench proxy --opt processes=N`` in its own process (no Django): one JSON command a line
on stdin, one JSON result a line on stdout, so its CPU is not the bench's and the bench can read every process's.

``{"op": "load", ...}``: closed-loop streams for ``duration_s``: ``streams`` proxied ones spread round-robin over
``proxied`` ([url, key] pairs, as a Service spreads connections over pods) and ``direct_streams`` straight to the
replicas (``direct`` urls, round-robin), the paired baseline of the added TTFT; ``watch``: replica urls whose
``GET /load`` (requests in flight) is polled every 5 ms, their maxima returned. ``{"op": "burst", ...}``:
``requests`` requests, ``concurrency`` at a time, rotating over ``proxied``; returns the count per HTTP status.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import aiohttp

try:
    import uvloop  # as the proxy runs: the load generator should not be the slower side
except ImportError:  # pragma: no cover - uvloop is in the locked dependencies
    uvloop = None

_FILLER = "Say hello in one word. "


def _outcome() -> dict:
    return {"ttft": [], "e2e": [], "tokens": 0, "errors": 0, "statuses": {}, "samples": []}


def _body(nonce: str, who: str, i: int, *, prompt_chars: int, max_tokens: int, model: str) -> bytes:
    """A unique prompt of ``prompt_chars`` characters (a fresh nonce a phase: no phase rides on another's cache)."""
    head = f"{nonce} worker {who} request {i}: "
    prompt = (head + _FILLER * (1 + prompt_chars // len(_FILLER)))[: max(prompt_chars, len(head))]
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    return json.dumps(body).encode()


def _headers(key: str | None) -> dict:
    return {"content-type": "application/json", **({"authorization": f"Bearer {key}"} if key else {})}


async def _one(session: aiohttp.ClientSession, url: str, payload: bytes, headers: dict, out: dict) -> None:
    """One streamed request: its TTFT, end-to-end time and tokens, or an error with its status or reason."""
    t0 = time.perf_counter()
    ttft, tokens, done = None, 0, False
    try:
        async with session.post(url + "/v1/completions", data=payload, headers=headers) as resp:
            out["statuses"][str(resp.status)] = out["statuses"].get(str(resp.status), 0) + 1
            if resp.status != 200:
                body = await resp.read()
                out["errors"] += 1
                out["samples"].append(f"{resp.status} {body[:160]!r}")
                return
            async for chunk in resp.content.iter_any():
                if ttft is None:
                    ttft = time.perf_counter() - t0
                tokens += chunk.count(b'"text":')
                done = done or b"[DONE]" in chunk
    except Exception as exc:  # noqa: BLE001 - every failure is counted, none stops the run
        out["errors"] += 1
        out["samples"].append(repr(exc)[:160])
        return
    if not done or ttft is None:
        out["errors"] += 1
        out["samples"].append("stream ended without [DONE]")
        return
    out["ttft"].append(ttft)
    out["e2e"].append(time.perf_counter() - t0)
    out["tokens"] += tokens


async def _watch(session: aiohttp.ClientSession, urls: list[str], peaks: dict, stop: asyncio.Event) -> None:
    """The most requests each replica held at once, polled every 5 ms (the simulator's ``/load``)."""
    while not stop.is_set():
        for url in urls:
            try:
                async with session.get(url + "/load") as resp:
                    peaks[url] = max(peaks.get(url, 0), (await resp.json())["server_load"])
            except (aiohttp.ClientError, KeyError, ValueError):
                pass
        await asyncio.sleep(0.005)


async def load(cmd: dict) -> dict:
    proxied, direct = cmd["proxied"], cmd.get("direct", [])
    streams, direct_streams = cmd["streams"], cmd.get("direct_streams", 0) if direct else 0
    shape = {"prompt_chars": cmd.get("prompt_chars", 64), "max_tokens": cmd["max_tokens"], "model": cmd["model"]}
    outs = {"proxied": _outcome(), "direct": _outcome()}
    nonce, peaks, stop = os.urandom(4).hex(), {}, asyncio.Event()
    total = streams + direct_streams
    ramp_s = min(cmd.get("ramp_s", 1.0) * total / 64, cmd["duration_s"] / 2)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:
        deadline = time.perf_counter() + cmd["duration_s"]

        async def worker(w: int) -> None:
            # Worker w: a proxied stream on proxy w mod N, or a direct one on replica w mod R; starts spread over
            # the ramp, so the streams do not all arrive in the same millisecond.
            await asyncio.sleep(ramp_s * w / max(total, 1))
            kind = "proxied" if w < streams else "direct"
            url, key = proxied[w % len(proxied)] if kind == "proxied" else (direct[w % len(direct)], None)
            i = 0
            while time.perf_counter() < deadline:
                await _one(session, url, _body(nonce, str(w), i, **shape), _headers(key), outs[kind])
                i += 1

        watcher = asyncio.create_task(_watch(session, cmd.get("watch", []), peaks, stop))
        started = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(total)))
        wall = time.perf_counter() - started
        stop.set()
        await watcher
    for out in outs.values():
        out["wall_s"] = wall
        out["samples"] = sorted(set(out["samples"]))[:3]
    return {**outs, "max_in_flight": peaks}


async def burst(cmd: dict) -> dict:
    """``requests`` requests as fast as ``concurrency`` workers send them, rotating over the proxies."""
    out = _outcome()
    targets, left = cmd["proxied"], iter(range(cmd["requests"]))
    nonce = os.urandom(4).hex()
    shape = {
        "prompt_chars": cmd.get("prompt_chars", 64),
        "max_tokens": cmd.get("max_tokens", 1),
        "model": cmd["model"],
    }
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def worker() -> None:
            for i in left:
                url, key = targets[i % len(targets)]
                await _one(session, url, _body(nonce, "burst", i, **shape), _headers(key), out)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(cmd["concurrency"])))
        out["wall_s"] = time.perf_counter() - started
    out["samples"] = sorted(set(out["samples"]))[:3]
    return {"statuses": out["statuses"], "wall_s": out["wall_s"], "samples": out["samples"]}


def _cpu_s() -> float:
    times = os.times()
    return times.user + times.system


def main() -> None:
    if uvloop is not None:
        uvloop.install()
    ops = {"load": load, "burst": burst}
    for line in sys.stdin:
        cmd = json.loads(line)
        before = _cpu_s()
        result = asyncio.run(ops[cmd["op"]](cmd))
        result["loadgen_cpu_s"] = round(_cpu_s() - before, 3)
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
