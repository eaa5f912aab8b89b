"""journal-acl-setup: the scan: what each group cannot read under the journal (check, and apply's
before and after), in bounded memory."""

from __future__ import annotations  # annotations stay text: typing is never imported

import gc
import os
import stat
from pathlib import Path

from debadmin.findings import finding, needs_action
from debadmin.journal_acl_setup import walk as walker
from debadmin.journal_acl_setup.dropin import tmpfiles_findings
from debadmin.journal_acl_setup.journald import journal_gid, journald_storage, require_journald
from debadmin.journal_acl_setup.journaldir import (
    EXPECTED_MODE,
    JOURNAL_DIR,
    check_paths,
    journal_uids,
    open_journal,
)
from debadmin.journal_acl_setup.messages import PROG

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Set, Tuple

    Finding = Dict[str, Any]


# What apply can fix; any other finding of severity action stays for the admin.
FIXABLE = {
    "journal-missing",
    "journal-ownership",
    "unreadable",
    "no-default-acl",
    "boot-grant-missing",
    "boot-grant-unknown-group",
}


ADMIN_CHOICE = {"storage-disabled"}


class State:
    """What inspect found (a plain class: dataclasses would import inspect, a startup
    cost the boot-time run pays for nothing)."""

    def __init__(
        self,
        root: Path,
        journal: Path,
        groups: Dict[str, int],
        storage: str,
        storage_source: Optional[str],
        exists: bool,
        findings: List[Finding],
        checked: int,
    ) -> None:
        self.root, self.journal, self.groups = root, journal, groups
        self.storage, self.storage_source = storage, storage_source
        self.exists, self.findings, self.checked = exists, findings, checked
        self.refused: List[Tuple[str, str]] = []  # (path, why) apply could not grant
        # What apply's grant walk found, where it vouches for the tree as it is now
        # (grant.unchanged): its findings and how many paths it walked.
        self.walked: Optional[Tuple[List[Finding], int]] = None

    def codes(self) -> Set[str]:
        return {f["code"] for f in self.findings if f["severity"] == "action"}

    def as_dict(self) -> dict:
        return {
            "journal_dir": str(self.journal),
            "exists": self.exists,
            "storage": self.storage,
            "storage_source": self.storage_source,
            "groups": list(self.groups),
            "checked_paths": self.checked,
            "findings": self.findings,
            "ok": not needs_action(self.findings),
        }


def skip_findings(skips: walker.Skips) -> List[Finding]:
    return [
        finding(s.code, "action" if s.action else "warning", s.message, s.path or None)
        for s in skips.items()
    ]


def scan(
    fd: int,
    journal: Path,
    groups: Dict[str, int],
    uids: Set[int],
    keep: Optional[int] = None,
    enough: bool = False,
) -> Tuple[List[Finding], int]:
    """What each group cannot read under the journal, and how many paths were read.

    Files are read by name in their open directory, not opened (the walk's
    open_files=False: two system calls a file instead of four).  Verdicts are kept by
    the ACLs' raw extended attributes, mode, owning group and type: a journal holds
    thousands of files with a handful of distinct ACLs, and parsing each one would be
    most of the cost.

    keep: list at most that many paths per group and finding code, and one line for
    the rest (apply needs to know what is missing, not 200,000 names of it).

    enough: stop at the first path a group cannot read or inherit from: what apply needs
    to know before its grant walk (which then says what is left, or the tree is scanned
    again: main.cmd_apply).
    """
    skips = walker.Skips()
    counts: Dict[Tuple[str, str], int] = {}
    unreadable: Dict[str, List[str]] = {name: [] for name in groups}
    no_default: Dict[str, List[str]] = {name: [] for name in groups}
    # key -> the groups that cannot read, and those that would not inherit (mostly empty)
    verdicts: Dict[tuple, Tuple[List[str], List[str]]] = {}
    want_dir, want_file = walker.R | walker.X, walker.R

    def judge(raw: Tuple[bytes, bytes], mode: int, gid: int, is_dir: bool):
        key = (raw, mode & 0o777, gid, is_dir)
        verdict = verdicts.get(key)
        if verdict is None:
            entries = walker.parse(raw[0]) or walker.from_mode(mode)
            defaults = walker.parse(raw[1])
            want = want_dir if is_dir else want_file
            verdict = verdicts[key] = (
                [n for n, g in groups.items() if not walker.group_can(entries, gid, g, want)],
                [
                    n
                    for n, g in groups.items()
                    if is_dir and not walker.group_can(defaults, gid, g, want_dir, default=True)
                ],
            )
        return verdict

    def unreadable_acl(path: str, exc: walker.AclError) -> None:
        skips.append(walker.Skip("unreadable-acl", path, f"{walker.shown(path)}: {exc}", True))

    def note(paths: List[str], group: str, code: str, path: str) -> None:
        seen = counts.get((group, code), 0)
        counts[(group, code)] = seen + 1
        if keep is None or seen < keep:
            paths.append(path)

    # A regular file's verdict by (access ACL, mode, group): one flat key a file.
    by_file: Dict[Tuple[bytes, int, int], List[str]] = {}

    def files(node: walker.Node) -> None:
        prefix = node.path + "/"
        for name, mode, gid, access in node.files:
            cannot = by_file.get((access, mode, gid))
            if cannot is None:
                try:
                    cannot = judge((access, b""), mode, gid, False)[0]
                except walker.AclError as exc:
                    unreadable_acl(prefix + name, exc)
                    continue
                by_file[(access, mode, gid)] = cannot
            for group in cannot:
                note(unreadable[group], group, "unreadable", prefix + name)

    count = 0
    # The walk makes a few tuples a file and no reference cycles: the collector's
    # passes over them are ~1.5 ms of a 5,000-file check for nothing.
    collecting = gc.isenabled()
    gc.disable()
    nodes = walker.walk(fd, str(journal), uids, skips, open_files=False)
    try:
        for node in nodes:
            if enough and counts:
                break
            if node.fd < 0:  # a batch of the directory's files, read by name
                count += len(node.files)
                files(node)
                continue
            count += 1
            try:
                st = node.st
                cannot_read, no_inherit = judge(node.raw(), st.st_mode, st.st_gid, node.is_dir)
            except walker.AclError as exc:
                unreadable_acl(node.path, exc)
            else:
                for name in cannot_read:
                    note(unreadable[name], name, "unreadable", node.path)
                for name in no_inherit:
                    note(no_default[name], name, "no-default-acl", node.path)
    finally:
        nodes.close()  # its descriptors, where it stopped early
        if collecting:
            gc.enable()
    found: List[Finding] = []
    for name in groups:  # the walk goes in directory order; the report in path order
        found += [
            finding(
                "unreadable",
                "action",
                f"group {name} cannot read {walker.shown(path)}",
                path,
                group=name,
            )
            for path in sorted(unreadable[name])
        ]
        found += [
            finding(
                "no-default-acl",
                "action",
                f"{walker.shown(path)} has no default ACL for group {name}: "
                "new files would be unreadable",
                path,
                group=name,
            )
            for path in sorted(no_default[name])
        ]
        for code in ("unreadable", "no-default-acl"):
            more = counts.get((name, code), 0) - len(
                (unreadable if code == "unreadable" else no_default)[name]
            )
            if more > 0:
                found.append(
                    finding(
                        code, "action", f"{code}: {more} more for group {name}", None, group=name
                    )
                )
    return found + skip_findings(skips), count


def inspect(
    root: Path,
    groups: Dict[str, int],
    keep: Optional[int] = None,
    enough: bool = False,
    walked: Optional[Tuple[List[Finding], int]] = None,
) -> State:
    """Compare the journal directory with what check requires (enough: see scan).

    walked: what apply's grant walk found of the tree, and vouches for (State.walked),
    taken instead of scanning it again."""
    require_journald(root)
    jgid = journal_gid(root)
    check_paths(root)
    journal = root / JOURNAL_DIR
    storage, source = journald_storage(root)
    found: List[Finding] = []
    disabled = storage in ("volatile", "none")
    if disabled:
        found.append(
            finding(
                "storage-disabled",
                "action",
                f"journald Storage={storage} (set in {source}): the journal is not kept on "
                f"disk; {PROG} leaves that choice alone (remove the setting to keep logs)",
                source,
                storage=storage,
            )
        )
    boot = tmpfiles_findings(root, groups)
    fd = open_journal(journal)
    if fd is None:
        if not disabled:
            found.append(
                finding("journal-missing", "action", f"{journal} does not exist", str(journal))
            )
        return State(root, journal, groups, storage, source, False, found + boot, 0)
    try:
        st = os.fstat(fd)
        problems = []
        if st.st_uid != 0:
            problems.append(f"owner is uid {st.st_uid}, not root")
        if st.st_gid != jgid:
            problems.append(f"group is gid {st.st_gid}, not systemd-journal")
        if stat.S_IMODE(st.st_mode) != EXPECTED_MODE:
            problems.append(f"mode is {stat.S_IMODE(st.st_mode):04o}, not 2755")
        for problem in problems:
            found.append(
                finding("journal-ownership", "action", f"{journal}: {problem}", str(journal))
            )
        if walked is not None:
            tree, checked = walked
        else:
            tree, checked = scan(fd, journal, groups, journal_uids(root), keep, enough)
    finally:
        os.close(fd)
    return State(root, journal, groups, storage, source, True, found + tree + boot, checked)
