"""Test helpers shipped with kvlog: fault injection and a local S3 server.

* :class:`FaultyStorage`, :class:`FaultPlan`, :func:`fail`, :func:`crash_at` and
  :class:`SimulatedCrash` (defined in ``kvlog.storage.faulty``) inject
  deterministic storage faults and crashes;
* :class:`SeaweedServer` runs SeaweedFS's S3 server on loopback;
* ``kvlog.testing.pytest_plugin`` provides the ``seaweedfs`` and ``s3_root``
  fixtures (enable it with ``-p kvlog.testing.pytest_plugin``).

Importing this package imports neither obstore nor pyarrow.
"""

from __future__ import annotations

from kvlog.storage.faulty import (
    Event,
    Fault,
    FaultPlan,
    FaultyStorage,
    SimulatedCrash,
    crash_at,
    fail,
)
from kvlog.testing.seaweedfs import SeaweedError, SeaweedServer, find_weed

__all__ = [
    "Event",
    "Fault",
    "FaultPlan",
    "FaultyStorage",
    "SimulatedCrash",
    "crash_at",
    "fail",
    "SeaweedError",
    "SeaweedServer",
    "find_weed",
]
