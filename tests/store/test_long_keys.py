"""Keys around the index's 480-byte direct-key limit (kvlog/index/keys.py).

Keys of up to 480 bytes are LMDB keys as they are; longer keys are stored as
their first 480 bytes plus a hash, and scans re-sort runs of long keys. These
tests put keys of 479, 480, 481, 500 and 4096 bytes that share prefixes in one
store and compare every scan (forward and reverse, start/stop/prefix bounds
equal to the keys themselves and to their neighbours) with sorted(), in the
memtable, in the index, mixed, after a reopen and through a fresh cache.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from store_support import EXPLICIT_FLUSH, Root

from kvlog.errors import InvalidRecordError

HEAD = b"p" * 470


def _key(length: int, tail: bytes = b"") -> bytes:
    """A key of ``length`` bytes: the shared head, filler, and ``tail`` at the end."""
    body = HEAD + b"q" * (length - len(HEAD) - len(tail)) + tail
    assert len(body) == length
    return body


def _long_keys() -> list[bytes]:
    keys = set()
    for length in (479, 480, 481, 500, 4096):
        for tail in (b"", b"a", b"z", b"\x00", b"\xff", b"qa", b"qz"):
            keys.add(_key(length, tail))
    # Keys that differ before byte 480, at byte 480, and only far beyond it.
    keys.add(HEAD + b"a" * 30)  # 500 bytes, sorts before the q-filled ones
    keys.add(HEAD + b"r" * 30)  # 500 bytes, sorts after them
    keys.add(_key(480) + b"a" * 3000)
    keys.add(_key(480) + b"a" * 2999 + b"b")
    keys.add(_key(480) + b"a" * 2999)
    keys.add(b"p" * 4096)
    keys.add(b"p" * 481)
    keys.add(b"p" * 480)
    keys.add(b"p")  # short keys around them
    keys.add(b"pp")
    keys.add(b"q")
    return sorted(keys)


KEYS = _long_keys()


def _bounds() -> list[bytes]:
    out = set()
    for key in KEYS:
        out.update({key, key + b"\x00", key[:-1], key[:479], key[:480], key[:481]})
    out.discard(b"")
    return sorted(out)


BOUNDS = _bounds()


def _expected(model: dict[bytes, bytes], start: bytes | None, stop: bytes | None,
              prefix: bytes | None, reverse: bool) -> list[tuple[bytes, bytes]]:
    out = [(k, v) for k, v in sorted(model.items())
           if (start is None or k >= start) and (stop is None or k < stop)
           and (prefix is None or k.startswith(prefix))]
    return out[::-1] if reverse else out


def _check_all_scans(store: Any, model: dict[bytes, bytes]) -> None:
    for reverse in (False, True):
        assert list(store.scan(reverse=reverse)) == _expected(model, None, None, None, reverse)
        for bound in BOUNDS:
            for start, stop, prefix in ((bound, None, None), (None, bound, None), (None, None, bound)):
                got = list(store.scan(start, stop, prefix=prefix, reverse=reverse))
                assert got == _expected(model, start, stop, prefix, reverse), (
                    f"scan start={start and len(start)} stop={stop and len(stop)} "
                    f"prefix={prefix and len(prefix)} reverse={reverse}"
                )
        for start, stop in itertools.combinations(BOUNDS[::3], 2):
            got = list(store.scan(start, stop, reverse=reverse))
            assert got == _expected(model, start, stop, None, reverse)
        for start, prefix in itertools.product(BOUNDS[::7], (HEAD, _key(480), _key(481)[:480], b"p" * 480)):
            got = list(store.scan(start, None, prefix=prefix, reverse=reverse))
            assert got == _expected(model, start, None, prefix, reverse)


@pytest.mark.parametrize("where", ["memtable", "index", "mixed"])
def test_scan_order_around_the_boundary(local_root: Root, opened: list[Any], where: str) -> None:
    store = local_root.open(partitions=3, **EXPLICIT_FLUSH)
    opened.append(store)
    model = {}
    for i, key in enumerate(KEYS):
        value = b"%d:%d" % (len(key), i)
        store.put(key, value)
        model[key] = value
        if where == "mixed" and i % 3 == 0:
            store.flush()
    if where == "index":
        store.flush()
        assert store.stats()["memtable_keys"] == 0
    if where == "memtable":
        assert store.stats()["live_keys"] == 0
    assert len(store) == len(model)
    _check_all_scans(store, model)
    store.close()
    again = local_root.open(**EXPLICIT_FLUSH)
    opened.append(again)
    _check_all_scans(again, model)
    fresh = local_root.open(cache="fresh", read_only=True)  # an index rebuilt by replaying the log
    opened.append(fresh)
    _check_all_scans(fresh, model)
    assert again.check() == []


def test_get_and_delete_long_keys(root: Root, opened: list[Any]) -> None:
    store = root.open(**EXPLICIT_FLUSH)
    opened.append(store)
    siblings = [_key(480) + tail for tail in (b"a", b"b", b"a" * 20, b"b" * 3616)]  # one 480-byte head
    model = {key: b"v%d" % len(key) for key in [*siblings, _key(480), _key(479)]}
    for key, value in model.items():
        store.put(key, value)
    store.flush()
    for key, value in model.items():
        assert store.get(key) == value and store[key] == value and key in store
    assert store.get(_key(480) + b"c") is None  # same head, never written
    assert _key(480) + b"c" not in store
    del store[siblings[0]]
    store.delete(siblings[3], sync=True)
    del model[siblings[0]], model[siblings[3]]
    assert store.get(siblings[0]) is None and store.get(siblings[3]) is None
    assert store.get(siblings[1]) == model[siblings[1]]
    assert list(store.scan()) == sorted(model.items())
    assert list(store.scan(prefix=_key(480), reverse=True)) == sorted(model.items())[::-1][:-1]
    assert len(store) == len(model)
    store.put(siblings[0], b"back", sync=True)
    model[siblings[0]] = b"back"
    assert list(store.scan(start=siblings[0])) == _expected(model, siblings[0], None, None, False)
    assert store.check() == []
    reader = root.open(cache="reader", read_only=True)
    opened.append(reader)
    assert list(reader.scan()) == sorted(model.items())
    for key in siblings:
        assert reader.get(key) == model.get(key)


def test_large_values_under_long_keys(local_root: Root, opened: list[Any]) -> None:
    store = local_root.open(**EXPLICIT_FLUSH)
    opened.append(store)
    model = {_key(500, b"%d" % i): bytes([i]) * 5000 for i in range(10)}  # read from data files
    for key, value in model.items():
        store.put(key, value)
    store.flush()
    assert list(store.scan()) == sorted(model.items())
    assert all(store.get(k) == v for k, v in model.items())
    assert store.check() == []


def test_max_key_bytes_is_enforced(local_root: Root, opened: list[Any]) -> None:
    store = local_root.open(**EXPLICIT_FLUSH)
    opened.append(store)
    assert store.config.max_key_bytes == 4096
    store.put(b"k" * 4096, b"ok", sync=True)
    too_long = b"k" * 4097
    version, items = store.log.version, list(store.scan())
    for call in (
        lambda: store.put(too_long, b"v"),
        lambda: store.put(too_long.decode(), b"v"),
        lambda: store.delete(too_long),
        lambda: store.__setitem__(too_long, b"v"),
    ):
        with pytest.raises(InvalidRecordError):
            call()
    with pytest.raises(InvalidRecordError):
        with store.batch() as b:
            b.put(b"fine", b"v")
            b.put(too_long, b"v")
    assert store.flush() == version and list(store.scan()) == items
    # A UTF-8 key is measured in bytes: 2049 two-byte characters are 4098 bytes.
    with pytest.raises(InvalidRecordError):
        store.put("é" * 2049, b"v")
    store.put("é" * 2048, b"v", sync=True)
    assert store.get("é" * 2048) == b"v"


def test_a_smaller_max_key_bytes(local_root: Root, opened: list[Any]) -> None:
    store = local_root.open(max_key_bytes=600, **EXPLICIT_FLUSH)
    opened.append(store)
    store.put(b"k" * 600, b"ok")
    with pytest.raises(InvalidRecordError):
        store.put(b"k" * 601, b"v")
    assert list(store.scan()) == [(b"k" * 600, b"ok")]
