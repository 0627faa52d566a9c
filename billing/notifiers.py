"""Webhook delivery of alert notifications: signed JSON POSTs, retried with exponential backoff, then marked failed.

Each notification row is locked while it is sent (``SKIP LOCKED``), so two workers never send the same one.
A tenant's hook is resolved again at every delivery, every address must be public, and the POST goes to the
checked address itself (Host header and TLS name from the URL), so a name rebound to an internal address after
registration is refused instead of reached. Redirects are never followed.
"""

import hashlib
import hmac
import json
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

import httpx
from django.db import transaction
from django.utils import timezone

from billing import egress
from billing.models import Alert, AlertNotification, Webhook

logger = logging.getLogger("infercap.billing")

MAX_ATTEMPTS = 5
BACKOFF_BASE_S = 10.0
BACKOFF_CAP_S = 600.0
TIMEOUT_S = 5.0


@dataclass(frozen=True)
class DeliveryResult:
    sent: int
    retrying: int
    failed: int


def backoff_s(attempts: int) -> float:
    """Delay before the next try after ``attempts`` failed ones: 10 s, 20 s, 40 s, … capped at 10 minutes."""
    return min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** max(0, attempts - 1))


def alert_payload(alert: Alert, event: str) -> dict:
    slo = alert.slo
    return {
        "event": event,
        "alert": {
            "id": alert.id,
            "severity": alert.severity,
            "state": alert.state,
            "long_window": alert.long_window,
            "short_window": alert.short_window,
            "burn_rate_threshold": alert.burn_rate_threshold,
            "burn_rate_long": alert.burn_rate_long,
            "burn_rate_short": alert.burn_rate_short,
            "started_at": alert.started_at.isoformat(),
            "fired_at": alert.fired_at.isoformat() if alert.fired_at else None,
            "resolved_at": alert.resolved_at.isoformat() if alert.resolved_at else None,
        },
        "slo": {
            "id": slo.id,
            "name": slo.name,
            "sli": slo.sli,
            "objective": slo.objective,
            "endpoint": slo.endpoint.name,
            "tenant": slo.tenant.slug if slo.tenant_id else None,
        },
    }


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def _targets(webhook: Webhook) -> list[tuple[httpx.URL, dict[str, str], dict]]:
    """Where to connect for ``webhook``: (URL with the host replaced by a checked address, extra headers, extensions)
    per address, in resolver order. Raises ``EgressRefused`` when a tenant's hook resolves to anything internal."""
    url = httpx.URL(webhook.url)
    port = url.port or (443 if url.scheme == "https" else 80)
    if webhook.tenant_id is None:
        # Operator-wide hooks may point inside (see billing.api.webhooks); still pinned to what was resolved.
        addresses = egress.resolve_host(url.host, port)
    else:
        addresses = egress.public_addresses(url.host, port)
    # The name the receiver expects: virtual hosting reads Host, TLS verifies the certificate against the SNI name.
    headers = {"Host": url.netloc.decode("ascii")}
    extensions = {"sni_hostname": url.host} if url.scheme == "https" else {}
    return [(url.copy_with(host=address), headers, extensions) for address in addresses]


def _send(client: httpx.Client, notification: AlertNotification) -> str | None:
    """POST one notification; returns None on a 2xx answer, else the error to record."""
    payload = alert_payload(notification.alert, notification.event)
    # Receivers can drop a retry of something they already processed (the Idempotency-Key).
    return post_event(
        client, notification.webhook, payload, idempotency_key=f"infercap-notification-{notification.id}"
    )


def post_event(client: httpx.Client, webhook: Webhook, payload: dict, *, idempotency_key: str) -> str | None:
    """POST one signed JSON event to ``webhook`` through the egress checks; None on a 2xx answer, else the error."""
    body = json.dumps(payload, sort_keys=True).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "infercap-alerts/1",
        "Idempotency-Key": idempotency_key,
    }
    if webhook.secret:
        headers["X-Infercap-Signature"] = sign(webhook.secret, body)
    try:
        targets = _targets(webhook)
    except (egress.EgressRefused, httpx.InvalidURL, OSError, UnicodeError) as exc:
        return f"refused: {exc}"[:500]
    error = "no address"
    for url, pinned, extensions in targets:
        try:
            request = client.build_request(
                "POST", url, content=body, headers={**headers, **pinned}, extensions=extensions
            )
            response = client.send(request, follow_redirects=False)
        except httpx.ConnectError as exc:  # this address is down: the next one the name resolved to may answer
            error = f"{type(exc).__name__}: {exc}"[:500]
            continue
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}"[:500]
        if 200 <= response.status_code < 300:
            return None
        return f"HTTP {response.status_code}: {response.text[:200]}"
    return error


def notifications_deliver_due(
    *, now: datetime | None = None, client: httpx.Client | None = None, limit: int = 100
) -> DeliveryResult:
    """Send every pending notification whose next attempt is due."""
    now = now or timezone.now()
    own_client = client is None
    client = client or httpx.Client(timeout=TIMEOUT_S, follow_redirects=False)
    sent = retrying = failed = 0
    try:
        due_ids = list(
            AlertNotification.objects.filter(status=AlertNotification.Status.PENDING, next_attempt_at__lte=now)
            .order_by("next_attempt_at")
            .values_list("id", flat=True)[:limit]
        )
        for notification_id in due_ids:
            with transaction.atomic():
                notification = (
                    AlertNotification.objects.select_for_update(skip_locked=True, of=("self",))
                    .select_related("alert__slo__endpoint", "alert__slo__tenant", "webhook")
                    .filter(pk=notification_id, status=AlertNotification.Status.PENDING)
                    .first()
                )
                if notification is None:  # another worker holds it or already sent it
                    continue
                error = _send(client, notification)
                notification.attempts += 1
                if error is None:
                    notification.status = AlertNotification.Status.SENT
                    notification.sent_at = now
                    notification.last_error = ""
                    sent += 1
                elif notification.attempts >= MAX_ATTEMPTS:
                    notification.status = AlertNotification.Status.FAILED
                    notification.last_error = error
                    failed += 1
                    logger.warning(
                        "webhook %s gave up after %d attempts: %s", notification.webhook, MAX_ATTEMPTS, error
                    )
                else:
                    notification.next_attempt_at = now + timedelta(seconds=backoff_s(notification.attempts))
                    notification.last_error = error
                    retrying += 1
                notification.save(update_fields=["attempts", "status", "sent_at", "last_error", "next_attempt_at"])
    finally:
        if own_client:
            client.close()
    return DeliveryResult(sent=sent, retrying=retrying, failed=failed)
