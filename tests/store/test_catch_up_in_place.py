"""A cache that fell behind commit GC catches up in place, beside its readers.

With a short ``commit_retention_ms``, another process's ``gc()`` collects the commits an idle
handle has not applied yet. That handle catches up from the newest checkpoint: built in a
cache beside its own and moved in with one LMDB transaction, so a reader of the same cache,
in this process or another, never sees an emptied key index, and a consumer resumes exactly
where it committed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

from store_support import EXPLICIT_FLUSH, PAD, Root, child_env, fill_old, replay_from, run_script

import kvlog
from kvlog.log.catch_up import ASIDE_PREFIX
from kvlog.log.naming import commit_name

#: Commits are collected below the newest checkpoint as soon as one is written. Data files of
#: their own: the other process's GC deletes the files the idle cache still names.
RETENTION_ZERO = {**EXPLICIT_FLUSH, "commit_retention_ms": 0, "checkpoint_interval": 10_000,
                  "commit_inline_bytes": 0}


def _fill(root: Root, keys: int, flushes: int) -> list[str]:
    return fill_old(root, keys, flushes, RETENTION_ZERO, width=4)


def _others_compact_checkpoint_and_collect(root: Root, keys: list[str]) -> None:
    """Another process overwrites ``keys``, compacts, checkpoints and collects (retention 0)."""
    counts = run_script("compact_gc_proc.py", root.spec("other", keys=keys, settings=RETENTION_ZERO,
                                                        metadata_checkpoint=True), timeout=120)
    assert counts["commits"] > 0 and counts["replaced"] > 0


def _fell_behind(root: Root, store: kvlog.Store) -> None:
    """``store``'s cache can no longer replay to the head: its head and next commit are gone."""
    head = store.log.version
    with root.open(cache="probe", read_only=True) as probe:
        assert not probe.log.storage.exists(commit_name(head))
        assert not probe.log.storage.exists(commit_name(head + 1))


def test_a_consumer_idle_past_commit_gc_resumes_where_it_committed(root: Root) -> None:
    names = _fill(root, 40, 4)
    with root.open(cache="consumer", **RETENTION_ZERO) as store:
        consumer = store.consumer("g")
        assert len(consumer.poll(timeout_s=0, max_records=7)) == 7
        consumer.commit()
        committed = {p: consumer.position(p) for p in consumer.partitions}
        _others_compact_checkpoint_and_collect(root, names[::3])
        _fell_behind(root, store)
        got = []
        while batch := consumer.poll(timeout_s=0):
            got.extend(batch)
        consumer.commit()
        assert store.check() == []
    expected = replay_from(root, committed)
    assert sorted((r.partition, r.offset, r.key, r.value) for r in got) == expected
    assert {r.key for r in got if r.value and r.value.startswith(b"new-")} == {k.encode() for k in names[::3]}


def test_a_caught_up_consumer_idle_past_commit_gc_is_woken_by_new_records(root: Root) -> None:
    """Nothing it reads is missing, so only the missing next commit tells it is behind: it must
    not wait for ever on a commit name GC already freed."""
    names = _fill(root, 40, 4)
    with root.open(cache="consumer", **RETENTION_ZERO) as store:
        consumer = store.consumer("g")
        while consumer.poll(timeout_s=0):
            pass
        consumer.commit()
        ends = {p: consumer.position(p) for p in consumer.partitions}
        _others_compact_checkpoint_and_collect(root, names[:5])
        _fell_behind(root, store)
        got = []
        while len(got) < 5:
            batch = consumer.poll(timeout_s=10)
            assert batch, "the consumer never saw the records written after GC collected its next commit"
            got.extend(batch)
    assert sorted((r.partition, r.offset, r.key, r.value) for r in got) == replay_from(root, ends)


def test_reads_of_a_shared_cache_never_miss_a_key_while_it_catches_up(local_root: Root) -> None:
    """One handle reads every key over and over while another handle of the same cache
    catches it up: every read answers the old value or the new one, never None."""
    names = _fill(local_root, 3000, 3)
    reader = local_root.open(cache="shared", read_only=True, clock=kvlog.ManualClock(), **RETENTION_ZERO)
    try:
        assert len(reader) == len(names)
        _others_compact_checkpoint_and_collect(local_root, names[::2])
        wrong: list[tuple[str, bytes | None]] = []
        stop = threading.Event()

        def read() -> None:
            while not stop.is_set():
                for key, value in zip(names[::7], reader.get_many(names[::7]), strict=True):
                    if value is None or not value.startswith((b"old-", b"new-")):
                        wrong.append((key, value))

        thread = threading.Thread(target=read)
        thread.start()
        try:
            # Opening the same cache, behind: it catches up from the checkpoint.
            with local_root.open(cache="shared", **RETENTION_ZERO) as writer:
                writer.put("after", "catch-up", sync=True)
        finally:
            stop.set()
            thread.join()
        assert wrong == []
        assert reader.get("k0000", b"").startswith(b"new-")  # the shared cache moved on
        assert reader.get("after") == b"catch-up"
    finally:
        reader.close()


def test_a_catch_up_killed_before_it_moved_in_leaves_the_cache_as_it_was(local_root: Root) -> None:
    names = _fill(local_root, 40, 4)
    cache = local_root.cache_dir("idle")
    assert cache is not None
    with local_root.open(cache="idle", **RETENTION_ZERO) as store:
        assert store.get(names[0]) is not None
        version = store.log.version
    _others_compact_checkpoint_and_collect(local_root, names[::3])
    # A process catching the cache up dies just before it moves the new cache in.
    script = (
        "import os, sys, kvlog, kvlog.log.catch_up as c\n"
        "c.transplant = lambda *a, **k: os._exit(9)\n"
        "kvlog.open(sys.argv[1], cache_dir=sys.argv[2])\n"
    )
    done = subprocess.run([sys.executable, "-c", script, local_root.uri, str(cache)], env=child_env(),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 9, done.stderr
    left = [p for p in cache.iterdir() if p.name.startswith(ASIDE_PREFIX)]
    assert len(left) == 1  # the cache it was building
    with local_root.open(cache="idle", read_only=True, **RETENTION_ZERO) as again:
        assert again.log.version > version
        assert not left[0].exists()  # its process is gone: removed by the next catch-up
        assert [again.get(k) for k in names] == [
            f"{'new' if i % 3 == 0 else 'old'}-{k}|".encode() + (b"y" * 600 if i % 3 == 0 else PAD.encode())
            for i, k in enumerate(names)]
        assert again.check() == []


def test_a_leftover_of_a_live_process_is_not_removed(local_root: Root) -> None:
    names = _fill(local_root, 40, 4)
    cache = local_root.cache_dir("idle")
    assert cache is not None
    with local_root.open(cache="idle", **RETENTION_ZERO):
        pass
    _others_compact_checkpoint_and_collect(local_root, names[::3])
    live = cache / f"{ASIDE_PREFIX}{os.getpid()}.0000"  # as a catch-up under way in this process
    live.mkdir()
    with local_root.open(cache="idle", **RETENTION_ZERO) as store:
        assert store.get(names[0], b"").startswith(b"new-")
    assert live.exists()
