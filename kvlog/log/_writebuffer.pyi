"""Types of the compiled write buffer (``_writebuffer.c``)."""

from collections.abc import Callable
from typing import Any

class WriteBuffer:
    keys: list[bytes]
    values: list[bytes | None]
    stamps: list[int]
    fatal: BaseException | None
    buffered_bytes: int
    trigger: int

    def __init__(self, memtable: Any, lock: Any, now_ns: Callable[[], int], overhead: int) -> None: ...
    def put(self, key: bytes, value: bytes, /) -> bool: ...
