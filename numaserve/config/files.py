"""The paths a config file names, read as its author meant them: against the file's own
directory, not whatever directory the server was started from (systemd starts it in /)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from numaserve.checkpoint.paths import path_against


def read_against(config, base: Path | None, named: bool):
    """`config` (a config.Config) with its relative paths read against `base`, the config
    file's directory; as it is for a config that is no file (base None)."""
    if base is None:
        return config
    if named:
        models = tuple(
            dataclasses.replace(m, path=path_against(m.path, base)) for m in config.models
        )
        config = dataclasses.replace(config, models=models)
    else:  # the one model; `models` is made from it again
        model = dataclasses.replace(config.model, path=path_against(config.model.path, base))
        config = dataclasses.replace(config, model=model, models=())
    server = config.server
    curve = server.curve and dataclasses.replace(
        server.curve,
        secret_key_file=_file(server.curve.secret_key_file, base),
        authorized_keys_dir=_file(server.curve.authorized_keys_dir, base),
    )
    keys = server.http_api_keys_file and _file(server.http_api_keys_file, base)
    server = dataclasses.replace(server, curve=curve, http_api_keys_file=keys)
    return dataclasses.replace(config, server=server)


def _file(path: str, base: Path) -> str:
    return os.path.normpath(base / Path(path).expanduser())
