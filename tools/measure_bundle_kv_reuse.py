"""Measure vLLM prefix-cache reuse of context bundles: one cold and one warm call per bundle.

For each of N independent bundles (a per-run nonce in the evidence and at the head of the system
message, so every run starts cold), the cold call sends the bundle with one question and the warm
call the same bundle with another. Per call: latency, prompt tokens, hit tokens from the
response's usage (`cached_tokens`) and the hit-token move of `vllm:prefix_cache_hits_total` for
the model around that call; then a summary (warm/cold latency ratio, hit rates, agreement).

Usage: `.venv/bin/python tools/measure_bundle_kv_reuse.py [--base-url URL] [--model M]
[--bundles 3] [--items 40] [--budget 1200] [--json]`. Needs a running vLLM with prefix caching
(and `--enable-prompt-tokens-details` for the usage column). The `bundle_reuse_measure` tool runs
the same measurement.
"""

from __future__ import annotations

import argparse
import sys

import anyio

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.vllm.client import VllmClient
from graph_kvcache_mcp.services.bundle.reuse import ReuseReport, measure_bundle_reuse, reuse_table


async def run(args: argparse.Namespace) -> ReuseReport:
    settings = Settings.from_env()
    base_url = args.base_url or settings.vllm_base_url

    async def progress(done: int, total: int, message: str) -> None:
        print(f"[{done}/{total}] {message}", file=sys.stderr, flush=True)

    async with VllmClient(base_url, api_key=settings.vllm_api_key) as client:
        return await measure_bundle_reuse(
            client,
            model=args.model or settings.vllm_model,
            bundles=args.bundles,
            items=args.items,
            token_budget=args.budget,
            max_tokens=args.max_tokens,
            progress=progress,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default=None, help="vLLM base URL (default: VLLM_BASE_URL)")
    parser.add_argument("--model", default=None, help="served model (default: the only one)")
    parser.add_argument("--bundles", type=int, default=3)
    parser.add_argument("--items", type=int, default=40, help="evidence items per bundle")
    parser.add_argument("--budget", type=int, default=1200, help="token budget per bundle")
    parser.add_argument("--max-tokens", type=int, default=4, help="tokens to generate per call")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args()
    report = anyio.run(run, args)
    print(report.model_dump_json(indent=2) if args.json else reuse_table(report))
    return 0 if report.reachable else 3


if __name__ == "__main__":
    raise SystemExit(main())
