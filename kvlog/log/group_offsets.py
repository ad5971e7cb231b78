"""Consumer groups' committed offsets, stored in the log itself.

As Kafka keeps them in ``__consumer_offsets``, kvlog keeps a group's committed offsets in
its own commit log: an ``offsets`` commit names the group and an offset per partition, and
replay records them in the catalog (:class:`kvlog.meta.group_offsets.GroupOffsets`).
Metadata checkpoints carry them, so they outlive the commits that wrote them, and every
process sees them once it applied the commit. Two writers of one group: the later commit
wins (there is no rebalancing).

**Tombstone holds.** A group may ask that compaction keep every tombstone and expired record
at or after its committed offsets, so a consumer slower than ``delete_retention_ms`` still sees
every delete (no "ghost keys"). The ``offsets`` commit that asks carries ``hold_ms`` (the
committing process's ``group_hold_max_ms``); the hold lasts until ``hold_ms`` after the group's
last commit, or until the group is deleted (an ``offsets`` commit with ``delete``). Every
process decides from the commits alone, so all agree.

A compaction reads the holds at some version and commits its ``replace`` later; a hold that
starts (or moves back to a lower offset) in between would lose records that compaction
removed. Such a commit records its version as the catalog's ``holds_changed``; a ``replace``
carries the version it read the holds at (``holds_at``), and replay refuses it when a hold
changed after that. The compactor then plans again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeGuard

from kvlog.errors import InvalidRecordError, KvlogError
from kvlog.format.commit import Commit
from kvlog.meta import MetaTxn
from kvlog.meta.group_offsets import OFFSET_LIMIT, PARTITION_LIMIT, GroupOffsets, GroupState

if TYPE_CHECKING:
    from kvlog.log.log import Log

__all__ = ["GROUP_BYTES_LIMIT", "apply_offsets", "check_group", "check_offset", "commit_offsets", "committed_offsets",
           "delete_group", "holds_changed_after", "holds_at"]

#: The longest group name, in UTF-8 bytes.
GROUP_BYTES_LIMIT = 255


def check_group(group: object) -> str:
    """``group`` if it is a usable group name, else :class:`InvalidRecordError`."""
    if not isinstance(group, str) or not group:
        raise InvalidRecordError(f"a consumer group is a non-empty str, not {group!r}")
    if "\x00" in group or len(group.encode("utf-8", "surrogatepass")) > GROUP_BYTES_LIMIT:
        raise InvalidRecordError(f"a consumer group name holds no NUL and at most {GROUP_BYTES_LIMIT} bytes")
    try:
        group.encode()
    except UnicodeEncodeError:
        raise InvalidRecordError("a consumer group name must be valid UTF-8 text") from None
    return group


def check_offset(offset: object) -> int:
    """``offset`` if it can be committed (an int in [0, 2**63)), else :class:`InvalidRecordError`."""
    if not isinstance(offset, int) or isinstance(offset, bool) or not 0 <= offset < OFFSET_LIMIT:
        raise InvalidRecordError(f"an offset is an integer in [0, 2**63), not {offset!r}")
    return offset


def _usable_group(group: object) -> TypeGuard[str]:
    """Whether a commit's ``group`` is a name :func:`check_group` accepts: one the catalog can
    key its rows by (valid UTF-8, at most :data:`GROUP_BYTES_LIMIT` bytes, no NUL). A commit
    naming another is refused, never applied: applying it would fail in every reader alike."""
    try:
        check_group(group)
    except InvalidRecordError:
        return False
    return True


def committed_offsets(the_log: Log, group: str) -> dict[int, int]:
    """Every partition's committed offset of ``group`` in this cache."""
    found: dict[int, int] = the_log.snapshot(lambda r: GroupOffsets(r).of_group(group))
    return found


def commit_offsets(the_log: Log, group: str, offsets: dict[int, int], *, hold_ms: int | None = None) -> int:
    """Commit ``offsets`` (partition -> next offset to read) for ``group``; durable on return.
    ``hold_ms``: the group holds tombstones until that long after this commit (None: a hold
    it has keeps its duration); a commit records at most 2**63 - 1 ms (some 292 million
    years), so a longer ``group_hold_max_ms`` (no setting bounds it) is recorded as that.
    Returns the version of the commit."""
    for p, offset in offsets.items():
        the_log.check_partition(p)
        check_offset(offset)
    body: dict[str, object] = {"group": group, "offsets": {str(p): o for p, o in sorted(offsets.items())}}
    if hold_ms is not None:
        body["hold_ms"] = min(hold_ms, OFFSET_LIMIT - 1)
    return _commit_group(the_log, body)


def delete_group(the_log: Log, group: str) -> int:
    """Forget ``group`` in every process: its committed offsets and its hold. Returns the
    version of the commit."""
    return _commit_group(the_log, {"group": group, "offsets": {}, "delete": True})


def _commit_group(the_log: Log, body: dict[str, object]) -> int:
    commit_id = the_log.new_id()

    def build(version: int) -> Commit:
        return Commit(version, commit_id, the_log.clock.now_ms(), "offsets", info=body)

    outcome = the_log.commit(build)
    if outcome.refusal is not None:
        raise KvlogError(f"the offsets commit was refused: {outcome.refusal.message}")
    return outcome.version


def holds_at(info: dict[str, object]) -> int | None:
    """The version a ``replace`` commit's compaction read the holds at (None: not recorded)."""
    at = info.get("holds_at")
    return at if isinstance(at, int) and not isinstance(at, bool) else None


def holds_changed_after(txn: MetaTxn, info: dict[str, object]) -> str | None:
    """Why a ``replace`` commit (its ``info``) must be refused because a hold started or moved
    back after its compaction read the holds; None when none did. A compaction reads the holds
    before its commit: a ``holds_at`` past the version before this commit shows nothing, and
    counts as not recorded."""
    at = holds_at(info)
    if at is not None and not 0 <= at <= txn.version():
        at = None
    changed = GroupOffsets(txn).holds_changed()
    if changed and (at is None or changed > at):
        return (f"a consumer group's tombstone hold changed at version {changed}, after the "
                f"compaction read the holds{'' if at is None else f' at version {at}'}")
    return None


def apply_offsets(txn: MetaTxn, commit: Commit, now_ms: int) -> str | None:
    """Replay an ``offsets`` commit (at ``now_ms``, the time replay gives it); the reason it is
    refused, or None once applied."""
    group, offsets = commit.info.get("group"), commit.info.get("offsets")
    if not _usable_group(group) or not isinstance(offsets, dict):
        return "an offsets commit names a group and its offsets"
    hold_ms, delete = commit.info.get("hold_ms"), commit.info.get("delete", False)
    if hold_ms is not None and (not isinstance(hold_ms, int) or isinstance(hold_ms, bool)
                                or not 0 <= hold_ms < OFFSET_LIMIT):
        return f"malformed hold_ms {hold_ms!r}"
    if not isinstance(delete, bool) or (delete and (offsets or hold_ms is not None)):
        return "an offsets commit that deletes its group carries no offsets and no hold"
    parsed: list[tuple[int, int]] = []
    for p, offset in offsets.items():
        if (not isinstance(p, str) or not p.isascii() or not p.isdigit() or int(p) >= PARTITION_LIMIT
                or not isinstance(offset, int) or isinstance(offset, bool) or not 0 <= offset < OFFSET_LIMIT):
            return f"malformed offset {offset!r} of partition {p!r}"
        parsed.append((int(p), offset))
    table = GroupOffsets(txn)
    if delete:
        table.delete(group)
        return None
    old = table.state(group)
    before = table.of_group(group)
    if hold_ms is None and old is not None:
        hold_ms = old.hold_ms
    state = GroupState(now_ms, hold_ms)
    if state.holding(now_ms):
        # A hold that starts (new, or lapsed at this commit's time), or a held offset that moves
        # back, protects records an in-flight compaction may already have left out. A hold that
        # has lapsed already (``hold_ms`` 0) protects nothing, and refuses no round.
        starts = old is None or not old.holding(now_ms)
        if starts or any(p not in before or offset < before[p] for p, offset in parsed):
            table.set_holds_changed(commit.version)
    for p, offset in parsed:
        table.put(group, p, offset)
    table.put_state(group, state)
    return None

