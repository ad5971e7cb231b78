"""Compaction, in a fixed vocabulary (as SlateDB's compactor):

* the **planner** (pure) turns metadata into a :class:`Plan`;
* a **job** executes a plan: the **offset map** (pure, bounded) and the
  **merger** (two passes, two forward streams per input file) write output files;
* the **runner** commits the job as one ``replace`` commit, schedules GC of its
  inputs, and runs jobs in a background thread that never dies silently.
"""

from kvlog.compaction.merger import JobResult, OutputWriter, PartitionFailure, run_job
from kvlog.compaction.offset_map import SLOT_BYTES, OffsetMap, capacity_for, fingerprints
from kvlog.compaction.planner import (
    BatchInfo,
    CleanSpec,
    FileInfo,
    Plan,
    partition_state,
    plan_compaction,
)
from kvlog.compaction.runner import CompactionReport, Compactor, check_compact_args

__all__ = [
    "SLOT_BYTES", "BatchInfo", "CleanSpec", "CompactionReport", "Compactor", "FileInfo", "JobResult", "OutputWriter",
    "OffsetMap", "PartitionFailure", "Plan", "capacity_for", "check_compact_args", "fingerprints", "partition_state",
    "plan_compaction", "run_job",
]
