"""journal-acl-setup: what apply found before it changed an ACL, so that revert puts it back.

A SQLite database, /var/lib/journal-acl-setup/acl-state.sqlite (in the image with
--root): for each directory or file apply changed, keyed by inode number and inode
generation (the walk never leaves the journal's own mount, so the inode number names a
file there; the generation, where the filesystem has one, tells a reused number from
the file that had it), its access and default ACL attributes as the kernel kept them
and its mode, recorded when apply first changed it and never overwritten, and the gids
apply granted it since; and the groups applied and not reverted, by name and gid (a
group deleted since is still reverted by its gid).

apply records every inode it is about to change in one transaction, committed (and so
on disk: SQLite syncs a commit) before the first change; revert computes, for every
inode recorded, what apply made of it from the record and its gids, and where the file
still holds exactly that, writes the record back (no gid left) or what apply makes of
the record for the gids left.  Memory stays flat however many files: rows are looked
up one at a time, never loaded together.
"""

from __future__ import annotations  # annotations stay text: typing is never imported

import fcntl
import os
import sqlite3
import struct
from pathlib import Path

from debadmin.errors import Error

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, Iterable, Optional, Set, Tuple

    Record = Tuple[int, int, bytes, bytes, Set[int]]  # is_dir, mode, access, default, gids

STATE_DIR = "var/lib/journal-acl-setup"
STATE_FILE = "acl-state.sqlite"
FS_IOC_GETVERSION = 0x80087601  # _IOR('v', 1, long): the inode generation
SCHEMA = """
CREATE TABLE IF NOT EXISTS acl (
    ino INTEGER NOT NULL, gen INTEGER NOT NULL, is_dir INTEGER NOT NULL,
    mode INTEGER NOT NULL, access BLOB NOT NULL, dflt BLOB NOT NULL, gids TEXT NOT NULL,
    PRIMARY KEY (ino, gen));
CREATE TABLE IF NOT EXISTS applied (name TEXT PRIMARY KEY, gid INTEGER NOT NULL);
"""


def generation(fd: int) -> int:
    """The inode generation of fd (ext4, xfs, btrfs), 0 where the filesystem has none."""
    try:
        return struct.unpack("l", fcntl.ioctl(fd, FS_IOC_GETVERSION, bytes(8)))[0]
    except OSError:
        return 0


def _text(gids: Iterable[int]) -> str:
    return ",".join(str(g) for g in sorted(set(gids)))


def state_path(root: Path) -> Path:
    return root / STATE_DIR / STATE_FILE


class Store:
    """The state database, opened for one apply or revert (under the tool's lock)."""

    def __init__(self, root: Path, create: bool) -> None:
        self.path = state_path(root)
        self.db: Optional[sqlite3.Connection] = None
        if not create and not self.path.exists():
            return
        try:
            if create:
                self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            self.db = sqlite3.connect(str(self.path), isolation_level=None)
            self.db.execute("PRAGMA synchronous=FULL")
            self.db.executescript(SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            raise Error(f"cannot open {self.path}: {exc}") from None

    def close(self) -> None:
        if self.db is not None:
            self.db.close()
            self.db = None

    def applied(self) -> Dict[str, int]:
        if self.db is None:
            return {}
        return dict(self.db.execute("SELECT name, gid FROM applied ORDER BY name"))

    def begin(self) -> None:
        self._run("BEGIN IMMEDIATE")

    def commit(self) -> None:
        self._run("COMMIT")

    def set_applied(self, groups: Dict[str, int]) -> None:
        self._run("DELETE FROM applied")
        for name, gid in groups.items():
            self._run("INSERT INTO applied VALUES (?, ?)", (name, gid))

    def record(
        self,
        ino: int,
        gen: int,
        is_dir: bool,
        mode: int,
        access: bytes,
        dflt: bytes,
        gids: Iterable[int],
    ) -> None:
        """Keep what an inode held before its first change and the groups apply granted
        it: a later call adds groups, never changes what it held."""
        record = self.lookup(ino, gen)
        if record is None:
            self._run(
                "INSERT INTO acl VALUES (?, ?, ?, ?, ?, ?, ?)",
                (ino, gen, int(is_dir), mode, access, dflt, _text(gids)),
            )
        elif not set(gids) <= record[4]:
            self.set_gids(ino, gen, record[4] | set(gids))

    def set_gids(self, ino: int, gen: int, gids: Iterable[int]) -> None:
        self._run("UPDATE acl SET gids = ? WHERE ino = ? AND gen = ?", (_text(gids), ino, gen))

    def lookup(self, ino: int, gen: int) -> Optional[Record]:
        if self.db is None:
            return None
        row = self.db.execute(
            "SELECT is_dir, mode, access, dflt, gids FROM acl WHERE ino = ? AND gen = ?",
            (ino, gen),
        ).fetchone()
        if row is None:
            return None
        gids = {int(g) for g in row[4].split(",") if g}
        return (row[0], row[1], bytes(row[2]), bytes(row[3]), gids)

    def forget(self, ino: int, gen: int) -> None:
        self._run("DELETE FROM acl WHERE ino = ? AND gen = ?", (ino, gen))

    def remove(self) -> None:
        """Delete the database (nothing applied is left to revert)."""
        self.close()
        for suffix in ("", "-journal", "-wal", "-shm"):
            try:
                os.unlink(f"{self.path}{suffix}")
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise Error(f"cannot remove {self.path}{suffix}: {exc.strerror}") from None

    def _run(self, sql: str, params: tuple = ()) -> None:
        if self.db is None:
            raise Error(f"{self.path} is not open")
        try:
            self.db.execute(sql, params)
        except sqlite3.Error as exc:
            raise Error(f"cannot write {self.path}: {exc}") from None
