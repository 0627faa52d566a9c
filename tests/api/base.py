"""NetBox-style API test cases: a resource declares its route, its objects and payloads, and inherits the checks.

Every resource gets list / read / create / update / delete, the role rules (who may write), tenant isolation
(tenant A cannot list, read, change or delete tenant B's objects: 404, never 403), invalid payloads (400 with
field errors) and a constant query count on list (no N+1).
"""

import itertools

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

_counter = itertools.count(1)


def needs(*traits: str):
    """Mark a check as applying only to resources with these traits (see APIResourceCase.__init_subclass__)."""

    def mark(test):
        test._needs = traits
        return test

    return mark


def unique(prefix: str) -> str:
    return f"{prefix}-{next(_counter)}"


class APIResourceCase:
    basename: str  # DRF route basename: "<basename>-list" / "<basename>-detail"
    model: type
    write_access: str | None = "tenant_admins"  # "operators", "tenant_admins", or None (read-only)
    tenant_scoped = True
    supports_delete = True
    id_field = "id"  # the key that holds the object's id in a row (an SLO budget names it "slo_id")

    # --- what each resource declares -------------------------------------------------------------------------
    def make(self, world, side: str):
        """An object belonging to tenant ``side`` ("a" or "b")."""
        raise NotImplementedError

    def make_many(self, world, n: int) -> None:
        for _ in range(n):
            self.make(world, "a")

    def create_payload(self, world) -> dict:
        raise NotImplementedError

    def invalid_payloads(self, world) -> list[tuple[dict, str]]:
        """(payload, field expected among the errors)."""
        return []

    def update_payload(self, world, obj) -> dict:
        raise NotImplementedError

    def tenant_of(self, obj) -> int | None:
        return obj.tenant_id

    # --- helpers ---------------------------------------------------------------------------------------------
    def list_url(self) -> str:
        return reverse(f"{self.basename}-list")

    def detail_url(self, obj) -> str:
        return reverse(f"{self.basename}-detail", args=[obj.pk])

    @staticmethod
    def results(response) -> list[dict]:
        body = response.json()
        return body["results"] if isinstance(body, dict) and "results" in body else body

    def writers(self) -> list[str]:
        return {"operators": ["operator"], "tenant_admins": ["a_admin", "a_write_key"]}.get(self.write_access, [])

    def tenant_readonly(self) -> list[str]:
        """Tenant A principals that may read A's objects but not change them."""
        if self.write_access == "operators":
            return ["a_admin", "a_member", "a_write_key", "a_read_key"]
        return ["a_member", "a_read_key"]

    def __init_subclass__(cls, **kwargs):
        """Drop the checks that do not apply to this resource, rather than reporting dozens of skips."""
        super().__init_subclass__(**kwargs)
        traits = {
            "writable": cls.write_access is not None,
            "read_only": cls.write_access is None,
            "scoped": cls.tenant_scoped,
            "deletable": cls.write_access is not None and cls.supports_delete,
            "undeletable": cls.write_access is not None and not cls.supports_delete,
        }
        for name in dir(cls):
            needs = getattr(getattr(cls, name), "_needs", ())
            if name.startswith("test_") and not all(traits[need] for need in needs):
                setattr(cls, name, None)

    # --- reads -----------------------------------------------------------------------------------------------
    def test_anonymous_is_refused(self, world):
        response = world.client("anonymous").get(self.list_url())
        assert response.status_code in (401, 403)

    def test_operator_lists_every_tenants_objects(self, world):
        a_obj, b_obj = self.make(world, "a"), self.make(world, "b")
        response = world.client("operator").get(self.list_url())
        assert response.status_code == 200, response.content
        ids = {row[self.id_field] for row in self.results(response)}
        assert {a_obj.pk, b_obj.pk} <= ids

    @needs("scoped")
    @pytest.mark.parametrize("who", ["a_admin", "a_member", "a_read_key", "a_write_key"])
    def test_tenant_lists_only_its_own(self, world, who):
        a_obj, b_obj = self.make(world, "a"), self.make(world, "b")
        response = world.client(who).get(self.list_url())
        assert response.status_code == 200, response.content
        ids = {row[self.id_field] for row in self.results(response)}
        assert a_obj.pk in ids
        assert b_obj.pk not in ids
        for row in self.results(response):
            obj = self.model.objects.get(pk=row[self.id_field])
            assert self.tenant_of(obj) in (world.a.tenant.pk, None)

    @pytest.mark.parametrize("who", ["a_admin", "a_member", "a_read_key"])
    def test_tenant_reads_its_own(self, world, who):
        a_obj = self.make(world, "a")
        response = world.client(who).get(self.detail_url(a_obj))
        assert response.status_code == 200, response.content
        assert response.json()[self.id_field] == a_obj.pk

    @needs("scoped")
    @pytest.mark.parametrize("who", ["a_admin", "a_member", "a_read_key", "a_write_key"])
    def test_other_tenants_object_is_not_found(self, world, who):
        b_obj = self.make(world, "b")
        response = world.client(who).get(self.detail_url(b_obj))
        assert response.status_code == 404, response.content

    def test_list_query_count_does_not_grow_with_rows(self, world):
        self.make_many(world, 2)
        counts = []
        for extra in (0, 6):
            self.make_many(world, extra)
            for who in ("operator", "a_admin"):
                client = world.client(who)
                client.get(self.list_url())  # warm any per-process caches, so only per-row queries can differ
                with CaptureQueriesContext(connection) as queries:
                    response = client.get(self.list_url())
                assert response.status_code == 200
                counts.append((who, len(queries)))
        assert counts[:2] == counts[2:], f"query count grew with rows (N+1): {counts}"

    # --- create ----------------------------------------------------------------------------------------------
    @needs("writable")
    def test_writer_creates(self, world):
        for who in self.writers():
            before = self.model.objects.count()
            response = world.client(who).post(self.list_url(), self.create_payload(world), format="json")
            assert response.status_code == 201, (who, response.content)
            assert self.model.objects.count() == before + 1
            created = self.model.objects.get(pk=response.json()[self.id_field])
            if self.tenant_scoped and who != "operator":
                assert self.tenant_of(created) == world.a.tenant.pk

    @needs("writable")
    def test_reader_cannot_create(self, world):
        for who in self.tenant_readonly():
            before = self.model.objects.count()
            response = world.client(who).post(self.list_url(), self.create_payload(world), format="json")
            assert response.status_code == 403, (who, response.content)
            assert self.model.objects.count() == before

    @needs("writable")
    def test_invalid_payloads_are_400_with_field_errors(self, world):
        cases = self.invalid_payloads(world)
        assert cases, "declare invalid payloads for every writable resource"
        client = world.client(self.writers()[0])
        for payload, field in cases:
            before = self.model.objects.count()
            response = client.post(self.list_url(), payload, format="json")
            assert response.status_code == 400, (payload, response.content)
            assert field in response.json(), (payload, response.json())
            assert self.model.objects.count() == before

    @needs("read_only")
    def test_read_only_resource_refuses_writes(self, world):
        obj = self.make(world, "a")
        client = world.client("operator")
        assert client.post(self.list_url(), {}, format="json").status_code == 405
        assert client.patch(self.detail_url(obj), {}, format="json").status_code == 405
        assert client.delete(self.detail_url(obj)).status_code == 405

    # --- update ----------------------------------------------------------------------------------------------
    @needs("writable")
    def test_writer_updates(self, world):
        for who in self.writers():
            obj = self.make(world, "a")
            payload = self.update_payload(world, obj)
            response = world.client(who).patch(self.detail_url(obj), payload, format="json")
            assert response.status_code == 200, (who, response.content)
            for key, value in payload.items():
                assert response.json()[key] == value, key

    @needs("writable")
    def test_reader_cannot_update(self, world):
        obj = self.make(world, "a")
        for who in self.tenant_readonly():
            response = world.client(who).patch(self.detail_url(obj), self.update_payload(world, obj), format="json")
            assert response.status_code == 403, (who, response.content)

    @needs("writable", "scoped")
    @pytest.mark.parametrize("who", ["a_admin", "a_write_key", "a_member"])
    def test_other_tenants_object_cannot_be_changed(self, world, who):
        b_obj = self.make(world, "b")
        before = self.detail_snapshot(world, b_obj)
        response = world.client(who).patch(self.detail_url(b_obj), self.update_payload(world, b_obj), format="json")
        assert response.status_code == 404, response.content
        assert self.detail_snapshot(world, b_obj) == before

    def detail_snapshot(self, world, obj) -> dict:
        return world.client("operator").get(self.detail_url(obj)).json()

    # --- delete ----------------------------------------------------------------------------------------------
    @needs("deletable")
    def test_writer_deletes(self, world):
        for who in self.writers():
            obj = self.make(world, "a")
            response = world.client(who).delete(self.detail_url(obj))
            assert response.status_code == 204, (who, response.content)
            assert not self.model.objects.filter(pk=obj.pk).exists()

    @needs("deletable")
    def test_reader_cannot_delete(self, world):
        obj = self.make(world, "a")
        for who in self.tenant_readonly():
            assert world.client(who).delete(self.detail_url(obj)).status_code == 403, who
        assert self.model.objects.filter(pk=obj.pk).exists()

    @needs("writable", "scoped")
    @pytest.mark.parametrize("who", ["a_admin", "a_write_key", "a_member"])
    def test_other_tenants_object_cannot_be_deleted(self, world, who):
        b_obj = self.make(world, "b")
        response = world.client(who).delete(self.detail_url(b_obj))
        assert response.status_code in ((404,) if self.supports_delete else (404, 405)), response.content
        assert self.model.objects.filter(pk=b_obj.pk).exists()

    @needs("undeletable")
    def test_delete_not_offered(self, world):
        obj = self.make(world, "a")
        assert world.client(self.writers()[0]).delete(self.detail_url(obj)).status_code == 405
        assert self.model.objects.filter(pk=obj.pk).exists()
