"""FaultyStorage: every fault kind, nth/times/patterns, seeded random faults, crash points."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvlog.errors import KvlogError, StorageError
from kvlog.storage import LocalStorage, Storage
from kvlog.storage.faulty import (
    Event,
    Fault,
    FaultPlan,
    FaultyStorage,
    SimulatedCrash,
    crash_at,
    fail,
)


@pytest.fixture
def inner(tmp_path: Path) -> LocalStorage:
    return LocalStorage(tmp_path / "root", fsync=False)


def test_simulated_crash_is_not_an_error_library_code_catches() -> None:
    assert issubclass(SimulatedCrash, BaseException)
    assert not issubclass(SimulatedCrash, Exception)
    assert not issubclass(SimulatedCrash, KvlogError)
    import kvlog.testing

    assert kvlog.testing.SimulatedCrash is SimulatedCrash


def test_error_fails_before_the_operation(inner: LocalStorage) -> None:
    storage = FaultyStorage(inner, FaultPlan(fail("put_if_absent", "log/*")))
    with pytest.raises(StorageError, match="injected"):
        storage.put_if_absent("log/1.json", b"commit")
    assert not inner.exists("log/1.json")
    assert storage.requests["put_if_absent"] == 0  # nothing reached the backend
    storage.put_if_absent("log/1.json", b"commit")  # times=1: the next call goes through
    assert inner.read("log/1.json") == b"commit"
    assert storage.requests["put_if_absent"] == 1
    assert [e.fault for e in storage.history] == ["error", None]


def test_timeout_after_success_really_did_the_write(inner: LocalStorage) -> None:
    storage = FaultyStorage(inner, [fail("put", "data/*", kind="timeout_after_success")])
    with pytest.raises(StorageError, match="timed out"):
        storage.put("data/f.arrow", b"payload")
    assert inner.read("data/f.arrow") == b"payload"
    assert storage.requests["put"] == 1
    # The caller cannot know: a put_if_absent retried after such a timeout finds its own object.
    storage.set_plan(FaultPlan(fail("put_if_absent", kind="timeout_after_success")))
    with pytest.raises(StorageError, match="timed out"):
        storage.put_if_absent("log/1.json", b"mine")
    with pytest.raises(FileExistsError):
        storage.put_if_absent("log/1.json", b"mine")
    assert storage.read("log/1.json") == b"mine"


def test_timeout_after_success_on_a_read(inner: LocalStorage) -> None:
    inner.put("x", b"1")
    storage = FaultyStorage(inner, FaultPlan().fail("read", kind="timeout_after_success"))
    with pytest.raises(StorageError, match="timed out"):
        storage.read("x")
    assert storage.requests["get"] == 1
    assert storage.read("x") == b"1"


@pytest.mark.parametrize(("when", "written"), [("before", False), ("after", True)])
def test_crash_before_and_after(inner: LocalStorage, when: str, written: bool) -> None:
    storage = FaultyStorage(inner, FaultPlan().fail("put", "k", kind="crash", when=when))  # type: ignore[arg-type]
    with pytest.raises(SimulatedCrash, match=f"crash {when}"):
        try:
            storage.put("k", b"v")
        except Exception:  # library code catching Exception does not stop a crash
            pytest.fail("SimulatedCrash was caught as an Exception")
    assert inner.exists("k") is written
    assert storage.history[-1].fault == f"crash_{when}"


def test_nth_and_times(inner: LocalStorage) -> None:
    inner.put("x", b"1")
    storage = FaultyStorage(inner, FaultPlan(fail("read", "x", nth=2, times=2)))
    outcomes = []
    for _ in range(5):
        try:
            storage.read("x")
            outcomes.append("ok")
        except StorageError:
            outcomes.append("error")
    assert outcomes == ["ok", "error", "error", "ok", "ok"]


def test_times_none_fails_every_call_from_nth(inner: LocalStorage) -> None:
    storage = FaultyStorage(inner, FaultPlan(fail("stat", nth=3, times=None)))
    inner.put("x", b"1")
    storage.stat("x")
    storage.stat("x")
    for _ in range(4):
        with pytest.raises(StorageError):
            storage.stat("x")


def test_patterns_and_any_operation(inner: LocalStorage) -> None:
    storage = FaultyStorage(inner, FaultPlan(fail("put", "log/*", times=None)))
    storage.put("data/0/a.arrow", b"d")  # another name: untouched
    with pytest.raises(StorageError):
        storage.put("log/1.json", b"c")
    storage.set_plan(FaultPlan(fail("*", "data/*", times=None)))
    for op in (
        lambda: storage.read("data/0/a.arrow"),
        lambda: storage.stat("data/0/a.arrow"),
        lambda: storage.delete("data/0/a.arrow"),
        lambda: storage.list("data/"),
    ):
        with pytest.raises(StorageError):
            op()
    assert storage.list("log/") == []


def test_first_matching_rule_wins(inner: LocalStorage) -> None:
    plan = FaultPlan(
        fail("put", "a", kind="crash"),
        fail("put", "*", times=None),
    )
    storage = FaultyStorage(inner, plan)
    with pytest.raises(SimulatedCrash):
        storage.put("a", b"1")
    with pytest.raises(StorageError):
        storage.put("a", b"1")


def test_stream_reads_can_fail(inner: LocalStorage) -> None:
    inner.put("s", b"0123456789")
    storage = FaultyStorage(inner, FaultPlan(fail("stream_read", "s", nth=2)))
    stream = storage.open_stream("s")
    try:
        assert stream.read(3) == b"012"
        with pytest.raises(StorageError):
            stream.read(3)
        stream.skip_to(6)
        assert stream.position == 6
        assert stream.read(10) == b"6789"
    finally:
        stream.close()


def test_open_stream_timeout_after_success_closes_the_stream(inner: LocalStorage) -> None:
    inner.put("s", b"abc")
    storage = FaultyStorage(inner, FaultPlan(fail("open_stream", kind="timeout_after_success")))
    with pytest.raises(StorageError, match="timed out"):
        storage.open_stream("s")
    assert storage.requests["stream"] == 1


def test_bad_rules_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown operation"):
        fail("write")
    with pytest.raises(ValueError, match="kind"):
        Fault("put", kind="explode")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout_after_success"):
        fail("put", kind="error", when="after")
    with pytest.raises(ValueError):
        fail("put", nth=0)
    with pytest.raises(ValueError):
        fail("put", times=0)


# -- seeded random faults --------------------------------------------------------------------


def _random_run(root: Path, seed: int, calls: int = 200) -> list[tuple[int, str, str | None]]:
    storage = FaultyStorage(LocalStorage(root, fsync=False), seed=seed, error_rate=0.3)
    for i in range(calls):
        try:
            if i % 3 == 0:
                storage.put(f"k{i % 7}", b"v")
            elif i % 3 == 1:
                storage.stat(f"k{i % 7}")
            else:
                storage.list("k")
        except (StorageError, FileNotFoundError):
            pass
    return [(e.index, e.op, e.fault) for e in storage.history]


def test_random_faults_are_deterministic_from_the_seed(tmp_path: Path) -> None:
    first = _random_run(tmp_path / "a", seed=42)
    again = _random_run(tmp_path / "b", seed=42)
    other = _random_run(tmp_path / "c", seed=43)
    assert first == again
    assert first != other
    injected = [f for _, _, f in first if f is not None]
    assert 20 < len(injected) < 120
    assert set(injected) == {"error", "timeout_after_success"}


def test_random_mode_options(inner: LocalStorage) -> None:
    with pytest.raises(ValueError, match="seed"):
        FaultyStorage(inner, error_rate=0.5)
    with pytest.raises(ValueError):
        FaultyStorage(inner, seed=1, error_rate=1.5)
    with pytest.raises(ValueError):
        FaultyStorage(inner, seed=1, random_ops=["nope"])
    only_reads = FaultyStorage(inner, seed=1, error_rate=1.0, random_ops=["read"])
    only_reads.put("x", b"1")  # never chosen
    with pytest.raises(StorageError):
        only_reads.read("x")
    crashes = FaultyStorage(inner, seed=5, error_rate=1.0, random_kinds=["crash"])
    with pytest.raises(SimulatedCrash):
        crashes.stat("x")


# -- crash points and enumerating every step of a flow ---------------------------------------


def _flow(storage: Storage) -> None:
    """A miniature commit: data first, then the commit, then cleanup."""
    storage.put("data/new.arrow", b"rows")
    storage.crash_point("after_data_write")
    storage.put_if_absent("log/2.json", b"commit data/new.arrow")
    storage.crash_point("after_commit")
    storage.delete("data/old.arrow")


def _setup(root: Path) -> LocalStorage:
    storage = LocalStorage(root, fsync=False)
    storage.put("data/old.arrow", b"old rows")
    storage.put("log/1.json", b"commit data/old.arrow")
    return storage


def test_crash_point_is_a_no_op_on_real_storage(inner: LocalStorage) -> None:
    inner.crash_point("after_data_write")
    _flow(_setup(inner.root))


def test_crash_points_are_recorded_and_can_crash(inner: LocalStorage) -> None:
    _setup(inner.root)
    probe = FaultyStorage(inner)
    _flow(probe)
    assert probe.crash_points == ["after_data_write", "after_commit"]
    assert [(e.op, e.name) for e in probe.history] == [
        ("put", "data/new.arrow"),
        ("crash_point", "after_data_write"),
        ("put_if_absent", "log/2.json"),
        ("crash_point", "after_commit"),
        ("delete", "data/old.arrow"),
    ]
    probe.reset()
    assert probe.history == [] and sum(probe.requests.values()) == 0
    probe.set_plan(FaultPlan(crash_at("after_commit")))
    probe.delete("log/2.json")
    with pytest.raises(SimulatedCrash, match="after_commit"):
        _flow(probe)


def test_crash_at_every_step_of_a_flow(tmp_path: Path) -> None:
    probe = FaultyStorage(_setup(tmp_path / "probe"))
    _flow(probe)
    events: list[Event] = list(probe.history)
    assert len(events) == 5
    outcomes = []
    for i, event in enumerate(events):
        for when in ("before", "after"):
            root = tmp_path / f"run-{i}-{when}"
            storage = FaultyStorage(_setup(root), event.crash_plan(when))  # type: ignore[arg-type]
            with pytest.raises(SimulatedCrash):
                _flow(storage)
            after = LocalStorage(root)
            committed = after.exists("log/2.json")
            # The invariant the order of the flow protects: a commit never names missing data.
            if committed:
                assert after.exists("data/new.arrow")
            else:
                assert after.exists("data/old.arrow")
            outcomes.append((event.op, when, committed))
    assert ("put_if_absent", "before", False) in outcomes
    assert ("put_if_absent", "after", True) in outcomes


def test_error_plan_from_an_event(inner: LocalStorage) -> None:
    probe = FaultyStorage(inner)
    probe.put("a", b"1")
    probe.put("a", b"2")
    second_put = probe.history[1]
    assert second_put.occurrence == 2
    storage = FaultyStorage(inner, second_put.error_plan())
    storage.put("a", b"3")
    with pytest.raises(StorageError):
        storage.put("a", b"4")
    assert inner.read("a") == b"3"
    with pytest.raises(ValueError):
        Event(0, "crash_point", "step", 1).error_plan()


def test_names_with_glob_characters_match_exactly(inner: LocalStorage) -> None:
    probe = FaultyStorage(inner)
    probe.put("odd[1]*?", b"x")
    storage = FaultyStorage(inner, probe.history[0].crash_plan())
    storage.put("odd1x", b"not matched")
    with pytest.raises(SimulatedCrash):
        storage.put("odd[1]*?", b"x")


def test_repr_and_delegation(inner: LocalStorage) -> None:
    storage = FaultyStorage(inner, FaultPlan(fail("put")))
    assert storage.uri == inner.uri
    assert "FaultyStorage" in repr(storage) and "put" in repr(storage)
    storage.close()
