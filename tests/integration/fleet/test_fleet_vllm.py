"""The fleet view against two real CPU vLLM instances publishing KV events (the tiny model).

Both start once for the module, with our own lifecycle code (`kv_events=True`): a's endpoints are
picked by the lifecycle, b's are fixed so it can be restarted on the same ones. Every prediction
is checked against the `cached_tokens` that instance then reports for that very request.
"""

from __future__ import annotations

import json
import tempfile
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client

from graph_kvcache_mcp.cli import main
from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.fleet.connection import FleetConnection, load_fleet
from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.connectors.vllm.process import ManagedVllm
from graph_kvcache_mcp.connectors.vllm.state import VllmStatus
from graph_kvcache_mcp.domain.outcomes import Presence
from graph_kvcache_mcp.server import build_server
from graph_kvcache_mcp.services.fleet import operations as fleet_service
from graph_kvcache_mcp.services.fleet.views import (
    FleetEffectivenessOut,
    FleetStatusOut,
    FleetWhereOut,
)
from tests.support.engines import RunningEngine
from tests.support.mcp_calls import call_error, call_ok
from tests.support.processes import wait_until
from tests.support.vllm import (
    MODEL_NAME,
    READY_TIMEOUT_S,
    VLLM_CPU,
    VllmServers,
    fast_cpu_launch,
    offline_environment,
    require_vllm_venv,
    tiny_model_dir,
)
from tests.support.vllm_connector import connector_vllms, random_prompt

pytestmark = pytest.mark.vllm


@dataclass
class Instance:
    name: str
    managed: ManagedVllm
    status: VllmStatus
    launch_overrides: dict[str, Any]
    altered: bool = False
    """A test stopped it or restarted it on other settings: the next test starts it again."""

    @property
    def base_url(self) -> str:
        assert self.status.base_url is not None
        return self.status.base_url

    def start(self, cache_root: Path, **overrides: Any) -> None:
        launch = fast_cpu_launch(tiny_model_dir(), self.status.port or free_port(), kv_events=True)
        launch = launch.model_copy(update={**self.launch_overrides, **overrides})
        self.status = self.managed.start(
            launch,
            env=offline_environment(cache_root),
            ready_timeout_s=READY_TIMEOUT_S,
            platform=VLLM_CPU,
        )


@dataclass
class Pair:
    a: Instance
    b: Instance
    fleet_file: Path
    settings: Settings
    cache_root: Path


def write_fleet_file(path: Path, members: list[tuple[str, VllmStatus]]) -> None:
    """The fleet file listing managed vLLMs under the given names, with their event sockets."""
    instances = [
        {
            "name": name,
            "base_url": status.base_url,
            "kv_events": status.kv_events,
            "kv_events_replay": status.kv_events_replay,
        }
        for name, status in members
    ]
    path.write_text(json.dumps({"instances": instances}))


def _instance(name: str, home: Path, cache_root: Path, **overrides: Any) -> Instance:
    managed = ManagedVllm(home, python=require_vllm_venv())
    item = Instance(name, managed, VllmStatus(running=False, data_dir=str(home)), overrides)
    item.status = item.status.model_copy(update={"port": free_port()})
    item.start(cache_root)
    return item


@pytest.fixture(scope="module")
def started_pair(
    vllm_servers: VllmServers, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pair]:
    vllm_servers.stop_shared()  # memory is shared: our two instead of the session's one
    root = tmp_path_factory.mktemp("fleet")
    # Fixed endpoints, so an instance started again keeps the ones the fleet file names.
    a_events, b_events = (
        {
            "kv_events_endpoint": f"ipc://{root}/{name}-events.sock",
            "kv_events_replay_endpoint": f"tcp://127.0.0.1:{free_port()}",
        }
        for name in ("a", "b")
    )
    with tempfile.TemporaryDirectory(prefix="vllm-cache-") as cache:
        cache_root = Path(cache)
        started: list[Instance] = []
        try:
            with ThreadPoolExecutor(2) as pool:
                jobs = [
                    pool.submit(_instance, "a", root / "a", cache_root, **a_events),
                    pool.submit(_instance, "b", root / "b", cache_root, **b_events),
                ]
                for job in jobs:
                    started.append(job.result())
            a, b = started
            fleet_file = root / "fleet.json"
            write_fleet_file(fleet_file, [(i.name, i.status) for i in (a, b)])
            settings = Settings.build(
                data_dir=root / "server", fleet_file=fleet_file, toolsets=("fleet",)
            )
            yield Pair(a, b, fleet_file, settings, cache_root)
        finally:
            for item in started:
                item.managed.stop(term_wait_s=10.0)
            for home in ("a", "b"):
                ManagedVllm(root / home).stop(term_wait_s=10.0)


@pytest.fixture
def pair(started_pair: Pair) -> Pair:
    """The module's two instances as each test expects them, whatever order tests run in: one
    a test before this one stopped or restarted on other settings is started again first."""
    for item in (started_pair.a, started_pair.b):
        if item.altered:
            item.managed.stop(term_wait_s=10.0)
            item.start(started_pair.cache_root)
            item.altered = False
    return started_pair


def prompt_text(words: int = 300) -> str:
    """A fresh prompt no earlier test has cached (about `words` tokens of the tiny model)."""
    tag = uuid.uuid4().hex
    return f"Run {tag}. " + " ".join(f"item{i % 50} {tag[i % 32]}" for i in range(words))


def messages_of(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


SENT: list[tuple[int, int]] = []
"""(prompt_tokens, cached_tokens) of every request the tests sent, in order."""


def reported_cached(item: Instance, text: str) -> int:
    """Send the request; the cached_tokens vLLM reports for it."""
    reply = httpx2.post(
        item.base_url + "/chat/completions",
        json={
            "model": MODEL_NAME,
            "messages": messages_of(text),
            "max_tokens": 1,
            "temperature": 0,
        },
        timeout=120,
    )
    reply.raise_for_status()
    usage = reply.json()["usage"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert isinstance(cached, int)
    SENT.append((usage["prompt_tokens"], cached))
    return cached


def by_name(out: FleetWhereOut) -> dict[str, Any]:
    return {i.name: i for i in out.instances}


async def test_where_cached_predicts_the_cached_tokens_each_instance_then_reports(
    pair: Pair, vllm_private: VllmServers
) -> None:
    only_a, both, neither = prompt_text(), prompt_text(), prompt_text()
    cases = (("only_a", only_a), ("both", both), ("neither", neither))
    async with Client(build_server(pair.settings)) as client:
        start = FleetEffectivenessOut.model_validate(
            await call_ok(client, "fleet_effectiveness", {})
        )
        sent_before = len(SENT)
        reported_cached(pair.a, only_a)
        reported_cached(pair.a, both)
        reported_cached(pair.b, both)
        answers = {
            case: by_name(
                FleetWhereOut.model_validate(
                    await call_ok(client, "fleet_where_cached", {"messages": messages_of(text)})
                )
            )
            for case, text in cases
        }
        actual = {
            case: {"a": reported_cached(pair.a, text), "b": reported_cached(pair.b, text)}
            for case, text in cases
        }
        window = FleetEffectivenessOut.model_validate(
            await call_ok(client, "fleet_effectiveness", {"since": start.snapshot_id})
        )
        unknown = await call_error(client, "fleet_effectiveness", {"since": "fleet-0000"})
        refused = await call_error(
            client, "fleet_where_cached", {"messages": [{"role": "user", "content": 5}]}
        )
        neither_given = await call_error(client, "fleet_where_cached", {})
    for case, _text in cases:
        out = answers[case]
        assert {n: out[n].cached_tokens for n in ("a", "b")} == actual[case], case
        assert all(out[n].trusted and out[n].freshness.state == "live" for n in ("a", "b"))
    assert answers["only_a"]["a"].cached_tokens > 0 == answers["only_a"]["b"].cached_tokens
    assert answers["both"]["b"].cached_tokens > 0
    assert answers["neither"]["a"].cached_tokens == 0
    sent = SENT[sent_before:]
    assert window.fleet.prompt_tokens == sum(p for p, _ in sent)
    assert window.fleet.local_cache == sum(c for _, c in sent) > 0
    assert window.fleet.from_tier == 0 and window.window_s is not None
    assert "not a snapshot this server holds" in unknown
    assert "Fix the messages" in refused
    assert "exactly one of messages or prompt" in neither_given


async def test_a_reset_prefix_cache_on_one_instance_clears_it_in_the_index(
    pair: Pair, vllm_private: VllmServers
) -> None:
    text = prompt_text()
    reported_cached(pair.a, text)
    reported_cached(pair.b, text)
    conn = FleetConnection(load_fleet(pair.settings))
    try:
        before = by_name(
            await fleet_service.where_cached(conn, request={"messages": messages_of(text)})
        )
        httpx2.post(pair.a.base_url.removesuffix("/v1") + "/reset_prefix_cache").raise_for_status()
        reported_cached(pair.a, prompt_text(40))  # AllBlocksCleared rides the next engine step
        after = by_name(
            await fleet_service.where_cached(conn, request={"messages": messages_of(text)})
        )
    finally:
        await conn.aclose()
    assert before["a"].cached_tokens > 0 and before["b"].cached_tokens > 0
    assert after["a"].cached_tokens == 0 == reported_cached(pair.a, text)
    assert after["b"].cached_tokens == before["b"].cached_tokens == reported_cached(pair.b, text)
    assert after["a"].freshness.last_seq > before["a"].freshness.last_seq


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    code = main(list(argv))
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip().startswith("{") else {}


def test_the_cli_replays_each_feed_and_answers_where_and_status_in_one_shot(
    pair: Pair, vllm_private: VllmServers, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    text = prompt_text()
    reported_cached(pair.b, text)
    body = tmp_path / "body.json"
    body.write_text(json.dumps({"model": MODEL_NAME, "messages": messages_of(text)}))
    common = ["--fleet", str(pair.fleet_file), "--data-dir", str(tmp_path), "--json"]
    code, where = cli(capsys, "fleet", "where", "--messages", str(body), *common)
    assert code == 0
    predicted = {i["name"]: i["cached_tokens"] for i in where["instances"]}
    assert predicted == {"a": reported_cached(pair.a, text), "b": reported_cached(pair.b, text)}
    assert predicted["b"] > 0 and where["best"] == "b"
    code, status = cli(capsys, "fleet", "status", "--prefixes", "3", *common)
    out = FleetStatusOut.model_validate(status)
    assert code == 0 and [i.reachable for i in out.instances] == [True, True]
    assert all(i.feed.state == "live" and i.block_size == 32 for i in out.instances)
    assert out.findings == [] and len(out.pressure) == 2
    assert out.prefixes and out.prefixes[0].tokens >= 32
    assert out.prefixes[0].head
    code, effect = cli(capsys, "fleet", "effectiveness", *common)
    eff = FleetEffectivenessOut.model_validate(effect)
    assert code == 0 and eff.fleet.prompt_tokens > 0 and eff.fleet.local_cache > 0
    assert eff.fleet.prompt_tokens == sum(i.split.prompt_tokens for i in eff.instances if i.split)


def test_a_bad_fleet_file_exits_2_with_the_reason(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad = tmp_path / "fleet.json"
    bad.write_text(
        json.dumps(
            {"instances": [{"name": "a", "base_url": "http://127.0.0.1:1/v1", "api_key": "s3cret"}]}
        )
    )
    code = main(["fleet", "status", "--fleet", str(bad), "--data-dir", str(tmp_path)])
    captured = capsys.readouterr()
    assert code == 2
    assert "api_key_env" in captured.err and "s3cret" not in captured.err + captured.out


async def test_a_restarted_instance_is_detected_and_rebuilt_and_a_block_size_change_is_a_finding(
    pair: Pair, vllm_private: VllmServers
) -> None:
    old, new = prompt_text(), prompt_text()
    reported_cached(pair.b, old)
    conn = FleetConnection(load_fleet(pair.settings))
    try:
        before = by_name(
            await fleet_service.where_cached(conn, request={"messages": messages_of(old)})
        )
        pair.b.altered = True
        pair.b.managed.stop(term_wait_s=10.0)
        pair.b.start(pair.cache_root, block_size=64)  # same endpoints, another block size
        reported_cached(pair.b, new)
        where_old = by_name(
            await fleet_service.where_cached(conn, request={"messages": messages_of(old)})
        )
        where_new = by_name(
            await fleet_service.where_cached(conn, request={"messages": messages_of(new)})
        )
        status = await fleet_service.status(conn)
    finally:
        await conn.aclose()
    assert before["b"].cached_tokens > 0
    assert where_old["b"].freshness.resets == 1 and where_old["b"].freshness.state == "live"
    assert where_old["b"].cached_tokens == 0 == reported_cached(pair.b, old)
    assert where_new["b"].block_size == 64
    assert where_new["b"].cached_tokens == reported_cached(pair.b, new) > 0
    codes = {f.code for f in status.findings}
    assert "block_size_mismatch" in codes


async def test_a_killed_instance_is_unreachable_and_its_entries_are_not_trusted(
    pair: Pair, vllm_private: VllmServers
) -> None:
    text = prompt_text()
    reported_cached(pair.a, text)
    conn = FleetConnection(load_fleet(pair.settings))
    try:
        await fleet_service.where_cached(conn, request={"messages": messages_of(text)})
        pair.a.altered = True
        pair.a.managed.stop(term_wait_s=10.0)
        out = by_name(
            await fleet_service.where_cached(conn, request={"messages": messages_of(text)})
        )
        status = await fleet_service.status(conn)
    finally:
        await conn.aclose()
    assert not out["a"].reachable and out["a"].cached_tokens is None and not out["a"].trusted
    assert out["a"].freshness.state == "unreachable"
    assert out["b"].reachable
    finding = next(f for f in status.findings if f.code == "unreachable")
    assert finding.instances == ["a"] and "stale" in finding.message
    assert [p.name for p in status.pressure] == ["b"]


async def test_two_instances_sharing_the_engine_tier_show_its_payoff(
    started_pair: Pair, vllm_private: VllmServers, memory_engine: RunningEngine, tmp_path: Path
) -> None:
    for item in (started_pair.a, started_pair.b):
        item.altered = True  # a test after this one gets them back
        item.managed.stop(term_wait_s=10.0)  # memory: these two replace the pair
    homes = [tmp_path / "ea", tmp_path / "eb"]
    with connector_vllms(homes, memory_engine, kv_events=True) as (first, second):
        fleet_file = tmp_path / "fleet.json"
        write_fleet_file(fleet_file, [("first", first.status), ("second", second.status)])
        conn = FleetConnection(
            load_fleet(Settings.build(data_dir=tmp_path / "server", fleet_file=fleet_file))
        )
        try:
            start = await fleet_service.counters(conn)
            prompt = random_prompt(400, seed=19)
            cold = first.complete(prompt)
            keys = first.keys_of(prompt)
            with memory_engine.sync_client() as engine:
                wait_until(
                    lambda: all(p == Presence(True) for p in engine.contains_many(keys)),
                    timeout_s=60.0,
                    what="the first instance's blocks in the engine",
                )
            warm = second.complete(prompt)
            out, _ = await fleet_service.effectiveness(conn, start, since_id="start")
        finally:
            await conn.aclose()
    by = {i.name: i for i in out.instances}
    assert cold.cached_tokens == 0 and warm.cached_tokens > 0
    first_split, second_split = by["first"].split, by["second"].split
    assert first_split is not None and second_split is not None
    assert first_split.computed == cold.prompt_tokens and first_split.from_tier == 0
    assert second_split.from_tier == warm.cached_tokens
    assert by["first"].engine_kv_saved_blocks == len(keys)
    assert by["second"].engine_kv_loaded_blocks == warm.cached_tokens // 32
    assert out.fleet.from_tier == warm.cached_tokens
    assert out.fleet.tier_payoff == round(warm.cached_tokens / out.fleet.prompt_tokens, 4) > 0
