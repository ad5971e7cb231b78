"""Checkpoints written from the catalog's rows as stored: a checkpoint holds what decoding the
whole catalog gives, whether its rows were decoded afresh or remembered from the last
checkpoint by their exact stored bytes; a row another writer changed, a damaged row and a row
stored in another shape are decoded and checked afresh; outcomes are pruned by their version."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvlog
from kvlog.errors import CorruptDataError
from kvlog.format.envelope import decode_document, encode_document
from kvlog.format.producer_state import producer_to_json
from kvlog.log import Log, checkpoints
from kvlog.log.checkpoints import _checkpoint_body
from kvlog.log.naming import checkpoint_name
from kvlog.meta import CommitOutcome, GroupOffsets, LmdbEnv, MetaReader, MetaTxn, NamedPins, Refusal
from kvlog.meta.env import seal

SETTINGS: dict[str, Any] = {"partitions": 3, "background_compaction": False, "checkpoint_interval": 1000}


def decoded_body(r: MetaReader) -> dict[str, Any]:
    """A checkpoint's body (but its commit id) from the catalog decoded value by value."""
    files = dict(r.iter_files())
    batches = [b.to_json() for entry in files.values() for p, last in entry.batches
               if (b := r.find_batch(p, last)) is not None]
    return {
        "version": r.version(), "last_commit_ms": r.last_commit_ms(),
        "files": {fid: entry.to_json() for fid, entry in files.items()}, "batches": batches,
        "parts": {str(p): {"end": end} for p, end in r.iter_partitions()},
        "producers": [producer_to_json(s) for s in r.iter_producers()],
        "pending": dict(r.iter_pending()), "condemned": dict(r.iter_condemned()),
        "cleaner": {str(p): s.to_json() for p, s in r.iter_cleaner()},
        "offsets": [[g, p, o] for g, p, o in GroupOffsets(r).every()],
        "groups": {g: state.to_json() for g, state in GroupOffsets(r).states().items()},
        "holds_changed": GroupOffsets(r).holds_changed(),
        "pins": {pin.name: pin.to_json() for pin in NamedPins(r).every()},
    }


def written(the_log: Log, version: int) -> dict[str, Any]:
    name = checkpoint_name(version)
    body = decode_document(name, the_log.storage.read(name), "checkpoint")
    assert body.pop("commit_id") == the_log.snapshot(lambda r: r.applied_commit())[1]
    return body


def checkpoint_now(the_log: Log, *, forget: bool = False) -> dict[str, Any]:
    """Write a checkpoint at the applied version (a commit first if one is there already) and
    check it against the catalog decoded value by value."""
    if the_log.storage.exists(checkpoint_name(the_log.version)):
        the_log.producer().append(0, [(b"one-more", b"v")], base_sequence=0)
    if forget:
        the_log.checkpoint_rows = {}
    expected = the_log.snapshot(decoded_body)
    version = the_log.write_checkpoint()
    got = written(the_log, version)
    assert got == expected
    # The very bytes of the body encoded whole (sorted members, as the format says).
    commit_id = the_log.snapshot(lambda r: r.applied_commit())[1]
    assert the_log.storage.read(checkpoint_name(version)) == encode_document(
        "checkpoint", dict(expected, commit_id=commit_id))
    return got


def raw_write(env: LmdbEnv, table: str, key: bytes, value: bytes) -> None:
    """Put a row as another process would: not through this process's MetaTxn."""
    env.write(lambda txn: txn.put(key, value, db=env.dbs[table]))


def work(store: kvlog.Store, rounds: int) -> None:
    """Writes, overwrites, deletes and compactions: files of every level, batches with gaps
    (``present``), tombstones with a horizon, pending deletions, a named checkpoint."""
    for r in range(rounds):
        for half in range(2):
            for i in range(30):
                store.put(b"k%03d" % (i * 7 % 40), b"v%d-%d" % (r, i))
                if i % 5 == 0:
                    store.delete(b"k%03d" % ((i + r) % 40))
                if i % 6 == 0:
                    store.flush()
            store.flush()
            if half == 0:
                store.compact(force=True)
    store.checkpoint(f"named-{store.log.version}")


def test_checkpoints_hold_the_catalog_whether_rows_are_remembered_or_not(tmp_path: Path) -> None:
    with kvlog.open(tmp_path / "s", **SETTINGS) as store:
        the_log = store.log
        work(store, 2)
        cold = checkpoint_now(the_log)  # nothing remembered: every row decoded
        assert len(cold["files"]) >= 3 and any("present" in b for b in cold["batches"])
        assert any("horizon" in b for b in cold["batches"]) and cold["pending"] and cold["pins"]
        assert the_log.checkpoint_rows["files"] and the_log.checkpoint_rows["batches"]
        for _ in range(3):  # rows remembered, some changed, some new, some gone
            work(store, 1)
            checkpoint_now(the_log)
        checkpoint_now(the_log, forget=True)
        work(store, 1)
        # Remembered or decoded afresh, the same bytes.
        both = the_log.snapshot(lambda r: (_checkpoint_body(r, the_log.checkpoint_rows), _checkpoint_body(r, {})))
        assert both[0][:3] == both[1][:3]
        store.flush()
    # A fresh cache loads the newest checkpoint and sees the same store.
    with kvlog.open(tmp_path / "s", cache_dir=tmp_path / "fresh", **SETTINGS) as fresh, \
            kvlog.open(tmp_path / "s", **SETTINGS) as own:
        assert fresh.check() == [] and list(fresh.scan()) == list(own.scan())
        assert fresh.log.snapshot(decoded_body) == own.log.snapshot(decoded_body)


def test_a_row_changed_by_another_writer_is_decoded_afresh(tmp_path: Path) -> None:
    with kvlog.open(tmp_path / "s", **SETTINGS) as store:
        the_log = store.log
        work(store, 1)
        checkpoint_now(the_log)
        fid, entry = the_log.snapshot(lambda r: next(r.iter_files()))
        key = fid.encode()
        changed = dict(entry.to_json(), size=entry.size + 1)
        raw_write(the_log.env, "files", key, seal(key, json.dumps(changed, separators=(",", ":")).encode()))
        assert checkpoint_now(the_log)["files"][fid]["size"] == entry.size + 1
        # Stored in another shape (members in another order, spaces, an older file lacking
        # ``order``): the checkpoint holds the value it decodes to, encoded as documents are.
        older = {k: v for k, v in reversed(entry.to_json().items()) if k != "order"}
        raw_write(the_log.env, "files", key, seal(key, json.dumps(older, indent=1).encode()))
        got = checkpoint_now(the_log)["files"][fid]
        assert got["order"] == [entry.version, 0] and got["size"] == entry.size
        # Back to bytes seen before: the same value again.
        raw_write(the_log.env, "files", key, seal(key, json.dumps(changed, separators=(",", ":")).encode()))
        assert checkpoint_now(the_log)["files"][fid]["size"] == entry.size + 1


@pytest.mark.parametrize("table", ["files", "batches"])
def test_a_damaged_row_is_found_though_it_was_remembered(tmp_path: Path, table: str) -> None:
    with kvlog.open(tmp_path / "s", **SETTINGS) as store:
        the_log = store.log
        work(store, 1)
        checkpoint_now(the_log)
        key = next(iter(the_log.checkpoint_rows[table]))
        env = the_log.env

        def damage(txn: Any) -> None:
            value = bytearray(txn.get(key, db=env.dbs[table]))
            value[-2] ^= 0x04
            txn.put(key, bytes(value), db=env.dbs[table])

        env.write(damage)
        store.put(b"after", b"damage", sync=True)
        with pytest.raises(CorruptDataError):
            the_log.write_checkpoint()


def outcome_row(commit_id: str, payload: bytes) -> tuple[bytes, bytes]:
    key = commit_id.encode()
    return key, seal(key, payload)


@settings(max_examples=40, deadline=None)
@given(versions=st.lists(st.integers(0, 2**63 - 1), min_size=1, max_size=12),
       below=st.integers(0, 2**63), refused=st.booleans())
def test_outcomes_are_pruned_by_their_version(tmp_path_factory: pytest.TempPathFactory,
                                              versions: list[int], below: int, refused: bool) -> None:
    with kvlog.open(tmp_path_factory.mktemp("s") / "s", **SETTINGS) as store:
        env = store.log.env
        refusal = Refusal("ProducerFencedError", 'a "quoted", message') if refused else None
        ids = [f"c{i}" for i in range(len(versions))]
        env.write(lambda txn: [MetaTxn(env, txn).put_outcome(c, CommitOutcome(v, refusal))
                               for c, v in zip(ids, versions, strict=True)])
        # Outcomes stored in other shapes are read whole.
        odd = {"odd-order": (b'{"error":null,"version":%d,"results":[]}', 5),
               "spaced": (b'{"version": %d, "error": null, "results": []}', 6),
               "alone": (b'{"version":%d}', 7), "huge": (b'{"version":%d,"error":null}', 10**30)}
        for commit_id, (template, version) in odd.items():
            raw_write(env, "outcomes", *outcome_row(commit_id, template % version))
        env.write(lambda txn: MetaTxn(env, txn).prune_outcomes(below))
        left = store.log.snapshot(lambda r: {c for c in [*ids, *odd] if r.get_outcome(c) is not None})
        expected = {c for c, v in zip(ids, versions, strict=True) if v >= below}
        assert left == expected | {c for c, (_t, v) in odd.items() if v >= below}


@pytest.mark.parametrize("payload", [b'{"version":01,"error":null}', b'{"version":7', b"[1,2]",
                                     b'{"version":{},"error":null}', b"not json"])
def test_a_malformed_outcome_is_damage_when_pruning(tmp_path: Path, payload: bytes) -> None:
    with kvlog.open(tmp_path / "s", **SETTINGS) as store:
        env = store.log.env
        raw_write(env, "outcomes", *outcome_row("bad", payload))
        with pytest.raises(CorruptDataError):
            env.write(lambda txn: MetaTxn(env, txn).prune_outcomes(3))


def test_rows_beyond_the_remembered_ones_are_decoded_each_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checkpoints, "REMEMBER_ROWS", 2)
    with kvlog.open(tmp_path / "s", **SETTINGS) as store:
        the_log = store.log
        for _ in range(3):
            work(store, 1)
            checkpoint_now(the_log)
            assert len(the_log.snapshot(decoded_body)["files"]) > 2
            assert [len(rows) for rows in the_log.checkpoint_rows.values()] == [2, 2]
