"""The fleet across hosts end to end (issue #37's tests): a store, two nodes and the operator as
network namespaces on one bridge, set up with the product's own commands only (`fleet pki`,
`engine start --listen`, `lmcache coordinator start --listen --node`, `vllm start --engine-url
https://... --coordinator https://... --listen ... --kv-events`, a fleet file made of the nodes'
`fleet_entry`s as printed, `fleet where`, `cache warm`), a real CPU vLLM and `lmcache server` per
node. One test, in the order a user meets it: node 2 served node 1's prompt from the engine; a
warm from the operator lands in node 2's L1 with the engine untouched; `fleet where` equals what
each node's vLLM then reports; every edge port refuses a client without a fleet certificate;
the bridge never carried the engine token, the API key or the prompts' text; the store's edge
killed mid-traffic leaves the nodes serving (misses) and `engine start --listen` with
`lmcache coordinator start --listen` bring it back. Skipped when not root (CI runs as root)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.capture import capture_on, send_canary
from tests.support.fleet_tls import require_haproxy
from tests.support.lmcache import require_lmcache
from tests.support.mp_stack import CHUNK_SIZE, require_lmcache_in_vllm_venv
from tests.support.netns import CLI, Host, hosts_on_bridge, processes_left, require_netns
from tests.support.vllm import (
    MODEL_NAME,
    READY_TIMEOUT_S,
    offline_environment,
    require_vllm_venv,
    tiny_vllm_start_flags,
)

pytestmark = [pytest.mark.vllm, pytest.mark.lmcache]

REPO = Path(__file__).resolve().parents[3]
HOSTS = ("store", "node-1", "node-2", "operator")  # each host's name in its certificate
ENGINE_EDGE, COORDINATOR_EDGE = 9443, 9444
NODE_PORT = 8443  # P: vLLM's API; P+1 feed, P+2 replay, P+3 the lmcache server's admin
API_KEY = "e2e-api-key-" + os.urandom(8).hex()
MARKER = "QUOKKAMARMALADE"  # in every prompt: what a capture of clear text would show
ENV = {k: v for k, v in os.environ.items() if not k.startswith(("EPISTEMIC_", "VLLM_API"))}
ENV["PYTHONPATH"] = str(REPO)
ENGINE_BOUND_S = 120.0  # the servers store after the request; a bound, not a race


def prompt(seed: str) -> str:
    """A text prompt of three LMCache chunks and some (about 820 tokens), distinct per seed,
    with the marker."""
    return " ".join(f"{MARKER}{seed}{i % 89} fleet" for i in range(50))


# Run in the operator's namespace: one completion through a node's edge with only the CA; prints
# the HTTP status and vLLM's cached tokens (0 when refused).
_SEND = """
import json, ssl, sys, urllib.error, urllib.request
from pathlib import Path
ca_dir, url, key, model, text = sys.argv[1:]
context = ssl.create_default_context(cafile=str(Path(ca_dir) / "ca.pem"))
body = json.dumps({"model": model, "prompt": text, "max_tokens": 1, "temperature": 0}).encode()
headers = {"Content-Type": "application/json"}
if key:
    headers["Authorization"] = f"Bearer {key}"
request = urllib.request.Request(url + "/completions", data=body, headers=headers)
try:
    with urllib.request.urlopen(request, context=context, timeout=300) as answer:
        usage = json.load(answer)["usage"]
        print(answer.status, (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
except urllib.error.HTTPError as exc:
    print(exc.read()[:500], file=sys.stderr)
    print(exc.code, 0)
"""

# Run in the operator's namespace: each HOST:PORT with a client that has the CA but no
# certificate; prints "HOST:PORT refused" or "HOST:PORT answered".
_PROBE = """
import sys
from pathlib import Path
from tests.support.fleet_tls import client_context, refused
no_certificate = client_context(None, Path(sys.argv[1]))
for target in sys.argv[2:]:
    host, port = target.rsplit(":", 1)
    said = "refused" if refused(int(port), no_certificate, host) else "answered"
    print(target, said)
"""


def test_a_store_two_nodes_and_the_operator_across_hosts(tmp_path: Path) -> None:
    require_netns()
    require_haproxy()
    require_vllm_venv()
    require_lmcache_in_vllm_venv()
    lmcache_python = require_lmcache().parent / "python"
    started_at = time.monotonic()
    with hosts_on_bridge(*HOSTS) as bridged:
        store, node_1, node_2, operator = bridged.hosts
        nodes = {"node-1": node_1, "node-2": node_2}
        dirs = {name: tmp_path / name for name in HOSTS}
        tls = _pki(store, tmp_path, dict(zip(HOSTS, bridged.hosts, strict=True)))
        try:
            engine = _cli(
                store,
                *("engine", "start", "--data-dir", dirs["store"]),
                *("--listen", f"{store.address}:{ENGINE_EDGE}", "--tls-dir", tls["store"]),
            )
            coordinator_listen = (
                *("--listen", f"{store.address}:{COORDINATOR_EDGE}"),
                *("--tls-dir", tls["store"], "--python", lmcache_python),
            )
            coordinator = _cli(
                store,
                *("lmcache", "coordinator", "start", "--data-dir", dirs["store"]),
                *coordinator_listen,
            )
            token_file = Path(engine["join"]["token_file"])
            token = token_file.read_text().strip()
            joined = _join_nodes(
                nodes, tmp_path, token_file, engine["join"], coordinator["join"], tls
            )
            node_flags = [f"--node={joined[name]['coordinator_node']}" for name in nodes]
            _cli(
                store,
                *("lmcache", "coordinator", "start", "--data-dir", dirs["store"]),
                *coordinator_listen,
                *node_flags,
            )
            fleet = tmp_path / "fleet.json"
            fleet.write_text(
                json.dumps(
                    {
                        "tls_dir": str(tls["operator"]),
                        "instances": [joined[name]["fleet_entry"] for name in nodes],
                        "engine_url": engine["join"]["engine_url"],
                        "engine_token_env": "KV_TOKEN",
                        "coordinator_url": coordinator["join"]["coordinator_url"],
                    }
                )
            )
            op = Operator(operator, fleet, dirs["operator"], tls["operator"], token)
            urls = {name: joined[name]["fleet_entry"]["base_url"] for name in nodes}

            with capture_on(bridged.bridge) as seen:
                canary = send_canary(node_1, operator)

                # Node 2 serves node 1's prompt from the engine.
                first = prompt("a")
                assert op.send(urls["node-1"], first)[0] == 200
                whole = op.wait_l2(first, "node-2")
                hits = _engine(store, dirs["store"])["get_hits"]
                status, cached = op.send(urls["node-2"], first)
                assert status == 200 and cached >= whole, (cached, whole)
                assert _engine(store, dirs["store"])["get_hits"] > hits

                # A warm from the operator lands in node 2's L1; the engine is untouched after.
                second = prompt("b")
                assert op.send(urls["node-1"], second)[0] == 200
                whole = op.wait_l2(second, "node-2")
                warmed = op.cli("cache", "warm", "--instance", "node-2", "--prompt", second)
                assert (warmed["done"], warmed["found"]) == (True, whole // CHUNK_SIZE), warmed
                predicted = op.where_until(second, "node-2", "l1", whole)
                engine_after_warm = _engine(store, dirs["store"])
                status, cached = op.send(urls["node-2"], second)
                assert status == 200 and cached == predicted["node-2"]["cached_tokens"] > 0
                assert _engine(store, dirs["store"]) == engine_after_warm  # served from L1
                # `fleet where` was exact on node 1 too (its own prefix cache).
                status, cached = op.send(urls["node-1"], second)
                assert status == 200 and cached == predicted["node-1"]["cached_tokens"] > 0

                # The vLLM reads on a node by its URL alone (a configured target), with the
                # fleet CA and the key: its status, and why a request would miss its cache.
                across = {**op.env, "SSL_CERT_FILE": str(tls["operator"] / "ca.pem")}
                here = ("--base-url", urls["node-2"], "--data-dir", dirs["operator"])
                seen_status = _cli(operator, "vllm", "status", *here, env=across)
                assert (seen_status["reachable"], seen_status["managed_by_us"]) == (True, False)
                body = tmp_path / "chat.json"
                body.write_text(json.dumps({"messages": [{"role": "user", "content": second}]}))
                why = _cli(
                    operator,
                    "diagnose",
                    "miss",
                    "--first",
                    body,
                    "--second",
                    body,
                    *here,
                    env=across,
                )
                assert why["reachable"] is True, why

                # No fleet certificate: refused at every edge port of every host; vLLM's API
                # takes the CA alone but needs the key.
                ports = [f"{store.address}:{p}" for p in (ENGINE_EDGE, COORDINATOR_EDGE)]
                ports += [f"{h.address}:{NODE_PORT + k}" for h in nodes.values() for k in (1, 2, 3)]
                probes = op.host.run([sys.executable, "-c", _PROBE, str(tls["none"]), *ports])
                assert probes.stdout.split() == [w for p in ports for w in (p, "refused")]
                for url in urls.values():
                    assert op.send(url, second, key="") == (401, 0)

                # The store's edge killed mid-traffic (a request to node 1 in flight; it must
                # answer whether it crossed before or after): the nodes keep answering, misses.
                edge = _cli(store, "edge", "status", "--data-dir", dirs["store"])
                third = prompt("c")
                in_flight = op.send_later(urls["node-1"], third)
                os.kill(int(edge["pid"]), signal.SIGKILL)
                assert op.answer_of(in_flight)[0] == 200
                store_ports = [
                    f"{store.address}:{ENGINE_EDGE}",
                    f"{store.address}:{COORDINATOR_EDGE}",
                ]
                assert not any(op.host.connects(store_ports)), "the store's edge outlived SIGKILL"
                assert (
                    _cli(store, "engine", "status", "--data-dir", dirs["store"])["published"]
                    is None
                )
                gone = store.run(
                    [*CLI, "edge", "status", "--data-dir", str(dirs["store"]), "--json"],
                    env=ENV,
                    check=False,
                )
                reason = json.loads(gone.stdout)["reason"]  # what it carried, to run again
                assert gone.returncode == 3 and "is gone without `edge stop`" in reason, reason
                assert f"{store.address}:{COORDINATOR_EDGE}>" in reason, reason
                assert op.send(urls["node-2"], third) == (200, 0)  # an L2 miss, not an error

                # What the user runs to bring the store back: the two publishing commands.
                _cli(
                    store,
                    *("engine", "start", "--data-dir", dirs["store"]),
                    *("--listen", f"{store.address}:{ENGINE_EDGE}", "--tls-dir", tls["store"]),
                )
                _cli(
                    store,
                    *("lmcache", "coordinator", "start", "--data-dir", dirs["store"]),
                    *coordinator_listen,
                    *node_flags,
                )
                fourth = prompt("d")
                assert op.send(urls["node-1"], fourth)[0] == 200
                whole = op.wait_l2(fourth, "node-2")
                status, cached = op.send(urls["node-2"], fourth)
                assert status == 200 and cached >= whole, (cached, whole)
                # and the coordinator's routes: the operator's warm, carried by a callback
                warmed = op.cli("cache", "warm", "--instance", "node-1", "--prompt", fourth)
                assert (warmed["done"], warmed["found"]) == (True, whole // CHUNK_SIZE), warmed

            assert seen.holds(canary.encode()), "the capture saw nothing of the traffic"
            assert len(seen.data) > 1_000_000, len(seen.data)
            for secret in (token, API_KEY, f"{MARKER}a1 fleet", f"{MARKER}b1 fleet"):
                assert not seen.holds(secret.encode()), "crossed the bridge in clear"
        finally:
            _stop_everything(store, nodes, operator, dirs)
        for host in bridged.hosts:
            assert processes_left(host) == [], host
    print(f"wall time {time.monotonic() - started_at:.0f} s")


class Operator:
    """The operator's host: its fleet file, data dir and TLS dir, and the engine token in the
    environment the fleet file names."""

    def __init__(self, host: Host, fleet: Path, data_dir: Path, tls: Path, token: str) -> None:
        self.host, self.fleet, self.data_dir, self.tls = host, fleet, data_dir, tls
        self.env = {**ENV, "VLLM_API_KEY": API_KEY, "KV_TOKEN": token}

    def cli(self, *args: object) -> dict[str, Any]:
        return _cli(
            self.host, *args, "--fleet", self.fleet, "--data-dir", self.data_dir, env=self.env
        )

    def send(self, url: str, text: str, *, key: str = API_KEY) -> tuple[int, int]:
        """One completion through a node's edge: (HTTP status, vLLM's cached tokens)."""
        return self.answer_of(self.send_later(url, text, key=key))

    def send_later(self, url: str, text: str, *, key: str = API_KEY) -> subprocess.Popen[str]:
        argv = [sys.executable, "-c", _SEND, str(self.tls), url, key, MODEL_NAME, text]
        return self.host.spawn(argv, env=ENV)

    @staticmethod
    def answer_of(sent: subprocess.Popen[str]) -> tuple[int, int]:
        out, err = sent.communicate(timeout=330)
        status, cached = out.split()
        assert status in ("200", "401"), err[-1000:]
        return int(status), int(cached)

    def where(self, text: str) -> dict[str, dict[str, Any]]:
        out = self.cli("fleet", "where", "--prompt", text)
        return {i["name"]: i for i in out["instances"]}

    def where_until(self, text: str, name: str, tier: str, tokens: int) -> dict[str, Any]:
        """`fleet where` once `name`'s `tier` holds `tokens` of `text` (the servers report
        their stores about every second; bounded)."""
        deadline = time.monotonic() + ENGINE_BOUND_S
        while True:
            seen = self.where(text)
            held = seen[name]["tiers"].get(tier, {}).get("tokens")
            if held == tokens or time.monotonic() > deadline:
                assert held == tokens, seen[name]
                return seen
            time.sleep(1.0)

    def wait_l2(self, text: str, name: str) -> int:
        """The prompt's whole chunks, once `name` sees all of them in the engine (L2)."""
        tokens = self.where(text)[name]["prompt_tokens"]
        whole = int(tokens) // CHUNK_SIZE * CHUNK_SIZE
        assert whole >= 2 * CHUNK_SIZE, tokens
        self.where_until(text, name, "l2", whole)
        return whole


def _pki(store: Host, root: Path, hosts: dict[str, Host]) -> dict[str, Path]:
    """The fleet's CA and one TLS dir per host (its name in the certificate), with `fleet pki`;
    "none" is a directory holding only the CA, for a client without a certificate."""
    pki = root / "pki"
    _cli(store, "fleet", "pki", "init", "--dir", pki)
    dirs = {}
    for name, host in hosts.items():
        dirs[name] = root / "tls" / name
        _cli(
            store,
            *("fleet", "pki", "issue", "--dir", pki, "--name", name),
            *("--ip", host.address, "--out", dirs[name]),
        )
    dirs["none"] = root / "tls" / "none"
    dirs["none"].mkdir(mode=0o700)
    shutil.copyfile(pki / "ca.pem", dirs["none"] / "ca.pem")
    return dirs


def _join_nodes(
    nodes: dict[str, Host],
    root: Path,
    token_file: Path,
    engine_join: dict[str, Any],
    coordinator_join: dict[str, Any],
    tls: dict[str, Path],
) -> dict[str, dict[str, Any]]:
    """Both nodes' `vllm start`, at once (each its own vLLM and lmcache server, distinct shm
    names through distinct lmcache ports); their `--json` results."""
    starts = {}
    for index, (name, host) in enumerate(nodes.items()):
        secrets_dir = root / f"{name}-secrets"
        secrets_dir.mkdir(mode=0o700)
        copy = secrets_dir / "engine-token"
        shutil.copyfile(token_file, copy)
        copy.chmod(0o600)
        env = {
            **ENV,
            **offline_environment(root / f"{name}-vllm-cache"),
            "GRAPH_KVCACHE_VLLM_PYTHON": str(require_vllm_venv()),
            "VLLM_API_KEY": API_KEY,
        }
        argv = [
            *CLI,
            *("vllm", "start", *tiny_vllm_start_flags(), "--port", "8000", "--kv-events"),
            *("--kv-connector", "mp_native", "--lmcache-port", str(15555 + index)),
            *("--engine-url", engine_join["engine_url"], "--engine-token-file", str(copy)),
            *("--store-name", engine_join["tls_name"]),
            *("--coordinator", coordinator_join["coordinator_url"]),
            *("--tls-dir", str(tls[name]), "--listen", f"{host.address}:{NODE_PORT}"),
            *("--data-dir", str(root / name), "--ready-timeout-s", str(READY_TIMEOUT_S)),
            "--json",
        ]
        starts[name] = host.spawn(argv, env=env)
    results = {}
    for name, process in starts.items():
        out, err = process.communicate(timeout=READY_TIMEOUT_S + 180)
        assert process.returncode == 0, err[-3000:] + out[-2000:]
        assert API_KEY not in out + err
        results[name] = json.loads(out)
    return results


def _engine(store: Host, data_dir: Path) -> dict[str, Any]:
    """The engine's counters (the durable backend counts GETs)."""
    stats: dict[str, Any] = _cli(store, "kv", "stats", "--data-dir", data_dir)["engine"]
    return {k: stats[k] for k in ("get_hits", "get_misses", "unique_blocks", "put_new")}


def _stop_everything(
    store: Host, nodes: dict[str, Host], operator: Host, dirs: dict[str, Path]
) -> None:
    verbs = [
        *((host, name, verb) for name, host in nodes.items() for verb in ("vllm", "lmcache")),
        *((host, name, "edge") for name, host in nodes.items()),
        (store, "store", "lmcache coordinator"),
        (store, "store", "engine"),
        (store, "store", "edge"),
        (operator, "operator", "edge"),
    ]
    for host, name, verb in verbs:
        argv = [*CLI, *verb.split(), "stop", "--data-dir", str(dirs[name])]
        host.run(argv, env=ENV, check=False, timeout_s=120)


def _cli(host: Host, *args: object, env: dict[str, str] | None = None) -> dict[str, Any]:
    done = host.run([*CLI, *(str(a) for a in args), "--json"], env=env or ENV, check=False)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result
