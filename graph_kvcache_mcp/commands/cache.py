"""`graph-kvcache-mcp cache warm|evict|pin|unpin`: the cache_* tools, one shot, on one fleet
instance's LMCache server through its coordinator."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from graph_kvcache_mcp.commands._common import (
    EXIT_OK,
    EXIT_UNAVAILABLE,
    chat_body,
    emit,
    fleet_options,
    run_async,
)
from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.errors import ConfigError, VllmRequestError
from graph_kvcache_mcp.services.cache import operations as cache_service
from graph_kvcache_mcp.services.cache.operations import CacheOut
from graph_kvcache_mcp.services.fleet.feed_edge import fleet_once
from graph_kvcache_mcp.services.fleet.tiers import TierSources


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    group = subparsers.add_parser(
        "cache", help="warm, evict or pin a prompt on an instance's LMCache server"
    )
    verbs = group.add_subparsers(dest="verb", required=True)
    parent = fleet_options()
    parent.add_argument(
        "--instance",
        default=None,
        help="the fleet instance to act on (default: the only one, when the fleet has one)",
    )
    what = parent.add_mutually_exclusive_group(required=True)
    what.add_argument("--messages", type=Path, help="JSON chat-completions body")
    what.add_argument("--prompt", help="a completions prompt")
    warm = verbs.add_parser("warm", parents=[parent], help="copy the prompt from L2 into L1")
    warm.add_argument("--timeout", type=float, default=30.0, help="seconds to wait (default 30)")
    evict = verbs.add_parser("evict", parents=[parent], help="drop the prompt from L1")
    evict.add_argument(
        "--tier",
        choices=("l1", "l2"),
        default="l1",
        help="l1: the lmcache server's memory (default); l2: its L2 store",
    )
    verbs.add_parser("pin", parents=[parent], help="pin the prompt's L2 keys (coordinator)")
    verbs.add_parser("unpin", parents=[parent], help="remove one pin from them")
    for verb in ("warm", "evict", "pin", "unpin"):
        verbs.choices[verb].set_defaults(handler=run_cache)


def run_cache(args: argparse.Namespace, settings: Settings) -> int:
    request: dict[str, Any] | None = None
    if args.messages is not None:
        request = chat_body(args.messages)
        if not isinstance(request.get("messages"), list):
            raise ConfigError(f"{args.messages} has no messages list")
    if args.verb == "warm" and not 0 < args.timeout <= 300:
        raise ConfigError("--timeout must be more than 0 and at most 300 seconds")

    async def main() -> int:
        try:
            async with fleet_once(settings, args.fleet) as conn:
                instance = args.instance or only_instance(conn.names)
                target = await cache_service.resolve_target(
                    conn, TierSources(settings), instance, request=request, prompt=args.prompt
                )
                if isinstance(target, Unavailable):
                    out = CacheOut(instance=instance, done=False, reason=target.reason)
                elif args.verb == "warm":
                    out = await cache_service.warm(instance, target, timeout_s=args.timeout)
                elif args.verb == "evict":
                    out = await cache_service.evict(instance, target, tier=args.tier)
                else:
                    out = await cache_service.pin(instance, target, on=args.verb == "pin")
        except VllmRequestError as exc:
            raise ConfigError(str(exc)) from None
        emit(out, as_json=args.json, human=_describe)
        return EXIT_OK if out.done else EXIT_UNAVAILABLE

    return run_async(main)


def only_instance(names: list[str]) -> str:
    """The fleet's one instance, which `--instance` may then leave out.

    Raises:
        ConfigError: the fleet has several (or none): name one with --instance.
    """
    if len(names) == 1:
        return names[0]
    listed = ", ".join(names) or "none"
    raise ConfigError(f"the fleet has {len(names)} instances ({listed}): name one with --instance")


def _describe(out: CacheOut) -> str:
    head = f"{out.instance}: {'done' if out.done else 'not done'}"
    facts = [
        f"{label} {value}"
        for label, value in (
            ("chunks", out.chunks),
            ("found", out.found),
            ("affected", out.affected),
        )
        if value is not None
    ]
    lines = [head + (f" ({', '.join(facts)})" if facts else "")]
    lines += [text for text in (out.reason, out.note) if text]
    return "\n".join(lines)
