"""A LoRA adapter's artifact on disk: where it may lie and what it says about itself (pure: no Django; the adapter
services and the proxy's load path call it; docs/lora-serving.md).

Adapters name a directory relative to the operators' storage root, never a path or hub id of their own: vLLM reads
whatever ``lora_path`` it is given, so a tenant who could name ``/etc`` or ``../other-tenant`` would have the engine
read it. The relative path is checked as text (no absolute path, no ``..``), then resolved (symlinks followed) and
must still lie under the resolved root; every file read is resolved the same way, so a symlink inside an approved
directory cannot point out of it either.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

ADAPTER_CONFIG = "adapter_config.json"
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
MAX_CONFIG_BYTES = 1 << 20


class ArtifactError(ValueError):
    """Why an artifact path cannot be served, in a sentence (the API's field error for ``artifact_path``)."""


@dataclass(frozen=True)
class Artifact:
    path: Path  # the resolved directory, under the root: what vLLM is given as ``lora_path``
    rank: int | None  # adapter_config.json's ``r``
    base_model: str  # adapter_config.json's ``base_model_name_or_path``


def relative_path_problem(relative) -> str | None:
    """Why ``relative`` is not a plain path under the root (as text, before touching the disk), or None."""
    if not isinstance(relative, str) or not relative.strip():
        return "must be a directory path relative to the LoRA storage root"
    if "\x00" in relative or "\\" in relative or any(ord(c) < 32 for c in relative):
        return "must not contain backslashes or control characters"
    path = PurePosixPath(relative)
    if path.is_absolute() or relative.startswith("~") or (len(relative) > 1 and relative[1] == ":"):
        return "must be relative to the LoRA storage root, not an absolute path"
    if ".." in path.parts:
        return "must not contain '..'"
    return None


def _inside(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)


def resolve_under_root(relative: str, *, root: Path) -> Path:
    """The directory ``relative`` names, resolved, if it lies under ``root`` (resolved too); else ArtifactError."""
    if problem := relative_path_problem(relative):
        raise ArtifactError(problem)
    real_root = Path(os.path.realpath(root))
    resolved = Path(os.path.realpath(real_root / relative))
    if not _inside(resolved, real_root) or resolved == real_root:
        raise ArtifactError("resolves outside the LoRA storage root (a symlink that leaves it is refused)")
    if not resolved.is_dir():
        raise ArtifactError(f"no adapter directory {relative!r} under the LoRA storage root")
    return resolved


def _file_inside(directory: Path, name: str, real_root: Path) -> Path | None:
    candidate = directory / name
    if not candidate.exists():
        return None
    resolved = Path(os.path.realpath(candidate))
    if not _inside(resolved, real_root) or not resolved.is_file():
        raise ArtifactError(f"{name} resolves outside the LoRA storage root or is not a file")
    return resolved


def inspect_artifact(relative: str, *, root: Path) -> Artifact:
    """Check the adapter directory ``relative`` under ``root`` and read its adapter_config.json; ArtifactError
    says what is missing or wrong (no config, no weights, not a LoRA adapter, a bad rank)."""
    directory = resolve_under_root(relative, root=root)
    real_root = Path(os.path.realpath(root))
    config_path = _file_inside(directory, ADAPTER_CONFIG, real_root)
    if config_path is None:
        raise ArtifactError(f"{relative!r} has no {ADAPTER_CONFIG}")
    if not any(_file_inside(directory, name, real_root) for name in WEIGHT_FILES):
        raise ArtifactError(f"{relative!r} has no adapter weights ({' or '.join(WEIGHT_FILES)})")
    if config_path.stat().st_size > MAX_CONFIG_BYTES:
        raise ArtifactError(f"{ADAPTER_CONFIG} is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ArtifactError(f"{ADAPTER_CONFIG} is not readable JSON: {type(exc).__name__}") from None
    if not isinstance(config, dict):
        raise ArtifactError(f"{ADAPTER_CONFIG} is not a JSON object")
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise ArtifactError(f"{ADAPTER_CONFIG} describes a {config.get('peft_type')} adapter, not LoRA")
    rank = config.get("r")
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 1):
        raise ArtifactError(f"{ADAPTER_CONFIG} has an invalid rank r={rank!r}")
    base = config.get("base_model_name_or_path")
    return Artifact(path=directory, rank=rank, base_model=base if isinstance(base, str) else "")


def same_base_model(adapter_base: str, endpoint_model: str, *, endpoint_model_path: str | None = None) -> bool:
    """Whether an adapter trained on ``adapter_base`` fits the endpoint's model (its model profile name, and the
    local directory vLLM loads for it, if any): the same name, the same last path segment (a hub id
    ``org/name`` against a local directory ``.../name``), or the same directory on disk."""
    if not adapter_base or not endpoint_model:
        return False
    a, b = adapter_base.rstrip("/"), endpoint_model.rstrip("/")
    if a == b or a.rsplit("/", 1)[-1].lower() == b.rsplit("/", 1)[-1].lower():
        return True
    if endpoint_model_path and os.path.isdir(a) and os.path.isdir(endpoint_model_path):
        return os.path.realpath(a) == os.path.realpath(endpoint_model_path)
    return False
