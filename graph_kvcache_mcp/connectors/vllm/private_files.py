"""What the managed vLLM keeps in its private dir (`<data_dir>/vllm/`, 0700): the launch filled
in with the sockets and the identity file it is to use there, the KV identity record its
`EngineKVConnector` publishes (`domain.vllm.kv_identity_file`), and the removal of what a stopped
or exited vLLM leaves behind (rendezvous files, event sockets, shared memory). Only files of ours
are removed, never through a link. The lifecycle itself is `connectors.vllm.process`."""

from __future__ import annotations

import stat
from collections.abc import Iterable
from pathlib import Path

from graph_kvcache_mcp.connectors.files.private import (
    private_dir,
    read_private,
    refuse_link,
    remove_own,
)
from graph_kvcache_mcp.connectors.processes.shared_memory import remove_unmapped
from graph_kvcache_mcp.connectors.vllm.health import rendezvous_files
from graph_kvcache_mcp.connectors.vllm.state import VllmState
from graph_kvcache_mcp.domain.lmcache.stack import MAX_IPC_PATH, MP_CONNECTORS, rpc_socket_path
from graph_kvcache_mcp.domain.vllm.kv_identity_file import (
    IDENTITY_FILE_NAME,
    MAX_IDENTITY_FILE_BYTES,
    PublishedKvIdentity,
    parse_identity_file,
)
from graph_kvcache_mcp.domain.vllm.launch import VllmLaunch
from graph_kvcache_mcp.errors import ConfigError

EVENT_SOCKETS = ("kv-events.sock", "kv-replay.sock")
"""The KV event feed and replay sockets vLLM binds in our private dir (feed first)."""


def with_private_files(launch: VllmLaunch, data_dir: Path, home: Path) -> VllmLaunch:
    """`launch` with its event sockets, its lmcache RPC socket and its identity file set in the
    private dir `home` of the data dir `data_dir`, where the launch asks for them."""
    launch = _with_lmcache_socket(_with_event_endpoints(launch, home), data_dir)
    return _with_identity_file(launch, home)


def _with_lmcache_socket(launch: VllmLaunch, data_dir: Path) -> VllmLaunch:
    """`launch` with the MP connector aimed at the private KV RPC socket of the managed
    lmcache server of this data dir, when that server serves `launch.lmcache_port` there
    (a server of someone else's, or ours with too long a path, is reached by TCP)."""
    if launch.kv_connector not in MP_CONNECTORS or launch.lmcache_rpc_url is not None:
        return launch
    socket = rpc_socket_path(data_dir, launch.lmcache_port)
    if socket is None or not socket.is_socket():
        return launch
    return launch.model_copy(update={"lmcache_rpc_url": f"ipc://{socket}"})


def _with_event_endpoints(launch: VllmLaunch, home: Path) -> VllmLaunch:
    """`launch` with the KV event sockets filled in: the live feed and the replay socket as
    ipc sockets in our private dir. vLLM binds tcp only on a wildcard (every interface), and
    a loopback replay port answers every local user with the token ids of recent prompts
    (and could be taken by one of them before vLLM binds it); a socket in a 0700 directory
    is reachable by its owner only."""
    if not launch.kv_events or launch.kv_events_endpoint:
        return launch
    private_dir(home)
    feed, replay = (home / name for name in EVENT_SOCKETS)
    if len(str(replay)) > MAX_IPC_PATH:
        raise ConfigError(
            f"the KV event socket path {replay} is longer than {MAX_IPC_PATH} characters "
            "(the limit of a unix socket); use a shorter --data-dir"
        )
    return launch.model_copy(
        update={
            "kv_events_endpoint": f"ipc://{feed}",
            "kv_events_replay_endpoint": f"ipc://{replay}",
        }
    )


def _with_identity_file(launch: VllmLaunch, home: Path) -> VllmLaunch:
    """`launch` with EngineKVConnector publishing its KV identity in our private dir; a
    record left by an earlier vLLM is removed first, so the file read later is this one's."""
    if launch.kv_connector != "engine":
        return launch
    private_dir(home)
    path = launch.kv_identity_file or str(home / IDENTITY_FILE_NAME)
    remove_identity_file(path, home)
    return launch.model_copy(update={"kv_identity_file": path})


def remove_leftovers(
    home: Path, log_path: Path, state: VllmState, segments: Iterable[str] = ()
) -> None:
    """What our stopped or exited vLLM leaves behind: its rendezvous files, its event
    sockets, and the shared memory it mapped (recorded, or `segments`) that nothing maps."""
    remove_rendezvous(log_path, state)
    remove_event_sockets(home)
    remove_unmapped({*state.shared_memory, *segments})


def remove_event_sockets(home: Path) -> None:
    """Remove the KV event sockets our stopped vLLM bound in its private dir (vLLM leaves
    them behind): only sockets of ours, never through a link."""
    for name in EVENT_SOCKETS:
        remove_own(home / name, stat.S_ISSOCK)


def remove_rendezvous(log_path: Path, state: VllmState | None) -> list[str]:
    """Remove the `vllm_dist_*` rendezvous files of our (stopped or exited) vLLM: those its
    state recorded and those its log names since its start. Only regular files of ours
    with that name are removed, never through a link; what was removed."""
    names = {*(state.rendezvous if state else ()), *map(str, rendezvous_files(log_path))}
    return [name for name in sorted(names) if remove_own(Path(name))]


def remove_identity_file(path: str | None, home: Path) -> None:
    """Remove an EngineKVConnector identity record we placed in our private dir `home` (a file
    of ours, never through a link). A path elsewhere (named in hand-written extra args) is the
    user's file: left alone."""
    if path and Path(path).parent.resolve() == home.resolve():
        refuse_link(Path(path))
        remove_own(Path(path))


def read_kv_identity(path: str | None) -> PublishedKvIdentity | str:
    """The connector's record at `path`, or why there is none to use (a reason)."""
    if path is None:
        return (
            "this vLLM was started without an identity file for its EngineKVConnector (by an "
            "older graph-kvcache-mcp): restart it with vllm_restart"
        )
    try:
        text = read_private(Path(path))
    except (ConfigError, OSError) as exc:
        return f"the connector's identity file {path} cannot be read: {exc}"
    if text is None:
        return (
            f"the connector has not written {path} yet (it does once vLLM has set up its KV "
            "cache; see vllm_logs when it stays missing)"
        )
    if len(text) > MAX_IDENTITY_FILE_BYTES:
        return f"the connector's identity file {path} is too large to be its record"
    return parse_identity_file(text)
