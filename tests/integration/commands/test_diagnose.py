"""`graph-kvcache-mcp diagnose ...` through `main(argv)`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graph_kvcache_mcp.cli import main
from graph_kvcache_mcp.connectors.processes.ports import free_port
from tests.support.hybrid import hybrid_model_dir
from tests.support.vllm import tiny_model_dir

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


def test_budget_follows_the_named_card_and_refuses_an_unknown_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = str(MODELS.parent / "lmcache" / "qwen3-next-80b-a3b.config.json")
    given = ("diagnose", "budget", "--hf-config", config, "--platform", "gpu", "--json")
    blocks = {}
    for card in ("h100", "a100"):
        code, out, _ = run(
            capsys, *given, "--gpu", card, "--kv-memory-gib", "40", "--max-model-len", "32768"
        )
        assert code == 0
        budget = json.loads(out)
        blocks[card] = (budget["block_size"], budget["tokens_fit"])
    assert blocks["h100"][0] == 576 and blocks["a100"][0] == 544
    assert blocks["h100"][1] < blocks["a100"][1]
    code, out, err = run(capsys, *given, "--gpu", "v100")
    assert (code, out) == (2, "") and "--gpu" in err


def test_budget_refuses_a_missing_config_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "diagnose", "budget", "--hf-config", "/nonexistent/x")
    assert (code, out) == (2, "") and "no config.json" in err


def test_miss_exits_3_when_vllm_is_down_and_2_for_a_bad_body(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}))
    bad.write_text("[1, 2]")
    url = f"http://127.0.0.1:{free_port()}/v1"
    common = ("--base-url", url, "--model", "m", "--data-dir", str(tmp_path))
    code, out, _ = run(
        capsys, "diagnose", "miss", "--first", str(good), "--second", str(good), *common, "--json"
    )
    assert code == 3 and json.loads(out)["reachable"] is False
    code, out, err = run(
        capsys, "diagnose", "miss", "--first", str(bad), "--second", str(good), *common
    )
    assert (code, out) == (2, "") and "not a chat-completions body" in err


def test_stack_exits_3_when_nothing_answers(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = ["--url", f"http://127.0.0.1:{free_port()}", "--data-dir", str(tmp_path)]
    vllm = ["--base-url", f"http://127.0.0.1:{free_port()}/v1"]
    code, out, _ = run(capsys, "diagnose", "stack", *argv, *vllm, "--json")
    assert code == 3
    assert {f["id"] for f in json.loads(out)["findings"]} == {
        "engine_unreachable",
        "vllm_unreachable",
    }


def test_miss_with_a_local_tokenizer_needs_no_vllm_but_a_block_size(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    model_dir = tiny_model_dir()
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    system = {"role": "system", "content": "Keep answers short. " * 40}
    first.write_text(json.dumps({"messages": [system, {"role": "user", "content": "one?"}]}))
    second.write_text(json.dumps({"messages": [system, {"role": "user", "content": "two?"}]}))
    argv = ["diagnose", "miss", "--first", str(first), "--second", str(second)]
    local = ["--tokenizer", str(model_dir), "--data-dir", str(tmp_path)]
    code, out, _ = run(capsys, *argv, *local, "--block-size", "32", "--json")
    assert code == 0
    diagnosis = json.loads(out)
    assert (diagnosis["tokenizer"], diagnosis["cause"]["kind"]) == ("local", "new_turn")
    assert diagnosis["predicted_cached_tokens"] % 32 == 0 and diagnosis["predicted_cached_tokens"]
    code, out, err = run(capsys, *argv, *local)
    assert (code, out) == (2, "") and "block size" in err


def test_miss_with_a_hybrids_local_dir_applies_the_hybrid_rule(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The dir's config.json says the model keeps mamba state: an edit halfway into the system
    prompt reuses nothing (the first request's state is past the divergence)."""
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    user = {"role": "user", "content": "one?"}
    for path, word in ((first, "short"), (second, "long")):
        system = "Keep answers short. " * 20 + f"Keep answers {word}. " * 20
        path.write_text(json.dumps({"messages": [{"role": "system", "content": system}, user]}))
    argv = ["diagnose", "miss", "--first", str(first), "--second", str(second), "--json"]
    local = ["--tokenizer", str(hybrid_model_dir("granite")), "--data-dir", str(tmp_path)]
    code, out, _ = run(capsys, *argv, *local, "--block-size", "32")
    assert code == 0
    diagnosis = json.loads(out)
    assert diagnosis["common_prefix_tokens"] >= 4 * 32
    assert diagnosis["predicted_cached_tokens"] == 0
    assert "hybrid model" in diagnosis["cause"]["detail"]
