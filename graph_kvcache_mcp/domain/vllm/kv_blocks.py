"""Keys and stored values for vLLM KV blocks kept in the engine. Pure: no I/O, no torch.

A block key is a content-addressed chain, one key per full block of `block_size` tokens:

    root      = sha256("vkv-root", scheme version, model identity digest, cache salt)
    digest[i] = sha256("vkv-block", digest[i-1] (root for i = 0), the block's token ids)
    key[i]    = "vkv1:" + hex(digest[i])

so a key names the whole prefix up to and including its block, for one model identity: the same
prefix on another vLLM process (or after a restart) gives the same keys; another model, dtype,
geometry, block size or KV layout gives other keys.

A stored value is self-describing and checksummed (see `encode_block`): a value written for another
identity or geometry, cut short, or corrupted decodes to `RejectedBlock(reason)`, never to bytes a
caller could scatter into a KV cache.
"""

from __future__ import annotations

import functools
import hashlib
import json
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

try:
    import crc32c
except ImportError as exc:  # vLLM's venv gets this package with --no-deps
    raise ImportError(
        "graph-kvcache-mcp's KV blocks need the crc32c package in this Python: "
        "pip install 'crc32c>=2.7' (docs/vllm-connector.md)"
    ) from exc

KEY_PREFIX = "vkv1:"
KEY_SCHEME_VERSION = 1
BLOB_MAGIC = b"GKVB"
BLOB_FORMAT_VERSION = 1
_PREFIX_STRUCT = struct.Struct(">4sBI")  # magic, format version, header length
_MAX_HEADER_BYTES = 64 * 1024
_TOKEN_STRUCT = "<%dq"  # token ids as little-endian int64, a fixed width whatever the vocab


class KvModelIdentity(BaseModel):
    """Everything that decides whether stored KV bytes fit a vLLM's KV cache.

    Two processes share blocks exactly when their identities are equal. The served model name
    stands for the weights: serve different weights under a different name.
    """

    model_config = ConfigDict(frozen=True)

    served_model: str = Field(min_length=1)
    architecture: str
    dtype: str = Field(description="Dtype of the KV cache entries (e.g. bfloat16).")
    num_layers: int = Field(ge=1)
    num_kv_heads: int = Field(ge=1, description="KV heads held by this rank.")
    head_size: int = Field(ge=1)
    head_size_v: int = Field(ge=1)
    block_size: int = Field(ge=1, description="Tokens per block.")
    page_bytes: int = Field(ge=1, description="Bytes of one layer's page for one block.")
    layout: str = Field(
        description="Device, attention backend, KV layout, kernel block, kernel ISA and cache "
        "dtype (`domain.vllm.engine_kv.device`, e.g. cpu:CPU_ATTN:LBHNC:kb32:vec:auto)."
    )
    tensor_parallel: str = Field("1/1", description="rank/size of the rank that holds the KV.")
    vllm_version: str
    kv_groups: str = Field(
        "",
        description="A hybrid's KV cache groups (kind, layers, state geometry); empty for one "
        "full-attention group.",
    )

    @property
    def digest(self) -> str:
        """Hex sha256 over the scheme version and every field, in a canonical encoding.

        `kv_groups` counts only when set, so a dense model's digest (and its stored keys) is
        the one it had before hybrids were handled.
        """
        return _identity_digest(self)

    @property
    def block_bytes(self) -> int:
        """Payload bytes of one block: every layer's page."""
        return self.num_layers * self.page_bytes


@functools.lru_cache(maxsize=64)
def _identity_digest(identity: KvModelIdentity) -> str:
    """`KvModelIdentity.digest`, computed once per identity (equal identities share it): every
    value a load receives checks its header against it, and the dump, JSON and sha256 took a
    fifth of a load's Python time. A cache keyed by the frozen model, not a cached_property:
    `model_copy(update=...)` would carry a cached value over to the changed copy."""
    dump = identity.model_dump()
    if not dump["kv_groups"]:
        del dump["kv_groups"]
    fields = {"scheme": KEY_SCHEME_VERSION, **dump}
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


KV_DEVICES = ("cpu", "cuda")
"""Where EngineKVConnector moves KV blocks: vLLM's CPU cache, or its CUDA cache through pinned
host memory on side streams (`plugins.vllm_kv.device`)."""
GPU_ALTERNATIVE = (
    "EngineKVConnector moves blocks of vLLM's CPU and CUDA KV caches only. Elsewhere use "
    "LMCache's MP connector with the engine as its remote tier (graph-kvcache-mcp lmcache "
    "config, vllm start --kv-connector mp_native); docs/vllm-connector.md says what each device "
    "is proven with"
)


def unsupported_setup(
    *,
    device: str,
    tensor_parallel: int,
    pipeline_parallel: int,
    kv_cache_groups: int,
    spec_kind: str,
    sliding_window: int | None,
) -> str | None:
    """Why the connector must refuse this vLLM setup at start-up, or None when it handles it."""
    if device not in KV_DEVICES:
        return f"the KV cache lives on {device!r}. {GPU_ALTERNATIVE}"
    if pipeline_parallel != 1:
        # Each stage holds other layers: a block's value would need every stage's pages.
        return (
            "EngineKVConnector handles pipeline parallel size 1 only; this vLLM runs PP "
            f"{pipeline_parallel}"
        )
    if tensor_parallel != 1 and device != "cuda":
        # Each rank stores its heads under its own key (`engine_kv.device.rank_key`), but
        # only the CUDA path is built for it: a multi-rank CPU vLLM was never run or tested.
        return (
            "EngineKVConnector handles tensor parallelism on CUDA only (per-rank keys); a "
            f"{device!r} KV cache needs tensor parallel size 1, this vLLM runs TP "
            f"{tensor_parallel}"
        )
    if kv_cache_groups != 1:
        return f"EngineKVConnector handles one KV cache group; this model has {kv_cache_groups}"
    if spec_kind != "FullAttentionSpec" or sliding_window:
        return (
            "EngineKVConnector handles full-attention KV caches; this model's is "
            f"{spec_kind}{' with a sliding window' if sliding_window else ''}"
        )
    return None


HYBRID_HINT = (
    "EngineKVConnector handles a hybrid as one full-attention KV cache group plus Mamba state "
    "groups in vLLM's align mode (--enable-prefix-caching; vLLM derives the mode from it)"
)


def unsupported_hybrid(
    *,
    device: str,
    tensor_parallel: int,
    pipeline_parallel: int,
    group_kinds: Sequence[str],
    sliding_window: bool,
    mamba_cache_mode: str,
) -> str | None:
    """Why the connector must refuse this multi-group vLLM setup, or None when it handles it.

    `group_kinds` names each KV cache group's spec class (e.g. "FullAttentionSpec", "MambaSpec").
    Any device the connector moves (CPU or CUDA) and any prefill-checkpoint rule: states move
    at the block ends vLLM offers (`boundary_state_offloads`) and load into block `end - 1` of
    each Mamba group, which vLLM's backend-neutral checkpoint logic keeps on every platform
    (Mamba2 keeps a prefill-checkpoint block on CPU already; GDN does on Hopper from the GPU
    pin on).
    """
    single = unsupported_setup(
        device=device,
        tensor_parallel=tensor_parallel,
        pipeline_parallel=pipeline_parallel,
        kv_cache_groups=1,
        spec_kind="FullAttentionSpec",
        sliding_window=None,
    )
    if single is not None:
        return single
    if tensor_parallel != 1:  # per-rank keys are wired for a dense model's blocks only
        return f"EngineKVConnector keys a hybrid's blocks for one rank, not TP {tensor_parallel}"
    attention = [kind for kind in group_kinds if kind == "FullAttentionSpec"]
    others = [kind for kind in group_kinds if kind not in ("FullAttentionSpec", "MambaSpec")]
    if others or sliding_window or len(attention) != 1 or len(attention) == len(group_kinds):
        what = ", ".join(group_kinds) + (" with a sliding window" if sliding_window else "")
        return (
            f"{HYBRID_HINT}; this model's groups are {what}. For a sliding-window model, "
            "--disable-hybrid-kv-cache-manager serves it as one full-attention group"
        )
    if mamba_cache_mode != "align":
        return f"{HYBRID_HINT}; this vLLM runs mamba cache mode {mamba_cache_mode!r}"
    return None


def state_key(state_identity_digest: str, chain_digest: bytes) -> str:
    """The key of a hybrid's recurrent (Mamba) state after the prefix `chain_digest` names.

    Hashed apart from block keys ("vkv-state" and the state identity, which names the Mamba
    layers and their geometry), so a state key never equals a block key of any model.
    """
    digest = hashlib.sha256(
        b"vkv-state\0%s\0%s" % (state_identity_digest.encode(), chain_digest)
    ).digest()
    return KEY_PREFIX + digest.hex()


def chain_root(identity_digest: str, cache_salt: str | None = None) -> bytes:
    """The parent of a prompt's first block."""
    salt = (cache_salt or "").encode()
    return hashlib.sha256(
        b"vkv-root\0%d\0%s\0%d\0%s"
        % (KEY_SCHEME_VERSION, identity_digest.encode(), len(salt), salt)
    ).digest()


def block_digests(root: bytes, token_ids: Sequence[int], block_size: int) -> list[bytes]:
    """One chained digest per full block of `token_ids`; a partial tail block gets none."""
    digests: list[bytes] = []
    parent = root
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        block = token_ids[start : start + block_size]
        tokens = struct.pack(_TOKEN_STRUCT % len(block), *block)
        parent = hashlib.sha256(b"vkv-block\0" + parent + tokens).digest()
        digests.append(parent)
    return digests


def block_keys(
    identity_digest: str,
    token_ids: Sequence[int],
    block_size: int,
    *,
    cache_salt: str | None = None,
) -> list[str]:
    """The engine keys of every full block of `token_ids`, in order."""
    root = chain_root(identity_digest, cache_salt)
    return [KEY_PREFIX + digest.hex() for digest in block_digests(root, token_ids, block_size)]


@dataclass(frozen=True, slots=True)
class RejectedBlock:
    """A stored value that must not be loaded; `reason` says why (for logs and tests)."""

    reason: str


def encode_block(
    key: str, identity: KvModelIdentity, payload: bytes | Sequence[bytes | memoryview]
) -> bytes:
    """The value stored under `key`: a short header that names what the payload is, then it.

    Layout: `GKVB`, format version (u8), header length (u32, big-endian), a JSON header (key,
    identity digest, shape, dtype, layout, payload length, CRC-32C of the payload), the payload
    (every layer's page for the block, layer-major, exactly as the KV cache holds it). The
    payload may come in parts (one page per layer): they are checksummed and joined in one copy.
    """
    parts = [payload] if isinstance(payload, bytes) else list(payload)
    check = PayloadCheck(CRC32C, "")
    size = 0
    for part in parts:
        check.update(part)
        size += memoryview(part).nbytes
    header = json.dumps(
        {
            "key": key,
            "identity": identity.digest,
            "shape": _shape(identity),
            "dtype": identity.dtype,
            "layout": identity.layout,
            "payload_bytes": size,
            CRC32C: check.value(),
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    prefix = _PREFIX_STRUCT.pack(BLOB_MAGIC, BLOB_FORMAT_VERSION, len(header))
    return b"".join([prefix, header, *parts])


BLOCK_PREFIX_BYTES = _PREFIX_STRUCT.size
"""The fixed start of every value: magic, format version, header length."""


def header_length(prefix: bytes | bytearray | memoryview) -> int | RejectedBlock:
    """The JSON header's length from a value's first `BLOCK_PREFIX_BYTES`, or why it is no block."""
    if len(prefix) < _PREFIX_STRUCT.size:
        return RejectedBlock(f"value of {len(prefix)} bytes is too short to be a KV block")
    magic, version, header_len = _PREFIX_STRUCT.unpack_from(prefix)
    if magic != BLOB_MAGIC:
        return RejectedBlock("value is not a KV block (bad magic)")
    if version != BLOB_FORMAT_VERSION:
        return RejectedBlock(f"KV block format {version} is not {BLOB_FORMAT_VERSION}")
    if header_len > _MAX_HEADER_BYTES:
        return RejectedBlock("KV block header length is out of range")
    return int(header_len)


CRC32C = "crc32c"
CRC32 = "crc32"
SHA256 = "sha256"
CHECKSUM_KINDS = (CRC32C, CRC32, SHA256)
"""The payload checksums a header may name, the one values are written with first."""


class PayloadCheck:
    """A payload's checksum, computed chunk by chunk, against the one its header names.

    Values carry a CRC-32C (`"crc32c"`: 8 hex digits), which finds any accidental damage and,
    with the CPU's CRC32 instruction (`crc32c` package), runs at about 20-30 GB/s per core here:
    a load checks every byte it receives, and zlib's CRC-32 (about 5 GB/s) cost a restored
    request a fifth of its load time. Values written before carry a zlib CRC-32 (`"crc32"`) or a
    sha256 (`"sha256"`) and are still read. Each releases the GIL on large chunks, so lanes
    overlap. None is a defence against a writer that means harm: that writer could compute a
    matching checksum as easily.
    """

    def __init__(self, kind: str, expected: str) -> None:
        self.kind = kind
        self.expected = expected
        self._crc = 0
        self._sha = hashlib.sha256() if kind == SHA256 else None

    def update(self, chunk: bytes | bytearray | memoryview) -> None:
        if self._sha is not None:
            self._sha.update(chunk)
        elif self.kind == CRC32C:
            self._crc = crc32c.crc32c(chunk, self._crc)
        else:
            self._crc = zlib.crc32(chunk, self._crc)

    def value(self) -> str:
        return self._sha.hexdigest() if self._sha is not None else f"{self._crc:08x}"

    def matches(self) -> bool:
        return self.value() == self.expected


def check_header(
    header: bytes | bytearray | memoryview, key: str, identity: KvModelIdentity
) -> PayloadCheck | RejectedBlock:
    """A check for the payload from a value's JSON header, or why the value does not fit."""
    try:
        fields = json.loads(bytes(header))
    except ValueError:
        return RejectedBlock("KV block header is not JSON")
    if not isinstance(fields, dict):
        return RejectedBlock("KV block header is not an object")
    expected = {
        "key": key,
        "identity": identity.digest,
        "shape": _shape(identity),
        "dtype": identity.dtype,
        "layout": identity.layout,
        "payload_bytes": identity.block_bytes,
    }
    for field, wanted in expected.items():
        if fields.get(field) != wanted:
            return RejectedBlock(f"KV block {field} is {fields.get(field)!r}, expected {wanted!r}")
    for kind in CHECKSUM_KINDS:
        if isinstance(checksum := fields.get(kind), str):
            return PayloadCheck(kind, checksum)
    return RejectedBlock("KV block has no checksum")


CHECKSUM_MISMATCH = RejectedBlock("KV block payload does not match its checksum")


def decode_block(value: bytes, key: str, identity: KvModelIdentity) -> memoryview | RejectedBlock:
    """The payload of a value stored under `key` for `identity`, or why it cannot be used."""
    view = memoryview(value)
    header_len = header_length(view[:BLOCK_PREFIX_BYTES])
    if isinstance(header_len, RejectedBlock):
        return header_len
    start = BLOCK_PREFIX_BYTES
    if start + header_len > len(view):
        return RejectedBlock("KV block header length is out of range")
    check = check_header(view[start : start + header_len], key, identity)
    if isinstance(check, RejectedBlock):
        return check
    payload = view[start + header_len :]
    if len(payload) != identity.block_bytes:
        return RejectedBlock(
            f"KV block payload is {len(payload)} bytes, not {identity.block_bytes}"
        )
    check.update(payload)
    return payload if check.matches() else CHECKSUM_MISMATCH


def _shape(identity: KvModelIdentity) -> list[int]:
    """[layers, page bytes]: the payload's shape as the header records it."""
    return [identity.num_layers, identity.page_bytes]
