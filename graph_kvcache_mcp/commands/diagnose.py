"""`graph-kvcache-mcp diagnose miss|stack|budget`: what the diagnose_* tools return, in a shell."""

from __future__ import annotations

import argparse
from pathlib import Path

from graph_kvcache_mcp.commands._common import (
    EXIT_MISS,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    chat_body,
    common_options,
    emit,
    run_async,
)
from graph_kvcache_mcp.commands._flags import add_flag
from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.vllm.access import open_client
from graph_kvcache_mcp.connectors.vllm.local_tokens import LocalChatTokenizer
from graph_kvcache_mcp.domain.diagnosis.kv_budget import KvBudget, KvMemoryGib, UnitTokens
from graph_kvcache_mcp.domain.diagnosis.stack_findings import StackDiagnosis
from graph_kvcache_mcp.domain.diagnosis.tier_miss import TierMiss
from graph_kvcache_mcp.domain.vllm.hybrid.cache import is_hybrid_config
from graph_kvcache_mcp.domain.vllm.hybrid.gpu_rules import GpuChoice, VllmVersion
from graph_kvcache_mcp.domain.vllm.launch import MaxModelLen
from graph_kvcache_mcp.errors import ConfigError, VllmRequestError
from graph_kvcache_mcp.services.diagnosis.kv_budget import budget_for
from graph_kvcache_mcp.services.diagnosis.prefix_miss import MissDiagnosis, explain_miss
from graph_kvcache_mcp.services.diagnosis.stack_check import check_stack


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    group = subparsers.add_parser(
        "diagnose", help="why a request missed the prefix cache, stack checks, KV budget"
    )
    verbs = group.add_subparsers(dest="verb", required=True)
    parent = common_options()

    miss = verbs.add_parser(
        "miss", parents=[parent], help="why the second chat request misses vLLM's prefix cache"
    )
    miss.add_argument("--first", type=Path, required=True, help="JSON chat-completions body")
    miss.add_argument("--second", type=Path, required=True, help="JSON chat-completions body")
    miss.add_argument(
        "--base-url", dest="vllm_base_url", default=None, help="vLLM base URL (or VLLM_BASE_URL)"
    )
    miss.add_argument("--model", default=None, help="served model (default: the only one)")
    miss.add_argument("--block-size", type=int, help="default: vLLM's cache_config_info")
    miss.add_argument("--verify", action="store_true", help="also send both, report cached")
    miss.add_argument(
        "--tokenizer",
        type=Path,
        default=None,
        help="local HF tokenizer dir (tokenizer.json + chat template): no vLLM needed; "
        "give --block-size",
    )
    miss.set_defaults(handler=run_miss)

    stack = verbs.add_parser(
        "stack", parents=[parent], help="check engine, vLLM and LMCache for misconfiguration"
    )
    stack.add_argument(
        "--base-url", dest="vllm_base_url", default=None, help="vLLM base URL (or VLLM_BASE_URL)"
    )
    stack.add_argument("--model", default=None, help="served model (default: the only one)")
    stack.add_argument("--url", dest="kv_url", default=None, help="engine base URL")
    stack.add_argument("--lmcache-url", default=None, help="lmcache server HTTP URL")
    stack.add_argument("--shared-prefix-tokens", type=int, help="prefix requests share")
    stack.set_defaults(handler=run_stack)

    budget = verbs.add_parser(
        "budget", parents=[parent], help="KV bytes per token, tokens that fit, chunk bytes"
    )
    budget.add_argument("--hf-config", required=True, help="local config.json or model dir")
    budget.add_argument("--kv-dtype", help="KV cache dtype (default: the model's), e.g. fp8")
    add_flag(budget, "--kv-memory-gib", KvMemoryGib, help="KV memory to fill, in GiB")
    add_flag(budget, "--chunk-size", UnitTokens, help="LMCache chunk size in tokens")
    add_flag(budget, "--block-size", UnitTokens, help="vLLM block size in tokens")
    budget.add_argument(
        "--platform", choices=("cpu", "gpu"), help="a hybrid's layout (default: this machine)"
    )
    add_flag(budget, "--gpu", GpuChoice, help="a hybrid's card: a100|h100|h200|b200 or 9.0")
    add_flag(budget, "--vllm-version", VllmVersion, help="its vLLM (default: the pin)")
    add_flag(budget, "--max-model-len", MaxModelLen, help="context (default: the config's)")
    budget.add_argument(
        "--no-prefix-caching", action="store_true", help="a hybrid without align mode"
    )
    budget.set_defaults(handler=run_budget)


def run_miss(args: argparse.Namespace, settings: Settings) -> int:
    first, second = chat_body(args.first), chat_body(args.second)

    async def diagnose() -> MissDiagnosis:
        if args.tokenizer is not None:
            local = LocalChatTokenizer(args.tokenizer)
            return await explain_miss(
                None,
                local,
                first,
                second,
                model=local.name,
                block_size=args.block_size,
                verify=args.verify,
                hybrid=is_hybrid_config(local.model_config()),
            )
        async with open_client(settings) as client:
            return await explain_miss(
                client,
                client.routes,
                first,
                second,
                model=args.model or settings.vllm_model,
                block_size=args.block_size,
                verify=args.verify,
                settings=settings,
            )

    async def main() -> int:
        try:
            out = await diagnose()
        except VllmRequestError as exc:
            raise ConfigError(str(exc)) from None
        emit(out, as_json=args.json, human=_describe_miss)
        if not out.reachable:
            return EXIT_UNAVAILABLE
        return (
            EXIT_MISS
            if out.verification and out.verification.matches_prediction is False
            else EXIT_OK
        )

    return run_async(main)


def _describe_miss(out: MissDiagnosis) -> str:
    if not out.reachable:
        return f"vLLM unreachable: {out.reason}"
    lines = [
        f"{out.model}: block size {out.block_size} ({out.block_size_source}), "
        f"tokenized by {out.tokenizer}",
        f"  prompts: {out.first_tokens} and {out.second_tokens} tokens, "
        f"{out.common_prefix_tokens} in common"
        + (
            ""
            if out.first_divergent_token is None
            else f", part at token {out.first_divergent_token}"
        ),
        f"  predicted cached tokens for the second: {out.predicted_cached_tokens}",
    ]
    if out.divergence is not None:
        where = out.divergence
        if where.message_index is not None:
            lines.append(f"  parts in message {where.message_index} ({where.role})")
        lines.append(f"  first:  {where.first_excerpt!r}")
        lines.append(f"  second: {where.second_excerpt!r}")
    if out.cause is not None:
        lines += [f"cause: {out.cause.kind}: {out.cause.detail}", f"fix: {out.cause.fix}"]
    if out.verification is not None:
        check = out.verification
        verdict = {True: "matches", False: "MISMATCH", None: "unknown"}[check.matches_prediction]
        lines.append(
            f"verified: vLLM cached {check.cached_tokens} ({check.cached_tokens_source}), "
            f"predicted {out.predicted_cached_tokens}: {verdict}"
        )
        if check.note:
            lines.append(f"  {check.note}")
    if out.tiers is not None:
        lines += _describe_tiers(out.tiers)
    return "\n".join(lines)


def _describe_tiers(tiers: TierMiss) -> list[str]:
    lines = [f"tiers ({tiers.lmcache_url}): next request gets {tiers.cached_tokens} cached"]
    for verdict in tiers.tiers:
        lines.append(
            f"  {verdict.tier}: holds {verdict.held_tokens}, serves {verdict.serves_tokens}: "
            f"{verdict.why}: {verdict.detail}"
        )
    lines += [
        f"  LMCache early exit {reason}: {what}" for reason, what in tiers.early_exits.items()
    ]
    lines += [f"  mismatch: {mismatch}" for mismatch in tiers.mismatches]
    return lines


def run_stack(args: argparse.Namespace, settings: Settings) -> int:
    async def main() -> int:
        async with open_client(settings) as client:
            out = await check_stack(
                settings,
                client,
                model=args.model,
                lmcache_url=args.lmcache_url,
                shared_prefix_tokens=args.shared_prefix_tokens,
            )
        emit(out, as_json=args.json, human=_describe_stack)
        if not out.any_reachable:
            return EXIT_UNAVAILABLE
        return EXIT_MISS if out.has_error else EXIT_OK

    return run_async(main)


def _describe_stack(out: StackDiagnosis) -> str:
    lines = [
        f"{c.component}: {c.target} ({'reachable' if c.reachable else 'UNREACHABLE'})"
        for c in out.checked
    ]
    for finding in out.findings:
        lines.append(f"[{finding.severity}] {finding.id} ({finding.component}): {finding.evidence}")
        lines.append(f"    fix: {finding.fix}")
    if not any(f.severity != "info" for f in out.findings):
        lines.append("no problems found")
    return "\n".join(lines)


def run_budget(args: argparse.Namespace, settings: Settings) -> int:
    out = budget_for(
        args.hf_config,
        kv_dtype=args.kv_dtype,
        kv_memory_gib=args.kv_memory_gib,
        chunk_size=args.chunk_size,
        block_size=args.block_size,
        platform=args.platform,
        max_model_len=args.max_model_len,
        prefix_caching=not args.no_prefix_caching,
        gpu=args.gpu,
        vllm_version=args.vllm_version,
    )
    emit(out, as_json=args.json, human=_describe_budget)
    return EXIT_OK


def _describe_budget(out: KvBudget) -> str:
    per_token = "not modelled" if out.bytes_per_token is None else f"{out.bytes_per_token:,}"
    lines = [
        f"{out.model}: {out.kind}, KV {out.kv_dtype} ({out.dtype_bytes} B)",
        f"  {per_token} bytes per token in {out.full_attention_layers} full-attention layers",
    ]
    if out.sliding_window is not None:
        window = out.sliding_window
        lines.append(
            f"  sliding window: {window.layers} layers x {window.window_tokens} tokens, "
            f"{window.bytes_per_token:,} B/token, at most {window.bytes_per_sequence:,} B/sequence"
        )
    if out.recurrent_state is not None:
        state = out.recurrent_state
        size = "unknown" if state.bytes_per_sequence is None else f"{state.bytes_per_sequence:,}"
        lines.append(
            f"  recurrent state ({state.family}): {state.layers} layers, {size} B/sequence"
        )
    if out.tokens_fit is not None:
        lines.append(f"  {out.tokens_fit:,} tokens fit in {out.kv_memory_gib} GiB")
    if out.block_bytes is not None:
        lines.append(f"  {out.block_bytes:,} bytes per {out.block_size}-token block")
    if out.chunk is not None:
        over = " — OVER the engine's value cap" if out.chunk.over_engine_value_cap else ""
        lines.append(
            f"  {out.chunk.chunk_bytes:,} bytes per {out.chunk.chunk_tokens}-token chunk{over}"
        )
    lines += ["inputs:"] + [f"  {i.name} = {i.value} ({i.source})" for i in out.inputs]
    lines += [f"note: {n}" for n in out.notes]
    return "\n".join(lines)
