"""journal-acl-setup: the journal directory and the files apply writes, on disk: paths kept inside an
image, the journal opened by descriptor, writability checks and the lock."""

from __future__ import annotations  # annotations stay text: typing is never imported

import contextlib
import errno
import os
import pwd
import stat
from pathlib import Path

from debadmin import fsutil
from debadmin.errors import Error
from debadmin.journal_acl_setup import walk as walker

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from typing import Any, Optional, Set


JOURNAL_DIR = "var/log/journal"


DEFAULTS_FILE = "etc/default/journal-acl-setup"


TMPFILES_DROPIN = "etc/tmpfiles.d/journal-acl-setup.conf"


JOURNALD_BINARIES = ("usr/lib/systemd/systemd-journald", "lib/systemd/systemd-journald")


JOURNALD_CONF_DIRS = ("etc", "run", "usr/local/lib", "usr/lib", "lib")


# systemd >= 256 reads the main journald.conf from the first of these; older ones only /etc.
MAIN_CONF_DIRS = ("etc", "run", "usr/local/lib", "usr/lib")


MAIN_CONF_SINCE = 256


SYSTEMD_SHARED_DIRS = ("usr/lib/systemd", "lib/systemd", "usr/lib/*/systemd")


# Owners whose files under the journal get ACLs, besides root: journald's own files are
# root's, systemd-journal-remote's (and upload's, gateway's) are theirs.
JOURNAL_USERS = ("systemd-journal-remote", "systemd-journal-upload", "systemd-journal-gateway")


EXPECTED_MODE = 0o2755


def acl_state() -> Any:
    """The state module, imported by apply and revert only: sqlite3 is a start-up
    cost check has no use for."""
    from debadmin.journal_acl_setup import state

    return state


def contained(root: Path, relative: str) -> Path:
    """ROOT/relative; in an image, refuse a path whose symbolic links lead out of it.

    The walk, mkdir and the drop-in writes would otherwise act on the host: an image's
    var/log -> /srv/log (absolute, meant inside the image) resolves to the host's /srv/log.
    """
    path = root / relative
    if root == Path("/"):
        return path
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    if os.path.commonpath([real_root, real]) != real_root:
        raise Error(
            f"{path} resolves to {real}, outside {root}: refusing to follow a symbolic "
            "link out of the image"
        )
    return path


def check_paths(root: Path) -> None:
    """Refuse, before reading or changing anything, paths that escape the image: the
    journal, the files apply writes, its state, and journald's configuration (a linked
    journald.conf.d would otherwise be read from the host)."""
    relatives = [JOURNAL_DIR, TMPFILES_DROPIN, DEFAULTS_FILE, "var/lib/journal-acl-setup"]
    for directory in JOURNALD_CONF_DIRS:
        relatives += [f"{directory}/systemd/journald.conf", f"{directory}/systemd/journald.conf.d"]
    for relative in relatives:
        contained(root, relative)


def journal_uids(root: Path = Path("/")) -> Set[int]:
    """The owners whose files under the journal get ACLs: root and the journal's users."""
    uids = {0}
    if root == Path("/"):
        for name in JOURNAL_USERS:
            try:
                uids.add(pwd.getpwnam(name).pw_uid)
            except KeyError:
                pass
        return uids
    try:
        text = (root / "etc/passwd").read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return uids
    except OSError as exc:
        raise Error(f"cannot read {root / 'etc/passwd'}: {exc.strerror}") from None
    for line in text.splitlines():
        fields = line.split(":")
        if len(fields) >= 3 and fields[0] in JOURNAL_USERS and fields[2].isdigit():
            uids.add(int(fields[2]))
    return uids


def open_journal(journal: Path) -> Optional[int]:
    """A descriptor of the journal directory, None when it does not exist.

    A symbolic link there is followed as journald and systemd-tmpfiles follow it, but
    only when the link and the directory it leads to are root's: anyone else could
    point it anywhere.
    """
    try:
        st = os.lstat(journal)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise Error(f"cannot read {journal}: {exc.strerror}") from None
    if stat.S_ISLNK(st.st_mode):
        target = os.readlink(journal)
        if st.st_uid != 0:
            raise Error(
                f"{journal} is a symbolic link (to {target}) owned by uid {st.st_uid}, "
                "not root: refusing to follow it"
            )
        fd = open_link_target(journal, target)
        owner = os.fstat(fd).st_uid
        if owner != 0:
            os.close(fd)
            raise Error(
                f"{journal} is a symbolic link to {target}, a directory owned by uid "
                f"{owner}, not root: refusing to follow it"
            )
        return fd
    if not stat.S_ISDIR(st.st_mode):
        raise Error(f"{journal} exists but is not a directory")
    try:
        return os.open(journal, walker.O_DIR)
    except OSError as exc:
        raise Error(f"cannot open {journal}: {exc.strerror}") from None


def require_magic_links(fd: int, directory: Path) -> None:
    """Refuse, before any change, where default ACLs cannot be set by descriptor."""
    if not walker.magic_links_work(fd):
        raise Error(
            f"{walker.magic_link(fd)} does not lead to the open {directory} (is /proc "
            "mounted?): default ACLs are set through it, never by name; nothing changed"
        )


def open_link_target(link: Path, target: str) -> int:
    """Open the directory a root-owned link names, one component at a time.

    Every directory passed through must be root's and writable by root alone: the
    owner of one could otherwise swap the next name (for a link to /etc) between the
    open and any check.  A link along the way is refused rather than followed.
    """
    start = "/" if target.startswith("/") else str(link.parent)
    try:
        fd = os.open(start, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise Error(f"cannot open {start}: {exc.strerror}") from None
    where = start
    try:
        for part in [p for p in target.split("/") if p not in ("", ".")]:
            st = os.fstat(fd)
            if st.st_uid != 0 or st.st_mode & 0o022:
                mode = stat.S_IMODE(st.st_mode)
                raise Error(
                    f"{link} is a symbolic link to {target}, through {where}, which is not "
                    f"root's alone (owner uid {st.st_uid}, mode {mode:04o}): refusing to "
                    "follow it"
                )
            try:
                new = os.open(part, walker.O_DIR, dir_fd=fd)
            except FileNotFoundError:
                raise Error(f"{link} is a symbolic link to {target}, which does not exist")
            except OSError as exc:
                reason = exc.strerror
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    with contextlib.suppress(OSError):
                        if stat.S_ISLNK(os.lstat(part, dir_fd=fd).st_mode):
                            reason = "another symbolic link, not followed"
                raise Error(
                    f"cannot follow {link} (a link to {target}): {where}/{part}: {reason}"
                ) from None
            os.close(fd)
            fd, where = new, f"{where.rstrip('/')}/{part}"
    except BaseException:
        os.close(fd)
        raise
    return fd


def systemd_running(root: Path) -> bool:
    """True when we act on the running system and it was booted with systemd."""
    return root == Path("/") and os.path.isdir("/run/systemd/system")


def writable(directory: Path) -> None:
    """Raise unless files can be created in directory or, if it is missing, where it goes."""
    probe = directory
    while not os.path.lexists(probe) and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise Error(f"{probe} is not a directory")
    if not os.access(probe, os.W_OK):
        try:
            readonly = bool(os.statvfs(probe).f_flag & os.ST_RDONLY)
        except OSError:
            readonly = False
        reason = "read-only file system" if readonly else "permission denied"
        raise Error(f"cannot write in {probe}: {reason}")


def probe_acl_support(directory: Path) -> None:
    """Set an ACL on a scratch file in directory; raise a clear error where that fails."""
    import tempfile  # only apply needs it: a start-up cost check and the no-op apply skip

    try:
        fd, scratch = tempfile.mkstemp(prefix=".journal-acl-setup-probe.", dir=directory)
    except OSError as exc:
        raise Error(f"cannot write in {directory}: {exc.strerror}") from None
    try:
        walker.to_acl(walker.granted(walker.from_mode(0o600), 0, walker.R)).applyto(fd)
    except OSError:
        raise Error(
            f"the filesystem holding {directory} does not support POSIX ACLs; "
            "mount it with ACL support, or add the users to group systemd-journal instead"
        ) from None
    finally:
        os.close(fd)
        os.unlink(scratch)


def not_read_only(path: Path) -> None:
    """Raise where path is on a read-only filesystem: no ACL could be set there."""
    try:
        readonly = bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError as exc:
        raise Error(f"cannot read {path}: {exc.strerror}") from None
    if readonly:
        raise Error(f"{path} is on a read-only file system: nothing changed")


def lock_path(root: Path) -> Path:
    """One lock for apply, revert, the postinst and the boot service."""
    if root == Path("/"):
        # A directory of its own: the boot unit's RuntimeDirectory=, writable there
        # although ProtectSystem=strict makes the rest of /run read-only.
        return Path("/run/journal-acl-setup/lock")
    return root / acl_state().STATE_DIR / "lock"


@contextlib.contextmanager
def locked(root: Path, dry_run: bool) -> Any:
    """The tool's lock file, and a lock on the journal's parent directory itself (its
    inode, however the root is spelt: --root //, or a container's tree from the host
    while the container runs its own apply).  Nothing with --dry-run: it writes
    nothing, a lock file included."""
    if dry_run:
        yield
        return
    path = lock_path(root)
    writable(path.parent)
    fsutil.make_dirs(path.parent)
    with fsutil.locked(path):
        parent = contained(root, JOURNAL_DIR).parent
        try:
            fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            fd = -1  # no /var/log: apply says so, revert has nothing to do
        try:
            if fd >= 0:
                import fcntl

                fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            if fd >= 0:
                os.close(fd)


def write_file(path: Path, text: str) -> None:
    fsutil.make_dirs(path.parent)
    fsutil.atomic_write(path, text)
