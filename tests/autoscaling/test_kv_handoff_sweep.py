"""The shared-storage KV hand-off folders are cleaned: what no decode replica consumed is removed once older than the
TTL, fresh entries and anything the connector does not write stay, and the sweep never leaves its root
(capacity/autoscaling/actuators/kv_storage.py; docs/disaggregation.md, "Cleaning the hand-off folders")."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from capacity.autoscaling.actuators.base import kv_storage_dir
from capacity.autoscaling.actuators.kv_storage import KVStorageError, sweep_folder, sweep_root
from tests.factories import EndpointFactory
from workers.schedule import beat_schedule
from workers.tasks import kv_storage as task

TTL = 300.0


def prompt_folder(parent: Path, tag: str, *, age_s: float = 0.0, suffix: str = "", layers: int = 2) -> Path:
    """A prompt's folder as the connector leaves it (md5-named, one safetensors file per layer), stored ``age_s``
    seconds ago."""
    folder = parent / (hashlib.md5(tag.encode()).hexdigest() + suffix)
    folder.mkdir(parents=True)
    for i in range(layers):
        (folder / f"model.layers.{i}.self_attn.attn.safetensors").write_bytes(b"k" * 1000)
    stamp = time.time() - age_s
    os.utime(folder, (stamp, stamp))
    return folder


def test_a_sweep_removes_old_entries_and_keeps_fresh_ones(tmp_path):
    root = tmp_path / "kv"
    mine = root / "endpoint-7"
    old = prompt_folder(mine, "old", age_s=TTL + 5)
    fresh = prompt_folder(mine, "fresh", age_s=TTL - 60)
    result = sweep_folder(mine, root=root, ttl_s=TTL, now=time.time())
    assert not old.exists() and fresh.exists()
    assert (result.removed, result.kept, result.removed_bytes) == (1, 1, 2000)
    assert sorted(p.name for p in mine.iterdir()) == [fresh.name], "nothing renamed aside is left behind"
    # The same folder later, on the caller's clock: the fresh one has aged past the TTL
    later = sweep_folder(mine, root=root, ttl_s=TTL, now=time.time() + 61)
    assert (later.removed, later.kept) == (1, 0) and not fresh.exists()


def test_the_sweep_never_leaves_one_endpoints_folder(tmp_path):
    root = tmp_path / "kv"
    mine, theirs = root / "endpoint-1", root / "endpoint-2"
    prompt_folder(mine, "a", age_s=TTL * 2)
    kept = prompt_folder(theirs, "b", age_s=TTL * 2)
    outside = prompt_folder(tmp_path / "elsewhere", "c", age_s=TTL * 2)
    stray = mine / "operator-notes.txt"
    stray.write_text("not the connector's")
    os.utime(stray, (0, 0))
    (mine / hashlib.md5(b"link").hexdigest()).symlink_to(outside, target_is_directory=True)

    result = sweep_folder(mine, root=root, ttl_s=TTL, now=time.time())
    assert result.removed == 1 and kept.exists(), "another endpoint's folder is not touched"
    assert stray.exists() and outside.exists() and len(list(outside.iterdir())) == 2, "no stray file, no symlink"
    assert sorted(result.skipped) == sorted(["operator-notes.txt", hashlib.md5(b"link").hexdigest()])


@pytest.mark.parametrize(
    "path",
    [
        "elsewhere",  # outside the root
        "kv/endpoint-1/../../elsewhere",  # a way out through ..
        "kv",  # the root itself
        "kv/endpoint-1/nested",  # not straight under the root
        "kv/tenant-data",  # not an endpoint's folder
    ],
)
def test_a_path_outside_the_root_is_refused(tmp_path, path):
    root = tmp_path / "kv"
    prompt_folder(root / "endpoint-1", "x", age_s=TTL * 2)
    for target in (tmp_path / "elsewhere", root / "endpoint-1" / "nested", root / "tenant-data"):
        target.mkdir(parents=True, exist_ok=True)
    victim = prompt_folder(tmp_path / "elsewhere", "victim", age_s=TTL * 2)
    with pytest.raises(KVStorageError):
        sweep_folder(tmp_path / path, root=root, ttl_s=TTL, now=time.time())
    assert victim.exists()


def test_a_symlinked_endpoint_folder_is_refused(tmp_path):
    root = tmp_path / "kv"
    victim = prompt_folder(tmp_path / "elsewhere", "victim", age_s=TTL * 2)
    root.mkdir()
    (root / "endpoint-3").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(KVStorageError):
        sweep_folder(root / "endpoint-3", root=root, ttl_s=TTL, now=time.time())
    assert sweep_root(root, ttl_s=TTL, now=time.time()) == {} and victim.exists()


def test_a_folder_claimed_by_a_loading_engine_is_kept_while_fresh(tmp_path):
    """A claim renames the folder (its mtime is the writing's, old): the claim's own time counts, so the sweep does
    not delete a folder an engine is reading; a claim left by an engine killed mid-load goes after the TTL."""
    root = tmp_path / "kv"
    folder = prompt_folder(root / "endpoint-4", "claimed", age_s=TTL * 3)
    claimed = folder.with_name(folder.name + f".loading-{os.getpid()}-0123abcd")
    folder.rename(claimed)
    partial = prompt_folder(root / "endpoint-4", "partial", age_s=TTL * 3, suffix=".partial-12-89abcdef")
    result = sweep_folder(root / "endpoint-4", root=root, ttl_s=TTL, now=time.time())
    assert (result.kept, result.removed) == (2, 0) and claimed.exists() and partial.exists(), "claimed, written now"
    # Left by an engine killed mid-load or mid-write: removed once the TTL has passed since
    assert sweep_folder(root / "endpoint-4", root=root, ttl_s=TTL, now=time.time() + TTL + 1).removed == 2
    assert not any((root / "endpoint-4").iterdir())


@pytest.mark.django_db
def test_the_periodic_task_sweeps_every_endpoint_and_drops_a_deleted_ones_folder(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    settings.INFERCAP = {**settings.INFERCAP, "KV_HANDOFF_TTL_S": 120.0}
    live = EndpointFactory()
    old = prompt_folder(kv_storage_dir(live), "old", age_s=121)
    fresh = prompt_folder(kv_storage_dir(live), "fresh", age_s=60)
    gone = prompt_folder(tmp_path / "kv" / "endpoint-999999", "gone", age_s=121)
    assert beat_schedule()["kv-handoff-sweep"]["task"] == "kv_storage.sweep"

    report = task.sweep()
    assert not old.exists() and fresh.exists() and not gone.exists()
    assert not gone.parent.exists(), "the deleted endpoint's emptied folder is removed"
    assert kv_storage_dir(live).is_dir(), "a live endpoint keeps its folder"
    assert report[f"endpoint-{live.pk}"] == {"removed": 1, "kept": 1, "bytes": 2000}
