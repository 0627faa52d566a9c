"""Webhook SSRF: a tenant's hook must resolve to public addresses when registered and again when delivered, and
delivery connects to the address it checked (Host and TLS name from the URL), so DNS rebinding reaches nothing."""

from datetime import timedelta

import httpx
import pytest
from django.utils import timezone

from billing.egress import address_is_public
from billing.models import Alert, AlertNotification, Webhook
from billing.notifiers import notifications_deliver_due
from tests.billing.conftest import PUBLIC_IP
from tests.conftest import client_for
from tests.factories import SLOFactory


def _notify(hook: Webhook, tenant) -> AlertNotification:
    slo = SLOFactory(endpoint=tenant.endpoint, tenant=tenant.tenant)
    alert = Alert.objects.create(
        slo=slo, severity="page", state="firing", long_window="1h", short_window="5m", burn_rate_threshold=14.4
    )
    return AlertNotification.objects.create(alert=alert, webhook=hook, event="firing")


def _deliver(**kwargs):
    return notifications_deliver_due(now=timezone.now() + timedelta(seconds=1), **kwargs)


@pytest.mark.parametrize(
    "address, public",
    [
        ("93.184.216.34", True),
        ("2606:2800:220:1:248:1893:25c8:1946", True),
        ("127.0.0.1", False),
        ("10.1.2.3", False),
        ("169.254.169.254", False),
        ("100.64.0.7", False),  # carrier-grade NAT: not private, not global either
        ("0.0.0.0", False),
        ("224.0.0.1", False),
        ("::1", False),
        ("fd00::1", False),
        ("::ffff:127.0.0.1", False),
        ("::ffff:169.254.169.254", False),
        ("64:ff9b::a9fe:a9fe", False),  # NAT64 of 169.254.169.254
    ],
)
def test_only_globally_routable_addresses_are_public(address, public):
    assert address_is_public(address) is public


def test_a_name_resolving_internally_is_refused_at_registration(tenant_a, fake_dns):
    fake_dns.names.update(
        {
            "loopback.example": ["127.0.0.1"],
            "metadata.example": ["169.254.169.254"],
            "cgnat.example": ["100.64.1.1"],
            "mixed.example": [PUBLIC_IP, "10.0.0.8"],  # one internal answer among public ones is enough
            "mapped.example": ["::ffff:127.0.0.1"],
            "gone.example": [],
        }
    )
    admin = client_for(tenant_a.admin)
    for host in ("loopback", "metadata", "cgnat", "mixed", "mapped", "gone"):
        response = admin.post("/api/v1/webhooks/", {"name": host, "url": f"https://{host}.example/h"}, format="json")
        assert response.status_code == 400, (host, response.json())
        assert "public host" in response.json()["url"][0]
    assert (
        admin.post("/api/v1/webhooks/", {"name": "x", "url": "http://100.64.1.1/"}, format="json").status_code == 400
    )
    assert not Webhook.objects.exists()
    fake_dns.names["hooks.example"] = [PUBLIC_IP]
    ok = admin.post("/api/v1/webhooks/", {"name": "ok", "url": "https://hooks.example/h"}, format="json")
    assert ok.status_code == 201, ok.json()


def test_a_tenant_hook_cannot_be_moved_inside_by_an_update(tenant_a, fake_dns):
    fake_dns.names.update({"hooks.example": [PUBLIC_IP], "inside.example": ["10.0.0.8"]})
    admin = client_for(tenant_a.admin)
    hook = admin.post("/api/v1/webhooks/", {"name": "ok", "url": "https://hooks.example/h"}, format="json").json()
    moved = admin.patch(f"/api/v1/webhooks/{hook['id']}/", {"url": "http://inside.example/h"}, format="json")
    assert moved.status_code == 400
    assert Webhook.objects.get(pk=hook["id"]).url == "https://hooks.example/h"


def test_operators_may_register_internal_hooks_only_for_every_alert(operator, tenant_a, fake_dns):
    fake_dns.names["router.internal.example"] = ["10.0.0.5"]
    ops = client_for(operator)
    wide = ops.post("/api/v1/webhooks/", {"name": "r", "url": "http://router.internal.example/h"}, format="json")
    assert wide.status_code == 201 and wide.json()["tenant"] is None
    # A tenant's hook is editable by that tenant's admins, so even an operator cannot aim it inside.
    scoped = ops.post(
        "/api/v1/webhooks/",
        {"name": "t", "url": "http://router.internal.example/h", "tenant": tenant_a.tenant.pk},
        format="json",
    )
    assert scoped.status_code == 400


def test_a_tenant_hook_resolving_to_loopback_is_not_delivered(tenant_a, webhook_server, fake_dns):
    # Stored before the guard existed (or written around the API): delivery checks on its own.
    fake_dns.names["internal.example"] = ["127.0.0.1"]
    port = httpx.URL(webhook_server.url).port
    hook = Webhook.objects.create(name="t", url=f"http://internal.example:{port}/hook", tenant=tenant_a.tenant)
    notification = _notify(hook, tenant_a)
    result = _deliver()
    notification.refresh_from_db()
    assert webhook_server.requests == []
    assert result.sent == 0 and notification.status == "pending"
    assert notification.last_error.startswith("refused: internal.example resolves to 127.0.0.1")


def test_a_name_rebound_to_loopback_after_registration_is_not_delivered(tenant_a, webhook_server, fake_dns):
    port = httpx.URL(webhook_server.url).port
    fake_dns.names["rebind.example"] = [PUBLIC_IP]
    created = client_for(tenant_a.admin).post(
        "/api/v1/webhooks/", {"name": "rebind", "url": f"http://rebind.example:{port}/hook"}, format="json"
    )
    assert created.status_code == 201, created.json()
    notification = _notify(Webhook.objects.get(pk=created.json()["id"]), tenant_a)
    fake_dns.names["rebind.example"] = ["127.0.0.1"]  # the attacker's DNS answers differently at delivery
    _deliver()
    notification.refresh_from_db()
    assert webhook_server.requests == []
    assert "127.0.0.1" in notification.last_error and notification.status == "pending"


def test_delivery_connects_to_the_checked_address_with_the_name_as_host_and_tls_name(tenant_a, fake_dns):
    fake_dns.names["hooks.example"] = [PUBLIC_IP]
    hook = Webhook.objects.create(name="t", url="https://hooks.example:8443/a?x=1", tenant=tenant_a.tenant)
    _notify(hook, tenant_a)
    seen: list[httpx.Request] = []

    def receiver(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200)

    with httpx.Client(transport=httpx.MockTransport(receiver)) as client:
        assert _deliver(client=client).sent == 1
    (request,) = seen
    assert str(request.url) == f"https://{PUBLIC_IP}:8443/a?x=1"
    assert request.headers["Host"] == "hooks.example:8443"
    assert request.extensions["sni_hostname"] == "hooks.example"


def test_an_operator_hook_is_pinned_too_and_reaches_the_receiver_by_name(tenant_a, webhook_server, fake_dns):
    fake_dns.names["router.example"] = ["127.0.0.1"]
    port = httpx.URL(webhook_server.url).port
    hook = Webhook.objects.create(name="ops", url=f"http://router.example:{port}/hook")
    _notify(hook, tenant_a)
    assert _deliver().sent == 1
    (request,) = webhook_server.requests
    assert request["headers"]["Host"] == f"router.example:{port}"
    assert fake_dns.lookups == ["router.example"]  # resolved once, by the guard; the connection used the address


def test_redirects_are_not_followed(tenant_a, fake_dns):
    fake_dns.names["hooks.example"] = [PUBLIC_IP]
    hook = Webhook.objects.create(name="t", url="http://hooks.example/a", tenant=tenant_a.tenant)
    notification = _notify(hook, tenant_a)
    seen: list[str] = []

    def receiver(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(302, headers={"Location": "http://169.254.169.254/latest/meta-data/"})

    with httpx.Client(transport=httpx.MockTransport(receiver), follow_redirects=True) as client:
        _deliver(client=client)
    notification.refresh_from_db()
    assert seen == [f"http://{PUBLIC_IP}/a"]
    assert notification.last_error.startswith("HTTP 302")
