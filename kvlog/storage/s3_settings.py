"""Connection settings of an S3 store: its URI, ``storage_options`` and the AWS environment.

Resolved once, when the storage is opened, into a frozen :class:`S3Settings`; every
bad option is a :class:`~kvlog.errors.ConfigError` that names it. Secrets are kept
out of ``repr`` and of every message.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from kvlog.errors import ConfigError, StorageError
from kvlog.storage.base import check_name

if TYPE_CHECKING:
    from obstore.store import S3Credential

__all__ = ["KNOWN_OPTIONS", "S3Settings", "StaticCredentials", "resolve_settings"]

#: Options :class:`ObjectStoreStorage` understands; anything else is a ConfigError.
KNOWN_OPTIONS = frozenset(
    {
        "endpoint_override",
        "access_key",
        "secret_key",
        "session_token",
        "region",
        "allow_http",
        "virtual_hosted_style_request",
        "timeout",
        "connect_timeout",
        "stream_timeout",
        "retries",
        "retry_timeout",
    }
)

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|sec|m|min|h)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_CREDENTIAL_HELP = (
    "pass storage_options access_key and secret_key (plus session_token for temporary "
    "credentials), or set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (plus AWS_SESSION_TOKEN)"
)


def _parse_duration(key: str, value: object) -> timedelta:
    """``30``, ``2.5``, ``"30s"``, ``"500ms"``, ``"2m"``, ``"1h"`` or a timedelta."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION_RE.match(value)):
        seconds = float(m.group(1)) * _DURATION_UNITS[m.group(2) or "s"]
    else:
        raise ConfigError(
            f"storage option {key}={value!r} is not a duration: use seconds or a string like '30s', '500ms', '2m'"
        )
    if seconds <= 0:
        raise ConfigError(f"storage option {key}={value!r} must be positive")
    return timedelta(seconds=seconds)


def _parse_bool(key: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no"):
        return value.lower() in ("true", "1", "yes")
    raise ConfigError(f"storage option {key}={value!r} must be true or false")


def _parse_str(key: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"storage option {key} must be a non-empty string")
    return value


@dataclass(frozen=True)
class S3Settings:
    """Resolved connection settings; secrets are kept out of ``repr``."""

    bucket: str
    prefix: str
    endpoint: str | None
    region: str
    access_key: str | None = field(repr=False)
    secret_key: str | None = field(repr=False)
    session_token: str | None = field(repr=False)
    allow_http: bool
    virtual_hosted_style_request: bool
    timeout: timedelta
    connect_timeout: timedelta
    stream_timeout: timedelta
    retries: int
    retry_timeout: timedelta

    def secrets(self) -> list[str]:
        return [s for s in (self.secret_key, self.session_token) if s]


class StaticCredentials:
    """A credential provider that hands obstore fixed keys (and ignores the environment)."""

    def __init__(self, access_key: str, secret_key: str, session_token: str | None) -> None:
        self._credential: S3Credential = {
            "access_key_id": access_key,
            "secret_access_key": secret_key,
            "token": session_token,
            "expires_at": None,
        }

    def __call__(self) -> S3Credential:
        return self._credential

    def __repr__(self) -> str:
        return "StaticCredentials(***)"


def resolve_settings(uri: str, options: Mapping[str, Any], env: Mapping[str, str]) -> S3Settings:
    parsed = urlparse(uri)
    if parsed.scheme not in ("s3", "s3a"):
        raise ConfigError(f"{uri!r} is not an s3:// URI")
    if parsed.username is not None or parsed.password is not None:
        raise ConfigError(
            "do not put credentials in the store URI: pass them as storage_options access_key/secret_key"
        )
    bucket = parsed.hostname or ""
    if not bucket or parsed.port is not None or parsed.query or parsed.fragment:
        raise ConfigError(f"{uri!r} is not a valid s3://bucket/prefix URI")
    prefix = parsed.path.strip("/")
    if prefix:
        try:
            check_name(prefix)
        except StorageError as e:
            raise ConfigError(f"invalid prefix {prefix!r} in {uri!r}") from e

    unknown = sorted(set(options) - KNOWN_OPTIONS)
    if unknown:
        raise ConfigError(
            f"unknown storage_options {unknown} for {uri!r}; known: {sorted(KNOWN_OPTIONS)}"
        )

    endpoint: str | None = None
    if options.get("endpoint_override") is not None:
        endpoint = _parse_str("endpoint_override", options["endpoint_override"])
    else:
        endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None
    if endpoint is not None:
        endpoint = endpoint.rstrip("/")
        if urlparse(endpoint).scheme not in ("http", "https"):
            raise ConfigError(
                f"endpoint {endpoint!r} must start with http:// or https://, e.g. http://127.0.0.1:8333"
            )

    region = (
        _parse_str("region", options["region"])
        if options.get("region") is not None
        else env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"
    )

    access_key = options.get("access_key")
    secret_key = options.get("secret_key")
    session_token = options.get("session_token")
    if access_key is not None or secret_key is not None:
        if access_key is None or secret_key is None:
            raise ConfigError(
                f"storage_options for {uri!r} give only one of access_key and secret_key: give both"
            )
        access_key = _parse_str("access_key", access_key)
        secret_key = _parse_str("secret_key", secret_key)
        if session_token is not None:
            session_token = _parse_str("session_token", session_token)
    elif session_token is not None:
        raise ConfigError(
            f"storage_options for {uri!r} give session_token without access_key and secret_key"
        )
    else:
        access_key = env.get("AWS_ACCESS_KEY_ID") or None
        secret_key = env.get("AWS_SECRET_ACCESS_KEY") or None
        session_token = env.get("AWS_SESSION_TOKEN") or None
        if (access_key is None) != (secret_key is None):
            raise ConfigError(
                f"only one of AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY is set: {_CREDENTIAL_HELP}"
            )
        delegated = any(
            env.get(var)
            for var in (
                "AWS_WEB_IDENTITY_TOKEN_FILE",
                "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                "AWS_CONTAINER_CREDENTIALS_FULL_URI",
            )
        )
        if access_key is None and not delegated:
            raise ConfigError(f"no S3 credentials for {uri!r}: {_CREDENTIAL_HELP}")

    allow_http = (
        _parse_bool("allow_http", options["allow_http"])
        if options.get("allow_http") is not None
        else endpoint is not None and endpoint.startswith("http://")
    )
    if endpoint is not None and endpoint.startswith("http://") and not allow_http:
        raise ConfigError(f"endpoint {endpoint!r} is plain http but allow_http is false")
    virtual = _parse_bool(
        "virtual_hosted_style_request", options.get("virtual_hosted_style_request", False)
    )
    timeout = _parse_duration("timeout", options.get("timeout", "30s"))
    connect_timeout = _parse_duration(
        "connect_timeout", options.get("connect_timeout", min(timeout, timedelta(seconds=5)))
    )
    stream_timeout = _parse_duration("stream_timeout", options.get("stream_timeout", "1h"))
    retries = options.get("retries", 5)
    if isinstance(retries, str) and retries.isdigit():  # options from Spark (.option) are strings
        retries = int(retries)
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
        raise ConfigError(f"storage option retries={retries!r} must be an integer >= 0")
    retry_timeout = _parse_duration("retry_timeout", options.get("retry_timeout", "2m"))
    return S3Settings(
        bucket=bucket,
        prefix=prefix,
        endpoint=endpoint,
        region=region,
        access_key=access_key,
        secret_key=secret_key,
        session_token=session_token,
        allow_http=allow_http,
        virtual_hosted_style_request=virtual,
        timeout=timeout,
        connect_timeout=connect_timeout,
        stream_timeout=stream_timeout,
        retries=retries,
        retry_timeout=retry_timeout,
    )
