"""A prompt's LMCache chunk keys and engine keys, computed offline from its token ids. Pure: no I/O.

LMCache's MP server names each whole chunk of a prompt by a rolling hash over the token ids (its
`TokenHasher`, lmcache 0.5.6), and our `native_plugin` adapter stores that chunk in the engine
under `domain.lmcache.keys.engine_key` of the chunk's `ObjectKey` string:

    NONE  = blake3(int64_be(0) || uint32_be(0))
    h_k   = blake3(h_{k-1} || tokens[k*C : (k+1)*C] as uint32_be)    (whole chunks; h_{-1} = NONE)
    key_k = f"{model}@{kv_rank:08x}@{object_group:x}@{h_k.hex()}" (+ f"@{salt}" when salted)

So whether the engine (L2) holds a prompt's leading chunks can be asked with HEAD on computed
keys, with no coordinator and no counter moving. Only blake3 is seed-free: LMCache seeds the other
algorithms (`sha256_cbor`, `builtin`) from vLLM's NONE hash, which depends on `PYTHONHASHSEED`
and vLLM's version, so for those the keys are `KeysUnknown` with the reason.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from graph_kvcache_mcp.domain.lmcache.keys import DEFAULT_NAMESPACE, check_namespace, engine_keys

DEFAULT_CHUNK_SIZE = 256
SEED_FREE_HASH = "blake3"
SINGLE_PROCESS_KV_RANK = 0x01000100
"""`(world_size<<24)|(global_rank<<16)|(local_world_size<<8)|local_rank` for one worker."""
_NONE_SEED = struct.pack(">qI", 0, 0)  # LMCache hashes (prefix 0, tokens (0,)) for NONE


@dataclass(frozen=True)
class ChunkScheme:
    """What names a chunk: the server's chunk size and hash, and the key's other fields."""

    model: str
    chunk_size: int = DEFAULT_CHUNK_SIZE
    hash_algorithm: str = SEED_FREE_HASH
    kv_rank: int = SINGLE_PROCESS_KV_RANK
    object_group: int = 0
    cache_salt: str = ""
    namespace: str = DEFAULT_NAMESPACE

    def __post_init__(self) -> None:
        if not self.model or "@" in self.model:
            raise ValueError(f"model name {self.model!r} cannot name an LMCache chunk (no '@')")
        if self.chunk_size < 1:
            raise ValueError(f"chunk size {self.chunk_size} must be a positive token count")
        if "@" in self.cache_salt:
            raise ValueError("a cache salt cannot contain '@'")
        check_namespace(self.namespace)


@dataclass(frozen=True)
class ChunkKey:
    """One whole chunk of a prompt: the tokens it ends at, its LMCache key and its engine key."""

    end_token: int
    lmcache_key: str
    engine_key: str


@dataclass(frozen=True)
class KeysUnknown:
    """The keys cannot be computed offline; `reason` says why and what would tell instead."""

    reason: str


def chunk_hashes(tokens: Sequence[int], *, chunk_size: int) -> list[bytes]:
    """The blake3 rolling hash of each whole `chunk_size`-token chunk of `tokens`, in order.

    Raises:
        ValueError: a token id outside 0..2**32-1 (LMCache packs them as uint32).
    """
    import blake3  # only this computation needs it; keeps the import off the server's start

    prefix = blake3.blake3(_NONE_SEED).digest()
    out: list[bytes] = []
    for start in range(0, len(tokens) - chunk_size + 1, chunk_size):
        chunk = tokens[start : start + chunk_size]
        try:
            packed = struct.pack(f">{len(chunk)}I", *chunk)
        except struct.error as exc:
            raise ValueError(f"token ids must be 0..4294967295 ({exc})") from exc
        prefix = blake3.blake3(prefix + packed).digest()
        out.append(prefix)
    return out


def prompt_chunk_keys(tokens: Sequence[int], scheme: ChunkScheme) -> list[ChunkKey] | KeysUnknown:
    """Every whole chunk's keys for a prompt of `tokens` (all ids from position 0).

    Raises:
        ValueError: a token id LMCache could not hash.
    """
    if scheme.hash_algorithm != SEED_FREE_HASH:
        return KeysUnknown(
            f"the LMCache server hashes with {scheme.hash_algorithm!r}, seeded from vLLM's "
            "NONE hash (PYTHONHASHSEED, vLLM version): only blake3 keys can be computed offline; "
            "ask the coordinator's directory instead"
        )
    salt = f"@{scheme.cache_salt}" if scheme.cache_salt else ""
    head = f"{scheme.model}@{scheme.kv_rank:08x}@{scheme.object_group:x}@"
    hashes = chunk_hashes(tokens, chunk_size=scheme.chunk_size)
    names = [f"{head}{digest.hex()}{salt}" for digest in hashes]
    stored = engine_keys(names, namespace=scheme.namespace) if names else []
    return [
        ChunkKey(end_token=(index + 1) * scheme.chunk_size, lmcache_key=name, engine_key=key)
        for index, (name, key) in enumerate(zip(names, stored, strict=True))
    ]


def leading_tokens(keys: Sequence[ChunkKey], present: Sequence[bool]) -> int:
    """The leading prompt tokens whose chunks are all present (LMCache loads a prefix only)."""
    held = 0
    for key, here in zip(keys, present, strict=True):
        if not here:
            break
        held = key.end_token
    return held
