"""How the vLLM client fails against loopback doubles: hung, garbage, a proxy page, a 5xx, a
stream that stalls; and that a cancelled stream gives its connection back."""

from __future__ import annotations

import anyio
import anyio.to_thread

from graph_kvcache_mcp.connectors.vllm.client import VllmClient
from graph_kvcache_mcp.domain.bundle import ChatMessage
from graph_kvcache_mcp.domain.outcomes import Unavailable
from tests.support.peers import garbage_peer, slow_peer
from tests.support.vllm_peers import failing_vllm_peer, proxy_page_peer, stalled_stream_peer

QUESTION = [ChatMessage(role="user", content="hi")]


async def chat_with(url: str, *, timeout_s: float = 5.0, stream: bool = False) -> Unavailable:
    # No /metrics reads around the call: the double answers every request the same way.
    async with VllmClient(url + "/v1", timeout_s=timeout_s, metrics_fallback=False) as client:
        outcome = await client.chat(QUESTION, model="m", max_tokens=1, stream=stream)
    assert isinstance(outcome, Unavailable), outcome
    return outcome


async def test_a_peer_that_accepts_and_never_answers_times_out_after_the_setting() -> None:
    with slow_peer(hold_s=30) as url:
        with anyio.fail_after(10):
            outcome = await chat_with(url, timeout_s=0.5)
    assert "did not answer within 0.5 s (GRAPH_KVCACHE_VLLM_TIMEOUT_S)" in outcome.reason
    assert "not reachable" not in outcome.reason


async def test_garbage_bytes_are_a_bad_answer() -> None:
    with garbage_peer() as url:
        outcome = await chat_with(url)
    assert "sent a bad answer (not valid HTTP" in outcome.reason


async def test_an_html_page_with_200_is_a_bad_answer_for_chat_and_tokenize() -> None:
    with proxy_page_peer() as url:
        chat = await chat_with(url)
        async with VllmClient(url + "/v1") as client:
            count = await client.tokenize("x", model="m")
    assert isinstance(count, Unavailable)
    for outcome in (chat, count):
        assert "bad answer" in outcome.reason and "proxy" in outcome.reason


async def test_a_5xx_carries_vllms_own_message() -> None:
    with failing_vllm_peer("EngineCore encountered an issue") as url:
        outcome = await chat_with(url)
    assert outcome.status == 500
    assert "HTTP 500: EngineCore encountered an issue" in outcome.reason


async def test_a_stream_that_stalls_between_chunks_times_out() -> None:
    with stalled_stream_peer() as peer:
        with anyio.fail_after(10):
            outcome = await chat_with(peer.url, timeout_s=0.5, stream=True)
        closed = await anyio.to_thread.run_sync(peer.client_closed.wait, 5.0)
    assert "sent no chunk of its streamed answer for 0.5 s" in outcome.reason
    assert closed, "the timed-out stream left its connection open"


async def test_a_cancelled_stream_closes_its_connection() -> None:
    with stalled_stream_peer() as peer:
        async with VllmClient(peer.url + "/v1", timeout_s=60, metrics_fallback=False) as client:
            async with anyio.create_task_group() as group:
                group.start_soon(
                    lambda: client.chat(QUESTION, model="m", max_tokens=5, stream=True)
                )
                sent = await anyio.to_thread.run_sync(peer.first_chunk_sent.wait, 5.0)
                group.cancel_scope.cancel()
            # The client is still open: only the stream's own close can have ended the connection.
            closed = await anyio.to_thread.run_sync(peer.client_closed.wait, 5.0)
    assert sent and closed


async def test_a_stream_that_turns_into_a_foreign_shape_is_a_bad_answer_and_is_closed() -> None:
    with stalled_stream_peer(then={"unexpected": "shape"}) as peer:
        async with VllmClient(peer.url + "/v1", timeout_s=60, metrics_fallback=False) as client:
            with anyio.fail_after(10):
                outcome = await client.chat(QUESTION, model="m", max_tokens=5, stream=True)
            closed = await anyio.to_thread.run_sync(peer.client_closed.wait, 5.0)
    assert isinstance(outcome, Unavailable)
    assert "not the shape of an OpenAI answer" in outcome.reason
    assert closed, "the abandoned stream kept its connection"
