"""billing.services: SLO and webhook writes are validated, audited once, and leave nothing behind when they fail."""

import pytest
from django.core.exceptions import ValidationError

from billing.models import SLO, Webhook
from billing.services import slo_create, slo_delete, slo_update, webhook_create, webhook_delete, webhook_update
from tenants.models import AuditEntry


def _audit(action: str) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(action=action))


def test_slo_create_update_delete_are_audited_once(operator, tenant_a):
    slo = slo_create(
        endpoint=tenant_a.endpoint, tenant=tenant_a.tenant, name="avail", sli="availability", objective=0.99,
        actor=operator,
    )  # fmt: skip
    [created] = _audit("slo.create")
    assert (created.actor, created.tenant, created.object_id) == (operator, tenant_a.tenant, str(slo.pk))

    slo_update(slo=slo, objective=0.995, enabled=False, actor=operator)
    slo.refresh_from_db()
    assert (slo.objective, slo.enabled) == (0.995, False)
    [updated] = _audit("slo.update")
    assert updated.detail == {"fields": ["enabled", "objective"]}

    slo_delete(slo=slo, actor=operator)
    assert not SLO.objects.filter(pk=slo.pk).exists()
    assert len(_audit("slo.delete")) == 1


def test_an_invalid_slo_is_a_field_error_and_leaves_no_row_or_audit_entry(operator, tenant_a):
    with pytest.raises(ValidationError) as caught:
        slo_create(endpoint=tenant_a.endpoint, name="too strict", sli="availability", objective=1.5, actor=operator)
    assert "objective" in caught.value.message_dict
    assert not SLO.objects.exists() and not _audit("slo.create")

    slo = slo_create(endpoint=tenant_a.endpoint, name="ok", sli="availability", objective=0.99, actor=operator)
    with pytest.raises(ValidationError):
        slo_update(slo=slo, period_days=0, actor=operator)
    slo.refresh_from_db()
    assert slo.period_days == 30 and not _audit("slo.update")


def test_webhook_writes_are_audited_without_the_secret(operator, tenant_a):
    hook = webhook_create(
        name="pager", url="http://alerts.internal/hook", tenant=None, secret="s3cret", actor=operator
    )
    [created] = _audit("webhook.create")
    assert created.detail == {"url": "http://alerts.internal/hook"} and created.tenant is None

    webhook_update(webhook=hook, secret="rotated", severities=["page"], actor=operator)
    hook.refresh_from_db()
    assert (hook.secret, hook.severities) == ("rotated", ["page"])
    [updated] = _audit("webhook.update")
    assert updated.detail == {"fields": ["secret", "severities"]}
    assert "rotated" not in str(updated.detail)

    webhook_delete(webhook=hook, actor=operator)
    assert not Webhook.objects.exists() and len(_audit("webhook.delete")) == 1


def test_a_webhook_with_a_malformed_url_is_refused_before_anything_is_saved(operator):
    with pytest.raises(ValidationError) as caught:
        webhook_create(name="bad", url="not a url", actor=operator)
    assert "url" in caught.value.message_dict
    assert not Webhook.objects.exists() and not _audit("webhook.create")
