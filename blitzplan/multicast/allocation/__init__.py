"""Allocation: which sender sends which bytes of each target node (ports, the widest-matrix
allocation, its linear-programming refinement), written as lanes into a
:class:`~blitzplan.multicast.allocation.plan_builder.PlanBuilder`.
"""
