"""Planners: the BlitzScale greedy, its local search, and the baseline data planes; each builds
lanes through the allocation stage and times them through the timeline stage.
"""
