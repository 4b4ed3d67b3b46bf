"""Where a producer's check endpoint is reached: warnings for addresses a checker cannot use.

A checker reaches an endpoint at the URL its heartbeat advertises (:mod:`outbox.registry`). The
default — listen on loopback and advertise that — is right on a laptop and wrong everywhere else:
the checker on another host finds the instance live, cannot reach it, and after
``no_producer_timeout_s`` gives its transactions up. Nothing fails at start, so say it there.
"""

from __future__ import annotations

import ipaddress
import logging
import urllib.parse

log = logging.getLogger("outbox.checks")


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def warn_unreachable(host: str, url: str, advertise_url: str | None) -> None:
    """Warn when a checker on another host could not reach an endpoint listening on ``host``:
    it advertises the loopback address it listens on, or a remote address while it listens
    on loopback only (right only behind a proxy on this host, such as a service-mesh sidecar)."""
    if not _loopback(host):
        return
    if advertise_url is None:
        log.warning(
            "the check endpoint listens on %s and advertises %s: only a checker on this host "
            "can reach it. In a deployment, serve on host='0.0.0.0' (OUTBOX_CHECK_HOST) and "
            "advertise an address the checker reaches (OUTBOX_CHECK_ADVERTISE_URL: a pod IP, a "
            "Service name)",
            host,
            url,
        )
        return
    advertised = urllib.parse.urlsplit(advertise_url).hostname or ""
    if not _loopback(advertised):
        log.warning(
            "the check endpoint listens on %s (this host only) but advertises %s: a checker "
            "elsewhere cannot reach it unless a proxy on this host forwards to it. Serve on "
            "host='0.0.0.0' (OUTBOX_CHECK_HOST)",
            host,
            advertise_url,
        )
