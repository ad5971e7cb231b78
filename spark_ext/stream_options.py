"""The options of the ``kvlog`` streaming source and sink, parsed and checked before a query runs.

Each side has a frozen dataclass built by ``parse`` from the options Spark hands the data
source. An unknown option, or a value that cannot be used, raises
:class:`~kvlog.errors.ConfigError` naming the known options, before any micro-batch is
planned or any file written (option names are case-insensitive, as Spark's are).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import xxhash

from kvlog.errors import ConfigError
from spark_ext.options import STORAGE_PREFIX, storage_options_from, store_uri

__all__ = ["STREAM_READ_OPTIONS", "StreamReadOptions", "StreamWriteOptions", "EARLIEST", "LATEST"]

#: ``startingOffsets`` in a JSON object: Kafka's markers for "the partition's first record"
#: and "the partition's end when the query starts".
EARLIEST = -2
LATEST = -1

_READ_OPTIONS = ("path", "startingOffsets", "maxRecordsPerTrigger", "view", "cache_dir")
#: The options only a streaming read has (a batch read refuses them).
STREAM_READ_OPTIONS = ("maxRecordsPerTrigger",)
#: ``checkpointLocation`` and ``queryName`` are Spark's own: ``writeStream`` passes them along.
_WRITE_OPTIONS = ("path", "checkpointLocation", "queryName", "cache_dir")


def _check_known(options: Mapping[str, str], known: tuple[str, ...], side: str) -> None:
    allowed = {name.lower() for name in known}
    unknown = sorted(k for k in options if k.lower() not in allowed and not k.lower().startswith(STORAGE_PREFIX))
    if unknown:
        raise ConfigError(
            f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(repr(k) for k in unknown)} for "
            f"the kvlog streaming {side}; the known options are {', '.join(known)} and storage.* "
            "(settings of the store's storage)")


def _lookup(options: Mapping[str, str], name: str) -> str | None:
    for key, value in options.items():
        if key.lower() == name.lower():
            return str(value)
    return None


@dataclass(frozen=True)
class StreamReadOptions:
    """``spark.readStream.format("kvlog")``: where to start, and how much per micro-batch.

    ``starting`` is ``"earliest"``, ``"latest"`` or a mapping partition -> offset, where an
    offset may be :data:`EARLIEST` or :data:`LATEST`; partitions the mapping leaves out start
    at their first record.
    """

    uri: str
    storage_options: dict[str, Any] | None
    cache_dir: str | None
    starting: str | dict[int, int]
    max_records_per_trigger: int | None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> StreamReadOptions:
        _check_known(options, _READ_OPTIONS, "source")
        view = (_lookup(options, "view") or "log").lower()
        if view != "log":
            raise ConfigError(f"view={view!r}: a kvlog stream reads the log view (every record in offset order)")
        raw_start = (_lookup(options, "startingOffsets") or "earliest").strip()
        starting: str | dict[int, int]
        if raw_start.lower() in ("earliest", "latest"):
            starting = raw_start.lower()
        else:
            starting = _offsets_json(raw_start)
        raw_max = _lookup(options, "maxRecordsPerTrigger")
        max_records: int | None = None
        if raw_max is not None:
            try:
                max_records = int(raw_max)
            except ValueError:
                max_records = 0
            if max_records < 1:
                raise ConfigError(f"maxRecordsPerTrigger={raw_max!r}: use a whole number >= 1")
        return cls(store_uri(options), storage_options_from(options), _lookup(options, "cache_dir") or None,
                   starting, max_records)


def _offsets_json(text: str) -> dict[int, int]:
    hint = ('startingOffsets is "earliest", "latest" or a JSON object of partition -> offset such as '
            '{"0": 10, "3": 0} (-2: the partition\'s first record, -1: its end when the query starts)')
    try:
        parsed = json.loads(text)
    except ValueError:
        raise ConfigError(f"startingOffsets={text!r}: {hint}") from None
    if not isinstance(parsed, dict) or not parsed:
        raise ConfigError(f"startingOffsets={text!r}: {hint}")
    out: dict[int, int] = {}
    for key, value in parsed.items():
        try:
            partition = int(key)
        except ValueError:
            raise ConfigError(f"startingOffsets={text!r}: partition {key!r} is not a number; {hint}") from None
        if not isinstance(value, int) or isinstance(value, bool) or value < EARLIEST or partition < 0:
            raise ConfigError(f"startingOffsets={text!r}: partition {key!r} -> {value!r}; {hint}")
        out[partition] = value
    return out


@dataclass(frozen=True)
class StreamWriteOptions:
    """``df.writeStream.format("kvlog")``: the store, and the query's checkpoint.

    The checkpoint location is the query's identity: :attr:`producer_id` is derived from it,
    so a query restarted from its checkpoint writes as the same idempotent producer.
    """

    uri: str
    storage_options: dict[str, Any] | None
    cache_dir: str | None
    checkpoint: str

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> StreamWriteOptions:
        _check_known(options, _WRITE_OPTIONS, "sink")
        checkpoint = _lookup(options, "checkpointLocation")
        if not checkpoint:
            raise ConfigError(
                "the kvlog streaming sink needs .option('checkpointLocation', dir): the query's checkpoint "
                "is its identity as an idempotent producer, which makes its writes exactly once")
        return cls(store_uri(options), storage_options_from(options), _lookup(options, "cache_dir") or None,
                   normal_checkpoint(checkpoint))

    @property
    def producer_id(self) -> int:
        """The query's producer id: a 63-bit hash of its checkpoint location."""
        return xxhash.xxh3_64_intdigest(f"kvlog-stream-sink:{self.checkpoint}".encode()) >> 1


def normal_checkpoint(location: str) -> str:
    """``location`` spelled one way: an absolute local path (``file:`` dropped), or the URI as given.

    A relative path is resolved against this process's working directory, which for Spark's
    Python workers is the driver JVM's, the one Spark resolves the checkpoint against."""
    text = location.strip()
    if text.startswith("file:"):
        text = "/" + text[len("file:"):].lstrip("/")
    if "://" in text:
        return text.rstrip("/")
    return os.path.normpath(os.path.abspath(text))
