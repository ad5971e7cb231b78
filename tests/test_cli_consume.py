"""``kvlog consume``: a consumer group's records from its committed offsets, committed as printed."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

import kvlog
from kvlog.cli import main
from kvlog.cli.encoding import unescape_tsv

KVLOG = str(Path(sys.executable).with_name("kvlog"))
QUIET = {"background_compaction": False, "flush_interval_ms": 0, "partitions": 2}


def call(capsys: pytest.CaptureFixture[bytes], *args: str) -> tuple[int, bytes, str]:
    capsys.readouterr()
    try:
        code = main(list(args))
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err.decode("utf-8", errors="backslashreplace")


@pytest.fixture
def store_path(tmp_path: Path) -> str:
    path = str(tmp_path / "store")
    with kvlog.open(path, **QUIET) as store:
        store.put(b"a", b"1")
        store.put(b"tab\tkey", b"\x80\x00")
        store.delete(b"a")
    return path


def test_consume_prints_past_the_committed_offsets_and_commits(
        capsysbinary: pytest.CaptureFixture[bytes], store_path: str) -> None:
    code, out, err = call(capsysbinary, "consume", store_path, "g")
    assert code == 0, err
    rows = [line.split(b"\t") for line in out.splitlines()]
    with kvlog.open(store_path, read_only=True) as store:
        expected = list(store.changes())
    assert [(int(r[0]), int(r[1]), int(r[2])) for r in rows] == [
        (e.partition, e.offset, e.timestamp_ms) for e in expected]
    assert [(unescape_tsv(r[3].decode()), None if r[4] == b"\\N" else unescape_tsv(r[4].decode()))
            for r in rows] == [(e.key, e.value) for e in expected]
    # The second run prints nothing: the offsets were committed in the store.
    assert call(capsysbinary, "consume", store_path, "g")[:2] == (0, b"")
    with kvlog.open(store_path, **QUIET) as store:
        store.put(b"b", b"2")
    code, out, _err = call(capsysbinary, "consume", store_path, "g", "--format", "json")
    assert code == 0
    (obj,) = [json.loads(line) for line in out.splitlines()]
    assert (obj["key"], obj["value"]) == ("b", "2")


def test_json_and_hex_output_say_which_value_is_a_tombstone(
        capsysbinary: pytest.CaptureFixture[bytes], store_path: str) -> None:
    code, out, _err = call(capsysbinary, "consume", store_path, "g", "--format", "json", "--no-commit")
    assert code == 0
    objs = [json.loads(line) for line in out.splitlines()]
    by_key = {o.get("key", o.get("key_hex")): o for o in objs}
    assert by_key["tab\tkey"]["value_hex"] == "8000"
    assert [o["value"] for o in objs if o.get("key") == "a"] == ["1", None]
    code, out, _err = call(capsysbinary, "consume", store_path, "g", "--hex", "--no-commit")
    assert {tuple(line.split(b"\t")[3:]) for line in out.splitlines()} == {
        (b"61", b"31"), (b"61", b"\\N"), (b"tab\tkey".hex().encode(), b"8000")}
    # --no-commit committed nothing: the group still starts at the beginning.
    with kvlog.open(store_path, read_only=True) as store, store.consumer("g") as consumer:
        assert all(consumer.committed(p) is None for p in range(2))


@pytest.mark.parametrize("args, code, expected", [
    (("--max-records", "0"), 2, "--max-records must be positive"),
    (("--partition", "7"), 2, "--partition 7 is not in [0, 2)"),
])
def test_bad_arguments_are_one_line_and_commit_nothing(
        capsysbinary: pytest.CaptureFixture[bytes], store_path: str,
        args: tuple[str, ...], code: int, expected: str) -> None:
    got, out, err = call(capsysbinary, "consume", store_path, "g", *args)
    assert (got, out) == (code, b"") and expected in err and len(err.splitlines()) == 1, err
    with kvlog.open(store_path, read_only=True) as store, store.consumer("g") as consumer:
        assert all(consumer.committed(p) is None for p in range(2))


def test_a_missing_store_is_one_line(capsysbinary: pytest.CaptureFixture[bytes], tmp_path: Path) -> None:
    got, out, err = call(capsysbinary, "consume", str(tmp_path / "none"), "g")
    assert (got, out) == (1, b"") and "StoreNotFoundError" in err
    assert not (tmp_path / "none").exists()


def test_follow_prints_another_processes_writes_as_they_land(store_path: str) -> None:
    proc = subprocess.Popen([KVLOG, "consume", store_path, "g", "--follow", "--set", "follow_interval_ms=20"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        seen = [proc.stdout.readline() for _ in range(3)]  # what the log held
        assert all(line.endswith(b"\n") for line in seen)
        started = time.monotonic()
        subprocess.run([KVLOG, "put", store_path, "late", "v"], check=True, timeout=120)
        line = proc.stdout.readline()
        assert line.split(b"\t")[3:] == [b"late", b"v\n"]
        assert time.monotonic() - started < 60
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    # Every printed poll was committed before the process was stopped.
    with kvlog.open(store_path, read_only=True) as store, store.consumer("g") as consumer:
        assert consumer.poll(timeout_s=0) == []
