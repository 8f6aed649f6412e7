"""Authentication of the Relay page: the caller's Airflow JWT, checked by Airflow's own auth manager.

Why here: Airflow mounts a plugin's FastAPI app as is, without its authentication. So every route of
the page depends on :func:`require_user`, which takes the token the way Airflow's API does (an
``Authorization: Bearer`` header first, else the ``_token`` cookie the UI sets at login) and hands it
to ``get_auth_manager().get_user_from_token``: signature, expiry, audience and revocation are checked
by the configured auth manager with its configured secret or keys, no crypto of ours. A missing,
forged, expired or revoked token is a 401 (Airflow's API answers 403 for a forged one; a page has no
use for telling the two apart). Authorization is the auth manager's too: the page is the custom view
``Relay`` (read), which the simple auth manager grants to viewers and up.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import HTTPException, Request, status

log = logging.getLogger(__name__)

COOKIE = "_token"  # airflow.api_fastapi.auth.managers.base_auth_manager.COOKIE_NAME_JWT_TOKEN
RESOURCE = "Relay"


def token_of(request: Request) -> str | None:
    """The Bearer token if one is given (it wins, as in Airflow's API), else the UI's cookie."""
    header = request.headers.get("authorization", "")
    scheme, _, credentials = header.partition(" ")
    if scheme.lower() == "bearer" and credentials.strip():
        return credentials.strip()
    return request.cookies.get(COOKIE) or None


def _unauthorized(detail: str) -> HTTPException:
    return HTTPException(
        status_code=status.HTTP_401_UNAUTHORIZED, detail=detail, headers={"WWW-Authenticate": "Bearer"}
    )


async def require_user(request: Request) -> Any:
    """The Airflow user behind the request's token; 401 without a valid one, 403 without access."""
    token = token_of(request)
    if not token:
        raise _unauthorized("Not authenticated: log in to Airflow")
    # Imported here: the plugin module is also loaded by the scheduler and the workers, which
    # never serve the page and need not import the API server.
    from airflow.api_fastapi.app import get_auth_manager
    from jwt import InvalidTokenError

    manager = get_auth_manager()
    try:
        user = await manager.get_user_from_token(token)
    except InvalidTokenError as exc:  # ExpiredSignatureError is one too
        log.info("relay page: token refused: %s", type(exc).__name__)
        raise _unauthorized("Invalid or expired token: log in to Airflow again") from None
    if not manager.is_authorized_custom_view(method="GET", resource_name=RESOURCE, user=user):
        raise HTTPException(status_code=status.HTTP_403_FORBIDDEN, detail="No access to the Relay page")
    return user
