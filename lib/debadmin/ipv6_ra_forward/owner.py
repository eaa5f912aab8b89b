"""Who manages a network interface: systemd-networkd, NetworkManager, ifupdown or nobody.

Read from their configuration and state files under a root directory, never by asking a
running daemon, so that the same code works on fixture trees and on a mounted image.
"""

import configparser
import fnmatch
import glob
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from debadmin import sysconf
from debadmin.errors import Error

log = logging.getLogger("debadmin")

NETWORKD = "systemd-networkd"
NETWORKMANAGER = "NetworkManager"
IFUPDOWN = "ifupdown"
NOBODY = "none"

NETWORKD_DIRS = (
    "etc/systemd/network",
    "run/systemd/network",
    "usr/local/lib/systemd/network",
    "usr/lib/systemd/network",
    "lib/systemd/network",
)
NM_CONNECTION_DIRS = (
    "etc/NetworkManager/system-connections",
    "run/NetworkManager/system-connections",
)
WANTS = (
    "etc/systemd/system/multi-user.target.wants",
    "etc/systemd/system/network-online.target.wants",
    "etc/systemd/system/sockets.target.wants",
)
# Lines that end the stanza before them (config.c read_interfaces_defn): these always;
# auto, allow-*, no-auto-down and no-scripts only with interface names after them (alone
# in a stanza, they name its interface and the stanza goes on).
IFUPDOWN_STANZAS = ("iface", "mapping", "source", "rename")
IFUPDOWN_MARKS = ("auto", "no-auto-down", "no-scripts")


def _source_keyword(word: str) -> Optional[str]:
    """source, or source-directory (ifup takes any word starting with source-dir for
    it), or None."""
    if word == "source":
        return "source"
    return "source-directory" if word.startswith("source-dir") else None


def _mark(word: str) -> bool:
    """auto, allow-*, no-auto-down or no-scripts."""
    return word in IFUPDOWN_MARKS or (word.startswith("allow-") and len(word) > 6)


def _ends_stanza(words: List[str]) -> bool:
    """Whether a line that is not an iface line ends the stanza before it."""
    first = words[0]
    if first in IFUPDOWN_STANZAS or _source_keyword(first):
        return True
    return _mark(first) and len(words) > 1


@dataclass
class Owner:
    """The manager of one interface and what it was recognised by."""

    name: str = NOBODY
    source: Optional[str] = None  # the file that says so
    connection: Optional[str] = None  # NetworkManager connection id
    inet6: Optional[Dict[str, str]] = None  # ifupdown: method and options of iface X inet6
    ipv6_method: Optional[str] = None  # NetworkManager: ipv6.method of that connection

    @property
    def handles_ra_itself(self) -> bool:
        """networkd and NetworkManager process RAs in user space and own accept_ra."""
        return self.name in (NETWORKD, NETWORKMANAGER)


def _read(path: Path, newline: Optional[str] = None) -> Optional[str]:
    """The file's text (newline="": line ends kept as they are, CRs included)."""
    try:
        with open(path, encoding="utf-8", errors="replace", newline=newline) as f:
            return f.read()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    except OSError as exc:
        raise Error(f"cannot read {path}: {exc.strerror}") from None


def _ini(text: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(
        strict=False,
        interpolation=None,
        delimiters=("=",),
        comment_prefixes=("#", ";"),
        empty_lines_in_values=False,
    )
    parser.optionxform = str  # keys are case-sensitive in both networkd and NM files
    try:
        parser.read_string(text)
    except configparser.Error:
        return configparser.ConfigParser()
    return parser


def ifindex(root: Path, ifname: str) -> Optional[int]:
    text = _read(root / "sys/class/net" / ifname / "ifindex")
    try:
        return int(text.strip()) if text else None
    except ValueError:
        return None


def _service_enabled(root: Path, unit: str) -> bool:
    return any((root / wants / unit).exists() for wants in WANTS)


# --- systemd-networkd ---------------------------------------------------------------------


def networkd_active(root: Path) -> bool:
    return (
        (root / "run/systemd/netif/links").is_dir()
        or _service_enabled(root, "systemd-networkd.service")
        or _service_enabled(root, "systemd-networkd.socket")
    )


def _networkd_files(root: Path) -> List[Path]:
    """.network files in systemd's search order: an earlier directory masks a same-named file."""
    return sysconf.dropin_files(root, NETWORKD_DIRS, ".network")


def networkd_name_matches(patterns: str, ifname: str) -> bool:
    """systemd's Name= match: globs separated by spaces, a leading ! inverts the list."""
    words = patterns.split()
    if not words:
        return False
    invert = words[0].startswith("!")
    if invert:
        words[0] = words[0][1:]
        words = [w for w in words if w]
    hit = any(fnmatch.fnmatchcase(ifname, w) for w in words)
    return hit != invert


def networkd_file_for(root: Path, ifname: str) -> Optional[Path]:
    """The first .network file whose [Match] Name= matches ifname (other keys unevaluated)."""
    for path in _networkd_files(root):
        parser = _ini(_read(path) or "")
        if not parser.has_section("Match"):
            continue
        names = parser.get("Match", "Name", fallback=None)
        if names is not None and networkd_name_matches(names, ifname):
            return path
    return None


def networkd_state(root: Path, index: Optional[int]) -> Optional[Dict[str, str]]:
    """systemd-networkd's runtime state of a link (/run/systemd/netif/links/IFINDEX)."""
    if index is None:
        return None
    text = _read(root / "run/systemd/netif/links" / str(index))
    if text is None:
        return None
    state = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith("#"):
            state[key.strip()] = value.strip()
    return state


def networkd_network_settings(root: Path, path: Path) -> Dict[str, str]:
    """The [Network] keys of a .network file and its drop-ins, the last assignment winning.

    Drop-ins are read as systemd reads them: NAME.network.d/*.conf from every search
    directory, sorted by file name across all of them, a file in an earlier directory
    (/etc) masking the same name in later ones (/usr/lib).
    """
    dropin_dirs = [f"{base}/{path.name}.d" for base in NETWORKD_DIRS]
    files = [path, *sysconf.dropin_files(root, dropin_dirs, ".conf")]
    values: Dict[str, str] = {}
    for file in files:
        parser = _ini(_read(file) or "")
        if parser.has_section("Network"):
            for key, value in parser.items("Network"):
                values[key] = value.strip()
    return values


def networkd_accepts_ra(root: Path, path: Path) -> bool:
    """Whether a .network file or its drop-ins say IPv6AcceptRA=yes explicitly."""
    return parse_boolean(networkd_network_settings(root, path).get("IPv6AcceptRA")) is True


def parse_boolean(value: Optional[str]) -> Optional[bool]:
    """systemd's parse_boolean(); None when unset or not a boolean."""
    if value is None:
        return None
    value = value.strip().lower()
    if value in ("1", "yes", "y", "true", "t", "on"):
        return True
    if value in ("0", "no", "n", "false", "f", "off"):
        return False
    return None


def systemd_version(root: Path) -> Optional[int]:
    """The major version of the installed systemd package (252 on bookworm, 257 on trixie)."""
    text = _read(root / "var/lib/dpkg/status") or ""
    for paragraph in text.split("\n\n"):
        fields = dict(
            line.split(":", 1) for line in paragraph.splitlines() if ":" in line and line[0] != " "
        )
        if fields.get("Package", "").strip() == "systemd" and "installed" in fields.get(
            "Status", ""
        ):
            digits = ""
            for char in fields.get("Version", "").strip():
                if not char.isdigit():
                    break
                digits += char
            return int(digits) if digits else None
    return None


# systemd 256 replaced the .network file's IPForward= (since ignored with a warning) by
# IPv4Forwarding= and IPv6Forwarding=, per link and in networkd.conf.
NETWORKD_PER_FAMILY_FORWARDING = 256

NETWORKD_CONF_DIRS = (
    "etc/systemd/networkd.conf.d",
    "run/systemd/networkd.conf.d",
    "usr/local/lib/systemd/networkd.conf.d",
    "usr/lib/systemd/networkd.conf.d",
)


def networkd_global_ipv6_forwarding(root: Path) -> Optional[bool]:
    """[Network] IPv6Forwarding= of networkd.conf and its drop-ins (systemd >= 256)."""
    files = [root / "etc/systemd/networkd.conf"]
    files += sysconf.dropin_files(root, NETWORKD_CONF_DIRS, ".conf")
    value = None
    for file in files:
        parser = _ini(_read(file) or "")
        if parser.has_option("Network", "IPv6Forwarding"):
            value = parse_boolean(parser.get("Network", "IPv6Forwarding"))
    return value


def _ipv6_in_family(value: Optional[str]) -> bool:
    """IPForward= / IPMasquerade= values that include IPv6: yes (both), ipv6, both."""
    if value is None:
        return False
    value = value.strip().lower()
    return value in ("ipv6", "both") or parse_boolean(value) is True


def networkd_ra_verdict(
    root: Path, path: Optional[Path], version: Optional[int]
) -> Tuple[bool, str]:
    """Whether systemd-networkd handles router advertisements on the link, and why.

    networkd runs its own RA client and sets the kernel's accept_ra to 0, so the kernel's
    forwarding sysctl does not stop it. Read from networkd's source:
      252 (bookworm) network_adjust_ipv6_accept_ra(): an unset IPv6AcceptRA= becomes
        !(ip_forward & IPv6), and ip_forward comes from the link's IPForward=
        (yes, ipv6) or its IPMasquerade= (ipv6, both).
      257 (trixie) link_ndisc_enabled(): an explicit IPv6AcceptRA= wins; else
        IPv6SendRA=yes disables it; else link_get_ip_forwarding(AF_INET6): the link's
        IPv6Forwarding=, then IPMasquerade= (ipv6, both), then networkd.conf's
        IPv6Forwarding=; unset everywhere means RAs are handled. IPForward= is ignored.
    A path of None (no .network file matches) reads as a file without settings.
    """
    settings = networkd_network_settings(root, path) if path is not None else {}
    explicit = parse_boolean(settings.get("IPv6AcceptRA"))
    if explicit is not None:
        return explicit, f"IPv6AcceptRA={settings['IPv6AcceptRA']}"
    modern = version is not None and version >= NETWORKD_PER_FAMILY_FORWARDING
    if modern:
        if parse_boolean(settings.get("IPv6SendRA")):
            return False, f"IPv6SendRA={settings['IPv6SendRA']} without IPv6AcceptRA=yes"
        forwarding = parse_boolean(settings.get("IPv6Forwarding"))
        if forwarding is not None:
            return not forwarding, f"IPv6Forwarding={settings['IPv6Forwarding']}"
        if _ipv6_in_family(settings.get("IPMasquerade")):
            return False, f"IPMasquerade={settings['IPMasquerade']} without IPv6AcceptRA=yes"
        forwarding = networkd_global_ipv6_forwarding(root)
        if forwarding:
            return False, "IPv6Forwarding=yes in networkd.conf without IPv6AcceptRA=yes"
        return True, "no IPv6AcceptRA=, IPv6Forwarding=, IPMasquerade= or IPv6SendRA="
    if _ipv6_in_family(settings.get("IPForward")):
        return False, f"IPForward={settings['IPForward']} without IPv6AcceptRA=yes"
    if _ipv6_in_family(settings.get("IPMasquerade")):
        return False, f"IPMasquerade={settings['IPMasquerade']} without IPv6AcceptRA=yes"
    return True, "no IPv6AcceptRA=, IPForward= or IPMasquerade="


def networkd_native(root: Path, path: Optional[Path], version: Optional[int]) -> Tuple[str, bool]:
    """The [Network] text by which networkd itself both forwards and keeps RAs, and
    whether the link's configuration says so already."""
    settings = networkd_network_settings(root, path) if path is not None else {}
    accept = parse_boolean(settings.get("IPv6AcceptRA")) is True
    if version is not None and version >= NETWORKD_PER_FAMILY_FORWARDING:
        forwarding = parse_boolean(settings.get("IPv6Forwarding")) is True
        return "[Network]\nIPv6AcceptRA=yes\nIPv6Forwarding=yes\n", accept and forwarding
    current = (settings.get("IPForward") or "").strip().lower()
    # IPForward= is one setting for both families: keep IPv4 forwarding where it was on.
    ipv4 = current == "ipv4" or parse_boolean(current) is True or current == "both"
    value = "yes" if ipv4 else "ipv6"
    return f"[Network]\nIPv6AcceptRA=yes\nIPForward={value}\n", accept and _ipv6_in_family(current)


# --- NetworkManager -----------------------------------------------------------------------


def networkmanager_active(root: Path) -> bool:
    return (root / "run/NetworkManager").is_dir() or _service_enabled(
        root, "NetworkManager.service"
    )


def nm_interface_name(
    parser: configparser.ConfigParser, profiles: Optional[list] = None
) -> Optional[str]:
    """The interface a keyfile is for: interface-name, or for a VLAN profile without one
    the name NetworkManager gives it (nm_utils_new_vlan_name(): PARENT.ID, the parent
    shortened to fit 15 bytes); a parent given as a profile's UUID is that profile's
    interface (profiles: the (path, parser) pairs to look it up in)."""
    name = parser.get("connection", "interface-name", fallback=None)
    if name or parser.get("connection", "type", fallback=None) != "vlan":
        return name
    parent = parser.get("vlan", "parent", fallback="")
    vlan_id = parser.get("vlan", "id", fallback="")
    if parent and _is_uuid(parent):
        parent = _nm_by_uuid(profiles or [], parent) or ""
    if not parent or not vlan_id.isdigit():
        return None  # no parent, or one no profile here names: no name to compare
    suffix = f".{int(vlan_id)}"
    return parent[: 15 - len(suffix)] + suffix


def nm_connection_for(root: Path, ifname: str) -> Optional[Dict[str, str]]:
    """The NetworkManager keyfile bound to ifname: {'id': ..., 'path': ..., 'method': ...}."""
    profiles = _nm_profiles(root)
    for entry, parser in profiles:
        if nm_interface_name(parser, profiles) == ifname:
            return {
                "id": parser.get("connection", "id", fallback=entry.name[:-13]),
                "path": str(entry),
                "method": parser.get("ipv6", "method", fallback="auto"),
            }
    return None


def nm_device_managed(root: Path, index: Optional[int]) -> Optional[bool]:
    """NetworkManager's runtime view of a device (/run/NetworkManager/devices/IFINDEX)."""
    if index is None:
        return None
    text = _read(root / "run/NetworkManager/devices" / str(index))
    if text is None:
        return None
    value = _ini(text).get("device", "managed", fallback="false").strip().lower()
    return value in ("true", "yes", "1")


# --- ifupdown -----------------------------------------------------------------------------


def _logical_lines(text: str) -> List[str]:
    """ifupdown's lines (config.c get_line): split on newlines only; a line starting
    with # after its leading blanks is a comment, and never goes on; a line whose last
    character is a backslash (before any trailing blank is trimmed) goes on with the
    next one; blank lines are left out."""
    lines: List[str] = []
    pending: Optional[str] = None
    for raw in text.split("\n"):
        if pending is None:
            if raw.strip().startswith("#"):
                continue
            pending = ""
        if raw.endswith("\\"):
            pending += raw[:-1]
            continue
        line = (pending + raw).strip()
        pending = None
        if line:
            lines.append(line)
    if pending and pending.strip():
        lines.append(pending.strip())
    return lines


# source-directory reads the files whose names match this (interfaces(5)).
SOURCE_DIRECTORY_NAME = re.compile(r"[A-Za-z0-9_-]+")


def _ifupdown_lines(root: Path, path: Path, seen: set) -> List[Tuple[str, Path]]:
    """The lines of /etc/network/interfaces with source and source-directory expanded,
    each with the file it is in.  A source line stays, before what it includes: like
    any stanza keyword, it ends the stanza before it (and a stanza ends with its file:
    an option after the source line belongs to no stanza, as ifup says)."""
    if path in seen:
        return []
    seen.add(path)
    text = _read(path, newline="")  # ifup reads bytes: a CR stays, before the newline
    if text is None:
        return []
    lines: List[Tuple[str, Path]] = []
    for line in _logical_lines(text):
        words = line.split()
        lines.append((line, path))
        keyword = _source_keyword(words[0])
        if keyword is None or len(words) < 2:
            continue
        # Relative paths are relative to the directory of the current file; shell
        # wildcards may be used in both (ifupdown expands them with wordexp).
        target = (
            root / words[1].lstrip("/") if words[1].startswith("/") else path.parent / words[1]
        )
        matches = [Path(match) for match in sorted(glob.glob(str(target)))]
        if keyword == "source":
            for match in matches:
                lines.extend(_ifupdown_lines(root, match, seen))
            continue
        for directory in matches:
            try:
                names = sorted(p.name for p in directory.iterdir())
            except OSError:
                names = []
            for name in names:
                if SOURCE_DIRECTORY_NAME.fullmatch(name):
                    lines.extend(_ifupdown_lines(root, directory / name, seen))
    return lines


@dataclass
class Stanza:
    """One iface stanza as ifup reads it: each is its own logical interface definition,
    run in file order with the others of the same name and family."""

    ifname: str
    family: str
    options: Dict[str, str]  # 'method' and the options (an option's first value)
    source: Path  # the file it is in (a stanza ends with its file)


def ifupdown_stanza_list(root: Path) -> List[Stanza]:
    """The iface stanzas of /etc/network/interfaces and the files it sources, in the
    order ifup reads them."""
    stanzas: List[Stanza] = []
    current: Optional[Stanza] = None
    last: Optional[Path] = None
    for line, path in _ifupdown_lines(root, root / "etc/network/interfaces", set()):
        words = line.split()
        if path != last:  # a stanza ends with its file (ifupdown reads each on its own)
            current, last = None, path
        if words[0] == "iface" and len(words) >= 4:
            current = Stanza(words[1], words[2], {"method": words[3]}, path)
            stanzas.append(current)
        elif _ends_stanza(words):
            current = None
        elif current is not None and _mark(words[0]):
            continue  # alone in a stanza: marks its interface, not an option
        elif current is not None:
            # ifup joins a repeated option's values with newlines and runs the first.
            current.options.setdefault(words[0], " ".join(words[1:]))
    return stanzas


# The accept_ra that ifupdown writes at ifup when an inet6 stanza sets none, per method.
# interfaces(5) of bookworm's ifupdown 0.8.41, INET6 ADDRESS FAMILY: "The auto Method ...
# accept_ra int ... Default value: "2"", "The dhcp Method ... accept_ra int ... Default
# value: "1"", "The static Method" lists accept_ra without a default: ifupdown writes it
# only when it is set, except that its inet6.defn converts 'gateway (if_set 0)
# =accept_ra?', so a static stanza with a gateway and no accept_ra gets 0. Only these three
# methods write accept_ra at all (manual, loopback, v4tunnel and 6to4 do not).
IFUPDOWN_ACCEPT_RA_DEFAULT = {"auto": "2", "dhcp": "1", "static": None}


def stanza_accept_ra(inet6: Optional[Dict[str, str]]) -> Optional[str]:
    """The accept_ra one inet6 stanza (method and options) writes at ifup, or None."""
    if inet6 is None:
        return None
    method = inet6.get("method", "")
    if method not in IFUPDOWN_ACCEPT_RA_DEFAULT:
        return None
    value = inet6.get("accept_ra")
    if value is not None:
        return value.strip()
    if method == "static" and inet6.get("gateway"):
        return "0"
    return IFUPDOWN_ACCEPT_RA_DEFAULT[method]


def ifupdown_deciding(stanzas: List[Stanza], ifname: str) -> Optional[Stanza]:
    """The stanza of ifname whose accept_ra stays after ifup: ifup runs every iface
    stanza of the name in order, each with its own options and its method's defaults,
    so the last inet6 stanza that writes accept_ra decides; else its last inet6
    stanza, else its last stanza of any family (None where it has none)."""
    mine = [s for s in stanzas if s.ifname == ifname]
    inet6 = [s for s in mine if s.family == "inet6"]
    writing = [s for s in inet6 if stanza_accept_ra(s.options) is not None]
    for found in (writing, inet6, mine):
        if found:
            return found[-1]
    return None


# --- all together ---------------------------------------------------------------------------


def detect(root: Path, ifname: str) -> Owner:
    """Who manages ifname; runtime state first, then configuration."""
    index = ifindex(root, ifname)
    state = networkd_state(root, index)
    if state and state.get("ADMIN_STATE", "unmanaged") != "unmanaged":
        # A link still pending has no NETWORK_FILE yet: name the .network file that
        # matches it, so that a drop-in for it is one that applies.
        source = state.get("NETWORK_FILE") or networkd_file_for(root, ifname)
        return Owner(NETWORKD, str(source or root / "run/systemd/netif/links" / str(index)))
    managed = nm_device_managed(root, index)
    if managed:
        conn = nm_connection_for(root, ifname)
        return Owner(
            NETWORKMANAGER,
            conn["path"] if conn else str(root / "run/NetworkManager/devices" / str(index)),
            connection=conn["id"] if conn else None,
            ipv6_method=conn["method"] if conn else None,
        )
    if networkd_active(root) and state is None:
        path = networkd_file_for(root, ifname)
        if path is not None:
            return Owner(NETWORKD, str(path))
    if networkmanager_active(root) and managed is None:
        conn = nm_connection_for(root, ifname)
        if conn is not None:
            return Owner(
                NETWORKMANAGER, conn["path"], connection=conn["id"], ipv6_method=conn["method"]
            )
    stanza = ifupdown_deciding(ifupdown_stanza_list(root), ifname)
    if stanza is not None:
        # The file of the stanza whose accept_ra counts (an interfaces.d file, where
        # that stanza is there): what advice and findings name.
        inet6 = stanza.options if stanza.family == "inet6" else None
        return Owner(IFUPDOWN, str(stanza.source), inet6=inet6)
    return Owner()


# --- bonds, bridges and VLANs in the managers' configuration -----------------------------
#
# sysfs tells what is stacked now; the configuration tells what each manager makes at its
# next start or reload: a bond that is not up yet, the ports it will take. Read so that a
# port is sent to the top of its stack before the bond exists, and so that advice names
# the file and the setting that make the device.


@dataclass
class Stacked:
    """A relation a manager's configuration sets up: ifname is a port of master (Bond=,
    bond-master, controller=), or ifname is a device the manager makes (kind bond, vlan,
    bridge...); how is the setting as written, source the file."""

    manager: str
    kind: str
    how: str
    source: str
    master: Optional[str] = None

    def where(self) -> str:
        return f"{self.manager}: {self.how} in {self.source}"


def _ini_values(text: str, section: str, key: str) -> List[str]:
    """Every value of a key that may repeat in a section (networkd's VLAN=, Bond=...);
    configparser keeps only the last one."""
    values, current = [], None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1].strip()
        elif current == section and "=" in line:
            name, _, value = line.partition("=")
            if name.strip() == key:
                values.append(value.strip())
    return values


NETWORKD_MASTER_KEYS = (("Bond", "bond"), ("Bridge", "bridge"))
NETWORKD_STACKED_KEYS = ("VLAN", "MACVLAN", "IPVLAN", "MACVTAP")


def _networkd_network_texts(root: Path, path: Path) -> List[Tuple[Path, str]]:
    dropin_dirs = [f"{base}/{path.name}.d" for base in NETWORKD_DIRS]
    return [(f, _read(f) or "") for f in [path, *sysconf.dropin_files(root, dropin_dirs, ".conf")]]


def networkd_master(root: Path, ifname: str) -> Optional[Stacked]:
    """The bond or bridge ifname's .network (or its drop-ins) puts it in: Bond=, Bridge=."""
    path = networkd_file_for(root, ifname)
    if path is None:
        return None
    found = None
    for file, text in _networkd_network_texts(root, path):
        for key, kind in NETWORKD_MASTER_KEYS:
            for value in _ini_values(text, "Network", key):
                # The last assignment wins; an empty one resets.
                found = (
                    Stacked(NETWORKD, kind, f"{key}={value}", str(file), value) if value else None
                )
    return found


def networkd_netdev(root: Path, ifname: str) -> Optional[Stacked]:
    """The .netdev that makes ifname ([NetDev] Name=ifname), with its Kind=."""
    for path in sysconf.dropin_files(root, NETWORKD_DIRS, ".netdev"):
        text = _read(path) or ""
        names = _ini_values(text, "NetDev", "Name")
        if names and names[-1] == ifname:
            kinds = _ini_values(text, "NetDev", "Kind")
            kind = kinds[-1] if kinds else "?"
            return Stacked(NETWORKD, kind, f"Kind={kind}", str(path))
    return None


def networkd_stacked_on(root: Path, ifname: str) -> List[str]:
    """The devices ifname's .network puts on it (VLAN=, MACVLAN=...)."""
    path = networkd_file_for(root, ifname)
    if path is None:
        return []
    names: List[str] = []
    for _, text in _networkd_network_texts(root, path):
        for key in NETWORKD_STACKED_KEYS:
            names += [v for v in _ini_values(text, "Network", key) if v and v not in names]
    return names


# ifenslave's and bridge-utils' options (interfaces(5) of ifenslave and bridge-utils-interfaces(5));
# ifupdown2 spells them with '-' where bridge-utils has '_'.
IFUPDOWN_PORT_LISTS = (
    ("bond-slaves", "bond"),
    ("bridge_ports", "bridge"),
    ("bridge-ports", "bridge"),
)


def _ifupdown_vlan_name(ifname: str, options: Dict[str, str]) -> bool:
    """The vlan package's names: vlan-raw-device, or RAW.ID / vlanID (if-pre-up.d/vlan)."""
    if "vlan-raw-device" in options or "vlan_raw_device" in options:
        return True
    raw, dot, vid = ifname.rpartition(".")
    return bool(dot and raw and vid.isdigit())


def ifupdown_master(root: Path, ifname: str) -> Optional[Stacked]:
    """The bond or bridge ifupdown puts ifname in: bond-master on its stanza, or its name
    in a bond's bond-slaves or a bridge's bridge_ports."""
    stanzas = ifupdown_stanza_list(root)
    for stanza in stanzas:
        if stanza.ifname == ifname and stanza.options.get("bond-master"):
            master = stanza.options["bond-master"].split()[0]
            return Stacked(IFUPDOWN, "bond", f"bond-master {master}", str(stanza.source), master)
    for stanza in stanzas:
        for key, kind in IFUPDOWN_PORT_LISTS:
            value = stanza.options.get(key) or ""
            if ifname in value.split():
                how = f"{key} {value} ('iface {stanza.ifname} {stanza.family}')"
                return Stacked(IFUPDOWN, kind, how, str(stanza.source), stanza.ifname)
    return None


def ifupdown_device(root: Path, ifname: str) -> Optional[Stacked]:
    """What kind of device an ifupdown stanza of ifname makes: bond, bridge, vlan."""
    for stanza in ifupdown_stanza_list(root):
        if stanza.ifname != ifname:
            continue
        options, source = stanza.options, str(stanza.source)
        name, family = stanza.ifname, stanza.family
        for option in ("bond-slaves", "bond-mode", "bond_mode"):
            if option in options:
                return Stacked(IFUPDOWN, "bond", f"'iface {name} {family}' with {option}", source)
        for option in ("bridge_ports", "bridge-ports"):
            if option in options:
                how = f"'iface {name} {family}' with {option}"
                return Stacked(IFUPDOWN, "bridge", how, source)
        if _ifupdown_vlan_name(ifname, options):
            return Stacked(IFUPDOWN, "vlan", f"'iface {name} {family}' (vlan)", source)
    return None


def _nm_profiles(root: Path) -> List[Tuple[Path, configparser.ConfigParser]]:
    return [
        (entry, _ini(_read(entry) or ""))
        for entry in sysconf.dropin_files(root, NM_CONNECTION_DIRS, ".nmconnection")
    ]


def _nm_by_uuid(profiles, uuid: str) -> Optional[str]:
    """The interface name of the profile with this UUID (a controller or a VLAN parent
    may be named by its profile's UUID rather than by an interface name)."""
    for _, parser in profiles:
        if parser.get("connection", "uuid", fallback="").lower() == uuid.lower():
            return parser.get("connection", "interface-name", fallback=None)
    return None


def _is_uuid(value: str) -> bool:
    return len(value) == 36 and value.count("-") == 4


def nm_master(root: Path, ifname: str) -> Optional[Stacked]:
    """The bond or bridge a NetworkManager port profile puts ifname in: controller= and
    port-type= (1.46 and later, trixie's 1.52), or master= and slave-type= (bookworm's
    1.42); the controller named by interface or by its profile's UUID."""
    profiles = _nm_profiles(root)
    for entry, parser in profiles:
        if nm_interface_name(parser, profiles) != ifname:
            continue
        for key, type_key in (("controller", "port-type"), ("master", "slave-type")):
            master = parser.get("connection", key, fallback="").strip()
            if not master:
                continue
            kind = parser.get("connection", type_key, fallback="").strip() or "controller"
            name = _nm_by_uuid(profiles, master) if _is_uuid(master) else master
            how = f"{key}={master}, {type_key}={kind}"
            return Stacked(NETWORKMANAGER, kind, how, str(entry), name or master)
    return None


def nm_device(root: Path, ifname: str) -> Optional[Stacked]:
    """The NetworkManager profile that makes ifname (type bond, bridge, vlan...)."""
    profiles = _nm_profiles(root)
    for entry, parser in profiles:
        kind = parser.get("connection", "type", fallback="")
        if (
            kind in ("bond", "bridge", "vlan", "macvlan")
            and nm_interface_name(parser, profiles) == ifname
        ):
            conn = parser.get("connection", "id", fallback=entry.name[:-13])
            return Stacked(NETWORKMANAGER, kind, f"connection {conn} (type={kind})", str(entry))
    return None


def _managers(root: Path) -> List[str]:
    """The managers whose configuration counts here, in detect()'s order."""
    found = []
    if networkd_active(root):
        found.append(NETWORKD)
    if networkmanager_active(root):
        found.append(NETWORKMANAGER)
    if (root / "etc/network/interfaces").exists():
        found.append(IFUPDOWN)
    return found


def _configured(root: Path, ifname: str, readers: Dict[str, Any]) -> Optional[Stacked]:
    """What the first manager in detect()'s order whose reader finds something says."""
    for manager in _managers(root):
        found = readers[manager](root, ifname)
        if found is not None:
            return found
    return None


def configured_master(root: Path, ifname: str) -> Optional[Stacked]:
    """The bond or bridge a manager's configuration makes ifname a port of, if any."""
    readers = {NETWORKD: networkd_master, NETWORKMANAGER: nm_master, IFUPDOWN: ifupdown_master}
    return _configured(root, ifname, readers)


def configured_device(root: Path, ifname: str) -> Optional[Stacked]:
    """The bond, bridge or VLAN a manager's configuration makes under the name ifname."""
    readers = {NETWORKD: networkd_netdev, NETWORKMANAGER: nm_device, IFUPDOWN: ifupdown_device}
    return _configured(root, ifname, readers)


BRING_UP = {
    NETWORKD: "'networkctl reload' makes it",
    NETWORKMANAGER: "'nmcli connection up' of its profile makes it",
    IFUPDOWN: "'ifup {name}' makes it",
}


def not_there_yet(root: Path, ifname: str) -> Optional[str]:
    """For an interface that does not exist: which manager would make it, and how."""
    device = configured_device(root, ifname)
    if device is None:
        return None
    return (
        f"{device.manager} makes {ifname} ({device.how} in {device.source}) but it does "
        f"not exist now: {BRING_UP[device.manager].format(name=ifname)}"
    )
