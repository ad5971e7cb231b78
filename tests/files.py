"""Copying stores in tests without filling the disk.

A store's metadata cache is an LMDB data file the size of its map (1 GiB), sparse: only the
pages written take disk space. ``shutil.copytree`` writes the holes out, so a test copying a
store case by case would write a gigabyte per copy; :func:`copy_store` keeps them holes.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

__all__ = ["copy_store"]


def copy_store(source: Path, target: Path) -> Path:
    """Copy the directory ``source`` to ``target`` (which must not exist), sparse files kept
    sparse, modes and times kept."""
    if target.exists():
        raise FileExistsError(target)
    subprocess.run(["cp", "-a", "--sparse=always", str(source), str(target)], check=True)
    return target
