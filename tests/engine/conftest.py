"""One real vLLM engine per test session, shared by every test under tests/engine/.

Without .venv-engine the tests fail and say to run scripts/install_engine.sh; INFERCAP_SKIP_ENGINE=1 skips them
instead. INFERCAP_ENGINE_URL points them at an engine already serving the tiny model (to iterate without the
~70 s start-up each run).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import httpx
import pytest

from tests.engine.engine import INSTALL_HINT, engine_installed, start_engine, stop_engine

SERVED_MODEL_NAME = "tiny-llama"


@dataclass
class Engine:
    url: str
    model: str
    startup_s: float | None = None
    pid: int | None = None  # the API server, leader of the engine's process group; None for INFERCAP_ENGINE_URL

    def client(self, timeout: float = 120.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=timeout)


@pytest.fixture(scope="session")
def engine():
    if os.environ.get("INFERCAP_SKIP_ENGINE") == "1":
        pytest.skip("INFERCAP_SKIP_ENGINE=1: the real vLLM engine tests are skipped")
    if url := os.environ.get("INFERCAP_ENGINE_URL"):
        yield Engine(url=url.rstrip("/"), model=os.environ.get("INFERCAP_ENGINE_MODEL", SERVED_MODEL_NAME))
        return
    if not engine_installed():
        pytest.fail(f"the real vLLM engine is not installed: {INSTALL_HINT}", pytrace=False)
    process = start_engine(served_model_name=SERVED_MODEL_NAME)
    try:
        yield Engine(url=process.url, model=SERVED_MODEL_NAME, startup_s=process.startup_s, pid=process.pid)
    finally:
        stop_engine(process)
        os.unlink(process.log_path)


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
