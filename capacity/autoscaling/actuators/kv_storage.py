"""The shared-storage KV hand-off folders, cleaned (docs/disaggregation.md, "Cleaning the hand-off folders").

A disaggregated endpoint's prefill replicas leave each prompt's KV under ``VAR_DIR/kv/endpoint-<id>/<md5>/``
(``base.kv_storage_dir``); its decode replicas consume what they load (the connector removes it), and what nobody
loads (a prefill whose decode fell back or was cancelled, a prompt a decode replica stored for itself) is removed
here once it is older than a TTL (``INFERCAP["KV_HANDOFF_TTL_S"]``), by the periodic task of
``workers.tasks.kv_storage``.

The sweep touches only the folders of one root, each an ``endpoint-<id>`` directory straight under it (a symlinked
one, or a path that resolves elsewhere, is refused), and in each only the entries the connector writes (an md5
folder, or one of its private ``.partial-``/``.loading-`` folders) and its own leftovers; it follows no symlink.
An entry is first renamed aside (atomic) and then deleted, so an engine that claims the same folder at that moment
(also by rename) finds it gone and recomputes the prompt, instead of reading a half-deleted folder.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings

ENDPOINT_DIR = re.compile(r"^endpoint-([0-9]+)$")
# A prompt's folder (md5 of its token ids, salt and hashes), a step's private folder being written, a folder claimed
# by a loading engine, or a sweep's own folder renamed aside.
_PROMPT = re.compile(r"^[0-9a-f]{32}$")
_PRIVATE = re.compile(r"^[0-9a-f]{32}\.(partial|loading)-[0-9]+-[0-9a-f]{8}$")
_SWEPT = re.compile(r"^[0-9a-f]{32}.*\.swept-[0-9a-f]{12}$")


class KVStorageError(ValueError):
    """A path the sweep refuses: not an endpoint's folder straight under the KV root."""


@dataclass
class SweepResult:
    removed: int = 0
    kept: int = 0
    removed_bytes: int = 0
    skipped: list[str] = field(default_factory=list)  # entries the sweep does not own (left alone)

    def add(self, other: SweepResult) -> None:
        self.removed += other.removed
        self.kept += other.kept
        self.removed_bytes += other.removed_bytes
        self.skipped += other.skipped


def kv_root() -> Path:
    """Where every endpoint's hand-off folder lies (``base.kv_storage_dir``'s parent)."""
    return Path(settings.VAR_DIR) / "kv"


def handoff_ttl_s() -> float:
    return float(settings.INFERCAP.get("KV_HANDOFF_TTL_S", 300.0))


def endpoint_folder(path: Path, *, root: Path) -> Path:
    """``path`` resolved, if it is an ``endpoint-<id>`` directory straight under ``root``; else KVStorageError."""
    path, root = Path(path), Path(root).resolve()
    if path.is_symlink():
        raise KVStorageError(f"{path} is a symlink: the sweep follows none")
    resolved = path.resolve()
    if resolved.parent != root or not ENDPOINT_DIR.match(resolved.name):
        raise KVStorageError(f"{path} is not an endpoint's folder under {root}")
    return resolved


def _age_s(entry: os.DirEntry, now: float) -> float:
    """Since the entry was stored. A private folder's age counts from its last rename too (``st_ctime``): a folder
    claimed by a loading engine keeps the mtime of its writing, and must not look old while it is read."""
    st = entry.stat(follow_symlinks=False)
    last = st.st_mtime if _PROMPT.match(entry.name) else max(st.st_mtime, st.st_ctime)
    return now - last


def _size(path: Path) -> int:
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                pass
    return total


def _remove(path: Path) -> int:
    """Rename aside, then delete; 0 bytes (and nothing done) when another claimed or removed it first."""
    aside = path.with_name(f"{path.name}.swept-{uuid.uuid4().hex[:12]}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return -1
    size = _size(aside)
    shutil.rmtree(aside, ignore_errors=True)
    return size


def sweep_folder(path: Path, *, root: Path, ttl_s: float, now: float) -> SweepResult:
    """Remove the entries of one endpoint's folder older than ``ttl_s`` at ``now`` (epoch seconds, the caller's
    clock); keep the fresh ones and leave anything the connector does not write."""
    folder = endpoint_folder(path, root=root)
    result = SweepResult()
    with os.scandir(folder) as entries:
        listed = list(entries)
    for entry in listed:
        owned = _PROMPT.match(entry.name) or _PRIVATE.match(entry.name) or _SWEPT.match(entry.name)
        if not owned or entry.is_symlink() or not entry.is_dir(follow_symlinks=False):
            result.skipped.append(entry.name)
            continue
        try:
            stale = _SWEPT.match(entry.name) or _age_s(entry, now) >= ttl_s
        except FileNotFoundError:  # consumed while we looked
            continue
        if not stale:
            result.kept += 1
            continue
        size = _remove(Path(entry.path))
        if size >= 0:
            result.removed += 1
            result.removed_bytes += size
    return result


def sweep_root(
    root: Path | None = None, *, ttl_s: float | None = None, now: float, live_endpoint_ids: set[int] | None = None
) -> dict[str, SweepResult]:
    """Sweep every endpoint's folder under ``root`` (``kv_root()``); the folder of an endpoint no longer in
    ``live_endpoint_ids`` (when given) is removed once the sweep has emptied it."""
    root = Path(root) if root is not None else kv_root()
    ttl_s = handoff_ttl_s() if ttl_s is None else ttl_s
    results: dict[str, SweepResult] = {}
    if not root.is_dir():
        return results
    for child in sorted(root.iterdir()):
        match = ENDPOINT_DIR.match(child.name)
        if not match or child.is_symlink() or not child.is_dir():
            continue
        results[child.name] = sweep_folder(child, root=root, ttl_s=ttl_s, now=now)
        if live_endpoint_ids is not None and int(match.group(1)) not in live_endpoint_ids:
            try:
                child.rmdir()  # only when empty
            except OSError:
                pass
    return results
