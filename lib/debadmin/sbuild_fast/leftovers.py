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
"""

import logging
import os
import re
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, List, Optional, Sequence, Set

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
    owner: int  # the user's uid or the first subordinate uid

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
                if info.st_uid != owner or alive(int(match["pid"]), int(match["start"])):
                    continue
            elif UNSHARE_NAME.match(path.name):
                kind = "unshare-mode tree"
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


def remove(leftover: Leftover, uid: int, mapped: Sequence[str]) -> bool:
    """Remove a leftover: what the subordinate ids own through their mapping (mapped: the
    argv prefix running as the namespace's root), then the top directory if the user's."""
    path = str(leftover.path)
    if leftover.owner != uid or any(True for _ in _entries(leftover.path)):
        subprocess.run(
            [*mapped, "rm", "-rf", "--one-file-system", "--", path],
            check=False,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    try:
        if leftover.path.is_dir() and not leftover.path.is_symlink():
            leftover.path.rmdir()
    except OSError:
        pass
    gone = not os.path.lexists(path)
    if not gone:
        log.warning("cannot remove the leftover %s", leftover.describe())
    return gone


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


def clean(
    user: str, uid: int, mapped: Sequence[str], extra_dirs: Iterable[Optional[str]] = ()
) -> List[Leftover]:
    """Remove the user's dead leftovers; the ones removed."""
    removed = []
    for leftover in dead_leftovers(user, uid, extra_dirs):
        if remove(leftover, uid, mapped):
            log.info("removed the leftover %s", leftover.describe())
            removed.append(leftover)
    return removed
