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
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kvlog.errors import ConfigError
from spark_ext.options import STORAGE_PREFIX, storage_options_from, store_uri

__all__ = ["DEFAULT_LEASE_MS", "EARLIEST", "LATEST", "READ_OPTIONS", "OffsetSpec", "ReadOptions", "check_known",
           "offset_ranges", "parse_offsets", "parse_read_options"]

#: Kafka's offset codes, per partition in the JSON form of ``startingOffsets``/``endingOffsets``.
EARLIEST = -2
LATEST = -1

#: The options a batch read takes (as users spell them; Spark lower-cases them), besides
#: every ``storage.*`` option.
READ_OPTIONS: tuple[str, ...] = ("path", "uri", "view", "internal", "cache_dir", "now_ms", "checkpoint",
                                 "startingOffsets", "endingOffsets", "latest_split_bytes", "lease_ms")

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
        return self.starting_offsets is not None or self.ending_offsets is not None


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
    if view == "latest" and (starting is not None or ending is not None):
        raise ConfigError("startingOffsets/endingOffsets read a range of the changelog: they apply to "
                          "view=log only; view=latest is each key's newest record (read an older "
                          "state with the checkpoint option)")
    if starting is not None and ending is not None:
        for partition, start in starting.partitions:
            end = ending.offset(partition)
            if start >= 0 and end >= 0 and start > end:
                raise ConfigError(f"partition {partition}: startingOffsets {start} is after endingOffsets {end}")
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


def offset_ranges(options: ReadOptions, partitions: int, ends: Mapping[int, int]) -> dict[int, tuple[int, int]]:
    """``{partition: (first, end)}``, end exclusive, for each partition of a store of
    ``partitions`` partitions whose next offsets are ``ends``; :class:`ConfigError` for an
    offset of a partition the store does not have."""
    for spec, name in ((options.starting_offsets, "startingOffsets"), (options.ending_offsets, "endingOffsets")):
        for partition, _offset in (spec.partitions if spec is not None else ()):
            if partition >= partitions:
                raise ConfigError(f"{name}: partition {partition} does not exist: the store has "
                                  f"{partitions} partitions (0 to {partitions - 1})")
    out: dict[int, tuple[int, int]] = {}
    for partition in range(partitions):
        end_of_log = ends.get(partition, 0)
        start = options.starting_offsets.offset(partition) if options.starting_offsets else EARLIEST
        end = options.ending_offsets.offset(partition) if options.ending_offsets else LATEST
        first = 0 if start == EARLIEST else end_of_log if start == LATEST else start
        last = end_of_log if end == LATEST else end
        out[partition] = (first, max(first, last))
    return out


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
