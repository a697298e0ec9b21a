"""The store host in a network namespace of its own (real engine, real haproxy, real `lmcache
coordinator` from .venv-lmcache): `engine start --listen` and `lmcache coordinator start --listen
--node` publish both on one edge; from the node's namespace a client with a fleet certificate
reaches `/kv` byte-exact and the coordinator, one without is refused at both ports; the
coordinator's callback route reaches the node; the stops leave nothing running. Skipped when not
root (CI runs as root)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.fleet_tls import make_fleet_tls, require_haproxy
from tests.support.lmcache import require_lmcache
from tests.support.netns import Host, processes_left, require_netns, two_hosts

pytestmark = pytest.mark.lmcache

CLI = (sys.executable, "-m", "graph_kvcache_mcp")
REPO = Path(__file__).resolve().parents[3]
ENGINE_EDGE, COORDINATOR_EDGE, NODE_ADMIN = 9443, 9444, 9560
NODE_ENGINE, NODE_COORDINATOR, STAND_IN = 19130, 19300, 18081

# A STAND-IN for the node's lmcache server admin HTTP (the real one is the node side's test):
# answers every GET with a body naming itself, so the store's callback is seen to arrive.
_STAND_IN = """
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"stand-in lmcache server: " + self.path.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""

# Inside the node's namespace: the coordinator through the node's edge; then the store's two
# ports directly, with the fleet certificate and with none.
_PROBES = """
import sys, urllib.request
from pathlib import Path
from typing import Any
from tests.support.fleet_tls import client_context, refused
fleet, host, local_coordinator, *ports = sys.argv[1:]
with urllib.request.urlopen(f"http://127.0.0.1:{local_coordinator}/instances", timeout=30) as r:
    print("instances", r.status, "instances" in r.read().decode())
for port in ports:
    print(port, "fleet", refused(int(port), client_context(Path(fleet), Path(fleet)), host) is None)
    print(port, "none", refused(int(port), client_context(None, Path(fleet)), host) is None)
"""

_CALLBACK = """
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=30) as reply:
    print(reply.read().decode())
"""


def test_the_store_host_publishes_engine_and_coordinator_on_one_edge(tmp_path: Path) -> None:
    require_netns()
    require_haproxy()
    python = require_lmcache().parent / "python"
    value = os.urandom(1024 * 1024 + 5)
    (tmp_path / "value").write_bytes(value)
    with two_hosts() as (store, node):
        tls = make_fleet_tls(tmp_path / "tls", store.address, node.address)
        store_dir, node_dir = tmp_path / "store", tmp_path / "node"
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        stand_in = subprocess.Popen(
            ["ip", "netns", "exec", node.namespace, sys.executable, "-c", _STAND_IN, str(STAND_IN)]
        )
        try:
            engine = _cli(
                store,
                *("engine", "start", "--backend", "memory", "--data-dir", store_dir),
                *("--listen", f"{store.address}:{ENGINE_EDGE}", "--tls-dir", tls.store),
            )
            join = engine["join"]
            assert join["engine_url"] == f"https://{store.address}:{ENGINE_EDGE}"
            assert join["tls_name"] == "store" and len(join["ca_sha256"]) == 64
            assert "coordinator_url" not in join
            assert Path(join["token_file"]).is_file()

            node_tail = f"{'.'.join(node.address.split('.')[1:])}"
            coordinator = _cli(
                store,
                *("lmcache", "coordinator", "start", "--data-dir", store_dir, "--python", python),
                *("--listen", f"{store.address}:{COORDINATOR_EDGE}", "--tls-dir", tls.store),
                *("--node", f"node@{node.address}:{NODE_ADMIN}"),
            )
            assert coordinator["edge_restarted"] is True  # the engine's edge gained routes
            assert coordinator["runs_until_stop"] is True
            assert coordinator["nodes"] == [f"node@{node.address}:{NODE_ADMIN}"]
            assert coordinator["join"] == {
                "coordinator_url": f"https://{store.address}:{COORDINATOR_EDGE}",
                "tls_name": "store",
                "ca_sha256": join["ca_sha256"],
            }
            status = _cli(store, "engine", "status", "--data-dir", store_dir)
            assert status["published"] == f"{store.address}:{ENGINE_EDGE}"
            assert status["join"] == join
            again = _cli(
                store,
                *("engine", "start", "--data-dir", store_dir),
                *("--listen", f"{store.address}:{ENGINE_EDGE}", "--tls-dir", tls.store),
            )
            assert (again["reused"], again["edge_restarted"]) == (True, False)
            taken = store.run(
                [
                    *(*CLI, "engine", "start", "--data-dir", str(store_dir), "--json"),
                    *(
                        "--listen",
                        f"{store.address}:{COORDINATOR_EDGE}",
                        "--tls-dir",
                        str(tls.store),
                    ),
                ],
                env=env,
                check=False,
            )
            assert taken.returncode == 2
            assert "the edge already carries" in json.loads(taken.stdout)["error"]
            more = _cli(
                store,
                *("lmcache", "coordinator", "start", "--data-dir", store_dir, "--python", python),
                *("--tls-dir", tls.store, "--node", f"node-b@10.9.8.7:{NODE_ADMIN}"),
            )
            assert (more["reused"], more["edge_restarted"], more["pid"]) == (
                True,
                True,
                coordinator["pid"],
            )
            assert more["nodes"] == [
                f"node@{node.address}:{NODE_ADMIN}",
                f"node-b@10.9.8.7:{NODE_ADMIN}",
            ]

            _cli(
                node,
                *("edge", "start", "--data-dir", node_dir, "--tls-dir", tls.node),
                *("--outbound", f"http:{NODE_ENGINE}>{store.address}:{ENGINE_EDGE}@store"),
                *(
                    "--outbound",
                    f"http:{NODE_COORDINATOR}>{store.address}:{COORDINATOR_EDGE}@store",
                ),
                *("--inbound", f"http:{node.address}:{NODE_ADMIN}>{STAND_IN}"),
            )
            kv_env = {**env, "EPISTEMIC_GRAPH_KVCACHE_TOKEN_FILE": join["token_file"]}
            url = ("--url", f"http://127.0.0.1:{NODE_ENGINE}")
            _cli(node, "kv", "put", "store/value", tmp_path / "value", *url, env=kv_env)
            _cli(node, "kv", "get", "store/value", "-o", tmp_path / "back", *url, env=kv_env)
            assert (tmp_path / "back").read_bytes() == value

            probes = node.run(
                [
                    *(sys.executable, "-c", _PROBES, str(tls.node), store.address),
                    *(str(NODE_COORDINATOR), str(ENGINE_EDGE), str(COORDINATOR_EDGE)),
                ],
                env=env,
            )
            assert probes.stdout.split("\n")[:5] == [
                "instances 200 True",
                f"{ENGINE_EDGE} fleet True",
                f"{ENGINE_EDGE} none False",
                f"{COORDINATOR_EDGE} fleet True",
                f"{COORDINATOR_EDGE} none False",
            ], probes.stderr

            callback = f"http://127.{node_tail}:{NODE_ADMIN}/cache/prefetches"
            reached = store.run([sys.executable, "-c", _CALLBACK, callback], env=env)
            assert reached.stdout.strip() == "stand-in lmcache server: /cache/prefetches"

            stopped = _cli(store, "engine", "stop", "--data-dir", store_dir)
            assert stopped["stopped"] and "restarted" in stopped["edge"]
            stopped = _cli(store, "lmcache", "coordinator", "stop", "--data-dir", store_dir)
            assert stopped["stopped"] and "edge stopped" in stopped["edge"]
        finally:
            for verb in (("engine",), ("lmcache", "coordinator"), ("edge",)):
                store.run([*CLI, *verb, "stop", "--data-dir", str(store_dir)], check=False)
            node.run([*CLI, "edge", "stop", "--data-dir", str(node_dir)], check=False)
            stand_in.terminate()
            stand_in.wait(timeout=30)
        assert processes_left(store) == []


def _cli(host: Host, *args: object, env: dict[str, str] | None = None) -> dict[str, Any]:
    run_env = env or {**os.environ, "PYTHONPATH": str(REPO)}
    done = host.run([*CLI, *(str(a) for a in args), "--json"], env=run_env, check=False)
    assert done.returncode == 0, done.stderr + done.stdout
    result: dict[str, Any] = json.loads(done.stdout)
    return result
