"""The identity file ``kvlog.json``: written once, with put-if-absent, when a store is created."""

from __future__ import annotations

from dataclasses import dataclass

from kvlog.errors import CorruptDataError
from kvlog.format.envelope import FORMAT_VERSION, decode_document, encode_document

__all__ = ["Identity", "IDENTITY_NAME", "encode_identity", "decode_identity"]

IDENTITY_NAME = "kvlog.json"


@dataclass(frozen=True)
class Identity:
    """What never changes about a store."""

    store_uuid: str
    partitions: int
    created_ms: int
    fingerprint_seed: int
    """Seeds the compactor's key fingerprints, so nobody can precompute colliding keys."""
    format_version: int = FORMAT_VERSION


def encode_identity(identity: Identity) -> bytes:
    """The bytes of ``kvlog.json``."""
    return encode_document(
        "identity",
        {
            "uuid": identity.store_uuid, "partitions": identity.partitions,
            "created_ms": identity.created_ms, "fingerprint_seed": identity.fingerprint_seed,
            "format_version": identity.format_version,
        },
    )


def decode_identity(data: bytes, name: str = IDENTITY_NAME) -> Identity:
    """The identity in ``data``; raises ``CorruptDataError`` naming ``name``."""
    body = decode_document(name, data, "identity")
    try:
        identity = Identity(
            store_uuid=str(body["uuid"]), partitions=int(body["partitions"]),
            created_ms=int(body["created_ms"]), fingerprint_seed=int(body["fingerprint_seed"]),
            format_version=int(body["format_version"]),
        )
    except (KeyError, TypeError, ValueError, OverflowError) as e:
        raise CorruptDataError(name, f"malformed identity ({e})") from None
    if identity.format_version != FORMAT_VERSION:
        raise CorruptDataError(
            name,
            f"unknown format version {identity.format_version} of the store "
            f"(this kvlog reads version {FORMAT_VERSION}); upgrade kvlog",
        )
    if identity.partitions < 1:
        raise CorruptDataError(name, "identity has no partitions")
    return identity
