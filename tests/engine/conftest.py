"""The real vLLM engines of tests/engine/, started side by side and stopped when the package's tests are done.

Three engines serve the package: the ``engine`` (default flags, shared by most tests), the ``second_engine`` (one
sequence at a time, so requests queue inside vLLM; LoRA adapters on two slots) and the ``kv_engine`` (24 KV blocks, publishing KV-cache events
over ZMQ; LoRA adapters too). A start is ~60 CPU-seconds of imports in three processes, so the pool launches every engine the
collected tests need at once, when the first of them is wanted: on two cores that takes about half as long as one
start after another. They are package-scoped: an idle engine polls at ~10% of a core, and the rest of the suite
should not pay for it.

Without .venv-engine the tests fail and say to run scripts/install_engine.sh; INFERCAP_SKIP_ENGINE=1 skips them
instead. INFERCAP_ENGINE_URL (and INFERCAP_SECOND_ENGINE_URL) point the tests at engines already serving the tiny
model, to iterate without the start-up each run.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import pytest

from simulator.process import free_port
from tests.engine.engine import INSTALL_HINT, engine_installed, launch_engine, stop_engine, wait_ready

SERVED_MODEL_NAME = "tiny-llama"
SECOND_MODEL = "tiny-llama-one-seq"
EMBED_MODEL = "tiny-embed"
KV_NUM_BLOCKS = 24
# The second and the KV-events engines also serve LoRA adapters: two slots of rank up to 8, loaded at run time
# (test_lora_real_engine)
LORA_SLOTS, LORA_MAX_RANK = 2, 8
LORA_FLAGS = ("--enable-lora", "--max-loras", str(LORA_SLOTS), "--max-lora-rank", str(LORA_MAX_RANK))
LORA_ENV = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}


@dataclass
class Engine:
    url: str
    model: str
    startup_s: float | None = None
    pid: int | None = None  # the API server, leader of the engine's process group; None for INFERCAP_ENGINE_URL
    events_endpoint: str = ""  # where it publishes KV-cache events (the kv_engine only)

    def client(self, timeout: float = 120.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=timeout)


@dataclass(frozen=True)
class EngineSpec:
    served_model_name: str
    extra: tuple = ()
    env: dict = field(default_factory=dict)
    url_variable: str = ""  # an environment variable naming an engine already running so


def _kv_engine_spec() -> tuple[EngineSpec, str]:
    port = free_port()
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{port}", "topic": "kv"}
    extra = ("--kv-events-config", json.dumps(config), "--num-gpu-blocks-override", str(KV_NUM_BLOCKS))
    # a context that fits the small cache; LoRA as the second engine has it (adapter affinity across the two)
    extra += ("--max-model-len", "1024", *LORA_FLAGS)
    # dev mode: POST /reset_prefix_cache
    spec = EngineSpec(SERVED_MODEL_NAME, extra, {"VLLM_SERVER_DEV_MODE": "1", **LORA_ENV})
    return spec, f"tcp://127.0.0.1:{port}"


def _specs() -> dict[str, tuple[EngineSpec, str]]:
    return {
        "engine": (EngineSpec(SERVED_MODEL_NAME, url_variable="INFERCAP_ENGINE_URL"), ""),
        # Eager: no torch.compile warm-up; none of its tests measures its speed.
        "second_engine": (
            EngineSpec(
                SECOND_MODEL,
                ("--max-num-seqs", "1", "--enforce-eager", *LORA_FLAGS),
                LORA_ENV,
                url_variable="INFERCAP_SECOND_ENGINE_URL",
            ),
            "",
        ),
        "kv_engine": _kv_engine_spec(),
        # The tiny model as vLLM's pooling runner: /v1/embeddings (test_embeddings_real_engine)
        "embed_engine": (EngineSpec(EMBED_MODEL, ("--runner", "pooling", "--enforce-eager")), ""),
    }


class EnginePool:
    """Launches the engines the collected tests use, all at once on the first request; hands each out once it
    answers /health; stops every one at the end."""

    def __init__(self, wanted: set[str]):
        self.wanted = wanted
        self._specs = _specs()
        self._launched: dict = {}  # name -> (ReplicaProcess, events endpoint)
        self._ready: dict[str, Engine] = {}

    def get(self, name: str) -> Engine:
        if name in self._ready:
            return self._ready[name]
        spec, events = self._specs[name]
        if spec.url_variable and (url := os.environ.get(spec.url_variable)):
            model = os.environ.get(spec.url_variable.replace("_URL", "_MODEL"), spec.served_model_name)
            self._ready[name] = Engine(url=url.rstrip("/"), model=model)
            return self._ready[name]
        if not engine_installed():
            pytest.fail(f"the real vLLM engine is not installed: {INSTALL_HINT}", pytrace=False)
        if name not in self._launched:
            # The first request starts every wanted engine side by side, except those started alone when their
            # own tests come (LAUNCHED_ALONE): four imports at once on two busy cores come near the start timeout.
            self._launch((self.wanted - LAUNCHED_ALONE) | {name})
        process, events = self._launched[name]
        wait_ready(process)
        self._ready[name] = Engine(process.url, spec.served_model_name, process.startup_s, process.pid, events)
        return self._ready[name]

    def restart(self, name: str, on_stopped: Callable[[], None] | None = None) -> Engine:
        """Stop a pooled engine and start it again with the same flags on the same ports (HTTP and KV events), as
        a replica's engine restarts in place: a new process, an empty cache. ``on_stopped`` runs in between."""
        engine = self.get(name)
        if name not in self._launched:
            pytest.skip(f"{name} is an engine already serving (its INFERCAP_*_URL): it cannot be restarted here")
        spec, events = self._specs[name]
        process, _ = self._launched[name]
        stop_engine(process)
        os.unlink(process.log_path)
        try:
            if on_stopped is not None:
                on_stopped()
        finally:  # whatever the check found, the package's later tests get their engine back
            again = launch_engine(
                served_model_name=spec.served_model_name, port=process.port, extra=spec.extra, env=spec.env
            )
            self._launched[name] = (again, events)
            wait_ready(again)
        engine.pid, engine.startup_s = again.pid, again.startup_s
        return engine

    def _launch(self, names: set[str]) -> None:
        for other in sorted(names - set(self._launched)):
            spec, events = self._specs[other]
            if spec.url_variable and os.environ.get(spec.url_variable):
                continue
            process = launch_engine(served_model_name=spec.served_model_name, extra=spec.extra, env=spec.env)
            self._launched[other] = (process, events)

    def stop(self) -> None:
        for process, _ in self._launched.values():
            stop_engine(process)
            os.unlink(process.log_path)


@pytest.fixture(scope="package")
def engine_pool(request):
    if os.environ.get("INFERCAP_SKIP_ENGINE") == "1":
        pytest.skip("INFERCAP_SKIP_ENGINE=1: the real vLLM engine tests are skipped")
    wanted = {name for item in request.session.items for name in item.fixturenames if name in _POOLED}
    pool = EnginePool(wanted)
    try:
        yield pool
    finally:
        pool.stop()


_POOLED = ("engine", "second_engine", "kv_engine", "embed_engine")
LAUNCHED_ALONE = frozenset({"embed_engine"})  # one test module's: started when it runs


@pytest.fixture(scope="package")
def engine(engine_pool) -> Engine:
    return engine_pool.get("engine")


@pytest.fixture(scope="package")
def second_engine(engine_pool) -> Engine:
    """A second engine that runs one sequence at a time, under another model name, and serves LoRA adapters
    (``LORA_SLOTS`` of rank up to ``LORA_MAX_RANK``, loaded and unloaded at run time)."""
    return engine_pool.get("second_engine")


@pytest.fixture(scope="package")
def embed_engine(engine_pool) -> Engine:
    """The tiny model served by vLLM's pooling runner (``--runner pooling``): /v1/embeddings, no completions."""
    return engine_pool.get("embed_engine")


@pytest.fixture(scope="package")
def kv_engine(engine_pool) -> Engine:
    """An engine of 24 KV blocks of 128 tokens that publishes its KV-cache events (``events_endpoint``, topic kv)."""
    return engine_pool.get("kv_engine")


@pytest.fixture
def engine_endpoint(engine, db):
    """An endpoint named as the engine serves, with the session engine attached as its (static) replica."""
    from endpoints.services import replica_attach
    from tests.factories import EndpointFactory

    endpoint = EndpointFactory(
        name=engine.model, ttft_slo_ms=60_000, tpot_slo_ms=2_000, concurrency_max=8, concurrency_limit=8
    )
    replica = replica_attach(endpoint=endpoint, url=engine.url, name="session-engine")
    return endpoint, replica
