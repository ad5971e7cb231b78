"""The ``kvlog`` data source for Spark sessions whose Python filter pushdown is off.

PySpark refuses a Python data source reader that implements ``pushFilters`` when
``spark.sql.python.filterPushdown.enabled`` is false (Spark's default), with
``DATA_SOURCE_PUSHDOWN_DISABLED``. :class:`KvlogPlainDataSource` reads the same
views with the same options through a reader that inherits PySpark's own
``pushFilters``: Spark then applies every filter itself, and a read is pruned only
by its options (``startingOffsets``/``endingOffsets``, ``checkpoint``).

It is what ``pip install`` registers in every Spark session (the top-level module
``pyspark_kvlog``, which PySpark finds by its name), and what
:func:`spark_ext.register` registers on a Spark session whose user turned pushdown off.
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSourceReader
from pyspark.sql.types import StructType

from spark_ext.datasource import KvlogDataSource
from spark_ext.read_checks import check_user_schema
from spark_ext.read_options import parse_read_options
from spark_ext.reader import KvlogReader

__all__ = ["KvlogPlainDataSource", "KvlogPlainReader", "PUSHDOWN_CONF"]

#: The runtime SQL setting that lets Spark push filters into Python data sources.
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


class KvlogPlainReader(KvlogReader):
    """:class:`KvlogReader` without filter pushdown (PySpark's ``pushFilters``, which takes nothing)."""

    pushFilters = DataSourceReader.pushFilters  # noqa: N815 - Spark's name


class KvlogPlainDataSource(KvlogDataSource):
    """The ``kvlog`` data source, reading without filter pushdown (see the module doc)."""

    def reader(self, schema: StructType) -> DataSourceReader:
        options = parse_read_options(self.options)
        check_user_schema(schema, options)
        return KvlogPlainReader(dict(self.options), self._view(), self._internal())
