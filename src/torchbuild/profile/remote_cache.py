"""A compile cache shared by a site's builds: ccache's remote storage (ccache >= 4.7) behind
the local cache, from the profile's ccache_remote and ccache_remote_readonly.

    problem        why a ccache_remote URL is refused (None: taken): redis, http or https only,
                   a host, no credentials (profiles are recorded in manifests and image labels),
                   no characters a shell or ccache's `|attribute` syntax would read, and
                   nothing ccache's own URL parser refuses (a port :06379, an empty port,
                   a %zone, [ or ] in the path, a stray %)
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
    return _ccache_url_problem(url)


# ccache (4.4 on) reads the URL with its bundled URL parser (cxxurl, src/third_party/url.cpp),
# stricter than Python's urlsplit: a URL it cannot parse makes every compile fail ("Cannot parse
# URL"). Its rules, for what _SAFE lets through: a port is 1 to 5 digits without a leading zero
# (no `:06379`, no empty `host:`); a host is a name of letters, digits and -._~+ or an IP literal
# in brackets ([::1], never a zone: [::1%eth0]); the path holds no [ or ], and every % starts
# two hex digits. Checked here, where the profile is resolved; `invoke doctor` also runs this
# host's ccache with the URL (doctor/host.py, ccache_remote_check).
_PORT = re.compile(r"[1-9][0-9]{0,4}")
_REG_NAME = re.compile(r"[A-Za-z0-9._~+-]+")
_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")


def _ccache_url_problem(url: str) -> str | None:
    """Why ccache's URL parser refuses url (which problem() otherwise took), or None."""
    rest = url.partition("://")[2]
    authority, slash, path = rest.partition("/")
    if authority.startswith("["):
        literal, bracket, after = authority[1:].partition("]")
        if not bracket:
            return f"{url!r} opens an address with [ but never closes it"
        try:
            ipaddress.IPv6Address(literal)
        except ValueError:
            return f"{url!r}: [{literal}] is not an IPv6 address"
        if "%" in literal:  # Python's ipaddress takes a zone (fe80::1%eth0), ccache does not
            return f"{url!r}: [{literal}] names a zone (%...), which ccache does not take; give the address alone"
        port = after[1:] if after.startswith(":") else None
        if after and port is None:
            return f"{url!r}: after ] comes :PORT or the path"
    else:
        host, colon, port_text = authority.partition(":")
        if not _REG_NAME.fullmatch(host):
            return f"{url!r}: the host {host!r} holds a character ccache does not take in a host name"
        port = port_text if colon else None
    if port is not None and not (_PORT.fullmatch(port) and int(port) <= 65535):
        return f"{url!r}: the port {port!r} is not a number from 1 to 65535 without leading zeros"
    if slash and ("[" in path or "]" in path):
        return f"{url!r}: the path holds [ or ], which ccache refuses (write %5B and %5D)"
    if _PERCENT.search(path):
        return f"{url!r}: a % in the path is not followed by two hex digits (write %25 for a %)"
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
