"""`graph-kvcache-mcp diagnose budget`: the same diagnoses the diagnose_* tools return."""

from __future__ import annotations

import argparse

from graph_kvcache_mcp.commands._common import EXIT_OK, common_options, emit
from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.domain.kv_budget import KvBudget
from graph_kvcache_mcp.services.kv_budget import budget_for


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    group = subparsers.add_parser(
        "diagnose", help="why a request missed the prefix cache, stack checks, KV budget"
    )
    verbs = group.add_subparsers(dest="verb", required=True, metavar="{budget}")
    parent = common_options()

    budget = verbs.add_parser(
        "budget", parents=[parent], help="KV bytes per token, tokens that fit, chunk bytes"
    )
    budget.add_argument("--hf-config", required=True, help="local config.json or model dir")
    budget.add_argument("--kv-dtype", help="KV cache dtype (default: the model's), e.g. fp8")
    budget.add_argument("--kv-memory-gib", type=float, help="KV memory to fill, in GiB")
    budget.add_argument("--chunk-size", type=int, help="LMCache chunk size in tokens")
    budget.add_argument("--block-size", type=int, help="vLLM block size in tokens")
    budget.set_defaults(handler=run_budget)


def run_budget(args: argparse.Namespace, settings: Settings) -> int:
    out = budget_for(
        args.hf_config,
        kv_dtype=args.kv_dtype,
        kv_memory_gib=args.kv_memory_gib,
        chunk_size=args.chunk_size,
        block_size=args.block_size,
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
