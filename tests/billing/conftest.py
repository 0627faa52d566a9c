"""Billing test helpers: synthetic usage written straight into the minute rollups, a real local webhook server and
a resolver the tests control (``fake_dns``)."""

import json
import threading
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from benchmarks.harness.security.fake_dns import FakeDNS
from billing.models import TPOT_BOUNDS_MS, TTFT_BOUNDS_MS, UsageDay, UsageHour, UsageMinute
from billing.rollups import DAY, HOUR, recompute_coarser

# An address that is globally routable (so the webhook guard accepts it); no test ever connects to it.
PUBLIC_IP = "93.184.216.34"


def synth_minutes(*, endpoint, tenant, start: datetime, minutes: int, per_minute: int, bad_ratio) -> None:
    """Traffic of ``per_minute`` requests a minute; ``bad_ratio(i)`` of the i-th minute's requests fail.

    Written as minute rollups (hours and days recomputed from them) so days of history take milliseconds.
    """
    rows = []
    for i in range(minutes):
        bad = round(per_minute * bad_ratio(i))
        ok = per_minute - bad
        latency = {f"ttft_le_{b}": ok for b in TTFT_BOUNDS_MS} | {f"tpot_le_{b}": ok for b in TPOT_BOUNDS_MS}
        rows.append(
            UsageMinute(
                endpoint=endpoint,
                tenant=tenant,
                start=start + timedelta(minutes=i),
                requests=per_minute,
                ok=ok,
                good=ok,
                upstream_errors=bad,
                output_tokens=ok * 100,
                good_output_tokens=ok * 100,
                mu=per_minute,
                **latency,
            )
        )
    UsageMinute.objects.bulk_create(
        rows,
        update_conflicts=True,
        unique_fields=["endpoint", "tenant", "start"],
        update_fields=["requests", "ok", "good", "upstream_errors"],
    )
    lo = start.replace(minute=0, second=0, microsecond=0)
    hi = start + timedelta(minutes=minutes) + HOUR
    recompute_coarser(UsageHour, [(lo, hi)])
    recompute_coarser(UsageDay, [(lo.replace(hour=0), hi.replace(hour=0, minute=0) + DAY)])


class WebhookServer:
    def __init__(self, status: int = 200):
        self.status = status
        self.requests: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                server.requests.append({"headers": dict(self.headers), "body": body, "json": json.loads(body)})
                self.send_response(server.status)
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def webhook_server():
    server = WebhookServer()
    yield server
    server.close()


@pytest.fixture
def fake_dns():
    """Names the test maps (``fake_dns.names["x.example"] = [ip]``) resolve so for the whole process, httpx too."""
    with FakeDNS() as dns:
        yield dns
