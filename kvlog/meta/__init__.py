"""The LMDB metadata cache and key index; the only package that imports lmdb."""

from kvlog.meta.cache import IndexEntry, MetaReader, MetaTxn, index_lookup, prefix_successor
from kvlog.meta.env import DB_NAMES, LmdbEnv, acquire_env, release_env, reset_env
from kvlog.meta.keys import DIRECT_KEY_BYTES, LONG_KEY_BYTES, encode_index_key

__all__ = [
    "DB_NAMES", "DIRECT_KEY_BYTES", "LONG_KEY_BYTES", "IndexEntry", "LmdbEnv", "MetaReader",
    "MetaTxn", "acquire_env", "index_lookup", "encode_index_key", "prefix_successor", "release_env",
    "reset_env",
]
