"""The Spark jobs on a real Spark standalone cluster: a master and a worker on loopback.

Both daemons come from pyspark's own ``bin/spark-class`` (``SPARK_HOME`` = the
pyspark package directory), each in its own process group, so stopping them
(SIGTERM, then SIGKILL) also takes the executors and Python workers the worker
started. The commands under test are ``kvlog spark compact URI --master
spark://...`` and ``kvlog spark materialize URI OUT --master spark://...``,
run as subprocesses (also in their own process groups), and a streaming query
(``stream_copy.py``: the ``kvlog`` streaming source into the ``kvlog`` sink) with a
driver of its own on the same cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import kvlog

pytestmark = [pytest.mark.spark, pytest.mark.slow]

KVLOG = str(Path(sys.executable).with_name("kvlog"))
START_TIMEOUT_S = 120
COMMAND_TIMEOUT_S = 300
#: For every JVM here (daemons, drivers, executors): C1 only and the serial collector start and
#: run small jobs about 30 % faster on a busy 2-core machine.
FAST_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _env(home: Path) -> dict[str, str]:
    return dict(os.environ, SPARK_HOME=str(home), SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
                PYSPARK_DRIVER_PYTHON=sys.executable, SPARK_DAEMON_MEMORY="512m", JDK_JAVA_OPTIONS=FAST_JVM)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group, SIGKILL it if it lingers, and reap the leader."""
    for sig, wait_s in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and _group_alive(process.pid):
            process.poll()
            time.sleep(0.2)
        if not _group_alive(process.pid):
            break
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=5)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie leader still counts for killpg; look at the member processes themselves.
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def _wait_for(log: Path, text: str, process: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if text in log.read_text(errors="replace"):
            return
        if process.poll() is not None:
            break
        time.sleep(0.5)
    raise AssertionError(f"the Spark {what} did not start:\n{log.read_text(errors='replace')[-4000:]}")


@contextlib.contextmanager
def standalone_cluster(work: Path, groups: list[int]) -> Iterator[str]:
    """A master and a one-core worker on 127.0.0.1; yields the master URL; stops both."""
    home = _spark_home()
    spark_class = str(home / "bin" / "spark-class")
    env = _env(home)
    port, master_ui, worker_ui = _free_port(), _free_port(), _free_port()
    url = f"spark://127.0.0.1:{port}"
    started: list[subprocess.Popen[bytes]] = []
    try:
        master_log = work / "master.log"
        with open(master_log, "wb") as out:
            master = subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                 "--port", str(port), "--webui-port", str(master_ui)],
                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        started.append(master)
        groups.append(master.pid)
        _wait_for(master_log, "I have been elected leader", master, "master")
        worker_log = work / "worker.log"
        (work / "worker-dir").mkdir()
        with open(worker_log, "wb") as out:
            worker = subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
                 "--cores", "1", "--memory", "1g", "--webui-port", str(worker_ui),
                 "--work-dir", str(work / "worker-dir")],
                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        started.append(worker)
        groups.append(worker.pid)
        _wait_for(worker_log, "Successfully registered with master", worker, "worker")
        yield url
    finally:
        for process in reversed(started):
            _stop(process)


def run_command(args: list[str], cwd: Path, groups: list[int]) -> subprocess.CompletedProcess[str]:
    """Run ``kvlog ARGS`` in its own process group; kill the whole group on a timeout."""
    env = _env(_spark_home())
    process = subprocess.Popen([KVLOG, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               cwd=cwd, env=env, start_new_session=True)
    groups.append(process.pid)
    try:
        stdout, stderr = process.communicate(timeout=COMMAND_TIMEOUT_S)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # the JVM the command started, if anything is left
        process.wait()
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def run_stream_copy(args: list[str], cwd: Path, groups: list[int]) -> subprocess.CompletedProcess[str]:
    """Run ``stream_copy.py ARGS`` (a streaming query's driver) as :func:`run_command` runs ``kvlog``."""
    env = dict(_env(_spark_home()), PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    process = subprocess.Popen([sys.executable, str(Path(__file__).with_name("stream_copy.py")), *args],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd, env=env,
                               start_new_session=True)
    groups.append(process.pid)
    try:
        stdout, stderr = process.communicate(timeout=COMMAND_TIMEOUT_S)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def test_compact_and_materialize_on_a_standalone_cluster(tmp_path: Path) -> None:
    path = tmp_path / "store"
    model: dict[bytes, bytes] = {}
    with kvlog.open(str(path), partitions=4, background_compaction=False, flush_interval_ms=0) as store:
        for i in range(4000):
            key = b"c%04d" % (i % 500)
            if i % 8 == 0:
                store.delete(key)
                model.pop(key, None)
            else:
                store.put(key, b"value-%d" % i)
                model[key] = b"value-%d" % i
            if i % 500 == 499:
                store.flush()
        records_before = sum(1 for _ in store.changes())
    groups: list[int] = []
    try:
        with standalone_cluster(tmp_path, groups) as master:
            done = run_command(["spark", "compact", str(path), "--master", master], tmp_path, groups)
            assert done.returncode == 0, done.stderr[-4000:]
            report = json.loads(done.stdout)
            assert report["rounds"] == 1 and not report["refused"]
            assert report["records_read"] == records_before and report["records_removed"] > 0
            out = tmp_path / "latest"
            done = run_command(["spark", "materialize", str(path), str(out), "--master", master], tmp_path,
                               groups)
            assert done.returncode == 0, done.stderr[-4000:]
            assert json.loads(done.stdout)["rows"] == len(model)
            # The streaming source and sink: the compacted log, copied in micro-batches of 250.
            copy = tmp_path / "stream-copy"
            kvlog.open(str(copy), partitions=4).close()
            done = run_stream_copy([master, str(path), str(copy), str(tmp_path / "stream-ck"), "250"], tmp_path,
                                   groups)
            assert done.returncode == 0, done.stderr[-4000:]
            # The executors really ran on the worker.
            assert any((tmp_path / "worker-dir").glob("app-*/*/stderr"))
    finally:
        leftovers = [pgid for pgid in groups if _group_alive(pgid)]
        for pgid in leftovers:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
    assert not leftovers, f"process groups left running: {leftovers}"
    table = pq.read_table(out, columns=["key", "value"])
    assert dict(zip(*(c.to_pylist() for c in table.columns), strict=True)) == model
    with kvlog.open(str(path), read_only=True) as store:
        rows = [(r.partition, r.key) for r in store.changes()]
        assert max(Counter(rows).values()) == 1
        assert len(rows) == records_before - report["records_removed"]
        assert dict(store.scan()) == model
        assert store.check() == []
        source_log = Counter((r.partition, r.key, r.value, r.timestamp_ms) for r in store.changes())
    with kvlog.open(str(copy), read_only=True) as store:
        assert Counter((r.partition, r.key, r.value, r.timestamp_ms) for r in store.changes()) == source_log
        assert store.log.version == -(-len(rows) // 250)  # created (no commit), then one commit per micro-batch
