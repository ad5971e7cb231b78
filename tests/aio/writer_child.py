"""A second process for the follow tests: ``writer_child.py STORE CACHE_DIR KEY...`` opens the
store with its own metadata cache (so its own producer), puts each key (value ``from-child``)
with ``sync=True``, prints ``done`` and exits."""

from __future__ import annotations

import sys

import kvlog


def main() -> None:
    path, cache_dir, *keys = sys.argv[1:]
    with kvlog.open(path, cache_dir=cache_dir, background_compaction=False) as store:
        for key in keys:
            store.put(key.encode(), b"from-child", sync=True)
    print("done", flush=True)


if __name__ == "__main__":
    main()
