"""The discrete-event simulator of a prefill/decode-disaggregated cluster that scales.

One heap of ``(time, sequence, kind, payload)`` events; the sequence counter belongs to the
simulator, so ties break by insertion order and two runs of the same input are identical.

Requests arrive at a router, which queues each at the serving prefill instance with the fewest
queued prompt tokens. A prefill instance runs batches of queued requests up to a token budget;
the batch's last layer emits each request's first token (TTFT). The request's KV cache then moves
to the decode instance with the most free KV memory as a flow on the topology (max-min fair
shared with every other KV flow and with the weight flows of loads in progress). A decode
instance steps all its running requests at once (continuous batching), one token each per step,
admitting a request only when its prompt and output fit its free KV memory.

Scaling comes from the autoscaler every ``interval_s``; the system (see :mod:`.systems`) turns a
decision into new instances with load times (and, for BlitzScale, live pairs whose relay schedule
comes from the same ZigZag policy objects as ``schedule_live``), role mutations and releases.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from blitzplan.cluster import ClusterState, QueuedRequest, Role
from blitzplan.compute import ComputeModel, RooflineComputeModel
from blitzplan.errors import InvalidInputError
from blitzplan.models import ModelSpec
from blitzplan.sim.autoscaler import Autoscaler, Load, ScaleDecision
from blitzplan.sim.traces import Trace
from blitzplan.topologies import Flow, Topology

__all__ = ["SimInstance", "SimRequest", "Simulator"]

ARRIVE, PREFILL_DONE, KV_DONE, DECODE_STEP, READY, TICK, FAIL, LIVE_DONE, RESTORE, WAKE = range(10)
_WINDOW_S = 2.0  # the autoscaler's load window


@dataclass(eq=False)
class SimRequest:
    """A request's progress through the cluster."""

    id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    first_token_s: float = math.nan
    finish_s: float = math.nan
    tokens_done: int = 0
    restarts: int = 0
    dropped: str = ""


@dataclass(eq=False)
class SimInstance:
    """One instance: loading, then serving; draining before release."""

    id: str
    role: str
    gpus: tuple[str, ...]
    created_s: float
    ready_s: float
    state: str = "loading"
    released_s: float = math.nan
    queue: deque[SimRequest] = field(default_factory=deque)
    queued_tokens: int = 0
    busy_until_s: float = 0.0
    running: list[SimRequest] = field(default_factory=list)
    stepping: bool = False
    kv_used: float = 0.0
    kv_capacity: float = 0.0
    idle_since_s: float = 0.0
    draining: bool = False


@dataclass
class _KvFlow:
    flow: Flow
    request: SimRequest
    source: SimInstance
    target: SimInstance
    remaining: float
    rate: float = 0.0
    version: int = 0


@dataclass(frozen=True)
class ScaleEvent:
    """One scaling decision and what it bought."""

    decided_s: float
    detected_s: float
    reason: str
    prefill: int
    decode: int
    first_capacity_s: float
    full_capacity_s: float


class Simulator:
    """A stateful run over one trace; :meth:`run` drives the event loop to the end."""

    def __init__(
        self,
        topology: Topology,
        model: ModelSpec,
        trace: Trace,
        *,
        tp: int,
        system: Any,
        autoscaler: Autoscaler | None,
        compute: ComputeModel | None = None,
        token_budget: int = 8192,
        max_decode_batch: int = 256,
        failures: Sequence[tuple[float, str]] = (),
        drain_limit_s: float = 600.0,
        progress: Callable[[float], None] | None = None,
    ) -> None:
        self.topology = topology
        self.model = model
        self.tp = tp
        self.system = system
        self.autoscaler = autoscaler
        gpu = topology.gpu_spec(topology.gpus()[0])
        self.compute = compute or RooflineComputeModel(model, gpu, tp=tp)
        self.token_budget = token_budget
        self.max_decode_batch = max_decode_batch
        self.kv_per_token = float(model.kv_bytes_per_token)
        weights_per_gpu = model.shard(tp).total_bytes
        self.kv_capacity = max(0.0, tp * (0.9 * gpu.memory_bytes - weights_per_gpu))
        self.requests = [
            SimRequest(i, r.arrival_s, max(1, r.prompt_tokens), max(1, r.output_tokens))
            for i, r in enumerate(trace.requests)
        ]
        self.end_s = (trace.duration_s if trace.requests else 0.0) + drain_limit_s
        self.pending = len(self.requests)
        self.instances: dict[str, SimInstance] = {}
        self.failed_gpus: set[str] = set()
        self.failed_hosts: list[tuple[float, str]] = []
        self.no_host_copy_s = 0.0
        self.copy_restored_s = 0.0
        self.events: list[tuple[float, int, int, Any]] = []
        self._seq = 0
        self._next_instance = 0
        self.now = 0.0
        self.backlog: deque[SimRequest] = deque()
        self.decode_backlog: deque[tuple[SimRequest, SimInstance]] = deque()
        self.kv_flows: dict[int, _KvFlow] = {}
        self._kv_seq = 0
        self._kv_last = 0.0
        self.weight_flows: list[tuple[float, float, Flow]] = []
        self.scale_events: list[ScaleEvent] = []
        self.hot_since_s: float | None = None
        self.recent_prompt: deque[tuple[float, int]] = deque()
        self._recent_prompt_tokens = 0
        self.recent_kv: deque[tuple[float, float]] = deque()
        self.gpu_timeline: list[tuple[float, int]] = [(0.0, 0)]
        self.events_processed = 0
        self.progress = progress
        self._prefill_cost: dict[tuple[int, int], float] = {}
        self._decode_cost: dict[tuple[int, int], float] = {}
        for time, host in failures:
            if host not in topology.hosts():
                raise InvalidInputError(
                    f"failures names host {host!r}, which is not in the topology"
                )
            self._push(time, FAIL, host)
        for request in self.requests:
            self._push(request.arrival_s, ARRIVE, request)

    # --- event plumbing ---------------------------------------------------------------------

    def _push(self, time: float, kind: int, payload: Any) -> None:
        heapq.heappush(self.events, (time, self._seq, kind, payload))
        self._seq += 1

    def run(self) -> None:
        self.system.start(self)
        if self.autoscaler is not None and self.requests:
            self._push(self.autoscaler.interval_s, TICK, None)
        handlers: dict[int, Callable[[Any], None]] = {
            ARRIVE: self._arrive,
            PREFILL_DONE: self._prefill_done,
            KV_DONE: self._kv_done,
            DECODE_STEP: self._decode_step,
            READY: self._ready,
            TICK: self._tick,
            FAIL: self._fail,
            LIVE_DONE: self._live_done,
            RESTORE: self._restore,
            WAKE: self._wake,
        }
        next_report = 0.0
        while self.events:
            time, _, kind, payload = heapq.heappop(self.events)
            if time > self.end_s:
                break
            self.now = time
            handlers[kind](payload)
            self.events_processed += 1
            if self.progress is not None and time >= next_report:
                self.progress(time / max(self.end_s, 1e-9))
                next_report = time + max(1.0, self.end_s / 50)
            if kind == TICK and self._all_done():
                break
        for request in self.requests:
            if math.isnan(request.finish_s) and not request.dropped:
                request.dropped = "unfinished when the run ended"
        for inst in list(self.instances.values()):
            if inst.state != "released":
                self._release(inst, at_s=self.now)

    def _all_done(self) -> bool:
        return self.pending == 0

    def _finish(self, request: SimRequest) -> None:
        request.finish_s = self.now
        self.pending -= 1

    # --- instances --------------------------------------------------------------------------

    def new_id(self) -> str:
        self._next_instance += 1
        return f"s{self._next_instance - 1}"

    def add_instance(
        self, role: str, gpus: Sequence[str], *, ready_s: float, instance_id: str | None = None
    ) -> SimInstance:
        inst = SimInstance(
            instance_id or self.new_id(),
            role,
            tuple(gpus),
            self.now,
            ready_s,
            kv_capacity=self.kv_capacity,
        )
        self.instances[inst.id] = inst
        self._gpus_changed()
        self._push(ready_s, READY, inst)
        return inst

    def _gpus_changed(self) -> None:
        allocated = sum(len(i.gpus) for i in self.instances.values() if i.state != "released")
        self.gpu_timeline.append((self.now, allocated))

    def serving(self, role: str) -> list[SimInstance]:
        return [
            i
            for i in self.instances.values()
            if i.role == role and i.state == "serving" and not i.draining
        ]

    def active(self, role: str) -> list[SimInstance]:
        """Serving or loading (the autoscaler counts both)."""
        return [
            i
            for i in self.instances.values()
            if i.role == role and i.state in ("serving", "loading") and not i.draining
        ]

    def _ready(self, inst: SimInstance) -> None:
        if inst.state != "loading":
            return
        if self.now < inst.ready_s:  # a live pair kept it busy past its load
            self._push(inst.ready_s, READY, inst)
            return
        inst.state = "serving"
        inst.idle_since_s = self.now
        if inst.role == "prefill":
            self._rebalance()
        else:
            self._admit_backlog()

    def _rebalance(self) -> None:
        """New prefill capacity: queued requests (none started yet) are routed again, oldest
        first, so they spread over every serving prefill instance."""
        waiting = list(self.backlog)
        self.backlog.clear()
        for inst in self.serving("prefill"):
            waiting.extend(inst.queue)
            inst.queue.clear()
            inst.queued_tokens = 0
        for request in sorted(waiting, key=lambda r: (r.arrival_s, r.id)):
            self._route(request)

    def release(self, inst: SimInstance) -> None:
        """Stop routing to ``inst``; it is released once its work is done."""
        inst.draining = True
        self._maybe_release(inst)

    def _maybe_release(self, inst: SimInstance) -> None:
        if not inst.draining or inst.state == "released":
            return
        if inst.role == "prefill" and (inst.queue or inst.busy_until_s > self.now):
            return
        if inst.role == "decode" and (
            inst.running or any(f.target is inst for f in self.kv_flows.values())
        ):
            return
        self._release(inst, at_s=self.now)

    def _release(self, inst: SimInstance, *, at_s: float) -> None:
        inst.state = "released"
        inst.released_s = at_s
        self.system.released(self, inst)
        self._gpus_changed()

    def mutate(self, inst: SimInstance) -> None:
        """A prefill instance becomes a decode instance in place; its queue is routed again."""
        waiting = list(inst.queue)
        inst.queue.clear()
        inst.queued_tokens = 0
        inst.role = "decode"
        inst.kv_used = 0.0
        for request in waiting:
            self._route(request)
        if inst.state == "serving":
            self._admit_backlog()

    # --- requests ---------------------------------------------------------------------------

    def _arrive(self, request: SimRequest) -> None:
        self.recent_prompt.append((self.now, request.prompt_tokens))
        self._recent_prompt_tokens += request.prompt_tokens
        self._route(request)
        self._watch_prefill_bound()

    def _watch_prefill_bound(self) -> None:
        """Note when prefill demand first passes the autoscaler's high mark (the detection
        delay of the next scale-up runs from here)."""
        high = getattr(self.autoscaler, "high", None)
        if high is None or self.hot_since_s is not None:
            return
        horizon = self.now - _WINDOW_S
        while self.recent_prompt and self.recent_prompt[0][0] < horizon:
            self._recent_prompt_tokens -= self.recent_prompt.popleft()[1]
        queued = sum(i.queued_tokens for i in self.serving("prefill"))
        capacity = len(self.active("prefill")) * self._prefill_capacity()
        if capacity <= 0 or (self._recent_prompt_tokens + queued) / _WINDOW_S > high * capacity:
            self.hot_since_s = self.now

    def _prefill_capacity(self) -> float:
        """Prompt tokens per second one prefill instance processes at a full token budget."""
        return self.token_budget / self._prefill_s(
            self.token_budget, max(1, self.token_budget // 1024)
        )

    def _route(self, request: SimRequest) -> None:
        candidates = self.serving("prefill")
        if not candidates:
            self.backlog.append(request)
            return
        inst = min(candidates, key=lambda i: (i.queued_tokens, i.id))
        inst.queue.append(request)
        inst.queued_tokens += request.prompt_tokens
        self._start_prefill(inst)

    def _prefill_s(self, tokens: int, requests: int) -> float:
        key = (tokens, requests)
        if key not in self._prefill_cost:
            self._prefill_cost[key] = self.model.num_layers * self.compute.prefill_layer_s(
                tokens, requests=requests
            ) + self.compute.head_s(requests)
        return self._prefill_cost[key]

    def _start_prefill(self, inst: SimInstance) -> None:
        if inst.state != "serving" or inst.busy_until_s > self.now or not inst.queue:
            return
        batch: list[SimRequest] = []
        tokens = 0
        while inst.queue and (
            not batch or tokens + inst.queue[0].prompt_tokens <= self.token_budget
        ):
            request = inst.queue.popleft()
            batch.append(request)
            tokens += request.prompt_tokens
        inst.queued_tokens -= tokens
        inst.busy_until_s = self.now + self._prefill_s(tokens, len(batch))
        self._push(inst.busy_until_s, PREFILL_DONE, (inst, batch))

    def _prefill_done(self, payload: tuple[SimInstance, list[SimRequest]]) -> None:
        inst, batch = payload
        if inst.state == "released":
            for request in batch:  # its host failed mid-batch: prefill again elsewhere
                request.restarts += 1
                self._route(request)
            return
        for request in batch:
            self.first_token(request, inst)
        inst.idle_since_s = self.now
        self._start_prefill(inst)
        self._maybe_release(inst)

    def first_token(self, request: SimRequest, source: SimInstance) -> None:
        """The prefill of ``request`` is done on ``source``: emit its first token, send its KV."""
        if math.isnan(request.first_token_s):
            request.first_token_s = self.now
        request.tokens_done = 1
        if request.output_tokens <= 1:
            self._finish(request)
            return
        target = self._decode_target(request)
        if target is None:
            self.decode_backlog.append((request, source))
        else:
            self._send_kv(request, source, target)

    def relay(self, request: SimRequest, old: SimInstance, done_s: float) -> None:
        """``request`` leaves ``old``'s queue for a live pair; its prefill ends at ``done_s``."""
        self._push(done_s, LIVE_DONE, (request, old))

    def hold(self, inst: SimInstance, until_s: float) -> None:
        """``inst`` is busy (with a live pair's blocks) until ``until_s``."""
        inst.busy_until_s = max(inst.busy_until_s, until_s)
        self._push(until_s, WAKE, inst)

    def _wake(self, inst: SimInstance) -> None:
        self._start_prefill(inst)
        self._maybe_release(inst)

    def _live_done(self, payload: tuple[SimRequest, SimInstance]) -> None:
        request, old = payload
        if old.state == "released":
            request.restarts += 1
            self._route(request)
            return
        self.first_token(request, old)

    # --- KV transfers -----------------------------------------------------------------------

    def _kv_need(self, request: SimRequest) -> float:
        return (request.prompt_tokens + request.output_tokens) * self.kv_per_token

    def _decode_target(self, request: SimRequest) -> SimInstance | None:
        need = self._kv_need(request)
        fits = [i for i in self.serving("decode") if i.kv_capacity - i.kv_used >= need]
        if not fits:
            return None
        target = max(fits, key=lambda i: (i.kv_capacity - i.kv_used, i.id))
        target.kv_used += need
        return target

    def _send_kv(self, request: SimRequest, source: SimInstance, target: SimInstance) -> None:
        size = request.prompt_tokens * self.kv_per_token / self.tp
        self.recent_kv.append((self.now, size * self.tp))
        if source.gpus[0] == target.gpus[0] or size <= 0:
            self._join_decode(request, target)
            return
        self._advance_kv()
        self._kv_seq += 1
        flow = self.topology.flow(source.gpus[0], target.gpus[0], name=f"kv{request.id}")
        self.kv_flows[self._kv_seq] = _KvFlow(flow, request, source, target, size)
        self._reshare()

    def _advance_kv(self) -> None:
        elapsed = self.now - self._kv_last
        for kv in self.kv_flows.values():
            kv.remaining = max(0.0, kv.remaining - kv.rate * elapsed)
        self._kv_last = self.now

    def _reshare(self) -> None:
        if not self.kv_flows:
            return
        ids = list(self.kv_flows)
        loads = [f for start, end, f in self.weight_flows if start <= self.now < end]
        rates = self.topology.fair_share([self.kv_flows[i].flow for i in ids] + loads)
        for fid, rate in zip(ids, rates, strict=False):
            kv = self.kv_flows[fid]
            kv.rate = rate
            kv.version += 1
            self._push(self.now + kv.remaining / rate, KV_DONE, (fid, kv.version))

    def _kv_done(self, payload: tuple[int, int]) -> None:
        fid, version = payload
        kv = self.kv_flows.get(fid)
        if kv is None or kv.version != version:
            return
        self._advance_kv()
        del self.kv_flows[fid]
        self._reshare()
        if kv.target.state == "released":
            kv.request.restarts += 1
            self._route(kv.request)
            return
        self._join_decode(kv.request, kv.target)

    def _join_decode(self, request: SimRequest, target: SimInstance) -> None:
        target.running.append(request)
        if not target.stepping:
            target.stepping = True
            self._schedule_step(target)

    def _admit_backlog(self) -> None:
        while self.decode_backlog:
            request, source = self.decode_backlog[0]
            target = self._decode_target(request)
            if target is None:
                return
            self.decode_backlog.popleft()
            self._send_kv(request, source, target)

    # --- decode -----------------------------------------------------------------------------

    def _decode_s(self, batch: int, context: int) -> float:
        key = (batch, context // 64)
        if key not in self._decode_cost:
            self._decode_cost[key] = self.model.num_layers * self.compute.decode_layer_s(
                batch, (context // 64) * 64
            ) + self.compute.head_s(batch)
        return self._decode_cost[key]

    def _schedule_step(self, inst: SimInstance) -> None:
        batch = inst.running[: self.max_decode_batch]
        context = sum(r.prompt_tokens + r.tokens_done for r in batch) // len(batch)
        self._push(self.now + self._decode_s(len(batch), context), DECODE_STEP, (inst, len(batch)))

    def _decode_step(self, payload: tuple[SimInstance, int]) -> None:
        inst, size = payload
        if inst.state == "released":
            return
        finished = []
        for request in inst.running[:size]:
            request.tokens_done += 1
            if request.tokens_done >= request.output_tokens:
                self._finish(request)
                finished.append(request)
        if finished:
            done = set(map(id, finished))
            inst.running = [r for r in inst.running if id(r) not in done]
            inst.kv_used = max(0.0, inst.kv_used - sum(self._kv_need(r) for r in finished))
            self._admit_backlog()
        if inst.running:
            self._schedule_step(inst)
        else:
            inst.stepping = False
            inst.idle_since_s = self.now
            self._maybe_release(inst)

    # --- autoscaling ------------------------------------------------------------------------

    def load(self) -> Load:
        horizon = self.now - _WINDOW_S
        while self.recent_prompt and self.recent_prompt[0][0] < horizon:
            self._recent_prompt_tokens -= self.recent_prompt.popleft()[1]
        while self.recent_kv and self.recent_kv[0][0] < horizon:
            self.recent_kv.popleft()
        queued = sum(
            i.queued_tokens
            for i in self.instances.values()
            if i.role == "prefill" and i.state != "released"
        ) + sum(r.prompt_tokens for r in self.backlog)
        demand = (self._recent_prompt_tokens + queued) / _WINDOW_S
        decode = self.active("decode")
        nic = self._nic_ingress()
        return Load(
            now_s=self.now,
            prefill_instances=len(self.active("prefill")),
            decode_instances=len(decode),
            prefill_demand_tokens_per_s=demand,
            prefill_capacity_tokens_per_s=self._prefill_capacity(),
            kv_used_bytes=sum(i.kv_used for i in decode)
            + sum(self._kv_need(r) for r, _ in self.decode_backlog),
            kv_capacity_bytes=self.kv_capacity,
            kv_arrival_bytes_per_s=sum(b for _, b in self.recent_kv) / _WINDOW_S,
            kv_ingress_bytes_per_s=nic,
        )

    def _nic_ingress(self) -> float:
        gpu = self.topology.gpus()[0]
        nic = self.topology.nic_of(gpu)
        leaf = self.topology.leaf_of_nic(nic)
        per_gpu = self.topology.bytes_per_s((leaf, nic)) if leaf else math.inf
        return per_gpu * self.tp

    def _tick(self, _: Any) -> None:
        if self.autoscaler is None:
            return
        load = self.load()
        decision = self.autoscaler.decide(load)
        if decision.prefill > 0 or decision.decode > 0:
            if self.hot_since_s is None:
                self.hot_since_s = self.now
        elif self.hot_since_s is not None and self.now - self.hot_since_s > _WINDOW_S:
            self.hot_since_s = None  # a passing spike that never asked for more
        if decision.prefill or decision.decode:
            self.system.scale(self, decision)
        if not self._all_done():
            self._push(self.now + self.autoscaler.interval_s, TICK, None)

    def record_scale(self, decision: ScaleDecision, first_s: float, full_s: float) -> None:
        detected = self.hot_since_s if self.hot_since_s is not None else self.now
        self.scale_events.append(
            ScaleEvent(
                self.now,
                detected,
                decision.reason,
                decision.prefill,
                decision.decode,
                first_s,
                full_s,
            )
        )
        self.hot_since_s = None

    def idle_instance(self, role: str, idle_s: float) -> SimInstance | None:
        """A serving instance of ``role`` idle for at least ``idle_s``, if any."""
        for inst in sorted(self.serving(role), key=lambda i: i.id, reverse=True):
            busy = inst.queue or inst.busy_until_s > self.now or inst.running
            if not busy and self.now - inst.idle_since_s >= idle_s:
                return inst
        return None

    def snapshot(self) -> ClusterState:
        """The cluster as plan() sees it: instances with queues and KV use; loading instances
        hold their GPUs but are no sources."""
        topology = self.system.topology_now(self)
        state = ClusterState(topology, models=[self.model])
        if self.now < self.copy_restored_s:
            state.pool.drop(self.model.identity)  # the host copy is being rebuilt
        for inst in self.instances.values():
            if inst.state == "released":
                continue
            role = Role.LOADING if inst.state == "loading" else Role(inst.role)
            queue = [QueuedRequest(r.arrival_s - self.now, r.prompt_tokens) for r in inst.queue]
            state.add_instance(
                self.model,
                gpus=list(inst.gpus),
                role=role,
                queue=queue,
                kv_bytes_used=int(inst.kv_used),
                instance_id=inst.id,
            )
        return state

    def add_weight_flows(self, flows: Sequence[Flow], end_s: float) -> None:
        self.weight_flows = [w for w in self.weight_flows if w[1] > self.now]
        self.weight_flows.extend((self.now, end_s, f) for f in flows)

    # --- faults -----------------------------------------------------------------------------

    def _fail(self, host: str) -> None:
        self.failed_hosts.append((self.now, host))
        self.failed_gpus |= set(self.topology.gpus_of_host(host))
        self._advance_kv()
        for fid, kv in list(self.kv_flows.items()):
            if host in (
                self.topology.host_of(kv.source.gpus[0]),
                self.topology.host_of(kv.target.gpus[0]),
            ):
                del self.kv_flows[fid]
                kv.target.kv_used = max(0.0, kv.target.kv_used - self._kv_need(kv.request))
                kv.request.restarts += 1
                self._route(kv.request)
        self._reshare()
        for inst in list(self.instances.values()):
            if inst.state == "released" or self.topology.host_of(inst.gpus[0]) != host:
                continue
            orphans = list(inst.queue) + list(inst.running)
            inst.queue.clear()
            inst.running = []
            self._release(inst, at_s=self.now)
            for request in orphans:
                request.restarts += 1
                request.tokens_done = 0
                self._route(request)
        lost = [r for r, s in self.decode_backlog if s.state == "released"]
        self.decode_backlog = deque((r, s) for r, s in self.decode_backlog if s.state != "released")
        for request in lost:  # its KV cache died with the prefill instance
            request.restarts += 1
            self._route(request)
        restore_s = self.system.host_copy_lost(self, host)
        if restore_s is not None:
            self.no_host_copy_s += restore_s
            self.copy_restored_s = self.now + restore_s
            self._push(self.copy_restored_s, RESTORE, host)

    def _restore(self, host: str) -> None:
        """The host copy is back (the next snapshot places it on a surviving host)."""
        del host
