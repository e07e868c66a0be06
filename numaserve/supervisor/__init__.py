"""Runs a Plan as processes and keeps them running.

`arbiter` is the loop and the per-slot state machine; `children` holds the states and the
restart policy; `reload` a rolling restart; `processes` and `router_link` are its edges to the
OS and to the router; `sdnotify` its edge to systemd. Nothing here imports the router or a
model runtime: the children are started by their command lines (processes/specs.py).
"""
