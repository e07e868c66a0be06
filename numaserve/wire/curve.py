"""CurveZMQ on the client endpoint: key files, their checks, the server's side and the client's.

ZeroMQ's own encryption and authentication (the zguide's "Ironhouse"): the server has a key
pair and knows its clients' public keys; a client has a key pair and knows the server's
public key. The files are pyzmq's certificates (`zmq.auth.create_certificates`), which
`numaserve keygen` writes: NAME.key holds the public key, NAME.key_secret both.

A client whose key is not authorised fails in the handshake, answered by the authenticator's
thread, once per connection; one speaking plaintext to a CURVE socket fails in libzmq's I/O
thread. Neither message reaches the router's loop.
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

log = logging.getLogger("numaserve.wire.curve")
ZAP_DOMAIN = "numaserve"


class CurveError(ValueError):
    """A key file that is missing, unreadable, malformed or readable by anyone."""


def keygen(directory: str | os.PathLike, name: str) -> tuple[Path, Path]:
    """Write NAME.key (public) and NAME.key_secret (the pair, mode 0600) in `directory`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    public, secret = (directory / f"{name}.key"), (directory / f"{name}.key_secret")
    for path in (public, secret):
        if path.exists():
            raise CurveError(f"{path} exists: remove it first, or choose another name")
    old = os.umask(0o077)  # the secret is never readable by others, not even for a moment
    try:
        zmq.auth.create_certificates(str(directory), name)
    finally:
        os.umask(old)
    public.chmod(0o644)
    return public, secret


def read_key_pair(path: str | os.PathLike, what: str) -> tuple[bytes, bytes]:
    """(public, secret) from a NAME.key_secret file that only its owner and group may read."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
        public, secret = zmq.auth.load_certificate(str(path))
    except FileNotFoundError:
        raise CurveError(f"{what} {path}: no such file (numaserve keygen writes one)") from None
    except PermissionError:
        raise CurveError(f"{what} {path}: not readable by this user (uid {os.getuid()})") from None
    except (OSError, ValueError) as e:
        raise CurveError(f"{what} {path}: not a key pair: {e}") from None
    if secret is None:
        raise CurveError(
            f"{what} {path}: holds only a public key; give the .key_secret file of the pair"
        )
    if mode & (stat.S_IROTH | stat.S_IWOTH | stat.S_IWGRP):
        raise CurveError(
            f"{what} {path}: readable or writable by others (mode {stat.filemode(mode)}); "
            f"anyone who reads it can pose as its owner: chmod 600 {path} (or 640, for a group)"
        )
    return public, secret


def read_public_key(value: str | bytes | os.PathLike, what: str) -> bytes:
    """A public key: its 40 Z85 characters, or a key file (NAME.key, or NAME.key_secret)."""
    text = value.decode() if isinstance(value, bytes) else str(value)
    if len(text) == 40 and not Path(text).exists():
        try:
            z85.decode(text)
        except (KeyError, ValueError):  # a character outside Z85's alphabet is a KeyError
            raise CurveError(f"{what} {text!r}: not a Z85 key, nor a file") from None
        return text.encode()
    try:
        public, _ = zmq.auth.load_certificate(text)
    except (OSError, ValueError) as e:
        raise CurveError(f"{what} {text}: not a public key or a key file: {e}") from None
    return public


@dataclass(frozen=True)
class ClientKeys:
    """What a client needs: the server's public key, and its own pair."""

    server: bytes
    public: bytes
    secret: bytes

    @classmethod
    def load(cls, server_key: str | bytes | os.PathLike, client_key: str | os.PathLike):
        """`server_key`: the server's public key or key file; `client_key`: the client's
        NAME.key_secret."""
        public, secret = read_key_pair(client_key, "client key")
        return cls(read_public_key(server_key, "server key"), public, secret)

    def apply(self, sock: zmq.Socket) -> None:
        """Before connect: the socket speaks CURVE to the server."""
        sock.curve_serverkey = self.server
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret


class AuthorizedKeys:
    """The public keys in a directory (every *.key file), read again whenever the directory
    changes: a key added or removed applies to the next connection, with no restart."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        self.keys: frozenset[bytes] = frozenset()
        self.read_at: int | None = None
        self.refresh()

    def refresh(self) -> None:
        changed = self.directory.stat().st_mtime_ns
        if changed == self.read_at:
            return
        keys = set()
        for path in sorted(self.directory.glob("*.key")):
            try:
                keys.add(zmq.auth.load_certificate(str(path))[0])
            except (OSError, ValueError) as e:
                log.warning("authorized key %s skipped: %s", path, e)
        self.keys, self.read_at = frozenset(keys), changed
        log.info("%d authorized client key(s) in %s", len(keys), self.directory)

    def callback(self, domain: str, key: bytes) -> bool:
        """pyzmq's credentials-provider hook: `key` in Z85."""
        try:
            self.refresh()
        except OSError as e:  # the directory went away: keep the keys last read
            log.warning("cannot read %s: %s", self.directory, e)
        return key in self.keys


def server_keys(secret_key_file: str, authorized_keys_dir: str):
    """(public, secret, AuthorizedKeys) of a server; CurveError for a key pair or a key
    directory that cannot serve."""
    public, secret = read_key_pair(secret_key_file, "server.curve.secret_key_file")
    directory = Path(authorized_keys_dir)
    if not directory.is_dir():
        raise CurveError(
            f"server.curve.authorized_keys_dir {directory}: not a directory; put each client's "
            "public key (NAME.key, from numaserve keygen) there"
        )
    try:
        return public, secret, AuthorizedKeys(directory)
    except OSError as e:
        raise CurveError(f"server.curve.authorized_keys_dir {directory}: {e.strerror}") from None


def serve(ctx: zmq.Context, sock: zmq.Socket, secret_key_file: str, authorized_keys_dir: str):
    """Make `sock` (before it binds) a CURVE server that admits the authorised keys; returns
    the authenticator, to stop at close."""
    public, secret, keys = server_keys(secret_key_file, authorized_keys_dir)
    auth = ThreadAuthenticator(ctx)
    auth.start()
    auth.configure_curve_callback(ZAP_DOMAIN, credentials_provider=keys)
    sock.zap_domain = ZAP_DOMAIN.encode()
    sock.curve_server = True
    sock.curve_publickey = public
    sock.curve_secretkey = secret
    return auth
