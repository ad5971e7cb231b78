"""Fixtures of the Store tests: a store root on local disk or on SeaweedFS."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from store_support import Root


@pytest.fixture
def local_root(tmp_path: Path) -> Root:
    """A fresh local store directory (the store does not exist yet)."""
    return Root("local", str(tmp_path / "store"), None, tmp_path / "work")


@pytest.fixture
def s3_store_root(s3_root: tuple[str, dict[str, Any]], tmp_path: Path) -> Root:
    """A fresh prefix on the session's SeaweedFS server."""
    uri, options = s3_root
    return Root("s3", uri, options, tmp_path / "work")


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def root(request: pytest.FixtureRequest) -> Root:
    """A fresh store root, once on local disk and once on SeaweedFS."""
    if request.param == "local":
        return request.getfixturevalue("local_root")  # type: ignore[no-any-return]
    return request.getfixturevalue("s3_store_root")  # type: ignore[no-any-return]


@pytest.fixture
def opened() -> Iterator[list[Any]]:
    """Collects stores a test opens and closes those still open at the end (even on failure)."""
    stores: list[Any] = []
    yield stores
    for store in reversed(stores):
        try:
            store.close(flush=False)
        except Exception:  # noqa: BLE001 - a fenced or broken store still gets released
            pass
