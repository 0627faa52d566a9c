"""/api/v1/hardware-profiles/ and /api/v1/model-profiles/: every authenticated principal reads; operators write."""

from rest_framework import serializers

from capacity.models import HardwareProfile, ModelProfile
from capacity.services import profile_create, profile_delete, profile_update
from tenants.api.base import WRITE, ScopedModelViewSet


class HardwareProfileSerializer(serializers.ModelSerializer):
    replica_fit = serializers.SerializerMethodField(
        help_text="whether a replica of gpus_per_replica fits one interconnect domain, on how many nodes, and why "
        "(docs/placement.md)"
    )

    class Meta:
        model = HardwareProfile
        fields = [
            "id", "name", "gpu_type", "gpus_per_replica", "gpu_memory_gb", "memory_bandwidth_gbps", "usd_per_gpu_hour",
            "memory_overhead_gb", "capacity_type", "max_replicas", "kv_link_gbps", "gpus_per_node",
            "interconnect_domain_gpus",
            "domain_node_label", "gpu_product", "gpu_product_label", "mig_profile", "replica_fit",
        ]  # fmt: skip
        read_only_fields = ["id", "replica_fit"]

    def get_replica_fit(self, obj: HardwareProfile) -> dict:
        fit = obj.replica_fit()
        return {"fits": fit.fits, "nodes": fit.nodes, "reason": fit.reason}


class ModelProfileSerializer(serializers.ModelSerializer):
    class Meta:
        model = ModelProfile
        fields = [
            "id", "name", "parameters_b", "n_layers", "n_kv_heads", "d_head", "dtype_bytes", "weights_gb",
            "max_model_len", "alpha", "alpha_cached", "beta", "gamma", "mu_per_min", "source_benchmark",
        ]  # fmt: skip
        # Coefficients come from benchmarks; source_benchmark records which one, and is set by the capacity app.
        read_only_fields = ["id", "source_benchmark"]


class ProfileViewSet(ScopedModelViewSet):
    """Profiles are platform catalogue data, the same for every tenant."""

    write_access = WRITE.OPERATORS

    def visible_queryset(self, principal):
        return self.model.objects.all()

    def create_object(self, data):
        return profile_create(model=self.model, actor=self.request.user, **data)

    def update_object(self, instance, data):
        return profile_update(profile=instance, actor=self.request.user, **data)

    def delete_object(self, instance):
        profile_delete(profile=instance, actor=self.request.user)


class HardwareProfileViewSet(ProfileViewSet):
    model = HardwareProfile
    queryset = HardwareProfile.objects.all()
    serializer_class = HardwareProfileSerializer
    filterset_fields = ["name", "gpu_type", "gpus_per_replica"]
    ordering_fields = ["name", "usd_per_gpu_hour"]


class ModelProfileViewSet(ProfileViewSet):
    model = ModelProfile
    queryset = ModelProfile.objects.select_related("source_benchmark")
    serializer_class = ModelProfileSerializer
    filterset_fields = ["name", "dtype_bytes"]
    ordering_fields = ["name", "parameters_b"]


def register(router) -> None:
    router.register("hardware-profiles", HardwareProfileViewSet, basename="hardware-profile")
    router.register("model-profiles", ModelProfileViewSet, basename="model-profile")
