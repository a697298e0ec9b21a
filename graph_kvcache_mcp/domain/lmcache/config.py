"""LMCache + vLLM configuration with the engine as LMCache's remote tier. Pure: no I/O.

`plan_lmcache(facts, choices)` returns everything an operator runs, for one of three modes:

- `mp_native` (recommended): a standalone `lmcache server` whose `--l2-adapter` is our
  `native_plugin` client (`plugins/lmcache/l2.py`); vLLM connects with `LMCacheMPConnector`.
- `redis_resp`: the same MP server with LMCache's built-in `resp` adapter pointed at a Redis
  endpoint (a real Redis, or the engine's RESP wire) — nothing of ours runs inside LMCache.
- `inprocess_plugin`: LMCache inside each vLLM worker (`LMCacheConnectorV1`), our
  `EngineRemoteConnector` under `remote_storage_plugins` (current `remote_storage_plugin.*`
  keys; the `external_backend.*` spelling is ignored by LMCache 0.4.2-0.5.7).

Rules applied (lmcache 0.5.6, see docs/lmcache.md): the same `PYTHONHASHSEED` on every process,
telemetry off, `kv_connector_module_path` always set, `--enable-prefix-caching`; for Mamba/GDN
hybrids `--max-num-batched-tokens` = the attention block size (vLLM derives the Mamba cache mode
from prefix caching, so no `--mamba-cache-mode`) and a
chunk size that is a multiple of it; chunks kept under the engine's 64 MiB value cap. Secrets are
never written: the token is passed through as `${EPISTEMIC_GRAPH_KVCACHE_TOKEN}`.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from graph_kvcache_mcp.domain.endpoints import approve_http_url
from graph_kvcache_mcp.domain.engine.environment import KV_TOKEN_ENV, KV_TOKEN_REF
from graph_kvcache_mcp.domain.lmcache.choices import MODES, LmcacheChoices, Mode
from graph_kvcache_mcp.domain.lmcache.keys import check_namespace
from graph_kvcache_mcp.domain.lmcache.model import ModelFacts
from graph_kvcache_mcp.domain.lmcache.process_spec import (
    L2_ADAPTER_FLAG,
    ProcessSpec,
    compact_json,
    point_resp_adapter,
)
from graph_kvcache_mcp.domain.lmcache.sizing import (
    DEFAULT_CHUNK_TOKENS,
    ENGINE_VALUE_CAP_BYTES,
    INPROCESS_HEADER_BYTES,
    block_size,
    chunk_size,
)
from graph_kvcache_mcp.domain.vllm.serve_command import vllm_argv

__all__ = [
    "DEFAULT_CHUNK_TOKENS",
    "ENGINE_VALUE_CAP_BYTES",
    "INPROCESS_HEADER_BYTES",
    "L2_ADAPTER_FLAG",
    "MODES",
    "TELEMETRY_OFF",
    "LmcacheChoices",
    "LmcachePlan",
    "Mode",
    "ModelSummary",
    "ProcessSpec",
    "inprocess_kv_transfer_config",
    "inprocess_yaml",
    "mp_kv_transfer_config",
    "plan_lmcache",
    "point_resp_adapter",
]
L2_MODULE = "graph_kvcache_mcp.plugins.lmcache.l2"
L2_CLASS = "EngineL2Client"
REMOTE_MODULE = "graph_kvcache_mcp.plugins.lmcache.remote"
REMOTE_CLASS = "EngineRemoteConnector"
MP_CONNECTOR_MODULE = "lmcache.integration.vllm.lmcache_mp_connector"
PLUGIN_NAME = "graphkv"
TOKEN_REF = KV_TOKEN_REF
TELEMETRY_OFF = {"LMCACHE_TRACK_USAGE": "false", "DO_NOT_TRACK": "1", "VLLM_NO_USAGE_STATS": "1"}


class ModelSummary(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    kind: str
    attention_layers: int
    kv_bytes_per_token: int | None = Field(
        description="All attention layers, one TP rank; None for compressed KV (not modelled)."
    )
    chunk_size: int
    chunk_bytes: int | None = Field(
        description="Estimated bytes of one chunk object on one rank; None for compressed KV."
    )
    block_size: int | None = Field(None, description="Hybrid attention block size, if any.")
    block_size_source: Literal["given", "estimated"] | None = None


class LmcachePlan(BaseModel):
    """Everything to run for one model and mode; `supported=False` means do not use LMCache."""

    model_config = ConfigDict(frozen=True)

    mode: Mode
    supported: bool
    model: ModelSummary
    lmcache_server: ProcessSpec | None = None
    l2_adapter: dict[str, Any] | None = None
    vllm: ProcessSpec
    kv_transfer_config: dict[str, Any] | None = None
    lmcache_yaml: str | None = None
    warnings: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


def plan_lmcache(facts: ModelFacts, choices: LmcacheChoices | None = None) -> LmcachePlan:
    """The commands, flags, YAML, env and warnings for `facts` deployed as `choices` say.

    Raises:
        ConfigError: a choice contradicts the model (e.g. a chunk size that is not a multiple of
            the hybrid block size) or an address is unusable.
    """
    choices = choices or LmcacheChoices()
    approve_http_url(
        choices.engine_url, what="engine URL", insecure_hosts=choices.insecure_http_hosts
    )
    check_namespace(choices.namespace)
    tp = choices.tensor_parallel_size
    warnings: list[str] = []
    notes: list[str] = []
    block, block_source = block_size(facts, choices, warnings)
    chunk = chunk_size(facts, choices, block, warnings)
    modelled = facts.kind != "compressed"
    summary = ModelSummary(
        name=facts.name,
        kind=facts.kind,
        attention_layers=facts.attention_layers,
        kv_bytes_per_token=facts.kv_bytes_per_token(tp) if modelled else None,
        chunk_size=chunk,
        chunk_bytes=facts.chunk_bytes(chunk, tp, block) if modelled else None,
        block_size=block,
        block_size_source=block_source,
    )
    base_env = {"PYTHONHASHSEED": str(choices.python_hash_seed), **TELEMETRY_OFF}

    if facts.kind == "compressed":
        warnings.append(
            "compressed-KV attention (DeepSeek-V4 style) is not supported by LMCache's MP "
            "connector yet: serve with vLLM's native prefix caching only (no "
            "--kv-transfer-config); nothing is offloaded to the engine"
        )
        vllm = ProcessSpec(argv=vllm_argv(facts, choices, None, block), env=base_env)
        return LmcachePlan(
            mode=choices.mode, supported=False, model=summary, vllm=vllm, warnings=warnings
        )

    _general_warnings(facts, choices, summary, warnings, notes)
    if choices.mode == "inprocess_plugin":
        return _inprocess(facts, choices, summary, block, base_env, warnings, notes)
    return _mp(facts, choices, summary, block, base_env, warnings, notes)


def _general_warnings(
    facts: ModelFacts,
    choices: LmcacheChoices,
    summary: ModelSummary,
    warnings: list[str],
    notes: list[str],
) -> None:
    if facts.vision:
        warnings.append(
            "vision inputs: LMCache caches text-token KV only; requests carrying images or video "
            "recompute that part, so expect lower reuse on multimodal prompts"
        )
    if facts.kind == "hybrid":
        warnings.append(
            f"hybrid model: --max-num-batched-tokens {summary.block_size} (one block per "
            "scheduler step) is valid for every LMCache version but slows cold prefill of long "
            "prompts; on LMCache >= 0.5.4 it may be raised (it must stay >= the block size)"
        )
        if choices.mode == "inprocess_plugin":
            warnings.append(
                "hybrid models are documented for the MP connector; prefer mode mp_native"
            )
    if facts.kind == "mla":
        notes.append("MLA: every TP rank holds the same latent KV, so only rank 0 stores it")
    if facts.sliding_window:
        notes.append("sliding-window attention needs no extra flags")
    if choices.mode == "mp_native":
        notes.append(
            f"the engine token reaches our adapter through {KV_TOKEN_ENV} in the "
            "lmcache server's environment; LMCache logs adapter_params, so never put it there"
        )
        notes.append(
            "the engine has no DELETE: leave max_capacity_gb at 0 (no L2 eviction accounting)"
        )
    if choices.mode != "inprocess_plugin":
        notes.append(
            f"lmcache server's admin API (port {choices.lmcache_http_port}) has no "
            "authentication: keep --http-host on loopback"
        )


def mp_kv_transfer_config(
    lmcache_host: str, lmcache_port: int, rpc_url: str | None = None
) -> dict[str, Any]:
    """vLLM's `--kv-transfer-config` for LMCache's MP connector to an `lmcache server`; with
    `rpc_url` (an `ipc://` socket) the connector talks there, and the port stays as the server's
    name."""
    extra: dict[str, Any] = {
        "lmcache.mp.host": f"tcp://{lmcache_host}",
        "lmcache.mp.port": lmcache_port,
        "lmcache.mp.hash_algorithm": "blake3",
    }
    if rpc_url is not None:
        extra["lmcache.mp.server_urls"] = [rpc_url]  # wins over host and port in LMCache
    return {
        "kv_connector": MP_CONNECTOR_CLASS,
        "kv_connector_module_path": MP_CONNECTOR_MODULE,
        "kv_role": "kv_both",
        "kv_connector_extra_config": extra,
    }


MP_CONNECTOR_CLASS = "LMCacheMPConnector"
"""vLLM's connector for an `lmcache server` (the `kv_connector` of mp_native and redis_resp)."""


def _cpu_transfer_flags(choices: LmcacheChoices, notes: list[str]) -> list[str]:
    """A CPU vLLM worker registers its KV cache `engine_driven` over shared memory; the server's
    default (`lmcache_driven`) has no handler for that, and the worker waits 300 s, then vLLM
    cannot be stopped. `auto` with a named shared-memory pool serves it and leaves nothing in
    /dev/shm when the server exits (forcing `lmcache_driven` in vLLM instead leaks a
    KV-cache-sized segment per vLLM start)."""
    if not choices.cpu:
        return []
    notes.append(
        "CPU vLLM: --supported-transfer-mode auto with --shm-name (LMCache's default "
        "lmcache_driven hangs a CPU worker's registration for 300 s); L1 lives in "
        f"/dev/shm/lmcache_l1_pool_{choices.l1_shm_name} while the server runs"
    )
    return [
        "--supported-transfer-mode",
        "auto",
        "--shm-name",
        choices.l1_shm_name,
        "--no-l1-use-lazy",
    ]


def inprocess_kv_transfer_config() -> dict[str, Any]:
    """vLLM's `--kv-transfer-config` for LMCache inside each vLLM worker."""
    return {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}


def _l2_adapter(
    choices: LmcacheChoices, server_env: dict[str, str], warnings: list[str]
) -> dict[str, Any]:
    """The server's `--l2-adapter`: our native_plugin client, or LMCache's `resp` adapter; adds
    the environment each needs (references, never secret values)."""
    if choices.mode == "mp_native":
        adapter: dict[str, Any] = {
            "type": "native_plugin",
            "module_path": L2_MODULE,
            "class_name": L2_CLASS,
            "adapter_params": {
                "base_url": choices.engine_url,
                "namespace": choices.namespace,
                "num_workers": choices.num_workers,
                "max_connections": choices.max_connections,
            },
            "max_capacity_gb": 0,
            # one engine behind every server: the coordinator counts its bytes once for the fleet
            "shared": True,
        }
        server_env[KV_TOKEN_ENV] = TOKEN_REF
    else:
        adapter = {
            "type": "resp",
            "host": choices.redis_host,
            "port": choices.redis_port,
            "num_workers": 8,
            "max_capacity_gb": 0,
            "shared": True,
        }
        server_env["LMCACHE_RESP_USERNAME"] = "${LMCACHE_RESP_USERNAME}"
        server_env["LMCACHE_RESP_PASSWORD"] = "${LMCACHE_RESP_PASSWORD}"
        warnings.append(
            "resp mode stores chunks in a Redis keyspace: pointed at the engine's RESP wire they "
            "bypass /kv, so kv_stats, dedup counters and lmcache_check do not see them; the "
            "engine's RESP password is HMAC-SHA256(auth secret, 'redis:' + user) in hex"
        )
    return adapter


def _mp(
    facts: ModelFacts,
    choices: LmcacheChoices,
    summary: ModelSummary,
    block: int | None,
    base_env: dict[str, str],
    warnings: list[str],
    notes: list[str],
) -> LmcachePlan:
    server_env = dict(base_env)
    adapter = _l2_adapter(choices, server_env, warnings)
    server = ProcessSpec(
        argv=[
            "lmcache",
            "server",
            "--host",
            choices.lmcache_host,
            "--port",
            str(choices.lmcache_port),
            "--http-host",
            "127.0.0.1",
            "--http-port",
            str(choices.lmcache_http_port),
            "--chunk-size",
            str(summary.chunk_size),
            "--l1-size-gb",
            _number(choices.l1_size_gb),
            "--eviction-policy",
            "LRU",
            "--hash-algorithm",
            "blake3",
            "--l2-adapter",
            compact_json(adapter),
            *_cpu_transfer_flags(choices, notes),
        ],
        env=server_env,
    )
    transfer = mp_kv_transfer_config(choices.lmcache_host, choices.lmcache_port)
    vllm = ProcessSpec(argv=vllm_argv(facts, choices, transfer, block), env=dict(base_env))
    return LmcachePlan(
        mode=choices.mode,
        supported=True,
        model=summary,
        lmcache_server=server,
        l2_adapter=adapter,
        vllm=vllm,
        kv_transfer_config=transfer,
        warnings=warnings,
        notes=notes,
    )


def _inprocess(
    facts: ModelFacts,
    choices: LmcacheChoices,
    summary: ModelSummary,
    block: int | None,
    base_env: dict[str, str],
    warnings: list[str],
    notes: list[str],
) -> LmcachePlan:
    transfer = inprocess_kv_transfer_config()
    env = {
        **base_env,
        "LMCACHE_CONFIG_FILE": choices.config_file,
        KV_TOKEN_ENV: TOKEN_REF,
    }
    notes.append(
        "in-process mode is documented by LMCache as deprecated but available; MP mode is the "
        "direction of travel"
    )
    return LmcachePlan(
        mode=choices.mode,
        supported=True,
        model=summary,
        vllm=ProcessSpec(argv=vllm_argv(facts, choices, transfer, block), env=env),
        kv_transfer_config=transfer,
        lmcache_yaml=inprocess_yaml(choices, summary.chunk_size),
        warnings=warnings,
        notes=notes,
    )


def inprocess_yaml(choices: LmcacheChoices, chunk_size: int) -> str:
    """LMCache's in-process YAML with our remote plugin, current key names only."""
    lines = [
        "# LMCache in-process configuration (LMCACHE_CONFIG_FILE), generated by graph-kvcache-mcp.",
        f"# The engine token comes from {KV_TOKEN_ENV}, never from this file.",
        f"chunk_size: {chunk_size}",
        "local_cpu: true",
        f"max_local_cpu_size: {_number(choices.max_local_cpu_size_gb)}",
        "save_unfull_chunk: false",
        "remote_serde: naive",
        "blocking_timeout_secs: 10",
        "pre_caching_hash_algorithm: sha256_cbor",
        f"remote_storage_plugins: [{PLUGIN_NAME}]",
        "extra_config:",
        f"  remote_storage_plugin.{PLUGIN_NAME}.module_path: {REMOTE_MODULE}",
        f"  remote_storage_plugin.{PLUGIN_NAME}.class_name: {REMOTE_CLASS}",
        f"  graphkv.base_url: {json.dumps(choices.engine_url)}",
        f"  graphkv.namespace: {json.dumps(choices.namespace)}",
        f"  graphkv.max_connections: {choices.max_connections}",
    ]
    return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)
