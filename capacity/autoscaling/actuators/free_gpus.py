"""This host's GPUs as a placement cluster, held and free, for the capacity ledger's whole-group figures
(docs/placement.md, "In the ledger"). None where no GPU is known: a host without GPUs, or a Kubernetes cluster, whose
nodes' free GPUs the actuator does not read."""

from capacity.autoscaling.actuators.local import LocalActuator
from capacity.autoscaling.actuators.local_gpus import HOST
from capacity.placement.cluster import Cluster, Gpu


def local_free_gpus() -> Cluster | None:
    """The local actuator's inventory (``INFERCAP["LOCAL_GPUS"]``) with every live holding taken."""
    ledger = LocalActuator.gpu_ledger()
    if ledger is None:
        return None
    cluster = Cluster(ledger.nodes)
    known = set(cluster.gpus)
    for name, indices in ledger.held().items():
        cluster.take(name, [gpu for gpu in (Gpu(HOST, int(i)) for i in indices) if gpu in known])
    return cluster
