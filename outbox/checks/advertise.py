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


def _unspecified(host: str) -> bool:
    """``0.0.0.0`` or ``::``: an address to listen on, never one to reach."""
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return host == ""


def warn_unreachable(host: str | None, url: str, advertise_url: str | None) -> None:
    """Warn when a checker on another host could not reach an endpoint listening on ``host``
    and announced at ``advertise_url`` (None: ``url``, the address it listens on): the address
    announced is a loopback one, or the "any address" ``0.0.0.0`` (a checker connecting to it
    reaches its own host), or a remote one while the endpoint listens on loopback only (right
    only behind a proxy on this host, such as a service-mesh sidecar). ``host`` None: not known
    here (an ASGI app is served by someone else's server)."""
    announced = advertise_url or url
    advertised = urllib.parse.urlsplit(announced).hostname or ""
    fix = (
        "In a deployment, serve on host='0.0.0.0' (OUTBOX_CHECK_HOST) and advertise an address "
        "the checker reaches (OUTBOX_CHECK_ADVERTISE_URL: a pod IP, a Service name)"
    )
    if _loopback(advertised):
        log.warning(
            "the check endpoint listens on %s and advertises %s: only a checker on this host "
            "can reach it. %s",
            host,
            announced,
            fix,
        )
    elif _unspecified(advertised):
        log.warning(
            "the check endpoint listens on %s and advertises %s, which is no address a checker "
            "can reach (it would connect to its own host). %s",
            host,
            announced,
            fix,
        )
    elif host is not None and _loopback(host):
        log.warning(
            "the check endpoint listens on %s (this host only) but advertises %s: a checker "
            "elsewhere cannot reach it unless a proxy on this host forwards to it. Serve on "
            "host='0.0.0.0' (OUTBOX_CHECK_HOST)",
            host,
            announced,
        )
