"""The exit codes of ``kvlog``, its messages for people, ``-v`` and ``scan --limit``.

Each exit code of the table in docs/cli.rst ("Errors and exit codes") comes from a real
command here: 0 success, 1 the answer is no (a key not there, problems ``check`` found),
2 a usage error, 3 a store (checkpoint, consumer group) that is not there, 4 any other
failure. 130 and 141 come from tests/test_cli.py (an interrupt, a closed pipe) and 143 from
tests/test_cli_consume.py (SIGTERM). A kvlog error is ``kvlog: <message>`` without its
class name; ``-v`` names the class and each exception of the cause chain, one line each.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

import kvlog
import kvlog.cli
import kvlog.demo
from kvlog.cli import ExitCode, error_lines, exit_code_of
from kvlog.cli.encoding import InputError
from kvlog.errors import (
    CheckpointNotFoundError,
    ConfigError,
    CorruptDataError,
    GroupNotFoundError,
    ReadOnlyError,
    StorageError,
    StoreNotFoundError,
)
from tests.test_cli import DOCS_CLI, call, fails, one_line_failure, run

QUIET = {"background_compaction": False}


@pytest.fixture(scope="module")
def users(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A closed store of 12 keys over 3 partitions (``user:00`` to ``user:09``, ``x:a``, ``x:b``)."""
    path = tmp_path_factory.mktemp("exit-codes") / "users"
    with kvlog.open(str(path), partitions=3, **QUIET) as store:
        for i in range(10):
            store.put(f"user:{i:02d}", f"name {i}")
        store.put("x:a", "tab\there")
        store.put(b"x:b", b"\xff\x00")
    return str(path)


@pytest.fixture
def behind(tmp_path: Path) -> Path:
    """A store whose ``log/`` was restored from a copy older than its cache: ``check`` finds
    that, and every other command refuses the cache (StorageBehindError, exit 4)."""
    root = tmp_path / "s"
    assert run("put", str(root), "user:1", "Ada").returncode == 0
    shutil.copytree(root / "log", tmp_path / "backup-log")
    assert run("put", str(root), "user:2", "Grace").returncode == 0
    shutil.rmtree(root / "log")
    shutil.copytree(tmp_path / "backup-log", root / "log")
    return root


# --- every exit code from a real process ------------------------------------------------------

def test_exit_0_on_success(users: str) -> None:
    done = run("get", users, "user:03")
    assert (done.returncode, done.stdout, done.stderr) == (0, "name 3", "")
    done = run("check", users)
    assert (done.returncode, done.stdout, done.stderr) == (0, "ok\n", "")


def test_exit_1_for_a_key_that_is_not_there(users: str) -> None:
    assert one_line_failure(run("get", users, "user:99"), 1) == "kvlog: key not found: user:99"


def test_exit_1_when_check_finds_problems(behind: Path) -> None:
    done = run("check", str(behind))
    assert done.returncode == 1, done.stderr
    assert done.stderr == "kvlog: 1 problem(s) found\n" and len(done.stdout.splitlines()) == 1, done


@pytest.mark.parametrize("args, expected", [
    (("get", "{users}"), "kvlog get: error: expected KEY after the URI, got 0 argument(s)"),
    (("get", "{users}", "--hex", "zz"), "kvlog get: error: KEY is not hex: 'zz' (two hex digits per byte)"),
    (("scan", "{users}", "--format", "csv"), "kvlog scan: error: argument --format: invalid choice"),
    (("no-such-command",), "kvlog: error: argument COMMAND: invalid choice"),
    (("bench",), "kvlog: the benchmark suite is not installed with kvlog"),
])
def test_exit_2_for_a_usage_error(users: str, args: tuple[str, ...], expected: str) -> None:
    line = one_line_failure(run(*(a.format(users=users) for a in args)), 2)
    assert line.startswith(expected), line


@pytest.mark.parametrize("args", [
    ("get", "{missing}", "k"), ("put", "{foreign}", "k", "v"), ("delete", "{missing}", "k"),
    ("scan", "{missing}", "--limit", "1"), ("stats", "{missing}"), ("check", "{missing}"),
    ("compact", "{missing}"), ("consume", "{missing}", "g"), ("spark", "compact", "{missing}"),
])
def test_exit_3_when_the_store_is_not_there(tmp_path: Path, args: tuple[str, ...]) -> None:
    """No store at the URI (or a directory of other files ``put`` may not make one in): exit 3,
    one line naming the place without the error's class name, and nothing created."""
    foreign = tmp_path / "etc"
    foreign.mkdir()
    (foreign / "hosts").write_text("127.0.0.1 localhost\n")
    missing = tmp_path / "missing"
    line = one_line_failure(run(*(a.format(missing=missing, foreign=foreign) for a in args)), 3)
    assert line.startswith(("kvlog: no kvlog store at ", f"kvlog: {foreign} is not empty")), line
    assert "Error" not in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["etc"] and [p.name for p in foreign.iterdir()] == ["hosts"]


def test_exit_4_for_any_other_kvlog_error(tmp_path: Path, users: str, behind: Path) -> None:
    (tmp_path / "afile").write_text("x\n")
    cases = [
        (("put", f"{tmp_path}/afile/sub", "k", "v"), "kvlog: cannot create the store directory "),  # StorageError
        (("get", users, "k", "--set", "partitions=2"), "kvlog: partitions=2"),  # ConfigError
        (("put", users, "", "v"), "kvlog: a key may not be empty"),  # InvalidRecordError
        (("get", str(behind), "user:1"), "kvlog: log/"),  # StorageBehindError
    ]
    for args, expected in cases:
        line = one_line_failure(run(*args), 4)
        assert line.startswith(expected) and "Error" not in line.split(":")[1], line


# --- exit codes and messages of each kind of error, through main() ----------------------------

def _raising(monkeypatch: pytest.MonkeyPatch, error: BaseException) -> None:
    """Make ``kvlog demo`` raise ``error`` (the command line's handling is what is tested)."""
    def broken(*_args: object, **_kwargs: object) -> None:
        raise error

    monkeypatch.setattr(kvlog.demo, "run_demo", broken)


@pytest.mark.parametrize("error, code", [
    (StoreNotFoundError("no kvlog store at 'x'"), 3),
    (CheckpointNotFoundError("no checkpoint named 'before-sale' in the store"), 3),
    (GroupNotFoundError("no consumer group 'nightly' in the store"), 3),
    (ConfigError("bad setting"), 4),
    (ReadOnlyError("the store is open read-only"), 4),
    (CorruptDataError("log/00000001.json", "checksum mismatch"), 4),
    (StorageError("disk full"), 4),
    (InputError("KEY is not hex"), 2),
    (OSError(28, "No space left on device"), 4),
    (RuntimeError("a bug"), 4),
])
def test_each_kind_of_error_has_its_exit_code(capsysbinary: pytest.CaptureFixture[bytes], tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch, error: Exception,
                                              code: int) -> None:
    _raising(monkeypatch, error)
    line = fails(capsysbinary, code, "demo", "--no-spark", "--path", str(tmp_path / "demo"))
    assert exit_code_of(error) == code
    if isinstance(error, InputError):
        assert line == f"kvlog demo: error: {error}"
    elif isinstance(error, kvlog.KvlogError):
        assert line == f"kvlog: {error}"  # for people: no class name
    else:  # a bug or an OS error keeps its type, which a report needs
        assert line == f"kvlog: error: {type(error).__name__}: {error}"


def test_the_exit_codes_are_the_documented_table() -> None:
    """The codes of :class:`ExitCode` are the rows of the table in docs/cli.rst and each is in
    the module doc of :mod:`kvlog.cli`."""
    text = DOCS_CLI.read_text(encoding="utf-8")
    section = text[text.index("Errors and exit codes\n"):]
    table = section[section.index(".. list-table::"):section.index("\n\n", section.index("   * - 143"))]
    rows = [int(code) for code in re.findall(r"^   \* - (\d+)$", table, flags=re.MULTILINE)]
    assert rows == sorted(int(code) for code in ExitCode)
    doc = kvlog.cli.__doc__ or ""
    assert all(re.search(rf"\b{int(code)} ", doc) for code in ExitCode), doc


# --- -v: the type and the cause chain ----------------------------------------------------------

def test_a_kvlog_error_is_one_line_without_its_class_name(tmp_path: Path) -> None:
    missing = str(tmp_path / "NOPE")
    assert one_line_failure(run("get", missing, "k"), 3) == f"kvlog: no kvlog store at {missing!r}"


@pytest.mark.parametrize("where", ["before", "after"])
def test_verbose_names_the_type_and_every_cause(tmp_path: Path, where: str) -> None:
    """``-v`` before or after the command: the type, then one line per cause; still exit 4."""
    (tmp_path / "afile").write_text("x\n")
    target = f"{tmp_path}/afile/sub"
    args = ["-v", "put", target, "k", "v"] if where == "before" else ["put", target, "k", "v", "--verbose"]
    done = run(*args)
    reason = f"[Errno 20] Not a directory: {target!r}"
    assert (done.returncode, done.stdout) == (4, "")
    assert done.stderr == (f"kvlog: StorageError: cannot create the store directory {target}: {reason}\n"
                           f"  caused by: NotADirectoryError: {reason}\n")
    assert one_line_failure(run("put", target, "k", "v"), 4) == (
        f"kvlog: cannot create the store directory {target}: {reason}")


def test_verbose_before_the_command_is_not_undone_by_the_command(tmp_path: Path) -> None:
    """``kvlog -v get ...``: the command's own ``--verbose`` (unset) leaves the global one on."""
    missing = str(tmp_path / "NOPE")
    assert one_line_failure(run("-v", "get", missing, "k"), 3) == (
        f"kvlog: StoreNotFoundError: no kvlog store at {missing!r}")
    assert one_line_failure(run("-v", "spark", "compact", missing), 3).startswith(
        "kvlog: StoreNotFoundError: no kvlog store at ")


def _chained() -> StorageError:
    """A StorageError raised from a ConfigError (``__cause__``) that was raised while handling
    an OSError whose message has two lines (``__context__``)."""
    config = ConfigError("while handling")
    config.__context__ = OSError("first line\nsecond line")
    error = StorageError("the backend failed")
    error.__cause__ = config
    return error


def test_the_cause_chain_follows_cause_then_context_and_stops_where_suppressed(
        capsysbinary: pytest.CaptureFixture[bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    error = _chained()
    _raising(monkeypatch, error)
    code, out, err = call(capsysbinary, "-v", "demo", "--no-spark", "--path", str(tmp_path / "demo"))
    assert (code, out) == (4, b"")
    assert err == ("kvlog: StorageError: the backend failed\n"
                   "  caused by: ConfigError: while handling\n"  # __cause__
                   "  caused by: OSError: first line second line\n")  # __context__, on one line
    assert error_lines(error) == ["kvlog: the backend failed"]
    try:
        raise StorageError("outer") from None
    except StorageError as suppressed:
        suppressed.__context__ = OSError("hidden")
        assert error_lines(suppressed, verbose=True) == ["kvlog: StorageError: outer"]


def test_verbose_on_a_bug_keeps_the_error_prefix_and_lists_causes(
        capsysbinary: pytest.CaptureFixture[bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        raise ValueError("unforeseen") from KeyError("k")
    except ValueError as e:
        _raising(monkeypatch, e)
    code, _, err = call(capsysbinary, "demo", "--no-spark", "--path", str(tmp_path / "demo"), "-v")
    assert (code, err) == (4, "kvlog: error: ValueError: unforeseen\n  caused by: KeyError: 'k'\n")


def test_a_cause_chain_that_loops_ends() -> None:
    first, second = StorageError("a"), OSError("b")
    first.__cause__, second.__cause__ = second, first
    assert error_lines(first, verbose=True) == ["kvlog: StorageError: a", "  caused by: OSError: b"]


def test_an_error_without_a_message_is_named_by_its_type() -> None:
    assert error_lines(StorageError()) == ["kvlog: StorageError"]
    assert error_lines(RuntimeError()) == ["kvlog: error: RuntimeError"]


# --- scan --limit --------------------------------------------------------------------------------

@pytest.mark.parametrize("output", [(), ("--format", "json"), ("--hex",), ("--hex", "--format", "json")],
                         ids=["tsv", "json", "hex", "hex-json"])
@pytest.mark.parametrize("selection", [(), ("--reverse",), ("--prefix", "user:"), ("--start", "user:05"),
                                       ("--start", "user:02", "--stop", "user:07", "--reverse")],
                         ids=["all", "reverse", "prefix", "start", "range-reverse"])
def test_scan_limit_prints_the_first_n_records_in_every_format(
        capsysbinary: pytest.CaptureFixture[bytes], users: str, output: tuple[str, ...],
        selection: tuple[str, ...]) -> None:
    if "--hex" in output:  # bounds are hex digits too
        selection = tuple(a.encode().hex() if a.startswith("user:") else a for a in selection)
    code, everything, err = call(capsysbinary, "scan", users, *selection, *output)
    lines = everything.splitlines(keepends=True)
    assert (code, err) == (0, "") and len(lines) >= 5, err
    for limit in (1, 2, len(lines) - 1, len(lines), len(lines) + 10):
        code, out, err = call(capsysbinary, "scan", users, *selection, *output, "--limit", str(limit))
        assert (code, err) == (0, "")
        assert out == b"".join(lines[:limit]), (limit, out)
    if "--format" in output:
        code, out, _ = call(capsysbinary, "scan", users, *selection, *output, "--limit", "1")
        assert json.loads(out).keys() <= {"key", "key_hex", "value", "value_hex"}


def test_scan_limit_in_a_real_process(users: str) -> None:
    done = run("scan", users, "--prefix", "x:", "--limit", "1")
    assert (done.returncode, done.stdout, done.stderr) == (0, "x:a\ttab\\there\n", "")
    done = run("scan", users, "--reverse", "--limit", "1", "--format", "json")
    assert (done.returncode, done.stdout, done.stderr) == (0, '{"key": "x:b", "value_hex": "ff00"}\n', "")


@pytest.mark.parametrize("limit, reason", [
    ("0", "0 is not above zero"), ("-1", "-1 is not above zero"), ("1.5", "'1.5' is not a whole number"),
    ("ten", "'ten' is not a whole number"), ("", "'' is not a whole number"),
])
def test_a_bad_scan_limit_is_a_usage_error(capsysbinary: pytest.CaptureFixture[bytes], users: str,
                                           limit: str, reason: str) -> None:
    line = fails(capsysbinary, 2, "scan", users, "--limit", limit)
    assert line == f"kvlog scan: error: argument --limit: {reason} (see kvlog scan --help)"
    line = fails(capsysbinary, 2, "scan", users, f"--limit={limit}", "--format", "json")
    assert line == f"kvlog scan: error: argument --limit: {reason} (see kvlog scan --help)"


def test_scan_limit_on_a_missing_store_is_exit_3(capsysbinary: pytest.CaptureFixture[bytes], tmp_path: Path) -> None:
    line = fails(capsysbinary, 3, "scan", str(tmp_path / "none"), "--limit", "3")
    assert line == f"kvlog: no kvlog store at {str(tmp_path / 'none')!r}"
    assert not (tmp_path / "none").exists()
