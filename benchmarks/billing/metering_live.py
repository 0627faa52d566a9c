"""The real-engine fleet of ``bench metering --live``: two vLLM engines (the CPU build in .venv-engine serving the
tiny model, LoRA on) started one after the other at nice 10, each behind a ``FaultRelay`` that plays the
simulator's faults, and a primary endpoint whose only replica is a port nobody listens on.

The engine has no fault injection: ``error_rate`` becomes the relay refusing connections, ``reset_after_tokens``
the relay cutting a stream after that many SSE events, and ``slow_factor`` nothing (the live kinds do real work:
``Fleet.work``, ``Fleet.context_words`` and ``LIVE_SLOTS_PER_REPLICA``, so requests queue in the proxy).
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.billing.metering_kinds import Fleet
from benchmarks.operations.fault_relay import FaultRelay
from capacity.runtimes.processes import (
    ENGINE_MODEL_DIR,
    ENGINE_STARTUP_TIMEOUT_S,
    ProcessGroup,
    build_tiny_lora,
    build_tiny_model,
    engine_installed,
    free_port,
    niced_argv,
    vllm_replica_argv,
    vllm_replica_env,
)

ENGINES = 2
LIVE_SLOTS_PER_REPLICA = 2  # a low limit: the queued-disconnect kind fills it with a few streams
LORA_SLOTS, LORA_MAX_RANK = 2, 8
LIVE_WORK = 0.25  # the long answers at a quarter: 50-100 tokens where the simulator decodes 200-400
# 1,020 of the kinds' words are ~3,900 tokens of the tiny model's 4,096 (measured: 900 words, 3,424 tokens)
CONTEXT_WORDS = 1020
ENGINE_FLAGS = [
    "--enforce-eager",  # no torch.compile warm-up at start
    "--enable-lora",
    "--max-loras",
    str(LORA_SLOTS),
    "--max-lora-rank",
    str(LORA_MAX_RANK),
    # A chat with tools asks for tool_choice "auto" by default, which vLLM refuses (400) without a parser; the tiny
    # tokenizer has no tool-call tokens, and the pythonic parser needs none.
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "pythonic",
]
ENGINE_ENV = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}


@dataclass
class LiveFleet(Fleet):
    relays: dict[str, FaultRelay] = field(default_factory=dict)  # by the relay's URL (the replica's)

    def set_faults(self, urls: list[str], **settings) -> None:
        for url in urls:
            relay = self.relays[url]
            if settings.get("error_rate"):
                relay.refuse()
            elif settings.get("reset_after_tokens"):
                relay.reset_streams(after_events=int(settings["reset_after_tokens"]))

    def clear_faults(self) -> None:
        for relay in self.relays.values():
            relay.restore()


def engines_start(procs: ProcessGroup, *, served_model_name: str, progress=print) -> list[str]:
    """Start the engines one after the other (each ~60 CPU-seconds of imports); their base URLs."""
    if not engine_installed():
        raise RuntimeError("bench metering --live needs the vLLM engine: run scripts/install_engine.sh")
    build_tiny_model(ENGINE_MODEL_DIR)
    urls = []
    for i in range(ENGINES):
        port = free_port()
        started = time.monotonic()
        argv = vllm_replica_argv(port, served_model_name=served_model_name, extra=ENGINE_FLAGS)
        procs.spawn(
            niced_argv(argv),
            env=vllm_replica_env() | ENGINE_ENV,
            inherit_env=False,
            health_url=f"http://127.0.0.1:{port}/health",
            timeout=ENGINE_STARTUP_TIMEOUT_S,
            cwd=ENGINE_MODEL_DIR.parent,
        )
        urls.append(f"http://127.0.0.1:{port}")
        progress(f"engine {i} serving on port {port} after {time.monotonic() - started:.0f} s")
    return urls


def relays_for(engine_urls: list[str]) -> list[FaultRelay]:
    return [FaultRelay(int(url.rsplit(":", 1)[1])) for url in engine_urls]


def dead_url() -> str:
    """A replica URL that refuses every connection: the primary endpoint's, so its requests fall back."""
    return f"http://127.0.0.1:{free_port()}"


def lora_artifact_build(lora_root: str, artifact: str) -> None:
    """A random rank-8 adapter of the tiny model, where the adapter store looks for it (the root and shared/)."""
    built = Path(lora_root) / artifact
    if built.exists():
        shutil.rmtree(built)
    build_tiny_lora(built, rank=LORA_MAX_RANK)
    shared = Path(lora_root) / "shared" / artifact
    os.makedirs(shared.parent, exist_ok=True)
    if shared.exists():
        shutil.rmtree(shared)
    shutil.copytree(built, shared)
