"""Writes for SLOs and alert webhooks: validated, saved and audited once, in one transaction, for the API and console."""

from django.db import transaction

from billing.models import SLO, Webhook
from endpoints.models import Endpoint
from tenants.models import Tenant
from tenants.services import audit_log, validated_save


@transaction.atomic
def slo_create(*, endpoint: Endpoint, name: str, tenant: Tenant | None = None, actor=None, **fields) -> SLO:
    slo = SLO(endpoint=endpoint, name=name, tenant=tenant, **fields)
    return _save_audited(slo, actor=actor, action="slo.create", detail={"endpoint": slo.endpoint_id})


@transaction.atomic
def slo_update(*, slo: SLO, actor=None, **changes) -> SLO:
    _assign(slo, changes)
    return _save_audited(slo, actor=actor, action="slo.update", detail={"fields": sorted(changes)})


@transaction.atomic
def slo_delete(*, slo: SLO, actor=None) -> None:
    audit_log(actor=actor, action="slo.delete", obj=slo, detail={"name": slo.name})
    slo.delete()


@transaction.atomic
def webhook_create(*, name: str, url: str, tenant: Tenant | None = None, actor=None, **fields) -> Webhook:
    """The URL's egress check (public hosts only for a tenant's hook) is the caller's: see ``billing.egress``."""
    hook = Webhook(name=name, url=url, tenant=tenant, **fields)
    return _save_audited(hook, actor=actor, action="webhook.create", detail={"url": hook.url})


@transaction.atomic
def webhook_update(*, webhook: Webhook, actor=None, **changes) -> Webhook:
    _assign(webhook, changes)
    # Field names only: a value such as the signing secret has no place in the audit log.
    return _save_audited(webhook, actor=actor, action="webhook.update", detail={"fields": sorted(changes)})


@transaction.atomic
def webhook_delete(*, webhook: Webhook, actor=None) -> None:
    audit_log(actor=actor, action="webhook.delete", obj=webhook, detail={"name": webhook.name})
    webhook.delete()


def _save_audited(obj, *, actor, action: str, detail: dict):
    validated_save(obj)
    audit_log(actor=actor, action=action, obj=obj, detail=detail)
    return obj


def _assign(obj, changes: dict) -> None:
    for name, value in changes.items():
        setattr(obj, name, value)
