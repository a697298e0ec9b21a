"""The three managed processes report status and stop on one shared model."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from graph_kvcache_mcp.connectors.engine.state import EngineStatus, EngineStopResult
from graph_kvcache_mcp.connectors.lmcache.state import LmcacheStatus, LmcacheStopResult
from graph_kvcache_mcp.connectors.processes.status import (
    LeasedStatus,
    ProcessStatus,
    StopResult,
)
from graph_kvcache_mcp.connectors.vllm.state import VllmStatus, VllmStopResult

SHARED_STATUS = set(ProcessStatus.model_fields)
STOPS = (EngineStopResult, LmcacheStopResult, VllmStopResult)


@pytest.mark.parametrize("status", [EngineStatus, LmcacheStatus, VllmStatus])
def test_every_status_carries_the_shared_fields_under_the_same_names(
    status: type[ProcessStatus],
) -> None:
    assert issubclass(status, ProcessStatus)
    assert set(status.model_fields) >= SHARED_STATUS
    for name in SHARED_STATUS:
        assert status.model_fields[name].annotation == ProcessStatus.model_fields[name].annotation


def test_the_leased_processes_share_the_lease_fields() -> None:
    assert issubclass(EngineStatus, LeasedStatus) and issubclass(LmcacheStatus, LeasedStatus)
    assert not issubclass(VllmStatus, LeasedStatus)


@pytest.mark.parametrize("stop", STOPS)
def test_every_stop_result_refuses_a_how_outside_the_three_outcomes(
    stop: type[StopResult],
) -> None:
    assert stop(stopped=True, how="killed", data_dir="/d").how == "killed"
    with pytest.raises(ValidationError):
        stop(stopped=True, how="vanished", data_dir="/d")


@pytest.mark.parametrize("stop", STOPS)
def test_every_stop_result_has_the_same_schema_for_how(stop: type[StopResult]) -> None:
    schema = stop.model_json_schema()["properties"]["how"]
    assert schema["enum"] == ["terminated", "killed", "not_running"]
