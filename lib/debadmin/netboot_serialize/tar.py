"""netboot-serialize's tarball side: validate hostile archives, extract and rewrite them."""

import bz2
import contextlib
import gzip
import io
import lzma
import os
import posixpath
import re
import stat
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

from debadmin.errors import Error

# Generous for an installer netboot tree (about 60 MB unpacked, 500 members).
MAX_MEMBERS = 20000
MAX_MEMBER_SIZE = 1 << 30
MAX_TOTAL_SIZE = 4 << 30
MAX_NAME = 4096
MAX_LINK_DEPTH = 40
MAX_WANTED_SIZE = 1 << 20  # files read into memory: boot configs, version.info
MAX_WANTED_TOTAL = 16 << 20  # all of them together (d-i's are about 40 kB)
# The largest single read tarfile may make: it reads a GNU long name or a pax header whole,
# so a hostile archive declaring a 600 MB name would be held in memory.  Our own reads of
# member data are at most MAX_WANTED_SIZE (a config read whole) or 1 MiB chunks.
MAX_READ = 4 << 20
# Name suffix -> compression, for --output; an in-place rewrite keeps what the source has.
SUFFIXES = (
    (".tar.gz", "gzip"),
    (".tgz", "gzip"),
    (".tar.xz", "xz"),
    (".txz", "xz"),
    (".tar.bz2", "bzip2"),
    (".tbz2", "bzip2"),
    (".tar", "plain"),
)
MAGIC = ((b"\x1f\x8b", "gzip"), (b"\xfd7zXZ\x00", "xz"), (b"BZh", "bzip2"))
# Compressions Python's tarfile cannot read on bookworm and trixie (zstd arrives in 3.14).
UNSUPPORTED_MAGIC = ((b"\x28\xb5\x2f\xfd", "zstd"), (b"\x04\x22\x4d\x18", "lz4"))
UNPACK = {"zstd": "tar --zstd -xf FILE -C DIR", "lz4": "lz4 -dc FILE | tar -xf - -C DIR"}
READ_ERRORS = (tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError)
CHUNK = 1 << 16  # compressed bytes read at a time
# The end-of-archive marker: two zero blocks (GNU tar accepts one with a warning).
BLOCK = 512


def compression_of_name(path: Path) -> Optional[str]:
    """gzip, xz, bzip2 or plain by the name's suffix; None when it is no tarball name."""
    return next((kind for suffix, kind in SUFFIXES if path.name.endswith(suffix)), None)


def is_tarball_name(path: Path) -> bool:
    return compression_of_name(path) is not None


def is_unsupported_tarball_name(path: Path) -> bool:
    """A name like netboot.tar.zst: a tarball, but in a compression this tool cannot write."""
    return not is_tarball_name(path) and bool(re.search(r"\.tar\.[^./]+$", path.name))


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


def _kind(info: tarfile.TarInfo) -> str:
    """A member's kind: file, dir, symlink or hardlink; anything else is refused."""
    if info.isdev() or info.isfifo():
        raise Error(f"refusing tarball: device node or fifo {info.name!r}")
    if info.isreg():
        return "file"
    if info.isdir():
        return "dir"
    if info.issym():
        return "symlink"
    if info.islnk():
        return "hardlink"
    raise Error(f"refusing tarball: unsupported member type of {info.name!r}")


def _check_size(info: tarfile.TarInfo, total: int) -> int:
    """The unpacked total with this member; refuse a member or total over the limits."""
    if info.size < 0 or info.size > MAX_MEMBER_SIZE:
        raise Error(f"refusing tarball: {info.name!r} is {info.size} bytes")
    total += info.size
    if total > MAX_TOTAL_SIZE:
        raise Error(f"refusing tarball: more than {MAX_TOTAL_SIZE} bytes unpacked")
    return total


def _check_place(tree: _Tree, info: tarfile.TarInfo, name: str, kind: str) -> bool:
    """Refuse a member written through a symlink, twice, or below a non-directory; False
    for a directory the tree already has (skipped). Adds implicit parent directories."""
    parent = posixpath.dirname(name)
    if tree.resolve(parent) != parent:
        raise Error(f"refusing tarball: {info.name!r} lies under a symlink or outside")
    if name in tree.kinds:
        if kind == "dir" and tree.kinds[name] == "dir":
            return False
        raise Error(f"refusing tarball: {info.name!r} appears twice")
    if parent and tree.kinds.get(parent) != "dir":
        # Directories may be implicit in tarballs; a file as parent is not.
        if parent in tree.kinds:
            raise Error(f"refusing tarball: parent of {info.name!r} is not a directory")
        for i in range(1, len(parent.split("/")) + 1):
            tree.kinds.setdefault("/".join(parent.split("/")[:i]), "dir")
    return True


def _check_link(tree: _Tree, info: tarfile.TarInfo, name: str, kind: str) -> None:
    """A symlink must stay relative and inside the tree; a hard link must name an earlier
    file of the tree. Records the symlink in tree."""
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


def validate(tar: tarfile.TarFile) -> List[Member]:
    """Every member checked before anything is written; raise Error on the first bad one."""
    members: List[Member] = []
    tree = _Tree()
    total = 0
    for count, info in enumerate(tar, 1):
        if count > MAX_MEMBERS:
            raise Error(f"refusing tarball: more than {MAX_MEMBERS} members")
        name = _normalise(info.name, "member name")
        kind = _kind(info)
        total = _check_size(info, total)
        if not name:
            if kind != "dir":
                raise Error(f"refusing tarball: member {info.name!r} would replace the top")
            continue
        # Nothing may be written through a symlink, nor may a name appear twice.
        if not _check_place(tree, info, name, kind):
            continue
        _check_link(tree, info, name, kind)
        tree.kinds[name] = kind
        members.append(Member(name, info, kind))
    # A later symlink can change how an earlier one resolves: check them all again.
    for link in tree.links:
        if tree.resolve(link) is None:
            raise Error(f"refusing tarball: symlink {link!r} resolves outside the tree")
    return members


class Damaged(Error):
    """The archive or its compression is damaged: refused before anything is written."""


def _decompressor(compression: str):
    if compression == "gzip":
        return zlib.decompressobj(16 + zlib.MAX_WBITS)  # checks the CRC-32 and ISIZE trailer
    if compression == "xz":
        return lzma.LZMADecompressor(lzma.FORMAT_XZ)  # checks the stream's check field
    return bz2.BZ2Decompressor()  # checks every block's and the stream's CRC


def _after_stream(raw: BinaryIO, rest: bytes, magic: bytes, compression: str) -> Optional[bytes]:
    """What follows the end of a stream (rest, then raw): a concatenated stream's first
    bytes, or None at the end of the file, only zero padding (not for bzip2) allowed."""
    while len(rest) < len(magic):
        more = raw.read(CHUNK)
        if not more:
            break
        rest += more
    if rest.startswith(magic):
        return rest
    padding = len(rest)
    while rest:
        if rest.strip(b"\0") or compression == "bzip2":
            raise Damaged(f"data after the end of the {compression} stream")
        rest = raw.read(CHUNK)
        padding += len(rest)
    if compression == "xz" and padding % 4:
        raise Damaged("xz stream padding that is not a multiple of four bytes")
    return None


def decompressed_chunks(raw: BinaryIO, compression: str) -> Iterator[bytes]:
    """The decompressed bytes of raw, read to its last byte: every stream's checksum
    verified, concatenated streams followed, anything else after them refused."""
    if compression == "plain":
        yield from iter(lambda: raw.read(CHUNK), b"")
        return
    magic = next(m for m, kind in MAGIC if kind == compression)
    dec = _decompressor(compression)
    data = raw.read(CHUNK)
    while True:
        try:
            out = dec.decompress(data, CHUNK * 16)
        except (zlib.error, lzma.LZMAError, OSError, EOFError) as exc:
            raise Damaged(f"its {compression} data fails the check ({_one_line(exc)})") from None
        if compression == "gzip":
            data = dec.unconsumed_tail
            # Output may still be pending with all input taken: ask again before reading.
            needs_input = not data and not out
        else:
            data, needs_input = b"", dec.needs_input
        if out:
            yield out
        if dec.eof:
            following = _after_stream(raw, dec.unused_data, magic, compression)
            if following is None:
                return
            dec, data = _decompressor(compression), following  # a concatenated stream
            continue
        if needs_input:
            data = raw.read(CHUNK)
            if not data:
                raise Damaged(f"the {compression} data ends early (truncated download?)")


class _Stream:
    """The decompressed archive as a file tarfile can read in stream order.

    Forward seeks decompress and drop; a backward seek starts again from the first byte,
    so every byte read has passed the compressor's checks once the end is reached.  Any
    single read over MAX_READ bytes is refused (tarfile reads a long name or pax header
    whole, so a hostile archive declaring a 600 MB name would be held in memory).
    """

    def __init__(self, path: Path, compression: str) -> None:
        self.path = path
        self.compression = compression
        self.raw: Optional[BinaryIO] = None
        self._restart()

    def _restart(self) -> None:
        if self.raw is not None:
            self.raw.close()
        try:
            self.raw = open(self.path, "rb")
        except OSError as exc:
            raise Error(f"cannot read tarball {self.path}: {exc.strerror}") from None
        self.chunks = decompressed_chunks(self.raw, self.compression)
        self.buffer = b""
        self.position = 0  # of the first byte of buffer in the decompressed stream
        self.at = 0  # the read position
        self.ended = False

    def _fill(self, want: int) -> None:
        """Decompress until buffer holds the bytes up to want, or the end."""
        while not self.ended and self.position + len(self.buffer) < want:
            chunk = next(self.chunks, None)
            if chunk is None:
                self.ended = True
                break
            drop = min(self.at - self.position, len(self.buffer))
            self.buffer = self.buffer[drop:] + chunk
            self.position += drop

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0 or size > MAX_READ:
            raise Error(f"refusing tarball: a header or name of over {MAX_READ} bytes")
        self._fill(self.at + size)
        start = max(self.at - self.position, 0)
        data = self.buffer[start : start + size] if self.at >= self.position else b""
        self.at += len(data)
        return data

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence == os.SEEK_CUR:
            offset += self.at
        elif whence != os.SEEK_SET:
            raise OSError("only absolute seeks")
        if offset < self.position:
            self._restart()
        self.at = offset
        while self.at > self.position + len(self.buffer) and not self.ended:
            self.buffer, self.position = b"", self.position + len(self.buffer)
            self._fill(min(self.at, self.position + MAX_READ))
        return self.at

    def tell(self) -> int:
        return self.at

    def rest_is_end_marker(self, offset: int) -> Optional[str]:
        """Read from offset to the last byte; why it is not an end-of-archive marker."""
        self.seek(offset)
        zeros = 0
        while True:
            chunk = self.read(CHUNK)
            if not chunk:
                break
            if chunk.strip(b"\0"):
                zeros += len(chunk) - len(chunk.lstrip(b"\0"))
                if zeros < BLOCK:
                    return f"a damaged or unreadable tar header at byte {offset}"
                return f"data after the end-of-archive marker (byte {offset + zeros})"
            zeros += len(chunk)
            if zeros > MAX_READ:
                # GNU tar pads to its record size (10 kB by default): gigabytes of
                # compressed zeros are a bomb, not padding.
                return f"over {MAX_READ} bytes of padding after the end-of-archive marker"
        if zeros < BLOCK:
            return "no end-of-archive marker (truncated download?)"
        return None

    def close(self) -> None:
        if self.raw is not None:
            self.raw.close()


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def read_error(path: Path, exc: BaseException) -> Error:
    if isinstance(exc, tarfile.ReadError) and "unexpected end of data" in str(exc):
        return damaged(path, Damaged("a member is cut short (truncated download?)"))
    return Error(f"cannot read tarball {path}: {_one_line(exc)}")


def detect_compression(path: Path) -> str:
    """gzip, xz, bzip2 or plain, by the file's first bytes."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(8)
    except OSError as exc:
        raise Error(f"cannot read tarball {path}: {exc.strerror}") from None
    for magic, name in UNSUPPORTED_MAGIC:
        if head.startswith(magic):
            raise Error(
                f"cannot read tarball {path}: it is {name}-compressed, which this tool does "
                f"not read; unpack it first ({UNPACK[name]}) and give the directory"
            )
    return next((kind for magic, kind in MAGIC if head.startswith(magic)), "plain")


@contextlib.contextmanager
def open_tarball(path: Path) -> Iterator[Tuple[tarfile.TarFile, "_Stream"]]:
    """The archive at path, gzip, xz, bzip2 or plain, for reading in stream order."""
    compression = detect_compression(path)
    stream = _Stream(path, compression)
    try:
        try:
            tar = tarfile.open(fileobj=stream, mode="r:")
        except tarfile.ReadError:
            raise Error(
                f"cannot read tarball {path}: "
                + (
                    "not a tar archive (neither plain nor gzip-, xz- or bzip2-compressed)"
                    if compression == "plain"
                    else f"no tar archive inside its {compression} compression"
                )
            ) from None
        except Damaged as exc:
            raise damaged(path, exc) from None
        except READ_ERRORS as exc:
            raise read_error(path, exc) from None
        with tar:
            yield tar, stream
    finally:
        stream.close()


def damaged(path: Path, exc: BaseException) -> Error:
    return Error(f"refusing damaged tarball {path}: {_one_line(exc)}")


def read_to_end(path: Path, tar: tarfile.TarFile, stream: "_Stream") -> None:
    """After the last member tarfile found: the end marker, then nothing but zeros to the
    last byte of the file, which the decompressor checks.  tarfile stops quietly at a
    damaged header mid-archive; GNU tar reports 'Skipping to next header' and fails."""
    why = stream.rest_is_end_marker(tar.offset)
    if why:
        raise Damaged(why)


def read_members(
    path: Path, choose: Callable[[List[str]], Iterable[str]]
) -> Tuple[List[Member], Dict[str, bytes]]:
    """Validate the archive; return its members and the contents of the files chosen.

    choose gets every member name and returns the names to read; it may raise Error.
    Only those are read into memory, each at most MAX_WANTED_SIZE, MAX_WANTED_TOTAL in all.
    """
    contents: Dict[str, bytes] = {}
    with open_tarball(path) as (tar, stream):
        try:
            members = validate(tar)
            read_to_end(path, tar, stream)
            wanted = set(choose([m.name for m in members]))
            total = 0
            for member in members:
                if member.kind != "file" or member.name not in wanted:
                    continue
                if member.info.size > MAX_WANTED_SIZE:
                    raise Error(
                        f"refusing tarball: {member.info.name!r} is "
                        f"{member.info.size} bytes, too big for a boot config"
                    )
                total += member.info.size
                if total > MAX_WANTED_TOTAL:
                    raise Error(
                        f"refusing tarball: its boot configs are over {MAX_WANTED_TOTAL} bytes"
                    )
                handle = tar.extractfile(member.info)
                contents[member.name] = handle.read() if handle else b""
        except Damaged as exc:
            raise damaged(path, exc) from None
        except READ_ERRORS as exc:
            raise read_error(path, exc) from None
    return members, contents


def _all_seen(seen: int, members: List[Member]) -> None:
    """A second read of the archive met every member the first one validated."""
    if seen != len(members):
        raise Damaged(f"{seen} of its {len(members)} members read: it changed while being read")


def extract(path: Path, members: List[Member], dest: Path, replace: Dict[str, bytes]) -> None:
    """Unpack validated members into the empty directory dest, with replaced contents."""
    by_name = {m.info.name: m for m in members}
    dirs = []
    seen = 0
    with open_tarball(path) as (tar, stream):
        try:
            for info in tar:
                member = by_name.get(info.name)
                if member is None:
                    continue
                seen += 1
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
            _all_seen(seen, members)
            read_to_end(path, tar, stream)
        except Damaged as exc:
            raise damaged(path, exc) from None
        except (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError) as exc:
            raise read_error(path, exc) from None
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


@contextlib.contextmanager
def compressed(out: BinaryIO, compression: str) -> Iterator[BinaryIO]:
    """out wrapped in the compressor; no time stamp in the gzip header, so same in, same out."""
    if compression == "plain":
        yield out
        return
    if compression == "gzip":
        stream: BinaryIO = gzip.GzipFile(fileobj=out, mode="wb", mtime=0, compresslevel=6)
    elif compression == "xz":
        stream = lzma.LZMAFile(out, "wb", preset=6)
    else:
        stream = bz2.BZ2File(out, "wb", compresslevel=9)
    try:
        yield stream
    finally:
        stream.close()


def rewrite(
    path: Path,
    members: List[Member],
    out: BinaryIO,
    replace: Dict[str, bytes],
    compression: str,
) -> None:
    """Copy the validated members of the tarball at path into out, with replaced contents.

    Member order and metadata stay, so the same input gives the same bytes.  A pax global
    header (git archive's commit id, for one) stays too: the copy is then written in pax
    format, which carries it, and each member's own pax records with it.
    """
    by_name = {m.info.name: m for m in members}
    seen = 0
    try:
        with open_tarball(path) as (src, source), compressed(
            out, compression
        ) as stream, tarfile.open(
            fileobj=stream,
            mode="w",
            format=tarfile.PAX_FORMAT if src.pax_headers else tarfile.GNU_FORMAT,
            pax_headers=dict(src.pax_headers),
        ) as dst:
            for info in src:
                member = by_name.get(info.name)
                if member is None:
                    if info.name.strip("./") == "":
                        dst.addfile(info)
                    continue
                seen += 1
                if member.kind == "file":
                    if member.name in replace:
                        new = _copy_info(info)
                        data = replace[member.name]
                        new.size = len(data)
                        dst.addfile(new, io.BytesIO(data))
                    elif info.issparse():
                        # tarfile writes a sparse header without its map: the data
                        # would be lost.  The holes are packed as the zeros they read as.
                        new = _copy_info(info)
                        new.type, new.size = tarfile.REGTYPE, info.size
                        dst.addfile(new, src.extractfile(info))
                    else:
                        dst.addfile(info, src.extractfile(info))
                else:
                    dst.addfile(info)
            _all_seen(seen, members)
            read_to_end(path, src, source)
    except Damaged as exc:
        raise damaged(path, exc) from None
    except (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError) as exc:
        raise read_error(path, exc) from None


def _copy_info(info: tarfile.TarInfo) -> tarfile.TarInfo:
    new = tarfile.TarInfo(info.name)
    for attr in ("mode", "uid", "gid", "mtime", "type", "uname", "gname"):
        setattr(new, attr, getattr(info, attr))
    return new


def walk_error(exc: OSError) -> None:
    """os.walk's onerror: an unreadable directory is an error, not a silent omission."""
    raise Error(f"cannot read {exc.filename}: {exc.strerror}")


def write_tree_tarball(
    tree: Path, out: BinaryIO, replace: Dict[str, bytes], compression: str
) -> None:
    """Pack the tree as netboot.tar.gz is packed ('./' names), sorted, with replaced files.

    Hard links stay hard links, except where either name is replaced: the edit in place
    breaks such a link too, so the replaced file is packed as a file of its own.
    """
    entries = []
    # Symlinked directories are not entered.
    for dirpath, dirnames, filenames in os.walk(tree, onerror=walk_error):
        dirnames.sort()
        rel_dir = os.path.relpath(dirpath, tree)
        entries.append(rel_dir)
        links = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
        entries.extend(
            os.path.normpath(os.path.join(rel_dir, name)) for name in sorted(filenames + links)
        )
    with compressed(out, compression) as stream, tarfile.open(
        fileobj=stream, mode="w", format=tarfile.GNU_FORMAT
    ) as dst:
        for rel in entries:
            full = tree / rel
            info = dst.gettarinfo(str(full), "." if rel == "." else "./" + rel)
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            if info.islnk() and (rel in replace or info.linkname[2:] in replace):
                info.type, info.linkname = tarfile.REGTYPE, ""
                info.size = os.lstat(full).st_size
            if info.isreg():
                if rel in replace:
                    info.size = len(replace[rel])
                    dst.addfile(info, io.BytesIO(replace[rel]))
                else:
                    with open(full, "rb") as handle:
                        dst.addfile(info, handle)
            elif info.isdir() or info.issym() or info.islnk():
                dst.addfile(info)
            else:
                raise Error(f"refusing to pack {full}: not a file, directory or symlink")


def lstat_kind(path: Path) -> str:
    mode = os.lstat(path).st_mode
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        return "file"
    return "other"
