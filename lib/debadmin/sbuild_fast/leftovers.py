"""sbuild-fast leftovers: unpacked trees whose build is dead, found and removed.

A session server killed with SIGKILL cannot remove its tree, and sbuild's unshare mode
leaves its unpacked chroot (tmp.sbuild.XXXXXXXXXX) when it dies or gives up before its
cleanup. These trees belong to the user's first subordinate uid (the root of the build's
user namespace), so the user cannot remove them with rm: they are removed through the
same id mapping (unshare --map-auto, as the session's own root), and only when they are
provably this user's and provably dead:

- a session's mount point (TMP/sbuild-fast.PID.START.XXXXXXXX, the user's own) and its
  on-disk tree (TMP/sbuild-fast-session.PID.START.XXXXXXXX, the first subordinate uid's)
  carry the server's pid and start time (field 22 of /proc/PID/stat): dead when no process
  has that pid with that start time;
- sbuild's tmp.sbuild.XXXXXXXXXX (chowned to the first subordinate uid by sbuild, or still
  the user's and empty): dead when no sbuild of the user runs but the callers' own
  ancestors (one running sbuild may be unpacking into it: it is then left for next time).

Nothing of root's is touched: nothing is looked for when the caller is root or the user's
first subordinate id is 0; a directory with one of these names that root owns is reported
(status "not-ours"), never entered; a tree holding an entry whose owner or group is
outside the user's mapping (root's, another user's: the overflow id inside it) is
reported and left whole, and the removal itself runs in the user's mapping, which holds
no right over root's files.
"""

import logging
import os
import pwd
import re
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, List, Optional, Sequence, Set

from debadmin import fsutil
from debadmin.errors import Error
from debadmin.sbuild_fast import sbuild

log = logging.getLogger("sbuild-fast")

MOUNTPOINT_PREFIX = "sbuild-fast."
DISK_PREFIX = "sbuild-fast-session."
SESSION_NAME = re.compile(
    r"^(?P<kind>sbuild-fast|sbuild-fast-session)\.(?P<pid>[0-9]+)\.(?P<start>[0-9]+)\.[A-Za-z0-9_]+$"
)
UNSHARE_NAME = re.compile(r"^tmp\.sbuild\.[A-Za-z0-9]{10}$")


def start_time(pid: int, proc: Path = Path("/proc")) -> Optional[int]:
    """A process's start time (clock ticks after boot), None when there is none."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after its end
    try:
        return int(text[text.rindex(")") + 2 :].split()[19])
    except (ValueError, IndexError):
        return None


def own_tag(proc: Path = Path("/proc")) -> str:
    """This process's PID.START, for the names of what it makes."""
    pid = os.getpid()
    return f"{pid}.{start_time(pid, proc)}"


def ancestors(pid: int, proc: Path = Path("/proc")) -> Set[int]:
    """pid and the pids of its ancestors."""
    seen: Set[int] = set()
    while pid > 0 and pid not in seen:
        seen.add(pid)
        try:
            text = (proc / str(pid) / "stat").read_text()
            pid = int(text[text.rindex(")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return seen


def other_sbuild_runs(uid: int, proc: Path = Path("/proc"), me: Optional[int] = None) -> bool:
    """Whether a process of uid other than me and my ancestors runs sbuild (perl [-w]
    [-I DIR] /usr/bin/sbuild ...: any word of its command line; a false match only keeps
    a tree, a missed one would remove a live build's)."""
    mine = ancestors(os.getpid() if me is None else me, proc)
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(os.path.basename(a) == b"sbuild" for a in argv):
            return True
    return False


@dataclass
class Leftover:
    path: Path
    kind: str  # "session mount point", "session tree", "unshare-mode tree"
    owner: int  # the user's uid or the first subordinate uid (0: root's, not ours)

    def describe(self) -> str:
        return f"{self.kind} {self.path}"


def _entries(directory: Path) -> Iterable[Path]:
    try:
        return sorted(directory.iterdir())
    except OSError:
        return []


def find(
    dirs: Sequence[Path],
    uid: int,
    subroot: int,
    alive: Callable[[int, int], bool],
    sbuild_elsewhere: Callable[[], bool],
) -> List[Leftover]:
    """The dead leftovers of uid (first subordinate uid subroot) directly in dirs:
    alive(pid, start) tells whether a session server still runs; sbuild_elsewhere()
    whether an sbuild of the user (not the caller) runs."""
    found: List[Leftover] = []
    unshare_checked: List[bool] = []
    seen: Set[Path] = set()
    if uid == 0 or subroot == 0:
        return found  # root's is never ours to remove
    for directory in dirs:
        for path in _entries(directory):
            try:
                info = path.lstat()
            except OSError:
                continue
            if not stat.S_ISDIR(info.st_mode) or (info.st_dev, info.st_ino) in seen:
                continue
            match = SESSION_NAME.match(path.name)
            if match:
                kind = "session mount point" if match["kind"] == "sbuild-fast" else "session tree"
                owner = uid if kind == "session mount point" else subroot
                if info.st_uid == 0:
                    owner = 0  # reported, never entered
                elif info.st_uid != owner or alive(int(match["pid"]), int(match["start"])):
                    continue
            elif UNSHARE_NAME.match(path.name):
                kind = "unshare-mode tree"
                if info.st_uid == 0:
                    seen.add((info.st_dev, info.st_ino))
                    found.append(Leftover(path, kind, 0))
                    continue
                if info.st_uid not in (uid, subroot):
                    continue
                if not unshare_checked:
                    unshare_checked.append(not sbuild_elsewhere())
                if not unshare_checked[0]:
                    continue
                owner = info.st_uid
            else:
                continue
            seen.add((info.st_dev, info.st_ino))
            found.append(Leftover(path, kind, owner))
    return found


def server_alive(pid: int, start: int, proc: Path = Path("/proc")) -> bool:
    """Whether the process pid that started at start still runs: a zombie (killed, not
    yet reaped by a parent or an init that reaps late) has closed its descriptors, and
    its session died with them."""
    if start_time(pid, proc) != start:
        return False
    try:
        text = (proc / str(pid) / "stat").read_text()
        return text[text.rindex(")") + 2 :].split()[0] not in ("Z", "X")
    except (OSError, ValueError, IndexError):
        return False


def candidate_dirs(extra: Iterable[Optional[str]] = ()) -> List[Path]:
    """Where sessions and sbuild's unshare mode put their trees: TMPDIR, /tmp, /var/tmp,
    /dev/shm and the directories of configured templates."""
    out: List[Path] = []
    for d in (os.environ.get("TMPDIR"), "/tmp", "/var/tmp", "/dev/shm", *extra):
        if d and Path(d).is_absolute() and Path(d) not in out:
            out.append(Path(d))
    return out


def removal_argv() -> List[str]:
    """The user's own id mapping with both the user (as 0) and the first subordinate
    range: its root may remove what either owns (a tmp.sbuild.* of the user's with the
    subordinate root's files inside), and has no right over anything else."""
    return ["unshare", "--map-auto", "--map-root-user"]


def overflow_id(kind: str) -> int:
    """The id (kind: uid or gid) an owner outside a user namespace's mapping shows as
    inside it."""
    try:
        return int(Path(f"/proc/sys/kernel/overflow{kind}").read_text().strip())
    except (OSError, ValueError):
        return 65534


# Exit status of the removal's shell when the tree holds an entry of an unmapped owner.
FOREIGN_RC = 3
REMOVE_SCRIPT = (
    'if find "$1" -xdev \\( -uid "$2" -o -gid "$3" \\) -print -quit | grep -q .; then '
    "exit %d; fi; " % FOREIGN_RC
)


def removal_command(path: Path) -> str:
    """What the user runs to remove a leftover by hand."""
    return " ".join([*removal_argv(), "rm", "-rf", "--one-file-system", "--", str(path)])


def remove(leftover: Leftover, uid: int, mapped: Sequence[str], dry_run: bool = False) -> str:
    """Remove a leftover through the user's mapping (mapped: the argv prefix running as
    its root, removal_argv()), unless its top or any entry is an id's outside that mapping
    (root's, another user's). The outcome: "removed", "would-remove" (dry_run: nothing
    is written), "not-ours" (left whole) or "failed"."""
    path = str(leftover.path)
    if uid == 0 or leftover.owner == 0:
        return "not-ours"
    script = REMOVE_SCRIPT + ("exit 0" if dry_run else 'exec rm -rf --one-file-system -- "$1"')
    ran = subprocess.run(
        [
            *mapped,
            "sh",
            "-c",
            script,
            "sh",
            path,
            str(overflow_id("uid")),
            str(overflow_id("gid")),
        ],
        check=False,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    if ran.returncode == FOREIGN_RC:
        return "not-ours"
    if dry_run:
        return "would-remove" if ran.returncode == 0 else "failed"
    gone = not os.path.lexists(path)
    return "removed" if gone else "failed"


def first_subuid(user: str, root: Path = Path("/")) -> Optional[int]:
    try:
        text = (root / "etc/subuid").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        fields = line.split(":")
        if len(fields) >= 3 and fields[0] == user and fields[1].isdigit():
            return int(fields[1])
    return None


def dead_leftovers(
    user: str, uid: int, extra_dirs: Iterable[Optional[str]] = ()
) -> List[Leftover]:
    """The user's dead leftovers on this host."""
    subroot = first_subuid(user)
    if subroot is None:
        return []
    return find(
        candidate_dirs(extra_dirs),
        uid,
        subroot,
        server_alive,
        lambda: other_sbuild_runs(uid),
    )


def _warned(record: Optional[Path]) -> Set[str]:
    if record is None:
        return set()
    try:
        return set(record.read_text(encoding="utf-8").splitlines())
    except OSError:
        return set()


def clean(
    user: str,
    uid: int,
    mapped: Sequence[str],
    extra_dirs: Iterable[Optional[str]] = (),
    record: Optional[Path] = None,
) -> List[Leftover]:
    """Remove the user's dead leftovers; the ones removed. One that stays is warned about
    once (record: the file naming those already warned about; None: every time), with the
    command that removes it; 'sbuild-fast doctor' reports it at every run."""
    removed = []
    warned = _warned(record)
    stuck: Set[str] = set()
    for leftover in dead_leftovers(user, uid, extra_dirs):
        outcome = remove(leftover, uid, mapped)
        if outcome == "removed":
            log.info("removed the leftover %s", leftover.describe())
            removed.append(leftover)
            continue
        stuck.add(str(leftover.path))
        if outcome == "not-ours":
            message = "the leftover %s holds files of root or of another user: left alone"
        else:
            message = "cannot remove the leftover %s: " + removal_command(leftover.path)
        if str(leftover.path) in warned:
            log.info(message, leftover.describe())
        else:
            log.warning(
                message + " (said once; 'sbuild-fast doctor' lists it)", leftover.describe()
            )
    if record is not None and stuck != warned and record.parent.is_dir():
        try:
            if stuck:
                fsutil.atomic_write(record, "".join(f"{p}\n" for p in sorted(stuck)).encode())
            else:
                fsutil.remove_file(record)
        except (OSError, Error) as exc:
            log.debug("cannot record the leftovers warned about in %s: %s", record, exc)
    return removed


# The leftovers a run could not remove and has warned about (once each).
LEFTOVERS_WARNED = "leftovers-warned"


def clean_mine(dry_run: bool) -> None:
    """Remove what killed sessions and failed unshare-mode builds of this user left (their
    trees belong to the first subordinate uid: removed through its mapping)."""
    uid = os.getuid()
    if dry_run or uid == 0:
        return
    user = pwd.getpwuid(uid).pw_name
    record = sbuild.user_cache_dir() / sbuild.STATE_SUBDIR / LEFTOVERS_WARNED
    clean(user, uid, removal_argv(), record=record)
