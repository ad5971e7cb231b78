"""Types of the structural check of kvlog's LMDB cache file (``_cache_check.c``); see
kvlog.index.entry.check_cache_file."""

from typing import Any

#: Any object with the buffer protocol: bytes, memoryview, an mmap.
Buffer = Any

def check_lmdb(data: Buffer, index_name: Buffer, runs_name: Buffer, sealed_names: tuple[bytes, ...], /
               ) -> str | None: ...
