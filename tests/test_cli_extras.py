"""Optional parts and first contact: logging stays silent until configured, a missing extra is
one line naming what to install (before any work), Spark commands check the store before a
JVM, and the demo says where its store is and removes it unless ``--keep``.

Missing packages are made by fault injection: a directory put first on ``PYTHONPATH`` holds
a package of that name whose import raises ``ImportError`` (and, for pyspark, first writes a
marker file, so a test can tell that pyspark was never even imported). Every command runs as
a real process.
"""

from __future__ import annotations

import doctest
import os
import pickle
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import kvlog
import kvlog.extras
from kvlog.errors import ConfigError, MissingExtraError

ROOT = Path(__file__).resolve().parent.parent
KVLOG = str(Path(sys.executable).with_name("kvlog"))
TIMEOUT_S = 120
BLOCKED = ("pyspark", "obstore", "matplotlib")


@pytest.fixture
def blocked(tmp_path: Path) -> dict[str, str]:
    """An environment in which pyspark, obstore and matplotlib cannot be imported; importing
    pyspark leaves the file ``pyspark-imported`` in the stub directory."""
    stubs = tmp_path / "stubs"
    for name in BLOCKED:
        (stubs / name).mkdir(parents=True)
        marker = f"open({str(stubs / f'{name}-imported')!r}, 'w').close()\n"
        (stubs / name / "__init__.py").write_text(
            f"{marker}raise ImportError(\"No module named {name!r} (blocked by the test)\", name={name!r})\n")
    return env_with(stubs)


def env_with(first: Path) -> dict[str, str]:
    """This environment with ``first`` ahead of the source tree on ``PYTHONPATH``."""
    path = os.pathsep.join(p for p in (str(first), str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, PYTHONPATH=path, XDG_CACHE_HOME=str(first.parent / "xdg-cache"))


def run(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([KVLOG, *args], capture_output=True, text=True, timeout=TIMEOUT_S, env=env,
                          cwd=cwd, check=False)


def one_line(done: subprocess.CompletedProcess[str], code: int | None = None) -> str:
    """The one stderr line of a failed command (non-zero exit, ``code`` if given, one line, no
    traceback)."""
    assert done.returncode != 0, (done.stdout, done.stderr)
    if code is not None:
        assert done.returncode == code, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and done.stderr.endswith("\n"), done.stderr
    return lines[0]


# -- logging ---------------------------------------------------------------------------------

WARN_ON_OPEN = """
import logging, pathlib, shutil, sys
import kvlog
if sys.argv[2] == "configured":
    logging.basicConfig()
root = pathlib.Path(sys.argv[1])
with kvlog.open(root, checkpoint_interval=2, background_compaction=False) as store:
    for i in range(5):
        store.put(f"k{i}", "v")
        store.flush()
shutil.rmtree(root / "cache")
sorted((root / "log").glob("*.checkpoint.json"))[-1].write_bytes(b"{damaged")
with kvlog.open(root) as store:  # the damaged checkpoint is skipped, with a warning
    assert store.get("k4") == b"v"
"""


@pytest.mark.parametrize("configured", [False, True])
def test_a_warning_prints_only_when_logging_is_configured(tmp_path: Path, configured: bool) -> None:
    """kvlog's loggers hang under ``kvlog``, which has a NullHandler: a real warning (a
    damaged checkpoint skipped on open) prints nothing unless the application configures
    logging, as docs/operations.rst says."""
    mode = "configured" if configured else "silent"
    done = subprocess.run([sys.executable, "-c", WARN_ON_OPEN, str(tmp_path / "s"), mode], capture_output=True,
                          text=True, timeout=TIMEOUT_S, env=env_with(tmp_path), check=False)
    assert done.returncode == 0, done.stderr
    if configured:
        assert done.stderr.startswith("WARNING:kvlog.log:checkpoint 4 unusable"), done.stderr
    else:
        assert done.stderr == ""


# -- missing extras --------------------------------------------------------------------------

def test_require_names_the_extra_and_its_example_runs() -> None:
    assert doctest.testmod(kvlog.extras).failed == 0
    with pytest.raises(MissingExtraError) as caught:
        kvlog.extras.require("spark", ["no_such_module_here"], purpose="this job")
    error = caught.value
    assert isinstance(error, ConfigError) and (error.extra, error.module) == ("spark", "no_such_module_here")
    assert "pip install 'kvlog[spark]'" in str(error) and "Java 17" in str(error)
    again = pickle.loads(pickle.dumps(error))
    assert (type(again), str(again), again.extra) == (MissingExtraError, str(error), "spark")
    assert "MissingExtraError" in kvlog.errors.__all__


S3_OPEN = """
import kvlog
from kvlog.errors import MissingExtraError
try:
    kvlog.open("s3://bucket/prefix", storage_options={"endpoint_override": "http://127.0.0.1:9"})
except MissingExtraError as e:
    print(e.extra, e.module)
"""


def test_an_s3_store_without_obstore_names_the_s3_extra(tmp_path: Path, blocked: dict[str, str]) -> None:
    done = subprocess.run([sys.executable, "-c", S3_OPEN], capture_output=True, text=True, env=blocked,
                          timeout=TIMEOUT_S, check=False)
    assert (done.returncode, done.stdout, done.stderr) == (0, "s3 obstore\n", "")
    line = one_line(run("get", "s3://bucket/prefix", "k", env=blocked, cwd=tmp_path), 4)
    assert line == ("kvlog: the object store 's3://bucket/prefix' needs obstore, "
                    "which is not installed: pip install 'kvlog[s3]'"), line


@pytest.mark.parametrize("job", [("compact",), ("materialize", "{tmp}/out"), ("rebuild-index", "{tmp}/cache")])
def test_a_spark_job_without_pyspark_is_one_line(tmp_path: Path, blocked: dict[str, str],
                                                 job: tuple[str, ...]) -> None:
    store = tmp_path / "s"
    with kvlog.open(store, partitions=2) as s:
        s.put("k", "v")
    before = sorted(p.name for p in tmp_path.iterdir())
    line = one_line(run("spark", job[0], str(store), *(a.format(tmp=tmp_path) for a in job[1:]), env=blocked), 4)
    assert line.startswith(f"kvlog: kvlog spark {job[0]} needs pyspark"), line
    assert "pip install 'kvlog[spark]'" in line and "Java 17" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no output, no cache


@pytest.mark.parametrize("where", ["missing", "empty", "file"])
@pytest.mark.parametrize("job", ["compact", "materialize", "rebuild-index"])
def test_spark_jobs_check_the_store_before_spark(tmp_path: Path, blocked: dict[str, str], where: str,
                                                 job: str) -> None:
    """Not a store: one line, and pyspark was never imported (so no JVM started)."""
    target = tmp_path / "target"
    if where == "empty":
        target.mkdir()
    elif where == "file":
        target.write_text("not a store\n")
    extra = {"compact": [], "materialize": [str(tmp_path / "out")], "rebuild-index": [str(tmp_path / "c")]}[job]
    line = one_line(run("spark", job, str(target), *extra, env=blocked), 3)
    assert line.startswith(f"kvlog: no kvlog store at {str(target)!r}"), line
    assert not (tmp_path / "stubs" / "pyspark-imported").exists()
    assert not (tmp_path / "out").exists() and not (tmp_path / "c").exists()


@pytest.mark.parametrize("args, expected", [
    (("--storage-options", '{"region": "x"}'), "storage_options ['region'] do not apply"),
    (("rebuild-index:", "{tmp}/afile"), "CACHE_DIR '{tmp}/afile' is a file, not a directory"),
    (("materialize:", "{tmp}/afile"), "OUT '{tmp}/afile' is a file, not a directory"),
])
def test_bad_spark_options_are_refused_before_spark(tmp_path: Path, blocked: dict[str, str],
                                                    args: tuple[str, ...], expected: str) -> None:
    store = tmp_path / "s"
    with kvlog.open(store, partitions=2) as s:
        s.put("k", "v")
    (tmp_path / "afile").write_text("x\n")
    job, rest = ("compact", list(args)) if not args[0].endswith(":") else (args[0][:-1], list(args[1:]))
    line = one_line(run("spark", job, str(store), *(a.replace("{tmp}", str(tmp_path)) for a in rest),
                        env=blocked), 4)
    assert line.startswith("kvlog: " + expected.format(tmp=tmp_path)), line
    assert not (tmp_path / "stubs" / "pyspark-imported").exists()


def test_the_demo_without_pyspark_refuses_before_writing(tmp_path: Path, blocked: dict[str, str]) -> None:
    done = run("demo", "--records", "1000", "--path", str(tmp_path / "demo"), env=blocked)
    line = one_line(done, 4)
    assert line.startswith("kvlog: the Spark step of kvlog demo (--no-spark skips it) "
                           "needs pyspark"), line
    assert "pip install 'kvlog[spark]'" in line and done.stdout == ""
    assert not (tmp_path / "demo").exists()


def bench(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=TIMEOUT_S, check=False)


def test_the_benchmarks_without_matplotlib_refuse_before_running(tmp_path: Path,
                                                                 blocked: dict[str, str]) -> None:
    out = tmp_path / "results" / "out.json"
    done = bench("--quick", "--only", "store.puts", "--out", str(out), env=blocked)
    line = one_line(done)
    assert line == ("python -m benchmarks: drawing the charts (--no-plot skips them) needs matplotlib, "
                    "which is not installed: pip install 'kvlog[bench]'"), line
    assert done.returncode == 2 and done.stdout == "" and not out.parent.exists()
    line = one_line(bench("--quick", "--only", "log.s3", "--no-plot", "--out", str(out), env=blocked))
    assert line == ("python -m benchmarks: running the S3 benchmarks (--no-s3 skips them) needs obstore, "
                    "which is not installed: pip install 'kvlog[bench]'"), line
    assert not out.parent.exists()


def test_the_benchmarks_refuse_a_directory_as_their_results_file(tmp_path: Path) -> None:
    """``--out`` names the results file: a directory is refused before anything runs."""
    done = bench("--quick", "--only", "store.puts", "--no-plot", "--out", str(tmp_path),
                 env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert one_line(done) == (f"python -m benchmarks: --out {tmp_path} is a directory; give the results "
                              f"file, e.g. {tmp_path / 'latest.json'}")
    assert done.returncode == 2 and done.stdout == "" and list(tmp_path.iterdir()) == []


def test_a_failing_chart_loses_no_result(tmp_path: Path) -> None:
    """matplotlib imports but cannot draw (injected): the results file is written anyway and one
    line says the charts were skipped."""
    stubs = tmp_path / "stubs" / "matplotlib"
    stubs.mkdir(parents=True)
    (stubs / "__init__.py").write_text("def use(backend):\n    raise RuntimeError('no backend (injected)')\n")
    (stubs / "pyplot.py").write_text("")
    out = tmp_path / "results" / "out.json"
    done = bench("--quick", "--only", "store.puts", "--records", "2000", "--repeats", "1", "--out", str(out),
                 env=env_with(tmp_path / "stubs"))
    assert done.returncode == 0, done.stderr
    assert done.stderr == (f"charts skipped for {out} (the results are written): "
                           "RuntimeError: no backend (injected)\n")
    assert '"store.puts"' in out.read_text()


# -- the demo --------------------------------------------------------------------------------

def test_the_demo_removes_its_store_and_says_so(tmp_path: Path) -> None:
    path = tmp_path / "demo"
    done = run("demo", "--no-spark", "--records", "3000", "--path", str(path))
    assert done.returncode == 0 and done.stderr == "", done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"kvlog demo: store at {path} (removed at the end; --keep keeps it)"
    assert lines[1].startswith("writing 3,000 records") and lines[1].endswith(" ...")
    assert any(line.startswith("compacting ") and ": done in " in line for line in lines)
    assert lines[-2:] == ["all checks passed", f"removed the demo store {path} (--keep keeps it)"]
    assert not path.exists()


def test_the_demo_refuses_a_path_that_holds_files(tmp_path: Path) -> None:
    (tmp_path / "mine.txt").write_text("keep me\n")
    line = one_line(run("demo", "--no-spark", "--path", str(tmp_path)), 4)
    assert line.startswith(f"kvlog: demo path {str(tmp_path)!r} exists and is not an empty"), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt"]


def test_an_interrupted_demo_removes_its_store(tmp_path: Path) -> None:
    path = tmp_path / "demo"
    proc = subprocess.Popen([KVLOG, "demo", "--no-spark", "--records", "20000000", "--path", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("kvlog demo: store at ")
        assert proc.stdout.readline().startswith("writing 20,000,000 records")
        assert path.is_dir()
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (proc.returncode, stderr) == (130, "kvlog: interrupted\n")
    assert stdout == f"the demo stopped: removed the demo store {path} (--keep keeps it)\n"
    assert not path.exists()
