"""Snapshot ids that carry their own baseline: `<kind>-<body>.<mac>`, signed, so a `since` holds
across other sessions' calls and server restarts while the server keeps nothing.

The body is the snapshot's JSON, deflated and base64url-encoded; the mac is HMAC-SHA256 over the
kind and the body under a key of the data dir (`connectors/files/snapshot_key.py`), cut to 128
bits. An id is bounded (`MAX_ID_CHARS`, and the inflated JSON by `MAX_JSON_BYTES`) so a caller
cannot make the server inflate a bomb; a forged, altered or foreign id (another data dir's key)
fails the mac before anything is parsed.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import zlib

from graph_kvcache_mcp.errors import GraphKvcacheError, quoted

MAX_ID_CHARS = 16_384
MAX_JSON_BYTES = 262_144
_MAC_BYTES = 16


class SnapshotIdError(GraphKvcacheError, ValueError):
    """A `since` id this server cannot use: malformed, too long, of another kind, or not signed
    with this data dir's key."""


def seal(kind: str, payload: bytes, key: bytes) -> str:
    """The id for `payload` (a snapshot's JSON) of `kind`.

    Raises:
        SnapshotIdError: the payload is too large for an id (the caller keeps no baseline then).
    """
    body = _b64(zlib.compress(payload, 9))
    snapshot_id = f"{kind}-{body}.{_b64(_mac(kind, body, key))}"
    if len(payload) > MAX_JSON_BYTES or len(snapshot_id) > MAX_ID_CHARS:
        raise SnapshotIdError(
            f"a {kind} snapshot is too large for an id ({len(snapshot_id)} characters; "
            f"at most {MAX_ID_CHARS})"
        )
    return snapshot_id


def unseal(kind: str, snapshot_id: str, key: bytes, *, tool: str) -> bytes:
    """The payload `snapshot_id` carries, once its kind and mac check out.

    Raises:
        SnapshotIdError: says what is wrong and to call `tool` without since for a fresh id.
    """
    again = f"call {tool} without since and pass the snapshot_id it returns"
    given = quoted(snapshot_id, limit=60)
    if len(snapshot_id) > MAX_ID_CHARS:
        raise SnapshotIdError(
            f"since is {len(snapshot_id)} characters, longer than any snapshot id "
            f"({MAX_ID_CHARS}): {again}"
        )
    given_kind, _, rest = snapshot_id.partition("-")
    if given_kind != kind and rest:
        raise SnapshotIdError(
            f"since names a {given_kind!r} snapshot, not one of {tool} ({kind!r}): {again}"
        )
    body, dot, mac = rest.rpartition(".")
    if given_kind != kind or not dot or not body:
        raise SnapshotIdError(
            f"since={given} is not a snapshot this server holds (not a {tool} snapshot id): {again}"
        )
    try:
        given_mac = _unb64(mac)
    except ValueError:
        given_mac = b""
    if not hmac.compare_digest(given_mac, _mac(kind, body, key)):
        raise SnapshotIdError(
            f"since={given} is not a snapshot this server holds (its signature does not match "
            f"this data dir's key: altered, or issued under another data dir): {again}"
        )
    inflater = zlib.decompressobj()
    try:
        payload = inflater.decompress(_unb64(body), MAX_JSON_BYTES)
    except (ValueError, zlib.error) as exc:  # signed but unreadable: a key reused elsewhere
        raise SnapshotIdError(f"since={given} cannot be read: {again}") from exc
    if inflater.unconsumed_tail:
        raise SnapshotIdError(f"since={given} holds too large a snapshot: {again}")
    return payload


def _mac(kind: str, body: str, key: bytes) -> bytes:
    return hmac.new(key, f"{kind}-{body}".encode("ascii"), hashlib.sha256).digest()[:_MAC_BYTES]


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    """Raises: ValueError: not base64url as `_b64` writes it (one spelling per id: the decoder
    alone would also take stray characters and other trailing bits for the same bytes)."""
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise ValueError(str(exc)) from exc
    if _b64(raw) != text:
        raise ValueError("not canonical base64url")
    return raw
