"""The server seen from outside: Prometheus metrics, /healthz and /readyz, on server.metrics.

`snapshot.py` is what the supervisor hands over, `exposition.py` turns it into Prometheus'
metric families and `health.py` into probe verdicts (both pure), and `endpoint.py` is the HTTP
server, the only part here that reads /proc and /sys.
"""
