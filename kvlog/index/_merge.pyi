"""Types of the compiled merge of index runs (``_merge.c``); see kvlog.index.merge."""

from typing import Any

#: Any object with the buffer protocol: bytes, memoryview, a numpy array, an Arrow buffer.
Buffer = Any

def merge(runs: list[Any], lower: Buffer | None, limit: int, /
          ) -> tuple[list[tuple[bytes, bytes]], list[bytes]]: ...
