"""Bound: a certified lower bound on any plan's objective under the cost model (cuts and
max-flows on the topology).
"""
