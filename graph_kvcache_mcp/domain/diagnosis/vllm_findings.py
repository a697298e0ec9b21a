"""Findings about vLLM, from its /metrics, its cache config and a probe call. Pure: no I/O.

A vLLM that does not answer has one finding; one that answers goes through `RULES`, one small
function per finding id, each returning its finding or None.
"""

from __future__ import annotations

from collections.abc import Callable

from graph_kvcache_mcp.domain.diagnosis.stack_facts import Finding, Severity, VllmFacts
from graph_kvcache_mcp.domain.vllm.hybrid.launch import CPU_DEFAULT_BATCHED_TOKENS
from graph_kvcache_mcp.domain.vllm.metrics.models import int_label
from graph_kvcache_mcp.domain.vllm.worker_death import WorkerDeath

KV_PRESSURE_USAGE = 0.9


def vllm_findings(facts: VllmFacts) -> list[Finding]:
    """What is wrong with vLLM: its worker's death, no answer, or each rule of `RULES` that
    fires, in order."""
    died = [] if facts.worker_death is None else [_worker_died(facts.worker_death)]
    if not facts.reachable:
        return [
            *died,
            _finding(
                "vllm_unreachable",
                "error",
                facts.reason or f"{facts.target} did not answer",
                "start vLLM (vllm_start) or point VLLM_BASE_URL at the running server",
            ),
        ]
    return [*died, *(found for rule in RULES if (found := rule(facts)) is not None)]


def _worker_died(death: WorkerDeath) -> Finding:
    code = "unknown" if death.exit_code is None else str(death.exit_code)
    stats = f"; last scheduler stats {death.last_stats}" if death.last_stats else ""
    return _finding(
        "vllm_worker_died",
        "error",
        f"{death.what_happened} (at {death.at}, exit code {code}){stats}",
        death.what_to_do,
    )


def _prefix_caching_off(facts: VllmFacts) -> Finding | None:
    config = facts.cache_config
    if config is None or config.enable_prefix_caching is not False:
        return None
    return _finding(
        "vllm_prefix_caching_off",
        "error",
        "vllm:cache_config_info has enable_prefix_caching=False",
        "restart vLLM with --enable-prefix-caching (and without "
        "--no-enable-prefix-caching): nothing is reused between requests now",
    )


def _prompt_tokens_details_off(facts: VllmFacts) -> Finding | None:
    if facts.prompt_tokens_details is not False:
        return None
    return _finding(
        "vllm_prompt_tokens_details_off",
        "warning",
        "a probe call's usage has no prompt_tokens_details",
        "restart vLLM with --enable-prompt-tokens-details so each response says how "
        "many prompt tokens came from the cache",
    )


def _block_larger_than_shared_prefix(facts: VllmFacts) -> Finding | None:
    block = facts.cache_config.block_size if facts.cache_config is not None else None
    shared = facts.shared_prefix_tokens
    if not block or shared is None or shared >= block:
        return None
    return _finding(
        "vllm_block_larger_than_shared_prefix",
        "warning",
        f"the shared prefix is {shared} tokens, the block size {block}: vLLM "
        "caches whole blocks only, so it reuses nothing",
        "share a longer stable prefix, or restart vLLM with a smaller --block-size",
    )


def _kv_pressure(facts: VllmFacts) -> Finding | None:
    usage = facts.kv_cache_usage
    full = usage is not None and usage > KV_PRESSURE_USAGE
    if (facts.preemptions or 0) <= 0 and not full:
        return None
    parts = []
    if facts.preemptions:
        parts.append(f"{facts.preemptions} preemptions (vllm:num_preemptions_total)")
    if full:
        parts.append(f"KV cache {usage:.0%} full")
    return _finding(
        "vllm_kv_pressure",
        "warning",
        ", ".join(parts),
        "give vLLM more KV memory (--gpu-memory-utilization or "
        "--kv-cache-memory-bytes), lower --max-num-seqs, or shorten prompts: evicted "
        "blocks are recomputed",
    )


def _external_cache_never_hits(facts: VllmFacts) -> Finding | None:
    """LMCache's own lookups judge it when known: vLLM asks its connector only for what its own
    cache lacks, so external hits of 0 are healthy when vLLM's cache served everything. The
    connector is broken when it was asked, held nothing, while prompts did repeat (vLLM's own
    cache hit). Without LMCache's counters, vLLM's external counters are all there is."""
    if facts.connector_lookup_tokens is not None and facts.connector_found_tokens is not None:
        if (
            facts.connector_lookup_tokens <= 0
            or facts.connector_found_tokens > 0
            or (facts.external_hits or 0) > 0
            or (facts.prefix_hits or 0) <= 0
        ):
            return None
        evidence = (
            f"LMCache was asked for {facts.connector_lookup_tokens} tokens and held none "
            f"(lmcache_mp_lookup_hit_tokens_total = 0), while vLLM's own cache hit "
            f"{facts.prefix_hits}: the prompts repeat, yet LMCache never finds them"
        )
    elif (facts.external_queries or 0) > 0 and facts.external_hits == 0:
        evidence = (
            f"the KV connector was asked for {facts.external_queries} tokens and found none "
            "(vllm:external_prefix_cache_hits_total = 0)"
        )
    else:
        return None
    return _finding(
        "external_cache_never_hits",
        "warning",
        evidence,
        "check that the connector stores (kv_role kv_both), that every process "
        "shares PYTHONHASHSEED and the hash algorithm, and that LMCache's chunk size "
        "matches",
    )


def _hybrid_align_crash(facts: VllmFacts) -> Finding | None:
    """A Mamba2 hybrid in align mode on CPU dies on the first prompt longer than one step."""
    run, config = facts.hybrid, facts.cache_config
    if run is None or config is None or run.platform != "cpu" or run.mixer != "mamba2":
        return None
    block = config.block_size or int_label(config.labels.get("mamba_block_size"))
    if config.labels.get("mamba_cache_mode") != "align" or not block:
        return None
    batched = int_label(config.labels.get("max_num_batched_tokens")) or run.max_num_batched_tokens
    problems = []
    if (batched or CPU_DEFAULT_BATCHED_TOKENS) > block:
        shown = batched or f"vLLM's CPU default {CPU_DEFAULT_BATCHED_TOKENS}"
        problems.append(f"max_num_batched_tokens {shown} > block {block}")
    if run.chunk_size is not None and run.chunk_size < block:
        problems.append(f"Mamba chunk {run.chunk_size} < block {block}")
    if not problems:
        return None
    return _finding(
        "vllm_hybrid_align_crash",
        "error",
        f"{run.model_family} (Mamba2) on CPU in mamba_cache_mode align with "
        + " and ".join(problems)
        + ": the first prompt longer than a step kills the engine core (IndexError in "
        "mamba_mixer2)",
        f"restart with vllm_start (it plans the recipe), or --max-num-batched-tokens {block} "
        f"and a Mamba chunk of at least {block} (--hf-overrides)",
    )


def _hybrid_state_not_cached(facts: VllmFacts) -> Finding | None:
    config = facts.cache_config
    if facts.hybrid is None or config is None or config.enable_prefix_caching is False:
        return None
    if config.labels.get("mamba_cache_mode") != "none":
        return None
    return _finding(
        "vllm_hybrid_state_not_cached",
        "warning",
        f"{facts.hybrid.model_family} runs with mamba_cache_mode none: its Mamba state is "
        "never kept, so no prefix is reused",
        "restart with vllm_start (prefix caching on, from which vLLM derives align mode, and "
        "the platform's recipe)",
    )


RULES: tuple[Callable[[VllmFacts], Finding | None], ...] = (
    _prefix_caching_off,
    _hybrid_align_crash,
    _hybrid_state_not_cached,
    _prompt_tokens_details_off,
    _block_larger_than_shared_prefix,
    _kv_pressure,
    _external_cache_never_hits,
)
"""The rules for a vLLM that answers, in the order their findings are listed."""


def _finding(id_: str, severity: Severity, evidence: str, fix: str) -> Finding:
    return Finding(id=id_, severity=severity, component="vllm", evidence=evidence, fix=fix)
