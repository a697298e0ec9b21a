"""`graph-kvcache-mcp bundle compile|render|chat|reuse-measure`: context bundles from the shell.

Evidence comes as JSONL (one evidence item per line, the shape bundle_compile takes); `--json`
prints exactly what the MCP tools return.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from contextlib import AsyncExitStack
from datetime import datetime
from pathlib import Path
from typing import Any

from graph_kvcache_mcp.commands._common import (
    EXIT_MISS,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    Verbs,
    common_options,
    emit,
    note,
    read_cli_input,
    run_async,
)
from graph_kvcache_mcp.commands._flags import add_flag, add_model_flags
from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.opener import open_kv_client
from graph_kvcache_mcp.connectors.vllm.access import open_client
from graph_kvcache_mcp.connectors.vllm.tokens import token_counter_for
from graph_kvcache_mcp.domain.bundle import DEFAULT_PREAMBLE, Bundle, ChatMessage
from graph_kvcache_mcp.domain.bundle.models import BundleParams, ChatAnswerTokens, Query
from graph_kvcache_mcp.domain.engine.keys import check_key
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.errors import InvalidValue, VllmRequestError
from graph_kvcache_mcp.host.http_app import MAX_HTTP_BODY_BYTES
from graph_kvcache_mcp.services.bundle.bundles import (
    ExactTokenCounter,
    bundle_chat,
    compile_cached,
    load_bundle,
    make_request,
    secret_of,
)
from graph_kvcache_mcp.services.bundle.reuse import (
    ReuseAnswerTokens,
    ReuseBudget,
    ReuseBundles,
    ReuseItems,
    measure_bundle_reuse,
    reuse_table,
)
from graph_kvcache_mcp.services.bundle.views import (
    BundleChatOut,
    BundleCompileOut,
    BundleRenderOut,
)

COMPILE_FLAGS = (
    "policy_version",
    "token_budget",
    "top_k",
    "diversity_lambda",
    "freshness_half_life_days",
)
"""`BundleParams` fields `bundle compile` takes as flags."""


def register(subparsers: Verbs) -> None:
    group = subparsers.add_parser("bundle", help="compile, cache and render context bundles")
    verbs = group.add_subparsers(dest="verb", required=True)
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
    add_flag(compile_, "--query", Query, default="", help="what the bundle should answer")
    add_model_flags(
        compile_,
        BundleParams,
        COMPILE_FLAGS,
        flags={
            "token_budget": "--budget",
            "diversity_lambda": "--lambda",
            "freshness_half_life_days": "--half-life-days",
        },
    )
    compile_.add_argument(
        "--weights", default=None, help="relevance,evidence,freshness (e.g. 0.6,0.25,0.15)"
    )
    compile_.add_argument("--as-of", default=None, help="ISO 8601 instant freshness is measured at")
    compile_.add_argument("--text", action="store_true", help="print the rendered bundle too")
    compile_.add_argument("--no-cache", action="store_true", help="do not use the KV store")
    compile_.add_argument(
        "--token-counter",
        choices=("auto", "estimate", "vllm"),
        default="auto",
        help="budget tokens: vllm = the served tokenizer, estimate = UTF-8 bytes/4, "
        "auto = vllm when --model is given",
    )
    _vllm_flags(compile_)
    compile_.set_defaults(handler=run_compile)

    _add_turn_verbs(verbs, parent)
    _add_reuse_measure(verbs)


def _add_turn_verbs(verbs: Verbs, parent: argparse.ArgumentParser) -> None:
    turn = argparse.ArgumentParser(add_help=False)
    turn.add_argument("key", help="a key printed by `bundle compile`")
    turn.add_argument("--turn", required=True, help="the user's message")
    turn.add_argument("--preamble", default=None, help="system preamble (default: built in)")
    turn.add_argument(
        "--preamble-file",
        type=Path,
        default=None,
        help="a file whose text goes before the bundle (a system preamble)",
    )
    turn.add_argument("--history", type=Path, default=None, help="JSONL of earlier messages")

    render = verbs.add_parser("render", parents=[parent, turn], help="chat messages for one turn")
    render.set_defaults(handler=run_render)

    chat = verbs.add_parser(
        "chat", parents=[parent, turn], help="ask vLLM over a stored bundle; prints the Trace too"
    )
    add_flag(chat, "--max-tokens", ChatAnswerTokens, default=64, help="answer length cap")
    _vllm_flags(chat)
    chat.set_defaults(handler=run_chat)


def _add_reuse_measure(verbs: Verbs) -> None:
    measure = verbs.add_parser(
        "reuse-measure",
        parents=[common_options()],
        help="cold vs warm vLLM calls over fresh bundles (prefix-cache reuse)",
    )
    add_flag(measure, "--bundles", ReuseBundles, default=3, help="how many bundles to measure")
    add_flag(measure, "--items", ReuseItems, default=40, help="evidence items per bundle")
    add_flag(measure, "--budget", ReuseBudget, default=1200, help="token budget per bundle")
    add_flag(
        measure, "--max-tokens", ReuseAnswerTokens, default=4, help="answer length cap per call"
    )
    _vllm_flags(measure)
    measure.set_defaults(handler=run_reuse_measure)


def _vllm_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--base-url", dest="vllm_base_url", default=None, help="vLLM base URL (VLLM_BASE_URL)"
    )
    parser.add_argument("--model", default=None, help="served model (default: the only one)")


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


MAX_EVIDENCE_BYTES = MAX_HTTP_BODY_BYTES
"""The most evidence read from a file or stdin: what one tool call may carry."""


def _lines(source: str) -> list[str]:
    raw = read_cli_input(source, max_bytes=MAX_EVIDENCE_BYTES, what="evidence")
    try:
        return raw.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        where = "standard input" if source == "-" else source
        raise InvalidValue(
            f"{where} is not UTF-8 text (byte {exc.start}): evidence is JSON Lines"
        ) from None


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
        **{name: getattr(args, name) for name in COMPILE_FLAGS},
        weights=_weights(args.weights),
        as_of=_as_of(args.as_of),
    )

    exact_wanted = args.token_counter == "vllm" or (
        args.token_counter == "auto" and settings.vllm_model is not None
    )

    async def go() -> int:
        secret = secret_of(settings)
        async with AsyncExitStack() as stack:
            exact: ExactTokenCounter | Unavailable | None = None
            if exact_wanted:
                client = await stack.enter_async_context(open_client(settings))
                try:
                    exact = await token_counter_for(client, settings.vllm_model)
                except VllmRequestError as exc:
                    raise InvalidValue(str(exc)) from None
            kv = (
                None if args.no_cache else await stack.enter_async_context(open_kv_client(settings))
            )
            result = await compile_cached(request, kv=kv, exact=exact, secret=secret)
        out = BundleCompileOut.from_result(result, include_text=args.text)
        emit(out, as_json=args.json, human=describe_compile)
        if out.store_reachable is False and not args.json:
            note(f"note: bundle compiled but not cached: {out.reason}")
        return EXIT_OK

    return run_async(go)


def _turn_inputs(args: argparse.Namespace) -> tuple[str, str, list[ChatMessage] | None]:
    """(key, preamble, history) from the flags every per-turn command shares."""
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
        if any(message.role == "system" for message in history):
            raise InvalidValue("history may hold only user and assistant messages")
    return key, preamble, history


def run_render(args: argparse.Namespace, settings: Settings) -> int:
    key, preamble, history = _turn_inputs(args)

    async def go() -> int:
        async with open_kv_client(settings) as kv:
            loaded = await load_bundle(kv, key, secret=secret_of(settings))
        if not isinstance(loaded, Bundle):
            out = BundleRenderOut.not_served(key, loaded)
            emit(out, as_json=args.json, human=describe_render)
            return EXIT_MISS if out.reachable else EXIT_UNAVAILABLE
        messages = loaded.as_prompt_messages(args.turn, system_preamble=preamble, history=history)
        emit(BundleRenderOut.from_messages(key, messages), as_json=args.json, human=describe_render)
        return EXIT_OK

    return run_async(go)


def run_chat(args: argparse.Namespace, settings: Settings) -> int:
    key, preamble, history = _turn_inputs(args)

    async def go() -> int:
        async with open_kv_client(settings) as kv:
            loaded = await load_bundle(kv, key, secret=secret_of(settings))
        if not isinstance(loaded, Bundle):
            out = BundleChatOut.from_render(BundleRenderOut.not_served(key, loaded))
            emit(out, as_json=args.json, human=describe_chat)
            return EXIT_MISS if out.reachable else EXIT_UNAVAILABLE
        async with open_client(settings) as client:
            try:
                chat = await bundle_chat(
                    client,
                    loaded,
                    args.turn,
                    model=settings.vllm_model,
                    system_preamble=preamble,
                    history=history,
                    max_tokens=args.max_tokens,
                )
            except VllmRequestError as exc:
                raise InvalidValue(str(exc)) from None
        if isinstance(chat, Unavailable):
            emit(BundleChatOut.vllm_down(key, chat), as_json=args.json, human=describe_chat)
            return EXIT_UNAVAILABLE
        emit(BundleChatOut.from_chat(key, chat), as_json=args.json, human=describe_chat)
        return EXIT_OK

    return run_async(go)


def run_reuse_measure(args: argparse.Namespace, settings: Settings) -> int:
    async def progress(done: int, total: int, message: str) -> None:
        if not args.json:
            note(f"[{done}/{total}] {message}")

    async def go() -> int:
        async with open_client(settings) as client:
            try:
                report = await measure_bundle_reuse(
                    client,
                    model=settings.vllm_model,
                    bundles=args.bundles,
                    items=args.items,
                    token_budget=args.budget,
                    max_tokens=args.max_tokens,
                    progress=progress,
                )
            except VllmRequestError as exc:
                raise InvalidValue(str(exc)) from None
        emit(report, as_json=args.json, human=reuse_table)
        return EXIT_OK if report.reachable else EXIT_UNAVAILABLE

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


def describe_chat(out: BundleChatOut) -> str:
    if not out.found or not out.reachable or out.trace is None:
        return f"{'not found' if out.reachable else 'unavailable'}: {out.reason}"
    trace = out.trace
    hit = "unknown" if trace.prefix_cache_hit_tokens is None else trace.prefix_cache_hit_tokens
    return (
        f"{out.answer}\n--- {trace.prompt_tokens} prompt tokens, {hit} from the prefix cache "
        f"({trace.cached_tokens_source}), {trace.latency_s * 1000:.1f} ms"
    )


def describe_render(out: BundleRenderOut) -> str:
    if not out.found:
        return f"{'not found' if out.reachable else 'store unavailable'}: {out.reason}"
    blocks = [f"--- {message.role} ---\n{message.content}" for message in out.messages]
    return "\n".join(blocks)
