"""Setup: where the new instances go, who may send, what each holder holds and what each link
has left for weights (the :class:`~blitzplan.multicast.setup.problem.Problem` every later stage
reads).
"""
