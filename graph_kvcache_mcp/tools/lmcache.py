"""LMCache tools (lmcache_*): generate LMCache + vLLM configuration for the engine tier, run the
managed `lmcache server`, and check the LMCache adapter against the engine. Opt-in toolset
"lmcache" (GRAPH_KVCACHE_TOOLSETS)."""

from __future__ import annotations

from typing import Annotated, Any

import anyio.to_thread
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field

from graph_kvcache_mcp.connectors.engine.opener import resolve_kv_target
from graph_kvcache_mcp.connectors.lmcache.state import LmcacheStopResult
from graph_kvcache_mcp.domain.lifecycle import ReadyTimeout, ServicePort, StopWait
from graph_kvcache_mcp.domain.lmcache.choices import (
    BlockTokens,
    ChunkSize,
    LmcacheChoices,
    Mode,
    ServerMode,
    SizeGb,
    TensorParallelSize,
)
from graph_kvcache_mcp.domain.lmcache.keys import DEFAULT_NAMESPACE, Namespace
from graph_kvcache_mcp.domain.lmcache.model import Count, KvKind
from graph_kvcache_mcp.domain.lmcache.stack import Coordinator
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.errors import ConfigError, EngineProcessError, LmcacheProcessError
from graph_kvcache_mcp.host.registrar import Registrar
from graph_kvcache_mcp.services.lmcache.check import (
    DEFAULT_PAGE_BYTES,
    CheckStep,
    LmcacheCheckOut,
    PageBytes,
    run_lmcache_check,
)
from graph_kvcache_mcp.services.lmcache.plan import (
    LmcacheConfigOut,
    model_facts,
    plan_for_this_host,
)
from graph_kvcache_mcp.services.stack.lifetime import LeasedToSession
from graph_kvcache_mcp.services.stack.stack import Stack
from graph_kvcache_mcp.services.stack.views import LmcacheStatusOut
from graph_kvcache_mcp.tools._common import (
    READ_ONLY,
    STARTS_PROCESS,
    STOPS_PROCESS,
    ToolSpec,
    register_all,
    state_of,
)
from graph_kvcache_mcp.tools.file_paths import hf_config_inside_roots

TOOLSET = "lmcache"

# The check stores one random page per call (the engine has no delete): a write, not idempotent.
WRITES_TEST_PAGE = ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False
)


NamespaceArg = Annotated[
    Namespace,
    Field(description="Key namespace hashed into every engine key (keeps fleets apart)."),
]


HfConfigArg = Annotated[
    str | None,
    Field(
        description="Absolute path of a local Hugging Face config.json (or its model "
        "directory) inside the allowed roots. Preferred: the facts are read from it. Nothing "
        "is downloaded."
    ),
]
ModelIdArg = Annotated[
    str | None, Field(description="Model id as vLLM serves it, e.g. Qwen/Qwen3-8B.")
]
KindArg = Annotated[
    KvKind | None,
    Field(description="KV layout when no config.json is given: dense|mla|hybrid|compressed."),
]
ModeArg = Annotated[
    Mode,
    Field(
        description="mp_native (recommended: lmcache server + our native_plugin adapter), "
        "redis_resp (LMCache's resp adapter to a Redis endpoint), or inprocess_plugin "
        "(LMCache inside vLLM with our remote_storage_plugins connector)."
    ),
]
EngineUrlArg = Annotated[
    str | None, Field(description="Engine KV base URL; default: the engine this server uses.")
]
MambaBlockArg = Annotated[
    BlockTokens | None,
    Field(
        description="Hybrid models: vLLM's attention block size from its log line "
        "'Setting attention block size to N tokens' (otherwise estimated).",
    ),
]
TensorParallelArg = Annotated[
    TensorParallelSize, Field(description="vLLM --tensor-parallel-size (KV per rank).")
]


async def lmcache_config(
    ctx: Context[Any],
    hf_config: HfConfigArg = None,
    model: ModelIdArg = None,
    kind: KindArg = None,
    num_layers: Annotated[
        Count | None, Field(description="Attention layers (without config.json).")
    ] = None,
    kv_heads: Annotated[Count | None, Field(description="KV heads (GQA).")] = None,
    head_dim: Annotated[Count | None, Field(description="Head size (MLA: latent width).")] = None,
    kv_dtype: Annotated[str | None, Field(description="KV dtype, e.g. bfloat16.")] = None,
    vision: Annotated[bool | None, Field(description="The model takes images or video.")] = None,
    mode: ModeArg = "mp_native",
    engine_url: EngineUrlArg = None,
    chunk_size: Annotated[ChunkSize | None, Field(description="Tokens per LMCache chunk.")] = None,
    mamba_block_size: MambaBlockArg = None,
    tensor_parallel_size: TensorParallelArg = 1,
    namespace: NamespaceArg = DEFAULT_NAMESPACE,
    lmcache_port: Annotated[
        ServicePort, Field(description="The lmcache server's port (vLLM connects).")
    ] = 5555,
    lmcache_http_port: Annotated[
        ServicePort, Field(description="The lmcache server's HTTP admin port.")
    ] = 8080,
    l1_size_gb: Annotated[
        SizeGb, Field(description="The lmcache server's L1 (host memory) size in GB.")
    ] = 20.0,
) -> LmcacheConfigOut:
    """Generate LMCache + vLLM configuration that makes the engine LMCache's shared remote tier:
    the `lmcache server` command with its --l2-adapter JSON, the vLLM command with
    --kv-transfer-config, the in-process YAML (mode inprocess_plugin), environment, and warnings
    (compressed-KV models are unsupported, image KV is not cached, hybrid cold-prefill cost, chunks
    over the engine's 64 MiB value cap). Give hf_config (a local config.json) when you can;
    otherwise model, num_layers, kv_heads and head_dim. Computes only; starts nothing. If
    plan.supported is false, tell the user to rely on vLLM's native prefix caching."""
    facts = {
        "model": model,
        "kind": kind,
        "num_layers": num_layers,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "kv_dtype": kv_dtype,
        "vision": vision,
    }
    choices = {
        "mode": mode,
        "namespace": namespace,
        "chunk_size": chunk_size,
        "mamba_block_size": mamba_block_size,
        "tensor_parallel_size": tensor_parallel_size,
        "lmcache_port": lmcache_port,
        "lmcache_http_port": lmcache_http_port,
        "l1_size_gb": l1_size_gb,
    }
    return await _plan(ctx, hf_config, engine_url, facts, choices)


async def _plan(
    ctx: Context[Any],
    hf_config: str | None,
    engine_url: str | None,
    facts_given: dict[str, Any],
    choices_given: dict[str, Any],
) -> LmcacheConfigOut:
    """The plan for the facts (read from `hf_config` when given) and the choices."""
    settings = state_of(ctx).settings
    source = f"config.json at {hf_config}" if hf_config else "given facts"
    if hf_config is not None:
        hf_config = str(await hf_config_inside_roots(ctx, hf_config, param="hf_config"))
    try:
        # The engine this server would use, without starting one: generating config is read-only.
        default_url = (await anyio.to_thread.run_sync(resolve_kv_target, settings)).base_url
        facts = await anyio.to_thread.run_sync(
            lambda: model_facts(hf_config=hf_config, **facts_given)
        )
        choices = LmcacheChoices(
            engine_url=engine_url or default_url,
            insecure_http_hosts=settings.insecure_http_hosts,
            **choices_given,
        )
        plan = await anyio.to_thread.run_sync(plan_for_this_host, facts, choices, settings.data_dir)
    except ConfigError as exc:
        raise ToolError(f"{exc}. Fix the argument and call lmcache_config again.") from None
    return LmcacheConfigOut(facts=facts, facts_source=source, plan=plan)


async def lmcache_check(
    ctx: Context[Any],
    page_bytes: Annotated[
        PageBytes,
        Field(description="Size of the random test page."),
    ] = DEFAULT_PAGE_BYTES,
    namespace: NamespaceArg = DEFAULT_NAMESPACE,
) -> LmcacheCheckOut:
    """Validate the LMCache adapter against this server's engine, without vLLM: build the same
    native_plugin client `lmcache server` loads, set a random page, wait on its eventfd, drain,
    check the engine's stats grew, read the page back byte-exact, set it again and check the
    dedup counter moved while resident bytes stayed flat. Each step has pass/fail and figures.
    Writes one page per call (the engine has no delete). reachable=false: report the reason."""
    access = state_of(ctx).kv
    kv = await access.connect()
    if isinstance(kv, Unavailable):
        return LmcacheCheckOut(
            base_url=access.label,
            reachable=False,
            passed=False,
            steps=[CheckStep(name="client", passed=False, detail=kv.reason)],
            reason=kv.reason,
        )
    token = access.token()
    try:
        return await anyio.to_thread.run_sync(
            lambda: run_lmcache_check(
                kv.base_url, token, page_bytes=page_bytes, namespace=namespace
            )
        )
    except ConfigError as exc:
        raise ToolError(f"{exc}. Fix the argument and call lmcache_check again.") from None


async def lmcache_start(
    ctx: Context[Any],
    hf_config: Annotated[
        str | None, Field(description="Local config.json (or model dir) to size the server.")
    ] = None,
    model: Annotated[str | None, Field(description="Model id, when no config.json.")] = None,
    num_layers: Annotated[Count | None, Field(description="Attention layers.")] = None,
    kv_heads: Annotated[Count | None, Field(description="KV heads (GQA).")] = None,
    head_dim: Annotated[Count | None, Field(description="Head size.")] = None,
    mode: Annotated[
        ServerMode,
        Field(description="mp_native (our adapter to the engine) or redis_resp."),
    ] = "mp_native",
    engine_url: Annotated[
        str | None, Field(description="Engine KV base URL; default: the engine this server uses.")
    ] = None,
    lmcache_port: Annotated[ServicePort, Field(description="Server port.")] = 5555,
    lmcache_http_port: Annotated[
        ServicePort, Field(description="HTTP admin port (/healthcheck, /status).")
    ] = 8080,
    l1_size_gb: Annotated[SizeGb, Field(description="L1 size in GB.")] = 20.0,
    extra_args: Annotated[
        list[str] | None,
        Field(description="More `lmcache server` flags, e.g. ['--no-l1-use-lazy']."),
    ] = None,
    ready_timeout_s: Annotated[
        ReadyTimeout, Field(description="Give up (and stop it) if not healthy by then.")
    ] = 180.0,
    coordinator: Annotated[
        Coordinator | None,
        Field(description="Join 'managed' (stops with the server) or a coordinator URL."),
    ] = None,
) -> LmcacheStatusOut:
    """Start the `lmcache server` that lmcache_config plans (or reuse the one this data dir
    already runs), from LMCache's venv (GRAPH_KVCACHE_LMCACHE_PYTHON), and return once its
    /healthcheck answers healthy, with /status (L1 usage, each L2 adapter's health). vLLM then
    connects with kv_connector mp_native (vllm_start). This session holds a lease: the server
    stops when the last session using it exits (unless --keep-engine)."""
    access = state_of(ctx).lmcache
    planned = await lmcache_config(
        ctx,
        hf_config=hf_config,
        model=model,
        num_layers=num_layers,
        kv_heads=kv_heads,
        head_dim=head_dim,
        mode=mode,
        engine_url=engine_url,
        lmcache_port=lmcache_port,
        lmcache_http_port=lmcache_http_port,
        l1_size_gb=l1_size_gb,
    )
    planned_server = planned.plan.lmcache_server
    if planned_server is None:
        raise ToolError(f"mode {mode} plans no lmcache server: {'; '.join(planned.plan.warnings)}")
    server = planned_server.model_copy(update={"argv": [*planned_server.argv, *(extra_args or [])]})
    state = state_of(ctx)
    try:
        status = await Stack.of(state.settings).start_server(
            server,
            LeasedToSession(state.kv, access),
            ready_timeout_s=ready_timeout_s,
            resp=mode == "redis_resp",  # the managed engine's RESP wire, answering first
            coordinator=coordinator,
        )
    except (LmcacheProcessError, EngineProcessError, ConfigError) as exc:
        raise ToolError(str(exc)) from exc
    return LmcacheStatusOut.build(status, access)


async def lmcache_stop(
    ctx: Context[Any],
    wait_s: Annotated[StopWait, Field(description="SIGTERM grace before SIGKILL.")] = 15,
    force: Annotated[
        bool, Field(description="Also stop a server other sessions use or the CLI started.")
    ] = False,
) -> LmcacheStopResult:
    """Stop the lmcache server this project started from its data dir (SIGTERM to its process
    group, SIGKILL after wait_s). Without force it refuses while other sessions hold leases or
    when the CLI started it, or while the managed vLLM uses it (forced, vLLM is stopped first).
    A server this project did not start is never signalled."""
    state = state_of(ctx)
    stack = Stack.of(state.settings)
    why = await anyio.to_thread.run_sync(stack.stop_blocker)
    if why is not None and not force:
        raise ToolError(
            f"{why}. Stop vLLM first (vllm_stop), or pass force=true to stop vLLM and then the "
            "server"
        )
    lifetime = LeasedToSession(state.kv, state.lmcache)
    try:
        return await stack.stop_server(lifetime, force=force, wait_s=wait_s)
    except LmcacheProcessError as exc:
        raise ToolError(str(exc)) from exc


async def lmcache_status(ctx: Context[Any]) -> LmcacheStatusOut:
    """Is the managed lmcache server running and healthy: its /healthcheck, and from /status its
    L1 usage and each L2 adapter's health, plus the sessions holding leases on it.
    running=false: start one with lmcache_start."""
    access = state_of(ctx).lmcache
    return LmcacheStatusOut.build(await access.status(), access)


SPECS = (
    ToolSpec(lmcache_config, "LMCache configuration for the engine tier", READ_ONLY),
    ToolSpec(lmcache_check, "Check the LMCache adapter against the engine", WRITES_TEST_PAGE),
    ToolSpec(lmcache_start, "Start the managed lmcache server", STARTS_PROCESS),
    ToolSpec(lmcache_stop, "Stop the managed lmcache server", STOPS_PROCESS),
    ToolSpec(lmcache_status, "Status of the managed lmcache server", READ_ONLY),
)


def register(server: Registrar, *, read_only: bool) -> None:
    register_all(server, SPECS, read_only=read_only)
