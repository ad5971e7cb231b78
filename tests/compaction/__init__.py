"""Compaction tests (a package, so their module names never clash with other test directories)."""
