"""kvlog on Spark: the ``kvlog`` data source, exact compaction, materialization, bulk index rebuild.

Usage::

    import spark_ext
    spark = spark_ext.get_session()                           # local[*], settings for small machines
    spark_ext.register(spark)
    spark.read.format("kvlog").option("view", "latest").load(uri).show()
"""

from spark_ext.jobs import compact, materialize, rebuild_index, register
from spark_ext.savemodes import save
from spark_ext.session import check_java, console_progress, get_session

__all__ = ["check_java", "console_progress", "compact", "get_session", "materialize", "rebuild_index", "register",
           "save"]
