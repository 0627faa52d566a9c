"""A LoRA adapter's artifact on disk: where it may lie and what it says about itself (pure: no Django; the adapter
services and the proxy's load path call it; docs/lora-serving.md).

Adapters name a directory relative to their owner's part of the operators' storage root (``owner_root``: a
tenant's private adapters under ``tenants/<tenant id>/``, the operators' shared ones under ``shared/``), never a
path or hub id of their own: vLLM reads whatever ``lora_path`` it is given, so a tenant who could name ``/etc``,
``../other-tenant`` or another tenant's directory would have the engine read it. The relative path is checked as
text (no absolute path, no ``..``), then resolved (symlinks followed) and must still lie under the resolved owner
root; every file read is resolved the same way, so a symlink inside an approved directory cannot point out of it.

The engine never sees an adapter's public name: it holds each artifact version under ``engine_name`` (owner, adapter
id and a fingerprint of the files), so a reused or renamed name, or new weights in the same directory, is never
served from what a replica loaded before (docs/lora-serving.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

ADAPTER_CONFIG = "adapter_config.json"
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
MAX_CONFIG_BYTES = 1 << 20
TENANTS_DIR = "tenants"  # <root>/tenants/<tenant id>/: one tenant's adapters, the only place it may name
SHARED_DIR = "shared"  # <root>/shared/: the operators' shared adapters
ENGINE_NAME = re.compile(r"^lora-(?:t(?P<tenant>\d+)|shared)-(?P<id>\d+)-(?P<fingerprint>[0-9a-f]+)$")


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


def owner_root(root: Path | str, owner_tenant_id: int | None) -> Path:
    """Where an adapter of this owner lies: ``<root>/tenants/<id>`` for a tenant's private adapter, ``<root>/shared``
    for the operators' shared ones. Its ``artifact_path`` is relative to this directory and may not leave it."""
    base = Path(root)
    return base / SHARED_DIR if owner_tenant_id is None else base / TENANTS_DIR / str(int(owner_tenant_id))


def artifact_fingerprint(directory: Path | str) -> str:
    """A cheap fingerprint of the artifact's current files (the directory's real path, and each of
    adapter_config.json and the weights: size, mtime and inode): new weights written into the same directory, or the
    directory swapped, give another fingerprint, hence another engine name and a fresh load."""
    digest = hashlib.sha256(os.path.realpath(directory).encode())
    for name in (ADAPTER_CONFIG, *WEIGHT_FILES):
        try:
            st = os.stat(os.path.join(directory, name))
        except OSError:
            continue
        digest.update(f"|{name}:{st.st_size}:{st.st_mtime_ns}:{st.st_ino}".encode())
    return digest.hexdigest()[:12]


def engine_name(*, adapter_id: int, owner_tenant_id: int | None, fingerprint: str) -> str:
    """The ``lora_name`` the engine holds one artifact version of one adapter under: never its public name, so a
    name freed by a delete or rename and registered again is a new engine name (loaded from its own artifact)."""
    owner = "shared" if owner_tenant_id is None else f"t{int(owner_tenant_id)}"
    return f"lora-{owner}-{int(adapter_id)}-{fingerprint}"


def engine_name_owner(name: str) -> tuple[bool, int | None]:
    """(whether ``name`` is an engine name at all, the tenant owning it or None for a shared one). Adapters an
    engine holds under other names (loaded by hand, or before engine names) are no one's."""
    found = ENGINE_NAME.match(name)
    if found is None:
        return False, None
    return True, int(found["tenant"]) if found["tenant"] else None


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
