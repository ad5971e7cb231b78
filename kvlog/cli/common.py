"""What every command shares: the parser class, a store's arguments, and opening the store."""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

from kvlog.config import StoreConfig
from kvlog.errors import ConfigError, StorageBehindError, StoreNotFoundError
from kvlog.format.identity import IDENTITY_NAME
from kvlog.log.opening import CREATE_HINT, ON_STORAGE_BEHIND, REBUILD_HINT

__all__ = [
    "ExitCode", "Parser", "Subparsers", "one_line", "positive_count", "uri_arg", "storage_options_arg", "setting_arg",
    "add_store_arguments", "open_store", "cli_spelling", "require_store", "store_config",
    "stored_partitions",
]

#: The object :meth:`argparse.ArgumentParser.add_subparsers` returns, to which commands add parsers.
Subparsers = Any


class ExitCode(enum.IntEnum):
    """The exit codes of ``kvlog``: what a script calling it can tell apart without reading stderr.

    Documented in :mod:`kvlog.cli` and docs/cli.rst ("Errors and exit codes"); a command
    returns one of these, and :func:`kvlog.cli.main` maps every exception to one.
    """

    #: The command did what it was asked.
    OK = 0
    #: The command ran and its answer is no (as ``grep``'s 1): ``get`` of a key that is not
    #: there, ``check`` (or the demo's own checks) found problems.
    NEGATIVE = 1
    #: The command line itself is wrong (argparse's own code): a bad argument or option, bad
    #: hex, an unreadable ``--key-file``, and ``kvlog bench`` (not available in an install).
    USAGE = 2
    #: What the command names is not there: no store at the URI, no such named checkpoint or
    #: consumer group (:class:`~kvlog.errors.StoreNotFoundError` and its subclasses).
    NO_STORE = 3
    #: Any other failure: every other kvlog error (storage, corrupt data, read-only, a refused
    #: record or setting, a missing extra) and any other exception (a bug, an OS error).
    FAILURE = 4
    #: Interrupted by SIGINT (Ctrl-C): 128 + 2, as a shell reports it.
    INTERRUPTED = 130
    #: The output pipe was closed early (``kvlog scan URI | head``): 128 + SIGPIPE (13).
    BROKEN_PIPE = 141
    #: Stopped by SIGTERM (``consume`` stops cleanly on it): 128 + 15.
    TERMINATED = 143


class Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line on stderr and exit code 2."""

    def error(self, message: str) -> NoReturn:
        """Print ``<prog>: error: <message>`` as one line (the usage is under ``--help``) and exit 2."""
        self.exit(int(ExitCode.USAGE), f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines too) as one space: an error stays one line."""
    return " ".join(text.split())


def positive_count(text: str) -> int:
    """A count option (``--records N``, ``--limit N``): a whole number above zero, refused as a
    usage error otherwise (``0``, ``-5``, ``1.5``, ``many``)."""
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if count <= 0:
        raise argparse.ArgumentTypeError(f"{count} is not above zero")
    return count


def _require_utf8(arg: str) -> None:
    """A usage error naming where ``arg`` stops being UTF-8 text, if it does."""
    try:
        arg.encode("utf-8")
    except UnicodeEncodeError as e:
        raise argparse.ArgumentTypeError(f"{arg!r} is not valid UTF-8 (at character {e.start})") from None


def uri_arg(arg: str) -> str:
    """A store URI, refused before anything is created unless it is UTF-8 text.

    The metadata cache and object stores need the location as text, so a path that is not
    UTF-8 would fail only after its directory was made.
    """
    _require_utf8(arg)
    return arg


def storage_options_arg(text: str) -> dict[str, Any]:
    """``--storage-options``: a JSON object in UTF-8, refused as a usage error otherwise."""
    _require_utf8(text)
    try:
        options = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON: {e}") from None
    if not isinstance(options, dict):
        raise argparse.ArgumentTypeError(
            f"must be a JSON object such as '{{\"region\": \"us-east-1\"}}', not {type(options).__name__}")
    return options


_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


def setting_arg(text: str) -> tuple[str, Any]:
    """``--set NAME=VALUE``: a :class:`~kvlog.config.StoreConfig` setting and its typed value.

    The value is read as the setting's type: an integer (``1_000`` is allowed), a number, a
    boolean (true/false, yes/no, on/off, 1/0), ``none`` for an optional setting, or text.
    Ranges are checked when the store opens, all settings together.
    """
    name, sep, raw = text.partition("=")
    name = name.strip()
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
    kinds = {f.name: str(f.type) for f in dataclasses.fields(StoreConfig)}
    if name not in kinds:
        unknown: dict[str, Any] = {name: raw}
        try:
            StoreConfig.from_settings(None, **unknown)
        except ConfigError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    kind, value = kinds[name], raw.strip()
    try:
        if "None" in kind and value.lower() == "none":
            return name, None
        if kind == "bool":
            if value.lower() not in _TRUE + _FALSE:
                raise ValueError("not true or false")
            return name, value.lower() in _TRUE
        if kind.startswith("int"):
            return name, int(value)
        if kind == "float":
            return name, float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{name}={raw!r}: must be {kind.replace(' | None', ' or none')}") from None
    return name, value


def add_store_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments every store command takes: the URI, ``--storage-options``, ``--set`` and
    ``--on-storage-behind``."""
    parser.add_argument("uri", type=uri_arg, help="the store: a directory, file:///abs/dir or s3://bucket/prefix")
    parser.add_argument("--storage-options", type=storage_options_arg, metavar="JSON",
                        help='JSON object of object-store options, e.g. \'{"region": "us-east-1"}\'')
    parser.add_argument("--set", dest="settings", type=setting_arg, action="append", default=[],
                        metavar="NAME=VALUE",
                        help="a store setting (any StoreConfig field, e.g. cache_bytes=1_000_000); repeatable")
    parser.add_argument("--on-storage-behind", choices=ON_STORAGE_BEHIND, default="raise",
                        help="when the cache applied commits the storage root no longer holds (restored "
                             "from an older copy): raise (the default) refuses; rebuild rebuilds the "
                             "cache from storage, losing them")


def settings_of(args: argparse.Namespace) -> dict[str, Any]:
    """The ``--set`` settings of a command (the last of a repeated name wins)."""
    return dict(args.settings)


def open_store(args: argparse.Namespace, **kwargs: Any) -> Any:
    """The store a command works on; no background compaction unless ``--set`` asks for it.

    :func:`kvlog.open` decides where a store may be created (a missing or empty directory);
    a command's ``--create`` asks for one anywhere. Its refusals name the command's flags.
    """
    import kvlog

    settings: dict[str, Any] = {"background_compaction": False, **settings_of(args), **kwargs}
    if getattr(args, "create", False):
        settings["create"] = True
    with cli_spelling():
        return kvlog.open(args.uri, storage_options=args.storage_options,
                          on_storage_behind=args.on_storage_behind, **settings)


@contextmanager
def cli_spelling() -> Iterator[None]:
    """Re-raise the open errors that say how to go on with the command line's flags instead
    of :func:`kvlog.open`'s arguments (``--create``, ``--on-storage-behind rebuild``)."""
    try:
        yield
    except StorageBehindError as e:
        raise StorageBehindError(e.name, _flags(e.reason)) from None
    except StoreNotFoundError as e:
        raise type(e)(_flags(str(e))) from None


def _flags(message: str) -> str:
    return (message.replace(REBUILD_HINT, "give --on-storage-behind rebuild to rebuild the cache "
                                          "from storage without them")
            .replace(CREATE_HINT, "give --create to make a store there"))


def require_store(uri: str, storage_options: dict[str, Any] | None) -> None:
    """Raise :class:`~kvlog.errors.StoreNotFoundError` unless a kvlog store is at ``uri``.

    Looks for the store's identity object only: no cache, no producer, nothing created. A
    job that starts something costly (a JVM) checks this first.
    """
    from kvlog.storage import open_storage, parse_store_uri

    directory = parse_store_uri(uri).directory
    if directory is not None and not directory.is_dir():
        what = "is not a directory" if os.path.lexists(directory) else "does not exist"
        raise StoreNotFoundError(f"no kvlog store at {uri!r}: it {what}")
    storage = open_storage(uri, storage_options)
    try:
        if not storage.exists(IDENTITY_NAME):
            raise StoreNotFoundError(f"no kvlog store at {uri!r} (no {IDENTITY_NAME})")
    finally:
        storage.close()


def store_config(args: argparse.Namespace) -> StoreConfig:
    """The settings :func:`open_store` opens the store with, checked without opening it.

    A command checks its input against these (a key's length against ``max_key_bytes``...)
    before it opens the store, so input it refuses changes no file: opening alone writes the
    metadata cache. A setting out of range is a :class:`~kvlog.errors.ConfigError` here.
    """
    return StoreConfig.from_settings(**{"background_compaction": False, **settings_of(args)})


def stored_partitions(uri: str, storage_options: dict[str, Any] | None) -> int | None:
    """The number of partitions of the store at ``uri``, or None if there is no store there.

    Read from the store's identity object through the storage layer alone: no cache is
    opened and no file or directory is made, so a command can refuse a partition the store
    does not have before it changes anything.
    """
    from kvlog.format.identity import decode_identity
    from kvlog.storage import open_storage, parse_store_uri

    directory = parse_store_uri(uri).directory
    if directory is not None and not directory.is_dir():
        return None
    storage = open_storage(uri, storage_options)
    try:
        try:
            data = storage.read(IDENTITY_NAME)
        except FileNotFoundError:
            return None
        return decode_identity(data).partitions
    finally:
        storage.close()
