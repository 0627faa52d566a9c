"""An operator's toleration whose value the API server would refuse (an Equal toleration's value is a label value) is
a field error when set, never a pod the Deployment POST has refused later (docs/placement.md, "In the ledger")."""

import pytest
from django.urls import reverse

from endpoints.models import Endpoint

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("field", ["tolerations", "spot_tolerations"])
def test_an_operators_toleration_with_a_value_no_label_takes_is_refused(world, field):
    mine = world.a.endpoint
    url = reverse("endpoint-detail", args=[mine.pk])
    bad = {field: [{"key": "dedicated", "operator": "Equal", "value": "team x", "effect": "NoSchedule"}]}
    response = world.client("operator").patch(url, {"launch_options": bad}, format="json")
    assert response.status_code == 400, response.content
    assert "is not a label value" in str(response.json()["launch_options"])
    assert Endpoint.objects.get(pk=mine.pk).launch_options == {}
    good = {field: [{"key": "dedicated", "operator": "Equal", "value": "team-x", "effect": "NoSchedule"}]}
    assert world.client("operator").patch(url, {"launch_options": good}, format="json").status_code == 200
