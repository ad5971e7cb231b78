"""The ``kvlog`` Python data source: what Spark calls to read and write a store.

The readers live in :mod:`spark_ext.reader`, the writer in :mod:`spark_ext.writer`;
this module maps Spark's options to them.
"""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
)
from pyspark.sql.types import StructType

from kvlog.errors import ConfigError
from spark_ext.read_checks import check_read, check_user_schema
from spark_ext.read_options import parse_read_options
from spark_ext.reader import KvlogReader
from spark_ext.savemodes import refuse_catalog_table
from spark_ext.schemas import LATEST_SCHEMA, LOG_INTERNAL_SCHEMA, LOG_SCHEMA
from spark_ext.stream_options import STREAM_READ_OPTIONS, StreamReadOptions
from spark_ext.stream_reader import KvlogStreamReader
from spark_ext.stream_writer import make_stream_writer
from spark_ext.writer import KvlogWriter, check_write_schema

__all__ = ["KvlogDataSource"]


class KvlogDataSource(DataSource):
    """``spark.read.format("kvlog").option("view", "log" | "latest").load(uri)`` and append writes."""

    @classmethod
    def name(cls) -> str:
        return "kvlog"

    def _view(self) -> str:
        view = str(self.options.get("view", "log")).lower()
        if view not in ("log", "latest"):
            raise ConfigError(f"view={view!r}: use 'log' or 'latest'")
        return view

    def _internal(self) -> bool:
        return str(self.options.get("internal", "false")).lower() == "true"

    def schema(self) -> str:
        refuse_catalog_table(self.options)  # CREATE TABLE ... USING kvlog
        # Called when a read is analysed (``.load()``): the options are checked here, and the
        # store too when they name a checkpoint or offsets (spark_ext.read_options).
        # ``.load()`` does not say whether the read is a batch or a stream: a stream's own options
        # are known here, and refused by ``reader()`` on a batch read (and the batch-only ones by
        # ``streamReader()``).
        check_read(parse_read_options(self.options, extra_known=STREAM_READ_OPTIONS))
        if self._view() == "latest":
            return LATEST_SCHEMA
        return LOG_INTERNAL_SCHEMA if self._internal() else LOG_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        options = parse_read_options(self.options)
        check_user_schema(schema, options)  # the first call that sees a .schema(...) of the user's
        return KvlogReader(dict(self.options), self._view(), self._internal())

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        """``mode("append")`` and ``mode("overwrite")`` (see :mod:`spark_ext.writer`)."""
        check_write_schema(schema)  # on the driver, before the store is opened or any task runs
        return KvlogWriter(dict(self.options), schema, overwrite)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802 - Spark's name
        """``spark.readStream.format("kvlog")``: the log view in micro-batches (:mod:`spark_ext.stream_reader`)."""
        return KvlogStreamReader(StreamReadOptions.parse(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:  # noqa: N802
        """``df.writeStream.format("kvlog")``: exactly-once appends (:mod:`spark_ext.stream_writer`)."""
        if overwrite:
            raise ConfigError("the kvlog streaming sink only appends: use outputMode('append') or 'update'")
        return make_stream_writer(dict(self.options), schema)
