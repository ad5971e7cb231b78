"""A service that keeps a materialized view of a store: started from a snapshot, kept up to
date from the changelog, saved to disk with the offsets it is exactly as of, and resumed from
that file after a crash. It says when it has caught up.

Another *process* writes: puts and deletes over a few hundred keys, and compacts once midway.
The service never replays the whole changelog. At its first start it reads the store's state
from a snapshot and the offsets that state is as of (``snap.end_offsets()``); then it tails
the changelog from those offsets (``consumer.seek_all``), applying each record (a tombstone
deletes). Every few hundred records it writes the view and its consumer's positions to one
file, atomically (a rename): the view and its offsets never disagree, so after a crash it
resumes exactly, with nothing applied twice or missed. Halfway it "crashes" (it stops without
saving the records applied since the last save) and starts again from the file. It reports
its lag (``consumer.lag()``) as it goes and stops once the writer is done and
``consumer.caught_up()``. At the end the view equals the store.

Run it: ``python examples/materialized_view.py``.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import kvlog

WRITES = 3000
KEYS = 300
GROUP = "materialized-view"


def writer(path: str) -> None:
    """The other process: WRITES records over KEYS keys (every fifth a delete), compacting once."""
    rng = random.Random(11)
    with kvlog.open(path, flush_interval_ms=20) as store:
        for i in range(WRITES):
            key = f"item:{rng.randrange(KEYS):04d}"
            if i % 5 == 4:
                store.delete(key)
            else:
                store.put(key, f"price-{i}")
            if i == WRITES // 2:
                store.compact(force=True)  # the service's tail reads past what this removes
        store.flush()


def save(file: Path, view: dict[bytes, bytes], offsets: dict[int, int]) -> None:
    """The view and the offsets it is exactly as of, in one file replaced whole."""
    tmp = file.with_suffix(".tmp")
    tmp.write_text(json.dumps({"offsets": {str(p): o for p, o in offsets.items()},
                               "view": {k.decode("latin-1"): v.decode("latin-1") for k, v in view.items()}}))
    os.replace(tmp, file)


def load(file: Path) -> tuple[dict[bytes, bytes], dict[int, int]] | None:
    """The saved view and its offsets, if the service saved any."""
    if not file.exists():
        return None
    saved = json.loads(file.read_text())
    view = {k.encode("latin-1"): v.encode("latin-1") for k, v in saved["view"].items()}
    return view, {int(p): o for p, o in saved["offsets"].items()}


def serve(path: str, file: Path, writer_done: subprocess.Popen[bytes], *, crash_after: int | None) -> dict[bytes, bytes]:
    """Start from the saved view, else from a snapshot; tail until the writer is done and the
    view is caught up (or until ``crash_after`` records: then stop without saving)."""
    with kvlog.open(path, read_only=True) as store:
        saved = load(file)
        if saved is None:
            with store.snapshot() as snap:
                view, offsets = dict(snap.scan()), snap.end_offsets()
            print(f"started from a snapshot: {len(view)} keys as of offsets {offsets}")
        else:
            view, offsets = saved
            print(f"resumed from the saved view: {len(view)} keys as of offsets {offsets}")
        consumer = store.consumer(GROUP)
        consumer.seek_all(offsets)
        applied = 0
        while True:
            records = consumer.poll(timeout_s=0.2, max_records=200)
            for record in records:
                if record.value is None:
                    view.pop(record.key, None)
                else:
                    view[record.key] = record.value
            applied += len(records)
            if crash_after is not None and applied >= crash_after:
                print(f"crashed after {applied} records (the last ones unsaved)")
                return view
            if records:
                save(file, view, {p: consumer.position(p) for p in consumer.partitions})
                print(f"applied {applied}, lag {sum(consumer.lag().values())}")
            elif writer_done.poll() is not None and consumer.caught_up():
                save(file, view, {p: consumer.position(p) for p in consumer.partitions})
                print(f"caught up at offsets {store.end_offsets()}")
                return view


def main() -> None:
    if sys.argv[1:2] == ["writer"]:
        writer(sys.argv[2])
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "store")
        with kvlog.open(path) as store:  # created, with a few keys before the service starts
            for i in range(50):
                store.put(f"item:{i:04d}", "opening-price")
        file = Path(tmp) / "view.json"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                                        os.environ.get("PYTHONPATH")]))}
        process = subprocess.Popen([sys.executable, __file__, "writer", path], env=env)
        try:
            serve(path, file, process, crash_after=WRITES // 3)
            view = serve(path, file, process, crash_after=None)  # the restarted service
        finally:
            process.wait(timeout=300)
        if process.returncode != 0:
            raise SystemExit(f"the writer process exited with {process.returncode}")
        with kvlog.open(path, read_only=True) as store:
            expected = dict(store.scan())
        assert view == expected, "the view differs from the store"
        print(f"{len(view)} keys in the view")
        print("the view equals the store")


if __name__ == "__main__":
    main()
