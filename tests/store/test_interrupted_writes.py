"""Ctrl-C at any step of a durable write never leaves the handle unable to flush or close.

A ``KeyboardInterrupt`` is raised at each point, in turn, where a signal can land in the code
a ``put(sync=True)`` runs through the flusher, the commit signal and the standard library's
locks and conditions (a trace function raises it where the interpreter would); and the
``SystemExit`` of a SIGTERM handler (``sys.exit(143)``) at each such point of the commit path
(appending, committing, checkpointing). After each,
closing the handle must finish (the exit hook of a program stopped by Ctrl-C does the same),
every write acknowledged before stays, and the interrupted write is there or not (it was
never acknowledged), never half.
"""

from __future__ import annotations

import dis
import sys
import threading
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import pytest

import kvlog
import kvlog.log.append
import kvlog.log.checkpoints
import kvlog.log.committer
import kvlog.log.flusher
import kvlog.log.waiting

#: The files whose lines the interrupt lands between: the flusher, the commit signal, and the
#: standard library's lock and condition code they use.
TRACED = {kvlog.log.flusher.__file__, kvlog.log.waiting.__file__, threading.__file__}
#: The commit path's files, where a SIGTERM handler's ``SystemExit`` lands in turn.
COMMIT_PATH = {kvlog.log.append.__file__, kvlog.log.committer.__file__, kvlog.log.checkpoints.__file__}
#: Settings with a background flusher and group commit, as by default, kept small.
SETTINGS: dict[str, Any] = {"partitions": 1, "background_compaction": False}
CLOSE_S = 30.0


#: Where CPython checks for signals inside code: when a call returns (``CALL``).
CALL = dis.opmap["CALL"]


def _handler(code: CodeType, offset: int) -> tuple[int, int, bool] | None:
    """The exception handler covering instruction ``offset`` of ``code`` (None: none)."""
    for entry in dis._parse_exception_table(code):  # type: ignore[attr-defined]
        if entry.start <= offset < entry.end:
            return entry.target, entry.depth, entry.lasti
    return None


class InterruptAt:
    """A trace function raising KeyboardInterrupt at the ``at``-th point of the traced code
    where a signal can land: just after a call returned, inside the handlers of the call.

    (A KeyboardInterrupt from Ctrl-C is raised where the interpreter checks for signals: as
    a ``CALL`` instruction ends, with that instruction's exception handlers. Raising at any
    traced line instead would also hit points no signal reaches, such as the end of a
    ``with`` block before its ``__exit__`` runs.)"""

    def __init__(self, at: int, traced: set[str] = TRACED,
                 raised: type[BaseException] = KeyboardInterrupt) -> None:
        self.at = at
        self.traced = traced
        self.raised = raised
        self.seen = 0
        self._last: dict[int, int | None] = {}

    def __call__(self, frame: FrameType, event: str, arg: object) -> Any:
        if frame.f_code.co_filename not in self.traced:
            return None  # no events in other frames
        if event == "call":
            frame.f_trace_opcodes = True
            frame.f_trace_lines = False
            self._last[id(frame)] = None
        elif event == "opcode":
            code, now = frame.f_code, frame.f_lasti
            before, self._last[id(frame)] = self._last.get(id(frame)), now
            if before is not None and code.co_code[before] == CALL and _handler(code, before) == _handler(code, now):
                self.seen += 1
                if self.seen == self.at:
                    raise self.raised
        return self


def _durable_put(store: kvlog.Store) -> None:
    store.put(b"during", b"2", sync=True)


def _put_then_flush(store: kvlog.Store) -> None:
    store.put(b"during", b"2")
    store.flush()


def _wait_for_a_commit(store: kvlog.Store) -> None:
    store.log.wait_for_commit(store.log.version, 0.01)
    store.put(b"during", b"2", sync=True)


#: What is interrupted: each writes ``during`` and returns once it is durable.
STEPS = {"put-sync": _durable_put, "put-then-flush": _put_then_flush, "wait-for-commit": _wait_for_a_commit}


def _interrupted_write(path: Path, step: str, at: int, traced: set[str] = TRACED,
                       raised: type[BaseException] = KeyboardInterrupt) -> bool:
    """Run ``step`` with ``raised`` at point ``at`` of ``traced``; close; whether it came."""
    store = kvlog.open(path, **SETTINGS)
    store.put(b"before", b"1", sync=True)
    trace = InterruptAt(at, traced, raised)
    interrupted = False
    sys.settrace(trace)
    try:
        STEPS[step](store)
    except raised:
        interrupted = True
    except RuntimeError as e:
        # CPython's Condition.wait releases the lock in a Python call and takes it back in a
        # ``finally`` it enters only later: an interrupt in between leaves the lock free, and
        # the ``with`` block around the wait fails to release it again. The lock stays
        # consistent (free), and the program is being interrupted anyway.
        if str(e) != "release unlocked lock":
            raise
        interrupted = True
    finally:
        sys.settrace(None)
    if interrupted:
        store.put(b"after", b"3")  # the handle goes on: the next write is flushed by close
    closer = threading.Thread(target=store.close, daemon=True)
    closer.start()
    closer.join(CLOSE_S)
    assert not closer.is_alive(), f"close() hangs after an interrupt of {step} at point {at}"
    with kvlog.open(path, **SETTINGS) as again:
        assert again.get(b"before") == b"1"
        during = again.get(b"during")
        assert during == b"2" if not interrupted else during in (None, b"2")
        assert again.get(b"after") == (b"3" if interrupted else None)
        assert again.check() == []
    return interrupted


@pytest.mark.parametrize("step", sorted(STEPS))
def test_ctrl_c_at_any_point_leaves_a_handle_that_writes_and_closes(tmp_path: Path, step: str) -> None:
    at = 1
    while _interrupted_write(tmp_path / f"s{at}", step, at):
        at += 1
    assert at > 20  # the step ran through that many points


@pytest.mark.parametrize("step", ["put-sync", "put-then-flush"])
def test_a_sigterm_handlers_exit_at_any_point_of_the_commit_path_loses_no_acknowledged_write(
        tmp_path: Path, step: str) -> None:
    at = 1
    while _interrupted_write(tmp_path / f"s{at}", step, at, COMMIT_PATH, SystemExit):
        at += 1
    assert at > 20  # the commit path ran through that many points
