"""Storage backends chosen by URI scheme.

``open_storage("path/or/dir")`` and ``open_storage("file:///abs/dir")`` give a
:class:`LocalStorage`; ``open_storage("s3://bucket/prefix", storage_options)``
an object store through obstore (the ``s3`` extra), imported only then.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import unquote, urlparse

from kvlog.errors import ConfigError
from kvlog.extras import require
from kvlog.storage.base import BytesLike, ForwardStream, ObjectInfo, Storage, check_name
from kvlog.storage.local import LocalStorage

__all__ = [
    "BytesLike",
    "ForwardStream",
    "ObjectInfo",
    "Storage",
    "LocalStorage",
    "check_name",
    "open_storage",
    "is_local_uri",
]


def is_local_uri(uri: str | os.PathLike[str]) -> bool:
    """Whether ``uri`` names a local directory (a plain path or ``file://``)."""
    text = os.fspath(uri)
    scheme = urlparse(text).scheme
    return scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt")


def open_storage(
    uri: str | os.PathLike[str], storage_options: dict[str, Any] | None = None
) -> Storage:
    """The backend for ``uri``: a path, ``file:///abs/dir`` or ``s3://bucket/prefix``."""
    text = os.fspath(uri)
    if not text:
        raise ConfigError("empty store URI: give a directory, file:///abs/dir or s3://bucket/prefix")
    parsed = urlparse(text)
    options = dict(storage_options or {})
    if parsed.scheme == "":
        _no_options(options, text)
        return LocalStorage(text)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise ConfigError(f"file URI {text!r} names a host; use file:///absolute/path")
        _no_options(options, text)
        return LocalStorage(unquote(parsed.path))
    if parsed.scheme in ("s3", "s3a"):
        require("s3", purpose=f"the object store {text!r}")  # MissingExtraError names the extra
        from kvlog.storage.object_store import ObjectStoreStorage

        return ObjectStoreStorage(text, options)
    raise ConfigError(
        f"unsupported URI scheme {parsed.scheme!r} in {text!r}: "
        "use a directory path, file:///absolute/path or s3://bucket/prefix"
    )


def _no_options(options: dict[str, Any], uri: str) -> None:
    if options:
        raise ConfigError(
            f"storage_options {sorted(options)} do not apply to the local store {uri!r}"
        )
