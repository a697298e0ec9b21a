"""Real LMCache 0.5.6 driving our native_plugin client: `lmcache server` and `lmcache bench l2`."""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from graph_kvcache_mcp.cli import main
from graph_kvcache_mcp.connectors.lmcache.state import LmcacheStatus
from graph_kvcache_mcp.connectors.processes.ports import free_port
from graph_kvcache_mcp.domain.engine.kv_stats import EngineStats
from graph_kvcache_mcp.domain.lmcache.metrics import parse_lmcache_counters
from tests.support.engines import RunningEngine
from tests.support.lmcache import (
    adapter_json,
    cpu_server_flags,
    engine_stats,
    require_lmcache,
    run_lmcache,
    running_lmcache_server,
)
from tests.support.tls_edge import make_test_pki, tls_forwarder

pytestmark = pytest.mark.lmcache

# 2 layers x K/V x 256 tokens x 2 heads x 64 x fp16 = 256 KiB per chunk; 512 tokens = 2 chunks.
SHAPE = "(2,64,16,2,64):float16:2"
REQUESTS = 2
CHUNKS = REQUESTS * 2


def wait_for_stats(
    engine: RunningEngine, condition: Callable[[EngineStats], bool], what: str
) -> EngineStats:
    """L2 stores complete after LMCache answers its client: poll the engine under a deadline."""
    deadline = time.monotonic() + 30
    while True:
        stats = engine_stats(engine)
        if condition(stats):
            return stats
        if time.monotonic() > deadline:
            raise AssertionError(f"engine never showed {what}: {stats}")
        time.sleep(0.2)


def bench_server(rpc_url: str, http_url: str, engine: RunningEngine, *, first: int = 0) -> str:
    """LMCache's own bench client: REQUESTS requests from sequence `first` on, stored then
    retrieved with checksums. Tests that share an engine give different `first`s: chunks already
    in the engine would be found, not stored, and checked by nothing."""
    result = run_lmcache(
        [
            "bench",
            "server",
            "--rpc-url",
            rpc_url,
            "--url",
            http_url,
            "--mode",
            "cpu",
            "--kvcache-shape-spec",
            SHAPE,
            "--num-tokens",
            "512",
            "--start",
            str(first),
            "--end",
            str(first + REQUESTS),
            "--interval",
            "0",
        ],
        engine,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def checksums(output: str, phase: str) -> dict[int, str]:
    pattern = rf"\[seq (\d+)/{phase}\] CHECKSUM: ([0-9a-f]+)"
    return {int(seq): digest for seq, digest in re.findall(pattern, output)}


def test_lmcache_server_stores_into_the_engine_and_reloads_from_it_after_l1_is_cleared(
    durable_engine: RunningEngine, tmp_path: Path
) -> None:
    require_lmcache()
    before = engine_stats(durable_engine)
    with running_lmcache_server(durable_engine, tmp_path) as server:
        first = bench_server(server.rpc_url, server.http_url, durable_engine)
        assert first.count("CHECKSUM MATCH OK") == REQUESTS
        stored = wait_for_stats(
            durable_engine,
            lambda s: (s.put_new or 0) - (before.put_new or 0) >= CHUNKS,
            f"{CHUNKS} new blocks",
        )

        assert server.post("/cache/clear") == {"status": "ok", "cleared": {"tier": "l1"}}
        second = bench_server(server.rpc_url, server.http_url, durable_engine)
        reloaded = wait_for_stats(
            durable_engine,
            lambda s: (s.get_hits or 0) - (stored.get_hits or 0) >= CHUNKS,
            f"{CHUNKS} GET hits",
        )
        log = server.log()
        with urllib.request.urlopen(server.http_url + "/metrics", timeout=10) as reply:
            counters = parse_lmcache_counters(reply.read().decode())

    # LMCache's per-adapter load counter, by its real name: our adapter's loads, none by P2P.
    assert (counters.l2_loads or 0) >= 1 and counters.p2p_loads == 0, counters
    assert "(0 L1, 2 L2)" in log, "the second pass must be served from L2, i.e. the engine"
    assert (reloaded.put_new or 0) - (before.put_new or 0) == CHUNKS, "nothing stored twice"
    # The warm pass zeroes its KV buffers and reloads them; equal checksums = bytes round-tripped.
    assert checksums(second, "warm") == checksums(first, "cold")
    assert len(checksums(second, "warm")) == REQUESTS
    assert durable_engine.token.get_secret_value() not in log


def test_lmcache_bench_l2_round_trips_through_the_adapter_and_verifies_bytes(
    memory_engine: RunningEngine,
) -> None:
    require_lmcache()
    before = engine_stats(memory_engine)
    result = run_lmcache(
        [
            "bench",
            "l2",
            "--l2-adapter",
            adapter_json(memory_engine, num_workers=2),
            "--num-keys",
            "8",
            "--data-size-kb",
            "64",
            "--no-skip-verify",
        ],
        memory_engine,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    after = engine_stats(memory_engine)
    stores = re.search(r"Operation:\s+Store.*?Total success:\s+(\d+)", output, re.S)
    loads = re.search(r"Operation:\s+Load.*?Total success:\s+(\d+)", output, re.S)
    assert stores and loads, output[-4000:]
    stored, loaded = int(stores.group(1)), int(loads.group(1))
    assert loaded == stored >= 8
    assert f"[Verify] All {stored} keys data verified OK." in output, output[-4000:]
    grew = (after.unique_blocks or 0) - (before.unique_blocks or 0)
    assert grew >= 8
    assert (after.resident_bytes or 0) - (before.resident_bytes or 0) == grew * 64 * 1024
    assert memory_engine.token.get_secret_value() not in output


def test_the_managed_server_trusts_a_private_ca_named_by_ssl_cert_file_and_stores_through_tls(
    memory_engine: RunningEngine,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The issue's case: the engine behind a TLS edge signed by a private CA. The managed
    server used to drop SSL_CERT_FILE, so every L2 store failed; it inherits it now."""
    python = str(require_lmcache().parent / "python")
    pki = make_test_pki(tmp_path)
    token = memory_engine.token.get_secret_value()
    engine_port = int(memory_engine.base_url.rsplit(":", 1)[1])
    common = ["--data-dir", str(tmp_path / "data"), "--json"]
    ports = ["--lmcache-port", str(free_port()), "--lmcache-http-port", str(free_port())]
    model = ["--model", "test-model", "--num-layers", "2", "--kv-heads", "2", "--head-dim", "64"]
    extra = [f"--extra-arg={arg}" for arg in cpu_server_flags()]
    before = engine_stats(memory_engine)
    with tls_forwarder(pki, engine_port) as tls_port:
        monkeypatch.setenv("EPISTEMIC_GRAPH_KVCACHE_URL", f"https://127.0.0.1:{tls_port}")
        monkeypatch.setenv("EPISTEMIC_GRAPH_KVCACHE_TOKEN", token)
        monkeypatch.setenv("SSL_CERT_FILE", str(pki.ca_file))
        monkeypatch.delenv("SSL_CERT_DIR", raising=False)
        start = ["lmcache", "start", *model, *ports, "--l1-size-gb", "0.1", "--python", python]
        code = main([*start, *extra, *common])
        out = capsys.readouterr()
        try:
            assert code == 0, out.err
            status = LmcacheStatus.model_validate_json(out.out)
            assert status.pid is not None and status.rpc_url and status.http_url
            environ = Path(f"/proc/{status.pid}/environ").read_bytes().split(b"\0")
            # A bool, so a failure never prints the environment (the token is in it).
            inherited = f"SSL_CERT_FILE={pki.ca_file}".encode() in environ
            assert inherited, "the managed lmcache server did not inherit SSL_CERT_FILE"
            bench_server(status.rpc_url, status.http_url, memory_engine, first=1000)
            wait_for_stats(
                memory_engine,
                lambda s: (s.unique_blocks or 0) - (before.unique_blocks or 0) >= CHUNKS,
                f"{CHUNKS} new blocks stored through the TLS edge",
            )
        finally:
            main(["lmcache", "stop", *common])
            capsys.readouterr()
