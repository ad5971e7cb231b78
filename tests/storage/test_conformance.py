"""One storage conformance suite, run on every backend.

Backends: ``local`` (a temporary directory), ``s3`` (SeaweedFS on loopback, via
the ``s3_root`` fixture of ``kvlog.testing.pytest_plugin``) and ``faulty``
(:class:`FaultyStorage` around a local directory, with no faults planned).
"""

from __future__ import annotations

import array
import hashlib
import multiprocessing
import pickle
import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kvlog.errors import ConfigError, StorageError
from kvlog.storage import LocalStorage, Storage, SwapConflict, open_storage
from kvlog.storage.faulty import FaultyStorage

BACKENDS = ["local", pytest.param("s3", marks=pytest.mark.s3), "faulty"]
MiB = 1024 * 1024


def _payload(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_storage(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[[], Storage]]:
    """A factory of handles onto one fresh root of the backend under test."""
    made: list[Storage] = []
    if backend == "s3":
        uri, options = request.getfixturevalue("s3_root")

        def factory() -> Storage:
            return open_storage(uri, options)

    elif backend == "local":

        def factory() -> Storage:
            return LocalStorage(tmp_path / "root")

    else:

        def factory() -> Storage:
            return FaultyStorage(LocalStorage(tmp_path / "root"))

    def tracked() -> Storage:
        storage = factory()
        made.append(storage)
        return storage

    yield tracked
    for storage in made:
        storage.close()


@pytest.fixture
def storage(make_storage: Callable[[], Storage]) -> Storage:
    return make_storage()


# -- whole objects ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"x",
        b"hello world",
        bytearray(b"\x00\xff" * 1000),
        memoryview(b"view of bytes"),
        memoryview(array.array("I", [1, 2, 3, 0xFFFFFFFF])),
    ],
    ids=["empty", "one-byte", "text", "bytearray", "memoryview", "typed-memoryview"],
)
def test_put_read_round_trip(storage: Storage, data: bytes | bytearray | memoryview) -> None:
    storage.put("obj/a.bin", data)
    assert storage.read("obj/a.bin") == bytes(data)
    storage.put_if_absent("obj/b.bin", data)
    assert storage.read("obj/b.bin") == bytes(data)


def test_missing_object_is_file_not_found(storage: Storage) -> None:
    storage.put("present", b"1")
    with pytest.raises(FileNotFoundError):
        storage.read("missing")
    with pytest.raises(FileNotFoundError):
        storage.read_range("missing", 0, 10)
    with pytest.raises(FileNotFoundError):
        storage.read_range("missing", 0, 0)
    with pytest.raises(FileNotFoundError):
        storage.stat("missing")
    with pytest.raises(FileNotFoundError):
        storage.open_stream("missing")
    with pytest.raises(FileNotFoundError):
        storage.read("dir/missing")
    assert not storage.exists("missing")
    assert storage.exists("present")


def test_put_overwrites(storage: Storage) -> None:
    storage.put("k", b"first version, longer")
    storage.put("k", b"second")
    assert storage.read("k") == b"second"
    assert storage.stat("k").size == len(b"second")


def test_put_if_absent_refuses_existing(storage: Storage) -> None:
    storage.put_if_absent("log/00000000000000000001.json", b"winner")
    with pytest.raises(FileExistsError):
        storage.put_if_absent("log/00000000000000000001.json", b"loser")
    assert storage.read("log/00000000000000000001.json") == b"winner"
    storage.put("plain", b"p")
    with pytest.raises(FileExistsError):
        storage.put_if_absent("plain", b"q")
    assert storage.read("plain") == b"p"


def _race_threads(write: Callable[[int, bytes], object]) -> int:
    """Run ``write(i, payload)`` in 8 threads at once (payload ``writer-<i>-`` repeated): exactly
    one may succeed, the 7 others must be refused (``FileExistsError``: ``SwapConflict`` too);
    the winner's number."""
    barrier = threading.Barrier(8)
    outcomes: dict[int, str] = {}

    def attempt(i: int) -> None:
        payload = f"writer-{i}-".encode() * (100 + i)
        barrier.wait()
        try:
            write(i, payload)
            outcomes[i] = "won"
        except FileExistsError:
            outcomes[i] = "lost"
        except Exception as e:  # reported by the test
            outcomes[i] = f"error {e!r}"

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, o in outcomes.items() if o == "won"]
    assert len(winners) == 1, outcomes
    assert sorted(o for o in outcomes.values() if o != "won") == ["lost"] * 7, outcomes
    return winners[0]


def test_put_if_absent_race_threads(storage: Storage) -> None:
    """8 threads create the same name at once: exactly one wins, the object is its payload."""
    for round_ in range(2):
        name = f"log/{round_:020d}.json"
        winner = _race_threads(lambda _i, payload, name=name: storage.put_if_absent(name, payload))
        assert storage.read(name) == f"writer-{winner}-".encode() * (100 + winner)


def _create_in_process(root: str, name: str, i: int, barrier: Any, results: Any) -> None:
    storage = LocalStorage(root)
    payload = f"process-{i}-".encode() * (1000 + i)
    barrier.wait()
    try:
        storage.put_if_absent(name, payload)
        results.put((i, "won"))
    except FileExistsError:
        results.put((i, "lost"))
    except Exception as e:
        results.put((i, f"error {e!r}"))


def _race_processes(ctx: Any, target: Callable[..., None], args: tuple[str, str], barrier: Any,
                    results: Any) -> dict[int, str]:
    """Run ``target(*args, i, barrier, results)`` in 8 processes at once; each one's outcome."""
    procs = [ctx.Process(target=target, args=(*args, i, barrier, results)) for i in range(8)]
    for p in procs:
        p.start()
    outcomes = dict(results.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    results.close()
    return outcomes


def test_put_if_absent_race_processes_local(tmp_path: Path) -> None:
    """8 processes create the same name in one directory: exactly one wins."""
    ctx = multiprocessing.get_context("spawn")
    root = tmp_path / "root"
    LocalStorage(root)
    name = "log/00000000000000000001.json"
    barrier = ctx.Barrier(8)
    results = ctx.Queue()
    outcomes = _race_processes(ctx, _create_in_process, (str(root), name), barrier, results)
    winners = [i for i, o in outcomes.items() if o == "won"]
    assert len(winners) == 1, outcomes
    assert sorted(o for o in outcomes.values() if o != "won") == ["lost"] * 7, outcomes
    expected = f"process-{winners[0]}-".encode() * (1000 + winners[0])
    assert LocalStorage(root).read(name) == expected


# -- swap: the conditional replace commits are published with ------------------------------


def test_swap_creates_replaces_and_refuses_a_stale_version(storage: Storage) -> None:
    token = storage.swap("log/head.json", b"one", None, copy_to="log/00000000000000000001.json")
    assert storage.read_versioned("log/head.json") == (b"one", token)
    assert storage.read("log/00000000000000000001.json") == b"one"
    with pytest.raises(SwapConflict):
        storage.swap("log/head.json", b"again", None)  # it exists: a create is refused
    second = storage.swap("log/head.json", b"two", token, copy_to="log/00000000000000000002.json")
    assert second != token and storage.read("log/head.json") == b"two"
    with pytest.raises(SwapConflict):
        storage.swap("log/head.json", b"stale", token, copy_to="log/00000000000000000003.json")
    assert storage.read("log/head.json") == b"two"
    assert not storage.exists("log/00000000000000000003.json")  # a refused swap copies nothing
    assert storage.read_versioned("log/head.json", second) is None  # unchanged since
    assert storage.read_versioned("log/head.json", token) == (b"two", second)
    # The copy replaces whatever had its name (a copy left by a swap that never happened).
    storage.put("log/00000000000000000003.json", b"left over")
    storage.swap("log/head.json", b"three", second, copy_to="log/00000000000000000003.json")
    assert storage.read("log/00000000000000000003.json") == b"three"
    assert [i.name for i in storage.list("log/")] == [
        "log/00000000000000000001.json", "log/00000000000000000002.json",
        "log/00000000000000000003.json", "log/head.json"]
    with pytest.raises(FileNotFoundError):
        storage.read_versioned("log/missing.json")


def test_swap_of_an_absent_object_with_a_token_is_refused(storage: Storage) -> None:
    token = storage.swap("elsewhere", b"x", None)
    with pytest.raises(SwapConflict):
        storage.swap("log/head.json", b"y", token)
    assert not storage.exists("log/head.json")


def test_swap_race_threads(storage: Storage) -> None:
    """8 threads swap the same version of the head at once: exactly one wins, the head is its
    payload, and only the winner's copy exists."""
    token = storage.swap("log/head.json", b"start", None)
    winner = _race_threads(
        lambda i, payload: storage.swap("log/head.json", payload, token, copy_to=f"log/{i:020d}.json"))
    assert storage.read("log/head.json") == f"writer-{winner}-".encode() * (100 + winner)
    copies = [i.name for i in storage.list("log/") if i.name != "log/head.json"]
    assert copies == [f"log/{winner:020d}.json"]


def _swap_in_process(root: str, token: str, i: int, barrier: Any, results: Any) -> None:
    storage = LocalStorage(root)
    barrier.wait()
    try:
        storage.swap("log/head.json", f"process-{i}-".encode() * (1000 + i), token)
        results.put((i, "won"))
    except SwapConflict:
        results.put((i, "lost"))
    except Exception as e:
        results.put((i, f"error {e!r}"))


def test_swap_race_processes_local(tmp_path: Path) -> None:
    """8 processes swap the same version of a head in one directory: exactly one wins (the
    lock is a file lock, which threads of one process and other processes all take)."""
    ctx = multiprocessing.get_context("spawn")
    root = tmp_path / "root"
    token = LocalStorage(root).swap("log/head.json", b"start", None)
    barrier = ctx.Barrier(8)
    results = ctx.Queue()
    outcomes = _race_processes(ctx, _swap_in_process, (str(root), token), barrier, results)
    winners = [i for i, o in outcomes.items() if o == "won"]
    assert len(winners) == 1, outcomes
    assert LocalStorage(root).read("log/head.json") == f"process-{winners[0]}-".encode() * (1000 + winners[0])


# -- ranges and streams -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("start", "length"),
    [
        (0, 0),
        (0, 1),
        (0, 1000),
        (0, 5000),
        (10, 20),
        (500, 0),
        (999, 1),
        (999, 10),
        (1000, 0),
        (1000, 5),
        (5000, 10),
        (123, 877),
    ],
)
def test_read_range_byte_exact(storage: Storage, start: int, length: int) -> None:
    data = _payload(1000, seed=7)
    storage.put("r/obj", data)
    assert storage.read_range("r/obj", start, length) == data[start : start + length]


def test_read_range_rejects_negative(storage: Storage) -> None:
    storage.put("r/obj", b"abc")
    with pytest.raises(ValueError):
        storage.read_range("r/obj", -1, 2)
    with pytest.raises(ValueError):
        storage.read_range("r/obj", 0, -2)


def test_stream_reads_forward_and_skips(storage: Storage) -> None:
    data = _payload(3 * MiB + 17, seed=3)  # several network chunks on object stores
    storage.put("s/obj", data)
    stream = storage.open_stream("s/obj")
    try:
        assert stream.position == 0
        assert stream.read(10) == data[:10]
        assert stream.position == 10
        stream.skip_to(10)  # staying put is fine
        stream.skip_to(100)
        assert stream.read(5) == data[100:105]
        with pytest.raises(ValueError):
            stream.skip_to(50)
        # A read that crosses chunk boundaries.
        start = MiB - 3
        stream.skip_to(start)
        assert stream.read(2 * MiB) == data[start : start + 2 * MiB]
        stream.skip_to(len(data) - 7)
        assert stream.read(100) == data[-7:]
        assert stream.position == len(data)
        assert stream.read(10) == b""
        with pytest.raises(ValueError):
            stream.skip_to(0)
    finally:
        stream.close()


def test_stream_from_offset(storage: Storage) -> None:
    data = _payload(100_000, seed=4)
    storage.put("s/obj", data)
    stream = storage.open_stream("s/obj", start=40_000)
    try:
        assert stream.position == 40_000
        chunks = []
        while chunk := stream.read(7_777):
            chunks.append(chunk)
        assert b"".join(chunks) == data[40_000:]
    finally:
        stream.close()
    past = storage.open_stream("s/obj", start=200_000)
    try:
        assert past.read(10) == b""
    finally:
        past.close()
    empty = storage.open_stream("s/obj", start=len(data))
    try:
        assert empty.read(1) == b""
    finally:
        empty.close()


@pytest.mark.slow
def test_large_object_round_trip(storage: Storage) -> None:
    """A 64 MiB (+ an odd tail) object: put (multipart on S3), put_if_absent, ranges, stream."""
    size = 64 * MiB + 12_345
    data = _payload(size, seed=64)
    digest = hashlib.sha256(data).hexdigest()
    storage.put("big/put.bin", data)
    storage.put_if_absent("big/create.bin", data)
    for name in ("big/put.bin", "big/create.bin"):
        assert storage.stat(name).size == size
        back = storage.read(name)
        assert len(back) == size
        assert hashlib.sha256(back).hexdigest() == digest
        del back
        assert storage.read_range(name, size - 100, 1000) == data[-100:]
        assert storage.read_range(name, 33 * MiB, 10) == data[33 * MiB : 33 * MiB + 10]
    stream = storage.open_stream("big/put.bin", start=5)
    hasher = hashlib.sha256(data[:5])
    try:
        while chunk := stream.read(4 * MiB + 1):
            hasher.update(chunk)
    finally:
        stream.close()
    assert hasher.hexdigest() == digest


# -- listing and metadata -----------------------------------------------------------------

# No name is a "directory" of another ("a" beside "a/b"): a filesystem cannot hold both.
LIST_NAMES = [
    "a.txt",
    "a/b",
    "a/c/d",
    "ab",
    "b/x",
    "data/0/x.arrow",
    "data/1/y.arrow",
    "kvlog.json",
    "log/00000000000000000001.json",
    "log/00000000000000000002.json",
    "log/00000000000000000010.json",
    "log/00000000000000000010.checkpoint.arrow",
]


def test_list_order_and_prefixes(storage: Storage) -> None:
    for i, name in enumerate(reversed(LIST_NAMES)):
        storage.put(name, b"x" * (i + 1))

    def names(prefix: str) -> list[str]:
        return [info.name for info in storage.list(prefix)]

    assert names("") == sorted(LIST_NAMES)
    assert names("a") == ["a.txt", "a/b", "a/c/d", "ab"]
    assert names("a/") == ["a/b", "a/c/d"]
    assert names("a/c") == ["a/c/d"]
    assert names("a/c/") == ["a/c/d"]
    assert names("data/") == ["data/0/x.arrow", "data/1/y.arrow"]
    assert names("log/0000000000000000000") == [
        "log/00000000000000000001.json",
        "log/00000000000000000002.json",
    ]
    assert names("log/00000000000000000010") == [
        "log/00000000000000000010.checkpoint.arrow",
        "log/00000000000000000010.json",
    ]
    assert names("log/00000000000000000010.j") == ["log/00000000000000000010.json"]
    assert names("kvlog.json") == ["kvlog.json"]
    assert names("nothing") == []
    assert names("nothing/") == []
    assert names("a/c/d/e") == []
    assert list(storage.iter_names("b")) == ["b/x"]
    sizes = {info.name: info.size for info in storage.list()}
    assert sizes == {name: i + 1 for i, name in enumerate(reversed(LIST_NAMES))}


def test_list_of_empty_root(storage: Storage) -> None:
    assert storage.list() == []
    assert storage.list("log/") == []


def test_stat_reports_size_and_mtime(storage: Storage) -> None:
    storage.put("st/obj", b"12345")
    info = storage.stat("st/obj")
    assert info.name == "st/obj"
    assert info.size == 5
    # The server's clock may differ a little from ours; both run on this machine.
    assert abs(info.mtime_ms - time.time_ns() // 1_000_000) < 10 * 60 * 1000
    storage.put("st/empty", b"")
    assert storage.stat("st/empty").size == 0
    listed = {i.name: i for i in storage.list("st/")}
    assert listed["st/obj"].size == 5


def test_delete(storage: Storage) -> None:
    storage.delete("never/existed")  # not an error
    storage.put("d/obj", b"1")
    storage.delete("d/obj")
    with pytest.raises(FileNotFoundError):
        storage.read("d/obj")
    storage.delete("d/obj")  # twice is fine
    assert storage.list("d/") == []
    storage.put_if_absent("d/obj", b"again")  # the name can be created again
    assert storage.read("d/obj") == b"again"


# -- request counting and names -----------------------------------------------------------


def test_request_counting(make_storage: Callable[[], Storage]) -> None:
    storage = make_storage()
    assert sum(storage.requests.values()) == 0
    storage.put("c/a", b"hello")
    storage.put_if_absent("c/b", b"world")
    storage.read("c/a")
    storage.read_range("c/a", 1, 2)
    stream = storage.open_stream("c/a")
    stream.read(5)
    stream.close()
    storage.stat("c/a")
    storage.list("c/")
    storage.delete("c/b")
    assert dict(storage.requests) == {
        "put": 1,
        "put_if_absent": 1,
        "get": 1,
        "range_get": 1,
        "stream": 1,
        "stat": 1,
        "list": 1,
        "delete": 1,
    }
    storage.read("c/a")
    assert storage.requests["get"] == 2
    other = make_storage()  # each handle counts its own requests
    assert sum(other.requests.values()) == 0


def test_pickled_copy_works(storage: Storage) -> None:
    """Spark executors receive pickled storages: the copy reconnects by itself."""
    storage.put("p/obj", b"before pickling")
    copy = pickle.loads(pickle.dumps(storage))
    assert type(copy) is type(storage)
    assert copy.uri == storage.uri
    assert sum(copy.requests.values()) == 0
    assert copy.read("p/obj") == b"before pickling"
    copy.put_if_absent("p/from-copy", b"written by the copy")
    assert storage.read("p/from-copy") == b"written by the copy"
    assert copy.requests["put_if_absent"] == 1


BAD_NAMES = ["", "/abs", "/abs/olute", "..", ".", "a/../b", "../up", "./a", "a//b", "a/", "a/."]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_names_are_storage_errors(storage: Storage, name: str) -> None:
    operations: list[Callable[[], object]] = [
        lambda: storage.read(name),
        lambda: storage.read_range(name, 0, 1),
        lambda: storage.open_stream(name),
        lambda: storage.put(name, b"x"),
        lambda: storage.put_if_absent(name, b"x"),
        lambda: storage.stat(name),
        lambda: storage.delete(name),
    ]
    for op in operations:
        with pytest.raises(StorageError):
            op()


def test_unknown_scheme_is_config_error() -> None:
    with pytest.raises(ConfigError, match="ftp"):
        open_storage("ftp://x")
    with pytest.raises(ConfigError):
        open_storage("")


@pytest.mark.parametrize("size", [0, 1, 70_000])
def test_put_file_writes_the_file_s_bytes(storage: Storage, tmp_path: Path, size: int) -> None:
    scratch = tmp_path / f"scratch-{size}.bin"
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    scratch.write_bytes(payload)
    storage.put("obj/from-file.bin", b"older")
    storage.put_file("obj/from-file.bin", scratch)
    assert storage.read("obj/from-file.bin") == payload
    assert storage.stat("obj/from-file.bin").size == size


def test_local_put_file_moves_the_file_into_place(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "root")
    scratch = tmp_path / "root-scratch.bin"
    scratch.write_bytes(b"moved, not copied")
    inode = scratch.stat().st_ino
    storage.put_file("data/x.bin", scratch)
    assert not scratch.exists()
    assert (tmp_path / "root" / "data" / "x.bin").stat().st_ino == inode
    assert storage.read("data/x.bin") == b"moved, not copied"
    assert storage.requests["put"] == 1
