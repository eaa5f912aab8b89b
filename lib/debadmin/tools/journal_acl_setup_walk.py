"""journal-acl-setup: POSIX ACLs read and written on descriptors, and a walk that cannot be
redirected.

Every directory is opened relative to its parent's descriptor with O_NOFOLLOW, every file
too, and ACLs are read and set on those descriptors with python3-pylibacl (posix1e).  A
name swapped for a symbolic link between the directory read and the open fails with ELOOP
instead of leading elsewhere; a directory renamed away while it is walked is still the
directory that was opened.

A directory's default ACL is read and set through its descriptor's magic link,
/proc/self/fd/N: libacl's acl_get_file/acl_set_file (posix1e.ACL(filedef=...) and
applyto(path, ACL_TYPE_DEFAULT)) take a path only, and the kernel resolves that link to
the open inode itself, with no name lookup an attacker could redirect.  applyto(fd,
ACL_TYPE_DEFAULT) is no way round it: pylibacl 0.7 ignores the type for a descriptor and
sets the access ACL instead.
"""

from __future__ import annotations  # annotations stay text: no typing work at start-up

import errno
import os
import stat
from typing import Dict, Iterator, List, Optional, Set, Tuple

import posix1e

USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER = (
    posix1e.ACL_USER_OBJ,
    posix1e.ACL_USER,
    posix1e.ACL_GROUP_OBJ,
    posix1e.ACL_GROUP,
    posix1e.ACL_MASK,
    posix1e.ACL_OTHER,
)
UNDEFINED = 0xFFFFFFFF  # the id of an entry that names no user or group
R, W, X = posix1e.ACL_READ, posix1e.ACL_WRITE, posix1e.ACL_EXECUTE
# Numeric ids: the text is a cache key and must not depend on (or wait for) NSS.
TEXT_OPTIONS = posix1e.TEXT_NUMERIC_IDS | posix1e.TEXT_ABBREVIATE

ACCESS_XATTR, DEFAULT_XATTR = "system.posix_acl_access", "system.posix_acl_default"
O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
O_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
MAX_DEPTH = 32

Entries = Dict[Tuple[int, int], int]  # (tag, id) -> rwx bits


class AclError(Exception):
    """An ACL that cannot be read or written (the caller turns it into an Error)."""


def entries(acl: posix1e.ACL) -> Optional[Entries]:
    """The entries of an ACL as (tag, id) -> rwx bits; None for an empty (default) ACL."""
    result: Entries = {}
    for entry in acl:
        tag = entry.tag_type
        perms = entry.permset
        result[(tag, entry.qualifier if tag in (USER, GROUP) else UNDEFINED)] = (
            (R if perms.read else 0) | (W if perms.write else 0) | (X if perms.execute else 0)
        )
    return result or None


def to_acl(items: Entries) -> posix1e.ACL:
    """A posix1e.ACL holding items (libacl orders them as the kernel wants)."""
    acl = posix1e.ACL()
    for (tag, ident), perm in items.items():
        entry = acl.append()
        entry.tag_type = tag
        if tag in (USER, GROUP):
            entry.qualifier = ident
        entry.permset.read = bool(perm & R)
        entry.permset.write = bool(perm & W)
        entry.permset.execute = bool(perm & X)
    return acl


def text(acl: Optional[posix1e.ACL]) -> bytes:
    """The ACL's short text with numeric ids (b"" for none): what the verdict cache keys on."""
    return b"" if acl is None else acl.to_any_text(options=TEXT_OPTIONS, separator=b",")


def from_mode(mode: int) -> Entries:
    """The minimal ACL a file without an access ACL has: its permission bits."""
    return {
        (USER_OBJ, UNDEFINED): (mode >> 6) & 7,
        (GROUP_OBJ, UNDEFINED): (mode >> 3) & 7,
        (OTHER, UNDEFINED): mode & 7,
    }


def magic_link(fd: int) -> str:
    """The path by which libacl reaches the inode open as fd, and nothing else."""
    return f"/proc/self/fd/{fd}"


def magic_links_work(fd: int) -> bool:
    """Whether magic_link(fd) leads to the inode open as fd: not where /proc is not
    mounted (a chroot, an image being built), nor where something else sits there."""
    try:
        link, st = os.stat(magic_link(fd)), os.fstat(fd)
    except OSError:
        return False
    return (link.st_dev, link.st_ino) == (st.st_dev, st.st_ino)


def _proc_hint(exc: OSError) -> str:
    if exc.errno == errno.ENOENT and not os.path.isdir("/proc/self/fd"):
        return f"{exc.strerror} (is /proc mounted?)"
    return str(exc.strerror)


def shown(path: str) -> str:
    """path as one printable line for a message: control characters (a newline in a name
    could fake a line of the report) and undecodable bytes (surrogateescape, which a strict
    UTF-8 stdout cannot write) as \\xNN or \\uNNNN escapes; the finding's subject keeps
    the exact name."""
    if path.isprintable():
        return path
    out = []
    for char in path:
        code = ord(char)
        if char.isprintable():
            out.append(char)
        elif 0xDC80 <= code <= 0xDCFF:
            out.append(f"\\x{code - 0xDC00:02x}")
        elif code < 0x100:
            out.append(f"\\x{code:02x}")
        else:
            out.append(f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    return "".join(out)


def perms_text(perm: int) -> str:
    return "".join(c if perm & bit else "-" for c, bit in (("r", R), ("w", W), ("x", X)))


class Node:
    """A directory or regular file under the journal, open as fd while it is visited."""

    __slots__ = ("path", "fd", "st", "is_dir")

    def __init__(self, path: str, fd: int, st: os.stat_result, is_dir: bool) -> None:
        self.path, self.fd, self.st, self.is_dir = path, fd, st, is_dir

    def read(self) -> Tuple[posix1e.ACL, Optional[posix1e.ACL]]:
        """The access ACL (from the mode where there is none) and, for a directory, the
        default ACL (empty where there is none), read on the descriptor."""
        try:
            access = posix1e.ACL(fd=self.fd)
        except OSError as exc:
            if exc.errno != errno.EOPNOTSUPP:
                raise AclError(f"cannot read the ACL: {exc.strerror}") from None
            access = posix1e.ACL(mode=self.st.st_mode)  # no ACL support: the mode is all
        if not self.is_dir:
            return access, None
        try:
            return access, posix1e.ACL(filedef=magic_link(self.fd))
        except OSError as exc:
            if exc.errno != errno.EOPNOTSUPP:
                raise AclError(f"cannot read the default ACL: {_proc_hint(exc)}") from None
            return access, None

    def raw(self) -> Tuple[bytes, bytes]:
        """The access and default ACL attributes as the kernel keeps them (b"" for none):
        a cache key two system calls cheap, where libacl's parse and text cost more."""
        try:
            access = os.getxattr(self.fd, ACCESS_XATTR)
        except OSError as exc:
            if exc.errno not in (errno.ENODATA, errno.EOPNOTSUPP):
                raise AclError(f"cannot read the ACL: {exc.strerror}") from None
            access = b""
        if not self.is_dir:
            return access, b""
        try:
            return access, os.getxattr(magic_link(self.fd), DEFAULT_XATTR)
        except OSError as exc:
            if exc.errno not in (errno.ENODATA, errno.EOPNOTSUPP):
                raise AclError(f"cannot read the default ACL: {_proc_hint(exc)}") from None
            return access, b""

    def acls(self) -> Tuple[Entries, Optional[Entries]]:
        """The access and default ACLs as entries (default None where there is none)."""
        access, default = self.read()
        return entries(access) or from_mode(self.st.st_mode), (
            entries(default) if default is not None else None
        )

    def set_acls(self, access: Optional[Entries], default: Optional[Entries]) -> None:
        """Write the ACLs given (None: leave that one alone), on the descriptor."""
        try:
            if access is not None:
                to_acl(access).applyto(self.fd)
            if default is not None and self.is_dir:
                to_acl(default).applyto(magic_link(self.fd), posix1e.ACL_TYPE_DEFAULT)
        except OSError as exc:
            raise AclError(
                f"cannot set the ACL of {shown(self.path)}: {_proc_hint(exc)}"
            ) from None


def group_can(entries: Optional[Entries], owner_gid: int, gid: int, want: int, default=False):
    """Whether a member of gid (and of no other group) gets every permission in want.

    The POSIX ACL check: the owning group and a named entry for gid both match; access
    is granted if a matching entry, masked, grants it; a process matching any group entry
    never falls through to 'other'.  For a default ACL only a matching group entry counts:
    its 'other' entry is masked by the creation mode, and journald creates files 0640.
    """
    if entries is None:
        return False
    mask = entries.get((MASK, UNDEFINED), 7)
    matching = []
    if owner_gid == gid:
        matching.append(entries.get((GROUP_OBJ, UNDEFINED), 0))
    if (GROUP, gid) in entries:
        matching.append(entries[(GROUP, gid)])
    if matching:
        return any(perm & mask & want == want for perm in matching)
    if default:
        return False
    return entries.get((OTHER, UNDEFINED), 0) & want == want


def _group_class(entries: Entries) -> int:
    perm = 0
    for (tag, _), value in entries.items():
        if tag in (USER, GROUP_OBJ, GROUP):
            perm |= value
    return perm


def granted(entries: Entries, gid: int, want: int) -> Entries:
    """entries plus a named entry giving gid want, the mask widened by want and no more.

    As setfacl -n: an existing mask is kept, only the bits the new entry needs are
    added to it, so a 0640 journal file keeps its r-- mask (setfacl's recalculation
    would make it r-x from adm's inherited r-x entry).  An ACL without a mask gets one
    covering its group class, as the kernel requires once it holds a named entry.
    """
    result = dict(entries)
    result[(GROUP, gid)] = result.get((GROUP, gid), 0) | want
    mask = result.get((MASK, UNDEFINED))
    result[(MASK, UNDEFINED)] = (_group_class(entries) if mask is None else mask) | want
    return result


def default_base(access: Entries) -> Entries:
    """A new default ACL starts from the directory's owner, group and other entries."""
    return {k: v for k, v in access.items() if k[0] in (USER_OBJ, GROUP_OBJ, OTHER)}


def without(entries: Optional[Entries], gids: Set[int]) -> Optional[Entries]:
    """entries without named entries for gids (the mask kept); None if nothing changes."""
    if entries is None or not any((GROUP, g) in entries for g in gids):
        return None
    return {k: v for k, v in entries.items() if not (k[0] == GROUP and k[1] in gids)}


# --- the walk --------------------------------------------------------------------------------


class Skip:
    """Something the walk did not visit: code, path, why; action: the tree could not be
    read as it is (a race), rather than left alone on purpose."""

    __slots__ = ("code", "path", "message", "action")

    def __init__(self, code: str, path: str, message: str, action: bool = False) -> None:
        self.code, self.path, self.message, self.action = code, path, message, action


def mount_id(fd: int) -> Optional[int]:
    """The id of the mount fd is on, from /proc/self/fdinfo (None where /proc is missing):
    a bind mount of the same filesystem has the same st_dev, but not the same mount."""
    try:
        with open(f"/proc/self/fdinfo/{fd}", "rb") as info:
            for line in info:
                if line.startswith(b"mnt_id:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def walk(top_fd: int, top_path: str, allowed_uids: Set[int], skips: List[Skip]) -> Iterator[Node]:
    """Yield top and every directory and regular file under it, each open while yielded.

    Never follows a symbolic link; skips (into skips) what is not a directory or regular
    file, what is not owned by one of allowed_uids, a file with more than one link, a
    name whose type changed between reading the directory and opening it, and a directory
    on another mount than top (a filesystem mounted below it, a bind mount, which could
    bring a directory from outside the journal or top itself, a loop, into the walk).
    Files that vanish meanwhile (journald rotates and vacuums) are passed over in
    silence.  The caller owns top_fd; the descriptors of everything below are closed here.
    """
    st = os.fstat(top_fd)
    return _walk(top_fd, top_path, st, allowed_uids, skips, 0, (st.st_dev, mount_id(top_fd)))


def _walk(
    top_fd: int,
    top_path: str,
    top_st: os.stat_result,
    allowed_uids: Set[int],
    skips: List[Skip],
    depth: int,
    mount: Tuple[int, Optional[int]],
) -> Iterator[Node]:
    yield Node(top_path, top_fd, top_st, True)
    try:
        with os.scandir(top_fd) as it:
            entries = [(e.name, _kind(e)) for e in it]
    except FileNotFoundError:
        return
    except OSError as exc:
        skips.append(
            Skip(
                "unreadable-directory",
                top_path,
                f"cannot read {shown(top_path)}: {exc.strerror}",
                action=True,
            )
        )
        return
    for name, kind in entries:
        path = f"{top_path}/{name}"
        if kind == "link":
            skips.append(
                Skip("ignored-symlink", path, f"{shown(path)} is a symbolic link, never followed")
            )
            continue
        if kind == "other":
            skips.append(
                Skip("skipped-type", path, f"{shown(path)} is not a directory or regular file")
            )
            continue
        is_dir = kind == "dir"
        try:
            fd = os.open(name, O_DIR if is_dir else O_FILE, dir_fd=top_fd)
        except FileNotFoundError:
            continue
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENXIO):
                skips.append(_changed(path))
            else:
                skips.append(
                    Skip(
                        "unreadable-file",
                        path,
                        f"cannot open {shown(path)}: {exc.strerror}",
                        action=True,
                    )
                )
            continue
        try:
            st = os.fstat(fd)
            if not (stat.S_ISDIR(st.st_mode) if is_dir else stat.S_ISREG(st.st_mode)):
                skips.append(_changed(path))
                continue
            # Directories only: on an overlayfs whose layers are on several filesystems
            # a file's st_dev is its layer's, not the mount's.  A file bind-mounted here
            # takes root, as any mount does.
            if is_dir and (st.st_dev != mount[0] or mount_id(fd) != mount[1]):
                skips.append(
                    Skip(
                        "skipped-mount",
                        path,
                        f"{shown(path)} is a mount point (or on another filesystem): "
                        "not walked, left alone",
                    )
                )
                continue
            if st.st_uid not in allowed_uids:
                skips.append(
                    Skip(
                        "skipped-owner",
                        path,
                        f"{shown(path)} is owned by uid {st.st_uid}, not root "
                        "or a journal user: left alone",
                    )
                )
                continue
            if top_st.st_uid != 0 and st.st_uid != top_st.st_uid:
                # In systemd-journal-remote's directory everything is its own: a file of
                # root's there was put there (a hard link whose other name is gone since,
                # with fs.protected_hardlinks=0), not written by it.
                skips.append(
                    Skip(
                        "skipped-owner",
                        path,
                        f"{shown(path)} is owned by uid {st.st_uid} in a directory of uid "
                        f"{top_st.st_uid}: left alone",
                    )
                )
                continue
            if not is_dir and st.st_nlink > 1:
                skips.append(
                    Skip(
                        "skipped-hardlink",
                        path,
                        f"{shown(path)} has {st.st_nlink} hard links: "
                        "left alone (one of them may be outside the journal)",
                    )
                )
                continue
            if is_dir:
                if depth + 1 >= MAX_DEPTH:
                    skips.append(
                        Skip(
                            "skipped-depth",
                            path,
                            f"{shown(path)} is nested more than "
                            f"{MAX_DEPTH} levels deep: left alone",
                        )
                    )
                    continue
                yield from _walk(fd, path, st, allowed_uids, skips, depth + 1, mount)
            else:
                yield Node(path, fd, st, False)
        finally:
            os.close(fd)


def _changed(path: str) -> Skip:
    return Skip(
        "changed-while-reading",
        path,
        f"{shown(path)} changed type while it was read (replaced by a symbolic link?): not checked",
        action=True,
    )


def _kind(entry: os.DirEntry) -> str:
    try:
        if entry.is_symlink():
            return "link"
        if entry.is_dir(follow_symlinks=False):
            return "dir"
        if entry.is_file(follow_symlinks=False):
            return "file"
    except OSError:
        pass
    return "other"
