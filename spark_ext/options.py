"""Reading the kvlog data source's options, and opening stores from them on driver and executors."""

from __future__ import annotations

import os
from collections.abc import Mapping
from hashlib import sha256
from pathlib import Path
from typing import Any

from kvlog.errors import ConfigError

__all__ = ["store_uri", "storage_options_from", "driver_cache_dir", "STORAGE_PREFIX"]

STORAGE_PREFIX = "storage."


def store_uri(options: Mapping[str, str]) -> str:
    """The store URI of ``load(uri)`` / ``save(uri)`` (or the ``path`` option)."""
    uri = options.get("path") or options.get("uri")
    if not uri:
        raise ConfigError(
            "the kvlog data source needs a store URI: .load(uri) or .save(uri), or OPTIONS (path '...') of "
            "CREATE TEMPORARY VIEW ... USING kvlog. A catalog table (CREATE TABLE ... USING kvlog, "
            "saveAsTable) cannot be read or written: Spark passes it no path; use a temporary view")
    return str(uri)


def storage_options_from(options: Mapping[str, str]) -> dict[str, Any] | None:
    """``storage.endpoint_override`` and friends, without the prefix (None when there are none)."""
    found = {k[len(STORAGE_PREFIX):]: v for k, v in options.items() if k.lower().startswith(STORAGE_PREFIX)}
    return found or None


def driver_cache_dir(uri: str, cache_dir: str | os.PathLike[str] | None) -> str:
    """The metadata cache the Spark driver plans with: ``cache_dir``, or a private one per store.

    Never the store's own cache: the driver replays without maintaining the key index,
    which must not touch a cache that applications read through.
    """
    if cache_dir:
        return os.fspath(cache_dir)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvlog" / "spark"
    return str(base / sha256(os.path.abspath(uri).encode() if "://" not in uri else uri.encode()).hexdigest()[:24])
