"""Read leases (``kvlog.log.leases``) against GC in another, real process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from store_support import EXPLICIT_FLUSH, Root, run_script

from kvlog.log import leases
from kvlog.meta import NamedPins

PAD = "x" * 1100


def _store(root: Root) -> list[str]:
    names = [f"k{i:03d}" for i in range(30)]
    # Data files of their own: GC deletes a replaced data file once no lease keeps it (an inline
    # file goes only with its commit, by the commit retention).
    with root.open(partitions=2, commit_inline_bytes=0, **EXPLICIT_FLUSH) as store:
        for n, key in enumerate(names):
            store.put(key, f"old-{key}|{PAD}")
            if n % 10 == 9:
                store.flush()
    return names


def _paths(r: Any) -> list[str]:
    return sorted(entry.path for _fid, entry in r.iter_files())


def _other_process_compacts_and_collects(root: Root, names: list[str]) -> dict[str, int]:
    """Another process overwrites every key, compacts and runs GC 60 s later by its clock."""
    return run_script("compact_gc_proc.py", root.spec("other", keys=names, settings=EXPLICIT_FLUSH),
                      timeout=120)


def test_a_lease_keeps_its_files_from_gc_in_another_process_until_released(local_root: Root) -> None:
    names = _store(local_root)
    with local_root.open(cache="reader", **EXPLICIT_FLUSH) as reader:
        lease, paths = leases.take(reader.log, 600_000, _paths)
        assert reader.checkpoints() == []  # a lease is no checkpoint
        _other_process_compacts_and_collects(local_root, names)
        reader.refresh()
        assert not set(paths) & set(reader.log.snapshot(_paths))  # every leased file was replaced
        assert all((Path(local_root.uri) / p).exists() for p in paths)
        leases.release(reader.log, lease.name)
        assert _other_process_compacts_and_collects(local_root, names)["replaced"] >= len(paths)
        assert not any((Path(local_root.uri) / p).exists() for p in paths)


def test_an_expired_lease_keeps_nothing_and_gc_drops_it(local_root: Root) -> None:
    names = _store(local_root)
    with local_root.open(cache="reader", **EXPLICIT_FLUSH) as reader:
        _lease, paths = leases.take(reader.log, 1000, _paths)  # expired at the other's GC (+60 s)
        assert _other_process_compacts_and_collects(local_root, names)["replaced"] >= len(paths)
        assert not any((Path(local_root.uri) / p).exists() for p in paths)
        reader.refresh()
        assert reader.log.snapshot(lambda r: list(NamedPins(r).every())) == []
