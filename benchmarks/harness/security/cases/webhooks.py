"""Webhook SSRF: a tenant may not make the platform's worker POST to internal addresses, by IP literal, by a name
that resolves inside, or by a name rebound to an internal address between registration and delivery."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from django.utils import timezone

from benchmarks.harness.security.fake_dns import FakeDNS
from benchmarks.harness.security.registry import expect, security_case
from benchmarks.harness.security.world import SecurityWorld
from billing.models import SLO, Alert, AlertNotification, Webhook
from billing.notifiers import notifications_deliver_due

PUBLIC_IP = "93.184.216.34"  # globally routable; never connected to (the cases inject the resolver)
INTERNAL_LITERALS = [
    "http://127.0.0.1:8000/",
    "http://10.1.2.3/hook",
    "http://169.254.169.254/latest/meta-data/",
    "http://100.64.0.1/",
    "http://0.0.0.0:5432/",
    "http://[::1]/",
    "http://[::ffff:127.0.0.1]/",
    "http://[fd00::1]/",
    "http://localhost:6379/",
]
INTERNAL_NAMES = {
    "loopback.attacker.example": ["127.0.0.1"],
    "metadata.attacker.example": ["169.254.169.254"],
    "cluster.attacker.example": ["10.96.0.1"],
    "cgnat.attacker.example": ["100.64.7.7"],
    "mixed.attacker.example": [PUBLIC_IP, "192.168.1.1"],
    "mapped.attacker.example": ["::ffff:10.0.0.1"],
}


def _register(world: SecurityWorld, url: str):
    return world.api(world.a.keys["write"]).post("/api/v1/webhooks/", {"name": "probe", "url": url}, format="json")


@security_case("webhooks.literal_internal_ips", "a tenant key registers webhooks at internal IP literals")
def literal_internal_ips(world: SecurityWorld) -> str:
    accepted = [url for url in INTERNAL_LITERALS if _register(world, url).status_code != 400]
    expect(not accepted, f"accepted: {', '.join(accepted)}")
    return f"{len(INTERNAL_LITERALS)} internal literals refused with 400"


@security_case("webhooks.names_resolving_internally", "a tenant registers names whose DNS answers are internal")
def names_resolving_internally(world: SecurityWorld) -> str:
    with FakeDNS(INTERNAL_NAMES | {"public.attacker.example": [PUBLIC_IP]}):
        accepted = [n for n in INTERNAL_NAMES if _register(world, f"https://{n}/hook").status_code != 400]
        control = _register(world, "https://public.attacker.example/hook").status_code
    expect(not accepted, f"accepted: {', '.join(accepted)}")
    expect(control == 201, f"a public name was not accepted either ({control}): the case proves nothing")
    return f"{len(INTERNAL_NAMES)} internal names refused; a public name accepted"


class _Receiver:
    """A local HTTP server standing in for an internal service: it counts what reaches it."""

    def __init__(self) -> None:
        self.hits: list[dict] = []
        hits = self.hits

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                hits.append({"host": self.headers.get("Host"), "json": json.loads(body or b"{}")})
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _notification(world: SecurityWorld, hook_id: int):
    slo = SLO.objects.create(
        name=f"{world.tag}-probe",
        endpoint=world.a.endpoint,
        tenant=world.a.tenant,
        sli="availability",
        objective=0.999,
    )
    alert = Alert.objects.create(
        slo=slo, severity="page", state="firing", long_window="1h", short_window="5m", burn_rate_threshold=14.4
    )
    return AlertNotification.objects.create(alert=alert, webhook=Webhook.objects.get(pk=hook_id), event="firing")


@security_case(
    "webhooks.rebinding_at_delivery",
    "a name public at registration resolves to loopback at delivery (DNS rebinding) to reach an internal service",
)
def rebinding_at_delivery(world: SecurityWorld) -> str:
    receiver = _Receiver()
    try:
        with FakeDNS({"rebind.attacker.example": [PUBLIC_IP]}) as dns:
            created = _register(world, f"http://rebind.attacker.example:{receiver.port}/internal")
            expect(created.status_code == 201, f"registration of a public name failed ({created.status_code})")
            notification = _notification(world, created.json()["id"])
            dns.names["rebind.attacker.example"] = ["127.0.0.1"]
            notifications_deliver_due(now=timezone.now() + timedelta(seconds=1))
        notification.refresh_from_db()
    finally:
        receiver.close()
    expect(not receiver.hits, f"delivered to the internal service: {len(receiver.hits)} request(s)")
    expect(notification.status != "sent", "the notification is marked sent")
    return f"not delivered; recorded: {notification.last_error[:120]}"
