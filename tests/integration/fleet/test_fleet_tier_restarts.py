"""fleet where's tiers through restarts, on the real MP stack with events (engine, `lmcache
server` joined to a real `lmcache coordinator`, CPU vLLM publishing KV events): every prediction
is checked against what vLLM then reports (`cached_tokens`, its external hits), LMCache's own
lookup counters (L1 / L2 hit tokens) and the engine's /kv/stats.

- a never-sent prompt: 0 in every tier, trusted, and nothing is served from anywhere;
- a coordinator restarted after the server, with and then without its checkpoint: the L1
  answer is marked untrusted (a lower bound), never trusted and wrong;
- a server restarted under a running vLLM: L1 empty and trusted again, the engine serves the
  predicted tokens;
- two instances on one server, after an L1 evict: the one that never saw the prompt (a fresh
  process, as after a restart) gets it from the engine, the other from its own cache; fleet
  status reports the server's L1 and the engine once.

vLLM starts: 1 (stack) + 1 (the second instance).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import httpx
import pytest

from graph_kvcache_mcp.connectors.fleet.connection import FleetConnection
from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.connectors.vllm.process import ManagedVllm
from graph_kvcache_mcp.domain.fleet.fleet_file import Fleet, FleetInstance
from graph_kvcache_mcp.domain.fleet.memory import PoolUse
from graph_kvcache_mcp.domain.fleet.tiers import connector_tokens
from graph_kvcache_mcp.domain.lmcache.coordinator_plan import coordinator_url
from graph_kvcache_mcp.domain.lmcache.stack import StackOptions, rpc_socket_path
from graph_kvcache_mcp.domain.vllm.launch import VllmLaunch
from graph_kvcache_mcp.services.cache.operations import evict
from graph_kvcache_mcp.services.fleet.operations import status, where_cached
from graph_kvcache_mcp.services.fleet.tiers import TierSources
from graph_kvcache_mcp.services.fleet.views import FleetWhereOut, InstanceWhere
from tests.integration.fleet.test_fleet_tiers import send, text_prompt
from tests.integration.fleet.test_stack_coordinator import _target
from tests.support.coordinator import running_coordinator
from tests.support.mp_stack import (
    CHUNK_SIZE,
    KV_BYTES_PER_TOKEN,
    MpStack,
    cached_tokens_of,
    require_lmcache_in_vllm_venv,
)
from tests.support.vllm import READY_TIMEOUT_S, VLLM_CPU, VLLM_PYTHON

pytestmark = [pytest.mark.vllm, pytest.mark.lmcache]
SETTLE_S = 90.0  # events flush about every second; a server re-registers at its next heartbeat
CONTEXT_LINE = "Registered non-GPU context"  # the server's log line when a vLLM attaches
DEGRADED_LINE = "entering degraded mode"  # vLLM's connector, when its server stops answering


@dataclass
class Coordinator:
    """A real coordinator on one fixed port, restartable with another state dir."""

    root: Path
    port: int = field(default_factory=free_port)
    _running: ExitStack = field(default_factory=ExitStack)

    @property
    def url(self) -> str:
        return coordinator_url(self.port)

    def start(self, state_dir: Path) -> None:
        state_dir.mkdir(parents=True, exist_ok=True)
        self._running = ExitStack()
        self._running.enter_context(running_coordinator(state_dir, port=self.port))

    def stop(self) -> None:
        self._running.close()  # TERM: a clean stop writes its checkpoint


@dataclass
class FedStack(MpStack):
    """The MP stack with vLLM's KV events on and the server joined to `coordinator`."""

    coordinator: Coordinator | None = None

    def launch(self, *, port: int | None = None) -> VllmLaunch:
        return super().launch(port=port).model_copy(update={"kv_events": True})

    @property
    def options(self) -> StackOptions:
        assert self.coordinator is not None
        return StackOptions(http_port=self.http_port, coordinator=self.coordinator.url)

    def member(self, name: str, managed: ManagedVllm) -> FleetInstance:
        state = managed.status()
        assert state.base_url is not None, state
        return FleetInstance(
            name=name,
            base_url=state.base_url,
            kv_events=state.kv_events,
            kv_events_replay=state.kv_events_replay,
            lmcache_http_url=f"http://127.0.0.1:{self.http_port}",
        )

    def reset_vllm_cache(self) -> None:
        """Empty vLLM's own prefix cache (dev mode): the next lookup goes to LMCache. vLLM
        publishes the AllBlocksCleared event at its next engine step: a prompt shorter than a
        block makes one, so the feed says so before the next prediction."""
        httpx.post(f"{self.vllm_root()}/reset_prefix_cache", timeout=60.0).raise_for_status()
        send(self, "flush")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FedStack]:
    require_lmcache_in_vllm_venv()
    root = tmp_path_factory.mktemp("tier-restarts")
    coordinator = Coordinator(root)
    coordinator.start(root / "coordinator")
    built = FedStack(root, coordinator=coordinator)
    saved = dict(os.environ)
    try:
        yield built
    finally:
        built.close()
        coordinator.stop()
        os.environ.clear()
        os.environ.update(saved)


def trusting(stack: FedStack) -> TierSources:
    """The stack's tier sources, trusting the coordinator the test started (LMCache's own, not
    this data dir's: untrusted unless the user opts in with
    GRAPH_KVCACHE_TRUST_UNMANAGED_COORDINATOR)."""
    return TierSources(stack.settings.model_copy(update={"trust_unmanaged_coordinator": True}))


async def where_all(stack: FedStack, prompt: str, *members: FleetInstance) -> FleetWhereOut:
    conn = FleetConnection(Fleet(instances=members or (stack.member("a", stack.vllm),)))
    try:
        return await where_cached(conn, prompt=prompt, tiers=trusting(stack))
    finally:
        await conn.aclose()


async def where(stack: FedStack, prompt: str) -> InstanceWhere:
    return (await where_all(stack, prompt)).instances[0]


async def settles(stack: FedStack, prompt: str, **tokens: int) -> InstanceWhere:
    """The answer once each named tier reads the given tokens (and L1 is registered)."""
    answer: InstanceWhere | None = None
    with anyio.move_on_after(SETTLE_S):
        while True:
            answer = await where(stack, prompt)
            if all(answer.tiers[tier].tokens == want for tier, want in tokens.items()):
                return answer
            await anyio.sleep(0.5)
    raise AssertionError(f"tiers did not reach {tokens}: {answer and answer.model_dump()}")


async def _logged(path: Path, offset: int, line: str) -> None:
    """Until `line` appears in the log at `path` past `offset` (bytes written before)."""
    with anyio.fail_after(SETTLE_S):
        while True:
            with path.open("rb") as log:
                log.seek(offset)
                if line.encode() in log.read():
                    return
            await anyio.sleep(0.5)


@dataclass
class Moves:
    """What one request moved: vLLM's external hits, LMCache's L1/L2 hit tokens, engine reads."""

    cached: int
    external: int
    l1_hit: int
    l2_hit: int
    engine_reads: int


def from_engine(tokens: int) -> Moves:
    """What a request served `tokens` from the engine moves: one engine read per chunk."""
    return Moves(
        cached=tokens,
        external=tokens,
        l1_hit=0,
        l2_hit=tokens,
        engine_reads=tokens // CHUNK_SIZE,
    )


def measured(stack: FedStack, prompt: str, port: int | None = None) -> Moves:
    vllm, server, engine = (
        stack.vllm_counters(port),
        stack.lmcache_counters(),
        stack.engine_stats(),
    )
    reply = send(stack, prompt, port)
    vllm2, server2, engine2 = (
        stack.vllm_counters(port),
        stack.lmcache_counters(),
        stack.engine_stats(),
    )

    def moved(before: int | None, after: int | None) -> int:
        assert before is not None and after is not None
        return after - before

    return Moves(
        cached=cached_tokens_of(reply),
        external=moved(
            vllm.external_prefix_cache_hits_tokens, vllm2.external_prefix_cache_hits_tokens
        ),
        l1_hit=moved(server.l1_hit_tokens, server2.l1_hit_tokens),
        l2_hit=moved(server.l2_hit_tokens, server2.l2_hit_tokens),
        engine_reads=moved(engine.get_hits, engine2.get_hits),
    )


def whole_chunks(answer: InstanceWhere) -> int:
    assert answer.prompt_tokens is not None
    return answer.prompt_tokens // CHUNK_SIZE * CHUNK_SIZE


def from_connector(answer: InstanceWhere, held: int) -> int:
    assert answer.prompt_tokens is not None
    return connector_tokens(held, prompt_tokens=answer.prompt_tokens, chunk_size=CHUNK_SIZE)


async def test_a_never_sent_prompt_predicts_nothing_and_nothing_serves_it(
    stack: FedStack,
) -> None:
    await stack.ensure()
    send(stack, "a first request, shorter than a chunk, so the feed has spoken")
    prompt = text_prompt("never-sent")
    answer = await where(stack, prompt)
    assert answer.freshness.state == "live"
    for tier in ("vllm", "l1", "l2"):
        assert (answer.tiers[tier].tokens, answer.tiers[tier].trusted) == (0, True), tier
    assert (answer.cached_tokens, answer.trusted) == (0, True)
    moves = measured(stack, prompt)
    assert moves == Moves(cached=0, external=0, l1_hit=0, l2_hit=0, engine_reads=0)


async def test_a_restarted_coordinator_marks_l1_untrusted_with_or_without_its_checkpoint(
    stack: FedStack,
) -> None:
    await stack.ensure()
    assert stack.coordinator is not None
    prompt = text_prompt("coordinator")
    send(stack, prompt)
    cold = await where(stack, prompt)
    whole = whole_chunks(cold)
    stored = await settles(stack, prompt, l1=whole, l2=whole)
    assert stored.tiers["l1"].trusted
    # with its checkpoint (the same state dir), then without (an empty one)
    for state_dir, restored in ((stack.root / "coordinator", whole), (stack.root / "blank", 0)):
        stack.coordinator.stop()
        stack.coordinator.start(state_dir)
        with anyio.fail_after(SETTLE_S):  # until the server has registered again
            while True:
                answer = await where(stack, prompt)
                if answer.tiers["l1"].tokens is not None:
                    break
                await anyio.sleep(0.5)
        l1 = answer.tiers["l1"]
        assert (l1.tokens, l1.trusted) == (restored, False), state_dir
        assert l1.reason is not None and "after this server" in l1.reason
        assert answer.tiers["l2"].trusted and answer.tiers["l2"].tokens == whole
        # the truth: the server still holds every chunk in L1
        stack.reset_vllm_cache()
        moves = measured(stack, prompt)
        assert moves.cached == moves.external == moves.l1_hit == from_connector(cold, whole)
        assert moves.engine_reads == 0


async def test_a_server_restart_is_predicted_from_the_engine(stack: FedStack) -> None:
    await stack.ensure()
    prompt = text_prompt("server")
    send(stack, prompt)
    whole = whole_chunks(await where(stack, prompt))
    await settles(stack, prompt, l2=whole)

    vllm_log = stack.vllm.log_path.stat().st_size
    stack.lmcache.stop(term_wait_s=10.0)
    # vLLM re-registers its KV caches with a server only on its heartbeat's unhealthy->healthy
    # edge: a restart quicker than a failed ping would leave the new server without them
    await _logged(stack.vllm.log_path, vllm_log, DEGRADED_LINE)
    server_log = stack.lmcache.log_path.stat().st_size
    await stack.ensure()  # the same server plan on the same ports; vLLM is reused
    await _logged(stack.lmcache.log_path, server_log, CONTEXT_LINE)
    stack.reset_vllm_cache()
    answer = await settles(stack, prompt, vllm=0, l1=0, l2=whole)
    assert all(answer.tiers[tier].trusted for tier in ("vllm", "l1", "l2")), answer.tiers
    predicted = from_connector(answer, whole)
    assert (answer.cached_tokens, answer.trusted) == (predicted, True)
    assert measured(stack, prompt) == from_engine(predicted)


async def test_two_instances_on_one_server_after_an_l1_evict_the_fresh_one_reads_the_engine(
    stack: FedStack, tmp_path: Path
) -> None:
    await stack.ensure()
    assert stack.coordinator is not None
    prompt = text_prompt("shared")
    send(stack, prompt)
    whole = whole_chunks(await where(stack, prompt))
    await settles(stack, prompt, l1=whole, l2=whole)
    held = await memory_of(stack, stack.member("a", stack.vllm))
    evicted = await evict("a", await _target(stack, stack.coordinator.url, prompt), tier="l1")
    assert evicted.done and evicted.affected == whole // CHUNK_SIZE
    await settles(stack, prompt, l1=0)
    left = await memory_of(stack, stack.member("a", stack.vllm))
    # the coordinator's L1 bytes drop by the evicted chunks (1 KiB of KV per token here)
    assert held.used_bytes - left.used_bytes == whole * KV_BYTES_PER_TOKEN

    second = ManagedVllm(tmp_path / "second", python=VLLM_PYTHON)
    try:
        port = free_port()
        socket = rpc_socket_path(stack.data_dir, stack.lmcache_port)
        assert socket is not None
        second.start(
            stack.launch(port=port).model_copy(update={"lmcache_rpc_url": f"ipc://{socket}"}),
            env=stack.env,
            ready_timeout_s=READY_TIMEOUT_S,
            platform=VLLM_CPU,
        )
        a, b = stack.member("a", stack.vllm), stack.member("b", second)
        out = await where_all(stack, prompt, a, b)
        on_a, on_b = out.instances
        assert (on_b.tiers["vllm"].tokens, on_b.tiers["l1"].tokens) == (0, 0)
        assert on_b.tiers["l2"].tokens == whole
        predicted_b = from_connector(on_b, whole)
        assert (on_b.cached_tokens, on_b.trusted) == (predicted_b, True)
        assert on_a.trusted and on_a.cached_tokens is not None and on_a.cached_tokens > 0
        assert on_a.tiers["l1"].tokens == 0 and on_a.tiers["l2"].tokens == whole

        assert measured(stack, prompt, port) == from_engine(predicted_b)
        moves_a = measured(stack, prompt)
        # served from its own cache; LMCache still looks the prompt up and, finding it in L2
        # only, reads it from the engine (measured: 9 chunks) although vLLM loads none of it
        assert (moves_a.cached, moves_a.external) == (on_a.cached_tokens, 0)

        conn = FleetConnection(Fleet(instances=(a, b)))
        try:
            fleet = await status(conn, prefixes=0, tiers=trusting(stack))
        finally:
            await conn.aclose()
    finally:
        second.stop(term_wait_s=10.0)
    assert fleet.memory is not None
    (server,) = fleet.memory.servers
    assert server.instances == ["a", "b"] and server.l1 is not None, server
    assert server.l1.capacity_bytes == held.capacity_bytes and server.l1.capacity_bytes
    assert server.l2 == []  # the engine is declared shared: counted once, below
    (engine,) = fleet.memory.shared_l2
    assert engine.tier == "l2" and engine.used_bytes >= whole * KV_BYTES_PER_TOKEN
    assert all("LMCache L1" in rank.reason for rank in fleet.pressure)


async def memory_of(stack: FedStack, *members: FleetInstance) -> PoolUse:
    """The stack's server's L1 pool, as fleet status reports it."""
    conn = FleetConnection(Fleet(instances=members))
    try:
        fleet = await status(conn, prefixes=0, tiers=trusting(stack))
    finally:
        await conn.aclose()
    assert fleet.memory is not None and fleet.memory.servers[0].l1 is not None, fleet.memory
    return fleet.memory.servers[0].l1
