"""Reading the kvlog data source's options, and opening stores from them on driver and executors."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvlog.errors import ConfigError

__all__ = ["store_uri", "storage_options_from", "STORAGE_PREFIX"]

STORAGE_PREFIX = "storage."


def store_uri(options: Mapping[str, str]) -> str:
    """The store URI of ``load(uri)`` / ``save(uri)`` (or the ``path`` option)."""
    uri = options.get("path") or options.get("uri")
    if not uri:
        raise ConfigError("the kvlog data source needs a store URI: .load(uri) or .save(uri)")
    return str(uri)


def storage_options_from(options: Mapping[str, str]) -> dict[str, Any] | None:
    """``storage.endpoint_override`` and friends, without the prefix (None when there are none)."""
    found = {k[len(STORAGE_PREFIX):]: v for k, v in options.items() if k.lower().startswith(STORAGE_PREFIX)}
    return found or None
