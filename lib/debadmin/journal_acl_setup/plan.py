"""journal-acl-setup: apply's plan: the steps that make check pass, the checks before the first, and the
verdict after the last."""

from __future__ import annotations  # annotations stay text: typing is never imported

import os
from pathlib import Path

from debadmin import cli, fsutil
from debadmin.errors import EXIT_ACTION, EXIT_OK, Error
from debadmin.journal_acl_setup.dropin import gone_groups, read_tmpfiles_dropin, render_tmpfiles
from debadmin.journal_acl_setup.grant import applied_groups, granting, record_setup
from debadmin.journal_acl_setup.groups import (
    STOCK_GROUP,
    configured_groups,
    write_configured_groups,
)
from debadmin.journal_acl_setup.journald import journal_gid
from debadmin.journal_acl_setup.journaldir import (
    DEFAULTS_FILE,
    EXPECTED_MODE,
    TMPFILES_DROPIN,
    acl_state,
    journal_uids,
    not_read_only,
    open_journal,
    probe_acl_support,
    require_magic_links,
    systemd_running,
    writable,
    write_file,
)
from debadmin.journal_acl_setup.messages import PROG, log
from debadmin.journal_acl_setup.scan import ADMIN_CHOICE, State

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from typing import Any, Callable, List, Set, Tuple

    Step = Tuple[str, Callable[[], object]]  # what to print, what to do


def preflight(state: State) -> None:
    """Fail before changing anything where apply could not finish."""
    codes = state.codes()
    parent = state.journal.parent
    if not state.exists and not parent.is_dir():
        raise Error(f"{parent} does not exist or is not a directory")
    if codes & {"boot-grant-missing", "boot-grant-unknown-group"}:
        writable((state.root / TMPFILES_DROPIN).parent)
    if codes & {"journal-missing", "journal-ownership", "unreadable", "no-default-acl"}:
        writable(state.root / acl_state().STATE_DIR)
        not_read_only(state.journal if state.exists else parent)
        probe_acl_support(state.journal if state.exists else parent)
    # Always: a check without /proc reports unreadable default ACLs, which apply cannot fix,
    # and stopping after the drop-in and configuration steps would be half an apply.
    target = state.journal if state.exists else parent
    try:
        fd = open_journal(target) if state.exists else os.open(parent, os.O_DIRECTORY)
    except OSError as exc:
        raise Error(f"cannot open {parent}: {exc.strerror}") from None
    if fd is None:
        raise Error(f"{target} vanished while it was read")
    try:
        require_magic_links(fd, target)
    finally:
        os.close(fd)


def tmpfiles(root: Path, *extra: str) -> None:
    proc = run_commands()
    argv = ["systemd-tmpfiles", "--create", "--prefix=/var/log/journal"]
    if root != Path("/"):
        argv.append(f"--root={root}")
    proc.run(argv + list(extra))


def run_commands() -> Any:
    """debadmin.proc, imported only when a command runs (subprocess), and logging set up
    first, for its messages."""
    cli.logger()
    from debadmin import proc

    return proc


def fix_ownership(journal: Path, jgid: int) -> None:
    """Owner, group and mode of the journal directory, set on its descriptor.

    systemd-tmpfiles does the same from systemd.conf's z line, but not through a
    symbolic link inside an image (--root).
    """
    fd = open_journal(journal)
    if fd is None:
        raise Error(f"{journal} does not exist")
    try:
        os.fchown(fd, 0, jgid)
        os.fchmod(fd, EXPECTED_MODE)
    except OSError as exc:
        raise Error(f"cannot set the owner and mode of {journal}: {exc.strerror}") from None
    finally:
        os.close(fd)


def setup_steps(state: State, codes: Set[str]) -> List[Step]:
    """Creating the journal directory, its owner, group and mode, systemd-tmpfiles; on a
    hand-made directory, what they change recorded before and after (ownership.py)."""
    root, journal = state.root, state.journal
    steps: List[Step] = []
    if "journal-missing" in codes:
        steps.append((f"create {journal}", lambda: fsutil.make_dirs(journal)))
    setup = state.exists and bool(codes & {"journal-ownership"})
    if setup:
        where = root / acl_state().STATE_DIR / acl_state().STATE_FILE
        steps.append(
            (
                f"record the owner, group, mode and ACLs of {journal}, its machine "
                f"directories and their system.journal in {where}",
                lambda: record_setup(root, journal, after=False),
            )
        )
    if codes & {"journal-missing", "journal-ownership"}:
        jgid = journal_gid(root)
        steps.append(
            (
                f"make {journal} root:systemd-journal (gid {jgid}) mode 2755",
                lambda: fix_ownership(journal, jgid),
            )
        )
        steps.append(
            ("run systemd-tmpfiles --create --prefix=/var/log/journal", lambda: tmpfiles(root))
        )
    if setup:
        steps.append(
            (
                "record what they hold now (revert --adm gives them back where they still do)",
                lambda: record_setup(root, journal, after=True),
            )
        )
    return steps


def plan(state: State, add_to_config: List[str]) -> List[Step]:
    """The changes apply would make, in order: what to print, and what to do."""
    root, journal = state.root, state.journal
    steps: List[Step] = []
    codes = state.codes()
    steps += setup_steps(state, codes)
    # The state database (sqlite3) is read only where a group but adm is asked for.
    asked = [n for n in state.groups if n != STOCK_GROUP]
    applied = applied_groups(root) if asked else {}
    fresh = [n for n in asked if n not in applied]
    if codes & {"journal-missing", "unreadable", "no-default-acl"} or (fresh and state.exists):
        names = ", ".join(f"{name} (gid {gid})" for name, gid in state.groups.items())
        uids = journal_uids(root)
        steps.append(
            (
                f"grant {names} read access and default ACLs under {journal} "
                "(by file descriptor, no symbolic link followed, masks kept)",
                lambda: granting(state, uids),
            )
        )
    if codes & {"boot-grant-missing", "boot-grant-unknown-group"}:
        # Keep the groups an earlier apply added: the drop-in holds the union.
        # Groups deleted since are left out: tmpfiles would ignore the lines naming them.
        present = read_tmpfiles_dropin(root) or {}
        kept = set(present) - set(gone_groups(root, present))
        union = sorted(kept | {n for n in state.groups if n != STOCK_GROUP})
        if union:
            steps.append(
                (
                    f"write {root / TMPFILES_DROPIN} for {', '.join(union)}",
                    lambda: write_file(root / TMPFILES_DROPIN, render_tmpfiles(union)),
                )
            )
        else:
            dropin = root / TMPFILES_DROPIN
            steps.append((f"remove {dropin}", lambda: fsutil.remove_file(dropin)))
    if add_to_config:
        configured = configured_groups(root)
        names = configured + [n for n in add_to_config if n not in configured]
        steps.append(
            (
                f"add {', '.join(add_to_config)} to JOURNAL_ACL_GROUPS in {root / DEFAULTS_FILE}",
                lambda: write_configured_groups(root, names),
            )
        )
    return steps


# What apply tried and could not do for one path: listed, exit 1.  Anything else left
# (a name swapped while it was walked) is an error, exit 2.
NOT_GRANTED = {"unreadable", "no-default-acl", "unreadable-acl", "unreadable-file", "bind-mount"}


def verdict(state: Any, after: Any) -> int:
    """apply's exit status from what is left to do after it (after) and what refused an
    ACL while it ran (state.refused); an Error where more than ACLs was left undone."""
    left = [
        f for f in after.findings if f["severity"] == "action" and f["code"] not in ADMIN_CHOICE
    ]
    for item in left:
        print(f"still: {item['message']}")
    if any(f["code"] not in NOT_GRANTED for f in left):
        raise Error("apply did not fix every finding (see above)")
    if left or state.refused:
        print(
            f"{PROG}: {len(state.refused)} path(s) refused an ACL (listed above as "
            "'not granted'); everything else was granted"
        )
        return EXIT_ACTION
    return EXIT_OK


def flush(root: Path, dry_run: bool, say: Callable[[str], None]) -> None:
    """Ask a running journald to move /run/log/journal to /var/log/journal."""
    if not systemd_running(root):
        log.info("systemd is not running here: journald not asked to flush")
        return
    if dry_run:
        say("would run journalctl --flush")
        return
    proc = run_commands()
    proc.run(["journalctl", "--flush"])
    say("done: run journalctl --flush")
