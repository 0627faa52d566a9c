"""Admin for hardware and model profiles, capacity benchmarks, autoscaler decisions and operators' scale pins."""

from django.contrib import admin

from capacity.models import AutoscalerDecision, CapacityBenchmark, HardwareProfile, ModelProfile, ScalePin
from tenants.admin.base import OperatorAdmin, ReadOnlyOperatorAdmin


@admin.register(HardwareProfile)
class HardwareProfileAdmin(OperatorAdmin):
    list_display = [
        "name",
        "gpu_type",
        "gpus_per_replica",
        "gpu_memory_gb",
        "memory_bandwidth_gbps",
        "usd_per_gpu_hour",
        "capacity_type",
        "max_replicas",
        "gpus_per_node",
        "interconnect_domain_gpus",
        "gpu_product",
    ]
    list_filter = ["gpu_type", "gpus_per_replica", "capacity_type"]
    search_fields = ["name", "gpu_type"]


@admin.register(ModelProfile)
class ModelProfileAdmin(OperatorAdmin):
    list_display = [
        "name",
        "parameters_b",
        "n_layers",
        "n_kv_heads",
        "d_head",
        "dtype_bytes",
        "weights_gb",
        "alpha",
        "alpha_cached",
        "beta",
        "gamma",
        "mu_per_min",
        "source_benchmark",
    ]
    list_filter = ["dtype_bytes"]
    search_fields = ["name"]
    list_select_related = ["source_benchmark__model_profile", "source_benchmark__hardware_profile"]
    raw_id_fields = ["source_benchmark"]


@admin.register(CapacityBenchmark)
class CapacityBenchmarkAdmin(OperatorAdmin):
    list_display = [
        "model_profile",
        "hardware_profile",
        "version",
        "status",
        "b_max",
        "mu_per_min",
        "fit_error",
        "created_at",
        "finished_at",
    ]
    list_filter = ["status", "model_profile", "hardware_profile"]
    search_fields = ["model_profile__name", "hardware_profile__name"]
    list_select_related = ["model_profile", "hardware_profile"]
    date_hierarchy = "created_at"


@admin.register(AutoscalerDecision)
class AutoscalerDecisionAdmin(ReadOnlyOperatorAdmin):
    list_display = ["at", "endpoint", "axis", "current", "desired", "applied", "reason"]
    list_filter = ["axis", "applied", "endpoint"]
    search_fields = ["endpoint__name", "reason", "tick"]
    list_select_related = ["endpoint"]
    date_hierarchy = "at"


# Read only: a pin is set and released through the scale API, which records it in the decision log
# (capacity/autoscaling/pins.py).
@admin.register(ScalePin)
class ScalePinAdmin(ReadOnlyOperatorAdmin):
    list_display = ["endpoint", "replicas", "until", "set_by_label", "set_at", "reason"]
    search_fields = ["endpoint__name", "set_by_label", "reason"]
    list_select_related = ["endpoint"]
