"""Baseline data planes under the same cost model, each returning the same plan structure.

* ``allcache``: every new GPU copies its shard from its own host's DRAM (an AllCache hit).
* ``serverlessllm``: a cache miss: each host reads the model from its SSD into DRAM, and its new
  GPUs copy their shards from DRAM as the units land (pipelined SSD -> DRAM -> GPU).
* ``one_by_one``: the widest source sends the whole shard to each new instance in turn.
* ``binomial``: a binomial tree (lambda-Scale style): in round ``r`` every holder sends the whole
  model to one new instance, store and forward, so holders double each round.
* ``ring``: one topology-blind chain (NCCL-style broadcast) through the new instances in name
  order, from the widest source's own GPUs, no NVLink sharding.

Baselines never stripe: every new instance is its own node and each of its GPUs receives its
whole shard over one lane per holder it needs (one, or several when the source's TP is finer).
Their lanes are not paced.
"""

from __future__ import annotations

from collections.abc import Callable

from blitzplan.multicast.allocation.plan_builder import PlanBuilder
from blitzplan.multicast.allocation.ports import ports
from blitzplan.multicast.plan_types import ALL_RANKS, NewInstance, NodeKind, PlanNode
from blitzplan.multicast.setup.holdings import holder_segments
from blitzplan.multicast.setup.problem import Problem
from blitzplan.multicast.timeline.assemble import Built, run

__all__ = ["BASELINES", "full_shards"]


def _instance_builder(problem: Problem, sources: tuple[PlanNode, ...]) -> PlanBuilder:
    """Sources, then one unstriped target node per new instance."""
    builder = PlanBuilder(problem.topology)
    for node in sources:
        builder.add_node(node)
    for inst in problem.instances:
        present = problem.delivered.get(inst.name, ())
        node_id = builder.add_node(
            PlanNode(
                0,
                NodeKind.TARGET,
                inst.name,
                gpus=inst.gpus,
                exits=inst.gpus,
                tp=problem.tp,
                present=present if any(present) else (),
            )
        )
        builder.instances.append(NewInstance(inst.name, inst.gpus, node_id, inst.startup_s))
    return builder


def full_shards(builder: PlanBuilder, hop: int, sender: PlanNode, receiver: PlanNode) -> None:
    """Lanes giving every GPU of ``receiver`` its whole shard from what ``sender`` holds."""
    for dst in receiver.gpus:
        rank = receiver.rank_of(dst)
        if rank is None:
            continue
        if sender.memory is not None:
            exit_ = sender.exits[0] if sender.exits else sender.memory
            builder.add_lane(hop, sender.memory, exit_, dst, rank, 0.0, 1.0)
        elif sender.kind is NodeKind.INSTANCE:
            for lo, hi, q in holder_segments(sender.tp, rank, receiver.tp):
                builder.add_lane(hop, sender.gpus[q], sender.gpus[q], dst, rank, lo, hi)
        else:
            holder = next(g for g in sender.gpus if sender.rank_of(g) == rank)
            builder.add_lane(hop, holder, holder, dst, rank, 0.0, 1.0)


def _targets(builder: PlanBuilder) -> list[int]:
    return [inst.node for inst in builder.instances]


def _widest_source(problem: Problem) -> PlanNode:
    port = ports(problem, problem.sources)
    return max(problem.sources, key=lambda n: (port.egress(n.id), n.kind is NodeKind.INSTANCE))


def _cache(builder: PlanBuilder, host: str, kind: NodeKind, memory: str, label: str) -> int:
    return builder.add_node(PlanNode(0, kind, label, memory=memory))


def allcache(problem: Problem) -> Built:
    builder = _instance_builder(problem, ())
    topo = problem.topology
    caches: dict[str, int] = {}
    for target in _targets(builder):
        host = topo.host_of(builder.nodes[target].gpus[0])
        if host not in caches:
            caches[host] = _cache(
                builder, host, NodeKind.CACHE, topo.host_mem(host), f"DRAM cache on {host}"
            )
        hop = builder.hop(caches[host], target)
        full_shards(builder, hop, builder.nodes[caches[host]], builder.nodes[target])
    return run(problem, builder, ())


def serverlessllm(problem: Problem) -> Built:
    builder = _instance_builder(problem, ())
    topo = problem.topology
    stages: dict[str, int] = {}
    for target in _targets(builder):
        host = topo.host_of(builder.nodes[target].gpus[0])
        if host not in stages:
            ssd, memory = topo.ssd(host), topo.host_mem(host)
            disk = _cache(builder, host, NodeKind.CACHE, ssd, f"SSD on {host}")
            stages[host] = builder.add_node(
                PlanNode(0, NodeKind.STAGE, f"DRAM on {host}", memory=memory, tp=problem.tp)
            )
            hop = builder.hop(disk, stages[host])
            builder.add_lane(hop, ssd, ssd, memory, ALL_RANKS, 0.0, 1.0)
        hop = builder.hop(stages[host], target)
        full_shards(builder, hop, builder.nodes[stages[host]], builder.nodes[target])
    return run(problem, builder, ())


def one_by_one(problem: Problem) -> Built:
    builder = _instance_builder(problem, (_widest_source(problem),))
    previous: list[int] = []
    for phase, target in enumerate(_targets(builder)):
        hop = builder.hop(0, target, phase=phase, after=previous)
        full_shards(builder, hop, builder.nodes[0], builder.nodes[target])
        previous = [hop]
    return run(problem, builder, ())


def binomial(problem: Problem) -> Built:
    builder = _instance_builder(problem, (_widest_source(problem),))
    waiting = _targets(builder)
    holders: list[int] = [0]
    last_round: list[int] = []
    phase = 0
    while waiting:
        this_round = []
        for sender in list(holders):
            if not waiting:
                break
            target = waiting.pop(0)
            hop = builder.hop(sender, target, phase=phase, pipelined=False, after=last_round)
            full_shards(builder, hop, builder.nodes[sender], builder.nodes[target])
            this_round.append(hop)
            holders.append(target)
        last_round, phase = this_round, phase + 1
    return run(problem, builder, ())


def ring(problem: Problem) -> Built:
    best = _widest_source(problem)
    own = best.gpus if best.gpus else best.exits[:1]
    builder = _instance_builder(problem, (PlanNode(**{**best.__dict__, "exits": own}),))
    sender = 0
    for target in _targets(builder):
        hop = builder.hop(sender, target)
        full_shards(builder, hop, builder.nodes[sender], builder.nodes[target])
        sender = target
    return run(problem, builder, ())


BASELINES: dict[str, Callable[[Problem], Built]] = {
    "allcache": allcache,
    "serverlessllm": serverlessllm,
    "one_by_one": one_by_one,
    "binomial": binomial,
    "ring": ring,
}
"""Baseline data planes by method name."""
