"""The managed `lmcache coordinator` and the flags that join an `lmcache server` to it.
Pure: no I/O.

The coordinator hashes token ids itself, so its chunk size and hash algorithm must equal the
servers'. It has no authentication, so it binds loopback only; the servers advertise 127.0.0.1
because the coordinator calls their HTTP port back (prefetch, delete) and they bind loopback. A
node of a fleet across hosts advertises its own loopback address instead (`127.X.Y.Z`, see
`domain/edge/node_join.py`), which the store host's edge maps back to the node.
Without event reporting a server never fills the directory. Its derived state (the directory)
and the operator's state (pins, quotas) survive a restart only through the checkpoint and
metadata files, kept in our private data dir.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from graph_kvcache_mcp.domain.lmcache.chunk_keys import DEFAULT_CHUNK_SIZE, SEED_FREE_HASH
from graph_kvcache_mcp.domain.lmcache.process_spec import ProcessSpec
from graph_kvcache_mcp.errors import ConfigError

COORDINATOR_HOST = "127.0.0.1"
CHECKPOINT_FILE = "checkpoint.json"
METADATA_FILE = "metadata.json"
URL_FLAG = "--coordinator-url"
REPORTING_FLAG = "--coordinator-event-reporting"
ADVERTISE_FLAG = "--coordinator-advertise-ip"


def coordinator_spec(
    *,
    port: int,
    state_dir: Path,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    hash_algorithm: str = SEED_FREE_HASH,
) -> ProcessSpec:
    """`lmcache coordinator` on loopback `port`, keeping its state under `state_dir`."""
    return ProcessSpec(
        argv=[
            "lmcache",
            "coordinator",
            "--host",
            COORDINATOR_HOST,
            "--port",
            str(port),
            "--chunk-size",
            str(chunk_size),
            "--hash-algorithm",
            hash_algorithm,
            "--checkpoint-path",
            str(state_dir / CHECKPOINT_FILE),
            "--metadata-path",
            str(state_dir / METADATA_FILE),
        ],
        env={"LMCACHE_TRACK_USAGE": "false", "LMCACHE_DISABLE_BANNER": "1"},
    )


def coordinator_url(port: int) -> str:
    return f"http://{COORDINATOR_HOST}:{port}"


def joined_url(server: ProcessSpec) -> str | None:
    """The coordinator `server` is started joined to, if any."""
    return recorded_coordinator_url(server.argv)


def recorded_coordinator_url(command: Sequence[str]) -> str | None:
    """The coordinator a server's command (as planned or as recorded at start) joins, if any."""
    for index, arg in enumerate(command[:-1]):
        if arg == URL_FLAG:
            return command[index + 1]
    return None


def join_coordinator(
    server: ProcessSpec, url: str, *, advertise_ip: str = COORDINATOR_HOST
) -> ProcessSpec:
    """`server` started joined to the coordinator at `url`, reporting its events to it, and
    telling it to call back at `advertise_ip` (and the server's HTTP port).

    Raises:
        ConfigError: the server is already joined to another coordinator.
    """
    current = joined_url(server)
    if current == url:
        return server
    if current is not None:
        raise ConfigError(
            f"the lmcache server is already joined to the coordinator at {current}; one server "
            f"reports to one coordinator (not also {url})"
        )
    join = [URL_FLAG, url, REPORTING_FLAG, ADVERTISE_FLAG, advertise_ip]
    return server.model_copy(update={"argv": [*server.argv, *join]})


def check_agreement(server: ProcessSpec, coordinator: ProcessSpec) -> None:
    """Refuse a coordinator whose chunk size or hash algorithm differs from the server's: it
    would hash every lookup to keys no server stores.

    Raises:
        ConfigError: names the flag that differs and both values.
    """
    for flag, default in (
        ("--chunk-size", str(DEFAULT_CHUNK_SIZE)),
        ("--hash-algorithm", "blake3"),
    ):
        mine, theirs = flag_value(server, flag, default), flag_value(coordinator, flag, default)
        if mine != theirs:
            raise ConfigError(
                f"the coordinator's {flag} {theirs} differs from the lmcache server's {mine}: "
                "start the coordinator with the servers' value, or every lookup misses"
            )


def flag_value(spec: ProcessSpec, flag: str, default: str) -> str:
    """The value `spec` gives `flag`, or `default`."""
    argv = spec.argv
    for index, arg in enumerate(argv[:-1]):
        if arg == flag:
            return argv[index + 1]
    return default
