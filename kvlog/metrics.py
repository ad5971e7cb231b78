"""A store's counters, gauges and histograms for Prometheus (the ``metrics`` extra).

:func:`register` adds a collector of one :class:`~kvlog.Store` to a ``prometheus_client``
registry (the default one unless told), which the application exposes as it exposes its other
metrics (``prometheus_client.start_http_server``, or its web framework's endpoint);
:func:`text` gives the text format once, as ``kvlog stats --prometheus URI`` prints it.

Why Prometheus's client rather than OpenTelemetry: a store is embedded in an application,
and a pull collector costs the store nothing between scrapes: every figure is read from
``store.stats()`` when the registry is scraped (one snapshot of the metadata cache, about a
millisecond for a small store), and the put path only keeps the counters ``stats()`` has
anyway. The text format is what both Prometheus and OpenTelemetry's collector scrape, and the
library parses it back (the tests do).

Every metric carries the label ``store`` (the store's id), so several stores of one process
can share a registry. What they mean (``stats()`` has the same figures):

* ``kvlog_records_flushed_total``, ``kvlog_flushes_total``: this handle's writes made durable,
  and the flushes (group commits) that carried them.
* ``kvlog_commits_written_total``, ``kvlog_commits_applied_total``: commits this process
  published, and commits (any process's) applied to its cache.
* ``kvlog_commit_seconds``: a histogram of how long this process's commits took, from the call
  to the outcome (retries included).
* ``kvlog_storage_requests_total{kind}``: storage requests by kind (``get``, ``range_get``,
  ``stream``, ``put``, ``put_if_absent``, ``swap``, ``stat``, ``list``, ``delete``);
  ``kvlog_storage_bytes_total{direction}``: bytes ``sent`` (puts, swaps) and ``received``
  (whole and ranged reads; streamed reads are counted as requests only);
  ``kvlog_fsyncs_total``: file and directory fsyncs of a local root.
* ``kvlog_version``, ``kvlog_live_keys``, ``kvlog_files``, ``kvlog_file_bytes``,
  ``kvlog_unflushed_bytes``: the applied commit, the keys, the live data files and their bytes,
  and this handle's writes not durable yet. ``kvlog_live_keys`` is left out while index runs
  wait to be merged (``kvlog_index_runs_pending`` above 0, during loads): counting the keys
  through them would look each of their entries up, seconds for a million, in every scrape.
* ``kvlog_partition_end_offset{partition}``, ``kvlog_partition_begin_offset{partition}``,
  ``kvlog_partition_dirty_ratio{partition}``: each partition's offsets, and the share of its
  bytes the cleaner has not cleaned yet (compaction's trigger).
* ``kvlog_compaction_rounds_total``, ``kvlog_compaction_failures_total``,
  ``kvlog_compaction_failing_partitions``, ``kvlog_compaction_last_success_timestamp_seconds``:
  the cleaner's rounds, failures (rounds and partitions), the partitions it is backing off
  from, and when a round last ended without an error (0: none yet in this process).
* ``kvlog_consumer_lag{group, partition}``: for every consumer group with committed offsets,
  the offsets between its committed offset (or the partition's begin) and the end.
* ``kvlog_tombstone_hold_offset{partition}``: the offset from which on compaction keeps
  tombstones and expired records for the consumer groups that hold them;
  ``kvlog_consumer_group_hold_expiry_timestamp_seconds{group}``: when a group's hold lapses
  unless it commits again.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from kvlog.extras import require

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

    from kvlog.store import Store

__all__ = ["StoreCollector", "register", "text"]

_PURPOSE = "kvlog.metrics"


def _client() -> Any:
    require("metrics", purpose=_PURPOSE)
    import prometheus_client.core

    return prometheus_client.core


def _le(bound: float) -> str:
    """A bucket's upper bound as the text format writes it (``+Inf`` for the last)."""
    return "+Inf" if bound == float("inf") else repr(bound)


class StoreCollector:
    """A ``prometheus_client`` collector of one store's figures, read at every scrape."""

    def __init__(self, store: Store) -> None:
        _client()
        self._store = store

    def describe(self) -> list[Any]:
        """Nothing up front: the families depend on the store (its partitions and groups)."""
        return []

    def collect(self) -> Iterator[Any]:
        """The metric families of the store now."""
        core = _client()
        stats = self._store.stats(count_keys=False)
        store = str(stats["store_uuid"])

        def counter(name: str, doc: str, value: float, **labels: str) -> Any:
            family = core.CounterMetricFamily(name, doc, labels=["store", *labels])
            family.add_metric([store, *labels.values()], value)
            return family

        def gauge(name: str, doc: str, value: float) -> Any:
            family = core.GaugeMetricFamily(name, doc, labels=["store"])
            family.add_metric([store], value)
            return family

        yield counter("kvlog_records_flushed", "Records this handle made durable.", stats.get("records_flushed", 0))
        yield counter("kvlog_flushes", "Flushes (group commits) of this handle.", stats.get("flushes", 0))
        yield counter("kvlog_commits_written", "Commits this process published.", stats["commits_written"])
        yield counter("kvlog_commits_applied", "Commits applied to this process's cache.", stats["commits_applied"])
        latency = stats["commit_latency"]
        buckets, cumulative = [], 0
        for bound, count in zip([*latency["bounds_s"], float("inf")], latency["counts"], strict=True):
            cumulative += count
            buckets.append((_le(bound), cumulative))
        histogram = core.HistogramMetricFamily(
            "kvlog_commit_seconds", "How long this process's commits took, retries included.",
            labels=["store"])
        histogram.add_metric([store], buckets, latency["sum_s"])
        yield histogram
        requests = core.CounterMetricFamily("kvlog_storage_requests", "Storage requests by kind.",
                                            labels=["store", "kind"])
        for kind, count in sorted(stats["storage_requests"].items()):
            requests.add_metric([store, kind], count)
        yield requests
        traffic = stats["storage_traffic"]
        transferred = core.CounterMetricFamily("kvlog_storage_bytes", "Bytes sent to and received from storage.",
                                               labels=["store", "direction"])
        for direction in ("sent", "received"):
            transferred.add_metric([store, direction], traffic[direction])
        yield transferred
        yield counter("kvlog_fsyncs", "File and directory fsyncs of a local root.", traffic["fsyncs"])
        yield gauge("kvlog_version", "The applied commit version.", stats["version"])
        if stats["live_keys"] is not None:  # none while index runs wait (see the module's doc)
            yield gauge("kvlog_live_keys", "Keys with a live value.", stats["live_keys"])
        yield gauge("kvlog_index_runs_pending", "Index runs waiting to be merged into the key index.",
                    stats["index_runs"])
        yield gauge("kvlog_files", "Live data files.", stats["files"])
        yield gauge("kvlog_file_bytes", "Bytes of the live data files.", stats["file_bytes"])
        yield gauge("kvlog_unflushed_bytes", "This handle's writes not durable yet.", stats.get("unflushed_bytes", 0))
        yield from self._partitions(core, store, stats)
        yield from self._compaction(core, store, stats)
        yield self._lag(core, store, stats)
        yield from self._holds(core, store, stats)

    @staticmethod
    def _partitions(core: Any, store: str, stats: dict[str, Any]) -> Iterator[Any]:
        families = {
            "end_offset": core.GaugeMetricFamily("kvlog_partition_end_offset", "The next offset of a partition.",
                                                 labels=["store", "partition"]),
            "start_offset": core.GaugeMetricFamily("kvlog_partition_begin_offset",
                                                   "The lowest offset still in a partition.",
                                                   labels=["store", "partition"]),
            "dirty_ratio": core.GaugeMetricFamily("kvlog_partition_dirty_ratio",
                                                  "The share of a partition's bytes not cleaned yet.",
                                                  labels=["store", "partition"]),
        }
        for partition in stats["partition_stats"]:
            for key, family in families.items():
                family.add_metric([store, str(partition["partition"])], partition[key])
        yield from families.values()

    @staticmethod
    def _compaction(core: Any, store: str, stats: dict[str, Any]) -> Iterator[Any]:
        compaction = stats.get("compaction") or {}
        values = [
            ("kvlog_compaction_rounds", "Compaction rounds run by this process.", compaction.get("rounds", 0), True),
            ("kvlog_compaction_failures", "Failed compaction rounds and partitions in this process.",
             compaction.get("failures_total", 0), True),
            ("kvlog_compaction_failing_partitions", "Partitions the cleaner is backing off from.",
             len(compaction.get("failing_partitions") or {}), False),
            ("kvlog_compaction_last_success_timestamp_seconds",
             "When a compaction round last ended without an error (0: not yet).",
             (compaction.get("last_success_ms") or 0) / 1000.0, False),
        ]
        for name, doc, value, is_counter in values:
            kind = core.CounterMetricFamily if is_counter else core.GaugeMetricFamily
            family = kind(name, doc, labels=["store"])
            family.add_metric([store], value)
            yield family

    @staticmethod
    def _lag(core: Any, store: str, stats: dict[str, Any]) -> Any:
        family = core.GaugeMetricFamily("kvlog_consumer_lag",
                                        "Offsets between a group's committed offset and the end.",
                                        labels=["store", "group", "partition"])
        parts = {str(p["partition"]): p for p in stats["partition_stats"]}
        for group, offsets in sorted(stats.get("consumer_groups", {}).items()):
            for partition, info in parts.items():
                position = max(offsets.get(partition, info["start_offset"]), info["start_offset"])
                family.add_metric([store, group, partition], max(0, info["end_offset"] - position))
        return family


    @staticmethod
    def _holds(core: Any, store: str, stats: dict[str, Any]) -> Iterator[Any]:
        offsets = core.GaugeMetricFamily("kvlog_tombstone_hold_offset",
                                         "The offset from which on compaction keeps dead records for a "
                                         "group that holds tombstones (absent: no hold).",
                                         labels=["store", "partition"])
        for partition, offset in stats["holds"].items():
            offsets.add_metric([store, partition], offset)
        yield offsets
        expiry = core.GaugeMetricFamily("kvlog_consumer_group_hold_expiry_timestamp_seconds",
                                        "When a group's tombstone hold lapses unless it commits again.",
                                        labels=["store", "group"])
        for group, expires_ms in stats["holding_groups"].items():
            expiry.add_metric([store, group], expires_ms / 1000.0)
        yield expiry


def register(store: Store, registry: CollectorRegistry | None = None) -> StoreCollector:
    """Add ``store``'s collector to ``registry`` (``prometheus_client``'s default one unless
    given) and return it (``registry.unregister(collector)`` removes it)."""
    collector = StoreCollector(store)
    if registry is None:
        registry = _client().REGISTRY
    registry.register(collector)
    return collector


def text(store: Store) -> str:
    """The store's metrics now, in Prometheus's text format."""
    core = _client()
    import prometheus_client

    registry = core.CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store))
    return str(prometheus_client.generate_latest(registry).decode("utf-8"))
