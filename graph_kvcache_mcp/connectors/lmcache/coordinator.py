"""LMCache's coordinator (`lmcache coordinator`, 0.5.6) over HTTP: which registered server holds
which chunk in L1, from its directory. The API has no auth; only loopback or listed hosts are
accepted (parse_http_url). Every call is bounded by the client's timeout: a coordinator that is
down or hangs reads as `Unavailable(reason)`, never as "nothing cached".

Our calls carry prompts' token ids and we believe the answers, so on loopback the port must be
held by a process of our own user (`identity.listener_user`) before the first call, and again
after a connection failure: another user who took the port of a coordinator that died (or bound
it first) is sent nothing and its answers are never read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Self

import anyio.to_thread
import httpx2

from graph_kvcache_mcp.connectors.net.tls_trust import ClientTls, certificate_reason
from graph_kvcache_mcp.connectors.processes.identity import listener_user
from graph_kvcache_mcp.domain.endpoints import HttpEndpoint, parse_http_url
from graph_kvcache_mcp.domain.fleet.advertised import registered_ips
from graph_kvcache_mcp.domain.fleet.tier_trust import (
    Registration,
    own_registration,
    process_start_s,
)
from graph_kvcache_mcp.domain.outcomes import Unavailable

DEFAULT_TIMEOUT_S = 5.0


class CoordinatorHttp:
    """One coordinator's HTTP API. Use as `async with`."""

    def __init__(
        self, url: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, tls: ClientTls | None = None
    ) -> None:
        """`tls`: a fleet's mutual-TLS context, for a coordinator on another host."""
        self.endpoint: HttpEndpoint = parse_http_url(url, what="LMCache coordinator URL")
        self.url = self.endpoint.url.rstrip("/")
        self._http = httpx2.AsyncClient(
            timeout=httpx2.Timeout(timeout_s), verify=True if tls is None else tls.context
        )
        self._trusted = None if tls is None else tls.trusted
        self._proved = not self.endpoint.is_loopback
        """A listed remote host cannot be proved from here: the user named it."""

    def __repr__(self) -> str:
        return f"CoordinatorHttp({self.url!r})"

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self._http.aclose()

    async def instance_id(
        self, ip: str, http_port: int, *, reported: str | None = None
    ) -> str | Unavailable | None:
        """The id the server at `ip:http_port` registered under: the one it reports
        (`LmcacheHttp.instance_id`), else the newest registration there (`own_registration`);
        None when it is not registered."""
        found = await self.registrations(ip, http_port)
        if isinstance(found, Unavailable):
            return found
        own = own_registration(found, None, reported)
        return own.instance_id if own is not None else None

    async def registrations(self, ip: str, http_port: int) -> list[Registration] | Unavailable:
        """Every registration at `ip:http_port` (`GET /instances`); a server on another host
        may have registered under the loopback address its node advertises (`registered_ips`)."""
        body = await self._call("GET", "/instances")
        if isinstance(body, Unavailable):
            return body
        ips = registered_ips(ip)
        return [
            Registration(
                instance_id=str(item.get("instance_id")),
                registered_at=_number(item.get("registration_time")),
            )
            for item in body.get("instances") or []
            if item.get("ip") in ips and int(item.get("http_port") or 0) == http_port
        ]

    async def started_s(self) -> float | None:
        """When the coordinator process started (its /metrics); None when it does not say."""
        if await self._refusal() is not None:
            return None
        try:
            reply = await self._http.get(self.url + "/metrics")
        except httpx2.HTTPError:
            return None
        return process_start_s(reply.text) if reply.status_code == 200 else None

    async def usage(self) -> dict[str, Any] | Unavailable:
        """Fleet memory (`GET /instances/usage`): per server its L1 (and unshared L2) used and
        capacity bytes; shared pools (the engine declared shared) once, in `shared_modules`."""
        return await self._call("GET", "/instances/usage")

    async def l1_chunks(
        self, token_ids: Sequence[int], *, model: str, instance_id: str, cache_salt: str = ""
    ) -> list[bool] | Unavailable:
        """Per whole chunk of the prompt, in order: whether `instance_id` holds it in L1."""
        body = await self._call(
            "POST",
            "/directory/lookup",
            {
                "token_ids": list(token_ids),
                "model_name": model,
                "world_size": 1,
                "cache_salt": cache_salt,
            },
        )
        if isinstance(body, Unavailable):
            return body
        return [
            any(
                p.get("tier") == "l1" and p.get("instance_id") == instance_id
                for p in result.get("placements") or []
            )
            for result in body.get("results") or []
        ]

    async def prefetch(self, body: dict[str, Any]) -> dict[str, Any] | Unavailable:
        """Submit a warm of the body's chunks into its instance's L1 (`POST /cache/prefetches`)."""
        return await self._call("POST", "/cache/prefetches", body)

    async def prefetch_state(
        self, instance_id: str, request_id: str
    ) -> dict[str, Any] | Unavailable:
        """One poll of a prefetch job; the first `completed` answer consumes the job."""
        return await self._call("GET", f"/cache/prefetches/{instance_id}/{request_id}")

    async def delete(self, body: dict[str, Any]) -> dict[str, Any] | Unavailable:
        return await self._call("POST", "/cache/delete", body)

    async def pins(self, body: dict[str, Any], *, pin: bool) -> dict[str, Any] | Unavailable:
        return await self._call("POST" if pin else "DELETE", "/cache/pins", body)

    async def lookup(
        self, token_ids: Sequence[int], *, model: str, cache_salt: str = ""
    ) -> dict[str, Any] | Unavailable:
        """The directory's whole answer for a prompt: its chunk count, each chunk's hash and
        every placement (instance, tier)."""
        body = {
            "token_ids": list(token_ids),
            "model_name": model,
            "world_size": 1,
            "cache_salt": cache_salt,
        }
        return await self._call("POST", "/directory/lookup", body)

    async def instances(self) -> list[dict[str, Any]] | Unavailable:
        """The registered servers (`GET /instances`)."""
        body = await self._call("GET", "/instances")
        if isinstance(body, Unavailable):
            return body
        return [item for item in body.get("instances") or [] if isinstance(item, dict)]

    async def _refusal(self) -> Unavailable | None:
        """Why nothing may be sent to the coordinator's port now (None once it is proved ours)."""
        if self._proved:
            return None
        endpoint = self.endpoint
        owner = await anyio.to_thread.run_sync(
            lambda: listener_user(endpoint.port, host=endpoint.host)
        )
        if owner == "ours":
            self._proved = True
            return None
        if owner == "none":
            return Unavailable(f"LMCache coordinator not reachable at {self.url} (nothing listens)")
        return Unavailable(
            f"the port of the LMCache coordinator at {self.url} is held by another user's "
            "process: nothing is sent to it (start the coordinator again on another port)"
        )

    async def _call(self, method: str, path: str, body: Any = None) -> dict[str, Any] | Unavailable:
        if (refused := await self._refusal()) is not None:
            return refused
        try:
            reply = await self._http.request(method, self.url + path, json=body)
        except httpx2.HTTPError as exc:
            self._proved = not self.endpoint.is_loopback  # the port may change hands: prove again
            untrusted = certificate_reason(exc, trusted=self._trusted)
            return Unavailable(
                f"LMCache coordinator at {self.url} was not trusted: {untrusted}"
                if untrusted
                else f"LMCache coordinator not reachable at {self.url} ({type(exc).__name__})"
            )
        if reply.status_code != 200:
            return Unavailable(
                f"LMCache coordinator at {self.url} answered HTTP {reply.status_code} on {path}",
                status=reply.status_code,
            )
        try:
            payload = reply.json()
        except ValueError:
            return Unavailable(f"LMCache coordinator at {self.url} sent no JSON on {path}")
        if not isinstance(payload, dict):
            return Unavailable(f"LMCache coordinator at {self.url} sent an unexpected {path} body")
        return payload


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None
