"""The free GPUs as a placement cluster, held and free, for the capacity ledger's whole-group figures
(docs/placement.md, "In the ledger"): a Kubernetes cluster's nodes where the room beat task publishes them
(``kubernetes_room.py``), else this host's, as the local actuator allots them. None where no GPU is known."""

from capacity.autoscaling.actuators.base import ActuatorError
from capacity.autoscaling.actuators.kubernetes_room import kubernetes_room
from capacity.autoscaling.actuators.local import LocalActuator
from capacity.autoscaling.actuators.local_gpus import HOST, mig_inventory
from placement.cluster import Cluster, Gpu


def free_gpus() -> Cluster | None:
    """The cluster's GPU nodes with what live pods hold taken, where endpoints run on Kubernetes (None while they
    cannot be read); else this host's."""
    published, cluster = kubernetes_room()
    return cluster if published else local_free_gpus()


def local_free_gpus() -> Cluster | None:
    """The local actuator's inventory (``INFERCAP["LOCAL_GPUS"]``) with every live holding taken, and its free MIG
    slices per profile (``INFERCAP["LOCAL_MIG"]``); None (unknown) where it names neither or cannot be read (a bad
    value: launches say why, the ledger shows no figure)."""
    try:
        ledger = LocalActuator.gpu_ledger()
        slices = mig_inventory()
    except ActuatorError:
        return None
    if ledger is None and not slices:
        return None
    cluster = Cluster(ledger.nodes if ledger is not None else [])
    known = set(cluster.gpus)
    for name, indices in (ledger.held() if ledger is not None else {}).items():
        cluster.take(name, [gpu for gpu in (Gpu(HOST, int(i)) for i in indices) if gpu in known])
    for profile, devices in slices.items():
        held = LocalActuator.mig_ledger(profile, devices).held()
        cluster.mig_free[profile] = max(0, len(devices) - sum(len(indices) for indices in held.values()))
    return cluster
