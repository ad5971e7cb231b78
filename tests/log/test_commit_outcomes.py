"""The outcome a commit returns is the one applying it stored in the cache, whether this log
applied it at once or another log's commits came between."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvlog.errors import ProducerFencedError
from kvlog.format.commit import Commit
from kvlog.log import Log
from kvlog.meta import CommitOutcome


def noting(the_log: Log, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, CommitOutcome]]:
    """Note each commit's id with the outcome ``commit`` returned for it."""
    seen: list[tuple[str, CommitOutcome]] = []
    original = the_log.commit

    def commit(build: Callable[[int], Commit], own: Any = None) -> CommitOutcome:
        ids: list[str] = []

        def noted(version: int) -> Commit:
            made = build(version)
            ids.append(made.commit_id)
            return made

        out = original(noted, own)
        seen.append((ids[-1], out))
        return out

    monkeypatch.setattr(the_log, "commit", commit)
    return seen


def test_returned_outcomes_are_the_stored_ones(tmp_path: Path, make_log: Any,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "root"
    mine = make_log(root, tmp_path / "mine")
    other = make_log(root, tmp_path / "other")
    seen = noting(mine, monkeypatch)
    producer = mine.producer()
    for i in range(3):
        producer.append(i % 4, [(b"k%d" % i, b"v")], base_sequence=0)
        other.producer().append(1, [(b"x%d" % i, b"y")], base_sequence=0)  # another cache's commit between
    newer = mine.producer(producer.producer_id)  # fences the first handle
    newer.append(0, [(b"n", b"v")], base_sequence=0)
    with pytest.raises(ProducerFencedError):
        producer.append(0, [(b"old", b"v")], base_sequence=1)
    assert len(seen) >= 6
    assert any(out.refusal is not None for _id, out in seen)
    for commit_id, out in seen:
        assert mine.outcome(commit_id) == out
