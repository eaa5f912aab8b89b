"""secureboot-ca-check --fix: add the 2023 Microsoft CAs to an edk2 NVRAM file, offline."""

import base64
import datetime
import errno
import fcntl
import hashlib
import os
import re
import shutil
import stat
import struct
import subprocess
import tempfile
import uuid
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from cryptography import x509

from debadmin import fsutil
from debadmin.errors import Error
from debadmin.output import emit_json
from debadmin.secureboot_ca_check import blockdev, efi
from debadmin.secureboot_ca_check import payloads

# What --fix adds: (id, subject CN, variable, SHA-256 fingerprint), as in
# secureboot_ca_check.KNOWN_CAS (a unit test keeps the two equal).
TARGETS: Tuple[Tuple[str, str, str, str], ...] = (
    (
        "kek_2k_ca_2023",
        "Microsoft Corporation KEK 2K CA 2023",
        "KEK",
        "3cd3f0309edae228767a976dd40d9f4affc4fbd5218f2e8cc3c9dd97e8ac6f9d",
    ),
    (
        "uefi_ca_2023",
        "Microsoft UEFI CA 2023",
        "db",
        "f6124e34125bee3fe6d79a574eaa7b91c0e7bd9d929c1a321178efd611dad901",
    ),
    (
        "windows_uefi_ca_2023",
        "Windows UEFI CA 2023",
        "db",
        "076f1fea90ac29155ebf77c17682f75f1fdd1be196da302dc8461e350a9ae330",
    ),
    (
        "option_rom_uefi_ca_2023",
        "Microsoft Option ROM UEFI CA 2023",
        "db",
        "e5be3e64c6e66a281457ecdece0d6d0787577aad2a3a0144262c10c14ba8d8f1",
    ),
)
TARGETS_BY_ID = {t[0]: t for t in TARGETS}
# Microsoft Corporation KEK CA 2011: with KEK 2K CA 2023, what makes the keys Microsoft's.
MICROSOFT_KEK_2011 = "a1117f516a32cefcba3f2d1ace10a87972fd6bbe8fe0d0b996e09e65d802a503"
# Where installed copies are looked for (relative to the root): trixie's
# python3-virt-firmware ships three of the four as PEM files; sid's ovmf enrols all four in
# its Microsoft templates.
CERT_DIRS = ("usr/lib/python3/dist-packages/virt/firmware/certs",)
TEMPLATE_STORES = ("usr/share/OVMF/OVMF_VARS_4M.ms.fd", "usr/share/OVMF/OVMF_VARS.ms.fd")
MAX_CERT_FILE = 1 << 20
QCOW2_MAGIC = b"QFI\xfb"
# OVMF's and ArmVirtQemu's variable stores are 256 KiB (in a flash image of up to 64 MiB);
# a bigger one is hostile, and walking a million headers of it would take minutes.
MAX_STORE = 2 << 20

VAR_DELETED = 0xFD
VAR_HEADER = struct.Struct("<HBBIQ16sIII16s")  # AUTHENTICATED_VARIABLE_HEADER, 60 bytes
# Fault-tolerant write working block (MdeModulePkg/Include/Guid/SystemNvDataGuid.h).
FTW_SIGNATURES = (
    "9e58292b-7c68-497d-a0ce-6500fd9f1b95",  # gEdkiiWorkingBlockSignatureGuid
    "fff12b8d-7696-4c8b-a985-2747075b4f50",  # gEfiSystemNvDataFvGuid (older builds)
)
FTW_HEADER = 32
FTW_WRITE_HEADER = 40
FTW_RECORD = 40
PEM_BLOCK = re.compile(
    rb"-----BEGIN CERTIFICATE-----\s*([A-Za-z0-9+/=\s]+?)-----END CERTIFICATE-----"
)


# --- the variable store ----------------------------------------------------------------------


@dataclass
class Slot:
    """One variable header in the store, wherever its state."""

    offset: int
    state: int
    attributes: int
    name: str
    guid: str
    data_at: int
    data_size: int

    @property
    def end(self) -> int:
        return self.data_at + self.data_size


@dataclass
class Store:
    data: bytes
    source: str
    start: int  # first variable header
    end: int  # end of the variable store
    free: int  # where edk2's walk ends, and writes its next variable
    erased: bool = True  # the rest of the store erased (else edk2 reclaims at its start)
    fv_end: int = 0  # end of the firmware volume: what follows is copied as it is
    slots: List[Slot] = field(default_factory=list)

    _current: Optional[Dict[Tuple[str, str], Slot]] = None

    def current(self, name: str, guid: str) -> Optional[Slot]:
        """The copy edk2 uses (FindVariableEx): the first VAR_ADDED one, else the last
        VAR_ADDED & VAR_IN_DELETED_TRANSITION one."""
        if self._current is None:
            added: Dict[Tuple[str, str], Slot] = {}
            transition: Dict[Tuple[str, str], Slot] = {}
            for slot in self.slots:
                key = (slot.name, slot.guid)
                if slot.state == efi.VAR_ADDED:
                    added.setdefault(key, slot)
                elif slot.state == efi.VAR_ADDED_IN_DELETED_TRANSITION:
                    transition[key] = slot
            self._current = {**transition, **added}
        return self._current.get((name, guid))


def align4(value: int) -> int:
    return (value + 3) & ~3


def walk_store(data: bytes, source: str, ftw: bool = True) -> Store:
    """Every variable header of an authenticated edk2 store, checked to the end.

    Also checks what edk2 checks before it trusts the store (firmware volume header and its
    checksum, store header) and that the fault-tolerant write working block holds no
    unfinished write that edk2 would replay over the store at the next boot.
    """
    if len(data) >= 0x48:
        header_length = struct.unpack_from("<H", data, 48)[0]
        if header_length + 20 <= len(data):
            store_size = struct.unpack_from("<I", data, header_length + 16)[0]
            if store_size > MAX_STORE:
                raise Error(
                    f"{source}: a variable store of {store_size} bytes is larger than edk2 "
                    f"builds make them (OVMF: 256 KiB); --fix refuses more than "
                    f"{MAX_STORE >> 20} MiB"
                )
    # The same checks as the report's reader, first: one verdict on what is readable.
    efi.parse_varstore(data, source)
    header_length = struct.unpack_from("<H", data, 48)[0]
    fv_length = struct.unpack_from("<Q", data, 32)[0]
    store_guid, store_size = struct.unpack_from("<16sI", data, header_length)
    if efi.guid_str(store_guid) != efi.AUTH_VARIABLE_GUID:
        raise Error(f"{source}: not an authenticated variable store: cannot hold KEK or db")
    end = header_length + store_size
    store = Store(data, source, align4(header_length + 28), end, 0, fv_length)
    walk_end = efi.WalkEnd()
    for offset, state, attributes, raw_name, vendor, data_at, data_size in efi.walk_variables(
        data, store.start, end, True, source, every=True, walk_end=walk_end
    ):
        # parse_varstore checked sizes, termination and encoding of every finished
        # header; an unfinished one has no name here (edk2 never reads it).
        name = raw_name[:-2].decode("utf-16-le", "replace")
        slot = Slot(offset, state, attributes, name, efi.guid_str(vendor), data_at, data_size)
        store.slots.append(slot)
    store.free, store.erased = walk_end.offset, walk_end.erased
    if ftw:
        check_ftw(data, end, fv_length, source)
    return store


def check_ftw(data: bytes, store_end: int, fv_length: int, source: str) -> None:
    """Refuse a store whose FTW working block is missing, damaged or has a pending write."""
    for at in range((store_end + 0xFFF) & ~0xFFF, fv_length - FTW_HEADER + 1, 0x1000):
        if efi.guid_str(data[at : at + 16]) in FTW_SIGNATURES:
            break
    else:
        raise Error(
            f"{source}: no fault-tolerant write working block after the variable store: "
            "unknown store layout"
        )
    crc, flags, queue_size = struct.unpack_from("<IB3xQ", data, at + 16)
    header = bytearray(data[at : at + FTW_HEADER])
    header[16:20] = b"\xff\xff\xff\xff"
    header[20] = 0xFF
    # WorkingBlockValid (bit 0) cleared, WorkingBlockInvalid (bit 1) still set.
    if zlib.crc32(bytes(header)) != crc or flags & 3 != 2:
        raise Error(f"{source}: fault-tolerant write working block is damaged (CRC or state)")
    queue_end = at + FTW_HEADER + queue_size
    if queue_end > fv_length:
        raise Error(f"{source}: fault-tolerant write queue runs past the volume")
    pos = at + FTW_HEADER
    while pos + FTW_WRITE_HEADER <= queue_end:
        state = data[pos]
        if state == 0xFF:
            return
        writes, private = struct.unpack_from("<QQ", data, pos + 24)
        if writes > 1024 or private > 4096:
            raise Error(f"{source}: fault-tolerant write queue is damaged")
        records = pos + FTW_WRITE_HEADER
        if not state & 0x4:  # Complete
            pos = records + writes * (FTW_RECORD + private)
            continue
        raise Error(
            f"{source}: the firmware's last fault-tolerant write did not finish (edk2 would "
            "replay it over the store at the next boot): start the VM once, shut it down "
            "cleanly, then run --fix again"
        )


def variable_blob(old: bytes, new_data: bytes, name: str) -> bytes:
    """A VAR_ADDED copy of the variable whose header is old, with new_data, 4-aligned
    (edk2 pads with the erased value 0xff)."""
    fields = list(VAR_HEADER.unpack_from(old))
    raw_name = (name + "\0").encode("utf-16-le")
    fields[1] = efi.VAR_ADDED
    fields[7] = len(raw_name)
    fields[8] = len(new_data)
    blob = VAR_HEADER.pack(*fields) + raw_name + new_data
    return blob + b"\xff" * (align4(len(blob)) - len(blob))


def readback_volume(head: bytes) -> bytes:
    """head (a volume up to the end of its store) as a volume of its own, for reading it
    back: the length in the header cut to it, the header checksum made again."""
    volume = bytearray(head)
    header_length = struct.unpack_from("<H", volume, 48)[0]
    struct.pack_into("<Q", volume, 32, len(volume))
    struct.pack_into("<H", volume, 50, 0)
    checksum = -sum(struct.unpack_from(f"<{header_length // 2}H", volume)) & 0xFFFF
    struct.pack_into("<H", volume, 50, checksum)
    return bytes(volume)


def rewrite(store: Store, updates: Dict[Tuple[str, str], bytes]) -> bytes:
    """The store with each (name, guid) variable given new data, as edk2 leaves it.

    edk2's UpdateVariable appends the new copy after the last variable and marks the old
    one deleted (0x3f, then 0x3e in transition, then 0x3c); without room it reclaims
    first (Reclaim): the valid variables copied compactly, the updated one last.
    """
    # Up to the end of the store only: the rest of the volume (event log, FTW working
    # and spare blocks) stays as it is, and a 64 MiB flash image is not copied.
    data = bytearray(memoryview(store.data)[: store.end])
    olds = {key: store.current(*key) for key in updates}
    blobs = []
    for key, new_data in updates.items():
        old = olds[key]
        if old is None:
            raise Error(f"{store.source}: {key[0]} is not in the store")
        blobs.append(variable_blob(store.data[old.offset : old.data_at], new_data, key[0]))
    needed = sum(map(len, blobs))
    # Appended where edk2 appends its next variable, when the rest of the store is free;
    # when it is not (a write a power-off cut short left bytes after where edk2's walk
    # ends), edk2 reclaims at its next start and would drop anything appended there.
    if store.erased and store.free + needed <= store.end:
        data[store.free : store.free + needed] = b"".join(blobs)
        # The old copy, and as UpdateVariable does an in-transition copy beside it too.
        for slot in store.slots:
            key = (slot.name, slot.guid)
            if key in updates and (
                slot is olds[key] or slot.state == efi.VAR_ADDED_IN_DELETED_TRANSITION
            ):
                data[slot.offset + 2] &= efi.VAR_IN_DELETED_TRANSITION & VAR_DELETED
        return bytes(data)
    # Reclaim as edk2's Reclaim(): the VAR_ADDED variables its walk finds, in order,
    # then each VAR_ADDED & VAR_IN_DELETED_TRANSITION one with no VAR_ADDED copy kept
    # (the first, promoted to VAR_ADDED), then the updated ones.  Whatever the walk does
    # not reach (a cut-short write and anything after it) is dropped, as edk2 drops it.
    added, promoted, seen = [], [], set()
    for slot in store.slots:
        key = (slot.name, slot.guid)
        if key not in updates and slot.state == efi.VAR_ADDED:
            added.append(slot)
            seen.add(key)
    for slot in store.slots:
        key = (slot.name, slot.guid)
        if (
            key not in updates
            and key not in seen
            and slot.state == efi.VAR_ADDED_IN_DELETED_TRANSITION
        ):
            promoted.append(slot)
            seen.add(key)
    kept = []
    for slot in added + promoted:
        raw = bytearray(store.data[slot.offset : align4(slot.end)])
        raw[2] = efi.VAR_ADDED
        kept.append(bytes(raw))
    body = b"".join(kept + blobs)
    if store.start + len(body) > store.end:
        raise Error(
            f"{store.source}: not enough room: the variable store holds "
            f"{store.end - store.start} bytes, the variables with the new certificates "
            f"need {len(body)}"
        )
    data[store.start : store.end] = body + b"\xff" * (store.end - store.start - len(body))
    return bytes(data)


# --- certificates ----------------------------------------------------------------------------


@dataclass
class Cert:
    target: Tuple[str, str, str, str]
    der: bytes
    origin: str


def certificates_in(blob: bytes, source: str) -> List[bytes]:
    """The DER certificates of a DER or PEM file."""
    if b"-----BEGIN" in blob:
        ders = []
        for match in PEM_BLOCK.finditer(blob):
            try:
                ders.append(base64.b64decode(re.sub(rb"\s", b"", match.group(1)), validate=True))
            except ValueError:
                raise Error(f"{source}: bad base64 in a PEM certificate") from None
        if not ders:
            raise Error(f"{source}: no PEM CERTIFICATE block")
        return ders
    return [blob]


def parse_cert(der: bytes, source: str) -> x509.Certificate:
    try:
        if efi.der_length(der) != len(der):
            raise ValueError("trailing bytes")
        return efi.load_certificate(der)
    except Exception as exc:  # cryptography raises ValueError and friends
        raise Error(
            f"{source}: not a DER or PEM X.509 certificate ({exc.__class__.__name__})"
        ) from None


def target_of(der: bytes) -> Optional[Tuple[str, str, str, str]]:
    """The target whose fingerprint is the SHA-256 of der: of the very bytes that would be
    written, not of cryptography's re-encoding of what it parsed."""
    sha256 = hashlib.sha256(der).hexdigest()
    return next((t for t in TARGETS if t[3] == sha256), None)


def load_cert_files(paths: List[str]) -> Dict[str, Cert]:
    """The certificates named by --cert, each one of the four or an Error."""
    found: Dict[str, Cert] = {}
    for path in paths:
        blob = efi.read_bounded(Path(path), MAX_CERT_FILE, "a certificate")
        for der in certificates_in(blob, path):
            parse_cert(der, path)
            target = target_of(der)
            if target is None:
                raise Error(
                    f"{path}: certificate with SHA-256 fingerprint "
                    f"{hashlib.sha256(der).hexdigest()} is not one of the four Microsoft "
                    "2023 CAs --fix adds"
                )
            found[target[0]] = Cert(target, der, path)
    return found


def installed_certs(root: Path) -> Dict[str, Cert]:
    """The four CAs where Debian packages installed them; files that do not match a
    known fingerprint are passed over."""
    found: Dict[str, Cert] = {}
    for directory in CERT_DIRS:
        try:
            names = sorted(os.listdir(root / directory))
        except OSError:
            continue
        for name in names:
            path = root / directory / name
            if not name.endswith((".pem", ".der", ".crt", ".cer")):
                continue
            try:
                blob = efi.read_bounded(path, MAX_CERT_FILE, "a certificate")
                for der in certificates_in(blob, str(path)):
                    parse_cert(der, str(path))
                    target = target_of(der)
                    if target and target[0] not in found:
                        found[target[0]] = Cert(target, der, str(path))
            except Error:
                continue
    for template in TEMPLATE_STORES:
        path = root / template
        if not path.is_file():
            continue
        try:
            variables = efi.read_varstore(path)
            for var in ("KEK", "db"):
                if var in variables:
                    for entry in efi.parse_signature_lists(variables[var].data, str(path)):
                        if entry.cert is None:
                            continue
                        # Without the zeros some firmware pads an entry with.
                        der = entry.data[: efi.der_length(entry.data)]
                        target = target_of(der)
                        if target and target[0] not in found:
                            found[target[0]] = Cert(target, der, f"{path} ({var})")
        except Error:
            continue
    return found


def signature_list(der: bytes) -> bytes:
    """One EFI_SIGNATURE_LIST holding one X.509 certificate owned by Microsoft."""
    size = 16 + len(der)
    return (
        uuid.UUID(efi.CERT_X509).bytes_le
        + struct.pack("<III", 28 + size, 0, size)
        + uuid.UUID(efi.MICROSOFT_OWNER).bytes_le
        + der
    )


# --- planning and writing ----------------------------------------------------------------------


VAR_GUIDS = {"KEK": efi.GLOBAL_GUID, "db": efi.IMAGE_SECURITY_GUID}


@dataclass
class Plan:
    source: str
    add: List[Cert] = field(default_factory=list)  # what will be added
    present: List[str] = field(default_factory=list)  # ids already there
    unavailable: List[Tuple[str, str, str, str]] = field(default_factory=list)
    updates: Dict[Tuple[str, str], bytes] = field(default_factory=dict)
    new_bytes: Optional[Tuple[bytes, memoryview]] = None  # the new volume, the rest

    def as_json(self) -> dict:
        return {
            "path": self.source,
            "added": [
                {"ca": c.target[0], "name": c.target[1], "variable": c.target[2], "from": c.origin}
                for c in self.add
            ],
            "present": self.present,
            "unavailable": [
                {"ca": t[0], "name": t[1], "variable": t[2]} for t in self.unavailable
            ],
        }


def plan_fix(data: bytes, source: str, certs: Dict[str, Cert]) -> Plan:
    """What --fix does to the raw store data: checks everything, writes nothing."""
    store = walk_store(data, source)
    plan = Plan(source)
    current = enrolled_keys(store, data, source)
    # Per variable: a db CA found in KEK (or the other way round) does not count.
    present = {
        (var, efi.fingerprint(e.cert))
        for var in VAR_GUIDS
        for e in efi.parse_signature_lists(current[var], f"{source}: {var}")
        if e.cert is not None
    }
    if not present & {("KEK", MICROSOFT_KEK_2011), ("KEK", TARGETS[0][3])}:
        raise Error(
            f"{source}: KEK holds no Microsoft KEK CA: the keys are not Microsoft's, "
            "--fix does not add Microsoft's CAs to them"
        )
    additions: Dict[str, bytes] = {}
    for target in TARGETS:
        if (target[2], target[3]) in present:
            plan.present.append(target[0])
        elif target[0] in certs:
            cert = certs[target[0]]
            plan.add.append(cert)
            additions[target[2]] = additions.get(target[2], b"") + signature_list(cert.der)
        else:
            plan.unavailable.append(target)
    for var, extra in additions.items():
        plan.updates[(var, VAR_GUIDS[var])] = current[var] + extra
    if plan.updates:
        new = rewrite(store, plan.updates)  # bytes up to the end of the store
        check_rewrite(data, new, store, plan.updates, source)
        plan.new_bytes = (new, memoryview(data)[store.end :])
    return plan


def enrolled_keys(store: Store, data: bytes, source: str) -> Dict[str, bytes]:
    """The data of KEK and db as edk2 uses them; an Error when either is missing or not
    an authenticated variable."""
    current = {}
    for var, guid in VAR_GUIDS.items():
        slot = store.current(var, guid)
        if slot is None:
            raise Error(
                f"{source}: no {var} variable: no Secure Boot keys are enrolled (a store made "
                "from an OVMF_VARS template without .ms holds none), nothing to add to"
            )
        if (slot.attributes & efi.ATTR_AUTHENTICATED_DB) != efi.ATTR_AUTHENTICATED_DB:
            raise Error(f"{source}: {var}: attributes 0x{slot.attributes:08x} are not 0x27")
        current[var] = bytes(data[slot.data_at : slot.end])
    return current


def check_rewrite(
    data: bytes, new: bytes, store: Store, updates: Dict[Tuple[str, str], bytes], source: str
) -> None:
    """Read back what was built, as edk2 will: the same checks, the new data in place.
    Every variable the report reads is what edk2 saw before, or the new data, and edk2
    finds the rest of the new store free (else it would reclaim it)."""
    check = efi.parse_varstore(readback_volume(new), source)
    expected = {name: variable.data for name, variable in efi.parse_varstore(data, source).items()}
    expected.update({var: value for (var, _guid), value in updates.items()})
    readback = walk_store(readback_volume(new), source, ftw=False)
    if (
        {name: variable.data for name, variable in check.items()} != expected
        or not readback.erased
        or len(new) != store.end
    ):
        raise Error(f"{source}: internal error: the rewritten store does not read back")


def ofd_locked(fd: int, take: bool = True) -> bool:
    """Whether another open file description holds a lock on the file (qemu holds OFD
    read locks on the NVRAM file of a running VM); unless take is false, takes a write
    lock on it otherwise.  take=False only asks (F_OFD_GETLK, which a descriptor opened
    read-only may do: a --dry-run on a read-only file or device)."""
    lock = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
    if not take:
        found = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, lock)
        return struct.unpack("hhqqi4x", found)[0] != fcntl.F_UNLCK
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, lock)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return True
        raise
    return False


def qemu_img(*args: str) -> None:
    try:
        result = subprocess.run(
            ["qemu-img", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env={**os.environ, "LC_ALL": "C.UTF-8"},
            timeout=60,
        )
    except FileNotFoundError:
        raise Error("qemu-img is needed for qcow2 NVRAM files (apt install qemu-utils)") from None
    except subprocess.TimeoutExpired:
        raise Error("qemu-img did not finish within 60 s") from None
    if result.returncode:
        message = result.stderr.decode("utf-8", "replace").strip().splitlines()
        raise Error(f"qemu-img {args[0]} failed: {message[-1] if message else result.returncode}")


def check_qcow2(image: bytes, path: Path) -> None:
    """Refuse a qcow2 NVRAM whose data is not in this file alone or that qemu-img cannot
    rewrite faithfully (QEMU's docs/interop/qcow2.txt header)."""
    version = struct.unpack_from(">I", image, 4)[0] if len(image) >= 8 else 0
    if len(image) < (104 if version >= 3 else 72):
        raise Error(f"{path}: truncated qcow2 header")
    backing_offset, _, _, size, crypt = struct.unpack_from(">QIIQI", image, 8)
    incompatible = struct.unpack_from(">Q", image, 72)[0] if version >= 3 else 0
    if backing_offset:
        raise Error(
            f"{path}: a qcow2 file with a backing file: only single-file NVRAM is read or fixed"
        )
    if incompatible & 0x4:
        raise Error(f"{path}: a qcow2 file with an external data file: refused")
    if incompatible & 0x2:
        raise Error(f"{path}: qcow2 file marked corrupt (qemu-img check -r all)")
    if crypt:
        raise Error(f"{path}: an encrypted qcow2 file: refused")
    if size > efi.MAX_VARSTORE:
        raise Error(f"{path}: qcow2 of {size} bytes, larger than a varstore")


def read_store_file(handle, path: Path) -> Tuple[bytes, Optional[bytes]]:
    """The raw store bytes of an open NVRAM file (qcow2 converted by qemu-img) and, for
    qcow2, the image itself."""
    head = os.pread(handle.fileno(), 4, 0)
    if head != QCOW2_MAGIC:
        handle.seek(0)
        data = handle.read(efi.MAX_VARSTORE + 1)
        if len(data) > efi.MAX_VARSTORE:
            raise Error(f"{path}: larger than {efi.MAX_VARSTORE >> 20} MiB, not a varstore")
        return data, None
    # qemu-img reads a copy: it would refuse the file we hold locked.
    handle.seek(0)
    image = handle.read(2 * efi.MAX_VARSTORE + 1)
    if len(image) > 2 * efi.MAX_VARSTORE:
        raise Error(f"{path}: larger than {2 * efi.MAX_VARSTORE >> 20} MiB, not a varstore")
    check_qcow2(image, path)
    with tempfile.TemporaryDirectory(prefix="secureboot-ca-check.") as tmp:
        copy, raw = Path(tmp) / "qcow2", Path(tmp) / "raw"
        copy.write_bytes(image)
        qemu_img("convert", "-f", "qcow2", "-O", "raw", str(copy), str(raw))
        return efi.read_bounded(raw, efi.MAX_VARSTORE, "a varstore"), image


def read_nvram(path: Path) -> bytes:
    """The raw store of an NVRAM file, raw or qcow2, or of a block device (for the
    report)."""
    if blockdev.is_block_device(path):
        return blockdev.read_device(blockdev.device_name(path))
    with efi.open_regular(path) as handle:
        return read_store_file(handle, path)[0]


def read_varstore(path: Path) -> Dict[str, efi.Variable]:
    """The report's variables of an NVRAM file, raw or qcow2 (--varstore): read as --fix
    and --libvirt read it, so that what one can fix the other can check."""
    try:
        data = read_nvram(path)
    except OSError as exc:
        raise Error(f"cannot read {path}: {exc.strerror}") from None
    return efi.parse_varstore(data, str(path))


def write_store(path: Path, chunks, image: Optional[bytes], info: os.stat_result) -> None:
    owner = {"uid": info.st_uid, "gid": info.st_gid} if os.geteuid() == 0 else {}
    mode = stat.S_IMODE(info.st_mode)
    if image is None:
        with fsutil.atomic_writer(path, mode=mode, **owner) as out:
            for chunk in chunks:
                out.write(chunk)
        return
    raw_data = b"".join(chunks)
    with tempfile.TemporaryDirectory(prefix="secureboot-ca-check.") as tmp:
        raw, copy, back = Path(tmp) / "raw", Path(tmp) / "qcow2", Path(tmp) / "back"
        raw.write_bytes(raw_data)
        # Written into a copy of the original (-n): its cluster size, compat level,
        # refcount width, compression type and internal snapshots stay as they were.
        copy.write_bytes(image)
        qemu_img("convert", "-n", "-f", "raw", "-O", "qcow2", str(raw), str(copy))
        qemu_img("convert", "-f", "qcow2", "-O", "raw", str(copy), str(back))
        if back.read_bytes() != raw_data:
            raise Error(f"{path}: internal error: the rewritten qcow2 file does not read back")
        with fsutil.atomic_writer(path, mode=mode, **owner) as out, open(copy, "rb") as src:
            shutil.copyfileobj(src, out)


def backup_path(path: Path, now: datetime.datetime) -> Path:
    """A name beside path that no file has: an earlier backup is never replaced."""
    stamp = now.strftime("%Y%m%dT%H%M%SZ")
    backup, number = path.with_name(f"{path.name}.{stamp}.bak"), 1
    while os.path.lexists(backup):
        backup, number = path.with_name(f"{path.name}.{stamp}.{number}.bak"), number + 1
    return backup


def unchanged(fd: int, path: Path, seen: os.stat_result) -> None:
    """Refuse when the file changed since it was read (a writer that takes no lock) or
    path names another file now (replaced by rename): the change would be lost."""
    now = os.fstat(fd)
    try:
        named = os.stat(path, follow_symlinks=False)
    except OSError:
        named = None
    if (
        (now.st_size, now.st_mtime_ns) != (seen.st_size, seen.st_mtime_ns)
        or named is None
        or (
            named.st_dev,
            named.st_ino,
        )
        != (now.st_dev, now.st_ino)
    ):
        raise Error(f"{path} changed while --fix read it: nothing written, run it again")


DPKG_INFO = "var/lib/dpkg/info"


def package_owner(path: Path, root: Path = Path("/")) -> Optional[str]:
    """The package whose files list path (dpkg's database under root, the .list files
    dpkg-query -S reads), by the name given and by its real path (usr-merge aliases);
    None when no package owns it."""
    names = set()
    for candidate in (Path(os.path.abspath(path)), Path(os.path.realpath(path))):
        try:
            names.add("/" + candidate.relative_to(os.path.abspath(root)).as_posix())
        except ValueError:  # not under root: its own name
            names.add(str(candidate))
    wanted = [b"\n" + os.fsencode(n) + b"\n" for n in names]
    info = root / DPKG_INFO
    try:
        lists = sorted(n for n in os.listdir(info) if n.endswith(".list"))
    except OSError:
        return None
    for name in lists:
        try:
            with open(info / name, "rb") as handle:
                listed = b"\n" + handle.read() + b"\n"  # one search per name, in C
        except OSError:
            continue
        if any(line in listed for line in wanted):
            return name[: -len(".list")].split(":")[0]
    return None


def refuse_packaged(path: Path, root: Path) -> None:
    owner = package_owner(path, root)
    if owner:
        raise Error(
            f"{path}: belongs to the package {owner} (dpkg would restore it, and every VM "
            f"created from it later would get the change): copy it (cp {path} VM_VARS.fd) "
            "and fix the copy; nothing written"
        )


def fix_file(
    path: Path, certs: Dict[str, Cert], dry_run: bool, root: Path = Path("/"), planner=None
) -> dict:
    """Plan, and unless dry_run apply, the fix of one NVRAM file; the JSON result.
    planner (default plan_fix) makes the plan from the store's bytes (dbx.py's for dbx).

    The lock taken before the file is read is held until the new file is in place.  A
    dry run opens the file read-only and takes no lock (it asks whether another holds
    one): it works on a file it may not write (a read-only mount, a copy without write
    permission)."""
    refuse_packaged(path, root)
    if blockdev.is_block_device(path):
        return fix_device(path, certs, dry_run, root, planner)
    mode = os.O_RDONLY if dry_run else os.O_RDWR
    try:
        fd = os.open(path, mode | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Error(f"{path}: a symbolic link: name the NVRAM file itself") from None
        raise Error(f"cannot open {path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Error(f"{path}: not a regular file")
        os.set_blocking(fd, True)
        if ofd_locked(fd, take=not dry_run):
            raise Error(f"{path} is locked by another process (a running VM?): shut it down first")
        seen = os.fstat(fd)
        data, image = read_store_file(handle, path)
        plan = (planner or plan_fix)(data, str(path), certs)
        result = plan.as_json()
        result.update(
            {"format": "raw" if image is None else "qcow2", "backup": None, "written": False}
        )
        if plan.new_bytes is None or dry_run:
            return result
        unchanged(fd, path, seen)
        backup = backup_path(path, datetime.datetime.now(datetime.timezone.utc))
        owner = {"uid": info.st_uid, "gid": info.st_gid} if os.geteuid() == 0 else {}
        # The backup from the file we hold open (and locked), whatever its format.
        handle.seek(0)
        with fsutil.atomic_writer(backup, mode=stat.S_IMODE(info.st_mode), **owner) as out:
            shutil.copyfileobj(handle, out)
        unchanged(fd, path, seen)
        write_store(path, plan.new_bytes, image, info)
        result.update({"backup": str(backup), "written": True})
        return result


DEVICE_BACKUPS = "var/lib/secureboot-ca-check"


def fix_device(
    path: Path, certs: Dict[str, Cert], dry_run: bool, root: Path, planner=None
) -> dict:
    """fix_file() for a block device (an efidisk): the store at its start, the rest of
    the volume left as it is.  Refused while any other process holds the device open;
    written in place (a device cannot be renamed over): the volume's bytes first saved
    to a backup file (fsynced), then the store's new bytes, fsynced, read back."""
    device = blockdev.device_name(path)
    blockdev.refuse_held(device)
    fd = blockdev.open_device(device, write=not dry_run)
    try:
        data = blockdev.read_head(fd, device)
        plan = (planner or plan_fix)(data, str(path), certs)
        result = plan.as_json()
        result.update(
            {"format": "block device", "device": str(device), "backup": None, "written": False}
        )
        if plan.new_bytes is None or dry_run:
            return result
        new = plan.new_bytes[0]  # up to the end of the store; the rest stays on the device
        blockdev.refuse_held(device)
        if blockdev.read_head(fd, device) != data:
            raise Error(f"{path} changed while --fix read it: nothing written, run it again")
        backup = device_backup(root, path, data)
        written = 0
        while written < len(new):
            written += os.pwrite(fd, new[written:], written)
        os.fsync(fd)
        if os.pread(fd, len(new), 0) != new:
            raise Error(
                f"{path}: the store does not read back as written: restore it with "
                f"dd if={backup} of={device} conv=fsync"
            )
        result.update({"backup": str(backup), "written": True})
        return result
    finally:
        os.close(fd)


def device_backup(root: Path, path: Path, data: bytes) -> Path:
    """The firmware volume at the start of the device (all of what was read when its
    header gives no sensible length), in a new file under ROOT/var/lib/secureboot-ca-check,
    fsynced before anything is written to the device."""
    length = blockdev.volume_length(data)
    volume = data[:length] if length and length <= len(data) else data
    base = root / DEVICE_BACKUPS
    try:
        os.makedirs(base, mode=0o755, exist_ok=True)
    except OSError as exc:
        raise Error(f"cannot create {base}: {exc.strerror}: nothing written") from None
    backup = backup_path(base / path.name, datetime.datetime.now(datetime.timezone.utc))
    try:
        fsutil.atomic_write(backup, volume, mode=0o600)
    except OSError as exc:
        raise Error(f"cannot write the backup {backup}: {exc.strerror}: nothing written") from None
    return backup


def shipped_certs(root: Path, directory: Optional[str] = None) -> Dict[str, Cert]:
    """The four certificates of Microsoft's objects (shipped by this package under
    /usr/share/secureboot-ca-check, or --payloads DIR), each checked by fingerprint."""
    base = Path(directory) if directory else root / str(payloads.DEFAULT_DIR).lstrip("/")
    found: Dict[str, Cert] = {}
    for ca, rel in payloads.CERTIFICATE_FILES.items():
        path = base / rel
        if not directory and not os.path.lexists(path):
            continue  # not installed (another --root): the other sources may have it
        try:
            der = efi.read_bounded(path, MAX_CERT_FILE, "a certificate")
        except Error as exc:
            raise payloads.PayloadError(str(exc)) from None
        if hashlib.sha256(der).hexdigest() != payloads.FINGERPRINTS[ca]:
            # Never written (only what matches a known fingerprint is), and no verdict
            # either: the shipped copy is damaged or replaced.
            raise payloads.PayloadError(
                f"{path}: not the certificate of {ca} (SHA-256 fingerprint differs): "
                "damaged or replaced, not as Microsoft published it: nothing written"
            )
        target = target_of(der)
        if target is not None and target[0] == ca:
            found[ca] = Cert(target, der, str(path))
    return found


def available_certs(
    cert_files: List[str], root: Path, directory: Optional[str] = None
) -> Dict[str, Cert]:
    """The --cert files, then the installed copies, then Microsoft's as this package
    ships them (or --payloads DIR); an Error when there is none at all."""
    found = {
        **shipped_certs(root, directory),
        **installed_certs(root),
        **load_cert_files(cert_files),
    }
    if not found:
        raise Error(
            "no certificate of the 2023 CAs found (python3-virt-firmware, which bookworm "
            "lacks, ships three): pass them with --cert FILE, see secureboot-ca-check(8)"
        )
    return found


def render_fix(result: dict, dry_run: bool) -> List[str]:
    lines = [f"{result['path']}:"]
    verb = "would add" if dry_run else "added"
    for item in result["added"]:
        lines.append(f"  {verb} {item['name']} to {item['variable']} (from {item['from']})")
    names = {t[0]: t[1] for t in TARGETS}
    for ca in result["present"]:
        lines.append(f"  already present: {names[ca]}")
    for item in result["unavailable"]:
        lines.append(
            f"  not added: {item['name']}: no certificate (pass it with --cert FILE, "
            "see secureboot-ca-check(8))"
        )
    if result.get("backup"):
        lines.append(f"  backup of the original: {result['backup']}")
    if not result["added"]:
        lines.append("  nothing to change")
    lines += block_device_note(result)
    return lines


def block_device_note(result: dict) -> List[str]:
    """What the held-open check of a block device cannot see."""
    if result.get("format") != "block device":
        return []
    return [
        "  note: only this host's processes were checked for the device: a VM running on "
        "another cluster node, or a qemu using librbd, is not seen (on Proxmox VE, "
        "'qm status VMID' on the VM's node must say stopped)"
    ]


# Without these two the report's verdict stays "action needed" (the others are advice).
REQUIRED = ("kek_2k_ca_2023", "uefi_ca_2023")


def still_needed(result: dict) -> bool:
    return any(item["ca"] in REQUIRED for item in result["unavailable"])


def cmd_fix(args) -> int:
    """--varstore FILE... --fix: every file checked first, then each written."""
    root = Path(args.root or "/")
    paths = [Path(p) for p in args.varstore]
    for path in paths:  # before anything else: the answer is to copy it
        refuse_packaged(path, root)
    certs = available_certs(args.cert or [], root, args.payloads)
    # All files planned before the first is written: a refusal leaves every file as it was.
    results = [fix_file(path, certs, dry_run=True, root=root) for path in paths]
    if not args.dry_run:
        results = [fix_file(path, certs, dry_run=False, root=root) for path in paths]
    status = 1 if any(still_needed(r) for r in results) else 0
    if args.json:
        emit_json({"fixes": results, "dry_run": bool(args.dry_run), "exit_status": status})
    else:
        for result in results:
            print("\n".join(render_fix(result, args.dry_run)))
    return status
