"""The max-flow bound's graph: the topology as a sparse integer graph, restricted to the edges a
plan may use (see :mod:`~blitzplan.multicast.bound.lower_bound`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from blitzplan.multicast.setup.problem import Problem
from blitzplan.topologies import Topology

__all__ = ["MB", "FlowGraph", "base_arrays"]

MB = 1e6
"""Capacities are whole MB/s (rounded up, so the flow is never underestimated)."""
_BIG = 2**30


class FlowGraph:
    """The topology as a sparse integer graph for :func:`scipy.sparse.csgraph.maximum_flow`.

    Edges a plan may not use carry capacity 0; a super-source feeds every holder and every new
    instance GPU has an edge to a super-sink whose capacity is opened per query."""

    def __init__(self, problem: Problem, extra_holders: Iterable[str] = ()) -> None:
        from scipy.sparse import csr_matrix

        topo = problem.topology
        base = base_arrays(topo)
        n = len(base["names"])
        index = base["index"]
        self.source, self.sink, self.size = n, n + 1, n + 2
        passes = base["routing"].copy()
        for name in self._transit(problem):
            passes[index[name]] = True
        exit_nics, entry_nics = self._nics(problem)
        exit_ok = np.zeros(n, dtype=bool)
        entry_ok = np.zeros(n, dtype=bool)
        exit_ok[[index[x] for x in exit_nics]] = True
        entry_ok[[index[x] for x in entry_nics]] = True
        u, v = base["u"], base["v"]
        is_nic, is_fabric = base["nic"], base["fabric"]
        usable = passes[u] & passes[v]
        usable &= ~(is_nic[u] & is_fabric[v] & ~exit_ok[u])
        usable &= ~(is_fabric[u] & is_nic[v] & ~entry_ok[v])
        residual = np.fromiter((problem.residual[e] for e in base["edges"]), dtype=float)
        caps = np.where(usable, np.minimum(np.ceil(residual / MB), _BIG), 0).astype(np.int64)
        holders = [index[h] for h in holder_nodes(problem) | set(extra_holders)]
        gpus = sorted({index[g] for t in problem.targets for g in t.gpus})
        rows = np.concatenate([u, np.full(len(holders), self.source), gpus])
        cols = np.concatenate([v, holders, np.full(len(gpus), self.sink)])
        data = np.concatenate([caps, np.full(len(holders), _BIG), np.zeros(len(gpus))])
        matrix = csr_matrix((data.astype(np.int32), (rows, cols)), shape=(self.size, self.size))
        matrix.sort_indices()
        self.matrix = matrix
        self.exit_slots: dict[str, list[int]] = {}
        for k in np.nonzero(usable & is_nic[u] & is_fabric[v])[0]:
            a, b = int(u[k]), int(v[k])
            lo, hi = matrix.indptr[a], matrix.indptr[a + 1]
            slot = lo + int(np.searchsorted(matrix.indices[lo:hi], b))
            host = str(topo.graph.nodes[base["names"][a]]["host"])
            self.exit_slots.setdefault(host, []).append(slot)
        self.sink_slot = {}
        for g in gpus:
            lo, hi = matrix.indptr[g], matrix.indptr[g + 1]
            where = lo + int(np.searchsorted(matrix.indices[lo:hi], self.sink))
            self.sink_slot[base["names"][g]] = where
        self.index = index

    @staticmethod
    def _transit(problem: Problem) -> set[str]:
        nodes = holder_nodes(problem)
        for node in (*problem.sources, *problem.targets):
            nodes |= {e for e in node.exits if problem.topology.kind(e) == "gpu"}
            nodes |= set(node.gpus) | set(node.relays)
        return nodes

    @staticmethod
    def _nics(problem: Problem) -> tuple[set[str], set[str]]:
        topo = problem.topology
        exits = {
            e if topo.kind(e) == "nic" else topo.nic_of(e)
            for node in (*problem.sources, *problem.targets)
            for e in node.exits
        }
        exits |= {topo.nic_of(g) for t in problem.targets if t.present for g in t.gpus}
        entries = {topo.nic_of(g) for t in problem.targets for g in (*t.gpus, *t.relays)}
        return exits, entries

    def max_flow(self, sinks: Iterable[str], *, host: str | None = None) -> float:
        """Max-flow from every holder into ``sinks``, in bytes per second (rounded up). With
        ``host``, no flow leaves by a NIC of that host (a lane to a GPU of the same host never
        takes a NIC)."""
        from scipy.sparse import csr_matrix
        from scipy.sparse.csgraph import maximum_flow

        data = self.matrix.data.copy()
        for gpu in sinks:
            data[self.sink_slot[gpu]] = _BIG
        for slot in self.exit_slots.get(host or "", []):
            data[slot] = 0
        matrix = csr_matrix(
            (data, self.matrix.indices, self.matrix.indptr), shape=self.matrix.shape
        )
        return float(maximum_flow(matrix, self.source, self.sink).flow_value) * MB


def base_arrays(topo: Topology) -> dict[str, Any]:
    """Index arrays of the topology's nodes and edges (cached on the topology)."""
    cached = topo.memo.get("flow_graph")
    if cached is not None:
        return cached["base"]  # type: ignore[no-any-return]
    names = list(topo.graph.nodes)
    index = {name: i for i, name in enumerate(names)}
    edges = list(topo.graph.edges)
    kinds = [topo.kind(n) for n in names]
    fabric = [topo.graph.nodes[n].get("switch") in ("leaf", "spine") for n in names]
    base: dict[str, Any] = {
        "names": names,
        "index": index,
        "edges": edges,
        "u": np.array([index[a] for a, _ in edges], dtype=np.int64),
        "v": np.array([index[b] for _, b in edges], dtype=np.int64),
        "routing": np.array([k in ("switch", "nic") for k in kinds], dtype=bool),
        "nic": np.array([k == "nic" for k in kinds], dtype=bool),
        "fabric": np.array(fabric, dtype=bool),
    }
    topo.memo["flow_graph"] = {"base": base}
    return base


def holder_nodes(problem: Problem) -> set[str]:
    nodes = {n for s in problem.sources for n in s.host_local_nodes}
    nodes |= {g for t in problem.targets if t.present for g in t.gpus}
    return nodes
