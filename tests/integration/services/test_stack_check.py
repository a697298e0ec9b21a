"""diagnose stack against real components: each finding made to fire by a real misconfiguration,
and a healthy stack without errors."""

from __future__ import annotations

import secrets
from pathlib import Path

from pydantic import SecretStr

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.connectors.vllm.client import VllmClient
from graph_kvcache_mcp.domain.diagnosis.stack_findings import StackDiagnosis
from graph_kvcache_mcp.services.diagnosis.stack_check import check_stack
from tests.support.engines import RunningEngine


def closed_url() -> str:
    return f"http://127.0.0.1:{free_port()}/v1"


async def diagnose(settings: Settings, **options: object) -> StackDiagnosis:
    async with VllmClient(settings.vllm_base_url, timeout_s=5.0, max_retries=0) as client:
        return await check_stack(settings, client, **options)  # type: ignore[arg-type]


def ids(out: StackDiagnosis) -> dict[str, str]:
    return {f.id: f.severity for f in out.findings}


async def test_a_memory_engine_warns_and_a_stopped_vllm_is_an_error(
    memory_engine: RunningEngine,
) -> None:
    settings = memory_engine.settings.model_copy(update={"vllm_base_url": closed_url()})
    out = await diagnose(settings)
    assert ids(out) == {"engine_memory_backend": "warning", "vllm_unreachable": "error"}
    assert [(c.component, c.reachable) for c in out.checked] == [
        ("engine", True),
        ("vllm", False),
    ]
    assert out.findings[0].id == "vllm_unreachable"  # errors first


async def test_a_wrong_engine_token_is_an_error_that_never_shows_the_token(
    durable_engine: RunningEngine,
) -> None:
    wrong = "wrong-" + secrets.token_hex(16)
    settings = durable_engine.settings.model_copy(
        update={"kv_token": SecretStr(wrong), "vllm_base_url": closed_url()}
    )
    out = await diagnose(settings)
    assert ids(out)["engine_auth_failed"] == "error"
    text = out.model_dump_json()
    assert wrong not in text and durable_engine.token.get_secret_value() not in text


async def test_a_configured_engine_that_is_down_is_unreachable(tmp_path: Path) -> None:
    settings = Settings.build(
        data_dir=tmp_path,
        kv_url=f"http://127.0.0.1:{free_port()}",
        vllm_base_url=closed_url(),
    )
    out = await diagnose(settings)
    assert ids(out) == {"engine_unreachable": "error", "vllm_unreachable": "error"}
    assert not any(c.reachable for c in out.checked)


async def test_a_durable_engine_has_no_engine_finding_and_lmcache_down_is_reported(
    durable_engine: RunningEngine,
) -> None:
    settings = durable_engine.settings.model_copy(update={"vllm_base_url": closed_url()})
    lmcache_url = f"http://127.0.0.1:{free_port()}"
    out = await diagnose(settings, lmcache_url=lmcache_url)
    assert ids(out) == {"vllm_unreachable": "error", "lmcache_unreachable": "error"}
    assert ("lmcache", lmcache_url, False) in [
        (c.component, c.target, c.reachable) for c in out.checked
    ]
