"""Atomic file writes and advisory locks."""

import contextlib
import fcntl
import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Iterator, Optional, Union

from debadmin.errors import Error


def fsync_path(path: Path, flags: int = 0) -> None:
    """fsync(2) a file (or, with os.O_DIRECTORY, a directory) by name."""
    fd = os.open(path, os.O_RDONLY | flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(directory: Path) -> None:
    fsync_path(directory, os.O_DIRECTORY)


@contextlib.contextmanager
def atomic_writer(
    path: Path, mode: int = 0o644, uid: Optional[int] = None, gid: Optional[int] = None
) -> Iterator[BinaryIO]:
    """A binary file that replaces path atomically when the with block ends without error.

    Temp file in the same directory, fsync, rename, fsync the directory: an interrupt
    leaves either the old file or the new one, never a half-written file, and the temp file
    is removed on any failure.
    """
    path = Path(path)
    directory = path.parent
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise Error(f"cannot write {path}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            if uid is not None or gid is not None:
                os.fchown(handle.fileno(), -1 if uid is None else uid, -1 if gid is None else gid)
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
    mode: int = 0o644,
    uid: Optional[int] = None,
    gid: Optional[int] = None,
) -> None:
    """Write data to path atomically (see atomic_writer)."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    with atomic_writer(path, mode, uid, gid) as handle:
        handle.write(data)


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
    """Hold an exclusive flock on lock_path (created if missing) for the with block."""
    lock_path = Path(lock_path)
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise Error(f"cannot open lock {lock_path}: {exc.strerror}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            raise Error(f"{lock_path} is locked by another process") from None
        yield
    finally:
        os.close(fd)
