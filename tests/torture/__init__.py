"""The torture harness: seeded schedules of concurrent writers, readers, compaction, GC, faults,
crashes, restores and damage, checked against every acknowledged write.

In the spirit of FoundationDB's simulator and Jepsen's acknowledged-write checkers: a seed
draws a scenario (:mod:`.scenarios`) - which actors run (writer threads sharing or owning
handles, writer processes, readers, storms of same-producer openers), which faults their storage
injects (:mod:`.storage`), and which actions the schedule takes meanwhile (compaction, GC,
clock jumps, crashes, kill -9, snapshots and restores). Every write carries a unique value
naming its writer and counter (:mod:`.model`); after the actors stop, a new process with a new
cache reads everything and the checker asserts that every acknowledged write is there (or
superseded by a later write of its key), that nothing never written appears, that the
changelog is ordered and free of duplicates, that ``check()`` finds nothing, and that every
cache agrees. :mod:`.damage` flips bytes and deletes commits and expects ``check()`` to say so.

Beside engine faults, :mod:`.lifecycle` runs the lifecycles of everyday programs in child
processes (:mod:`.lifeworker`) that open the store with default arguments: ``lifecycle``
(exiting without ``close()``, dropping handles, SIGTERM with and without a handler, SIGINT,
default-argument openers at one instant), ``consumer-idle`` (consumer groups resuming after
other processes compacted and collected garbage), ``cli-consume`` (``kvlog consume --follow``
killed and restarted: at least once) and ``full-disk`` (a 4 MB tmpfs under the data or a cache;
root only). A normal exit or a handled signal acknowledges what the process wrote before it.
:mod:`.held` has slow members of groups that hold tombstones read the changelog among all of
that; each one's view must end as the store (``held``).

Determinism: the scenario, its schedule of actions, the operations every actor draws and the
faults every storage injects (chosen by call number) all follow from the seed, through
``random.Random`` instances derived from it. Thread and process interleavings do not: a replay
performs the same schedule with the same faults, and a failure that depends on timing may need
a few replays. Each run writes ``run.log`` (settings, schedule, every open, crash, kill, fault
plan and kvlog warning, with times) beside the writer processes' journals.

Run seeds from the command line (``python -m tests.torture --seeds 100``, ``--seed S`` to
replay one, ``make torture SEEDS=500``) or through ``tests/torture/test_torture.py`` (a fixed
set, marked ``slow``; the SeaweedFS ones also ``s3``); ``--scenario NAME`` runs one scenario. To add a scenario, see :mod:`.scenarios`.
"""

from __future__ import annotations

from .runner import RunResult, run_seed
from .scenarios import SCENARIOS, Action, Scenario, scenario

__all__ = ["RunResult", "run_seed", "SCENARIOS", "Action", "Scenario", "scenario"]
