"""pytest fixtures for kvlog's real services (enable with ``-p kvlog.testing.pytest_plugin``).

``seaweedfs``
    one SeaweedFS S3 server on loopback for the whole test run,
    stopped (by pid) at the end.
``s3_root``
    function-scoped: ``(uri, storage_options)`` of a fresh, unique prefix in a
    bucket of that server, for one test.

Tests that use either fixture are marked ``s3`` automatically, so
``-m "not s3"`` deselects them. Importing this plugin imports neither obstore
nor pyarrow.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from kvlog.testing.seaweedfs import SeaweedServer

__all__ = ["seaweedfs", "s3_root", "TEST_BUCKET"]

#: The bucket that holds every test's prefix.
TEST_BUCKET = "kvlog-tests"
_S3_FIXTURES = frozenset({"seaweedfs", "s3_root"})
_prefix_numbers = itertools.count(1)
_startup_key = pytest.StashKey[float]()


def pytest_configure(config: pytest.Config) -> None:
    for line in (
        "s3: needs the SeaweedFS S3 server (started by a fixture on loopback)",
        "spark: runs real PySpark",
        "slow: takes more than a few seconds",
    ):
        config.addinivalue_line("markers", line)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _S3_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.s3)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    seconds = config.stash.get(_startup_key, None)
    if seconds is not None:
        terminalreporter.write_line(f"SeaweedFS S3 server started in {seconds:.2f} s")


@pytest.fixture(scope="session")
def seaweedfs(pytestconfig: pytest.Config) -> Iterator[SeaweedServer]:
    """One SeaweedFS server (S3 on a free loopback port) for the whole test run."""
    from kvlog.testing.seaweedfs import SeaweedServer

    with SeaweedServer() as server:
        if server.startup_seconds is not None:
            pytestconfig.stash[_startup_key] = server.startup_seconds
        yield server


@pytest.fixture
def s3_root(seaweedfs: SeaweedServer, request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    """``(uri, storage_options)`` of a prefix no other test uses."""
    seaweedfs.create_bucket(TEST_BUCKET)
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", request.node.name).strip("-.")[:80] or "test"
    prefix = f"{name}-{next(_prefix_numbers)}"
    return seaweedfs.uri(TEST_BUCKET, prefix), dict(seaweedfs.storage_options)
