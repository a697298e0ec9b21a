"""What is misconfigured in the KV-cache stack, from what each component reported. Pure: no I/O.

The service gathers one `*Facts` per component (None: not checked); `stack_findings` turns them
into findings with fixed ids, each with its evidence and what to change. Evidence never carries a
token: the facts hold none.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from graph_kvcache_mcp.domain.vllm.metrics import CacheConfig

Severity = Literal["error", "warning", "info"]
Component = Literal["engine", "vllm", "lmcache"]
KV_PRESSURE_USAGE = 0.9
MP_CONNECTOR = "LMCacheMPConnector"
LMCACHE_DRIVEN = "lmcache_driven"


class Finding(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    severity: Severity
    component: Component
    evidence: str
    fix: str


class Checked(BaseModel):
    """One component the diagnosis tried to reach."""

    model_config = ConfigDict(frozen=True)

    component: Component
    target: str
    reachable: bool


class StackDiagnosis(BaseModel):
    """Tool and CLI output of diagnose_stack."""

    model_config = ConfigDict(frozen=True)

    findings: list[Finding]
    checked: list[Checked]

    @property
    def any_reachable(self) -> bool:
        return any(c.reachable for c in self.checked)

    @property
    def has_error(self) -> bool:
        return any(f.severity == "error" for f in self.findings)


class EngineFacts(BaseModel):
    model_config = ConfigDict(frozen=True)

    target: str
    source: Literal["configured", "managed", "default"]
    reachable: bool
    status: int | None = None
    reason: str | None = None
    backend: str | None = None


class VllmFacts(BaseModel):
    model_config = ConfigDict(frozen=True)

    target: str
    reachable: bool
    reason: str | None = None
    model: str | None = None
    version: str | None = None
    cache_config: CacheConfig | None = None
    prompt_tokens_details: bool | None = Field(
        None, description="Whether a probe call's usage carried prompt_tokens_details."
    )
    kv_cache_usage: float | None = None
    preemptions: int | None = None
    external_queries: int | None = None
    external_hits: int | None = None
    shared_prefix_tokens: int | None = Field(
        None, description="The prefix requests are meant to share (given, or a session's)."
    )
    kv_connector: str | None = Field(None, description="The managed vLLM's kv_connector, if any.")
    hash_seed: str | None = Field(None, description="PYTHONHASHSEED of the managed vLLM.")
    platform: Literal["cpu", "gpu"] | None = Field(None, description="The managed vLLM's.")
    lmcache_target: str | None = Field(
        None, description="host:port the managed vLLM's MP connector talks to."
    )
    lmcache_target_answers: bool | None = Field(
        None, description="Whether anything listens on lmcache_target."
    )
    lmcache_transfer_mode: str | None = Field(
        None, description="LMCACHE_MP_TRANSFER_MODE in the managed vLLM's environment."
    )


class LmcacheFacts(BaseModel):
    model_config = ConfigDict(frozen=True)

    target: str
    reachable: bool
    reason: str | None = None
    version: str | None = None
    unhealthy_l2: list[str] = Field(default_factory=list)
    hash_seed: str | None = None
    chunk_size: int | None = None
    l2_adapters: int | None = Field(None, description="How many L2 adapters /status lists.")
    transfer_mode: str | None = Field(
        None,
        description="The managed server's --supported-transfer-mode (LMCache's default "
        "lmcache_driven when the flag is absent).",
    )
    rpc_port: int | None = Field(None, description="The managed server's ZMQ port.")
    registration_hang: str | None = Field(
        None, description="The server log's line saying it cannot register vLLM's KV caches."
    )
    leaked_segments: list[str] = Field(
        default_factory=list,
        description="/dev/shm/lmcache_kv_<pid>_* segments whose process is gone.",
    )
    resp_peer_gone: str | None = Field(
        None, description="Why the managed server's resp L2 adapter lost its engine."
    )


def stack_findings(
    engine: EngineFacts | None, vllm: VllmFacts | None, lmcache: LmcacheFacts | None
) -> StackDiagnosis:
    """The findings for what was checked, errors first."""
    findings: list[Finding] = []
    checked: list[Checked] = []
    if engine is not None:
        checked.append(
            Checked(component="engine", target=engine.target, reachable=engine.reachable)
        )
        findings += _engine(engine)
    if vllm is not None:
        checked.append(Checked(component="vllm", target=vllm.target, reachable=vllm.reachable))
        findings += _vllm(vllm)
    if lmcache is not None:
        checked.append(
            Checked(component="lmcache", target=lmcache.target, reachable=lmcache.reachable)
        )
        findings += _lmcache(lmcache)
    findings += _hash_seed(vllm, lmcache)
    findings += mp_stack_findings(vllm, lmcache)
    findings += _versions(vllm, lmcache)
    order = {"error": 0, "warning": 1, "info": 2}
    findings.sort(key=lambda f: order[f.severity])
    return StackDiagnosis(findings=findings, checked=checked)


def _engine(facts: EngineFacts) -> list[Finding]:
    if facts.status in (401, 403):
        return [
            Finding(
                id="engine_auth_failed",
                severity="error",
                component="engine",
                evidence=f"{facts.target} refused the token (HTTP {facts.status})",
                fix="set EPISTEMIC_GRAPH_KVCACHE_TOKEN to the token the engine was started with",
            )
        ]
    if not facts.reachable:
        if facts.source == "default":
            return [
                Finding(
                    id="engine_not_started",
                    severity="info",
                    component="engine",
                    evidence=f"no engine configured or running ({facts.reason})",
                    fix="nothing to do for the MCP server: it starts a local engine on first "
                    "use; `graph-kvcache-mcp engine start` starts one for other clients",
                )
            ]
        return [
            Finding(
                id="engine_unreachable",
                severity="error",
                component="engine",
                evidence=facts.reason or f"{facts.target} did not answer",
                fix="start the engine (engine_start) or fix EPISTEMIC_GRAPH_KVCACHE_URL",
            )
        ]
    if facts.backend == "memory":
        return [
            Finding(
                id="engine_memory_backend",
                severity="warning",
                component="engine",
                evidence=f"{facts.target} runs the memory backend",
                fix="nothing survives a restart: start the engine with the durable backend "
                "(engine_start backend=durable) for a cache that outlives the process",
            )
        ]
    return []


def _vllm(facts: VllmFacts) -> list[Finding]:
    if not facts.reachable:
        return [
            Finding(
                id="vllm_unreachable",
                severity="error",
                component="vllm",
                evidence=facts.reason or f"{facts.target} did not answer",
                fix="start vLLM (vllm_start) or point VLLM_BASE_URL at the running server",
            )
        ]
    found: list[Finding] = []
    config = facts.cache_config
    if config is not None and config.enable_prefix_caching is False:
        found.append(
            Finding(
                id="vllm_prefix_caching_off",
                severity="error",
                component="vllm",
                evidence="vllm:cache_config_info has enable_prefix_caching=False",
                fix="restart vLLM with --enable-prefix-caching (and without "
                "--no-enable-prefix-caching): nothing is reused between requests now",
            )
        )
    if facts.prompt_tokens_details is False:
        found.append(
            Finding(
                id="vllm_prompt_tokens_details_off",
                severity="warning",
                component="vllm",
                evidence="a probe call's usage has no prompt_tokens_details",
                fix="restart vLLM with --enable-prompt-tokens-details so each response says how "
                "many prompt tokens came from the cache",
            )
        )
    block = config.block_size if config is not None else None
    shared = facts.shared_prefix_tokens
    if block and shared is not None and shared < block:
        found.append(
            Finding(
                id="vllm_block_larger_than_shared_prefix",
                severity="warning",
                component="vllm",
                evidence=f"the shared prefix is {shared} tokens, the block size {block}: vLLM "
                "caches whole blocks only, so it reuses nothing",
                fix="share a longer stable prefix, or restart vLLM with a smaller --block-size",
            )
        )
    usage = facts.kv_cache_usage
    if (facts.preemptions or 0) > 0 or (usage is not None and usage > KV_PRESSURE_USAGE):
        parts = []
        if facts.preemptions:
            parts.append(f"{facts.preemptions} preemptions (vllm:num_preemptions_total)")
        if usage is not None and usage > KV_PRESSURE_USAGE:
            parts.append(f"KV cache {usage:.0%} full")
        found.append(
            Finding(
                id="vllm_kv_pressure",
                severity="warning",
                component="vllm",
                evidence=", ".join(parts),
                fix="give vLLM more KV memory (--gpu-memory-utilization or "
                "--kv-cache-memory-bytes), lower --max-num-seqs, or shorten prompts: evicted "
                "blocks are recomputed",
            )
        )
    if (facts.external_queries or 0) > 0 and facts.external_hits == 0:
        found.append(
            Finding(
                id="external_cache_never_hits",
                severity="warning",
                component="vllm",
                evidence=f"the KV connector was asked for {facts.external_queries} tokens and "
                "found none (vllm:external_prefix_cache_hits_total = 0)",
                fix="check that the connector stores (kv_role kv_both), that every process "
                "shares PYTHONHASHSEED and the hash algorithm, and that LMCache's chunk size "
                "matches",
            )
        )
    return found


def _lmcache(facts: LmcacheFacts) -> list[Finding]:
    if not facts.reachable:
        return [
            Finding(
                id="lmcache_unreachable",
                severity="error",
                component="lmcache",
                evidence=facts.reason or f"{facts.target} did not answer",
                fix="start `lmcache server` (lmcache_config prints the command) or fix its "
                "HTTP URL",
            )
        ]
    if facts.unhealthy_l2:
        return [
            Finding(
                id="lmcache_l2_unhealthy",
                severity="error",
                component="lmcache",
                evidence="L2 adapters reporting unhealthy: " + ", ".join(facts.unhealthy_l2),
                fix="check the adapter's backend (the engine for native_plugin: engine_status, "
                "kv_probe) and lmcache_check",
            )
        ]
    return []


def mp_stack_findings(vllm: VllmFacts | None, lmcache: LmcacheFacts | None) -> list[Finding]:
    """What breaks vLLM's MP connector with an `lmcache server`: transfer modes, shared-memory
    leaks, chunk sizes, a missing or lost L2, and a server vLLM cannot reach."""
    mp = vllm if vllm is not None and vllm.reachable and vllm.kv_connector == MP_CONNECTOR else None
    found = _transfer_mode(mp, lmcache) + _leaks(mp, lmcache) + _unreachable_server(mp, lmcache)
    if lmcache is None or not lmcache.reachable:
        return found
    found += _chunks(vllm, lmcache)
    if lmcache.l2_adapters == 0:
        found.append(
            Finding(
                id="lmcache_l2_not_configured",
                severity="warning",
                component="lmcache",
                evidence=f"{lmcache.target}/status lists no L2 adapter: KV lives in L1 only",
                fix="start the server with an --l2-adapter (lmcache_config mode mp_native plans "
                "our adapter to the engine): without one nothing survives a server restart",
            )
        )
    if lmcache.resp_peer_gone is not None:
        found.append(
            Finding(
                id="lmcache_resp_engine_restarted",
                severity="error",
                component="lmcache",
                evidence=lmcache.resp_peer_gone,
                fix="restart the lmcache server (lmcache_stop, then lmcache_start mode "
                "redis_resp) now that the engine runs with its RESP wire: LMCache's resp adapter "
                "connects only at server start",
            )
        )
    return found


def _transfer_mode(mp: VllmFacts | None, lmcache: LmcacheFacts | None) -> list[Finding]:
    evidence = lmcache.registration_hang if lmcache is not None else None
    if (
        evidence is None
        and mp is not None
        and lmcache is not None
        and mp.platform == "cpu"
        and lmcache.transfer_mode == LMCACHE_DRIVEN
        and mp.lmcache_transfer_mode != LMCACHE_DRIVEN
    ):
        evidence = (
            "the lmcache server runs with transfer mode lmcache_driven (LMCache's default); "
            "vLLM's CPU worker registers engine_driven"
        )
    if evidence is None:
        return []
    return [
        Finding(
            id="lmcache_transfer_mode_mismatch",
            severity="error",
            component="lmcache",
            evidence=evidence,
            fix="restart the lmcache server with --supported-transfer-mode auto and a "
            "--shm-name of its own: otherwise vLLM waits 300 s for register_kv_caches, fails, "
            "and then hangs on shutdown (only SIGKILL stops it)",
        )
    ]


def _leaks(mp: VllmFacts | None, lmcache: LmcacheFacts | None) -> list[Finding]:
    parts = []
    if mp is not None and mp.platform == "cpu" and mp.lmcache_transfer_mode == LMCACHE_DRIVEN:
        parts.append("the managed CPU vLLM runs with LMCACHE_MP_TRANSFER_MODE=lmcache_driven")
    if lmcache is not None and lmcache.leaked_segments:
        shown = ", ".join(lmcache.leaked_segments[:5])
        parts.append(
            f"{len(lmcache.leaked_segments)} /dev/shm segment(s) of exited vLLMs left: {shown}"
        )
    if not parts:
        return []
    return [
        Finding(
            id="lmcache_driven_leaks_shm",
            severity="warning",
            component="vllm",
            evidence="; ".join(parts),
            fix="drop LMCACHE_MP_TRANSFER_MODE=lmcache_driven from vLLM's environment and run "
            "the lmcache server with --supported-transfer-mode auto and --shm-name: each "
            "lmcache_driven CPU vLLM start leaves a KV-cache-sized /dev/shm/lmcache_kv_<pid>_0 "
            "behind; remove the listed ones (their processes are gone)",
        )
    ]


def _unreachable_server(mp: VllmFacts | None, lmcache: LmcacheFacts | None) -> list[Finding]:
    if mp is None or mp.lmcache_target is None:
        return []
    port = mp.lmcache_target.rsplit(":", 1)[-1]
    elsewhere = (
        lmcache is not None
        and lmcache.rpc_port is not None
        and port.isdigit()
        and int(port) != lmcache.rpc_port
    )
    if mp.lmcache_target_answers is not False and not elsewhere:
        return []
    evidence = f"vLLM's MP connector talks to {mp.lmcache_target}"
    if elsewhere:
        assert lmcache is not None
        evidence += f", the managed lmcache server listens on port {lmcache.rpc_port}"
    else:
        evidence += ", where nothing listens"
    return [
        Finding(
            id="lmcache_unreachable_from_vllm",
            severity="error",
            component="vllm",
            evidence=evidence,
            fix="start the lmcache server on that port (lmcache_start), or restart vLLM with "
            "lmcache_port set to the server's port: until then every lookup waits for its "
            "timeout and nothing is stored",
        )
    ]


def _chunks(vllm: VllmFacts | None, lmcache: LmcacheFacts) -> list[Finding]:
    chunk = lmcache.chunk_size
    if chunk is None or vllm is None or not vllm.reachable:
        return []
    found = []
    block = vllm.cache_config.block_size if vllm.cache_config is not None else None
    if block and chunk % block:
        lower = max(block, chunk // block * block)
        found.append(
            Finding(
                id="lmcache_chunk_not_block_multiple",
                severity="error",
                component="lmcache",
                evidence=f"LMCache chunk size {chunk} is not a multiple of vLLM's block size "
                f"{block}",
                fix=f"restart the lmcache server with --chunk-size {lower} or {lower + block} "
                "(lmcache_config picks one from the model)",
            )
        )
    shared = vllm.shared_prefix_tokens
    if shared is not None and shared < chunk:
        found.append(
            Finding(
                id="lmcache_chunk_larger_than_prompts",
                severity="warning",
                component="lmcache",
                evidence=f"the shared prefix is {shared} tokens, LMCache's chunk {chunk}: only "
                "whole chunks are stored, so none of it is",
                fix="restart the lmcache server with a smaller --chunk-size (a multiple of "
                "vLLM's block size, at most the prefix length), or share a longer prefix",
            )
        )
    return found


def _hash_seed(vllm: VllmFacts | None, lmcache: LmcacheFacts | None) -> list[Finding]:
    # Only a vLLM with a KV connector shares hashes with another process.
    if vllm is None or not vllm.reachable or vllm.kv_connector is None:
        return []
    seeds = {"vLLM": vllm.hash_seed}
    if lmcache is not None and lmcache.hash_seed is not None:  # known only for ours
        seeds["LMCache"] = lmcache.hash_seed
    unset = [name for name, seed in seeds.items() if seed is None]
    if not unset and len(set(seeds.values())) == 1:
        return []
    shown = ", ".join(f"{name}={seed or 'unset'}" for name, seed in seeds.items())
    return [
        Finding(
            id="hash_seed_mismatch",
            severity="warning",
            component="vllm",
            evidence=f"PYTHONHASHSEED {shown} (kv_connector {vllm.kv_connector})",
            fix="start vLLM and LMCache with the same PYTHONHASHSEED (e.g. 0): otherwise their "
            "chunk hashes differ and the external cache never hits",
        )
    ]


def _versions(vllm: VllmFacts | None, lmcache: LmcacheFacts | None) -> list[Finding]:
    parts = []
    if vllm is not None and vllm.version:
        parts.append(f"vLLM {vllm.version}")
    if lmcache is not None and lmcache.version:
        parts.append(f"LMCache {lmcache.version}")
    if not parts:
        return []
    return [
        Finding(
            id="versions",
            severity="info",
            component="vllm" if vllm is not None and vllm.version else "lmcache",
            evidence=", ".join(parts),
            fix="nothing to fix; quote these when reporting a problem",
        )
    ]
