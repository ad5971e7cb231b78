"""The identity file ``kvlog.json``: written with put-if-absent when a store is created, and
rewritten once, with the same store and a newer format version, when a store of an older
format is first opened for writing (an older kvlog then refuses it instead of misreading it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvlog.errors import CorruptDataError, InvalidRecordError
from kvlog.format.envelope import decode_document, encode_document

__all__ = ["Identity", "IDENTITY_NAME", "STORE_FORMAT", "STORE_FORMATS", "encode_identity", "decode_identity"]

#: The store format this kvlog writes: 2, whose commits may carry a small flush's records.
STORE_FORMAT = 2
#: The store formats this kvlog opens. A format-1 store is upgraded when it is first opened
#: for writing: its identity is rewritten with format 2 before any commit of format 2 lands.
STORE_FORMATS = (1, 2)

IDENTITY_NAME = "kvlog.json"


@dataclass(frozen=True)
class Identity:
    """What never changes about a store."""

    store_uuid: str
    partitions: int
    created_ms: int
    fingerprint_seed: int
    """Seeds the compactor's key fingerprints, so nobody can precompute colliding keys."""
    format_version: int = STORE_FORMAT


#: ``(field, low, high)``: the integer fields of an identity and their ranges (partitions are
#: 16-bit in the metadata cache's keys; the seed is an unsigned 64-bit number).
_INTS = (("partitions", 1, 2**16 + 1), ("created_ms", -(2**63), 2**63), ("fingerprint_seed", 0, 2**64),
         ("format_version", 0, 2**63))


def _check_identity(name: str, body: dict[str, Any]) -> None:
    """The one set of rules an identity obeys: checked on what is read and on what is written."""
    uuid = body.get("uuid")
    if not isinstance(uuid, str) or not uuid:
        raise CorruptDataError(name, "malformed identity (its uuid is not a string)")
    for key, low, high in _INTS:
        value = body.get(key)
        if type(value) is not int or not low <= value < high:
            raise CorruptDataError(name, f"malformed identity ({key} is not an integer in [{low}, {high}))")
    if body["format_version"] not in STORE_FORMATS:
        raise CorruptDataError(
            name,
            f"unknown format version {body['format_version']} of the store "
            f"(this kvlog reads versions {STORE_FORMATS[0]} to {STORE_FORMATS[-1]}); upgrade kvlog",
        )


def encode_identity(identity: Identity) -> bytes:
    """The bytes of ``kvlog.json``; an identity :func:`decode_identity` would refuse is an
    :class:`~kvlog.errors.InvalidRecordError` and is not encoded."""
    body: dict[str, Any] = {
        "uuid": identity.store_uuid, "partitions": identity.partitions,
        "created_ms": identity.created_ms, "fingerprint_seed": identity.fingerprint_seed,
        "format_version": identity.format_version,
    }
    try:
        _check_identity(IDENTITY_NAME, body)
    except CorruptDataError as e:
        raise InvalidRecordError(f"an identity kvlog could not read back is not written: {e.reason}") from None
    return encode_document("identity", body)


def decode_identity(data: bytes, name: str = IDENTITY_NAME) -> Identity:
    """The identity in ``data``; raises ``CorruptDataError`` naming ``name``."""
    body = decode_document(name, data, "identity")
    _check_identity(name, body)
    return Identity(store_uuid=body["uuid"], partitions=body["partitions"], created_ms=body["created_ms"],
                    fingerprint_seed=body["fingerprint_seed"], format_version=body["format_version"])
