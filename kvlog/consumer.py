"""Consumer groups: read the changelog from where a named group left off.

A :class:`Consumer` reads the records of some partitions in offset order, from a position
per partition. ``poll`` returns what is there past the positions, or waits for new commits
(:meth:`kvlog.Log.wait_for_commit`) until records arrive or the timeout passes. ``commit``
stores the positions as the group's committed offsets *in the store itself*, through the
commit log (as Kafka keeps them in ``__consumer_offsets``): they survive restarts and the
collection of old commits, and other processes see them once they refresh.

A consumer created with ``hold_tombstones=True`` makes its group hold tombstones: compaction
keeps every tombstone and expired record at or after the group's committed offsets, so a
consumer that lags past ``delete_retention_ms`` still reads every delete of a key it read
(no "ghost keys"). The hold is committed when the consumer is created (at its starting
positions) and lasts until ``group_hold_max_ms`` after the group's last commit, or until
:func:`delete_group`. :func:`consumer_groups` lists the groups with their lags and holds.

A consumer starts at the group's committed offset of each partition, else at the partition's
start (Kafka's ``auto.offset.reset=earliest``). A position below the start (compacted away)
resumes at the start; offsets compaction removed are skipped. A consumer idle while another
process compacted and collected the files its cache lists reads on from its positions
(:meth:`kvlog.Log.read` catches up with the newer commits). Two consumers of one group
(in one process or several) are not coordinated: each reads what it is given and the later
``commit`` wins.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import TracebackType

from kvlog.errors import GroupNotFoundError, InvalidRecordError, StoreClosedError
from kvlog.log import Log, Record
from kvlog.log import group_offsets as offsets_commits
from kvlog.log.group_offsets import check_group, check_offset, commit_offsets, committed_offsets
from kvlog.log.waiting import check_timeout
from kvlog.meta import GroupOffsets, GroupState, MetaReader

__all__ = ["Consumer", "GroupInfo", "consumer_groups", "delete_group"]


@dataclass(frozen=True)
class GroupInfo:
    """A consumer group as the store knows it (:meth:`kvlog.Store.consumer_groups`)."""

    name: str
    offsets: dict[int, int]
    """The committed offset of each partition the group committed (the next offset it reads)."""
    lag: dict[int, int]
    """Per committed partition, the offsets between the committed offset and the end offset."""
    last_commit_ms: int | None
    """When the group last committed (ms since the epoch; None: unknown)."""
    hold_expires_ms: int | None
    """When the group's tombstone hold lapses unless it commits again (None: no hold)."""
    holding: bool
    """Whether the hold lasts now: compaction keeps the tombstones and expired records at or
    after the group's offsets."""


def consumer_groups(log: Log) -> list[GroupInfo]:
    """Every consumer group of the store as this process's cache knows it, by name."""

    def read(r: MetaReader) -> tuple[dict[str, dict[int, int]], dict[str, GroupState]]:
        table = GroupOffsets(r)
        return table.by_group(), table.states()

    by_group, states = log.snapshot(read)
    ends, begins = log.end_offsets(), log.begin_offsets()
    now = log.clock.now_ms()
    out = []
    for name in sorted(set(by_group) | set(states)):
        committed, state = by_group.get(name, {}), states.get(name)
        out.append(GroupInfo(
            name, committed, {p: max(0, ends[p] - max(o, begins[p])) for p, o in committed.items() if p in ends},
            None if state is None else state.last_commit_ms,
            None if state is None else state.hold_expires_ms,
            state is not None and state.holding(now),
        ))
    return out


def delete_group(log: Log, group: str) -> None:
    """Forget ``group`` in every process: its committed offsets and its tombstone hold (after
    reading the head). :class:`~kvlog.errors.GroupNotFoundError` when no such group exists."""
    check_group(group)
    log.refresh()
    if not any(info.name == group for info in consumer_groups(log)):
        raise GroupNotFoundError(f"no consumer group {group!r} in the store")
    offsets_commits.delete_group(log, group)


class Consumer:
    """A member of consumer group ``group`` reading ``partitions`` (all by default).
    Create with :meth:`kvlog.Store.consumer`."""

    def __init__(self, log: Log, group: str, partitions: Iterable[int] | None = None, *,
                 hold_tombstones: bool = False, defer_hold: bool = False) -> None:
        """``defer_hold``: commit the tombstone hold in the first call of another method rather
        than here (:mod:`kvlog.aio` does, so its creation does no I/O on the event loop)."""
        log.check_open()
        if type(hold_tombstones) is not bool:
            raise InvalidRecordError(f"hold_tombstones must be True or False, not {hold_tombstones!r}")
        self._log = log
        self.group = check_group(group)
        if partitions is None:
            chosen = list(range(log.partitions))
        else:
            if isinstance(partitions, str | bytes) or not isinstance(partitions, Iterable):
                raise InvalidRecordError(f"partitions must be an iterable of ints, not {partitions!r}")
            chosen = [log.check_partition(p) for p in partitions]
            if not chosen or len(set(chosen)) != len(chosen):
                raise InvalidRecordError(f"partitions must be distinct and at least one: {chosen!r}")
        #: The partitions this consumer reads, in the order given.
        self.partitions: tuple[int, ...] = tuple(chosen)
        self._lock = threading.RLock()
        self._closed = False
        self._next = 0  # the partition a poll reads first, so every partition gets its turn
        #: Whether this consumer's group holds tombstones (committed with every :meth:`commit`).
        self.hold_tombstones = hold_tombstones
        self._hold_due = hold_tombstones
        if hold_tombstones and not defer_hold:
            log.refresh()  # the hold starts at the group's latest committed offsets
        committed = committed_offsets(log, self.group)
        self._positions = {p: committed[p] if p in committed else log.start_offset(p) for p in chosen}
        if not defer_hold:
            self._start_hold()

    def _start_hold(self) -> None:
        """Commit the group's tombstone hold at the positions, once, before any record is read:
        from then on compaction keeps every dead record this consumer has still to read."""
        if self._hold_due:
            commit_offsets(self._log, self.group, dict(self._positions), hold_ms=self._log.config.group_hold_max_ms)
            self._hold_due = False

    # -- helpers ----------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("the consumer is closed")
        self._log.check_open()
        if self._hold_due:
            self._start_hold()

    def _assigned(self, partition: int) -> int:
        if (not isinstance(partition, int) or isinstance(partition, bool)
                or partition not in self._positions):
            raise InvalidRecordError(f"partition {partition!r} is not one of this consumer's "
                                     f"{list(self.partitions)}")
        return partition

    def _chosen(self, partitions: Iterable[int] | None) -> list[int]:
        """``partitions`` (None: all of this consumer's), each checked to be one of them."""
        if partitions is None:
            return list(self.partitions)
        if isinstance(partitions, str | bytes) or not isinstance(partitions, Iterable):
            raise InvalidRecordError(f"partitions must be an iterable of ints, not {partitions!r}")
        return [self._assigned(p) for p in partitions]

    def _checked(self, offsets: object) -> dict[int, int]:
        """``offsets`` as a dict of this consumer's partitions to valid offsets, or
        :class:`InvalidRecordError` naming the first bad one."""
        if not isinstance(offsets, Mapping):
            raise InvalidRecordError(f"offsets must be a mapping of partitions to offsets, not {offsets!r}")
        return {self._assigned(p): check_offset(o) for p, o in offsets.items()}

    def _fetch(self, max_records: int) -> list[Record]:
        out: list[Record] = []
        order = self.partitions[self._next:] + self.partitions[:self._next]
        self._next = (self._next + 1) % len(self.partitions)
        for p in order:
            want = max_records - len(out)
            if want <= 0:
                break
            position = self._positions[p]
            for record in self._log.read(p, position):
                out.append(record)
                position = record.offset + 1
                want -= 1
                if want == 0:
                    break
            self._positions[p] = position
        return out

    # -- reading ----------------------------------------------------------------------------------
    def poll(self, timeout_s: float = 1.0, max_records: int = 500) -> list[Record]:
        """Up to ``max_records`` records past the positions, in offset order per partition,
        advancing the positions. Returns at once when there are some; else waits up to
        ``timeout_s`` seconds for commits that bring some (an empty list when none came)."""
        timeout = check_timeout(timeout_s)
        if not isinstance(max_records, int) or isinstance(max_records, bool) or max_records <= 0:
            raise InvalidRecordError(f"max_records must be an integer > 0, not {max_records!r}")
        monotonic_s = self._log.clock.monotonic_s
        deadline = monotonic_s() + timeout
        with self._lock:
            while True:
                self._check_open()
                version = self._log.version
                records = self._fetch(max_records)
                remaining = deadline - monotonic_s()
                if records or remaining <= 0:
                    return records
                if self._log.wait_for_commit(version, min(remaining, timeout)) <= version:
                    return []

    def __iter__(self) -> Iterator[Record]:
        """Every record from the positions on, waiting for new ones forever (until closed)."""
        while not self._closed:
            try:
                batch = self.poll()
            except StoreClosedError:
                if self._closed:
                    return
                raise
            yield from batch

    # -- positions --------------------------------------------------------------------------------
    def position(self, partition: int) -> int:
        """The offset the next record of ``partition`` is read from (at least its start offset)."""
        with self._lock:
            self._check_open()
            p = self._assigned(partition)
            start = self._log.start_offset(p)
            if self._positions[p] < start:
                self._positions[p] = start  # compacted away: resume at the start
            return self._positions[p]

    def seek(self, partition: int, offset: int) -> None:
        """Read ``partition`` from ``offset`` on (past the end: wait for it; below the start:
        from the start)."""
        with self._lock:
            self._check_open()
            p = self._assigned(partition)
            self._positions[p] = check_offset(offset)

    def seek_all(self, offsets: Mapping[int, int]) -> None:
        """Read each partition of ``offsets`` from its offset (``snap.end_offsets()`` tails a
        snapshot's state exactly); the other partitions keep their positions. Every partition
        and offset is checked before any position moves."""
        with self._lock:
            self._check_open()
            self._positions.update(self._checked(offsets))

    def seek_to_beginning(self, partitions: Iterable[int] | None = None) -> None:
        """Read ``partitions`` (all of this consumer's by default) from their start offsets."""
        with self._lock:
            self._check_open()
            chosen = self._chosen(partitions)
            begins = self._log.begin_offsets()
            self._positions.update({p: begins[p] for p in chosen})

    def seek_to_end(self, partitions: Iterable[int] | None = None) -> None:
        """Read ``partitions`` (all of this consumer's by default) from their end offsets, after
        reading the head: only records written from now on are read."""
        with self._lock:
            self._check_open()
            chosen = self._chosen(partitions)
            self._log.refresh()
            ends = self._log.end_offsets()
            self._positions.update({p: ends[p] for p in chosen})

    def lag(self) -> dict[int, int]:
        """Per partition of this consumer, how many offsets lie between its position and the
        end offset (after reading the head): 0 when it has read everything durable. Offsets
        compaction removed count too (Kafka's lag is the same difference)."""
        with self._lock:
            self._check_open()
            self._log.refresh()
            ends, begins = self._log.end_offsets(), self._log.begin_offsets()
            return {p: max(0, ends[p] - max(self._positions[p], begins[p])) for p in self.partitions}

    def caught_up(self) -> bool:
        """Whether every partition's position is at its end offset (after reading the head)."""
        return not any(self.lag().values())

    # -- committed offsets ------------------------------------------------------------------------
    def commit(self, offsets: Mapping[int, int] | None = None) -> None:
        """Store ``offsets`` (None: every position) as the group's committed offsets, durably,
        in the store (one commit); partitions not given keep theirs. Every partition and offset
        is checked first. A consumer that holds tombstones renews its group's hold. On a
        read-only store: :class:`~kvlog.errors.ReadOnlyError`."""
        with self._lock:
            self._check_open()
            chosen = dict(self._positions) if offsets is None else self._checked(offsets)
            if chosen:  # nothing given: nothing to commit (no empty commit)
                hold_ms = self._log.config.group_hold_max_ms if self.hold_tombstones else None
                commit_offsets(self._log, self.group, chosen, hold_ms=hold_ms)

    def committed(self, partition: int) -> int | None:
        """The group's committed offset of ``partition`` as this process's cache knows it
        (``store.refresh()`` picks up other processes' commits); None: never committed."""
        with self._lock:
            self._check_open()
            p = self._assigned(partition)
        return committed_offsets(self._log, self.group).get(p)

    # -- lifetime ---------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop consuming (positions not committed are dropped; call :meth:`commit` first)."""
        self._closed = True

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"Consumer(group={self.group!r}, partitions={list(self.partitions)}, {state})"
