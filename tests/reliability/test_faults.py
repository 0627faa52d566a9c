"""Faults injected into the real platform: every scenario of ``bench reliability`` with short durations.

Order matters a little: the scenarios share one platform, each leaves it whole (replicas replaced,
relays restored) for the next; the books are checked last, across all of them.
"""

import pytest

from workers.benchmarks import reliability as scenarios

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_replica_crash_mid_stream_ends_streams_cleanly_and_is_replaced(platform, db_access):
    result = scenarios.crash_mid_stream(platform, print)

    assert result["cut_mid_stream"] >= 1, "the kill must land while some streams are running"
    assert result["clean_error_events"] == result["cut_mid_stream"], "every cut stream ends with an error event"
    assert result["after_crash_ok"] == result["after_crash_total"], "new requests go to the other replicas"
    assert result["victim_state"] in ("failed", "stopped")
    assert result["replaced_within_s"] is not None, "a replacement replica becomes ready"
    assert result["usage_keeps_delivered_tokens"], "cut streams are billed for the tokens delivered, no more"
    assert result["proxy_5xx"] == 0


def test_hung_replica_is_detected_within_15_s_and_gets_no_traffic_afterwards(platform, db_access):
    result = scenarios.replica_hang(platform, print)

    assert result["detect_s"] is not None and result["detect_s"] <= 15
    assert result["recover_s"] is not None
    assert result["ok_after_detection"] == result["after_detection_total"]
    assert result["routed_to_hung_after_detection"] == 0


def test_postgres_down_proxy_keeps_serving_and_no_usage_is_lost(platform, db_access):
    result = scenarios.dependency_down(platform, print, platform.pg_relay, "PostgreSQL", 6)

    assert result["relay_connections_refused"] > 0, "the platform really tried PostgreSQL while it was down"
    assert result["ok"] == result["requests"] > 0
    assert result["proxy_5xx"] == 0
    assert result["lost_usage_so_far"] == 0 and result["duplicated_usage_so_far"] == 0


def test_redis_down_proxy_keeps_serving_and_control_loops_resume(platform, db_access):
    result = scenarios.dependency_down(platform, print, platform.redis_relay, "Redis", 6)

    assert result["relay_connections_refused"] > 0
    assert result["ok"] == result["requests"] > 0, "rate limits fail open (INFERCAP_RATE_LIMIT_FAIL_MODE=open)"
    assert result["proxy_5xx"] == 0
    assert result["celery_resumed_within_s"] is not None
    assert not result["double_scaled"]


def test_worker_killed_mid_task_task_is_redelivered_and_idempotent(platform, db_access):
    result = scenarios.worker_killed(platform, print)

    assert result["attempts"] >= 2, "late acks: the killed worker's task runs again"
    assert result["effects_recorded"] == 1, "and its effect is recorded once"


def test_overload_keeps_critical_within_slo_and_sheds_sheddable_with_retry_after(platform, db_access):
    result = scenarios.overload(platform, print, 8)

    assert result["critical_slo_attainment"] >= 0.95
    assert result["sheddable_429_share"] > 0.3, "sheddable traffic absorbs the overload"
    assert result["sheddable_429_with_retry_after"] == 1.0
    assert result["proxy_5xx"] == 0
    assert result["proxy_peak_rss_mb"] < 400


def test_bad_input_gets_4xx_and_the_proxy_survives(platform, db_access):
    result = scenarios.bad_input(platform, print)

    assert result["server_error_cases"] == []
    assert result["all_4xx"]
    assert result["slow_body"]["status"] == 408, "a trickled body is cut off with 408 Request Timeout"
    assert result["slow_body"]["seconds"] < 15
    assert result["proxy_alive"]


def test_usage_books_balance_across_every_fault(platform, db_access):
    books = platform.wait_books_settled(timeout_s=60)

    assert books["seen"] > 100
    assert books["lost"] == 0
    assert books["duplicated"] == 0


def test_a_key_cannot_reach_another_tenants_endpoint_through_the_proxy(platform, db_access):
    import time

    import httpx

    from tests.factories import EndpointFactory, TenantFactory

    # Static actuator: the running autoscaler must not start replicas for it (they would outlive the test).
    other = EndpointFactory(
        name=f"{platform.seeded.endpoint_name}-other",
        owner_tenant=TenantFactory(),
        launch_options={"actuator": "static"},
    )
    try:
        time.sleep(1.5)  # the proxy's snapshot picks up the new endpoint
        response = httpx.post(
            f"{platform.base}/v1/chat/completions",
            json={**platform.body(stream=False), "model": other.name},
            headers={"Authorization": f"Bearer {platform.seeded.keys['critical']}"},
            timeout=10,
        )
        assert response.status_code in (403, 404)
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    finally:
        other.delete()


def test_raw_keys_never_reach_the_logs_or_the_database(platform, db_access):
    from tenants.models import ApiKey

    logs = "".join(path.read_text(errors="replace") for path in platform.log_paths.values() if path.exists())
    assert logs, "the processes wrote logs"
    for raw in platform.seeded.keys.values():
        assert raw not in logs
        stored = ApiKey.objects.get(prefix=raw[:12])
        assert raw not in (stored.key_hash, stored.prefix) and stored.key_hash != raw


def test_rest_api_fuzzed_from_its_openapi_schema_has_no_500s_and_matches_it(platform, db_access):
    result = scenarios.api_fuzz(platform, print, 20)

    assert result["ran"], result
    assert result["server_errors"] == 0, result["output"]
    assert result["schema_violations"] == 0, result["output"]
