"""Damaged commits, checkpoints and data files are refused with a CorruptDataError naming the object."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import kvlog
from kvlog.check import check_store
from kvlog.errors import CorruptDataError, InvalidRecordError, KvlogError
from kvlog.format.commit import Commit, decode_commit, encode_commit
from kvlog.format.envelope import decode_document, encode_document
from kvlog.log import Log
from kvlog.log.naming import checkpoint_name, commit_name
from kvlog.log.records import partition_for_key
from kvlog.meta import LiveBatch
from kvlog.storage import LocalStorage
from tests.commits import publish

PARTS = 4


def _key(partition: int, n: int) -> bytes:
    found = [f"key-{i}".encode() for i in range(1000) if partition_for_key(f"key-{i}".encode(), PARTS) == partition]
    return found[n]


def _build(make_log: Any, root: Path, cache: Path, **settings: Any) -> Log:
    """A log with commits 1 (producer) .. 4 (appends to partitions 0, 1, 0)."""
    the_log = make_log(root, cache, **settings)
    producer = the_log.producer(5)
    producer.append(0, [(_key(0, 0), b"a" * 2000), (_key(0, 1), b"b")], base_sequence=0)
    producer.append(1, [(_key(1, 0), b"c")], base_sequence=0)
    producer.append(0, [(_key(0, 2), b"d")], base_sequence=2)
    assert the_log.version == 4
    return the_log


def _flip(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0x01
    path.write_bytes(bytes(data))


def _body_start(data: bytes) -> int:
    return data.index(b"\n") + 1


def _body_end(data: bytes) -> int:
    """Where the body line ends: the end of the object, or where its attached bytes start."""
    return data.index(b"\n", _body_start(data)) + 1


@pytest.mark.parametrize("where", ["header", "body", "last-body-byte", "final-newline", "truncated", "padded"])
def test_a_corrupted_commit_is_refused_naming_it(
    tmp_path: Path, make_log: Any, where: str
) -> None:
    root = tmp_path / "root"
    _build(make_log, root, tmp_path / "cache").close()
    name = commit_name(3)
    path = root / name
    data = path.read_bytes()
    body, end = _body_start(data), _body_end(data)
    if where == "header":
        _flip(path, 3)
    elif where == "body":
        _flip(path, body + (end - body) // 2)
    elif where == "last-body-byte":
        _flip(path, end - 2)
    elif where == "final-newline":
        _flip(path, end - 1)
    elif where == "truncated":
        path.write_bytes(data[: len(data) - 10])
    else:
        path.write_bytes(data + b" ")
    with pytest.raises(CorruptDataError) as info:
        make_log(root, tmp_path / "fresh-cache")
    assert info.value.name == name
    assert name in str(info.value)
    # A cache that already applied it does not read it again; one behind it stops right there.
    same = make_log(root, tmp_path / "cache")
    assert same.version == 4
    with pytest.raises(CorruptDataError) as again:
        make_log(root, tmp_path / "fresh-cache-2")
    assert again.value.name == name


def test_a_commit_of_an_unknown_format_version_is_refused(tmp_path: Path, make_log: Any) -> None:
    root = tmp_path / "root"
    _build(make_log, root, tmp_path / "cache").close()
    path = root / commit_name(2)
    data = path.read_bytes()
    header = json.loads(data[: data.index(b"\n")])
    header["format"] = 99
    path.write_bytes(json.dumps(header, separators=(",", ":")).encode() + data[data.index(b"\n"):])
    with pytest.raises(CorruptDataError, match="version") as info:
        make_log(root, tmp_path / "fresh-cache")
    assert info.value.name == commit_name(2)


def test_a_commit_under_the_wrong_version_name_is_refused(tmp_path: Path, make_log: Any) -> None:
    root = tmp_path / "root"
    _build(make_log, root, tmp_path / "cache").close()
    (root / commit_name(3)).write_bytes((root / commit_name(2)).read_bytes())
    with pytest.raises(CorruptDataError) as info:
        make_log(root, tmp_path / "fresh-cache")
    assert info.value.name == commit_name(3)


def test_a_corrupted_checkpoint_is_refused_naming_it(tmp_path: Path, make_log: Any) -> None:
    root = tmp_path / "root"
    _build(make_log, root, tmp_path / "cache", checkpoint_interval=3).close()
    name = checkpoint_name(3)
    path = root / name
    data = path.read_bytes()
    _flip(path, _body_start(data) + 10)
    # While the commits it sums up remain, a damaged checkpoint only costs replay time...
    replayed = make_log(root, tmp_path / "replaying-cache", checkpoint_interval=3)
    assert replayed.version >= 3
    # ... once commit GC has taken them, it is refused, naming it.
    for version in (1, 2):
        (root / commit_name(version)).unlink()
    with pytest.raises(CorruptDataError) as info:
        make_log(root, tmp_path / "fresh-cache", checkpoint_interval=3)
    assert info.value.name == name


def _batch_of(the_log: Log, partition: int) -> LiveBatch:
    batch: LiveBatch = the_log.snapshot(lambda r: next(iter(r.iter_batches(partition, 0))))
    return batch


@pytest.mark.parametrize(("offset_in_batch", "inline_bytes"), [
    *(pytest.param(where, 0, id=where) for where in ("first", "middle", "last")),
    *(pytest.param(where, 65536, id=f"{where}-inline file") for where in ("first", "middle", "last")),
])
def test_a_corrupted_data_batch_is_refused_when_read(
    tmp_path: Path, make_log: Any, offset_in_batch: str, inline_bytes: int
) -> None:
    root = tmp_path / "root"
    the_log = _build(make_log, root, tmp_path / "cache", commit_inline_bytes=inline_bytes)
    batch = _batch_of(the_log, 0)
    assert batch.path.startswith("log/" if inline_bytes else "data/")
    the_log.close()
    position = {"first": batch.position, "middle": batch.position + batch.length // 2,
                "last": batch.position + batch.length - 1}[offset_in_batch]
    _flip(root / batch.path, position)

    reader = make_log(root, tmp_path / "cache")  # the cache is fine; the data is not
    with pytest.raises(CorruptDataError) as info:
        list(reader.read(0))
    assert info.value.name == batch.path and batch.path in str(info.value)
    assert [r.value for r in reader.read(1)] == [b"c"]  # other files are unaffected
    assert any(batch.path in finding for finding in check_store(reader, deep=True))
    # A fresh cache replays the commit, reads the batch to index it, and refuses it.
    with pytest.raises(CorruptDataError) as fresh:
        make_log(root, tmp_path / "fresh-cache")
    assert fresh.value.name == batch.path


def test_a_truncated_or_missing_data_file_is_refused(tmp_path: Path, make_log: Any) -> None:
    root = tmp_path / "root"
    # Data files of their own: the test truncates one and deletes another.
    the_log = _build(make_log, root, tmp_path / "cache", commit_inline_bytes=0)
    first, second = _batch_of(the_log, 0), _batch_of(the_log, 1)
    the_log.close()
    data = (root / first.path).read_bytes()
    (root / first.path).write_bytes(data[: first.position + first.length // 2])
    (root / second.path).unlink()
    reader = make_log(root, tmp_path / "cache")
    with pytest.raises(CorruptDataError) as truncated:
        list(reader.read(0))
    assert truncated.value.name == first.path
    with pytest.raises(CorruptDataError) as missing:
        list(reader.read(1))
    assert missing.value.name == second.path
    findings = check_store(reader)
    assert any(second.path in f and "missing" in f for f in findings)
    assert any(first.path in f for f in findings)


@pytest.mark.parametrize("damage", ["flipped", "truncated"])
def test_a_damaged_inline_file_is_refused_naming_its_commit(tmp_path: Path, make_log: Any, damage: str) -> None:
    """A small flush's records are attached to its commit: a flipped byte in them or a truncation
    of them is a CorruptDataError naming the commit, for a cache that indexed them and a fresh one."""
    root = tmp_path / "root"
    the_log = _build(make_log, root, tmp_path / "cache")
    batch, other = _batch_of(the_log, 1), _batch_of(the_log, 0)
    the_log.close()
    name = commit_name(3)
    assert batch.path == name and other.path != name  # partition 1's inline file is commit 3's
    path = root / name
    data = path.read_bytes()
    assert json.loads(data[: data.index(b"\n")])["format"] == 2
    if damage == "flipped":
        _flip(path, batch.position + batch.length // 2)
    else:
        path.write_bytes(data[: batch.position + batch.length // 2])

    reader = make_log(root, tmp_path / "cache")  # the cache is fine; the commit's records are not
    with pytest.raises(CorruptDataError) as info:
        list(reader.read(1))
    assert info.value.name == name and name in str(info.value)
    assert [r.value for r in reader.read(0)] == [b"a" * 2000, b"b", b"d"]  # other files are unaffected
    assert any(name in finding for finding in check_store(reader, deep=True))
    with pytest.raises(CorruptDataError) as fresh:
        make_log(root, tmp_path / "fresh-cache")
    assert fresh.value.name == name


def test_the_store_reports_a_corrupted_value_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "store"
    big = b"x" * 5000  # larger than inline_value_bytes: the value is read from the data file
    with kvlog.open(path, background_compaction=False) as store:
        store.put("big", big, sync=True)
        store.put("small", "s", sync=True)
        p = store.log.partition_for("big")
        batch = _batch_of(store.log, p)
    _flip(path / batch.path, batch.position + batch.length // 2)
    with kvlog.open(path, background_compaction=False) as store:
        assert store.get("small") == b"s"  # inlined in the index
        with pytest.raises(CorruptDataError) as info:
            store.get("big")
        assert info.value.name == batch.path
        assert isinstance(info.value, KvlogError)


@pytest.mark.parametrize("cleaner", [{"0": None}, {"0": [1]}, {"0": {"checkpoint": None}}],
                         ids=["null", "a list", "a null checkpoint"])
def test_a_replace_commit_with_a_malformed_cleaner_state_is_refused_naming_it(
    tmp_path: Path, make_log: Any, cleaner: dict[str, Any]
) -> None:
    """A ``replace`` commit whose cleaner state (in its info) is not the shape of one is corrupt
    data naming the commit, as every other malformed field of a commit is: never a raw error."""
    root = tmp_path / "root"
    the_log = _build(make_log, root, tmp_path / "cache")
    the_log.close()
    # Commit 5 replaces nothing and adds nothing: only its cleaner state is read when applied.
    name = commit_name(5)
    previous = decode_commit(commit_name(4), (root / commit_name(4)).read_bytes())
    commit = Commit(5, "c" * 32, previous.timestamp_ms, "replace", previous_id=previous.commit_id)
    with pytest.raises(InvalidRecordError, match="cleaner"):  # kvlog never writes one
        encode_commit(replace(commit, info={"cleaner": cleaner}))
    body = decode_document(name, encode_commit(commit), "commit")
    body["info"] = {"cleaner": cleaner}
    publish(LocalStorage(root, fsync=False), encode_document("commit", body))
    with pytest.raises(CorruptDataError) as info:
        make_log(root, tmp_path / "fresh-cache")
    assert info.value.name == name
