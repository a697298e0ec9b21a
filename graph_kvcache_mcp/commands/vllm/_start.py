"""`vllm start`: its flags, read from `VllmLaunch`, and starting vLLM (or the MP stack under it)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from functools import partial

import anyio

from graph_kvcache_mcp.commands._common import EXIT_OK, emit, note
from graph_kvcache_mcp.commands._flags import add_launch_flags, add_model_flags, model_from_args
from graph_kvcache_mcp.commands.vllm._describe import describe_status
from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.opener import engine_environment
from graph_kvcache_mcp.connectors.engine.process import ManagedEngine
from graph_kvcache_mcp.connectors.lmcache.access import lmcache_python
from graph_kvcache_mcp.connectors.lmcache.process import ManagedLmcache
from graph_kvcache_mcp.connectors.lmcache.state import LmcacheStatus, RespPeer
from graph_kvcache_mcp.connectors.vllm.process import ManagedVllm, WaitProgress
from graph_kvcache_mcp.domain.endpoints import parse_http_url
from graph_kvcache_mcp.domain.lmcache.config import ProcessSpec
from graph_kvcache_mcp.domain.lmcache.stack import MP_CONNECTORS, StackOptions
from graph_kvcache_mcp.domain.vllm.launch import VllmLaunch
from graph_kvcache_mcp.services.vllm import operations as vllm_service
from graph_kvcache_mcp.services.vllm.stack import start_mp_stack
from graph_kvcache_mcp.services.vllm.views import VllmStatusOut

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
        ("http_port", "chunk_size"),
        flags={"http_port": "--lmcache-http-port"},
        defaults={"http_port": None},
        helps={
            "http_port": "mp_native: its HTTP port (default: $GRAPH_KVCACHE_LMCACHE_HTTP_PORT "
            "or 8080)",
            "chunk_size": "mp_native: tokens per LMCache chunk (256)",
        },
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
    managed = ManagedVllm(settings.data_dir, python=settings.vllm_python)
    progress = None if args.json else _note_progress
    if launch.kv_connector in MP_CONNECTORS:
        options = StackOptions(
            http_port=args.http_port or settings.lmcache_http_port, chunk_size=args.chunk_size
        )
        out = anyio.run(
            partial(
                _start_stack, settings, managed, launch, options, args.ready_timeout_s, progress
            )
        )
    else:
        out = vllm_service.start(
            managed,
            launch,
            env=engine_environment(settings) if launch.needs_engine_environment else None,
            ready_timeout_s=args.ready_timeout_s,
            progress=progress,
            calls_base_url=settings.vllm_base_url,
        )
    emit(out, as_json=args.json, human=describe_status)
    return EXIT_OK


def _note_progress(_elapsed_s: float, _total_s: float, message: str) -> None:
    note(message)


async def _start_stack(
    settings: Settings,
    managed: ManagedVllm,
    launch: VllmLaunch,
    options: StackOptions,
    ready_timeout_s: float,
    progress: WaitProgress | None,
) -> VllmStatusOut:
    """The stack from the CLI: each piece it starts runs until its own `stop` command."""

    async def ensure_engine() -> None:
        if settings.kv_url is None:
            await anyio.to_thread.run_sync(
                partial(ManagedEngine(settings.data_dir).start, resp=launch.l2_over_resp)
            )

    async def start_lmcache(
        server: ProcessSpec, env: Mapping[str, str], peer: RespPeer | None
    ) -> LmcacheStatus:
        lmcache = ManagedLmcache(settings.data_dir, python=lmcache_python(settings))
        return await anyio.to_thread.run_sync(
            partial(lmcache.start, server, env=env, resp_peer=peer)
        )

    return await start_mp_stack(
        managed,
        launch,
        settings,
        ensure_engine=ensure_engine,
        start_lmcache=start_lmcache,
        options=options,
        ready_timeout_s=ready_timeout_s,
        progress=progress,
    )
