"""The torture checker's rule for writes a restore may have undone, on hand-built histories.

A write's commit lands at some moment between the start of the call that made it and its
acknowledgement. A restore removes every commit that landed between its snapshot and the moment
its files were in place. So the checker excuses a lost write exactly when those two spans meet,
and must still report one whose span lies wholly before the snapshot or wholly after the
restore.
"""

from __future__ import annotations

from pathlib import Path

from .model import FinalView, History, Journal, Write, check_final, key_name, make_value

KEY = key_name("t0a", 0)
SNAPSHOT_NS = 1_000_000
RESTORED_NS = 2_000_000


def _history(*spans: tuple[int, int]) -> tuple[History, list[Write]]:
    """A history of one writer's writes to ``KEY``, made and acknowledged at the ``spans`` given,
    with one restore from ``SNAPSHOT_NS`` to ``RESTORED_NS``."""
    history = History()
    journal = history.journal("t0a")
    writes = []
    for made, acked in spans:
        w = journal.record(KEY, journal.next_value(KEY, 5), gen=1)
        w.made_ns, w.acked_ns = made, acked
        writes.append(w)
    history.restores.append((SNAPSHOT_NS, RESTORED_NS))
    return history, writes


def _violations(history: History, value: bytes | None) -> list[str]:
    """What the checker says when every reader finds ``value`` under ``KEY`` (None: absent)."""
    scan = {} if value is None else {KEY: value}
    view = FinalView("a new process (new cache)", scan, {KEY: value}, None, {}, [])
    return check_final(history, [view], [KEY], lambda key: 0)


def test_a_write_whose_call_began_before_the_restore_ended_but_returned_after_it_may_be_lost() -> None:
    # The commit of the second write landed before the restore put the old files back (the
    # restore removed it); the put_sync that made it returned only after the restore ended.
    history, (first, _second) = _history((100, 200), (RESTORED_NS - 10, RESTORED_NS + 5_000))
    assert _violations(history, first.value) == []


def test_a_buffered_write_acknowledged_by_a_flush_after_the_restore_may_be_lost() -> None:
    # A plain put made before the snapshot, committed by a background flush before the restore
    # and acknowledged by a flush() after it: its commit may be one the restore removed.
    history, (first, _second) = _history((100, 200), (SNAPSHOT_NS - 10, RESTORED_NS + 5_000))
    assert _violations(history, first.value) == []


def test_a_write_made_after_the_restore_ended_must_survive() -> None:
    history, (first, second) = _history((100, 200), (RESTORED_NS + 1, RESTORED_NS + 5_000))
    problems = _violations(history, first.value)
    assert len(problems) == 1
    assert repr(KEY) in problems[0] and second.label in problems[0]


def test_a_write_acknowledged_before_the_snapshot_must_survive() -> None:
    history, (first,) = _history((100, SNAPSHOT_NS - 1))
    problems = _violations(history, None)
    assert len(problems) == 1
    assert repr(KEY) in problems[0] and first.label in problems[0]


def test_a_process_journal_keeps_when_each_write_began(tmp_path: Path) -> None:
    path = tmp_path / "p0.1.journal"
    journal = Journal("p0", path=path)
    key = key_name("p0", 0)
    made = journal.record(key, make_value("p0", key, 1, 3), gen=1)
    journal.ack(1)
    journal.close()
    (parsed,), _other = Journal.parse(path, "p0")
    assert (parsed.counter, parsed.made_ns, parsed.acked_ns) == (made.counter, made.made_ns, made.acked_ns)
    assert parsed.acked_ns is not None and parsed.made_ns <= parsed.acked_ns
