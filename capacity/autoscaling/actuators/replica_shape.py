"""How many GPUs one replica of a launch takes, and the hardware it takes them on (docs/placement.md, "In the
actuators")."""

from capacity.models import HardwareProfile
from endpoints.models import Endpoint
from placement.cluster import replica_gpu_count


def launch_hardware(endpoint: Endpoint) -> HardwareProfile | None:
    """The profile this launch runs on: a spot or prefill pool's (``launch_hardware_profile_id``), else the
    endpoint's (or the version's, for a version's launch)."""
    hardware_id = getattr(endpoint, "launch_hardware_profile_id", None) or endpoint.hardware_profile_id
    return HardwareProfile.objects.filter(pk=hardware_id).first() if hardware_id else None


def profile_gpus(hardware: HardwareProfile | None) -> int:
    """A pod's GPUs on Kubernetes: the hardware profile's ``gpus_per_replica``, what the planner and the quota count
    (a launch option's ``tensor_parallel_size`` alone may be CPU ranks, on a cluster of CPU nodes)."""
    return replica_gpu_count(None, hardware.gpus_per_replica if hardware is not None else None, engine_ranks=False)


def engine_gpus(endpoint: Endpoint, hardware: HardwareProfile | None) -> int:
    """A local replica's GPUs on a host that has some: the engine's ranks (``tensor_parallel_size``) where the
    launch options set it, else the hardware profile's ``gpus_per_replica``."""
    tp = (endpoint.launch_options or {}).get("tensor_parallel_size")
    return replica_gpu_count(tp, hardware.gpus_per_replica if hardware is not None else None)
