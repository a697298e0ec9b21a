"""The vLLM client's error mapping and cache attribution, against `httpx2.MockTransport` doubles.

Each double stands in for a server that cannot be staged for real: one that answers a proxy's
page, a foreign shape, a 5xx with vLLM's message, or whose /metrics moved under other traffic.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx2
import pytest

from graph_kvcache_mcp.connectors.vllm.client import VllmClient
from graph_kvcache_mcp.domain.bundle import ChatMessage
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.domain.vllm.chat import ChatResult
from graph_kvcache_mcp.domain.vllm.metrics import parse_snapshot
from graph_kvcache_mcp.errors import VllmRequestError
from tests.support.expositions import CAPTURED_MODEL, captured, widen, with_external_tier

BASE_URL = "http://127.0.0.1:8000/v1"
ROOT = "http://127.0.0.1:8000"
QUESTION = [ChatMessage(role="user", content="hi")]
Handler = Callable[[httpx2.Request], httpx2.Response]


def client_of(handler: Handler, **options: float) -> VllmClient:
    return VllmClient(BASE_URL, transport=httpx2.MockTransport(handler), **options)  # type: ignore[arg-type]


def answering(status: int, body: str, content_type: str = "application/json") -> Handler:
    """A double that answers every request with `status` and `body`."""

    def handler(_request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(status, text=body, headers={"content-type": content_type})

    return handler


def failing(exc: type[httpx2.TransportError]) -> Handler:
    """A double whose every request fails in the transport with `exc`."""

    def handler(request: httpx2.Request) -> httpx2.Response:
        raise exc("stand-in failure", request=request)

    return handler


def completion(prompt_tokens: int, *, cached: int | None = None) -> dict[str, object]:
    usage: dict[str, object] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 1,
        "total_tokens": prompt_tokens + 1,
    }
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return {
        "id": "cmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": CAPTURED_MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ok"},
                "finish_reason": "length",
            }
        ],
        "usage": usage,
    }


async def chat_outcome(handler: Handler) -> ChatResult | Unavailable:
    async with client_of(handler) as client:
        return await client.chat(QUESTION, model=CAPTURED_MODEL, max_tokens=1)


@pytest.mark.parametrize(
    ("failure", "words"),
    [
        (httpx2.ConnectError, "not reachable at http://127.0.0.1:8000 (ConnectError)"),
        (httpx2.ReadTimeout, "did not answer within 120 s (GRAPH_KVCACHE_VLLM_TIMEOUT_S)"),
        (httpx2.RemoteProtocolError, "bad answer (not valid HTTP: RemoteProtocolError)"),
    ],
)
async def test_transport_failures_read_as_three_distinct_reasons(
    failure: type[httpx2.TransportError], words: str
) -> None:
    outcome = await chat_outcome(failing(failure))
    assert isinstance(outcome, Unavailable)
    assert words in outcome.reason


async def test_a_read_timeout_on_a_streamed_call_names_the_stream() -> None:
    async with client_of(failing(httpx2.ReadTimeout)) as client:
        outcome = await client.chat(QUESTION, model=CAPTURED_MODEL, max_tokens=1, stream=True)
    assert isinstance(outcome, Unavailable)
    assert "sent no chunk of its streamed answer for 120 s" in outcome.reason


async def test_an_html_page_with_status_200_is_a_bad_answer() -> None:
    page = "<html><body>Welcome to the proxy</body></html>"
    outcome = await chat_outcome(answering(200, page, "text/html"))
    assert isinstance(outcome, Unavailable)
    assert "bad answer" in outcome.reason and "not at a proxy" in outcome.reason


async def test_json_of_another_shape_is_a_bad_answer() -> None:
    outcome = await chat_outcome(answering(200, json.dumps({"hello": "world"})))
    assert isinstance(outcome, Unavailable)
    assert "not the shape of an OpenAI answer" in outcome.reason


async def test_a_json_content_type_over_garbage_is_a_bad_answer() -> None:
    outcome = await chat_outcome(answering(200, "{not json"))
    assert isinstance(outcome, Unavailable)
    assert "bad answer (not JSON" in outcome.reason


async def test_a_5xx_is_a_bad_answer_that_carries_vllms_own_message() -> None:
    body = json.dumps({"error": {"message": "EngineCore died", "type": "Internal", "code": 500}})
    outcome = await chat_outcome(answering(500, body))
    assert isinstance(outcome, Unavailable)
    assert outcome.status == 500
    assert "HTTP 500: EngineCore died" in outcome.reason


async def test_a_refused_request_raises_with_vllms_message_and_status() -> None:
    body = json.dumps({"object": "error", "message": "The model `x` does not exist.", "code": 404})
    with pytest.raises(VllmRequestError, match="does not exist") as caught:
        await chat_outcome(answering(404, body))
    assert caught.value.status == 404


async def test_a_refused_api_key_says_which_setting_to_fix() -> None:
    outcome = await chat_outcome(answering(401, json.dumps({"error": "Unauthorized"})))
    assert isinstance(outcome, Unavailable)
    assert "VLLM_API_KEY" in outcome.reason


@pytest.mark.parametrize(
    ("status", "body", "content_type", "words"),
    [
        (200, "<html>proxy</html>", "text/html", "/tokenize answered with no JSON: text/html"),
        (200, json.dumps({"tokens": [1, 2]}), "application/json", "without a count"),
        (200, json.dumps([1, 2]), "application/json", "answered list, not an object"),
        (502, "Bad Gateway", "text/plain", "HTTP 502: Bad Gateway"),
    ],
)
async def test_tokenize_guards_every_read_of_the_answer(
    status: int, body: str, content_type: str, words: str
) -> None:
    async with client_of(answering(status, body, content_type)) as client:
        outcome = await client.tokenize("x", model="m")
    assert isinstance(outcome, Unavailable)
    assert words in outcome.reason


async def test_reset_with_a_page_instead_of_json_is_a_bad_answer() -> None:
    async with client_of(answering(200, "<html>proxy</html>", "text/html")) as client:
        outcome = await client.reset_prefix_cache()
    assert isinstance(outcome, Unavailable)
    assert "/reset_prefix_cache answered with no JSON" in outcome.reason


def metrics_server(prompt_tokens: int) -> Handler:
    """A vLLM double without prompt-token details whose counters double after the first scrape:
    prompt tokens and prefix hits move by what the captured exposition holds."""
    scrapes = [0]

    def handler(request: httpx2.Request) -> httpx2.Response:
        if request.url.path == "/metrics":
            scrapes[0] += 1
            factor = 1 if scrapes[0] == 1 else 2
            return httpx2.Response(200, text=widen(captured(), [(CAPTURED_MODEL, "0", factor)]))
        return httpx2.Response(200, json=completion(prompt_tokens))

    return handler


CAPTURED = parse_snapshot(captured(), CAPTURED_MODEL)


async def test_hits_come_from_metrics_when_only_this_call_moved_the_counters() -> None:
    assert CAPTURED.prompt_tokens is not None
    outcome = await chat_outcome(metrics_server(CAPTURED.prompt_tokens))
    assert isinstance(outcome, ChatResult)
    assert outcome.trace.cached_tokens_source == "metrics_delta"
    assert outcome.trace.prefix_cache_hit_tokens == CAPTURED.prefix_cache_hits_tokens


async def test_no_cache_attribution_when_other_traffic_moved_the_counters() -> None:
    assert CAPTURED.prompt_tokens is not None
    this_call = CAPTURED.prompt_tokens - 100  # the counters moved by 100 tokens more than this
    outcome = await chat_outcome(metrics_server(this_call))
    assert isinstance(outcome, ChatResult)
    trace = outcome.trace
    assert (trace.cached_tokens_source, trace.prefix_cache_hit_tokens) == ("unavailable", None)
    assert trace.prefix_cache_miss_tokens is None
    assert trace.note is not None and "other requests ran at the same time" in trace.note


def usage_server(
    prompt_tokens: int, cached: int, seen: list[str], *, exposition: str | None = None
) -> Handler:
    """A vLLM double that reports cached tokens in usage and whose /metrics counters grow by what
    `exposition` (default: the capture) holds with every answered call, so each call's window
    moves by exactly that much."""

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request.url.path)
        if request.url.path == "/metrics":
            factor = 1 + seen.count("/v1/chat/completions")
            text = exposition if exposition is not None else captured()
            return httpx2.Response(200, text=widen(text, [(CAPTURED_MODEL, "0", factor)]))
        return httpx2.Response(200, json=completion(prompt_tokens, cached=cached))

    return handler


async def test_usage_details_win_and_metrics_stop_once_no_external_tier_shows() -> None:
    assert CAPTURED.prompt_tokens is not None
    seen: list[str] = []
    handler = usage_server(CAPTURED.prompt_tokens, 32, seen)
    async with client_of(handler) as client:
        first = await client.chat(QUESTION, model=CAPTURED_MODEL, max_tokens=1)
        scrapes_for_first = seen.count("/metrics")
        second = await client.chat(QUESTION, model=CAPTURED_MODEL, max_tokens=1)
    assert isinstance(first, ChatResult) and isinstance(second, ChatResult)
    assert (second.trace.cached_tokens_source, second.trace.prefix_cache_hit_tokens) == (
        "usage",
        32,
    )
    # Around the first call only, to learn that no KV connector moves the external counters.
    assert scrapes_for_first == 2
    assert seen.count("/metrics") == 2
    assert second.trace.external_cache_hit_tokens is None


async def test_usage_hits_are_split_by_tier_when_a_kv_connector_moves_the_counters() -> None:
    assert CAPTURED.prompt_tokens is not None and CAPTURED.prefix_cache_hits_tokens is not None
    tiered = with_external_tier(captured(), queries=1200, hits=1024, engine_bytes=786_432)
    reported = CAPTURED.prefix_cache_hits_tokens + 1024  # usage counts local plus external
    seen: list[str] = []
    handler = usage_server(CAPTURED.prompt_tokens, reported, seen, exposition=tiered)
    async with client_of(handler) as client:
        first = await client.chat(QUESTION, model=CAPTURED_MODEL, max_tokens=1)
        second = await client.chat(QUESTION, model=CAPTURED_MODEL, max_tokens=1)
    assert isinstance(first, ChatResult) and isinstance(second, ChatResult)
    trace = first.trace
    assert trace.cached_tokens_source == "usage"
    assert (trace.prefix_cache_hit_tokens, trace.external_cache_hit_tokens) == (reported, 1024)
    assert trace.local_cache_hit_tokens == CAPTURED.prefix_cache_hits_tokens
    assert trace.external_bytes_read == 786_432
    # The tier keeps the meter reading after every call; the read after the first call is the
    # second call's start (one scrape fewer on the agent's wait), and still splits it.
    assert seen.count("/metrics") == 3
    assert second.trace.external_cache_hit_tokens == 1024


async def test_no_tier_split_when_other_traffic_moved_the_counters() -> None:
    assert CAPTURED.prompt_tokens is not None
    tiered = with_external_tier(captured(), queries=1200, hits=1024, engine_bytes=None)
    seen: list[str] = []
    this_call = CAPTURED.prompt_tokens - 100  # the counters moved by 100 tokens more than this
    handler = usage_server(this_call, 500, seen, exposition=tiered)
    outcome = await chat_outcome(handler)
    assert isinstance(outcome, ChatResult)
    trace = outcome.trace
    assert (trace.cached_tokens_source, trace.prefix_cache_hit_tokens) == ("usage", 500)
    assert (trace.external_cache_hit_tokens, trace.external_bytes_read) == (None, None)
    assert trace.note is not None and "cannot be split" in trace.note
