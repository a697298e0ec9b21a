"""Benchmark what MCP adds to a KV read: kv_get of a 4 KiB value through the in-memory `Client`
vs the direct connector call, measured in the same run against one managed engine.

Usage: `.venv/bin/python tools/bench_mcp.py [--calls N] [--rounds R]`. Needs the `engine` extra.

Rows (interleaved in R rounds so drift hits every row alike; each call timed on its own):
  connector          `await KvClient.get(key)` - the baseline
  connector + view   the same plus building the tool's result model (sha256, base64)
  mcp auto           `client.call_tool("kv_get", ...)`, 2026-07-28 era (direct dispatch)
  mcp legacy         the same over the 2025 initialize handshake (JSON-RPC over memory streams)
  mcp auto, no client check   `mcp auto` with the SDK client's output-schema validation turned
                     off: the difference to `mcp auto` is what that client-side check costs
  mcp auto, SDK schema   `mcp auto` with the client checking against the output schema as the
                     SDK writes it (titles, $ref, anyOf nulls) instead of the lean one this
                     server publishes: the difference is what the lean schema saves
Overhead = row p50 - connector p50, per call. Goal: mcp overhead p50 <= 2 ms. `--clock cpu`
times each call in this process's CPU time instead of wall time: on a machine busy with other
work, what MCP costs this process (client and server both run here) without the waiting.

`--breakdown` also times the pieces of one call on their own (best of 5 rounds, microseconds),
ours (strict argument check, compact text) against the SDK's (output conversion, the client's
output-schema check with the schema as the SDK writes it and as this server publishes it).

`--vllm-chat` instead starts the MP stack of the tests (engine, `lmcache server`, CPU vLLM with
LMCache's MP connector; needs `.venv-vllm` with lmcache) and times, side by side, the same chat
(a shared ~700-token system prompt, a new question, 2 tokens out) sent straight to vLLM with the
openai SDK, through the library's `VllmClient.chat` and through the `vllm_chat` tool (both also
read vLLM's and LMCache's counters once after the call to credit its cached tokens by tier), 60
calls per row by default, with p50/p90, the ratio and the ms over the direct chat, and the load
average. Goal: the tool adds at most 20 ms p50.
"""

from __future__ import annotations

import argparse
import base64
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
from mcp import Client
from mcp.types import CallToolResult
from pydantic import BaseModel

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.client import KvClient
from graph_kvcache_mcp.connectors.engine.process import ManagedEngine
from graph_kvcache_mcp.domain.latency import percentile
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.host.strict_server import compact
from graph_kvcache_mcp.host.tool_schemas import lean_output_schema
from graph_kvcache_mcp.server import build_server
from graph_kvcache_mcp.services.kv.views import KvGetManyOut, KvGetOut

VALUE_BYTES = 4096
GOAL_OVERHEAD_MS = 2.0
KEY = "bench:mcp-4k"

Call = Callable[[], Awaitable[object]]


CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}
clock = CLOCKS["wall"]


async def timed(call: Call, count: int, into: list[float]) -> None:
    for _ in range(count):
        started = clock()
        await call()
        into.append((clock() - started) * 1000)


async def measure(settings: Settings, calls: int, rounds: int) -> dict[str, list[float]]:
    kv = KvClient.connect(settings.kv_url or "", settings.kv_token, timeout_s=settings.kv_timeout_s)
    await kv.put(KEY, os.urandom(VALUE_BYTES))
    arguments = {"keys": [KEY], "include_value": True}

    async def connector() -> object:
        return await kv.get(KEY)

    async def connector_view() -> object:
        outcome = await kv.get(KEY)
        return KvGetManyOut.from_results([KvGetOut.from_outcome(KEY, outcome, include_value=True)])

    samples: dict[str, list[float]] = {
        "connector": [],
        "connector + view": [],
        "mcp auto": [],
        "mcp legacy": [],
        "mcp auto, no client check": [],
        "mcp auto, SDK schema": [],
    }
    async with (
        Client(build_server(settings), mode="auto") as auto,
        Client(build_server(settings), mode="legacy") as legacy,
        Client(build_server(settings), mode="auto") as unchecked,
        Client(build_server(settings), mode="auto") as sdk_schema,
    ):

        async def no_check(name: str, result: object) -> None:
            del name, result

        unchecked.session.validate_tool_result = no_check  # type: ignore[method-assign]
        await sdk_schema.list_tools()  # the client caches each tool's output schema: swap one
        sdk_written = KvGetManyOut.model_json_schema(mode="serialization")
        sdk_schema.session._tool_output_schemas["kv_get"] = sdk_written

        async def via_auto() -> object:
            result = await auto.call_tool("kv_get", arguments)
            assert not result.is_error and result.structured_content is not None
            return result

        async def via_legacy() -> object:
            result = await legacy.call_tool("kv_get", arguments)
            assert not result.is_error and result.structured_content is not None
            return result

        async def via_unchecked() -> object:
            result = await unchecked.call_tool("kv_get", arguments)
            assert not result.is_error and result.structured_content is not None
            return result

        async def via_sdk_schema() -> object:
            result = await sdk_schema.call_tool("kv_get", arguments)
            assert not result.is_error and result.structured_content is not None
            return result

        paths: dict[str, Call] = {
            "connector": connector,
            "connector + view": connector_view,
            "mcp auto": via_auto,
            "mcp legacy": via_legacy,
            "mcp auto, no client check": via_unchecked,
            "mcp auto, SDK schema": via_sdk_schema,
        }
        for call in paths.values():  # warm up connections, caches and code paths
            await timed(call, 20, [])
        per_round = max(1, calls // rounds)
        for _ in range(rounds):
            for name, call in paths.items():
                await timed(call, per_round, samples[name])
    await kv.aclose()
    return samples


def report(samples: dict[str, list[float]]) -> bool:
    base = percentile(samples["connector"], 50) or 0.0
    print(
        f"kv_get of a {VALUE_BYTES // 1024} KiB value, {len(samples['connector'])} calls per row "
        "(per-call ms)"
    )
    print(f"{'path':<26} {'p50':>8} {'p95':>8} {'mean':>8} {'x conn p50':>11} {'overhead p50':>13}")
    for name, values in samples.items():
        p50 = percentile(values, 50) or 0.0
        p95 = percentile(values, 95) or 0.0
        mean = sum(values) / len(values)
        print(
            f"{name:<26} {p50:>8.3f} {p95:>8.3f} {mean:>8.3f} {p50 / base:>10.2f}x "
            f"{p50 - base:>12.3f}"
        )
    worst = max(
        (percentile(samples[name], 50) or 0.0) - base for name in ("mcp auto", "mcp legacy")
    )
    met = worst <= GOAL_OVERHEAD_MS
    print(
        f"MCP overhead p50 (worst era): {worst:.3f} ms per call; goal <= {GOAL_OVERHEAD_MS} ms: "
        f"{'met' if met else 'NOT met'}"
    )
    return met


def best_us(call: Callable[[], object], count: int, rounds: int = 5) -> float:
    """The fastest round's microseconds per call: the piece's own cost, least disturbed."""
    fastest = float("inf")
    for _ in range(rounds):
        started = clock()
        for _ in range(count):
            call()
        fastest = min(fastest, (clock() - started) / count * 1e6)
    return fastest


def breakdown(settings: Settings) -> None:
    """The pieces of one kv_get call, each timed on its own (no engine traffic)."""
    from jsonschema import exceptions as schema_errors  # type: ignore[import-untyped]
    from jsonschema.validators import validator_for  # type: ignore[import-untyped]

    tool = build_server(settings)._tool_manager.get_tool("kv_get")
    assert tool is not None
    meta = tool.fn_metadata
    sdk_arguments: type[BaseModel] = meta.arg_model.__mro__[1]  # before tighten() closed it
    arguments = {"keys": [KEY], "include_value": True}
    value = os.urandom(VALUE_BYTES)
    outcome = KvGetOut.model_validate(
        {"key": KEY, "reachable": True, "hit": True, "size_bytes": VALUE_BYTES}
        | {"sha256": "0" * 64, "value_b64": base64.b64encode(value).decode()}
    )
    out = KvGetManyOut.from_results([outcome])
    result = meta.convert_result(out)
    assert isinstance(result, CallToolResult)
    sdk_schema = KvGetManyOut.model_json_schema(mode="serialization")

    def check(schema: dict[str, object]) -> Callable[[], object]:
        validator = validator_for(schema)(schema)
        return lambda: schema_errors.best_match(validator.iter_errors(result.structured_content))

    rows = [
        ("ours", "strict argument check", lambda: meta.validate_arguments(arguments), 2000),
        ("sdk", "(its lax argument check)", lambda: sdk_arguments.model_validate(arguments), 2000),
        ("ours", "compact text block", lambda: compact(result), 2000),
        (
            "sdk",
            "convert_result (check, dump, indented text)",
            lambda: meta.convert_result(out),
            2000,
        ),
        ("sdk client", "output-schema check, SDK's schema", check(sdk_schema), 300),
        (
            "sdk client",
            "output-schema check, lean schema",
            check(lean_output_schema(sdk_schema)),
            300,
        ),
    ]
    print(f"\n{'whose':<11} {'piece of one kv_get call':<45} {'us':>8}")
    for whose, piece, call, count in rows:
        print(f"{whose:<11} {piece:<45} {best_us(call, count):>8.1f}")


DEFAULT_CALLS = 500
CHAT_CALLS = 60
GOAL_CHAT_OVERHEAD_MS = 20.0
CHAT_RULES = "You answer in one word. " * 120
CHAT_ROWS = ("direct chat", "VllmClient.chat", "vllm_chat tool")


async def measure_chat(settings: Settings, calls: int, rounds: int) -> dict[str, list[float]]:
    """The same chat straight to vLLM, through the library's client (which credits the call's
    cached tokens by tier) and through the vllm_chat tool, interleaved call by call."""
    import openai

    from graph_kvcache_mcp.domain.bundle import ChatMessage
    from graph_kvcache_mcp.services.stack.vllm import open_metered_client

    direct = openai.AsyncOpenAI(base_url=settings.vllm_base_url, api_key="unused")
    library = open_metered_client(settings)
    samples: dict[str, list[float]] = {name: [] for name in CHAT_ROWS}
    asked = 0

    def question() -> str:
        nonlocal asked
        asked += 1
        return f"question {asked}"

    async def straight() -> object:
        return await direct.chat.completions.create(
            model=settings.vllm_model or "",
            messages=[
                {"role": "system", "content": CHAT_RULES},
                {"role": "user", "content": question()},
            ],
            max_tokens=2,
            temperature=0.0,
        )

    async def client_chat() -> object:
        turns = [
            ChatMessage(role="system", content=CHAT_RULES),
            ChatMessage(role="user", content=question()),
        ]
        result = await library.chat(turns, model=settings.vllm_model, max_tokens=2)
        assert not isinstance(result, Unavailable), result
        return result

    async with Client(build_server(settings)) as client:

        async def tool() -> object:
            result = await client.call_tool(
                "vllm_chat", {"system": CHAT_RULES, "message": question(), "max_tokens": 2}
            )
            assert not result.is_error, result
            return result

        paths: dict[str, Call] = dict(zip(CHAT_ROWS, (straight, client_chat, tool), strict=True))
        for call in paths.values():  # warm every path: clients, the model lookup, the prefix cache
            await call()
        for _ in range(rounds):
            for _ in range(max(1, calls // rounds)):
                for name, call in paths.items():
                    await timed(call, 1, samples[name])
    await direct.close()
    await library.aclose()
    return samples


def report_chat(samples: dict[str, list[float]], load_before: tuple[float, ...]) -> bool:
    """p50/p90 per row, each row's ratio to the direct chat and its ms over it."""
    base = {q: percentile(samples["direct chat"], q) or 0.0 for q in (50, 90)}
    print(
        f"chat of ~975 prompt tokens, 2 out, {len(samples['direct chat'])} calls per row "
        f"(per-call ms); load average before {_load(load_before)}, after {_load(os.getloadavg())}"
    )
    print(f"{'path':<16} {'p50':>8} {'p90':>8} {'x direct p50':>13} {'+ms p50':>8} {'+ms p90':>8}")
    for name, values in samples.items():
        p50 = percentile(values, 50) or 0.0
        p90 = percentile(values, 90) or 0.0
        print(
            f"{name:<16} {p50:>8.2f} {p90:>8.2f} {p50 / base[50]:>12.2f}x "
            f"{p50 - base[50]:>8.2f} {p90 - base[90]:>8.2f}"
        )
    overhead = (percentile(samples["vllm_chat tool"], 50) or 0.0) - base[50]
    met = overhead <= GOAL_CHAT_OVERHEAD_MS
    print(
        f"vllm_chat overhead p50: {overhead:.2f} ms; goal <= {GOAL_CHAT_OVERHEAD_MS} ms: "
        f"{'met' if met else 'NOT met'}"
    )
    return met


def _load(load: tuple[float, ...]) -> str:
    return " ".join(f"{value:.2f}" for value in load)


def chat_bench(calls: int, rounds: int) -> None:
    """Start the tests' MP stack, time the chat rows, stop it."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.support.mp_stack import MpStack

    with tempfile.TemporaryDirectory(prefix="bench-mcp-chat-") as root:
        stack = MpStack(Path(root))
        try:
            anyio.run(stack.ensure)
            settings = stack.settings.model_copy(update={"toolsets": ("vllm",)})
            load_before = os.getloadavg()
            samples = anyio.run(measure_chat, settings, calls, rounds)
        finally:
            stack.close()
    report_chat(samples, load_before)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--calls",
        type=int,
        default=DEFAULT_CALLS,
        help=f"timed calls per row (--vllm-chat: {CHAT_CALLS})",
    )
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--breakdown", action="store_true", help="also time each piece alone")
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="cpu: this process's CPU time per call, which other load on the machine barely "
        "moves (the engine's own time is then not counted, in any row)",
    )
    parser.add_argument(
        "--vllm-chat", action="store_true", help="time vllm_chat against a direct chat instead"
    )
    args = parser.parse_args()
    global clock
    clock = CLOCKS[args.clock]
    if args.vllm_chat:
        chat_bench(args.calls if args.calls != DEFAULT_CALLS else CHAT_CALLS, args.rounds)
        return
    with tempfile.TemporaryDirectory(prefix="bench-mcp-") as data_dir:
        engine = ManagedEngine(Path(data_dir))
        status = engine.start(backend="memory")
        try:
            assert status.base_url is not None
            settings = Settings.build(
                kv_url=status.base_url,
                kv_token=engine.token(),
                data_dir=Path(data_dir),
                toolsets=("kv",),
            )
            samples = anyio.run(measure, settings, args.calls, args.rounds)
        finally:
            engine.stop(term_wait_s=5.0)
    report(samples)
    if args.breakdown:
        breakdown(settings)


if __name__ == "__main__":
    main()
