"""The warm pool in whole TP groups (docs/placement.md, "In the actuators"): a standby whose group is not free whole
inside one domain is not started, holds nothing, and the warm pool's action says why, as a serving launch's does."""

import json
import time

from capacity.autoscaling import services
from capacity.autoscaling.actuators import local
from capacity.autoscaling.actuators.local import LocalActuator
from endpoints.models import Endpoint


def _endpoint(endpoint, size: int) -> Endpoint:
    options = {"actuator": "local", "profile": "tiny", "tensor_parallel_size": size}
    Endpoint.objects.filter(pk=endpoint.pk).update(launch_options=options, warm_pool_size=1)
    return Endpoint.objects.get(pk=endpoint.pk)


def test_a_standby_short_of_a_whole_group_is_not_started_and_says_why(
    db, tenant_a, settings, tmp_path, monkeypatch, reap_local_replicas, clean_store
):
    settings.INFERCAP = {**settings.INFERCAP, "LOCAL_GPUS": "4"}
    settings.VAR_DIR = tmp_path
    # One GPU of four is held by a replica that is starting: three are free, no TP-4 group.
    holding = {"serving-1": {"gpus": [0], "pid": None, "port": 8123, "at": time.time()}}
    (tmp_path / "local-gpus.json").write_text(json.dumps(holding))
    started: list[dict] = []
    monkeypatch.setattr(local.subprocess, "Popen", lambda *a, **k: started.append(k) or None)
    endpoint = _endpoint(tenant_a.endpoint, 4)
    actions = services.keep_warm_pool(endpoint=endpoint, actuator=LocalActuator())
    assert actions == [
        "warm pool: launch failed: capped at 0 of 1: no whole TP-4 group free in one domain (3 GPUs free)"
    ]
    assert not endpoint.replicas.filter(is_standby=True).exists() and started == []
    assert LocalActuator.gpu_ledger().held() == {"serving-1": [0]}  # nothing held for the standby
    # A TP-2 standby fits in the three free GPUs (0 is held): its group is whole, GPUs 1 and 2.
    monkeypatch.undo()  # real replica processes from here
    actions = services.keep_warm_pool(endpoint=_endpoint(tenant_a.endpoint, 2), actuator=LocalActuator())
    assert actions[-1].startswith("warm pool: started 1")
    standby = endpoint.replicas.get(is_standby=True)
    assert sorted(LocalActuator.gpu_ledger().held()[standby.name]) == [1, 2]
