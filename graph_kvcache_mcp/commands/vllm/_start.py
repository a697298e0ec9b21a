"""`vllm start`: its flags, read from `VllmLaunch`, and starting vLLM (or the MP stack under it);
with the join flags (`--engine-url https://...`, `--listen`, `--tls-dir`, ...), a node joining a
store host through this host's edge (`services/node_join.py`; the MCP tool has no such flags)."""

from __future__ import annotations

import argparse
import json
import os
from functools import partial
from pathlib import Path

import anyio

from graph_kvcache_mcp.commands._common import EXIT_OK, emit, note
from graph_kvcache_mcp.commands._flags import add_launch_flags, add_model_flags, model_from_args
from graph_kvcache_mcp.commands.vllm._describe import describe_status
from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.domain.endpoints import parse_http_url
from graph_kvcache_mcp.domain.lmcache.stack import StackOptions
from graph_kvcache_mcp.domain.vllm.launch import VllmLaunch
from graph_kvcache_mcp.services.node_join import NodeJoinFlags, NodeStartOut, start_node
from graph_kvcache_mcp.services.stack.lifetime import RunsUntilStop
from graph_kvcache_mcp.services.stack.start import start_vllm

LAUNCH_FLAGS = (
    "model",
    "port",
    "served_model_name",
    "max_model_len",
    "dtype",
    "gpu_memory_utilization",
    "block_size",
    "kv_cache_memory_bytes",
    "dev_mode",
    "kv_connector",
    "kv_events",
    "lmcache_port",
)
"""`VllmLaunch` fields `vllm start` takes as flags of the same name."""


def add_start_flags(start: argparse.ArgumentParser) -> None:
    add_model_flags(
        start,
        VllmLaunch,
        LAUNCH_FLAGS,
        defaults={"port": None, "lmcache_port": None},
        helps={
            "port": "default: the --base-url port",
            "dev_mode": "VLLM_SERVER_DEV_MODE=1",
            "kv_connector": "external KV tier: engine (EngineKVConnector, CPU vLLM) or an "
            "LMCache mode",
            "kv_events": "publish KV events (private ipc feed, loopback replay port) for `fleet`",
            "lmcache_port": "mp_native: the lmcache server's port (default: "
            "$GRAPH_KVCACHE_LMCACHE_PORT or 5555)",
        },
    )
    start.add_argument(
        "--no-prompt-tokens-details",
        action="store_true",
        help="leave out --enable-prompt-tokens-details (cached tokens then come from /metrics)",
    )
    add_launch_flags(
        start,
        program="vLLM",
        python_dest="vllm_python",
        python_env="GRAPH_KVCACHE_VLLM_PYTHON",
        ready_timeout_s=600.0,
    )
    add_model_flags(
        start,
        StackOptions,
        ("http_port", "chunk_size", "coordinator"),
        flags={"http_port": "--lmcache-http-port"},
        defaults={"http_port": None},
        helps={
            "http_port": "mp_native: its HTTP port (default: $GRAPH_KVCACHE_LMCACHE_HTTP_PORT "
            "or 8080)",
            "chunk_size": "mp_native: tokens per LMCache chunk (256)",
            "coordinator": "mp_native: join an LMCache coordinator, 'managed' (started in the "
            "data dir, stopped by `lmcache stop`) or its URL (used, never stopped; "
            "https://S:PORT: a store host's, through this host's edge)",
        },
    )
    _add_join_flags(start)


def _add_join_flags(start: argparse.ArgumentParser) -> None:
    join = start.add_argument_group(
        'a node joining a store host (docs/multi-host.md, "A node joins")'
    )
    join.add_argument(
        "--engine-url",
        default=None,
        metavar="https://S:PORT",
        help="the store's engine (its `engine start --json` join output): the children reach "
        "it through this host's edge",
    )
    join.add_argument(
        "--engine-token-file",
        type=Path,
        default=None,
        help="the store's engine token, copied here privately (a file of yours, mode 0600)",
    )
    join.add_argument(
        "--store-name",
        default=None,
        help="the store certificate's DNS name (tls_name in its join output): the edge checks it",
    )
    join.add_argument(
        "--tls-dir",
        type=Path,
        default=None,
        help="this node's ca.pem, cert.pem, key.pem (from `fleet pki issue`)",
    )
    join.add_argument(
        "--listen",
        default=None,
        metavar="N:P",
        help="publish on this host's address N through the edge: P vLLM's API (TLS, its API "
        "key), P+1/P+2 the KV-event feed and replay, P+3 the lmcache server's admin HTTP "
        "(mutual TLS)",
    )
    join.add_argument(
        "--api-key-env",
        default=None,
        metavar="NAME",
        help="the variable holding vLLM's API key (default VLLM_API_KEY); required with --listen",
    )


def run_start(args: argparse.Namespace, settings: Settings) -> int:
    port = args.port or parse_http_url(settings.vllm_base_url, what="VLLM_BASE_URL").port
    launch = model_from_args(
        VllmLaunch,
        args,
        [name for name in LAUNCH_FLAGS if name not in ("port", "lmcache_port")],
        port=port,
        lmcache_port=args.lmcache_port or settings.lmcache_port,
        prompt_tokens_details=not args.no_prompt_tokens_details,
        extra_args=tuple(args.extra_arg),
    )
    options = StackOptions(
        http_port=args.http_port or settings.lmcache_http_port,
        chunk_size=args.chunk_size,
        coordinator=args.coordinator,
    )
    flags = NodeJoinFlags(
        listen=args.listen,
        tls_dir=args.tls_dir,
        engine_url=args.engine_url,
        engine_token_file=args.engine_token_file,
        store_name=args.store_name,
        api_key_env=args.api_key_env,
    )
    if flags.given(args.coordinator):
        node = anyio.run(
            partial(
                start_node,
                settings,
                launch,
                options,
                flags,
                lmcache_http_port=args.http_port,
                environ=os.environ,
                ready_timeout_s=args.ready_timeout_s,
                progress=None if args.json else _note_progress,
            )
        )
        emit(node, as_json=args.json, human=describe_node)
        return EXIT_OK
    out = anyio.run(
        partial(
            start_vllm,
            settings,
            launch,
            RunsUntilStop(),  # each piece runs until its own stop command
            options=options,
            ready_timeout_s=args.ready_timeout_s,
            progress=None if args.json else _note_progress,
            calls_base_url=settings.vllm_base_url,
        )
    )
    emit(out, as_json=args.json, human=describe_status)
    return EXIT_OK


def describe_node(out: NodeStartOut) -> str:
    lines = [describe_status(out)]
    if out.edge is not None:
        lines.append(f"edge: pid {out.edge.pid}{' (reused)' if out.edge.reused else ''}")
    if out.fleet_entry is not None:
        entry = json.dumps(out.fleet_entry.model_dump(exclude_none=True))
        lines.append(f"fleet entry (paste into a fleet file's instances): {entry}")
    if out.coordinator_node is not None:
        lines.append(f"on the store: lmcache coordinator start ... --node {out.coordinator_node}")
    return "\n".join(lines)


def _note_progress(_elapsed_s: float, _total_s: float, message: str) -> None:
    note(message)
