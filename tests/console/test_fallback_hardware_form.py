"""The console's endpoint form takes a fallback hardware profile (docs/placement.md, "Falling back to another hardware
profile") and refuses one that cannot hold the model, as the API does."""

from django.urls import reverse

from endpoints.models import Endpoint
from tests.console.test_actions import _endpoint_data, _post_confirmed
from tests.factories import HardwareProfileFactory


def test_the_endpoint_form_takes_a_fallback_profile_that_holds_the_model(client, operator, tenant_a):
    client.force_login(operator)
    url = reverse("console:endpoint-create")
    small = HardwareProfileFactory(name="t4", gpu_type="T4", gpu_memory_gb=16)
    bad = client.post(url, _endpoint_data(tenant_a, fallback_hardware_profile=small.pk))
    assert bad.status_code == 400
    assert "t4 cannot hold llama-13b" in " ".join(bad.context["form"].errors["fallback_hardware_profile"])
    pair = HardwareProfileFactory(name="l40s-x2", gpu_type="L40S", gpus_per_replica=2, gpu_memory_gb=48)
    done = _post_confirmed(client, url, _endpoint_data(tenant_a, fallback_hardware_profile=pair.pk))
    assert done.status_code == 302
    assert Endpoint.objects.get(name="llama-new").fallback_hardware_profile == pair
