"""The operator's host (#37 item 5), two network namespaces as hosts: a node with a real CPU vLLM
(KV events on) behind an edge built with `edge start --inbound` (its API and both feeds, mutual
TLS), and the operator with a fleet file in the contract's shape. `fleet status` sees the
instance up and its feed live (read through the operator's own edge); `fleet where` predicts
what vLLM then reports; `fleet effectiveness` reads what its cache paid; a fleet file whose
tls_dir is another CA's gets a named certificate failure. Skipped when not root (CI runs as
root)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.fleet_tls import make_fleet_tls, require_haproxy
from tests.support.netns import Host, require_netns, two_hosts
from tests.support.vllm import require_vllm_venv

CLI = (sys.executable, "-m", "graph_kvcache_mcp")
REPO = Path(__file__).resolve().parents[3]
API_PORT, FEED_PORT, REPLAY_PORT = 18100, 18101, 18102  # the node's edge (contract: P, P+1, P+2)
VLLM_FEED, VLLM_REPLAY = 15557, 15558  # where vLLM itself binds its feeds (inside the node)
PROMPT = " ".join(f"across hosts the operator reads node cache line {i}." for i in range(40))

# The node's vLLM, run inside the node's namespace until its stdin closes (then stopped).
_NODE_VLLM = """
import json, sys
from pathlib import Path
from tests.support.vllm import running_vllm
data_dir, feed, replay = sys.argv[1:]
with running_vllm(
    Path(data_dir),
    kv_events=True,
    kv_events_endpoint=f"tcp://*:{feed}",
    kv_events_replay_endpoint=f"tcp://*:{replay}",
) as server:
    print(json.dumps({"port": server.port, "model": server.model}), flush=True)
    sys.stdin.read()
"""

# A prompt sent to vLLM on the node's loopback: what vLLM reports as cached for it.
_SEND = """
import sys, httpx2
port, model, prompt = sys.argv[1:]
body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0}
answer = httpx2.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=300).json()
details = answer["usage"].get("prompt_tokens_details") or {}
print(details.get("cached_tokens") or 0)
"""


def test_the_operator_reads_a_node_across_hosts_with_mutual_tls(tmp_path: Path) -> None:
    require_netns()
    require_haproxy()
    require_vllm_venv()
    with two_hosts() as (operator, node):
        tls = make_fleet_tls(tmp_path / "tls", operator.address, node.address)
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        env.pop("VLLM_API_KEY", None)  # the node's vLLM runs without a key: any bearer passes
        op_env = {**env, "VLLM_API_KEY": "operator-test-key"}  # what the fleet file names
        node_dir, op_dir, rogue_dir = (tmp_path / n for n in ("node", "operator", "rogue"))
        vllm = _start_node_vllm(node, node_dir / "vllm", env)
        try:
            assert vllm.stdout is not None
            started = vllm.stdout.readline()
            assert started, "the node's vLLM did not start (its helper exited)"
            port = int(json.loads(started)["port"])
            _cli(
                node,
                *("edge", "start", "--data-dir", node_dir, "--tls-dir", tls.node),
                *("--inbound", f"http:{node.address}:{API_PORT}>{port}"),
                *("--inbound", f"tcp:{node.address}:{FEED_PORT}>{VLLM_FEED}"),
                *("--inbound", f"tcp:{node.address}:{REPLAY_PORT}>{VLLM_REPLAY}"),
                env=env,
            )
            first = _send(node, port, env)
            fleet_file = _fleet_file(tmp_path / "fleet.json", node.address, tls.store)

            status = _cli(
                operator, "fleet", "status", "--fleet", fleet_file, "--data-dir", op_dir, env=op_env
            )
            (facts,) = status["instances"]
            assert facts["reachable"], facts
            assert facts["feed"]["state"] == "live", facts["feed"]

            where = _cli(
                operator,
                *("fleet", "where", "--prompt", PROMPT, "--fleet", fleet_file),
                *("--data-dir", op_dir),
                env=op_env,
            )
            (predicted,) = where["instances"]
            reported = _send(node, port, env)
            assert predicted["cached_tokens"] == reported > first

            # What the node's prefix cache paid since it started, read across hosts too.
            paid = _cli(
                operator,
                *("fleet", "effectiveness", "--fleet", fleet_file, "--data-dir", op_dir),
                env=op_env,
            )
            (effect,) = paid["instances"]
            assert effect["reachable"] and effect["split"]["local_cache"] >= reported, effect

            # Another CA's certificate: named as a certificate failure, not an empty answer.
            _stop_edge(operator, op_dir, env)
            rogue_file = _fleet_file(tmp_path / "rogue.json", node.address, tls.rogue)
            rogue_argv = ("fleet", "status", "--fleet", str(rogue_file), "--json")
            done = operator.run(
                [*CLI, *rogue_argv, "--data-dir", str(rogue_dir)],
                env=op_env,
                check=False,
            )
            assert done.returncode == 3, done.stderr + done.stdout
            (refused,) = json.loads(done.stdout)["instances"]
            assert not refused["reachable"]
            assert "certificate verify failed" in refused["reason"], refused["reason"]
        finally:
            for host, data_dir in ((operator, rogue_dir), (operator, op_dir), (node, node_dir)):
                _stop_edge(host, data_dir, env)
            if vllm.stdin is not None:
                vllm.stdin.close()  # the helper stops its vLLM and exits
            vllm.wait(timeout=120)


def _start_node_vllm(node: Host, data_dir: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    argv = ["ip", "netns", "exec", node.namespace, sys.executable, "-c", _NODE_VLLM]
    return subprocess.Popen(
        [*argv, str(data_dir), str(VLLM_FEED), str(VLLM_REPLAY)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )


def _send(node: Host, port: int, env: dict[str, str]) -> int:
    done = node.run([sys.executable, "-c", _SEND, str(port), "tiny-llama", PROMPT], env=env)
    return int(done.stdout.strip())


def _fleet_file(path: Path, address: str, tls_dir: Path) -> Path:
    # The contract's fleet_entry as a node prints it (no lmcache server on this node).
    entry = {
        "name": "node",
        "tls_name": "node",
        "base_url": f"https://{address}:{API_PORT}/v1",
        "api_key_env": "VLLM_API_KEY",
        "kv_events": f"tls://{address}:{FEED_PORT}",
        "kv_events_replay": f"tls://{address}:{REPLAY_PORT}",
    }
    path.write_text(json.dumps({"tls_dir": str(tls_dir), "instances": [entry]}))
    return path


def _stop_edge(host: Host, data_dir: Path, env: dict[str, str]) -> None:
    host.run([*CLI, "edge", "stop", "--data-dir", str(data_dir)], env=env, check=False)


def _cli(host: Host, *args: object, env: dict[str, str]) -> dict[str, Any]:
    done = host.run([*CLI, *(str(a) for a in args), "--json"], env=env, check=False)
    assert done.returncode == 0, done.stderr + done.stdout
    result: dict[str, Any] = json.loads(done.stdout)
    return result
