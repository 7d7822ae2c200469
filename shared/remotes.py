"""A project's push remote as the user gives it: an https:// or http:// URL, or the absolute path of a repository.

Both services read it here: the ingress refuses a bad one with a 422 before anything is queued, the executor
checks it again (and, for a path, what is on disk) when it records it and before each push. The remote is the
user's data: a push never reads it (nor a rewriting `insteadOf`) from the repository's config, which a spawn may
have written. What is refused, and why:
- ssh (`ssh://`, `host:path`) and `git://`: the push runs in a sandbox with no ssh and a proxy that speaks HTTP;
- credentials in the URL (`user:token@`): they would be kept in the database and the journal, shown in the page;
- `file://`, relative paths, `..`, control characters: give the real absolute path.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath
from urllib.parse import urlsplit

MAX_CHARS = 2000
SCHEMES = ("https", "http")


@dataclass(frozen=True, slots=True)
class Remote:
    """A checked push remote: `url` as given (stripped); `path` for a local repository, else `host` and `port`."""

    url: str
    path: PurePosixPath | None = None
    scheme: str | None = None
    host: str | None = None
    port: int | None = None

    @property
    def is_path(self) -> bool:
        return self.path is not None

    @property
    def allow_entry(self) -> str:
        """The one host:port a network remote's sandbox may reach (bracketed when an IPv6 address)."""
        assert self.host is not None and self.port is not None
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse(raw: str) -> Remote:
    """The remote, or ValueError with the reason a user can act on."""
    url = raw.strip()
    if not url:
        raise ValueError("push_remote is empty")
    if len(url) > MAX_CHARS:
        raise ValueError(f"push_remote is longer than {MAX_CHARS} characters")
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in url):
        raise ValueError("push_remote contains a control character")
    if url.startswith("/"):
        return _path(url)
    scheme = url.partition("://")[0].lower() if "://" in url else None
    if scheme in SCHEMES:
        return _network(url, scheme)
    if scheme == "file":
        raise ValueError(f"push_remote {url!r}: give the repository's absolute path, not a file:// URL")
    if scheme in ("ssh", "git", "git+ssh", "ssh+git") or (scheme is None and ":" in url):
        raise ValueError(f"push_remote {url!r}: ssh and git:// remotes are not supported (the push runs in a "
                         "sandbox without ssh); give an https:// URL or a local repository's absolute path")
    raise ValueError(f"push_remote {url!r} must be an https:// or http:// URL or the absolute path of a repository")


def _path(url: str) -> Remote:
    path = PurePosixPath(url)
    if ".." in path.parts:
        raise ValueError(f"push_remote {url!r} may not contain '..'; give the real path")
    if path == PurePosixPath("/"):
        raise ValueError("push_remote may not be /")
    return Remote(url=url, path=path)


def _network(url: str, scheme: str) -> Remote:
    parts = urlsplit(url)
    if "@" in parts.netloc:
        raise ValueError("push_remote may not carry credentials (user:token@): they would be stored and shown; the "
                         "push sends none")
    if parts.query or parts.fragment:
        raise ValueError(f"push_remote {url!r} may not have a query or a fragment")
    try:
        port = parts.port or (443 if scheme == "https" else 80)
    except ValueError:
        raise ValueError(f"push_remote {url!r} has an invalid port") from None
    host = (parts.hostname or "").lower()
    if not host or any(ch.isspace() for ch in host):
        raise ValueError(f"push_remote {url!r} has no host")
    if parts.path in ("", "/"):
        raise ValueError(f"push_remote {url!r} names no repository (a path after the host)")
    return Remote(url=url, scheme=scheme, host=host, port=port)
