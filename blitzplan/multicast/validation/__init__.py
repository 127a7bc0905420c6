"""Validation: the independent checker of any MulticastPlan against the cluster, the cost model
and the bytes each holder holds.
"""
