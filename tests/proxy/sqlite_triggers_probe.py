"""Run in a subprocess by ``test_snapshot_delta_watermark``: migrates an empty SQLite database (the embedded
default) with the real migrations, then reports as JSON what the change triggers do there, before and after a
schema change that rebuilds ``tenants_apikey`` and another ``migrate``."""

import json

import django

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection, models  # noqa: E402

from gateway.proxy.snapshot_keys import key_checksum, read_key_changes, read_keys  # noqa: E402
from tenants.models import ApiKey, Tenant  # noqa: E402


def _triggers() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM sqlite_master WHERE type = 'trigger' AND name LIKE 'tenants_%' ORDER BY 1")
        return [name for (name,) in cursor.fetchall()]


def _stamps(key: ApiKey) -> tuple[str, int]:
    fresh = ApiKey.objects.get(pk=key.pk)
    return str(fresh.changed_at), fresh.changed_xid


def main() -> None:
    call_command("migrate", verbosity=0)
    report = {"vendor": connection.vendor, "migrated": _triggers()}
    tenant = Tenant.objects.create(name="t", slug="t")
    key = ApiKey.objects.create(tenant=tenant, name="k", prefix="p1", key_hash="h1", scopes=["inference"])
    table, cursor = read_keys()
    inserted = _stamps(key)
    key.scopes = ["read"]
    key.save()
    scoped = _stamps(key)
    key.name = "renamed"
    key.save()  # a full save() of an unwatched change writes the instance's stale stamps back
    report["stamps"] = {"inserted": inserted, "scoped": scoped, "renamed": _stamps(key)}
    Tenant.objects.filter(pk=tenant.pk).update(budget_usd=5.0, budget_hard_stop=True)
    table, cursor = read_key_changes(table, cursor)
    report["delta"] = {"scopes": sorted(table["h1"].scopes), "budget": table["h1"].tenant_budget_usd}
    report["checksum_equal"] = key_checksum() == (cursor.count, cursor.checksum)
    with connection.schema_editor() as editor:  # what an AlterField migration does on SQLite: a table rebuild
        old = ApiKey._meta.get_field("name")
        new = models.CharField(max_length=200)
        new.set_attributes_from_name("name")
        new.model = ApiKey
        editor.alter_field(ApiKey, old, new)
    report["rebuilt"] = _triggers()
    call_command("migrate", verbosity=0)
    report["migrated_again"] = _triggers()
    before = _stamps(key)
    ApiKey.objects.filter(pk=key.pk).update(rpm_limit=7)
    report["stamps_after_rebuild"] = {"before": before, "after": _stamps(key)}
    print(json.dumps(report))


main()
