"""diagnose miss on a real vLLM (tiny model, block size 32): for every cause kind the prediction
equals, exactly, the cached tokens vLLM reports when both requests are sent one after the other."""

from __future__ import annotations

from typing import Any

import pytest

from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.connectors.vllm.client import VllmClient
from graph_kvcache_mcp.connectors.vllm.local_tokens import LocalChatTokenizer
from graph_kvcache_mcp.domain.diagnosis.prefix_diff import CauseKind
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.services.diagnosis.prefix_miss import explain_miss
from tests.support.vllm import BLOCK_SIZE, RunningVllm

RULES = " ".join(
    f"Rule {name}: keep each function small, name things for what they mean, and test it."
    for name in ("one", "two", "three", "four", "five", "six", "seven", "eight")
)
"""A stable system prompt of several blocks (no digits: a digit at the divergence reads as a
counter)."""


def body(*turns: tuple[str, str]) -> dict[str, Any]:
    return {"messages": [{"role": role, "content": content} for role, content in turns]}


CASES: list[tuple[CauseKind, dict[str, Any], dict[str, Any]]] = [
    (
        "identical",
        body(("system", RULES), ("user", "Review the diff.")),
        body(("system", RULES), ("user", "Review the diff.")),
    ),
    (
        "volatile_value",
        body(("system", RULES + " Now: 2026-12-01T10:41:07Z."), ("user", "Review the diff.")),
        body(("system", RULES + " Now: 2026-12-01T10:42:19Z."), ("user", "Review the diff.")),
    ),
    (
        "reordered",
        body(
            ("system", RULES),
            ("user", "The first document describes the parser and its errors."),
            ("user", "The second document describes the cache and its eviction policy."),
            ("user", "Compare them."),
        ),
        body(
            ("system", RULES),
            ("user", "The second document describes the cache and its eviction policy."),
            ("user", "The first document describes the parser and its errors."),
            ("user", "Compare them."),
        ),
    ),
    (
        "whitespace",
        body(("system", RULES + " Answer briefly."), ("user", "Review the diff.")),
        body(("system", RULES + "  Answer briefly."), ("user", "Review the diff.")),
    ),
    (
        "short_prefix",
        body(("system", "You are a pirate. " + RULES), ("user", "Review the diff.")),
        body(("system", "You are a poet. " + RULES), ("user", "Review the diff.")),
    ),
    (
        "new_turn",
        body(("system", RULES), ("user", "What does this diff change?")),
        body(("system", RULES), ("user", "Is this diff safe to merge?")),
    ),
    (
        "edited",
        body(("system", RULES + " Prefer tabs."), ("user", "Review the diff.")),
        body(("system", RULES + " Prefer spaces."), ("user", "Review the diff.")),
    ),
]

pytestmark = pytest.mark.vllm


@pytest.mark.parametrize(("kind", "first", "second"), CASES, ids=[c[0] for c in CASES])
async def test_the_prediction_equals_the_cached_tokens_vllm_reports_for_every_cause(
    vllm_server: RunningVllm, kind: CauseKind, first: dict[str, Any], second: dict[str, Any]
) -> None:
    async with vllm_server.client() as client:
        tokenizer = client.routes
        reset = await client.reset_prefix_cache()
        assert not isinstance(reset, Unavailable) and reset.reset, reset
        out = await explain_miss(client, tokenizer, first, second, verify=True)
    assert out.reachable, out.reason
    assert out.cause is not None and out.cause.kind == kind, out.cause
    assert (out.block_size, out.block_size_source) == (BLOCK_SIZE, "cache_config_info")
    assert out.first_tokens and out.first_tokens > 4 * BLOCK_SIZE  # spans several blocks
    assert out.verification is not None and out.verification.cached_tokens_source == "usage"
    assert out.predicted_cached_tokens == out.verification.cached_tokens, out
    assert out.verification.matches_prediction is True
    if kind == "identical":
        assert out.first_divergent_token is None and out.divergence is None
    else:
        assert out.divergence is not None and out.first_divergent_token == out.common_prefix_tokens
        assert out.divergence.first_excerpt != out.divergence.second_excerpt


async def test_a_given_block_size_is_used_and_said_to_be_given(vllm_server: RunningVllm) -> None:
    first, second = CASES[5][1], CASES[5][2]
    async with vllm_server.client() as client:
        tokenizer = client.routes
        out = await explain_miss(client, tokenizer, first, second, block_size=64)
    assert (out.block_size, out.block_size_source) == (64, "given")
    assert out.common_prefix_tokens is not None and out.second_tokens is not None
    common = min(out.common_prefix_tokens, out.second_tokens - 1)
    assert out.predicted_cached_tokens == common // 64 * 64


async def test_an_unreachable_vllm_is_unavailable_with_its_reason() -> None:
    base_url = f"http://127.0.0.1:{free_port()}/v1"
    async with VllmClient(base_url, timeout_s=5.0, max_retries=0) as client:
        tokenizer = client.routes
        out = await explain_miss(client, tokenizer, CASES[0][1], CASES[0][2], model="m")
    assert not out.reachable and out.reason and "not reachable" in out.reason
    assert out.cause is None and out.predicted_cached_tokens is None


async def test_a_local_tokenizer_dir_gives_the_same_diagnosis_as_the_server(
    vllm_server: RunningVllm,
) -> None:
    local = LocalChatTokenizer(vllm_server.model_dir)
    async with vllm_server.client() as client:
        routes = client.routes
        for kind, first, second in CASES:
            served = await explain_miss(client, routes, first, second)
            offline = await explain_miss(None, local, first, second, block_size=BLOCK_SIZE)
            assert offline.tokenizer == "local" and served.tokenizer == "vllm"
            figures = ("first_tokens", "second_tokens", "common_prefix_tokens", "cause")
            assert [getattr(offline, f) for f in figures] == [getattr(served, f) for f in figures]
            assert offline.predicted_cached_tokens == served.predicted_cached_tokens, kind
