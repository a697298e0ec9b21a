"""Measure how much of a bundle prefix vLLM serves from its prefix cache: cold vs warm calls.

For each of N independent bundles: one cold call (first time vLLM sees that system message) and
one warm call (same bundle, another question). Each call reports the hit tokens twice: from the
response's usage (`cached_tokens`) and from the move of `vllm:prefix_cache_hits_total` for the
model around that call alone. A per-run nonce is folded into the evidence (new content, new keys)
and written at the head of the system message, so no block of an earlier run, or of an earlier
bundle of this run, can match: every cold call starts from nothing.

Used by the `bundle_reuse_measure` tool and `tools/measure_bundle_kv_reuse.py`.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from graph_kvcache_mcp.domain.bundle import (
    DEFAULT_PREAMBLE,
    Bundle,
    BundleParams,
    BundleRequest,
    ChatMessage,
    compile_bundle,
)
from graph_kvcache_mcp.domain.bundle.synthetic import QUERY, synthetic_evidence
from graph_kvcache_mcp.domain.latency import percentile
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.domain.vllm.chat import ChatResult, MetricsWindow

if TYPE_CHECKING:  # the client (and openai) load on the first call, not with the server
    from graph_kvcache_mcp.connectors.vllm.client import VllmClient

StepProgress = Callable[[int, int, str], Awaitable[None]]
ReuseBundles = Annotated[int, Field(ge=1, le=20)]
ReuseItems = Annotated[int, Field(ge=2, le=200)]
ReuseBudget = Annotated[int, Field(ge=64, le=100_000)]
ReuseAnswerTokens = Annotated[int, Field(ge=1, le=256)]
"""The bounds of a reuse measurement (bundle_reuse_measure, `bundle reuse-measure`)."""
"""(calls done, calls in total, message)."""

COLD_QUESTION = "Which findings describe how whole blocks are reused? Answer in one line."
WARM_QUESTION = "Which findings contradict each other? Answer in one line."
_AS_OF = datetime(2026, 1, 1, tzinfo=UTC)


class BundleReuseCall(BaseModel):
    """One measured call."""

    model_config = ConfigDict(frozen=True)

    bundle: int = Field(description="Which bundle (1-based).")
    phase: Literal["cold", "warm"]
    latency_s: float
    prompt_tokens: int
    hit_tokens_usage: int | None = Field(
        description="usage.prompt_tokens_details.cached_tokens (None: the server did not say)."
    )
    cached_tokens_source: str = Field(description="Where the Trace's hit count came from.")
    hit_tokens_metrics: int | None = Field(
        description="Move of vllm:prefix_cache_hits_total for the model around this call."
    )
    queries_tokens_metrics: int | None = Field(
        description="Move of vllm:prefix_cache_queries_total for the model around this call."
    )
    metrics_exclusive: bool = Field(
        description="True when the metrics window saw only this call's prompt tokens (no other "
        "traffic), so the deltas belong to it."
    )
    whole_blocks: bool | None = Field(description="Hit tokens are a multiple of the block size.")


class ReuseSummary(BaseModel):
    model_config = ConfigDict(frozen=True)

    bundles: int
    calls: int
    block_size: int | None
    cold_latency_p50_s: float | None
    warm_latency_p50_s: float | None
    warm_cold_latency_ratio: float | None = Field(
        description="Total warm latency / total cold latency (below 1 = the cache helped)."
    )
    cold_hit_tokens: int = Field(description="Hit tokens over all cold calls (expect 0).")
    warm_hit_tokens: int
    warm_prompt_tokens: int
    warm_hit_rate: float | None = Field(description="Warm hit tokens / warm prompt tokens.")
    metrics_hit_rate: float | None = Field(
        description="Sum of hits deltas / sum of queries deltas over all calls (tokens)."
    )
    usage_matches_metrics: bool | None = Field(
        description="Every call with both counts and an exclusive window agrees; None: none had."
    )


class ReuseReport(BaseModel):
    """The table and the summary. reachable=false: vLLM could not be reached (see reason)."""

    model_config = ConfigDict(frozen=True)

    reachable: bool
    reason: str | None = None
    model: str | None = None
    nonce: str
    bundle_tokens: list[int] = Field(
        default_factory=list, description="Each bundle's text tokens as the budget counted them."
    )
    calls: list[BundleReuseCall] = Field(default_factory=list)
    summary: ReuseSummary | None = None


def measurement_bundle(index: int, nonce: str, *, items: int, token_budget: int) -> Bundle:
    """Bundle `index` of the run `nonce` (pure: equal arguments, equal bundle)."""
    request = BundleRequest(
        query=QUERY,
        items=tuple(synthetic_evidence(items, seed=f"{nonce}-{index}")),
        params=BundleParams(token_budget=token_budget, top_k=items, as_of=_AS_OF),
    )
    return compile_bundle(request)


def measurement_preamble(index: int, nonce: str) -> str:
    # The run and bundle come first: the very first block of each system message is new.
    return f"Run {nonce}, bundle {index}. {DEFAULT_PREAMBLE}"


async def measure_bundle_reuse(
    client: VllmClient,
    *,
    model: str | None = None,
    bundles: int = 3,
    items: int = 40,
    token_budget: int = 1200,
    max_tokens: int = 4,
    nonce: str | None = None,
    progress: StepProgress | None = None,
) -> ReuseReport:
    """Run the cold/warm pairs and summarize them.

    Raises:
        VllmRequestError: vLLM refused a request (e.g. the bundle exceeds its context).
    """
    nonce = nonce or secrets.token_hex(4)
    chosen = await _warmed_up(client, model, nonce)
    if isinstance(chosen, ReuseReport):
        return chosen
    run = _Run(model=chosen, nonce=nonce)
    for index in range(1, bundles + 1):
        bundle = measurement_bundle(index, nonce, items=items, token_budget=token_budget)
        run.bundle_tokens.append(bundle.tokens_used)
        preamble = measurement_preamble(index, nonce)
        for phase, question in _PHASES:
            messages = bundle.as_prompt_messages(question, system_preamble=preamble)
            measured = await _measured_call(client, chosen, messages, max_tokens)
            if isinstance(measured, Unavailable):
                return run.report(reason=measured.reason)
            call = run.record(index, phase, *measured)
            if progress is not None:
                done = f"bundle {index} {phase}: {call.hit_tokens_usage} hit tokens"
                await progress(len(run.calls), 2 * bundles, done)
    summary = summarize_reuse(run.calls, block_size=run.block_size, bundles=bundles)
    return run.report(summary=summary)


_PHASES: tuple[tuple[Literal["cold", "warm"], str], ...] = (
    ("cold", COLD_QUESTION),
    ("warm", WARM_QUESTION),
)


async def _warmed_up(client: VllmClient, model: str | None, nonce: str) -> str | ReuseReport:
    """The model to measure, after one throwaway call (so one-time costs do not land on the
    first cold call); a report saying why when vLLM cannot be reached."""
    chosen = await client.resolve_model(model)
    if isinstance(chosen, Unavailable):
        return ReuseReport(reachable=False, reason=chosen.reason, nonce=nonce)
    warm_up = [ChatMessage(role="user", content=f"warm-up {nonce}")]
    first = await client.chat(warm_up, model=chosen, max_tokens=1)
    if isinstance(first, Unavailable):
        return ReuseReport(reachable=False, reason=first.reason, model=chosen, nonce=nonce)
    return chosen


@dataclass
class _Run:
    """What a run has measured so far: each bundle's tokens, each call, the block size."""

    model: str
    nonce: str
    bundle_tokens: list[int] = field(default_factory=list)
    calls: list[BundleReuseCall] = field(default_factory=list)
    block_size: int | None = None

    def record(
        self,
        index: int,
        phase: Literal["cold", "warm"],
        result: ChatResult,
        window: MetricsWindow | None,
    ) -> BundleReuseCall:
        trace = result.trace
        self.block_size = self.block_size or (window.block_size if window else None)
        call = BundleReuseCall(
            bundle=index,
            phase=phase,
            latency_s=trace.latency_s,
            prompt_tokens=trace.prompt_tokens,
            hit_tokens_usage=trace.prefix_cache_hit_tokens,
            cached_tokens_source=trace.cached_tokens_source,
            hit_tokens_metrics=window.hits if window else None,
            queries_tokens_metrics=window.queries if window else None,
            metrics_exclusive=window is not None and window.exclusive_to(trace.prompt_tokens),
            whole_blocks=_whole_blocks(trace.prefix_cache_hit_tokens, self.block_size),
        )
        self.calls.append(call)
        return call

    def report(
        self, *, reason: str | None = None, summary: ReuseSummary | None = None
    ) -> ReuseReport:
        """The report so far: unreachable when `reason` is given, else with its summary."""
        return ReuseReport(
            reachable=reason is None,
            reason=reason,
            model=self.model,
            nonce=self.nonce,
            bundle_tokens=self.bundle_tokens,
            calls=self.calls,
            summary=summary,
        )


async def _measured_call(
    client: VllmClient, model: str, messages: Sequence[ChatMessage], max_tokens: int
) -> tuple[ChatResult, MetricsWindow | None] | Unavailable:
    """The call, and what /metrics saw around it (None when /metrics could not be read)."""
    before = await client.meter.snapshot(model)
    result = await client.chat(messages, model=model, max_tokens=max_tokens)
    if isinstance(result, Unavailable):
        return result
    if before is None:
        return result, None
    return result, await client.meter.window(model, before, result.trace.prompt_tokens)


def _whole_blocks(tokens: int | None, block_size: int | None) -> bool | None:
    if tokens is None or not block_size:
        return None
    return tokens % block_size == 0


def summarize_reuse(
    calls: Sequence[BundleReuseCall], *, block_size: int | None, bundles: int
) -> ReuseSummary:
    """Latency ratio, hit rates and the usage/metrics agreement over a run's calls."""
    cold = [c for c in calls if c.phase == "cold"]
    warm = [c for c in calls if c.phase == "warm"]
    cold_latency = sum(c.latency_s for c in cold)
    warm_hits = sum(c.hit_tokens_usage or 0 for c in warm)
    warm_prompt = sum(c.prompt_tokens for c in warm)
    metered = [c for c in calls if c.hit_tokens_metrics is not None and c.queries_tokens_metrics]
    hits_sum = sum(c.hit_tokens_metrics or 0 for c in metered)
    queries_sum = sum(c.queries_tokens_metrics or 0 for c in metered)
    comparable = [
        c
        for c in calls
        if c.metrics_exclusive and None not in (c.hit_tokens_usage, c.hit_tokens_metrics)
    ]
    return ReuseSummary(
        bundles=bundles,
        calls=len(calls),
        block_size=block_size,
        cold_latency_p50_s=percentile([c.latency_s for c in cold], 50),
        warm_latency_p50_s=percentile([c.latency_s for c in warm], 50),
        warm_cold_latency_ratio=(
            sum(c.latency_s for c in warm) / cold_latency if cold and cold_latency > 0 else None
        ),
        cold_hit_tokens=sum(c.hit_tokens_usage or 0 for c in cold),
        warm_hit_tokens=warm_hits,
        warm_prompt_tokens=warm_prompt,
        warm_hit_rate=warm_hits / warm_prompt if warm_prompt else None,
        metrics_hit_rate=hits_sum / queries_sum if queries_sum else None,
        usage_matches_metrics=(
            all(c.hit_tokens_usage == c.hit_tokens_metrics for c in comparable)
            if comparable
            else None
        ),
    )


def reuse_table(report: ReuseReport) -> str:
    """The per-call table and the summary, for people (the script and the CLI print it)."""
    if not report.reachable:
        return f"vLLM unavailable: {report.reason}"
    header = (
        f"{'call':<16} {'latency ms':>10} {'prompt tok':>10} {'hit (usage)':>11} "
        f"{'hit (metrics)':>13} {'source':>8}"
    )
    lines = [f"model {report.model}, run nonce {report.nonce}", header, "-" * len(header)]
    for call in report.calls:
        lines.append(
            f"{f'bundle {call.bundle} {call.phase}':<16} {call.latency_s * 1000:>10.1f} "
            f"{call.prompt_tokens:>10} {_n(call.hit_tokens_usage):>11} "
            f"{_n(call.hit_tokens_metrics):>13} {call.cached_tokens_source:>8}"
        )
    summary = report.summary
    if summary is not None:
        lines += [
            "",
            f"block size {_n(summary.block_size)}; bundle tokens {report.bundle_tokens}",
            f"cold p50 {_ms(summary.cold_latency_p50_s)}, "
            f"warm p50 {_ms(summary.warm_latency_p50_s)}, "
            f"warm/cold latency ratio {_f(summary.warm_cold_latency_ratio)}",
            f"warm hit rate {_f(summary.warm_hit_rate)} ({summary.warm_hit_tokens}/"
            f"{summary.warm_prompt_tokens} tokens); cold hit tokens {summary.cold_hit_tokens}; "
            f"metrics hit rate over all calls {_f(summary.metrics_hit_rate)}",
            f"usage matches metrics: {summary.usage_matches_metrics}",
        ]
    return "\n".join(lines)


def _n(value: int | None) -> str:
    return "n/a" if value is None else str(value)


def _f(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 1000:.1f} ms"
