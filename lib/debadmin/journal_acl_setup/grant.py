"""journal-acl-setup: the grant: every group given read access and default ACLs under the journal, each
inode recorded in the state before its change."""

from __future__ import annotations  # annotations stay text: typing is never imported

import os
import time
from pathlib import Path

from debadmin.errors import Error
from debadmin.journal_acl_setup import walk as walker
from debadmin.journal_acl_setup.dropin import read_tmpfiles_dropin
from debadmin.journal_acl_setup.groups import STOCK_GROUP
from debadmin.journal_acl_setup.journaldir import acl_state, open_journal
from debadmin.journal_acl_setup.messages import log
from debadmin.journal_acl_setup.scan import State, skip_findings

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Set, Tuple

    # new access and default attributes, the gids the ACLs name, the record's later
    Verdict = Tuple[Optional[bytes], Optional[bytes], Set[int], str]


# Changes waiting for their records' commit: descriptors kept open, one commit (fsyncs
# of the state file) per batch of up to BATCH_MAX, as the descriptor limit allows.
BATCH_MAX = 4096


def batch_size() -> int:
    """How many changes may wait for their commit: as many descriptors as the soft
    limit leaves room for (raised up to the hard limit where that allows BATCH_MAX),
    keeping a margin for the walk's own (one per directory level) and SQLite's."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = BATCH_MAX + 256
    if soft != resource.RLIM_INFINITY and soft < want:
        raised = want if hard == resource.RLIM_INFINITY else min(hard, want)
        if raised > soft:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
                soft = raised
            except (OSError, ValueError):
                pass
    if soft == resource.RLIM_INFINITY:
        return BATCH_MAX
    return max(16, min(BATCH_MAX, soft - 256))


VERDICTS_MAX = 4096  # distinct (attributes, mode, group, type) remembered by one walk
DIRS_MAX = 4096  # directories whose mtime one walk remembers (unchanged)
# The clock the kernel sets file times from (current_time(): the coarse real-time clock,
# advanced once a tick): two changes within one tick leave the same mtime.
CLOCK_REALTIME_COARSE = getattr(time, "CLOCK_REALTIME_COARSE", 5)
SECOND = 1_000_000_000


def coarse_ns() -> int:
    return time.clock_gettime_ns(CLOCK_REALTIME_COARSE)


def _cut(mtime: int) -> int:
    """How much earlier than the change mtime may be, from the zeros it ends in: 1 ns
    where it has none (ext4, xfs, btrfs and tmpfs keep nanoseconds), 100 ns for two
    (ntfs3, CIFS), up to 2 s for a whole second (ext4's small inodes keep seconds; FAT
    two).  A nanosecond time that happens to end in zeros only costs a scan."""
    if mtime % SECOND == 0:
        return 2 * SECOND
    cut = 1
    while mtime % (cut * 10) == 0:
        cut *= 10
    return cut


def clock_past(fd: int) -> int:
    """The coarse clock, once it has moved past the mtime of the directory open as fd
    (apply's ACL probe made and removed a file there a moment ago: a tick, a few ms, to
    wait at most), for unchanged()."""
    mtime = os.fstat(fd).st_mtime_ns
    cut = _cut(mtime)
    now = coarse_ns()
    waits = 0
    while mtime + cut > now and cut < 1_000_000 and waits < 50:
        time.sleep(0.001)
        now, waits = coarse_ns(), waits + 1
    return now


def clock_offset() -> int:
    """The real-time clock against the monotonic one: it falls by as much as the clock
    was set or slewed back (a time server), by which a later change's mtime may be
    older than the clock read at the walk's start."""
    return time.time_ns() - time.monotonic_ns()


def unchanged(dirs: List[Tuple[str, int, int, int]], start_ns: int) -> bool:
    """Whether no name was added to, removed from or renamed in any directory of dirs
    (path, st_dev, st_ino, st_mtime_ns as the walk opened it, before reading it) since
    the walk began (start_ns: the coarse clock then): each still the same inode at the
    same path with the same mtime, older than start_ns, so that any change since would
    have set a later one.  What the walk read of each is then all it holds; a journald
    rotating a file meanwhile (a rename) is caught, as is a file made in a directory
    before its default ACL was set."""
    for path, dev, ino, mtime in dirs:
        if mtime + _cut(mtime) > start_ns:
            return False
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            return False
        if (st.st_dev, st.st_ino, st.st_mtime_ns) != (dev, ino, mtime):
            return False
    return True


def _verdict(
    raw: Tuple[bytes, bytes], st: os.stat_result, gids: Set[int], is_dir: bool, previous
) -> Verdict:
    """What apply makes of an inode's ACLs (raw: its attributes): the new access and
    default ACL attributes, packed (None: left as they are), the gids its ACLs name,
    and of those the groups applied before (previous), as the record's later column
    writes them.  Shared by every inode with the same verdict."""
    access = walker.parse(raw[0]) or walker.from_mode(st.st_mode)
    default = walker.parse(raw[1])
    new_access, new_default = walker.grant_all(access, default, st.st_gid, gids, is_dir)
    holds = walker.named_gids(access) | walker.named_gids(default)
    return (
        walker.posixacl.pack(new_access) if new_access != access else None,
        None if new_default in (None, default) else walker.posixacl.pack(new_default),
        holds,
        acl_state().ids_text(holds & previous),
    )


def grant_tree(
    journal: Path,
    groups: Dict[str, int],
    uids: Set[int],
    store: Any,
    say: Callable[[str], None],
    first: Set[int] = frozenset(),
    previous: Set[int] = frozenset(),
) -> Tuple[walker.Skips, List[Tuple[str, str]], Optional[int]]:
    """Give every group read access and a default ACL, on each descriptor under journal.

    Only what is missing is added (a named entry, the mask widened by the bits it needs,
    no other entry gaining a right through it: walker.granted).  One walk, recording
    and changing: what every inode to be changed holds now is recorded in store, and
    the changes wait, their descriptors kept open, until a batch of BATCH records is
    committed (on disk: SQLite syncs a commit); only then are they made.  BATCH is
    batch_size(), up to BATCH_MAX where the descriptor limit allows.  A SIGKILL
    anywhere leaves no change without its record.  Also recorded: an inode that holds
    entries of a group applied for the first time (first), unchanged (so that revert
    keeps them), and of an inode without a record, the groups applied before
    (previous) whose entries it holds (inherited from apply's default ACLs: revert of
    them takes them off).  A directory or file that refuses its ACL (a full
    extended-attribute block: ENOSPC; EPERM; EROFS) is listed with the reason and the
    walk goes on.

    Returns what the walk skipped, what was refused, and where nothing was skipped or
    refused and no directory changed while it ran (unchanged, against the clock at the
    start less what it was set back since), how many paths it walked: what a scan of
    the tree would find now is then known without one (the grant's after-check).  A skipped file (a second hard link, another
    owner) is not vouched for: its link count or owner may change back meanwhile, and no
    directory's mtime would say so.
    """
    gids = set(groups.values())
    gids_text = acl_state().ids_text(gids)
    generation = acl_state().generation
    # What apply makes of an inode depends on its attributes, mode, group and type
    # alone, and a journal has a few distinct ones: each worked out once.
    verdicts: Dict[Tuple[bytes, bytes, int, int, bool], Verdict] = {}
    batch = batch_size()
    refused: List[Tuple[str, str]] = []
    pending: List[Tuple[walker.Node, Any, Any]] = []  # changes whose records are not on disk
    rows: List[tuple] = []  # their records, written in one statement before the commit
    # The directories walked, for unchanged(): one more than DIRS_MAX says there were
    # too many to vouch for.
    dirs: List[Tuple[str, int, int, int]] = []
    walked = 0

    def refuse(path: str, exc: walker.AclError) -> None:
        refused.append((path, str(exc)))
        say(f"not granted: {walker.shown(path)}: {exc.reason}")

    def flush() -> None:
        """Write and commit the batch's records, then make its changes."""
        store.record_many(rows)
        rows.clear()
        store.commit()
        try:
            for node, new_access, new_default in pending:
                try:
                    node.set_attributes(new_access, new_default)
                except walker.AclError as exc:
                    refuse(node.path, exc)
        finally:
            for node, _, _ in pending:
                os.close(node.fd)
            pending.clear()
            store.begin()

    fd = open_journal(journal)
    if fd is None:
        raise Error(f"{journal} does not exist")
    skips = walker.Skips()
    try:
        start_ns, offset = clock_past(fd), clock_offset()
        store.begin()
        try:
            for node in walker.walk(fd, str(journal), uids, skips):
                walked += 1
                if node.is_dir and len(dirs) <= DIRS_MAX:
                    st = node.st
                    dirs.append((node.path, st.st_dev, st.st_ino, st.st_mtime_ns))
                try:
                    raw = node.raw()  # read once: parsed here, recorded below
                except walker.AclError as exc:
                    refuse(node.path, exc)
                    continue
                seen = (*raw, node.st.st_mode, node.st.st_gid, node.is_dir)
                verdict = verdicts.get(seen)
                if verdict is None:
                    try:
                        verdict = _verdict(raw, node.st, gids, node.is_dir, previous)
                    except walker.AclError as exc:
                        refuse(node.path, exc)
                        continue
                    if len(verdicts) < VERDICTS_MAX:
                        verdicts[seen] = verdict
                new_access, new_default, holds, later_text = verdict
                if new_access is None and new_default is None:
                    if holds & first:
                        key = (node.st.st_ino, generation(node.fd))
                        if store.lookup(*key) is None:
                            # What it holds of the groups applied before came from
                            # apply's defaults (it has no record): revert of them takes
                            # it off, as for an inode changed now.
                            later = holds & previous
                            store.record(*key, node.is_dir, node.st.st_mode, *raw, (), later)
                    continue
                key = (node.st.st_ino, generation(node.fd))
                # Most inodes have no record (a first apply: none has): the batch's
                # records go in with one INSERT OR IGNORE; one that has a record gets
                # record()'s rules (Store.record_many).
                rows.append((*key, node.is_dir, node.st.st_mode, *raw, gids_text, later_text))
                # The walk closes node.fd once it moves on: the change keeps its own.
                pending.append((node.take(), new_access, new_default))
                if len(pending) >= batch:
                    flush()
            flush()
        finally:
            for node, _, _ in pending:  # an error before the batch's records were on disk
                os.close(node.fd)
            pending.clear()
        store.commit()
    finally:
        os.close(fd)
    back = max(0, offset - clock_offset())
    settled = (
        not refused
        and not len(skips)
        and len(dirs) <= DIRS_MAX
        and unchanged(dirs, start_ns - back)
    )
    return skips, refused, walked if settled else None


def record_setup(root: Path, journal: Path, after: bool) -> None:
    """Record what the journal directory, its machine directories and their active
    files hold, before apply's setup steps (committed before the first) or after."""
    from debadmin.journal_acl_setup import ownership

    fd = open_journal(journal)
    if fd is None:
        raise Error(f"{journal} does not exist")
    store = acl_state().Store(root, create=True)
    try:
        ownership.record(fd, str(journal), store, after)
    finally:
        store.close()
        os.close(fd)


def applied_groups(root: Path) -> Dict[str, int]:
    """The groups the state database says were applied and not reverted, read only
    ({} without a usable database)."""
    store = acl_state().Store(root, create=False, read_only=True)
    try:
        return store.applied()
    finally:
        store.close()


def granting(state: State, uids: Set[int]) -> None:
    """The grant step of apply: the state database opened, the groups recorded as
    applied (with those applied before), the tree walked, what it skipped logged and
    what refused an ACL kept for the exit status."""
    store = acl_state().Store(state.root, create=True)
    try:
        previous = store.applied()
        # A group the drop-in names was applied before, and its record lost (the state
        # file deleted): its entries now are apply's, not the admin's, and are not kept.
        before = set(read_tmpfiles_dropin(state.root) or {}) | set(previous) | {STOCK_GROUP}
        first = {g for n, g in state.groups.items() if n not in before}
        lost = {g for n, g in state.groups.items() if n in before and n not in previous}
        store.begin()
        store.set_applied({**previous, **state.groups})
        store.commit()
        skips, refused, walked = grant_tree(
            state.journal,
            state.groups,
            set(uids),
            store,
            print,
            first=first,
            previous=set(previous.values()) | lost,
        )
    finally:
        store.close()
    for skip in skips.items():
        log.warning("%s", skip.message)
    state.refused = refused
    if walked is not None:
        state.walked = (skip_findings(skips), walked)
