"""LoRA adapters through the real proxy on the real vLLM engine (docs/lora-serving.md): the package's second engine
(tests/engine/conftest.py: ``--enable-lora --max-loras 2 --max-lora-rank 8`` and runtime adapter updates), serving random rank-8 adapters
of the tiny model (scripts/build_tiny_lora.py). The first request for an adapter loads it (the engine then lists
it), a third adapter on two slots unloads the least recently used one, another tenant's private adapter is a 404
and absent from its /v1/models, and an adapter whose artifact vanished or that the engine cannot load is an
OpenAI-shaped error, not a replica stuck loading."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from billing.models import UsageRecord
from capacity.runtimes.lora_artifacts import ENGINE_NAME
from endpoints.adapters import adapter_create
from endpoints.models import Adapter
from endpoints.services import replica_attach
from tests.engine.conftest import LORA_MAX_RANK, LORA_SLOTS, SERVED_MODEL_NAME
from tests.engine.engine import ENGINE_PY, MODEL_DIR, ROOT
from tests.factories import EndpointFactory, ReservationFactory
from tests.proxy.conftest import spawn_proxy
from tests.proxy.helpers import assert_openai_error, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SLOTS, MAX_RANK = LORA_SLOTS, LORA_MAX_RANK
ADAPTERS = ("ft-one", "ft-two", "ft-three")


@pytest.fixture(scope="module")
def lora_store():
    """A LoRA storage root holding three copies of one random rank-8 adapter (one torch start-up: ~5 s)."""
    root = Path(tempfile.mkdtemp(prefix="infercap-lora-"))
    built = root / ADAPTERS[0]
    subprocess.run(
        [str(ENGINE_PY), str(ROOT / "scripts" / "build_tiny_lora.py"), "--model", str(MODEL_DIR), "--out", str(built)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    for name in ADAPTERS[1:]:
        shutil.copytree(built, root / name)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def lora_engine(second_engine):
    """The package's second engine (tests/engine/conftest.py), which serves adapters."""
    return second_engine


def engine_adapters(url: str) -> set[str]:
    cards = httpx.get(f"{url}/v1/models", timeout=10).json()["data"]
    return {card["id"] for card in cards if card.get("parent")}


def loaded(url: str) -> set[str]:
    """The adapters the engine holds, by public name: it holds them under engine names (owner, adapter id, files'
    fingerprint; docs/lora-serving.md), never the names tenants call."""
    ids = {}
    for name in engine_adapters(url):
        found = ENGINE_NAME.match(name)
        assert found is not None, f"the engine holds {name!r}, not an engine name"
        ids[int(found["id"])] = name
    return set(Adapter.objects.filter(pk__in=ids).values_list("name", flat=True))


def own_store(lora_store, tenant):
    """The tenant's part of the LoRA root, here the store itself (its adapters' paths are relative to it)."""
    link = lora_store / "tenants" / str(tenant.pk)
    if not link.exists():
        link.parent.mkdir(exist_ok=True)
        os.symlink(lora_store, link)
    return link


@pytest.fixture
def served(lora_engine, lora_store, procs, clean_redis, tenant_a, tenant_b, settings, monkeypatch):
    """A shared LoRA endpoint on the module's engine (its adapters unloaded first), tenant A's three private
    adapters, both tenants reserving on it, and a proxy in front that sees the same LoRA root."""
    for name in engine_adapters(lora_engine.url):
        httpx.post(f"{lora_engine.url}/v1/unload_lora_adapter", json={"lora_name": name}, timeout=30)
    settings.INFERCAP = {**settings.INFERCAP, "LORA_ROOT": str(lora_store)}
    monkeypatch.setenv("INFERCAP_LORA_ROOT", str(lora_store))  # the proxy process's settings
    endpoint = EndpointFactory(
        name="lora-base",
        ttft_slo_ms=60_000,
        tpot_slo_ms=5_000,
        concurrency_max=8,
        concurrency_limit=8,
        launch_options={"max_loras": SLOTS, "max_lora_rank": MAX_RANK},
        model_profile__name=SERVED_MODEL_NAME,
    )
    for actors in (tenant_a, tenant_b):
        ReservationFactory(tenant=actors.tenant, endpoint=endpoint, mu_per_min=1e9)
    replica_attach(endpoint=endpoint, url=lora_engine.url, name="lora-engine", served_model_name=lora_engine.model)
    own_store(lora_store, tenant_a.tenant)
    for name in ADAPTERS:
        adapter_create(name=name, owner_tenant=tenant_a.tenant, endpoint=endpoint, artifact_path=name)
    # Every slot may hold tenant A's adapters here: these tests judge the eviction rule, not the per-tenant quota
    # (tests/proxy/test_lora_slots.py, bench security's adapters.no_thrash_across_tenants).
    base = spawn_proxy(procs, lora_tenant_slot_share=1.0)
    return SimpleNamespace(endpoint=endpoint, base=base, a=tenant_a.raw_key, b=tenant_b.raw_key)


def ask(served, model: str, key: str | None = None) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "ignore_eos": True}
    headers = {"Authorization": f"Bearer {key or served.a}"}
    return httpx.post(f"{served.base}/v1/chat/completions", json=body, headers=headers, timeout=180)


def models(served, key: str) -> dict[str, dict]:
    response = httpx.get(f"{served.base}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=10)
    return {card["id"]: card for card in response.json()["data"]}


def test_first_request_loads_the_adapter_and_other_tenants_cannot_see_or_use_it(lora_engine, served):
    assert engine_adapters(lora_engine.url) == set()
    response = ask(served, "ft-one")
    assert response.status_code == 200, response.text
    assert response.json()["model"] == "ft-one"  # the client reads the adapter's name
    assert loaded(lora_engine.url) == {"ft-one"}  # loaded on demand by the proxy, under its engine name
    assert ask(served, "ft-one").status_code == 200 and loaded(lora_engine.url) == {"ft-one"}
    rows = wait_for(lambda: list(UsageRecord.objects.filter(adapter="ft-one")) or None, 20)
    assert {row.endpoint_id for row in rows} == {served.endpoint.pk} and rows[0].mu > 0
    # Tenant A lists its adapter under its base endpoint, as vLLM does; tenant B neither sees nor reaches it.
    assert models(served, served.a)["ft-one"]["parent"] == "lora-base"
    assert "ft-one" not in models(served, served.b) and "lora-base" in models(served, served.b)
    hidden, missing = ask(served, "ft-one", served.b), ask(served, "ft-none", served.b)
    assert assert_openai_error(hidden, 404)["code"] == assert_openai_error(missing, 404)["code"] == "model_not_found"
    assert hidden.json()["error"]["message"].replace("ft-one", "X") == missing.json()["error"]["message"].replace(
        "ft-none", "X"
    )


def test_at_the_slot_limit_the_least_popular_idle_adapter_is_unloaded(lora_engine, served):
    # infercap's eviction rule (docs/lora.md): the idle adapter with the lowest decayed request rate leaves, ties by
    # least recent use; the engine's own adapter list shows which one the proxy unloaded.
    for name in ("ft-one", "ft-two", "ft-one"):  # ft-two: requested once, and the least recently used
        assert ask(served, name).status_code == 200
    assert loaded(lora_engine.url) == {"ft-one", "ft-two"}
    response = ask(served, "ft-three")
    assert response.status_code == 200, response.text
    assert loaded(lora_engine.url) == {"ft-one", "ft-three"}
    assert ask(served, "ft-two").status_code == 200  # back on demand
    # ft-three (one request, the most recent) leaves rather than ft-one (two requests): LRU would unload ft-one.
    assert loaded(lora_engine.url) == {"ft-one", "ft-two"}


def test_vanished_and_unloadable_artifacts_are_openai_errors_and_the_replica_keeps_serving(
    lora_engine, lora_store, served
):
    shutil.rmtree(lora_store / "ft-two")  # gone from the store after its registration
    (lora_store / "ft-three" / "adapter_model.safetensors").write_bytes(b"not safetensors")
    try:
        gone = assert_openai_error(ask(served, "ft-two"), 503)
        assert gone["code"] == "adapter_unavailable" and "missing" in gone["message"]
        broken = assert_openai_error(ask(served, "ft-three"), 502)
        assert broken["code"] == "adapter_load_failed" and str(lora_store) not in broken["message"]
        assert loaded(lora_engine.url) == set()
        assert ask(served, "ft-one").status_code == 200  # nothing was left loading: the replica serves on
        assert ask(served, "lora-base").status_code == 200
    finally:
        shutil.rmtree(lora_store / "ft-three")
        for name in ("ft-two", "ft-three"):
            shutil.copytree(lora_store / "ft-one", lora_store / name)


def test_each_adapter_stays_on_one_of_two_replicas_under_infercap_routing(
    second_engine, kv_engine, lora_store, procs, clean_redis, tenant_a, settings, monkeypatch
):
    """Two real LoRA replicas behind the proxy: requests for two adapters, interleaved, load each adapter once, on
    one replica, and every request for it goes there (round robin would load each on both)."""
    engines = {"one-seq": second_engine, "kv": kv_engine}
    for engine in engines.values():
        for name in engine_adapters(engine.url):
            httpx.post(f"{engine.url}/v1/unload_lora_adapter", json={"lora_name": name}, timeout=30)
    settings.INFERCAP = {**settings.INFERCAP, "LORA_ROOT": str(lora_store)}
    monkeypatch.setenv("INFERCAP_LORA_ROOT", str(lora_store))
    endpoint = EndpointFactory(
        name="lora-pair",
        ttft_slo_ms=60_000,
        tpot_slo_ms=5_000,
        concurrency_max=8,
        concurrency_limit=8,
        routing_policy="infercap",
        launch_options={"max_loras": SLOTS, "max_lora_rank": MAX_RANK},
        model_profile__name=SERVED_MODEL_NAME,
    )
    ReservationFactory(tenant=tenant_a.tenant, endpoint=endpoint, mu_per_min=1e9)
    for name, engine in engines.items():
        replica_attach(endpoint=endpoint, url=engine.url, name=name, served_model_name=engine.model)
    own_store(lora_store, tenant_a.tenant)
    for name in ADAPTERS[:2]:
        adapter_create(name=name, owner_tenant=tenant_a.tenant, endpoint=endpoint, artifact_path=name)
    # Placement is judged here, not the staleness rule (see test_proxy_two_engines.py).
    # Placement without the per-tenant slot quota, which the router does not weigh yet (docs/lora-serving.md).
    served = SimpleNamespace(
        base=spawn_proxy(procs, metrics_stale_s=120, lora_tenant_slot_share=1.0), a=tenant_a.raw_key
    )
    ids = []
    for _ in range(4):
        for name in ADAPTERS[:2]:
            response = ask(served, name)
            assert response.status_code == 200, response.text
            ids.append((name, response.headers["x-request-id"]))
    held = {name: loaded(engine.url) for name, engine in engines.items()}
    for adapter in ADAPTERS[:2]:
        assert sum(adapter in adapters for adapters in held.values()) == 1, held  # loaded once, on one replica
    rows = wait_for(
        lambda: (
            (r := dict(UsageRecord.objects.filter(endpoint=endpoint).values_list("request_id", "replica__name")))
            and len(r) == len(ids)
            and r
        ),
        20,
    )
    for adapter in ADAPTERS[:2]:
        (replica,) = {rows[rid] for name, rid in ids if name == adapter}
        assert adapter in held[replica]  # every request for it went where it is loaded
