"""A handle the program never closes keeps its writes, as a file object does: buffered writes
are flushed when the interpreter exits normally (an uncaught exception, Ctrl-C, or SIGTERM
turned into ``SystemExit`` included) and when the garbage collector frees a dropped handle,
with a ``ResourceWarning``; a forked child never flushes or closes its parent's handle; a
failing exit-time flush is logged and warned about, not raised. Every case runs real processes
on a real store and reads the result from a fresh process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from store_support import child_env

#: No background flush and no compaction: what reaches storage is only what a close (or an
#: explicit flush) wrote, so a key a fresh process reads was flushed by the path under test.
QUIET = "flush_interval_ms=0, background_compaction=False"


def _run(code: str, *args: str, dev: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (``-X dev`` shows ResourceWarnings) with ``args``."""
    flags = ["-X", "dev"] if dev else []
    return subprocess.run([sys.executable, *flags, "-c", textwrap.dedent(code), *args], env=child_env(),
                          capture_output=True, text=True, timeout=120)


def _read(path: Path, *keys: str) -> list[bytes | None]:
    """The values of ``keys`` as a fresh process reads them (its own cache)."""
    out = _run("""
        import sys, kvlog
        with kvlog.open(sys.argv[1], read_only=True, cache_dir=sys.argv[2]) as s:
            print(repr([s.get(k) for k in sys.argv[3:]]))
    """, str(path), str(path.parent / f"reader-{os.urandom(4).hex()}"), *keys, dev=False)
    assert out.returncode == 0, out.stderr
    values: list[bytes | None] = eval(out.stdout)  # noqa: S307 - the repr of a list of bytes/None
    return values


def _started(code: str, *args: str) -> subprocess.Popen[str]:
    """``code`` running in a fresh interpreter, once it printed ``ready``."""
    proc = subprocess.Popen([sys.executable, "-X", "dev", "-c", textwrap.dedent(code), *args], env=child_env(),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_a_handle_never_closed_is_flushed_at_exit(tmp_path: Path) -> None:
    out = _run(f"""
        import sys, kvlog
        s = kvlog.open(sys.argv[1], {QUIET})
        s.put("k", "v")
        s.put("k2", "v2")
    """, str(tmp_path / "s"))
    assert out.returncode == 0, out.stderr
    assert "ResourceWarning: unclosed kvlog store" in out.stderr and "Traceback" not in out.stderr
    assert _read(tmp_path / "s", "k", "k2") == [b"v", b"v2"]


def test_a_handle_never_closed_is_flushed_when_an_exception_ends_the_program(tmp_path: Path) -> None:
    out = _run(f"""
        import sys, kvlog
        s = kvlog.open(sys.argv[1], {QUIET})
        s.put("k", "v")
        raise ValueError("the program failed")
    """, str(tmp_path / "s"))
    assert out.returncode == 1 and "ValueError: the program failed" in out.stderr
    assert _read(tmp_path / "s", "k") == [b"v"]


def test_a_handle_dropped_in_a_function_is_flushed_when_collected(tmp_path: Path) -> None:
    # The handle is dropped while its flusher and compactor threads run; once the collector
    # freed it, the process waits for its other threads (as a normal exit does) and leaves by
    # os._exit, which skips the exit hook: what the fresh process reads, the collection flushed.
    out = _run("""
        import gc, os, sys, threading, weakref, kvlog
        def work():
            s = kvlog.open(sys.argv[1], flush_interval_ms=60_000)
            s.put("k", "v")
            return weakref.ref(s)
        ref = work()
        gc.collect()
        for t in threading.enumerate():
            if t is not threading.main_thread():
                t.join()
        print("freed" if ref() is None else "alive", flush=True)
        os._exit(0)
    """, str(tmp_path / "s"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "freed"
    assert "ResourceWarning: unclosed kvlog store" in out.stderr and "Traceback" not in out.stderr
    assert _read(tmp_path / "s", "k") == [b"v"]


def test_a_handle_opened_after_one_was_dropped_writes_after_its_flush(tmp_path: Path) -> None:
    # A dropped handle's flush runs in a thread of its own once the collector frees it; the
    # next open waits for it, so the new handle's value of the same keys is the one that stays
    # (in the changelog too: the old handle's records come first).
    out = _run("""
        import gc, sys, kvlog
        def write(value):
            s = kvlog.open(sys.argv[1], flush_interval_ms=60_000)
            for i in range(200):
                s.put(f"k{i}", value)
            for i in range(20_000):  # a flush long enough to still run when the next open comes
                s.put(f"filler{i}", value * 50)
        write("old")
        gc.collect()
        with kvlog.open(sys.argv[1]) as s:
            for i in range(200):
                s.put(f"k{i}", "new")
    """, str(tmp_path / "s"))
    assert out.returncode == 0, out.stderr
    assert "ResourceWarning: unclosed kvlog store" in out.stderr and "Traceback" not in out.stderr
    assert _read(tmp_path / "s", *[f"k{i}" for i in range(200)]) == [b"new"] * 200
    changes = _run("""
        import sys, kvlog
        with kvlog.open(sys.argv[1], read_only=True, cache_dir=sys.argv[2]) as s:
            print(repr([r.value for r in s.changes() if r.key == b"k0"]))
    """, str(tmp_path / "s"), str(tmp_path / "changes-cache"), dev=False)
    assert changes.stdout.strip() == repr([b"old", b"new"]), changes.stderr


def test_ctrl_c_ends_the_program_and_flushes(tmp_path: Path) -> None:
    proc = _started(f"""
        import sys, kvlog
        s = kvlog.open(sys.argv[1], {QUIET})
        s.put("k", "v")
        print("ready", flush=True)
        sys.stdin.read()
    """, str(tmp_path / "s"))
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=120)
    assert "KeyboardInterrupt" in err
    assert _read(tmp_path / "s", "k") == [b"v"]


def test_sigterm_turned_into_system_exit_flushes(tmp_path: Path) -> None:
    proc = _started(f"""
        import signal, sys, kvlog
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        s = kvlog.open(sys.argv[1], {QUIET})
        s.put("k", "v")
        print("ready", flush=True)
        sys.stdin.read()
    """, str(tmp_path / "s"))
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    assert proc.returncode == 143
    assert _read(tmp_path / "s", "k") == [b"v"]


def test_sigterm_by_default_ends_the_process_without_a_flush(tmp_path: Path) -> None:
    proc = _started(f"""
        import sys, kvlog
        s = kvlog.open(sys.argv[1], {QUIET})
        s.put("durable", "1", sync=True)
        s.put("k", "v")
        print("ready", flush=True)
        sys.stdin.read()
    """, str(tmp_path / "s"))
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGTERM  # the library installs no handler
    assert _read(tmp_path / "s", "durable", "k") == [b"1", None]


FORKING = f"""
    import gc, multiprocessing, os, sys, kvlog
    s = kvlog.open(sys.argv[1], {QUIET})
    s.put("before-fork", "1")

    def child_drops(handle):
        del handle
        gc.collect()

    pid = os.fork()
    if pid == 0:  # the child leaves through a normal exit: the exit hook and the collector run
        del s
        gc.collect()
        sys.exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    p = multiprocessing.get_context("fork").Process(target=child_drops, args=(s,))
    p.start()
    p.join()
    assert p.exitcode == 0
    if sys.argv[2] == "discard":
        s.close(flush=False)  # what reaches storage now is only what a child flushed
    else:
        s.put("after-fork", "2")
        s.close()  # the parent's handle works: no child closed its state
    print("done", flush=True)
"""


def test_a_forked_child_never_flushes_its_parents_buffer(tmp_path: Path) -> None:
    out = _run(FORKING, str(tmp_path / "s"), "discard")
    assert out.returncode == 0 and out.stdout.strip() == "done", out.stderr
    assert _read(tmp_path / "s", "before-fork") == [None]


def test_a_forked_child_leaves_its_parents_handle_working(tmp_path: Path) -> None:
    out = _run(FORKING, str(tmp_path / "s"), "close")
    assert out.returncode == 0 and out.stdout.strip() == "done", out.stderr
    assert "ResourceWarning" not in out.stderr  # no child warned about (or closed) the parent's handle
    assert _read(tmp_path / "s", "before-fork", "after-fork") == [b"1", b"2"]


def test_a_failing_exit_flush_is_logged_and_warned_not_raised(tmp_path: Path) -> None:
    out = _run(f"""
        import logging, sys, kvlog
        from kvlog.storage import LocalStorage
        from kvlog.storage.faulty import FaultyStorage, fail
        logging.basicConfig(format="LOG %(name)s %(levelname)s %(message)s")
        storage = FaultyStorage(LocalStorage(sys.argv[1]))
        s = kvlog.open(storage, {QUIET}, commit_retries=2)
        s.put("k", "v")
        storage.set_plan([fail("*", times=None)])  # storage refuses everything from here on
    """, str(tmp_path / "s"))
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    assert "LOG kvlog ERROR kvlog store" in out.stderr and "its unflushed writes are lost" in out.stderr
    assert "RuntimeWarning: kvlog store" in out.stderr
    assert _read(tmp_path / "s", "k") == [None]


def test_an_async_store_never_closed_is_flushed_at_exit(tmp_path: Path) -> None:
    out = _run(f"""
        import asyncio, sys, kvlog.aio
        async def main():
            s = await kvlog.aio.open(sys.argv[1], {QUIET})
            await s.put("k", "v")
            main.kept = s  # still referenced when the program ends
        asyncio.run(main())
    """, str(tmp_path / "s"))
    assert out.returncode == 0, out.stderr
    assert "ResourceWarning: unclosed kvlog store" in out.stderr and "Traceback" not in out.stderr
    assert _read(tmp_path / "s", "k") == [b"v"]


def test_an_async_store_dropped_is_flushed_when_collected(tmp_path: Path) -> None:
    out = _run(f"""
        import asyncio, gc, os, sys, threading, kvlog.aio
        async def main():
            s = await kvlog.aio.open(sys.argv[1], {QUIET})
            await s.put("k", "v")
        asyncio.run(main())
        gc.collect()
        for t in threading.enumerate():
            if t is not threading.main_thread():
                t.join()
        os._exit(0)  # skips the exit hook: only the collection may have flushed
    """, str(tmp_path / "s"))
    assert out.returncode == 0, out.stderr
    assert "ResourceWarning: unclosed kvlog store" in out.stderr and "Traceback" not in out.stderr
    assert _read(tmp_path / "s", "k") == [b"v"]


def test_ctrl_c_while_a_flush_takes_the_buffer_loses_no_write(tmp_path: Path, monkeypatch: Any) -> None:
    # Ctrl-C raises KeyboardInterrupt between any two steps of the main thread; one raised while
    # a flush turns the buffer into batches must leave every record buffered for the next flush.
    import kvlog
    from kvlog.log import flusher

    real = flusher.split_by_partition
    calls = 0

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(flusher, "split_by_partition", interrupted)
    with kvlog.open(tmp_path / "s", flush_interval_ms=0, background_compaction=False) as store:
        for i in range(100):
            store.put(f"k{i}", f"v{i}")
        try:
            store.flush()
        except KeyboardInterrupt:
            pass
        else:
            raise AssertionError("the flush was not interrupted")
        store.flush()
    assert calls == 2
    assert _read(tmp_path / "s", *[f"k{i}" for i in range(100)]) == [f"v{i}".encode() for i in range(100)]
