"""Where webhooks may go: allowed and denied networks, checked on the address a request connects to.

The check runs on resolved addresses, when each connection is made (the resolver below is the
connector's only way to a name's addresses, and an address literal is checked before the request):
a name that resolves to an allowed address now and to a denied one later (DNS rebinding) is
checked again on its next connection, and a connection always goes to an address that was
checked. The request keeps the URL's host name for its Host header and TLS server name. A reused
keep-alive connection goes to the address it was checked on.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from tickler.config import DEFAULT_DENIED_NETWORKS, Network, Settings, parse_networks

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class DestinationDenied(Exception):
    """A receiver's address that the policy refuses: no request was sent."""


@dataclass(frozen=True)
class DestinationPolicy:
    allow: tuple[Network, ...] = ()  # empty: anywhere not denied
    deny: tuple[Network, ...] = parse_networks("TICKLER_WEBHOOK_DENY_NETWORKS", DEFAULT_DENIED_NETWORKS)

    @classmethod
    def from_settings(cls, settings: Settings) -> DestinationPolicy:
        return cls(
            allow=parse_networks("TICKLER_WEBHOOK_ALLOW_NETWORKS", settings.webhook_allow_networks),
            deny=parse_networks("TICKLER_WEBHOOK_DENY_NETWORKS", settings.webhook_deny_networks),
        )

    def refusal(self, address: str) -> str | None:
        """Why a request may not connect to `address` (an IP address), or None when it may."""
        found: Address = ipaddress.ip_address(address.split("%", 1)[0])  # an IPv6 zone is not the address
        if isinstance(found, ipaddress.IPv6Address) and found.ipv4_mapped is not None:
            found = found.ipv4_mapped  # ::ffff:169.254.169.254 is 169.254.169.254
        if any(found in network for network in self.deny):
            return f"destination {found} is denied by TICKLER_WEBHOOK_DENY_NETWORKS"
        if self.allow and not any(found in network for network in self.allow):
            return f"destination {found} is not in TICKLER_WEBHOOK_ALLOW_NETWORKS"
        return None

    def check(self, addresses: Sequence[str]) -> None:
        """Raise DestinationDenied when any of a name's addresses is refused: a name that points
        at a denied address at all is not trusted with its others either."""
        for address in addresses:
            reason = self.refusal(address)
            if reason is not None:
                raise DestinationDenied(reason)


def literal_address(host: str) -> str | None:
    """The host of a URL when it is an IP address (the connector does not resolve those)."""
    try:
        return str(ipaddress.ip_address(host.strip("[]").split("%", 1)[0]))
    except ValueError:
        return None


class CheckedResolver(AbstractResolver):
    """Resolves a receiver's name, then lets the connector have its addresses only if the policy
    allows every one. `lookup` stands in for the system resolver in tests (a name that resolves
    to a denied address)."""

    def __init__(self, policy: DestinationPolicy, lookup: AbstractResolver | None = None) -> None:
        self.policy = policy
        self.lookup = lookup or DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self.lookup.resolve(host, port, family)
        self.policy.check([entry["host"] for entry in found])
        return found

    async def close(self) -> None:
        await self.lookup.close()


class StaticResolver(AbstractResolver):
    """Names resolved from a table (tests: a name that resolves to a denied address without
    touching /etc/hosts or DNS)."""

    def __init__(self, table: dict[str, list[str]]) -> None:
        self.table = table

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        addresses = self.table.get(host)
        if not addresses:
            raise OSError(f"cannot resolve {host}")
        return [_result(host, address, port) for address in addresses]

    async def close(self) -> None:
        pass


def _result(host: str, address: str, port: int) -> Any:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    return ResolveResult(hostname=host, host=address, port=port, family=family, proto=0, flags=socket.AI_NUMERICHOST)
