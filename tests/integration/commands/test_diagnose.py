"""`graph-kvcache-mcp diagnose ...` through `main(argv)`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graph_kvcache_mcp.cli import main

MODELS = Path(__file__).resolve().parents[2] / "data" / "models"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_budget_prints_the_same_model_the_tool_returns(capsys: pytest.CaptureFixture[str]) -> None:
    config = str(MODELS / "deepseek-v3.config.json")
    code, out, _ = run(capsys, "diagnose", "budget", "--hf-config", config, "--json")
    assert code == 0
    budget = json.loads(out)
    assert (budget["kind"], budget["bytes_per_token"]) == ("mla", 61 * 576 * 2)
    code, text, _ = run(capsys, "diagnose", "budget", "--hf-config", config)
    assert code == 0 and "70,272 bytes per token" in text


def test_budget_refuses_a_missing_config_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "diagnose", "budget", "--hf-config", "/nonexistent/x")
    assert (code, out) == (2, "") and "no config.json" in err
