"""Types of the compiled column loops (``_columns.c``); see kvlog.format.columns."""

from typing import Any

#: Any object with the buffer protocol: bytes, memoryview, a numpy array, an Arrow buffer.
Buffer = Any

def pack_binary(items: list[bytes | None], order: Buffer | None, /
                ) -> tuple[bytes, bytes, bytes | None, int]: ...
def index_values(key_ends: Buffer, key_data: Buffer, value_ends: Buffer, value_data: Buffer,
                 rows: Buffer, partitions: Buffer, positions: Buffer, inline_limit: int, /
                 ) -> list[tuple[bytes, bytes]]: ...
def latest_rows(key_ends: Buffer, key_data: Buffer, /) -> bytes: ...
