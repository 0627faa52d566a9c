"""endpoints.rollouts.selectors: who sees which versions and rollouts (the owner's tenant and the operators)."""

from endpoints.rollouts.selectors import rollouts_visible_to, versions_visible_to
from endpoints.rollouts.services import create_version, ensure_current_version, start_rollout
from tests.factories import EndpointFactory


def test_versions_and_rollouts_are_seen_by_the_owner_and_the_operators_only(operator, tenant_a, tenant_b):
    endpoint = tenant_a.endpoint
    first = ensure_current_version(endpoint)
    second = create_version(endpoint=endpoint, user=operator, launch_options={"max_model_len": 2048})
    rollout = start_rollout(endpoint=endpoint, to_version=second, user=operator)
    shared = EndpointFactory(name="shared-model", owner_tenant=None)
    shared_version = ensure_current_version(shared)

    for principal in (tenant_a.admin, tenant_a.member):
        assert {v.pk: v.is_current for v in versions_visible_to(principal)} == {first.pk: True, second.pk: False}
        assert list(rollouts_visible_to(principal)) == [rollout]
    assert not versions_visible_to(tenant_b.admin).exists()
    assert not rollouts_visible_to(tenant_b.admin).exists()
    assert set(versions_visible_to(operator).values_list("pk", flat=True)) >= {first.pk, second.pk, shared_version.pk}
    assert list(rollouts_visible_to(operator)) == [rollout]
