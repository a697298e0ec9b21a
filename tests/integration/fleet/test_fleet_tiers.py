"""fleet where's L2 tier on the real MP stack (engine, `lmcache server` with our adapter, CPU
vLLM): the engine's holding of a prompt, read by computed keys and HEAD, is exact against the
engine's own /kv/stats, moves none of its counters, and predicts what vLLM then reports after a
restart. vLLM starts: 1 (stack) + 1 (restart)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest

from graph_kvcache_mcp.connectors.fleet.connection import FleetConnection
from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.domain.fleet.fleet_file import Fleet, FleetInstance
from graph_kvcache_mcp.domain.fleet.tiers import connector_tokens
from graph_kvcache_mcp.services.fleet.operations import where_cached
from graph_kvcache_mcp.services.fleet.tiers import TierSources
from graph_kvcache_mcp.services.fleet.views import FleetWhereOut, InstanceWhere
from tests.support.coordinator import running_coordinator
from tests.support.mp_stack import (
    CHUNK_SIZE,
    MpStack,
    cached_tokens_of,
    require_lmcache_in_vllm_venv,
)
from tests.support.vllm import MODEL_NAME

pytestmark = [pytest.mark.vllm, pytest.mark.lmcache]
STORE_WAIT_S = 60.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MpStack]:
    require_lmcache_in_vllm_venv()
    built = MpStack(tmp_path_factory.mktemp("tiers-stack"))
    saved = dict(os.environ)
    try:
        yield built
    finally:
        built.close()
        os.environ.clear()
        os.environ.update(saved)


def text_prompt(seed: str, words: int = 420) -> str:
    return " ".join(f"{seed}{i % 97} tier" for i in range(words))


async def where(
    stack: MpStack,
    prompt: str,
    *,
    lmcache_http_url: str | None = None,
    coordinator_url: str | None = None,
) -> InstanceWhere:
    fleet = Fleet(
        instances=(
            FleetInstance(
                name="a",
                base_url=f"{stack.vllm_root()}/v1",
                lmcache_http_url=lmcache_http_url or f"http://127.0.0.1:{stack.http_port}",
            ),
        ),
        coordinator_url=coordinator_url,
    )
    conn = FleetConnection(fleet)
    try:
        out: FleetWhereOut = await where_cached(
            conn, prompt=prompt, tiers=TierSources(stack.settings)
        )
    finally:
        await conn.aclose()
    return out.instances[0]


def send(stack: MpStack, prompt: str, port: int | None = None) -> dict[str, object]:
    """The prompt sent to the stack's vLLM (or the one on `port`); its raw answer."""
    reply = httpx.post(
        f"{stack.vllm_root(port)}/v1/completions",
        json={"model": MODEL_NAME, "prompt": prompt, "max_tokens": 2, "temperature": 0},
        timeout=300.0,
    )
    reply.raise_for_status()
    return dict(reply.json())


async def test_l2_is_exact_against_the_engine_and_predicts_the_hit_after_a_vllm_restart(
    stack: MpStack,
) -> None:
    await stack.ensure()
    prompt = text_prompt("never")
    before = stack.engine_stats()
    cold = await where(stack, prompt)
    after = stack.engine_stats()
    assert cold.tiers["l2"].tokens == 0 and cold.tiers["l2"].trusted
    assert cold.tiers["l1"].tokens is None and "coordinator" in (cold.tiers["l1"].reason or "")
    # HEAD moves none of the engine's read counters
    assert (after.get_hits, after.get_misses) == (before.get_hits, before.get_misses)
    assert cold.prompt_tokens is not None and cold.prompt_tokens > 2 * CHUNK_SIZE

    send(stack, prompt)
    whole = cold.prompt_tokens // CHUNK_SIZE * CHUNK_SIZE
    with anyio.fail_after(STORE_WAIT_S):  # LMCache stores to L2 after the request returns
        while True:
            warm = await where(stack, prompt)
            if warm.tiers["l2"].tokens == whole:
                break
            await anyio.sleep(0.5)
    stored = stack.engine_stats()
    assert stored.put_new is not None and after.put_new is not None
    assert stored.put_new - after.put_new == whole // CHUNK_SIZE  # exact: one block per chunk

    stack.vllm.stop(term_wait_s=10.0)
    await stack.ensure()
    restarted = await where(stack, prompt)
    predicted = connector_tokens(
        restarted.tiers["l2"].tokens or 0, prompt_tokens=cold.prompt_tokens, chunk_size=CHUNK_SIZE
    )
    assert predicted > 0
    assert cached_tokens_of(send(stack, prompt)) == predicted
    assert warm.tiers["l2"].source == restarted.tiers["l2"].source


async def test_a_server_that_does_not_answer_reads_as_unknown_with_the_reason(
    stack: MpStack,
) -> None:
    await stack.ensure()
    silent = f"http://127.0.0.1:{free_port()}"
    with anyio.fail_after(30):
        answer = await where(stack, "anything at all", lmcache_http_url=silent)
    l2 = answer.tiers["l2"]
    assert (l2.tokens, l2.trusted) == (None, False)
    assert l2.reason is not None and l2.reason.startswith("unknown") and silent in l2.reason
    assert answer.cached_tokens is None or answer.trusted is False


async def test_l1_is_unknown_within_the_deadline_when_the_coordinator_is_down(
    stack: MpStack,
) -> None:
    await stack.ensure()
    down = f"http://127.0.0.1:{free_port()}"
    with anyio.fail_after(30):
        answer = await where(stack, text_prompt("down"), coordinator_url=down)
    l1 = answer.tiers["l1"]
    assert (l1.tokens, l1.trusted) == (None, False)
    assert l1.reason is not None and l1.reason.startswith("unknown") and down in l1.reason
    assert answer.tiers["l2"].tokens == 0  # the engine still answers for L2


async def test_l1_says_a_server_that_never_joined_the_coordinator_is_not_registered(
    stack: MpStack, tmp_path: Path
) -> None:
    await stack.ensure()
    with running_coordinator(tmp_path) as url:
        answer = await where(stack, text_prompt("joined"), coordinator_url=url)
    l1 = answer.tiers["l1"]
    assert l1.tokens is None and l1.reason is not None
    assert "not registered" in l1.reason and "--coordinator-url" in l1.reason
