"""Benchmark cold prefill on CPU vLLM: without a connector, without one but with AMX tile state
requested at start-up, and with EngineKVConnector, side by side.

Why: the connector asks Linux for AMX tile state when vLLM registers its KV caches, and an
earlier bench saw cold prefill 1.8x faster with the connector than without. One random Llama
(the `bench_connector.py` model) and three vLLM processes, all up at once; the same P prompts of
T tokens go cold to each, one token each (latency = time to first token), interleaved (prompt i
goes to the three in a rotating order) so that the machine's load drifts over all three alike:

- `none`: no KV connector;
- `none, AMX requested`: no KV connector; a `sitecustomize` on vLLM's path asks for AMX tile
  state in every vLLM process before vLLM starts (what the connector does, without it);
- `engine connector`: `EngineKVConnector` (asks for the tile state itself; saves every block);
- `engine connector (engine unreachable)` (opt-in, `--setups`): the connector pointed at a closed
  port, so every save is dropped at once: the connector's cost without its uploads.

Then P short fresh prompts ask each for D tokens (decode; the connector saves every block that
fills). Reported: median TTFT and decode tokens/s per setup, each as a ratio to `none` (TTFT
above 1 is slower, decode below 1 is slower). Usage:
`.venv/bin/python tools/bench_cold_prefill.py [--prompts 5] [--tokens 3072]`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from graph_kvcache_mcp.connectors.engine.process import ManagedEngine  # noqa: E402
from tests.support.engines import RunningEngine  # noqa: E402
from tests.support.vllm import add_bench_model_arguments, bench_model_dir  # noqa: E402
from tests.support.vllm_connector import connector_vllm, random_prompt  # noqa: E402

BASELINE = "none"
SETUPS = {
    BASELINE: "none",
    "none, AMX requested": "none",
    "engine connector": "engine",
    "engine connector (engine unreachable)": "engine",
}
"""Setup name -> kv_connector. The last: the connector in place, every save dropped at once."""
UNREACHABLE = {"EPISTEMIC_GRAPH_KVCACHE_URL": "http://127.0.0.1:9"}
SETUPS_UNREACHABLE = "engine connector (engine unreachable)"
AMX_SITECUSTOMIZE = """\
import torch

if torch.cpu._is_amx_tile_supported() and not torch.cpu._init_amx():
    raise SystemExit("the OS refused AMX tile state")
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_bench_model_arguments(parser, prompts=5)
    parser.add_argument("--decode", type=int, default=128, help="tokens per decode request")
    parser.add_argument(
        "--setups",
        default="none,none, AMX requested,engine connector",
        help="comma-separated names from SETUPS, the baseline first",
    )
    args = parser.parse_args()
    model = bench_model_dir(args.layers, args.hidden, args.kv_heads)
    prompts = [random_prompt(args.tokens, seed=5000 + i) for i in range(args.prompts)]
    overrides = {"max_model_len": args.tokens + 64, "kv_cache_memory_bytes": 768 * 1024**2}
    chosen = [name.strip() for name in args.setups.split(",")]
    chosen = [name for name in SETUPS if name in chosen or name == BASELINE]
    times: dict[str, list[float]] = {name: [] for name in chosen}
    rates: dict[str, list[float]] = {name: [] for name in chosen}
    with tempfile.TemporaryDirectory(prefix="bench-cold-") as tmp, ExitStack() as stack:
        managed = ManagedEngine(Path(tmp) / "engine")
        managed.start(backend="memory")
        stack.callback(managed.stop, term_wait_s=5.0)
        state = managed.running_state()
        assert state is not None
        engine = RunningEngine(managed, state.base_url, managed.token(), "memory")
        amx_dir = Path(tmp) / "amx"
        amx_dir.mkdir()
        (amx_dir / "sitecustomize.py").write_text(AMX_SITECUSTOMIZE)
        amx = {"PYTHONPATH": f"{amx_dir}{os.pathsep}{REPO}"}
        servers = {}
        for index, name in enumerate(chosen):
            launch = {**overrides, "kv_connector": SETUPS[name]}
            env = {"none, AMX requested": amx, SETUPS_UNREACHABLE: UNREACHABLE}.get(name, {})
            servers[name] = stack.enter_context(
                connector_vllm(
                    Path(tmp) / f"vllm-{index}", engine, model_dir=model, extra_env=env, **launch
                )
            )
            servers[name].complete(random_prompt(64, seed=6000 + index), max_tokens=1)
        names = chosen
        for turn, prompt in enumerate(prompts):
            for name in names[turn % len(names) :] + names[: turn % len(names)]:
                times[name].append(servers[name].complete(prompt, max_tokens=1).elapsed_s)
            print(f"prompt {turn + 1}: " + ", ".join(f"{n} {times[n][-1]:.3f}" for n in names))
        for turn in range(args.prompts):  # decode: short fresh prompts, exactly D new tokens
            prompt = random_prompt(64, seed=7000 + turn)
            for name in names[turn % len(names) :] + names[: turn % len(names)]:
                answer = servers[name].complete(prompt, max_tokens=args.decode, ignore_eos=True)
                rates[name].append(args.decode / answer.elapsed_s)
    base = statistics.median(times[BASELINE])
    shape = f"{args.layers} layers, hidden {args.hidden}"
    print(f"model: {shape}; {args.prompts} x {args.tokens} tokens")
    base_rate = statistics.median(rates[BASELINE])
    print(f"| setup | cold TTFT (s) | TTFT vs {BASELINE} | decode tok/s | decode vs {BASELINE} |")
    print("|---|---|---|---|---|")
    for name, taken in times.items():
        median, rate = statistics.median(taken), statistics.median(rates[name])
        print(
            f"| {name} | {median:.3f} | {median / base:.2f}x | {rate:.1f} | "
            f"{rate / base_rate:.2f}x |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
