"""The vLLM client against a real vLLM: per-call cache accounting checked against /metrics."""

from __future__ import annotations

import uuid

import anyio
import pytest
from pydantic import SecretStr

from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.connectors.vllm.client import VllmClient
from graph_kvcache_mcp.connectors.vllm.metrics import VllmMetricsClient
from graph_kvcache_mcp.domain.bundle import ChatMessage
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.domain.vllm.chat import ChatResult
from graph_kvcache_mcp.domain.vllm.metrics import MetricsSnapshot, delta
from graph_kvcache_mcp.errors import VllmRequestError
from tests.support.vllm import BLOCK_SIZE, RunningVllm

pytestmark = pytest.mark.vllm


def long_system_prompt() -> str:
    """~1.5k tokens, unique per call of this function, so no earlier test warmed its blocks."""
    rules = " ".join(f"Rule {i}: keep answers short and cite the source." for i in range(80))
    return f"Session {uuid.uuid4().hex}. {rules}"


def conversation(system: str, question: str) -> list[ChatMessage]:
    return [ChatMessage(role="system", content=system), ChatMessage(role="user", content=question)]


async def settled_snapshot(
    metrics: VllmMetricsClient, model: str, before: MetricsSnapshot, prompt_tokens: int
) -> MetricsSnapshot:
    """The first snapshot that shows the call's prompt tokens (stats land just after replies)."""
    with anyio.fail_after(5):
        while True:
            after = await metrics.snapshot(model)
            assert isinstance(after, MetricsSnapshot)
            moved = (after.prompt_tokens or 0) - (before.prompt_tokens or 0)
            if moved >= prompt_tokens:
                return after
            await anyio.sleep(0.02)


async def test_second_call_sharing_a_long_prefix_hits_whole_blocks_matching_metrics(
    vllm_server: RunningVllm,
) -> None:
    system = long_system_prompt()
    async with vllm_server.client() as client:
        first = await client.chat(conversation(system, "What is rule 3?"), max_tokens=4)
        assert isinstance(first, ChatResult)
        before = await client.metrics.snapshot(vllm_server.model)
        assert isinstance(before, MetricsSnapshot)
        second = await client.chat(conversation(system, "And rule 7?"), max_tokens=4)
        assert isinstance(second, ChatResult)
        after = await settled_snapshot(
            client.metrics, vllm_server.model, before, second.trace.prompt_tokens
        )
    window = delta(before, after)
    assert first.trace.cached_tokens_source == "usage"
    assert first.trace.prefix_cache_hit_tokens == 0
    assert first.trace.prefix_cache_miss_tokens == first.trace.prompt_tokens > 1000
    hit = second.trace.prefix_cache_hit_tokens
    assert second.trace.cached_tokens_source == "usage"
    assert hit is not None and hit > 0
    assert hit % BLOCK_SIZE == 0
    assert hit == window.prefix_cache_hits_tokens
    assert second.trace.prefix_cache_miss_tokens == second.trace.prompt_tokens - hit
    assert window.prompt_tokens == second.trace.prompt_tokens


async def test_streamed_call_reports_ttft_and_cached_tokens_from_the_last_chunk(
    vllm_server: RunningVllm,
) -> None:
    system = long_system_prompt()
    async with vllm_server.client() as client:
        cold = await client.chat(conversation(system, "one"), max_tokens=6, stream=True)
        warm = await client.chat(conversation(system, "two"), max_tokens=6, stream=True)
    assert isinstance(cold, ChatResult) and isinstance(warm, ChatResult)
    for result in (cold, warm):
        assert result.trace.stream is True
        assert result.trace.ttft_s is not None
        assert 0 < result.trace.ttft_s <= result.trace.latency_s
        assert result.trace.completion_tokens == 6
        assert result.trace.finish_reason == "length"
    assert cold.trace.prefix_cache_hit_tokens == 0
    assert (warm.trace.prefix_cache_hit_tokens or 0) > 0


async def test_tokenize_counts_what_a_chat_call_sends(vllm_server: RunningVllm) -> None:
    messages = conversation(long_system_prompt(), "count me")
    async with vllm_server.client() as client:
        counted = await client.tokenize(messages=messages)
        result = await client.chat(messages, max_tokens=1)
        text_count = await client.tokenize("hello world")
    assert isinstance(result, ChatResult)
    assert counted == result.trace.prompt_tokens
    assert isinstance(text_count, int) and text_count > 0


async def test_model_defaults_to_the_only_served_model(vllm_server: RunningVllm) -> None:
    async with vllm_server.client() as client:
        assert await client.models() == [vllm_server.model]
        result = await client.complete("plain prompt", max_tokens=2)
    assert isinstance(result, ChatResult)
    assert result.trace.model == vllm_server.model


async def test_unknown_model_is_refused_with_vllms_reason(vllm_server: RunningVllm) -> None:
    async with vllm_server.client() as client:
        with pytest.raises(VllmRequestError, match="no-such-model") as caught:
            await client.chat(conversation("s", "q"), model="no-such-model", max_tokens=1)
    assert caught.value.status == 404


async def test_reset_prefix_cache_makes_the_next_identical_call_cold(
    vllm_server: RunningVllm,
) -> None:
    messages = conversation(long_system_prompt(), "same")
    async with vllm_server.client() as client:
        await client.chat(messages, max_tokens=1)
        warm = await client.chat(messages, max_tokens=1)
        reset = await client.reset_prefix_cache()
        cold = await client.chat(messages, max_tokens=1)
    assert isinstance(warm, ChatResult) and isinstance(cold, ChatResult)
    assert not isinstance(reset, Unavailable)
    assert (reset.reset, reset.dev_mode) == (True, True)
    assert (warm.trace.prefix_cache_hit_tokens or 0) > 0
    assert cold.trace.prefix_cache_hit_tokens == 0


async def test_a_stopped_server_reads_as_unavailable_not_as_an_empty_answer() -> None:
    base_url = f"http://127.0.0.1:{free_port()}/v1"
    async with VllmClient(base_url, timeout_s=5.0, max_retries=0) as client:
        result = await client.chat(conversation("s", "q"), model="m", max_tokens=1)
        health = await client.health()
        count = await client.tokenize("x", model="m")
    for outcome in (result, health, count):
        assert isinstance(outcome, Unavailable)
        assert base_url.removesuffix("/v1") in outcome.reason


async def test_the_api_key_never_shows_in_reprs_or_reasons() -> None:
    secret = "sk-never-print-" + uuid.uuid4().hex
    base_url = f"http://127.0.0.1:{free_port()}/v1"
    async with VllmClient(
        base_url, api_key=SecretStr(secret), timeout_s=2.0, max_retries=0
    ) as client:
        result = await client.chat(conversation("s", "q"), model="m", max_tokens=1)
        shown = [repr(client), repr(client.metrics), str(await client.metrics.snapshot())]
    assert isinstance(result, Unavailable)
    assert all(secret not in text for text in [*shown, result.reason])


async def test_an_answer_slower_than_the_timeout_reads_as_timed_out_and_vllm_still_serves(
    vllm_server: RunningVllm,
) -> None:
    messages = conversation(long_system_prompt(), "Tell a very long story.")
    async with VllmClient(vllm_server.base_url, timeout_s=0.05, metrics_fallback=False) as hasty:
        with anyio.fail_after(30):
            slow = await hasty.chat(messages, model=vllm_server.model, max_tokens=2000)
    async with vllm_server.client() as patient:
        after = await patient.chat(conversation("s", "q"), max_tokens=1)
    assert isinstance(slow, Unavailable)
    assert "did not answer within 0.05 s (GRAPH_KVCACHE_VLLM_TIMEOUT_S)" in slow.reason
    assert isinstance(after, ChatResult)
