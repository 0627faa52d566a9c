"""Rollouts in the console: the endpoint page shows version history and the rollout's progress and decisions;
start / pause / resume / promote / roll back are confirmed forms that act through the services and leave audit
entries; tenants only read (their own endpoints), and never reach the actions."""

import pytest
from django.urls import reverse

from endpoints.models import EndpointVersion, Rollout, RolloutEvent, RolloutState
from endpoints.rollouts.services import create_version, ensure_current_version, start_rollout
from tenants.models import AuditEntry
from tests.factories import EndpointFactory, ModelProfileFactory, ReservationFactory

pytestmark = pytest.mark.django_db


def _post_confirmed(client, url, data):
    """The first POST only asks for confirmation; the confirmed one acts."""
    first = client.post(url, data)
    assert first.status_code == 200, first.content.decode()[:2000]
    assert 'name="confirmed" value="yes"' in first.content.decode()
    return client.post(url, {**data, "confirmed": "yes"})


def _rollout(endpoint, **kwargs) -> Rollout:
    version = create_version(endpoint=endpoint, launch_options={"speed": 3})
    return start_rollout(endpoint=endpoint, to_version=version, **kwargs)


def test_endpoint_page_shows_versions_progress_decisions_and_the_actions_that_fit(client, operator, tenant_a):
    endpoint = tenant_a.endpoint
    rollout = _rollout(endpoint, strategy="canary", canary_steps=[20, 100])
    Rollout.objects.filter(pk=rollout.pk).update(state=RolloutState.SHIFTING, traffic_percent=20, step_index=0)
    RolloutEvent.objects.create(
        rollout=rollout, kind="shift", from_state="surging", to_state="shifting", message="canary at 20 %"
    )
    client.force_login(operator)
    page = client.get(reverse("console:endpoint", args=[endpoint.pk])).content.decode()
    assert 'id="version-history"' in page and "v1" in page and "v2" in page and "serving" in page
    assert "Rollout v1 → v2" in page and "20 %" in page and "canary at 20 %" in page
    base = f"/console/endpoints/{endpoint.pk}/rollouts/{rollout.pk}/"
    for name in ("pause", "promote", "rollback"):
        assert f'href="{base}{name}/"' in page
    assert f'href="{base}resume/"' not in page  # only a paused rollout resumes
    # A new rollout cannot start while this one runs
    assert reverse("console:rollout-start", args=[endpoint.pk]) not in page


def test_start_a_rollout_to_a_new_version_errors_then_confirm_then_audit(client, operator, tenant_a):
    endpoint = tenant_a.endpoint
    ensure_current_version(endpoint)
    client.force_login(operator)
    url = reverse("console:rollout-start", args=[endpoint.pk])
    assert client.get(url).status_code == 200
    base = {"strategy": "canary", "canary_steps": "10, 50, 100", "max_surge": 2, "step_duration_s": 60}
    # Nothing to roll out to
    bad = client.post(url, base)
    assert bad.status_code == 400 and "to_version" in bad.context["form"].errors
    # Launch options that are not an object; canary steps that are not percents
    bad = client.post(url, {**base, "launch_options": "[1, 2]"})
    assert bad.status_code == 400 and "launch_options" in bad.context["form"].errors
    bad = client.post(url, {**base, "launch_options": '{"speed": 4}', "canary_steps": "ten"})
    assert bad.status_code == 400 and "canary_steps" in bad.context["form"].errors
    # Steps the service refuses (not rising) come back on the field, and nothing was made
    bad = _post_confirmed(client, url, {**base, "launch_options": '{"speed": 4}', "canary_steps": "50, 10, 100"})
    assert bad.status_code == 400 and "canary_steps" in bad.context["form"].errors
    assert EndpointVersion.objects.filter(endpoint=endpoint).count() == 1 and not Rollout.objects.exists()

    model = ModelProfileFactory(name="llama-next")
    done = _post_confirmed(client, url, {**base, "model_profile": model.pk, "launch_options": '{"speed": 4}'})
    assert done.status_code == 302 and done["Location"] == reverse("console:endpoint", args=[endpoint.pk])
    rollout = Rollout.objects.get(endpoint=endpoint)
    assert (rollout.strategy, rollout.canary_steps, rollout.created_by) == ("canary", [10, 50, 100], operator)
    assert (rollout.to_version.model_profile, rollout.to_version.launch_options) == (model, {"speed": 4})
    assert AuditEntry.objects.get(action="rollout.start").actor == operator
    assert AuditEntry.objects.get(action="endpoint.version.create").detail["version"] == 2


def test_start_a_rollout_to_an_existing_version(client, operator, tenant_a):
    endpoint = tenant_a.endpoint
    version = create_version(endpoint=endpoint, launch_options={"speed": 9})
    client.force_login(operator)
    url = reverse("console:rollout-start", args=[endpoint.pk])
    both = client.post(url, {"to_version": version.pk, "launch_options": '{"speed": 1}', "strategy": "all_at_once"})
    assert both.status_code == 400 and "to_version" in both.context["form"].errors
    data = {"to_version": version.pk, "strategy": "all_at_once", "max_surge": 1, "step_duration_s": 30}
    assert _post_confirmed(client, url, data).status_code == 302
    assert Rollout.objects.get(endpoint=endpoint).to_version == version


def test_pause_resume_and_roll_back_are_confirmed_and_audited(client, operator, tenant_a):
    endpoint = tenant_a.endpoint
    rollout = _rollout(endpoint)
    client.force_login(operator)

    def url(action):
        return reverse("console:rollout-action", args=[endpoint.pk, rollout.pk, action])

    assert client.get(url("pause")).status_code == 200
    done = _post_confirmed(client, url("pause"), {"reason": "checking dashboards"})
    assert done.status_code == 302
    rollout.refresh_from_db()
    assert rollout.state == RolloutState.PAUSED and rollout.reason == "checking dashboards"
    entry = AuditEntry.objects.get(action="rollout.pause")
    assert entry.actor == operator and entry.detail["reason"] == "checking dashboards"
    # Pausing again is refused with the service's reason on the form, and nothing changes
    again = _post_confirmed(client, url("pause"), {"reason": ""})
    assert again.status_code == 400 and "cannot be paused" in again.content.decode()
    assert AuditEntry.objects.filter(action="rollout.pause").count() == 1
    assert _post_confirmed(client, url("resume"), {"reason": ""}).status_code == 302
    assert _post_confirmed(client, url("rollback"), {"reason": "bad canary"}).status_code == 302
    rollout.refresh_from_db()
    assert rollout.state == RolloutState.ROLLING_BACK and rollout.traffic_percent == 0
    assert [e.kind for e in rollout.events.order_by("id")] == ["created", "pause", "resume", "rollback"]
    assert client.get(url("explode")).status_code == 404


def test_tenants_read_their_own_endpoints_rollout_and_never_reach_the_actions(client, tenant_a, tenant_b):
    rollout = _rollout(tenant_a.endpoint)
    shared = EndpointFactory(name="shared-model")
    ReservationFactory(tenant=tenant_a.tenant, endpoint=shared)
    create_version(endpoint=shared, launch_options={"speed": 5})
    client.force_login(tenant_a.admin)
    own = client.get(reverse("console:endpoint", args=[tenant_a.endpoint.pk])).content.decode()
    assert "Rollout v1 → v2" in own and 'id="version-history"' in own
    assert "/rollouts/" not in own  # no action links, no start button
    # A shared endpoint it only reserves on: the page, without the operators' version history
    page = client.get(reverse("console:endpoint", args=[shared.pk])).content.decode()
    assert 'id="version-history"' not in page
    for path in (
        reverse("console:rollout-start", args=[tenant_a.endpoint.pk]),
        reverse("console:rollout-action", args=[tenant_a.endpoint.pk, rollout.pk, "rollback"]),
    ):
        assert client.get(path).status_code == 404
        assert client.post(path, {"reason": "", "confirmed": "yes"}).status_code == 404
    client.force_login(tenant_b.admin)
    assert client.get(reverse("console:endpoint", args=[tenant_a.endpoint.pk])).status_code == 404
    assert Rollout.objects.get(pk=rollout.pk).state == RolloutState.PENDING


def test_a_rollout_decision_is_published_to_operators_and_the_owner_only(monkeypatch, tenant_a, tenant_b):
    sent = []
    monkeypatch.setattr("console.signals.publish", lambda **kwargs: sent.append(kwargs))
    rollout = _rollout(tenant_a.endpoint)  # records its "created" event
    ReservationFactory(tenant=tenant_b.tenant, endpoint=tenant_a.endpoint)  # a reserver does not see rollouts
    RolloutEvent.objects.create(
        rollout=rollout, kind="shift", from_state="surging", to_state="shifting", message="10 %"
    )
    events = [e for e in sent if e["kind"] == "rollout"]
    assert [e["payload"]["kind"] for e in events] == ["created", "shift"]
    assert events[-1]["payload"] == {
        "endpoint_id": tenant_a.endpoint.pk,
        "endpoint": tenant_a.endpoint.name,
        "rollout_id": rollout.pk,
        "kind": "shift",
        "state": "shifting",
        "message": "10 %",
    }
    assert all(list(e["tenant_ids"]) == [tenant_a.tenant.pk] for e in events)


def test_the_admin_does_not_edit_versioned_fields_of_an_existing_endpoint(client, operator, tenant_a):
    client.force_login(operator)
    endpoint = tenant_a.endpoint
    page = client.get(reverse("admin:endpoints_endpoint_change", args=[endpoint.pk])).content.decode()
    assert 'name="routing_policy"' in page  # live settings stay editable
    for field in ("model_profile", "hardware_profile", "runtime", "launch_options", "current_version"):
        assert f'name="{field}"' not in page, field
    assert 'name="model_profile"' in client.get(reverse("admin:endpoints_endpoint_add")).content.decode()


# --- review: launch options, a start racing another, CSRF --------------------------------------------------------

_START = {"strategy": "all_at_once", "canary_steps": "10, 50, 100", "max_surge": 2, "step_duration_s": 60}


def test_launch_options_a_launcher_cannot_use_are_a_form_error_and_make_nothing(client, operator, tenant_a):
    # Before, {"cpus": "abc"} made version 2 and started a rollout whose replicas could never start.
    endpoint = tenant_a.endpoint
    ensure_current_version(endpoint)
    client.force_login(operator)
    url = reverse("console:rollout-start", args=[endpoint.pk])
    bad = _post_confirmed(client, url, {**_START, "launch_options": '{"cpus": "abc"}'})
    assert bad.status_code == 400 and "CPU amount" in str(bad.context["form"].errors["launch_options"])
    assert EndpointVersion.objects.filter(endpoint=endpoint).count() == 1 and not Rollout.objects.exists()


def test_a_start_that_slips_past_the_in_progress_check_is_a_form_error(client, operator, tenant_a, monkeypatch):
    # The one-active-rollout constraint surfacing as an IntegrityError was a 500 page here.
    from endpoints.rollouts import services

    endpoint = tenant_a.endpoint
    _rollout(endpoint)
    other = create_version(endpoint=endpoint, launch_options={"speed": 4})
    monkeypatch.setattr(services, "active_rollout", lambda endpoint: None)
    client.force_login(operator)
    url = reverse("console:rollout-start", args=[endpoint.pk])
    bad = _post_confirmed(client, url, {**_START, "to_version": other.pk})
    assert bad.status_code == 400 and "already in progress" in bad.content.decode()
    assert Rollout.objects.filter(endpoint=endpoint).count() == 1


def test_rollout_actions_need_a_csrf_token_and_a_get_changes_nothing(operator, tenant_a):
    from django.test import Client

    endpoint = tenant_a.endpoint
    rollout = _rollout(endpoint)
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    for action in ("pause", "promote", "rollback"):
        url = reverse("console:rollout-action", args=[endpoint.pk, rollout.pk, action])
        assert client.post(url, {"confirmed": "yes"}).status_code == 403
        assert client.get(url, {"confirmed": "yes"}).status_code == 200  # the form, nothing done
    start = reverse("console:rollout-start", args=[endpoint.pk])
    assert client.post(start, {**_START, "launch_options": '{"speed": 8}', "confirmed": "yes"}).status_code == 403
    rollout.refresh_from_db()
    assert rollout.state == RolloutState.PENDING and list(rollout.events.values_list("kind", flat=True)) == ["created"]
    assert Rollout.objects.filter(endpoint=endpoint).count() == 1
