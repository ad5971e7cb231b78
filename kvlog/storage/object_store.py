"""S3 and S3-compatible object storage through obstore (the Rust ``object_store`` crate).

``put_if_absent`` is a single PUT with ``If-None-Match: *``: the server makes the
object visible whole or answers 412, so it is a real commit point (pyarrow's S3
filesystem cannot send that header). ``open_stream`` is one
streaming GET. Clients are created lazily and dropped when the storage is
pickled, so a storage object travels cheaply to Spark executors.

Credentials never appear in ``repr``, in error messages or in logs. They are
kept in memory and travel with a pickled storage (executors need them).
"""

from __future__ import annotations

import errno
import os
import re
import threading
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NoReturn

import obstore
from obstore.exceptions import (
    AlreadyExistsError,
    BaseError,
    NotModifiedError,
    PermissionDeniedError,
    PreconditionError,
    UnauthenticatedError,
)
from obstore.store import S3Store

from kvlog.errors import ConfigError, StorageError
from kvlog.storage.base import BytesLike, ObjectInfo, Storage, SwapConflict, check_name
from kvlog.storage.s3_settings import StaticCredentials, resolve_settings

if TYPE_CHECKING:
    from obstore import BytesStream, GetOptions, ObjectMeta
    from obstore.store import ClientConfig, RetryConfig, S3Config

__all__ = ["ObjectStoreStorage", "ObjectStream"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)
_STATUS_RE = re.compile(r"status code: (\d{3})")
_CODE_RE = re.compile(r"<Code>([^<]{1,64})</Code>")
#: Errors obstore raises for failed requests (it also raises builtin FileNotFoundError/ValueError).
_BACKEND_ERRORS = (BaseError, OSError, ValueError)
#: Single PUT up to this size; above it ``put`` uploads in parts (S3 completes them atomically).
_MULTIPART_THRESHOLD = 32 * 1024 * 1024
_PART_SIZE = 8 * 1024 * 1024
_STREAM_CHUNK = 1024 * 1024
_LIST_CHUNK = 1000


class ObjectStream:
    """A forward-only stream over one streaming GET; buffers the chunks the server sends.

    ``skip_to`` reads and discards the bytes in between (no second request), so
    it suits the small gaps of a sequential scan.
    """

    def __init__(
        self,
        storage: ObjectStoreStorage,
        name: str,
        chunks: BytesStream | None,
        start: int,
    ) -> None:
        self._storage = storage
        self._name = name
        self._chunks = chunks
        self._chunk: memoryview = memoryview(b"")
        self._offset = 0
        self._position = start

    @property
    def position(self) -> int:
        return self._position

    def _fill(self) -> bool:
        """Make the buffer non-empty; False at the end of the object."""
        while self._offset >= len(self._chunk):
            if self._chunks is None:
                return False
            try:
                chunk = next(self._chunks)
            except StopIteration:
                self._chunks = None
                return False
            except _BACKEND_ERRORS as e:
                self._chunks = None
                self._storage._raise("stream", self._name, e)
            self._chunk = memoryview(chunk).cast("B")
            self._offset = 0
        return True

    def read(self, n: int) -> bytes:
        if n < 0:
            raise ValueError("read size must be >= 0")
        parts: list[memoryview] = []
        need = n
        while need > 0 and self._fill():
            take = min(need, len(self._chunk) - self._offset)
            parts.append(self._chunk[self._offset : self._offset + take])
            self._offset += take
            need -= take
        data = b"".join(parts)
        self._position += len(data)
        return data

    def skip_to(self, position: int) -> None:
        if position < self._position:
            raise ValueError(f"stream is at {self._position}, cannot go back to {position}")
        need = position - self._position
        while need > 0 and self._fill():
            take = min(need, len(self._chunk) - self._offset)
            self._offset += take
            need -= take
        # Past the end of the object the stream stays empty, as a file would.
        self._position = position

    def close(self) -> None:
        # Dropping the stream drops the HTTP response and its connection.
        self._chunks = None
        self._chunk = memoryview(b"")
        self._offset = 0

    def __enter__(self) -> ObjectStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ObjectStoreStorage(Storage):
    """Objects in an S3 bucket (or an S3-compatible server) under ``s3://bucket/prefix``.

    Object names are joined under the prefix (``s3://b/stores/one`` keeps
    ``log/00000000000000000001.json`` at key ``stores/one/log/00000000000000000001.json``);
    the prefix may be empty.

    ``storage_options`` (all optional; unknown keys are a :class:`ConfigError`):

    ``endpoint_override``
        URL of an S3-compatible server, e.g. ``"http://127.0.0.1:8333"``.
        Default: ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``, else AWS.
    ``access_key``, ``secret_key``, ``session_token``
        Credentials. Default: ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
        ``AWS_SESSION_TOKEN``; web-identity (``AWS_WEB_IDENTITY_TOKEN_FILE``) and
        container (``AWS_CONTAINER_CREDENTIALS_*``) credentials are also used.
        With none of these a :class:`ConfigError` says what to set.
    ``region``
        Default ``AWS_REGION``, ``AWS_DEFAULT_REGION``, else ``"us-east-1"``.
    ``allow_http``
        Allow plain ``http://`` endpoints. Default: true exactly when
        ``endpoint_override`` starts with ``http://``.
    ``virtual_hosted_style_request``
        ``bucket.host`` URLs instead of ``host/bucket`` (path style). Default false,
        which custom endpoints need.
    ``timeout``
        Whole-request timeout, seconds or a string like ``"30s"`` (default ``"30s"``).
    ``connect_timeout``
        Connection timeout (default the smaller of ``timeout`` and 5 s).
    ``stream_timeout``
        Whole-request timeout of :meth:`open_stream`, which may stay open while a
        caller works through a large object (default ``"1h"``); each network read
        of a stream must still progress within ``timeout``.
    ``retries``
        Retries of a failed request (5xx, connection errors, timeouts of reads),
        with exponential backoff (default 5).
    ``retry_timeout``
        No retry starts later than this after the first attempt (default ``"2m"``).

    Errors: a missing object is ``FileNotFoundError``; refused credentials, an
    unreachable endpoint or a missing bucket are a
    :class:`~kvlog.errors.StorageError` whose message says what to fix.
    """

    def __init__(self, uri: str, storage_options: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self._settings = resolve_settings(uri, dict(storage_options or {}), os.environ)
        s = self._settings
        self.bucket = s.bucket
        self.prefix = s.prefix
        self.uri = f"s3://{s.bucket}/{s.prefix}" if s.prefix else f"s3://{s.bucket}"
        self._init_runtime()

    # Pickling: the live clients stay behind and the copy reconnects lazily.
    _transient = (
        *Storage._transient,
        "_client_lock",
        "_client",
        "_stream_client",
        "_bucket_checked",
    )

    def _init_runtime(self) -> None:
        self._client_lock = threading.Lock()
        self._client: S3Store | None = None
        self._stream_client: S3Store | None = None
        self._bucket_checked = False

    def _rebuild(self) -> None:
        super()._rebuild()
        self._init_runtime()

    def __repr__(self) -> str:
        endpoint = f", endpoint={self._settings.endpoint!r}" if self._settings.endpoint else ""
        return f"ObjectStoreStorage({self.uri!r}{endpoint})"

    # -- clients ---------------------------------------------------------------------------

    def _make_client(self, whole_request_timeout: timedelta) -> S3Store:
        s = self._settings
        config: S3Config = {
            "region": s.region,
            "virtual_hosted_style_request": s.virtual_hosted_style_request,
        }
        if s.endpoint is not None:
            config["endpoint"] = s.endpoint
        client_options: ClientConfig = {
            "allow_http": s.allow_http,
            "timeout": whole_request_timeout,
            "connect_timeout": s.connect_timeout,
            "read_timeout": s.timeout,
        }
        retry_config: RetryConfig = {"max_retries": s.retries, "retry_timeout": s.retry_timeout}
        credentials = (
            StaticCredentials(s.access_key, s.secret_key, s.session_token)
            if s.access_key is not None and s.secret_key is not None
            else None
        )
        try:
            return S3Store(
                s.bucket,
                prefix=s.prefix or None,
                config=config,
                client_options=client_options,
                retry_config=retry_config,
                credential_provider=credentials,
            )
        except _BACKEND_ERRORS as e:
            raise ConfigError(
                f"cannot configure the S3 client for {self.uri}: {self._redact(_first_line(e))}"
            ) from None

    @property
    def client(self) -> S3Store:
        """The obstore client, created on first use (and again after unpickling)."""
        client = self._client
        if client is None:
            with self._client_lock:
                if self._client is None:
                    self._client = self._make_client(self._settings.timeout)
                client = self._client
        return client

    @property
    def _streams(self) -> S3Store:
        client = self._stream_client
        if client is None:
            with self._client_lock:
                if self._stream_client is None:
                    self._stream_client = self._make_client(self._settings.stream_timeout)
                client = self._stream_client
        return client

    def close(self) -> None:
        with self._client_lock:
            self._client = None
            self._stream_client = None

    # -- error mapping ---------------------------------------------------------------------

    def _redact(self, text: str) -> str:
        for secret in self._settings.secrets():
            text = text.replace(secret, "***")
        return text

    def _where(self, name: str) -> str:
        return f"{self.uri}/{name}" if name else self.uri

    def _endpoint_text(self) -> str:
        return self._settings.endpoint or f"AWS S3 ({self._settings.region})"

    def _error(self, op: str, name: str, e: BaseException) -> StorageError:
        """One clear line for a failed request; the obstore error is chained by the caller."""
        text = str(e)
        status_match = _STATUS_RE.search(text)
        code_match = _CODE_RE.search(text)
        status = int(status_match.group(1)) if status_match else None
        code = code_match.group(1) if code_match else None
        where = self._where(name)
        detail = (
            f"HTTP {status} {code}" if code else f"HTTP {status}" if status else type(e).__name__
        )
        if code == "NoSuchBucket":
            message = (
                f"{op} {where}: bucket {self.bucket!r} does not exist at {self._endpoint_text()}: "
                "create it or fix the URI"
            )
        elif isinstance(e, PermissionDeniedError | UnauthenticatedError) or status in (401, 403):
            if code in (
                "InvalidAccessKeyId",
                "SignatureDoesNotMatch",
                "InvalidToken",
                "ExpiredToken",
            ):
                message = (
                    f"{op} {where}: the credentials were refused ({detail}): check access_key/"
                    "secret_key/session_token or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY/AWS_SESSION_TOKEN"
                )
            else:
                # AccessDenied, or a HEAD whose 403 has no body to tell which.
                message = (
                    f"{op} {where}: the credentials were refused or lack permission ({detail}): "
                    "check access_key/secret_key or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, and "
                    "that they may read, write and list the bucket"
                )
        elif status is None and _is_connection_error(text):
            message = (
                f"{op} {where}: cannot reach {self._endpoint_text()} ({_connection_detail(text)}): "
                "check endpoint_override / AWS_ENDPOINT_URL and that the server is running; retry later"
            )
        else:
            message = f"{op} {where} failed ({detail}): {_first_line(e)[:300]}; retry later"
        return StorageError(self._redact(message))

    def _raise(self, op: str, name: str, e: BaseException) -> NoReturn:
        raise self._error(op, name, e) from e

    def _not_found(self, op: str, name: str, e: BaseException) -> NoReturn:
        """A 404: the object is missing, unless the bucket is (then it is a StorageError)."""
        text = str(e)
        if "NoSuchBucket" in text:
            self._raise(op, name, e)
        if "NoSuchKey" not in text:
            # A HEAD has no body to tell a missing key from a missing bucket: ask once.
            self._check_bucket(op, name)
        raise FileNotFoundError(errno.ENOENT, "no such object", self._where(name)) from None

    def _check_bucket(self, op: str, name: str) -> None:
        if self._bucket_checked:
            return
        self._count("list")
        try:
            for _ in obstore.list(self.client, chunk_size=1):
                break
        except _BACKEND_ERRORS as e:
            self._raise(op, name, e)
        self._bucket_checked = True

    # -- the Storage contract ---------------------------------------------------------------

    def read(self, name: str) -> bytes:
        check_name(name)
        self._count("get")
        try:
            return self._received(bytes(obstore.get(self.client, name).bytes()))
        except FileNotFoundError as e:
            self._not_found("read", name, e)
        except _BACKEND_ERRORS as e:
            self._raise("read", name, e)

    def read_range(self, name: str, start: int, length: int) -> bytes:
        """``length`` bytes from ``start``; fewer at the end, none at or past it.

        A zero ``length`` costs a ``stat`` (to raise ``FileNotFoundError`` as the
        other backends do) instead of a ranged GET.
        """
        check_name(name)
        if start < 0 or length < 0:
            raise ValueError("start and length must be >= 0")
        if length == 0:
            self.stat(name)
            return b""
        self._count("range_get")
        try:
            return self._received(bytes(obstore.get_range(self.client, name, start=start, length=length)))
        except FileNotFoundError as e:
            self._not_found("read", name, e)
        except _BACKEND_ERRORS as e:
            if self._unsatisfiable(e):
                # 416: the range starts at or past the end; confirm the object exists.
                self.stat(name)
                return b""
            self._raise("read", name, e)

    def open_stream(self, name: str, start: int = 0) -> ObjectStream:
        """One streaming GET from ``start``; a start at or past the end gives an empty stream."""
        check_name(name)
        if start < 0:
            raise ValueError("start must be >= 0")
        self._count("stream")
        try:
            options: GetOptions = {"range": {"offset": start}} if start else {}
            result = obstore.get(self._streams, name, options=options)
            chunks = result.stream(min_chunk_size=_STREAM_CHUNK)
        except FileNotFoundError as e:
            self._not_found("open", name, e)
        except _BACKEND_ERRORS as e:
            if self._unsatisfiable(e):
                self.stat(name)
                return ObjectStream(self, name, None, start)
            self._raise("open", name, e)
        return ObjectStream(self, name, chunks, start)

    @staticmethod
    def _unsatisfiable(e: BaseException) -> bool:
        text = str(e)
        return "status code: 416" in text or "InvalidRange" in text

    def put_if_absent(self, name: str, data: BytesLike) -> None:
        """One PUT with ``If-None-Match: *``; ``FileExistsError`` when the name exists.

        Retries are part of the request: if an attempt created the object but its
        answer was lost, the retry finds the object and this raises
        ``FileExistsError`` although the object holds ``data``. Callers that must
        tell the cases apart read the object back and compare.
        """
        check_name(name)
        self._count("put_if_absent", memoryview(data).nbytes)
        payload = data if isinstance(data, bytes | bytearray) else memoryview(data).cast("B")
        try:
            obstore.put(self.client, name, payload, mode="create", use_multipart=False)
        except (AlreadyExistsError, PreconditionError):
            raise FileExistsError(errno.EEXIST, "object exists", self._where(name)) from None
        except _BACKEND_ERRORS as e:
            self._raise("create", name, e)

    def read_versioned(self, name: str, unless: str | None = None) -> tuple[bytes, str] | None:
        """One GET (with ``If-None-Match: <unless>``: no body while unchanged); the token is
        the object's ETag."""
        check_name(name)
        self._count("get")
        try:
            options: GetOptions = {"if_none_match": unless} if unless is not None else {}
            result = obstore.get(self.client, name, options=options)
            data = self._received(bytes(result.bytes()))
        except NotModifiedError:
            return None
        except FileNotFoundError as e:
            self._not_found("read", name, e)
        except _BACKEND_ERRORS as e:
            self._raise("read", name, e)
        tag = result.meta.get("e_tag")
        if not tag:
            raise StorageError(f"read {self._where(name)}: the server sent no ETag, which "
                               "conditional writes need")
        return data, tag

    def swap(self, name: str, data: BytesLike, expected: str | None, copy_to: str | None = None) -> str:
        """One PUT with ``If-Match: <expected>`` (``If-None-Match: *`` for None), then the copy's
        PUT. A retried attempt whose first answer was lost is refused as a conflict although it
        wrote: callers that must tell read the object back."""
        check_name(name)
        self._count("swap", memoryview(data).nbytes)
        payload = data if isinstance(data, bytes | bytearray) else memoryview(data).cast("B")
        mode: Any = "create" if expected is None else {"e_tag": expected}
        try:
            result = obstore.put(self.client, name, payload, mode=mode, use_multipart=False)
        except (AlreadyExistsError, PreconditionError, FileNotFoundError):
            raise SwapConflict(errno.EEXIST, "another version", self._where(name)) from None
        except _BACKEND_ERRORS as e:
            self._raise("swap", name, e)
        tag = result.get("e_tag")
        if not tag:
            raise StorageError(f"swap {self._where(name)}: the server sent no ETag, which "
                               "conditional writes need")
        if copy_to is not None:
            self.put(copy_to, payload)
        return tag

    def put(self, name: str, data: BytesLike) -> None:
        """Create or replace ``name``. Above 32 MiB the upload is multipart, which S3
        completes atomically; an interrupted multipart upload leaves hidden parts that
        a bucket lifecycle rule for incomplete uploads removes."""
        check_name(name)
        self._count("put", memoryview(data).nbytes)
        # obstore takes flat byte buffers: view anything else (e.g. typed memoryviews) as bytes.
        payload = data if isinstance(data, bytes | bytearray) else memoryview(data).cast("B")
        size = len(payload)
        try:
            obstore.put(
                self.client,
                name,
                payload,
                use_multipart=size > _MULTIPART_THRESHOLD,
                chunk_size=_PART_SIZE,
            )
        except _BACKEND_ERRORS as e:
            self._raise("write", name, e)

    def stat(self, name: str) -> ObjectInfo:
        check_name(name)
        self._count("stat")
        try:
            meta = obstore.head(self.client, name)
        except FileNotFoundError as e:
            self._not_found("stat", name, e)
        except _BACKEND_ERRORS as e:
            self._raise("stat", name, e)
        return _info(name, meta)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Objects whose names start with ``prefix`` (which may end mid-name), sorted.

        The server lists the deepest "directory" the prefix names; the rest of the
        prefix is matched here.
        """
        directory, _, _ = prefix.rpartition("/")
        if directory:
            check_name(directory)
        elif prefix.startswith("/"):
            raise StorageError(f"invalid prefix {prefix!r}")
        self._count("list")
        out: list[ObjectInfo] = []
        try:
            stream = obstore.list(self.client, directory or None, chunk_size=_LIST_CHUNK)
            for page in stream:
                for meta in page:
                    name = meta["path"]
                    if name.startswith(prefix) and not name.endswith("/"):
                        out.append(_info(name, meta))
        except _BACKEND_ERRORS as e:
            self._raise("list", prefix, e)
        out.sort(key=lambda info: info.name)
        return out

    def delete(self, name: str) -> None:
        check_name(name)
        self._count("delete")
        try:
            obstore.delete(self.client, name)
        except FileNotFoundError as e:
            if "NoSuchBucket" in str(e):
                self._raise("delete", name, e)
        except _BACKEND_ERRORS as e:
            self._raise("delete", name, e)


def _info(name: str, meta: ObjectMeta) -> ObjectInfo:
    return ObjectInfo(name, int(meta["size"]), (meta["last_modified"] - _EPOCH) // _MS)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _is_connection_error(text: str) -> bool:
    lowered = text.lower()
    return any(
        marker in lowered
        for marker in ("error sending request", "connect", "timed out", "timeout", "dns error")
    )


def _connection_detail(text: str) -> str:
    lowered = text.lower()
    if "refused" in lowered:
        return "connection refused"
    if "timed out" in lowered or "timeout" in lowered:
        return "timed out"
    if "dns" in lowered:
        return "name not resolved"
    return "connection failed"
