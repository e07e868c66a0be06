"""A server's configuration, the top of the shared base (it may import checkpoint/, wire/ and
tasks/: a config names its tasks and sizes its messages):

- `schema.py`: the schema and its checks (frozen dataclasses; every key, its bounds, its error);
- `files.py`: the paths a file names, read against its directory;
- `ports.py`: the ports a command line moves, over the file's;
- `precisions.py`: which backend runs which precision;
- `addresses.py`: `host:port` and endpoints, and whether other hosts reach one;
- `keys_file.py`: the HTTP API keys file's format and rules."""
