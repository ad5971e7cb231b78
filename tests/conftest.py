"""Fixtures for the whole suite: ``native`` runs a test against the C extensions and against
their Python twins (see tests/native.py)."""

from tests.native import native

__all__ = ["native"]
