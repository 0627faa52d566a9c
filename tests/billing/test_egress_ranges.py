"""Webhook egress is an allowlist of global unicast: IPv6 site-local, documentation, 6to4 and NAT64 of internal
IPv4 and the IPv4 blocks that ``ipaddress.is_global`` lets through are refused at registration and at delivery."""

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


@pytest.mark.parametrize(
    "address",
    [
        "fec0::1",  # site-local: is_global on Python 3.11
        "feff::1",
        "fc00::1",
        "fdff:ffff::1",
        "fe80::1",
        "fe80::1%eth0",
        "ff02::1",
        "ff0e::1",
        "2001:db8::1",
        "3fff::1",  # documentation, RFC 9637: is_global on Python 3.11
        "2001:0:4136:e378:8000:63bf:f7f7:f7f7",  # Teredo, both embedded addresses public
        "2001:2::1",  # benchmarking
        "2001:20::1",  # ORCHIDv2
        "2002:a00:1::1",  # 6to4 of 10.0.0.1
        "2002:a9fe:a9fe::1",  # 6to4 of the metadata service
        "2002:c000:9::1",  # 6to4 of 192.0.0.9
        "64:ff9b::a00:1",  # NAT64 of 10.0.0.1
        "64:ff9b::6440:1",  # NAT64 of carrier-grade NAT
        "64:ff9b:1::808:808",  # local-use NAT64
        "::ffff:8.8.8.8",  # IPv4-mapped: no resolver answers it for a name; the socket would go out over IPv4
        "::ffff:a00:1",
        "::a00:1",  # IPv4-compatible (deprecated)
        "::",
        "::1",
        "100::1",  # discard
        "5f00::1",  # SRv6 SIDs
        "4000::1",  # outside 2000::/3: unallocated
        "192.0.0.9",  # IETF protocol assignments: is_global on Python 3.11
        "192.0.0.170",
        "192.88.99.1",  # 6to4 relay anycast: is_global on Python 3.11
        "100.64.0.1",
        "100.127.255.254",
        "0.0.0.0",
        "0.1.2.3",
        "198.18.0.1",
        "198.19.255.255",
        "203.0.113.7",
        "224.0.0.251",
        "239.255.255.250",
        "240.0.0.1",
        "255.255.255.255",
        "not an address",
    ],
)
def test_special_ranges_are_not_public(address):
    assert address_is_public(address) is False


@pytest.mark.parametrize(
    "address",
    [
        "93.184.216.34",
        "8.8.8.8",
        "100.63.255.255",  # just below carrier-grade NAT
        "100.128.0.1",  # just above it
        "2606:4700:4700::1111",
        "2a00:1450:4001:80b::200e",
        "2001:200::1",  # just past the IETF block: a regional registry's allocation
        "64:ff9b::808:808",  # NAT64 of a public address (DNS64 on an IPv6-only network)
        "2002:5db8:d822::1",  # 6to4 of 93.184.216.34
    ],
)
def test_global_unicast_is_public(address):
    assert address_is_public(address) is True


def test_site_local_and_documentation_hooks_are_refused_at_registration(tenant_a, fake_dns):
    fake_dns.names.update({"site.example": ["fec0::7"], "doc.example": [PUBLIC_IP, "3fff::1"]})
    admin = client_for(tenant_a.admin)
    for url in ("http://[fec0::1]/", "http://[3fff::1]:8080/h", "https://site.example/h", "https://doc.example/h"):
        response = admin.post("/api/v1/webhooks/", {"name": "x", "url": url}, format="json")
        assert response.status_code == 400, (url, response.json())
        assert "public host" in response.json()["url"][0]
    assert not Webhook.objects.exists()
    public = admin.post("/api/v1/webhooks/", {"name": "ok", "url": "http://[2606:4700:4700::1111]/h"}, format="json")
    assert public.status_code == 201, public.json()


def test_a_hook_rebound_to_site_local_is_refused_before_connecting(tenant_a, fake_dns):
    fake_dns.names["hooks.example"] = ["2606:4700:4700::1111"]
    hook = Webhook.objects.create(name="t", url="https://hooks.example/h", tenant=tenant_a.tenant)
    alert = Alert.objects.create(
        slo=SLOFactory(endpoint=tenant_a.endpoint, tenant=tenant_a.tenant),
        severity="page",
        state="firing",
        long_window="1h",
        short_window="5m",
        burn_rate_threshold=14.4,
    )
    notification = AlertNotification.objects.create(alert=alert, webhook=hook, event="firing")
    fake_dns.names["hooks.example"] = ["fec0::1"]
    attempted: list[httpx.Request] = []

    def receiver(request: httpx.Request) -> httpx.Response:
        attempted.append(request)
        return httpx.Response(200)

    with httpx.Client(transport=httpx.MockTransport(receiver)) as client:
        notifications_deliver_due(now=timezone.now() + timedelta(seconds=1), client=client)
    notification.refresh_from_db()
    assert attempted == []
    assert notification.status == "pending"
    assert notification.last_error.startswith("refused: hooks.example resolves to fec0::1")
