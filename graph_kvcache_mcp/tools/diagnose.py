"""Diagnosis tools (diagnose_*): why a request missed vLLM's prefix cache, what is misconfigured
in the stack, how much KV a model needs. Default toolset "diagnose"."""

from __future__ import annotations

from functools import partial
from typing import Annotated, Any

import anyio.to_thread
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from graph_kvcache_mcp.domain.diagnosis.kv_budget import KvBudget, KvMemoryGib, UnitTokens
from graph_kvcache_mcp.domain.diagnosis.stack_findings import StackDiagnosis
from graph_kvcache_mcp.domain.vllm.deadlines import CALL_TIMEOUT_ENV
from graph_kvcache_mcp.domain.vllm.hybrid.gpu_rules import GPU_CAPABILITY, BudgetPlatform
from graph_kvcache_mcp.domain.vllm.launch import MaxModelLen
from graph_kvcache_mcp.errors import ConfigError, VllmRequestError
from graph_kvcache_mcp.host.registrar import Registrar
from graph_kvcache_mcp.services.diagnosis.kv_budget import budget_for
from graph_kvcache_mcp.services.diagnosis.prefix_miss import MissDiagnosis, explain_miss
from graph_kvcache_mcp.services.diagnosis.stack_check import check_stack
from graph_kvcache_mcp.tools._common import READ_ONLY, ToolSpec, register_all, state_of
from graph_kvcache_mcp.tools.file_paths import hf_config_inside_roots
from graph_kvcache_mcp.tools.progress import with_progress

TOOLSET = "diagnose"

Model = Annotated[str | None, Field(description="Served model (default: the only one).")]
ChatBody = Annotated[
    dict[str, Any], Field(description="A chat-completions body with messages (tools optional).")
]


async def diagnose_miss(
    ctx: Context[Any],
    first: ChatBody,
    second: Annotated[dict[str, Any], Field(description="The same, sent after first.")],
    model: Model = None,
    block_size: Annotated[
        int | None, Field(ge=1, description="Default: vLLM's cache_config_info.")
    ] = None,
    verify: Annotated[bool, Field(description="Also send both; report cached_tokens.")] = False,
) -> MissDiagnosis:
    """Why the second chat request misses vLLM's prefix cache after the first: where tokens
    part, predicted_cached_tokens, cause {kind, detail, fix}. verify=true sends both, reports
    cached_tokens. reachable=false: vLLM is down."""
    access = state_of(ctx).vllm
    settings = access.settings
    try:
        async with access.borrowed() as client:
            return await explain_miss(
                client,
                client.routes,
                first,
                second,
                model=model or settings.vllm_model,
                block_size=block_size,
                verify=verify,
                settings=settings,
            )
    except (ConfigError, VllmRequestError) as exc:
        raise ToolError(f"{exc}. Fix the request and call diagnose_miss again.") from None


async def diagnose_stack(
    ctx: Context[Any],
    model: Model = None,
    lmcache_url: Annotated[
        str | None, Field(description="lmcache server HTTP URL, to check it too.")
    ] = None,
    shared_prefix_tokens: Annotated[
        int | None, Field(ge=0, description="Prefix your requests share, in tokens.")
    ] = None,
) -> StackDiagnosis:
    """Check engine, vLLM (and LMCache given lmcache_url) at once: findings, each with its fix, and
    what was checked. Starts nothing; fix errors first."""
    state = state_of(ctx)
    try:
        async with state.vllm.borrowed() as client:
            check = partial(
                check_stack,
                state.settings,
                client,
                model=model,
                lmcache_url=lmcache_url,
                shared_prefix_tokens=shared_prefix_tokens,
                server_manages_engine=state.kv.source == "managed",
            )
            # Three vLLM probes (health, models, /metrics), then a one-token chat.
            bound_s = 3 * client.probe_timeout_s + client.timeout_s
            what = f"checking the stack (vLLM at {client.root_url})"
            return await with_progress(
                ctx, check, what=what, bound_s=bound_s, knob=CALL_TIMEOUT_ENV
            )
    except ConfigError as exc:
        raise ToolError(f"{exc}. Fix the argument and call diagnose_stack again.") from None


async def diagnose_budget(
    ctx: Context[Any],
    hf_config: Annotated[
        str | dict[str, Any],
        Field(description="config.json path (or model dir), or its JSON object."),
    ],
    kv_dtype: Annotated[str | None, Field(description="KV dtype, e.g. fp8.")] = None,
    kv_memory_gib: Annotated[KvMemoryGib | None, Field(description="KV memory to fill.")] = None,
    chunk_size: Annotated[UnitTokens | None, Field(description="LMCache chunk tokens.")] = None,
    block_size: Annotated[UnitTokens | None, Field(description="vLLM block tokens.")] = None,
    platform: Annotated[BudgetPlatform | None, Field(description="Default: this host.")] = None,
    max_model_len: Annotated[MaxModelLen | None, Field(description="Default: config's.")] = None,
    no_prefix_caching: Annotated[bool, Field(description="Hybrid: no align mode.")] = False,
) -> KvBudget:
    """KV a model needs: bytes/token, tokens fitting kv_memory_gib, chunk bytes vs the engine's
    64 MiB cap; windowed, recurrent state apart, a hybrid as vLLM lays it out. Computes only."""
    if isinstance(hf_config, str):
        hf_config = str(await hf_config_inside_roots(ctx, hf_config, param="hf_config"))
    try:
        return await anyio.to_thread.run_sync(
            lambda: budget_for(
                hf_config,
                kv_dtype=kv_dtype,
                kv_memory_gib=kv_memory_gib,
                chunk_size=chunk_size,
                block_size=block_size,
                platform="cpu" if platform == "cpu" else platform and "gpu",
                max_model_len=max_model_len,
                prefix_caching=not no_prefix_caching,
                gpu=platform if platform in GPU_CAPABILITY else None,
            )
        )
    except ConfigError as exc:
        raise ToolError(f"{exc}. Fix the argument and call diagnose_budget again.") from None


SPECS = (
    # Like vllm_chat, verify=true only adds to vLLM's cache and counters: read-only.
    ToolSpec(diagnose_miss, "Why a request missed the prefix cache", READ_ONLY),
    ToolSpec(diagnose_stack, "Check the KV-cache stack's configuration", READ_ONLY),
    ToolSpec(diagnose_budget, "KV budget of a model", READ_ONLY),
)


def register(server: Registrar, *, read_only: bool) -> None:
    register_all(server, SPECS, read_only=read_only)
