"""What a killed server or stub leaves in /dev/shm is found and removed; live regions stay."""

from __future__ import annotations

import os
import time

from facefuse.serving.supervisor import (
    SHM_PREFIX,
    orphaned_shm_regions,
    remove_orphaned_shm_regions,
)


def test_only_regions_no_process_maps_or_holds_are_orphaned(tmp_path):
    shm, proc = tmp_path / "shm", tmp_path / "proc"
    shm.mkdir()
    mapped, held, orphan = (shm / f"{SHM_PREFIX}{name}" for name in ("a", "b", "c"))
    for path in (mapped, held, orphan):
        path.write_bytes(b"\0" * 16)
    (shm / "unrelated").write_bytes(b"x")
    server = proc / "41"
    (server / "fd").mkdir(parents=True)
    (server / "maps").write_text(f"7f00-7f10 rw-s 00000000 00:1a 9 /dev/shm/{mapped.name}\n")
    os.symlink(f"/dev/shm/{held.name}", server / "fd" / "5")
    (proc / "self-not-a-pid").mkdir()
    assert orphaned_shm_regions(shm, proc, min_age_s=0.0) == [orphan]
    assert orphaned_shm_regions(shm, proc, min_age_s=3600.0) == []  # too new to judge
    old = time.time() - 60
    os.utime(orphan, (old, old))
    assert remove_orphaned_shm_regions(shm_dir=shm, proc=proc, min_age_s=30.0) == 1
    assert not orphan.exists() and mapped.exists() and held.exists()
    assert (shm / "unrelated").exists()
