"""Attacks of a second local user (`nobody`) on the managed engine, staged for real.

Ports are squatted inside a network namespace each test creates (`unshare -n`), so fixed ports
never meet anything else on the machine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from graph_kvcache_mcp.connectors.engine.process import ManagedEngine
from graph_kvcache_mcp.connectors.processes.identity import is_ours
from graph_kvcache_mcp.errors import ConfigError
from tests.support.engines import RunningEngine, require_in_ci

ROOT = Path(__file__).resolve().parents[3]


def _require_namespaces() -> None:
    tools = all(shutil.which(tool) for tool in ("unshare", "setpriv", "ip"))
    if os.geteuid() != 0 or not tools or not os.access("/usr/bin/python3", os.X_OK):
        require_in_ci(
            "root with unshare, setpriv, ip and /usr/bin/python3 (network namespaces, a second "
            "user running the system Python)"
        )


def _race(mode: str, tmp_path: Path) -> list[dict[str, object]]:
    _require_namespaces()
    tmp_path.chmod(0o755)  # the squatter, as nobody, only reads /proc: nothing of ours
    done = subprocess.run(
        [
            "unshare",
            "-n",
            "--",
            sys.executable,
            "-m",
            "tests.support.port_race",
            mode,
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    attempts = [json.loads(line) for line in done.stdout.splitlines()]
    assert attempts and attempts[-1]["won"], f"the squatter never won the race: {attempts}"
    return attempts


def test_a_squatter_that_takes_the_port_gets_no_token_and_the_start_fails(tmp_path: Path) -> None:
    won = _race("listen", tmp_path)[-1]
    assert won["requests"] == 0 and not won["token_sent"]
    assert won["error"] is not None and "taken by another process" in str(won["error"])
    assert won["rotated"] and not won["engine_left"]


def test_a_squatter_racing_a_self_heal_gets_no_token_either(tmp_path: Path) -> None:
    won = _race("heal", tmp_path)[-1]
    assert won["requests"] == 0 and not won["token_sent"]
    assert won["error"] is not None and "taken by another process" in str(won["error"])
    assert won["rotated"] and not won["engine_left"]


def test_a_failed_bind_in_the_engine_log_is_a_failed_start(tmp_path: Path) -> None:
    won = _race("bind", tmp_path)[-1]
    assert won["error"] is not None and "could not bind port" in str(won["error"])
    assert won["rotated"] and not won["engine_left"]


# --- state planted by another user --------------------------------------------------------------

AS_NOBODY = ("setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "/usr/bin/python3")

LISTENER = """
import socket, sys
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen(8)
print(server.getsockname()[1], flush=True)
server.settimeout(30)
while True:
    peer, _ = server.accept()
    peer.settimeout(2)
    try:
        print("got", peer.recv(65536).hex(), flush=True)
    except OSError:
        pass
    peer.close()
"""


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory like /tmp (root's, sticky, writable by everyone) that `nobody` can reach."""
    _require_namespaces()
    directory = Path(tempfile.mkdtemp(prefix="kv-shared-"))
    directory.chmod(0o1777)
    try:
        yield directory
    finally:
        shutil.rmtree(directory)


def _as_nobody(code: str, *args: str) -> None:
    subprocess.run([*AS_NOBODY, "-c", code, *args], check=True, timeout=30)


def test_an_engine_dir_another_user_planted_is_refused_naming_it(shared: Path) -> None:
    _as_nobody("import os, sys; os.mkdir(sys.argv[1], 0o777)", str(shared / "engine"))
    managed = ManagedEngine(shared)
    with pytest.raises(ConfigError, match=f"refusing to use {shared / 'engine'}: .*uid 65534"):
        managed.start(backend="memory")
    assert managed.running_state(tidy=False) is None
    assert not (shared / "engine" / "token").exists()


def test_a_forged_state_file_naming_our_real_engine_gets_no_token(
    shared: Path, memory_engine: RunningEngine
) -> None:
    real = memory_engine.managed.running_state()
    assert real is not None
    attacker = subprocess.Popen([*AS_NOBODY, "-c", LISTENER], stdout=subprocess.PIPE, text=True)
    try:
        assert attacker.stdout is not None
        port = int(attacker.stdout.readline())
        # Everything the record holds is world-readable in /proc, or the attacker's own choice.
        forged = real.model_copy(
            update={
                "process": real.process.model_copy(update={"nonce": None}),
                "port": port,
                "base_url": f"http://127.0.0.1:{port}",
                "data_dir": str(shared),
            }
        )
        _as_nobody(
            "import os, sys; os.mkdir(sys.argv[1], 0o777); "
            "open(os.path.join(sys.argv[1], 'state.json'), 'w').write(sys.argv[2])",
            str(shared / "engine"),
            forged.model_dump_json(),
        )
        with pytest.raises(ConfigError, match="refusing to use"):
            ManagedEngine(shared).status()
        with pytest.raises(ConfigError, match="refusing to use"):
            ManagedEngine(shared).start(backend="memory")
    finally:
        attacker.kill()
        received = attacker.communicate(timeout=10)[0]
    assert "got" not in received
    assert memory_engine.managed.running_state() is not None  # never signalled


def test_a_record_copying_a_real_process_by_its_public_facts_is_not_ours(
    memory_engine: RunningEngine,
) -> None:
    real = memory_engine.managed.running_state()
    assert real is not None
    assert is_ours(real.process)
    # pid, start ticks and argv[0] are readable by anyone; the spawn nonce is not.
    assert not is_ours(real.process.model_copy(update={"nonce": None}))
    assert not is_ours(real.process.model_copy(update={"nonce": "0" * 32}))
