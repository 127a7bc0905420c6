"""Timeline: when every lane's units land (fair-share rates per phase, then the pipelined
recurrence), and the evaluated plan frozen into a MulticastPlan.
"""
