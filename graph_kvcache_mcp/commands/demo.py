"""`graph-kvcache-mcp demo`: an MCP client drives this server over stdio and prints a transcript.

Workflow: kv_stats -> kv_put -> kv_get -> kv_probe -> kv_stats(since), then what runs without
vLLM: a context bundle compiled and compiled again (served from its KV cache), a KV budget for a
model config, and a stack diagnosis that says what is missing. It always uses the embedded
default (a managed engine; configured engine URLs are not passed on), in a temporary data dir
unless --data-dir is given, and leaves no engine behind that it started.

With --vllm it then walks the golden path on a CPU vLLM: it makes the tiny local test model with
the vLLM venv's interpreter (`--vllm-python`, else GRAPH_KVCACHE_VLLM_PYTHON; `./run.sh demo
--vllm` sets that venv up once), starts a managed vLLM through vllm_start, compiles a bundle,
chats over it twice (the second turn's prompt tokens come from vLLM's prefix cache), runs
diagnose_stack with vLLM up, and stops the vLLM it started (vllm_stop, whatever happened).
"""

from __future__ import annotations

import argparse
import base64
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graph_kvcache_mcp.commands._common import EXIT_OK, EXIT_UNAVAILABLE, run_async
from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.errors import shortened
from graph_kvcache_mcp.fixtures.tiny_model import build_tiny_model
from graph_kvcache_mcp.services.stack.ports import free_port
from graph_kvcache_mcp.services.stack.stack import Stack

if TYPE_CHECKING:
    from mcp import Client
    from mcp.types import CallToolResult

DEMO_KEY = "demo:hello"
DEMO_VALUE = b"hello from the graph-kvcache-mcp demo"

Say = Callable[[str], None]


class DemoFailed(Exception):
    """A step's result was not what the workflow needs; the message says which and why."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = subparsers.add_parser(
        "demo",
        help="run a scripted MCP session (stats, put, get, probe) against a local engine",
        description="Run a scripted MCP session: start this server over stdio with a temporary "
        "data dir, drive its tools against the engine it starts (stats, put, get, probe) and "
        "print each call and result. Needs the engine (the [engine] extra); --vllm adds a tiny "
        "CPU vLLM.",
    )
    demo.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="use this data dir instead of a temporary one (an engine already running there is "
        "reused and left running)",
    )
    demo.add_argument(
        "--vllm",
        action="store_true",
        help="then walk the golden path on a CPU vLLM with a tiny local model (minutes)",
    )
    demo.add_argument(
        "--vllm-python",
        type=Path,
        default=None,
        help="interpreter of the venv with vLLM (default: GRAPH_KVCACHE_VLLM_PYTHON)",
    )
    demo.set_defaults(handler=run_demo)


def run_demo(args: argparse.Namespace, settings: Settings) -> int:
    # The demo ignores configured engines on purpose: it shows the embedded default, so without
    # the engine installed there is nothing to show (main exits 3 with the install command).
    Stack.check_engine_installed()
    temporary = args.data_dir is None
    data_dir = Path(tempfile.mkdtemp(prefix="graph-kvcache-demo-")) if temporary else args.data_dir
    say = _printer()
    golden: GoldenPath | None = None
    try:
        if args.vllm:
            python = args.vllm_python or settings.vllm_python
            if python is None or not Path(python).exists():
                say(
                    f"demo --vllm needs the vLLM venv's python (not found: {python}): run "
                    "./run.sh demo --vllm (it sets .venv-vllm up once), or pass --vllm-python"
                )
                return EXIT_UNAVAILABLE
            golden = GoldenPath.prepare(Path(python), data_dir, say)
        return run_async(lambda: demo_session(data_dir, say, golden))
    finally:
        if temporary:
            # The server stops the engine it started on exit; make sure nothing outlives the demo.
            stack = Stack.of(settings.model_copy(update={"data_dir": data_dir}))
            leftover = stack.stop_engine(wait_s=5.0, force=True)
            shutil.rmtree(data_dir, ignore_errors=True)
            who = "the demo" if leftover.stopped else "the server, on exit"
            say(f"cleaned up: the engine was stopped by {who}; {data_dir} removed")


async def demo_session(data_dir: Path, say: Say, golden: GoldenPath | None = None) -> int:
    """Spawn `python -m graph_kvcache_mcp serve` over stdio and run the workflow through it."""
    # Imported here: the SDK costs ~0.4 s, which every other CLI command skips.
    from mcp import Client, StdioServerParameters

    server = StdioServerParameters(
        command=sys.executable,
        args=["-m", "graph_kvcache_mcp", "serve", "--data-dir", str(data_dir)],
        env=golden.environment() if golden else None,
    )
    say(f"graph-kvcache-mcp demo: an MCP client drives the server over stdio (data dir {data_dir})")
    async with Client(server) as client:
        tools = await client.list_tools()
        info = client.server_info
        say(
            f"connected to {info.name if info else '?'} {info.version if info else ''}, "
            f"protocol {client.protocol_version}, {len(tools.tools)} tools: "
            + ", ".join(tool.name for tool in tools.tools)
        )
        try:
            await run_workflow(client, say)
            if golden is not None:
                await golden.walk(client, say)
        except DemoFailed as exc:
            say(f"demo stopped: {exc}")
            return EXIT_UNAVAILABLE
    say("done: every step answered as expected")
    return EXIT_OK


async def run_workflow(client: Client, say: Say) -> None:
    """stats -> put -> get -> probe -> stats(since), each call and its result in plain words."""
    stats = await _call(client, say, 1, "kv_stats", {})
    if not stats["reachable"]:
        raise DemoFailed(f"the store is not reachable: {stats['reason']}")
    say(f"   -> {stats['backend']} backend at {stats['base_url']}")

    value_b64 = base64.b64encode(DEMO_VALUE).decode()
    put = await _call(client, say, 2, "kv_put", {"key": DEMO_KEY, "value_b64": value_b64})
    if not put["reachable"]:
        raise DemoFailed(f"kv_put could not reach the store: {put['reason']}")
    say(f"   -> {put['state']}: {put['size_bytes']} bytes, sha256 {put['sha256'][:16]}...")

    got = await _call(client, say, 3, "kv_get", {"keys": [DEMO_KEY], "include_value": True})
    first = got["results"][0]
    if not first["hit"]:
        raise DemoFailed(f"kv_get did not find {DEMO_KEY}: {first['reason'] or 'a miss'}")
    text = base64.b64decode(first["value_b64"]).decode()
    say(f"   -> hit: {first['size_bytes']} bytes, value {text!r}")

    probe = await _call(client, say, 4, "kv_probe", {"samples": 10})
    for check in probe["checks"]:
        say(f"      [{'ok' if check['passed'] else 'FAIL'}] {check['name']}: {check['detail']}")
    if not probe["passed"]:
        raise DemoFailed("kv_probe reported a failed check (see above)")

    delta = await _call(client, say, 5, "kv_stats", {"since": stats["snapshot_id"]})
    moved = {k: v for k, v in (delta["delta"] or {}).items() if isinstance(v, int) and v}
    say("   -> engine counters moved since step 1: " + (json.dumps(moved) if moved else "none"))
    await run_beyond_kv(client, say)


DEMO_EVIDENCE = [
    {
        "id": "e1",
        "text": "vLLM reuses a cached prefix only when the tokens match exactly.",
        "source_refs": ["docs/vllm.md"],
    },
    {
        "id": "e2",
        "text": "A timestamp at the top of a system prompt defeats prefix caching.",
        "source_refs": ["docs/diagnose.md"],
        "relations": [{"type": "supports", "target": "e1"}],
    },
    {
        "id": "e3",
        "text": "The engine keeps the first value stored under a key.",
        "source_refs": ["docs/kv-store.md"],
    },
]
DEMO_MODEL_CONFIG = {  # a Llama-3.1-8B-shaped config.json, inline
    "model_type": "llama",
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
    "torch_dtype": "bfloat16",
}


async def run_beyond_kv(client: Client, say: Say) -> None:
    """bundle_compile twice (assembled, then served from the KV cache), diagnose_budget on an
    inline config, diagnose_stack: what the stack lacks with no vLLM running."""
    compile_args = {
        "query": "why did my prompt miss the prefix cache?",
        "items": DEMO_EVIDENCE,
        "token_budget": 200,
        "token_counter": "estimate",
    }
    first = await _call(client, say, 6, "bundle_compile", compile_args)
    say(
        f"   -> {first['selected']} of {first['candidates']} items, {first['tokens_used']} "
        f"tokens, key {first['key'][:28]}..., cache: {first['cache']}"
    )
    again = await _call(client, say, 7, "bundle_compile", compile_args)
    if not again["kv_cache_hit"]:
        raise DemoFailed(f"the same bundle was not served from the KV cache: {again['reason']}")
    say(f"   -> same key, served from the KV store (assembled again: {again['assembled']})")

    budget = await _call(client, say, 8, "diagnose_budget", {"hf_config": DEMO_MODEL_CONFIG})
    say(f"   -> {budget['bytes_per_token']} bytes of KV per token ({budget['kv_dtype']})")

    stack = await _call(client, say, 9, "diagnose_stack", {})
    checked = ", ".join(
        f"{c['component']} {'up' if c['reachable'] else 'down'}" for c in stack["checked"]
    )
    say(f"   -> checked {checked}; {len(stack['findings'])} findings")
    for finding in stack["findings"]:
        say(f"      [{finding['severity']}] {finding['id']}: {finding['fix']}")


VLLM_READY_TIMEOUT_S = 900.0
SERVED_MODEL = "tiny-llama"
GOLDEN_QUERY = "Why does a second turn over the same bundle cost fewer prompt tokens?"


@dataclass(frozen=True)
class GoldenPath:
    """The --vllm part: a tiny model made locally, served by a CPU vLLM the server manages."""

    python: Path
    model_dir: Path
    port: int
    cache_root: Path

    @classmethod
    def prepare(cls, python: Path, data_dir: Path, say: Say) -> GoldenPath:
        """Make the tiny model (random weights: the answers are gibberish, the caching real)."""
        say(f"making the tiny local test model with {python} (random weights; seconds)")
        started = time.monotonic()
        model_dir = build_tiny_model(python, data_dir / "tiny-llama")
        say(f"   -> {model_dir} in {time.monotonic() - started:.0f} s")
        return cls(python, model_dir, free_port(), data_dir / "vllm-cache")

    def environment(self) -> dict[str, str]:
        """What the server needs to start and reach this vLLM, offline."""
        return {
            "GRAPH_KVCACHE_VLLM_PYTHON": str(self.python),
            "VLLM_BASE_URL": f"http://127.0.0.1:{self.port}/v1",
            "VLLM_MODEL": SERVED_MODEL,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_CACHE_ROOT": str(self.cache_root),
        }

    async def walk(self, client: Client, say: Say) -> None:
        """vllm_start -> bundle_compile -> bundle_chat twice -> diagnose_stack -> vllm_stop."""
        say("\nthe golden path on a CPU vLLM (starting it takes 1-3 minutes on 2 cores)")
        started = time.monotonic()
        launch = {
            "model": str(self.model_dir),
            "served_model_name": SERVED_MODEL,
            "max_model_len": 4096,
            "dtype": "bfloat16",
            "block_size": 32,
            "kv_cache_memory_bytes": 256 * 1024 * 1024,
            "ready_timeout_s": VLLM_READY_TIMEOUT_S,
        }
        try:
            up = await _call(client, say, 10, "vllm_start", launch)
            if not up.get("running"):
                raise DemoFailed(f"vLLM did not start: {'; '.join(up.get('notes') or [])}")
            say(f"   -> vLLM healthy on port {self.port} after {time.monotonic() - started:.0f} s")
            await self._chat_twice(client, say)
            stack = await _call(client, say, 14, "diagnose_stack", {})
            say(f"   -> {len(stack['findings'])} findings with vLLM up")
            for finding in stack["findings"]:
                say(f"      [{finding['severity']}] {finding['id']}: {finding['fix']}")
        finally:
            stopped = await client.call_tool("vllm_stop", {})
            say(f"\n15. vllm_stop -> {'stopped' if not stopped.is_error else _text(stopped)}")

    async def _chat_twice(self, client: Client, say: Say) -> None:
        compiled = await _call(
            client,
            say,
            11,
            "bundle_compile",
            {"query": GOLDEN_QUERY, "items": GOLDEN_EVIDENCE, "token_budget": 600},
        )
        say(f"   -> {compiled['selected']} items, {compiled['tokens_used']} tokens")
        hits = []
        for step, turn in ((12, "What decides a cache hit?"), (13, "And the block size?")):
            chat = await _call(
                client, say, step, "bundle_chat", {"key": compiled["key"], "turn_text": turn}
            )
            trace = chat.get("trace") or {}
            hits.append(trace.get("prefix_cache_hit_tokens") or 0)
            say(
                f"   -> {trace.get('prompt_tokens')} prompt tokens, "
                f"{trace.get('prefix_cache_hit_tokens')} from vLLM's prefix cache "
                f"(source: {trace.get('cached_tokens_source')})"
            )
        if hits[1] <= 0:
            raise DemoFailed("the second turn over the same bundle hit nothing in the cache")


GOLDEN_EVIDENCE = [
    {
        "id": f"g{n}",
        "text": f"Observation {n}: {text}",
        "source_refs": [f"notes/{n}"],
    }
    for n, text in enumerate(
        [
            "vLLM hashes full blocks of prompt tokens; a block is reused only on an exact match.",
            "A bundle rendered byte for byte the same keeps every block of its prefix reusable.",
            "The system message comes first, so a stable bundle sits at the start of the prompt.",
            "A changed evidence item changes the bundle key and every block after the change.",
            "Prefix caching is on by default; the metrics count queries and hits in tokens.",
            "The engine stores the compiled bundle by content, so compiling again is a cache hit.",
            "A CPU vLLM needs a block size that is a multiple of 32 tokens.",
            "The second turn repeats the system message and the first turn, then adds one more.",
        ]
    )
]


def _text(result: CallToolResult) -> str:
    return " ".join(getattr(block, "text", "") for block in result.content)


async def _call(
    client: Client,
    say: Say,
    step: int,
    tool: str,
    arguments: dict[str, Any],
) -> dict[str, Any]:
    say(f"\n{step}. {tool} {shortened(json.dumps(arguments), limit=120)}")
    result: CallToolResult = await client.call_tool(tool, arguments)
    if result.is_error or result.structured_content is None:
        raise DemoFailed(f"{tool} failed: {_text(result)}")
    return dict(result.structured_content)


def _printer() -> Say:
    def say(line: str) -> None:
        print(line, flush=True)

    return say
