"""The read options of the ``kvlog`` data source, parsed and checked once, when a read is analysed.

Spark hands a data source its options as strings, with names lower-cased
(``startingOffsets`` arrives as ``startingoffsets``). :func:`parse_read_options`
turns them into a :class:`ReadOptions`, refusing with :class:`~kvlog.errors.ConfigError`
an option it does not know (naming the known ones, and the closest one when a name
looks misspelled), a bad value, and offsets given for ``view=latest``. A streaming
source passes the names of its own extra options as ``extra_known``.

Offsets follow the Kafka source's conventions: ``startingOffsets`` and
``endingOffsets`` are ``earliest``, ``latest`` or a JSON object of offsets per kvlog
partition (``{"0": 10, "3": -2}``, where -2 is earliest and -1 is latest). A partition
the object leaves out starts at the earliest offset and ends at the latest. The
starting offset is inclusive, the ending one exclusive. :func:`offset_ranges` resolves
them against the store (its partition count and its partitions' ends).

``startingOffsetsByTimestamp`` and ``endingOffsetsByTimestamp`` give a time instead, in
milliseconds since the epoch, per kvlog partition, keyed as ``startingOffsets``' JSON
(``{"0": 1700000000000}``); a partition the object leaves out starts at the earliest
offset and ends at the latest, as there. :mod:`spark_ext.by_timestamp` resolves a time
to an offset when the read is planned. Each is refused together with its offsets
counterpart (``startingOffsets`` with ``startingOffsetsByTimestamp``): both would say
where a partition starts, and Kafka's rule that the timestamp one wins would silently
ignore an option. ``minPartitions`` asks for at least that many input partitions
(:mod:`spark_ext.splits`). Like the offsets, the two timestamp options read a range of
the changelog and apply to ``view=log`` only; ``minPartitions`` applies to both views.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kvlog.errors import ConfigError
from spark_ext.options import STORAGE_PREFIX, storage_options_from, store_uri

__all__ = ["DEFAULT_LEASE_MS", "EARLIEST", "LATEST", "MAX_MIN_PARTITIONS", "MAX_TIMESTAMP_MS", "READ_OPTIONS",
           "OffsetSpec", "ReadOptions", "TimestampSpec", "check_known", "check_partitions", "offset_ranges",
           "parse_by_timestamp", "parse_min_partitions", "parse_offsets", "parse_read_options", "parse_timestamps"]

#: Kafka's offset codes, per partition in the JSON form of ``startingOffsets``/``endingOffsets``.
EARLIEST = -2
LATEST = -1

#: The options a batch read takes (as users spell them; Spark lower-cases them), besides
#: every ``storage.*`` option.
READ_OPTIONS: tuple[str, ...] = ("path", "uri", "view", "internal", "cache_dir", "now_ms", "checkpoint",
                                 "startingOffsets", "endingOffsets", "startingOffsetsByTimestamp",
                                 "endingOffsetsByTimestamp", "minPartitions", "latest_split_bytes", "lease_ms")

#: The largest ``minPartitions``: more input partitions than this is a mistake (each is a
#: task, planned and serialized on the driver), not a read.
MAX_MIN_PARTITIONS = 100_000
#: The latest time ``startingOffsetsByTimestamp``/``endingOffsetsByTimestamp`` take: record
#: timestamps are signed 64-bit milliseconds.
MAX_TIMESTAMP_MS = 2**63 - 1

#: How long a batch read's lease keeps the files it reads from every process's GC, unless the
#: read sets option ``lease_ms`` (see ``kvlog.log.leases``).
DEFAULT_LEASE_MS = 3_600_000

#: Options of other systems that users reach for, and what kvlog offers instead.
_HINTS = {
    "versionasof": "kvlog reads as of a named checkpoint: .option('checkpoint', name)",
    "timestampasof": "kvlog reads as of a named checkpoint: .option('checkpoint', name)",
    "subscribe": "a kvlog store is read by its URI: .load(uri)",
    "topic": "a kvlog store is read by its URI: .load(uri)",
}


@dataclass(frozen=True)
class OffsetSpec:
    """``startingOffsets`` or ``endingOffsets``: one code or offset per listed partition,
    ``default`` (:data:`EARLIEST` or :data:`LATEST`) for the others."""

    default: int
    partitions: tuple[tuple[int, int], ...] = ()

    def offset(self, partition: int) -> int:
        return dict(self.partitions).get(partition, self.default)


@dataclass(frozen=True)
class TimestampSpec:
    """``startingOffsetsByTimestamp`` or ``endingOffsetsByTimestamp``: a time (milliseconds
    since the epoch) per listed partition, ascending by partition. The partitions it leaves
    out start at their earliest offset and end at their latest, as with the JSON form of
    ``startingOffsets``/``endingOffsets``."""

    partitions: tuple[tuple[int, int], ...]

    def time(self, partition: int) -> int | None:
        """The time given for ``partition`` (None: not listed)."""
        return dict(self.partitions).get(partition)


@dataclass(frozen=True)
class ReadOptions:
    """The parsed options of one read."""

    uri: str
    view: str = "log"
    internal: bool = False
    cache_dir: str | None = None
    now_ms: int | None = None
    checkpoint: str | None = None
    starting_offsets: OffsetSpec | None = None
    ending_offsets: OffsetSpec | None = None
    #: ``startingOffsetsByTimestamp``/``endingOffsetsByTimestamp`` (None: not given, or already
    #: resolved into ``starting_offsets``/``ending_offsets`` by :mod:`spark_ext.by_timestamp`).
    starting_timestamps: TimestampSpec | None = None
    ending_timestamps: TimestampSpec | None = None
    #: ``minPartitions``: at least this many input partitions (None: the read's own plan).
    min_partitions: int | None = None
    storage_options: tuple[tuple[str, Any], ...] = ()
    #: View ``latest``: a kvlog partition of more stored bytes is read by several tasks
    #: (None: :data:`spark_ext.latest.LATEST_SPLIT_BYTES`).
    latest_split_bytes: int | None = None
    #: How long the read's lease keeps its files from GC (ms); 0: the read takes no lease.
    lease_ms: int = DEFAULT_LEASE_MS

    @property
    def storage(self) -> dict[str, Any] | None:
        """The ``storage.*`` options without their prefix, as ``open_storage`` takes them."""
        return dict(self.storage_options) or None

    @property
    def has_offsets(self) -> bool:
        """Whether the read has a range of offsets (given as offsets or as times)."""
        return any(spec is not None for spec in (self.starting_offsets, self.ending_offsets,
                                                 self.starting_timestamps, self.ending_timestamps))

    @property
    def names_partitions(self) -> bool:
        """Whether an offsets or timestamp option names a partition (checked against the store)."""
        return any(spec is not None and bool(spec.partitions) for spec in (
            self.starting_offsets, self.ending_offsets, self.starting_timestamps, self.ending_timestamps))


def check_known(options: Iterable[str], known: Iterable[str], subject: str = "of the kvlog data source") -> None:
    """Refuse an option name outside ``known`` (case-insensitive) and ``storage.*``; the message
    names the option ``subject`` refuses ("for the kvlog streaming sink"), the known ones, and
    the closest match."""
    by_lower = {name.lower(): name for name in known}
    for name in options:
        lower = name.lower()
        if lower in by_lower or lower.startswith(STORAGE_PREFIX):
            continue
        listed = ", ".join(sorted(by_lower.values(), key=str.lower)) + f", {STORAGE_PREFIX}*"
        close = difflib.get_close_matches(lower, list(by_lower), n=1, cutoff=0.7)
        hint = _HINTS.get(lower) or (f"did you mean {by_lower[close[0]]!r}?" if close else "")
        raise ConfigError(f"unknown option {name!r} {subject}"
                          f"{f' ({hint})' if hint else ''}; the known options are: {listed}")


def parse_read_options(options: Mapping[str, Any], *, extra_known: Iterable[str] = ()) -> ReadOptions:
    """Check and parse a read's options (see the module doc); :class:`ConfigError` when wrong."""
    check_known(options, (*READ_OPTIONS, *extra_known))
    lowered = {str(k).lower(): str(v) for k, v in options.items()}
    view = lowered.get("view", "log").lower()
    if view not in ("log", "latest"):
        raise ConfigError(f"view={view!r}: use 'log' or 'latest'")
    internal = _boolean(lowered.get("internal", "false"), "internal")
    now_ms = _integer(lowered["now_ms"], "now_ms") if lowered.get("now_ms") else None
    checkpoint = lowered.get("checkpoint") or None
    if "checkpoint" in lowered and not checkpoint:
        raise ConfigError("checkpoint='': give the name of a checkpoint of the store")
    starting = parse_offsets(lowered["startingoffsets"], "startingOffsets") if "startingoffsets" in lowered else None
    ending = parse_offsets(lowered["endingoffsets"], "endingOffsets") if "endingoffsets" in lowered else None
    starting_times = parse_by_timestamp(lowered, "startingOffsetsByTimestamp", "startingOffsets")
    ending_times = parse_by_timestamp(lowered, "endingOffsetsByTimestamp", "endingOffsets")
    if view == "latest" and (starting is not None or ending is not None or starting_times is not None
                             or ending_times is not None):
        raise ConfigError("startingOffsets/endingOffsets (and their ByTimestamp forms) read a range of the "
                          "changelog: they apply to view=log only; view=latest is each key's newest record "
                          "(read an older state with the checkpoint option)")
    if starting is not None and ending is not None:
        for partition, start in starting.partitions:
            end = ending.offset(partition)
            if start >= 0 and end >= 0 and start > end:
                raise ConfigError(f"partition {partition}: startingOffsets {start} is after endingOffsets {end}")
    if starting_times is not None and ending_times is not None:
        for partition, since in starting_times.partitions:
            until = ending_times.time(partition)
            if until is not None and since > until:
                raise ConfigError(f"partition {partition}: startingOffsetsByTimestamp {since} is after "
                                  f"endingOffsetsByTimestamp {until}: the read is empty")
    min_partitions = parse_min_partitions(lowered["minpartitions"]) if "minpartitions" in lowered else None
    split: int | None = None
    if lowered.get("latest_split_bytes"):
        text = lowered["latest_split_bytes"]
        split = int(text) if text.strip().isdigit() else 0
        if split <= 0:
            raise ConfigError(f"option latest_split_bytes must be a positive integer, got {text!r}")
    lease_ms = DEFAULT_LEASE_MS
    if "lease_ms" in lowered:
        lease_ms = _integer(str(lowered["lease_ms"]), "lease_ms")
        if lease_ms < 0:
            raise ConfigError(f"option lease_ms must be 0 (no lease) or a positive integer, got {lease_ms}")
    return ReadOptions(
        uri=store_uri(lowered), view=view, internal=internal, cache_dir=lowered.get("cache_dir") or None,
        now_ms=now_ms, checkpoint=checkpoint, starting_offsets=starting, ending_offsets=ending,
        starting_timestamps=starting_times, ending_timestamps=ending_times, min_partitions=min_partitions,
        storage_options=tuple(sorted((storage_options_from(lowered) or {}).items())), latest_split_bytes=split,
        lease_ms=lease_ms)


def parse_offsets(text: str, name: str) -> OffsetSpec:
    """``earliest``, ``latest`` or ``{"<partition>": <offset>, ...}`` (-2 earliest, -1 latest)."""
    default = EARLIEST if name == "startingOffsets" else LATEST
    word = text.strip().lower()
    if word in ("earliest", "latest"):
        code = EARLIEST if word == "earliest" else LATEST
        if name == "endingOffsets" and code == EARLIEST:
            raise ConfigError("endingOffsets='earliest' reads nothing: ending offsets are 'latest' or per partition")
        return OffsetSpec(code)
    try:
        parsed = json.loads(text)
    except ValueError as e:
        raise ConfigError(f"{name}={text!r} is neither 'earliest', 'latest' nor JSON such as "
                          f'{{"0": 10, "3": -2}} ({e})') from None
    if not isinstance(parsed, dict):
        raise ConfigError(f'{name}={text!r}: give a JSON object of offsets per partition, such as {{"0": 10}}')
    found: dict[int, int] = {}
    for key, value in parsed.items():
        try:
            partition = int(key)
        except ValueError:
            raise ConfigError(f"{name}: {key!r} is not a partition number") from None
        if partition < 0:
            raise ConfigError(f"{name}: partition {partition} does not exist (partitions count from 0)")
        if isinstance(value, bool) or not isinstance(value, int) or value < EARLIEST:
            raise ConfigError(f"{name}: partition {partition}: {value!r} is not an offset "
                              "(an offset from 0, -2 for earliest or -1 for latest)")
        if name == "endingOffsets" and value == EARLIEST:
            raise ConfigError(f"endingOffsets: partition {partition}: -2 (earliest) is not an ending offset")
        found[partition] = value
    return OffsetSpec(default, tuple(sorted(found.items())))


def check_partitions(options: ReadOptions, partitions: int) -> None:
    """:class:`ConfigError` for an offset or a time of a partition a store of ``partitions``
    partitions does not have."""
    specs: tuple[tuple[OffsetSpec | TimestampSpec | None, str], ...] = (
        (options.starting_offsets, "startingOffsets"), (options.ending_offsets, "endingOffsets"),
        (options.starting_timestamps, "startingOffsetsByTimestamp"),
        (options.ending_timestamps, "endingOffsetsByTimestamp"))
    for spec, name in specs:
        for partition, _value in (spec.partitions if spec is not None else ()):
            if partition >= partitions:
                raise ConfigError(f"{name}: partition {partition} does not exist: the store has "
                                  f"{partitions} partitions (0 to {partitions - 1})")


def offset_ranges(options: ReadOptions, partitions: int, ends: Mapping[int, int]) -> dict[int, tuple[int, int]]:
    """``{partition: (first, end)}``, end exclusive, for each partition of a store of
    ``partitions`` partitions whose next offsets are ``ends``; :class:`ConfigError` for an
    offset of a partition the store does not have. Times must have been resolved into
    offsets first (:func:`spark_ext.by_timestamp.resolve_times`): a range is a range of offsets.
    A start after the end (a time resolved past an ending offset) reads nothing."""
    check_partitions(options, partitions)
    if options.starting_timestamps is not None or options.ending_timestamps is not None:
        raise ValueError("offset_ranges takes resolved offsets: resolve the times first "
                         "(spark_ext.by_timestamp.resolve_times)")
    out: dict[int, tuple[int, int]] = {}
    for partition in range(partitions):
        end_of_log = ends.get(partition, 0)
        start = options.starting_offsets.offset(partition) if options.starting_offsets else EARLIEST
        end = options.ending_offsets.offset(partition) if options.ending_offsets else LATEST
        first = 0 if start == EARLIEST else end_of_log if start == LATEST else start
        last = end_of_log if end == LATEST else end
        out[partition] = (first, max(first, last))
    return out


class _Members(list[tuple[str, Any]]):
    """A JSON object's members in their order, repeated names kept (``json.loads``' pairs hook)."""


def parse_timestamps(text: str, name: str) -> TimestampSpec:
    """``{"<partition>": <milliseconds since the epoch>, ...}``: at least one partition, each
    once, each time an integer from 0 to :data:`MAX_TIMESTAMP_MS`."""
    example = '{"0": 1700000000000, "3": 1700000000000}'
    try:
        parsed = json.loads(text, object_pairs_hook=_Members)
    except ValueError as e:
        raise ConfigError(f"{name}={text!r} is not JSON: give an object of times per partition, in "
                          f"milliseconds since the epoch, such as {example} ({e})") from None
    if not isinstance(parsed, _Members):
        raise ConfigError(f"{name}={text!r}: give a JSON object of times per partition, in milliseconds "
                          f"since the epoch, such as {example}")
    if not parsed:
        raise ConfigError(f"{name}={text!r} names no partition: give a time for at least one, such as {example}")
    found: dict[int, int] = {}
    for key, value in parsed:
        if not re.fullmatch(r"-?[0-9]{1,10}", key):
            topics = (" (kvlog's JSON is keyed by partition alone: a store has no topics)"
                      if isinstance(value, _Members) else "")
            raise ConfigError(f"{name}: {key!r} is not a partition number{topics}, as in {example}")
        partition = int(key)
        if partition < 0:
            raise ConfigError(f"{name}: partition {partition} does not exist (partitions count from 0)")
        if partition in found:
            raise ConfigError(f"{name}: partition {partition} is given twice")
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TIMESTAMP_MS:
            raise ConfigError(f"{name}: partition {partition}: {json.dumps(value)} is not a time (an integer "
                              f"of milliseconds since the epoch, from 0 to {MAX_TIMESTAMP_MS})")
        found[partition] = value
    return TimestampSpec(tuple(sorted(found.items())))


def parse_by_timestamp(lowered: Mapping[str, str], name: str, offsets_name: str) -> TimestampSpec | None:
    """Option ``name`` (``startingOffsetsByTimestamp``) of the lower-cased ``lowered``, parsed;
    refused beside ``offsets_name`` (``startingOffsets``), which would say the same thing."""
    if name.lower() not in lowered:
        return None
    if offsets_name.lower() in lowered:
        starting = name.startswith("starting")
        where, default = ("starts", "starts at its earliest") if starting else ("ends", "ends at its latest")
        raise ConfigError(f"{offsets_name} and {name} both say where the read {where}: give one of them "
                          f"(a partition the JSON of {name} leaves out {default} offset)")
    return parse_timestamps(lowered[name.lower()], name)


def parse_min_partitions(text: str) -> int:
    """``minPartitions``: a whole number from 1 to :data:`MAX_MIN_PARTITIONS`."""
    word = text.strip()
    if not re.fullmatch(r"[0-9]{1,7}", word) or not 1 <= int(word) <= MAX_MIN_PARTITIONS:
        raise ConfigError(f"minPartitions={text!r}: use a whole number from 1 to {MAX_MIN_PARTITIONS} "
                          "(the least number of input partitions, that is Spark tasks, of the read)")
    return int(word)


def _boolean(text: str, name: str) -> bool:
    word = text.strip().lower()
    if word not in ("true", "false"):
        raise ConfigError(f"{name}={text!r}: use 'true' or 'false'")
    return word == "true"


def _integer(text: str, name: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{name}={text!r} is not an integer") from None
