"""Object names of the storage root. Keys and values never appear in them."""

from __future__ import annotations

__all__ = ["commit_name", "checkpoint_name", "data_file_name", "parse_log_name", "LOG_PREFIX", "DATA_PREFIX"]

LOG_PREFIX = "log/"
DATA_PREFIX = "data/"
_DIGITS = 20


def commit_name(version: int) -> str:
    """``log/<20-digit version>.json``."""
    return f"{LOG_PREFIX}{version:0{_DIGITS}d}.json"


def checkpoint_name(version: int) -> str:
    """``log/<20-digit version>.checkpoint.json``."""
    return f"{LOG_PREFIX}{version:0{_DIGITS}d}.checkpoint.json"


def data_file_name(level: int, file_id: str) -> str:
    """``data/<level>/<id>.arrow``."""
    return f"{DATA_PREFIX}{level}/{file_id}.arrow"


def parse_log_name(name: str) -> tuple[int, str] | None:
    """(version, "commit" | "checkpoint") of a name under ``log/``, or None for anything else."""
    if not name.startswith(LOG_PREFIX):
        return None
    rest = name[len(LOG_PREFIX):]
    digits, dot, suffix = rest.partition(".")
    if len(digits) != _DIGITS or not digits.isdigit() or not dot:
        return None
    if suffix == "json":
        return int(digits), "commit"
    if suffix == "checkpoint.json":
        return int(digits), "checkpoint"
    return None
