"""Context bundle tools (bundle_*): compile through the KV cache, render, chat, measure reuse.

Thin adapters over services/bundle/bundles.py; the CLI (`graph-kvcache-mcp bundle ...`) runs
the same code.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from datetime import datetime
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from graph_kvcache_mcp.connectors.vllm.tokens import token_counter_for
from graph_kvcache_mcp.domain.bundle import (
    DEFAULT_PREAMBLE,
    Bundle,
    ChatMessage,
    EvidenceItem,
    ScoreWeights,
)
from graph_kvcache_mcp.domain.bundle.models import (
    MAX_ITEMS,
    BundleRequest,
    ChatAnswerTokens,
    DiversityLambda,
    HalfLifeDays,
    PolicyVersion,
    Query,
    TokenBudget,
    TopK,
)
from graph_kvcache_mcp.domain.engine.keys import check_key
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.errors import InvalidKey, InvalidValue, VllmRequestError
from graph_kvcache_mcp.host.registrar import Registrar
from graph_kvcache_mcp.services.bundle import bundles as bundle_service
from graph_kvcache_mcp.services.bundle.bundles import (
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
    ReuseReport,
    measure_bundle_reuse,
)
from graph_kvcache_mcp.services.bundle.views import (
    BundleChatOut,
    BundleCompileOut,
    BundleRenderOut,
)
from graph_kvcache_mcp.tools._common import (
    CALLS_MODEL,
    READ_ONLY,
    WRITES_IDEMPOTENT,
    ServedModel,
    ToolSpec,
    register_all,
    state_of,
)

TOOLSET = "bundle"

Key = Annotated[
    str,
    Field(min_length=1, description="The key bundle_compile returned."),
]
TurnText = Annotated[str, Field(description="This turn's user message.")]
Preamble = Annotated[
    str,
    Field(description="Before the bundle in the system message; keep it fixed."),
]
History = Annotated[
    list[ChatMessage] | None,
    Field(description="Earlier user/assistant messages, after the system message."),
]
Model = ServedModel
TokenCounterChoice = Literal["auto", "estimate", "vllm"]


async def bundle_compile(
    query: Annotated[Query, Field(description="What the bundle should answer.")],
    items: Annotated[
        list[EvidenceItem],
        Field(max_length=MAX_ITEMS, description="Candidate evidence, unique ids."),
    ],
    ctx: Context[Any],
    policy_version: Annotated[
        PolicyVersion, Field(description="Your policy's version (keyed).")
    ] = "v1",
    token_budget: Annotated[TokenBudget, Field(description="Most tokens the text may use.")] = 2000,
    top_k: Annotated[TopK, Field(description="Most items to select.")] = 20,
    diversity_lambda: Annotated[
        DiversityLambda, Field(description="MMR: 1 = score only, lower = more diverse.")
    ] = 0.7,
    weights: Annotated[
        ScoreWeights | None,
        Field(description="Score weights, normalized by their sum."),
    ] = None,
    freshness_half_life_days: Annotated[
        HalfLifeDays, Field(description="Freshness half-life, days.")
    ] = 30.0,
    as_of: Annotated[
        datetime | None,
        Field(description="When freshness is measured (ISO 8601); omit = neutral."),
    ] = None,
    include_text: Annotated[bool, Field(description="Also return the rendered text.")] = False,
    token_counter: Annotated[
        TokenCounterChoice,
        Field(
            description="vllm: the served model's tokenizer; estimate: bytes/4; auto: vllm if "
            "VLLM_MODEL is set."
        ),
    ] = "auto",
) -> BundleCompileOut:
    """Select evidence for a query under a token budget (relevance, evidence, freshness, MMR
    diversity), cached by content and parameters (an edit: a new key). Returns the key for
    bundle_render / bundle_chat."""
    try:
        request = make_request(
            query,
            items,
            policy_version=policy_version,
            token_budget=token_budget,
            top_k=top_k,
            diversity_lambda=diversity_lambda,
            weights=weights,
            freshness_half_life_days=freshness_half_life_days,
            as_of=as_of,
        )
    except InvalidValue as exc:
        raise ToolError(f"{exc}; fix it and call bundle_compile again") from exc
    return await _compile(ctx, request, token_counter, include_text=include_text)


async def _compile(
    ctx: Context[Any],
    request: BundleRequest,
    token_counter: TokenCounterChoice,
    *,
    include_text: bool,
) -> BundleCompileOut:
    """Compile through the session's KV store, counting with the served tokenizer when asked."""
    state = state_of(ctx)
    exact_wanted = token_counter == "vllm" or (
        token_counter == "auto" and state.settings.vllm_model is not None
    )
    async with AsyncExitStack() as stack:
        exact = None
        if exact_wanted:
            client = await stack.enter_async_context(state.vllm.borrowed())
            try:
                exact = await token_counter_for(client, state.settings.vllm_model)
            except VllmRequestError as exc:
                raise ToolError(str(exc)) from exc
        result = await compile_cached(
            request,
            kv=await state.kv.connect(),
            exact=exact,
            secret=secret_of(state.settings),
            counters=state.bundles,
        )
    return BundleCompileOut.from_result(result, include_text=include_text)


async def stored_bundle(ctx: Context[Any], key: str) -> Bundle | BundleRenderOut:
    """The bundle under `key`, or the render result that explains why there is none."""
    try:
        check_key(key)
    except InvalidKey as exc:
        raise ToolError(f"{exc}. Pass the key bundle_compile returned.") from exc
    state = state_of(ctx)
    kv = await state.kv.connect()
    if isinstance(kv, Unavailable):
        return BundleRenderOut.not_served(key, kv)
    outcome = await load_bundle(kv, key, secret=secret_of(state.settings))
    if isinstance(outcome, Bundle):
        return outcome
    return BundleRenderOut.not_served(key, outcome)


async def bundle_render(
    key: Key,
    turn_text: TurnText,
    ctx: Context[Any],
    system_preamble: Preamble = DEFAULT_PREAMBLE,
    history: History = None,
) -> BundleRenderOut:
    """Render a stored bundle as chat messages [system (preamble + bundle), *history,
    user]; the system message is byte-identical across turns (system_sha256): a cacheable prefix.
    found=false: compile first."""
    bundle = await stored_bundle(ctx, key)
    if isinstance(bundle, BundleRenderOut):
        return bundle
    try:
        messages = bundle.as_prompt_messages(
            turn_text, system_preamble=system_preamble, history=history
        )
    except ValueError as exc:
        raise ToolError(f"{exc}; drop system messages from history") from exc
    return BundleRenderOut.from_messages(key, messages)


async def bundle_chat(
    key: Key,
    turn_text: TurnText,
    ctx: Context[Any],
    system_preamble: Preamble = DEFAULT_PREAMBLE,
    history: History = None,
    model: Model = None,
    max_tokens: Annotated[
        ChatAnswerTokens, Field(description="Most tokens the model may generate.")
    ] = 64,
) -> BundleChatOut:
    """Ask vLLM one question over a stored bundle (rendered as by bundle_render): the answer and a
    trace with prefix_cache_hit_tokens; later turns should hit. found=false: compile first."""
    bundle = await stored_bundle(ctx, key)
    if isinstance(bundle, BundleRenderOut):
        return BundleChatOut.from_render(bundle)
    access = state_of(ctx).vllm
    try:
        async with access.borrowed() as client:
            chat = await bundle_service.bundle_chat(
                client,
                bundle,
                turn_text,
                model=model or access.settings.vllm_model,
                system_preamble=system_preamble,
                history=history,
                max_tokens=max_tokens,
            )
    except VllmRequestError as exc:
        raise ToolError(f"{exc}; check the model name and the bundle's size") from exc
    except InvalidValue as exc:  # the history's own problem, never vLLM's
        raise ToolError(f"{exc}; drop system messages from history") from exc
    if isinstance(chat, Unavailable):
        return BundleChatOut.vllm_down(key, chat)
    access.traces.append(chat.trace)  # vllm_trace_summary counts bundle turns too
    return BundleChatOut.from_chat(key, chat)


async def bundle_reuse_measure(
    ctx: Context[Any],
    bundles: Annotated[
        ReuseBundles, Field(description="Bundles; each gets a cold and a warm call.")
    ] = 3,
    items_per_bundle: Annotated[
        ReuseItems, Field(description="Synthetic evidence items per bundle.")
    ] = 40,
    token_budget: Annotated[ReuseBudget, Field(description="Token budget of each bundle.")] = 1200,
    max_tokens: Annotated[ReuseAnswerTokens, Field(description="Tokens generated per call.")] = 4,
    model: Model = None,
) -> ReuseReport:
    """Measure vLLM prefix-cache reuse: N fresh bundles, a cold then a warm call each; per call
    latency, prompt and hit tokens; then warm/cold latency ratio and hit rates."""
    total = 2 * bundles

    async def progress(done: int, _total: int, message: str) -> None:
        await ctx.report_progress(done, total, message)

    access = state_of(ctx).vllm
    try:
        async with access.borrowed() as client:
            return await measure_bundle_reuse(
                client,
                model=model or access.settings.vllm_model,
                bundles=bundles,
                items=items_per_bundle,
                token_budget=token_budget,
                max_tokens=max_tokens,
                progress=progress,
            )
    except VllmRequestError as exc:
        raise ToolError(f"{exc}; try a smaller token_budget or name the model") from exc


SPECS = (
    ToolSpec(bundle_compile, "Compile a context bundle (cached)", WRITES_IDEMPOTENT),
    ToolSpec(bundle_render, "Render a bundle as chat messages", READ_ONLY),
    ToolSpec(bundle_chat, "Chat over a bundle (vLLM)", CALLS_MODEL),
    ToolSpec(bundle_reuse_measure, "Measure vLLM prefix reuse of bundles", CALLS_MODEL),
)


def register(server: Registrar, *, read_only: bool) -> None:
    register_all(server, SPECS, read_only=read_only)
