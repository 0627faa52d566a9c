"""Adapter slots shared by tenants, against a simulated vLLM replica over HTTP (``--max-loras 2``; docs/lora-serving.md):
a tenant at its slot quota only unloads its own adapters, adapters in use or queued for are never unloaded, a stale
engine report does not bring back an adapter just unloaded, and names no adapter has any more are unloaded."""

import asyncio
import json

import aiohttp
import pytest

from capacity.runtimes.lora_artifacts import engine_name, engine_name_owner
from capacity.runtimes.processes import free_port, sim_replica_argv
from gateway.proxy.config import ProxyConfig
from gateway.proxy.errors import ProxyError
from gateway.proxy.replica_adapters import ReplicaAdapters, ensure_loaded, load_mu, unload_stale
from gateway.proxy.snapshot import AdapterInfo


@pytest.fixture
def replica(procs):
    port = free_port()
    procs.spawn(sim_replica_argv(port, speed=20.0, extra=["--max-loras", "2", "--max-lora-rank", "16"]), port=port)
    return f"http://127.0.0.1:{port}"


def artifact(tmp_path, tenant, adapter_id) -> AdapterInfo:
    directory = tmp_path / f"t{tenant}-{adapter_id}"
    directory.mkdir()
    (directory / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}))
    (directory / "adapter_model.safetensors").write_bytes(b"\0" * 16)
    name = engine_name(adapter_id=adapter_id, owner_tenant_id=tenant, fingerprint="ab12")
    return AdapterInfo(
        name=f"ft-{adapter_id}", owner_tenant_id=tenant, endpoint_name="base", rank=8, path=str(directory),
        created=0, engine_name=name,
    )  # fmt: skip


async def held_by_engine(session, url) -> list[str]:
    async with session.get(url + "/admin/lora") as resp:
        return (await resp.json())["held"]


async def unloaded(session, url) -> list[str]:
    async with session.get(url + "/admin/lora") as resp:
        return [e["adapter"] for e in (await resp.json())["events"] if e["event"] == "unload"]


def test_engine_names_carry_the_owner_and_never_the_public_name():
    name = engine_name(adapter_id=12, owner_tenant_id=5, fingerprint="0a1b")
    assert name == "lora-t5-12-0a1b" and engine_name_owner(name) == (True, 5)
    assert engine_name_owner(engine_name(adapter_id=3, owner_tenant_id=None, fingerprint="ff")) == (True, None)
    assert engine_name_owner("support-ft") == (False, None)  # loaded by hand, or before engine names: no one's
    assert ProxyConfig().tenant_adapter_slots(2) == 1 and ProxyConfig().tenant_adapter_slots(8) == 4
    assert ProxyConfig(lora_tenant_slot_share=1.0).tenant_adapter_slots(8) == 0  # no quota
    assert load_mu(None, mu_per_s=10.0, min_mu=5.0) == 0.0 and load_mu(0.01, mu_per_s=10.0, min_mu=5.0) == 5.0
    assert load_mu(2.0, mu_per_s=10.0, min_mu=5.0) == 20.0


async def test_a_tenant_at_its_quota_unloads_its_own_adapter_never_another_tenants(replica, tmp_path):
    b_ft, a_one, a_two = artifact(tmp_path, 2, 1), artifact(tmp_path, 1, 2), artifact(tmp_path, 1, 3)
    slots = ReplicaAdapters()
    async with aiohttp.ClientSession() as session:

        async def load(adapter):
            return await ensure_loaded(
                session, url=replica, replica=slots, adapter=adapter, max_loras=2, timeout_s=5, tenant_slots=1
            )

        assert await load(b_ft) > 0 and await load(a_one) > 0
        # B's adapter is idle and the least recently used, yet A at its one slot may only give up its own.
        slots.last_used[b_ft.engine_name] = 0.0
        assert await load(a_two) > 0
        assert await unloaded(session, replica) == [a_one.engine_name]
        assert sorted(await held_by_engine(session, replica)) == sorted([b_ft.engine_name, a_two.engine_name])
        # A's adapter in use: A's next one waits (a 503 with Retry-After), B's adapter still stays.
        slots.in_use[a_two.engine_name] = 1
        assert not slots.can_serve(a_one.engine_name, 2, 1)
        with pytest.raises(ProxyError) as caught:
            await load(a_one)
        assert (caught.value.status, caught.value.code, caught.value.retry_after) == (503, "adapter_slots_busy", 1)
        assert b_ft.engine_name in await held_by_engine(session, replica)


async def test_adapters_queued_for_are_not_unloaded_and_stale_reports_add_nothing(replica, tmp_path):
    first, second, third = (artifact(tmp_path, None, i) for i in (1, 2, 3))
    queued: set[str] = set()
    slots = ReplicaAdapters(queued=lambda: queued)
    async with aiohttp.ClientSession() as session:
        for adapter in (first, second):
            await ensure_loaded(session, url=replica, replica=slots, adapter=adapter, max_loras=2, timeout_s=5)
        queued.update({first.engine_name, second.engine_name})  # requests wait in the queue for both
        assert not slots.can_serve(third.engine_name, 2)
        with pytest.raises(ProxyError):
            await ensure_loaded(session, url=replica, replica=slots, adapter=third, max_loras=2, timeout_s=5)
        queued.discard(first.engine_name)
        await ensure_loaded(session, url=replica, replica=slots, adapter=third, max_loras=2, timeout_s=5)
        assert await unloaded(session, replica) == [first.engine_name]
        # A metrics scrape taken before that unload still lists the first adapter running: it stays unloaded here,
        # else the proxy would count three adapters on two slots and the engine would evict on its own.
        slots.note_active(frozenset({first.engine_name}), now=100.0, observed_at=slots.changed_at)
        assert first.engine_name not in slots.held()
        # Names no adapter has now (deleted, an older artifact version) are unloaded once nothing waits for them.
        current = {third.engine_name}
        assert await unload_stale(session, url=replica, replica=slots, current=current, endpoint_name="base") == []
        queued.clear()
        gone = await unload_stale(
            session, url=replica, replica=slots, current={third.engine_name}, endpoint_name="base"
        )
        assert gone == [second.engine_name] and await held_by_engine(session, replica) == [third.engine_name]


async def test_a_list_read_while_this_process_loads_is_ignored(replica, tmp_path):
    adapter = artifact(tmp_path, 1, 1)
    slots = ReplicaAdapters()
    async with aiohttp.ClientSession() as session:
        read_since = slots.clock()
        await asyncio.sleep(0.01)
        await ensure_loaded(session, url=replica, replica=slots, adapter=adapter, max_loras=2, timeout_s=5)
        slots.sync_from_models(set(), read_since)  # read before the load ended: it would forget a held adapter
        assert adapter.engine_name in slots.held()
        slots.sync_from_models(set(), slots.clock())
        assert adapter.engine_name not in slots.held()
