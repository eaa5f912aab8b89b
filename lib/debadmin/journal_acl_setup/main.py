"""journal-acl-setup: a persistent systemd journal that the admin groups can read.

The command line only: options, dispatch, exit codes.  Where the work lives:
journaldir.py (the journal on disk, the lock), groups.py, dropin.py (the tmpfiles.d
drop-in), journald.py (its configuration), scan.py (check), plan.py and grant.py
(apply), revert_steps.py and revert.py (revert), state.py and ownership.py (what
revert gives back), walk.py (the descriptor walk, the ACL rules).
"""

from __future__ import annotations  # annotations stay text: typing is never imported

import argparse
import gc
import os
import re
from pathlib import Path

from debadmin import cli, metrics
from debadmin.errors import EXIT_ACTION, EXIT_NOT_APPLICABLE, EXIT_OK, Error
from debadmin.findings import needs_action, text_lines
from debadmin.journal_acl_setup.groups import configured_groups, resolve_known, wanted_groups
from debadmin.journal_acl_setup.journald import require_journald
from debadmin.journal_acl_setup.journaldir import acl_state, check_paths, locked
from debadmin.journal_acl_setup.messages import PROG, log, warn
from debadmin.journal_acl_setup.plan import verdict, flush, plan, preflight
from debadmin.journal_acl_setup.revert_steps import revert_with
from debadmin.journal_acl_setup.scan import ADMIN_CHOICE, inspect

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from typing import Callable, List, Optional


def require_root(args: argparse.Namespace) -> None:
    """apply and revert change root's files: say so, rather than fail on EPERM later."""
    if os.geteuid() != 0 and not getattr(args, "dry_run", False):
        raise Error(f"{args.command} must be run as root (try: sudo {PROG} {args.command})")


def cmd_check(args: argparse.Namespace) -> int:
    root = Path(args.root)
    groups, unknown = resolve_known(wanted_groups(args, root), root)
    # Constant memory however many files: the first CHECK_LISTED paths of each group and
    # finding code are listed, the rest counted in one finding.
    state = inspect(root, groups, keep=CHECK_LISTED)
    state.findings[:0] = unknown
    disabled = "storage-disabled" in state.codes()
    if args.json:
        from debadmin.output import emit_json  # json: only for --json

        emit_json(state.as_dict())
    else:
        for line in text_lines(state.findings):
            # The admin's Storage= is no action to take: labelled as the verdict (exit 3).
            print(re.sub(r"^action: (?=journald Storage=)", "not applicable: ", line))
        actions = [f for f in state.findings if f["severity"] == "action"]
        if disabled:
            print(
                f"not applicable: journald keeps no persistent journal by the admin's "
                f"choice (Storage={state.storage})"
            )
        elif actions:
            print(f"{len(actions)} finding(s) need action; '{PROG} apply' fixes what it can")
        else:
            print(
                f"ok: {state.journal} is persistent and readable by "
                f"{', '.join(groups)} ({state.checked} paths checked)"
            )
    if disabled:
        return EXIT_NOT_APPLICABLE
    return EXIT_ACTION if needs_action(state.findings) else EXIT_OK


def quiet(args: argparse.Namespace) -> bool:
    return getattr(args, "verbosity", 0) < 0


LISTED = 50  # paths listed per finding code once apply is done; the rest counted


CHECK_LISTED = 10  # the same for check


def cmd_apply(args: argparse.Namespace) -> int:
    root = Path(args.root)
    require_root(args)
    say = (lambda text: None) if quiet(args) else print
    names = wanted_groups(args, root)
    groups, unknown = resolve_known(names, root)
    for item in unknown:
        warn(item["message"])
    with locked(root, args.dry_run):
        configured = configured_groups(root) if args.group else names
        add_to_config = [n for n in groups if n not in configured]
        # A dry run lists everything; apply stops reading at the first path a group
        # cannot read (its grant walk goes through them all, and says what is left).
        state = inspect(root, groups, keep=LISTED, enough=not args.dry_run)
        metrics.findings(state.findings)
        for item in state.findings:
            if item["code"] in ADMIN_CHOICE:
                log.warning("left as set: %s", item["message"])
        steps = plan(state, add_to_config)
        if not steps:
            say("nothing to change: the journal is already set up")
            return EXIT_OK
        if args.dry_run:
            for text, _ in steps:
                say(f"would {text}")
            flush(root, True, say)
            return EXIT_OK
        preflight(state)
        for text, action in steps:
            action()
            say(f"done: {text}")
        flush(root, False, say)
        # What is left, scanned again unless the grant walk vouches for the tree:
        # nothing refused or skipped, no directory changed while it ran
        # (grant.unchanged).  The flush above only adds files under default ACLs.
        after = inspect(root, groups, keep=LISTED, walked=state.walked)
        metrics.findings(after.findings)
    return verdict(state, after)


def cmd_revert(args: argparse.Namespace) -> int:
    root = Path(args.root)
    require_root(args)
    say = (lambda text: None) if quiet(args) else print
    require_journald(root)
    check_paths(root)
    with locked(root, args.dry_run):
        return revert_locked(args, root, say)


def revert_locked(args: argparse.Namespace, root: Path, say: Callable[[str], None]) -> int:
    store = acl_state().Store(root, create=False, read_only=args.dry_run)
    try:
        return revert_with(args, root, say, store)
    finally:
        store.close()


def build_parser() -> argparse.ArgumentParser:
    parser = cli.new_parser(
        PROG,
        "Make the systemd journal persistent and readable by the admin groups.",
        epilog="exit status: 0 ok, 1 action needed (check), 2 error, 3 not applicable",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, func, helptext in (
        ("check", cmd_check, "report whether the journal is persistent and readable"),
        ("apply", cmd_apply, "make check pass"),
        ("revert", cmd_revert, "remove what apply added (never a log file)"),
    ):
        p = sub.add_parser(
            name, help=helptext, description=helptext, formatter_class=cli.Formatter
        )
        cli.add_verbosity(p)
        # debadmin(7) metrics: apply and revert on this system, not an image's.
        p.set_defaults(func=func, metrics=name != "check" and (lambda a: a.root == "/"))
        p.add_argument(
            "-g",
            "--group",
            action="append",
            metavar="GROUP",
            help="group that must read the journal (repeatable; default: "
            "JOURNAL_ACL_GROUPS from /etc/default/journal-acl-setup, else adm)",
        )
        p.add_argument(
            "--root",
            default="/",
            metavar="DIR",
            help="act on the system image mounted at DIR (default: /)",
        )
        if name == "check":
            p.add_argument("--json", action="store_true", help="print the report as JSON")
        if name == "revert":
            p.add_argument(
                "--all",
                action="store_true",
                help="every group granted but adm, the configuration left as it is "
                "(run on package removal)",
            )
            p.add_argument(
                "--strip",
                action="store_true",
                help="without apply's record: remove the groups' ACL entries and narrow "
                "the masks, restoring nothing",
            )
            p.add_argument(
                "--adm",
                action="store_true",
                help="adm too, and the journal directory's owner, group, mode and what "
                "systemd-tmpfiles changed, as apply found them",
            )
        if name != "check":
            p.add_argument(
                "-n",
                "--dry-run",
                action="store_true",
                help="print what would change and change nothing",
            )
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    code = cli.run(PROG, build_parser(), argv)
    if argv is None:
        # Called by bin/journal-acl-setup, the process ends next: what is left is not
        # garbage, and freezing it spares the interpreter's final collection, a pass over
        # every object the imports made (~3 ms of a 55 ms check of 5,000 files).
        gc.freeze()
    return code
