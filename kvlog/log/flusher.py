"""Write buffers, flush and group commit.

Writes go to one write buffer (and the memtable, under the same lock); a
buffered put, the hot path, is compiled (``_writebuffer.c``: 530 ns a put
where the same steps in Python, its twin ``_writebuffer_py``, take 1,000, loop
included; :mod:`kvlog._native` picks one), everything else
about the buffer is here. A flush takes everything buffered, splits it into
one batch per partition, writes one L0 data file holding them, and commits
it: so a write batch, added under one lock, is never split across commits.
Threads waiting for durability share flushes (group commit): one of them leads
a flush that covers every write buffered before it started, the others wait
for it. A flush that fails keeps its batches, with their producer sequences,
and is retried first: the idempotent-producer rules make a resend that did
land a harmless duplicate.

Triggers: ``flush()``, a durable write, ``flush_bytes`` buffered (the writer
whose put fills the buffer leads the flush), ``flush_interval_ms`` elapsed
(the background thread, which also retries failed flushes), and
``max_unflushed_bytes`` (backpressure: a writer flushes, or waits for the
flush in flight; never unbounded memory).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import xxhash

from kvlog._native import load
from kvlog.errors import KvlogError, ProducerError, StoreClosedError
from kvlog.format.columns import binary_column, int64_column, nullable_int64_column
from kvlog.format.datafile import SCHEMA, SCHEMA_EXPIRES
from kvlog.index import MemTable
from kvlog.log.append import PendingBatch
from kvlog.log.log import Log
from kvlog.log.producers import SEQUENCE_MODULUS
from kvlog.memory import release_unused_memory

if TYPE_CHECKING:
    from kvlog.log._writebuffer import WriteBuffer
else:
    WriteBuffer = load("kvlog.log._writebuffer", "kvlog.log._writebuffer_py").WriteBuffer

__all__ = ["Flusher", "GATHER_S", "RECORD_OVERHEAD_BYTES", "split_by_partition"]

log = logging.getLogger("kvlog.flush")

#: The longest a writer about to lead a durable flush waits for the durable writers the last
#: flush acknowledged to come back with their next write (see ``Flusher._gather``): a fraction
#: of one flush (a few milliseconds on local disk, tens on S3), and more than the instant those
#: writers need to buffer again.
GATHER_S = 0.002

#: Bytes of memory counted per buffered record on top of its key and value: the Python objects
#: of the buffer (the key and value objects' headers, the timestamp, three list slots), the
#: memtable entry, and the record's share of the flush's Arrow copy and index encoding
#: (measured at about 300 bytes for 16-byte keys and 100-byte values).
RECORD_OVERHEAD_BYTES = 320

#: Flushed bytes (as the buffer counts them) after which the flushing thread hands freed
#: memory back to the system (``release_unused_memory``): at once after a flush this large,
#: else after the flushes that add up to it. A small flush frees a few KiB, which the next one
#: reuses, while handing memory back costs as much as the rest of a small flush's CPU work.
RELEASE_AFTER_BYTES = 1 << 20


@dataclass
class _InFlight:
    batches: list[PendingBatch]
    records: int
    generation: int
    nbytes: int
    writers: int = 0  # durable writes it carries
    sent: bool = False  # an attempt to append it was made (a retry may find it landed)


def split_by_partition(
    keys: list[bytes], values: list[bytes | None], stamps_ns: list[int], partitions: int,
    expiring: Sequence[tuple[int, int]] = (),
) -> list[tuple[int, pa.RecordBatch]]:
    """One record batch per partition holding records, in write order, sorted by partition
    (timestamps given in nanoseconds, stored in milliseconds; a None value is a tombstone).

    ``expiring`` lists ``(position, expires_ms)`` of the records with a time to live: then the
    batches have the ``expires`` column (:data:`~kvlog.format.datafile.SCHEMA_EXPIRES`)."""
    n = len(keys)
    stamps = np.fromiter(stamps_ns, dtype=np.int64, count=n) // 1_000_000
    expires: np.ndarray | None = None
    has_expiry: np.ndarray | None = None
    if expiring:
        where = np.fromiter((p for p, _e in expiring), dtype=np.int64, count=len(expiring))
        expires = np.zeros(n, dtype=np.int64)
        has_expiry = np.zeros(n, dtype=bool)
        expires[where] = np.fromiter((e for _p, e in expiring), dtype=np.int64, count=len(expiring))
        has_expiry[where] = True
    order = None
    if partitions > 1:
        hashes = np.fromiter(map(xxhash.xxh3_64_intdigest, keys), dtype=np.uint64, count=n)
        parts = (hashes % np.uint64(partitions)).astype(np.uint16)  # 16 bits: numpy's radix sort
        counts = np.bincount(parts, minlength=partitions)
        used = np.flatnonzero(counts).tolist()
        if len(used) > 1:
            order = np.argsort(parts, kind="stable").astype(np.int64)
            stamps = stamps[order]
            if expires is not None and has_expiry is not None:
                expires, has_expiry = expires[order], has_expiry[order]
    else:
        used = [0]
    # The columns are made in partition order at once: one pass over the Python objects each.
    columns = [binary_column(keys, order), binary_column(values, order), int64_column(stamps)]
    if expires is not None and has_expiry is not None:
        batch = pa.record_batch([*columns, nullable_int64_column(expires, has_expiry)], schema=SCHEMA_EXPIRES)
    else:
        batch = pa.record_batch(columns, schema=SCHEMA)
    if order is None:
        return [(used[0], batch)]
    out = []
    start = 0
    for p in used:
        count = int(counts[p])
        out.append((p, batch.slice(start, count)))
        start += count
    return out


class Flusher:
    """Buffers a producer's writes and makes them durable in group commits."""

    def __init__(self, log: Log, producer_id: int, epoch: int, memtable: MemTable) -> None:
        self._log = log
        self.producer_id = producer_id
        self.epoch = epoch
        self._memtable = memtable
        self._cfg = log.config
        self._clock = log.clock
        clock = log.clock
        # Buffered records are stamped in nanoseconds (a cheap call), in milliseconds at the flush.
        self._now_ns: Callable[[], int] = getattr(clock, "now_ns", None) or (lambda: clock.now_ms() * 1_000_000)
        self._partitions = log.partitions
        # One lock for the buffer and the memtable: a write enters both at once.
        self._lock = memtable.lock
        # Wakes the background thread; announces finished flushes to waiting writers. Code
        # holds the lock itself (``with self._wake_lock``), never the conditions: a condition's
        # ``__enter__`` is Python code, and a KeyboardInterrupt raised as it returns would leave
        # the lock held by nobody's ``with`` block, and every later flush waiting on it.
        self._wake_lock = wake_lock = threading.Lock()
        self._wake = threading.Condition(wake_lock)
        # Durable writes buffered and not taken yet (counted with the buffer, under its lock),
        # how many a leader gathers (see _gather), and the signal of each arrival to it.
        self._arrived = threading.Condition(wake_lock)
        self._queued = 0
        self._expected = 0
        self._gathering = False
        self._flush_lock = threading.Lock()
        self._leading = False  # a writer leads a flush that other writers wait for
        # The buffer: three columns of records, the bytes they count, and the trigger (buffered
        # bytes past which a write leaves the fast path: flush_bytes, or less while a flush is
        # in flight and the bound is near). Its put() is compiled; everything else is here.
        self._buf = WriteBuffer(memtable, memtable.lock, self._now_ns, RECORD_OVERHEAD_BYTES)
        #: Buffer one put of a validated key and value; True when :meth:`after_trigger` is due.
        self.buffer_put: Callable[[bytes, bytes], bool] = self._buf.put
        self._inflight: _InFlight | None = None
        self._inflight_bytes = 0
        # Generations count records: the buffer holds records _taken + 1 .. _taken + len(_buf.keys).
        self._taken = 0
        self._durable = 0
        self._flush_bytes = self._cfg.flush_bytes
        self._max_unflushed = self._cfg.max_unflushed_bytes
        self._buf.trigger = min(self._flush_bytes, self._max_unflushed)
        #: ``(position in the buffer, expires_ms)`` of the buffered records with a time to live.
        self._expiring: list[tuple[int, int]] = []
        self._next_sequence: dict[int, int] = {}
        self._fatal: KvlogError | None = None
        self.last_error: str | None = None
        self.flushes = 0
        self.records_flushed = 0
        self._unreleased_bytes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the background flusher thread."""
        self._thread = threading.Thread(target=self._run, name="kvlog-flusher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the background thread (buffered writes stay buffered)."""
        self._stop.set()
        with self._wake_lock:
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    # -- writing ----------------------------------------------------------------------------------
    @property
    def unflushed_bytes(self) -> int:
        with self._lock:
            return self._buf.buffered_bytes + self._inflight_bytes

    def put(self, key: bytes, value: bytes) -> None:
        """Buffer one put of a validated key and value, not durable yet (the fast path of :meth:`write`)."""
        if self._buf.put(key, value):
            self._after_write(0, False)

    def after_trigger(self) -> None:
        """Attend to a buffer whose put returned True: kick the background flush, or wait for it."""
        self._after_write(0, False)

    def write(self, records: Sequence[tuple[bytes, bytes | None]], *, sync: bool,
              ttls: Sequence[int | None] | None = None) -> None:
        """Buffer validated ``(key, value)`` records (None: a delete) as one unit; wait if ``sync``.

        ``ttls`` (one per record, or None) gives a value its time to live: it expires that many
        milliseconds after its timestamp, the time of this call."""
        if self._fatal is not None:
            raise self._fatal
        size = sum(len(k) + (len(v) if v is not None else 0) + RECORD_OVERHEAD_BYTES for k, v in records)
        stamp = self._now_ns()
        stamp_ms = stamp // 1_000_000
        expiring = [] if ttls is None else [(i, stamp_ms + t) for i, t in enumerate(ttls) if t is not None]
        with self._lock:
            buf = self._buf
            first, expiring_before = len(buf.keys), len(self._expiring)
            try:
                self._expiring.extend((first + i, e) for i, e in expiring)
                for key, value in records:
                    buf.keys.append(key)
                    buf.values.append(value)
                    buf.stamps.append(stamp)
            except BaseException:
                # A KeyboardInterrupt between two appends: the columns must stay aligned.
                for column in (buf.keys, buf.values, buf.stamps):
                    del column[first:]
                del self._expiring[expiring_before:]
                raise
            # Buffered whole: an interrupt from here on leaves the write to be flushed.
            self._memtable.write(records, expiring)
            generation = self._taken + len(self._buf.keys)
            self._buf.buffered_bytes = buffered = self._buf.buffered_bytes + size
            if sync:
                self._queued += 1
        if sync or buffered >= self._buf.trigger:
            self._after_write(generation, sync)

    def _after_write(self, generation: int, sync: bool) -> None:
        """A durable write, or a buffer past its trigger: flush, wake the flusher, or wait."""
        if sync:
            self.flush_until(generation, gather=True)
            return
        with self._lock:
            over = self._buf.buffered_bytes + self._inflight_bytes > self._max_unflushed
            full = self._buf.buffered_bytes >= self._flush_bytes
        if over or self._thread is None:
            if over or full:  # backpressure, or no background flusher: the writer flushes
                self.flush()
            return
        if full:
            # The writer that fills the buffer leads its flush (writers arriving meanwhile wait
            # for it as in a group commit). Handing it to the background thread instead is
            # slower in CPython: a writer busy with puts holds the GIL, and the flusher waits a
            # switch interval (5 ms) for it after each of the flush's many GIL releases.
            try:
                self.flush()
            except KvlogError as e:
                if self._fatal is not None:
                    raise
                # Not acknowledged yet, still buffered: the background flusher retries it.
                log.warning("flush failed (the background flusher retries): %s", e)

    def flush(self) -> int:
        """Make every earlier write durable; return the applied commit version."""
        with self._lock:
            generation = self._taken + len(self._buf.keys)
        self.flush_until(generation)
        return self._log.version

    def flush_until(self, generation: int, *, gather: bool = False) -> None:
        """Return once every write up to ``generation`` is durable (flushing as needed).

        Group commit: a waiter that finds no flush running leads one, which takes every write
        buffered so far; waiters arriving meanwhile sleep until it ends, and if it did not cover
        them, one of them leads the next flush for all of them. With ``gather`` (a durable
        write) the waiter counts among the durable writers a leader gathers (:meth:`_gather`).
        """
        if gather:
            with self._wake_lock:
                if self._gathering:
                    self._arrived.notify()
        self._flush_until(generation, gather)

    def _flush_until(self, generation: int, gather: bool) -> None:
        while True:
            # ``lead`` is set before ``_leading``, inside the ``try``: an exception raised between
            # any two steps (a KeyboardInterrupt) never leaves a flush led by nobody.
            lead = False
            try:
                with self._wake_lock:
                    while self._durable < generation and self._leading and self._fatal is None:
                        self._wake.wait(1.0)
                    if self._durable >= generation:
                        return
                    if self._fatal is not None:
                        raise self._fatal
                    lead = self._leading = True
                    if gather:
                        self._gather()
                with self._flush_lock:  # the background thread may hold it: wait, do not spin
                    if self._durable < generation:
                        self._flush_once()
            finally:
                if lead:
                    # Cleared before the lock is taken (waiters look again within a second if
                    # the wake-up is lost to an interrupted acquire).
                    self._leading = False
                    with self._wake_lock:
                        self._wake.notify_all()

    def _gather(self) -> None:
        """Before leading a flush (under the wake lock): wait, at most :data:`GATHER_S`, until as
        many durable writes are buffered as there were durable writers when the last flush
        ended (those it carried, and those that arrived while it ran).

        The writers the last flush acknowledged are on their way back with their next durable
        write; a flush started at once would leave them to the next one, so each flush would
        carry about half of the writers. Gathering lets one flush carry them all. The count
        adapts: a flush that gathered fewer (writers that stopped) expects fewer next time.
        """
        if self._queued >= self._expected:
            return
        self._gathering = True
        try:
            self._arrived.wait_for(
                lambda: self._queued >= self._expected or self._fatal is not None, GATHER_S)
        finally:
            self._gathering = False

    def _announce(self) -> None:
        """Wake the writers waiting for a flush (after the flush lock is released)."""
        with self._wake_lock:
            self._wake.notify_all()

    def discard(self) -> None:
        """Drop every buffered write (a simulated crash, or closing without flushing)."""
        with self._lock:
            self._taken += len(self._buf.keys)
            self._buf.keys, self._buf.values, self._buf.stamps = [], [], []
            self._expiring = []
            self._buf.buffered_bytes = 0
            self._inflight = None
            self._inflight_bytes = 0
            self._queued = 0
            self._memtable.discard()

    # -- the flush itself -------------------------------------------------------------------------
    def _take_buffers(self) -> _InFlight | None:
        """The flush in flight, or a new one of everything buffered (called under the flush lock).

        The batches are made before the buffer is taken, and the flush in flight is recorded
        before the buffer is emptied: an exception on the way (a ``KeyboardInterrupt`` from
        Ctrl-C, raised between any two steps) leaves every record buffered, or both buffered
        and in flight (written once more, as a retry), never in neither."""
        if self._inflight is not None:
            return self._inflight
        with self._lock:
            keys, values, stamps = self._buf.keys, self._buf.values, self._buf.stamps
            generation = self._taken + len(keys)
            nbytes = self._buf.buffered_bytes
            if not keys:
                self._durable = max(self._durable, generation)
                return None
            expiring = self._expiring
            batches = []
            sequences = dict(self._next_sequence)
            for partition, records in split_by_partition(keys, values, stamps, self._partitions, expiring):
                seq = sequences.get(partition, 0)
                batches.append(PendingBatch(partition, records, seq))
                sequences[partition] = (seq + records.num_rows) % SEQUENCE_MODULUS
            self._inflight = _InFlight(batches, len(keys), generation, nbytes, self._queued)
            self._next_sequence = sequences
            self._buf.keys, self._buf.values, self._buf.stamps = [], [], []
            self._expiring = []
            self._queued = 0
            self._taken = generation
            self._memtable.freeze()
            self._buf.buffered_bytes = 0
            self._inflight_bytes = nbytes
            self._buf.trigger = max(0, min(self._flush_bytes, self._max_unflushed - nbytes))
        return self._inflight

    def _flush_once(self) -> None:
        inflight = self._take_buffers()
        if inflight is None:
            return
        resend, inflight.sent = inflight.sent, True
        try:
            self._log.append_batches(self.producer_id, self.epoch, inflight.batches, resend=resend)
        except ProducerError as e:
            self._fatal = self._buf.fatal = e
            self.last_error = f"{type(e).__name__}: {e}"
            raise
        except KvlogError as e:
            self.last_error = f"{type(e).__name__}: {e}"
            raise
        with self._lock:
            self._memtable.retire()
            self._inflight = None
            self._inflight_bytes = 0
            self._buf.trigger = min(self._flush_bytes, self._max_unflushed)
            self._durable = max(self._durable, inflight.generation)
            self.flushes += 1
            self.records_flushed += inflight.records
            self.last_error = None
            self._expected = inflight.writers + self._queued
            self._unreleased_bytes += inflight.nbytes
            release = self._unreleased_bytes >= RELEASE_AFTER_BYTES
            if release:
                self._unreleased_bytes = 0
        # The flush's Arrow copies and encodings were allocated by this thread: hand them back
        # (once a megabyte's worth was flushed), or every flushing thread's allocator keeps its
        # own high-water mark.
        if release:
            release_unused_memory()

    def _due(self) -> bool:
        if self._inflight is not None and not self._leading:
            return True  # a failed flush, to retry
        stamps = self._buf.stamps
        return bool(stamps) and self._now_ns() - stamps[0] >= self._cfg.flush_interval_ms * 1_000_000

    def _run(self) -> None:
        interval_s = max(self._cfg.flush_interval_ms, 1) / 1000.0
        backoff = interval_s
        monotonic_s = self._log.clock.monotonic_s
        quiet_since: float | None = None  # when the writers were first seen quiet after flush quiet_after
        quiet_after = -2
        settled_after = -1  # the flush count when the index runs were last merged
        while not self._stop.is_set():
            with self._wake_lock:
                # Writers change the buffer before they notify under this lock: no lost wake-up.
                if not self._due() or self._fatal is not None:
                    # Quiet for a whole interval since a flush: merge the key index's runs then.
                    settle = False
                    if (self._buf.keys or self._inflight is not None or self._fatal is not None
                            or self.flushes == settled_after):
                        quiet_since = None
                    elif quiet_since is None or self.flushes != quiet_after:
                        quiet_since, quiet_after = monotonic_s(), self.flushes
                    elif monotonic_s() - quiet_since >= interval_s:
                        quiet_since, settled_after, settle = None, self.flushes, True
                    if not settle:
                        self._wake.wait(timeout=interval_s)
                        continue
                else:
                    settle = False
            if settle:
                self._settle_index()
                continue
            try:
                try:
                    with self._flush_lock:
                        self._flush_once()
                finally:
                    self._announce()
                backoff = interval_s
            except StoreClosedError:
                return
            except KvlogError as e:
                log.warning("background flush failed (will retry): %s", e)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def _settle_index(self) -> None:
        try:
            self._log.settle_index()
        except StoreClosedError:
            self._stop.set()
        except KvlogError as e:
            log.warning("merging the key index's runs failed (the next quiet spell retries): %s", e)
