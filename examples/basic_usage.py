"""kvlog's key-value API in one small program: put, get, delete, scan, batch, flush, reopen.

Run it with ``python examples/basic_usage.py``; it works in a temporary
directory and removes it at the end.
"""

from __future__ import annotations

import os
import tempfile

import kvlog


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="kvlog-example-") as tmp:
        path = os.path.join(tmp, "users")
        print(f"opening a store at {path}")
        with kvlog.open(path) as store:
            store.put("user:1", "Ada Lovelace")
            store.put("user:2", "Grace Hopper")
            store.put("user:3", "Barbara Liskov")
            print("user:1 =", store.get("user:1"))

            store.delete("user:3")
            print("after delete, user:3 =", store.get("user:3"))

            with store.batch() as batch:  # all or nothing, durable when the block exits
                batch.put("user:4", "Katherine Johnson")
                batch.put("user:5", "Margaret Hamilton")
            version = store.flush()  # every earlier write is durable from here on
            print(f"flushed: commit version {version}")

            print("scan of prefix user:")
            for key, value in store.scan(prefix="user:"):
                print(f"  {key.decode()} -> {value.decode()}")

            print("changelog (every durable record, partition by partition):")
            for record in store.changes():
                kind = "delete" if record.is_tombstone else "put"
                print(f"  partition {record.partition} offset {record.offset}: {kind} {record.key.decode()}")

            findings = store.check()
            print("check:", "ok" if not findings else findings)

        with kvlog.open(path, read_only=True) as reader:
            keys = [key.decode() for key in reader]
            print(f"reopened read-only: {len(reader)} keys: {', '.join(keys)}")
            assert reader.get("user:4") == b"Katherine Johnson"
    print("basic usage: done")


if __name__ == "__main__":
    main()
