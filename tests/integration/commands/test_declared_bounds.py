"""Each bounded parameter is declared once: the tool, the domain model and the CLI flag refuse the
same out-of-range value, each naming the parameter (the tool through the real MCP server
in-process, the CLI through its real entry point: exit 2, never a traceback).

The first cases are the bounds that had drifted apart (issue 20); the rest were bounded in the
tool only, so the CLI took any value.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from pydantic import BaseModel, ValidationError

from graph_kvcache_mcp.cli import main
from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.domain.bundle.models import BundleParams
from graph_kvcache_mcp.domain.diagnosis.kv_budget import kv_budget
from graph_kvcache_mcp.domain.lmcache.choices import LmcacheChoices
from graph_kvcache_mcp.domain.lmcache.stack import StackOptions
from graph_kvcache_mcp.domain.vllm.launch import VllmLaunch
from graph_kvcache_mcp.errors import ConfigError
from graph_kvcache_mcp.server import build_server
from tests.support.mcp_calls import call_error

ITEMS = [{"id": "a", "text": "alpha"}]
FACTS = {"model": "m", "num_layers": 2, "kv_heads": 2, "head_dim": 64}
FACT_FLAGS = ("--model", "m", "--num-layers", "2", "--kv-heads", "2", "--head-dim", "64")


@dataclass(frozen=True)
class Case:
    tool: str
    arguments: dict[str, Any]
    param: str
    argv: tuple[str, ...]
    flag: str
    model: type[BaseModel] | None = None
    fields: dict[str, Any] | None = None
    toolset: str = "vllm"


DRIFTED = [
    pytest.param(
        Case(
            "vllm_start",
            {"model": "/m", "port": 80},
            "port",
            ("vllm", "start", "--model", "/m", "--port", "80"),
            "--port",
            VllmLaunch,
            {"model": "/m", "port": 80},
        ),
        id="vllm-port-below-1024",
    ),
    pytest.param(
        Case(
            "lmcache_config",
            {**FACTS, "tensor_parallel_size": 65},
            "tensor_parallel_size",
            ("lmcache", "config", *FACT_FLAGS, "--tp", "65"),
            "--tp",
            LmcacheChoices,
            {"tensor_parallel_size": 65},
            toolset="lmcache",
        ),
        id="tensor-parallel-size-over-64",
    ),
    pytest.param(
        Case(
            "bundle_compile",
            {"query": "q", "items": ITEMS, "freshness_half_life_days": 2e6},
            "freshness_half_life_days",
            ("bundle", "compile", "--no-cache", "--half-life-days", "2e6"),
            "--half-life-days",
            BundleParams,
            {"freshness_half_life_days": 2e6},
            toolset="bundle",
        ),
        id="half-life-over-a-million-days",
    ),
    pytest.param(
        Case(
            "lmcache_config",
            {**FACTS, "lmcache_port": 80},
            "lmcache_port",
            ("lmcache", "config", *FACT_FLAGS, "--lmcache-port", "80"),
            "--lmcache-port",
            LmcacheChoices,
            {"lmcache_port": 80},
            toolset="lmcache",
        ),
        id="lmcache-config-port-below-1024",
    ),
    pytest.param(
        Case(
            "lmcache_config",
            {**FACTS, "lmcache_http_port": 443},
            "lmcache_http_port",
            ("lmcache", "config", *FACT_FLAGS, "--lmcache-http-port", "443"),
            "--lmcache-http-port",
            LmcacheChoices,
            {"lmcache_http_port": 443},
            toolset="lmcache",
        ),
        id="lmcache-config-http-port-below-1024",
    ),
    pytest.param(
        Case(
            "bundle_compile",
            {"query": "q", "items": ITEMS, "policy_version": ""},
            "policy_version",
            ("bundle", "compile", "--no-cache", "--policy-version", ""),
            "--policy-version",
            BundleParams,
            {"policy_version": ""},
            toolset="bundle",
        ),
        id="empty-policy-version",
    ),
    pytest.param(
        Case(
            "diagnose_budget",
            {"hf_config": {"model_type": "llama"}, "kv_memory_gib": 2e6},
            "kv_memory_gib",
            ("diagnose", "budget", "--hf-config", "x", "--kv-memory-gib", "2e6"),
            "--kv-memory-gib",
            toolset="diagnose",
        ),
        id="kv-memory-over-the-domain-ceiling",
    ),
    pytest.param(
        Case(
            "fleet_status",
            {"prefixes": 101},
            "prefixes",
            ("fleet", "status", "--prefixes", "101"),
            "--prefixes",
            toolset="fleet",
        ),
        id="fleet-prefixes-checked-by-hand-in-the-cli",
    ),
]

TOOL_ONLY_BEFORE = [
    pytest.param(
        Case("vllm_start", {"model": "/m", "ready_timeout_s": 0}, "ready_timeout_s",
             ("vllm", "start", "--model", "/m", "--ready-timeout-s", "0"), "--ready-timeout-s"),
        id="vllm-ready-timeout",
    ),
    pytest.param(
        Case("vllm_stop", {"wait_s": 500}, "wait_s", ("vllm", "stop", "--wait-s", "500"),
             "--wait-s"),
        id="vllm-stop-wait",
    ),
    pytest.param(
        Case("vllm_logs", {"lines": 0}, "lines", ("vllm", "logs", "--lines", "0"), "--lines"),
        id="vllm-log-lines",
    ),
    pytest.param(
        Case("vllm_chat", {"message": "hi", "max_tokens": 5000}, "max_tokens",
             ("vllm", "chat", "--message", "hi", "--max-tokens", "5000"), "--max-tokens"),
        id="vllm-chat-max-tokens",
    ),
    pytest.param(
        Case("vllm_chat", {"message": "hi", "temperature": 3}, "temperature",
             ("vllm", "chat", "--message", "hi", "--temperature", "3"), "--temperature"),
        id="vllm-chat-temperature",
    ),
    pytest.param(
        Case("vllm_restart_reuse", {"prompt_tokens": 8}, "prompt_tokens",
             ("vllm", "restart-reuse", "--prompt-tokens", "8"), "--prompt-tokens"),
        id="restart-reuse-prompt-tokens",
    ),
    pytest.param(
        Case("vllm_start", {"model": "/m", "block_size": 0}, "block_size",
             ("vllm", "start", "--model", "/m", "--block-size", "0"), "--block-size",
             VllmLaunch, {"model": "/m", "block_size": 0}),
        id="vllm-block-size",
    ),
    pytest.param(
        Case("lmcache_config", {"model": "m", "num_layers": 0}, "num_layers",
             ("lmcache", "config", "--model", "m", "--num-layers", "0"), "--num-layers",
             toolset="lmcache"),
        id="lmcache-num-layers",
    ),
    pytest.param(
        Case("lmcache_start", {**FACTS, "ready_timeout_s": 4000}, "ready_timeout_s",
             ("lmcache", "start", *FACT_FLAGS, "--ready-timeout-s", "4000"), "--ready-timeout-s",
             toolset="lmcache"),
        id="lmcache-ready-timeout",
    ),
    pytest.param(
        Case("lmcache_check", {"page_bytes": 0}, "page_bytes",
             ("lmcache", "check", "--page-bytes", "0"), "--page-bytes", toolset="lmcache"),
        id="lmcache-check-page-bytes",
    ),
    pytest.param(
        Case("lmcache_check", {"namespace": ""}, "namespace",
             ("lmcache", "check", "--namespace", ""), "--namespace", toolset="lmcache"),
        id="lmcache-namespace",
    ),
    pytest.param(
        Case("bundle_reuse_measure", {"bundles": 21}, "bundles",
             ("bundle", "reuse-measure", "--bundles", "21"), "--bundles", toolset="bundle"),
        id="bundle-reuse-bundles",
    ),
    pytest.param(
        Case("bundle_compile", {"query": "q", "items": ITEMS, "top_k": 0}, "top_k",
             ("bundle", "compile", "--no-cache", "--top-k", "0"), "--top-k",
             BundleParams, {"top_k": 0}, toolset="bundle"),
        id="bundle-top-k",
    ),
    pytest.param(
        Case("kv_probe", {"samples": 0}, "samples", ("kv", "probe", "--samples", "0"),
             "--samples", toolset="kv"),
        id="kv-probe-samples",
    ),
    pytest.param(
        Case("engine_start", {"port": 80}, "port", ("engine", "start", "--port", "80"),
             "--port", toolset="engine"),
        id="engine-port",
    ),
]  # fmt: skip


@pytest.mark.parametrize("case", DRIFTED + TOOL_ONLY_BEFORE)
async def test_tool_model_and_cli_refuse_the_same_value(
    case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = Settings.build(data_dir=tmp_path, toolsets=(case.toolset,))
    async with Client(build_server(settings)) as client:
        message = await call_error(client, case.tool, case.arguments)
    assert case.param in message, message

    if case.model is not None:
        with pytest.raises(ValidationError) as refused:
            case.model(**(case.fields or {}))
        assert case.param in {str(part) for e in refused.value.errors() for part in e["loc"]}

    evidence = tmp_path / "evidence.jsonl"
    evidence.write_text('{"id": "a", "text": "alpha"}\n', encoding="utf-8")
    argv = [*case.argv, "--data-dir", str(tmp_path)]
    if case.argv[:2] == ("bundle", "compile"):
        argv += ["--evidence", str(evidence)]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"argument {case.flag}:" in err and "Traceback" not in err, err


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (("bundle", "compile", "--no-cache", "--half-life-days", "inf"), "--half-life-days"),
        (("lmcache", "config", *FACT_FLAGS, "--l1-size-gb", "inf"), "--l1-size-gb"),
        (("vllm", "start", "--model", "/m", "--ready-timeout-s", "nan"), "--ready-timeout-s"),
    ],
    ids=["half-life", "l1-size", "ready-timeout"],
)
def test_the_cli_refuses_infinite_and_nan_where_the_model_does(
    argv: tuple[str, ...], flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """JSON carries no inf or NaN, but a flag can: the shared type refuses them for both."""
    evidence = tmp_path / "evidence.jsonl"
    evidence.write_text('{"id": "a", "text": "alpha"}\n', encoding="utf-8")
    code = main([*argv, "--evidence", str(evidence)] if "bundle" in argv else list(argv))
    err = capsys.readouterr().err
    assert code == 2 and f"argument {flag}: Input should be a finite number" in err, err
    for model, fields in (
        (BundleParams, {"freshness_half_life_days": float("inf")}),
        (LmcacheChoices, {"l1_size_gb": float("inf")}),
        (StackOptions, {"l1_size_gb": float("nan")}),
    ):
        with pytest.raises(ValidationError):
            model(**fields)


def test_kv_budget_refuses_what_its_tool_and_flag_refuse() -> None:
    """The domain function checks the same declared bound the tool schema now carries."""
    with pytest.raises(ConfigError, match=r"kv_memory_gib is 2000000\.0"):
        kv_budget({"model_type": "llama"}, kv_memory_gib=2e6)
    with pytest.raises(ConfigError, match=r"chunk_size is 2\.5"):
        kv_budget({"model_type": "llama"}, chunk_size=2.5)  # type: ignore[arg-type]


def test_settings_refuse_an_lmcache_port_the_stack_could_not_use(tmp_path: Path) -> None:
    """GRAPH_KVCACHE_LMCACHE_PORT feeds VllmLaunch and StackOptions: the same bound applies."""
    with pytest.raises(ConfigError, match="lmcache_port: should be greater than or equal to 1024"):
        Settings.build(data_dir=tmp_path, lmcache_port=80)
