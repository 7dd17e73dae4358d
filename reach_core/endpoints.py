"""Which agent endpoints the platform may talk to: the SSRF guard.

There are two checkpoints, and both are needed:

* ``check_registration`` runs when an agent registers. It never touches DNS (the
  answer at registration proves nothing about the answer at connect time), so a
  host name is judged by the allow-list alone.
* ``check_resolved`` / ``resolve_and_check`` run when the gateway connects. A name
  allowed at registration may have been re-pointed since (DNS rebinding), so the
  addresses about to be used are checked: an allow-listed name must also resolve
  inside the allowed CIDRs (the name says who may be called, the ranges say where
  the platform may connect). The caller must connect to exactly the addresses
  returned, never resolve the name a second time.

Pure Python without Django, so the control plane and the async gateway share one
implementation; configuration arrives as an ``EndpointPolicy``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], Awaitable[list[str]]]
BlockingResolver = Callable[[str, int], list[str]]

MAX_URL_LENGTH = 500
_DEFAULT_PORTS = {"http": 80, "https": 443}
_METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200")
)
_METADATA_NAMES = frozenset({"metadata", "metadata.google.internal"})
_THIS_NETWORK = ipaddress.IPv4Network("0.0.0.0/8")  # 0.0.0.0 reaches the local host on Linux
_BROADCAST = ipaddress.IPv4Address("255.255.255.255")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_DNS_LABEL = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)")
# A last label like these makes URL parsers (WHATWG, curl, inet_aton) read the host as IPv4.
_NUMERIC_LABEL = re.compile(r"[0-9]+|0x[0-9a-f]*")
_QUAD_PART = re.compile(r"0|[1-9][0-9]{0,2}")
_PORT = re.compile(r"[0-9]{1,5}")


class EndpointRefused(ValueError):
    """An endpoint the platform will not talk to; the message names the rule that refused it."""


@dataclass(frozen=True)
class EndpointPolicy:
    """Where agent endpoints may point.

    ``allow`` holds CIDRs (``"10.0.0.0/8"``, a bare address means a single host) and
    host names (``"agents.internal"``, or ``"*.svc.cluster.local"`` for one or more
    labels in front of the suffix). ``own_ports`` are the platform's listening ports:
    a loopback endpoint on one of them would make the platform call itself.
    Construction validates every entry and raises ``ValueError`` on a malformed one.
    """

    allow: tuple[str, ...]
    own_ports: frozenset[int]
    _networks: tuple[IPNetwork, ...] = field(init=False, repr=False, compare=False)
    _names: frozenset[str] = field(init=False, repr=False, compare=False)
    _suffixes: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.allow, str):
            raise ValueError("endpoint allow-list must be a sequence of entries, not a string")
        parsed = [_parse_allow_entry(entry)[1] for entry in self.allow]
        for port in self.own_ports:
            if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
                raise ValueError(f"own port must be an integer 1..65535, got {port!r}")
        setattr_ = object.__setattr__  # frozen: derived fields are set once, here
        setattr_(self, "allow", tuple(self.allow))
        setattr_(self, "own_ports", frozenset(self.own_ports))
        setattr_(self, "_networks", tuple(p for p in parsed if not isinstance(p, str)))
        names = [p for p in parsed if isinstance(p, str)]
        setattr_(self, "_names", frozenset(n for n in names if not n.startswith(".")))
        setattr_(self, "_suffixes", tuple(n for n in names if n.startswith(".")))

    @classmethod
    def from_setting(cls, allow: Iterable[str], own_ports: Iterable[int]) -> EndpointPolicy:
        """Build from settings values: entries are trimmed and canonicalised, ports may be
        numeric strings. Raises ``ValueError`` on a malformed CIDR, name or port."""
        if isinstance(allow, str):
            raise ValueError("endpoint allow-list must be a sequence of entries, not a string")
        canonical = dict.fromkeys(_parse_allow_entry(entry)[0] for entry in allow)
        ports = frozenset(int(p) if isinstance(p, str) else p for p in own_ports)
        return cls(allow=tuple(canonical), own_ports=ports)

    def allows_ip(self, ip: IPAddress) -> bool:
        return any(ip in network for network in self._networks)

    def allows_name(self, name: str) -> bool:
        """Exact or wildcard match; ``name`` must already be lower-cased."""
        return name in self._names or any(name.endswith(s) for s in self._suffixes)


def _parse_allow_entry(entry: object) -> tuple[str, IPNetwork | str]:
    """Return (canonical text, network or name); a wildcard name is kept as ``.suffix``."""
    if not isinstance(entry, str) or not entry.strip().isascii():
        raise ValueError(f"endpoint allow-list entry must be an ASCII string, got {entry!r}")
    text = entry.strip().lower()
    if "/" in text or ":" in text or _is_canonical_ipv4(text):
        try:  # strict: "10.0.0.1/8" (host bits set) is far more likely a typo than intended
            network = ipaddress.ip_network(text)
        except ValueError as exc:
            raise ValueError(f"malformed CIDR in endpoint allow-list: {entry!r} ({exc})") from None
        return str(network), network
    wildcard = text.startswith("*.")
    try:
        name, ip = _parse_host(text[2:] if wildcard else text, bracketed=False)
    except EndpointRefused as exc:
        raise ValueError(f"malformed host name in endpoint allow-list: {entry!r} ({exc})") from None
    if wildcard:
        if ip is not None:
            raise ValueError(f"malformed wildcard in endpoint allow-list: {entry!r} (not a name)")
        return f"*.{name}", f".{name}"
    return name, name


def _is_canonical_ipv4(host: str) -> bool:
    parts = host.split(".")
    return len(parts) == 4 and all(_QUAD_PART.fullmatch(p) and int(p) <= 255 for p in parts)


def _parse_host(host: str, bracketed: bool) -> tuple[str, IPAddress | None]:
    """Return (normalised host, its address, or None for a DNS name). Raises EndpointRefused."""
    if not host:
        raise EndpointRefused("host is missing")
    if not host.isascii():  # also stops str.lower() and int() folding look-alike characters
        raise EndpointRefused(f"invalid host name {host!r}: IDN names are refused, not guessed")
    if bracketed:
        # ipaddress accepts zone ids ("%eth0"); they only mean something on our own machine.
        try:
            ip = ipaddress.IPv6Address(host) if "%" not in host else None
        except ValueError:
            ip = None
        if ip is None:
            raise EndpointRefused(f"invalid IPv6 literal [{host}]")
        return ip.compressed, ip
    host = host.lower()
    labels = host.split(".")
    last = labels[-1] or (labels[-2] if len(labels) > 1 else "")
    if _NUMERIC_LABEL.fullmatch(last):
        if _is_canonical_ipv4(host):
            return host, ipaddress.IPv4Address(host)
        raise EndpointRefused(
            f"ambiguous numeric host {host!r}: only canonical dotted-quad IPv4 "
            "(no leading zeros) and bracketed IPv6 are accepted as IP literals"
        )
    if len(host) > 253 or not all(_DNS_LABEL.fullmatch(label) for label in labels):
        raise EndpointRefused(
            f"invalid host name {host!r}: use letters, digits, hyphens and dots, labels 1-63 long"
        )
    return host, None


class _Target(NamedTuple):
    url: str  # normalised
    host: str  # lower-cased name or compressed address, without brackets
    ip: IPAddress | None
    port: int  # explicit, or the scheme's default


def _parse_url(url: str) -> _Target:
    """Rules 1-4: the URL's shape. Says nothing about whether the destination is allowed."""
    if len(url) > MAX_URL_LENGTH:
        raise EndpointRefused(f"URL is too long: {len(url)} characters, at most {MAX_URL_LENGTH}")
    if not url.isascii():
        raise EndpointRefused("URL contains non-ASCII characters: IDN is refused, not guessed")
    # urlsplit silently strips and deletes some of these, so look at the raw text.
    if any(not 0x21 <= ord(c) <= 0x7E for c in url):
        raise EndpointRefused("URL contains whitespace or control characters")
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise EndpointRefused(f"URL is unparseable: {exc}") from None
    if parts.scheme not in _DEFAULT_PORTS:
        raise EndpointRefused(f"scheme must be http or https, got {parts.scheme or 'none'!r}")
    if "#" in url:  # raw check: urlsplit reports an empty fragment for a bare "#"
        raise EndpointRefused("fragment is not allowed: an endpoint is a base URL")
    if "?" in url:
        raise EndpointRefused("query string is not allowed: an endpoint is a base URL")
    netloc = parts.netloc
    if "@" in netloc:
        raise EndpointRefused("credentials in the URL are not allowed (user:password@host)")
    bracketed = netloc.startswith("[")
    if bracketed:
        host, _, rest = netloc[1:].partition("]")
        if rest and not rest.startswith(":"):
            raise EndpointRefused(f"invalid host {netloc!r}: junk after the IPv6 literal")
        has_port, port_text = bool(rest), rest[1:]
    else:
        host, sep, port_text = netloc.partition(":")
        has_port = bool(sep)
    name, ip = _parse_host(host, bracketed)
    if has_port and (not _PORT.fullmatch(port_text) or not 1 <= int(port_text) <= 65535):
        raise EndpointRefused(f"port must be 1..65535, got {port_text!r}")
    shown = f"[{name}]" if bracketed else name
    if has_port:
        port = int(port_text)
        shown += f":{port}"
    else:
        port = _DEFAULT_PORTS[parts.scheme]
    return _Target(f"{parts.scheme}://{shown}{parts.path}", name, ip, port)


def _unwrap(ip: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 form really reaches (mapped, compatible, NAT64), else ``ip``."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        # "::" and "::1" are themselves, not IPv4-compatible forms of 0.0.0.0 / 0.0.0.1.
        if ip in _NAT64 or (int(ip) >> 32 == 0 and int(ip) > 1):
            return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip


def _always_refused(ip: IPAddress) -> str | None:
    """Rule 5: why ``ip`` (already unwrapped) is refused whatever the allow-list says."""
    if ip in _METADATA_ADDRESSES:  # before link-local: the more useful explanation
        return "a cloud metadata address"
    if ip.is_link_local:
        return "a link-local address"
    if ip.is_unspecified or ip in _THIS_NETWORK:
        return "an unspecified address"
    if ip.is_multicast:
        return "a multicast address"
    if ip == _BROADCAST:
        return "the broadcast address"
    return None


def _check_ip(ip: IPAddress, port: int, policy: EndpointPolicy, via: str | None) -> None:
    """Rules 5, 6 and 7 for one address; ``via`` is the name that resolved to it. Being
    allow-listed does not let a name reach addresses outside the allowed CIDRs."""
    real = _unwrap(ip)
    subject = str(ip) if real == ip else f"{ip} (IPv4 {real})"
    if via is not None:
        subject = f"{via} resolved to {subject}"
    reason = _always_refused(real)
    if reason:
        raise EndpointRefused(f"always refused: {subject} is {reason}")
    if port in policy.own_ports and (real.is_loopback or real.is_unspecified):
        raise EndpointRefused(f"the platform's own port: {subject} port {port} would loop to us")
    if not policy.allows_ip(real):
        if via is not None:
            raise EndpointRefused(
                f"not in the allow-list: {subject}, in no allowed CIDR (an allowed name must "
                "also resolve inside the allowed address ranges)")
        raise EndpointRefused(f"not in the allow-list: {subject} is in no allowed CIDR")


def _check_host(host: str, ip: IPAddress | None, port: int, policy: EndpointPolicy) -> None:
    """Rules 5-7 for a parsed host, without resolving it."""
    if ip is not None:
        _check_ip(ip, port, policy, via=None)
        return
    if host in _METADATA_NAMES:
        raise EndpointRefused(f"always refused: {host!r} is a cloud metadata host name")
    # RFC 6761: resolvers may answer any *.localhost with loopback.
    if port in policy.own_ports and (host == "localhost" or host.endswith(".localhost")):
        raise EndpointRefused(f"the platform's own port: {host} port {port} would loop to us")
    if not policy.allows_name(host):
        raise EndpointRefused(f"not in the allow-list: host name {host!r} matches no allowed name")


def check_registration(url: str, policy: EndpointPolicy) -> str:
    """Validate ``url`` at registration time without any DNS lookup; return it normalised
    (scheme and host lower-cased, IPv6 bracketed and compressed, default port not added,
    path and trailing slash kept). Raises ``EndpointRefused``."""
    target = _parse_url(url)
    _check_host(target.host, target.ip, target.port, policy)
    return target.url


def _parse_address(address: object) -> IPAddress:
    if not isinstance(address, str) or not address.isascii():
        raise EndpointRefused(f"resolved address {address!r} is not an IP address")
    try:  # a zone id would make the address compare unequal to the refused ones
        return ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        raise EndpointRefused(f"resolved address {address!r} is not an IP address") from None


def check_resolved(host: str, port: int, addresses: Iterable[str], policy: EndpointPolicy) -> None:
    """Connect-time check: ``host`` (name or IP literal, IPv6 bracketed or not) passes the
    registration rules for ``port``, and every resolved address passes rule 5 and the
    own-port rule and must be in an allowed CIDR (a name's as well as a literal's).
    Raises ``EndpointRefused``, including when ``addresses`` is empty."""
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise EndpointRefused(f"port must be 1..65535, got {port!r}")
    bracketed = host.startswith("[") and host.endswith("]")
    inner = host[1:-1] if bracketed else host
    name, ip = _parse_host(inner, bracketed=bracketed or ":" in inner)
    _check_host(name, ip, port, policy)
    resolved = [_parse_address(a) for a in addresses]
    if not resolved:
        raise EndpointRefused(f"{name} resolved to no addresses")
    for address in resolved:
        _check_ip(address, port, policy, via=None if ip is not None else name)


async def _default_resolver(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


async def resolve_and_check(
    url: str, policy: EndpointPolicy, resolver: Resolver | None = None
) -> list[str]:
    """Parse and check ``url``, resolve its host (``resolver(host, port)``, by default the
    event loop's getaddrinfo; an IP literal is not resolved), check the answer with
    ``check_resolved`` and return the addresses the caller must connect to.

    Raises ``EndpointRefused``; resolution failures (``OSError``) propagate unchanged.
    """
    target = _checked_target(url, policy)
    if target.ip is not None:
        addresses = [str(target.ip)]
    else:
        addresses = list(await (resolver or _default_resolver)(target.host, target.port))
    check_resolved(target.host, target.port, addresses, policy)
    return addresses


def system_resolver(host: str, port: int) -> list[str]:
    """The blocking default resolver: getaddrinfo's addresses, de-duplicated, in order."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


class CheckedTarget(NamedTuple):
    """A URL that passed every rule, with the addresses it may be connected to."""

    url: str  # normalised
    scheme: str
    host: str  # lower-cased name or compressed address, without brackets
    port: int
    addresses: tuple[str, ...]  # checked; connect to these and nothing else

    @property
    def host_header(self) -> str:
        """The ``Host`` header (and, for https, the TLS server name is ``host``)."""
        shown = f"[{self.host}]" if ":" in self.host else self.host
        return shown if self.port == _DEFAULT_PORTS[self.scheme] else f"{shown}:{self.port}"


def resolve_and_check_target(
    url: str, policy: EndpointPolicy, resolver: BlockingResolver | None = None
) -> CheckedTarget:
    """Blocking: parse and check ``url``, resolve its host once (``resolver(host, port)``,
    by default ``system_resolver``; an IP literal is not resolved), check every address.
    Raises ``EndpointRefused``; resolution failures (``OSError``) propagate unchanged."""
    target = _checked_target(url, policy)
    if target.ip is not None:
        addresses = [str(target.ip)]
    else:
        addresses = list((resolver or system_resolver)(target.host, target.port))
    check_resolved(target.host, target.port, addresses, policy)
    return CheckedTarget(target.url, urlsplit(target.url).scheme, target.host, target.port,
                         tuple(addresses))


def resolve_and_check_blocking(
    url: str, policy: EndpointPolicy, resolver: BlockingResolver | None = None
) -> list[str]:
    """``resolve_and_check`` for synchronous callers (health probes, Agent Card fetches),
    with the system resolver unless ``resolver`` is given. Same errors."""
    return list(resolve_and_check_target(url, policy, resolver).addresses)


def _checked_target(url: str, policy: EndpointPolicy):
    target = _parse_url(url)
    # Refuse before resolving: a disallowed name should not even cause a DNS query.
    _check_host(target.host, target.ip, target.port, policy)
    return target
