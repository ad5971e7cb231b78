"""``kvlog stats``: :meth:`kvlog.Store.stats` as a short summary for people.

Sizes are in MiB, times are ages ("3 min ago") against the ``now_ms`` given, and each
partition shows its dirty ratio (the share of its bytes past the cleaner's checkpoint)
next to the ``min_cleanable_dirty_ratio`` at which compaction cleans it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["render_stats", "age", "mib"]

_MIB = 1024 * 1024


def mib(n: int) -> str:
    """``n`` bytes in MiB, two decimals."""
    return f"{n / _MIB:.2f} MiB"


def age(then_ms: int | None, now_ms: int) -> str:
    """How long ago ``then_ms`` was, roughly ("12 s ago", "3 min ago", "5 h ago", "2 days ago").

    ``None`` or 0 is "never"; a time ahead of ``now_ms`` (another machine's clock) is "in ...".
    """
    if not then_ms:
        return "never"
    delta_s = (now_ms - then_ms) // 1000
    ahead = delta_s < 0
    delta_s = abs(delta_s)
    if delta_s < 1:
        return "just now"
    for unit, size in (("day", 86_400), ("h", 3_600), ("min", 60), ("s", 1)):
        if delta_s >= size:
            count = delta_s // size
            text = f"{count} {unit}{'s' if unit == 'day' and count != 1 else ''}"
            return f"in {text}" if ahead else f"{text} ago"
    raise AssertionError("unreachable: delta_s >= 1")


def _levels(levels: Mapping[str, Mapping[str, int]]) -> str:
    parts = [f"L{level} {info['files']} ({mib(info['bytes'])})"
             for level, info in sorted(levels.items(), key=lambda item: int(item[0]))]
    return ", ".join(parts) if parts else "none"


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows as left-aligned columns two spaces apart."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
            for row in rows]


def _compaction(compaction: Mapping[str, Any] | None, now_ms: int) -> list[str]:
    if compaction is None:
        return ["compaction   not running in this process (a read-only open); see `kvlog compact`"]
    state = "background thread running" if compaction.get("background") else "no background thread"
    lines = [f"compaction   {compaction.get('rounds', 0)} round(s), {state}"]
    failing = compaction.get("failing_partitions") or {}
    for partition, failure in sorted(failing.items(), key=lambda item: int(item[0])):
        retry = age(failure.get("retry_at_ms"), now_ms)
        lines.append(f"  partition {partition} failing ({failure.get('failures', 0)} time(s), "
                     f"retry {retry}): {failure.get('error', '')}")
    if compaction.get("last_error"):
        lines.append(f"  last error: {compaction['last_error']}")
    if not failing and not compaction.get("last_error"):
        lines.append("  no errors")
    return lines


def _groups(stats: Mapping[str, Any], now_ms: int) -> list[str]:
    """A line per consumer group: its lag (summed over partitions) and its tombstone hold."""
    groups: Mapping[str, Mapping[str, int]] = stats.get("consumer_groups") or {}
    if not groups:
        return ["groups       none"]
    parts = {str(p["partition"]): p for p in stats["partition_stats"]}
    holding: Mapping[str, int] = stats.get("holding_groups") or {}
    lines = [f"groups       {len(groups)}"]
    for name, offsets in sorted(groups.items()):
        lag = sum(max(0, parts[p]["end_offset"] - max(o, parts[p]["start_offset"]))
                  for p, o in offsets.items() if p in parts)
        hold = f", holds tombstones (lapses {age(holding[name], now_ms)})" if name in holding else ""
        lines.append(f"  {name}: lag {lag}{hold}")
    held = stats.get("holds") or {}
    if held:
        lines.append("  held from: " + ", ".join(f"partition {p} offset {o}" for p, o in held.items()))
    return lines


def _disk(disk: Mapping[str, int]) -> list[str]:
    """Two lines: the store's bytes on disk by what holds them, then the cache's by its pages."""
    return [
        f"disk         {mib(disk['total'])}: data files {mib(disk['data_files'])}, awaiting deletion "
        f"{mib(disk['awaiting_deletion'])}, unreferenced {mib(disk['unreferenced'])}, "
        f"log {mib(disk['log'])}, cache {mib(disk['cache'])}",
        f"  cache pages: index {mib(disk['cache_index'])}, runs {mib(disk['cache_runs'])}, "
        f"catalog {mib(disk['cache_catalog'])}, free {mib(disk['cache_free'])}",
    ]


def render_stats(stats: Mapping[str, Any], now_ms: int, *, min_dirty_ratio: float | None = None,
                 disk: Mapping[str, int] | None = None) -> str:
    """The summary ``kvlog stats`` prints for ``stats`` (one :meth:`kvlog.Store.stats` result).

    ``min_dirty_ratio`` is the store's ``min_cleanable_dirty_ratio``: a partition past it is
    marked ``cleanable``. ``disk`` (a :meth:`kvlog.Store.disk_usage` result) adds the bytes on
    disk by what holds them.
    """
    lines = [
        f"store        {stats['uri']} (uuid {stats['store_uuid']})",
        f"version      {stats['version']} (the applied commit)",
        f"keys         {stats['live_keys']} live, {stats['records']} records in the log, "
        f"{stats['partitions']} partitions",
        f"files        {stats['files']} ({mib(stats['file_bytes'])}); levels: {_levels(stats['levels'])}",
        f"cache        {stats['cache_dir']} ({mib(stats['cache_disk_bytes'])} on disk, "
        f"{stats['index_runs']} index run(s) pending)",
    ]
    if disk is not None:
        lines.extend(_disk(disk))
    if stats.get("producer_id") is not None:
        lines.append(f"producer     {stats['producer_id']} epoch {stats['producer_epoch']}, "
                     f"{stats['unflushed_bytes']} bytes unflushed")
    if stats.get("flush_error"):
        lines.append(f"flush error  {stats['flush_error']}")
    lines.extend(_compaction(stats.get("compaction"), now_ms))
    lines.extend(_groups(stats, now_ms))
    rows = [["partition", "offsets", "records", "data", "dirty", "last cleaned"]]
    for p in stats["partition_stats"]:
        ratio = float(p.get("dirty_ratio", 0.0))
        mark = " cleanable" if min_dirty_ratio is not None and ratio > min_dirty_ratio else ""
        cleaner = p.get("cleaner") or {}
        rows.append([
            str(p["partition"]), f"{p['start_offset']}..{p['end_offset']}", str(p["records"]),
            mib(p["data_bytes"]), f"{ratio:.2f}{mark}", age(cleaner.get("last_round_ms"), now_ms),
        ])
    lines.append("")
    lines.extend(_table(rows))
    native = stats.get("native") or {}
    compiled = sum(1 for kind in native.values() if kind == "c")
    lines.append("")
    lines.append(f"native       {compiled} of {len(native)} extension(s) compiled")
    return "\n".join(lines) + "\n"
