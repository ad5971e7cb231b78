"""The space figures' child process: one store loaded in a fresh process, its disk and memory.

``python -m benchmarks.peer_child --kind KIND --keys N --dir DIR`` loads N records (16-byte
keys, 100-byte values, generated 10,000 at a time) into a new store of ``KIND`` (kvlog, lmdb,
rocksdict) through its adapter's bulk path (:meth:`benchmarks.peers.Peer.load`: kvlog's puts,
flush and index merge; py-lmdb's one write transaction; rocksdict's puts and flush), then
prints one JSON object: the bytes its directory takes on disk right then and after
``close()``, and its peak ``RssAnon`` (sampled every 5 ms) against the baseline after the
store's module was imported. Only the measured store's module is imported.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from benchmarks.data import make_keys, make_values
from benchmarks.machine import read_status_kib
from benchmarks.rss import RssSampler

__all__ = ["main"]

_CHUNK = 10_000


def records(keys: int, seed: int) -> Iterator[tuple[bytes, bytes]]:
    for start in range(0, keys, _CHUNK):
        count = min(_CHUNK, keys - start)
        yield from zip(make_keys(start, count, seed), make_values(start, count, seed), strict=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peer_child", description=__doc__)
    parser.add_argument("--kind", required=True, choices=("kvlog", "lmdb", "rocksdict"))
    parser.add_argument("--keys", type=int, required=True)
    parser.add_argument("--dir", required=True, help="a new directory")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from benchmarks.peers import KvlogPeer, LmdbPeer, Peer, RocksdictPeer, disk_bytes

    path = Path(args.dir)
    peer: Peer
    if args.kind == "kvlog":
        import kvlog  # noqa: F401  (imported before the baseline, as the others' modules are)
    elif args.kind == "rocksdict":
        import rocksdict  # noqa: F401
    sampler = RssSampler()
    baseline = sampler.sample()
    sampler.start()
    t0 = time.perf_counter()
    if args.kind == "kvlog":
        peer = KvlogPeer(path)
    elif args.kind == "lmdb":
        peer = LmdbPeer(path, map_size=args.keys * 1024 + 64 * 1024 * 1024)
    else:
        peer = RocksdictPeer(path)
    peer.load(records(args.keys, args.seed))
    load_s = time.perf_counter() - t0
    loaded = disk_bytes(path)
    peak = sampler.mark()
    found = peer.get(make_keys(args.keys - 1, 1, args.seed)[0]) is not None
    peer.close()
    sampler.stop()
    result = {"kind": args.kind, "keys": args.keys, "load_s": load_s, "disk_bytes": loaded,
              "disk_bytes_closed": disk_bytes(path), "baseline_kib": baseline, "peak_kib": peak,
              "vm_hwm_kib": read_status_kib("VmHWM"), "samples": sampler.samples, "last_found": found}
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
