"""Publishing and reading commits in tests the way kvlog does: through the head.

A commit is live once the head (``log/head.json``) holds its bytes; its copy at
``log/<version>.json`` is where readers read it. A test that plants a commit by hand
publishes it with :func:`publish`; one that damages or restores the newest commit acts on
the head too (:func:`head_version`, :func:`set_head`).
"""

from __future__ import annotations

from collections.abc import Callable

from kvlog.errors import StorageError
from kvlog.format.envelope import split_document
from kvlog.log.head import HEAD_NAME, read_head
from kvlog.log.naming import commit_name
from kvlog.storage import LocalStorage, Storage, SwapConflict
from kvlog.storage.base import BytesLike

__all__ = ["HEAD_NAME", "HookBeforeSwap", "head_version", "publish", "set_head"]


class HookBeforeSwap(LocalStorage):
    """A real local storage that runs ``hook`` once, just before the next swap of the head (the
    writer built its commit: another process acts at that instant), fails the next ``failing``
    reads of the head (a transient error), and counts the swaps refused."""

    hook: Callable[[], None] | None = None
    failing = 0
    refused = 0

    def read_versioned(self, name: str, unless: str | None = None) -> tuple[bytes, str] | None:
        if self.failing and name == HEAD_NAME:
            self.failing -= 1
            raise StorageError(f"cannot read {name}: service unavailable")
        return super().read_versioned(name, unless)

    def swap(self, name: str, data: BytesLike, expected: str | None, copy_to: str | None = None) -> str:
        hook, self.hook = self.hook, None
        if hook is not None:
            hook()
        try:
            return super().swap(name, data, expected, copy_to)
        except SwapConflict:
            self.refused += 1
            raise


def publish(storage: Storage, data: bytes) -> str:
    """Make the commit ``data`` live, as a writer does: swap the head to it (conditional on the
    head read now), leaving its copy at its own name; returns the commit's name."""
    version = split_document(HEAD_NAME, data, "commit")[0]["version"]
    storage.swap(HEAD_NAME, data, read_head(storage).token, copy_to=commit_name(version))
    return commit_name(version)


def set_head(storage: Storage, version: int) -> None:
    """Point the head at the commit storage holds at ``version`` (an operator restoring it,
    or damage), unconditionally."""
    storage.put(HEAD_NAME, storage.read(commit_name(version)))


def head_version(storage: Storage) -> int:
    """The version the head holds (0: none)."""
    return read_head(storage).version
