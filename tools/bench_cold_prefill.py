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
  port, so every save is dropped at once: the connector's cost without its uploads;
- `none (again)` (opt-in): a second plain vLLM, the A/A control: how far two identical servers
  drift apart on this machine, the noise any other ratio here carries.

Every setup gets vLLM's own core reservation for one rank (`VLLM_CPU_NUM_OF_RESERVED_CPU=1`, what
`vllm start` gives a connector vLLM; plain vLLM's default), so all bind OpenMP alike.

Then R rounds (`--rounds`, default 5) of decode: in each, one short fresh prompt asks each setup
for D tokens (the connector saves every block that fills), in rotating order. Reported: median
TTFT and decode tokens/s per setup, and each as a ratio to `none` (TTFT above 1 is slower,
decode below 1 is slower; decode's ratio is the median of the per-round ratios, goal >= 0.9).
Usage: `.venv/bin/python tools/bench_cold_prefill.py [--prompts 5] [--tokens 3072] [--rounds 5]`
(`--prompts 0`: decode only).
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
    "none (again)": "none",
}
"""Setup name -> kv_connector."""
DECODE_GOAL = 0.9
SAME_RESERVATION = {"VLLM_CPU_NUM_OF_RESERVED_CPU": "1"}
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
    parser.add_argument("--rounds", type=int, default=5, help="decode requests per setup")
    parser.add_argument(
        "--setups",
        default="engine connector;none (again)",
        help="names from SETUPS separated by ';' (the baseline, none, always runs)",
    )
    args = parser.parse_args()
    model = bench_model_dir(args.layers, args.hidden, args.kv_heads)
    prompts = [random_prompt(args.tokens, seed=5000 + i) for i in range(args.prompts)]
    overrides = {"max_model_len": args.tokens + 64, "kv_cache_memory_bytes": 768 * 1024**2}
    chosen = [name.strip() for name in args.setups.split(";")]
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
            env = {**SAME_RESERVATION, **env}
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
        for turn in range(args.rounds):  # decode: short fresh prompts, exactly D new tokens
            prompt = random_prompt(64, seed=7000 + turn)
            for name in names[turn % len(names) :] + names[: turn % len(names)]:
                answer = servers[name].complete(prompt, max_tokens=args.decode, ignore_eos=True)
                rates[name].append(args.decode / answer.elapsed_s)
            print(f"decode {turn + 1}: " + ", ".join(f"{n} {rates[n][-1]:.1f}" for n in names))
    shape = f"{args.layers} layers, hidden {args.hidden}"
    print(f"model: {shape}; {args.prompts} x {args.tokens} tokens; {args.rounds} x {args.decode}")
    print(f"| setup | cold TTFT (s) | TTFT vs {BASELINE} | decode tok/s | decode vs {BASELINE} |")
    print("|---|---|---|---|---|")
    for name in chosen:
        ttft, base = _median(times[name]), _median(times[BASELINE])
        ttft_cells = f"{ttft:.3f} | {ttft / base:.2f}x"
        ratio = decode_ratio(rates[name], rates[BASELINE])
        print(f"| {name} | {ttft_cells} | {_median(rates[name]):.1f} | {ratio:.2f}x |")
    slowest = min(decode_ratio(rates[name], rates[BASELINE]) for name in chosen)
    print(f"slowest decode vs {BASELINE}: {slowest:.2f}x (goal >= {DECODE_GOAL}x)")
    return 0 if slowest >= DECODE_GOAL else 1


def decode_ratio(rates: list[float], baseline: list[float]) -> float:
    """The median of the per-round ratios: each round's requests ran back to back, so a round
    shares the machine's load of its moment, which a ratio of medians would mix across rounds."""
    return statistics.median(rate / base for rate, base in zip(rates, baseline, strict=True))


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


if __name__ == "__main__":
    sys.exit(main())
