"""Each vLLM tool waits on a stuck server only as long as its own deadline, says which variable
sets it, and tells a client that asked for progress while it waits (#39 item 2).

The stuck server is `hung_peer` (a test double: a loopback listener that accepts and never
answers), since a real vLLM cannot be made to hang on purpose.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import anyio
from mcp import Client

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.server import build_server
from graph_kvcache_mcp.services.vllm.views import VllmChatOut, VllmMetricsOut, VllmStatusOut
from tests.support.mcp_calls import call_ok
from tests.support.peers import hung_peer

CALL_KNOB = "GRAPH_KVCACHE_VLLM_TIMEOUT_S"
PROBE_KNOB = "GRAPH_KVCACHE_VLLM_PROBE_TIMEOUT_S"
SLACK_S = 20.0  # a loaded machine; the bug this guards against waited 120 s


def stuck_settings(tmp_path: Path, url: str, **extra: Any) -> Settings:
    return Settings.build(
        data_dir=tmp_path, toolsets=("vllm", "diagnose"), vllm_base_url=url + "/v1", **extra
    )


async def timed_call(
    settings: Settings, tool: str, arguments: dict[str, Any]
) -> tuple[dict[str, Any], float, list[str]]:
    """The tool's result, the seconds it took and the progress messages it sent."""
    notes: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        notes.append(message or "")

    async with Client(build_server(settings)) as client:
        began = time.monotonic()
        with anyio.fail_after(150):
            result = await client.call_tool(tool, arguments, progress_callback=on_progress)
        took = time.monotonic() - began
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return dict(result.structured_content), took, notes


async def test_vllm_metrics_on_a_stuck_server_gives_up_after_the_probe_deadline(
    tmp_path: Path,
) -> None:
    """The chat deadline stays at its 120 s default: the scrape is bounded by the probe's."""
    with hung_peer() as (url, accepted):
        settings = stuck_settings(tmp_path, url, vllm_probe_timeout_s=3.0)
        payload, took, notes = await timed_call(settings, "vllm_metrics", {"model": "m"})
    out = VllmMetricsOut.model_validate(payload)
    assert accepted.value >= 1
    assert out.reachable is False and out.reason is not None
    assert f"did not answer within 3 s ({PROBE_KNOB})" in out.reason
    assert CALL_KNOB not in out.reason
    assert took < 3.0 + SLACK_S
    assert notes and all(PROBE_KNOB in note for note in notes)


async def test_vllm_chat_on_a_stuck_server_ends_at_its_deadline_with_progress_on_the_way(
    tmp_path: Path,
) -> None:
    with hung_peer() as (url, _):
        settings = stuck_settings(tmp_path, url, vllm_timeout_s=6.0, vllm_probe_timeout_s=1.0)
        payload, took, notes = await timed_call(
            settings, "vllm_chat", {"message": "hi", "model": "m"}
        )
    out = VllmChatOut.model_validate(payload)
    assert out.reachable is False and out.reason is not None
    assert f"did not answer within 6 s ({CALL_KNOB})" in out.reason
    # the /metrics read before the call (1 s) and the call (6 s); never the 120 s default
    assert took < 7.0 + SLACK_S
    assert len(notes) >= 2 and "vLLM chat" in notes[0] and CALL_KNOB in notes[0]


async def test_diagnose_stack_names_the_probe_deadline_it_really_waited(tmp_path: Path) -> None:
    with hung_peer() as (url, _):
        settings = stuck_settings(tmp_path, url, vllm_probe_timeout_s=2.0)
        payload, took, _ = await timed_call(settings, "diagnose_stack", {})
    text = json.dumps(payload)
    assert f"did not answer within 2 s ({PROBE_KNOB})" in text
    assert CALL_KNOB not in text
    assert took < 2.0 + SLACK_S


async def test_vllm_status_on_a_stuck_port_answers_within_seconds(tmp_path: Path) -> None:
    with hung_peer() as (url, _):
        settings = stuck_settings(tmp_path, url)
        async with Client(build_server(settings)) as client:
            began = time.monotonic()
            out = VllmStatusOut.model_validate(await call_ok(client, "vllm_status", {}))
            took = time.monotonic() - began
    assert out.reachable is False
    assert took < 10.0 + SLACK_S
