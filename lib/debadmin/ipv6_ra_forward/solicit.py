"""Router solicitations: ICMPv6 type 133 from the link-local address, over a raw socket."""

import logging
import socket
import struct
from pathlib import Path
from typing import Optional

from debadmin import fsutil
from debadmin.errors import Error

log = logging.getLogger("debadmin")


ICMPV6_ROUTER_SOLICITATION = 133
ND_OPT_SOURCE_LINKADDR = 1
ALL_ROUTERS = "ff02::2"


def link_local_address(ifname: str, root: Path = Path("/")) -> Optional[str]:
    """ifname's link-local address once duplicate address detection passed, else None."""
    text = fsutil.read_text(root / "proc/net/if_inet6") or ""
    for line in text.splitlines():
        fields = line.split()
        if len(fields) != 6 or fields[5] != ifname or int(fields[3], 16) != IPV6_SCOPE_LINK:
            continue
        if int(fields[4], 16) & (IFA_F_TENTATIVE | IFA_F_DADFAILED):
            continue
        return socket.inet_ntop(socket.AF_INET6, bytes.fromhex(fields[0]))
    return None


def link_layer_address(ifname: str, root: Path = Path("/")) -> Optional[bytes]:
    """/sys/class/net/IFNAME/address as bytes (6 for Ethernet), or None."""
    text = (fsutil.read_text(root / "sys/class/net" / ifname / "address") or "").strip()
    try:
        raw = bytes(int(part, 16) for part in text.split(":")) if text else b""
    except ValueError:
        return None
    return raw if raw and any(raw) else None


def router_solicitation(link_layer: Optional[bytes]) -> bytes:
    """The ICMPv6 message (RFC 4861 4.1): type 133, code 0, checksum 0 (the kernel
    computes it on raw ICMPv6 sockets), reserved; then the source link-layer address
    option (type 1, length in units of 8 octets) when there is an address to give."""
    packet = struct.pack("!BBHI", ICMPV6_ROUTER_SOLICITATION, 0, 0, 0)
    if link_layer:
        length = (2 + len(link_layer) + 7) // 8
        option = struct.pack("!BB", ND_OPT_SOURCE_LINKADDR, length) + link_layer
        packet += option.ljust(length * 8, b"\0")
    return packet


def send_router_solicitation(ifname: str, root: Path = Path("/")) -> None:
    """Send one ICMPv6 Router Solicitation to ff02::2 on ifname, hop limit 255.

    From the link-local address, with the source link-layer address option, so that the
    router may answer at once (RFC 4861 6.2.6). Without a usable link-local address the
    kernel picks the source (possibly the unspecified address), and then RFC 4861 forbids
    the option.
    """
    try:
        index = socket.if_nametoindex(ifname)
        source = link_local_address(ifname, root)
        with socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, ifname.encode())
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_IF, index)
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_HOPS, 255)
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_LOOP, 0)
            if source:
                sock.bind((source, 0, 0, index))
            packet = router_solicitation(link_layer_address(ifname, root) if source else None)
            sock.sendto(packet, (ALL_ROUTERS, 0, 0, index))
    except OSError as exc:
        raise Error(
            f"cannot send a router solicitation on {ifname}: " f"{exc.strerror or exc}"
        ) from None


IFA_F_TENTATIVE = 0x40
IFA_F_DADFAILED = 0x08
IPV6_SCOPE_LINK = 0x20


def link_local_tentative(ifname: str, root: Path = Path("/")) -> bool:
    """Whether ifname's link-local address is still in duplicate address detection
    (/proc/net/if_inet6: address, index, prefix length, scope, flags, name)."""
    text = fsutil.read_text(root / "proc/net/if_inet6") or ""
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 6 and fields[5] == ifname and int(fields[3], 16) == IPV6_SCOPE_LINK:
            if int(fields[4], 16) & IFA_F_TENTATIVE:
                return True
    return False


TENTATIVE = (
    "its link-local address is still tentative: the kernel solicits by itself when duplicate "
    "address detection completes, and accept_ra is 2 by then"
)


def solicit(ifname: str) -> bool:
    """Solicit, logging instead of failing: a link that is down solicits by itself when up,
    one whose link-local address is tentative when duplicate address detection ends."""
    if link_local_tentative(ifname):
        log.info("no router solicitation on %s: %s", ifname, TENTATIVE)
        return False
    try:
        send_router_solicitation(ifname)
    except Error as exc:
        if link_local_tentative(ifname):  # it became tentative meanwhile (link bounced)
            log.info("no router solicitation on %s: %s", ifname, TENTATIVE)
            return False
        log.warning("%s (the kernel solicits by itself when the link comes up)", exc)
        return False
    log.info("sent a router solicitation on %s", ifname)
    return True
