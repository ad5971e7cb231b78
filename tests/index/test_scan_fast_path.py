"""Scans over a flushed store (values read in bulk while inline) agree with a model.

The entries mix inline and non-inline values and long keys, in runs longer than one bulk
read, so a scan switches from the bulk path to the general one at every kind of entry.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import kvlog


def _model() -> dict[bytes, bytes]:
    model: dict[bytes, bytes] = {}
    for i in range(3000):
        key = b"k%05d" % i
        if i % 997 == 0:
            value = b"big" * 200  # past inline_value_bytes: read from its batch
        else:
            value = b"v%d" % i
        model[key] = value
        if i % 1200 == 0:
            model[key + b"L" * 600] = b"long%d" % i  # a long key right after a short one
    return model


@pytest.fixture(scope="module")
def flushed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[kvlog.Store, dict[bytes, bytes]]]:
    path: Path = tmp_path_factory.mktemp("scan") / "store"
    store = kvlog.open(path, partitions=3, inline_value_bytes=64, background_compaction=False)
    model = _model()
    for key, value in model.items():
        store.put(key, value)
    store.delete(b"k00002")
    del model[b"k00002"]
    store.flush()
    assert store.stats()["memtable_keys"] == 0
    yield store, model
    store.close()


def _expected(model: dict[bytes, bytes], start: bytes | None, stop: bytes | None,
              prefix: bytes | None) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in sorted(model.items())
            if (start is None or k >= start) and (stop is None or k < stop)
            and (prefix is None or k.startswith(prefix))]


@pytest.mark.parametrize(("start", "stop", "prefix"), [
    (None, None, None),
    (b"k00500", None, None),
    (None, b"k02500", None),
    (b"k00996", b"k01001", None),
    (b"k01200", b"k01200" + b"L" * 700, None),
    (b"k01200" + b"L" * 600, None, None),
    (None, None, b"k012"),
    (None, None, b"k01200L"),
    (b"k09", None, None),
])
def test_scan_matches_the_model(flushed: tuple[kvlog.Store, dict[bytes, bytes]], start: bytes | None,
                                stop: bytes | None, prefix: bytes | None) -> None:
    store, model = flushed
    assert list(store.scan(start, stop, prefix=prefix)) == _expected(model, start, stop, prefix)


def test_abandoned_scan_releases_its_snapshot(flushed: tuple[kvlog.Store, dict[bytes, bytes]]) -> None:
    store, model = flushed
    for _ in range(2000):  # more than the LMDB reader slots, if snapshots leaked
        it = store.scan()
        assert next(it)[0] == min(model)
        del it
    assert len(store) == len(model)
