"""The data source and the Spark jobs on SeaweedFS, with storage options given as Spark options.

Spark options are strings, so every storage option arrives as one
(``storage.allow_http`` = ``"True"``, ``storage.retries`` = ``"3"``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

import kvlog
import spark_ext

pytestmark = [pytest.mark.spark, pytest.mark.s3]

LOG_COLUMNS = ["partition", "offset", "timestamp", "key", "value", "is_tombstone", "expires_ms"]


def test_views_append_compact_and_materialize_on_seaweedfs(
        spark: Any, kv: Any, s3_root: tuple[str, dict[str, Any]], tmp_path: Path) -> None:
    uri, options = s3_root
    options = {**options, "retries": 3, "timeout": "60s"}
    cache = str(tmp_path / "cache")
    with kvlog.open(uri, storage_options=options, cache_dir=cache, partitions=4, **kv.MANUAL) as store:
        model = kv.fill(store, ops=600, keys=80, seed=61)
        want = [(p, o, t, k, v, v is None, None) for p, o, t, k, v in kv.log_rows(store)]

    def reader() -> Any:
        r = spark.read.format("kvlog").option("cache_dir", str(tmp_path / "spark-cache"))
        for name, value in options.items():
            r = r.option(f"storage.{name}", str(value))
        return r

    # Without the options the reader cannot reach the server: the options are what is used.
    with pytest.raises(Exception, match="ConfigError|StorageError|credentials"):
        spark.read.format("kvlog").option("cache_dir", str(tmp_path / "no-options")).load(uri).collect()

    got = kv.table_rows(reader().load(uri).toArrow(), LOG_COLUMNS)
    assert sorted(got) == want
    latest = reader().option("view", "latest").load(uri).collect()
    assert {bytes(r["key"]): bytes(r["value"]) for r in latest} == model

    writer = spark.createDataFrame([(f"s3-{i}", None if i % 5 == 0 else f"w{i}") for i in range(40)],
                                   "key string, value string").write.format("kvlog").mode("append")
    for name, value in options.items():
        writer = writer.option(f"storage.{name}", str(value))
    writer.save(uri)
    for i in range(40):
        if i % 5:
            model[b"s3-%d" % i] = b"w%d" % i

    report = spark_ext.compact(spark, uri, storage_options=options, force=True)
    assert report.rounds == 1 and not report.refused and report.records_removed > 0
    out = tmp_path / "latest"
    assert spark_ext.materialize(spark, uri, str(out), storage_options=options)["rows"] == len(model)
    table = pq.read_table(out, columns=["key", "value"])
    assert dict(zip(*(c.to_pylist() for c in table.columns), strict=True)) == model

    with kvlog.open(uri, storage_options=options, cache_dir=cache, read_only=True) as store:
        assert dict(store.scan()) == model
        rows = kv.log_rows(store)
        assert len(rows) == len({(p, k) for p, _o, _t, k, _v in rows})
        assert store.check() == []
