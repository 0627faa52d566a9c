"""LoRA adapters attacked as a tenant would (docs/lora-serving.md): registering another tenant's artifact directory
and probing the store through the refusals, a name freed by a delete or rename and registered again, and one
tenant's adapters thrashing a shared replica's slots under another tenant's adapter.

The proxy cases add a shared LoRA endpoint with its own simulated replica (``--max-loras 2``) to the committed world
and take it away again; what the engine loaded, unloaded and served, with each artifact's path, is read back from the
simulator's ``/admin/lora``.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
from django.conf import settings

from benchmarks.harness.security.registry import expect, security_case
from benchmarks.harness.security.world import SecurityWorld
from billing.models import UsageRecord
from capacity.runtimes.lora_artifacts import owner_root
from capacity.runtimes.processes import free_port, sim_replica_argv
from endpoints.adapters import adapter_create, adapter_delete, adapter_update
from endpoints.models import Adapter, Endpoint, Replica, ReplicaState, Runtime
from tenants.models import CapacityReservation

LORA_OPTIONS = {"max_loras": 2, "max_lora_rank": 16}
URL = "/api/v1/adapters/"


def _root() -> Path:
    return Path(settings.INFERCAP["LORA_ROOT"])


def _artifact(owner_tenant_id: int | None, relative: str, *, base_model: str, config: bool = True) -> Path:
    directory = owner_root(_root(), owner_tenant_id) / relative
    directory.mkdir(parents=True, exist_ok=True)
    if config:
        body = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "base_model_name_or_path": base_model}
        (directory / "adapter_config.json").write_text(json.dumps(body))
    (directory / "adapter_model.safetensors").write_bytes(os.urandom(16))
    return directory


def _lora_endpoint(world: SecurityWorld, name: str, owner=None) -> Endpoint:
    base = world.a.endpoint
    return Endpoint.objects.create(
        name=name,
        owner_tenant=owner,
        model_profile=base.model_profile,
        hardware_profile=base.hardware_profile,
        runtime=Runtime.SIM,
        concurrency_limit=16,
        concurrency_max=16,
        launch_options=dict(LORA_OPTIONS),
    )


@security_case(
    "adapters.foreign_artifact", "a tenant admin registers an adapter on another tenant's artifact directory"
)
def foreign_artifact(world: SecurityWorld) -> str:
    a, b = world.a.tenant.pk, world.b.tenant.pk
    model = world.a.endpoint.model_profile.name
    made = [
        _artifact(b, f"{world.tag}-ft-secret", base_model=model),
        _artifact(b, f"{world.tag}-no-config", base_model=model, config=False),
        _artifact(a, f"{world.tag}-other-base", base_model="mistralai/Mistral-7B-v0.1"),
    ]
    try:
        endpoint = _lora_endpoint(world, f"{world.tag}-a-lora", owner=world.a.tenant)
        paths = [
            f"tenants/{b}/{world.tag}-ft-secret",  # B's fine-tune, spelled from the store's root
            f"tenants/{b}/{world.tag}-no-config",  # B's directory without a config
            f"../{b}/{world.tag}-ft-secret",
            f"{world.tag}-ft-secret",  # B's directory's name, in A's own part: not there
            f"{world.tag}-missing",
            f"{world.tag}-other-base",  # A's own, trained on another model: its base is not echoed
            "/etc",
        ]
        answers = {}
        for who in (world.a.admin, world.a.keys["write"]):
            for path in paths:
                body = {"name": f"{world.tag}-probe", "endpoint": endpoint.pk, "artifact_path": path}
                response = world.api(who).post(URL, body, format="json")
                expect(response.status_code == 400, f"{path!r} answered {response.status_code}: accepted")
                answers[path] = response.content
        expect(len(set(answers.values())) == 1, f"the refusals differ: {sorted(set(answers.values()))[:3]}")
        expect(not Adapter.objects.filter(endpoint=endpoint).exists(), "an adapter was created")
        return f"{len(paths)} paths (B's fine-tune among them) refused with one identical 400, admin and write key"
    finally:
        for directory in made:
            shutil.rmtree(directory, ignore_errors=True)


class LoraFleet:
    """A shared LoRA endpoint with one simulated replica (2 adapter slots) in the committed world, and adapters'
    artifacts: what a proxy case adds and takes away."""

    def __init__(self, world: SecurityWorld) -> None:
        self.world = world
        port = free_port()
        extra = ["--max-loras", "2", "--max-lora-rank", "16"]
        self.endpoint = _lora_endpoint(world, f"{world.tag}-lora-shared")
        self.proc = world.procs.spawn(
            sim_replica_argv(port, speed=20.0, served_model_name=self.endpoint.name, extra=extra), port=port
        )
        self.url = f"http://127.0.0.1:{port}"
        Replica.objects.create(
            endpoint=self.endpoint, name=f"{self.endpoint.name}-r0", url=self.url, state=ReplicaState.READY,
            concurrency_limit=16,
        )  # fmt: skip
        for side in (world.a, world.b):  # reserved: the best-effort cap is not what these cases measure
            CapacityReservation.objects.create(tenant=side.tenant, endpoint=self.endpoint, mu_per_min=1e6)
        self.dirs: list[Path] = []

    def adapter(self, side, name: str, relative: str) -> tuple[Adapter, str]:
        """Register ``name`` for a tenant side on its own artifact ``relative``; returns it and the real path."""
        tenant = side.tenant
        directory = _artifact(tenant.pk, relative, base_model=self.endpoint.model_profile.name)
        self.dirs.append(directory)
        adapter = adapter_create(
            actor=side.admin, name=name, owner_tenant=tenant, endpoint=self.endpoint, artifact_path=relative
        )
        return adapter, os.path.realpath(directory)

    def events(self) -> list[dict]:
        return httpx.get(self.url + "/admin/lora", timeout=10).json()["events"]

    def close(self) -> None:
        self.world.procs.kill(self.proc)
        time.sleep(1.0)  # the proxy's last usage records are flushed every 0.25 s
        UsageRecord.objects.filter(endpoint=self.endpoint).delete()
        CapacityReservation.objects.filter(endpoint=self.endpoint).delete()
        Adapter.objects.filter(endpoint=self.endpoint).delete()
        Replica.objects.filter(endpoint=self.endpoint).delete()
        self.endpoint.delete()
        for directory in self.dirs:
            shutil.rmtree(directory, ignore_errors=True)


@contextmanager
def lora_fleet(world: SecurityWorld):
    world.proxy()
    fleet = LoraFleet(world)
    try:
        yield fleet
    finally:
        fleet.close()


def _served_until(world: SecurityWorld, key: str, model: str, *, timeout_s: float = 15.0) -> httpx.Response:
    """Send until the proxy's snapshot serves ``model`` (it reloads on the change): the first 200."""
    deadline = time.monotonic() + timeout_s
    while True:
        response = world.proxy_post(key, world.completion(model))
        if response.status_code == 200 or time.monotonic() > deadline:
            return response
        time.sleep(0.2)


def _last_served_path(fleet: LoraFleet) -> str:
    served = [e for e in fleet.events() if e["event"] == "serve"]
    return served[-1]["path"] if served else ""


@security_case(
    "adapters.name_reuse_serves_own_weights",
    "B deletes (or renames) an adapter; A registers the freed name on its own artifact and calls it",
    needs_proxy=True,
)
def name_reuse_serves_own_weights(world: SecurityWorld) -> str:
    a_key, b_key = world.a.keys["inference"], world.b.keys["inference"]
    with lora_fleet(world) as fleet:
        checked, deleted_path = [], ""
        for how in ("delete", "rename"):
            name = f"{world.tag}-{how}-ft"
            b_adapter, b_path = fleet.adapter(world.b, name, f"{world.tag}-{how}-b")
            response = _served_until(world, b_key, name)
            expect(
                response.status_code == 200, f"B's own adapter answered {response.status_code}: {response.text[:200]}"
            )
            expect(_last_served_path(fleet) == b_path, "B's request did not run on B's artifact")
            if how == "delete":
                adapter_delete(adapter=b_adapter, actor=world.b.admin)
                deleted_path = b_path
            else:
                adapter_update(adapter=b_adapter, actor=world.b.admin, name=f"{name}-moved")
            _, a_path = fleet.adapter(world.a, name, f"{world.tag}-{how}-a")
            response = _served_until(world, a_key, name)
            expect(response.status_code == 200, f"A's adapter answered {response.status_code}")
            expect(response.json().get("model") == name, f"A read model {response.json().get('model')!r}")
            served = _last_served_path(fleet)
            whose = "B" if served == b_path else "other"
            expect(served == a_path, f"after B's {how}, A's request ran on {whose}'s weights")
            checked.append(how)
        deadline = time.monotonic() + 10
        while not any(e["event"] == "unload" and e["path"] == deleted_path for e in fleet.events()):
            expect(time.monotonic() < deadline, "the deleted adapter was never unloaded from the replica")
            time.sleep(0.5)
        return (
            f"after B's {' and '.join(checked)}, A's request ran on A's artifact; the freed engine name was unloaded"
        )


def _hammer(world: SecurityWorld, key: str, model: str, stop: threading.Event, answers: list) -> None:
    with httpx.Client(timeout=30) as client:
        while not stop.is_set():
            response = client.post(
                world.proxy() + "/v1/completions",
                json=world.completion(model),
                headers={"Authorization": f"Bearer {key}"},
            )
            code = response.json().get("error", {}).get("code") if response.status_code != 200 else None
            answers.append((response.status_code, response.headers.get("retry-after"), code))


@security_case(
    "adapters.no_thrash_across_tenants",
    "tenant A hammers three adapters on a 2-slot shared replica while tenant B uses its one adapter",
    needs_proxy=True,
)
def no_thrash_across_tenants(world: SecurityWorld) -> str:
    with lora_fleet(world) as fleet:
        b_name = f"{world.tag}-b-steady"
        _, b_path = fleet.adapter(world.b, b_name, f"{world.tag}-b-steady")
        expect(_served_until(world, world.b.keys["inference"], b_name).status_code == 200, "B's adapter not served")
        a_names = []
        for i in range(3):
            a_names.append(f"{world.tag}-a-ft{i}")
            fleet.adapter(world.a, a_names[-1], f"{world.tag}-a-ft{i}")
        for name in a_names:
            expect(_served_until(world, world.a.keys["inference"], name).status_code == 200, f"{name} not served")
        stop, a_answers, b_answers = threading.Event(), [], []
        threads = [
            threading.Thread(target=_hammer, args=(world, world.a.keys["inference"], n, stop, a_answers))
            for n in a_names
        ] + [threading.Thread(target=_hammer, args=(world, world.b.keys["inference"], b_name, stop, b_answers))]
        for thread in threads:
            thread.start()
        time.sleep(4.0)
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
        b_unloads = [e for e in fleet.events() if e["event"] == "unload" and e["path"] == b_path]
        b_bad = sorted({(status, code) for status, _, code in b_answers if status != 200})
        a_404 = sum(1 for status, _, _ in a_answers if status == 404)
        a_no_retry = sum(1 for status, after, _ in a_answers if status in (429, 503) and not after)
        expect(b_answers and not b_bad, f"B's requests answered {b_bad} ({len(b_answers)} sent)")
        expect(not b_unloads, f"B's adapter was evicted {len(b_unloads)} times by A's loads")
        expect(a_404 == 0, f"A got {a_404} 404s for its own adapters")
        expect(a_no_retry == 0, f"{a_no_retry} of A's 429/503 carried no Retry-After")
        a_ok = sum(1 for status, _, _ in a_answers if status == 200)
        return (
            f"B: {len(b_answers)} requests all 200, its adapter never evicted; A: {a_ok}/{len(a_answers)} served, "
            "the rest 429/503 with Retry-After, no 404"
        )
