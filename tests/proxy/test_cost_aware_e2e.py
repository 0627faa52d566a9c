"""A mixed fleet behind the live proxy, routed by cost under the SLO (``routing_policy`` cost_aware, the endpoint's
``routing_plan``): short chats go to the cheap GPUs, long prompts to the fast ones the plan says can prefill them
in time (docs/algorithms.md#routing-a-mixed-fleet). Through real sockets, on simulated replicas."""

import httpx
import pytest

from billing.models import UsageRecord
from capacity.models import HardwareProfile
from tests.factories import EndpointFactory, HardwareProfileFactory
from tests.proxy.conftest import spawn_proxy, spawn_replica
from tests.proxy.helpers import chat_body, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PLAN = {
    "buckets": [
        {"name": "chat", "prompt_tokens": 16, "output_tokens": 8},
        {"name": "doc", "prompt_tokens": 1024, "output_tokens": 8},
    ],
    # The cheap type's prefill of a document misses the TTFT SLO (batch 0); the fast one costs ten times more.
    "types": {
        "cheap-gpu": {"usd_per_hour": 1.0, "batch": {"chat": 8, "doc": 0}, "rate_rps": {"chat": 20.0, "doc": 0.0}},
        "fast-gpu": {"usd_per_hour": 10.0, "batch": {"chat": 16, "doc": 4}, "rate_rps": {"chat": 40.0, "doc": 4.0}},
    },
    "shares": {"chat": {"cheap-gpu": 1.0}, "doc": {"fast-gpu": 1.0}},
}


def test_chats_go_to_the_cheap_gpus_and_documents_to_the_fast_ones(procs, clean_redis, tenant_a):
    fast = HardwareProfileFactory(name="fast-gpu", gpu_type="H100")
    cheap = HardwareProfileFactory(
        name="cheap-gpu", gpu_type="L40S", capacity_type=HardwareProfile.CapacityType.ON_DEMAND
    )
    endpoint = EndpointFactory(
        name="mixed-fleet", owner_tenant=tenant_a.tenant, hardware_profile=fast, routing_policy="cost_aware",
        routing_plan=PLAN,
    )  # fmt: skip
    _, on_cheap, _ = spawn_replica(procs, endpoint=endpoint, name="cheap", speed=20)
    on_cheap.hardware_profile = cheap  # it runs on the cheap pool; the other on the endpoint's own (fast) profile
    on_cheap.save(update_fields=["hardware_profile"])
    spawn_replica(procs, endpoint=endpoint, name="fast", speed=20)
    # Scrapes lag on a loaded CI host, and a replica whose metrics are stale is passed over (a chat then lands on the
    # fast replica); staleness is not what this test is about, so it allows 30 s and waits until the proxy has
    # scraped both replicas: a warm-up chat served by the cheap one and a document by the fast one.
    base = spawn_proxy(procs, metrics_stale_s=30)
    headers = {"Authorization": f"Bearer {tenant_a.raw_key}"}

    def both_seen() -> bool:
        wanted = {}
        for content, replica in (("warm-up", "cheap"), ("warm-up document " + "lorem ipsum " * 340, "fast")):
            r = httpx.post(
                base + "/v1/chat/completions",
                json=chat_body(endpoint.name, max_tokens=8, stream=False, content=content),
                headers=headers,
                timeout=30,
            )
            if r.status_code != 200:
                return False
            wanted[r.headers["x-request-id"]] = replica
        wait_for(lambda: UsageRecord.objects.filter(request_id__in=wanted).count() == len(wanted), 20)
        got = dict(UsageRecord.objects.filter(request_id__in=wanted).values_list("request_id", "replica__name"))
        return got == wanted

    wait_for(both_seen, 30, interval=0.5)
    sent = {}
    # Runs of three chats, then three documents, twice: round robin would put each kind on both replicas.
    for kind in ("chat", "doc", "chat", "doc"):
        for i in range(3):
            content = f"hello {i}" if kind == "chat" else f"document {i} " + "lorem ipsum " * 340
            r = httpx.post(
                base + "/v1/chat/completions",
                json=chat_body(endpoint.name, max_tokens=8, stream=False, content=content),
                headers=headers,
                timeout=30,
            )
            assert r.status_code == 200, r.text
            sent[r.headers["x-request-id"]] = kind
    wait_for(lambda: UsageRecord.objects.filter(request_id__in=sent).count() == len(sent), 20)
    served = dict(UsageRecord.objects.filter(request_id__in=sent).values_list("request_id", "replica__name"))
    assert {served[rid] for rid, kind in sent.items() if kind == "chat"} == {"cheap"}
    assert {served[rid] for rid, kind in sent.items() if kind == "doc"} == {"fast"}
