"""journal-acl-setup: POSIX ACLs read and written on descriptors, and a walk that cannot be
redirected.

Every directory is opened relative to its parent's descriptor with O_NOFOLLOW, every file
too, and ACLs are read and set on those descriptors through the kernel's
system.posix_acl_access / system.posix_acl_default extended attributes (the calls libacl
makes).  A name swapped for a symbolic link between the directory read and the open fails
with ELOOP instead of leading elsewhere; a directory renamed away while it is walked is
still the directory that was opened.
"""

import errno
import os
import stat
import struct
from typing import Dict, Iterator, List, Optional, Set, Tuple

ACCESS = "system.posix_acl_access"
DEFAULT = "system.posix_acl_default"
# linux/posix_acl.h and posix_acl_xattr.h: a little-endian version 2 header, then
# (tag u16, perm u16, id u32) entries sorted by tag, then id.
VERSION = 2
USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
UNDEFINED = 0xFFFFFFFF
R, W, X = 4, 2, 1
_HEADER = struct.Struct("<I")
_ENTRY = struct.Struct("<HHI")

O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
O_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
MAX_DEPTH = 32

Entries = Dict[Tuple[int, int], int]  # (tag, id) -> rwx bits


class AclError(Exception):
    """An ACL that cannot be read or written (the caller turns it into an Error)."""


def decode(data: bytes) -> Entries:
    """The entries of a system.posix_acl_* attribute value."""
    if len(data) < _HEADER.size or (len(data) - _HEADER.size) % _ENTRY.size:
        raise AclError(f"malformed ACL attribute of {len(data)} bytes")
    (version,) = _HEADER.unpack_from(data)
    if version != VERSION:
        raise AclError(f"ACL attribute version {version}, expected {VERSION}")
    entries: Entries = {}
    for offset in range(_HEADER.size, len(data), _ENTRY.size):
        tag, perm, ident = _ENTRY.unpack_from(data, offset)
        entries[(tag, ident if tag in (USER, GROUP) else UNDEFINED)] = perm & 7
    return entries


def encode(entries: Entries) -> bytes:
    """The attribute value for entries (the kernel wants them sorted by tag, then id)."""
    parts = [_HEADER.pack(VERSION)]
    for (tag, ident), perm in sorted(entries.items()):
        parts.append(_ENTRY.pack(tag, perm, ident))
    return b"".join(parts)


def from_mode(mode: int) -> Entries:
    """The minimal ACL a file without an access ACL has: its permission bits."""
    return {
        (USER_OBJ, UNDEFINED): (mode >> 6) & 7,
        (GROUP_OBJ, UNDEFINED): (mode >> 3) & 7,
        (OTHER, UNDEFINED): mode & 7,
    }


def _get(fd: int, name: str) -> Optional[bytes]:
    try:
        return os.getxattr(fd, name)
    except OSError as exc:
        if exc.errno in (errno.ENODATA, errno.EOPNOTSUPP):
            return None
        raise AclError(f"cannot read the ACL: {exc.strerror}") from None


def perms_text(perm: int) -> str:
    return "".join(c if perm & bit else "-" for c, bit in (("r", R), ("w", W), ("x", X)))


class Node:
    """A directory or regular file under the journal, open as fd while it is visited."""

    __slots__ = ("path", "fd", "st", "is_dir")

    def __init__(self, path: str, fd: int, st: os.stat_result, is_dir: bool) -> None:
        self.path, self.fd, self.st, self.is_dir = path, fd, st, is_dir

    def raw(self) -> Tuple[Optional[bytes], Optional[bytes]]:
        """The access and (directories) default ACL attributes, None where absent."""
        access = _get(self.fd, ACCESS)
        default = _get(self.fd, DEFAULT) if self.is_dir else None
        return access, default

    def acls(self) -> Tuple[Entries, Optional[Entries]]:
        access, default = self.raw()
        return (
            decode(access) if access is not None else from_mode(self.st.st_mode),
            decode(default) if default is not None else None,
        )

    def set_acls(self, access: Optional[Entries], default: Optional[Entries]) -> None:
        """Write the ACLs given (None: leave that one alone), on the descriptor."""
        try:
            if access is not None:
                os.setxattr(self.fd, ACCESS, encode(access))
            if default is not None and self.is_dir:
                os.setxattr(self.fd, DEFAULT, encode(default))
        except OSError as exc:
            raise AclError(f"cannot set the ACL of {self.path}: {exc.strerror}") from None


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


def walk(
    top_fd: int,
    top_path: str,
    allowed_uids: Set[int],
    skips: List[Skip],
    depth: int = 0,
) -> Iterator[Node]:
    """Yield top and every directory and regular file under it, each open while yielded.

    Never follows a symbolic link; skips (into skips) what is not a directory or regular
    file, what is not owned by one of allowed_uids, a file with more than one link, and a
    name whose type changed between reading the directory and opening it.  Files that
    vanish meanwhile (journald rotates and vacuums) are passed over in silence.  The
    caller owns top_fd; the descriptors of everything below are closed here.
    """
    yield Node(top_path, top_fd, os.fstat(top_fd), True)
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
                f"cannot read {top_path}: " f"{exc.strerror}",
                action=True,
            )
        )
        return
    for name, kind in entries:
        path = f"{top_path}/{name}"
        if kind == "link":
            skips.append(
                Skip("ignored-symlink", path, f"{path} is a symbolic link, never followed")
            )
            continue
        if kind == "other":
            skips.append(Skip("skipped-type", path, f"{path} is not a directory or regular file"))
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
                        "unreadable-file", path, f"cannot open {path}: {exc.strerror}", action=True
                    )
                )
            continue
        try:
            st = os.fstat(fd)
            if not (stat.S_ISDIR(st.st_mode) if is_dir else stat.S_ISREG(st.st_mode)):
                skips.append(_changed(path))
                continue
            if st.st_uid not in allowed_uids:
                skips.append(
                    Skip(
                        "skipped-owner",
                        path,
                        f"{path} is owned by uid {st.st_uid}, not root "
                        "or a journal user: left alone",
                    )
                )
                continue
            if not is_dir and st.st_nlink > 1:
                skips.append(
                    Skip(
                        "skipped-hardlink",
                        path,
                        f"{path} has {st.st_nlink} hard links: "
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
                            f"{path} is nested more than " f"{MAX_DEPTH} levels deep: left alone",
                        )
                    )
                    continue
                yield from walk(fd, path, allowed_uids, skips, depth + 1)
            else:
                yield Node(path, fd, st, False)
        finally:
            os.close(fd)


def _changed(path: str) -> Skip:
    return Skip(
        "changed-while-reading",
        path,
        f"{path} changed type while it was read (replaced by a symbolic link?): not checked",
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
