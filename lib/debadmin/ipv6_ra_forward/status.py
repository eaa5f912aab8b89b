"""What RAs left behind (ip's JSON), and the report and findings of 'status'."""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

from debadmin import proc
from debadmin.findings import finding, needs_action
from debadmin.errors import Error
from debadmin.ipv6_ra_forward import owner as owners
from debadmin.ipv6_ra_forward.sysctls import (
    Config,
    DEFAULTS_FILE,
    DROPIN,
    Persisted,
    ipv6_interfaces,
    matches,
    read_sysctl,
)
from debadmin.ipv6_ra_forward.managers import (
    ifupdown_accept_ra,
    ifupdown_conflicts,
    manager_keeps_ra,
    networkd_path,
)


def ip_json(argv: List[str]) -> list:
    result = proc.run(["ip", "-json", *argv])
    try:
        return json.loads(result.stdout or "[]")
    except ValueError:
        raise Error(f"cannot parse the output of ip {' '.join(argv)}") from None


def ra_addresses(addr_json: list, user_space: Iterable[str] = ()) -> Dict[str, List[str]]:
    """ifname -> global addresses learned from RAs (SLAAC), from 'ip -json -6 addr show'.

    Linux 5.18 tags addresses with their origin, and iproute2 releases newer than
    bookworm's print it: SLAAC ones have "protocol": "kernel_ra", and then that alone
    counts.  Bookworm's iproute2 6.1 prints no protocol at all (checked in a namespace on
    Linux 6.18); there an address counts when it is dynamic and carries
    mngtmpaddr (the kernel sets it on every SLAAC address) or is a temporary (privacy)
    address made from one.  A lifetime alone ('ip addr add ... valid_lft 3600', a DHCPv6
    lease) is not enough.

    systemd-networkd and NetworkManager add SLAAC addresses from user space: the kernel
    tags none of them, even where it tags its own. On the links they manage (user_space)
    an untagged dynamic address counts when it has mngtmpaddr (networkd sets it) or is a
    /64 (SLAAC needs one; DHCPv6 addresses are /128).
    """
    user_space = set(user_space)
    infos = [info for link in addr_json for info in link.get("addr_info", [])]
    tagged = any("protocol" in info for info in infos)  # link-locals say kernel_ll
    found: Dict[str, List[str]] = {}
    for link in addr_json:
        for info in link.get("addr_info", []):
            if info.get("family") != "inet6" or info.get("scope") != "global":
                continue
            if link.get("ifname") in user_space and "protocol" not in info:
                learned = bool(info.get("dynamic")) and bool(
                    info.get("mngtmpaddr") or info.get("prefixlen") == 64
                )
            elif tagged:
                learned = info.get("protocol") == "kernel_ra" or bool(info.get("temporary"))
            else:
                learned = bool(info.get("dynamic")) and bool(
                    info.get("mngtmpaddr") or info.get("temporary")
                )
            if learned:
                found.setdefault(link.get("ifname", "?"), []).append(
                    f"{info['local']}/{info.get('prefixlen', 128)}"
                )
    return found


def ra_routes(route_json: list) -> Dict[str, List[Dict[str, object]]]:
    """ifname -> default routes learned from RAs, from 'ip -json -6 route show default'."""
    found: Dict[str, List[Dict[str, object]]] = {}
    for route in route_json:
        if route.get("dst") != "default" or route.get("protocol") != "ra":
            continue
        if "nexthops" in route:
            for hop in route["nexthops"]:
                found.setdefault(hop.get("dev", "?"), []).append(
                    {
                        "gateway": hop.get("gateway"),
                        "metric": route.get("metric"),
                        "expires": route.get("expires"),
                    }
                )
            continue
        found.setdefault(route.get("dev", "?"), []).append(
            {
                "gateway": route.get("gateway"),
                "metric": route.get("metric"),
                "expires": route.get("expires"),
            }
        )
    return found


def router_links(neigh_json: list) -> List[str]:
    """Interfaces with a neighbour flagged as router, from 'ip -json -6 neigh show': the
    trace an RA leaves after forwarding purged its route."""
    return sorted({n.get("dev", "?") for n in neigh_json if "router" in n})


def accepts_ra(accept_ra: int, forwarding: int) -> bool:
    """The kernel's ipv6_accept_ra(): with forwarding on only 2 counts, else any non-zero."""
    return accept_ra == 2 if forwarding else accept_ra != 0


@dataclass
class StatusFacts:
    """What status reads once for every interface: the global sysctls, what ip shows that
    RAs left behind, and what keeps an uplink (the drop-in, UPLINKS)."""

    root: Path
    forwarding: int
    default_accept_ra: int
    addresses: Dict[str, List[str]]
    routes: Dict[str, List[Dict[str, object]]]
    routers: List[str]
    persisted: set
    config: Config
    explicit: bool

    def kept(self, name: str) -> bool:
        """The drop-in or UPLINKS keeps name at accept_ra=2."""
        return name in self.persisted or matches(self.config.uplinks, name)

    def is_uplink(self, name: str) -> bool:
        """Named, kept, or learning from RAs now. A router neighbour entry alone is not
        enough: it outlives the route, and a trunk that ignores RAs keeps one for ever."""
        if self.explicit or self.kept(name):
            return True
        return name in self.routes or name in self.addresses


# ipv6.method values that take no RAs (not "ignore": then the kernel does as it likes).
NM_NO_RA_METHODS = ("disabled", "link-local")


def not_uplink_reason(
    facts: StatusFacts, name: str, owner: owners.Owner, accept_ra: int
) -> Optional[str]:
    """Why the admin's configuration makes name no uplink, or None.

    NOT_UPLINKS says so outright. Otherwise an interface that enable or UPLINKS did not
    make an uplink, and that its manager (or the kernel's accept_ra=0) is told to ignore
    RAs on, is a choice, not a problem: a trunk, a macvlan's parent, a storage network.
    """
    if matches(facts.config.not_uplinks, name):
        return f"NOT_UPLINKS in {facts.root / DEFAULTS_FILE}"
    if facts.kept(name):
        return None  # an uplink by enable or UPLINKS: accept_ra=0 there is a finding
    if owner.name == owners.NETWORKD:
        path = networkd_path(facts.root, owner)
        if path is not None and path.is_file():
            settings = owners.networkd_network_settings(facts.root, path)
            if owners.parse_boolean(settings.get("IPv6AcceptRA")) is False:
                return f"IPv6AcceptRA=no ({owner.source})"
        return None
    if owner.name == owners.NETWORKMANAGER:
        if owner.ipv6_method in NM_NO_RA_METHODS:
            return f"ipv6.method {owner.ipv6_method} ({owner.source})"
        return None
    if owner.name == owners.IFUPDOWN and (owner.inet6 or {}).get("accept_ra", "").strip() == "0":
        # Written in the stanza, not the default a static method with a gateway gets.
        return f"accept_ra 0 in its inet6 stanza ({owner.source})"
    if accept_ra == 0:
        return "accept_ra=0"
    return None


def manager_findings(facts: StatusFacts, name: str, owner: owners.Owner) -> List[Tuple[str, str]]:
    """(code, message) for an uplink networkd or NetworkManager handles RAs of."""
    root = facts.root
    # networkd's verdict does not depend on the forwarding sysctl: its own settings
    # (IPv6Forwarding=...) stop its RA client whatever the kernel forwards.
    relevant = facts.forwarding or owner.name == owners.NETWORKD
    if not relevant or manager_keeps_ra(root, owner):
        return []
    if owner.name == owners.NETWORKD:
        _, why = owners.networkd_ra_verdict(
            root, networkd_path(root, owner), owners.systemd_version(root)
        )
        return [
            (
                "networkd-ra",
                f"systemd-networkd manages {name} and ignores its router "
                f"advertisements ({why}, {owner.source}): enable --networkd gives it "
                f"IPv6AcceptRA=yes and networkd's own forwarding",
            )
        ]
    return [
        (
            "networkmanager-ra",
            f"NetworkManager manages {name} with ipv6.method "
            f"{owner.ipv6_method or 'unknown'} ({owner.source}), not auto: "
            f"it does not learn the uplink from router advertisements",
        )
    ]


def accept_ra_finding(
    facts: StatusFacts, name: str, owner: owners.Owner, forwarding: int, accept_ra: int
) -> Optional[Tuple[str, str]]:
    """(code, message) when the kernel's accept_ra of an uplink is wrong or not kept."""
    if accept_ra == 0:
        return (
            "ra-disabled",
            f"{name} has accept_ra={accept_ra}: router advertisements are ignored",
        )
    if forwarding and accept_ra != 2:
        if facts.routes.get(name):
            return (
                "ra-ignored",
                f"forwarding is on and {name} has accept_ra={accept_ra}: its RA "
                f"default route will be dropped",
            )
        return (
            "ra-ignored",
            f"forwarding is on and {name} has accept_ra={accept_ra}: router "
            f"advertisements are ignored, it has no RA default route",
        )
    if (
        accept_ra == 2
        and forwarding
        and not facts.kept(name)
        and ifupdown_accept_ra(owner) != "2"  # ifupdown writes 2 itself at every ifup
    ):
        return (
            "not-persisted",
            f"{name} has accept_ra=2 but neither {facts.root / DROPIN} nor "
            f"{facts.root / DEFAULTS_FILE} keeps it: a reboot or a new link brings back "
            f"accept_ra={facts.default_accept_ra}",
        )
    return None


def kernel_findings(
    facts: StatusFacts, name: str, owner: owners.Owner, forwarding: int, accept_ra: int
) -> List[Tuple[str, str]]:
    """(code, message) for an uplink whose RAs the kernel handles."""
    found = []
    problem = accept_ra_finding(facts, name, owner, forwarding, accept_ra)
    if problem:
        found.append(problem)
    if ifupdown_conflicts(owner):
        found.append(
            (
                "ifupdown",
                f"ifupdown sets accept_ra={ifupdown_accept_ra(owner)} on {name} at ifup "
                f"({owner.source}): use accept_ra 2 in its inet6 stanza",
            )
        )
    return found


def router_seen_finding(
    facts: StatusFacts,
    name: str,
    owner: owners.Owner,
    forwarding: int,
    accept_ra: int,
    reason: Optional[str],
) -> List[Dict[str, object]]:
    """A warning, never an action, for an interface that is no uplink, that the admin did
    not tell to ignore RAs, where a router was seen but the kernel ignores its RAs now:
    an uplink whose route forwarding purged, or a trunk nobody said anything about."""
    if reason is not None or name not in facts.routers or owner.handles_ra_itself:
        return []
    if accepts_ra(accept_ra, forwarding):
        return []
    return [
        finding(
            "router-seen",
            "warning",
            f"a router was seen on {name}, whose RAs the kernel ignores now "
            f"(forwarding={forwarding}, accept_ra={accept_ra}): if it is an uplink, run "
            f"'ipv6-ra-forward enable {name}'; if not, add it to NOT_UPLINKS in "
            f"{facts.root / DEFAULTS_FILE}",
            subject=name,
        )
    ]


def status_entry(
    facts: StatusFacts, name: str, owner: owners.Owner
) -> Tuple[Dict[str, object], List[Dict[str, object]]]:
    """The report's entry for one interface, and the findings about it."""
    forwarding = read_sysctl(facts.root, name, "forwarding")
    accept_ra = read_sysctl(facts.root, name, "accept_ra")
    reason = not_uplink_reason(facts, name, owner, accept_ra)
    uplink = reason is None and facts.is_uplink(name)
    entry = {
        "name": name,
        "forwarding": bool(forwarding),
        "accept_ra": accept_ra,
        "accepts_ra": accepts_ra(accept_ra, forwarding),
        "ra_addresses": facts.addresses.get(name, []),
        "ra_default_routes": facts.routes.get(name, []),
        "managed_by": owner.name,
        "managed_by_source": owner.source,
        "uplink": uplink,
        "persisted": name in facts.persisted,
        "router_seen": name in facts.routers,
        "not_uplink": reason,
    }
    if name == "lo":
        return entry, []
    if not uplink:
        return entry, router_seen_finding(facts, name, owner, forwarding, accept_ra, reason)
    if owner.handles_ra_itself:
        problems = manager_findings(facts, name, owner)
    else:
        problems = kernel_findings(facts, name, owner, forwarding, accept_ra)
    return entry, [finding(code, "action", text, subject=name) for code, text in problems]


def collect_status(
    root: Path,
    names: List[str],
    addr_json: list,
    route_json: list,
    neigh_json: list,
    config: Config,
    persisted: Optional[Persisted],
) -> Dict[str, object]:
    """The report of 'status' (also its --json document)."""
    names_seen = names or ipv6_interfaces(root)
    owned = {n: owners.detect(root, n) for n in names_seen}
    user_space = [n for n, owner in owned.items() if owner.handles_ra_itself]
    facts = StatusFacts(
        root,
        read_sysctl(root, "all", "forwarding"),
        read_sysctl(root, "default", "accept_ra"),
        ra_addresses(addr_json, user_space),
        ra_routes(route_json),
        router_links(neigh_json),
        set(persisted.all_uplinks) if persisted else set(),
        config,
        bool(names),
    )
    interfaces: List[Dict[str, object]] = []
    findings: List[Dict[str, object]] = []
    for name in names_seen:
        entry, found = status_entry(facts, name, owned[name])
        interfaces.append(entry)
        findings.extend(found)
    return {
        "forwarding": bool(facts.forwarding),
        "default_accept_ra": facts.default_accept_ra,
        "dropin": str(root / DROPIN) if persisted else None,
        "not_uplinks": list(config.not_uplinks),
        "interfaces": interfaces,
        "findings": findings,
        "ok": not needs_action(findings),
    }
