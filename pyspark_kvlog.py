"""The ``kvlog`` Spark data source, found by PySpark without a ``register`` call.

PySpark registers, in every Spark session, the ``DefaultSource`` of each installed
top-level module whose name starts with ``pyspark_``. This one reads and writes
kvlog stores with Spark's default settings (filter pushdown into Python data
sources off); :func:`spark_ext.register` replaces it with the variant that
prunes with pushed filters.
"""

from spark_ext.plain_source import KvlogPlainDataSource as DefaultSource

__all__ = ["DefaultSource"]
