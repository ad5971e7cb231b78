"""CRC32C (Castagnoli), the checksum of every batch, data file, commit and checkpoint."""

from __future__ import annotations

import crc32c as _crc32c

__all__ = ["crc32c"]


def crc32c(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """CRC32C of ``data``, continuing from ``value``."""
    return int(_crc32c.crc32c(data, value))
