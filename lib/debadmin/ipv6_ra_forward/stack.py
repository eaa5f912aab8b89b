"""Where an interface sits in a stack of devices (bridge, bond, VLAN, macvlan), from sysfs."""

import os
from pathlib import Path
from typing import List, Optional, Tuple

from debadmin import fsutil
from debadmin.ipv6_ra_forward import owner as owners
from debadmin.ipv6_ra_forward.status import ra_addresses, ra_routes


def master_of(root: Path, ifname: str) -> Optional[Tuple[str, str]]:
    """(kind, name) of the bridge, bond or other device ifname is a port of, else None."""
    link = root / "sys/class/net" / ifname / "master"
    try:
        master = os.path.basename(os.readlink(link))
    except OSError:
        return None
    base = root / "sys/class/net" / master
    kind = (
        "bridge"
        if (base / "bridge").is_dir()
        else "bond"
        if (base / "bonding").is_dir()
        else "device"
    )
    return kind, master


def masters(root: Path, ifname: str) -> List[Tuple[str, str]]:
    """The (kind, name) chain of masters above ifname, nearest first: a bond's port under
    a bridge gives [("bond", "bond0"), ("bridge", "br0")]."""
    chain: List[Tuple[str, str]] = []
    name = ifname
    while len(chain) < 8:  # sysfs has no cycles; a fixture tree might
        master = master_of(root, name)
        if master is None or master[1] in (ifname, *(n for _, n in chain)):
            break
        chain.append(master)
        name = master[1]
    return chain


def devtype(root: Path, ifname: str) -> str:
    """DEVTYPE of /sys/class/net/IFNAME/uevent (vlan, bond, bridge, macvlan...), or ''."""
    text = fsutil.read_text(root / "sys/class/net" / ifname / "uevent") or ""
    for line in text.splitlines():
        if line.startswith("DEVTYPE="):
            return line[len("DEVTYPE=") :].strip()
    return ""


def uppers(root: Path, ifname: str) -> List[str]:
    """The devices stacked on ifname (its upper_NAME links: VLANs, macvlans, a master)."""
    try:
        entries = os.listdir(root / "sys/class/net" / ifname)
    except OSError:
        return []
    return sorted(e[len("upper_") :] for e in entries if e.startswith("upper_"))


def configured_masters(root: Path, ifname: str) -> List[owners.Stacked]:
    """The chain of bonds and bridges the managers' configuration puts ifname in, nearest
    first, for a port whose master is not up (sysfs knows nothing of it yet)."""
    chain: List[owners.Stacked] = []
    name = ifname
    while len(chain) < 8:
        found = owners.configured_master(root, name)
        if (
            found is None
            or not found.master
            or found.master in (ifname, *(c.master for c in chain))
        ):
            break
        chain.append(found)
        name = found.master
    return chain


def port_refusal(root: Path, ifname: str) -> Optional[str]:
    """Why ifname cannot be an uplink (a port of a bridge or bond), or None. The interface
    to use is the top of the stack, named in one step: br0 for a port of bond0 in br0.
    From sysfs, or where the master is not up, from the managers' configuration (Bond=,
    bond-master, controller=...), naming the setting."""
    chain = masters(root, ifname)
    if chain:
        # Above the top sysfs knows, a manager may put it in a bridge not up yet.
        chain += [(c.kind, c.master or "") for c in configured_masters(root, chain[-1][1])]
        kind, name = chain[0]
        via = "".join(f", itself a port of {k} {n}" for k, n in chain[1:])
        top = chain[-1][1]
        # A VLAN or macvlan on the top learns on its own network: named too.
        on_top = [u for u in uppers(root, top) if devtype(root, u) in ("vlan", "macvlan")]
        also = (
            f" (or 'ipv6-ra-forward enable {' '.join(on_top)}' for the network of the "
            f"{'VLANs' if len(on_top) > 1 else 'VLAN'} on it)"
            if on_top
            else ""
        )
        return (
            f"{ifname} is a port of {kind} {name}{via}; {top} holds the address and the "
            f"default route: forwarding would drop {top}'s route; run 'ipv6-ra-forward "
            f"enable {top}'{also}"
        )
    configured = configured_masters(root, ifname)
    if not configured:
        return None
    first = configured[0]
    via = "".join(f", itself a port of {c.kind} {c.master} ({c.how})" for c in configured[1:])
    top = configured[-1].master
    return (
        f"{ifname} is a port of {first.kind} {first.master} ({first.where()}){via}; "
        f"{top} will hold the address and the default route, not {ifname}: run "
        f"'ipv6-ra-forward enable {top}' once {top} exists"
    )


def lower_refusal(
    root: Path, ifname: str, uplinks: List[str], addr_json: list, route_json: list
) -> Optional[str]:
    """Why ifname, the lower device of VLANs or macvlans, is not the uplink, or None.

    A trunk may carry its own untagged network with a router on it: then it learns from
    RAs itself and is an uplink like any other. When it learns nothing and a device on it
    does, that device is the uplink to name.
    """
    routes, addresses = ra_routes(route_json), ra_addresses(addr_json)
    if routes.get(ifname) or addresses.get(ifname):
        return None
    stacked = [u for u in uppers(root, ifname) if devtype(root, u) in ("vlan", "macvlan")]
    learning = [u for u in stacked if routes.get(u) or addresses.get(u)]
    if not learning or any(u in uplinks for u in learning):
        return None
    kind = devtype(root, learning[0])
    kind = "VLAN" if kind == "vlan" else kind
    return (
        f"{ifname} learns nothing from router advertisements itself; {kind} "
        f"{' '.join(learning)} on it does: run 'ipv6-ra-forward enable {' '.join(learning)}'"
    )


def link_is_up(root: Path, ifname: str) -> bool:
    """IFF_UP from /sys/class/net/IFNAME/flags; unknown counts as up (then we try)."""
    try:
        flags = int((root / "sys/class/net" / ifname / "flags").read_text().strip(), 16)
    except (OSError, ValueError):
        return True
    return bool(flags & 0x1)
