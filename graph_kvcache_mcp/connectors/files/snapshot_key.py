"""The key that signs `since` snapshot ids (`domain/snapshot_ids.py`).

Derived from the bundle secret (`GRAPH_KVCACHE_BUNDLE_SECRET`, else `<data dir>/bundle-secret`),
under a label of its own so a snapshot id can never pass for a bundle signature: every server of
one data dir (or sharing the variable) reads another's ids, across restarts, and no other can.
"""

from __future__ import annotations

import hashlib
import hmac

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.files.bundle_secret import bundle_secret

_LABEL = b"graph-kvcache-mcp snapshot ids v1"


def snapshot_key(settings: Settings) -> bytes:
    """The signing key for snapshot ids.

    Raises:
        ConfigError: the bundle secret file cannot be used (see `bundle_secret`).
    """
    return hmac.new(bundle_secret(settings), _LABEL, hashlib.sha256).digest()
