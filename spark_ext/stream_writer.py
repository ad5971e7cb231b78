"""The ``kvlog`` streaming sink: each micro-batch lands in one commit, exactly once.

Tasks write their data files as batch appends do (:class:`spark_ext.writer.KvlogWriter`:
one file per task, nothing live yet). The driver's ``commit(messages, batch_id)`` then makes
them live in **one** kvlog commit, written as the query's idempotent producer:

* the producer id is derived from the query's checkpoint location
  (:attr:`~spark_ext.stream_options.StreamWriteOptions.producer_id`), the identity that stays
  the same when the query restarts from its checkpoint (Spark's query id lives in the same
  directory; the Python sink is handed the location, not the id);
* the epoch is ``batch_id + 1``, and in each commit the sequences of every partition start
  at 0, so the store's producer rules would refuse a second commit of the same micro-batch
  (the same sequences: a duplicate, or a fenced producer if the content differs);
* before the commit is written, at the exact version it will take, the driver reads the
  producer's epoch: if it is already ``batch_id + 1`` or newer, this micro-batch (or a later
  one) landed, and the commit is not written; the task files that are not live are deleted.

The check runs inside the commit's build step, which the committer calls after applying
every landed commit and before the put-if-absent of the next version; when another writer
takes that version first, the build step runs again on the newer state. So two drivers
committing the same micro-batch (a retried commit, a zombie driver, a query restarted while
its previous run was still committing) write it once. A micro-batch Spark re-runs after a
crash between the kvlog commit and Spark's own commit log finds its epoch there and writes
nothing.

The producer's epoch is kept in the store's metadata for good (an expired producer loses its
duplicate window after ``producer_id_expiration_ms``, not its epoch), so the guarantee does not
end with that expiry. It rests on the checkpoint location: a query restarted from a moved
checkpoint directory is another producer, which the store cannot tell from a new query.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from kvlog.errors import KvlogError
from kvlog.format.commit import FileEntry, file_from_json
from kvlog.log import Log, commit_files, open_log
from kvlog.storage import open_storage
from spark_ext.options import driver_cache_dir
from spark_ext.stream_options import StreamWriteOptions
from spark_ext.writer import KvlogWriter, _Files, check_write_schema

__all__ = ["KvlogStreamWriter", "make_stream_writer", "sequenced"]


class _Landed(KvlogError):
    """The producer's epoch shows that this micro-batch already landed: write nothing."""


def sequenced(files: list[FileEntry], producer_id: int, epoch: int) -> list[FileEntry]:
    """``files`` with every batch written as (``producer_id``, ``epoch``) and, per partition,
    sequences from 0 in file order: the batches of one micro-batch's commit."""
    next_sequence: dict[int, int] = {}
    out = []
    for file in files:
        batches = []
        for batch in file.batches:
            seq = next_sequence.get(batch.partition, 0)
            next_sequence[batch.partition] = seq + batch.location.count
            batches.append(replace(batch, producer_id=producer_id, epoch=epoch, base_sequence=seq))
        out.append(replace(file, batches=tuple(batches)))
    return out


class KvlogStreamWriter(KvlogWriter, DataSourceStreamArrowWriter):
    """``df.writeStream.format("kvlog")``: tasks write as :class:`KvlogWriter` does; see the module."""

    def __init__(self, options: dict[str, str], schema: StructType, parsed: StreamWriteOptions) -> None:
        super().__init__(options, schema)
        self.producer_id = parsed.producer_id

    def _open(self, read_only: bool) -> Log:
        return open_log(self.uri, create=False, read_only=read_only, storage_options=self.storage_options,
                        cache_dir=driver_cache_dir(self.uri, self.cache_dir), maintain_index=False)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # type: ignore[override]  # noqa: N803
        files = sequenced([file_from_json("spark task", json.loads(f)) for m in messages if isinstance(m, _Files)
                           for f in m.files], self.producer_id, batchId + 1)
        if not files:
            return
        epoch = batchId + 1
        the_log = self._open(read_only=False)
        try:
            def check(_version: int) -> None:
                # At the version this commit will take: has this micro-batch landed already?
                state = the_log.snapshot(lambda r: r.get_producer(self.producer_id))
                if state is not None and state.epoch >= epoch:
                    raise _Landed(f"micro-batch {batchId}: the producer is at epoch {state.epoch}")

            try:
                outcome = commit_files(the_log, "append", files, check=check)
            except _Landed:
                self._delete_unless_live(the_log, files)
                return
        finally:
            the_log.close()
        if outcome.refusal is not None:
            raise KvlogError(f"micro-batch {batchId}: the append commit was refused: {outcome.refusal.message}")

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # type: ignore[override]  # noqa: N803
        """Delete the task files of a failed micro-batch, except any that a commit made live: a
        commit may land and its caller still fail (its answer lost), and Spark then aborts."""
        files = [file_from_json("spark task", json.loads(f)) for m in messages if isinstance(m, _Files)
                 for f in m.files]
        if not files:
            return
        the_log = self._open(read_only=True)
        try:
            self._delete_unless_live(the_log, files)
        finally:
            the_log.close()

    def _delete_unless_live(self, the_log: Log, files: list[FileEntry]) -> None:
        live = the_log.snapshot(lambda r: {f.file_id for f in files if r.get_file(f.file_id) is not None})
        storage = open_storage(self.uri, self.storage_options)
        try:
            for f in files:
                if f.file_id not in live:
                    storage.delete(f.path)
        finally:
            storage.close()


def make_stream_writer(options: dict[str, Any], schema: StructType) -> KvlogStreamWriter:
    """The sink for ``options`` (checked first: nothing is opened for bad options)."""
    check_write_schema(schema)
    parsed = StreamWriteOptions.parse(options)
    return KvlogStreamWriter(options, schema, parsed)
