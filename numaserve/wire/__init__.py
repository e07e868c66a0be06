"""What crosses a ZeroMQ socket, at the ground of the shared base (it imports nothing else of
numaserve's):

- `protocol.py`: the protocol both sides of each socket speak (frames, message types, error
  codes, the checks of a text);
- `curve.py`: CurveZMQ's key files, their checks, and each side's sockets;
- `run.py`: a job a router shard sends an instance (RUN), typed, checked once where it is
  taken;
- `control.py`: the supervisor's control socket's lines, and the CLI's end of it.

A client's request, whose keys its task checks, is checked in tasks/requests.py."""
