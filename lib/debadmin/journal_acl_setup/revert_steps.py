"""journal-acl-setup: revert's steps: the groups taken back, the tree (revert.py), the state file, the
drop-in and the configuration, each checked before the first change."""

from __future__ import annotations  # annotations stay text: typing is never imported

import argparse
import os
from pathlib import Path

from debadmin import fsutil
from debadmin.errors import EXIT_ACTION, EXIT_OK, Error
from debadmin.journal_acl_setup.dropin import read_tmpfiles_dropin, render_tmpfiles
from debadmin.journal_acl_setup.groups import (
    STOCK_GROUP,
    configured_groups,
    lookup_group,
    validate_group_name,
    wanted_groups,
    write_configured_groups,
)
from debadmin.journal_acl_setup.journaldir import (
    DEFAULTS_FILE,
    JOURNAL_DIR,
    TMPFILES_DROPIN,
    journal_uids,
    not_read_only,
    open_journal,
    require_magic_links,
    writable,
)
from debadmin.journal_acl_setup.messages import PROG, log, warn

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Iterable, List, Optional, Set, Tuple

    Step = Tuple[str, Callable[[], object]]  # what to print, what to do


def resolve_revert_groups(
    names: Iterable[str], root: Path, applied: Optional[Dict[str, int]] = None
) -> Tuple[Dict[str, Optional[int]], List[str]]:
    """Like resolve_groups, but a group deleted since its apply may still be named: its
    lines in the drop-in, and its entries by the gid recorded at apply, are what is left
    of it to remove (gid None).  A name nothing knows (not a group, never applied) is
    returned apart, for a warning: it blocks nothing."""
    present = dict(read_tmpfiles_dropin(root) or {})
    present.update(dict.fromkeys(applied or {}, True))
    resolved: Dict[str, Optional[int]] = {}
    unknown: List[str] = []
    for name in names:
        validate_group_name(name)
        gid = lookup_group(name, root)
        if gid is None and name not in present:
            unknown.append(name)
            continue
        resolved[name] = gid
    return resolved, unknown


def revert_dropin(root: Path, groups: Dict[str, Optional[int]]) -> List[Step]:
    """Take the named groups out of the tmpfiles.d drop-in (removed once empty)."""
    steps: List[Step] = []
    dropin = root / TMPFILES_DROPIN
    present = read_tmpfiles_dropin(root)
    if present is not None:
        remaining = [n for n in present if n not in groups]
        touched = [n for n in present if n in groups]
        if not remaining:
            steps.append((f"remove {dropin}", lambda: fsutil.remove_file(dropin)))
        elif touched:
            steps.append(
                (
                    f"remove {', '.join(touched)} from {dropin}",
                    lambda: fsutil.atomic_write(dropin, render_tmpfiles(sorted(remaining))),
                )
            )
    return steps


def revert_names(args: argparse.Namespace, root: Path) -> List[str]:
    """The groups a revert is about: -g, --all (every group granted but adm), else the
    configured ones."""
    if not args.all:
        names = wanted_groups(args, root)
        return names + [STOCK_GROUP] if args.adm and STOCK_GROUP not in names else names
    if args.group:
        raise Error("--all and --group exclude each other")
    names = list(read_tmpfiles_dropin(root) or {})
    names += [n for n in configured_groups(root) if n not in names]
    return [n for n in names if n != STOCK_GROUP] + ([STOCK_GROUP] if args.adm else [])


class Reverting:
    """One revert of the tree: the groups, and what the walk left (problems)."""

    def __init__(
        self,
        journal: Path,
        gone: Dict[str, int],
        root: Path,
        store: Any,
        strip: bool,
        also: Optional[Set[int]] = None,
        setup: bool = False,
    ) -> None:
        self.journal, self.gone, self.store, self.strip = journal, gone, store, strip
        self.setup = setup  # revert --adm: the journal's setup given back too
        self.also = also or set()  # gids reverted besides gone's (renumbered groups)
        self.uids = journal_uids(root)
        self.problems: List[Tuple[Optional[str], str]] = []
        self.noted: Set[str] = set()

    def walk(self, dry_run: bool) -> int:
        from debadmin.journal_acl_setup import revert

        fd = open_journal(self.journal)
        if fd is None:
            return 0
        try:
            require_magic_links(fd, self.journal)
            outcome = revert.revoke(
                fd,
                str(self.journal),
                set(self.gone.values()) | self.also,
                self.uids,
                self.store,
                dry_run,
                self.strip,
                setup=self.setup,
                stock={g for n, g in self.gone.items() if n == STOCK_GROUP},
            )
        finally:
            os.close(fd)
        self.problems = outcome.problems
        # What the walk passed over (a symbolic link...), said once for both walks, as
        # apply says it.
        for message in outcome.notes:
            if message not in self.noted:
                self.noted.add(message)
                log.warning("%s", message)
        return outcome.touched

    def recorded(self) -> bool:
        """Whether the state holds records of the groups (or of the journal's setup,
        with --adm): the walk then has work, and revert needs no dry walk to know it."""
        if self.strip or self.store is None or self.store.db is None:
            return False
        records = self.store.holding(set(self.gone.values()) | self.also)
        try:
            found = next(records, None) is not None
        finally:
            records.close()  # its cursor with it, before the walk's transaction
        return found or self.setup and bool(self.store.setup_keys())

    def steps(self, dry_run: bool = True) -> List[Step]:
        """Restoring the ACLs under the journal, when any would change or a record is
        left (a read-only journal refuses here, before the first write).  One walk
        where records say there is work: a dry walk first only where none does (a
        revert with nothing left, files inheriting apply's defaults), or for -n, which
        lists what the walk would not restore."""
        if (dry_run or not self.recorded()) and not self.walk(dry_run=True) and not self.problems:
            return []
        fd = open_journal(self.journal)
        if fd is not None:
            os.close(fd)
            not_read_only(self.journal)
        names = ", ".join(self.gone)
        if self.strip:
            text = f"remove the ACL entries of {names} under {self.journal} (--strip)"
        else:
            text = (
                f"restore the ACLs under {self.journal} as they were before {names} "
                "was applied (by file descriptor)"
            )
        return [(text, lambda: self.walk(dry_run=False))]


def refuse_without_state(
    store: Any, journal: Path, unrecorded: Dict[str, int], root: Path
) -> None:
    """revert without a usable state database, where the tree holds the groups'
    entries: nothing can be restored exactly, so nothing is changed."""
    if not unrecorded:
        return
    probe = Reverting(journal, unrecorded, root, None, strip=True)
    count = probe.walk(dry_run=True)
    if not count:
        return
    what = "is empty" if store.path.exists() else "is missing"
    names = ", ".join(unrecorded)
    raise Error(
        f"{store.path} {what}: what apply changed for {names} cannot be restored "
        f"({count} path(s) under {journal} hold their ACL entries); nothing changed. "
        f"'{PROG} revert --strip' would remove those entries and narrow the masks, "
        "without restoring the ACLs, masks and modes they had before"
    )


def _store_steps(
    store: Any,
    applied: Dict[str, int],
    reverted: Dict[str, int],
    remaining: Dict[str, int],
    tree: Optional[Reverting],
) -> List[Step]:
    """Forgetting the reverted groups in the state database (removing it when none is
    left), once the tree is done: a group with a record left stays, for a later revert."""
    setup = tree is not None and tree.setup
    if store.db is None or not (setup or any(n in applied for n in reverted)):
        return []
    writable(store.path.parent)
    names = ", ".join(n for n in reverted if n in applied) or STOCK_GROUP

    def finish() -> Optional[str]:
        if tree is not None and tree.problems and not tree.strip:
            # records left: every group stays applied, the next revert finishes
            return f"kept {names} applied in {store.path}: not everything was restored"
        if remaining or store.setup_keys():
            # The journal's setup, recorded at apply, stays for revert --adm.
            forget_applied(store, remaining)
        else:
            store.remove()
        return None

    if not remaining:
        return [(f"remove {store.path} (once nothing is left to restore)", finish)]
    return [(f"forget {', '.join(n for n in reverted if n in applied)} in {store.path}", finish)]


def _configuration_steps(root: Path, groups: Dict[str, Optional[int]]) -> List[Step]:
    """Removing the reverted groups from JOURNAL_ACL_GROUPS."""
    configured = configured_groups(root)
    dropped = [n for n in groups if n != STOCK_GROUP and n in configured]
    if not dropped:
        return []
    writable((root / DEFAULTS_FILE).parent)
    kept = [n for n in configured if n not in dropped] or [STOCK_GROUP]
    return [
        (
            f"remove {', '.join(dropped)} from JOURNAL_ACL_GROUPS in {root / DEFAULTS_FILE}",
            lambda: write_configured_groups(root, kept),
        )
    ]


def _run_steps(
    args: argparse.Namespace,
    steps: List[Step],
    journal: Path,
    say: Callable[[str], None],
    tree: Optional[Reverting],
) -> int:
    if not steps:
        say("nothing to change: nothing of the named groups is left to revert")
        return EXIT_OK
    for text, action in steps:
        if args.dry_run:
            say(f"would {text}")
        else:
            result = action()
            say(result if isinstance(result, str) else f"done: {text}")
    problems = tree.problems if tree is not None else []
    for _path, message in problems:
        print(f"not restored: {message}")
    if not args.dry_run:
        say(f"{journal} and the log files in it were left in place")
    if problems:
        print(
            f"{PROG}: {len(problems)} finding(s): what apply changed there is not restored "
            "yet; its record is kept, run revert again once they are fixed"
        )
        return EXIT_ACTION
    return EXIT_OK


def revert_groups(
    args: argparse.Namespace, root: Path, applied: Dict[str, int]
) -> Dict[str, Optional[int]]:
    """The groups a revert takes back; one nothing knows is a warning (an error when it
    is the only one named)."""
    names = revert_names(args, root)
    if args.all:
        names += [n for n in applied if n != STOCK_GROUP and n not in names]
    groups, unknown = resolve_revert_groups(names, root, applied)
    if unknown and not groups and not args.all:
        raise Error(f"unknown group: {', '.join(unknown)}")
    for name in unknown:
        warn(f"group {name} does not exist and was never applied: nothing of it to revert")
    return groups


def adm_too(args: argparse.Namespace, store: Any) -> bool:
    """Whether revert --adm was asked, refused where it cannot be done."""
    adm = getattr(args, "adm", False)
    if adm and not store.usable:
        raise Error(
            f"{store.path} is missing or empty: without apply's record nothing of adm or "
            "of the journal's setup can be given back; nothing changed"
        )
    if adm and getattr(args, "strip", False):
        raise Error("--adm and --strip exclude each other")
    return adm


def revert_with(args: argparse.Namespace, root: Path, say: Callable[[str], None], store) -> int:
    applied = store.applied()
    groups = revert_groups(args, root, applied)
    journal = root / JOURNAL_DIR
    # Every check before the first write: the drop-in and the configuration are only
    # touched once the tree can be (a read-only /var/log refuses the whole revert).
    steps: List[Step] = []
    # adm's entries are systemd's own: its tmpfiles.d/systemd.conf sets default ACLs for
    # adm, so every file journald creates carries them; removing them would take from
    # adm what a stock system gives it.  An applied group is reverted by the gid
    # recorded at apply (deleted or renumbered since); without a record only its
    # drop-in lines are left.
    adm = adm_too(args, store)
    reverted = {
        name: applied[name] if name in applied else gid
        for name, gid in groups.items()
        if (name != STOCK_GROUP or adm) and (gid is not None or name in applied)
    }
    remaining = {n: g for n, g in applied.items() if n not in reverted}
    strip = getattr(args, "strip", False)
    also = renumbered_gids(store, groups, applied, remaining, strip)
    report_orphans(store, set(applied.values()) | also)
    if strip:
        gone = reverted
    else:
        # Only what apply recorded is restored; without a database nothing can be.
        gone = {n: g for n, g in reverted.items() if n in applied or adm and n == STOCK_GROUP}
        if not store.usable:
            refuse_without_state(store, journal, reverted, root)
    tree = Reverting(journal, gone, root, store, strip, also, setup=adm) if gone else None
    if tree is not None:
        steps += tree.steps(args.dry_run)
    steps += _store_steps(store, applied, reverted, remaining, tree)
    dropin_steps = revert_dropin(root, groups)
    if dropin_steps:
        writable((root / TMPFILES_DROPIN).parent)
    steps += dropin_steps
    if not args.all:
        steps += _configuration_steps(root, groups)
    return _run_steps(args, steps, journal, say, tree)


def renumbered_gids(
    store: Any,
    groups: Dict[str, Optional[int]],
    applied: Dict[str, int],
    remaining: Dict[str, int],
    strip: bool,
) -> Set[int]:
    """The current gids of applied groups renumbered since their apply, reverted too:
    with --strip every entry of the group goes; else only where records of apply name
    the gid and no group left applied has it (apply's entries, and nobody else's)."""
    also: Set[int] = set()
    for name, gid in groups.items():
        if name == STOCK_GROUP or name not in applied or gid in (None, applied[name]):
            continue
        if strip or gid not in remaining.values() and any(store.holding({gid})):
            also.add(gid)
    return also


def report_orphans(store: Any, known: Set[int]) -> None:
    """Records naming a gid no applied group has (a group renumbered and applied again):
    no revert by name reaches their entries, so they are said, not silently kept."""
    for gid, count in sorted(store.orphans(known).items()):
        warn(
            f"{count} record(s) in {store.path} name gid {gid}, which no applied group "
            "has: a revert by group name does not take their entries out"
        )


def forget_applied(store: Any, remaining: Dict[str, int]) -> None:
    store.begin()
    store.set_applied(remaining)
    store.commit()
