"""The ``kvlog`` command line run as a real command: where writes may create a store, and errors.

Every failure must be one line on stderr with a non-zero exit code, never a
traceback, and a refused write must leave the directory exactly as it was.
"""

from __future__ import annotations

import argparse
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


def run_bytes(*args: Arg, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    """Run ``kvlog ARGS`` with ``stdin`` as its input; stdout and stderr are bytes."""
    return subprocess.run([KVLOG, *args], input=stdin, capture_output=True, timeout=TIMEOUT_S, check=False)


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
        line = one_line_failure(run("put", target, "k", "v"), 3)
        assert "not a kvlog store" in line and "--create" in line, line
    line = one_line_failure(run("put", str(foreign_dir / "hosts"), "k", "v"), 3)
    assert "not a directory" in line, line
    # delete never creates: it needs an existing store.
    line = one_line_failure(run("delete", str(foreign_dir), "k"), 3)
    assert "no kvlog store at" in line, line
    assert listing(foreign_dir) == before


def test_delete_on_a_missing_store_creates_nothing(tmp_path: Path) -> None:
    line = one_line_failure(run("delete", str(tmp_path / "missing"), "k"), 3)
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
    assert run("get", str(foreign_dir), "k").stdout == "w"


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
    got = run_bytes("get", path, b"\xff\xfe")
    assert (got.returncode, got.stdout) == (0, b"\x80value"), got.stderr
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


def test_any_unexpected_error_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """A failure that is no kvlog error (a bug) is still one line, naming its type, and exit 4
    (any other failure), never a traceback."""
    import kvlog.demo

    def broken(*_args: object, **_kwargs: object) -> None:
        raise ValueError("something unforeseen\nover two lines")

    monkeypatch.setattr(kvlog.demo, "run_demo", broken)
    assert main(["demo", "--no-spark", "--path", str(tmp_path / "demo")]) == 4
    err = capsys.readouterr().err
    assert err == "kvlog: error: ValueError: something unforeseen over two lines\n", err


@pytest.mark.parametrize("records", ["-5", "0", "many", "1.5"])
def test_demo_refuses_a_record_count_that_is_not_positive(tmp_path: Path, records: str) -> None:
    line = one_line_failure(run("demo", "--no-spark", "--records", records, "--path", str(tmp_path / "demo")), 2)
    assert "--records" in line, line
    assert list(tmp_path.iterdir()) == []


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


# --- In-process runs: binary-safe input and output, formats, settings, help and errors ---------

from importlib.metadata import version as package_version  # noqa: E402

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from kvlog.cli import build_parser, main  # noqa: E402
from kvlog.cli.encoding import escape_tsv, json_record, record_from_json, unescape_tsv  # noqa: E402
from kvlog.cli.summary import age, render_stats  # noqa: E402


def call(capsys: pytest.CaptureFixture[bytes], *args: str) -> tuple[int, bytes, str]:
    """``main(args)`` in this process: (exit code, stdout bytes, stderr text)."""
    capsys.readouterr()
    try:
        code = main(list(args))
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err.decode("utf-8", errors="backslashreplace")


def fails(capsys: pytest.CaptureFixture[bytes], code: int, *args: str) -> str:
    """The one stderr line of ``kvlog ARGS`` run in this process, which must exit ``code``."""
    got, out, err = call(capsys, *args)
    assert (got, out) == (code, b""), err
    assert "Traceback" not in err and err.endswith("\n") and len(err.splitlines()) == 1, err
    return err.rstrip("\n")


def test_version_comes_from_the_package_metadata(capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    assert call(capsysbinary, "--version") == (0, f"kvlog {package_version('kvlog')}\n".encode(), "")
    done = run("--version")
    assert (done.returncode, done.stdout, done.stderr) == (0, f"kvlog {package_version('kvlog')}\n", "")


KEYS = st.binary(min_size=1, max_size=40)
VALUES = st.binary(max_size=300)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(items=st.dictionaries(KEYS, VALUES, min_size=1, max_size=4))
def test_arbitrary_bytes_round_trip(tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes],
                                    items: dict[bytes, bytes]) -> None:
    """Bytes put with --hex and --key-file/--value-file come back exactly through get (raw,
    --hex, json) and through scan in both formats, parsed back."""
    path = str(tmp_path / f"s{len(list(tmp_path.iterdir()))}")
    key_file, value_file = tmp_path / "key.bin", tmp_path / "value.bin"
    for i, (key, value) in enumerate(items.items()):
        if i % 2:
            key_file.write_bytes(key)
            value_file.write_bytes(value)
            args = ["--key-file", str(key_file), "--value-file", str(value_file)]
        else:
            args = ["--hex", key.hex(), value.hex()]
        assert call(capsysbinary, "put", path, *args) == (0, b"", "")
    for key, value in items.items():
        assert call(capsysbinary, "get", path, "--hex", key.hex()) == (0, value.hex().encode() + b"\n", "")
        key_file.write_bytes(key)
        assert call(capsysbinary, "get", path, "--key-file", str(key_file)) == (0, value, "")
        assert call(capsysbinary, "get", path, "--hex", key.hex(), "--format", "json") == (
            0, json_record(key, value, as_hex=True).encode() + b"\n", "")
        code, out, _ = call(capsysbinary, "get", path, "--key-file", str(key_file), "--format", "json")
        assert (code, record_from_json(json.loads(out))) == (0, (key, value))
    code, out, _ = call(capsysbinary, "scan", path, "--format", "json")
    assert code == 0 and out.endswith(b"\n")
    assert dict(record_from_json(json.loads(line)) for line in out.splitlines()) == items
    code, out, _ = call(capsysbinary, "scan", path)
    rows = [line.split(b"\t") for line in out.split(b"\n")[:-1]]
    assert code == 0 and all(len(row) == 2 for row in rows)
    assert {unescape_tsv(k.decode()): unescape_tsv(v.decode()) for k, v in rows} == items
    code, out, _ = call(capsysbinary, "scan", path, "--hex", "--reverse")
    pairs = [tuple(bytes.fromhex(f) for f in line.split("\t")) for line in out.decode().splitlines()]
    assert (code, pairs) == (0, sorted(items.items(), reverse=True))
    smallest = min(items)
    code, out, _ = call(capsysbinary, "scan", path, "--hex", "--prefix", smallest.hex(), "--format", "json")
    expected = {k: v for k, v in items.items() if k.startswith(smallest)}
    assert dict(record_from_json(json.loads(line)) for line in out.splitlines()) == expected
    key_file.write_bytes(smallest)
    assert call(capsysbinary, "delete", path, "--key-file", str(key_file)) == (0, b"", "")
    missing = fails(capsysbinary, 1, "get", path, "--hex", smallest.hex())
    assert missing == f"kvlog: key not found: {escape_tsv(smallest)}"


@given(st.binary(max_size=64))
def test_tsv_escaping_round_trips_and_stays_on_one_field(data: bytes) -> None:
    field = escape_tsv(data)
    assert unescape_tsv(field) == data
    assert "\t" not in field and "\n" not in field and "\r" not in field and field.isprintable()


def test_tsv_escaping_is_exactly_as_documented() -> None:
    data = b"a\tb\nc\\d\re\x00\x1b\x7f" + "é€\u2028\u0085".encode() + b"\xff\xc3"
    assert escape_tsv(data) == ("a\\tb\\nc\\\\d\\re\\x00\\x1b\\x7f" "é€"
                                "\\xe2\\x80\\xa8\\xc2\\x85\\xff\\xc3")
    with pytest.raises(ValueError):
        unescape_tsv("bad\\q")


def test_json_lines_use_text_when_valid_utf8_and_hex_otherwise() -> None:
    assert json_record(b"user:1", "Adá".encode()) == '{"key": "user:1", "value": "Adá"}'
    assert json_record(b"\xff", b"ok") == '{"key_hex": "ff", "value": "ok"}'
    assert json_record(b"k", b"v", as_hex=True) == '{"key_hex": "6b", "value_hex": "76"}'
    assert record_from_json(json.loads(json_record(b"\xff\x00", b"\x80"))) == (b"\xff\x00", b"\x80")


def test_stdin_and_stdout_carry_every_byte(tmp_path: Path) -> None:
    """Real processes: a value read from stdin is written back to a pipe byte for byte (no
    newline added when stdout is not a terminal); a key from stdin works too."""
    path = str(tmp_path / "s")
    value = bytes(range(256)) * 3 + b"\n\n"
    done = run_bytes("put", path, "blob", "--value-file", "-", stdin=value)
    assert (done.returncode, done.stderr) == (0, b"")
    got = run_bytes("get", path, "blob")
    assert (got.returncode, got.stdout, got.stderr) == (0, value, b"")
    done = run_bytes("put", path, "--key-file", "-", "v", stdin=b"\x00key\n")
    assert (done.returncode, done.stderr) == (0, b"")
    got = run_bytes("get", path, "--key-file", "-", "--format", "json", stdin=b"\x00key\n")
    assert got.stdout == b'{"key": "\\u0000key\\n", "value": "v"}\n'
    assert run_bytes("scan", path, "--stop", "b").stdout == b"\\x00key\\n\tv\n"


def test_positional_arguments_may_follow_options(capsysbinary: pytest.CaptureFixture[bytes],
                                                 tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    assert call(capsysbinary, "put", path, "--hex", "6b", "76")[0] == 0
    assert call(capsysbinary, "put", path, "k2", "--set", "cache_bytes=1_000_000", "v2")[0] == 0
    assert call(capsysbinary, "put", path, "--", "-dash", "-1")[0] == 0
    assert call(capsysbinary, "scan", path) == (0, b"-dash\t-1\nk\tv\nk2\tv2\n", "")


def test_set_passes_settings_and_names_typos(capsysbinary: pytest.CaptureFixture[bytes],
                                             tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    assert call(capsysbinary, "put", path, "k", "v", "--set", "partitions=2", "--set",
                "max_compaction_lag_ms=none", "--set", "compression=lz4")[0] == 0
    with kvlog.open(path, read_only=True) as store:
        assert store.log.partitions == 2
    line = fails(capsysbinary, 4, "get", path, "k", "--set", "partitions=3")
    assert line.startswith("kvlog: partitions=3"), line
    line = fails(capsysbinary, 4, "put", path, "k", "v", "--set", "max_record_bytes=10")
    assert "max_record_bytes" in line, line


@pytest.mark.parametrize(("setting", "expected"), [
    ("delete_retenton_ms=1", "unknown setting 'delete_retenton_ms' (did you mean 'delete_retention_ms'?)"),
    ("nonsense=1", "unknown setting 'nonsense'"),
    ("partitions=two", "partitions='two': must be int"),
    ("background_compaction=maybe", "must be bool"),
    ("min_cleanable_dirty_ratio=half", "must be float"),
    ("cache_bytes", "'cache_bytes' is not NAME=VALUE"),
    ("=1", "is not NAME=VALUE"),
])
def test_bad_settings_are_usage_errors(capsysbinary: pytest.CaptureFixture[bytes], tmp_path: Path,
                                       setting: str, expected: str) -> None:
    line = fails(capsysbinary, 2, "put", str(tmp_path / "s"), "k", "v", "--set", setting)
    assert line.startswith("kvlog put: error: argument --set") and expected in line, line
    assert list(tmp_path.iterdir()) == []


def test_open_names_the_setting_a_typo_meant(tmp_path: Path) -> None:
    with pytest.raises(kvlog.ConfigError) as info:
        kvlog.open(str(tmp_path / "s"), delete_retenton_ms=1)
    assert str(info.value) == "unknown setting 'delete_retenton_ms' (did you mean 'delete_retention_ms'?)"
    with pytest.raises(kvlog.ConfigError, match=r"^unknown settings 'flush_byts' \(did you mean "
                                                r"'flush_bytes'\?\), 'zzz'$"):
        kvlog.open(str(tmp_path / "s"), zzz=1, flush_byts=2)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("args", "expected"), [
    (("put", "{s}", "--hex", "zz", "76"), "KEY is not hex: 'zz'"),
    (("put", "{s}", "--hex", "6b", "7"), "VALUE is not hex: '7'"),
    (("get", "{s}", "--hex", "6g"), "KEY is not hex"),
    (("delete", "{s}", "--hex", "-"), "KEY is not hex"),
    (("scan", "{s}", "--hex", "--prefix", "x"), "--prefix is not hex"),
    (("scan", "{s}", "--hex", "--start", "00", "--stop", "0"), "--stop is not hex"),
    (("put", "{s}", "k", "--value-file", "{tmp}/missing"), "--value-file '{tmp}/missing': No such file"),
    (("put", "{s}", "--key-file", "{tmp}/missing", "v"), "--key-file '{tmp}/missing': No such file"),
    (("put", "{s}", "k", "--value-file", "{tmp}"), "Is a directory"),
    (("get", "{s}", "--key-file", "{tmp}"), "Is a directory"),
    (("put", "{s}", "k", "v", "--value-file", "{tmp}/f"), "give VALUE as an argument or with --value-file, not both"),
    (("get", "{s}", "k", "--key-file", "{tmp}/f"), "give KEY as an argument or with --key-file, not both"),
    (("put", "{s}", "--key-file", "-", "--value-file", "-"), "cannot both read stdin"),
    (("put", "{s}", "k"), "expected KEY VALUE after the URI, got 1 argument(s)"),
    (("put", "{s}", "a", "b", "c"), "expected KEY VALUE after the URI, got 3 argument(s)"),
    (("get", "{s}"), "expected KEY after the URI, got 0 argument(s)"),
    (("delete", "{s}", "a", "b"), "expected KEY after the URI, got 2 argument(s)"),
    (("get", "{s}", "k", "--format", "tsv"), "argument --format: invalid choice: 'tsv'"),
    (("scan", "{s}", "--format", "csv"), "argument --format: invalid choice: 'csv'"),
    (("put", "{s}", "k", "v", "--bogus"), "unrecognized arguments: --bogus"),
    (("stats", "{s}", "extra"), "unrecognized arguments: extra"),
])
def test_input_errors_are_one_line_and_create_nothing(capsysbinary: pytest.CaptureFixture[bytes], tmp_path: Path,
                                                      args: tuple[str, ...], expected: str) -> None:
    (tmp_path / "f").write_bytes(b"file")
    before = listing(tmp_path)
    fill = {"s": str(tmp_path / "s"), "tmp": str(tmp_path)}
    line = fails(capsysbinary, 2, *(a.format(**fill) for a in args))
    assert "error: " in line and expected.format(**fill) in line, line
    assert listing(tmp_path) == before


def test_input_errors_from_a_real_process(tmp_path: Path) -> None:
    line = one_line_failure(run("put", str(tmp_path / "s"), "k", "--value-file", str(tmp_path / "no")), 2)
    assert line == f"kvlog put: error: --value-file '{tmp_path}/no': No such file or directory", line
    line = one_line_failure(run("get", str(tmp_path / "s"), "--hex", "xyz"), 2)
    assert line.startswith("kvlog get: error: KEY is not hex: 'xyz'"), line
    assert list(tmp_path.iterdir()) == []


def test_a_refused_write_reads_its_input_first_and_changes_nothing(foreign_dir: Path) -> None:
    before = listing(foreign_dir)
    line = one_line_failure(run("put", str(foreign_dir), "--key-file", str(foreign_dir / "hosts"), "v"), 3)
    assert "not a kvlog store" in line, line
    line = one_line_failure(run("put", str(foreign_dir), "k", "--value-file", str(foreign_dir / "nope")), 2)
    assert "No such file" in line, line
    assert listing(foreign_dir) == before


def _walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], argparse.Action]]:
    out = []
    for action in parser._actions:
        out.append((path, action))
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out.extend(_walk(sub, (*path, name)))
    return out


def test_every_argument_has_help(capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    walked = _walk(build_parser())
    commands = {path for path, _ in walked if path}
    assert {("put",), ("get",), ("delete",), ("scan",), ("stats",), ("check",), ("compact",),
            ("spark", "compact"), ("demo",), ("bench",)} <= commands
    missing = [f"{' '.join(path) or 'kvlog'}: {action.dest}" for path, action in walked
               if not isinstance(action, argparse._HelpAction) and action.help != argparse.SUPPRESS
               and not (action.help or "").strip()]
    assert missing == []
    for path in sorted(commands - {("bench",)}):
        code, out, err = call(capsysbinary, *path, "--help")
        assert (code, err) == (0, "") and out.startswith(f"usage: kvlog {' '.join(path)}".encode()), out


def test_stats_prints_a_summary_and_json(capsysbinary: pytest.CaptureFixture[bytes], tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    with kvlog.open(path, partitions=2, background_compaction=False) as store:
        for i in range(50):
            store.put(b"k%d" % (i % 5), b"v" * 1000)
        store.flush()
        store.compact(force=True)
        store.put(b"k0", b"w" * 20_000)
    code, out, err = call(capsysbinary, "stats", path)
    text = out.decode()
    assert (code, err) == (0, ""), err
    assert f"store        {Path(path).as_uri()} (uuid " in text
    assert "keys         5 live, " in text and "2 partitions" in text
    assert "compaction   not running in this process (a read-only open)" in text
    lines = text.splitlines()
    header = lines.index(next(line for line in lines if line.startswith("partition ")))
    rows = [line.split() for line in lines[header + 1:header + 3]]
    assert [row[0] for row in rows] == ["0", "1"]
    assert all(row[-1] == "ago" and row[-2] in ("s", "min") or row[-1] == "now" for row in rows), rows
    assert any("cleanable" in row for row in rows), rows  # the partition written after the round
    code, out, err = call(capsysbinary, "stats", path, "--json")
    figures = json.loads(out)
    assert code == 0 and figures["live_keys"] == 5 and figures["partitions"] == 2
    with kvlog.open(path, read_only=True) as store:
        assert json.loads(json.dumps(store.stats())).keys() == figures.keys()
    dirty = [p["dirty_ratio"] for p in figures["partition_stats"]]
    assert all(0.0 <= r <= 1.0 for r in dirty) and max(dirty) > 0.5


def test_stats_summary_shows_compaction_errors(tmp_path: Path) -> None:
    """The summary of a writable store's stats (its compactor's state included)."""
    with kvlog.open(str(tmp_path / "s"), partitions=2, background_compaction=False) as store:
        store.put("a", "1")
        store.flush()
        stats = store.stats()
    now = 1_800_000_000_000
    stats["compaction"]["failing_partitions"] = {
        "1": {"error": "StorageError: disk full", "failures": 3, "retry_at_ms": now + 30_000}}
    stats["compaction"]["last_error"] = "StorageError: disk full"
    text = render_stats(stats, now, min_dirty_ratio=0.5)
    assert "compaction   0 round(s), no background thread" in text
    assert "  partition 1 failing (3 time(s), retry in 30 s): StorageError: disk full" in text
    assert "  last error: StorageError: disk full" in text
    assert f"producer     {stats['producer_id']} epoch " in text


@pytest.mark.parametrize(("then", "expected"), [
    (0, "never"), (None, "never"), (1_000_000 - 400, "just now"), (1_000_000 - 12_000, "12 s ago"),
    (1_000_000 - 180_000, "3 min ago"), (1_000_000 - 5 * 3_600_000, "5 h ago"),
    (1_000_000 - 86_400_000, "1 day ago"), (1_000_000 - 3 * 86_400_000, "3 days ago"),
    (1_000_000 + 120_000, "in 2 min"),
])
def test_ages(then: int | None, expected: str) -> None:
    assert age(then, 1_000_000) == expected


DOCS_CLI = Path(__file__).resolve().parent.parent / "docs" / "cli.rst"


def console_examples(text: str) -> list[list[tuple[str, str]]]:
    """Each ``console`` block of a page as (command, expected output) pairs.

    A line starting with ``$`` is a command; the lines after it, up to the next command,
    are its expected output (stdout and stderr together); ``<BLANKLINE>`` is an empty line.
    """
    blocks: list[list[tuple[str, str]]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        i += 1
        if lines[i - 1].strip() != ".. code-block:: console":
            continue
        examples: list[tuple[str, list[str]]] = []
        while i < len(lines) and (lines[i] == "" or lines[i].startswith("   ")):
            line = lines[i][3:]
            i += 1
            if line.startswith("$ "):
                examples.append((line[2:], []))
            elif line:
                examples[-1][1].append("" if line == "<BLANKLINE>" else line)
        blocks.append([(command, "".join(f"{out}\n" for out in output)) for command, output in examples])
    return blocks


def test_console_examples_of_the_cli_page_run(tmp_path: Path) -> None:
    """Every ``$ kvlog ...`` example of docs/cli.rst, run by bash in a new directory per
    block, prints what the page shows (``...`` matches anything)."""
    import doctest

    blocks = console_examples(DOCS_CLI.read_text())
    assert len(blocks) >= 6 and all(blocks)
    env = {**os.environ, "PATH": f"{Path(KVLOG).parent}{os.pathsep}{os.environ['PATH']}"}
    checker = doctest.OutputChecker()
    for n, block in enumerate(blocks):
        cwd = tmp_path / f"block{n}"
        cwd.mkdir()
        for command, expected in block:
            done = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, timeout=TIMEOUT_S, check=False)
            # A terminal shows a value without a final newline (``get``) on a line of its own.
            shown = done.stdout if done.stdout.endswith("\n") or not done.stdout else done.stdout + "\n"
            assert checker.check_output(expected, shown, doctest.ELLIPSIS), (
                f"$ {command}\nexpected:\n{expected}got:\n{shown}")


@pytest.mark.parametrize("module", ["kvlog", "kvlog.cli"])
def test_python_dash_m_runs_the_command_line(module: str, tmp_path: Path) -> None:
    store = tmp_path / "s"
    put = subprocess.run([sys.executable, "-m", module, "put", str(store), "k", "v"],
                         capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    assert put.returncode == 0, put.stderr
    got = subprocess.run([sys.executable, "-m", module, "get", str(store), "k"],
                         capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    assert (got.returncode, got.stdout) == (0, "v")
    missing = subprocess.run([sys.executable, "-m", module, "get", str(tmp_path / "nope"), "k"],
                             capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    assert (missing.returncode, missing.stderr) == (3, f"kvlog: no kvlog store at {str(tmp_path / 'nope')!r}\n")


@pytest.mark.parametrize("module", ["kvlog", "kvlog.cli"])
@pytest.mark.parametrize("args", [
    pytest.param(("--version",), id="version"),
    pytest.param(("get", "{tmp}/nope", "k"), id="no-store"),
    pytest.param(("-v", "put", "{tmp}/afile/sub", "k", "v"), id="verbose-cause-chain"),
    pytest.param(("scan", "{tmp}/nope", "--limit", "0"), id="usage"),
    pytest.param(("bench",), id="bench"),
])
def test_python_dash_m_is_the_kvlog_script(module: str, args: tuple[str, ...], tmp_path: Path) -> None:
    """``python -m kvlog ARGS`` (and ``python -m kvlog.cli``) prints what ``kvlog ARGS`` prints,
    on stdout and stderr, and exits with the same code: success, an error, a usage error."""
    (tmp_path / "afile").write_text("not a directory\n")
    argv = [a.format(tmp=tmp_path) for a in args]
    script = run(*argv, cwd=tmp_path)
    as_module = subprocess.run([sys.executable, "-m", module, *argv], capture_output=True, text=True,
                               errors="backslashreplace", timeout=TIMEOUT_S, cwd=tmp_path, check=False)
    assert (as_module.returncode, as_module.stdout, as_module.stderr) == (
        script.returncode, script.stdout, script.stderr)
    assert script.stdout or script.stderr  # each case says something to compare


def test_stats_summary_shows_groups_lags_and_holds(capsysbinary: pytest.CaptureFixture[bytes], tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    with kvlog.open(path, partitions=2, background_compaction=False) as store:
        for i in range(10):
            store.put(f"k{i}", "v")
        store.flush()
        store.consumer("reader").commit({0: 1})
        store.consumer("holder", hold_tombstones=True)
        ends = store.end_offsets()
    code, out, err = call(capsysbinary, "stats", path)
    text = out.decode()
    assert (code, err) == (0, ""), err
    assert "groups       2\n" in text
    assert f"  holder: lag {sum(ends.values())}, holds tombstones (lapses in 7 days)\n" in text
    assert f"  reader: lag {ends[0] - 1}\n" in text
    assert "  held from: partition 0 offset 0, partition 1 offset 0\n" in text
