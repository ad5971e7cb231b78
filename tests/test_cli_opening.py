"""The command line opens stores by :func:`kvlog.open`'s rules: a store is created only in a
missing or empty directory unless ``--create`` is given, whatever the spelling of the path, and
a cache of commits the storage root lost is refused in one line until ``--on-storage-behind
rebuild`` accepts the loss."""

from __future__ import annotations

from pathlib import Path

import pytest

import kvlog
from tests.store.root_surgery import QUIET, restore_root, write_past_a_backup
from tests.test_cli import listing, one_line_failure, run


@pytest.fixture
def foreign_dir(tmp_path: Path) -> Path:
    """A directory holding files of something else (like ``/etc``)."""
    root = tmp_path / "etc"
    root.mkdir()
    (root / "hosts").write_text("127.0.0.1 localhost\n")
    return root


def test_put_refuses_a_path_that_climbs_into_a_directory_with_other_files(foreign_dir: Path) -> None:
    before = listing(foreign_dir.parent)
    for target in (f"{foreign_dir}/missing/..", f"file://localhost{foreign_dir}/missing/.."):
        line = one_line_failure(run("put", target, "k", "v"), 3)
        assert "is not empty and is not a kvlog store" in line and "give --create" in line, line
    assert listing(foreign_dir.parent) == before  # no missing/, no kvlog.json, no cache/
    done = run("put", f"{foreign_dir}/missing/..", "k", "v", "--create")
    assert done.returncode == 0, done.stderr
    assert (foreign_dir / "kvlog.json").is_file() and not (foreign_dir / "missing").exists()
    assert run("get", str(foreign_dir), "k").stdout == "v"


def test_put_refuses_a_file_uri_with_a_query_in_one_line(tmp_path: Path) -> None:
    line = one_line_failure(run("put", f"{tmp_path.as_uri()}/s?partitions=3", "k", "v"), 4)
    assert line.startswith("kvlog: ") and "ConfigError" not in line and "query" in line, line
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def behind(tmp_path: Path) -> Path:
    """A store whose root (not its cache) was restored from a backup older than the cache."""
    root = tmp_path / "root"
    with kvlog.open(root, **QUIET) as store:
        write_past_a_backup(store, root, tmp_path / "backup")
    # The small writes are inline files of their commits: log/ is the whole root to restore.
    assert not (root / "data").exists()
    restore_root(root, tmp_path / "backup", dirs=("log",))  # the cache stays as it was
    return root


def stored(root: Path) -> dict[str, list[tuple[str, str, int]]]:
    """What the storage root holds: the listings of its log/ and (if any) data/."""
    return {name: listing(root / name) for name in ("log", "data") if (root / name).exists()}


def test_commands_refuse_a_cache_of_lost_commits_in_one_line_until_told_to_rebuild(
        behind: Path) -> None:
    root = behind
    before = stored(root)
    for command in (["get", str(root), "a"], ["put", str(root), "x", "1"], ["compact", str(root)]):
        line = one_line_failure(run(*command), 4)
        assert line.startswith("kvlog: ") and "give --on-storage-behind rebuild" in line, line
        assert "StorageBehindError" not in line, line  # the type is for -v
    line = one_line_failure(run("-v", "get", str(root), "a"), 4)
    assert line.startswith("kvlog: StorageBehindError: "), line
    assert stored(root) == before
    # check reports it as its one finding.
    done = run("check", str(root))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    (finding,) = done.stdout.splitlines()
    assert "which the cache applied, are missing from the storage root" in finding, finding
    done = run("get", str(root), "a", "--on-storage-behind", "rebuild")
    assert done.returncode == 0 and done.stdout == "1", done.stderr
    assert run("check", str(root)).stdout == "ok\n"
