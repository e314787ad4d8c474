"""A target's address, parsed once: ``scheme://[user:password@]host[:port]/path[?query]``.

What the path and query mean is the transport's (``transports.registry.TRANSPORTS``): a URL path for HTTP, a topic for
Kafka, a virtual host and a queue or exchange for AMQP. The password is never printed or recorded.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import quote, urlsplit

from core import secrets, tls

TRANSPORTS: dict[str, type] = {}
"""URL scheme -> the target class that serves it: ``transports.registry.TRANSPORTS`` is this dict, filled as that package
is imported (importing this module imports the package first). A spec reads the transports and imports none."""


@dataclass(frozen=True)
class TargetSpec:
    scheme: str          # a key of transports.registry.TRANSPORTS
    host: str
    port: int
    path: str            # URL path (HTTP), topic (Kafka), virtual host (AMQP 0-9-1), address (AMQP 1.0)
    userinfo: str | None = field(default=None, repr=False, compare=False)
    """``user:password`` when the URL names a user: basic auth over HTTP, SASL PLAIN over AMQP; never printed or
    recorded. A user without a password in the URL takes ``FLIGHTWATCH_TARGET_PASSWORD`` (``core.secrets``)."""
    query: str = ""      # the transport's options (AMQP: queue, exchange, routing_key, ...)
    tls: tls.Tls | None = None
    """A TLS scheme's (``amqps``, ``amqp1s``, ``https``): the CA its certificate is checked against (``core.tls``)."""

    @classmethod
    def parse(cls, text: str) -> TargetSpec:
        """``ValueError`` naming the URL (password hidden) and what is wrong with it."""
        u = urlsplit(text)
        shown = redacted(text, u)
        if u.scheme not in TRANSPORTS or not u.hostname:
            raise ValueError(f"bad target {shown!r}: use " + ", ".join(t.EXAMPLE for t in _unique(TRANSPORTS.values())))
        kind = TRANSPORTS[u.scheme]
        try:
            port = u.port or (kind.TLS_PORT if u.scheme in _secure(kind).values() else kind.DEFAULT_PORT)
        except ValueError:
            raise ValueError(f"bad target {shown!r}: bad port") from None
        try:
            userinfo = secrets.userinfo(u.username, u.password)
            path = kind.check(u.scheme, u.path, userinfo, u.query)
            secure = tls.Tls.of(u.scheme, u.query, _secure(kind))
        except ValueError as e:
            raise ValueError(f"bad target {shown!r}: {e}") from None
        return cls(u.scheme, u.hostname, port, path, userinfo, u.query, secure)

    def __str__(self) -> str:
        path = self.path if self.path.startswith("/") else "/" + self.path  # an AMQP 1.0 address may start with /
        return f"{self.scheme}://{self.host}:{self.port}{path}" + (f"?{self.query}" if self.query else "")

    def with_user(self) -> str:
        """The URL with its user and without the password, as a child process is given it (``secrets.child_env``
        hands it the password)."""
        user = secrets.user_of(self.userinfo)
        plain = str(self)
        if user is None:
            return plain
        scheme, rest = plain.split("://", 1)
        return f"{scheme}://{quote(user, safe='')}@{rest}"

    def reachable(self, timeout_s: float = 3.0) -> str | None:
        """None if the target's place answers (its transport says how: a TCP connection opens), else why not."""
        return TRANSPORTS[self.scheme].reachable(self, timeout_s)


def redacted(text: str, u=None) -> str:
    """The URL as it may be shown: any password replaced by ***."""
    u = u or urlsplit(text)
    try:
        return text.replace(f":{u.password}@", ":***@", 1) if u.password else text
    except ValueError:
        return text


def _unique(items) -> list:
    out = []
    for item in items:
        if item not in out:
            out.append(item)
    return out


def _secure(kind) -> dict[str, str]:
    """A target class's plain schemes with their TLS forms (``Target.SECURE``; a transport of your own may have none)."""
    return getattr(kind, "SECURE", {})
