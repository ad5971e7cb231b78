"""A streaming query for the tests that need a driver of its own: copy one store's log into another.

``python stream_copy.py MASTER SOURCE SINK CHECKPOINT MAX_RECORDS``: reads SOURCE with the
``kvlog`` streaming source (``maxRecordsPerTrigger`` = MAX_RECORDS), writes every record to
SINK with the ``kvlog`` streaming sink, with ``trigger(availableNow=True)``, and prints the
number of micro-batches it ran. The tests kill it with SIGKILL and run it again from the
same checkpoint.
"""

from __future__ import annotations

import sys

import spark_ext


def main(master: str, source: str, sink: str, checkpoint: str, max_records: str) -> None:
    spark = spark_ext.get_session(master, app_name="kvlog-stream-copy", **{
        "spark.sql.shuffle.partitions": "4", "spark.default.parallelism": "2"})
    spark.sparkContext.setLogLevel("ERROR")
    spark_ext.register(spark)
    query = (spark.readStream.format("kvlog").option("maxRecordsPerTrigger", max_records).load(source)
             .select("key", "value", "timestamp")
             .writeStream.format("kvlog").option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start(sink))
    query.awaitTermination()
    print(len(query.recentProgress))
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:6])
