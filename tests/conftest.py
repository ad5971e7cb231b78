"""Fixtures for the whole suite: ``native`` runs a test against the C extensions and against
their Python twins (see tests/native.py).

Under pytest-xdist (``make test`` runs two workers with ``--dist loadgroup``) every
Spark-marked test goes to one worker, so the suite starts one SparkSession, not one per
worker; the other tests are shared out as usual.
"""

import pytest

from tests.native import native

__all__ = ["native"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        if item.get_closest_marker("spark") is not None:
            item.add_marker(pytest.mark.xdist_group("spark"))
