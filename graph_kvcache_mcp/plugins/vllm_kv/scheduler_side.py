"""`EngineKVConnector`'s scheduler side (vLLM's EngineCore process): what to load and save.

Names each full block of a request by a chained content key (`domain.vllm.kv_blocks`), asks the
engine for the longest present run of them after vLLM's own prefix-cache hit, and plans each
step's loads and saves (`domain.vllm.kv_plan`; a hybrid's in `domain.vllm.hybrid.kv_plan`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graph_kvcache_mcp.connectors.files.private import write_private
from graph_kvcache_mcp.domain.vllm.engine_kv.hit_sources import HitSource
from graph_kvcache_mcp.domain.vllm.hybrid.kv_plan import HybridPlanner
from graph_kvcache_mcp.domain.vllm.kv_blocks import KvModelIdentity
from graph_kvcache_mcp.domain.vllm.kv_identity_file import (
    identity_file_json,
    published_identity,
)
from graph_kvcache_mcp.domain.vllm.kv_plan import ScheduledRequest, TransferPlanner
from graph_kvcache_mcp.plugins.vllm_kv.device.held import SchedulerHolds
from graph_kvcache_mcp.plugins.vllm_kv.engine_calls import logger
from graph_kvcache_mcp.plugins.vllm_kv.identity import ConnectorSetup, eligible
from graph_kvcache_mcp.plugins.vllm_kv.metadata import EngineKVMetadata

HIT_SOURCE_RETRY_S = 60.0
"""After the engine did not say its backend, ask again no sooner than this (hits meanwhile
count as external_unspecified): a lookup must not wait on a stats call per request."""

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request


class SchedulerSide:
    """Lookups and per-step plans for one vLLM's scheduler."""

    def __init__(self, setup: ConnectorSetup) -> None:
        self.identity = identity = setup.identity
        self.block_size = identity.block_size
        self.store = setup.store
        self.ranks = setup.tensor_parallel
        self.planner = TransferPlanner(identity.digest, self.block_size)
        self._local_tokens: dict[str, int] = {}
        self.holds = SchedulerHolds(setup.async_saves)
        self._hit_source: HitSource | None = None
        self._hit_source_asked = -HIT_SOURCE_RETRY_S
        self._layout = layout = setup.layout
        states = setup.states
        # A hybrid (several KV cache groups): attention blocks plus Mamba states, loaded
        # asynchronously (vLLM can only fail whole requests of a multi-group model).
        self._hybrid: HybridPlanner | None = None
        if layout is not None and states is not None:
            self._hybrid = HybridPlanner(
                identity.digest,
                states.digest,
                self.block_size,
                attention_group=layout.attention_group,
                state_groups=layout.state_groups,
            )

    def publish_identity(self, path: object, states: KvModelIdentity | None) -> None:
        """Write the identity record where the launch plan asked (best effort: logged)."""
        if not path:
            return
        record = published_identity(self.identity, states, tensor_parallel=self.ranks)
        try:
            write_private(Path(str(path)), identity_file_json(record))
        except Exception:  # the fleet view then says "not checked"; serving goes on
            logger.exception("EngineKVConnector: could not write its identity to %s", path)

    def matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int, bool]:
        """`get_num_new_matched_tokens`: tokens the engine holds after vLLM's own hit."""
        if not eligible(request):
            return 0, False
        if self._hybrid is not None:
            return self._hybrid_hit(request, num_computed_tokens, self._hybrid)
        keys = self.planner.lookup_keys(
            request.request_id, request.all_token_ids, num_computed_tokens, request.cache_salt
        )
        self._local_tokens[request.request_id] = num_computed_tokens
        began = time.perf_counter()
        # With tensor parallelism a block counts only where every rank's key is held: each
        # rank loads its own heads. A rank's key that vanishes after this lookup still fails
        # that rank's load; vLLM unions `get_block_ids_with_load_errors` over the ranks and
        # recomputes those blocks on all of them.
        present = self.store.count_present(keys, ranks=self.ranks) if keys else 0
        if present:
            logger.info(
                "EngineKVConnector: found %d of %d blocks of request %s in the engine in %.4f s",
                present,
                len(keys),
                request.request_id,
                time.perf_counter() - began,
            )
        return present * self.block_size, False

    def hit_sources(self, num_external_tokens: int) -> dict[HitSource, int]:
        """`get_external_cache_hit_sources`: every external token came from the engine, whose
        backend (asked once) names the tier."""
        if num_external_tokens <= 0:
            return {}
        if self._hit_source is None:
            now = time.monotonic()
            if now - self._hit_source_asked >= HIT_SOURCE_RETRY_S:
                self._hit_source_asked = now
                self._hit_source = self.store.hit_source()
        return {self._hit_source or "external_unspecified": num_external_tokens}

    def after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        local = self._local_tokens.pop(request.request_id, None)
        if local is None:
            return
        if self._hybrid is not None:
            self._hybrid.admitted(
                request.request_id, blocks.get_block_ids(), num_external_tokens, local
            )
            return
        block_ids = blocks.get_block_ids()[0]
        self.planner.admitted(request.request_id, block_ids, num_external_tokens, local)

    def step_plan(self, scheduler_output: SchedulerOutput) -> EngineKVMetadata:
        """`build_connector_meta`: this step's loads and saves."""
        group = self._layout.attention_group if self._layout is not None else 0
        scheduled = [
            ScheduledRequest(
                req_id=new.req_id,
                num_computed_tokens=new.num_computed_tokens,
                num_scheduled_tokens=scheduler_output.num_scheduled_tokens.get(new.req_id, 0),
                new_block_ids=list(new.block_ids[group]),
                replaces_blocks=True,
            )
            for new in scheduler_output.scheduled_new_reqs
        ]
        cached = scheduler_output.scheduled_cached_reqs
        for index, req_id in enumerate(cached.req_ids):
            new_blocks = cached.new_block_ids[index]
            scheduled.append(
                ScheduledRequest(
                    req_id=req_id,
                    num_computed_tokens=cached.num_computed_tokens[index],
                    num_scheduled_tokens=scheduler_output.num_scheduled_tokens.get(req_id, 0),
                    new_block_ids=list(new_blocks[group]) if new_blocks is not None else None,
                    replaces_blocks=req_id in cached.resumed_req_ids,
                )
            )
        preempted = sorted(scheduler_output.preempted_req_ids or ())
        finished = sorted(scheduler_output.finished_req_ids)
        if self._hybrid is not None:
            block_state = getattr(scheduler_output, "kv_connector_block_state", None)
            hybrid = self._hybrid.plan_step(
                scheduled,
                offers=block_state.boundary_state_offloads if block_state is not None else {},
                preempted=preempted,
                finished=finished,
            )
            self.holds.planned(save.req_id for save in hybrid.saves)
            self.holds.planned(state.req_id for state in hybrid.state_saves)
            return EngineKVMetadata(
                saves=hybrid.saves, hybrid_loads=hybrid.loads, state_saves=hybrid.state_saves
            )
        plan = self.planner.plan_step(scheduled, preempted=preempted, finished=finished)
        self.holds.planned(save.req_id for save in plan.saves)
        return EngineKVMetadata(loads=plan.loads, saves=plan.saves)

    def finished(self, request: Request) -> tuple[bool, dict[str, Any] | None]:
        """`request_finished`: True keeps the request's blocks until the workers report its
        async saves done (a device cache's; CPU saves are copied out in their own step)."""
        self.planner.forget(request.request_id)
        if self._hybrid is not None:
            self._hybrid.forget(request.request_id)
        self._local_tokens.pop(request.request_id, None)
        return self.holds.finished(request.request_id), None

    def connector_output(self, connector_output: KVConnectorOutput) -> None:
        if self._hybrid is not None:
            for req_id in connector_output.failed_recving or ():
                self._hybrid.load_failed(req_id)

    def _hybrid_hit(
        self, request: Request, local_tokens: int, hybrid: HybridPlanner
    ) -> tuple[int, bool]:
        """The longest run of stored attention blocks that ends on a stored Mamba state; loaded
        asynchronously (vLLM parks the request until the workers report it in)."""
        req_id = request.request_id
        keys = hybrid.lookup_keys(req_id, request.all_token_ids, local_tokens, request.cache_salt)
        self._local_tokens[req_id] = local_tokens
        began = time.perf_counter()
        present = self.store.count_present(keys) if keys else 0
        candidates = hybrid.state_candidates(req_id, local_tokens, present)
        found = self.store.first_present(candidates)
        blocks = 0 if found is None else present - found
        if present:
            logger.info(
                "EngineKVConnector: found %d of %d blocks of request %s in the engine, %d with "
                "a Mamba state at their end, in %.4f s",
                present,
                len(keys),
                req_id,
                blocks,
                time.perf_counter() - began,
            )
        return blocks * self.block_size, blocks > 0
