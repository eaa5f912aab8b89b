"""sbuild-fast: sbuild chroots with debhelper and eatmydata preinstalled, kept fresh.

The command line only: create.py, update.py, remove.py and configure.py do those
commands' work, session.py serves sbuild, doctor.py checks."""

import argparse
import signal
from pathlib import Path
from typing import Optional, Sequence

from debadmin import cli
from debadmin.errors import EXIT_OK
from debadmin.output import emit_json
from debadmin.sbuild_fast import create as sfc
from debadmin.sbuild_fast import doctor as sfd
from debadmin.sbuild_fast import remove as sfr
from debadmin.sbuild_fast import sbuild as sbs
from debadmin.sbuild_fast import session as sfs
from debadmin.sbuild_fast import update as sfu

PROG = "sbuild-fast"


def cmd_create(args: argparse.Namespace) -> int:
    return sfc.create(args)


def cmd_update(args: argparse.Namespace) -> int:
    return sfu.update(args)


# --- list / remove ------------------------------------------------------------------------


def cmd_list(args: argparse.Namespace) -> int:
    states = sbs.all_states()
    chroots = [sbs.describe(s) for s in states]
    caches = sbs.package_caches(states)
    if args.json:
        emit_json({"chroots": chroots, "caches": caches})
        return EXIT_OK
    if not chroots:
        print("no sbuild-fast chroots")
    for c in caches:
        print(
            f"package cache ({c['mode']})\t{c['files']} files\t{sfc.mib(c['size_bytes'])} of "
            f"{sfc.mib(c['max_bytes'])}\t{c['path']}"
        )
    for c in chroots:
        size = f"{c['size_bytes'] // 1048576} MiB" if c["size_bytes"] else "-"
        flag = "" if c["present"] else " (missing)"
        print(f"{c['name']}\t{c['mode']}\t{c['age_days']} days\t{size}\t{c['path']}{flag}")
    return EXIT_OK


def cmd_remove(args: argparse.Namespace) -> int:
    return sfr.remove(args)


# --- session: sbuild's autopkgtest-mode virt server ----------------------------------------


def cmd_session(args: argparse.Namespace) -> int:
    """Speak the autopkgtest virt server protocol on stdin/stdout for one sbuild run."""
    return sfs.serve_dist(args.dist, args.arch, sfc.host_arch())


# --- doctor -------------------------------------------------------------------------------


def cmd_doctor(args: argparse.Namespace) -> int:
    facts = sfd.gather(args.build_dir or [Path.cwd()], dry_run=args.dry_run)
    return sfd.report(facts, args.json)


# --- command line -------------------------------------------------------------------------


def mode_type(value: str) -> str:
    if value not in sbs.MODES:
        raise argparse.ArgumentTypeError(f"invalid mode {value!r} (unshare or schroot)")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = cli.new_parser(
        PROG,
        "sbuild chroots with debhelper and eatmydata preinstalled, kept fresh.",
        epilog="exit status: 0 ok, 1 action needed (doctor), 2 error",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def mode_option(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--mode",
            type=mode_type,
            default="unshare",
            metavar="{unshare,schroot}",
            help="unshare tarball for the user (default) or schroot chroot (root)",
        )

    def cache_max_option(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--cache-max",
            metavar="SIZE",
            help="cap of the package cache, kept from then on (default 2G; K, M, G, T)",
        )

    create = sub.add_parser("create", help="build a fast chroot")
    create.add_argument("--dist", help="distribution (default: the host's)")
    create.add_argument("--arch", help="architecture (default: the host's)")
    create.add_argument(
        "--mirror", metavar="URL", help="Debian archive (default: the one the host's apt uses)"
    )
    create.add_argument(
        "--include",
        action="append",
        metavar="PKG,...",
        help="more packages to preinstall (repeatable)",
    )
    mode_option(create)
    create.add_argument(
        "--keep-docs", action="store_true", help="keep documentation, man pages and translations"
    )
    create.add_argument(
        "--no-eatmydata",
        action="store_true",
        help="run apt and dpkg with their fsyncs (slower, for pristine checks)",
    )
    create.add_argument(
        "--no-lintian",
        action="store_true",
        help="do not preinstall lintian (default: preinstalled when sbuild runs it)",
    )
    create.add_argument(
        "--no-cache",
        action="store_true",
        help="no package cache shared across builds (default: .debs kept, size capped)",
    )
    cache_max_option(create)
    create.add_argument(
        "--backend",
        choices=("session", "unshare"),
        help="what a plain 'sbuild -d DIST' uses for an unshare chroot (--configure): "
        "sbuild-fast's session backend (default where it works here) or sbuild's unshare "
        "mode; default on a rerun: what the configuration already has",
    )
    create.add_argument(
        "--configure",
        action="store_true",
        help="write the sbuild settings block to the sbuild configuration file "
        "(~/.sbuildrc, or ~/.config/sbuild/config.pl for sbuild >= 0.87.1)",
    )
    create.add_argument("-n", "--dry-run", action="store_true", help="print what would be done")
    cli.add_verbosity(create)
    create.set_defaults(func=cmd_create, metrics=True)  # debadmin(7) metrics

    update = sub.add_parser(
        "update", help="refresh chroots (apt update + dist-upgrade) and replace them atomically"
    )
    update.add_argument("dist", nargs="*", metavar="DIST")
    update.add_argument("--mirror", metavar="URL", help="use another archive from now on")
    update.add_argument(
        "--recreate",
        action="store_true",
        help="build the chroots again from the archive instead of refreshing them",
    )
    mode_option(update)
    cache_max_option(update)
    update.add_argument("-n", "--dry-run", action="store_true", help="print what would be done")
    cli.add_verbosity(update)
    update.set_defaults(func=cmd_update, metrics=True)  # debadmin(7) metrics

    lst = sub.add_parser("list", help="list the chroots sbuild-fast made")
    lst.add_argument("--json", action="store_true", help="print one JSON document")
    cli.add_verbosity(lst)
    lst.set_defaults(func=cmd_list)

    remove = sub.add_parser("remove", help="remove a chroot")
    remove.add_argument("dist", metavar="DIST")
    remove.add_argument("--arch", help="architecture (default: the host's)")
    mode_option(remove)
    remove.add_argument("-n", "--dry-run", action="store_true", help="print what would be done")
    cli.add_verbosity(remove)
    remove.set_defaults(func=cmd_remove, metrics=True)  # debadmin(7) metrics

    session = sub.add_parser(
        "session", help="autopkgtest virt server for sbuild (run by sbuild, not by hand)"
    )
    session.add_argument("--dist", required=True, help="distribution")
    session.add_argument("--arch", help="architecture (default: the host's)")
    cli.add_verbosity(session)
    session.set_defaults(func=cmd_session)

    doctor = sub.add_parser("doctor", help="find what slows builds down")
    doctor.add_argument(
        "--build-dir",
        action="append",
        type=Path,
        metavar="DIR",
        help="a directory builds write to (default: the current one)",
    )
    doctor.add_argument("--json", action="store_true", help="print one JSON document")
    doctor.add_argument(
        "-n",
        "--dry-run",
        action="store_true",
        help="report the leftovers it would remove; write nothing",
    )
    cli.add_verbosity(doctor)
    doctor.set_defaults(func=cmd_doctor)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    previous = signal.signal(signal.SIGTERM, sfc.on_sigterm)
    try:
        return cli.run(PROG, build_parser(), argv)
    finally:
        signal.signal(signal.SIGTERM, previous)
