"""``kvlog consume``: a consumer group's records from its committed offsets, committed as printed."""

from __future__ import annotations

import json
import os
import random
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import kvlog
from kvlog.cli import main
from kvlog.cli.encoding import unescape_tsv

KVLOG = str(Path(sys.executable).with_name("kvlog"))
QUIET: dict[str, Any] = {"background_compaction": False, "flush_interval_ms": 0, "partitions": 2}


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
    (("--from", "newest"), 2, "'newest' is not earliest, latest or an offset"),
    (("--from", "-1"), 2, "is not earliest, latest or an offset"),
    (("--from", str(2**63)), 2, "is not earliest, latest or an offset"),
    (("--from", "１"), 2, "is not earliest, latest or an offset"),
])
def test_bad_arguments_are_one_line_and_commit_nothing(
        capsysbinary: pytest.CaptureFixture[bytes], store_path: str,
        args: tuple[str, ...], code: int, expected: str) -> None:
    got, out, err = call(capsysbinary, "consume", store_path, "g", *args)
    assert (got, out) == (code, b"") and expected in err and len(err.splitlines()) == 1, err
    with kvlog.open(store_path, read_only=True) as store, store.consumer("g") as consumer:
        assert all(consumer.committed(p) is None for p in range(2))


def test_from_starts_every_partition_where_it_says_instead_of_the_committed_offsets(
        capsysbinary: pytest.CaptureFixture[bytes], tmp_path: Path) -> None:
    path = str(tmp_path / "store")
    with kvlog.open(path, **QUIET) as store:
        for i in range(10):
            store.put(f"k{i}".encode(), b"v")
        store.flush()
        records = list(store.changes())

    def printed(*args: str) -> list[tuple[int, int]]:
        code, out, err = call(capsysbinary, "consume", path, *args)
        assert code == 0, err
        return [(int(r[0]), int(r[1])) for r in (line.split(b"\t") for line in out.splitlines())]

    everything = [(r.partition, r.offset) for r in records]
    assert printed("g", "--from", "latest") == []
    assert printed("g", "--from", "3") == [po for po in everything if po[1] >= 3]
    assert printed("g") == []  # what --from 3 printed was committed, and the rest is below it
    assert printed("g", "--from", "earliest") == everything
    assert printed("other", "--from", "latest", "--no-commit") == []
    assert printed("other") == everything  # --no-commit with --from committed nothing


def test_a_missing_store_is_one_line(capsysbinary: pytest.CaptureFixture[bytes], tmp_path: Path) -> None:
    got, out, err = call(capsysbinary, "consume", str(tmp_path / "none"), "g")
    assert (got, out, err) == (3, b"", f"kvlog: no kvlog store at {str(tmp_path / 'none')!r}\n")
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


# -- stopping ``consume --follow``: at least once, in processes of their own ---------------------------

ROOT = Path(__file__).resolve().parents[1]
#: The command line run as ``python -c``, with this checkout first on the path.
CLI = [sys.executable, "-c", "import sys; from kvlog.cli import main; sys.exit(main())"]
#: The environment of a command: this checkout first on the path, and stdout buffered as a
#: user's is (``PYTHONUNBUFFERED`` would hide output a command leaves in its buffer).
ENV = {**{k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"},
       "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
WAIT_S = 120

#: A writer that keeps appending numbered records, in bursts of five with a pause after each,
#: until it is stopped (a producer of its own). The pauses leave ``consume`` waiting with what
#: it printed last, where a stop finds it most of the time.
WRITER = """
import sys, time, kvlog
with kvlog.open(sys.argv[1], producer_id=7, background_compaction=False, flush_interval_ms=0) as store:
    i = 0
    while True:
        store.put(b"n%08d" % i, b"v%d" % i, sync=True)
        i += 1
        if i % 5 == 0:
            time.sleep(0.1)
"""


def lines_of(path: Path) -> list[tuple[int, int, bytes]]:
    """(partition, offset, key) of each complete line ``consume`` wrote to ``path`` (a line
    cut by SIGKILL is left out: its record was not committed, so the next run prints it)."""
    data = path.read_bytes()
    complete = data[:data.rfind(b"\n") + 1]
    out = []
    for line in complete.splitlines():
        fields = line.split(b"\t")
        out.append((int(fields[0]), int(fields[1]), fields[3]))
    return out


def committed_offsets(path: str) -> dict[int, int]:
    """The group ``g``'s committed offsets (partitions without one are left out)."""
    with kvlog.open(path, read_only=True) as store, store.consumer("g") as consumer:
        return {p: c for p in range(2) if (c := consumer.committed(p)) is not None}


def wait_for_a_line(path: Path, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + WAIT_S
    while b"\n" not in path.read_bytes():
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else proc.returncode
        assert time.monotonic() < deadline, "consume printed nothing"
        time.sleep(0.02)


def stop_at_random_moments(tmp_path: Path, signum: int, rounds: int, seed: int) -> None:
    """Run ``consume --follow`` to a file while a writer appends, stop it with ``signum`` at a
    random moment, restart it, ``rounds`` times; then check what was printed and committed.

    Each run must start at the offsets the previous one committed, print every record from
    there without a gap, and commit none it did not print: so the runs together print every
    record, and a record prints twice only when a SIGKILL fell between a print and its commit.
    SIGTERM and SIGINT commit exactly what was printed and exit 143 and 130.
    """
    rng = random.Random(seed)
    path = str(tmp_path / "store")
    with kvlog.open(path, **QUIET):
        pass
    writer = subprocess.Popen([sys.executable, "-c", WRITER, path], env=ENV, stderr=subprocess.PIPE)
    printed: list[tuple[int, int, bytes]] = []
    committed: dict[int, int] = {}
    try:
        for run in range(rounds):
            out = tmp_path / f"run{run}.tsv"
            with open(out, "wb") as sink:
                proc = subprocess.Popen([*CLI, "consume", path, "g", "--follow", "--max-records", "7",
                                         "--set", "follow_interval_ms=10"],
                                        env=ENV, stdout=sink, stderr=subprocess.PIPE)
            try:
                wait_for_a_line(out, proc)
                time.sleep(rng.uniform(0.0, 0.4))
                proc.send_signal(signum)
                _out, err = proc.communicate(timeout=WAIT_S)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            rows = lines_of(out)
            if signum == signal.SIGKILL:
                assert proc.returncode == -signal.SIGKILL
            else:
                assert proc.returncode == 128 + signum, err
                word = "interrupted" if signum == signal.SIGINT else "terminated"
                assert err.decode() == f"kvlog: {word}\n"
                assert out.read_bytes().endswith(b"\n")  # stopped at a record boundary
            now = committed_offsets(path)
            for p in range(2):
                offsets = [o for q, o, _k in rows if q == p]
                start = committed.get(p, 0)
                # From the committed offset on, in order, no gap, nothing twice.
                assert offsets == list(range(start, start + len(offsets))), (run, p, offsets[:5], start)
                end = start + len(offsets)
                assert start <= now.get(p, 0) <= end, (run, p, now, start, end)  # never past a print
                if signum != signal.SIGKILL:
                    assert now.get(p, 0) == end, (run, p)  # everything printed was committed
            committed = now
            printed.extend(rows)
    finally:
        writer.kill()
        writer.wait()
    # What the last run left is printed by one more run without --follow.
    last = subprocess.run([*CLI, "consume", path, "g"], env=ENV, capture_output=True, timeout=WAIT_S, check=True)
    printed.extend((int(f[0]), int(f[1]), f[3]) for f in (line.split(b"\t") for line in last.stdout.splitlines()))
    with kvlog.open(path, read_only=True) as store:
        expected = {(r.partition, r.offset, r.key) for r in store.changes()}
    assert set(printed) == expected
    assert len(expected) > rounds


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL],
                         ids=["SIGTERM", "SIGINT", "SIGKILL"])
def test_a_stopped_follow_prints_every_record_it_commits(tmp_path: Path, signum: int) -> None:
    stop_at_random_moments(tmp_path, signum, rounds=2, seed=signum)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL],
                         ids=["SIGTERM", "SIGINT", "SIGKILL"])
def test_a_follow_stopped_many_times_prints_every_record(tmp_path: Path, signum: int) -> None:
    stop_at_random_moments(tmp_path, signum, rounds=6, seed=1000 * signum)


def test_a_closed_pipe_ends_follow_quietly_and_commits_only_what_was_written(store_path: str) -> None:
    """The reader of ``consume --follow`` takes three lines and closes the pipe (``| head -n 3``):
    the next records written meet the closed pipe, and the command exits 141 with nothing on
    stderr, having committed the three records the reader got and none of the later ones."""
    proc = subprocess.Popen([*CLI, "consume", store_path, "g", "--follow", "--set", "follow_interval_ms=10"],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        got = b""
        deadline = time.monotonic() + WAIT_S
        while got.count(b"\n") < 3:  # each line as soon as it is printed, not at exit
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            assert time.monotonic() < deadline, f"three lines were not printed: {got!r}"
            if ready:
                chunk = os.read(proc.stdout.fileno(), 65536)
                assert chunk, proc.stderr.read() if proc.stderr else b""
                got += chunk
        proc.stdout.close()
        with kvlog.open(store_path, producer_id=7, **QUIET) as store:
            for i in range(5):
                store.put(f"later{i}".encode(), b"v", sync=True)
        _out, err = proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (proc.returncode, err) == (141, b"")
    rows = [line.split(b"\t") for line in got.splitlines()]
    assert len(rows) == 3
    printed = [max((int(r[1]) + 1 for r in rows if int(r[0]) == p), default=0) for p in range(2)]
    committed = committed_offsets(store_path)
    assert [committed.get(p, 0) for p in range(2)] == printed
