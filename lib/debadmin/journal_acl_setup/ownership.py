"""journal-acl-setup: the journal directory's setup, recorded before apply changes it.

A journal directory made by hand (root:root 0755, its system.journal 0600) is not what
systemd makes: apply sets the directory's owner, group and mode and runs
systemd-tmpfiles, whose systemd.conf lines change the directory, each machine directory
and its active system.journal (owner, group, mode, ACLs for adm).  Before the first of
those changes apply records what these inodes hold (state.Store.record_setup, committed
before the change), and once they are done what they hold then (setup_after).  They
belong to the journal being persistent and readable by adm, which stays at revert as
adm's entries stay; revert --adm gives them back, where they still hold what apply's
setup left (revert.py).
"""

from __future__ import annotations  # annotations stay text: typing is never imported

import contextlib
import os
import stat

from debadmin.journal_acl_setup import walk as walker

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Iterator

ACTIVE = "system.journal"


def targets(journal_fd: int, journal: str) -> Iterator[walker.Node]:
    """The journal directory, each directory in it and the system.journal in each: what
    systemd-tmpfiles' lines for /var/log/journal reach.  Each open while yielded; never
    a symbolic link, never anything but a directory or a regular file."""
    yield walker.Node(journal, journal_fd, os.fstat(journal_fd), True)
    with os.scandir(journal_fd) as entries:
        names = [e.name for e in entries if e.is_dir(follow_symlinks=False)]
    for name in sorted(names):
        try:
            fd, st = walker.open_checked(journal_fd, name, True)
        except OSError:
            continue  # gone or swapped meanwhile: not something tmpfiles changes either
        try:
            yield walker.Node(f"{journal}/{name}", fd, st, True)
            with contextlib.suppress(OSError):
                active_fd, active_st = walker.open_checked(fd, ACTIVE, False)
                try:
                    if active_st.st_nlink == 1 and stat.S_ISREG(active_st.st_mode):
                        yield walker.Node(
                            f"{journal}/{name}/{ACTIVE}", active_fd, active_st, False
                        )
                finally:
                    os.close(active_fd)
        finally:
            os.close(fd)


def record(journal_fd: int, journal: str, store: Any, after: bool) -> int:
    """Record the targets as they are now, before apply's setup steps (after false: a
    record made earlier is kept) or after them; committed.  How many were recorded."""
    from debadmin.journal_acl_setup import state

    count = 0
    store.begin()
    for node in targets(journal_fd, journal):
        key = (node.st.st_ino, state.generation(node.fd))
        raw = node.raw()
        if after:
            store.setup_after(*key, node.st, raw)
        else:
            store.record_setup(*key, node.is_dir, node.st, raw)
        count += 1
    store.commit()
    return count


def current(node: walker.Node) -> bytes:
    """What the inode open in node holds now, as setup records compare it."""
    from debadmin.journal_acl_setup import state

    return state.setup_key(os.fstat(node.fd), node.raw())


def give_back(node: walker.Node, before: Any) -> None:
    """The owner, group, mode and ACLs recorded before apply's setup steps, on the
    descriptor (the owner first: a chown may clear set-id bits the mode then restores)."""
    uid, gid, mode, access, default, _after = before
    try:
        os.fchown(node.fd, uid, gid)
    except OSError as exc:
        raise walker.AclError(
            f"cannot give {walker.shown(node.path)} back its owner: {exc.strerror}",
            str(exc.strerror),
        ) from None
    walker.restore(node, access, default, mode)
