"""How `vllm` verbs print for people (the `--json` output is the tool's model itself)."""

from __future__ import annotations

from graph_kvcache_mcp.connectors.vllm.state import VllmLogs, VllmStopResult
from graph_kvcache_mcp.domain.vllm.metrics import MetricsSnapshot
from graph_kvcache_mcp.domain.vllm.traces import Trace, TraceSummary
from graph_kvcache_mcp.services.vllm.restart_reuse import RestartReuseCall, RestartReuseOut
from graph_kvcache_mcp.services.vllm.views import VllmMetricsOut, VllmStatusOut


def describe_trace(trace: Trace) -> str:
    if trace.prefix_cache_hit_tokens is None:
        cache = f"cached tokens unavailable ({trace.note})"
    else:
        cache = (
            f"{trace.prefix_cache_hit_tokens}/{trace.prompt_tokens} prompt tokens from the prefix "
            f"cache ({trace.cached_tokens_source})"
        )
    ttft = f", ttft {trace.ttft_s * 1000:.0f} ms" if trace.ttft_s is not None else ""
    return f"{cache}; {trace.completion_tokens} generated; {trace.latency_s * 1000:.0f} ms{ttft}"


def describe_metrics(out: VllmMetricsOut) -> str:
    return describe_snapshot(out.snapshot) if out.snapshot else f"unavailable: {out.reason}"


def describe_snapshot(snapshot: MetricsSnapshot) -> str:
    def show(value: object) -> str:
        if value is None:
            return "n/a (not exported)"
        return f"{value:.3f}" if isinstance(value, float) else str(value)

    rows = [
        ("model", snapshot.model_name or "(all models)"),
        ("engines", ", ".join(snapshot.engines) or "none"),
        ("prefix cache queries (tokens)", show(snapshot.prefix_cache_queries_tokens)),
        ("prefix cache hits (tokens)", show(snapshot.prefix_cache_hits_tokens)),
        ("prefix cache hit rate", show(snapshot.prefix_cache_hit_rate)),
        ("external cache queries (tokens)", show(snapshot.external_prefix_cache_queries_tokens)),
        ("external cache hits (tokens)", show(snapshot.external_prefix_cache_hits_tokens)),
        ("prompt tokens by source", show(snapshot.prompt_tokens_by_source)),
        ("kv cache usage", show(snapshot.kv_cache_usage_perc)),
        (
            "requests running / waiting",
            f"{snapshot.requests_running} / {snapshot.requests_waiting}",
        ),
        ("ttft mean (s)", show(snapshot.ttft.mean_s if snapshot.ttft else None)),
    ]
    if snapshot.cache_config is not None:
        config = snapshot.cache_config
        rows.append(("block size", show(config.block_size)))
        rows.append(("prefix caching", show(config.enable_prefix_caching)))
    if snapshot.engine_kv_loaded_bytes is not None:  # vLLM runs EngineKVConnector
        rows.append(
            (
                "engine KV loaded / saved",
                f"{snapshot.engine_kv_loaded_blocks} blocks, {snapshot.engine_kv_loaded_bytes} B"
                f" / {snapshot.engine_kv_saved_blocks} blocks, {snapshot.engine_kv_saved_bytes} B",
            )
        )
        rows.append(
            (
                "engine KV failed loads / dropped saves",
                f"{snapshot.engine_kv_load_failed_blocks} / {snapshot.engine_kv_dropped_blocks}",
            )
        )
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)


def describe_status(status: VllmStatusOut) -> str:
    if not status.running:
        return f"vllm: not running ({status.reason})"
    health = "answering" if status.reachable else f"NOT answering: {status.reason}"
    owner = "started by this tool" if status.managed_by_us else "NOT started by this tool"
    reused = ", already running (reused)" if status.reused else ""
    lines = [f"vllm: running{reused}, {health}, {owner}", f"  url      {status.base_url}"]
    if status.served_models:
        lines.append(f"  models   {', '.join(status.served_models)}")
    if status.pid is not None:
        lines.append(f"  pid      {status.pid}")
    if status.platform is not None:
        lines.append(f"  platform {status.platform.kind} ({status.platform.detail})")
    lines += [f"  note     {line}" for line in status.notes]
    if status.startup_s is not None:
        lines.append(f"  startup  {status.startup_s:.1f} s")
    if status.log_path:
        lines.append(f"  log      {status.log_path}")
    if status.reason and status.reachable:
        lines.append(f"  ({status.reason})")
    return "\n".join(lines)


def describe_summary(summary: TraceSummary) -> str:
    def rate(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.1%}"

    def ms(value: float | None) -> str:
        return "n/a" if value is None else f"{value * 1000:.0f} ms"

    lines = [
        f"calls                  {summary.calls} ({summary.calls_with_cache_info} with cache info)",
        f"sources                {summary.calls_by_source}",
        f"avg prefix hit rate    {rate(summary.avg_prefix_cache_hit_rate)}",
        f"token hit rate         {rate(summary.token_hit_rate)}",
        f"tokens saved           {summary.total_tokens_saved}",
        f"latency p50 / p95      {ms(summary.latency_p50_s)} / {ms(summary.latency_p95_s)}",
    ]
    if summary.compute_saved is not None:
        lines.append(f"prefill saved (est.)   {summary.compute_saved.seconds:.3f} s")
        lines.append(f"  basis: {summary.compute_saved.basis}")
    if summary.note:
        lines.append(f"note: {summary.note}")
    return "\n".join(lines)


def describe_stop(result: VllmStopResult) -> str:
    if not result.stopped:
        return f"vllm: nothing stopped ({result.reason})"
    left = f"; still alive: {result.leftover_pids}" if result.leftover_pids else ""
    return f"vllm: stopped pid {result.pid} ({result.how}){left}"


def describe_logs(logs: VllmLogs) -> str:
    if not logs.exists:
        return f"vllm: no log at {logs.log_path}"
    return logs.text


def describe_reuse(out: RestartReuseOut) -> str:
    def ttft(call: RestartReuseCall) -> str:
        return f"{call.ttft_s:.3f} s" if call.ttft_s is not None else "unknown"

    warm = out.restarted
    source = f"{warm.external_hit_tokens} from the KV tier"
    if warm.lmcache_l1_hit_tokens is not None or warm.lmcache_l2_hit_tokens is not None:
        source += f": LMCache L1 {warm.lmcache_l1_hit_tokens}, L2 {warm.lmcache_l2_hit_tokens}"
    lines = [
        f"prompt {out.prompt_tokens} tokens; restarted {' and '.join(out.restarted_processes)} "
        f"in {out.restart_s:.1f} s",
        f"  cold:      TTFT {ttft(out.cold)}, cached {out.cold.cached_tokens}",
        f"  restarted: TTFT {ttft(warm)}, cached {warm.cached_tokens} ({source})",
        f"  TTFT speed-up: {out.ttft_speedup}x; engine bytes stored {out.engine_bytes_stored}, "
        f"loaded {out.engine_bytes_loaded}",
    ]
    lines += [f"  note: {n}" for n in out.notes]
    return "\n".join(lines)
