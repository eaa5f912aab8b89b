"""ipv6-ra-forward: forward IPv6 and keep learning the uplink from router advertisements.

The command line: options, dispatch, checks of the arguments, exit codes. The work is in
plan (enable, disable), status, watch, and below them stack, solicit, managers, sysctls.
"""

import argparse
import contextlib
import os
from pathlib import Path
from typing import Iterable, List, Optional

from debadmin import cli, fsutil
from debadmin.findings import text_lines
from debadmin.errors import EXIT_ACTION, EXIT_OK, Error
from debadmin.output import emit_json
from debadmin.ipv6_ra_forward.sysctls import (
    Config,
    DEFAULTS_FILE,
    DROPIN,
    matches,
    read_config,
    read_dropin,
    read_sysctl,
    sysctl_path,
    validate_ifname,
)
from debadmin.ipv6_ra_forward import owner as owners
from debadmin.ipv6_ra_forward.status import collect_status, ip_json
from debadmin.ipv6_ra_forward.stack import lower_refusal, port_refusal, uppers
from debadmin.ipv6_ra_forward.plan import (
    Loss,
    run_steps,
    losses_message,
    not_uplinks_step,
    plan_disable,
    plan_enable,
    ra_learned,
    reapply_note,
)
from debadmin.ipv6_ra_forward.watch import run_watch, watch_config

PROG = "ipv6-ra-forward"
# Not /run/lock: any user may create files there, and hold the lock for ever.
LOCK_DIR = "run"
ROOT = Path("/")  # tests point this at a fixture tree


def cmd_status(args: argparse.Namespace) -> int:
    root = ROOT
    names = [validate_ifname(n) for n in args.interfaces]
    for name in names:
        read_sysctl(root, name, "accept_ra")  # a clear error for an unknown interface
    report = collect_status(
        root,
        names,
        ip_json(["-6", "addr", "show"]),
        ip_json(["-6", "route", "show", "default"]),
        ip_json(["-6", "neigh", "show"]),
        read_config(root),
        read_dropin(root),
    )
    if args.json:
        emit_json(report)
    else:
        print(
            f"forwarding: {'on' if report['forwarding'] else 'off'} "
            f"(new interfaces get accept_ra={report['default_accept_ra']})"
        )
        for entry in report["interfaces"]:
            if not entry["uplink"] and not names:
                continue
            print(
                f"{entry['name']}: forwarding={int(entry['forwarding'])} "
                f"accept_ra={entry['accept_ra']} "
                f"RAs {'accepted' if entry['accepts_ra'] else 'ignored'} by the kernel, "
                f"managed by {entry['managed_by']}"
            )
            for address in entry["ra_addresses"]:
                print(f"  address {address}")
            for route in entry["ra_default_routes"]:
                # NetworkManager and networkd install RA routes without a kernel expiry.
                expires = "" if route["expires"] is None else f", expires {route['expires']} s"
                print(f"  default via {route['gateway']} (RA{expires})")
        for line in text_lines(report["findings"]):
            print(line)
        if not report["findings"]:
            print("no findings")
    return EXIT_OK if report["ok"] else EXIT_ACTION


def _lock(root: Path, dry_run: bool = False):
    """Serialise enable and disable (a read-modify-write of the drop-in)."""
    lock_dir = root / LOCK_DIR
    if lock_dir.is_dir() and not dry_run:
        return fsutil.locked(lock_dir / "ipv6-ra-forward.lock")
    return contextlib.nullcontext()


def _unique_names(names: List[str]) -> List[str]:
    """Validate every name before anything else is looked at; drop repetitions."""
    unique: List[str] = []
    for name in names:
        validate_ifname(name)
        if name not in unique:
            unique.append(name)
    return unique


def _require_present(
    root: Path, names: List[str], absent_ok: Iterable[str] = (), missing_hint: bool = False
) -> None:
    """Each interface must exist, except those in absent_ok (uplinks named in the drop-in
    that have gone away since: disable still takes them out of it). With missing_hint,
    a missing one is refused saying how the watcher takes it when it appears."""
    allowed = set(absent_ok)
    for name in names:
        if name in allowed and not sysctl_path(root, name, "accept_ra").exists():
            continue
        present = sysctl_path(root, name, "accept_ra").exists()
        if missing_hint and not present and not (root / "sys/class/net" / name).exists():
            made_by = owners.not_there_yet(root, name)
            watcher = (
                f'add it to UPLINKS= in /{DEFAULTS_FILE} (UPLINKS="{name}") and enable '
                "ipv6-ra-forward.service, which sets it up when it appears"
            )
            if made_by:
                raise Error(
                    f"no interface {name} yet: {made_by}, then run enable again; or {watcher}"
                )
            raise Error(
                f"no interface {name}: for one that does not exist yet (a bond, VLAN or "
                f"bridge made later), {watcher}"
            )
        read_sysctl(root, name, "accept_ra")  # a clear error for an unknown interface


def require_root(root: Path, dry_run: bool) -> None:
    """Changes need root; said in those words rather than as a lock or sysctl error."""
    if root == Path("/") and not dry_run and os.geteuid() != 0:
        raise Error("must be run as root (or try --dry-run)")


def check_uplinks(root: Path, uplinks: List[str], not_uplinks: List[str], config: Config) -> None:
    """Refuse, before anything is planned, uplinks that cannot be: named both ways, in
    NOT_UPLINKS, missing, a port of a bridge or bond, a lower device that learns nothing."""
    both = [n for n in uplinks if n in not_uplinks]
    if both:
        raise Error(f"{both[0]} is named both as an uplink and with --not-uplink")
    for name in uplinks:
        if matches(config.not_uplinks, name):
            raise Error(
                f"{name} is in NOT_UPLINKS of {root / DEFAULTS_FILE}: take it out there to "
                f"make it an uplink"
            )
    _require_present(root, uplinks, missing_hint=True)
    for name in uplinks:
        # Refused before anything is planned, so that nothing is written.
        why = port_refusal(root, name)
        if why:
            raise Error(why)
    if any(uppers(root, name) for name in uplinks):
        addr_json, route_json = ra_learned()
        for name in uplinks:
            why = lower_refusal(root, name, uplinks, addr_json, route_json)
            if why:
                raise Error(why)


def cmd_enable(args: argparse.Namespace) -> int:
    root = ROOT
    uplinks = _unique_names(args.uplinks)
    not_uplinks = _unique_names(args.not_uplink or [])
    require_root(root, args.dry_run)
    config = read_config(root)
    check_uplinks(root, uplinks, not_uplinks, config)
    persist = not args.no_persist
    with _lock(root, args.dry_run):
        losses: List[Loss] = []
        steps, _, snippets = plan_enable(
            root,
            uplinks,
            not args.no_forwarding,
            persist,
            args.networkd,
            config.not_uplinks + not_uplinks,
            losses,
        )
        if losses:
            raise Error("refused: " + losses_message(losses))
        remember = not_uplinks_step(root, config, not_uplinks) if persist else None
        if remember is not None:
            steps.insert(0, remember)
        run_steps(steps, args.dry_run)
    if not steps:
        print("nothing to change")
    for text in snippets:
        print(text, end="")
    for name in uplinks if steps else []:
        # A bridge, bond or VLAN is created anew by ifdown/ifup (a NIC is not): say what
        # brings accept_ra back then.
        sys_dir = root / "sys/class/net" / name
        if sys_dir.is_dir() and not (sys_dir / "device").exists():
            note = reapply_note(root, name, not args.no_persist)
            if note:
                print(note)
    return EXIT_ACTION if snippets else EXIT_OK


def cmd_disable(args: argparse.Namespace) -> int:
    root = ROOT
    uplinks = _unique_names(args.uplinks)
    require_root(root, args.dry_run)
    persisted = read_dropin(root)
    _require_present(root, uplinks, persisted.all_uplinks if persisted else ())
    with _lock(root, args.dry_run):
        steps, notes = plan_disable(root, uplinks, not args.no_persist)
        run_steps(steps, args.dry_run)
    for note in notes:
        print(note)
    if not steps:
        print("nothing to change")
    return EXIT_OK


def cmd_watch(args: argparse.Namespace) -> int:
    root = ROOT
    watch_config(root, args)  # a bad configuration is refused as such, root or not
    require_root(root, args.dry_run)
    return run_watch(root, args)


def build_parser() -> argparse.ArgumentParser:
    parser = cli.new_parser(
        PROG,
        "Turn on IPv6 forwarding and keep the uplinks' router advertisements: accept_ra=2\n"
        "first, then forwarding, then a router solicitation so the route is back in seconds.",
        epilog="exit status: 0 ok, 1 action needed, 2 error, 3 not applicable",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "status",
        help="report forwarding and RA state per interface",
        description="Report forwarding and RA state per interface and each "
        "problem; exit 1 when there is one.",
    )
    cli.add_verbosity(p)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("interfaces", nargs="*", metavar="IFACE", help="interfaces to report on")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser(
        "enable",
        help="accept RAs on the uplinks, then turn forwarding on",
        description="Set accept_ra=2 on each uplink, turn forwarding on, "
        "solicit a router advertisement, persist in sysctl.d.",
    )
    cli.add_verbosity(p)
    p.add_argument(
        "--no-forwarding",
        action="store_true",
        help="only set accept_ra=2; leave forwarding as it is",
    )
    p.add_argument(
        "--no-persist", action="store_true", help=f"change the running system only, not /{DROPIN}"
    )
    p.add_argument(
        "--networkd",
        action="store_true",
        help="give uplinks that systemd-networkd manages networkd's own configuration "
        "(IPv6AcceptRA=yes and its forwarding setting, in a drop-in), then networkctl reload",
    )
    p.add_argument(
        "--not-uplink",
        action="append",
        metavar="IFACE",
        help="an interface that may lose its RA-learned route and addresses when forwarding "
        "goes on (repeatable; remembered as NOT_UPLINKS in "
        f"/{DEFAULTS_FILE})",
    )
    p.add_argument(
        "-n", "--dry-run", action="store_true", help="print what would change and change nothing"
    )
    p.add_argument("uplinks", nargs="+", metavar="UPLINK", help="uplink interfaces")
    p.set_defaults(func=cmd_enable, metrics=True)  # debadmin(7) metrics

    p = sub.add_parser(
        "disable",
        help="undo what enable did",
        description="Restore accept_ra (and forwarding, if enable turned it "
        "on) and remove the uplinks from the drop-in.",
    )
    cli.add_verbosity(p)
    p.add_argument(
        "--no-persist", action="store_true", help=f"change the running system only, not /{DROPIN}"
    )
    p.add_argument(
        "-n", "--dry-run", action="store_true", help="print what would change and change nothing"
    )
    p.add_argument("uplinks", nargs="+", metavar="UPLINK", help="uplink interfaces")
    p.set_defaults(func=cmd_disable, metrics=True)  # debadmin(7) metrics

    p = sub.add_parser(
        "watch",
        help="configure matching uplinks as they appear",
        description="Apply the configured uplinks (names or globs) to existing "
        "interfaces and to those that appear or are renamed later. SIGHUP reads the "
        "configuration again; SIGTERM ends it.",
    )
    cli.add_verbosity(p)
    p.add_argument(
        "--config",
        metavar="FILE",
        help=f"read UPLINKS, NOT_UPLINKS and FORWARDING from FILE (default: /{DEFAULTS_FILE})",
    )
    p.add_argument(
        "--uplink",
        action="append",
        metavar="PATTERN",
        help="an uplink name or glob, instead of UPLINKS (repeatable)",
    )
    p.add_argument(
        "--once", action="store_true", help="configure the existing interfaces and exit"
    )
    p.add_argument(
        "-n", "--dry-run", action="store_true", help="print what would change and change nothing"
    )
    p.set_defaults(func=cmd_watch, metrics=True)  # debadmin(7) metrics
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    return cli.run(PROG, build_parser(), argv)
