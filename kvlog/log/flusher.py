"""Write buffers, flush and group commit.

Writes go to per-partition buffers. A flush takes everything buffered, writes
one L0 data file holding every partition's batch, and commits it: so a write
batch, added under one lock, is never split across commits. Many threads
waiting for durability share one flush (group commit). A flush that fails
keeps its batches, with their producer sequences, and is retried first: the
idempotent-producer rules make a resend that did land a harmless duplicate.

Triggers: ``flush()``, a durable write, ``flush_bytes`` buffered (the
background thread), ``flush_interval_ms`` elapsed (the background thread), and
``max_unflushed_bytes`` (the writer flushes itself: backpressure, never
unbounded memory).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvlog.errors import KvlogError, ProducerError, StoreClosedError
from kvlog.format.datafile import make_record_batch
from kvlog.index import MemTable
from kvlog.log.log import Log, PendingBatch
from kvlog.log.producers import SEQUENCE_MODULUS

__all__ = ["Flusher", "RECORD_OVERHEAD_BYTES"]

log = logging.getLogger("kvlog.flush")

#: Bytes of bookkeeping counted per buffered record on top of its key and value: the Python
#: objects of the buffer lists and the memtable entry (measured at about 250 bytes).
RECORD_OVERHEAD_BYTES = 256


@dataclass
class _Buffer:
    keys: list[bytes] = field(default_factory=list)
    values: list[bytes | None] = field(default_factory=list)
    stamps: list[int] = field(default_factory=list)


@dataclass
class _InFlight:
    batches: list[PendingBatch]
    keys: list[bytes]
    generation: int
    nbytes: int


class Flusher:
    """Buffers a producer's writes and makes them durable in group commits."""

    def __init__(self, log: Log, producer_id: int, epoch: int, memtable: MemTable) -> None:
        self._log = log
        self.producer_id = producer_id
        self.epoch = epoch
        self._memtable = memtable
        self._cfg = log.config
        self._clock = log.clock
        self._lock = threading.Condition(threading.Lock())
        self._flush_lock = threading.Lock()
        self._buffers: dict[int, _Buffer] = {}
        self._buffered_bytes = 0
        self._inflight: _InFlight | None = None
        self._generation = 0
        self._durable = 0
        self._oldest_ms: int | None = None
        self._next_sequence: dict[int, int] = {}
        self._fatal: KvlogError | None = None
        self.last_error: str | None = None
        self.flushes = 0
        self.records_flushed = 0
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
        with self._lock:
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    # -- writing ----------------------------------------------------------------------------------
    @property
    def unflushed_bytes(self) -> int:
        with self._lock:
            return self._buffered_bytes + (self._inflight.nbytes if self._inflight else 0)

    def write(self, records: Sequence[tuple[int, bytes, bytes | None, int]], *, sync: bool) -> None:
        """Buffer ``(partition, key, value, timestamp)`` records as one unit; wait for durability if ``sync``."""
        if self._fatal is not None:
            raise self._fatal
        size = sum(len(k) + (len(v) if v is not None else 0) + RECORD_OVERHEAD_BYTES for _p, k, v, _t in records)
        with self._lock:
            self._generation += 1
            generation = self._generation
            for partition, key, value, stamp in records:
                buf = self._buffers.get(partition)
                if buf is None:
                    buf = self._buffers[partition] = _Buffer()
                buf.keys.append(key)
                buf.values.append(value)
                buf.stamps.append(stamp)
                self._memtable.put(key, value, generation)
            self._buffered_bytes += size
            if self._oldest_ms is None:
                self._oldest_ms = self._clock.now_ms()
            total = self._buffered_bytes + (self._inflight.nbytes if self._inflight else 0)
            full = self._buffered_bytes >= self._cfg.flush_bytes
            if full:
                self._lock.notify_all()
        if sync or total > self._cfg.max_unflushed_bytes or (full and self._thread is None):
            self.flush_until(generation)

    def write_one(self, partition: int, key: bytes, value: bytes | None, stamp: int, *, sync: bool) -> None:
        """Buffer one record (the fast path of :meth:`write`)."""
        if self._fatal is not None:
            raise self._fatal
        size = len(key) + (len(value) if value is not None else 0) + RECORD_OVERHEAD_BYTES
        with self._lock:
            self._generation += 1
            generation = self._generation
            buf = self._buffers.get(partition)
            if buf is None:
                buf = self._buffers[partition] = _Buffer()
            buf.keys.append(key)
            buf.values.append(value)
            buf.stamps.append(stamp)
            self._memtable.put(key, value, generation)
            self._buffered_bytes += size
            if self._oldest_ms is None:
                self._oldest_ms = self._clock.now_ms()
            full = self._buffered_bytes >= self._cfg.flush_bytes
            if full:
                self._lock.notify_all()
            over = self._buffered_bytes + (self._inflight.nbytes if self._inflight else 0) > (
                self._cfg.max_unflushed_bytes
            )
        # Without a background flusher the writer flushes at flush_bytes itself.
        if sync or over or (full and self._thread is None):
            self.flush_until(generation)

    def flush(self) -> int:
        """Make every earlier write durable; return the applied commit version."""
        with self._lock:
            generation = self._generation
        self.flush_until(generation)
        return self._log.version

    def flush_until(self, generation: int) -> None:
        """Return once every write up to ``generation`` is durable (flushing as needed)."""
        while True:
            with self._lock:
                if self._durable >= generation:
                    return
            if self._fatal is not None:
                raise self._fatal
            with self._flush_lock:
                with self._lock:
                    if self._durable >= generation:
                        return
                self._flush_once()

    def discard(self) -> None:
        """Drop every buffered write (a simulated crash, or closing without flushing)."""
        with self._lock:
            self._buffers.clear()
            self._buffered_bytes = 0
            self._inflight = None
            self._oldest_ms = None
            self._memtable.clear()

    # -- the flush itself -------------------------------------------------------------------------
    def _take_buffers(self) -> _InFlight | None:
        with self._lock:
            if self._inflight is not None:
                return self._inflight
            if not self._buffers:
                self._durable = self._generation
                return None
            batches = []
            keys: list[bytes] = []
            for partition in sorted(self._buffers):
                buf = self._buffers[partition]
                seq = self._next_sequence.get(partition, 0)
                batches.append(PendingBatch(partition, make_record_batch(buf.keys, buf.values, buf.stamps), seq))
                self._next_sequence[partition] = (seq + len(buf.keys)) % SEQUENCE_MODULUS
                keys.extend(buf.keys)
            self._inflight = _InFlight(batches, keys, self._generation, self._buffered_bytes)
            self._buffers = {}
            self._buffered_bytes = 0
            self._oldest_ms = None
            return self._inflight

    def _flush_once(self) -> None:
        inflight = self._take_buffers()
        if inflight is None:
            return
        try:
            self._log.append_batches(self.producer_id, self.epoch, inflight.batches)
        except ProducerError as e:
            self._fatal = e
            self.last_error = f"{type(e).__name__}: {e}"
            raise
        except KvlogError as e:
            self.last_error = f"{type(e).__name__}: {e}"
            raise
        with self._lock:
            self._inflight = None
            self._durable = max(self._durable, inflight.generation)
            self.flushes += 1
            self.records_flushed += sum(b.records.num_rows for b in inflight.batches)
            self.last_error = None
            self._lock.notify_all()
        self._memtable.retire(inflight.keys, inflight.generation)

    def _run(self) -> None:
        interval_s = max(self._cfg.flush_interval_ms, 1) / 1000.0
        backoff = interval_s
        while not self._stop.is_set():
            with self._lock:
                self._lock.wait(timeout=interval_s)
                if self._stop.is_set():
                    return
                due = self._inflight is not None or self._buffered_bytes >= self._cfg.flush_bytes or (
                    self._oldest_ms is not None
                    and self._clock.now_ms() - self._oldest_ms >= self._cfg.flush_interval_ms
                )
            if not due or self._fatal is not None:
                continue
            try:
                with self._flush_lock:
                    self._flush_once()
                backoff = interval_s
            except StoreClosedError:
                return
            except KvlogError as e:
                log.warning("background flush failed (will retry): %s", e)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)
