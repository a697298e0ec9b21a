"""Numbers that hold under real traffic: vLLM's own load generator (`vllm bench serve`,
prefix_repetition) against the MP stack (vLLM -> lmcache server -> engine, every process real),
with every figure a tool reports checked against vLLM's and LMCache's counters scraped here.

vLLM starts: 1 (the stack) + 1 (the managed restart inside a window).
fleet_effectiveness's per-instance tier split is checked here too, on the same stack, and so is
the stack given only by URLs (configured targets: an empty data dir).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.domain.diagnosis.stack_facts import StackDiagnosis
from graph_kvcache_mcp.domain.vllm.traces import Trace
from graph_kvcache_mcp.server import build_server
from graph_kvcache_mcp.services.fleet.views import FleetEffectivenessOut
from graph_kvcache_mcp.services.vllm.views import (
    VllmChatOut,
    VllmMetricsOut,
    VllmTraceSummaryOut,
)
from tests.support.http_server import http_server
from tests.support.mcp_calls import call_error, call_ok
from tests.support.mp_stack import (
    CHUNK_SIZE,
    KV_TOKENS,
    MpStack,
    cached_tokens_of,
    module_stack,
)
from tests.support.vllm import MODEL_NAME, READY_TIMEOUT_S
from tests.support.vllm_connector import random_prompt

pytestmark = [pytest.mark.vllm, pytest.mark.lmcache]

SESSIONS = 8
HTTP_TOKEN = "since-ids-http-token-7c1e4b90d2a35f68"
AUTH = {"Authorization": f"Bearer {HTTP_TOKEN}"}
RULES = "You answer in one word. " * 120  # ~700 tokens every chat below shares


@pytest.fixture(scope="module")
def stack_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MpStack]:
    yield from module_stack(tmp_path_factory.mktemp("mp-traffic"))


@pytest.fixture
async def stack(stack_root: MpStack) -> AsyncIterator[MpStack]:
    await stack_root.ensure()
    yield stack_root


def bench(stack: MpStack, out: Path, seed: int) -> int:
    """16 prompts over 2 shared prefixes, 4 at a time; the prompt tokens vLLM counted for it."""
    before = stack.vllm_counters().prompt_tokens or 0
    stack.bench(out, seed=seed)
    return (stack.vllm_counters().prompt_tokens or 0) - before


async def metrics(client: Client, since: str | None = None) -> VllmMetricsOut:
    arguments = {} if since is None else {"since": since}
    return VllmMetricsOut.model_validate(await call_ok(client, "vllm_metrics", arguments))


async def test_a_window_across_a_managed_restart_counts_every_prompt_token(
    stack: MpStack, tmp_path: Path
) -> None:
    settings = stack.settings.model_copy(update={"toolsets": ("vllm",)})
    async with Client(build_server(settings)) as client:
        start = await metrics(client)
        assert start.snapshot_id is not None
        first = bench(stack, tmp_path / "first", seed=1)
        stack.vllm.restart(env=stack.env, ready_timeout_s=READY_TIMEOUT_S)
        after_restart = stack.vllm_counters().prompt_tokens or 0  # the new process's own count
        second = bench(stack, tmp_path / "second", seed=2)
        window = await metrics(client, since=start.snapshot_id)
    assert first > 0 and second > 0
    assert window.delta is not None
    assert window.delta.restarts == 1 and not window.delta.counter_reset
    # Every prompt token of both processes, never only the second's (the 61,443).
    assert window.delta.prompt_tokens == first + after_restart + second
    tiers = window.tiers
    assert tiers is not None, window
    assert tiers["local"] == window.delta.prefix_cache_hits_tokens
    assert tiers["external"] == window.delta.external_prefix_cache_hits_tokens
    if "lmcache_l1" in tiers:  # LMCache's counters moved over the same window: what vLLM took
        assert tiers["lmcache_l1"] + tiers["lmcache_l2"] == tiers["external"]


async def test_per_call_tier_parts_sum_to_the_hit_and_diagnose_is_quiet(stack: MpStack) -> None:
    settings = stack.settings.model_copy(update={"toolsets": ("vllm", "diagnose")})
    async with Client(build_server(settings)) as client:
        bench_counts = stack.lmcache_counters()
        outs = []
        for n in range(4):
            raw = await call_ok(
                client,
                "vllm_chat",
                {"system": RULES, "message": f"question {n}", "max_tokens": 2},
            )
            outs.append(VllmChatOut.model_validate(raw))
        summary = VllmTraceSummaryOut.model_validate(
            await call_ok(client, "vllm_trace_summary", {})
        )
        diagnosis = StackDiagnosis.model_validate(await call_ok(client, "diagnose_stack", {}))
    traces: list[Trace] = [out.trace for out in outs if out.trace is not None]
    assert len(traces) == 4
    split = [t for t in traces if t.lmcache_l1_hit_tokens is not None]
    assert split, [t.note for t in traces]  # sequential calls on a quiet stack: measured
    for trace in traces:
        hit, external = trace.prefix_cache_hit_tokens, trace.external_cache_hit_tokens
        if external is not None:
            assert hit is not None and trace.local_cache_hit_tokens == hit - external >= 0
    for trace in split:
        # LMCache's lookup counts the chunks vLLM had locally too; only what vLLM took counts.
        assert (trace.lmcache_l1_hit_tokens or 0) + (trace.lmcache_l2_hit_tokens or 0) == (
            trace.external_cache_hit_tokens
        )
    by_tier = summary.summary.tokens_saved_by_tier
    assert by_tier is not None
    assert by_tier["local"] + by_tier["external"] == summary.summary.total_tokens_saved
    assert by_tier.get("lmcache_l1", 0) + by_tier.get("lmcache_l2", 0) <= by_tier["external"]
    assert (stack.lmcache_counters().lookups or 0) > (bench_counts.lookups or 0)
    ids = {f.id: f.severity for f in diagnosis.findings}
    assert "external_cache_never_hits" not in ids, diagnosis.findings
    assert "error" not in ids.values(), diagnosis.findings


async def test_the_stack_named_only_by_urls_splits_traces_and_says_what_it_cannot_read(
    stack: MpStack, tmp_path: Path
) -> None:
    """The same stack given as configured targets (an empty data dir, the server named by
    GRAPH_KVCACHE_LMCACHE_URL): each chat's trace is still split by that server's counters,
    and the diagnosis says what of the two processes it cannot read from here."""
    settings = stack.settings.model_copy(
        update={
            "toolsets": ("vllm", "diagnose"),
            "data_dir": tmp_path / "elsewhere",
            "lmcache_url": f"http://127.0.0.1:{stack.http_port}",
        }
    )
    async with Client(build_server(settings)) as client:
        outs = []
        for n in range(3):
            arguments = {"system": RULES, "message": f"elsewhere {n}", "max_tokens": 2}
            outs.append(VllmChatOut.model_validate(await call_ok(client, "vllm_chat", arguments)))
        diagnosis = StackDiagnosis.model_validate(await call_ok(client, "diagnose_stack", {}))
    traces = [out.trace for out in outs if out.trace is not None]
    split = [t for t in traces if t.lmcache_l1_hit_tokens is not None]
    assert split, [t.note for t in traces]  # with no managed server, nothing split before
    for trace in split:
        assert (trace.lmcache_l1_hit_tokens or 0) + (trace.lmcache_l2_hit_tokens or 0) == (
            trace.external_cache_hit_tokens
        )
    assert ("lmcache", settings.lmcache_url, True) in [
        (c.component, c.target, c.reachable) for c in diagnosis.checked
    ]
    hidden = {f.component: f.evidence for f in diagnosis.findings if f.id == "runtime_not_readable"}
    assert hidden["lmcache"].startswith(f"not managed here: {settings.lmcache_url} ")
    assert hidden["vllm"].startswith(f"not managed here: {settings.vllm_base_url} ")


async def test_fleet_effectiveness_splits_an_instances_window_by_tier_as_the_counters_moved(
    stack: MpStack, tmp_path: Path
) -> None:
    """A prompt evicted from vLLM's own KV memory comes back from LMCache's L1: the instance's
    window says so, checked against vLLM's and the lmcache server's counters scraped here. A
    server two instances share splits neither."""
    fleet_file = tmp_path / "fleet.json"
    fleet_file.write_text(
        json.dumps(
            {
                "instances": [  # the managed vLLM: its lmcache server is found from our state
                    {"name": "stack", "base_url": stack.settings.vllm_base_url},
                    {"name": "down", "base_url": f"http://127.0.0.1:{free_port()}/v1"},
                ]
            }
        )
    )
    settings = stack.settings.model_copy(update={"toolsets": ("fleet",), "fleet_file": fleet_file})
    first = random_prompt(1500, seed=3110)
    async with Client(build_server(settings)) as client:
        start = FleetEffectivenessOut.model_validate(
            await call_ok(client, "fleet_effectiveness", {})
        )
        vllm_before, server_before = stack.vllm_counters(), stack.lmcache_counters()
        stack.complete(first, max_tokens=1)
        for seed in range(3111, 3111 + KV_TOKENS // 1500 + 1):  # evicts `first` from vLLM
            stack.complete(random_prompt(1500, seed=seed), max_tokens=1)
        again = stack.complete(first, max_tokens=1)
        vllm_after, server_after = stack.vllm_counters(), stack.lmcache_counters()
        window = FleetEffectivenessOut.model_validate(
            await call_ok(client, "fleet_effectiveness", {"since": start.snapshot_id})
        )
        # A second name for the same vLLM and server: one server's counters, two instances.
        twin = {
            "name": "twin",
            "base_url": stack.settings.vllm_base_url,
            "lmcache_http_url": f"http://127.0.0.1:{stack.http_port}",
        }
        fleet_file.write_text(
            json.dumps(
                {"instances": [{"name": "stack", "base_url": stack.settings.vllm_base_url}, twin]}
            )
        )
        shared_start = await call_ok(client, "fleet_effectiveness", {})
        stack.complete(first, max_tokens=1)
        shared = FleetEffectivenessOut.model_validate(
            await call_ok(client, "fleet_effectiveness", {"since": shared_start["snapshot_id"]})
        )
    assert len(shared.instances) == 2
    for item in shared.instances:  # vLLM's own parts, but no L1/L2 guessed per instance
        assert item.tiers is not None and set(item.tiers) == {"local", "external"}, item
    instances = {i.name: i for i in window.instances}
    assert start.instances[0].tiers is None  # since start: LMCache's totals cannot split it
    assert (instances["down"].reachable, instances["down"].tiers) == (False, None)
    tiers = instances["stack"].tiers
    assert tiers is not None, instances["stack"]
    local = moved(vllm_before.prefix_cache_hits_tokens, vllm_after.prefix_cache_hits_tokens)
    external = moved(
        vllm_before.external_prefix_cache_hits_tokens,
        vllm_after.external_prefix_cache_hits_tokens,
    )
    assert (tiers["local"], tiers["external"]) == (local, external)
    assert external == cached_tokens_of(again) == 1500 // CHUNK_SIZE * CHUNK_SIZE
    l1_found = moved(server_before.l1_hit_tokens, server_after.l1_hit_tokens)
    l2_found = moved(server_before.l2_hit_tokens, server_after.l2_hit_tokens)
    # Everything came from L1 (the server kept it in memory); parts never exceed what LMCache
    # found, and sum to what vLLM took from it.
    assert (tiers["lmcache_l1"], tiers["lmcache_l2"]) == (external, 0)
    assert tiers["lmcache_l1"] <= l1_found and tiers["lmcache_l2"] <= l2_found


def moved(before: int | None, after: int | None) -> int:
    assert before is not None and after is not None
    return after - before


def http_env(stack: MpStack) -> dict[str, str]:
    settings = stack.settings
    return {
        **stack.env,
        "GRAPH_KVCACHE_DATA_DIR": str(stack.data_dir),
        "EPISTEMIC_GRAPH_KVCACHE_URL": stack.engine_url,
        "EPISTEMIC_GRAPH_KVCACHE_TOKEN": stack.engine.token().get_secret_value(),
        "VLLM_BASE_URL": settings.vllm_base_url,
        "VLLM_MODEL": MODEL_NAME,
        "GRAPH_KVCACHE_TOOLSETS": "vllm,kv",
        "GRAPH_KVCACHE_HTTP_TOKEN": HTTP_TOKEN,
    }


async def session_ids(url: str) -> list[tuple[str, str]]:
    """Eight sessions at once, each with its own vllm_metrics and kv_stats ids, then ordinary
    traffic from all of them (more snapshots than the old server-wide store kept)."""
    ids: list[tuple[str, str]] = [("", "")] * SESSIONS

    async def one(n: int) -> None:
        async with (
            httpx2.AsyncClient(timeout=300, headers=AUTH) as http,
            Client(streamable_http_client(url, http_client=http)) as client,
        ):
            vllm_id = (await metrics(client)).snapshot_id
            kv_id = (await call_ok(client, "kv_stats", {}))["snapshot_id"]
            assert vllm_id is not None and isinstance(kv_id, str)
            ids[n] = (vllm_id, kv_id)
            for turn in range(3):
                await call_ok(
                    client, "vllm_chat", {"message": f"session {n} turn {turn}", "max_tokens": 1}
                )
                for _ in range(3):
                    await metrics(client)
                    await call_ok(client, "kv_stats", {})

    async with anyio.create_task_group() as group:
        for n in range(SESSIONS):
            group.start_soon(one, n)
    return ids


async def use_ids(url: str, ids: list[tuple[str, str]]) -> list[str]:
    """Each session's ids passed back as since (from new sessions); the forged id's error."""
    async with (
        httpx2.AsyncClient(timeout=300, headers=AUTH) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        for vllm_id, kv_id in ids:
            window = await metrics(client, since=vllm_id)
            assert window.delta is not None and (window.delta.prompt_tokens or 0) > 0
            kv = await call_ok(client, "kv_stats", {"since": kv_id})
            assert kv["delta"] is not None
        body, mac = ids[0][0].rsplit(".", 1)
        forged = body[:-4] + ("AAAA" if body[-4:] != "AAAA" else "BBBB") + "." + mac
        return [
            await call_error(client, "vllm_metrics", {"since": forged}),
            await call_error(client, "kv_stats", {"since": ids[0][0]}),
        ]


def test_eight_http_sessions_keep_their_since_ids_across_traffic_and_a_server_restart(
    stack_root: MpStack,
) -> None:
    anyio.run(stack_root.ensure)
    env = http_env(stack_root)
    with http_server(env) as server:
        ids = anyio.run(session_ids, server.url)
    with http_server(env) as restarted:  # a new server process: nothing kept in memory
        forged, foreign_kind = anyio.run(use_ids, restarted.url, ids)
    assert "signature does not match" in forged
    assert "names a 'vllm' snapshot, not one of kv_stats" in foreign_kind
