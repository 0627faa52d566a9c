"""factory_boy factories for every model; tests build their world from these."""

import factory
from django.utils import timezone

from billing.models import SLO, SLIKind, UsageRecord, UsageStatus
from capacity.models import HardwareProfile, ModelProfile
from endpoints.models import Endpoint, Replica, ReplicaState
from tenants.models import CapacityReservation, Role, Tenant, User


class TenantFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Tenant

    name = factory.Sequence(lambda n: f"Tenant {n}")
    slug = factory.Sequence(lambda n: f"tenant-{n}")


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = User
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    role = Role.TENANT_MEMBER
    tenant = factory.SubFactory(TenantFactory)
    password = factory.PostGenerationMethodCall("set_password", "pw-for-tests-123")

    @factory.post_generation
    def _save(obj, create, extracted, **kwargs):
        if create:
            obj.save()


class OperatorFactory(UserFactory):
    role = Role.OPERATOR
    tenant = None
    is_staff = True


class HardwareProfileFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = HardwareProfile
        django_get_or_create = ("name",)

    name = "a100-80g"
    gpu_type = "A100-80GB"
    gpus_per_replica = 1
    gpu_memory_gb = 80
    memory_bandwidth_gbps = 2039
    usd_per_gpu_hour = 2.5


class ModelProfileFactory(factory.django.DjangoModelFactory):
    """The 13B dense FP16 model of the planner's worked example (docs/algorithms.md#the-worked-example)."""

    class Meta:
        model = ModelProfile
        django_get_or_create = ("name",)

    name = "llama-13b"
    parameters_b = 13
    n_layers = 40
    n_kv_heads = 8
    d_head = 128
    dtype_bytes = 2
    weights_gb = 26
    max_model_len = 4096


class EndpointFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Endpoint

    name = factory.Sequence(lambda n: f"model-{n}")
    model_profile = factory.SubFactory(ModelProfileFactory)
    hardware_profile = factory.SubFactory(HardwareProfileFactory)


class ReplicaFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Replica

    endpoint = factory.SubFactory(EndpointFactory)
    name = factory.Sequence(lambda n: f"r{n}")
    url = factory.Sequence(lambda n: f"http://127.0.0.1:{20000 + n}")
    state = ReplicaState.READY


class ReservationFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = CapacityReservation

    tenant = factory.SubFactory(TenantFactory)
    endpoint = factory.SubFactory(EndpointFactory)
    mu_per_min = 100.0


class SLOFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = SLO

    name = factory.Sequence(lambda n: f"slo-{n}")
    endpoint = factory.SubFactory(EndpointFactory)
    sli = SLIKind.AVAILABILITY
    objective = 0.999


class UsageRecordFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = UsageRecord

    request_id = factory.Sequence(lambda n: f"req-{n}")
    tenant = factory.SubFactory(TenantFactory)
    endpoint = factory.SubFactory(EndpointFactory)
    status = UsageStatus.OK
    input_tokens = 100
    output_tokens = 50
    mu = 1.0
    slo_met = True
    started_at = factory.LazyFunction(timezone.now)
    finished_at = factory.LazyFunction(timezone.now)
