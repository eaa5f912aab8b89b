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
import urllib.parse
from pathlib import Path

from debadmin.errors import Error

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, Iterable, Iterator, List, Optional, Set, Tuple

    # is_dir, mode, access, default, gids granted, gids inherited from apply's defaults
    Record = Tuple[int, int, bytes, bytes, Set[int], Set[int]]
    # uid, gid, mode, access, default before apply's setup steps; what they left (or None)
    SetupRecord = Tuple[int, int, int, bytes, bytes, Optional[bytes]]

STATE_DIR = "var/lib/journal-acl-setup"
STATE_FILE = "acl-state.sqlite"
FS_IOC_GETVERSION = 0x80087601  # _IOR('v', 1, long): the inode generation
SCHEMA = """
CREATE TABLE IF NOT EXISTS acl (
    ino INTEGER NOT NULL, gen INTEGER NOT NULL, is_dir INTEGER NOT NULL,
    mode INTEGER NOT NULL, access BLOB NOT NULL, dflt BLOB NOT NULL, gids TEXT NOT NULL,
    later TEXT NOT NULL DEFAULT '', PRIMARY KEY (ino, gen));
CREATE TABLE IF NOT EXISTS applied (name TEXT PRIMARY KEY, gid INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS setup (
    ino INTEGER NOT NULL, gen INTEGER NOT NULL, is_dir INTEGER NOT NULL,
    uid INTEGER NOT NULL, gid INTEGER NOT NULL, mode INTEGER NOT NULL,
    access BLOB NOT NULL, dflt BLOB NOT NULL, after BLOB, PRIMARY KEY (ino, gen));
"""
# setup: the journal directory, its machine directories and their system.journal as
# apply found them before it set the directory's owner, group and mode and ran
# systemd-tmpfiles (a hand-made journal), and (after) what they held once that was
# done: revert --adm gives them back where they still hold that.


def generation(fd: int) -> int:
    """The inode generation of fd (ext4, xfs, btrfs), 0 where the filesystem has none."""
    try:
        return struct.unpack("l", fcntl.ioctl(fd, FS_IOC_GETVERSION, bytes(8)))[0]
    except OSError:
        return 0


def ids_text(gids: Iterable[int]) -> str:
    """gids as a record keeps them: "4,5050" (sorted), "" for none."""
    if not gids:  # most records: nothing inherited
        return ""
    return ",".join(str(g) for g in sorted(set(gids)))


def setup_key(st: os.stat_result, raw: Tuple[bytes, bytes]) -> bytes:
    """Owner, group, mode and both ACL attributes of an inode, as one comparable value."""
    head = struct.pack("<III", st.st_uid, st.st_gid, st.st_mode & 0o7777)
    return head + struct.pack("<I", len(raw[0])) + raw[0] + raw[1]


def state_path(root: Path) -> Path:
    return root / STATE_DIR / STATE_FILE


_IDS: Dict[str, frozenset] = {}  # the few distinct texts of a state file, parsed once


def _ids(text: str) -> Set[int]:
    ids = _IDS.get(text)
    if ids is None:
        ids = frozenset(int(g) for g in text.split(",") if g)
        if len(_IDS) < 1024:
            _IDS[text] = ids
    return set(ids)


DEFERRED_MAX = 4096  # deferred writes kept before they go in
READ_AHEAD = 1024  # records read ahead of a deferring transaction's walk


class Store:
    """The state database, opened for one apply or revert (under the tool's lock).

    create: apply's, made where missing.  Otherwise revert's, never created nor given
    tables: with read_only (revert -n) opened read-only, nothing written.  usable says
    whether it holds apply's tables (not: deleted, empty); db is None when not usable.
    """

    def __init__(self, root: Path, create: bool, read_only: bool = False) -> None:
        self.path = state_path(root)
        self.db: Optional[sqlite3.Connection] = None
        self.usable = False
        self.later = False
        # Writes of one inode's record waiting to go in with the next ones of the same
        # statement (executemany) during a deferring transaction; their keys, so that a
        # read of one of them writes them first.
        self._queue: List[Tuple[str, tuple]] = []
        self._queued: Set[Tuple[int, int]] = set()
        self._deferring = False
        self._ahead: Dict[Tuple[int, int], tuple] = {}  # records read ahead (lookup)
        if not create and not self.path.exists():
            return
        try:
            if create:
                self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                self.db = sqlite3.connect(str(self.path), isolation_level=None)
            else:
                mode = "ro" if read_only else "rw"
                uri = "file:" + urllib.parse.quote(str(self.path)) + f"?mode={mode}"
                self.db = sqlite3.connect(uri, isolation_level=None, uri=True)
            self.db.execute("PRAGMA synchronous=FULL")
            tables = {row[0] for row in self.db.execute("SELECT name FROM sqlite_master")}
            if create:
                self.db.executescript(SCHEMA)
            elif not {"acl", "applied"} <= tables:
                self.db.close()
                self.db = None
                return
            columns = {row[1] for row in self.db.execute("PRAGMA table_info(acl)")}
            if "later" not in columns and not read_only:  # written by 0.4.1 or older
                self.db.execute("ALTER TABLE acl ADD COLUMN later TEXT NOT NULL DEFAULT ''")
            self.later = "later" in columns or not read_only
        except (OSError, sqlite3.Error) as exc:
            if self.db is not None:
                self.db.close()
                self.db = None
            raise Error(f"cannot open {self.path}: {exc}") from None
        self.usable = True

    def close(self) -> None:
        self._queue.clear()  # never committed: what SQLite's rollback drops anyway
        self._queued.clear()
        self._ahead = {}
        self._deferring = False
        if self.db is not None:
            self.db.close()
            self.db = None

    def applied(self) -> Dict[str, int]:
        self._drain()
        if self.db is None:
            return {}
        return dict(self.db.execute("SELECT name, gid FROM applied ORDER BY name"))

    def begin(self, defer: bool = False) -> None:
        """Start a transaction; defer: the writes of records (set_gids, set_base,
        forget, forget_setup) wait, in order, to go in together (a revert's cost per
        inode), each written before its inode's record is read again, all before the
        commit."""
        self._run("BEGIN IMMEDIATE")
        self._deferring = defer

    def commit(self) -> None:
        self._drain()
        self._deferring = False
        self._ahead = {}
        self._run("COMMIT")

    def _write(self, sql: str, params: tuple, key: Tuple[int, int]) -> None:
        self._ahead.pop(key, None)
        if not self._deferring:
            self._run(sql, params)
            return
        self._queue.append((sql, params))
        self._queued.add(key)
        if len(self._queue) >= DEFERRED_MAX:
            self._drain()

    def _drain(self) -> None:
        """The deferred writes, in order: each run of one statement in one executemany."""
        queue = self._queue
        if not queue:
            return
        if self.db is None:
            raise Error(f"{self.path} is not open")
        start = 0
        try:
            while start < len(queue):
                sql, end = queue[start][0], start + 1
                while end < len(queue) and queue[end][0] == sql:
                    end += 1
                self.db.executemany(sql, [params for _, params in queue[start:end]])
                start = end
        except sqlite3.Error as exc:
            raise Error(f"cannot write {self.path}: {exc}") from None
        finally:
            queue.clear()
            self._queued.clear()

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
        later: Iterable[int] = (),
    ) -> None:
        """Keep what an inode held before its first change and the groups apply granted
        it: a later call adds groups, never changes what it held.  later: the groups
        applied before whose entries it holds without a record, inherited from a
        default ACL apply gave its directory (what revert of them takes off).  A record
        of nothing granted (kept: the inode held a group's entries before its first
        apply) is replaced by what the inode holds now."""
        record = self.lookup(ino, gen)
        if (
            record is None
            or not record[4]
            and (record[1], record[2], record[3])
            != (
                mode,
                access,
                dflt,
            )
        ):
            self._run(
                "INSERT OR REPLACE INTO acl (ino, gen, is_dir, mode, access, dflt, gids, later)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (ino, gen, int(is_dir), mode, access, dflt, ids_text(gids), ids_text(later)),
            )
        elif not set(gids) <= record[4]:
            self.set_gids(ino, gen, record[4] | set(gids))

    def record_many(self, rows: List[tuple]) -> None:
        """record() for each row (ino, gen, is_dir, mode, access, dflt, gids, later),
        gids and later as ids_text() writes them (a walk's rows share a few), with
        later only for an inode without a record (as record() is called for one that
        has: ()).  One INSERT OR IGNORE for all (a first apply: no inode has a record):
        where fewer rows went in, record()'s rules for each, which leave the rows
        inserted here as they are (their gids are the ones given)."""
        self._drain()
        self._ahead = {}
        if self.db is None:
            raise Error(f"{self.path} is not open")
        if not rows:
            return
        try:
            cursor = self.db.executemany(
                "INSERT OR IGNORE INTO acl (ino, gen, is_dir, mode, access, dflt, gids, later)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
        except sqlite3.Error as exc:
            raise Error(f"cannot write {self.path}: {exc}") from None
        if cursor.rowcount != len(rows):
            for ino, gen, is_dir, mode, access, dflt, gids, _ in rows:
                self.record(ino, gen, is_dir, mode, access, dflt, _ids(gids), ())

    def set_gids(self, ino: int, gen: int, gids: Iterable[int]) -> None:
        self._write(
            "UPDATE acl SET gids = ? WHERE ino = ? AND gen = ?",
            (ids_text(gids), ino, gen),
            (ino, gen),
        )

    def set_base(self, ino: int, gen: int, access: bytes, dflt: bytes, mode: int, later) -> None:
        """What an inode is to get back, once the inherited entries of a group reverted
        are taken out of it."""
        self._write(
            "UPDATE acl SET access = ?, dflt = ?, mode = ?, later = ? WHERE ino = ? AND gen = ?",
            (access, dflt, mode, ids_text(later), ino, gen),
            (ino, gen),
        )

    def lookup(self, ino: int, gen: int) -> Optional[Record]:
        """The record of an inode, or None.  In a deferring transaction (revert's walk)
        the records that follow it in the order apply wrote them, which is the order
        the walk meets them, are read ahead, READ_AHEAD at a time."""
        key = (ino, gen)
        if key in self._queued:
            self._drain()
        if self.db is None:
            return None
        row = self._ahead.pop(key, None)
        if row is None:
            row = self.db.execute(
                f"SELECT {self._columns()} FROM acl WHERE ino = ? AND gen = ?", key
            ).fetchone()
            if row is None:
                return None
            if self._deferring:
                self._read_ahead(row[0])
        return (row[1], row[2], bytes(row[3]), bytes(row[4]), _ids(row[5]), _ids(row[6]))

    def _columns(self) -> str:
        later = "later" if self.later else "''"
        return f"rowid, is_dir, mode, access, dflt, gids, {later}, ino, gen"

    def _read_ahead(self, rowid: int) -> None:
        """The records after rowid, as they are once the deferred writes are in (a write
        of one of them later drops it from what was read ahead: _write)."""
        self._drain()
        self._ahead = {
            (row[7], row[8]): row
            for row in self.db.execute(
                f"SELECT {self._columns()} FROM acl WHERE rowid > ? ORDER BY rowid LIMIT ?",
                (rowid, READ_AHEAD),
            )
        }

    def holding(self, gids: Set[int]) -> Iterator[Tuple[int, int, str]]:
        """The records that still name one of gids (granted or inherited), one at a
        time: (ino, gen, what they name)."""
        self._drain()
        if self.db is None:
            return
        later = "later" if self.later else "''"
        for ino, gen, granted, inherited in self.db.execute(
            f"SELECT ino, gen, gids, {later} FROM acl"
        ):
            named = (_ids(granted) | _ids(inherited)) & gids
            if named:
                yield ino, gen, ids_text(named)

    def count_holding(self, gids: Set[int]) -> int:
        """How many records holding() yields, counted by SQLite: the lists are texts of
        decimal gids joined by commas, so ",GID," is in ",gids,later," exactly where
        one names GID."""
        self._drain()
        if self.db is None or not gids:
            return 0
        later = "later" if self.later else "''"
        test = " OR ".join(["(',' || gids || ',' || " + later + " || ',') LIKE ?"] * len(gids))
        row = self.db.execute(
            f"SELECT count(*) FROM acl WHERE {test}", [f"%,{int(g)},%" for g in sorted(gids)]
        ).fetchone()
        return int(row[0])

    def orphans(self, known: Set[int]) -> Dict[int, int]:
        """The gids records name (granted or inherited) that are not in known: gid ->
        how many records name it."""
        self._drain()
        counts: Dict[int, int] = {}
        if self.db is None:
            return counts
        later = "later" if self.later else "''"
        # A few distinct lists among many records: SQLite counts each, Python parses it.
        for granted, inherited, records in self.db.execute(
            f"SELECT gids, {later}, count(*) FROM acl GROUP BY gids, {later}"
        ):
            for gid in (_ids(granted) | _ids(inherited)) - known:
                counts[gid] = counts.get(gid, 0) + records
        return counts

    def record_setup(self, ino: int, gen: int, is_dir: bool, st: os.stat_result, raw) -> None:
        """What an inode held before apply's setup steps; the first record is kept."""
        self._run(
            "INSERT OR IGNORE INTO setup (ino, gen, is_dir, uid, gid, mode, access, dflt)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (ino, gen, int(is_dir), st.st_uid, st.st_gid, st.st_mode, raw[0], raw[1]),
        )

    def setup_after(self, ino: int, gen: int, st: os.stat_result, raw) -> None:
        """What a recorded inode holds once apply's setup steps are done (set once)."""
        self._run(
            "UPDATE setup SET after = ? WHERE ino = ? AND gen = ? AND after IS NULL",
            (setup_key(st, raw), ino, gen),
        )

    def setup_lookup(self, ino: int, gen: int) -> Optional[SetupRecord]:
        """(uid, gid, mode, access, default, after) recorded before the setup steps."""
        if (ino, gen) in self._queued:
            self._drain()
        if not self.has_setup():
            return None
        row = self.db.execute(
            "SELECT uid, gid, mode, access, dflt, after FROM setup WHERE ino = ? AND gen = ?",
            (ino, gen),
        ).fetchone()
        if row is None:
            return None
        after = None if row[5] is None else bytes(row[5])
        return (row[0], row[1], row[2], bytes(row[3]), bytes(row[4]), after)

    def setup_keys(self) -> Set[Tuple[int, int]]:
        """The inodes recorded before the setup steps (a handful: the journal directory,
        its machine directories and their active files)."""
        self._drain()
        if not self.has_setup():
            return set()
        return {(ino, gen) for ino, gen in self.db.execute("SELECT ino, gen FROM setup")}

    def has_setup(self) -> bool:
        if self.db is None:
            return False
        return bool(
            self.db.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'setup'"
            ).fetchone()
        )

    def forget_setup(self, ino: int, gen: int) -> None:
        self._write("DELETE FROM setup WHERE ino = ? AND gen = ?", (ino, gen), (ino, gen))

    def forget(self, ino: int, gen: int) -> None:
        self._write("DELETE FROM acl WHERE ino = ? AND gen = ?", (ino, gen), (ino, gen))

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
        self._drain()  # what waits goes first: the order stays the order of the calls
        self._ahead = {}  # a write of any record: nothing read ahead is taken as current
        if self.db is None:
            raise Error(f"{self.path} is not open")
        try:
            self.db.execute(sql, params)
        except sqlite3.Error as exc:
            raise Error(f"cannot write {self.path}: {exc}") from None
