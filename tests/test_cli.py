"""The ``kvlog`` command line run as a real command: where writes may create a store, and errors.

Every failure must be one line on stderr with a non-zero exit code, never a
traceback, and a refused write must leave the directory exactly as it was.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import kvlog

KVLOG = str(Path(sys.executable).with_name("kvlog"))
TIMEOUT_S = 120

Arg = str | bytes


def run(*args: Arg, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``kvlog ARGS`` (bytes arguments go to the command line as they are)."""
    return subprocess.run([KVLOG, *args], capture_output=True, text=True, errors="backslashreplace",
                          timeout=TIMEOUT_S, cwd=cwd, check=False)


def one_line_failure(done: subprocess.CompletedProcess[str], code: int | None = None) -> str:
    """The single stderr line of a failed command (checked: non-zero exit, one line, no traceback)."""
    assert done.returncode != 0, (done.stdout, done.stderr)
    if code is not None:
        assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and done.stderr.endswith("\n"), done.stderr
    return lines[0]


def listing(root: Path) -> list[tuple[str, str, int]]:
    """Every entry under ``root`` (itself included) as (relative path, kind, size)."""
    out = []
    for path in [root, *sorted(root.rglob("*"))]:
        st = path.lstat()
        kind = "dir" if path.is_dir() else "file"
        out.append((str(path.relative_to(root)), kind, 0 if kind == "dir" else st.st_size))
    return out


@pytest.fixture
def foreign_dir(tmp_path: Path) -> Path:
    """A directory holding files of something else (like ``/etc``)."""
    root = tmp_path / "etc"
    (root / "sub").mkdir(parents=True)
    (root / "hosts").write_text("127.0.0.1 localhost\n")
    (root / "sub" / "conf").write_text("x = 1\n")
    return root


def test_put_refuses_a_directory_that_holds_other_files(foreign_dir: Path) -> None:
    before = listing(foreign_dir)
    for target in (str(foreign_dir), foreign_dir.as_uri(), str(foreign_dir / "sub")):
        line = one_line_failure(run("put", target, "k", "v"), 1)
        assert "not a kvlog store" in line and "--create" in line, line
    line = one_line_failure(run("put", str(foreign_dir / "hosts"), "k", "v"), 1)
    assert "not a directory" in line, line
    # delete never creates: it needs an existing store.
    line = one_line_failure(run("delete", str(foreign_dir), "k"), 1)
    assert "no kvlog store at" in line, line
    assert listing(foreign_dir) == before


def test_delete_on_a_missing_store_creates_nothing(tmp_path: Path) -> None:
    line = one_line_failure(run("delete", str(tmp_path / "missing"), "k"), 1)
    assert "no kvlog store at" in line, line
    assert not (tmp_path / "missing").exists()


def test_put_creates_a_store_in_a_missing_or_empty_directory(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    missing = tmp_path / "not" / "yet"
    for target in (empty, missing):
        done = run("put", str(target), "k", "v")
        assert done.returncode == 0 and done.stderr == "", done.stderr
        # Now a store: a second write (and a delete) go to it without --create.
        assert run("put", str(target), "k2", "v2").returncode == 0
        assert run("delete", str(target), "k2").returncode == 0
        with kvlog.open(str(target), read_only=True) as store:
            assert dict(store.scan()) == {b"k": b"v"}


def test_put_with_create_makes_a_store_in_a_directory_with_other_files(foreign_dir: Path) -> None:
    before = listing(foreign_dir)
    done = run("put", str(foreign_dir), "k", "v", "--create")
    assert done.returncode == 0, done.stderr
    assert (foreign_dir / "kvlog.json").is_file()
    assert set(before) <= set(listing(foreign_dir))  # the other files are left alone
    assert run("put", str(foreign_dir), "k", "w").returncode == 0  # an existing store needs no flag
    assert run("get", str(foreign_dir), "k").stdout == "w\n"


def test_put_with_create_on_object_storage(s3_root: tuple[str, dict[str, Any]]) -> None:
    """An object-store prefix is the store: written with or without ``--create``."""
    uri, options = s3_root
    as_json = json.dumps(options)
    assert run("put", uri, "a", "1", "--create", "--storage-options", as_json).returncode == 0
    assert run("put", uri, "b", "2", "--storage-options", as_json).returncode == 0
    done = run("scan", uri, "--storage-options", as_json)
    assert done.returncode == 0 and done.stdout == "a\t1\nb\t2\n", done.stderr


@pytest.mark.parametrize(("options", "expected"), [
    ("[1,2]", "must be a JSON object"),
    ('"text"', "must be a JSON object"),
    ("null", "must be a JSON object"),
    ("{bad", "not valid JSON"),
    ("", "not valid JSON"),
])
@pytest.mark.parametrize("command", ["put", "get", "compact"])
def test_bad_storage_options_are_one_line(tmp_path: Path, command: str, options: str, expected: str) -> None:
    args = {"put": ("k", "v"), "get": ("k",), "compact": ()}[command]
    line = one_line_failure(run(command, str(tmp_path / "s"), *args, "--storage-options", options), 2)
    assert "--storage-options" in line and expected in line, line
    assert list(tmp_path.iterdir()) == []


def test_usage_errors_are_one_line(tmp_path: Path) -> None:
    for args in (("put", str(tmp_path / "s"), "k"), ("no-such-command",), ()):
        line = one_line_failure(run(*args), 2)
        assert "error:" in line, line
    assert list(tmp_path.iterdir()) == []


def test_non_utf8_keys_and_values_are_bytes(tmp_path: Path) -> None:
    """Arguments that are not UTF-8 are taken as the bytes given: binary keys work end to end."""
    path = str(tmp_path / "s")
    assert run("put", path, b"\xff\xfe", b"\x80value").returncode == 0
    assert run("put", path, "caf\u00e9", "na\u00efve").returncode == 0
    with kvlog.open(path, read_only=True) as store:
        assert dict(store.scan()) == {b"\xff\xfe": b"\x80value", "caf\u00e9".encode(): "na\u00efve".encode()}
    got = run("get", path, b"\xff\xfe")
    assert (got.returncode, got.stdout) == (0, "\\x80value\n"), got.stderr
    scanned = run("scan", path, "--prefix", b"\xff")
    assert (scanned.returncode, scanned.stdout) == (0, "\\xff\\xfe\t\\x80value\n"), scanned.stderr
    assert run("scan", path, "--start", b"\x80", "--stop", b"\xff\xff").stdout == "\\xff\\xfe\t\\x80value\n"
    missing = one_line_failure(run("get", path, b"\xfe"), 1)
    assert missing == "kvlog: key not found: \\xfe"
    assert run("delete", path, b"\xff\xfe").returncode == 0
    with kvlog.open(path, read_only=True) as store:
        assert store.get(b"\xff\xfe") is None


def test_a_store_uri_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    target = os.fsencode(tmp_path) + b"/store-\xff"
    line = one_line_failure(run("put", target, "k", "v"), 2)
    assert "not valid UTF-8" in line, line
    line = one_line_failure(run("put", str(tmp_path / "s"), "k", "v", "--storage-options", b'{"a": "\xff"}'), 2)
    assert "not valid UTF-8" in line, line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args", [
    pytest.param(("demo", "--no-spark", "--records", "-5", "--path", "{tmp}/demo"), id="negative-records"),
])
def test_any_unexpected_error_is_one_line(tmp_path: Path, args: tuple[str, ...]) -> None:
    line = one_line_failure(run(*(a.format(tmp=tmp_path) for a in args)), 1)
    assert line.startswith("kvlog: error: "), line
    assert "storage-options" not in line, line


@pytest.mark.parametrize("args", [
    pytest.param((), id="bare"),
    pytest.param(("--quick", "--out", "{tmp}/out.json"), id="suite-options"),
    pytest.param(("--show", "{tmp}/missing.json", "--markdown"), id="show"),
    pytest.param(("--help",), id="help"),
])
def test_bench_names_where_the_suite_runs(tmp_path: Path, args: tuple[str, ...]) -> None:
    """The benchmark suite is not installed with kvlog: ``kvlog bench``, whatever follows it,
    prints one line naming ``make bench`` and ``python -m benchmarks``, exits 2, and runs
    nothing (no results file appears)."""
    done = run("bench", *(a.format(tmp=tmp_path) for a in args))
    line = one_line_failure(done, 2)
    assert done.stdout == ""
    assert line.startswith("kvlog: ") and "make bench" in line and "python -m benchmarks" in line, line
    assert list(tmp_path.iterdir()) == []


def test_help_lists_bench_as_a_pointer() -> None:
    """``kvlog --help`` describes ``bench`` as where the suite is, not as a runner."""
    done = run("--help")
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())  # argparse wraps help at the terminal's width
    assert " bench where the benchmark suite is (python -m benchmarks, in a checkout) " in text, done.stdout


def test_an_interrupt_is_one_line_and_exit_130(tmp_path: Path) -> None:
    """SIGINT while the command waits on a read: ``kvlog: interrupted`` and exit code 130.

    ``kvlog.json`` is a FIFO, so opening the store blocks reading it until a writer
    appears; the test opens the writer end (which succeeds only once the command has the
    FIFO open for reading) and never writes, so the command is surely blocked when
    interrupted.
    """
    root = tmp_path / "s"
    root.mkdir()
    fifo = root / "kvlog.json"
    os.mkfifo(fifo)
    proc = subprocess.Popen([KVLOG, "get", str(root), "k"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    writer = -1
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while writer < 0:
            try:
                writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as e:
                if e.errno != errno.ENXIO or time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.05)
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if writer >= 0:
            os.close(writer)
    assert (proc.returncode, stdout, stderr) == (130, "", "kvlog: interrupted\n")


def test_a_closed_output_pipe_is_no_traceback(tmp_path: Path) -> None:
    """``kvlog scan URI | head -1``: the reader goes away; the command stops quietly (exit 141)."""
    path = str(tmp_path / "s")
    with kvlog.open(path, background_compaction=False) as store:
        for i in range(20_000):
            store.put(b"key-%06d" % i, b"value-%06d" % i)
    proc = subprocess.Popen([KVLOG, "scan", path], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline() == b"key-000000\tvalue-000000\n"
    proc.stdout.close()
    stderr = proc.stderr.read()
    proc.wait(timeout=TIMEOUT_S)
    proc.stderr.close()
    assert (proc.returncode, stderr) == (141, b"")
