"""Two worker processes racing on the same tick: one decision, one actuation."""

import json
import os
import subprocess
import sys
import time

import pytest
from django.conf import settings

from capacity.autoscaling import store
from capacity.models import AutoscalerDecision
from endpoints.models import Endpoint
from tests.proxy.conftest import ROOT, subprocess_database_url
from tests.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

WORKER = """
import json, os, time, django
django.setup()
import redis
from django.conf import settings
from capacity.autoscaling.ticks import horizontal_tick
client = redis.Redis.from_url(settings.REDIS_URL)
client.incr("infercap:test:ready")
while not client.exists("infercap:test:go"):
    time.sleep(0.005)
decision = horizontal_tick(endpoint_id=int(os.environ["ENDPOINT_ID"]), tick=os.environ["TICK"])
print(json.dumps({"decision": decision.pk if decision else None}))
"""


def _ready_count(client, workers) -> int:
    for worker in workers:
        if worker.poll() is not None:  # died before the race: fail now, with its error
            raise AssertionError(worker.stderr.read().decode()[-2000:])
    return int(client.get("infercap:test:ready") or 0)


def test_two_worker_processes_one_decision(clean_store, tenant_a):
    endpoint = tenant_a.endpoint
    Endpoint.objects.filter(pk=endpoint.pk).update(launch_options={"actuator": "static"}, concurrency_limit=10)
    clean_store.hset(
        store.DEMAND_KEY.format(endpoint_id=endpoint.pk), "p", json.dumps({"t": time.time(), "in_flight": 40})
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings.test",
        "DATABASE_URL": subprocess_database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "ENDPOINT_ID": str(endpoint.pk),
        "TICK": "h-processes",
    }
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for _ in range(2)
    ]
    try:
        # Both are up (Django set up, the tick imported) and waiting, so the go signal starts a real race.
        wait_for(lambda: _ready_count(clean_store, workers) == 2, 60, message="both workers ready")
        clean_store.set("infercap:test:go", "1")
        outputs = [w.communicate(timeout=60) for w in workers]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait(5)
    results = [json.loads(out.decode().strip().splitlines()[-1])["decision"] for out, _ in outputs]
    assert sum(r is not None for r in results) == 1, [err.decode()[-500:] for _, err in outputs]
    decision = AutoscalerDecision.objects.get(endpoint=endpoint, tick="h-processes")
    assert decision.desired > decision.current
    assert any(a.startswith("launch failed") for a in decision.inputs["actions"])  # the static actuator cannot start
