"""`graph-kvcache-mcp fleet status|where|effectiveness`: the fleet_* tools, one shot: connect to
each feed, replay its buffer, answer, exit."""

from __future__ import annotations

import argparse
from pathlib import Path

import anyio

from graph_kvcache_mcp.commands import fleet_pki
from graph_kvcache_mcp.commands._common import (
    EXIT_OK,
    EXIT_UNAVAILABLE,
    chat_body,
    emit,
    fleet_options,
    run_async,
)
from graph_kvcache_mcp.commands._flags import add_flag
from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.domain.fleet.memory import FleetMemory, describe_pool
from graph_kvcache_mcp.errors import ConfigError, VllmRequestError
from graph_kvcache_mcp.services.fleet import operations as fleet_service
from graph_kvcache_mcp.services.fleet.feed_edge import fleet_once
from graph_kvcache_mcp.services.fleet.tiers import TierSources
from graph_kvcache_mcp.services.fleet.views import (
    FleetEffectivenessOut,
    FleetStatusOut,
    FleetWhereOut,
)

MAX_WINDOW_S = 3600.0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    group = subparsers.add_parser(
        "fleet",
        help="several vLLM instances: where prefixes are cached, pressure, payoff; the fleet's PKI",
    )
    verbs = group.add_subparsers(dest="verb", required=True)
    parent = fleet_options()

    status = verbs.add_parser("status", parents=[parent], help="instances, findings, index")
    add_flag(
        status,
        "--prefixes",
        fleet_service.ListedPrefixes,
        default=10,
        help="longest prefixes to list",
    )
    status.set_defaults(handler=run_status)

    where = verbs.add_parser("where", parents=[parent], help="where a prompt's prefix is cached")
    what = where.add_mutually_exclusive_group(required=True)
    what.add_argument("--messages", type=Path, help="JSON chat-completions body")
    what.add_argument("--prompt", help="a completions prompt")
    where.set_defaults(handler=run_where)

    effect = verbs.add_parser(
        "effectiveness", parents=[parent], help="prompt tokens by source, hit rates, tier payoff"
    )
    effect.add_argument(
        "--window",
        type=float,
        default=None,
        help="measure over the next SECONDS (default: since each instance started)",
    )
    effect.set_defaults(handler=run_effectiveness)

    fleet_pki.register(verbs)


def run_status(args: argparse.Namespace, settings: Settings) -> int:

    async def main() -> int:
        async with fleet_once(settings, args.fleet) as conn:
            out = await fleet_service.status(
                conn, prefixes=args.prefixes, tiers=TierSources(settings)
            )
        emit(out, as_json=args.json, human=_describe_status)
        return EXIT_OK if any(i.reachable for i in out.instances) else EXIT_UNAVAILABLE

    return run_async(main)


def run_where(args: argparse.Namespace, settings: Settings) -> int:
    request = None
    if args.messages is not None:
        request = chat_body(args.messages)
        if not isinstance(request.get("messages"), list):
            raise ConfigError(f"{args.messages} has no messages list")

    async def main() -> int:
        try:
            async with fleet_once(settings, args.fleet) as conn:
                out = await fleet_service.where_cached(
                    conn, request=request, prompt=args.prompt, tiers=TierSources(settings)
                )
        except VllmRequestError as exc:
            raise ConfigError(str(exc)) from None
        emit(out, as_json=args.json, human=_describe_where)
        return EXIT_OK if out.reachable else EXIT_UNAVAILABLE

    return run_async(main)


def run_effectiveness(args: argparse.Namespace, settings: Settings) -> int:
    if args.window is not None and not 0 < args.window <= MAX_WINDOW_S:
        raise ConfigError(f"--window takes 0 to {MAX_WINDOW_S:g} seconds")

    async def main() -> int:
        async with fleet_once(settings, args.fleet) as conn:
            tiers = TierSources(settings)
            before = None
            if args.window is not None:
                before = await fleet_service.counters(conn, tiers)
                await anyio.sleep(args.window)
            out, _now = await fleet_service.effectiveness(
                conn,
                before,
                since_id=None if before is None else f"{args.window:g} s ago",
                data_dir=settings.data_dir,  # a managed restart in the window counts (as the tool)
                tiers=tiers,
            )
        emit(out, as_json=args.json, human=_describe_effectiveness)
        return EXIT_OK if any(i.reachable for i in out.instances) else EXIT_UNAVAILABLE

    return run_async(main)


def _describe_status(out: FleetStatusOut) -> str:
    lines = []
    for i in out.instances:
        if not i.reachable:
            lines.append(f"{i.name}: unreachable ({i.reason})")
            continue
        usage = f"{i.kv_usage * 100:.1f}%" if i.kv_usage is not None else "?"
        lines.append(
            f"{i.name}: {i.model} vLLM {i.version}, block {i.block_size}, hash {i.hash_algo}, "
            f"KV {usage}, waiting {i.waiting}, preemptions {i.preemptions}, "
            f"{i.blocks_indexed} blocks indexed, feed {i.feed.state}"
        )
    lines += [f"[{f.severity}] {f.message}; fix: {f.fix}" for f in out.findings]
    if out.pressure:
        lines.append("pressure: " + ", ".join(f"{p.rank}. {p.name}" for p in out.pressure))
    lines += _describe_memory(out.memory)
    for p in out.prefixes:
        holders = ", ".join(f"{n} ({'/'.join(m)})" for n, m in p.holders.items())
        lines.append(f"{p.tokens} tokens on {holders}: {p.head!r}")
    return "\n".join(lines)


def _describe_memory(memory: FleetMemory | None) -> list[str]:
    if memory is None:
        return []
    lines = []
    for server in memory.servers:
        held = describe_pool(server.l1) if server.l1 else server.reason
        lines.append(f"LMCache {server.server} ({', '.join(server.instances)}): L1 {held}")
    lines += [f"shared L2 {p.backend}: {describe_pool(p)}" for p in memory.shared_l2]
    return lines


def _describe_where(out: FleetWhereOut) -> str:
    lines = []
    for i in out.instances:
        if not i.reachable:
            lines.append(f"{i.name}: unreachable ({i.reason})")
        elif i.cached_tokens is None:
            lines.append(f"{i.name}: unknown ({i.reason})")
        else:
            why = i.reason or f"feed {i.freshness.state}"
            trust = "" if i.trusted else f" ({why}: a guess)"
            lines.append(
                f"{i.name}: {i.cached_tokens} of {i.prompt_tokens} prompt tokens cached{trust}"
            )
        if i.tiers:
            held = ", ".join(
                f"{name} {'?' if tier.tokens is None else tier.tokens}"
                for name, tier in i.tiers.items()
            )
            lines.append(f"  tiers: {held}")
    if out.best:
        lines.append(f"best: {out.best}: {out.why}")
    return "\n".join(lines)


def _describe_effectiveness(out: FleetEffectivenessOut) -> str:
    lines = []
    for i in out.instances:
        if i.split is None:
            lines.append(f"{i.name}: {i.reason or 'no prompt_tokens_by_source'}")
            continue
        s = i.split
        lines.append(
            f"{i.name}: {s.prompt_tokens} prompt tokens: {s.computed} computed, "
            f"{s.local_cache} local cache, {s.from_tier} from the tier (hit rate {s.hit_rate})"
        )
        if i.tiers:
            lines.append("  cached by tier: " + ", ".join(f"{k} {v}" for k, v in i.tiers.items()))
    f = out.fleet
    lines.append(
        f"fleet: {f.prompt_tokens} prompt tokens, hit rate {f.hit_rate}, "
        f"tier payoff {f.tier_payoff}"
    )
    return "\n".join(lines)
