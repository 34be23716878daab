"""Parsley's stamp for Python writers: the stamp header's codec (``codec``) and a producer
that stamps what it sends over ``confluent-kafka`` (``producer``), so that a Parsley stage
delivers a record only after the records its writer had consumed."""

from .codec import (
    LEGACY_STAMP_HEADER,
    STAMP_HEADER,
    Channel,
    DecodeError,
    Entry,
    InFlight,
    Sender,
    Stamp,
    decode,
    encode,
    is_stamp_header,
)

__all__ = [
    "LEGACY_STAMP_HEADER",
    "STAMP_HEADER",
    "Channel",
    "DecodeError",
    "Entry",
    "InFlight",
    "Sender",
    "Stamp",
    "decode",
    "encode",
    "is_stamp_header",
]
