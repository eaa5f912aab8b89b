"""journal-acl-setup: POSIX ACLs read and written on descriptors, and a walk that cannot be
redirected.

Every directory is opened relative to its parent's descriptor with O_NOFOLLOW, every file
too, and ACLs are read and set on those descriptors: their attributes (posixacl) with
fgetxattr and fsetxattr, the system calls and bytes libacl's acl_get_fd/acl_set_fd use.  A
name swapped for a symbolic link between the directory read and the open fails with ELOOP
instead of leading elsewhere; a directory renamed away while it is walked is still the
directory that was opened.

A directory's default ACL is read and set through its descriptor's magic link,
/proc/self/fd/N: there is no descriptor call for it (libacl's acl_get_file/acl_set_file
take a path too, and pylibacl 0.7's applyto(fd, ACL_TYPE_DEFAULT) ignores the type and
sets the access ACL), and the kernel resolves that link to the open inode itself, with no
name lookup an attacker could redirect.

check reads regular files without opening them (walk(..., open_files=False)): an
fstatat on the directory's descriptor (AT_SYMLINK_NOFOLLOW) and an lgetxattr of the bare
name with the process's working directory set to that descriptor (fchdir).  Neither
call follows the last component, and the name cannot lead out of the directory that
was opened: the lookup starts at its inode, wherever it has been moved since.  Two calls
instead of open, fstat, fgetxattr and close.  The stat and the ACL may then belong to
two inodes that held the name one after the other; only the directory's owner can
rename there, and below a directory that is not root's the walk passes only files of
that owner, who can give any of them whatever ACL they like: a race there shows
nothing its owner could not show without one.  Writes stay on descriptors: apply and
revert walk with the files open.
"""

from __future__ import annotations  # annotations stay text: typing is never imported

import errno
import os
import stat
import posix1e

from debadmin import posixacl

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from typing import Dict, Iterator, List, Optional, Sequence, Set, Tuple

    Entries = Dict[Tuple[int, int], int]  # (tag, id) -> rwx bits
    FileRead = Tuple[str, int, int, bytes]  # a file read by name: name, mode, gid, access ACL

# The tags as the kernel stores them, which are libacl's values too (test_posixacl), so
# that entries() of a posix1e.ACL and parse() of an attribute key alike.
USER_OBJ, USER, GROUP_OBJ, GROUP = (
    posixacl.USER_OBJ,
    posixacl.USER,
    posixacl.GROUP_OBJ,
    posixacl.GROUP,
)
MASK, OTHER = posixacl.MASK, posixacl.OTHER
UNDEFINED = posixacl.UNDEFINED  # the id of an entry that names no user or group
R, W, X = posix1e.ACL_READ, posix1e.ACL_WRITE, posix1e.ACL_EXECUTE
# Numeric ids: the text is a cache key and must not depend on (or wait for) NSS.
TEXT_OPTIONS = posix1e.TEXT_NUMERIC_IDS | posix1e.TEXT_ABBREVIATE

ACCESS_XATTR, DEFAULT_XATTR = posixacl.ACCESS_XATTR, posixacl.DEFAULT_XATTR
O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
O_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
MAX_DEPTH = 32
NO_MOUNT = (-1, None)  # _refused's mount argument for a file: only directories are tested
OPEN_FILES = -1  # _walk's here for a walk that opens every file (apply, revert)


class AclError(Exception):
    """An ACL that cannot be read or written (the caller turns it into an Error);
    reason: why, without the path."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason or message


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


def parse(data: bytes) -> Optional[Entries]:
    """The entries of a system.posix_acl_access or _default attribute as the kernel
    gives it; None for none (b"").

    The same (tag, id) -> rwx bits as entries() makes of libacl's reading, without
    libacl: check parses only the few distinct ACLs of a journal this way.
    """
    try:
        return posixacl.parse(data)
    except posixacl.FormatError as exc:
        raise AclError(f"cannot read the ACL: {exc}") from None


def text(acl: Optional[posix1e.ACL]) -> bytes:
    """The ACL's short text with numeric ids (b"" for none): what the verdict cache keys on."""
    return b"" if acl is None else acl.to_any_text(options=TEXT_OPTIONS, separator=b",")


from_mode = posixacl.from_mode


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
    """A directory or regular file under the journal, open as fd while it is visited.

    files: for a directory walked with open_files false, its regular files, read by
    name and not yielded on their own, as (name, st_mode, st_gid, access ACL attribute)
    tuples: what check judges them by (the stat itself is let go at once, thousands of
    them kept would be a few megabytes to allocate and fault in).  taken: the caller
    keeps fd open past the walk (take).
    """

    __slots__ = ("path", "fd", "st", "is_dir", "files", "taken")

    def __init__(self, path: str, fd: int, st: os.stat_result, is_dir: bool) -> None:
        self.path, self.fd, self.st, self.is_dir = path, fd, st, is_dir
        self.files: Sequence[FileRead] = ()
        self.taken = False

    def take(self) -> "Node":
        """This node with a descriptor of its own, kept open after the walk moves on
        (the caller closes it): a file itself, its descriptor handed over (the walk no
        longer closes it), a directory's a duplicate (the walk still reads it)."""
        if self.is_dir:
            return Node(self.path, os.dup(self.fd), self.st, True)
        self.taken = True
        return self

    def raw(self) -> Tuple[bytes, bytes]:
        """The access and default ACL attributes as the kernel keeps them (b"" for none),
        read on the descriptor: what the verdict cache keys on, and what acls() parses."""
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
        """The access ACL (from the mode where there is none, as libacl reads it) and the
        default ACL (None where there is none or for a file)."""
        access, default = self.raw()
        return parse(access) or from_mode(self.st.st_mode), parse(default)

    def set_acls(self, access: Optional[Entries], default: Optional[Entries]) -> None:
        """Write the ACLs given (None: leave that one alone), on the descriptor.

        The attribute packed here (posixacl.pack, in the kernel's order) and set with
        fsetxattr (a directory's default ACL with setxattr on its magic link) is what
        libacl's acl_set_fd and acl_set_file write: the same system calls, the same
        bytes (test_posixacl), without building a posix1e.ACL entry by entry."""
        self.set_attributes(
            None if access is None else posixacl.pack(access),
            None if default is None else posixacl.pack(default),
        )

    def set_attributes(self, access: Optional[bytes], default: Optional[bytes]) -> None:
        """set_acls() of ACLs already packed (posixacl.pack): a walk that gives many
        inodes the same ACL packs it once."""
        try:
            if access is not None:
                os.setxattr(self.fd, ACCESS_XATTR, access)
            if default is not None and self.is_dir:
                os.setxattr(magic_link(self.fd), DEFAULT_XATTR, default)
        except OSError as exc:
            reason = _proc_hint(exc)
            raise AclError(f"cannot set the ACL of {shown(self.path)}: {reason}", reason) from None


def restore(node: "Node", access: bytes, default: bytes, mode: int) -> None:
    """Put back the ACL attributes (b"": none) and permission bits recorded for node,
    on its descriptor (a directory's default ACL through its magic link)."""
    try:
        if access:
            os.setxattr(node.fd, ACCESS_XATTR, access)
        else:
            try:
                os.removexattr(node.fd, ACCESS_XATTR)
            except OSError as exc:
                if exc.errno != errno.ENODATA:
                    raise
        if node.is_dir:
            if default:
                os.setxattr(magic_link(node.fd), DEFAULT_XATTR, default)
            else:
                try:
                    os.removexattr(magic_link(node.fd), DEFAULT_XATTR)
                except OSError as exc:
                    if exc.errno != errno.ENODATA:
                        raise
        # Removing an access ACL leaves the mask in the group bits: the mode goes back too.
        if stat.S_IMODE(os.fstat(node.fd).st_mode) != stat.S_IMODE(mode):
            os.fchmod(node.fd, stat.S_IMODE(mode))
    except OSError as exc:
        reason = _proc_hint(exc)
        raise AclError(f"cannot restore the ACL of {shown(node.path)}: {reason}", reason) from None


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
    """entries plus a named entry giving gid want, the mask widened by want and no more,
    and nobody else gaining a right through the wider mask.

    As setfacl -n: an existing mask is kept, only the bits the new entry needs are
    added to it, so a 0640 journal file keeps its r-- mask (setfacl's recalculation
    would make it r-x from adm's inherited r-x entry).  An ACL without a mask gets one
    covering its group class, as the kernel requires once it holds a named entry.

    Where the mask must widen, every other entry of the group class (named users and
    groups, the owning group) is lowered to what it had through the old mask: a
    user:X:r-- behind mask::--- becomes user:X:---, so X reads no more than before.  The
    group's own entry keeps what it had through the old mask plus want.  The same in any
    order of groups: the mask widens once, by the same bits, from the same old mask.
    """
    result = dict(entries)
    mask = result.get((MASK, UNDEFINED))
    if mask is None:  # no named entry yet: the group class is the owning group alone
        result[(GROUP, gid)] = result.get((GROUP, gid), 0) | want
        result[(MASK, UNDEFINED)] = _group_class(entries) | want
        return result
    if mask | want != mask:
        for key, perm in entries.items():
            if key[0] in (USER, GROUP_OBJ, GROUP) and key != (GROUP, gid):
                result[key] = perm & mask
    result[(GROUP, gid)] = (result.get((GROUP, gid), 0) & mask) | want
    result[(MASK, UNDEFINED)] = mask | want
    return result


def effective(entries: Optional[Entries]) -> Dict[Tuple[int, int], int]:
    """What each entry grants once masked: (tag, id) -> rwx bits (the owner and other
    entries are never masked)."""
    if entries is None:
        return {}
    mask = entries.get((MASK, UNDEFINED), 7)
    return {
        key: perm & mask if key[0] in (USER, GROUP_OBJ, GROUP) else perm
        for key, perm in entries.items()
        if key[0] != MASK
    }


def _named_can(entries: Optional[Entries], gid: int, want: int) -> bool:
    if entries is None or (GROUP, gid) not in entries:
        return False
    return entries[(GROUP, gid)] & entries.get((MASK, UNDEFINED), 7) & want == want


def default_base(access: Entries) -> Entries:
    """A new default ACL starts from the directory's owner, group and other entries, the
    owning group's as its mask lets it read (it has no mask of its own to narrow it)."""
    base = {k: v for k, v in access.items() if k[0] in (USER_OBJ, GROUP_OBJ, OTHER)}
    mask = access.get((MASK, UNDEFINED))
    if mask is not None and (GROUP_OBJ, UNDEFINED) in base:
        base[(GROUP_OBJ, UNDEFINED)] &= mask
    return base


def without(entries: Optional[Entries], gids: Set[int]) -> Optional[Entries]:
    """entries without named entries for gids (the mask kept); None if nothing changes."""
    if entries is None or not any((GROUP, g) in entries for g in gids):
        return None
    return {k: v for k, v in entries.items() if not (k[0] == GROUP and k[1] in gids)}


def grant_all(
    access: Entries, default: Optional[Entries], owner_gid: int, gids, is_dir: bool
) -> Tuple[Entries, Optional[Entries]]:
    """What apply makes of an access and default ACL for gids: each group that cannot
    read gets a named entry (and a default one on a directory, unless its own named
    entry there already gives it what it needs), the mask widened by the bits it needs.
    The same for any order of gids, in one apply or several: revert recomputes it."""
    want = R | X if is_dir else R
    new_access, new_default = access, default
    for gid in sorted(gids):
        if not group_can(new_access, owner_gid, gid, want):
            new_access = granted(new_access, gid, want)
        # A default ACL counts through the group's own named entry only: one apply
        # making a default ACL for another group would otherwise decide for this one
        # through the owning group's entry, and the result would depend on the order.
        if is_dir and not _named_can(new_default, gid, want):
            new_default = granted(new_default or default_base(access), gid, want)
    return new_access, new_default


def named_gids(entries: Optional[Entries]) -> Set[int]:
    """The gids entries name."""
    return {ident for tag, ident in (entries or {}) if tag == GROUP}


def _named(entries: Entries) -> bool:
    return any(tag in (USER, GROUP) for tag, _ in entries)


def strip_groups(
    entries: Optional[Entries], gids: Set[int], minimal: Optional[Entries] = None
) -> Optional[Entries]:
    """entries without the named entries of gids, for an inode apply did not record (a
    file journald made after apply, inheriting the default ACL): the mask narrowed to
    what the entries left need and never wider than it was; with no named entry left,
    the owner, owning group (through the mask, as it read) and other entries, for an
    access ACL and a default ACL (minimal None) alike: a default ACL's owning group
    entry is what later files give their group.  minimal only says it is an access ACL.
    None when there is nothing of gids to remove."""
    rest = without(entries, gids)
    if rest is None:
        return None
    mask = rest.pop((MASK, UNDEFINED), None)
    if not _named(rest):
        if mask is not None:
            rest[(GROUP_OBJ, UNDEFINED)] = rest.get((GROUP_OBJ, UNDEFINED), 0) & mask
        return rest
    if mask is not None:
        rest[(MASK, UNDEFINED)] = mask & _group_class(rest)
    return rest


def attribute(entries: Optional[Entries]) -> bytes:
    """The attribute the kernel keeps for entries: none (b"") for none or for an ACL
    the permission bits hold alone (owner, owning group and other only)."""
    if entries is None or not _named(entries) and (MASK, UNDEFINED) not in entries:
        return b""
    return posixacl.pack(entries)


def mode_of(entries: Entries, mode: int) -> int:
    """mode with the permission bits an access ACL sets: the owner's, the mask's (or the
    owning group's without a mask) and other's; the file type and special bits kept."""
    group = entries.get((MASK, UNDEFINED), entries.get((GROUP_OBJ, UNDEFINED), 0))
    return (
        (mode & ~0o777)
        | entries.get((USER_OBJ, UNDEFINED), 0) << 6
        | group << 3
        | entries.get((OTHER, UNDEFINED), 0)
    )


# --- the walk --------------------------------------------------------------------------------


class Skip:
    """Something the walk did not visit: code, path, why; action: the tree could not be
    read as it is (a race), rather than left alone on purpose."""

    __slots__ = ("code", "path", "message", "action")

    def __init__(self, code: str, path: str, message: str, action: bool = False) -> None:
        self.code, self.path, self.message, self.action = code, path, message, action


class Skips:
    """What a walk passed over, kept in bounded memory: every one asking for action (a
    race, a refusal: few, and each must be listed), the first EXAMPLES of each other code
    and a count of the rest (200,000 symbolic links make a summary, not 200,000 lines)."""

    EXAMPLES = 10

    def __init__(self) -> None:
        self.kept: List[Skip] = []
        self.counts: Dict[str, int] = {}

    def append(self, skip: Skip) -> None:
        seen = self.counts.get(skip.code, 0)
        self.counts[skip.code] = seen + 1
        if skip.action or seen < self.EXAMPLES:
            self.kept.append(skip)

    def __len__(self) -> int:
        return sum(self.counts.values())

    def items(self) -> List[Skip]:
        """The skips kept, in path order, then one summary per code with more."""
        result = sorted(self.kept, key=lambda s: s.path)
        for code, count in sorted(self.counts.items()):
            listed = sum(1 for s in self.kept if s.code == code)
            if count > listed:
                result.append(
                    Skip(
                        code,
                        "",
                        f"{code}: {count - listed} more like the {listed} above, not listed",
                    )
                )
        return result


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


def walk(
    top_fd: int,
    top_path: str,
    allowed_uids: Set[int],
    skips: Skips,
    open_files: bool = True,
) -> Iterator[Node]:
    """Yield top and every directory and regular file under it, each open while yielded.

    Never follows a symbolic link; skips (into skips) what is not a directory or regular
    file, what is not owned by one of allowed_uids, a file with more than one link, a
    name whose type changed between reading the directory and opening it, and a directory
    on another mount than top (a filesystem mounted below it, a bind mount, which could
    bring a directory from outside the journal or top itself, a loop, into the walk).
    Files that vanish meanwhile (journald rotates and vacuums) are passed over in
    silence.  The caller owns top_fd; the descriptors of everything below are closed here.

    With open_files false (for reading only), regular files are not opened and not
    yielded on their own: each directory's node carries them in node.files, read by name
    in the open directory (see the module's docstring), under the same rules.  The
    process's working directory is that directory while its files are read (never while
    a node is yielded), and is back where it was before anything is yielded.  Where the
    way back is unknown (a user's check started in a directory it cannot search), names
    are read through the directory's magic link instead; where neither works, files are
    opened and yielded as with open_files.
    """
    st = os.fstat(top_fd)
    mount = (st.st_dev, mount_id(top_fd))
    if open_files:
        return _walk(top_fd, top_path, st, 0, _Walk(allowed_uids, skips, mount, OPEN_FILES))
    return _walk_by_name(top_fd, top_path, st, allowed_uids, skips, mount)


class _Walk:
    """What stays the same over one walk: the owners it passes (allowed_uids), where it
    puts what it leaves alone (skips), the top's mount (st_dev, mount id) and the way back
    to the working directory (here: a descriptor, None where there is none, OPEN_FILES
    where every file is opened). A plain class: dataclasses would import inspect."""

    __slots__ = ("allowed_uids", "skips", "mount", "here")

    def __init__(
        self,
        allowed_uids: Set[int],
        skips: Skips,
        mount: Tuple[int, Optional[int]],
        here: Optional[int],
    ) -> None:
        self.allowed_uids, self.skips, self.mount, self.here = allowed_uids, skips, mount, here


def _walk_by_name(
    top_fd: int,
    top_path: str,
    top_st: os.stat_result,
    allowed_uids: Set[int],
    skips: Skips,
    mount: Tuple[int, Optional[int]],
) -> Iterator[Node]:
    try:
        here: Optional[int] = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        # No way back to the working directory (a user's check started in a directory
        # it cannot search): names are read through the directory's magic link instead,
        # so the verdict does not depend on where the tool was started.
        here = None
    try:
        yield from _walk(top_fd, top_path, top_st, 0, _Walk(allowed_uids, skips, mount, here))
    finally:
        if here is not None:
            os.close(here)


def _refused(
    path: str,
    st: os.stat_result,
    is_dir: bool,
    top_st: os.stat_result,
    allowed_uids: Set[int],
    mount: Tuple[int, Optional[int]],
    fd: int,
) -> Optional[Skip]:
    """Why the walk leaves path alone (st: its stat, fd: the directory open, or -1), or
    None: the same rules for a file opened and a file read by name."""
    if not (stat.S_ISDIR(st.st_mode) if is_dir else stat.S_ISREG(st.st_mode)):
        return _changed(path)
    # Directories only: on an overlayfs whose layers are on several filesystems
    # a file's st_dev is its layer's, not the mount's.  A file bind-mounted here
    # takes root, as any mount does.
    if is_dir and mount[1] is not None and (st.st_dev != mount[0] or mount_id(fd) != mount[1]):
        if st.st_dev == mount[0]:
            # The same filesystem on another mount: a bind mount, which may bring a
            # directory from outside the journal (or the journal itself) here.  What it
            # holds is not checked, so check does not call the tree fine.
            return Skip(
                "bind-mount",
                path,
                f"{shown(path)} is a bind mount: not walked, left alone, what it holds "
                "not checked",
                action=True,
            )
        return Skip(
            "skipped-mount",
            path,
            f"{shown(path)} is a mount point (or on another filesystem): not walked, left alone",
        )
    if is_dir and mount[1] is None:
        # Without /proc/self/fdinfo a bind mount of the same filesystem cannot be told
        # from a directory: fail closed, the directory is not walked and check says so.
        return Skip(
            "unknown-mount",
            path,
            f"{shown(path)}: cannot tell whether it is a mount point (/proc/self/fdinfo "
            "cannot be read): not walked",
            action=True,
        )
    if st.st_uid not in allowed_uids:
        return Skip(
            "skipped-owner",
            path,
            f"{shown(path)} is owned by uid {st.st_uid}, not root or a journal user: left alone",
        )
    if top_st.st_uid != 0 and st.st_uid != top_st.st_uid:
        # In systemd-journal-remote's directory everything is its own: a file of
        # root's there was put there (a hard link whose other name is gone since,
        # with fs.protected_hardlinks=0), not written by it.
        return Skip(
            "skipped-owner",
            path,
            f"{shown(path)} is owned by uid {st.st_uid} in a directory of uid "
            f"{top_st.st_uid}: left alone",
        )
    if not is_dir and st.st_nlink > 1:
        return Skip(
            "skipped-hardlink",
            path,
            f"{shown(path)} has {st.st_nlink} hard links: "
            "left alone (one of them may be outside the journal)",
        )
    return None


def _files_by_name(
    top_fd: int, top_path: str, top_st: os.stat_result, names: List[str], ctx: _Walk
) -> Optional[List[FileRead]]:
    """The regular files names of the directory open as top_fd, read without opening
    them, relative to the working directory moved there, or where the way back to it
    (here) is unknown, through the directory's magic link; None where neither works
    (open them instead).

    One loop, no call per file but the two system calls: the walk's cost on a journal.
    """
    read: List[FileRead] = []
    append = read.append
    top_uid = top_st.st_uid
    allowed_uids, skips, here = ctx.allowed_uids, ctx.skips, ctx.here
    prefix = ""
    if here is None:
        if not magic_links_work(top_fd):
            return None
        prefix = magic_link(top_fd) + "/"  # the lookup starts at top_fd's inode
    else:
        try:
            os.chdir(top_fd)
        except OSError:
            return None
    try:
        for name in names:
            try:
                st = os.stat(name, dir_fd=top_fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            except OSError as exc:
                skips.append(_unreadable(f"{top_path}/{name}", exc, "read"))
                continue
            # What _refused lets through, tested inline; _refused says why not.
            if not (
                stat.S_ISREG(st.st_mode)
                and st.st_nlink == 1
                and st.st_uid in allowed_uids
                and (top_uid == 0 or st.st_uid == top_uid)
            ):
                skip = _refused(
                    f"{top_path}/{name}", st, False, top_st, allowed_uids, NO_MOUNT, -1
                )
                if skip is not None:
                    skips.append(skip)
                    continue
            try:
                # lgetxattr, relative to the working directory or the magic link:
                # either way the lookup starts at top_fd's inode.
                access = os.getxattr(prefix + name, ACCESS_XATTR, follow_symlinks=False)
            except OSError as exc:
                if exc.errno in (errno.ENODATA, errno.EOPNOTSUPP):
                    access = b""
                else:
                    if exc.errno != errno.ENOENT:  # gone: passed over, as vanished files are
                        path = f"{top_path}/{name}"
                        skips.append(
                            Skip(
                                "unreadable-acl",
                                path,
                                f"{shown(path)}: cannot read the ACL: {exc.strerror}",
                                action=True,
                            )
                        )
                    continue
            append((name, st.st_mode, st.st_gid, access))
    finally:
        if here is not None:
            os.chdir(here)
    return read


BATCH = 512  # files read by name per batch: memory bounded however large a directory


def _walk(
    top_fd: int, top_path: str, top_st: os.stat_result, depth: int, ctx: _Walk
) -> Iterator[Node]:
    """The directory open as top_fd, then what is in it, as the directory is read: no
    list of a directory's entries is ever built (a journal directory can hold 200,000
    files), only batches of BATCH names read by name."""
    node = Node(top_path, top_fd, top_st, True)
    yield node
    skips = ctx.skips
    by_name = ctx.here != OPEN_FILES
    batch: List[str] = []
    try:
        it = os.scandir(top_fd)
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
    with it:
        for entry in it:
            name = entry.name
            if by_name:  # most entries of a journal: a regular file, batched by name
                try:
                    regular = entry.is_file(follow_symlinks=False)  # d_type: no system call
                except OSError:
                    regular = False
                if regular:
                    batch.append(name)
                    if len(batch) >= BATCH:
                        yield from _batch(top_fd, top_path, top_st, batch, ctx)
                        batch = []
                    continue
            kind = _kind(entry)
            path = f"{top_path}/{name}"
            if kind == "link":
                skips.append(
                    Skip(
                        "ignored-symlink",
                        path,
                        f"{shown(path)} is a symbolic link, never followed",
                    )
                )
                continue
            if kind == "other":
                skips.append(
                    Skip("skipped-type", path, f"{shown(path)} is not a directory or regular file")
                )
                continue
            if kind == "dir":
                yield from _visit(top_fd, name, path, top_st, depth, ctx)
            else:
                yield from _file(top_fd, name, path, top_st, ctx)
    if batch:
        yield from _batch(top_fd, top_path, top_st, batch, ctx)


def _batch(
    top_fd: int, top_path: str, top_st: os.stat_result, names: List[str], ctx: _Walk
) -> Iterator[Node]:
    """A batch of regular files read by name, as a node of the directory with no ACL of
    its own (files set, is_dir false, fd -1); where they cannot be read by name, each is
    opened and visited instead (a file's depth and mount do not matter)."""
    read = _files_by_name(top_fd, top_path, top_st, names, ctx)
    if read is not None:
        batch = Node(top_path, -1, top_st, False)
        batch.files = read
        yield batch
        return
    for name in names:
        yield from _file(top_fd, name, f"{top_path}/{name}", top_st, ctx)


def open_checked(dir_fd: int, name: str, is_dir: bool) -> Tuple[int, os.stat_result]:
    """Open name in dir_fd as what it was listed as, looking before opening: O_PATH (which
    opens nothing: no FIFO waits, no device acts), fstat, and only a directory or regular
    file is then opened for real, through /proc/self/fd of the O_PATH descriptor (the
    same inode, no second lookup), or where /proc is missing by name again, O_NOFOLLOW,
    its inode compared.  Raises OSError(ELOOP) for anything that is not what it was."""
    path_fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        st = os.fstat(path_fd)
        if not (stat.S_ISDIR(st.st_mode) if is_dir else stat.S_ISREG(st.st_mode)):
            raise OSError(errno.ELOOP, "changed type")
        flags = (O_DIR if is_dir else O_FILE) & ~os.O_NOFOLLOW
        try:
            # The magic link is the O_PATH descriptor's own file: no lookup by name, the
            # same inode (st holds).
            return os.open(magic_link(path_fd), flags), st
        except FileNotFoundError:
            if os.path.isdir("/proc/self/fd"):
                raise
        fd = os.open(name, O_DIR if is_dir else O_FILE, dir_fd=dir_fd)
        opened = os.fstat(fd)
        if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
            os.close(fd)
            raise OSError(errno.ELOOP, "changed while opened")
        return fd, opened
    finally:
        os.close(path_fd)


def _opened(
    top_fd: int, name: str, path: str, is_dir: bool, ctx: _Walk
) -> Optional[Tuple[int, os.stat_result]]:
    """open_checked(), or None where the name is gone or not what it was listed as (the
    reason in ctx.skips)."""
    try:
        return open_checked(top_fd, name, is_dir)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENXIO):
            ctx.skips.append(_changed(path))
        else:
            ctx.skips.append(_unreadable(path, exc, "open"))
        return None


def _file(top_fd: int, name: str, path: str, top_st: os.stat_result, ctx: _Walk) -> Iterator[Node]:
    """The regular file name of the directory open as top_fd, opened as a node and
    closed once the caller moves on (unless it took it: Node.take), or nothing where the
    walk passes it over (why in ctx.skips)."""
    opened = _opened(top_fd, name, path, False, ctx)
    if opened is None:
        return
    fd, st = opened
    node = None
    try:
        skip = _refused(path, st, False, top_st, ctx.allowed_uids, NO_MOUNT, fd)
        if skip is not None:
            ctx.skips.append(skip)
            return
        node = Node(path, fd, st, False)
        yield node
    finally:
        if node is None or not node.taken:
            os.close(fd)


def _visit(
    top_fd: int, name: str, path: str, top_st: os.stat_result, depth: int, ctx: _Walk
) -> Iterator[Node]:
    """The directory name of the directory open as top_fd, and what is in it."""
    skips = ctx.skips
    opened = _opened(top_fd, name, path, True, ctx)
    if opened is None:
        return
    fd, st = opened
    try:
        skip = _refused(path, st, True, top_st, ctx.allowed_uids, ctx.mount, fd)
        if skip is not None:
            skips.append(skip)
            return
        if depth + 1 >= MAX_DEPTH:
            skips.append(
                Skip(
                    "skipped-depth",
                    path,
                    f"{shown(path)} is nested more than {MAX_DEPTH} levels deep: left alone",
                )
            )
            return
        yield from _walk(fd, path, st, depth + 1, ctx)
    finally:
        os.close(fd)


def _unreadable(path: str, exc: OSError, verb: str) -> Skip:
    return Skip("unreadable-file", path, f"cannot {verb} {shown(path)}: {exc.strerror}", True)


def _changed(path: str) -> Skip:
    return Skip(
        "changed-while-reading",
        path,
        f"{shown(path)} changed type while it was read (replaced by a symbolic link?): "
        "not checked",
        action=True,
    )


def _kind(entry: os.DirEntry) -> str:
    try:  # from the directory entry's type (d_type): no system call where it is known
        if entry.is_file(follow_symlinks=False):  # most entries: one test
            return "file"
        if entry.is_dir(follow_symlinks=False):
            return "dir"
        if entry.is_symlink():
            return "link"
    except OSError:
        pass
    return "other"
