"""A server's configuration, the top of the shared base (it may import checkpoint/, wire/ and
tasks/: a config names its tasks and sizes its messages):

- `schema.py`: the schema and its checks (frozen dataclasses; every key, its bounds, its error);
- `files.py`: the paths a file names, read against its directory;
- `ports.py`: the ports a command line moves, over the file's;
- `runtimes.py`: the model runtimes (model.backend), one record each: their precisions,
  what prepare builds and an instance loads;
- `paths.py`: what a pool runs (its model paths by band and micro-batch size), one record
  family for the choice, prepare's record, an instance's READY, status and /info;
- `addresses.py`: `host:port` and endpoints, and whether other hosts reach one;
- `keys_file.py`: the HTTP API keys file's format and rules."""
