"""Actuators behind one interface; ``get_actuator(endpoint)`` picks the endpoint's.

The choice is ``Endpoint.launch_options["actuator"]``, else ``INFERCAP["AUTOSCALE_ACTUATOR"]``, else ``local``.
The health checker restarts a failed replica with ``get_actuator(replica.endpoint).restart(replica)``.
"""

from django.conf import settings

from capacity.autoscaling.actuators.base import Actuator, ActuatorError, StaticActuator
from capacity.autoscaling.actuators.kubernetes import KubernetesActuator
from capacity.autoscaling.actuators.local import LocalActuator


def actuator_name(endpoint) -> str:
    default = getattr(settings, "INFERCAP", {}).get("AUTOSCALE_ACTUATOR", "local")
    return str((endpoint.launch_options or {}).get("actuator") or default)


def get_actuator(endpoint) -> Actuator:
    name = actuator_name(endpoint)
    if name == "local":
        return LocalActuator()
    if name == "kubernetes":
        return KubernetesActuator()
    if name == "static":
        return StaticActuator()
    raise ActuatorError(f"unknown actuator {name!r} (local, kubernetes, static)")


__all__ = ["Actuator", "ActuatorError", "actuator_name", "get_actuator"]
