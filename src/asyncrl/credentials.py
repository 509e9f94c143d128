"""Connection credentials: kept out of logs, metrics, run directories and error messages.

A Redis URL may carry a password (``redis://:secret@host:6379/0``, ``redis://user:secret@host/0``,
``rediss://...`` for TLS). The rules:

* Whatever asyncrl writes or prints shows the URL **masked**: ``redis://:***@host:6379/0``
  (:func:`mask_secrets`, for a URL or any text: config dumps, validation errors, exception messages).
* A masked URL is still usable: the password ``***`` (or no password at all) is taken from the
  environment variable ``ASYNCRL_REDIS_PASSWORD`` when that is set (:func:`resolve_url`). So the
  run directory's ``config.yaml`` never holds the secret, and ``asyncrl train --resume`` works
  with the variable set; services get it from their unit's environment file.
* Bad connection settings fail fast, before any work, with one :class:`~asyncrl.errors.UserError`
  naming the config field (:func:`check_redis`).

**One retry policy for every Redis client** (queue, state store, shared weight store, evaluator,
connection checks): :func:`redis_retry`, redis-py's own :class:`~redis.retry.Retry` with
:class:`~redis.backoff.EqualJitterBackoff` — ``REDIS_RETRIES`` retries on connection errors and
timeouts, waits of 0.1–0.2 s doubling to at most 0.8 s, about 5 s in all — so a Redis restart or a
dropped connection of a few seconds is ridden through instead of crashing a role. Clients are
opened by :func:`open_redis` / :func:`connect`, pinged under the policy (a role started while Redis
restarts waits for it; only a failure that outlasts it is a ``UserError``), and retry nothing on
their own; every operation runs under :func:`with_retries` (one command, a script, a pipeline or a
transaction alike), so the policy is applied exactly once.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote, urlsplit, urlunsplit

from asyncrl.errors import UserError

if TYPE_CHECKING:
    from redis.retry import Retry

T = TypeVar("T")

PASSWORD_ENV = "ASYNCRL_REDIS_PASSWORD"
REDIS_RETRIES = 9
"""Retries after the first try of a Redis operation (connection errors and timeouts only)."""
REDIS_BACKOFF_BASE_S = 0.1
REDIS_BACKOFF_CAP_S = 0.8
MASK = "***"
REDIS_SCHEMES = ("redis", "rediss", "unix")

# scheme://[user]:password@  (the password runs up to the last '@' before the host part)
_CRED_IN_URL = re.compile(r"(?P<head>\b[a-z][a-z0-9+.-]*://[^:/@\s'\"]*):(?P<pw>[^@/\s'\"]+)@", re.IGNORECASE)


def mask_secrets(text: str) -> str:
    """Replace the password of every ``scheme://user:password@`` in ``text`` with ``***``."""
    return _CRED_IN_URL.sub(lambda m: f"{m.group('head')}:{MASK}@", text)


def resolve_url(url: str) -> str:
    """The URL to connect with: a masked (``***``) or absent password comes from ``$ASYNCRL_REDIS_PASSWORD``."""
    parts = urlsplit(url)
    secret = os.environ.get(PASSWORD_ENV)
    if parts.password == MASK and not secret:
        raise UserError(
            f"the Redis URL {url} has a masked password (***), as written to a run directory's config.yaml; "
            f"set the environment variable {PASSWORD_ENV} to the password"
        )
    if secret and parts.password in (None, MASK) and parts.scheme in ("redis", "rediss"):
        host = parts.hostname or ""
        if ":" in host:  # IPv6 literal
            host = f"[{host}]"
        netloc = f"{quote(parts.username or '', safe='')}:{quote(secret, safe='')}@{host}"
        if parts.port:
            netloc += f":{parts.port}"
        return urlunsplit(parts._replace(netloc=netloc))
    return url


def check_url_syntax(url: str, field: str) -> None:
    """Raise :class:`UserError` unless ``url`` looks like a Redis URL (no connection attempted)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a non-numeric port
    except ValueError as exc:
        raise UserError(f"{field} = {mask_secrets(url)!r} is not a valid URL: {exc}") from None
    if parts.scheme not in REDIS_SCHEMES:
        raise UserError(
            f"{field} = {mask_secrets(url)!r}: the scheme must be redis://, rediss:// (TLS) or unix://, "
            "e.g. redis://127.0.0.1:6379/0 or redis://:PASSWORD@host:6379/0"
        )
    if parts.scheme != "unix" and not parts.hostname:
        raise UserError(f"{field} = {mask_secrets(url)!r} names no host, e.g. redis://127.0.0.1:6379/0")


def redis_retry() -> Retry:
    """The retry policy of every Redis operation (see the module docstring)."""
    import redis
    from redis.backoff import EqualJitterBackoff
    from redis.retry import Retry

    return Retry(
        EqualJitterBackoff(cap=REDIS_BACKOFF_CAP_S, base=REDIS_BACKOFF_BASE_S),
        REDIS_RETRIES,
        supported_errors=(redis.ConnectionError, redis.TimeoutError, TimeoutError, ConnectionError),
    )


def with_retries(fn: Callable[[], T]) -> T:
    """Run ``fn`` (one command, script, pipeline or transaction) under :func:`redis_retry`."""
    import redis

    result: T = redis_retry().call_with_retry(
        fn, lambda _error: None, is_retryable=lambda e: not isinstance(e, redis.AuthenticationError)
    )
    return result


def key_prefix(run_dir: str | Path) -> str:
    """A run's Redis key prefix: ``asyncrl:{<sha1 of the absolute run_dir, 12 hex digits>}`` (a Cluster
    hash tag: every key of the run in one slot)."""
    digest = hashlib.sha1(str(Path(run_dir).absolute()).encode()).hexdigest()[:12]
    return f"asyncrl:{{{digest}}}"


def redis_text(value: object) -> str:
    """A Redis reply (bytes, decoded leniently) or any other value, as text."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def open_redis(url: str, field: str, *, socket_timeout_s: float) -> Any:
    """A ``redis.Redis`` client for ``url``, pinged under :func:`redis_retry` (a role started while Redis
    restarts waits for it); run its operations under :func:`with_retries`. Failures: as :func:`connect`.
    ``socket_timeout_s`` is the caller's config section's (``transport``, ``weights``, ``control.state``)."""
    return connect(url, field, timeout_s=5.0, socket_timeout=socket_timeout_s, health_check_interval=30)


def connect(url: str, field: str, *, timeout_s: float = 5.0, **kwargs: Any) -> Any:
    """A ``redis.Redis`` client for ``url``, checked with a PING under :func:`redis_retry`; any failure that
    outlasts the retries is a :class:`UserError`.

    The message names ``field`` and shows the URL masked; it says whether the server could not be
    reached, refused the credentials, or the settings are malformed.
    """
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    check_url_syntax(url, field)
    shown = mask_secrets(url)
    # the client retries nothing itself: redis-py's default (3 retries, up to 10 s apart) would multiply
    # the one policy, which with_retries applies around every operation
    kwargs = {"socket_timeout": timeout_s, "retry": Retry(NoBackoff(), 0), **kwargs}
    try:
        client = redis.Redis.from_url(resolve_url(url), socket_connect_timeout=timeout_s, **kwargs)
        with_retries(client.ping)
    except (redis.AuthenticationError, redis.ResponseError) as exc:
        msg, refused = mask_secrets(str(exc)), isinstance(exc, redis.AuthenticationError)
        needs = urlsplit(resolve_url(url)).password is None if refused else "WRONGPASS" in msg
        if needs or "NOAUTH" in msg:
            raise UserError(
                f"{field}: Redis at {shown} needs a password; put it in the URL (redis://:PASSWORD@host) "
                f"or in ${PASSWORD_ENV}"
            ) from None
        if refused:
            raise UserError(
                f"{field}: Redis at {shown} refused the credentials; check the password in the URL "
                f"or ${PASSWORD_ENV}"
            ) from None
        raise UserError(f"{field}: Redis at {shown} answered with an error: {msg}") from None
    except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
        raise UserError(
            f"{field}: cannot reach Redis at {shown} ({mask_secrets(str(exc))}); is redis-server running "
            "and the host/port right?"
        ) from None
    except ValueError as exc:
        raise UserError(f"{field} = {shown!r} is not usable: {mask_secrets(str(exc))}") from None
    return client


def check_redis(url: str, field: str, *, timeout_s: float = 5.0) -> None:
    """Fail fast (:class:`UserError`) unless Redis at ``url`` answers a PING with these credentials."""
    connect(url, field, timeout_s=timeout_s).close()


def check_connections(cfg: Any) -> None:
    """Fail fast on the run's Redis settings (``transport``, ``weights``, ``control.state``) before any work starts."""
    if cfg.transport.kind == "redis":
        check_redis(cfg.transport.redis_url, "transport.redis_url")
    if cfg.weights.kind == "shared":
        check_redis(cfg.weights.redis_url, "weights.redis_url")
    state = cfg.control.state
    if state.kind == "redis" and state.redis_url:
        check_redis(state.redis_url, "control.state.redis_url")
