"""The SSRF guard for agent endpoints: registration-time and connect-time rules.

Pure functions: no database, and no network I/O except resolving ``localhost`` once
through the real default resolver.
"""

from __future__ import annotations

import asyncio
import ipaddress

import pytest

from reach_core.endpoints import (
    EndpointPolicy,
    EndpointRefused,
    check_registration,
    check_resolved,
    resolve_and_check,
)

# A typical deployment: loopback agents, a named internal host and a cluster suffix.
POLICY = EndpointPolicy.from_setting(
    ["127.0.0.0/8", "::1/128", "agents.internal", "*.svc.cluster.local"], own_ports=[8000]
)
# Every IP allowed: whatever is refused under this policy is refused by a rule that the
# allow-list cannot override.
OPEN = EndpointPolicy.from_setting(["0.0.0.0/0", "::/0"], own_ports=[8000])


class FakeResolver:
    """Answers from a script, recording each (host, port) it is asked about."""

    def __init__(self, *answers: list[str]) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[str, int]] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.calls.append((host, port))
        return self.answers.pop(0)


# -- rules 1-4: the shape of the URL -------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("file:///etc/passwd", "scheme"),
        ("gopher://127.0.0.1:70/", "scheme"),
        ("ftp://127.0.0.1/", "scheme"),
        ("javascript:alert(1)", "scheme"),
        ("127.0.0.1:9000/", "scheme"),
        ("//127.0.0.1:9000/", "scheme"),
        ("http://user:pw@127.0.0.1:9000/", "credentials"),
        ("http://user@127.0.0.1:9000/", "credentials"),
        ("http://agents.internal\\@127.0.0.1/", "credentials"),
        ("http://127.0.0.1:9000/#frag", "fragment"),
        ("http://127.0.0.1:9000/#", "fragment"),
        ("http://127.0.0.1:9000/?a=1", "query"),
        ("http://127.0.0.1:9000/?", "query"),
        ("http:///path", "host is missing"),
        ("http://:9000/", "host is missing"),
        ("http:127.0.0.1", "host is missing"),
        ("http://127.0.0.1:0/", "port"),
        ("http://127.0.0.1:65536/", "port"),
        ("http://127.0.0.1:/", "port"),
        ("http://127.0.0.1:+80/", "port"),
        ("http://127.0.0.1:80:80/", "port"),
        ("http://127.0.0.1:9000/" + "a" * 500, "too long"),
        ("http://127.0.0.1 /", "whitespace"),
        (" http://127.0.0.1/", "whitespace"),
        ("http://127.0.0.1/\n", "whitespace"),
        ("http://127.0.0.1\t/", "whitespace"),
        ("http://b\u00fccher.example/", "non-ASCII"),
        ("http://[::1/", "unparseable"),
    ],
)
def test_malformed_urls_are_refused(url: str, match: str) -> None:
    with pytest.raises(EndpointRefused, match=match):
        check_registration(url, OPEN)


@pytest.mark.parametrize(
    "host",
    [
        "2130706433",  # 127.0.0.1 as one decimal number
        "0x7f000001",
        "0X7F000001",
        "0x7f.1",
        "127.1",
        "127.0.1",
        "0177.0.0.1",  # octal 127
        "127.000.0.1",
        "127.0.0.1.",
        "1.2.3.4.5",
        "256.0.0.1",
        "agents.0x10",
    ],
)
def test_ambiguous_numeric_hosts_are_refused(host: str) -> None:
    with pytest.raises(EndpointRefused, match="ambiguous numeric host"):
        check_registration(f"http://{host}/", OPEN)


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("http://agents%2einternal/", "invalid host name"),
        ("http://agents_x.internal/", "invalid host name"),
        ("http://-agents.internal/", "invalid host name"),
        ("http://agents-.internal/", "invalid host name"),
        ("http://agents..internal/", "invalid host name"),
        ("http://agents.internal./", "invalid host name"),
        ("http://" + "a" * 64 + ".internal/", "invalid host name"),
        ("http://127.0.0.1\\evil/", "invalid host name"),
        ("http://[v1.abc]/", "invalid IPv6 literal"),
        ("http://[fe80::1%25eth0]/", "invalid IPv6 literal"),
        ("http://[127.0.0.1]/", "unparseable|invalid IPv6 literal"),
        ("http://[::1]x/", "junk after the IPv6 literal"),
    ],
)
def test_invalid_hosts_are_refused(url: str, match: str) -> None:
    with pytest.raises(EndpointRefused, match=match):
        check_registration(url, OPEN)


# -- rule 5: refused whatever the allow-list says ------------------------------------------


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("http://169.254.169.254/latest/meta-data/", "metadata"),
        ("http://[fd00:ec2::254]/", "metadata"),
        ("http://100.100.100.200/", "metadata"),
        ("http://[::ffff:169.254.169.254]/", "metadata"),  # IPv4-mapped
        ("http://[::169.254.169.254]/", "metadata"),  # IPv4-compatible
        ("http://[64:ff9b::a9fe:a9fe]/", "metadata"),  # NAT64
        ("http://metadata.google.internal/", "metadata"),
        ("http://metadata/", "metadata"),
        ("http://169.254.1.1:9000/", "link-local"),
        ("http://[fe80::1]:9000/", "link-local"),
        ("http://0.0.0.0:9000/", "unspecified"),
        ("http://[::]:9000/", "unspecified"),
        ("http://[::ffff:0.0.0.0]:9000/", "unspecified"),
        ("http://224.0.0.1/", "multicast"),
        ("http://[ff02::1]/", "multicast"),
        ("http://255.255.255.255/", "broadcast"),
    ],
)
def test_always_refused_destinations(url: str, match: str) -> None:
    with pytest.raises(EndpointRefused, match=f"always refused.*{match}"):
        check_registration(url, OPEN)


def test_metadata_names_are_refused_even_when_allow_listed() -> None:
    policy = EndpointPolicy.from_setting(["metadata.google.internal", "metadata"], [])
    for url in ("http://metadata.google.internal/", "http://METADATA/"):
        with pytest.raises(EndpointRefused, match="metadata host name"):
            check_registration(url, policy)


# -- rule 7: the platform's own ports ------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000/",
        "http://127.9.9.9:8000/",
        "http://[::1]:8000/",
        "http://[::ffff:127.0.0.1]:8000/",
        "http://localhost:8000/",
        "http://agent.localhost:8000/",
    ],
)
def test_own_port_on_loopback_is_refused(url: str) -> None:
    with pytest.raises(EndpointRefused, match="the platform's own port"):
        check_registration(url, OPEN)


def test_own_port_counts_the_scheme_default() -> None:
    policy = EndpointPolicy.from_setting(["127.0.0.0/8"], own_ports=[80, 443])
    for url in ("http://127.0.0.1/", "https://127.0.0.1/", "http://127.0.0.1:80/"):
        with pytest.raises(EndpointRefused, match="own port"):
            check_registration(url, policy)
    assert check_registration("http://127.0.0.1:9000/", policy) == "http://127.0.0.1:9000/"


def test_own_port_elsewhere_is_fine() -> None:
    assert check_registration("http://10.0.0.5:8000/", OPEN) == "http://10.0.0.5:8000/"


# -- rule 6: the allow-list ----------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://10.1.2.3/",
        "http://8.8.8.8/",
        "http://[2001:db8::1]/",
        "http://[::ffff:10.1.2.3]/",
        "http://evil.example/",
        "http://agents.internal.evil.example/",
        "http://evilagents.internal/",
        "http://svc.cluster.local/",  # the wildcard needs at least one label in front
        "http://localhost:9000/",  # a name like any other: not listed here
    ],
)
def test_destinations_outside_the_allow_list_are_refused(url: str) -> None:
    with pytest.raises(EndpointRefused, match="not in the allow-list"):
        check_registration(url, POLICY)


@pytest.mark.parametrize(
    ("url", "normalised"),
    [
        ("http://127.0.0.1:9001/", "http://127.0.0.1:9001/"),
        ("HTTP://127.0.0.1:9001", "http://127.0.0.1:9001"),
        ("http://127.0.0.1:80/a/b/", "http://127.0.0.1:80/a/b/"),
        ("http://127.0.0.1:09001/", "http://127.0.0.1:9001/"),
        ("http://[::1]:9001/", "http://[::1]:9001/"),
        ("http://[0:0:0:0:0:0:0:1]:9001/x/", "http://[::1]:9001/x/"),
        ("http://Agents.Internal/v1/", "http://agents.internal/v1/"),
        ("https://agents.internal", "https://agents.internal"),
        ("https://a.b.svc.cluster.local:8443/", "https://a.b.svc.cluster.local:8443/"),
        ("HTTPS://Translator.SVC.cluster.local/run", "https://translator.svc.cluster.local/run"),
    ],
)
def test_allowed_destinations_are_normalised(url: str, normalised: str) -> None:
    assert check_registration(url, POLICY) == normalised


def test_localhost_is_allowed_only_when_listed() -> None:
    policy = EndpointPolicy.from_setting(["localhost"], own_ports=[8000])
    assert check_registration("http://LocalHost:9001/", policy) == "http://localhost:9001/"
    with pytest.raises(EndpointRefused, match="not in the allow-list"):
        check_registration("http://127.0.0.1:9001/", policy)


# -- connect time --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("addresses", "match"),
    [
        (["127.0.0.1", "169.254.169.254"], "metadata"),
        (["fd00:ec2::254"], "metadata"),
        (["::ffff:169.254.169.254"], "metadata"),
        (["fe80::1%eth0"], "link-local"),
        (["::"], "unspecified"),
        (["0.0.0.7"], "unspecified"),
        ([], "no addresses"),
        (["not-an-ip"], "not an IP address"),
    ],
)
def test_check_resolved_refuses_bad_answers_for_an_allowed_name(
    addresses: list[str], match: str
) -> None:
    with pytest.raises(EndpointRefused, match=match):
        check_resolved("agents.internal", 443, addresses, POLICY)


def test_check_resolved_accepts_an_allowed_name_inside_the_allowed_ranges() -> None:
    check_resolved("agents.internal", 443, ["127.0.0.1", "::1"], POLICY)


@pytest.mark.parametrize("addresses", [["203.0.113.7"], ["2001:db8::7"], ["127.0.0.1", "10.0.0.1"],
                                       ["::ffff:203.0.113.7"]])
def test_an_allowed_name_must_also_resolve_inside_the_allowed_ranges(addresses) -> None:
    # The name says whom the platform may call, the ranges where it may connect: an
    # allow-listed name re-pointed outside them is refused, every address counts.
    with pytest.raises(EndpointRefused, match=r"resolved to .* in no allowed CIDR"):
        check_resolved("agents.internal", 443, addresses, POLICY)


def test_check_resolved_applies_own_ports_to_resolved_loopback() -> None:
    with pytest.raises(EndpointRefused, match="own port"):
        check_resolved("agents.internal", 8000, ["127.0.0.1"], POLICY)


@pytest.mark.parametrize(
    ("host", "port", "addresses", "match"),
    [
        ("evil.example", 80, ["127.0.0.1"], "not in the allow-list"),
        ("metadata.google.internal", 80, ["10.0.0.1"], "metadata"),
        ("10.1.2.3", 80, ["10.1.2.3"], "not in the allow-list"),
        ("127.0.0.1", 9001, ["10.1.2.3"], "not in the allow-list"),
        ("169.254.169.254", 80, ["169.254.169.254"], "metadata"),
        ("127.1", 80, ["127.0.0.1"], "ambiguous numeric"),
        ("agents.internal", 0, ["127.0.0.1"], "port"),
    ],
)
def test_check_resolved_refusals(host: str, port: int, addresses: list[str], match: str) -> None:
    with pytest.raises(EndpointRefused, match=match):
        check_resolved(host, port, addresses, POLICY)


def test_check_resolved_accepts_ip_literals() -> None:
    check_resolved("127.0.0.1", 9001, ["127.0.0.1"], POLICY)
    check_resolved("[::1]", 9001, ["::1"], POLICY)
    check_resolved("::1", 9001, ["::1"], POLICY)


def test_a_re_pointed_name_is_refused_at_connect_time() -> None:
    """DNS rebinding: the name stays allowed, its answer does not."""
    resolver = FakeResolver(["127.0.0.1"], ["169.254.169.254"])
    url = "http://agents.internal:9001/"
    assert asyncio.run(resolve_and_check(url, POLICY, resolver)) == ["127.0.0.1"]
    with pytest.raises(EndpointRefused, match=r"agents\.internal resolved to 169\.254\.169\.254"):
        asyncio.run(resolve_and_check(url, POLICY, resolver))
    assert resolver.calls == [("agents.internal", 9001), ("agents.internal", 9001)]


def test_resolve_and_check_passes_the_default_port() -> None:
    resolver = FakeResolver(["10.0.0.7"])
    url = "https://a.svc.cluster.local/"
    cluster = EndpointPolicy.from_setting(["10.0.0.0/8", "*.svc.cluster.local"], [8000])
    assert asyncio.run(resolve_and_check(url, cluster, resolver)) == ["10.0.0.7"]
    assert resolver.calls == [("a.svc.cluster.local", 443)]


def test_resolve_and_check_does_not_resolve_literals_or_refused_names() -> None:
    resolver = FakeResolver()  # any call would fail on the empty script
    assert asyncio.run(resolve_and_check("http://[::1]:9001/", POLICY, resolver)) == ["::1"]
    for url in ("http://evil.example/", "http://169.254.169.254/", "ftp://agents.internal/"):
        with pytest.raises(EndpointRefused):
            asyncio.run(resolve_and_check(url, POLICY, resolver))
    assert resolver.calls == []


def test_resolve_and_check_with_the_default_resolver() -> None:
    policy = EndpointPolicy.from_setting(["localhost", "127.0.0.0/8", "::1"], own_ports=[8000])
    addresses = asyncio.run(resolve_and_check("http://localhost:9001/", policy))
    assert addresses
    assert all(ipaddress.ip_address(a).is_loopback for a in addresses)
    with pytest.raises(EndpointRefused, match="own port"):
        asyncio.run(resolve_and_check("http://localhost:8000/", policy))


# -- the policy itself ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "entry",
    [
        "10.0.0.0/33",
        "10.0.0.1/8",  # host bits set: almost certainly a typo
        "10.0.0/8",
        "::1/129",
        "fe80::zz",
        "127.1",
        "0x7f000001",
        "",
        "   ",
        "*",
        "*.",
        "**.internal",
        "*.10.0.0.1",
        "not a name",
        "bad_name.internal",
        "agents.internal.",
        "b\u00fccher.example",
        "http://agents.internal/",
    ],
)
def test_from_setting_rejects_malformed_allow_entries(entry: str) -> None:
    with pytest.raises(ValueError, match="allow-list"):
        EndpointPolicy.from_setting([entry], [])


@pytest.mark.parametrize("port", [0, 65536, -1, "http", True])
def test_from_setting_rejects_malformed_own_ports(port: object) -> None:
    with pytest.raises(ValueError):
        EndpointPolicy.from_setting([], [port])  # type: ignore[list-item]


def test_from_setting_rejects_a_bare_string() -> None:
    with pytest.raises(ValueError, match="not a string"):
        EndpointPolicy.from_setting("10.0.0.0/8", [])


def test_from_setting_canonicalises_entries() -> None:
    policy = EndpointPolicy.from_setting(
        [" Agents.Internal ", "10.0.0.0/255.0.0.0", "*.SVC.cluster.local", "::1", "10.0.0.0/8"],
        own_ports=["8000", 8001],  # type: ignore[list-item]
    )
    assert policy.allow == ("agents.internal", "10.0.0.0/8", "*.svc.cluster.local", "::1/128")
    assert policy.own_ports == frozenset({8000, 8001})
    assert policy == EndpointPolicy(policy.allow, policy.own_ports)


def test_direct_construction_is_validated_too() -> None:
    with pytest.raises(ValueError, match="malformed CIDR"):
        EndpointPolicy(allow=("10.0.0.0/33",), own_ports=frozenset())
