"""Writes for SLOs and alert webhooks: validated, saved and audited once, in one transaction, for the API and console."""

from django.db import transaction

from billing.models import SLO, Webhook
from endpoints.models import Endpoint
from tenants.models import Tenant
from tenants.services import audit_log, validated_save


@transaction.atomic
def slo_create(*, endpoint: Endpoint, name: str, tenant: Tenant | None = None, actor=None, **fields) -> SLO:
    slo = SLO(endpoint=endpoint, name=name, tenant=tenant, **fields)
    validated_save(slo)
    audit_log(actor=actor, action="slo.create", obj=slo, detail={"endpoint": slo.endpoint_id})
    return slo


@transaction.atomic
def slo_update(*, slo: SLO, actor=None, **changes) -> SLO:
    _assign(slo, changes)
    validated_save(slo)
    audit_log(actor=actor, action="slo.update", obj=slo, detail={"fields": sorted(changes)})
    return slo


@transaction.atomic
def slo_delete(*, slo: SLO, actor=None) -> None:
    audit_log(actor=actor, action="slo.delete", obj=slo, detail={"name": slo.name})
    slo.delete()


@transaction.atomic
def webhook_create(*, name: str, url: str, tenant: Tenant | None = None, actor=None, **fields) -> Webhook:
    """The URL's egress check (public hosts only for a tenant's hook) is the caller's: see ``billing.egress``."""
    hook = Webhook(name=name, url=url, tenant=tenant, **fields)
    validated_save(hook)
    audit_log(actor=actor, action="webhook.create", obj=hook, detail={"url": hook.url})
    return hook


@transaction.atomic
def webhook_update(*, webhook: Webhook, actor=None, **changes) -> Webhook:
    _assign(webhook, changes)
    validated_save(webhook)
    # Field names only: a value such as the signing secret has no place in the audit log.
    audit_log(actor=actor, action="webhook.update", obj=webhook, detail={"fields": sorted(changes)})
    return webhook


@transaction.atomic
def webhook_delete(*, webhook: Webhook, actor=None) -> None:
    audit_log(actor=actor, action="webhook.delete", obj=webhook, detail={"name": webhook.name})
    webhook.delete()


def _assign(obj, changes: dict) -> None:
    for name, value in changes.items():
        setattr(obj, name, value)
