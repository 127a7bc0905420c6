"""Exact live-scaling schedules: the MILP (PuLP: HiGHS or CBC), CP-SAT and enumeration models.

Each imports its solver library only when it runs; :func:`blitzplan.schedule_live` picks them by
``method`` and ``backend``. The backend table and ``SolveStatus`` are in :mod:`blitzplan.solvers`.
"""
