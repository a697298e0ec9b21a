"""Bytes at the edge: strict base64 and content digests. Pure: no I/O."""

from __future__ import annotations

import base64
import binascii
import hashlib

from graph_kvcache_mcp.errors import InvalidValue


def sha256_hex(value: bytes) -> str:
    return hashlib.sha256(value).hexdigest()


def decode_b64_strict(text: str) -> bytes:
    """Decode standard base64 (RFC 4648 alphabet, padded); anything else is refused.

    Lenient decoders drop stray characters and store different bytes than the caller meant.

    Raises:
        InvalidValue: names the problem (URL-safe alphabet, bad padding, stray characters).
    """
    if "-" in text or "_" in text:
        raise InvalidValue(
            "value_b64 uses the URL-safe alphabet ('-' or '_'); send standard base64 "
            "('+' and '/', padded with '=')"
        )
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise InvalidValue(
            f"value_b64 is not valid standard base64 ({exc}); encode the bytes with "
            "base64.b64encode and send the padded text without line breaks"
        ) from None


def encode_b64(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")
