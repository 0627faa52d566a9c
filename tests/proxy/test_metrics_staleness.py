"""How old a replica's scraped metrics may be before the router counts it as saturated: the proxy's
``metrics_stale_s`` knob (``INFERCAP_PROXY_METRICS_STALE_S``) reaches every policy's shared filter."""

import dataclasses

import pytest

from capacity.runtimes.vllm_metrics import ReplicaMetrics
from gateway.proxy.config import ProxyConfig, load_config
from gateway.proxy.runtime import EndpointRuntime
from gateway.routing.base import RouteRequest
from tests.rollouts.test_traffic_split import info

NOW = 100.0


class Scraper:
    """The scraper's read side: replica ``11``'s last scrape is five seconds old, the others' are fresh."""

    def latest(self, replica_id: str) -> ReplicaMetrics:
        return ReplicaMetrics(
            num_gpu_blocks=1000, block_size=16, scraped_at=NOW - (5.0 if replica_id == "11" else 0.0)
        )

    def note(self, replica_ids) -> None:
        pass


def routed_to(config: ProxyConfig, policy: str) -> str:
    """Where a request goes when the fresh replica already runs two requests and the stale one none."""
    endpoint = dataclasses.replace(info(limit=8), routing_policy=policy, replicas=info().replicas[:2])
    rt = EndpointRuntime(endpoint, config=config, scraper=Scraper(), clock=lambda: NOW)
    for i in range(2):
        rt.try_take(RouteRequest(request_id=f"busy{i}", prompt_text="x"), 1.0, exclude={"11"})
    return rt.try_take(RouteRequest(request_id="probe", prompt_text="a new prompt"), 1.0).view.replica_id


@pytest.mark.parametrize("policy", ["least_request", "infercap"])
def test_a_replica_with_stale_metrics_gets_no_traffic_until_the_knob_allows_its_age(policy):
    assert routed_to(ProxyConfig(), policy) == "10"  # 5 s > the 2 s default: counted as saturated
    assert routed_to(ProxyConfig(metrics_stale_s=10.0), policy) == "11"  # the idle one, once 5 s is fresh enough


def test_the_knob_is_read_from_the_environment_and_must_be_positive(monkeypatch):
    assert load_config().metrics_stale_s == 2.0
    monkeypatch.setenv("INFERCAP_PROXY_METRICS_STALE_S", "7.5")
    assert load_config().metrics_stale_s == 7.5
    monkeypatch.setenv("INFERCAP_PROXY_METRICS_STALE_S", "0")
    with pytest.raises(ValueError, match="metrics_stale_s"):
        load_config()
