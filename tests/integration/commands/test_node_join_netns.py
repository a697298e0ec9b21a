"""A node joins a store host (issue #37 item 4), two network namespaces standing in for hosts.

The store: the real engine on loopback and its edge (`edge start --inbound` to the engine, and
an outbound route to the node's KV-event feed, as the store reads it). The node: a real CPU
vLLM with `EngineKVConnector`, started by `vllm start --engine-url https://S:9443 --listen N:P
--tls-dir ...` alone. A prompt sent from the store host through the node's edge lands in the
store's engine; a client with only the CA gets an answer with the API key and 401 without it; a
client with no fleet certificate is refused at the feed ports; the feed itself reaches the store
through both edges; the stops leave nothing running. Skipped when not root (CI runs as root).
An mp_native node joining the store's coordinator, called back through both edges, is proved
with the product's own store commands in `tests/integration/fleet/test_fleet_hosts_end_to_end.py`.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.fleet_tls import make_fleet_tls, require_haproxy
from tests.support.netns import Host, require_netns, two_hosts
from tests.support.vllm import (
    BLOCK_SIZE,
    MODEL_NAME,
    READY_TIMEOUT_S,
    offline_environment,
    require_vllm_venv,
    tiny_vllm_start_flags,
)

pytestmark = pytest.mark.vllm

CLI = (sys.executable, "-m", "graph_kvcache_mcp")
REPO = Path(__file__).resolve().parents[3]
ENGINE_EDGE_PORT = 9443
NODE_PORT = 8443  # P: vLLM's API; P+1 feed, P+2 replay
VLLM_PORT = 8000  # vLLM on the node's loopback
STORE_FEED_PORT = 15557  # the store's loopback side of the node's feed
API_KEY = "node-api-key-" + os.urandom(8).hex()
PROMPT = [(7 * i) % 3000 + 5 for i in range(4 * BLOCK_SIZE + 3)]  # four full blocks
ENV = {k: v for k, v in os.environ.items() if k != "EPISTEMIC_GRAPH_KVCACHE_URL"}
ENV["PYTHONPATH"] = str(REPO)

# Run on the store host: a ZMQ subscriber on the store edge's loopback side of the node's feed;
# prints the topic of the first event it gets (or "none" after the bound).
_SUBSCRIBER = """
import sys, zmq
socket = zmq.Context().socket(zmq.SUB)
socket.setsockopt(zmq.SUBSCRIBE, b"")
socket.setsockopt(zmq.RCVTIMEO, int(float(sys.argv[2]) * 1000))
socket.connect(f"tcp://127.0.0.1:{sys.argv[1]}")
print("ready", flush=True)
try:
    print("event", socket.recv_multipart()[0].decode(errors="replace"), flush=True)
except zmq.Again:
    print("none", flush=True)
"""

# Run on the store host: vLLM's API through the node's edge with only the CA (no client
# certificate), with the key and without; then the feed ports with no client certificate.
_CLIENTS = """
import json, ssl, sys, urllib.error, urllib.request
from pathlib import Path
from tests.support.fleet_tls import client_context, refused
ca_dir, host, port, key, model, prompt = sys.argv[1:]
context = ssl.create_default_context(cafile=str(Path(ca_dir) / "ca.pem"))  # checks the name too
body = json.dumps({"model": model, "prompt": json.loads(prompt), "max_tokens": 2}).encode()
for header in ({"Authorization": f"Bearer {key}"}, {}):
    request = urllib.request.Request(
        f"https://{host}:{port}/v1/completions",
        data=body,
        headers={"Content-Type": "application/json", **header},
    )
    try:
        with urllib.request.urlopen(request, context=context, timeout=120) as answer:
            print(answer.status, len(json.load(answer)["choices"]))
    except urllib.error.HTTPError as exc:
        print(exc.code, 0)
no_certificate = client_context(None, Path(ca_dir))
for offset in (1, 2):
    print("feed", offset, refused(int(port) + offset, no_certificate, host) is not None)
"""


def test_a_node_joins_the_store_through_its_edge_and_publishes_vllm(tmp_path: Path) -> None:
    require_netns()
    require_haproxy()
    require_vllm_venv()
    with two_hosts() as (store, node):
        tls = make_fleet_tls(tmp_path / "tls", store.address, node.address)
        store_dir, node_dir = tmp_path / "store", tmp_path / "node"
        try:
            engine = _cli(store, "engine", "start", "--backend", "memory", "--data-dir", store_dir)
            _cli(
                store,
                *("edge", "start", "--data-dir", store_dir, "--tls-dir", tls.store),
                *("--inbound", f"http:{store.address}:{ENGINE_EDGE_PORT}>{engine['port']}"),
                *("--outbound", f"tcp:{STORE_FEED_PORT}>{node.address}:{NODE_PORT + 1}@node"),
            )
            out = _start_node(
                node,
                tmp_path,
                *("--kv-connector", "engine", "--kv-events"),
                *("--engine-url", f"https://{store.address}:{ENGINE_EDGE_PORT}"),
                *("--tls-dir", str(tls.node), "--listen", f"{node.address}:{NODE_PORT}"),
            )
            entry = out["fleet_entry"]
            assert entry == {
                "name": "node",
                "tls_name": "node",
                "base_url": f"https://{node.address}:{NODE_PORT}/v1",
                "api_key_env": "NODE_KEY",
                "kv_events": f"tls://{node.address}:{NODE_PORT + 1}",
                "kv_events_replay": f"tls://{node.address}:{NODE_PORT + 2}",
            }
            assert out["coordinator_node"] is None

            before = _unique_blocks(store, store_dir)
            subscriber = store.spawn(
                [sys.executable, "-c", _SUBSCRIBER, str(STORE_FEED_PORT), "120"], env=ENV
            )
            assert subscriber.stdout is not None and subscriber.stdout.readline() == "ready\n"
            time.sleep(2.0)  # the subscription crosses both edges before the first event
            clients = store.run(
                [
                    *(sys.executable, "-c", _CLIENTS, str(tls.store), node.address),
                    *(str(NODE_PORT), API_KEY, MODEL_NAME, json.dumps(PROMPT)),
                ],
                env=ENV,
                timeout_s=300,
            )
            assert clients.stdout.split("\n")[:4] == [
                "200 1",  # only the CA and the key: an answer
                "401 0",  # no key: refused by vLLM
                "feed 1 True",  # no fleet certificate: refused at the live feed
                "feed 2 True",  # and at the replay
            ], clients.stderr[-2000:]
            event, _ = subscriber.communicate(timeout=180)
            assert event.startswith("event"), event
            assert _wait_for_growth(store, store_dir, before) > before
        finally:
            _stop_all(((node, node_dir, "vllm"), (node, node_dir, "edge")), store, store_dir)
        assert _ours_running(tmp_path) == []


def test_a_join_whose_stack_fails_stops_the_edge_it_started(tmp_path: Path) -> None:
    require_netns()
    require_haproxy()
    with two_hosts() as (store, node):
        tls = make_fleet_tls(tmp_path / "tls", store.address, node.address)
        node_dir = tmp_path / "node"
        env = {**ENV, "VLLM_API_KEY": API_KEY, "GRAPH_KVCACHE_VLLM_PYTHON": sys.executable}
        try:
            done = node.run(
                [
                    *CLI,
                    *("vllm", "start", "--model", "m", "--kv-connector", "engine"),
                    *("--engine-url", f"https://{store.address}:{ENGINE_EDGE_PORT}"),
                    *("--store-name", "store", "--tls-dir", str(tls.node)),
                    *("--listen", f"{node.address}:{NODE_PORT}", "--data-dir", str(node_dir)),
                ],
                env=env,
                check=False,
            )
            # this test's python has no vLLM: the start fails after the edge came up
            assert done.returncode != 0
            assert "Traceback" not in done.stderr
            assert "vllm" in done.stderr.lower(), done.stderr[-2000:]
            status = node.run(
                [*CLI, "edge", "status", "--data-dir", str(node_dir), "--json"],
                env=ENV,
                check=False,
            )
            assert json.loads(status.stdout)["running"] is False
            assert "stopped the edge it started" in done.stderr
        finally:
            node.run([*CLI, "edge", "stop", "--data-dir", str(node_dir)], env=ENV, check=False)
        assert _ours_running(tmp_path) == []


def _start_node(node: Host, tmp_path: Path, *args: str) -> dict[str, Any]:
    """`vllm start` on the node with the store's token copied privately and the API key in
    NODE_KEY; its `--json` result. Neither secret may appear in its output."""
    token_file = tmp_path / "node-secrets" / "engine-token"
    token_file.parent.mkdir(mode=0o700)
    shutil.copyfile(tmp_path / "store" / "engine" / "token", token_file)
    token_file.chmod(0o600)
    node_env = {
        **ENV,
        **offline_environment(tmp_path / "vllm-cache"),
        "GRAPH_KVCACHE_VLLM_PYTHON": str(require_vllm_venv()),
        "NODE_KEY": API_KEY,
    }
    node_env.pop("VLLM_API_KEY", None)
    started = node.run(
        [
            *CLI,
            *("vllm", "start", *tiny_vllm_start_flags(), "--port", str(VLLM_PORT)),
            *("--engine-token-file", str(token_file), "--store-name", "store"),
            *("--api-key-env", "NODE_KEY", "--data-dir", str(tmp_path / "node")),
            *("--ready-timeout-s", str(READY_TIMEOUT_S), "--json"),
            *args,
        ],
        env=node_env,
        check=False,
        timeout_s=READY_TIMEOUT_S + 120,
    )
    assert started.returncode == 0, started.stderr[-3000:] + started.stdout[-2000:]
    said = started.stdout + started.stderr
    assert token_file.read_text().strip() not in said
    assert API_KEY not in said
    result: dict[str, Any] = json.loads(started.stdout)
    return result


def _stop_all(node_verbs: tuple[tuple[Host, Path, str], ...], store: Host, store_dir: Path) -> None:
    for host, data_dir, verb in (
        *node_verbs,
        (store, store_dir, "edge"),
        (store, store_dir, "engine"),
    ):
        host.run(
            [*CLI, verb, "stop", "--data-dir", str(data_dir)],
            env=ENV,
            check=False,
            timeout_s=120,
        )


def _cli(host: Host, *args: object) -> dict[str, object]:
    done = host.run([*CLI, *(str(a) for a in args), "--json"], env=ENV, check=False)
    assert done.returncode == 0, done.stderr + done.stdout
    result: dict[str, object] = json.loads(done.stdout)
    return result


def _unique_blocks(store: Host, store_dir: Path) -> int:
    done = store.run([*CLI, "kv", "stats", "--data-dir", str(store_dir), "--json"], env=ENV)
    stats = json.loads(done.stdout)
    return int(stats["engine"]["unique_blocks"] or 0)


def _wait_for_growth(store: Host, store_dir: Path, before: int) -> int:
    """The engine's block count once it grew past `before` (the connector saves after the
    request; bounded, not a race)."""
    deadline = time.monotonic() + 60.0
    while (now := _unique_blocks(store, store_dir)) <= before:
        if time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    return now


def _ours_running(root: Path) -> list[str]:
    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        command = " ".join(process.info["cmdline"] or ())
        if str(root) in command and process.pid != os.getpid():
            found.append(f"{process.pid}: {command[:200]}")
    return found
