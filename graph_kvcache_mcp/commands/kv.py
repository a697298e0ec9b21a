"""`graph-kvcache-mcp kv stats|get|put|exists|probe|key`: the KV store from the shell."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from graph_kvcache_mcp.commands._common import (
    EXIT_MISS,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    common_options,
    emit,
    note,
    read_cli_input,
    run_async,
)
from graph_kvcache_mcp.commands._flags import add_flag
from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.opener import open_kv_client
from graph_kvcache_mcp.domain.engine.limits import MAX_VALUE_BYTES, check_not_empty
from graph_kvcache_mcp.domain.outcomes import Hit
from graph_kvcache_mcp.services.kv.probe import KvProbeOut, ProbeSamples, probe_kv
from graph_kvcache_mcp.services.kv.stats import kv_stats
from graph_kvcache_mcp.services.kv.views import KvExistsOut, KvGetOut, KvPutOut, KvStatsOut


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    group = subparsers.add_parser("kv", help="read, write and inspect the engine's KV store")
    verbs = group.add_subparsers(dest="verb", required=True)
    parent = common_options()
    parent.add_argument(
        "--url", dest="kv_url", default=None, help="engine base URL (overrides env)"
    )

    verbs.add_parser("stats", parents=[parent], help="normalized stats").set_defaults(
        handler=run_stats
    )

    get = verbs.add_parser("get", parents=[parent], help="read one key")
    get.add_argument("key", help="the engine key to read")
    get.add_argument("-o", "--output", type=Path, help="write the value here (default: stdout)")
    get.set_defaults(handler=run_get)

    put = verbs.add_parser("put", parents=[parent], help="store FILE (or stdin) under KEY")
    put.add_argument("key", help="the engine key to store the value under")
    put.add_argument("file", nargs="?", default="-", help="a file path, or - for stdin (default)")
    put.add_argument(
        "--allow-empty",
        action="store_true",
        help="store an empty value (refused otherwise: the engine keeps a key's first value)",
    )
    put.set_defaults(handler=run_put)

    exists = verbs.add_parser("exists", parents=[parent], help="which keys are present")
    exists.add_argument("keys", nargs="+", help="engine keys to look up")
    exists.set_defaults(handler=run_exists)

    probe = verbs.add_parser("probe", parents=[parent], help="reachability, auth, round trip")
    add_flag(probe, "--samples", ProbeSamples, default=20, help="small reads timed for latency")
    probe.add_argument("--no-write", action="store_true", help="skip the canary PUTs")
    probe.set_defaults(handler=run_probe)


def run_stats(args: argparse.Namespace, settings: Settings) -> int:
    async def go() -> int:
        async with open_kv_client(settings) as kv:
            out = await kv_stats(kv, settings)
        emit(out, as_json=args.json, human=_describe_stats)
        return EXIT_OK if out.reachable else EXIT_UNAVAILABLE

    return run_async(go)


def run_get(args: argparse.Namespace, settings: Settings) -> int:
    async def go() -> int:
        async with open_kv_client(settings) as kv:
            outcome = await kv.get(args.key)
        saved_to = None
        if isinstance(outcome, Hit) and args.output is not None:
            args.output.write_bytes(outcome.value)
            saved_to = str(args.output)
        out = KvGetOut.from_outcome(args.key, outcome, saved_to=saved_to)
        if isinstance(outcome, Hit) and args.output is None and not args.json:
            sys.stdout.buffer.write(outcome.value)
            sys.stdout.buffer.flush()
        elif args.json or not out.hit:
            emit(out, as_json=args.json, human=_describe_get)
            if not out.hit:
                return EXIT_MISS if out.reachable else EXIT_UNAVAILABLE
        else:
            print(_describe_get(out), file=sys.stderr)
        return EXIT_OK

    return run_async(go)


def run_put(args: argparse.Namespace, settings: Settings) -> int:
    if args.file == "-" and sys.stdin.isatty():
        note("reading the value from stdin; end with Ctrl-D (or give a FILE after the key)")
    value = read_cli_input(args.file, max_bytes=MAX_VALUE_BYTES, what="the value")
    if not args.allow_empty:
        check_not_empty(value, how_to_allow="pass --allow-empty to store an empty value on purpose")

    async def go() -> int:
        async with open_kv_client(settings) as kv:
            out = KvPutOut.from_outcome(args.key, value, await kv.put(args.key, value))
        emit(out, as_json=args.json, human=_describe_put)
        return EXIT_OK if out.reachable else EXIT_UNAVAILABLE

    return run_async(go)


def run_exists(args: argparse.Namespace, settings: Settings) -> int:
    async def go() -> int:
        async with open_kv_client(settings) as kv:
            out = KvExistsOut.from_outcomes(args.keys, await kv.contains_many(args.keys))
        emit(out, as_json=args.json, human=_describe_exists)
        if not out.reachable:
            return EXIT_UNAVAILABLE
        return EXIT_OK if out.missing_count == 0 and out.reason is None else EXIT_MISS

    return run_async(go)


def run_probe(args: argparse.Namespace, settings: Settings) -> int:
    async def go() -> int:
        async with open_kv_client(settings) as kv:
            out = await probe_kv(kv, samples=args.samples, write=not args.no_write)
        emit(out, as_json=args.json, human=_describe_probe)
        if not out.reachable:
            return EXIT_UNAVAILABLE
        return EXIT_OK if out.passed else EXIT_MISS

    return run_async(go)


def _describe_stats(out: KvStatsOut) -> str:
    if not out.reachable or out.engine is None or out.client is None:
        return f"store unavailable: {out.reason}"
    lines = [f"engine {out.base_url} ({out.backend} backend)"]
    for name, value in out.engine.model_dump(exclude={"backend"}).items():
        lines.append(f"  {name:<22} {'n/a' if value is None else value}")
    lines.append(f"  {'hit_rate':<22} {_ratio(out.hit_rate)} ({out.hit_rate_source or 'no gets'})")
    lines.append(f"  {'dedup_ratio':<22} {_ratio(out.dedup_ratio)}")
    lines.append(f"  {'dedup_hit_share':<22} {_ratio(out.dedup_hit_share)}")
    if out.note:
        lines.append(f"  note: {out.note}")
    return "\n".join(lines)


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def _describe_get(out: KvGetOut) -> str:
    if not out.reachable:
        return f"store unavailable: {out.reason}"
    if not out.hit:
        return f"miss: {out.key}"
    where = f", saved to {out.saved_to}" if out.saved_to else ""
    return f"hit: {out.key} ({out.size_bytes} bytes, sha256 {out.sha256}{where})"


def _describe_put(out: KvPutOut) -> str:
    if not out.reachable:
        return f"store unavailable: {out.reason}"
    text = f"{out.state}: {out.key} ({out.size_bytes} bytes, sha256 {out.sha256})"
    return f"{text}\n  note: {out.note}" if out.note else text


def _describe_exists(out: KvExistsOut) -> str:
    lines = [
        f"{'present' if r.present else 'missing' if r.present is False else 'unknown'}  {r.key}"
        for r in out.results
    ]
    if out.reason:
        lines.append(f"store unavailable for some keys: {out.reason}")
    return "\n".join(lines)


def _describe_probe(out: KvProbeOut) -> str:
    lines = [f"probe {out.base_url}: {'PASS' if out.passed else 'FAIL'}"]
    lines += [f"  [{'ok' if c.passed else 'FAIL'}] {c.name}: {c.detail}" for c in out.checks]
    return "\n".join(lines)
