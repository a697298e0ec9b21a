"""Findings about the `lmcache server`, alone and as the far end of vLLM's MP connector. Pure."""

from __future__ import annotations

from graph_kvcache_mcp.domain.diagnosis.stack_facts import Finding, LmcacheFacts, VllmFacts

MP_CONNECTOR = "LMCacheMPConnector"
LMCACHE_DRIVEN = "lmcache_driven"


def lmcache_findings(facts: LmcacheFacts) -> list[Finding]:
    """What is wrong with the `lmcache server` on its own: no answer or an unhealthy L2."""
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
        evidence += f", the lmcache server at {lmcache.target} listens on port {lmcache.rpc_port}"
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
