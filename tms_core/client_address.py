"""The address of the client that sent a request, for everything that counts or records one.

The throttles (the API's, trigger URLs', callbacks'), the login lockout (django-axes), the audit
log and the ``/metrics`` allow-list all ask :func:`client_address`, so they agree on who asked.

``X-Forwarded-For`` is written by whoever sends the request, so it is believed only as far as
it was written by a proxy of ``TMS_TRUSTED_PROXIES`` (addresses or CIDR networks): with none
configured (the default) the client is the peer (``REMOTE_ADDR``) and the header is ignored.
Behind configured proxies the header is read from its end, where the nearest proxy appended
the address it saw, skipping each hop that is itself a trusted proxy: the first address that is
not one is the client's. What a client put in the header itself is never reached, so a client
cannot choose the address it is counted or recorded under.
"""

from __future__ import annotations

import ipaddress
from functools import lru_cache
from typing import Any

from tms_core.conf import tms_settings

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@lru_cache(maxsize=8)
def _networks(entries: tuple[str, ...]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(entry, strict=False) for entry in entries)


def _address(text: str) -> Address | None:
    """``text`` as an address; a port some proxies add (``1.2.3.4:5678``, ``[::1]:5678``) is left out."""
    text = text.strip()
    if text.startswith("[") and "]" in text:
        text = text[1 : text.index("]")]
    elif text.count(":") == 1:
        text = text.partition(":")[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        return address.ipv4_mapped
    return address


def _trusted(address: Address, networks: tuple[Network, ...]) -> bool:
    return any(address.version == network.version and address in network for network in networks)


def client_address(request: Any) -> str | None:
    """The client's address for ``request`` (a Django or DRF request), or None when the peer's
    is unknown. See the module docstring for when ``X-Forwarded-For`` is believed."""
    peer_text = request.META.get("REMOTE_ADDR") or ""
    networks = _networks(tuple(tms_settings().TRUSTED_PROXIES))
    peer = _address(peer_text)
    if peer is None:
        return peer_text or None
    if not networks or not _trusted(peer, networks):
        return str(peer)
    nearest = peer
    hops = [hop for hop in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if hop.strip()]
    for hop in reversed(hops):
        address = _address(hop)
        if address is None:
            # No trusted proxy writes this: the last address a trusted proxy vouched for stands.
            return str(nearest)
        if not _trusted(address, networks):
            return str(address)
        nearest = address
    return str(nearest)
