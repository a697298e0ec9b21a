"""Benchmark cold prefill on CPU vLLM with and without AMX tile state, side by side.

One random Llama (the `bench_connector.py` model) and three vLLM processes, all up at once; the
same P prompts of T tokens go cold to each of them, one token each (latency = time to first
token), interleaved (prompt i goes to the three in a rotating order), so that the machine's load
drifts over all three alike:

- `none, no AMX request`: no KV connector, and this package's vLLM plugin switched off
  (`VLLM_PLUGINS` names no plugin): nothing of ours asks Linux for AMX tile state;
- `none + plugin`: no KV connector, the `graph_kvcache_amx` general plugin on (what every vLLM
  whose venv has this package gets);
- `engine connector`: `EngineKVConnector`, plugin off (the connector asks for the tile state
  itself when vLLM registers its KV caches, and saves every new block).

Reported: median TTFT per setup and its ratio to `none, no AMX request`. Usage:
`.venv/bin/python tools/bench_cold_prefill.py [--prompts 5] [--tokens 3072]`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from graph_kvcache_mcp.connectors.engine.process import ManagedEngine  # noqa: E402
from tests.support.engines import RunningEngine  # noqa: E402
from tests.support.vllm_connector import connector_vllm, random_prompt  # noqa: E402
from tools.bench_connector import build_model  # noqa: E402

NO_PLUGINS = {"VLLM_PLUGINS": "no-such-plugin"}
SETUPS: dict[str, tuple[str, dict[str, str]]] = {
    "none, no AMX request": ("none", NO_PLUGINS),
    "none + plugin": ("none", {}),
    "engine connector": ("engine", NO_PLUGINS),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=3072)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--kv-heads", type=int, default=16)
    args = parser.parse_args()
    model = build_model(args.layers, args.hidden, args.kv_heads)
    prompts = [random_prompt(args.tokens, seed=5000 + i) for i in range(args.prompts)]
    overrides = {"max_model_len": args.tokens + 64, "kv_cache_memory_bytes": 768 * 1024**2}
    times: dict[str, list[float]] = {name: [] for name in SETUPS}
    with tempfile.TemporaryDirectory(prefix="bench-cold-") as tmp, ExitStack() as stack:
        managed = ManagedEngine(Path(tmp) / "engine")
        managed.start(backend="memory")
        stack.callback(managed.stop, term_wait_s=5.0)
        state = managed.running_state()
        assert state is not None
        engine = RunningEngine(managed, state.base_url, managed.token(), "memory")
        servers = {}
        for index, (name, (connector, env)) in enumerate(SETUPS.items()):
            launch = {**overrides, "kv_connector": connector}
            servers[name] = stack.enter_context(
                connector_vllm(
                    Path(tmp) / f"vllm-{index}", engine, model_dir=model, extra_env=env, **launch
                )
            )
            servers[name].complete(random_prompt(64, seed=6000 + index), max_tokens=1)
        names = list(SETUPS)
        for turn, prompt in enumerate(prompts):
            for name in names[turn % 3 :] + names[: turn % 3]:
                times[name].append(servers[name].complete(prompt, max_tokens=1).elapsed_s)
            print(f"prompt {turn + 1}: " + ", ".join(f"{n} {times[n][-1]:.3f}" for n in names))
    base = statistics.median(times["none, no AMX request"])
    shape = f"{args.layers} layers, hidden {args.hidden}"
    print(f"model: {shape}; {args.prompts} x {args.tokens} tokens")
    print("| setup | median cold TTFT (s) | vs none, no AMX request |")
    print("|---|---|---|")
    for name, taken in times.items():
        median = statistics.median(taken)
        print(f"| {name} | {median:.3f} | {base / median:.2f}x faster |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
