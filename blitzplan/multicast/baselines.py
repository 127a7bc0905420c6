"""Baseline data planes under the same cost model, each returning the same plan structure.

* ``allcache``: every new GPU copies its shard from its own host's DRAM (an AllCache hit).
* ``serverlessllm``: a cache miss: each host reads the model from its SSD into DRAM, and its new
  GPUs copy their shards from DRAM as the units land (pipelined SSD -> DRAM -> GPU).
* ``one_by_one``: the best eligible source sends the whole shard to each new instance in turn.
* ``binomial``: a binomial tree (lambda-Scale style): in round ``r`` every holder sends the whole
  model to one new instance, store and forward, so holders double each round.
* ``ring``: one topology-blind chain (NCCL-style broadcast) through the new instances in name
  order, from the best source's own GPUs, no NVLink sharding.

Baselines never stripe a node's receive: every new instance is its own node and each of its GPUs
receives its full shard.
"""

from __future__ import annotations

from collections.abc import Callable

from blitzplan.multicast.assemble import Built, run
from blitzplan.multicast.setup import Problem, hop_lanes
from blitzplan.multicast.timeline import PlanBuilder
from blitzplan.multicast.types import Chain, NewInstance, NodeKind, PlanNode

__all__ = ["BASELINES"]


def _instance_builder(problem: Problem, sources: tuple[PlanNode, ...]) -> PlanBuilder:
    """Sources, then one unstriped target node per new instance."""
    builder = PlanBuilder(problem.topology)
    for node in sources:
        builder.add_node(node)
    for inst in problem.instances:
        node_id = builder.add_node(
            PlanNode(
                0,
                NodeKind.TARGET,
                inst.name,
                gpus=inst.gpus,
                egress=tuple((g, g) for g in inst.gpus),
                tp=problem.tp,
            )
        )
        builder.instances.append(NewInstance(inst.name, inst.gpus, node_id, inst.startup_s))
    return builder


def _target_ids(builder: PlanBuilder) -> list[int]:
    return [inst.node for inst in builder.instances]


def allcache(problem: Problem) -> Built:
    builder = _instance_builder(problem, ())
    topo = problem.topology
    caches: dict[str, int] = {}
    for target in _target_ids(builder):
        host = topo.host_of(builder.nodes[target].gpus[0])
        if host not in caches:
            memory = topo.host_mem(host)
            caches[host] = builder.add_node(
                PlanNode(
                    0,
                    NodeKind.CACHE,
                    f"DRAM cache on {host}",
                    memory=memory,
                    egress=((memory, memory),),
                )
            )
        lanes = hop_lanes(builder.nodes[caches[host]], builder.nodes[target], full_shard=True)
        builder.add_hop(caches[host], target, lanes)
    return run(problem, builder, ())


def serverlessllm(problem: Problem) -> Built:
    builder = _instance_builder(problem, ())
    topo = problem.topology
    stages: dict[str, int] = {}
    for target in _target_ids(builder):
        host = topo.host_of(builder.nodes[target].gpus[0])
        if host not in stages:
            ssd, memory = topo.ssd(host), topo.host_mem(host)
            disk = builder.add_node(
                PlanNode(
                    0,
                    NodeKind.CACHE,
                    f"SSD on {host}",
                    memory=ssd,
                    egress=((ssd, ssd),),
                )
            )
            stages[host] = builder.add_node(
                PlanNode(
                    0,
                    NodeKind.STAGE,
                    f"DRAM on {host}",
                    memory=memory,
                    egress=((memory, memory),),
                    tp=problem.tp,
                )
            )
            builder.add_hop(disk, stages[host], [(ssd, ssd, memory, 1.0, 0)])
        lanes = hop_lanes(builder.nodes[stages[host]], builder.nodes[target], full_shard=True)
        builder.add_hop(stages[host], target, lanes)
    return run(problem, builder, ())


def one_by_one(problem: Problem) -> Built:
    builder = _instance_builder(problem, problem.sources[:1])
    previous: list[int] = []
    for phase, target in enumerate(_target_ids(builder)):
        lanes = hop_lanes(builder.nodes[0], builder.nodes[target], full_shard=True)
        previous = [builder.add_hop(0, target, lanes, phase=phase, after=previous)]
    return run(problem, builder, ())


def binomial(problem: Problem) -> Built:
    builder = _instance_builder(problem, problem.sources[:1])
    waiting = _target_ids(builder)
    holders: list[int] = [0]
    last_round: list[int] = []
    phase = 0
    while waiting:
        this_round = []
        for sender in list(holders):
            if not waiting:
                break
            target = waiting.pop(0)
            lanes = hop_lanes(builder.nodes[sender], builder.nodes[target], full_shard=True)
            this_round.append(
                builder.add_hop(
                    sender, target, lanes, phase=phase, pipelined=False, after=last_round
                )
            )
            holders.append(target)
        last_round, phase = this_round, phase + 1
    return run(problem, builder, ())


def ring(problem: Problem) -> Built:
    best = problem.sources[0]
    own = tuple((g, g) for g in best.gpus) if best.gpus else best.egress[:1]
    builder = _instance_builder(problem, (PlanNode(**{**best.__dict__, "egress": own}),))
    sender = 0
    targets = _target_ids(builder)
    for target in targets:
        lanes = hop_lanes(builder.nodes[sender], builder.nodes[target], full_shard=True)
        builder.add_hop(sender, target, lanes)
        sender = target
    return run(problem, builder, (Chain(0, tuple(targets)),))


BASELINES: dict[str, Callable[[Problem], Built]] = {
    "allcache": allcache,
    "serverlessllm": serverlessllm,
    "one_by_one": one_by_one,
    "binomial": binomial,
    "ring": ring,
}
"""Baseline data planes by method name."""
