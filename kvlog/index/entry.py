"""Index entries: what the key index says about a key, and the bytes it says it with.

An index value (in the B-tree and in index runs alike: settling copies run values into the
B-tree) is ``>IHQB``, the CRC32C then partition, offset and flags, followed by the expiry time
(``>q``, ms since the epoch; flag 4: the record has a time to live), the long key's length
(``>I``) and bytes (flag 2) and then the inline value (flag 1). The fast path
(:func:`index_inline`) never answers with the value of an entry that expires: such an entry is
decoded (:func:`decode_entry`), and its expiry checked, before its value is used. The CRC32C covers the
LMDB key followed by everything after the CRC itself, so a damaged value, or a value moved to
another key, is never taken for data: every read of the index checks it, and a mismatch raises
``CorruptDataError`` naming the cache and marks the key index for rebuild (meta ``index_ready``
= 0, see :mod:`kvlog.meta.env`).
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvlog._native import load
from kvlog.errors import CorruptDataError, KvlogError
from kvlog.format.checksum import crc32c
from kvlog.format.columns import INDEX_HEAD_BYTES as _PACKED_HEAD_BYTES
from kvlog.index.keys import DIRECT_KEY_BYTES, encode_index_key
from kvlog.meta.env import SEALED_DBS, CacheDamage, LmdbEnv

if TYPE_CHECKING:
    from kvlog.index import _cache_check, _runs
else:
    _runs = load("kvlog.index._runs", "kvlog.index._runs_py")
    _cache_check = load("kvlog.index._cache_check", "kvlog.index._cache_check_py")

__all__ = [
    "EXPIRES_FLAG", "RecordExpired", "INDEX_HEAD_BYTES", "INLINE_FLAG", "IndexEntry", "check_cache_file", "decode_entry", "decode_index_value",
    "encode_index_value", "entry_damage", "index_damage", "index_inline",
]

_INDEX_HEAD = struct.Struct(">IHQB")
_INDEX_BODY = struct.Struct(">HQB")  # the head after its CRC
_CRC = struct.Struct(">I")
_KEYLEN = struct.Struct(">I")
_EXPIRES = struct.Struct(">q")
_INLINE = 1
_LONG = 2
EXPIRES_FLAG = 4
#: An index value is ``>IHQB`` (CRC32C, partition, offset, flags) then the long key's length and
#: bytes (flag 2) then the inline value (flag 1); see the module's docstring. A value whose byte
#: :data:`INDEX_HEAD_BYTES` - 1 is :data:`INLINE_FLAG` is a short key's entry with its value
#: inline from byte INDEX_HEAD_BYTES on, once its checksum is checked (:func:`index_inline`).
INDEX_HEAD_BYTES = _INDEX_HEAD.size
if INDEX_HEAD_BYTES != _PACKED_HEAD_BYTES:  # kvlog.format.columns writes the same head in C
    raise ImportError(f"index heads of {INDEX_HEAD_BYTES} and {_PACKED_HEAD_BYTES} bytes disagree")
INLINE_FLAG = _INLINE


class RecordExpired(KvlogError):
    """The record an expiring index entry points at is gone: compaction removed it once it
    expired. Readers treat the key as absent (the store never lets this error out)."""


@dataclass(frozen=True)
class IndexEntry:
    """Where a key's latest value is: its partition and offset, the value itself when inlined,
    and when the record expires (ms since the epoch; None: never)."""

    partition: int
    offset: int
    inline: bytes | None
    expires_ms: int | None = None

    def expired(self, now_ms: int) -> bool:
        """Whether the record has expired at ``now_ms`` (its expiry reached): reads hide it."""
        return self.expires_ms is not None and now_ms >= self.expires_ms


def entry_damage(lmdb_key: bytes) -> CacheDamage:
    """The damage of the index entry of ``lmdb_key`` that failed its checks."""
    shown = lmdb_key[:DIRECT_KEY_BYTES]
    return CacheDamage(f"the key index's entry for {shown[:40]!r}{'...' if len(shown) > 40 else ''} "
                       "is malformed or fails its checksum", index_only=True)


def decode_entry(lmdb_key: bytes, value: bytes) -> tuple[bytes, IndexEntry]:
    """The user key and entry of an index value, its checksum checked (``CacheDamage``)."""
    try:
        key, partition, offset, inline, expires = _runs.decode(lmdb_key, value)
    except ValueError:
        raise entry_damage(lmdb_key) from None
    return key, IndexEntry(partition, offset, inline, expires)


def encode_index_value(key: bytes, partition: int, offset: int, inline: bytes | None,
                       expires_ms: int | None = None) -> bytes:
    """The index value of user ``key`` pointing at ``(partition, offset)``, with ``inline`` (its
    value) unless None, expiring at ``expires_ms`` unless None: head, expiry, long key if any,
    inline value, sealed with the CRC32C."""
    lmdb_key = encode_index_key(key)
    long_key = len(key) > DIRECT_KEY_BYTES
    flags = ((_INLINE if inline is not None else 0) | (_LONG if long_key else 0)
             | (EXPIRES_FLAG if expires_ms is not None else 0))
    parts = [_INDEX_BODY.pack(partition, offset, flags)]
    if expires_ms is not None:
        parts.append(_EXPIRES.pack(expires_ms))
    if long_key:
        parts += [_KEYLEN.pack(len(key)), key]
    if inline is not None:
        parts.append(inline)
    body = b"".join(parts)
    return _CRC.pack(crc32c(body, crc32c(lmdb_key))) + body


def decode_index_value(key: bytes, value: bytes) -> IndexEntry:
    """The entry of an index value read for ``key`` (a user key), its checksum checked: raises
    ``ValueError`` (a :class:`~kvlog.meta.env.CacheDamage`) if it fails (see :func:`index_damage`)."""
    return decode_entry(encode_index_key(key), value)[1]


#: ``index_inline(lmdb_key, value)``: a short key's inline value from its index value (None: the
#: value is in a data file), the checksum checked: ``ValueError`` if it fails (see
#: :func:`index_damage`). The compiled function itself: the get fast path calls it per get.
index_inline: Callable[[bytes, bytes], bytes | None] = _runs.inline


def index_damage(env: LmdbEnv, lmdb_key: bytes) -> CorruptDataError:
    """The error for an index entry of ``lmdb_key`` that failed its checks, once the key index
    is marked for rebuild."""
    damage = entry_damage(lmdb_key)
    return env.damaged(str(damage), index_only=True)


def check_cache_file(view: mmap.mmap) -> str | None:
    """The structural check of a whole LMDB cache file mapped at ``view`` (see
    :func:`kvlog.meta.env.check_lmdb_file`): every page of its B-trees, every key-index entry and
    index run, and every sealed value; None if whole, else the first damage found."""
    found: str | None = _cache_check.check_lmdb(view, b"index", b"runs", tuple(name.encode() for name in SEALED_DBS))
    return found
