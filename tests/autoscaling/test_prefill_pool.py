"""A disaggregated endpoint's two pools in the autoscaler: one horizontal tick decides the decode pool (demand) and
the prefill pool (its replicas' prompt-token counters and TTFT), stores both decisions, and one reconcile launches
each pool in its own role; a change of serving mode retires the old role only as the new one is ready."""

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from capacity.autoscaling import prefill, services, ticks
from capacity.autoscaling.actuators.base import Actuator
from capacity.models import AutoscalerDecision, HardwareProfile
from capacity.unit_resolver import prefill_coefficients
from endpoints.models import Endpoint, Replica, ReplicaRole, ReplicaState, ServingMode
from tests.factories import ReplicaFactory

pytestmark = pytest.mark.django_db(transaction=True)


class RoleRecorder(Actuator):
    """Records each launch's role, hardware and options (what the actuators turn into engine flags); starts nothing."""

    name = "recording"

    def __init__(self):
        self.launched, self.terminated, self.lock = [], [], threading.Lock()

    def launch(self, endpoint, count, *, standby=False):
        role = getattr(endpoint, "launch_role", ReplicaRole.MIXED)
        with self.lock:
            self.launched.append(
                (role, count, getattr(endpoint, "launch_hardware_profile_id", None), dict(endpoint.launch_options))
            )
        return [
            ReplicaFactory(endpoint=endpoint, state=ReplicaState.STARTING, actuator=self.name, role=role)
            for _ in range(count)
        ]

    def terminate(self, replicas, *, reason):
        with self.lock:
            self.terminated += [r.pk for r in replicas]
        for replica in replicas:
            self.stop_row(replica, reason)

    def sync(self, endpoint):
        pass


@pytest.fixture
def actuator(monkeypatch):
    recording = RoleRecorder()
    monkeypatch.setattr(services, "get_actuator", lambda endpoint: recording)
    return recording


class PrefillMetrics:
    """A prefill replica's /metrics: computed prompt tokens, waiting prompts and a TTFT histogram."""

    def __init__(self):
        self.prompt_tokens, self.cache_hits, self.waiting = 0.0, 0.0, 0.0
        self.ttft_fast, self.ttft_slow = 0.0, 0.0  # first tokens ≤ 0.5 s, and in (2.5, 5] s
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                body = (
                    f'vllm:prompt_tokens_total{{model_name="m"}} {outer.prompt_tokens}\n'
                    f'vllm:prefix_cache_hits_total{{model_name="m"}} {outer.cache_hits}\n'
                    f'vllm:num_requests_waiting{{model_name="m"}} {outer.waiting}\n'
                    f'vllm:time_to_first_token_seconds_bucket{{le="0.5"}} {outer.ttft_fast}\n'
                    f'vllm:time_to_first_token_seconds_bucket{{le="2.5"}} {outer.ttft_fast}\n'
                    f'vllm:time_to_first_token_seconds_bucket{{le="5.0"}} {outer.ttft_fast + outer.ttft_slow}\n'
                    f'vllm:time_to_first_token_seconds_bucket{{le="+Inf"}} {outer.ttft_fast + outer.ttft_slow}\n'
                ).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture
def metrics():
    server = PrefillMetrics()
    yield server
    server.httpd.shutdown()


@pytest.fixture
def disaggregated(tenant_a):
    Endpoint.objects.filter(pk=tenant_a.endpoint.pk).update(
        serving_mode=ServingMode.DISAGGREGATED,
        prefill_min_replicas=1,
        prefill_max_replicas=6,
        prefill_desired_replicas=1,
        launch_options={"cpus": 1, "speed": 1.0},
        prefill_launch_options={"speed": 2.0},
        ttft_slo_ms=1000,
        max_replicas=4,
    )
    endpoint = Endpoint.objects.get(pk=tenant_a.endpoint.pk)
    ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY, actuator="recording", role=ReplicaRole.DECODE)
    return endpoint


def prefill_rows(endpoint):
    return list(AutoscalerDecision.objects.filter(endpoint=endpoint, axis="prefill").order_by("at"))


def test_one_tick_scales_the_prefill_pool_on_its_prompt_rate(clean_store, actuator, disaggregated, metrics):
    endpoint = disaggregated
    ReplicaFactory(
        endpoint=endpoint, state=ReplicaState.READY, actuator="recording", role=ReplicaRole.PREFILL, url=metrics.url
    )
    coeffs = prefill_coefficients(endpoint)
    per_replica = prefill.tokens_per_s_capacity(mu_per_min=coeffs.mu_per_min, alpha=coeffs.alpha)
    now = time.time()
    metrics.prompt_tokens = 1_000_000.0
    first = ticks.horizontal_tick(endpoint_id=endpoint.pk, tick="h-1", now=now)
    assert first is not None and first.axis == "horizontal"
    [hold] = prefill_rows(endpoint)
    assert hold.desired == 1 and hold.inputs["tokens_per_s_20s"] == 0  # the first read gives no rate yet
    # Five seconds later the replica computed 5 s × 2.4 replicas' worth at 60 % (cache hits do not count).
    metrics.prompt_tokens += 5 * 2.4 * 0.6 * per_replica + 50_000
    metrics.cache_hits += 50_000
    ticks.horizontal_tick(endpoint_id=endpoint.pk, tick="h-2", now=now + 5)
    up = prefill_rows(endpoint)[-1]
    assert up.inputs["up_need"] == pytest.approx(2.4, rel=0.01)
    assert (up.current, up.desired, up.applied) == (1, 3, True) and up.reason.startswith("scale up")
    assert up.inputs["actions"] and all(a.startswith("prefill: ") for a in up.inputs["actions"])
    endpoint.refresh_from_db()
    assert endpoint.prefill_desired_replicas == 3
    # Two prefill replicas launched in their role, the prefill pool's options over the endpoint's; no decode launch.
    expected = {"cpus": 1, "speed": 2.0}
    assert [(role, n, opts) for role, n, _, opts in actuator.launched] == [(ReplicaRole.PREFILL, 2, expected)]
    assert Replica.objects.filter(endpoint=endpoint, role=ReplicaRole.PREFILL).count() == 3
    # The decode pool's decision does not count the prefill replicas.
    decode = AutoscalerDecision.objects.filter(endpoint=endpoint, axis="horizontal").order_by("-at").first()
    assert decode.inputs["ready"] == 1 and not any(a.startswith("prefill: ") for a in decode.inputs["actions"])
    # A redelivered tick stores nothing twice.
    assert ticks.horizontal_tick(endpoint_id=endpoint.pk, tick="h-2", now=now + 5) is None
    assert len(prefill_rows(endpoint)) == 2


def test_a_ttft_queue_adds_a_prefill_replica(clean_store, actuator, disaggregated, metrics):
    endpoint = disaggregated
    ReplicaFactory(
        endpoint=endpoint, state=ReplicaState.READY, actuator="recording", role=ReplicaRole.PREFILL, url=metrics.url
    )
    now = time.time()
    ticks.horizontal_tick(endpoint_id=endpoint.pk, tick="h-1", now=now)
    metrics.ttft_fast, metrics.ttft_slow, metrics.waiting = 10.0, 10.0, 4.0  # p95 in (2.5, 5] s, 4 waiting
    ticks.horizontal_tick(endpoint_id=endpoint.pk, tick="h-2", now=now + 5)
    row = prefill_rows(endpoint)[-1]
    assert row.desired == 2 and "TTFT" in row.reason and row.inputs["ttft_p95_ms"] > 2500


def test_an_aggregated_endpoint_has_no_prefill_decision(clean_store, actuator, tenant_a):
    ReplicaFactory(endpoint=tenant_a.endpoint, state=ReplicaState.READY, actuator="recording")
    ticks.horizontal_tick(endpoint_id=tenant_a.endpoint.pk, tick="h-1", now=time.time())
    assert prefill_rows(tenant_a.endpoint) == []
    assert all(role == ReplicaRole.MIXED for role, *_ in actuator.launched)


def test_switching_to_disaggregated_retires_mixed_replicas_only_as_decode_ones_are_ready(
    clean_store, actuator, tenant_a
):
    endpoint = tenant_a.endpoint
    mixed = [ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY, actuator="recording") for _ in range(2)]
    spare_profile = HardwareProfile.objects.exclude(pk=endpoint.hardware_profile_id).first()
    Endpoint.objects.filter(pk=endpoint.pk).update(
        serving_mode=ServingMode.DISAGGREGATED,
        desired_replicas=2,
        prefill_desired_replicas=1,
        prefill_hardware_profile=spare_profile,
    )
    endpoint.refresh_from_db()
    actions = services.reconcile(endpoint=endpoint)
    launched = {role: (n, hw) for role, n, hw, _ in actuator.launched}
    assert launched[ReplicaRole.DECODE][0] == 2 and launched[ReplicaRole.PREFILL][0] == 1
    if spare_profile is not None:
        assert launched[ReplicaRole.PREFILL][1] == spare_profile.pk  # the prefill pool's own hardware
    assert actuator.terminated == [] and not any("draining" in a for a in actions)  # nothing ready replaces them yet
    Replica.objects.filter(endpoint=endpoint, role=ReplicaRole.DECODE).update(state=ReplicaState.READY)
    actions = services.reconcile(endpoint=endpoint)
    for replica in mixed:
        replica.refresh_from_db()
        assert replica.state == ReplicaState.DRAINING
    assert sum("draining" in a for a in actions) == 2
