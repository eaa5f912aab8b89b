"""secureboot-ca-check: VM NVRAM on block devices (a Proxmox VE efidisk on LVM-thin, a ZFS
zvol, RBD): the store at the start of a larger volume, and who holds the device open."""

import errno
import fcntl
import os
import stat
import struct
from pathlib import Path
from typing import List, Optional, Tuple

from debadmin.errors import Error
from debadmin.secureboot_ca_check import efi

PROC = Path("/proc")
BLKROGET = 0x125E  # _IO(0x12, 94): the device's read-only flag (blockdev --getro)


def is_block_device(path: Path) -> bool:
    """path (a link followed: /dev/pve/vm-100-disk-1, /dev/zvol/...) names a block device."""
    try:
        return stat.S_ISBLK(os.stat(path).st_mode)
    except OSError:
        return False


def device_name(path: Path) -> Path:
    """The device node itself (the links Proxmox VE's storages use resolved)."""
    return Path(os.path.realpath(path))


def open_device(path: Path, write: bool) -> int:
    """A descriptor on the block device; for writing with O_EXCL, which the kernel
    refuses (EBUSY) while the device is mounted or claimed (device-mapper, md, a
    file system)."""
    flags = os.O_CLOEXEC | (os.O_RDWR | os.O_EXCL if write else os.O_RDONLY)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.EBUSY:
            raise Error(
                f"{path}: in use by the kernel (mounted, or claimed by another device): "
                "nothing written"
            ) from None
        raise Error(f"cannot open {path}: {exc.strerror}") from None
    if not stat.S_ISBLK(os.fstat(fd).st_mode):
        os.close(fd)
        raise Error(f"{path}: not a block device")
    if write and read_only(fd):
        # root opens a read-only device O_RDWR; only the write fails (EPERM).
        os.close(fd)
        raise Error(f"{path}: a read-only block device (blockdev --getro): nothing written")
    return fd


def read_only(fd: int) -> bool:
    return bool(struct.unpack("i", fcntl.ioctl(fd, BLKROGET, bytes(4)))[0])


def device_size(fd: int) -> int:
    return os.lseek(fd, 0, os.SEEK_END)


def read_head(fd: int, path: Path) -> bytes:
    """The start of the volume where the store is (the firmware volume; what follows it
    is padding up to the volume's size), at most efi.MAX_VARSTORE bytes."""
    size = min(device_size(fd), efi.MAX_VARSTORE)
    data = bytearray()
    while len(data) < size:
        chunk = os.pread(fd, size - len(data), len(data))
        if not chunk:
            break
        data += chunk
    if len(data) < size:
        raise Error(f"{path}: short read ({len(data)} of {size} bytes)")
    return bytes(data)


def read_device(path: Path) -> bytes:
    """The store's bytes of a block device, for the report."""
    fd = open_device(path, write=False)
    try:
        return read_head(fd, path)
    finally:
        os.close(fd)


def holders(device: Path, proc: Path = PROC) -> List[Tuple[int, str]]:
    """(pid, command) of every other process with the device open (a running VM's qemu),
    by its descriptors under /proc that lead to a device node (compared by device
    number, whatever name it was opened by); processes whose descriptors cannot be read
    are skipped."""
    rdev = os.stat(device).st_rdev
    found = []
    me = os.getpid()
    try:
        pids = [int(n) for n in os.listdir(proc) if n.isdigit()]
    except OSError:
        return found
    for pid in sorted(pids):
        if pid == me:
            continue
        fds = proc / str(pid) / "fd"
        try:
            names = os.listdir(fds)
        except OSError:
            continue
        for name in names:
            try:
                # Device nodes only: a stat through the link of every descriptor would
                # wait on each slow or hung file system a process has a file open on.
                if not os.readlink(fds / name).startswith("/dev/"):
                    continue
                info = os.stat(fds / name)
            except OSError:
                continue
            if stat.S_ISBLK(info.st_mode) and info.st_rdev == rdev:
                found.append((pid, command(proc, pid)))
                break
    return found


def command(proc: Path, pid: int) -> str:
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        raw = b""
    words = raw.rstrip(b"\0").split(b"\0")
    text = " ".join(w.decode("utf-8", "replace") for w in words[:4] if w)
    if len(words) > 4:
        text += " ..."
    if not text:
        try:
            text = (proc / str(pid) / "comm").read_text().strip()
        except OSError:
            text = "?"
    return text


def refuse_held(device: Path) -> None:
    held = holders(device)
    if held:
        who = "; ".join(f"pid {pid} ({efi_printable(cmd)})" for pid, cmd in held)
        raise Error(
            f"{device} is open in another process (a running VM?): {who}: stop it (for a "
            "Proxmox VE VM: qm stop VMID), then run --fix again; nothing written"
        )


def efi_printable(text: str) -> str:
    return "".join(ch if ch.isprintable() else "?" for ch in text)


def volume_length(data: bytes) -> Optional[int]:
    """The firmware volume's length from its header (what a backup keeps)."""
    if len(data) < 40:
        return None
    return int.from_bytes(data[32:40], "little")
