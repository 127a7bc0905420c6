"""Exact: exhaustive search of the greedy's decisions, OPTIMAL only on the certified bound."""
