"""Canonical JSON and digests: one byte encoding for one value. Pure.

Sorted keys, no whitespace, UTF-8 (not ASCII escapes), no NaN or infinity. Floats print as
Python's shortest round-trip repr, so equal floats always encode equally.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any


def canonical_json(value: Any) -> bytes:
    """Raises ValueError for NaN/infinity and TypeError for values JSON cannot hold."""
    text = json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
    return text.encode("utf-8")


def digest_hex(data: bytes, secret: bytes | None = None) -> str:
    """SHA-256 of `data`, or HMAC-SHA256 under `secret` when one is configured."""
    if secret is None:
        return hashlib.sha256(data).hexdigest()
    return hmac.new(secret, data, hashlib.sha256).hexdigest()
