"""Producer windows remembered decoded (kvlog.meta.cache) after real commits: each remembered
value is the very value its stored bytes decode to, field by field and type by type, whichever
writer, retry, fence or refusal made it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

import kvlog
from kvlog.errors import ProducerFencedError
from kvlog.format.producer_state import producer_from_json
from kvlog.meta import cache
from kvlog.meta.env import unseal

QUIET = {"flush_interval_ms": 0, "background_compaction": False, "partitions": 4}


def _shape(value: Any) -> Any:
    """``value`` with the type of every part: equal shapes are equal values of equal types."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__, tuple((f.name, _shape(getattr(value, f.name))) for f in dataclasses.fields(value)))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((_shape(k), _shape(v)) for k, v in value.items())))
    if isinstance(value, tuple | list):
        return (type(value).__name__, tuple(_shape(v) for v in value))
    return (type(value).__name__, value)


def test_remembered_windows_are_their_bytes_decoded(tmp_path: Path) -> None:
    root, one, two = str(tmp_path / "root"), str(tmp_path / "one"), str(tmp_path / "two")
    cache._REMEMBERED.clear()
    a = kvlog.open(root, cache_dir=one, producer_id=7, **QUIET)
    b = kvlog.open(root, cache_dir=two, producer_id=8, **QUIET)
    try:
        for i in range(40):
            a.put(b"a%d" % i, b"v%d" % i, sync=i % 3 == 0)
            b.put(b"b%d" % i, b"w%d" % i, sync=i % 5 == 0)
            if i % 7 == 0:
                a.flush()
                b.refresh()
        a.flush()
        b.flush()
        fencer = kvlog.open(root, cache_dir=str(tmp_path / "three"), producer_id=7, **QUIET)
        fencer.put(b"f", b"1", sync=True)
        with pytest.raises(ProducerFencedError):
            a.put(b"late", b"x", sync=True)
        fencer.close()
        b.refresh()
        assert b.get(b"f") == b"1" and b.get(b"a39") == b"v39"
    finally:
        a.close(flush=False)
        b.close()
    producers = [(key, hit) for (db, key), hit in list(cache._REMEMBERED.items()) if db == "producers"]
    assert {int.from_bytes(key, "big") for key, _hit in producers} >= {7, 8}
    for key, (stored, value) in producers:
        decoded = producer_from_json(json.loads(unseal(key, stored)))
        assert _shape(decoded) == _shape(value), key
