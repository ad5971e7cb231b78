"""Checks of a read against the store and against a schema the user gives, on the driver.

:func:`check_read` runs when a read is analysed (``.load()``): a checkpoint name
the store does not have is :class:`~kvlog.errors.CheckpointNotFoundError`, offsets
or times (``startingOffsetsByTimestamp``, ...) of a partition it does not have a
:class:`~kvlog.errors.ConfigError`. A read without those options does not open the
store before it is planned.

:func:`check_user_schema` refuses ``spark.read.schema(...)``: a view's columns
are fixed. PySpark hands a Python data source the user's schema in
``DataSource.reader(schema)`` only, when the query is planned (``collect``,
``count``, ``explain``), before any task runs; that is where it is refused.
"""

from __future__ import annotations

from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from kvlog.errors import ConfigError
from spark_ext.read_options import ReadOptions, check_partitions
from spark_ext.reader import live_batches
from spark_ext.schemas import (
    LATEST_ARROW,
    LATEST_SCHEMA,
    LOG_ARROW,
    LOG_INTERNAL_ARROW,
    LOG_INTERNAL_SCHEMA,
    LOG_SCHEMA,
)

__all__ = ["check_read", "check_user_schema", "view_schema"]


def check_read(options: ReadOptions) -> None:
    """Open the store at the read's checkpoint and check the partitions its offsets and times
    name, when it has either. (A time is resolved to an offset when the read is planned:
    that may read a data file, which analysing a read does not.)"""
    if options.checkpoint is None and not options.names_partitions:
        return
    _version, count, _batches = live_batches(options.uri, options.storage, options.cache_dir,
                                             checkpoint=options.checkpoint)
    check_partitions(options, count)


def view_schema(options: ReadOptions) -> str:
    """The columns of the read's view, as Spark DDL."""
    if options.view == "latest":
        return LATEST_SCHEMA
    return LOG_INTERNAL_SCHEMA if options.internal else LOG_SCHEMA


def _columns(schema: StructType) -> list[tuple[str, str, bool]]:
    return [(f.name, f.dataType.simpleString(), f.nullable) for f in schema.fields]


def check_user_schema(schema: StructType, options: ReadOptions) -> None:
    """Refuse a schema other than the view's (the same names, types and nullability: the
    columns PySpark checks each task's batches against)."""
    expected = view_schema(options)
    arrow = LATEST_ARROW if options.view == "latest" else LOG_INTERNAL_ARROW if options.internal else LOG_ARROW
    if _columns(schema) == _columns(from_arrow_schema(arrow)):
        return
    raise ConfigError(f"the kvlog data source does not take a schema: view={options.view} has the "
                      f"columns {expected}; remove .schema(...) (got {schema.simpleString()})")
