"""Spark's save modes on a kvlog store, and the store a write creates.

``append`` and ``overwrite`` are Spark write modes that reach the data source;
``errorifexists`` (Spark's default) and ``ignore`` are refused by Spark itself
before any data source code runs, for every Python data source, so
:func:`save` runs them as an append with the ``saveMode`` option, which the
writer checks when the write is planned. :func:`prepare_store` is that
planning step: it validates the options, creates the store when it is missing
(never inside an unrelated non-empty directory) and tells the writer whether
the write is to be skipped (``ignore`` on an existing store).

A catalog table ``USING kvlog`` cannot work with Spark's built-in catalog:
Spark hands the reads and writes of such a table no options at all (not even
its path), so :func:`refuse_catalog_table` refuses ``CREATE TABLE`` when Spark
asks the source for the table's schema, and the reads and writes of a table
registered by ``saveAsTable`` fail with the error of a missing store URI
(:func:`spark_ext.options.store_uri`), which says so.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from kvlog.clock import SystemClock, SystemIdSource
from kvlog.config import StoreConfig
from kvlog.errors import ConfigError
from kvlog.format.identity import IDENTITY_NAME, Identity, decode_identity, encode_identity
from kvlog.storage import open_storage
from spark_ext.options import storage_options_from

__all__ = ["SAVE_MODE_OPTION", "Prepared", "prepare_store", "refuse_catalog_table", "save",
           "save_mode", "store_exists"]

#: The option by which :func:`save` passes ``errorifexists`` or ``ignore`` to the writer.
SAVE_MODE_OPTION = "saveMode"

#: Spark's names of the save modes (``error`` and ``default`` are ``errorifexists``).
_MODES = {"append": "append", "overwrite": "overwrite", "errorifexists": "errorifexists",
          "error": "errorifexists", "default": "errorifexists", "ignore": "ignore"}

def save_mode(mode: str) -> str:
    """The save mode ``mode`` names (Spark's spellings, any case); ConfigError for another."""
    found = _MODES.get(str(mode).lower())
    if found is None:
        raise ConfigError(f"mode={mode!r}: use 'append', 'overwrite', 'errorifexists' (or 'error') or 'ignore'")
    return found


def _local_dir(uri: str) -> Path | None:
    """The directory of a local store URI (a path or ``file:`` URI), None for object stores."""
    parsed = urlparse(uri)
    if parsed.scheme == "" or (len(parsed.scheme) == 1 and os.name == "nt"):
        return Path(uri)
    if parsed.scheme == "file" and parsed.netloc in ("", "localhost"):
        return Path(unquote(parsed.path))
    return None


def store_exists(uri: str, storage_options: dict[str, Any] | None = None) -> bool:
    """Whether a kvlog store (its ``kvlog.json``) is at ``uri``; creates nothing."""
    directory = _local_dir(uri)
    if directory is not None:
        return (directory / IDENTITY_NAME).exists()
    storage = open_storage(uri, storage_options)
    try:
        return storage.exists(IDENTITY_NAME)
    finally:
        storage.close()


def _refuse_to_create(uri: str) -> None:
    """The rule of ``kvlog put``: a store is created in a missing or empty directory only."""
    directory = _local_dir(uri)
    if directory is None or not os.path.lexists(directory):
        return
    if not directory.is_dir():
        raise ConfigError(f"{uri} is not a directory: kvlog cannot create a store there")
    if (directory / IDENTITY_NAME).exists() or not any(directory.iterdir()):
        return
    raise ConfigError(f"{uri} is not empty and is not a kvlog store (no {IDENTITY_NAME}): a write creates a "
                      "store only in a missing or empty directory. Nothing was written")


def _partitions(options: Mapping[str, str]) -> int | None:
    raw = options.get("partitions")
    if raw is None:
        return None
    try:
        wanted = int(str(raw).replace("_", ""))
    except ValueError:
        raise ConfigError(f"partitions={raw!r}: must be an integer") from None
    StoreConfig(partitions=wanted)  # validates: ConfigError out of range
    return wanted


@dataclass(frozen=True)
class Prepared:
    """What planning decided: the store's partitions, and whether the write changes nothing."""

    partitions: int
    skip: bool = False


def prepare_store(uri: str, storage_options: dict[str, Any] | None, options: Mapping[str, str],
                  overwrite: bool) -> Prepared:
    """Validate the write's options and make sure the store is there, before any task runs.

    A missing store is created with the ``partitions`` option (the store default without
    it); an existing one with other partitions is a ConfigError. ``saveMode=errorifexists``
    refuses an existing store, ``saveMode=ignore`` skips the write (``Prepared.skip``); a
    store another writer creates at the same moment counts as existing, since the identity
    file is written with put-if-absent.
    """
    options = {key.lower(): value for key, value in options.items()}  # Spark's options ignore case
    given = options.get(SAVE_MODE_OPTION.lower())
    if_exists = None if given is None else save_mode(given)
    if if_exists is not None:
        if if_exists not in ("errorifexists", "ignore"):
            raise ConfigError(f"{SAVE_MODE_OPTION}={given!r}: use 'errorifexists' or "
                              "'ignore' (append and overwrite are Spark's .mode())")
        if overwrite:
            raise ConfigError(f"{SAVE_MODE_OPTION}={if_exists!r} goes with .mode('append'), not overwrite")
    partitions = _partitions(options)
    _refuse_to_create(uri)
    storage = open_storage(uri, storage_options)
    try:
        try:
            identity = decode_identity(storage.read(IDENTITY_NAME))
            created = False
        except FileNotFoundError:
            ids = SystemIdSource()
            fresh = Identity(store_uuid=ids.token(16).hex(),
                             partitions=partitions if partitions is not None else StoreConfig().partitions,
                             created_ms=SystemClock().now_ms(),
                             fingerprint_seed=int.from_bytes(ids.token(8), "big"))
            try:
                storage.put_if_absent(IDENTITY_NAME, encode_identity(fresh))
                identity, created = fresh, True
            except FileExistsError:  # created meanwhile by another writer
                identity, created = decode_identity(storage.read(IDENTITY_NAME)), False
    finally:
        storage.close()
    if not created:
        if if_exists == "errorifexists":
            raise ConfigError(f"a kvlog store already exists at {uri} (mode errorifexists): write with "
                              "mode 'append' or 'overwrite'. Nothing was written")
        if if_exists == "ignore":
            return Prepared(identity.partitions, skip=True)
        if partitions is not None and partitions != identity.partitions:
            raise ConfigError(f"partitions={partitions} but the store at {uri} has {identity.partitions} "
                              "partitions. Nothing was written")
    return Prepared(identity.partitions)


def refuse_catalog_table(options: Mapping[str, str]) -> None:
    """Refuse ``CREATE TABLE ... USING kvlog``: Spark asks for the schema with the catalog's options.

    Spark's catalog passes ``provider`` (and ``location``, ``owner``) only there; the reads
    and writes of the table it would register get no options, so the table could never
    reach its store.
    """
    if "provider" in options:
        raise ConfigError("CREATE TABLE ... USING kvlog is not supported: Spark passes a catalog table's path "
                          "to no read or write of it. Read through CREATE TEMPORARY VIEW name USING kvlog OPTIONS "
                          "(path '...'); write with df.write.format('kvlog') or spark_ext.save")


def save(df: Any, uri: str, mode: str = "errorifexists", **options: Any) -> None:
    """Write ``df`` to the store at ``uri`` in any of Spark's save modes.

    ``append`` and ``overwrite`` are ``df.write.format("kvlog").mode(mode).save(uri)``.
    ``errorifexists`` (the default, as in Spark) raises ConfigError when a store is there,
    else creates it and writes; ``ignore`` does nothing when a store is there (no Spark
    job runs), else creates it and writes. ``options`` are the data source's options
    (``partitions``, ``storage.*``, ``cache_dir``), given as strings or values.
    """
    from spark_ext.jobs import register

    wanted = save_mode(mode)
    strings = {key: str(value) for key, value in options.items()}
    _refuse_to_create(uri)  # here too, so that the error is kvlog's own, not wrapped by Spark
    if wanted in ("errorifexists", "ignore"):
        if store_exists(uri, storage_options_from(strings)):
            if wanted == "ignore":
                return
            raise ConfigError(f"a kvlog store already exists at {uri} (mode errorifexists): write with "
                              "mode 'append' or 'overwrite'. Nothing was written")
        strings[SAVE_MODE_OPTION] = wanted
    register(df.sparkSession)
    df.write.format("kvlog").mode("overwrite" if wanted == "overwrite" else "append").options(**strings).save(uri)
