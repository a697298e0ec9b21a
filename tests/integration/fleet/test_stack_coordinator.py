"""The MP stack with the managed coordinator (`StackOptions(coordinator="managed")`), all real:
the server joins it, fleet where's l1 follows what the server holds, an L1 evict empties it, a
warm refills it from the engine, and after a vLLM restart the request is served from L1 without
touching the engine, exactly as predicted. vLLM starts: 1 (stack) + 1 (restart)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx
import pytest

from graph_kvcache_mcp.connectors.lmcache.coordinator import CoordinatorHttp
from graph_kvcache_mcp.connectors.lmcache.coordinator_process import ManagedCoordinator
from graph_kvcache_mcp.domain.fleet.tiers import connector_tokens
from graph_kvcache_mcp.domain.lmcache.stack import StackOptions
from graph_kvcache_mcp.services.cache.operations import CacheTarget, evict, warm
from tests.integration.fleet.test_fleet_tiers import send, text_prompt, where
from tests.support.mp_stack import (
    CHUNK_SIZE,
    MpStack,
    cached_tokens_of,
    require_lmcache_in_vllm_venv,
)
from tests.support.vllm import MODEL_NAME

pytestmark = [pytest.mark.vllm, pytest.mark.lmcache]


@dataclass
class CoordinatedStack(MpStack):
    @property
    def options(self) -> StackOptions:
        return StackOptions(http_port=self.http_port, coordinator="managed")

    @property
    def coordinator(self) -> ManagedCoordinator:
        return ManagedCoordinator(self.data_dir)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CoordinatedStack]:
    yield from coordinated_module_stack(tmp_path_factory.mktemp("coordinated-stack"))


def coordinated_module_stack(root: Path) -> Iterator[CoordinatedStack]:
    """A module's coordinated stack under `root`, closed with its coordinator (and the
    environment `ensure` changed restored) at the end: the body of a module-scoped fixture."""
    require_lmcache_in_vllm_venv()
    built = CoordinatedStack(root)
    saved = dict(os.environ)
    try:
        yield built
    finally:
        built.close()
        built.coordinator.stop()
        os.environ.clear()
        os.environ.update(saved)


async def l1_reaches(stack: MpStack, prompt: str, tokens: int) -> None:
    with anyio.fail_after(60):  # the server reports its stores about every second
        while True:
            if (await where(stack, prompt)).tiers["l1"].tokens == tokens:
                return
            await anyio.sleep(0.5)


async def test_warm_then_restart_serves_from_l1_without_the_engine(stack: CoordinatedStack) -> None:
    await stack.ensure()
    coordinator = stack.coordinator.running_state()
    server = stack.lmcache.running_state()
    assert coordinator is not None and server is not None
    assert f"--coordinator-url {coordinator.url}" in " ".join(server.process.command)

    prompt = text_prompt("warm")
    cold = await where(stack, prompt)
    assert cold.tiers["l1"].tokens == 0 and cold.tiers["l1"].trusted
    assert cold.prompt_tokens is not None
    whole = cold.prompt_tokens // CHUNK_SIZE * CHUNK_SIZE
    send(stack, prompt)
    await l1_reaches(stack, prompt, whole)

    target = await _target(stack, coordinator.url, prompt)
    evicted = await evict("a", target, tier="l1")
    assert evicted.done and evicted.affected == whole // CHUNK_SIZE
    await l1_reaches(stack, prompt, 0)
    warmed = await warm("a", target, timeout_s=60.0)
    assert (warmed.done, warmed.found, warmed.chunks) == (
        True,
        whole // CHUNK_SIZE,
        whole // CHUNK_SIZE,
    )
    await l1_reaches(stack, prompt, whole)

    stack.vllm.stop(term_wait_s=10.0)
    await stack.ensure()
    before = stack.engine_stats()
    predicted = await where(stack, prompt)
    expected = connector_tokens(whole, prompt_tokens=cold.prompt_tokens, chunk_size=CHUNK_SIZE)
    assert predicted.tiers["l1"].tokens == whole
    assert cached_tokens_of(send(stack, prompt)) == expected
    assert stack.engine_stats().get_hits == before.get_hits  # served from L1


async def _target(stack: MpStack, url: str, prompt: str) -> CacheTarget:
    """What cache_* resolves from the fleet, spelled out: vLLM's tokens and --model root, and
    the server's instance id."""
    async with httpx.AsyncClient(timeout=60.0) as http:
        tokens = await http.post(
            f"{stack.vllm_root()}/tokenize", json={"model": MODEL_NAME, "prompt": prompt}
        )
        models = await http.get(f"{stack.vllm_root()}/v1/models")
    async with CoordinatorHttp(url) as coordinator:
        instance = await coordinator.instance_id("127.0.0.1", stack.http_port)
    assert isinstance(instance, str), instance
    root = str(models.json()["data"][0]["root"])
    return CacheTarget(url, instance, root, list(tokens.json()["tokens"]))
