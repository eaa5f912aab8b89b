"""What systemd-networkd, NetworkManager and ifupdown need to keep learning RAs."""

import shlex
from pathlib import Path
from typing import Optional

from debadmin.ipv6_ra_forward import owner as owners

NETWORKD_DROPIN_NAME = "60-ipv6-ra-forward.conf"


def networkd_path(root: Path, owner: owners.Owner) -> Optional[Path]:
    """The .network file (under root) that configures a networkd link, if any."""
    source = owner.source or ""
    if owner.name != owners.NETWORKD or not source.endswith(".network"):
        return None
    return Path(source) if source.startswith(str(root)) else root / source.lstrip("/")


def networkd_dropin(root: Path, owner: owners.Owner) -> Optional[Path]:
    """Where ipv6-ra-forward's networkd drop-in for this link goes (always under /etc)."""
    path = networkd_path(root, owner)
    if path is None:
        return None
    return root / "etc/systemd/network" / f"{path.name}.d" / NETWORKD_DROPIN_NAME


def stack_line(root: Path, ifname: str) -> str:
    """A comment line for a bond, bridge or VLAN a manager makes: the setting goes on it,
    not on its ports or its lower device."""
    device = owners.configured_device(root, ifname)
    if device is None or device.kind not in STACK_PARTS:
        return ""
    return (
        f"# {ifname} is a {device.kind} ({device.how} in {device.source}): the setting goes"
        f" on {ifname}, not on its {STACK_PARTS[device.kind]}.\n"
    )


STACK_PARTS = {
    "bond": "ports",
    "bridge": "ports",
    "vlan": "lower device",
    "macvlan": "lower device",
}


def snippet(owner: owners.Owner, ifname: str, root: Path = Path("/")) -> str:
    return stack_line(root, ifname) + _snippet(owner, ifname, root)


def _snippet(owner: owners.Owner, ifname: str, root: Path) -> str:
    if owner.name == owners.NETWORKD:
        version = owners.systemd_version(root)
        path = networkd_path(root, owner)
        text, _ = owners.networkd_native(root, path, version)
        _, why = owners.networkd_ra_verdict(root, path, version)
        if path is None:
            # A drop-in would extend a file that does not exist: give the whole file.
            return (
                f"# systemd-networkd manages {ifname} ({owner.source}) but no .network file\n"
                f"# matches it. So that networkd both forwards and keeps handling router\n"
                f"# advertisements, /etc/systemd/network/50-{ifname}.network, then"
                f" 'networkctl reload':\n"
                f"[Match]\nName={ifname}\n\n{text}"
            )
        dropin = f"/etc/systemd/network/{path.name}.d/{NETWORKD_DROPIN_NAME}"
        return (
            f"# systemd-networkd manages {ifname} ({owner.source}) and ignores its router\n"
            f"# advertisements ({why}). So that networkd both forwards and keeps them,\n"
            f"# run 'ipv6-ra-forward enable --networkd ...' or write"
            f" {dropin}, then 'networkctl reload':\n"
            f"{text}"
        )
    if owner.name == owners.NETWORKMANAGER:
        conn = shlex.quote(owner.connection) if owner.connection else "CONNECTION"
        return (
            f"# NetworkManager manages {ifname} ({owner.source}); it handles router\n"
            f"# advertisements itself with ipv6.method auto. Run:\n"
            f"nmcli connection modify {conn} ipv6.method auto\n"
            f"nmcli connection up {conn}\n"
        )
    if owner.name == owners.IFUPDOWN:
        return (
            f"# ifupdown writes accept_ra when it brings {ifname} up; in the\n"
            f"# 'iface {ifname} inet6' stanza of {owner.source} set:\n"
            f"    accept_ra 2\n"
        )
    return ""


def manager_keeps_ra(root: Path, owner: owners.Owner) -> bool:
    """Whether networkd or NetworkManager keeps accepting RAs with forwarding on."""
    if owner.name == owners.NETWORKD:
        version = owners.systemd_version(root)
        return owners.networkd_ra_verdict(root, networkd_path(root, owner), version)[0]
    if owner.name == owners.NETWORKMANAGER:
        # NetworkManager runs its own RA client; only its ipv6.method decides.
        return owner.ipv6_method == "auto"
    return False


def ifupdown_accept_ra(owner: owners.Owner) -> Optional[str]:
    """The accept_ra ifupdown leaves for the interface at ifup (that of the stanza that
    decides, owner.ifupdown_deciding), or None when it writes none."""
    if owner.name != owners.IFUPDOWN:
        return None
    return owners.stanza_accept_ra(owner.inet6)


def ifupdown_conflicts(owner: owners.Owner) -> bool:
    """ifupdown would write an accept_ra other than 2 at the next ifup."""
    value = ifupdown_accept_ra(owner)
    return value is not None and value != "2"
