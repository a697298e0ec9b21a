"""Two hosts as network namespaces: the store's engine reached from the node only through the
two edges, with mutual TLS; nothing else of the store is reachable, and outsiders are refused.
Skipped when not root (CI runs as root)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests.support.edge_hosts import EDGE_PORT, engine_behind_edges
from tests.support.fleet_tls import require_haproxy
from tests.support.netns import require_netns

REPO = Path(__file__).resolve().parents[3]

# Run inside the node's namespace: a fleet client, a client without a certificate and one from
# another CA at the store's edge; then the store's engine port directly.
_PROBES = """
import socket, sys
from pathlib import Path
from tests.support.fleet_tls import client_context, refused
fleet, rogue, host, edge_port, engine_port = sys.argv[1:]
for name, cert in (("fleet", Path(fleet)), ("none", None), ("rogue", Path(rogue))):
    print(name, refused(int(edge_port), client_context(cert, Path(fleet)), host) is None)
try:
    socket.create_connection((host, int(engine_port)), timeout=5).close()
    print("engine True")
except OSError:
    print("engine False")
"""


def test_the_nodes_kv_reaches_the_store_only_through_both_edges(tmp_path: Path) -> None:
    require_netns()
    require_haproxy()
    value = os.urandom(1024 * 1024 + 3)
    (tmp_path / "value").write_bytes(value)
    with engine_behind_edges(tmp_path) as hosts:
        store, node, tls = hosts.store, hosts.node, hosts.tls
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "EPISTEMIC_GRAPH_KVCACHE_TOKEN_FILE": str(hosts.token_file),
        }
        url = ("--url", hosts.node_url)
        node.cli("kv", "put", "netns/value", tmp_path / "value", *url, env=env)
        node.cli("kv", "get", "netns/value", "-o", tmp_path / "back", *url, env=env)
        assert (tmp_path / "back").read_bytes() == value

        probes = node.run(
            [
                sys.executable,
                "-c",
                _PROBES,
                *(str(tls.node), str(tls.rogue), store.address),
                *(str(EDGE_PORT), str(hosts.engine_port)),
            ],
            env=env,
        )
        assert probes.stdout.split("\n")[:4] == [
            "fleet True",
            "none False",
            "rogue False",
            "engine False",
        ]
