"""Atomic file writes and advisory locks."""

from __future__ import annotations  # annotations stay text: typing is never imported

import contextlib
import fcntl
import os
import stat
from pathlib import Path

from debadmin.errors import Error

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from typing import BinaryIO, Iterator, Optional, Union


def fsync_path(path: Path, flags: int = 0) -> None:
    """fsync(2) a file (or, with os.O_DIRECTORY, a directory) by name."""
    fd = os.open(path, os.O_RDONLY | flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(directory: Path) -> None:
    fsync_path(directory, os.O_DIRECTORY)


def _existing(path: Path) -> Optional[os.stat_result]:
    try:
        return os.stat(path)
    except OSError:
        return None


@contextlib.contextmanager
def atomic_writer(
    path: Path,
    mode: Optional[int] = None,
    uid: Optional[int] = None,
    gid: Optional[int] = None,
    follow_symlinks: bool = False,
) -> Iterator[BinaryIO]:
    """A binary file that replaces path atomically when the with block ends without error.

    Temp file in the same directory, fsync, rename, fsync the directory: an interrupt
    leaves either the old file or the new one, never a half-written file, and the temp file
    is removed on any failure.

    mode, uid and gid default to those of the file being replaced (owner and group only
    when running as root), else 0644 and the caller's. A symlink at path is replaced by
    the new file, unless follow_symlinks: then the file it points to is replaced (a
    user's dotfile kept in a dotfiles repository; never for paths inside a --root
    image, whose absolute links point outside it).
    """
    path = Path(path)
    if follow_symlinks and path.is_symlink():
        path = Path(os.path.realpath(path))
    directory = path.parent
    old = _existing(path) if not path.is_symlink() else None
    if mode is None:
        mode = stat.S_IMODE(old.st_mode) if old else 0o644
    if old and os.geteuid() == 0:
        uid = old.st_uid if uid is None else uid
        gid = old.st_gid if gid is None else gid
    import tempfile  # shutil, random, bz2, lzma: imported only when a file is written

    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise Error(f"cannot write {path}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            if uid is not None or gid is not None:
                os.fchown(handle.fileno(), -1 if uid is None else uid, -1 if gid is None else gid)
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        fsync_dir(directory)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise Error(f"cannot write {path}: {exc.strerror or exc}") from None
        raise


def atomic_write(
    path: Path,
    data: Union[bytes, str],
    mode: Optional[int] = None,
    uid: Optional[int] = None,
    gid: Optional[int] = None,
    follow_symlinks: bool = False,
) -> None:
    """Write data to path atomically (see atomic_writer)."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    with atomic_writer(path, mode, uid, gid, follow_symlinks) as handle:
        handle.write(data)


def make_dirs(*directories: Path) -> None:
    """mkdir -p each; an error names the directory."""
    for directory in directories:
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise Error(f"cannot create {directory}: {exc.strerror}") from None


def read_text(path: Path) -> Optional[str]:
    """The UTF-8 text of path, None when it does not exist; any other failure is an Error."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise Error(f"cannot read {path}: {exc}") from None


def remove_file(path: Path) -> bool:
    """Remove path if present (and fsync its directory); True when something was removed."""
    path = Path(path)
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise Error(f"cannot remove {path}: {exc.strerror}") from None
    fsync_dir(path.parent)
    return True


@contextlib.contextmanager
def locked(lock_path: Path, wait: bool = True) -> Iterator[None]:
    """Hold an exclusive flock on lock_path (created if missing) for the with block.

    The lock file must be a regular file of the caller's own (not a symlink): one that
    another user made, in a directory others can write to, could otherwise be held by
    them for ever."""
    lock_path = Path(lock_path)
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        raise Error(f"cannot open lock {lock_path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            raise Error(
                f"refusing lock {lock_path}: not a regular file of user {os.geteuid()} "
                f"(owner {info.st_uid})"
            )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            raise Error(f"{lock_path} is locked by another process") from None
        yield
    finally:
        os.close(fd)
