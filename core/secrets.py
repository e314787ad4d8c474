"""A target's login, kept off command lines: a URL may name its user alone (``amqp://fw@host:5671/orders?...``), and
the password comes from ``FLIGHTWATCH_TARGET_PASSWORD``, itself the password or ``@FILE`` (a file holding it, as the
telemetry's Kafka options take secrets). A password written in the URL still works, and is never printed.

    userinfo("fw", None)        # "fw:<the password from the environment>"
    userinfo("fw", "s3cret")    # "fw:s3cret"
    child_env(spec.userinfo)    # the environment for a process given the URL without its password
"""
from __future__ import annotations

import os
from urllib.parse import unquote

from core import settings

PASSWORD_ENV = "FLIGHTWATCH_TARGET_PASSWORD"


def resolve(value: str, what: str) -> str:
    """``value`` itself, or with a leading ``@`` the first line of that file; ``ValueError`` naming ``what`` if the
    file cannot be read (its path, never its content)."""
    if not value.startswith("@"):
        return value
    try:
        with open(value[1:]) as f:
            return f.read().strip()
    except OSError as e:
        raise ValueError(f"{what}: cannot read {value[1:]}: {e.strerror or e}") from None


def env_password() -> str | None:
    """``FLIGHTWATCH_TARGET_PASSWORD``, read (``@FILE``), or None when it is not set."""
    value = settings.get(PASSWORD_ENV)
    return None if value is None else resolve(value, PASSWORD_ENV)


def userinfo(username: str | None, password: str | None) -> str | None:
    """``user:password`` from a URL's parts (percent-encoded as in the URL): None without a user; a user without a
    password takes ``FLIGHTWATCH_TARGET_PASSWORD`` (an empty password when it is not set)."""
    if username is None:
        return None
    if password is None or password == "":
        return f"{unquote(username)}:{env_password() or ''}"
    return f"{unquote(username)}:{unquote(password)}"


def user_of(info: str | None) -> str | None:
    """The user of ``user:password`` (None without one)."""
    return None if info is None else info.partition(":")[0]


def child_env(info: str | None, env: dict | None = None) -> dict:
    """``env`` (the process's own by default) for a child given the URL with its user alone: the password in
    ``FLIGHTWATCH_TARGET_PASSWORD`` (a process's environment is readable only by its user, unlike its command line)."""
    out = dict(os.environ if env is None else env)
    if info is not None:
        out[PASSWORD_ENV] = info.partition(":")[2]
    return out
