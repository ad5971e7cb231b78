"""Pure encodings of everything kvlog stores: data files, commits, identity, bitmaps.

No I/O happens here: functions take and return bytes.
"""

from kvlog.format.bitmap import decode_offsets, encode_offsets
from kvlog.format.checksum import crc32c
from kvlog.format.commit import (
    COMMIT_KINDS,
    BatchEntry,
    Commit,
    FileEntry,
    decode_commit,
    encode_commit,
    file_from_json,
    file_to_json,
)
from kvlog.format.datafile import (
    SCHEMA,
    BatchLocation,
    DataFileWriter,
    decode_batch,
    make_record_batch,
    read_data_file,
)
from kvlog.format.envelope import FORMAT_VERSION, decode_document, encode_document
from kvlog.format.identity import (
    IDENTITY_NAME,
    STORE_FORMAT,
    Identity,
    decode_identity,
    encode_identity,
)
from kvlog.format.producer_state import (
    BatchMeta,
    PartitionProducerState,
    ProducerState,
    producer_from_json,
    producer_to_json,
)

__all__ = [
    "COMMIT_KINDS", "FORMAT_VERSION", "IDENTITY_NAME", "SCHEMA", "STORE_FORMAT",
    "BatchEntry", "BatchLocation", "BatchMeta", "Commit", "DataFileWriter", "FileEntry", "Identity",
    "PartitionProducerState", "ProducerState",
    "crc32c", "decode_batch", "decode_commit", "decode_document", "decode_identity",
    "decode_offsets", "encode_commit", "encode_document", "encode_identity", "encode_offsets",
    "file_from_json", "file_to_json", "make_record_batch", "producer_from_json",
    "producer_to_json", "read_data_file",
]
