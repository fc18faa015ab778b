"""A compile cache shared by a site's builds: ccache's remote storage (ccache >= 4.7) behind
the local cache, from the profile's ccache_remote and ccache_remote_readonly.

    problem        why a ccache_remote URL is refused (None: taken): redis, http or https only,
                   a host, no credentials (profiles are recorded in manifests and image labels),
                   no characters a shell or ccache's `|attribute` syntax would read
    storage_env    CCACHE_REMOTE_STORAGE (with `|read-only`) and CCACHE_NOREMOTE_ONLY, or {}
    endpoint       (scheme, host, port) the doctor asks
    container_warning  what to say when a build container cannot reach the URL's host (its
                   loopback is the container's own), or None
    remote_counts  the remote counters of `ccache --print-stats`, and what one warning says when
                   the storage failed (ccache then goes on with the local cache alone)
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from urllib.parse import urlsplit

SCHEMES = {"redis": 6379, "http": 80, "https": 443}
# what a URL may hold: no shell metacharacters, spaces, quotes, '|' (ccache's attributes) or '@'
_SAFE = re.compile(r"[A-Za-z0-9._~:/%\[\]+-]+")
_LIMIT = 400


def problem(url: str) -> str | None:
    """Why url cannot be a ccache_remote, or None when it can ('' too: no remote cache)."""
    if not url:
        return None
    if len(url) > _LIMIT:
        return f"is longer than {_LIMIT} characters"
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if scheme not in SCHEMES:
        return f"{url[:60]!r} is not a redis://, http:// or https:// URL"
    if "@" in url:
        return "carries credentials (user:password@); a profile is recorded in manifests and images"
    if not _SAFE.fullmatch(url):
        bad = sorted({c for c in url if not _SAFE.fullmatch(c)})
        return f"{url!r} holds {''.join(bad)!r}, which a URL for ccache may not"
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises on a port out of range
    except ValueError as exc:
        return f"{url!r} is malformed ({exc})"
    if not parts.hostname:
        return f"{url!r} names no host"
    if parts.port == 0:
        return f"{url!r} names port 0, which no storage listens on"
    return None


def storage_env(url: str, readonly: bool) -> dict[str, str]:
    """What ccache reads: the storage behind the local cache (CCACHE_NOREMOTE_ONLY: the local
    cache stays the first level), read-only when asked; {} without a URL."""
    if not url:
        return {}
    return {
        "CCACHE_REMOTE_STORAGE": url + ("|read-only" if readonly else ""),
        "CCACHE_NOREMOTE_ONLY": "true",  # ccache refuses CCACHE_REMOTE_ONLY=false
    }


def endpoint(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of a URL problem() took, the scheme's port when none is given."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, parts.hostname or "", parts.port or SCHEMES[scheme]


def container_warning(url: str) -> str | None:
    """One line when url's host is this machine's loopback (localhost, 127.0.0.0/8, ::1), which
    a container on Docker's bridge does not share: its ccache would fail every lookup and build
    from the local cache alone. None for any other host, or without a URL."""
    if not url:
        return None
    host = endpoint(url)[1]
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host.lower() == "localhost" or host.lower().endswith(".localhost")
    if not loopback:
        return None
    return (
        f"torchbuild: warning: ccache_remote {url} is this machine's loopback, which the build "
        "container does not share: it will build from its local cache alone. Name the storage by "
        "an address the container reaches (the host's own, or the Docker bridge's gateway)"
    )


# ccache >= 4.7 --print-stats keys -> the manifest's names
REMOTE_COUNTERS = {
    "local_hits": "local_storage_hit",
    "remote_hits": "remote_storage_hit",
    "remote_misses": "remote_storage_miss",
    "remote_errors": "remote_storage_error",
    "remote_timeouts": "remote_storage_timeout",
}


def remote_counts(stats: Mapping[str, int]) -> dict[str, int]:
    """The local and remote storage counters of `ccache --print-stats` (0 when ccache is older
    or had no remote storage)."""
    return {name: stats.get(key, 0) for name, key in REMOTE_COUNTERS.items()}


def failure_warning(counts: Mapping[str, int]) -> str | None:
    """One line when the remote storage failed (ccache went on with the local cache), else None."""
    failed = counts.get("remote_errors", 0) + counts.get("remote_timeouts", 0)
    if not failed:
        return None
    return (
        f"torchbuild: warning: the remote compile cache (ccache_remote) failed {failed} time(s): "
        "this build used the local cache alone for those compiles (run `invoke doctor --profile P` to check it)"
    )
