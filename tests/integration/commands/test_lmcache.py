"""`graph-kvcache-mcp lmcache key|config|check` from the shell side: output, --json, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graph_kvcache_mcp.cli import main
from graph_kvcache_mcp.domain.lmcache.keys import engine_key
from tests.support.engines import RunningEngine

DATA = Path(__file__).resolve().parents[2] / "data" / "lmcache"
KEY = "Qwen/Qwen3-8B@01000100@0@" + "cd" * 32


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_key_prints_the_engine_key(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "lmcache", "key", KEY)
    assert (code, out.strip()) == (0, engine_key(KEY))
    code, out, _ = run(capsys, "lmcache", "key", KEY, "--namespace", "fleet-b", "--json")
    assert code == 0
    assert json.loads(out) == {
        "lmcache_key": KEY,
        "engine_key": engine_key(KEY, namespace="fleet-b"),
        "namespace": "fleet-b",
        "scheme_version": 1,
    }


def test_config_prints_commands_and_exits_1_for_an_unsupported_model(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(
        capsys, "lmcache", "config", "--hf-config", str(DATA / "qwen3-8b.config.json")
    )
    assert code == 0
    assert "lmcache server" in out and "LMCacheMPConnector" in out
    code, out, _ = run(
        capsys,
        "lmcache",
        "config",
        "--json",
        "--hf-config",
        str(DATA / "deepseek-v4-flash.config.json"),
    )
    assert code == 1 and json.loads(out)["plan"]["supported"] is False


def test_config_honours_the_plain_http_opt_in_as_the_engine_client_does(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    flags = ("lmcache", "config", "--json", "--hf-config", str(DATA / "qwen3-8b.config.json"))
    remote = ("--engine-url", "http://10.0.0.5:9130")
    monkeypatch.delenv("GRAPH_KVCACHE_INSECURE_HTTP_HOSTS", raising=False)
    code, _, err = run(capsys, *flags, *remote)
    assert code == 2 and "GRAPH_KVCACHE_INSECURE_HTTP_HOSTS" in err
    monkeypatch.setenv("GRAPH_KVCACHE_INSECURE_HTTP_HOSTS", "10.0.0.0/24")
    code, out, _ = run(capsys, *flags, *remote)
    assert code == 0
    assert json.loads(out)["plan"]["l2_adapter"]["adapter_params"]["base_url"] == remote[1]


def test_config_refuses_bad_input_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "lmcache", "config", "--model", "x/y")
    assert code == 2 and "num_layers" in err
    code, _, err = run(capsys, "lmcache", "key", "")
    assert code == 2 and "empty" in err


def test_config_writes_the_in_process_yaml_to_a_new_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    target = tmp_path / "lmcache.yaml"
    args = ["lmcache", "config", "--mode", "inprocess_plugin", "--write-yaml", str(target)]
    code, out, _ = run(capsys, *args, "--hf-config", str(DATA / "qwen3-8b.config.json"), "--json")
    assert code == 0
    assert target.read_text() == json.loads(out)["plan"]["lmcache_yaml"]
    assert json.loads(out)["plan"]["vllm"]["env"]["LMCACHE_CONFIG_FILE"] == str(target)


def test_check_passes_against_an_engine_and_reports_it_down(
    capsys: pytest.CaptureFixture[str],
    memory_engine: RunningEngine,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EPISTEMIC_GRAPH_KVCACHE_TOKEN", memory_engine.token.get_secret_value())
    code, out, _ = run(capsys, "lmcache", "check", "--url", memory_engine.base_url, "--json")
    assert code == 0 and json.loads(out)["passed"] is True
    code, out, _ = run(capsys, "lmcache", "check", "--url", memory_engine.base_url)
    assert code == 0 and "PASS" in out and "dedup" in out
    code, out, _ = run(capsys, "lmcache", "check", "--url", "http://127.0.0.1:9", "--json")
    assert code == 3 and json.loads(out)["reachable"] is False


def test_config_of_a_local_model_without_a_hub_name_uses_its_path_not_its_class(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A config.json a script wrote (no `_name_or_path`) names only the class; vLLM serves the
    model under its directory, so that is what the printed command passes to --model."""
    raw = json.loads((DATA / "qwen3-8b.config.json").read_text())
    raw.pop("_name_or_path")
    model_dir = tmp_path / "my-model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(raw))
    for given in (model_dir, model_dir / "config.json"):
        code, out, _ = run(capsys, "lmcache", "config", "--hf-config", str(given))
        assert code == 0
        assert f"--model {model_dir}" in out and "--model Qwen3ForCausalLM" not in out
