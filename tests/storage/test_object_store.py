"""ObjectStoreStorage beyond the conformance suite: configuration, errors, pickling.

Tests that use the ``seaweedfs`` or ``s3_root`` fixtures are marked ``s3`` by the plugin.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import socket
import time
from typing import Any

import pytest

from kvlog.errors import ConfigError, StorageError
from kvlog.storage import open_storage
from kvlog.storage.object_store import ObjectStoreStorage
from kvlog.testing.seaweedfs import SeaweedServer


@pytest.fixture
def no_aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests here decide what the environment says about AWS."""
    for var in list(os.environ):
        if var.startswith("AWS_") and var != "AWS_CA_BUNDLE":
            monkeypatch.delenv(var)


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _read_in_child(storage: ObjectStoreStorage, name: str) -> bytes:
    return storage.read(name)


# -- configuration -------------------------------------------------------------------------


def test_missing_credentials_is_config_error(no_aws_env: None) -> None:
    with pytest.raises(ConfigError) as info:
        open_storage("s3://bucket/prefix", {"endpoint_override": "http://127.0.0.1:9"})
    message = str(info.value)
    assert "access_key" in message and "AWS_ACCESS_KEY_ID" in message
    with pytest.raises(ConfigError, match="both"):
        open_storage("s3://bucket/prefix", {"access_key": "only-the-key"})
    with pytest.raises(ConfigError, match="session_token"):
        open_storage("s3://bucket/prefix", {"session_token": "t"})


def test_half_credentials_in_env_is_config_error(
    no_aws_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key-without-secret")
    with pytest.raises(ConfigError, match="AWS_SECRET_ACCESS_KEY"):
        open_storage("s3://bucket/prefix")


@pytest.mark.parametrize(
    ("uri", "options", "match"),
    [
        ("s3://bucket/p", {"endpoint": "http://x"}, "unknown storage_options"),
        ("s3:///no-bucket", {}, "not a valid"),
        ("s3://user:pw@bucket/p", {}, "credentials in the store URI"),
        ("s3://bucket/a/../b", {}, "invalid prefix"),
        ("s3://bucket/p", {"timeout": "soon"}, "duration"),
        ("s3://bucket/p", {"timeout": -1}, "positive"),
        ("s3://bucket/p", {"retries": -1}, "retries"),
        ("s3://bucket/p", {"allow_http": "maybe"}, "true or false"),
        ("s3://bucket/p", {"endpoint_override": "127.0.0.1:9000"}, "http://"),
        ("s3://bucket/p", {"endpoint_override": "http://h:1", "allow_http": False}, "allow_http"),
    ],
)
def test_bad_configuration_is_config_error(uri: str, options: dict[str, Any], match: str) -> None:
    options = {"access_key": "k", "secret_key": "s", **options}
    with pytest.raises(ConfigError, match=match):
        open_storage(uri, options)


def test_uri_and_repr_hide_credentials(s3_root: tuple[str, dict[str, Any]]) -> None:
    uri, options = s3_root
    storage = open_storage(uri + "/", options)
    assert isinstance(storage, ObjectStoreStorage)
    assert storage.uri == uri
    for text in (repr(storage), str(storage), repr(storage._settings)):
        assert options["secret_key"] not in text
    assert open_storage("s3a://bucket", {"access_key": "k", "secret_key": "s"}).uri == "s3://bucket"


def test_credentials_from_environment(
    no_aws_env: None, monkeypatch: pytest.MonkeyPatch, s3_root: tuple[str, dict[str, Any]]
) -> None:
    uri, options = s3_root
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", options["access_key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", options["secret_key"])
    monkeypatch.setenv("AWS_ENDPOINT_URL", options["endpoint_override"])
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    storage = open_storage(uri)
    storage.put("env/obj", b"from the environment")
    assert storage.read("env/obj") == b"from the environment"


def test_empty_prefix_uses_the_bucket_root(seaweedfs: SeaweedServer) -> None:
    seaweedfs.create_bucket("kvlog-root-test")
    root = open_storage("s3://kvlog-root-test", seaweedfs.storage_options)
    nested = open_storage("s3://kvlog-root-test/inner/dir", seaweedfs.storage_options)
    nested.put("obj", b"nested")
    root.put("top", b"top")
    assert root.read("inner/dir/obj") == b"nested"
    assert [i.name for i in root.list()] == ["inner/dir/obj", "top"]
    assert [i.name for i in nested.list()] == ["obj"]


# -- failures as StorageError --------------------------------------------------------------


def test_wrong_credentials_are_a_clear_storage_error(s3_root: tuple[str, dict[str, Any]]) -> None:
    uri, options = s3_root
    secret = "not-the-right-secret-" + "x" * 20
    storage = open_storage(uri, {**options, "secret_key": secret})
    operations = [
        lambda: storage.read("a"),
        lambda: storage.stat("a"),
        lambda: storage.put("a", b"1"),
        lambda: storage.put_if_absent("a", b"1"),
        lambda: storage.list(),
        lambda: storage.delete("a"),
        lambda: storage.open_stream("a"),
    ]
    for op in operations:
        with pytest.raises(StorageError) as info:
            op()
        message = str(info.value)
        assert "credentials were refused" in message, message
        assert "secret_key" in message
        assert len(message.splitlines()) == 1
        assert secret not in message
        assert secret not in str(info.value.__cause__)
        assert secret not in repr(storage)
    wrong_key = open_storage(uri, {**options, "access_key": "NO-SUCH-KEY"})
    with pytest.raises(StorageError, match="credentials were refused"):
        wrong_key.read("a")


def test_unreachable_endpoint_fails_quickly(no_aws_env: None) -> None:
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    storage = open_storage(
        "s3://bucket/p",
        {
            "endpoint_override": endpoint,
            "access_key": "k",
            "secret_key": "s3cr3t-value",
            "retries": 0,
            "timeout": "2s",
        },
    )
    for op in (lambda: storage.read("a"), lambda: storage.put_if_absent("a", b"1")):
        began = time.monotonic()
        with pytest.raises(StorageError) as info:
            op()
        assert time.monotonic() - began < 5
        message = str(info.value)
        assert "cannot reach" in message and endpoint in message
        assert "endpoint_override" in message
        assert "s3cr3t-value" not in message


def test_unreachable_endpoint_with_default_retries_fails_in_seconds(no_aws_env: None) -> None:
    storage = open_storage(
        "s3://bucket/p",
        {
            "endpoint_override": f"http://127.0.0.1:{_closed_port()}",
            "access_key": "k",
            "secret_key": "s",
        },
    )
    began = time.monotonic()
    with pytest.raises(StorageError, match="cannot reach"):
        storage.stat("a")
    assert time.monotonic() - began < 30


def test_missing_bucket_is_a_storage_error(seaweedfs: SeaweedServer) -> None:
    storage = open_storage("s3://kvlog-no-such-bucket/p", seaweedfs.storage_options)
    operations = [
        lambda: storage.read("a"),
        lambda: storage.stat("a"),
        lambda: storage.read_range("a", 0, 5),
        lambda: storage.open_stream("a"),
        lambda: storage.put("a", b"1"),
        lambda: storage.put_if_absent("a", b"1"),
        lambda: storage.list(),
        lambda: storage.delete("a"),
    ]
    for op in operations:
        with pytest.raises(StorageError, match="bucket 'kvlog-no-such-bucket' does not exist"):
            op()
    # A second handle whose first request is a HEAD (no body to read the error code from).
    fresh = open_storage("s3://kvlog-no-such-bucket/p", seaweedfs.storage_options)
    with pytest.raises(StorageError, match="does not exist"):
        fresh.stat("a")


# -- pickling (Spark executors receive pickled storages) -----------------------------------


def test_pickle_round_trip(s3_root: tuple[str, dict[str, Any]]) -> None:
    uri, options = s3_root
    storage = open_storage(uri, options)
    assert isinstance(storage, ObjectStoreStorage)
    storage.put("p/obj", b"pickled")
    assert storage.requests["put"] == 1
    blob = pickle.dumps(storage)
    copy = pickle.loads(blob)
    assert isinstance(copy, ObjectStoreStorage)
    assert copy._client is None  # reconnects lazily
    assert copy.uri == storage.uri
    assert sum(copy.requests.values()) == 0
    assert copy.read("p/obj") == b"pickled"
    copy.put_if_absent("p/new", b"from the copy")
    assert storage.read("p/new") == b"from the copy"
    assert copy.requests["get"] == 1
    storage.close()
    assert storage.read("p/obj") == b"pickled"  # a closed storage reconnects too


def test_pickled_storage_works_in_another_process(s3_root: tuple[str, dict[str, Any]]) -> None:
    uri, options = s3_root
    storage = open_storage(uri, options)
    assert isinstance(storage, ObjectStoreStorage)
    storage.put("p/shared", b"seen by the child")
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        assert pool.apply(_read_in_child, (storage, "p/shared")) == b"seen by the child"


def test_large_put_is_multipart(s3_root: tuple[str, dict[str, Any]]) -> None:
    """Above 32 MiB ``put`` uploads in parts (the ETag of a multipart object ends in -N)."""
    import obstore

    uri, options = s3_root
    storage = open_storage(uri, options)
    assert isinstance(storage, ObjectStoreStorage)
    data = bytes(range(256)) * (33 * 4096)  # 33 MiB
    storage.put("mp/big", data)
    storage.put("mp/small", data[:1000])
    assert "-" in str(obstore.head(storage.client, "mp/big")["e_tag"])
    assert "-" not in str(obstore.head(storage.client, "mp/small")["e_tag"])
    assert storage.read("mp/big") == data
