"""The stored form of a bundle: versioned canonical JSON with a checksum. Pure.

    {"checksum": "sha256:<hex>" | "hmac-sha256:<hex>", "format": "ctxbundle/1", "payload": {...}}

The checksum covers the canonical bytes of `payload`. With a bundle secret configured it is an
HMAC, and unsigned entries are refused (anyone can write to the store; only we hold the secret).
Reading never raises: anything corrupt, foreign, from another format or for another key comes
back as `RejectedBundle` with the reason, which the cache treats as a miss.
"""

from __future__ import annotations

import hmac
import json
from dataclasses import dataclass
from typing import TypeAlias

from pydantic import ValidationError

from graph_kvcache_mcp.domain.bundle.canonical import canonical_json, digest_hex
from graph_kvcache_mcp.domain.bundle.compiled import FORMAT_VERSION, Bundle

_ENVELOPE_FIELDS = frozenset({"checksum", "format", "payload"})


@dataclass(frozen=True, slots=True)
class RejectedBundle:
    """A stored value we will not use; `reason` says why (never echoes the secret)."""

    reason: str


Decoded: TypeAlias = Bundle | RejectedBundle


def _checksum(payload: bytes, secret: bytes | None) -> str:
    scheme = "sha256" if secret is None else "hmac-sha256"
    return f"{scheme}:{digest_hex(payload, secret)}"


def encode_bundle(bundle: Bundle, *, secret: bytes | None = None) -> bytes:
    """The bytes to store: deterministic for an equal bundle and secret."""
    payload = bundle.model_dump(mode="json")
    return canonical_json(
        {
            "checksum": _checksum(canonical_json(payload), secret),
            "format": FORMAT_VERSION,
            "payload": payload,
        }
    )


def decode_bundle(blob: bytes, *, expected_key: str, secret: bytes | None = None) -> Decoded:
    """The bundle stored under `expected_key`, or `RejectedBundle(reason)`; never raises."""
    try:
        envelope = json.loads(blob)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return RejectedBundle("stored value is not JSON")
    if not isinstance(envelope, dict) or set(envelope) != _ENVELOPE_FIELDS:
        return RejectedBundle("stored value is not a bundle envelope")
    if envelope["format"] != FORMAT_VERSION:
        shown = str(envelope["format"])[:40]
        return RejectedBundle(f"stored format {shown!r} is not {FORMAT_VERSION!r}")
    checksum = envelope["checksum"]
    if not isinstance(checksum, str) or not isinstance(envelope["payload"], dict):
        return RejectedBundle("stored value is not a bundle envelope")
    scheme = checksum.partition(":")[0]
    if secret is not None and scheme != "hmac-sha256":
        return RejectedBundle("entry is not signed, and a bundle secret is configured")
    if secret is None and scheme != "sha256":
        return RejectedBundle(
            f"entry uses checksum {scheme!r}; configure the bundle secret to read it"
        )
    try:
        payload = canonical_json(envelope["payload"])
    except (ValueError, TypeError, RecursionError):
        return RejectedBundle("stored payload cannot be re-encoded")
    if not hmac.compare_digest(checksum, _checksum(payload, secret)):
        return RejectedBundle("checksum does not match the payload (corrupt or tampered entry)")
    try:
        bundle = Bundle.model_validate_json(payload)
    except ValidationError as exc:
        return RejectedBundle(
            f"payload is not a {FORMAT_VERSION} bundle ({exc.error_count()} errors)"
        )
    if bundle.key != expected_key:
        return RejectedBundle("entry belongs to another key (foreign entry)")
    return bundle
