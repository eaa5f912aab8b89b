"""The watcher: uplinks that appear, and accept_ra lowered behind our back (uevents, rtnetlink)."""

import argparse
import logging
import os
import select
import signal
import socket
import struct
import sys
import time
from pathlib import Path
from typing import Iterable, List, Optional

import pyudev

from debadmin.errors import EXIT_ACTION, EXIT_OK, Error
from debadmin.ipv6_ra_forward import owner as owners
from debadmin.ipv6_ra_forward.sysctls import (
    Config,
    DEFAULTS_FILE,
    ipv6_interfaces,
    matches,
    read_config,
    read_dropin,
    read_sysctl,
    sysctl_key,
    sysctl_path,
    validate_ifname,
    validate_pattern,
    write_sysctl,
)
from debadmin.ipv6_ra_forward.solicit import solicit
from debadmin.ipv6_ra_forward.stack import link_is_up, master_of, port_refusal
from debadmin.ipv6_ra_forward.plan import (
    Loss,
    run_steps,
    forwarding_losses,
    losses_message,
    plan_enable,
    ra_learned,
    sysctl_step,
)

log = logging.getLogger("debadmin")


def wait_for_sysctl(root: Path, ifname: str, timeout: float = 2.0) -> bool:
    """The kernel's uevent can precede the interface's IPv6 sysctl directory by a moment."""
    deadline = time.monotonic() + timeout
    while not sysctl_path(root, ifname, "accept_ra").exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def configure_new(root: Path, ifname: str, dry_run: bool, lowered: Optional[int] = None) -> bool:
    """accept_ra=2 on an uplink that appeared (or whose accept_ra was lowered), then a
    solicitation; True if it changed."""
    try:
        validate_ifname(ifname)
    except Error as exc:
        log.warning("ignored: %s", exc)
        return False
    if not wait_for_sysctl(root, ifname):
        log.warning(
            "%s has no IPv6 configuration (%s): left alone",
            ifname,
            sysctl_path(root, ifname, "accept_ra"),
        )
        return False
    why = port_refusal(root, ifname)
    if why:
        log.warning("%s left alone: %s", ifname, why)
        return False
    owner = owners.detect(root, ifname)
    if owner.handles_ra_itself:
        log.warning("%s is managed by %s: left alone; configure it there", ifname, owner.name)
        return False
    try:
        current = read_sysctl(root, ifname, "accept_ra")
        if current == 2:
            return False
        if dry_run:
            print(f"would set {sysctl_key(ifname, 'accept_ra')}=2 (was {current}) and solicit")
            return False
        write_sysctl(root, ifname, "accept_ra", 2)
    except Error as exc:  # the interface went away again
        log.warning("%s", exc)
        return False
    # A link event, not a uevent: an ifup lowered it, or (a new interface) the
    # rtnetlink event came before the uevent.
    why = ", seen on a link event" if lowered is not None else ""
    print(f"{ifname}: set accept_ra=2 (was {current}{why})", flush=True)
    if link_is_up(root, ifname):
        solicit(ifname)
    else:
        log.info("%s is down: the kernel solicits by itself when it comes up", ifname)
    return True


def udev_source(root: Path = Path("/")) -> str:
    """Which uevents to listen to: udevd's (sent after its rules ran, names final) when
    udevd runs in our network namespace; else the kernel's, which every network namespace
    gets for its own devices (containers without udevd, 'ip netns exec')."""
    if not (root / "run/udev/control").exists():
        return "kernel"
    try:
        same = os.stat("/proc/self/ns/net").st_ino == os.stat("/proc/1/ns/net").st_ino
    except OSError:
        same = False
    return "udev" if same else "kernel"


def watch_config(root: Path, args: argparse.Namespace) -> Config:
    """The configuration of watch: the file, with --uplink in place of its UPLINKS."""
    config = read_config(root, Path(args.config) if args.config else None)
    if args.uplink:
        config.uplinks = [validate_pattern(p) for p in args.uplink]
    return config


def valid_names(names: Iterable[str]) -> List[str]:
    """The names enable would accept; the others are left alone with a warning."""
    good = []
    for name in names:
        try:
            good.append(validate_ifname(name))
        except Error as exc:
            log.warning("ignored: %s", exc)
    return good


def watched(root: Path, config: Config) -> Config:
    """What watch keeps: UPLINKS, plus the kernel uplinks enable recorded in the drop-in
    (an ifup that writes accept_ra 1 must not undo those either). Forwarding follows
    FORWARDING when UPLINKS is set, else the drop-in (systemd-sysctl applies it)."""
    try:
        persisted = read_dropin(root)
    except Error as exc:
        log.warning("%s", exc)
        persisted = None
    if persisted is None:
        return config
    held = list(persisted.held)
    nots = config.not_uplinks
    if not persisted.uplinks:
        return Config(config.uplinks, config.forwarding, held, nots)
    extra = [n for n in persisted.uplinks if n not in config.uplinks]
    if not config.uplinks:
        return Config(extra, persisted.forwarding, held, nots)
    return Config(config.uplinks + extra, config.forwarding, held, nots)


def apply_existing(root: Path, config: Config, dry_run: bool) -> bool:
    """What enable --no-persist does, for the existing interfaces that match UPLINKS.

    Forwarding is left off, and the journal says why, while it would cost an interface
    neither UPLINKS nor NOT_UPLINKS names what it learned from RAs (enable's rule);
    returns False then, so that the watcher tries again later.
    """
    existing = []
    for name in valid_names(n for n in ipv6_interfaces(root) if config.is_uplink(n)):
        why = port_refusal(root, name)
        if why:
            log.warning("%s left alone: %s", name, why)
        elif name not in config.held:
            existing.append(name)
    losses: List[Loss] = []
    if existing:
        steps, _, snippets = plan_enable(
            root, existing, config.forwarding, False, False, config.not_uplinks, losses
        )
        run_steps(steps, dry_run)
        for text in snippets:
            log.warning("%s", text.rstrip())
    elif config.forwarding:
        current = read_sysctl(root, "all", "forwarding")
        if current != 1:
            addr_json, route_json = ra_learned()
            losses = forwarding_losses(root, [], config.not_uplinks, addr_json, route_json)
            if not losses:
                run_steps([sysctl_step(root, "all", "forwarding", 1, current)], dry_run)
    if losses:
        message = "forwarding left off: " + losses_message(losses, watcher=True)
        # Said once as an error; the watcher's retries each minute repeat it quietly.
        if message != _last_refusal[0]:
            log.error("%s", message)
        else:
            log.info("%s", message)
        _last_refusal[0] = message
        return False
    _last_refusal[0] = ""
    return True


_last_refusal = [""]


def warn_new_learner(root: Path, config: Config, ifname: str, appeared: bool = True) -> None:
    """An interface UPLINKS does not match, new or there at start, that would learn from
    RAs but for forwarding: the journal says it learns nothing, unless NOT_UPLINKS names
    it (at boot forwarding goes on before any interface has learned anything)."""
    if matches(config.not_uplinks, ifname) or not wait_for_sysctl(root, ifname, 0.5):
        return
    try:
        if read_sysctl(root, "all", "forwarding") != 1:
            return
        accept_ra = read_sysctl(root, ifname, "accept_ra")
    except Error:
        return
    if accept_ra in (0, 2) or ifname == "lo" or master_of(root, ifname):
        return
    if owners.detect(root, ifname).handles_ra_itself:
        return
    log.warning(
        "%s %s accept_ra=%d while forwarding is on: it learns no default route "
        "or address from router advertisements; add it to UPLINKS= (to learn them) or "
        "NOT_UPLINKS= (to say it need not) in /%s",
        ifname,
        "appeared with" if appeared else "has",
        accept_ra,
        DEFAULTS_FILE,
    )


# rtnetlink: an ifup, NetworkManager or networkd lowering accept_ra.
#
# No event says "accept_ra changed": RTM_NEWNETCONF carries forwarding, proxy_ndp and
# mc_forwarding only. But whoever lowers accept_ra on an uplink does it while configuring
# the link: ifupdown writes accept_ra, then sets the link up (RTM_NEWLINK) and the kernel
# adds its link-local address (RTM_NEWADDR); ifdown/ifup, NetworkManager and networkd
# reconfiguring a link change its flags and addresses the same way. So watch re-reads
# accept_ra of a matching uplink on every link or IPv6 address event for it, and of every
# matching uplink on an IPv6 netconf event (forwarding switched) and once a minute (a bare
# 'sysctl -w' raises no event).


NETLINK_ROUTE = 0
SOL_NETLINK = 270
NETLINK_ADD_MEMBERSHIP = 1
RTNLGRP_LINK = 1
RTNLGRP_IPV6_IFADDR = 9
RTNLGRP_IPV6_NETCONF = 25


RTM_NEWLINK, RTM_DELLINK, RTM_NEWADDR, RTM_DELADDR = 16, 17, 20, 21


RTM_NEWNETCONF = 80
RECHECK_SECONDS = 60.0
ALL = -1  # "every uplink" in the result of netlink_indexes


def rtnetlink_socket() -> socket.socket:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_NONBLOCK, NETLINK_ROUTE)
    sock.bind((0, 0))
    for group in (RTNLGRP_LINK, RTNLGRP_IPV6_IFADDR, RTNLGRP_IPV6_NETCONF):
        sock.setsockopt(SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, group)
    return sock


def netlink_indexes(data: bytes) -> set:
    """The interface indexes that rtnetlink messages are about; ALL for a netconf one.

    struct nlmsghdr (16 bytes: len, type, flags, seq, pid), then struct ifinfomsg
    (family, pad, type, index, ...) or struct ifaddrmsg (family, prefixlen, flags, scope,
    index): either way the index is the 32-bit word 4 bytes into the payload.
    """
    found = set()
    offset = 0
    while offset + 16 <= len(data):
        length, kind = struct.unpack_from("=IH", data, offset)
        if length < 16 or offset + length > len(data):
            break
        if kind in (RTM_NEWLINK, RTM_NEWADDR, RTM_DELADDR) and length >= 24:
            found.add(struct.unpack_from("=i", data, offset + 20)[0])
        elif kind == RTM_NEWNETCONF:
            found.add(ALL)
        offset += (length + 3) & ~3
    return found


def drain_netlink(sock: socket.socket) -> set:
    found: set = set()
    while True:
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            return found
        except OSError as exc:  # ENOBUFS: events were lost; look at everything
            log.info("rtnetlink: %s: checking every uplink", exc.strerror or exc)
            return {ALL}
        found |= netlink_indexes(data)


def recheck(root: Path, config: Config, indexes: set, dry_run: bool) -> List[str]:
    """Raise accept_ra back to 2 on matching uplinks that lost it; the names changed."""
    if ALL in indexes:
        names = [n for n in ipv6_interfaces(root) if config.is_uplink(n)]
    else:
        names = []
        for index in sorted(indexes):
            try:
                name = socket.if_indextoname(index)
            except OSError:
                continue  # gone again
            if config.is_uplink(name):
                names.append(name)
    changed = []
    for name in valid_names(names):
        try:
            current = read_sysctl(root, name, "accept_ra")
        except Error:
            continue
        if current == 2 or name in config.held or master_of(root, name):
            continue
        if owners.detect(root, name).handles_ra_itself:
            continue  # networkd and NetworkManager own accept_ra (0) on their links
        if configure_new(root, name, dry_run, lowered=current):
            changed.append(name)
    return changed


def reload_watch(root: Path, args: argparse.Namespace, config: Config) -> Config:
    """SIGHUP: read the configuration again and apply it to the existing interfaces.

    A configuration that cannot be read keeps the running one: a typo in the file must
    not end the service (Restart= would not bring it back from exit 2).
    """
    try:
        new = watch_config(root, args)
    except Error as exc:
        log.error("reload failed, still watching for %s: %s", " ".join(config.uplinks), exc)
        return config
    if not new.uplinks:
        # As at start, no uplinks means nothing to do: above all, forwarding is not
        # turned on, which would drop every interface's RA default route.
        print("reloaded: no uplinks configured: nothing changed, watching for nothing", flush=True)
        return new
    try:
        apply_existing(root, new, args.dry_run)
    except Error as exc:
        log.error("reload: %s", exc)
    print(f"reloaded: watching for {' '.join(new.uplinks)}", flush=True)
    return new


def handle_uevents(root: Path, config: Config, monitor, dry_run: bool) -> None:
    """New and renamed interfaces: an uplink is configured, another one that will learn
    nothing with forwarding on is named in the journal."""
    while True:
        device = monitor.poll(timeout=0)
        if device is None:
            return
        name = device.sys_name
        if device.action not in ("add", "move"):
            continue
        if config.is_uplink(name) and name not in config.held:
            configure_new(root, name, dry_run)
        elif not config.is_uplink(name) and device.action == "add":
            warn_new_learner(root, config, name)


def watch_loop(root, args, base, monitor, rtnl, stop, reload) -> None:
    """uevents for new and renamed interfaces; rtnetlink events (and a periodic look) for
    uplinks whose accept_ra something lowered.

    base is the configuration file's; the drop-in's uplinks and held uplinks are read
    again at each event, so that an 'enable' or 'disable' meanwhile holds at once.
    """
    next_recheck = time.monotonic() + RECHECK_SECONDS
    while not stop:
        if reload:
            reload.clear()
            base = reload_watch(root, args, base)
            continue
        if rtnl is not None:
            ready = select.select([monitor, rtnl], [], [], 1.0)[0]
        else:  # tests: a stand-in monitor without a file descriptor
            ready = [monitor]
        indexes = drain_netlink(rtnl) if rtnl is not None and rtnl in ready else set()
        if time.monotonic() >= next_recheck:
            indexes.add(ALL)
            next_recheck = time.monotonic() + RECHECK_SECONDS
            if _last_refusal[0]:
                # Forwarding was left off: try again, the other interfaces may have changed.
                try:
                    apply_existing(root, watched(root, base), args.dry_run)
                except Error as exc:
                    log.warning("%s", exc)
        if not indexes and monitor not in ready:
            continue
        config = watched(root, base)
        if monitor in ready:
            handle_uevents(root, config, monitor, args.dry_run)
        if indexes:
            try:
                recheck(root, config, indexes, args.dry_run)
            except Error as exc:
                log.warning("%s", exc)


def run_watch(root: Path, args: argparse.Namespace) -> int:
    """watch: apply the configuration, then (without --once) follow the events."""
    base = watch_config(root, args)
    config = watched(root, base)
    if not config.uplinks:
        print(f"no uplinks configured (UPLINKS in {root / DEFAULTS_FILE}): nothing to watch")
        return EXIT_OK
    source = udev_source(root)
    monitor = None
    rtnl = None
    if not args.once:
        # Listen before looking at the existing interfaces, so that none slips between.
        monitor = pyudev.Monitor.from_netlink(pyudev.Context(), source=source)
        monitor.filter_by("net")
        monitor.start()
        rtnl = rtnetlink_socket()
    stop: List[bool] = []
    reload: List[bool] = []
    if not args.once:
        # Before the first apply: a reload right after start must not kill the daemon.
        signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
        signal.signal(signal.SIGHUP, lambda *_: reload.append(True))
    try:
        apply_existing(root, config, args.dry_run)
    except Error as exc:
        # Not a configuration error (an interface gone meanwhile, a sysctl that cannot
        # be written): exit 1, so that Restart= tries again; exit 2, after which the
        # service is not restarted, is kept for configuration errors.
        print(f"ipv6-ra-forward: error: {exc}", file=sys.stderr)
        return EXIT_ACTION
    for name in valid_names(ipv6_interfaces(root)):
        if not config.is_uplink(name):
            warn_new_learner(root, config, name, appeared=False)
    if args.once:
        return EXIT_OK
    log.info("watching %s events of subsystem net for %s", source, " ".join(config.uplinks))
    print(f"watching for {' '.join(config.uplinks)}", flush=True)
    try:
        watch_loop(root, args, base, monitor, rtnl, stop, reload)
    finally:
        if rtnl is not None:
            rtnl.close()
    return EXIT_OK
