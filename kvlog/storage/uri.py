"""Store URIs: what a URI names, checked before anything is opened or created.

A store is a local directory (a plain path, or ``file:///abs/dir``, ``file://localhost/abs/dir``)
or an object-store prefix (``s3://bucket/prefix``, ``s3a://…``). Anything else is refused with
:class:`~kvlog.errors.ConfigError` rather than read as something it may not mean: a NUL byte, text
that is not UTF-8, a ``file://`` URI naming another host or carrying a query or fragment (a
directory whose name holds ``?`` or ``#`` is written ``%3F`` / ``%23`` there), an ``s3://`` URI
without a bucket, an unknown scheme, a type that is not a path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from kvlog.errors import ConfigError

__all__ = ["StoreLocation", "check_location_text", "parse_store_uri", "OBJECT_SCHEMES"]

#: The schemes of object stores (through obstore, the ``s3`` extra).
OBJECT_SCHEMES = ("s3", "s3a")

_FORMS = "give a directory path, file:///absolute/path or s3://bucket/prefix"


@dataclass(frozen=True)
class StoreLocation:
    """Where a store URI points: ``directory`` for a local store, else None (an object store).

    ``text`` is the URI as given (as text). A local directory whose path climbs with ``..`` is
    given resolved, as the system would find it once it exists, so checking and creating it
    never makes the missing directory a ``..`` climbs out of.
    """

    text: str
    directory: Path | None


def parse_store_uri(uri: object) -> StoreLocation:
    """The location ``uri`` names, or :class:`~kvlog.errors.ConfigError` saying why it names none."""
    if isinstance(uri, os.PathLike):
        uri = os.fspath(uri)
    if not isinstance(uri, str):
        raise ConfigError(f"a store URI is a str or a path, not {type(uri).__name__}: {_FORMS}")
    if not uri:
        raise ConfigError(f"empty store URI: {_FORMS}")
    check_location_text(uri, f"store URI {uri!r}")
    parts = urlsplit(uri)
    scheme = parts.scheme
    if scheme == "" or (len(scheme) == 1 and os.name == "nt"):
        return StoreLocation(uri, _directory(uri))
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ConfigError(f"file URI {uri!r} names the host {parts.netloc!r}; use file:///absolute/path")
        if parts.query or parts.fragment or uri.endswith(("?", "#")):
            raise ConfigError(f"file URI {uri!r} has a query or fragment, which name nothing in a "
                              "directory (write ? as %3F and # as %23 in a directory name)")
        try:
            path = unquote(parts.path, errors="strict")
        except UnicodeDecodeError:
            raise ConfigError(f"file URI {uri!r} escapes bytes that are not UTF-8") from None
        check_location_text(path, f"store URI {uri!r}")
        if not path.startswith("/"):
            raise ConfigError(f"file URI {uri!r} does not name an absolute path; use file:///absolute/path")
        return StoreLocation(uri, _directory(path))
    if scheme in OBJECT_SCHEMES:
        if not parts.netloc:
            raise ConfigError(f"{uri!r} is not a valid {scheme}://bucket/prefix URI: it names no bucket")
        return StoreLocation(uri, None)
    raise ConfigError(f"unsupported URI scheme {scheme!r} in {uri!r}: {_FORMS}")


def check_location_text(text: str, what: str) -> None:
    """Refuse, as ``what`` (e.g. ``store URI '...'``), a location with a NUL byte or text that is
    not UTF-8 (a path's undecodable bytes): the metadata cache and object stores need text."""
    if "\x00" in text:
        raise ConfigError(f"{what} contains a NUL byte")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ConfigError(f"{what} is not valid UTF-8 (at character {e.start})") from None


def _directory(path: str) -> Path:
    """The directory ``path`` names; with a ``..`` component, resolved as the system would."""
    if ".." in Path(path).parts:
        return Path(os.path.realpath(path))
    return Path(path)
