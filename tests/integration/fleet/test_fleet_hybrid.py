"""The fleet view and diagnose miss on real hybrids: a tiny GraniteMoeHybrid (two KV cache groups)
and a tiny NemotronH (three), each served by CPU vLLM with the prefix-caching recipe and KV events.

Every prediction, by `fleet_where_cached` and by `diagnose_miss`, is checked against the
`cached_tokens` vLLM then reports for that very request: an exact repeat, a prompt sharing the
head of a cached one, an edited prompt and a never-sent one. A hybrid keeps a request's mamba
state only where its prefill ended, so most of these serve nothing although the attention blocks
are there; a dense model would report hundreds of tokens.
"""

from __future__ import annotations

import json
import re
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.fleet.connection import FleetConnection, load_fleet
from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.connectors.vllm.client import VllmClient
from graph_kvcache_mcp.connectors.vllm.process import ManagedVllm
from graph_kvcache_mcp.connectors.vllm.state import VllmStatus
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.domain.vllm.hybrid.cache import state_position
from graph_kvcache_mcp.services.diagnosis.prefix_miss import explain_miss
from graph_kvcache_mcp.services.fleet import operations as fleet_service
from tests.support.hybrid import hybrid_model_dir
from tests.support.vllm import (
    BLOCK_SIZE,
    MODEL_NAME,
    READY_TIMEOUT_S,
    VLLM_CPU,
    VllmServers,
    fast_cpu_launch,
    offline_environment,
    require_vllm_venv,
)

pytestmark = pytest.mark.vllm

RAISED_BLOCK = re.compile(r"Setting attention block size to (\d+) tokens")
GROUPS = {"granite": 2, "nemotron": 3}


@dataclass
class Hybrid:
    family: str
    status: VllmStatus
    block: int
    settings: Settings

    @property
    def base_url(self) -> str:
        assert self.status.base_url is not None
        return self.status.base_url


def recipe(block: int) -> tuple[str, ...]:
    """The flags a Mamba2 hybrid needs for prefix caching on CPU (hybrid-cpu facts): align mode,
    one block per step, and a mamba chunk no smaller than the block."""
    return (
        "--mamba-cache-mode", "align",
        "--max-num-batched-tokens", str(block),
        "--hf-overrides", json.dumps({"mamba_chunk_size": block}),
    )  # fmt: skip


def _start(family: str, home: Path, cache_root: Path, events: dict[str, str]) -> Hybrid:
    """Start with the requested block; if vLLM raises it (its log says so), start again with
    the recipe sized to the block it uses."""
    managed = ManagedVllm(home, python=require_vllm_venv())
    block = BLOCK_SIZE
    while True:
        launch = fast_cpu_launch(
            hybrid_model_dir(family), free_port(), kv_events=True, extra_args=recipe(block),
            **events,
        )  # fmt: skip
        status = managed.start(
            launch,
            env=offline_environment(cache_root),
            ready_timeout_s=READY_TIMEOUT_S,
            platform=VLLM_CPU,
        )
        raised = RAISED_BLOCK.search(managed.log_path.read_text())
        if raised is None or int(raised.group(1)) == block:
            break
        managed.stop(term_wait_s=10.0)
        block = int(raised.group(1))
    fleet_file = home / "fleet.json"
    fleet_file.write_text(
        json.dumps(
            {
                "instances": [
                    {
                        "name": family,
                        "base_url": status.base_url,
                        "kv_events": status.kv_events,
                        "kv_events_replay": status.kv_events_replay,
                    }
                ]
            }
        )
    )
    settings = Settings.build(data_dir=home / "server", fleet_file=fleet_file, toolsets=("fleet",))
    return Hybrid(family, status, block, settings)


@pytest.fixture(scope="module", params=sorted(GROUPS))
def hybrid(
    request: pytest.FixtureRequest,
    vllm_servers: VllmServers,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Hybrid]:
    vllm_servers.stop_shared()  # memory is shared: this one instead of the session's
    family = str(request.param)
    root = tmp_path_factory.mktemp(f"hybrid-{family}")
    events = {
        "kv_events_endpoint": f"ipc://{root}/events.sock",
        "kv_events_replay_endpoint": f"tcp://127.0.0.1:{free_port()}",
    }
    with tempfile.TemporaryDirectory(prefix="vllm-cache-") as cache:
        try:
            yield _start(family, root / "vllm", Path(cache), events)
        finally:
            ManagedVllm(root / "vllm").stop(term_wait_s=10.0)


def long_text(words: int = 240) -> str:
    """A fresh prompt of about 1,300 tokens that no earlier request cached."""
    tag = uuid.uuid4().hex
    return f"Run {tag}. " + " ".join(f"item{i % 50} {tag[i % 32]}" for i in range(words))


def cut(text: str, share: float) -> str:
    """The text's first `share` of words (a word boundary, so the tokens are a true prefix)."""
    words = text.split(" ")
    return " ".join(words[: int(len(words) * share)])


def edit_at(text: str, share: float) -> str:
    """The text with a word inserted after its first `share` of words."""
    words = text.split(" ")
    at = int(len(words) * share)
    return " ".join([*words[:at], "EDITED", *words[at:]])


def messages_of(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def reported_cached(item: Hybrid, text: str) -> tuple[int, int]:
    """Send the request; its prompt tokens and the cached_tokens vLLM reports."""
    reply = httpx2.post(
        item.base_url + "/chat/completions",
        json={
            "model": MODEL_NAME,
            "messages": messages_of(text),
            "max_tokens": 1,
            "temperature": 0,
        },
        timeout=300,
    )
    reply.raise_for_status()
    usage = reply.json()["usage"]
    return usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]


async def test_fleet_where_predicts_what_the_hybrid_then_serves(
    hybrid: Hybrid, vllm_private: VllmServers
) -> None:
    text = long_text()
    steps: list[tuple[str, str]] = [
        ("never_sent", text),
        ("exact_repeat", text),
        ("edited", edit_at(text, 0.75)),
        ("shared_head", cut(text, 0.5) + " and then something else"),
        ("after_the_head", cut(text, 0.5) + " and then something else entirely, at length"),
    ]
    seen: dict[str, tuple[Any, int, int]] = {}
    conn = FleetConnection(load_fleet(hybrid.settings))
    try:
        for case, prompt in steps:
            out = await fleet_service.where_cached(conn, request={"messages": messages_of(prompt)})
            (answer,) = out.instances
            tokens, cached = reported_cached(hybrid, prompt)
            seen[case] = (answer, tokens, cached)
        groups = conn.index.groups(hybrid.family)
    finally:
        await conn.aclose()
    for case, (answer, tokens, cached) in seen.items():
        assert answer.prompt_tokens == tokens, case
        assert answer.cached_tokens == cached, (case, answer)
    assert len(groups) == GROUPS[hybrid.family] and "full_attention" in groups.values()
    first, *later = seen.values()
    # before any request no event has named the groups: a guess, and it says so
    assert not first[0].trusted and "KV cache groups" in (first[0].reason or "")
    assert all(answer.trusted and answer.reason is None for answer, _, _ in later)
    repeat, repeat_tokens, _ = seen["exact_repeat"]
    assert repeat.cached_tokens == state_position(repeat_tokens, hybrid.block) > 0
    # the edit and the shared head share hundreds of attention-cached tokens, but no state
    assert seen["edited"][0].cached_tokens == 0 and seen["shared_head"][0].cached_tokens == 0
    assert seen["edited"][0].by_medium == {"GPU": 0}


def miss_body(text: str) -> dict[str, Any]:
    return {"model": MODEL_NAME, "messages": messages_of(text)}


async def test_diagnose_miss_predicts_what_the_hybrid_then_serves_and_says_why(
    hybrid: Hybrid, vllm_private: VllmServers
) -> None:
    cases: dict[str, tuple[str, str]] = {}
    text = long_text()
    cases["exact_repeat"] = (text, text)
    text = long_text()
    cases["shared_head"] = (text, cut(text, 0.5) + " and then something else")
    text = long_text()
    cases["edited"] = (text, edit_at(text, 0.4))
    cases["never_sent"] = (long_text(), long_text())
    text = long_text()
    cases["warm_head_first"] = (cut(text, 0.5), text)
    outs = {}
    async with VllmClient(hybrid.base_url) as client:
        whole = await whole_blocks_text(client, hybrid.block)
        cases["repeat_of_whole_blocks"] = (whole, whole)
        for case, (first, second) in cases.items():
            outs[case] = await explain_miss(
                client, client.routes, miss_body(first), miss_body(second), verify=True
            )
    for case, out in outs.items():
        assert out.reachable and out.verification is not None, (case, out)
        assert out.verification.cached_tokens_source == "usage"
        assert out.predicted_cached_tokens == out.verification.cached_tokens, (case, out)
        assert out.block_size == hybrid.block
    repeat = outs["exact_repeat"]
    assert repeat.first_tokens is not None
    assert repeat.predicted_cached_tokens == state_position(repeat.first_tokens, hybrid.block)
    for case in ("shared_head", "edited"):
        out = outs[case]
        assert out.predicted_cached_tokens == 0, case
        assert (out.common_prefix_tokens or 0) > 4 * hybrid.block  # a dense model reuses these
        assert out.cause is not None and "hybrid model" in out.cause.detail
        assert "warm-up call" in out.cause.fix
    assert outs["never_sent"].predicted_cached_tokens == 0
    # whole blocks: vLLM keeps the state one block before the end (it computes the last token)
    whole_out = outs["repeat_of_whole_blocks"]
    assert whole_out.first_tokens is not None and whole_out.first_tokens % hybrid.block == 0
    assert whole_out.predicted_cached_tokens == whole_out.first_tokens - hybrid.block


async def whole_blocks_text(client: VllmClient, block: int) -> str:
    """A fresh prompt whose chat tokens fill whole blocks exactly."""
    for words in range(40, 40 + 4 * block):
        text = long_text(words)
        tokens = await client.routes.tokenize_chat(miss_body(text), model=MODEL_NAME)
        assert not isinstance(tokens, Unavailable), tokens
        if len(tokens.tokens) % block == 0:
            return text
    raise AssertionError(f"no prompt of whole {block}-token blocks found")
