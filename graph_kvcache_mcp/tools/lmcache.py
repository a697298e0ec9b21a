"""LMCache tools (lmcache_*): generate LMCache + vLLM configuration for the engine tier, and check
the LMCache adapter against the engine. Opt-in toolset "lmcache" (GRAPH_KVCACHE_TOOLSETS)."""

from __future__ import annotations

from typing import Annotated, Any

import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field

from graph_kvcache_mcp.connectors.kv_open import resolve_kv_target
from graph_kvcache_mcp.domain.engine_limits import VALUE_CAP_BYTES
from graph_kvcache_mcp.domain.lmcache_config import LmcacheChoices, Mode
from graph_kvcache_mcp.domain.lmcache_keys import DEFAULT_NAMESPACE
from graph_kvcache_mcp.domain.lmcache_model import KvKind
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.errors import ConfigError
from graph_kvcache_mcp.services.lmcache_check import (
    DEFAULT_PAGE_BYTES,
    CheckStep,
    LmcacheCheckOut,
    run_lmcache_check,
)
from graph_kvcache_mcp.services.lmcache_plan import LmcacheConfigOut, build_plan, model_facts
from graph_kvcache_mcp.tools._common import READ_ONLY, ToolSpec, register_all, state_of
from graph_kvcache_mcp.tools.file_paths import hf_config_inside_roots

TOOLSET = "lmcache"

# The check stores one random page per call (the engine has no delete): a write, not idempotent.
WRITES_TEST_PAGE = ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False
)

Namespace = Annotated[
    str,
    Field(
        min_length=1,
        max_length=128,
        description="Key namespace hashed into every engine key (keeps fleets apart).",
    ),
]


async def lmcache_config(
    ctx: Context[Any],
    hf_config: Annotated[
        str | None,
        Field(
            description="Absolute path of a local Hugging Face config.json (or its model "
            "directory) inside the allowed roots. Preferred: the facts are read from it. Nothing "
            "is downloaded."
        ),
    ] = None,
    model: Annotated[
        str | None,
        Field(description="Model id as vLLM serves it, e.g. Qwen/Qwen3-8B."),
    ] = None,
    kind: Annotated[
        KvKind | None,
        Field(description="KV layout when no config.json is given: dense|mla|hybrid|compressed."),
    ] = None,
    num_layers: Annotated[
        int | None, Field(ge=1, description="Attention layers (without config.json).")
    ] = None,
    kv_heads: Annotated[int | None, Field(ge=1, description="KV heads (GQA).")] = None,
    head_dim: Annotated[
        int | None, Field(ge=1, description="Head size (MLA: latent width).")
    ] = None,
    kv_dtype: Annotated[str | None, Field(description="KV dtype, e.g. bfloat16.")] = None,
    vision: Annotated[bool | None, Field(description="The model takes images or video.")] = None,
    mode: Annotated[
        Mode,
        Field(
            description="mp_native (recommended: lmcache server + our native_plugin adapter), "
            "redis_resp (LMCache's resp adapter to a Redis endpoint), or inprocess_plugin "
            "(LMCache inside vLLM with our remote_storage_plugins connector)."
        ),
    ] = "mp_native",
    engine_url: Annotated[
        str | None,
        Field(description="Engine KV base URL; default: the engine this server uses."),
    ] = None,
    chunk_size: Annotated[int | None, Field(ge=1, description="Tokens per LMCache chunk.")] = None,
    mamba_block_size: Annotated[
        int | None,
        Field(
            ge=1,
            description="Hybrid models: vLLM's attention block size from its log line "
            "'Setting attention block size to N tokens' (otherwise estimated).",
        ),
    ] = None,
    tensor_parallel_size: Annotated[
        int, Field(ge=1, le=64, description="vLLM --tensor-parallel-size (KV per rank).")
    ] = 1,
    namespace: Namespace = DEFAULT_NAMESPACE,
) -> LmcacheConfigOut:
    """Generate LMCache + vLLM configuration that makes the engine LMCache's shared remote tier:
    the `lmcache server` command with its --l2-adapter JSON, the vLLM command with
    --kv-transfer-config, the in-process YAML (mode inprocess_plugin), environment, and warnings
    (compressed-KV models are unsupported, image KV is not cached, hybrid cold-prefill cost, chunks
    over the engine's 64 MiB value cap). Give hf_config (a local config.json) when you can;
    otherwise model, num_layers, kv_heads and head_dim. Computes only; starts nothing. If
    plan.supported is false, tell the user to rely on vLLM's native prefix caching."""
    settings = state_of(ctx).settings
    source = f"config.json at {hf_config}" if hf_config else "given facts"
    if hf_config is not None:
        hf_config = str(await hf_config_inside_roots(ctx, hf_config, param="hf_config"))
    try:
        # The engine this server would use, without starting one: generating config is read-only.
        default_url = (await anyio.to_thread.run_sync(resolve_kv_target, settings)).base_url
        facts = await anyio.to_thread.run_sync(
            lambda: model_facts(
                hf_config=hf_config,
                model=model,
                kind=kind,
                num_layers=num_layers,
                kv_heads=kv_heads,
                head_dim=head_dim,
                kv_dtype=kv_dtype,
                vision=vision,
            )
        )
        choices = LmcacheChoices(
            mode=mode,
            engine_url=engine_url or default_url,
            namespace=namespace,
            chunk_size=chunk_size,
            mamba_block_size=mamba_block_size,
            tensor_parallel_size=tensor_parallel_size,
        )
        plan = build_plan(facts, choices)
    except ConfigError as exc:
        raise ToolError(f"{exc}. Fix the argument and call lmcache_config again.") from None
    return LmcacheConfigOut(facts=facts, facts_source=source, plan=plan)


async def lmcache_check(
    ctx: Context[Any],
    page_bytes: Annotated[
        int,
        Field(ge=1, le=VALUE_CAP_BYTES, description="Size of the random test page."),
    ] = DEFAULT_PAGE_BYTES,
    namespace: Namespace = DEFAULT_NAMESPACE,
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
    settings = access.settings
    token = settings.kv_token if settings.kv_url is not None else access.engine.token()
    try:
        return await anyio.to_thread.run_sync(
            lambda: run_lmcache_check(
                kv.base_url, token, page_bytes=page_bytes, namespace=namespace
            )
        )
    except ConfigError as exc:
        raise ToolError(f"{exc}. Fix the argument and call lmcache_check again.") from None


SPECS = (
    ToolSpec(lmcache_config, "LMCache configuration for the engine tier", READ_ONLY),
    ToolSpec(lmcache_check, "Check the LMCache adapter against the engine", WRITES_TEST_PAGE),
)


def register(server: MCPServer[Any], *, read_only: bool) -> None:
    register_all(server, SPECS, read_only=read_only)
