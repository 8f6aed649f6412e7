"""The signing key of the Spark REST submission server, and the short-lived tokens made with it.

Why: the REST server (``/v1/submissions/create``) starts any program on the cluster for whoever can
reach it. Spark 4's standalone master refuses ``spark.authenticate.secret`` with the REST server on;
the protection it offers is ``org.apache.spark.ui.JWSFilter``: every request must carry
``Authorization: Bearer <JWS>`` signed HS256 with a shared key (base64url of 32 random bytes), or it
is answered 403. The embedded stack generates the key once, in a 0600 file under the data dir; the
master reads it from a 0600 properties file (never its command line, where ``ps`` would show it);
Relay's client signs each request with a token valid for a minute. The key is never logged.
"""

from __future__ import annotations

import base64
import binascii
import os
import time
from pathlib import Path

import jwt

from relay.config import RelayConfig
from relay.config.secret_files import create_private
from relay.errors import ConfigError

KEY_BYTES = 32
TOKEN_TTL_S = 60.0
JWS_FILTER = "org.apache.spark.ui.JWSFilter"


def encode_key(raw: bytes) -> str:
    """base64url without padding: the form the JWS filter's ``secretKey`` parameter takes."""
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_key(text: str, where: str = "the Spark REST key") -> bytes:
    """The raw key bytes; ConfigError (naming ``where``, never the key) if malformed or too short."""
    value = text.strip()
    try:
        raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
    except (binascii.Error, ValueError) as exc:
        raise ConfigError(f"{where} is not base64url text") from exc
    if len(raw) < KEY_BYTES:
        raise ConfigError(f"{where} holds {len(raw)} bytes; HS256 needs at least {KEY_BYTES}")
    return raw


def ensure_secret_file(path: Path) -> bool:
    """Create the key file once (0600, folder 0700); True when created, False when it existed.

    An existing key is checked, so a damaged file fails here and not as 403s later.
    """
    if create_private(path, encode_key(os.urandom(KEY_BYTES)) + "\n"):
        return True
    decode_key(path.read_text(), str(path))
    return False


def read_secret_file(path: Path) -> str:
    """The key text of ``path`` (validated)."""
    try:
        text = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read the Spark REST key file {path}: {exc.strerror}") from exc
    decode_key(text, str(path))
    return text


def master_properties(key_text: str) -> dict[str, str]:
    """Spark properties that make the master's REST server require tokens signed with the key."""
    return {
        "spark.master.rest.filters": JWS_FILTER,
        f"spark.{JWS_FILTER}.param.secretKey": key_text,
        "spark.ui.killEnabled": "false",  # Relay kills through REST; no kill links in the web UI
    }


class RestSigner:
    """Makes ``Authorization`` headers for the REST server: a fresh HS256 JWS per request."""

    def __init__(self, key: bytes, ttl_s: float = TOKEN_TTL_S) -> None:
        self._key = key
        self.ttl_s = ttl_s

    def __repr__(self) -> str:
        return "RestSigner(key=***)"

    @classmethod
    def from_text(cls, text: str, where: str = "the Spark REST key") -> RestSigner:
        return cls(decode_key(text, where))

    def token(self) -> str:
        """Valid for ``ttl_s``: a token seen in a proxy log is useless a minute later."""
        now = int(time.time())
        claims = {"iss": "relay", "iat": now, "exp": now + int(self.ttl_s)}
        return jwt.encode(claims, self._key, algorithm="HS256")

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token()}"}


def refusal(reason: str, signed: bool) -> str:
    """Why the REST server answered 401/403 and what to check (never the key or the token)."""
    if not signed:
        return (
            f"{reason}: the REST server requires a signed token and no key is configured "
            "(set RELAY_SPARK_REST_SECRET_FILE to the master's key file)"
        )
    return f"{reason}: the token was rejected (is the configured key the one the master uses?)"


def signer_for(config: RelayConfig) -> RestSigner | None:
    """The signer of ``config``'s REST server: its key, or the key file; None when there is none.

    None (unsigned requests) only when no key was configured and the default file does not exist:
    a REST server that needs tokens then answers 403, and the error says where the key goes. A key
    file named explicitly (RELAY_SPARK_REST_SECRET_FILE) must exist.
    """
    if config.spark_rest_secret:
        return RestSigner.from_text(config.spark_rest_secret, "the configured Spark REST key")
    path = config.spark_rest_secret_path
    if config.spark_rest_secret_file is None and not path.exists():
        return None
    return RestSigner.from_text(read_secret_file(path), str(path))
