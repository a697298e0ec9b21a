"""Measure the golden path over MCP, as an agent drives it: from nothing to a verified warm cache.

    .venv/bin/python tools/measure_golden_path.py --model DIR --vllm-python .venv-vllm/bin/python

Starts `graph-kvcache-mcp` over stdio (the SDK's `Client`, as a host would) with a fresh data
dir, then calls vllm_start -> bundle_compile -> bundle_chat -> bundle_chat -> diagnose_stack and
prints each call's seconds and what it showed, as a Markdown table; vllm_stop cleans up. On a CPU
box pass a small local model (graph_kvcache_mcp/fixtures/tiny_model.py builds one) and
CPU flags are chosen for it.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

QUERY = "Which settings decide whether vLLM reuses a cached prefix?"
TOPICS = ("prefix cache", "block hash", "kv offload", "chunk size", "eviction", "tokenizer")


def evidence(count: int) -> list[dict[str, Any]]:
    """`count` distinct items about caching, long enough for a bundle of several blocks."""
    return [
        {
            "id": f"ev-{n:03d}",
            "text": f"Finding {n}: the {TOPICS[n % len(TOPICS)]} behaves as measured; blocks of "
            f"{16 * (1 + n % 4)} tokens are reused while the {TOPICS[n % len(TOPICS)]} is warm.",
            "kind": ("claim", "observation", "document")[n % 3],
            "source_refs": [f"doc-{n}"],
        }
        for n in range(count)
    ]


def server(data_dir: Path, vllm_python: str, port: int) -> StdioServerParameters:
    script = Path(sys.executable).with_name("graph-kvcache-mcp")
    command = str(script) if script.exists() else shutil.which("graph-kvcache-mcp")
    if command is None:
        sys.exit("graph-kvcache-mcp is not installed next to this interpreter or on PATH")
    env = {
        "GRAPH_KVCACHE_DATA_DIR": str(data_dir),
        "GRAPH_KVCACHE_VLLM_PYTHON": vllm_python,
        "VLLM_BASE_URL": f"http://127.0.0.1:{port}/v1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CACHE_ROOT": str(data_dir / "vllm-cache"),
    }
    return StdioServerParameters(command=command, args=[], env=env)


async def timed(
    client: Client, rows: list[tuple[str, float, str]], tool: str, arguments: dict[str, Any]
) -> dict[str, Any]:
    start = time.perf_counter()
    result = await client.call_tool(tool, arguments)
    seconds = time.perf_counter() - start
    if result.is_error or result.structured_content is None:
        text = " ".join(getattr(block, "text", "") for block in result.content)
        raise SystemExit(f"{tool} failed after {seconds:.1f} s: {text}")
    out = dict(result.structured_content)
    rows.append((tool, seconds, summary(tool, out)))
    return out


def summary(tool: str, out: dict[str, Any]) -> str:
    if tool == "vllm_start":
        return f"running={out.get('running')} reused={out.get('reused')}"
    if tool == "bundle_compile":
        return f"{out['selected']} items, {out['tokens_used']} tokens, cache {out['cache']}"
    if tool == "bundle_chat":
        trace = out.get("trace") or {}
        return (
            f"prompt {trace.get('prompt_tokens')} tokens, "
            f"prefix_cache_hit_tokens {trace.get('prefix_cache_hit_tokens')}"
        )
    if tool == "diagnose_stack":
        found = ", ".join(f"{f['id']} ({f['severity']})" for f in out["findings"]) or "none"
        return f"findings: {found}"
    return ""


async def main(args: argparse.Namespace) -> None:
    rows: list[tuple[str, float, str]] = []
    with tempfile.TemporaryDirectory(prefix="golden-path-") as tmp:
        data_dir = Path(tmp)
        start = time.perf_counter()
        async with Client(server(data_dir, args.vllm_python, args.port)) as client:
            connected = time.perf_counter() - start
            try:
                await timed(
                    client,
                    rows,
                    "vllm_start",
                    {
                        "model": args.model,
                        "served_model_name": args.served_model_name,
                        "max_model_len": 4096,
                        "dtype": "bfloat16",
                        "block_size": 32,
                        "kv_cache_memory_bytes": 256 * 1024 * 1024,
                    },
                )
                compiled = await timed(
                    client,
                    rows,
                    "bundle_compile",
                    {"query": QUERY, "items": evidence(40), "token_budget": 900},
                )
                for turn in ("What does the cache key depend on?", "Which block size is used?"):
                    await timed(
                        client, rows, "bundle_chat", {"key": compiled["key"], "turn_text": turn}
                    )
                await timed(client, rows, "diagnose_stack", {})
            finally:
                await client.call_tool("vllm_stop", {})
    total = sum(seconds for _, seconds, _ in rows)
    print(f"connect (initialize): {connected:.2f} s\n")
    print("| # | tool call | seconds | what it showed |")
    print("|---|---|---|---|")
    for index, (tool, seconds, shown) in enumerate(rows, 1):
        print(f"| {index} | `{tool}` | {seconds:.2f} | {shown} |")
    print(f"| | total ({len(rows)} calls) | {total:.2f} | |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="local model dir to serve")
    parser.add_argument("--served-model-name", default="tiny-llama")
    parser.add_argument("--vllm-python", required=True, help="python of the venv with vLLM")
    parser.add_argument("--port", type=int, default=8011)
    anyio.run(main, parser.parse_args())
