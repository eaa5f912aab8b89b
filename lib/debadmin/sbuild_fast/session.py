"""sbuild-fast session: an autopkgtest virt server that keeps one namespace set per build.

sbuild's unshare mode builds a new user, mount and pid namespace for each of the ~140
commands of a build (70-110 ms each). sbuild's autopkgtest mode runs each command through
the argv that the virt server's print-execute-command returns; this server unpacks the
sbuild-fast tarball once per build into namespaces it keeps (user, mount, pid, uts, ipc
and a network namespace with only lo), and returns an nsenter argv into them:

- ids as sbuild's unshare mode maps them (the first /etc/subuid and /etc/subgid line of
  the user, from 0), so the package cache is shared with that mode, file for file;
- commands run in the host's network namespace (apt reaches the archive), except the one
  unshare mode runs without network (dpkg-buildpackage) and the build user's others but
  apt-get: they enter the session's own;
- each command is pid 1 of a pid namespace of its own inside the session's, as in unshare
  mode: what it leaves behind dies when it returns;
- the session's init is pid 1 of its pid namespace: killing it at 'close' (or when
  sbuild, this server or init goes away) kills every process of the build;
- the unpacked tree lives in a tmpfs mounted inside the session's mount namespace when
  memory allows, so it vanishes with the namespace; otherwise on disk, removed at close
  (or, when this server was killed, by the next session: leftovers.py);
- the tree is the root of the session's mount namespace (pivot_root, the host's root
  detached), and each command starts with no descriptor above 2: nothing of the build,
  the session's root included, can reach a host path.
"""

import json
import logging
import os
import pwd
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, TextIO, Tuple

from debadmin.errors import Error
from debadmin.sbuild_fast import leftovers
from debadmin.sbuild_fast import sbuild as sbs
from debadmin.sbuild_fast.sbuild import CACHE_MOUNTPOINT

log = logging.getLogger("sbuild-fast")

# sbuild's autopkgtest mode runs commands through print-execute-command's argv from 0.85
# (bookworm) on, the same up to 0.91.
SBUILD_MIN = "0.85"

# What sbuild's unshare mode runs without network (Sbuild/Build.pm: DISABLE_NETWORK => 1,
# the same in 0.85, 0.89 and 0.91): the build itself.
OFFLINE_COMMANDS = ("dpkg-buildpackage",)

# Each command: a POSIX shell picks the namespaces and execs nsenter (shells, nsenter,
# unshare, mount and chroot: a few ms, where unshare mode pays 70-110 ms of Perl and
# newuidmap). sbuild appends: env NAME=VALUE... [/sbin/runuser -u USER --] [sh -c 'cd
# DIR...'] CMD. Offline (the session's network namespace, only lo): the build, as in
# unshare mode, and every other command sbuild runs as a user other than root, but apt-get
# (apt-get source fetches as the build user).
# nsenter enters the session's namespaces through the descriptors this server holds
# (/proc/SERVER/fd/N), never through a pid: once the session's init is dead, nothing can
# enter its pid namespace any more (fork fails there), so a command fails instead of
# running in whatever process took init's pid. --wd (not --root) puts it in the session's
# root directory; the second shell runs there, in a mount, pid, ipc and uts namespace of
# the command's own (as sbuild's unshare mode gives each command, hostname sbuild
# inherited): it mounts a fresh /proc and /dev/shm and chroots. What a command leaves
# behind (a process, a file in /dev/shm, a SysV IPC object, a hostname) dies with it.
# The session's root is the tree itself (pivot_root): what runs there is the chroot's, and
# trixie's buildd chroots have no mount(8). perl-base is essential: mount(2) through
# perl's syscall (its number for the machine: the chroot is the machine's own
# architecture), then chroot(8) from coreutils; mount(8) where the number is not known.
MOUNT_SYSCALL = {
    "x86_64": 165,
    "aarch64": 40,
    "riscv64": 40,
    "loongarch64": 40,
    "i386": 21,
    "i686": 21,
    "armv7l": 21,
    "armv8l": 21,
    "ppc64le": 21,
    "ppc64": 21,
    "s390x": 21,
}
COMMAND_SCRIPT = '/bin/mount -t tmpfs tmpfs dev/shm && exec /usr/sbin/chroot . "$@"'
COMMAND_PERL = (
    'my ($s, $t) = ("tmpfs", "dev/shm"); '
    'syscall(%d, $s, $t, $s, 0, 0) == 0 or die "sbuild-fast: /dev/shm: $!\\n"; '
    'exec("/usr/sbin/chroot", ".", @ARGV) or die "sbuild-fast: chroot: $!\\n";'
)


def command_argv(machine: str) -> List[str]:
    """What runs first in a command's own namespaces, in the tree: mounts a fresh
    /dev/shm and chroots to '.' (the tree) with the command's argv appended."""
    number = MOUNT_SYSCALL.get(machine)
    if number is None:
        return ["/bin/sh", "-c", COMMAND_SCRIPT, "sbuild-fast-command"]
    return ["/usr/bin/perl", "-e", COMMAND_PERL % number, "--"]


_COMMAND = " ".join(
    f"'{a}'" if " " in a or "$" in a else a for a in command_argv(os.uname().machine)
)
# First, every descriptor but 0, 1 and 2 is closed: one that sbuild inherited from its
# caller (a directory, say) would otherwise reach the session, a way back to the host's
# file system (dash closes 3-9; bash, only when there are more, the rest).
CLOSE_SCRIPT = (
    'for x in /proc/self/fd/*; do x=${x##*/}; [ "$x" -gt 2 ] && eval "exec $x>&-"; '
    'done 2>/dev/null; exec "$@"'
)
_ENTER = (
    "nsenter $o -- unshare --pid --fork --kill-child --mount-proc=proc --ipc --uts -- "
    f'{_COMMAND} "$@"'
)
EXEC_SCRIPT = (
    'c=""; for x in /proc/self/fd/*; do x=${x##*/}; case $x in [012]) ;; '
    '[3-9]) eval "exec $x>&-";; *) c=1;; esac; done; '
    'o=$1 f=$2; shift 2; n=""; u=""; a=""; s=0; '
    'for x in "$@"; do case $s$x in '
    "0runuser|0*/runuser) s=1; continue;; 1-u) s=2; continue;; 1*) s=3;; "
    "2root) s=3; continue;; 2*) s=3; u=1; continue;; esac; "
    "case $x in "
    + "|".join(f"{c}|*/{c}" for c in OFFLINE_COMMANDS)
    + ") n=1;; apt-get|*/apt-get) a=1;; esac; done; "
    '[ -n "$u" ] && [ -z "$a" ] && n=1; '
    '[ -n "$n" ] && o=$f; '
    f"[ -n \"$c\" ] && exec /bin/bash -c '{CLOSE_SCRIPT}' sbuild-fast-close {_ENTER}; "
    f"exec {_ENTER}"
)
# The namespaces a command enters (nsenter's options), init's and the offline keeper's.
NAMESPACES = ("user", "mnt", "uts", "ipc", "pid", "net")
NSENTER_OPTION = {"mnt": "mount"}  # the others: the same name

# The tmpfs for the unpacked tree: only when this much memory stays available beside it
# (the build's own files come on top of the chroot's).
TMPFS_RESERVE = 2 << 30
# How long init may take to unpack the tree and say 'ready' (a loaded machine, a slow
# disk): past it the session fails with one line rather than hanging sbuild.
HANDSHAKE_TIMEOUT = 600.0
TMPFS_FACTOR = 3  # the tree's size times this: the chroot, the build tree, the .debs
# The tmpfs's size= (a bound: two builds must not pin all memory), from the environment
# sbuild passes on to its virt server.
TMPFS_SIZE_VAR = "SBUILD_FAST_SESSION_TMPFS_SIZE"

# The unpacked tree is the tarball's, and a damaged one may hold symbolic links where
# init writes or mounts (etc/hosts, dev/null, dev itself, a bind's mount point): every
# path under the tree is reached by descriptors, one component at a time with
# O_NOFOLLOW, created where missing, and a symbolic link or other file where a directory
# belongs refuses the session; what init writes replaces whatever file was there; mounts
# land on the descriptor (/proc/self/fd/N), never on a path resolved again. Shared with
# the unit tests, which run it on trees of their own.
TREE_PATHS = r"""
import ctypes, os, stat
libc = ctypes.CDLL(None, use_errno=True)
MS_BIND, MS_REC, MS_NOSUID, MS_NOEXEC = 0x1000, 0x4000, 0x2, 0x8
def cmount(src, target, fstype, flags, data=None):
    if libc.mount(src.encode(), target.encode(), fstype and fstype.encode(), flags,
                  data and data.encode()) != 0:
        raise OSError(ctypes.get_errno(), "mount " + target)
def tree_dir(root, rel):
    # a descriptor of the directory ROOT/rel, made where missing; a link on the way is
    # resolved inside the tree (as a chroot would: merged /usr, /var/run), never outside
    names, parts, hops = [c for c in rel.split("/") if c not in ("", ".")], [], 0
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        while names:
            name = names.pop(0)
            if name == "..":
                parts = parts[:-1]
                os.close(fd)
                fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                names = parts + names
                parts = []
                continue
            try:
                os.mkdir(name, 0o755, dir_fd=fd)
            except FileExistsError:
                pass
            info = os.lstat(name, dir_fd=fd)
            if stat.S_ISLNK(info.st_mode):
                hops += 1
                if hops > 40:
                    raise OSError(40, "damaged tree: too many links in %s/%s" % (root, rel))
                target = os.readlink(name, dir_fd=fd)
                if target.startswith("/"):
                    os.close(fd)
                    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                    parts = []
                names = [c for c in target.split("/") if c not in ("", ".")] + names
                if not target.startswith("/"):
                    # relative: from the directory holding the link (parts so far)
                    os.close(fd)
                    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                    names = parts + names
                    parts = []
                continue
            try:
                sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                              | os.O_CLOEXEC, dir_fd=fd)
            except OSError as exc:
                raise OSError(exc.errno, "damaged tree: %s/%s is not a directory"
                              % (root, rel))
            os.close(fd)
            fd, parts = sub, parts + [name]
    except BaseException:
        os.close(fd)
        raise
    return fd
def tree_clear(dfd, name):
    # what is at name in the directory dfd goes unless it is a directory
    try:
        if not stat.S_ISDIR(os.lstat(name, dir_fd=dfd).st_mode):
            os.unlink(name, dir_fd=dfd)
    except FileNotFoundError:
        pass
def tree_file(root, rel, mode=0o644):
    # a new empty regular file at ROOT/rel (whatever was there goes): its descriptor
    parent, _, name = rel.rstrip("/").rpartition("/")
    dfd = tree_dir(root, parent)
    try:
        tree_clear(dfd, name)
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     mode, dir_fd=dfd)
    finally:
        os.close(dfd)
    os.fchmod(fd, mode)
    return fd
def tree_write(root, rel, text):
    fd = tree_file(root, rel)
    with os.fdopen(fd, "w") as f:
        f.write(text)
def tree_symlink(root, rel, target):
    parent, _, name = rel.rpartition("/")
    dfd = tree_dir(root, parent)
    try:
        tree_clear(dfd, name)
        os.symlink(target, name, dir_fd=dfd)
    finally:
        os.close(dfd)
def fd_path(fd):
    return "/proc/self/fd/%d" % fd
"""

# The session's init: runs inside the namespaces (python3 -c INIT json-args), as their
# root (unshare --map-auto maps the first subordinate range from 0 and sets uid 0 before
# exec, so init keeps its capabilities there). It mounts and unpacks, pivots into the
# tree, reports 'ready', and then only reaps orphans (pid 1 of the namespace) until it is
# killed.
INIT = (
    TREE_PATHS
    + r"""
import fcntl, json, select, signal, socket, struct, subprocess, sys, tempfile
a = json.loads(sys.argv[1])
os.umask(0o022)
root = a["root"]
def run(*argv, **kw):
    subprocess.run(argv, check=True, **kw)
if a["tmpfs"]:
    run("mount", "-t", "tmpfs", "-o", "mode=0755,nosuid,size=%d" % a["tmpfs_size"],
        "sbuild-fast", root)
else:
    disk = tempfile.mkdtemp(prefix=a["disk_prefix"], dir=a["disk_parent"])
    os.chmod(disk, 0o755)
    print("disk " + disk, flush=True)
    run("mount", "--bind", disk, root)
excl = ["--exclude=./dev/" + d for d in ("urandom", "random", "full", "null", "console",
                                          "zero", "tty", "ptmx")]
run("tar", *excl, "--directory", root, "--extract", "--file", "/proc/self/fd/%d" % a["tar_fd"],
    pass_fds=[a["tar_fd"]])
os.close(a["tar_fd"])
for d in ("null", "zero", "full", "random", "urandom", "tty", "console"):
    fd = tree_file(root, "dev/" + d, 0)
    cmount("/dev/" + d, fd_path(fd), None, MS_BIND)
    os.close(fd)
for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                     ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2"),
                     ("ptmx", "/dev/pts/ptmx")):
    tree_symlink(root, "dev/" + name, target)
def mount_on(rel, src, fstype, flags, data=None):
    fd = tree_dir(root, rel)
    try:
        cmount(src, fd_path(fd), fstype, flags, data)
    finally:
        os.close(fd)
mount_on("dev/pts", "none", "devpts", MS_NOEXEC | MS_NOSUID, "gid=5,mode=620,ptmxmode=666")
mount_on("dev/shm", "tmpfs", "tmpfs", 0)
mount_on("sys", "/sys", None, MS_BIND | MS_REC)
# as sbuild's unshare mode (0.86 on): nothing of /sys/kernel, an empty read-only tmpfs
# (sys is the host's sysfs by now, not the tarball's)
run("mount", "-t", "tmpfs", "-o", "ro,nosuid,nodev,noexec,mode=0755", "none", root + "/sys/kernel")
mount_on("proc", "proc", "proc", 0)
for fd, mountpoint in a["binds"]:
    # the host directory by its path in this namespace, as mount(8) took it (the server's
    # descriptor is of the host's mount namespace: a bind from it is refused)
    mount_on(mountpoint, os.readlink(fd_path(fd)), None, MS_BIND)
    os.close(fd)
socket.sethostname("sbuild")
# The session's own network namespace, where the build runs: only lo, up.
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, struct.pack("16sH", b"lo", 0)))[1]
fcntl.ioctl(s, 0x8914, struct.pack("16sH", b"lo", flags | 1))
s.close()
# The tree becomes the root of the session's mount namespace and the host's root is
# detached from it: no process of the session, its root included, can reach a host path
# (a chroot leaves the host's root in the namespace, one chroot("x"), chdir("..")... away).
# pivot_root moves every process of the namespace whose root is the old one: init too.
os.chdir(root)
old_root = tempfile.mkdtemp(prefix=".sbuild-fast-old-root.", dir=root)
run("pivot_root", ".", old_root)
os.chdir("/")
old_root = "/" + os.path.basename(old_root)
if libc.umount2(old_root.encode(), 2) != 0:  # MNT_DETACH
    raise OSError(ctypes.get_errno(), "umount " + old_root)
os.rmdir(old_root)
with open("/proc/self/mountinfo") as f:
    if len([ln for ln in f if ln.split()[4] == "/"]) != 1:
        raise OSError(0, "the host's root is still mounted in the session")
# Written where nothing but the tree is left to reach, and by descriptors still: a link
# at etc/hosts or etc/resolv.conf is replaced by the file, never followed.
tree_write("/", "etc/hosts",
           "127.0.0.1 localhost\n127.0.1.1 sbuild\n::1 localhost ip6-localhost ip6-loopback\n")
tree_write("/", "etc/resolv.conf", a["resolv"])
# The offline commands' mount namespace: the session's, with an empty /etc/resolv.conf
# (sbuild's unshare mode gives the build without network none of the host's). A child
# keeps it; the server finds it as init's one child.
ready_r, ready_w = os.pipe()
if os.fork() == 0:
    try:
        if libc.unshare(0x00020000) != 0:  # CLONE_NEWNS
            raise OSError(ctypes.get_errno(), "unshare")
        cmount("none", "/", None, 0x4000 | 0x40000)  # MS_REC | MS_PRIVATE
        cmount("sbuild-fast", "/mnt", "tmpfs", 0, "mode=0755,size=16k")
        open("/mnt/resolv.conf", "w").close()
        cmount("/mnt/resolv.conf", "/etc/resolv.conf", None, 0x1000)  # MS_BIND
        libc.umount2(b"/mnt", 2)  # MNT_DETACH: the file stays bound
        os.write(ready_w, b"1")
    except OSError as exc:
        print("offline mount namespace: %s" % exc, file=sys.stderr, flush=True)
        os._exit(1)
    select.select([a["alive_fd"]], [], [])
    os._exit(0)
os.close(ready_w)
if os.read(ready_r, 1) != b"1":
    sys.exit(1)
print("ready", flush=True)
os.close(1)
os.open("/dev/null", os.O_WRONLY)
# The server holds the other end of this pipe: when it goes (closed, killed, or its
# parent sbuild killed with it), init exits, and the kernel kills the whole session.
# (unshare's --kill-child does not outlive --setuid: the credential change clears it.)
alive = select.poll()
alive.register(a["alive_fd"], select.POLLIN | select.POLLHUP)
while not alive.poll(1000):
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                break
        except ChildProcessError:
            break
"""
)


def read_handshake(fd: int, timeout: float, on_disk: Callable[[str], None]) -> bool:
    """init's lines until 'ready' (on_disk gets the on-disk tree it announces): whether
    it said ready before another line or its end of file; an Error when it says neither
    within timeout seconds."""
    deadline = time.monotonic() + timeout
    buffer = b""
    while True:
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            text = line.decode("utf-8", "replace").strip()
            if not text.startswith("disk "):
                return text == "ready"
            on_disk(text[5:])
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            raise Error(f"did not start within {timeout:g} s")
        chunk = os.read(fd, 4096)
        if not chunk:
            return False
        buffer += chunk


def subid_range(kind: str, user: str, root: Path = Path("/")) -> Tuple[int, int]:
    """The first line of /etc/subuid or /etc/subgid for user, as sbuild reads it."""
    try:
        text = (root / "etc" / kind).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise Error(f"cannot read /etc/{kind}: {exc.strerror}") from None
    for line in text.splitlines():
        fields = line.split(":")
        if len(fields) >= 3 and fields[0] == user:
            try:
                return int(fields[1]), int(fields[2])
            except ValueError:
                break
    raise Error(f"no subordinate ids for {user} in /etc/{kind}")


def meminfo(field: str, root: Path = Path("/")) -> int:
    """A field of /proc/meminfo in bytes (0 when unknown)."""
    try:
        for line in (root / "proc/meminfo").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def mem_available(root: Path = Path("/")) -> int:
    """MemAvailable from /proc/meminfo in bytes (0 when unknown)."""
    return meminfo("MemAvailable", root)


def tmpfs_size(total: int, setting: Optional[str] = None) -> int:
    """The session tmpfs's size= in bytes: TMPFS_SIZE_VAR (bytes, with K, M or G, or a
    percentage of RAM; 0: never a tmpfs), else a quarter of RAM, so that two builds
    at once leave half of it."""
    value = (os.environ.get(TMPFS_SIZE_VAR, "") if setting is None else setting).strip()
    if not value:
        return total // 4
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "%": 0}
    number, unit = (value[:-1], value[-1].lower()) if value[-1].lower() in units else (value, "")
    try:
        amount = int(number)
    except ValueError:
        raise Error(f"{TMPFS_SIZE_VAR}={value}: not a size (such as 4G or 25%)") from None
    if amount < 0 or (unit == "%" and amount > 100):
        raise Error(f"{TMPFS_SIZE_VAR}={value}: not a size (such as 4G or 25%)")
    return total * amount // 100 if unit == "%" else amount * units.get(unit, 1)


def use_tmpfs(tree_size: int, available: int, size: Optional[int] = None) -> bool:
    """Whether the unpacked tree goes to a tmpfs: with room for the build beside it, in
    memory and in the tmpfs's size."""
    needed = tree_size * TMPFS_FACTOR
    return available >= needed + TMPFS_RESERVE and (size is None or size >= needed)


def encode_argv(argv: Sequence[str]) -> str:
    """print-execute-command's answer: arguments joined by commas, each URL-quoted
    (sbuild splits on ',' and decodes %XX)."""
    return ",".join(urllib.parse.quote(arg, safe="") for arg in argv)


def unshare_argv() -> List[str]:
    """unshare as the session's root: the first subordinate ranges mapped from 0 (as
    sbuild's unshare mode maps them), uid 0 set before exec so that capabilities stay."""
    return ["unshare", "--map-auto", "--setuid=0", "--setgid=0"]


class Session:
    """One build's namespaces: open() unpacks and starts them, close() kills them."""

    def __init__(
        self, tarball: Path, user: str, binds: Sequence[Tuple[Path, str]], tmp_parent: Path
    ) -> None:
        self.tarball = tarball
        self.user = user
        self.binds = list(binds)
        self.tmp_parent = tmp_parent
        self.proc: Optional[subprocess.Popen] = None
        self.init_pid: Optional[int] = None
        # init's pidfd: close() kills init, never a process that took its pid since
        self.init_pidfd: Optional[int] = None
        self.offline_pid: Optional[int] = None
        self.mountpoint: Optional[Path] = None
        self.disk: Optional[str] = None
        self.errors: Optional[TextIO] = None
        self.announce = True  # a line on stderr (sbuild's log) when it unpacks
        self.handshake_timeout = HANDSHAKE_TIMEOUT
        self.alive_w: Optional[int] = None
        # init's namespaces and root, and the offline keeper's mount namespace and root,
        # held from open() to close(): what every command enters
        self.held: Dict[str, int] = {}

    def open(self) -> str:
        uid = subid_range("subuid", self.user)
        gid = subid_range("subgid", self.user)
        self._start()
        assert self.proc and self.proc.stdout and self.errors
        try:
            ready = read_handshake(
                self.proc.stdout.fileno(), self.handshake_timeout, self._note_disk
            )
        except Error as exc:
            self.close()
            raise Error(f"the session for {self.tarball} {exc}") from None
        if not ready:
            self.errors.seek(0)
            lines = [ln.strip() for ln in self.errors.read().splitlines() if ln.strip()]
            self.close()
            raise Error(
                f"the session for {self.tarball} did not start: "
                + (" ".join(lines[-2:]) or "no reason given")
            )
        self.init_pid = self._init_pid()
        self.offline_pid = self._offline_pid()
        self._check_maps(uid, gid)
        self._hold()
        return str(self.mountpoint)

    def _note_disk(self, path: str) -> None:
        self.disk = path

    def _open_fds(self, fds: List[int]) -> Tuple[int, List[Tuple[int, str]]]:
        """The tarball's and the bind mounts' sources' descriptors (added to fds)."""
        try:
            tar_fd = os.open(self.tarball, os.O_RDONLY | os.O_CLOEXEC)
            fds.append(tar_fd)
            bind_args = []
            for source, mountpoint in self.binds:
                fd = os.open(source, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                fds.append(fd)
                bind_args.append((fd, mountpoint))
        except OSError as exc:
            raise Error(f"cannot open {exc.filename}: {exc.strerror}") from None
        return tar_fd, bind_args

    def _start(self) -> None:
        """Start unshare and init (which unpacks the tree), with what init needs."""
        fds: List[int] = []
        try:
            tar_fd, bind_args = self._open_fds(fds)
            # the names carry this server's pid and start time: what it leaves when it is
            # killed is provably dead once no process has both (leftovers.py)
            tag = leftovers.own_tag()
            self.mountpoint = Path(
                tempfile.mkdtemp(
                    prefix=f"{leftovers.MOUNTPOINT_PREFIX}{tag}.", dir=self.tmp_parent
                )
            )
            # the namespace's root (a subordinate id) must reach it to mount on it
            os.chmod(self.mountpoint, 0o755)
            try:
                resolv = Path("/etc/resolv.conf").read_text()
            except OSError:
                resolv = "nameserver 127.0.0.53\n"  # systemd-resolved, as sbuild does
            size = tmpfs_size(meminfo("MemTotal"))
            tmpfs = use_tmpfs(os.fstat(tar_fd).st_size, mem_available(), size)
            # sbuild's log says where the chroot comes from, as in unshare mode
            if self.announce:
                print(
                    f"I: sbuild-fast session: unpacking {self.tarball} into "
                    + ("a tmpfs of the session" if tmpfs else "a directory on disk"),
                    file=sys.stderr,
                    flush=True,
                )
            args = {
                "root": str(self.mountpoint),
                "tmpfs": tmpfs,
                "tmpfs_size": size,
                "disk_parent": str(disk_parent()),
                "disk_prefix": f"{leftovers.DISK_PREFIX}{tag}.",
                "binds": bind_args,
                "tar_fd": tar_fd,
                "resolv": resolv,
            }
            # init lives while this end is open: closed by close(), or by the kernel when
            # this server dies, however it dies
            alive_r, self.alive_w = os.pipe()
            fds.append(alive_r)
            args["alive_fd"] = alive_r
            # unshare's and init's complaints: shown when the session does not start
            self.errors = tempfile.TemporaryFile(mode="w+")
            self.proc = subprocess.Popen(
                unshare_argv()
                + ["--mount", "--pid", "--uts", "--ipc", "--net", "--fork", "--kill-child"]
                + ["--", sys.executable, "-I", "-c", INIT, json.dumps(args)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=self.errors,
                pass_fds=fds,
                preexec_fn=_die_with_parent,
            )
        finally:
            for fd in fds:
                os.close(fd)

    def _check_maps(self, uid: Tuple[int, int], gid: Tuple[int, int]) -> None:
        """The ids sbuild's unshare mode maps: the package cache's files are theirs."""
        for kind, (start, count) in (("uid", uid), ("gid", gid)):
            mapped = Path(f"/proc/{self.init_pid}/{kind}_map").read_text().split()
            if mapped != ["0", str(start), str(count)]:
                self.close()
                raise Error(
                    f"unshare --map-auto mapped {' '.join(mapped)}, not 0 {start} {count} "
                    f"as sbuild's unshare mode does (first /etc/sub{kind} line of {self.user})"
                )

    def _init_pid(self) -> int:
        assert self.proc
        path = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        children = path.read_text().split()
        if len(children) != 1:
            self.close()
            raise Error(f"the session's init is not the one child of {self.proc.pid}")
        pid = int(children[0])
        try:
            self.init_pidfd = os.pidfd_open(pid)
        except OSError:
            pass
        # still unshare's (unreaped) child: the pidfd is init's, not a later process's
        if self.init_pidfd is None or path.read_text().split() != children:
            self.close()
            raise Error("the session's init died as it started")
        return pid

    def _offline_pid(self) -> int:
        """The child of init that keeps the offline commands' mount namespace."""
        assert self.init_pid
        children = Path(f"/proc/{self.init_pid}/task/{self.init_pid}/children").read_text()
        if len(children.split()) != 1:
            self.close()
            raise Error("the session's offline namespace keeper is not init's one child")
        return int(children.split()[0])

    def _hold(self) -> None:
        """Open init's namespaces and root and the offline keeper's mount namespace and
        root, and check that they are the session's (not this server's)."""
        keeper = {"mnt": self.offline_pid, "root": self.offline_pid}
        try:
            for name in (*NAMESPACES, "root"):
                for prefix, pid in (("", self.init_pid), ("offline-", keeper.get(name))):
                    if pid:
                        path = f"/proc/{pid}/root" if name == "root" else f"/proc/{pid}/ns/{name}"
                        flags = os.O_RDONLY | os.O_CLOEXEC
                        self.held[prefix + name] = os.open(path, flags)
        except OSError as exc:
            self.close()
            raise Error(f"cannot hold the session's namespaces: {exc}") from None
        for name in NAMESPACES:
            if same_file(self.held[name], f"/proc/{os.getpid()}/ns/{name}"):
                self.close()
                raise Error(f"the session's init is not in a {name} namespace of its own")

    def nsenter_options(self, offline: bool) -> List[str]:
        """nsenter's options into the session (offline: the build's network namespace and
        mount namespace), by the paths of the descriptors this server holds."""
        fds = dict(self.held)
        if offline:
            fds["mnt"], fds["root"] = fds["offline-mnt"], fds["offline-root"]
        names = [n for n in NAMESPACES if offline or n != "net"]
        here = f"/proc/{os.getpid()}/fd"
        return [f"--{NSENTER_OPTION.get(n, n)}={here}/{fds[n]}" for n in names] + [
            f"--wd={here}/{fds['root']}"
        ]

    def exec_argv(self) -> List[str]:
        return [
            "/bin/sh",
            "-c",
            EXEC_SCRIPT,
            "sbuild-fast-session",
            " ".join(self.nsenter_options(False)),
            " ".join(self.nsenter_options(True)),
        ]

    def release(self) -> None:
        """Close the held descriptors: no command can enter the session any more."""
        for fd in self.held.values():
            os.close(fd)
        self.held = {}

    def close(self) -> None:
        """Kill pid 1 of the session (the kernel then kills every process in it), wait for
        it, and remove what is left on the host."""
        self.release()
        if self.alive_w is not None:
            os.close(self.alive_w)
            self.alive_w = None
        if self.proc is not None:
            with _suppress_missing():
                if self.init_pidfd is not None:
                    signal.pidfd_send_signal(self.init_pidfd, signal.SIGKILL)
                else:
                    self.proc.kill()  # --kill-child passes it on
            self.proc.wait()
            if self.init_pidfd is not None:
                os.close(self.init_pidfd)
                self.init_pidfd = None
            if self.proc.stdout:
                self.proc.stdout.close()
            self.proc = None
            self.init_pid = None
            self.offline_pid = None
        if self.errors:
            self.errors.close()
            self.errors = None
        if self.disk:
            # The on-disk tree is the subordinate ids': removed by their root, as sbuild does.
            subprocess.run([*unshare_argv(), "rm", "-rf", "--", self.disk], check=False)
            self.disk = None
        if self.mountpoint:
            with _suppress_missing():
                self.mountpoint.rmdir()
            self.mountpoint = None


def same_file(fd: int, path: str) -> bool:
    """Whether fd and path are the same file (the same namespace)."""
    mine, other = os.fstat(fd), os.stat(path)
    return (mine.st_dev, mine.st_ino) == (other.st_dev, other.st_ino)


class _suppress_missing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, value, tb) -> bool:
        return kind is not None and issubclass(kind, (ProcessLookupError, FileNotFoundError))


def _die_with_parent() -> None:
    """unshare gets SIGKILL when this server dies; --kill-child passes it on to init."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def serve(session: Session, stdin: TextIO, stdout: TextIO) -> int:
    """The autopkgtest virt server protocol, as sbuild's ChrootAutopkgtest.pm speaks it."""

    def say(text: str) -> None:
        stdout.write(text + "\n")
        stdout.flush()

    say("ok")
    opened = False
    try:
        for raw in stdin:
            words = raw.split()
            if not words:
                continue
            command = words[0]
            if command == "open" and not opened:
                try:
                    say("ok " + session.open())
                    opened = True
                except Error as exc:
                    say(f"error {exc}")
            elif command == "capabilities":
                say("ok root-on-testbed isolation-container")
            elif command == "print-execute-command" and opened:
                say("ok " + encode_argv(session.exec_argv()))
            elif command == "close" and opened:
                session.close()
                opened = False
                say("ok")
            elif command == "quit":
                session.close()
                return 0
            else:
                say(f"error unsupported command {command}")
    finally:
        session.close()
    return 0


def timed_command_cost(argv: Sequence[str], runs: int = 10) -> float:
    """Median wall time of running 'true' through argv (seconds)."""
    times = []
    for _ in range(runs):
        start = time.monotonic()
        subprocess.run([*argv, "true"], check=True, stdin=subprocess.DEVNULL)
        times.append(time.monotonic() - start)
    times.sort()
    return times[len(times) // 2]


def self_test(session: "Session") -> float:
    """Start session, check what makes it as safe as unshare mode (the build's network
    namespace holds only lo; commands run as the namespace's root; close leaves no process),
    and return the median seconds a command costs through it."""
    session.announce = False
    try:
        session.open()
        argv = session.exec_argv()
        count = ["sh", "-c", "grep -c : /proc/net/dev"]
        offline = subprocess.run(
            [*argv, *count, "dpkg-buildpackage"], capture_output=True, text=True
        )
        if offline.returncode != 0 or offline.stdout.strip() != "1":
            raise Error("the session's build would not be cut off the network")
        _check_hardening(argv)
        who = subprocess.run([*argv, "id", "-u"], capture_output=True, text=True)
        if who.stdout.strip() != "0":
            raise Error("commands in the session do not run as its root")
        # sbuild's autopkgtest mode adds its build user inside the chroot
        tools = subprocess.run(
            [*argv, "test", "-x", "/usr/sbin/groupadd", "-a", "-x", "/usr/sbin/useradd"]
        )
        if tools.returncode != 0:
            raise Error(
                "the chroot has no groupadd and useradd (passwd): "
                "run 'sbuild-fast update --recreate'"
            )
        # a process a command leaves behind dies with it (a pid namespace per command)
        subprocess.run(
            [*argv, "sh", "-c", "setsid sleep 600 </dev/null >/dev/null 2>&1 &"], check=False
        )
        init = session.init_pid
        if Path(f"/proc/{init}/task/{init}/children").read_text().split() != [
            str(session.offline_pid)
        ]:
            raise Error("a process left behind by a command outlived it")
        _check_per_command(session, argv)
        cost = timed_command_cost(argv)
        # the tree goes on disk where memory is short at a build: that must work too
        check_disk_parent(disk_parent())
        _check_dead_init(session, argv)
    finally:
        session.close()
    if init and Path(f"/proc/{init}").exists():
        raise Error("the session's init outlived its close")
    return cost


# What a command sees of its own namespaces: its hostname, what /dev/shm holds (after it
# leaves a file there) and its ipc, uts and mount namespaces.
PER_COMMAND_PROBE = (
    "cat /proc/sys/kernel/hostname; ls -A /dev/shm | wc -l; : > /dev/shm/sbuild-fast-probe; "
    "readlink /proc/self/ns/ipc /proc/self/ns/uts /proc/self/ns/mnt"
)


def _check_per_command(session: "Session", argv: Sequence[str]) -> None:
    """Each command gets, as in sbuild's unshare mode, an ipc, uts and mount namespace of
    its own, hostname sbuild and an empty /dev/shm: nothing it leaves there reaches the
    next command."""
    held = [f"{n}:[{os.fstat(session.held[n]).st_ino}]" for n in ("ipc", "uts", "mnt")]
    for _ in range(2):
        out = subprocess.run(
            [*argv, "sh", "-c", PER_COMMAND_PROBE], capture_output=True, text=True
        )
        lines = out.stdout.split()
        if out.returncode != 0 or len(lines) != 5 or lines[:2] != ["sbuild", "0"]:
            raise Error(
                "a command in the session does not get hostname sbuild and an empty "
                "/dev/shm of its own: " + " ".join(lines or out.stderr.split()[-8:])
            )
        if any(a == b for a, b in zip(lines[2:], held)):
            raise Error("a command shares the session's ipc, uts or mount namespace")


def _check_dead_init(session: "Session", argv: Sequence[str]) -> None:
    """Once the session's init is dead, a command fails and runs nothing (the argv
    enters held namespaces, never a pid that another process may have taken)."""
    assert session.proc and session.init_pidfd is not None
    signal.pidfd_send_signal(session.init_pidfd, signal.SIGKILL)
    session.proc.wait(timeout=30)  # unshare returns once init is gone
    ran = subprocess.run([*argv, "echo", "sbuild-fast-ran"], capture_output=True, text=True)
    if ran.returncode == 0 or "sbuild-fast-ran" in ran.stdout:
        raise Error("a command ran after the session's init died")


def _check_hardening(argv: Sequence[str]) -> None:
    """What sbuild 0.86 and later add to unshare mode: /sys/kernel empty, ::1 in
    /etc/hosts, no resolv.conf for the build without network."""
    probe = (
        "ls -A /sys/kernel | wc -l; wc -c < /etc/resolv.conf; "
        "grep -cx '::1 localhost ip6-localhost ip6-loopback' /etc/hosts"
    )
    out = subprocess.run(
        [*argv, "sh", "-c", probe, "dpkg-buildpackage"], capture_output=True, text=True
    ).stdout.split()
    if out != ["0", "0", "1"]:
        raise Error(
            "the session's build does not see what unshare mode shows it "
            "(an empty /sys/kernel, no resolv.conf, ::1 in /etc/hosts): " + " ".join(out)
        )


class Source:
    """What a session unpacks: an sbuild-fast chroot's tarball (state: its record), or the
    tarball sbuild's unshare mode would find (state None)."""

    def __init__(self, name: str, tarball: Path, state: Optional[Dict]) -> None:
        self.name, self.tarball, self.state = name, tarball, state


def choose_source(
    dist: str,
    arch: str,
    build_arch: str,
    state_of: Callable[[str], Optional[Dict]],
    tarball_of: Callable[[str], Optional[Path]],
    cache_dir: Path,
) -> Source:
    """The chroot a session serves for sbuild's %r (dist) and %a (arch, the host
    architecture): the sbuild-fast chroot DIST-ARCH; for a cross build without it, DIST-
    BUILD_ARCH (sbuild's unshare mode picks the chroot by BUILD_ARCH); with no sbuild-fast
    chroot of either, the tarball unshare mode finds for DIST-BUILD_ARCH (then DIST-ARCH:
    sbuild --arch sets both) in cache_dir; else one error naming what was looked for."""
    names = [f"{dist}-{arch}"] + ([f"{dist}-{build_arch}"] if build_arch != arch else [])
    for name in names:
        state = state_of(name)
        if state is not None and state.get("mode") == "unshare" and state.get("path"):
            return Source(name, Path(state["path"]), state)
    for name in reversed(names):
        tarball = tarball_of(name)
        if tarball is not None:
            return Source(name, tarball, None)
    wanted = " or ".join(names)
    files = " or ".join(f"{n}.t*" for n in reversed(names))
    raise Error(
        f"no sbuild-fast chroot {wanted} and no {files} in {cache_dir}: "
        f"run 'sbuild-fast create --dist {dist}'"
    )


def default_binds(state: Dict, cache_dir: Path) -> List[Tuple[Path, str]]:
    if state.get("cache", True) and cache_dir.is_dir():
        return [(cache_dir, CACHE_MOUNTPOINT)]
    return []


def foreign_binds(binds: List[Tuple[Path, str]], cache_dir: Path) -> List[Tuple[Path, str]]:
    """The bind mounts for a tarball of sbuild's own (not sbuild-fast's): those its unshare
    mode makes, without sbuild-fast's package cache (cache_dir), which the block adds for
    sbuild-fast's chroots: such a tarball's apt does not take turns on the cache, and two
    of its builds at once would fail on apt's lock."""
    return [
        (directory, mountpoint)
        for directory, mountpoint in binds
        if not (mountpoint == CACHE_MOUNTPOINT and Path(directory) == cache_dir)
    ]


def reachable_by_others(path: Path) -> bool:
    """Whether every directory from / to path lets others search it: the session's root
    is a subordinate id, an other to every directory of the host (pam_tmpdir's and
    $XDG_RUNTIME_DIR's parents are 0700)."""
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError):
        return False
    for directory in (real, *real.parents):
        try:
            info = os.stat(directory)
        except OSError:
            return False
        if not stat.S_ISDIR(info.st_mode) or not info.st_mode & stat.S_IXOTH:
            return False
    return True


def _tmpdir_candidates(fallback: str) -> List[Path]:
    return [Path(c) for c in (os.environ.get("TMPDIR"), fallback) if c]


def mountpoint_parent() -> Path:
    """Where the mount point of a session goes (made by this server, mounted on by the
    session's root): TMPDIR where the session's root can reach it, else /tmp."""
    for candidate in _tmpdir_candidates("/tmp"):
        if reachable_by_others(candidate) and os.access(candidate, os.W_OK):
            return candidate
    return Path("/tmp")


def disk_parent() -> Path:
    """Where the on-disk tree goes (made by the session's root): TMPDIR where others may
    reach it and write to it (sticky, as /var/tmp), else /var/tmp."""
    for candidate in _tmpdir_candidates("/var/tmp"):
        if reachable_by_others(candidate):
            mode = os.stat(candidate).st_mode
            if mode & stat.S_IWOTH and mode & stat.S_ISVTX:
                return candidate
    return Path("/var/tmp")


def check_disk_parent(parent: Path) -> None:
    """Make and remove a directory in parent as the session's root does for an on-disk
    tree: one clear error where that fails, rather than a failed build later."""
    probe = subprocess.run(
        [
            *unshare_argv(),
            "sh",
            "-c",
            'd=$(mktemp -d -p "$1" sbuild-fast-probe.XXXXXX) && rmdir "$d"',
            "sh",
            str(parent),
        ],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        raise Error(
            f"the session's root cannot make its on-disk tree in {parent}: "
            + (probe.stderr.strip().splitlines() or ["no reason given"])[-1]
        )


def serve_dist(dist: str, arch: Optional[str], native: str) -> int:
    """Speak the autopkgtest virt server protocol on stdin/stdout for one sbuild run of
    dist (arch: sbuild's host architecture, None for native, the host's)."""
    dist = sbs.validate_dist(dist)
    arch = sbs.validate_arch(arch or native)
    cache_dir = sbs.user_cache_dir()
    view: List = []  # sbuild's BUILD_ARCH and bind mounts, read once when needed

    def unshare_view() -> Tuple[Optional[str], List[Tuple[Path, str]]]:
        if not view:
            view.append(sbs.sbuild_unshare_view())
        return view[0]

    def state_of(name: str) -> Optional[Dict]:
        path = cache_dir / sbs.STATE_SUBDIR / f"{name}.json"
        return sbs.load_state(path) if path.exists() else None

    build_arch = native
    if arch != native and state_of(sbs.chroot_name(dist, arch)) is None:
        build_arch = unshare_view()[0] or native
    source = choose_source(
        dist,
        arch,
        build_arch,
        state_of,
        lambda name: sbs.find_unshare_tarball(cache_dir, name),
        cache_dir,
    )
    if source.state is not None:
        binds = default_binds(source.state, sbs.package_cache_dir("unshare"))
    else:
        # a tarball of sbuild's own: mounted as its unshare mode mounts it, without
        # sbuild-fast's package cache (as for a chroot named on sbuild's command line)
        binds = foreign_binds(unshare_view()[1], sbs.package_cache_dir("unshare"))
    user = pwd.getpwuid(os.getuid()).pw_name
    leftovers.clean_mine(False)
    session = Session(source.tarball, user, binds, mountpoint_parent())
    return serve(session, sys.stdin, sys.stdout)


__all__ = ["Session", "serve", "encode_argv", "subid_range", "use_tmpfs", "shutil", "serve_dist"]
