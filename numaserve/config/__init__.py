"""A server's configuration: the schema and its checks (`schema.py`), the paths a file names
(`files.py`), the ports a command line moves (`ports.py`), which backend runs which precision
(`precisions.py`), `host:port` and endpoints (`addresses.py`), where a model's path points
(`model_paths.py`) and the HTTP API keys file (`keys_file.py`)."""
