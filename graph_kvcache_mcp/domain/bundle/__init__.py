"""Context bundles: evidence selected under a token budget and rendered as a stable prompt prefix.

Pure: no I/O, no clock, no environment. `compile_bundle` selects; `bundle_key` names the result
by its content; `encode_bundle`/`decode_bundle` store and read it back; `Bundle.text()` and
`Bundle.as_prompt_messages()` render it, byte-identically for a fresh and a cached bundle;
`cache_verdict` says what a compile through the store reports and counts.
"""

from graph_kvcache_mcp.domain.bundle.cache import (
    CacheState,
    CacheVerdict,
    Lookup,
    StoredState,
    StoreOff,
    cache_verdict,
    join_notes,
    needs_store,
)
from graph_kvcache_mcp.domain.bundle.codec import (
    Decoded,
    RejectedBundle,
    decode_bundle,
    encode_bundle,
)
from graph_kvcache_mcp.domain.bundle.compile import budget_parts, compile_bundle
from graph_kvcache_mcp.domain.bundle.compiled import (
    FORMAT_VERSION,
    Bundle,
    Citation,
    ProofEdge,
    SelectedItem,
)
from graph_kvcache_mcp.domain.bundle.key import KEY_PREFIX, bundle_key, key_material
from graph_kvcache_mcp.domain.bundle.models import (
    RELATION_TYPES,
    BundleParams,
    BundleRequest,
    EvidenceItem,
    Relation,
    RelationType,
    ScoreWeights,
)
from graph_kvcache_mcp.domain.bundle.render import DEFAULT_PREAMBLE, ChatMessage
from graph_kvcache_mcp.domain.bundle.tokens import (
    EstimateCounter,
    PrecountedCounter,
    TokenCounter,
)

__all__ = [
    "DEFAULT_PREAMBLE",
    "FORMAT_VERSION",
    "KEY_PREFIX",
    "RELATION_TYPES",
    "Bundle",
    "BundleParams",
    "BundleRequest",
    "CacheState",
    "CacheVerdict",
    "ChatMessage",
    "Citation",
    "Decoded",
    "EstimateCounter",
    "EvidenceItem",
    "Lookup",
    "PrecountedCounter",
    "ProofEdge",
    "RejectedBundle",
    "Relation",
    "RelationType",
    "ScoreWeights",
    "SelectedItem",
    "StoreOff",
    "StoredState",
    "TokenCounter",
    "budget_parts",
    "bundle_key",
    "cache_verdict",
    "compile_bundle",
    "decode_bundle",
    "encode_bundle",
    "join_notes",
    "key_material",
    "needs_store",
]
