"""netboot-serialize's tarball side: validate hostile archives, extract and rewrite them."""

import gzip
import io
import os
import posixpath
import stat
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Dict, List, Optional, Tuple

from debadmin.errors import Error

# Generous for an installer netboot tree (about 60 MB unpacked, 500 members).
MAX_MEMBERS = 20000
MAX_MEMBER_SIZE = 1 << 30
MAX_TOTAL_SIZE = 4 << 30
MAX_NAME = 4096
MAX_LINK_DEPTH = 40
MAX_WANTED_SIZE = 1 << 20  # files read into memory: boot configs, version.info
TAR_SUFFIXES = (".tar.gz", ".tgz", ".tar")


def is_tarball_name(path: Path) -> bool:
    return path.name.endswith(TAR_SUFFIXES)


@dataclass
class Member:
    """One validated archive member; name is relative, normalised, without './'."""

    name: str
    info: tarfile.TarInfo
    kind: str  # file, dir, symlink, hardlink


def _normalise(raw: str, what: str) -> str:
    if "\0" in raw or len(raw) > MAX_NAME:
        raise Error(f"refusing tarball: bad {what} {raw[:80]!r}")
    if raw.startswith("/"):
        raise Error(f"refusing tarball: absolute {what} {raw!r}")
    parts = [p for p in raw.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise Error(f"refusing tarball: {what} {raw!r} contains '..'")
    return "/".join(parts)


class _Tree:
    """The directory tree an archive would create, to resolve links as the kernel would."""

    def __init__(self) -> None:
        self.kinds: Dict[str, str] = {"": "dir"}
        self.links: Dict[str, str] = {}

    def resolve(self, path: str, follow_last: bool = True, depth: int = 0) -> Optional[str]:
        """The real path inside the tree for path, or None where it leaves the tree."""
        if depth > MAX_LINK_DEPTH:
            return None
        current: List[str] = []
        parts = [p for p in path.split("/") if p not in ("", ".")]
        for index, part in enumerate(parts):
            if part == "..":
                if not current:
                    return None  # above the top of the tree
                current.pop()
                continue
            candidate = "/".join(current + [part])
            last = index == len(parts) - 1
            if candidate in self.links and (follow_last or not last):
                target = self.links[candidate]
                if target.startswith("/"):
                    return None
                base = "/".join(current)
                resolved = self.resolve(
                    posixpath.join(base, target) if base else target, True, depth + 1
                )
                if resolved is None:
                    return None
                current = resolved.split("/") if resolved else []
            else:
                current.append(part)
        return "/".join(current)


def validate(tar: tarfile.TarFile) -> List[Member]:
    """Every member checked before anything is written; raise Error on the first bad one."""
    members: List[Member] = []
    tree = _Tree()
    total = 0
    for count, info in enumerate(tar, 1):
        if count > MAX_MEMBERS:
            raise Error(f"refusing tarball: more than {MAX_MEMBERS} members")
        name = _normalise(info.name, "member name")
        if info.isdev() or info.isfifo():
            raise Error(f"refusing tarball: device node or fifo {info.name!r}")
        if info.isreg():
            kind = "file"
        elif info.isdir():
            kind = "dir"
        elif info.issym():
            kind = "symlink"
        elif info.islnk():
            kind = "hardlink"
        else:
            raise Error(f"refusing tarball: unsupported member type of {info.name!r}")
        if info.size < 0 or info.size > MAX_MEMBER_SIZE:
            raise Error(f"refusing tarball: {info.name!r} is {info.size} bytes")
        total += info.size
        if total > MAX_TOTAL_SIZE:
            raise Error(f"refusing tarball: more than {MAX_TOTAL_SIZE} bytes unpacked")
        if not name:
            if kind != "dir":
                raise Error(f"refusing tarball: member {info.name!r} would replace the top")
            continue
        # Nothing may be written through a symlink, nor may a name appear twice.
        parent = posixpath.dirname(name)
        if tree.resolve(parent) != parent:
            raise Error(f"refusing tarball: {info.name!r} lies under a symlink or outside")
        if name in tree.kinds:
            if kind == "dir" and tree.kinds[name] == "dir":
                continue
            raise Error(f"refusing tarball: {info.name!r} appears twice")
        if parent and tree.kinds.get(parent) != "dir":
            # Directories may be implicit in tarballs; a file as parent is not.
            if parent in tree.kinds:
                raise Error(f"refusing tarball: parent of {info.name!r} is not a directory")
            for i in range(1, len(parent.split("/")) + 1):
                tree.kinds.setdefault("/".join(parent.split("/")[:i]), "dir")
        if kind == "symlink":
            if info.linkname.startswith("/"):
                raise Error(
                    f"refusing tarball: symlink {info.name!r} -> {info.linkname!r} " "is absolute"
                )
            tree.links[name] = info.linkname
            if tree.resolve(name) is None:
                raise Error(
                    f"refusing tarball: symlink {info.name!r} -> {info.linkname!r} "
                    "resolves outside the tree"
                )
        elif kind == "hardlink":
            target = _normalise(info.linkname, "hard link target")
            if tree.kinds.get(target) != "file" or tree.resolve(target) != target:
                raise Error(
                    f"refusing tarball: hard link {info.name!r} -> "
                    f"{info.linkname!r} is not an earlier file of the tree"
                )
        tree.kinds[name] = kind
        members.append(Member(name, info, kind))
    # A later symlink can change how an earlier one resolves: check them all again.
    for link in tree.links:
        if tree.resolve(link) is None:
            raise Error(f"refusing tarball: symlink {link!r} resolves outside the tree")
    return members


def open_tarball(path: Path) -> tarfile.TarFile:
    try:
        return tarfile.open(path, "r:*")
    except (tarfile.TarError, EOFError, OSError, gzip.BadGzipFile) as exc:
        raise Error(f"cannot read tarball {path}: {exc}") from None


def read_members(
    path: Path, wanted: Callable[[str], bool]
) -> Tuple[List[Member], Dict[str, bytes]]:
    """Validate the archive; return its members and the contents of the wanted files."""
    contents: Dict[str, bytes] = {}
    with open_tarball(path) as tar:
        try:
            members = validate(tar)
            for member in members:
                if member.kind == "file" and wanted(member.name):
                    if member.info.size > MAX_WANTED_SIZE:
                        raise Error(
                            f"refusing tarball: {member.info.name!r} is "
                            f"{member.info.size} bytes, too big for a boot config"
                        )
                    handle = tar.extractfile(member.info)
                    contents[member.name] = handle.read() if handle else b""
        except (tarfile.TarError, EOFError, OSError, gzip.BadGzipFile) as exc:
            raise Error(f"cannot read tarball {path}: {exc}") from None
    return members, contents


def extract(path: Path, members: List[Member], dest: Path, replace: Dict[str, bytes]) -> None:
    """Unpack validated members into the empty directory dest, with replaced contents."""
    by_name = {m.info.name: m for m in members}
    dirs = []
    with open_tarball(path) as tar:
        try:
            for info in tar:
                member = by_name.get(info.name)
                if member is None:
                    continue
                target = dest / member.name
                target.parent.mkdir(parents=True, exist_ok=True)
                mode = info.mode & 0o777
                if member.kind == "dir":
                    target.mkdir(exist_ok=True)
                    dirs.append((target, mode | 0o700, info.mtime))
                elif member.kind == "symlink":
                    os.symlink(info.linkname, target)
                elif member.kind == "hardlink":
                    os.link(dest / _normalise(info.linkname, "hard link target"), target)
                else:
                    fd = os.open(
                        target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600
                    )
                    with os.fdopen(fd, "wb") as out:
                        if member.name in replace:
                            out.write(replace[member.name])
                        else:
                            handle = tar.extractfile(info)
                            _copy(handle, out, info.size)
                        os.fchmod(out.fileno(), mode)
                    if member.name not in replace:
                        os.utime(target, (info.mtime, info.mtime), follow_symlinks=False)
        except (tarfile.TarError, EOFError, gzip.BadGzipFile) as exc:
            raise Error(f"cannot read tarball {path}: {exc}") from None
    for directory, mode, mtime in reversed(dirs):
        os.chmod(directory, mode)
        os.utime(directory, (mtime, mtime))


def _copy(handle: Optional[BinaryIO], out: BinaryIO, size: int) -> None:
    if handle is None:
        return
    left = size
    while left > 0:
        chunk = handle.read(min(left, 1 << 20))
        if not chunk:
            raise Error("tarball member is truncated")
        out.write(chunk)
        left -= len(chunk)


def rewrite(
    path: Path, members: List[Member], out: BinaryIO, replace: Dict[str, bytes], compress: bool
) -> None:
    """Copy the validated members of the tarball at path into out, with replaced contents.

    Member order and metadata stay; the gzip header carries no time stamp, so the same
    input gives the same bytes.
    """
    by_name = {m.info.name: m for m in members}
    stream = gzip.GzipFile(fileobj=out, mode="wb", mtime=0, compresslevel=6) if compress else out
    try:
        with open_tarball(path) as src, tarfile.open(
            fileobj=stream, mode="w", format=tarfile.GNU_FORMAT
        ) as dst:
            for info in src:
                member = by_name.get(info.name)
                if member is None:
                    if info.name.strip("./") == "":
                        dst.addfile(info)
                    continue
                if member.kind == "file":
                    if member.name in replace:
                        new = _copy_info(info)
                        data = replace[member.name]
                        new.size = len(data)
                        dst.addfile(new, io.BytesIO(data))
                    else:
                        dst.addfile(info, src.extractfile(info))
                else:
                    dst.addfile(info)
    except (tarfile.TarError, EOFError, gzip.BadGzipFile) as exc:
        raise Error(f"cannot read tarball {path}: {exc}") from None
    finally:
        if compress:
            stream.close()


def _copy_info(info: tarfile.TarInfo) -> tarfile.TarInfo:
    new = tarfile.TarInfo(info.name)
    for attr in ("mode", "uid", "gid", "mtime", "type", "uname", "gname"):
        setattr(new, attr, getattr(info, attr))
    return new


def write_tree_tarball(
    tree: Path, out: BinaryIO, replace: Dict[str, bytes], compress: bool
) -> None:
    """Pack the tree as netboot.tar.gz is packed ('./' names), sorted, with replaced files."""
    entries = []
    for dirpath, dirnames, filenames in os.walk(tree):  # symlinked directories not entered
        dirnames.sort()
        rel_dir = os.path.relpath(dirpath, tree)
        entries.append(rel_dir)
        links = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
        entries.extend(
            os.path.normpath(os.path.join(rel_dir, name)) for name in sorted(filenames + links)
        )
    stream = gzip.GzipFile(fileobj=out, mode="wb", mtime=0, compresslevel=6) if compress else out
    try:
        with tarfile.open(fileobj=stream, mode="w", format=tarfile.GNU_FORMAT) as dst:
            for rel in entries:
                full = tree / rel
                info = dst.gettarinfo(str(full), "." if rel == "." else "./" + rel)
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                if info.isreg():
                    if rel in replace:
                        info.size = len(replace[rel])
                        dst.addfile(info, io.BytesIO(replace[rel]))
                    else:
                        with open(full, "rb") as handle:
                            dst.addfile(info, handle)
                elif info.isdir() or info.issym():
                    dst.addfile(info)
                else:
                    raise Error(f"refusing to pack {full}: not a file, directory or symlink")
    finally:
        if compress:
            stream.close()


def lstat_kind(path: Path) -> str:
    mode = os.lstat(path).st_mode
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        return "file"
    return "other"
