"""What crosses a ZeroMQ socket: the protocol both sides of each socket speak (`protocol.py`:
frames, message types, error codes), a client's request checked completely (`requests.py`)
and CurveZMQ's key files and sockets (`curve.py`)."""
