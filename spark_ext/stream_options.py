"""The options of the ``kvlog`` streaming source and sink, parsed and checked before a query runs.

Each side has a frozen dataclass built by ``parse`` from the options Spark hands the data
source. An unknown option, or a value that cannot be used, raises
:class:`~kvlog.errors.ConfigError` naming the known options, before any micro-batch is
planned or any file written (option names are case-insensitive, as Spark's are).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import xxhash

from kvlog.errors import ConfigError
from spark_ext.options import storage_options_from, store_uri
from spark_ext.read_options import (
    OffsetSpec,
    TimestampSpec,
    check_known,
    parse_by_timestamp,
    parse_min_partitions,
    parse_offsets,
)

__all__ = ["STREAM_READ_OPTIONS", "StreamReadOptions", "StreamWriteOptions"]

_READ_OPTIONS = ("path", "startingOffsets", "startingOffsetsByTimestamp", "maxRecordsPerTrigger", "minPartitions",
                 "view", "cache_dir")
#: Options of a batch read that say where it ends: a stream has none (Kafka's source refuses them too).
_ENDING_OPTIONS = ("endingOffsets", "endingOffsetsByTimestamp")
#: The options only a streaming read has (a batch read refuses them).
STREAM_READ_OPTIONS = ("maxRecordsPerTrigger",)
#: ``checkpointLocation`` and ``queryName`` are Spark's own: ``writeStream`` passes them along.
_WRITE_OPTIONS = ("path", "checkpointLocation", "queryName", "cache_dir")


def _lowered(options: Mapping[str, str]) -> dict[str, str]:
    """The options by lower-case name (Spark's option names are case-insensitive)."""
    return {str(k).lower(): str(v) for k, v in options.items()}


@dataclass(frozen=True)
class StreamReadOptions:
    """``spark.readStream.format("kvlog")``: where to start, and how much per micro-batch.

    ``starting`` is parsed as a batch read's ``startingOffsets``
    (:func:`spark_ext.read_options.parse_offsets`): partitions it leaves out start at their
    first record. ``starting_times`` is ``startingOffsetsByTimestamp``, refused beside
    ``startingOffsets``; it replaces ``starting`` (which is then ``earliest``) for the
    partitions it names. ``min_partitions`` is ``minPartitions``, applied to each micro-batch.
    """

    uri: str
    storage_options: dict[str, Any] | None
    cache_dir: str | None
    starting: OffsetSpec
    max_records_per_trigger: int | None
    starting_times: TimestampSpec | None = None
    min_partitions: int | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> StreamReadOptions:
        lowered = _lowered(options)
        for name in _ENDING_OPTIONS:
            if name.lower() in lowered:
                raise ConfigError(f"{name} is an option of batch reads: a kvlog stream has no end, it reads "
                                  "what is committed as it comes (as the Kafka source, which refuses it in a "
                                  "streaming query); bound a run with trigger(availableNow=True)")
        check_known(options, _READ_OPTIONS, "for the kvlog streaming source")
        view = lowered.get("view", "log").lower()
        if view != "log":
            raise ConfigError(f"view={view!r}: a kvlog stream reads the log view (every record in offset order)")
        starting_times = parse_by_timestamp(lowered, "startingOffsetsByTimestamp", "startingOffsets")
        starting = parse_offsets(lowered.get("startingoffsets") or "earliest", "startingOffsets")
        min_partitions = parse_min_partitions(lowered["minpartitions"]) if "minpartitions" in lowered else None
        raw_max = lowered.get("maxrecordspertrigger")
        max_records: int | None = None
        if raw_max is not None:
            try:
                max_records = int(raw_max)
            except ValueError:
                max_records = 0
            if max_records < 1:
                raise ConfigError(f"maxRecordsPerTrigger={raw_max!r}: use a whole number >= 1")
        return cls(store_uri(options), storage_options_from(options), lowered.get("cache_dir") or None,
                   starting, max_records, starting_times, min_partitions)


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
        check_known(options, _WRITE_OPTIONS, "for the kvlog streaming sink")
        lowered = _lowered(options)
        checkpoint = lowered.get("checkpointlocation")
        if not checkpoint:
            raise ConfigError(
                "the kvlog streaming sink needs .option('checkpointLocation', dir): the query's checkpoint "
                "is its identity as an idempotent producer, which makes its writes exactly once")
        return cls(store_uri(options), storage_options_from(options), lowered.get("cache_dir") or None,
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
