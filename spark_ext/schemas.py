"""The schemas of the ``kvlog`` data source's two views, as Spark DDL and as Arrow."""

from __future__ import annotations

import pyarrow as pa

__all__ = ["LOG_SCHEMA", "LATEST_SCHEMA", "LOG_INTERNAL_SCHEMA", "LOG_ARROW", "LOG_INTERNAL_ARROW", "LATEST_ARROW",
           "expires_column"]

LOG_SCHEMA = ("partition int, offset bigint, timestamp bigint, key binary, value binary, is_tombstone boolean, "
              "expires_ms bigint")
LATEST_SCHEMA = "key binary, value binary, partition int, offset bigint, timestamp bigint, expires_ms bigint"
LOG_INTERNAL_SCHEMA = LOG_SCHEMA + ", horizon bigint"

LOG_ARROW = pa.schema([
    ("partition", pa.int32()), ("offset", pa.int64()), ("timestamp", pa.int64()), ("key", pa.binary()),
    ("value", pa.binary()), ("is_tombstone", pa.bool_()), ("expires_ms", pa.int64()),
])
LOG_INTERNAL_ARROW = LOG_ARROW.append(pa.field("horizon", pa.int64()))
LATEST_ARROW = pa.schema([
    ("key", pa.binary()), ("value", pa.binary()), ("partition", pa.int32()), ("offset", pa.int64()),
    ("timestamp", pa.int64()), ("expires_ms", pa.int64()),
])


def expires_column(record_batch: pa.RecordBatch) -> pa.Array:
    """The ``expires`` column of a data-file batch (all null for a format 1 batch)."""
    if record_batch.num_columns > 3:
        return record_batch.column(3)
    return pa.nulls(record_batch.num_rows, pa.int64())
