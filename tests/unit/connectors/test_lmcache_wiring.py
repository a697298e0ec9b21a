"""An `lmcache server`'s wiring is read once from the command a start builds, and a state file
written before the wiring was recorded (a server left running across an upgrade) reads alike."""

from __future__ import annotations

from graph_kvcache_mcp.connectors.lmcache.state import LmcacheState
from graph_kvcache_mcp.domain.lmcache.config import LmcacheChoices, plan_lmcache
from graph_kvcache_mcp.domain.lmcache.coordinator_plan import join_coordinator
from graph_kvcache_mcp.domain.lmcache.model import ModelFacts
from graph_kvcache_mcp.domain.vllm.wiring import (
    LMCACHE_DEFAULT_TRANSFER_MODE,
    lmcache_wiring_of,
    reported_wiring,
)

ENGINE_URL = "http://127.0.0.1:8787"
COORDINATOR_URL = "http://127.0.0.1:9100"
LLAMA = ModelFacts(name="meta-llama/Llama-3.1-8B", attention_layers=32, kv_heads=8)


def _planned_args(*, cpu: bool) -> list[str]:
    plan = plan_lmcache(LLAMA, LmcacheChoices(engine_url=ENGINE_URL, cpu=cpu))
    assert plan.lmcache_server is not None
    return join_coordinator(plan.lmcache_server, COORDINATOR_URL).argv[1:]


def _recorded_state(args: list[str], *, with_wiring: bool) -> LmcacheState:
    record = {
        "pid": 4242,
        "start_ticks": 1,
        "command": ["/venv/bin/python", "-m", "graph_kvcache_mcp.plugins.lmcache.server", *args],
        "started_at": 0.0,
        "log_path": "/data/lmcache/lmcache.log",
    }
    fields = {
        "process": record,
        "host": "127.0.0.1",
        "port": 5601,
        "http_port": 5602,
        "http_url": "http://127.0.0.1:5602",
    }
    if with_wiring:
        fields["lmcache_wiring"] = lmcache_wiring_of(args).model_dump()
    return LmcacheState.model_validate(fields)


def test_a_planned_server_names_its_coordinator_transfer_mode_and_engine() -> None:
    wiring = lmcache_wiring_of(_planned_args(cpu=True))
    assert wiring.coordinator_url == COORDINATOR_URL
    assert wiring.transfer_mode == "auto"
    assert wiring.l2_base_url == ENGINE_URL


def test_a_server_without_the_flags_runs_lmcaches_defaults() -> None:
    wiring = lmcache_wiring_of(["server", "--port", "5601"])
    assert wiring.coordinator_url is None and wiring.l2_base_url is None
    assert wiring.transfer_mode == LMCACHE_DEFAULT_TRANSFER_MODE


def test_a_state_written_before_the_wiring_was_recorded_reads_the_same_wiring() -> None:
    for cpu in (True, False):
        args = _planned_args(cpu=cpu)
        old = _recorded_state(args, with_wiring=False)
        new = _recorded_state(args, with_wiring=True)
        assert old.lmcache_wiring is None
        assert old.wiring == new.wiring == lmcache_wiring_of(args)
        assert old.wiring.args == args


def test_a_server_not_started_here_is_known_by_what_its_config_reports() -> None:
    body = {  # the shape of lmcache 0.5.6's GET /config, trimmed to what is read
        "mp": {"host": "0.0.0.0", "port": 6555, "supported_transfer_mode": "auto"},
        "storage_manager": {
            "l2_adapter_config": {
                "adapters": [
                    {"type": "resp", "host": "h"},
                    {"type": "native_plugin", "adapter_params": {"base_url": ENGINE_URL}},
                ]
            }
        },
    }
    reported = reported_wiring(body)
    assert (reported.transfer_mode, reported.rpc_port, reported.l2_base_url) == (
        "auto",
        6555,
        ENGINE_URL,
    )
    bare = reported_wiring({})  # an older server's /config, or one that said nothing
    assert (bare.transfer_mode, bare.rpc_port, bare.l2_base_url) == (
        LMCACHE_DEFAULT_TRANSFER_MODE,
        None,
        None,
    )
