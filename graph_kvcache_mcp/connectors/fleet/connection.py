"""A fleet, connected: one vLLM client and one event feed per instance, and the shared index.

`load_fleet(settings)` reads the fleet file (`GRAPH_KVCACHE_FLEET` / `--fleet`) and adds the
managed vLLM when it publishes KV events and the file does not list it already, so a server
started with `vllm_start(kv_events=true)` joins the fleet by itself. API keys are read from the
environment variables the file names and go only into that instance's client.

A fleet file with `tls_dir` (instances on other hosts) gets one client TLS context
(`connectors.net.tls_client`) for every https URL of the file (`tls`, which the tier reads use
too), and its `tls://` feeds are read at the loopback ends of this host's edge routes
(`domain.fleet.feed_routes`; whoever connects ensures the edge carries them first).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
from pydantic import SecretStr

from graph_kvcache_mcp.config import Settings
from graph_kvcache_mcp.connectors.files.access import read_regular_file
from graph_kvcache_mcp.connectors.fleet.feed import EventFeed
from graph_kvcache_mcp.connectors.net.tls_client import client_tls
from graph_kvcache_mcp.connectors.vllm.process import ManagedVllm
from graph_kvcache_mcp.domain.fleet.feed_routes import feed_routes
from graph_kvcache_mcp.domain.fleet.fleet_file import FLEET_ENV, Fleet, FleetInstance, parse_fleet
from graph_kvcache_mcp.domain.fleet.index import BlockIndex
from graph_kvcache_mcp.domain.outcomes import Unavailable
from graph_kvcache_mcp.domain.vllm.metrics import (
    MetricsSnapshot,
    count_preemptions,
    parse_snapshot,
)
from graph_kvcache_mcp.errors import ConfigError, FileRefused

if TYPE_CHECKING:  # openai loads with the first client
    from graph_kvcache_mcp.connectors.vllm.client import VllmClient

MAX_FLEET_FILE_BYTES = 256 * 1024
MANAGED_NAME = "managed"
PROBE_TIMEOUT_S = 10.0


def load_fleet(settings: Settings, fleet_file: Path | None = None) -> Fleet:
    """The fleet to watch: the file's instances, plus the managed vLLM when it publishes events.

    Raises:
        ConfigError: no fleet file and no managed vLLM with events, or a file that is unreadable
            or refused by `parse_fleet`.
    """
    path = fleet_file or settings.fleet_file
    instances: list[FleetInstance] = []
    fleet: Fleet | None = None
    if path is not None:
        try:
            text = read_regular_file(path, max_bytes=MAX_FLEET_FILE_BYTES).decode("utf-8")
        except (FileRefused, UnicodeDecodeError) as exc:
            raise ConfigError(f"fleet file: {exc}") from None
        fleet = parse_fleet(
            text,
            source=str(path),
            insecure_hosts=settings.insecure_http_hosts,
            feed_hosts=settings.insecure_feed_hosts,
        )
        instances = list(fleet.instances)
    managed = ManagedVllm(settings.data_dir, python=settings.vllm_python, tidy=False)
    state = managed.running_state()
    if (
        state is not None
        and state.kv_events
        and all(i.base_url.rstrip("/") != state.base_url for i in instances)
    ):
        name = MANAGED_NAME if all(i.name != MANAGED_NAME for i in instances) else "managed-vllm"
        instances.append(
            FleetInstance(
                name=name,
                base_url=state.base_url,
                kv_events=state.kv_events,
                kv_events_replay=state.kv_events_replay,
            )
        )
    if not instances:
        raise ConfigError(
            f"no fleet: set {FLEET_ENV} (or --fleet FILE) to a fleet file, or start a managed "
            "vLLM with kv_events (vllm_start kv_events=true / vllm start --kv-events)"
        )
    if fleet is None:
        return Fleet(instances=tuple(instances))
    return fleet.model_copy(update={"instances": tuple(instances)})


@dataclass(frozen=True)
class InstanceProbe:
    """What one instance answered about itself just now."""

    name: str
    reachable: bool
    reason: str | None = None
    model: str | None = None
    version: str | None = None
    snapshot: MetricsSnapshot | None = None
    preemptions: int | None = None


class FleetConnection:
    """Clients, feeds and the index of one fleet. Close with `aclose()`."""

    def __init__(
        self,
        fleet: Fleet,
        *,
        timeout_s: float = 30.0,
        environ: Mapping[str, str] | None = None,
        index: BlockIndex | None = None,
    ) -> None:
        from graph_kvcache_mcp.connectors.vllm.client import VllmClient  # openai loads here

        env = os.environ if environ is None else environ
        self.fleet = fleet
        identity = fleet.identity()
        self.tls = None if identity is None else client_tls(identity)
        """The fleet's mutual-TLS client context (None: no tls_dir), for every https URL."""
        self.feed_routes = feed_routes(fleet)
        self.index = index or BlockIndex()
        self.clients: dict[str, VllmClient] = {}
        self.feeds: dict[str, EventFeed] = {}
        for item in fleet.instances:
            key = None
            if item.api_key_env:
                if not env.get(item.api_key_env):
                    raise ConfigError(
                        f"fleet instance {item.name!r}: its api_key_env {item.api_key_env} is "
                        "not set in this server's environment"
                    )
                key = SecretStr(env[item.api_key_env])
            # The fleet's one deadline bounds its scrapes and probes too (as before probes had
            # their own): a fleet status reads every instance's /metrics under it.
            target = fleet.vllm_target(item)
            self.clients[item.name] = VllmClient(
                target.url,
                api_key=key,
                timeout_s=timeout_s,
                probe_timeout_s=timeout_s,
                tls=None if target.tls is None else self.tls,
            )
            if item.kv_events:
                replay = item.kv_events_replay
                self.feeds[item.name] = EventFeed(
                    item.name,
                    self.feed_routes.endpoint(item.kv_events),
                    None if replay is None else self.feed_routes.endpoint(replay),
                    self.index,
                )
        self._lock = anyio.Lock()

    def __repr__(self) -> str:
        return f"FleetConnection({[i.name for i in self.fleet.instances]})"

    @property
    def names(self) -> list[str]:
        return [i.name for i in self.fleet.instances]

    async def aclose(self) -> None:
        for feed in self.feeds.values():
            feed.close()
        for client in self.clients.values():
            await client.aclose()

    async def sync(self, *, settle_s: float = 0.3, skip: Collection[str] = ()) -> None:
        """Fold every feed's new batches into the index (replaying what is missing), except the
        feeds of the instances in `skip` (known to be down: their replay would only time out)."""
        feeds = [feed for name, feed in self.feeds.items() if name not in skip]
        async with self._lock:
            await anyio.to_thread.run_sync(self._sync_all, feeds, settle_s)

    @staticmethod
    def _sync_all(feeds: Sequence[EventFeed], settle_s: float) -> None:
        for feed in feeds:  # one after another: they share the index
            feed.sync(settle_s=settle_s)

    async def probe_all(self) -> dict[str, InstanceProbe]:
        """Every instance's health, model, version and /metrics, concurrently."""
        found: dict[str, InstanceProbe] = {}

        async def one(name: str) -> None:
            found[name] = await self.probe(name)

        async with anyio.create_task_group() as group:
            for name in self.names:
                group.start_soon(one, name)
        return {name: found[name] for name in self.names}

    async def probe(self, name: str) -> InstanceProbe:
        client = self.clients[name]
        with anyio.move_on_after(PROBE_TIMEOUT_S):
            healthy = await client.health()
            if isinstance(healthy, Unavailable):
                return InstanceProbe(name, False, healthy.reason)
            models = await client.models()
            if isinstance(models, Unavailable):
                return InstanceProbe(name, False, models.reason)
            model = models[0] if models else None
            version = await client.routes.version()
            text = await client.metrics.scrape_text()
            snapshot: MetricsSnapshot | None = None
            preemptions: int | None = None
            if not isinstance(text, Unavailable):
                try:
                    snapshot = await anyio.to_thread.run_sync(parse_snapshot, text, model)
                    preemptions = count_preemptions(text, model)
                except ValueError:
                    snapshot = None
            return InstanceProbe(
                name,
                True,
                model=model,
                version=None if isinstance(version, Unavailable) else version,
                snapshot=snapshot,
                preemptions=preemptions,
            )
        return InstanceProbe(name, False, f"no answer within {PROBE_TIMEOUT_S:g} s")

    async def prompt_tokens(
        self,
        name: str,
        model: str,
        *,
        messages: Sequence[Mapping[str, Any]] | None,
        prompt: str | None,
    ) -> list[int] | Unavailable:
        """The token ids `name` makes of the request (its own chat template for messages).

        Raises:
            VllmRequestError: the instance refused the request.
        """
        routes = self.clients[name].routes
        if messages is not None:
            tokens = await routes.tokenize_chat({"messages": list(messages)}, model=model)
        else:
            tokens = await routes.tokenize_prompt(prompt or "", model=model)
        return tokens if isinstance(tokens, Unavailable) else tokens.tokens
