"""The GPU proofs in one short run: KV restored after a restart with equal logprobs, every full
block restored, and the restored load's rate against the engine's plain wire rate.

On a machine without a CUDA GPU it says so and exits 0, measuring nothing. With one (and vLLM
installed in `--python`'s venv, 0.33 for GPUs), it starts vLLM with EngineKVConnector on its CUDA
KV cache (`vllm start --kv-connector engine`: pinned host memory, side streams, events; see
docs/vllm-connector.md "On CUDA"), or with `--kv-connector mp_native` LMCache's MP connector with
the engine as its L2, to compare. Then:

1. a cold completion of a long prompt (temperature 0, logprobs), and vLLM's block size;
2. `vllm restart-reuse --restart stack`: vLLM (and an lmcache server, if any) restart, so the
   next hits come from the engine; its cold/restarted TTFT ratio and engine bytes loaded print;
3. the first prompt again on the restarted stack: cached tokens against every full block of
   the prompt (ratio 1.00 = every full block restored), and its logprobs against the cold ones;
4. the engine's plain GET rate for blocks of the same size (the wire), and the restored load's
   rate (engine bytes loaded / restarted call latency) as a share of it.

Usage: `.venv/bin/python tools/gpu_check.py --model Qwen/Qwen3-0.6B [--python VLLM_PY]
[--kv-connector engine|mp_native]`. It stops
what it started. Prints `ratio` lines; exit 1 when a proof fails, 2 on a setup error.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.engine.opener import resolve_kv_target, sync_client_for
from graph_kvcache_mcp.connectors.vllm.platform import detect_platform
from graph_kvcache_mcp.domain.vllm.kv_blocks import unsupported_setup

CLI = [sys.executable, "-m", "graph_kvcache_mcp"]
LOGPROB_TOLERANCE = 1e-3
"""Largest difference between a cold and a restored token logprob (kernels are not bit-exact
between a prefill and a load; a wrong page differs by whole units)."""
WIRE_BLOCKS = 64
CUDA_DENSE_SETUP: dict[str, Any] = {"device": "cuda", "tensor_parallel": 1}
CUDA_DENSE_SETUP |= {"pipeline_parallel": 1, "kv_cache_groups": 1, "sliding_window": None}
CUDA_DENSE_SETUP |= {"spec_kind": "FullAttentionSpec"}
"""A single-rank dense model on CUDA: what EngineKVConnector is asked to serve here."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--model", default="Qwen/Qwen3-0.6B", help="a dense model vLLM can load")
    parser.add_argument("--python", default=os.environ.get("GRAPH_KVCACHE_VLLM_PYTHON"))
    parser.add_argument("--prompt-tokens", type=int, default=2048)
    parser.add_argument("--kv-connector", choices=["engine", "mp_native"], default="engine")
    args = parser.parse_args(argv)
    platform = detect_platform()
    if platform.kind != "gpu":
        print(f"gpu_check: no CUDA GPU on this machine ({platform.detail}); nothing measured")
        return 0
    python = args.python or sys.executable
    version = _run([python, "-c", "import vllm; print(vllm.__version__)"]).strip()
    print(f"gpu: {', '.join(platform.gpus)}; vLLM {version} in {python}")
    refusal = unsupported_setup(**CUDA_DENSE_SETUP)
    print(f"EngineKVConnector on CUDA, one rank, dense: {refusal or 'handled'}")
    if refusal is not None and args.kv_connector == "engine":
        return 2
    data_dir = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    common = ["--data-dir", str(data_dir)]
    try:
        _run([*CLI, "vllm", "start", "--model", args.model, "--kv-connector", args.kv_connector,
              "--python", python, *common, "--json"])  # fmt: skip
        return _prove(args, common, data_dir)
    finally:
        for command in (["vllm", "stop"], ["lmcache", "stop"], ["engine", "stop"]):
            subprocess.run([*CLI, *command, *common], check=False, capture_output=True)


def _prove(args: argparse.Namespace, common: list[str], data_dir: Path) -> int:
    status = json.loads(_run([*CLI, "vllm", "status", *common, "--json"]))
    base = str(status["base_url"]).rstrip("/")
    prompt = f"{uuid.uuid4().hex} " + "The river keeps running past the mill. " * (
        args.prompt_tokens // 8
    )
    cold = _complete(base, prompt)
    block = _block_size(base)
    reuse = json.loads(
        _run([*CLI, "vllm", "restart-reuse", "--restart", "stack", *common, "--json"])
    )
    status = json.loads(_run([*CLI, "vllm", "status", *common, "--json"]))
    base = str(status["base_url"]).rstrip("/")
    began = time.perf_counter()
    warm = _complete(base, prompt)
    warm_s = time.perf_counter() - began
    prompt_tokens = int(cold["usage"]["prompt_tokens"])
    full = prompt_tokens // block * block
    cached = int((warm["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    drift = max(
        (abs(a - b) for a, b in zip(_logprobs(cold), _logprobs(warm), strict=True)), default=0.0
    )
    wire = _wire_rate(data_dir, int(reuse.get("engine_bytes_loaded") or 0), WIRE_BLOCKS)
    loaded = reuse.get("engine_bytes_loaded") or 0
    load_rate = loaded / reuse["restarted"]["latency_s"] if loaded else 0.0
    print(f"ratio restored/full-block tokens: {cached}/{full} = {cached / max(full, 1):.2f}")
    print(f"ratio cold/restarted TTFT (restart-reuse): {reuse.get('ttft_speedup')}")
    print(f"restored call latency {warm_s:.3f} s; max |logprob drift| {drift:.2e}")
    print(f"ratio load/wire: {load_rate / 1e9:.3f} / {wire / 1e9:.3f} GB/s = "
          f"{load_rate / wire if wire else 0.0:.2f}")  # fmt: skip
    ok = cached == full and drift <= LOGPROB_TOLERANCE
    print("gpu_check: " + ("every proof held" if ok else "a proof FAILED (see above)"))
    return 0 if ok else 1


def _complete(base: str, prompt: str) -> dict[str, Any]:
    body = {"prompt": prompt, "max_tokens": 16, "temperature": 0.0, "logprobs": 1}
    models = httpx.get(f"{base}/models", timeout=30.0).json()["data"]
    body["model"] = models[0]["id"]
    answer: dict[str, Any] = httpx.post(f"{base}/completions", json=body, timeout=300.0).json()
    return answer


def _logprobs(answer: dict[str, Any]) -> list[float]:
    return [float(v) for v in answer["choices"][0]["logprobs"]["token_logprobs"]]


def _block_size(base: str) -> int:
    root = base.removesuffix("/v1")
    for line in httpx.get(f"{root}/metrics", timeout=30.0).text.splitlines():
        if line.startswith("vllm:cache_config_info{") and 'block_size="' in line:
            return int(line.split('block_size="', 1)[1].split('"', 1)[0])
    return 16


def _wire_rate(data_dir: Path, bytes_loaded: int, blocks: int) -> float:
    """The engine's plain GET rate (bytes/s) for values the size the restore read per block."""
    size = max(1 << 20, bytes_loaded // max(blocks, 1))
    settings = Settings.build(data_dir=data_dir)
    with sync_client_for(resolve_kv_target(settings), settings) as client:
        keys = [f"gpu-check-wire-{uuid.uuid4().hex}-{i}" for i in range(blocks)]
        client.put_many([(key, os.urandom(size)) for key in keys])
        began = time.perf_counter()
        client.get_many(keys)
        return blocks * size / (time.perf_counter() - began)


def _run(command: list[str]) -> str:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"gpu_check: {' '.join(command[:6])} failed: {done.stderr.strip()[-800:]}")
    return done.stdout


if __name__ == "__main__":
    sys.exit(main())
