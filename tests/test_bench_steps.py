"""One benchmark step of either suite: its entries stamped, or an error entry when it raises."""

from __future__ import annotations

from functools import partial
from typing import Any

from benchmarks.suite import failed_entry, run_step


def test_a_step_that_raises_becomes_an_error_entry_with_its_traceback() -> None:
    def broken() -> dict[str, Any]:
        raise RuntimeError("disk full")

    (entry,) = run_step(broken, partial(failed_entry, "store.gets", "store", "random gets", "error"))
    assert entry["id"] == "store.gets" and entry["status"] == "error"
    assert "RuntimeError: disk full" in entry["reason"] and "disk full" in entry["traceback"]


def test_every_entry_a_step_produces_is_kept_and_stamped() -> None:
    entries = run_step(lambda: [{"id": "a"}, {"id": "b"}], partial(failed_entry, "x", "store", "x", "error"))
    assert [e["id"] for e in entries] == ["a", "b"]
    assert all("load_average" in e for e in entries)
