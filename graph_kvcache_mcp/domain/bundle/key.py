"""The bundle cache key: content-addressed, so an edit to any evidence changes it. Pure.

    ctxbundle:<hex digest of the canonical JSON of>
        format          the stored/rendered format version
        query_sha256    the query (lexical relevance depends on it)
        params          every parameter (policy_version, token_budget, top_k, diversity_lambda,
                        weights, freshness_half_life_days, as_of)
        token_counter   which tokenizer fitted the budget
        items           sorted (id, sha256 of the item's JSON: text, kind, source_refs,
                        confidence, observed_at, relevance, relations)

The digest is SHA-256, or HMAC-SHA256 when a bundle secret is configured: then nobody without the
secret can compute a key, so nobody can plant an entry where we will look (the engine keeps the
first value written under a key forever).
"""

from __future__ import annotations

import hashlib

from graph_kvcache_mcp.domain.bundle.canonical import canonical_json, digest_hex
from graph_kvcache_mcp.domain.bundle.compiled import FORMAT_VERSION
from graph_kvcache_mcp.domain.bundle.models import BundleRequest, EvidenceItem

KEY_PREFIX = "ctxbundle:"


def item_digest(item: EvidenceItem) -> str:
    """SHA-256 over every field of the item: anything that can change the bundle or its text.

    The bytes are the validated item's compact JSON, fields in declaration order: as canonical as
    the sorted form for a fixed model (validation already normalized instants and relations) and
    three times faster, which matters because a cache hit pays this for every candidate.
    """
    return hashlib.sha256(item.model_dump_json().encode("utf-8")).hexdigest()


def key_material(request: BundleRequest, *, token_counter: str) -> bytes:
    """The canonical bytes the key digests (exposed so tests and docs can show them)."""
    return canonical_json(
        {
            "format": FORMAT_VERSION,
            "query_sha256": hashlib.sha256(request.query.encode("utf-8")).hexdigest(),
            "params": request.params.model_dump(mode="json"),
            "token_counter": token_counter,
            "items": sorted([item.id, item_digest(item)] for item in request.items),
        }
    )


def bundle_key(request: BundleRequest, *, token_counter: str, secret: bytes | None = None) -> str:
    """`ctxbundle:` + 64 hex digits; equal for equal content in any item order."""
    return KEY_PREFIX + digest_hex(key_material(request, token_counter=token_counter), secret)
