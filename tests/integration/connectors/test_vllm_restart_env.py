"""What `ManagedVllm.restart` gives the new process: the plan's own environment again.

vLLM itself is a stand-in here (`tests.support.vllm_stand_in`, a test double): the rule is about
the environment our lifecycle code builds, and a real CPU vLLM start would cost a minute each.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.connectors.vllm.process import ManagedVllm
from graph_kvcache_mcp.domain.vllm.kv_identity_file import IDENTITY_FILE_NAME
from graph_kvcache_mcp.domain.vllm.launch import VllmLaunch
from tests.support.vllm import VLLM_CPU
from tests.support.vllm_stand_in import stand_in_vllm


def test_a_restart_passes_the_plans_own_environment_to_the_new_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The import probe runs with our own environment, the server with what the plan builds.
    monkeypatch.setenv("PYTHONPATH", stand_in_vllm(tmp_path))
    # the MP connector's import check looks for lmcache in vLLM's interpreter: an empty stand-in
    (tmp_path / "stand-in" / "lmcache").mkdir()
    (tmp_path / "stand-in" / "lmcache" / "__init__.py").write_text("")
    record = tmp_path / "environments.jsonl"
    managed = ManagedVllm(tmp_path / "data", python=sys.executable)
    launch = VllmLaunch(
        model="stand-in", served_model_name="stand-in", port=free_port(), kv_connector="mp_native"
    )
    env = {
        "STAND_IN_RECORD": str(record),
        "STAND_IN_RECORD_NAMES": "PYTHONHASHSEED",
    }
    try:
        started = managed.start(launch, env=env, ready_timeout_s=30, platform=VLLM_CPU)
        restarted = managed.restart(env=env, ready_timeout_s=30)
    finally:
        managed.stop(term_wait_s=5.0)
    assert started.pid != restarted.pid
    seen = [json.loads(line) for line in record.read_text().splitlines()]
    # LMCache hashes prompts with Python's hash seed: a restart without it would miss every key.
    assert seen == [{"PYTHONHASHSEED": "0"}, {"PYTHONHASHSEED": "0"}]


def test_a_restart_keeps_the_event_sockets_on_record_and_drops_the_old_identity_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", stand_in_vllm(tmp_path))
    managed = ManagedVllm(tmp_path / "data", python=sys.executable)
    launch = VllmLaunch(
        model="stand-in",
        served_model_name="stand-in",
        port=free_port(),
        kv_connector="engine",
        kv_events=True,
    )
    env = {"STAND_IN_RECORD": str(tmp_path / "environments.jsonl"), "STAND_IN_RECORD_NAMES": ""}
    try:
        started = managed.start(launch, env=env, ready_timeout_s=30, platform=VLLM_CPU)
        identity = managed.home / IDENTITY_FILE_NAME
        assert managed.status().kv_events is not None
        identity.write_text("{}")  # what the connector wrote; the stand-in writes none
        restarted = managed.restart(env=env, ready_timeout_s=30)
        state = managed.running_state()
    finally:
        managed.stop(term_wait_s=5.0)
    assert started.pid != restarted.pid and state is not None
    assert (state.kv_events, state.kv_events_replay) == (
        started.kv_events,
        started.kv_events_replay,
    )
    assert state.wiring.identity_file == str(identity)
    assert not identity.exists()  # the new connector writes its own
