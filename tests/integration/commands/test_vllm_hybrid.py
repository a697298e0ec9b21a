"""`vllm start` on the tiny random Mamba2 hybrids, as a user runs it, against real CPU vLLM:

- defaults serve a ~2.5k-token prompt (vLLM's own defaults crash there) and its repeat is cached;
- `diagnose budget` gives the block and the KV cache size vLLM itself logs, with 2 KV cache
  groups (granite) and 3 (nemotron); `diagnose stack` stays quiet on the recipe;
- a Mamba1 model, and LMCache MP on a CPU hybrid, are refused (exit 2) before anything starts.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from graph_kvcache_mcp.cli import main
from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.connectors.vllm.process import ManagedVllm
from graph_kvcache_mcp.domain.diagnosis.kv_budget import KvBudget
from graph_kvcache_mcp.domain.diagnosis.stack_findings import StackDiagnosis
from graph_kvcache_mcp.services.vllm.views import VllmChatOut, VllmStatusOut
from tests.support.hybrid import hybrid_model_dir
from tests.support.vllm import READY_TIMEOUT_S, require_vllm_venv

DATA = Path(__file__).parents[2] / "data" / "hybrid"
SHM = Path("/dev/shm")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def vllm_python(monkeypatch: pytest.MonkeyPatch) -> Path:
    python = require_vllm_venv()
    monkeypatch.setenv("GRAPH_KVCACHE_VLLM_PYTHON", str(python))
    return python


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    """A private data dir; whatever vLLM it managed is stopped at the end."""
    yield tmp_path / "data"
    ManagedVllm(tmp_path / "data").stop()


def long_prompt(words: int, seed: int) -> str:
    rng = random.Random(seed)
    names = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "lambda"]
    return " ".join(f"{rng.choice(names)}{rng.randint(0, 99)}" for _ in range(words))


def log_figure(log: str, pattern: str) -> int | None:
    found = re.findall(pattern, log)
    return int(found[-1].replace(",", "")) if found else None


@pytest.mark.vllm
@pytest.mark.parametrize(("family", "groups"), [("granite", 2), ("nemotron", 3)])
def test_vllm_start_with_defaults_serves_and_caches_a_long_prompt_as_the_budget_says(
    family: str,
    groups: int,
    vllm_python: Path,
    data_dir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    model = hybrid_model_dir(family)
    port = str(free_port())
    common = ["--data-dir", str(data_dir)]
    code, out, err = run(
        capsys, "vllm", "start", "--model", str(model), "--port", port,
        "--served-model-name", family, "--ready-timeout-s", str(READY_TIMEOUT_S), "--json", *common,
    )  # fmt: skip
    assert code == 0, err
    status = VllmStatusOut.model_validate_json(out)
    assert any("--max-num-batched-tokens" in note for note in status.notes)
    assert not any("--mamba-cache-mode" in note for note in status.notes)
    url = f"http://127.0.0.1:{port}/v1"
    prompt = long_prompt(620, seed=groups)
    chats = []
    for _ in range(2):
        code, out, err = run(
            capsys, "vllm", "chat", "--base-url", url, "--model", family,
            "--message", prompt, "--max-tokens", "3", "--json",
        )  # fmt: skip
        assert code == 0, err
        chats.append(VllmChatOut.model_validate_json(out))
    first, second = (chat.trace for chat in chats)
    assert first is not None and second is not None
    assert 2000 <= first.prompt_tokens <= 4000  # a prompt of many Mamba chunks, served
    hit = second.prefix_cache_hit_tokens or 0
    assert hit > 0 and hit % 128 == 0
    # vLLM's own figures: block, groups and "CPU KV cache size: N tokens" vs diagnose budget
    code, out, err = run(
        capsys, "diagnose", "budget", "--hf-config", str(model), "--platform", "cpu",
        "--kv-memory-gib", "1", "--json",
    )  # fmt: skip
    assert code == 0, err
    budget = KvBudget.model_validate_json(out)
    assert budget.hybrid is not None and budget.hybrid.layout.kv_cache_groups == groups
    log = ManagedVllm(data_dir).log_path.read_text(errors="replace")
    assert log_figure(log, r"CPU KV cache size: ([\d,]+) tokens") == budget.tokens_fit
    raised = log_figure(log, r"Setting attention block size to (\d+) tokens")
    assert raised == (budget.block_size if budget.hybrid.layout.block_raised else None)
    assert f"Padding mamba page size by {budget.hybrid.layout.padding_pct:.2f}%" in log
    code, out, err = run(capsys, "diagnose", "stack", "--base-url", url, "--json", *common)
    stack = StackDiagnosis.model_validate_json(out)
    found = {finding.id for finding in stack.findings}
    assert not {"vllm_hybrid_align_crash", "vllm_hybrid_state_not_cached"} & found, out


def test_a_mamba1_model_is_refused_on_cpu_before_vllm_starts(
    vllm_python: Path, data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "jamba"
    model.mkdir()
    shutil.copy(DATA / "jamba.config.json", model / "config.json")
    code, _, err = run(
        capsys, "vllm", "start", "--model", str(model), "--port", str(free_port()),
        "--data-dir", str(data_dir),
    )  # fmt: skip
    assert code == 2
    assert "Mamba1" in err and "selective_scan_fwd" in err and "Traceback" not in err
    assert ManagedVllm(data_dir).state() is None


def ours(marker: str) -> set[int]:
    """Processes whose command line names `marker` (our private data dir)."""
    found = set()
    for process in psutil.process_iter(["pid", "cmdline"]):
        if marker in " ".join(process.info["cmdline"] or ()):
            found.add(process.info["pid"])
    return found - {os.getpid()}


@pytest.mark.parametrize("family", ["granite", "nemotron"])
def test_lmcache_mp_on_a_cpu_hybrid_is_refused_in_seconds_with_nothing_started(
    family: str, vllm_python: Path, data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = hybrid_model_dir(family)
    shm_before = set(os.listdir(SHM)) if SHM.is_dir() else set()
    began = time.monotonic()
    code, _, err = run(
        capsys, "vllm", "start", "--model", str(model), "--port",
        str(free_port()), "--kv-connector", "mp_native", "--data-dir", str(data_dir),
    )  # fmt: skip
    took_s = time.monotonic() - began
    assert code == 2 and took_s < 30
    assert "KV cache groups" in err and "kv_connector=engine" in err and "Traceback" not in err
    assert ours(str(data_dir)) == set()
    new_shm = (set(os.listdir(SHM)) if SHM.is_dir() else set()) - shm_before
    assert not {name for name in new_shm if "lmcache" in name}
    for piece in ("engine", "lmcache", "vllm"):
        assert not list((data_dir / piece).glob("state.json"))
