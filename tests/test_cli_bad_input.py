"""Input the command line refuses changes no file of the store, and is refused in one line.

Each command runs through :func:`kvlog.cli.main` (what the ``kvlog`` script runs) against a
store whose every file, the metadata cache's included, is hashed before and after. No file
is left out: a refused command opens nothing, so even LMDB's ``lock.mdb`` and the cache's
clean-close marker stay as they were. A few run as processes of their own too, for what
only a process shows (its exit status, a store directory left uncreated).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import kvlog
from kvlog.cli import main
from tests.files import content_digest

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-c", "import sys; from kvlog.cli import main; sys.exit(main())"]
#: The environment of a command: this checkout first on the path, and stdout buffered as a
#: user's is (``PYTHONUNBUFFERED`` would hide output a command leaves in its buffer).
ENV = {**{k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"},
       "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
TIMEOUT_S = 300

#: A placeholder for the store's directory in the commands below.
S = "{store}"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local store of 8 partitions with a few keys and a consumer group's offsets, closed."""
    path = tmp_path_factory.mktemp("bad-input") / "store"
    with kvlog.open(str(path), partitions=8, background_compaction=False, flush_interval_ms=0) as s:
        for i in range(20):
            s.put(f"k{i}".encode(), f"v{i}".encode())
        s.delete(b"k3")
        with s.consumer("g") as consumer:
            consumer.poll(timeout_s=0, max_records=5)
            consumer.commit()
    return path


def tree(root: Path) -> dict[str, str]:
    """Every directory and file under ``root``: a file's digest, a directory's marker."""
    out: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        out[str(path.relative_to(root))] = "dir" if path.is_dir() else content_digest(path)
    return out


LONG_KEY = "k" * 5000

#: (command line, a piece of the one line on stderr): each refused before the store changes.
BAD = [
    (["put", S, "", "v"], "a key may not be empty"),
    (["put", S, LONG_KEY, "v"], "larger than max_key_bytes=4096"),
    (["put", S, "k", "v" * 200, "--set", "max_key_bytes=10", "--set", "max_record_bytes=100"], "larger than max_record_bytes=100"),
    (["put", S, "kk", "v", "--set", "max_key_bytes=1"], "larger than max_key_bytes=1"),
    (["put", S, "k", "v", "--set", "max_key_bytes=0"], "max_key_bytes=0"),
    (["put", S, "--hex", "zz", "00"], "KEY is not hex"),
    (["put", S, "k", "v", "--set", "no_such_setting=1"], "unknown setting"),
    (["put", S, "k", "--value-file", "{store}/no-such-file"], "--value-file"),
    (["get", S, ""], "a key may not be empty"),
    (["get", S, "--hex", "xyz"], "KEY is not hex"),
    (["delete", S, ""], "a key may not be empty"),
    (["delete", S, "--key-file", "{store}/../big-key"], "larger than max_key_bytes=65535"),
    (["scan", S, "--hex", "--prefix", "zz"], "--prefix is not hex"),
    (["scan", S, "--set", "max_key_bytes=0"], "max_key_bytes=0"),
    (["stats", S, "--storage-options", '{"region": "x"}'], "do not apply to the local store"),
    (["stats", S, "--storage-options", "[1]"], "must be a JSON object"),
    (["check", S, "--set", "partitions=0"], "partitions=0"),
    (["compact", S, "--set", "max_key_bytes=0"], "max_key_bytes=0"),
    (["consume", S, ""], "a consumer group is a non-empty str"),
    (["consume", S, "g", "--partition", "9"], "--partition 9 is not in [0, 8)"),
    (["consume", S, "g", "--partition", "-1"], "--partition -1 is not in [0, 8)"),
    (["consume", S, "g", "--partition", "1", "--partition", "1"], "--partition 1 is given more than once"),
    (["consume", S, "g", "--max-records", "0"], "--max-records must be positive"),
    (["consume", S, "g", "--follow", "--set", "follow_interval_ms=0"], "follow_interval_ms=0"),
    (["consume", S, "g", "--no-commit", "--partition", "8"], "--partition 8 is not in [0, 8)"),
    (["spark", "compact", S, "--conf", "no-equals-sign"], "is not KEY=VALUE"),
    (["spark", "materialize", S, "{store}/kvlog.json"], "is a file, not a directory"),
    (["demo", "--path", S, "--no-spark", "--records", "10"], "is not an empty directory"),
    (["bench", "--only", "x"], "python -m benchmarks"),
    (["no-such-command", S], "invalid choice"),
]


@pytest.mark.parametrize("argv, expected", BAD, ids=[" ".join(a)[:60] for a, _ in BAD])
def test_refused_input_changes_no_file_and_is_one_line(
        capsysbinary: pytest.CaptureFixture[bytes], store: Path, argv: list[str], expected: str) -> None:
    (store.parent / "big-key").write_bytes(b"k" * 70_000)
    before = tree(store)
    capsysbinary.readouterr()
    try:
        code = main([a.replace(S, str(store)) for a in argv])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out, raw_err = capsysbinary.readouterr()
    err = raw_err.decode("utf-8", errors="backslashreplace")
    assert code != 0, err
    assert len(err.splitlines()) == 1 and expected in err, err
    assert "Traceback" not in err and out == b"", (err, out)
    assert tree(store) == before


@pytest.mark.parametrize(("argv", "code"), [
    (["put", S, "", "v"], 4),  # the store's own rule (InvalidRecordError): any other failure
    (["consume", S, "", "--follow"], 4),
    (["consume", S, "g", "--partition", "9"], 2),  # a bad argument: a usage error
])
def test_refused_input_in_a_process_of_its_own_changes_no_file(store: Path, argv: list[str], code: int) -> None:
    """A real process: the documented exit code, one line on stderr, and no file changed."""
    before = tree(store)
    done = subprocess.run([*CLI, *(a.replace(S, str(store)) for a in argv)], env=ENV,
                          capture_output=True, timeout=TIMEOUT_S, check=False)
    err = done.stderr.decode("utf-8", errors="backslashreplace")
    assert done.returncode == code and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert tree(store) == before


@pytest.mark.parametrize("partition", ["8", "-1", "1000"])
def test_partitions_out_of_range_are_usage_errors(
        capsysbinary: pytest.CaptureFixture[bytes], store: Path, partition: str) -> None:
    """A partition the store does not have is a usage error (exit 2), like any bad argument."""
    capsysbinary.readouterr()
    assert main(["consume", str(store), "g", "--partition", partition]) == 2
    assert capsysbinary.readouterr().err.decode().startswith("kvlog consume: error: --partition")


def test_a_refused_put_creates_no_store(tmp_path: Path) -> None:
    """A put refused for its key leaves a missing directory missing."""
    target = tmp_path / "new"
    done = subprocess.run([*CLI, "put", str(target), "", "v"], env=ENV, capture_output=True,
                          timeout=TIMEOUT_S, check=False)
    assert (done.returncode, done.stderr) == (4, b"kvlog: a key may not be empty\n")
    assert not target.exists()
