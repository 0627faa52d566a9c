"""MIG slices (docs/placement.md, "MIG slices"): a GPU partitioned by NVIDIA's Multi-Instance GPU into instances
with their own compute and memory, each a device of its own to the process that runs on it. A hardware profile with a
``mig_profile`` (``1g.10gb``, ``3g.40gb``, ``1g.10gb+me``: sevenths of the GPU's compute, GB of its memory, and the
media engines) describes one slice: a replica runs on exactly one, as a TP group cannot span MIG instances (NCCL does
not reach across them). Pure: no Django.

Where a slice is named:

* on a host (the local actuator), by the device's UUID, the only name ``CUDA_VISIBLE_DEVICES`` takes for a MIG
  instance: ``INFERCAP_LOCAL_MIG`` lists them per profile (``local_slices``);
* on Kubernetes, by the resource NVIDIA's device plugin advertises (``resource_name``): under its ``mixed`` strategy
  one extended resource per profile (``nvidia.com/mig-1g.10gb``); under ``single`` (every GPU of a node cut the same
  way) the plain ``nvidia.com/gpu``, with GPU feature discovery writing the slice into the node's product label
  (``NVIDIA-A100-SXM4-80GB-MIG-1g.10gb``, ``product_label_value``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from placement.policies import Fit

# The profiles NVIDIA's tools name: compute slices (of 7) and memory in GB, "+me" for the media extensions.
PROFILE = re.compile(r"^(?P<compute>[1-7])g\.(?P<memory>[1-9][0-9]{0,3})gb(?P<media>\+me)?\Z")
# What nvidia-smi -L prints for a MIG device: "MIG-<uuid>" (R470 and later) or "MIG-GPU-<uuid>/<gi>/<ci>".
DEVICE = re.compile(r"^MIG-[0-9A-Za-z][0-9A-Za-z/-]{7,99}\Z")
STRATEGIES = ("mixed", "single")
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE = "nvidia.com/mig-"


@dataclass(frozen=True)
class MigSlice:
    name: str
    compute_sevenths: int
    memory_gb: int

    def describe(self) -> str:
        return f"one MIG {self.name} slice ({self.compute_sevenths}/7 of a GPU's compute, {self.memory_gb} GB)"


def parse(name: str) -> MigSlice:
    """The slice a profile name describes; ValueError naming the expected form."""
    match = PROFILE.match(name or "")
    if match is None:
        raise ValueError(f"MIG profile {name!r}: expected <compute>g.<memory>gb, e.g. 1g.10gb, 3g.40gb, 1g.10gb+me")
    return MigSlice(name, int(match["compute"]), int(match["memory"]))


def not_tensor_parallel(tp: int) -> str:
    """Why a MIG profile's replica cannot be ``tp`` GPUs ("" where it can: one slice)."""
    if tp == 1:
        return ""
    return f"a MIG slice runs one replica on itself: a TP-{tp} group cannot span MIG instances (NCCL does not)"


def resource_name(name: str, strategy: str) -> str:
    """The extended resource a pod asks for to get one slice of profile ``name`` under the device plugin's
    ``strategy``."""
    if strategy not in STRATEGIES:
        raise ValueError(f"MIG strategy {strategy!r} is not one of {', '.join(STRATEGIES)}")
    parse(name)
    return f"{MIG_RESOURCE}{name.replace('+', '.')}" if strategy == "mixed" else GPU_RESOURCE


def profile_of_resource(resource: str) -> str:
    """The profile a mixed-strategy resource names, ``resource_name``'s inverse: the device plugin spells a
    profile's ``+`` as ``.`` (a resource name takes no ``+``), so ``nvidia.com/mig-1g.10gb.me`` is ``1g.10gb+me``."""
    name = resource.removeprefix(MIG_RESOURCE)
    return name[: -len(".me")] + "+me" if name.endswith(".me") else name


def product_label_value(gpu_product: str, name: str) -> str:
    """The product label GPU feature discovery writes on a node whose GPUs are all cut into ``name`` slices (the
    ``single`` strategy); "" where the profile names no product. ValueError for a media-extension profile: a label
    value takes no ``+``, and how feature discovery spells it there is not known here (the mixed strategy names it)."""
    if parse(name).name.endswith("+me"):
        raise ValueError(f"MIG profile {name}: under the single strategy use a profile without +me, or run mixed")
    return f"{gpu_product}-MIG-{name}" if gpu_product else ""


def strategy_of(value) -> str:
    """``INFERCAP["KUBERNETES_MIG_STRATEGY"]`` as the actuator and the ledger both read it: empty is ``mixed``."""
    return str(value or "mixed")


def local_slices(text: str | None) -> dict[str, list[str]]:
    """``INFERCAP_LOCAL_MIG`` read: ``"<profile>=<uuid>,<uuid>;<profile>=<uuid>"`` → profile → device UUIDs, in the
    order given. Empty: no slices. ValueError naming what does not read (a device listed twice, a name that is not
    a MIG device's UUID: the value reaches ``CUDA_VISIBLE_DEVICES``, where a comma would name a second device)."""
    slices: dict[str, list[str]] = {}
    seen: set[str] = set()
    for part in (text or "").split(";"):
        if not part.strip():
            continue
        profile, sep, devices = part.partition("=")
        profile = profile.strip()
        if not sep:
            raise ValueError(f"{part.strip()!r}: expected <profile>=<MIG device UUID>[,<UUID>...]")
        parse(profile)
        for device in (d.strip() for d in devices.split(",")):
            if not DEVICE.match(device):
                raise ValueError(f"{device!r} is not a MIG device's UUID (MIG-..., as nvidia-smi -L prints it)")
            if device in seen:
                raise ValueError(f"{device} is listed twice")
            seen.add(device)
            slices.setdefault(profile, []).append(device)
    return slices


def slice_fit(name: str, tp: int) -> Fit:
    """The shape answer for a replica of ``tp`` on a MIG profile: one slice, or no fit."""
    why = not_tensor_parallel(tp)
    return Fit(not why, 0 if why else 1, why or parse(name).describe())
