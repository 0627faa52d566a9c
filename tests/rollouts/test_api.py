"""REST API for endpoint versions and rollouts: the NetBox-style resource checks (roles, tenant isolation, field
errors, no N+1), the operator actions with their events and audit entries, and endpoint PATCHes that make a new
version (switched at once without running replicas, rolled out with them) while config-only changes make none."""

import pytest
from django.urls import reverse

from endpoints.models import Endpoint, EndpointVersion, Rollout, RolloutState
from endpoints.rollouts.services import create_version, ensure_current_version, start_rollout
from tenants.models import AuditEntry
from tenants.services import api_key_create
from tests.api.base import APIResourceCase
from tests.api.conftest import World
from tests.factories import EndpointFactory, ModelProfileFactory, ReplicaFactory

_speed = iter(range(2, 10**6))


@pytest.fixture
def world(operator, tenant_a, tenant_b) -> World:
    _, raw = api_key_create(tenant=tenant_a.tenant, name="a read-only", scopes=["read"])
    return World(operator=operator, a=tenant_a, b=tenant_b, a_read_key_raw=raw)


def side_of(world, side):
    return world.a if side == "a" else world.b


def new_version(endpoint, **changes) -> EndpointVersion:
    return create_version(endpoint=endpoint, launch_options={"speed": next(_speed)}, **changes)


def finished_rollout(endpoint) -> Rollout:
    current = ensure_current_version(endpoint)
    return Rollout.objects.create(
        endpoint=endpoint, from_version=current, to_version=new_version(endpoint), state=RolloutState.SUCCEEDED
    )


class TestEndpointVersions(APIResourceCase):
    basename = "endpoint-version"
    model = EndpointVersion
    write_access = None

    def make(self, world, side):
        return new_version(side_of(world, side).endpoint)

    def tenant_of(self, obj):
        return obj.endpoint.owner_tenant_id


class TestRollouts(APIResourceCase):
    basename = "rollout"
    model = Rollout
    write_access = "operators"
    supports_delete = False
    # A rollout is never edited: it is steered with actions (tested below).
    test_writer_updates = None
    test_reader_cannot_update = None
    test_other_tenants_object_cannot_be_changed = None

    def make(self, world, side):
        return finished_rollout(side_of(world, side).endpoint)

    def tenant_of(self, obj):
        return obj.endpoint.owner_tenant_id

    def create_payload(self, world):
        endpoint = EndpointFactory(owner_tenant=world.a.tenant)
        return {"endpoint": endpoint.pk, "to_version": new_version(endpoint).pk, "strategy": "canary"}

    def invalid_payloads(self, world):
        endpoint = EndpointFactory(owner_tenant=world.a.tenant)
        good = {"endpoint": endpoint.pk, "to_version": new_version(endpoint).pk}
        current = ensure_current_version(endpoint)
        return [
            ({"to_version": good["to_version"]}, "endpoint"),
            ({**good, "to_version": new_version(world.b.endpoint).pk}, "to_version"),
            ({**good, "to_version": current.pk}, "to_version"),  # already serving
            ({**good, "to_version": 10**9}, "to_version"),
            ({**good, "strategy": "yolo"}, "strategy"),
            ({**good, "strategy": "canary", "canary_steps": [50, 10]}, "canary_steps"),
            ({**good, "strategy": "canary", "canary_steps": [10, 50]}, "canary_steps"),  # must end at 100
            ({**good, "max_surge": 0}, "max_surge"),
            ({**good, "error_rate_margin": 2}, "error_rate_margin"),
            ({**good, "step_duration_s": "soon"}, "step_duration_s"),
        ]


# --- actions ------------------------------------------------------------------------------------------------------


def act(client, rollout, name, reason=""):
    return client.post(reverse(f"rollout-{name}", args=[rollout.pk]), {"reason": reason}, format="json")


def test_operator_pauses_resumes_and_rolls_back_with_events_and_audit_entries(world):
    endpoint = world.a.endpoint
    client = world.client("operator")
    response = client.post(
        reverse("rollout-list"),
        {
            "endpoint": endpoint.pk,
            "to_version": new_version(endpoint).pk,
            "strategy": "canary",
            "canary_steps": [25, 100],
        },
        format="json",
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["state"] == "pending" and body["canary_steps"] == [25, 100] and body["created_by"] == "operator"
    assert [e["kind"] for e in body["events"]] == ["created"]
    rollout = Rollout.objects.get(pk=body["id"])

    paused = act(client, rollout, "pause", "looking at the canary")
    assert paused.status_code == 200, paused.content
    assert paused.json()["state"] == "paused" and paused.json()["paused_from"] == "pending"
    assert paused.json()["events"][-1]["kind"] == "pause"
    assert paused.json()["events"][-1]["message"] == "looking at the canary"
    # A paused rollout cannot be paused again: 400 with the reason, nothing recorded
    again = act(client, rollout, "pause")
    assert again.status_code == 400 and "paused" in str(again.json())
    assert act(client, rollout, "resume").json()["state"] == "pending"
    rolled = act(client, rollout, "rollback", "wrong model")
    assert rolled.json()["state"] == "rolling_back" and rolled.json()["traffic_percent"] == 0
    # The endpoint's detail names the rollout in progress
    detail = client.get(reverse("endpoint-detail", args=[endpoint.pk])).json()
    assert detail["active_rollout"] == rollout.pk

    actions = list(
        AuditEntry.objects.filter(action__startswith="rollout.", object_id=str(endpoint.pk))
        .order_by("id")
        .values_list("action", "actor_label")
    )
    assert actions == [
        ("rollout.start", "operator"),
        ("rollout.pause", "operator"),
        ("rollout.resume", "operator"),
        ("rollout.rollback", "operator"),
    ]


def test_promote_skips_the_remaining_canary_steps(world):
    endpoint = world.a.endpoint
    rollout = start_rollout(endpoint=endpoint, to_version=new_version(endpoint), strategy="canary")
    Rollout.objects.filter(pk=rollout.pk).update(state=RolloutState.SHIFTING, traffic_percent=10)
    response = act(world.client("operator"), rollout, "promote")
    assert response.status_code == 200, response.content
    # the canary steps and comparison are skipped; traffic then grows with the new version's warmed replicas
    # (all at once), never ahead of its capacity: still shifting at 10 % until the next tick
    body = response.json()
    assert (body["state"], body["strategy"], body["traffic_percent"]) == ("shifting", "all_at_once", 10)
    assert body["events"][-1]["kind"] == "promote"


@pytest.mark.parametrize("name", ["pause", "resume", "promote", "rollback"])
def test_tenants_cannot_act_and_never_see_another_tenants_rollout(world, name):
    endpoint = world.a.endpoint
    rollout = start_rollout(endpoint=endpoint, to_version=new_version(endpoint))
    for who in ("a_admin", "a_write_key", "a_member"):
        assert act(world.client(who), rollout, name).status_code == 403, who
    for who in ("b_admin", "b_member"):
        assert act(world.client(who), rollout, name).status_code == 404, who
        assert world.client(who).get(reverse("rollout-detail", args=[rollout.pk])).status_code == 404
    assert Rollout.objects.get(pk=rollout.pk).state == RolloutState.PENDING
    assert not AuditEntry.objects.filter(action=f"rollout.{name}").exists()


def test_a_second_rollout_of_an_endpoint_is_refused(world):
    endpoint = world.a.endpoint
    start_rollout(endpoint=endpoint, to_version=new_version(endpoint))
    response = world.client("operator").post(
        reverse("rollout-list"), {"endpoint": endpoint.pk, "to_version": new_version(endpoint).pk}, format="json"
    )
    assert response.status_code == 400 and "in progress" in str(response.json())
    assert Rollout.objects.filter(endpoint=endpoint).count() == 1


def test_versions_are_listed_per_endpoint_newest_first_with_the_serving_one_marked(world):
    endpoint = world.a.endpoint
    v1 = ensure_current_version(endpoint)
    v2 = new_version(endpoint, model_profile=ModelProfileFactory().pk)
    rows = world.client("a_member").get(reverse("endpoint-version-list"), {"endpoint": endpoint.pk}).json()["results"]
    assert [(r["number"], r["is_current"]) for r in rows] == [(v2.number, False), (v1.number, True)]
    assert rows[0]["model_profile"] == v2.model_profile_id and rows[0]["endpoint_name"] == endpoint.name


# --- endpoint PATCH and versions ---------------------------------------------------------------------------------


def patch_endpoint(client, endpoint, payload):
    return client.patch(reverse("endpoint-detail", args=[endpoint.pk]), payload, format="json")


def test_a_versioned_change_without_running_replicas_switches_to_a_new_version_at_once(world):
    endpoint = world.a.endpoint
    response = patch_endpoint(world.client("a_admin"), endpoint, {"launch_options": {"speed": 7}})
    assert response.status_code == 200, response.content
    endpoint.refresh_from_db()
    version = endpoint.current_version
    assert version.number == 2 and version.launch_options == {"speed": 7}
    assert response.json()["current_version"] == version.pk and response.json()["launch_options"] == {"speed": 7}
    assert response.json()["active_rollout"] is None


def test_a_versioned_change_with_running_replicas_starts_a_rollout_and_keeps_serving_the_old_version(world):
    endpoint = world.a.endpoint
    Endpoint.objects.filter(pk=endpoint.pk).update(launch_options={"actuator": "local", "speed": 1})
    endpoint.refresh_from_db()
    old = ensure_current_version(endpoint)
    ReplicaFactory(endpoint=endpoint, actuator="local", version=old)
    client = world.client("operator")
    response = patch_endpoint(client, endpoint, {"launch_options": {"actuator": "local", "speed": 2}})
    assert response.status_code == 200, response.content
    rollout = Rollout.objects.get(endpoint=endpoint)
    assert response.json()["active_rollout"] == rollout.pk
    assert (rollout.from_version, rollout.to_version.launch_options) == (old, {"actuator": "local", "speed": 2})
    # Until the rollout promotes, the endpoint still serves (and shows) the old version
    assert response.json()["current_version"] == old.pk and response.json()["launch_options"]["speed"] == 1

    # Another versioned change meanwhile is refused, and the live change sent with it is not applied either
    refused = patch_endpoint(
        client, endpoint, {"launch_options": {"actuator": "local", "speed": 3}, "max_replicas": 9}
    )
    assert refused.status_code == 400 and "in progress" in str(refused.json())
    endpoint.refresh_from_db()
    assert endpoint.max_replicas != 9 and EndpointVersion.objects.filter(endpoint=endpoint).count() == 2


def test_config_only_changes_and_unchanged_versioned_fields_make_no_version(world):
    endpoint = world.a.endpoint
    ensure_current_version(endpoint)
    client = world.client("a_admin")
    payload = {
        "routing_policy": "least_request",
        "ttft_slo_ms": 900,
        "concurrency_limit": 32,
        "launch_options": endpoint.launch_options,  # sent as it is: not a change
        "model_profile": endpoint.model_profile_id,
    }
    assert patch_endpoint(client, endpoint, payload).status_code == 200
    assert EndpointVersion.objects.filter(endpoint=endpoint).count() == 1
    assert not Rollout.objects.filter(endpoint=endpoint).exists()
    endpoint.refresh_from_db()
    assert (endpoint.routing_policy, endpoint.ttft_slo_ms, endpoint.concurrency_limit) == ("least_request", 900, 32)


def test_a_bad_versioned_change_is_a_field_error_and_changes_nothing(world):
    endpoint = world.a.endpoint
    ensure_current_version(endpoint)
    response = patch_endpoint(
        world.client("operator"), endpoint, {"launch_options": {"actuator": "teleport"}, "max_replicas": 9}
    )
    assert response.status_code == 400 and "launch_options" in response.json(), response.content
    endpoint.refresh_from_db()
    assert endpoint.max_replicas != 9 and EndpointVersion.objects.filter(endpoint=endpoint).count() == 1


# --- review: bad launch options, races -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "runtime", "says"),
    [
        ({"cpus": "abc"}, None, "CPU amount"),
        ({"cpus": -2}, None, "positive"),
        ({"resources": {"limits": {"cpu": "lots"}}}, None, "CPU amount"),
        ({"cpuset": "x-y"}, None, "cpuset"),
        ({"cpuset": 7}, None, "cpuset"),
        ({"speed": "abc"}, None, "speed"),
        ({"speed": 0}, None, "speed"),
        ({"faults": [1]}, None, "faults"),
        ({"actuator": 3}, None, "actuator"),
        ({"port": 70000}, None, "port"),
        ({"tensor_parallel_size": "abc"}, "vllm", "tensor_parallel_size"),
        ({"max_num_seqs": "abc"}, "vllm", "invalid literal"),
        ({"gpu_memory_utilization": 3}, "vllm", "gpu_memory_utilization"),
    ],
)
def test_launch_options_a_launcher_cannot_use_are_field_errors_and_make_no_version(world, options, runtime, says):
    # Before, {"cpus": "abc"} became version 2 (or a rollout) whose replicas then failed to start.
    endpoint = world.a.endpoint
    ensure_current_version(endpoint)
    client = world.client("operator")
    payload = {"launch_options": options, **({"runtime": runtime} if runtime else {})}
    response = patch_endpoint(client, endpoint, payload)
    assert response.status_code == 400, response.content
    assert says in str(response.json()["launch_options"])
    assert EndpointVersion.objects.filter(endpoint=endpoint).count() == 1
    # and a new endpoint with them is refused the same way
    created = client.post(
        reverse("endpoint-list"),
        {
            "name": "bad-launch",
            "owner_tenant": world.a.tenant.pk,
            "model_profile": endpoint.model_profile_id,
            "hardware_profile": endpoint.hardware_profile_id,
            "runtime": runtime or "sim",
            "launch_options": options,
        },
        format="json",
    )
    assert created.status_code == 400 and "launch_options" in created.json(), created.content


def test_usable_launch_options_and_unknown_keys_still_make_a_version(world):
    endpoint = world.a.endpoint
    ensure_current_version(endpoint)
    options = {"cpus": "1500m", "cpuset": "0-1", "speed": 2.5, "faults": {}, "some_runtime_flag": True}
    response = patch_endpoint(world.client("operator"), endpoint, {"launch_options": options})
    assert response.status_code == 200, response.content
    endpoint.refresh_from_db()
    assert endpoint.current_version.number == 2 and endpoint.launch_options == options


def test_a_live_change_does_not_undo_a_promotion_that_happened_meanwhile(world):
    # Before, endpoint_update saved every field of the instance it had loaded: a PATCH of max_replicas racing a
    # rollout's promotion wrote the old version's model and launch options (and current_version) back.
    from endpoints.rollouts.services import activate_version
    from endpoints.services import endpoint_update

    endpoint = world.a.endpoint
    v1 = ensure_current_version(endpoint)
    stale = Endpoint.objects.get(pk=endpoint.pk)  # what the PATCH request loaded
    v2 = new_version(endpoint)
    activate_version(endpoint=Endpoint.objects.get(pk=endpoint.pk), version=v2)  # the promotion, meanwhile
    endpoint_update(endpoint=stale, max_replicas=stale.max_replicas + 1)
    endpoint.refresh_from_db()
    assert endpoint.current_version_id == v2.pk != v1.pk
    assert endpoint.launch_options == v2.launch_options
    assert endpoint.max_replicas == stale.max_replicas


def test_a_start_that_slips_past_the_in_progress_check_is_a_400_not_an_integrity_error(world, monkeypatch):
    # The database's one-active-rollout constraint is the last line: it must read as a field error, not a 500.
    from endpoints.rollouts import services

    endpoint = world.a.endpoint
    start_rollout(endpoint=endpoint, to_version=new_version(endpoint))
    monkeypatch.setattr(services, "active_rollout", lambda endpoint: None)
    response = world.client("operator").post(
        reverse("rollout-list"), {"endpoint": endpoint.pk, "to_version": new_version(endpoint).pk}, format="json"
    )
    assert response.status_code == 400 and "already in progress" in str(response.json()), response.content
    assert Rollout.objects.filter(endpoint=endpoint).count() == 1


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_starts_for_one_endpoint_give_one_rollout_and_one_400(world):
    import threading

    from django.db import connection

    endpoint = world.a.endpoint
    versions = [new_version(endpoint).pk, new_version(endpoint).pk]
    barrier = threading.Barrier(2)
    statuses: list[int] = []

    def start(version_id):
        try:
            client = world.client("operator")
            barrier.wait(5)
            response = client.post(
                reverse("rollout-list"), {"endpoint": endpoint.pk, "to_version": version_id}, format="json"
            )
            statuses.append(response.status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=start, args=(v,)) for v in versions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(statuses) == [201, 400]
    assert Rollout.objects.filter(endpoint=endpoint).count() == 1


def test_an_operator_action_wins_over_a_tick_that_decided_before_it(world):
    # The tick records its decision with a compare-and-set on the row it read; an operator's pause in between
    # must not be overwritten (and the tick must not act on its stale decision).
    from django.utils import timezone

    from endpoints.rollouts import machine
    from endpoints.rollouts.services import pause_rollout
    from endpoints.rollouts.ticks import _facts, _record

    endpoint = world.a.endpoint
    rollout = start_rollout(endpoint=endpoint, to_version=new_version(endpoint))
    seen_by_tick = Rollout.objects.select_related("endpoint", "from_version", "to_version").get(pk=rollout.pk)
    pause_rollout(rollout=rollout, user=world.operator, reason="hold on")
    now = timezone.now()
    decision = machine.Decision(
        state=RolloutState.SURGING, traffic_percent=0, step_index=0, kind="surge", reason="start", launch=1
    )
    assert _record(seen_by_tick, _facts(seen_by_tick, now), decision, now) is False
    rollout.refresh_from_db()
    assert rollout.state == RolloutState.PAUSED and rollout.paused_from == RolloutState.PENDING
    assert not rollout.events.filter(kind="surge").exists()


def test_an_endpoint_with_rollout_history_can_be_deleted_but_not_during_a_rollout(world):
    # Before, a finished rollout's PROTECT on its versions made every such endpoint a 409 "still used by" forever.
    endpoint = world.a.endpoint
    rollout = start_rollout(endpoint=endpoint, to_version=new_version(endpoint))
    client = world.client("operator")
    refused = client.delete(reverse("endpoint-detail", args=[endpoint.pk]))
    assert refused.status_code == 400 and "rollout is in progress" in str(refused.json()), refused.content
    assert Endpoint.objects.filter(pk=endpoint.pk).exists()
    Rollout.objects.filter(pk=rollout.pk).update(state=RolloutState.SUCCEEDED)
    assert client.delete(reverse("endpoint-detail", args=[endpoint.pk])).status_code == 204
    assert not Endpoint.objects.filter(pk=endpoint.pk).exists() and not Rollout.objects.filter(pk=rollout.pk).exists()
    assert AuditEntry.objects.filter(action="endpoint.delete", object_id=str(endpoint.pk)).exists()


def test_rollouts_and_versions_filter_order_and_page_like_the_other_resources(world):
    endpoint, other = world.a.endpoint, EndpointFactory(owner_tenant=world.a.tenant)
    done = finished_rollout(endpoint)
    active = start_rollout(endpoint=other, to_version=new_version(other))
    client = world.client("a_admin")
    rows = client.get(reverse("rollout-list"), {"state": "pending"}).json()["results"]
    assert [r["id"] for r in rows] == [active.pk]
    rows = client.get(reverse("rollout-list"), {"endpoint": endpoint.pk}).json()["results"]
    assert [r["id"] for r in rows] == [done.pk]
    page = client.get(reverse("rollout-list"), {"limit": 1, "ordering": "created_at"}).json()
    assert page["count"] == 2 and [r["id"] for r in page["results"]] == [done.pk] and page["next"]
    numbers = [
        r["number"]
        for r in client.get(reverse("endpoint-version-list"), {"endpoint": other.pk, "ordering": "number"}).json()[
            "results"
        ]
    ]
    assert numbers == sorted(numbers) and len(numbers) == 2
    assert client.get(reverse("rollout-list"), {"state": "exploded"}).status_code == 400


@pytest.mark.django_db(transaction=True)
def test_a_direct_version_switch_waits_for_a_rollout_being_started_and_is_refused(world):
    # Before, activate_version (a PATCH on an endpoint without running replicas) checked for a rollout without the
    # endpoint's lock: racing a start, it switched the serving version under the new rollout, which then failed.
    import threading

    from django.core.exceptions import ValidationError
    from django.db import connection, transaction

    from endpoints.rollouts.services import activate_version

    endpoint = world.a.endpoint
    v1 = ensure_current_version(endpoint)
    v2, v3 = new_version(endpoint), new_version(endpoint)
    starting, outcome = threading.Event(), {}

    def switch():
        starting.wait(5)
        try:
            activate_version(endpoint=Endpoint.objects.get(pk=endpoint.pk), version=v3)
            outcome["switched"] = True
        except ValidationError as exc:
            outcome["refused"] = " ".join(exc.messages)
        finally:
            connection.close()

    thread = threading.Thread(target=switch)
    thread.start()
    with transaction.atomic():
        start_rollout(endpoint=endpoint, to_version=v2)
        starting.set()
        thread.join(0.5)  # the switch runs now; it must wait for this transaction
    thread.join(10)
    assert "in progress" in outcome.get("refused", ""), outcome
    endpoint.refresh_from_db()
    assert endpoint.current_version_id == v1.pk
