"""Storage backends chosen by URI scheme.

``open_storage("path/or/dir")`` and ``open_storage("file:///abs/dir")`` give a
:class:`LocalStorage`; ``open_storage("s3://bucket/prefix", storage_options)``
an object store through obstore (the ``s3`` extra), imported only then.
"""

from __future__ import annotations

import os
from typing import Any

from kvlog.errors import ConfigError
from kvlog.extras import require
from kvlog.storage.base import (
    BytesLike,
    ForwardStream,
    ObjectInfo,
    Storage,
    SwapConflict,
    check_name,
)
from kvlog.storage.local import LocalStorage
from kvlog.storage.uri import StoreLocation, parse_store_uri

__all__ = [
    "BytesLike",
    "ForwardStream",
    "ObjectInfo",
    "Storage",
    "SwapConflict",
    "LocalStorage",
    "check_name",
    "open_storage",
    "is_local_uri",
    "parse_store_uri",
    "StoreLocation",
]


def is_local_uri(uri: str | os.PathLike[str]) -> bool:
    """Whether ``uri`` names a local directory (a plain path or ``file://``); a URI that names
    nothing is a :class:`~kvlog.errors.ConfigError`."""
    return parse_store_uri(uri).directory is not None


def open_storage(
    uri: str | os.PathLike[str], storage_options: dict[str, Any] | None = None
) -> Storage:
    """The backend for ``uri``: a path, ``file:///abs/dir`` or ``s3://bucket/prefix``
    (checked by :func:`parse_store_uri` first)."""
    location = parse_store_uri(uri)
    options = dict(storage_options or {})
    if location.directory is not None:
        _no_options(options, location.text)
        return LocalStorage(location.directory)
    text = location.text
    require("s3", purpose=f"the object store {text!r}")  # MissingExtraError names the extra
    from kvlog.storage.object_store import ObjectStoreStorage

    return ObjectStoreStorage(text, options)


def _no_options(options: dict[str, Any], uri: str) -> None:
    if options:
        raise ConfigError(
            f"storage_options {sorted(options)} do not apply to the local store {uri!r}"
        )
