"""`graph-kvcache-mcp bundle compile|render`: context bundles from the shell.

Evidence comes as JSONL (one evidence item per line, the shape bundle_compile takes); `--json`
prints exactly what the MCP tools return.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

from graph_kvcache_mcp.commands._common import (
    EXIT_MISS,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    common_options,
    emit,
    note,
    run_async,
)
from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.kv_open import open_kv_client
from graph_kvcache_mcp.domain.bundle import DEFAULT_PREAMBLE, Bundle, ChatMessage
from graph_kvcache_mcp.domain.keys import check_key
from graph_kvcache_mcp.errors import InvalidValue
from graph_kvcache_mcp.services.bundle_views import BundleCompileOut, BundleRenderOut
from graph_kvcache_mcp.services.bundles import compile_cached, load_bundle, make_request, secret_of


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    group = subparsers.add_parser("bundle", help="compile, cache and render context bundles")
    verbs = group.add_subparsers(dest="verb", required=True, metavar="{compile,render}")
    parent = common_options()
    parent.add_argument(
        "--url", dest="kv_url", default=None, help="engine base URL (overrides env)"
    )

    compile_ = verbs.add_parser(
        "compile", parents=[parent], help="select evidence under a budget; cached by content"
    )
    compile_.add_argument(
        "--evidence", required=True, help="JSONL file of evidence items, or - for stdin"
    )
    compile_.add_argument("--query", default="", help="what the bundle should answer")
    compile_.add_argument("--policy-version", default=None)
    compile_.add_argument("--budget", dest="token_budget", type=int, default=None)
    compile_.add_argument("--top-k", type=int, default=None)
    compile_.add_argument("--lambda", dest="diversity_lambda", type=float, default=None)
    compile_.add_argument(
        "--weights", default=None, help="relevance,evidence,freshness (e.g. 0.6,0.25,0.15)"
    )
    compile_.add_argument("--half-life-days", dest="half_life", type=float, default=None)
    compile_.add_argument("--as-of", default=None, help="ISO 8601 instant freshness is measured at")
    compile_.add_argument("--text", action="store_true", help="print the rendered bundle too")
    compile_.add_argument("--no-cache", action="store_true", help="do not use the KV store")
    compile_.set_defaults(handler=run_compile)

    render = verbs.add_parser("render", parents=[parent], help="chat messages for one turn")
    render.add_argument("key", help="a key printed by `bundle compile`")
    render.add_argument("--turn", required=True, help="the user's message")
    render.add_argument("--preamble", default=None, help="system preamble (default: built in)")
    render.add_argument("--preamble-file", type=Path, default=None)
    render.add_argument("--history", type=Path, default=None, help="JSONL of earlier messages")
    render.set_defaults(handler=run_render)


def read_jsonl(lines: Iterable[str], what: str) -> list[dict[str, Any]]:
    """One JSON object per non-empty line.

    Raises:
        InvalidValue: names the first line that is not a JSON object.
    """
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidValue(f"{what} line {number} is not JSON ({exc.msg})") from None
        if not isinstance(record, dict):
            raise InvalidValue(f"{what} line {number} is not a JSON object")
        records.append(record)
    return records


def _lines(source: str) -> list[str]:
    if source == "-":
        return sys.stdin.read().splitlines()
    return Path(source).read_text(encoding="utf-8").splitlines()


def _weights(text: str | None) -> dict[str, float] | None:
    if text is None:
        return None
    parts = text.split(",")
    if len(parts) != 3:
        raise InvalidValue("--weights takes three numbers: relevance,evidence,freshness")
    try:
        values = [float(part) for part in parts]
    except ValueError:
        raise InvalidValue(f"--weights {text!r}: use numbers such as 0.6,0.25,0.15") from None
    return dict(zip(("relevance", "evidence", "freshness"), values, strict=True))


def _as_of(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise InvalidValue(f"--as-of {text!r} is not an ISO 8601 instant") from None


def run_compile(args: argparse.Namespace, settings: Settings) -> int:
    request = make_request(
        args.query,
        read_jsonl(_lines(args.evidence), "evidence"),
        policy_version=args.policy_version,
        token_budget=args.token_budget,
        top_k=args.top_k,
        diversity_lambda=args.diversity_lambda,
        weights=_weights(args.weights),
        freshness_half_life_days=args.half_life,
        as_of=_as_of(args.as_of),
    )

    async def go() -> int:
        secret = secret_of(settings)
        if args.no_cache:
            result = await compile_cached(request, kv=None, secret=secret)
        else:
            async with open_kv_client(settings) as kv:
                result = await compile_cached(request, kv=kv, secret=secret)
        out = BundleCompileOut.from_result(result, include_text=args.text)
        emit(out, as_json=args.json, human=describe_compile)
        if out.store_reachable is False and not args.json:
            note(f"note: bundle compiled but not cached: {out.reason}")
        return EXIT_OK

    return run_async(go)


def run_render(args: argparse.Namespace, settings: Settings) -> int:
    key = check_key(args.key)
    preamble = DEFAULT_PREAMBLE if args.preamble is None else args.preamble
    if args.preamble_file is not None:
        preamble = args.preamble_file.read_text(encoding="utf-8")
    history = None
    if args.history is not None:
        records = read_jsonl(args.history.read_text(encoding="utf-8").splitlines(), "history")
        try:
            history = [ChatMessage.model_validate(record) for record in records]
        except ValueError as exc:
            raise InvalidValue(f"history: {exc}") from None

    async def go() -> int:
        async with open_kv_client(settings) as kv:
            loaded = await load_bundle(kv, key, secret=secret_of(settings))
        if not isinstance(loaded, Bundle):
            out = BundleRenderOut.not_served(key, loaded)
            emit(out, as_json=args.json, human=describe_render)
            return EXIT_MISS if out.reachable else EXIT_UNAVAILABLE
        try:
            messages = loaded.as_prompt_messages(
                args.turn, system_preamble=preamble, history=history
            )
        except ValueError as exc:
            raise InvalidValue(f"history: {exc}") from None
        emit(BundleRenderOut.from_messages(key, messages), as_json=args.json, human=describe_render)
        return EXIT_OK

    return run_async(go)


def describe_compile(out: BundleCompileOut) -> str:
    how = "cache hit" if out.kv_cache_hit else f"{out.cache}, assembled"
    if out.stored:
        how += f", {out.stored}"
    lines = [
        f"{out.key}  ({how}, {out.total_ms:.1f} ms)",
        f"selected {out.selected} of {out.candidates} items, {out.tokens_used}/{out.token_budget} "
        f"tokens ({out.token_counter}); dropped {out.dropped_over_budget} over budget, "
        f"{out.dropped_by_top_k} by top_k; {out.citations} citations, {out.proof_edges} edges",
    ]
    lines += [
        f"  [{item.id}] {item.kind:<12} {item.tokens:>5} tokens  score {item.score:.3f}"
        for item in out.items
    ]
    if out.text is not None:
        lines += ["", out.text.rstrip("\n")]
    return "\n".join(lines)


def describe_render(out: BundleRenderOut) -> str:
    if not out.found:
        return f"{'not found' if out.reachable else 'store unavailable'}: {out.reason}"
    blocks = [f"--- {message.role} ---\n{message.content}" for message in out.messages]
    return "\n".join(blocks)
