"""Consumer groups' committed offsets, stored in the log itself.

As Kafka keeps them in ``__consumer_offsets``, kvlog keeps a group's committed offsets in
its own commit log: an ``offsets`` commit names the group and an offset per partition, and
replay records them in the catalog (:class:`kvlog.meta.group_offsets.GroupOffsets`).
Metadata checkpoints carry them, so they outlive the commits that wrote them, and every
process sees them once it applied the commit. Two writers of one group: the later commit
wins (there is no rebalancing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvlog.errors import InvalidRecordError, KvlogError
from kvlog.format.commit import Commit
from kvlog.meta import MetaTxn
from kvlog.meta.group_offsets import OFFSET_LIMIT, PARTITION_LIMIT, GroupOffsets

if TYPE_CHECKING:
    from kvlog.log.log import Log

__all__ = ["GROUP_BYTES_LIMIT", "apply_offsets", "check_group", "check_offset", "commit_offsets", "committed_offsets"]

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


def committed_offsets(the_log: Log, group: str) -> dict[int, int]:
    """Every partition's committed offset of ``group`` in this cache."""
    found: dict[int, int] = the_log.snapshot(lambda r: GroupOffsets(r).of_group(group))
    return found


def commit_offsets(the_log: Log, group: str, offsets: dict[int, int]) -> int:
    """Commit ``offsets`` (partition -> next offset to read) for ``group``; durable on return.
    Returns the version of the commit."""
    for p, offset in offsets.items():
        the_log.check_partition(p)
        check_offset(offset)
    commit_id = the_log.new_id()
    body = {"group": group, "offsets": {str(p): o for p, o in sorted(offsets.items())}}

    def build(version: int) -> Commit:
        return Commit(version, commit_id, the_log.clock.now_ms(), "offsets", info=body)

    outcome = the_log.commit(build)
    if outcome.refusal is not None:
        raise KvlogError(f"the offsets commit was refused: {outcome.refusal.message}")
    return outcome.version


def apply_offsets(txn: MetaTxn, commit: Commit) -> str | None:
    """Replay an ``offsets`` commit; the reason it is refused, or None once applied."""
    group, offsets = commit.info.get("group"), commit.info.get("offsets")
    if not isinstance(group, str) or not group or "\x00" in group or not isinstance(offsets, dict):
        return "an offsets commit names a group and its offsets"
    parsed: list[tuple[int, int]] = []
    for p, offset in offsets.items():
        if (not isinstance(p, str) or not p.isascii() or not p.isdigit() or int(p) >= PARTITION_LIMIT
                or not isinstance(offset, int) or isinstance(offset, bool) or not 0 <= offset < OFFSET_LIMIT):
            return f"malformed offset {offset!r} of partition {p!r}"
        parsed.append((int(p), offset))
    table = GroupOffsets(txn)
    for p, offset in parsed:
        table.put(group, p, offset)
    return None

