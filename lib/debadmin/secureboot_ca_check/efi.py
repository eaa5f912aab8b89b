"""Strict parsers for secureboot-ca-check: efivarfs, edk2 varstores, signature lists, PE."""

import base64
import datetime
import functools
import hashlib
import os
import re
import stat
import struct
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Dict, Iterator, List, Optional, Tuple, Union

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.serialization import Encoding, pkcs7
from cryptography.x509.oid import NameOID

from debadmin.errors import Error, NotApplicable

GLOBAL_GUID = "8be4df61-93ca-11d2-aa0d-00e098032b8c"
IMAGE_SECURITY_GUID = "d719b2cb-3d3a-4596-a3bc-dad00e67656f"
# edk2's gEfiSecureBootEnableDisableGuid: SecureBootEnable, set in the firmware setup.
SECURE_BOOT_ENABLE_GUID = "f0a30bc7-af08-4556-99c4-001009c93a44"
MICROSOFT_OWNER = "77fa9abd-0359-4d32-bd60-28f4e78f784b"

# (name, vendor GUID) of every variable the report reads.
VARIABLES: Dict[str, str] = {
    "SecureBoot": GLOBAL_GUID,
    "SetupMode": GLOBAL_GUID,
    "PK": GLOBAL_GUID,
    "KEK": GLOBAL_GUID,
    "db": IMAGE_SECURITY_GUID,
    "dbx": IMAGE_SECURITY_GUID,
    "PKDefault": GLOBAL_GUID,
    "KEKDefault": GLOBAL_GUID,
    "dbDefault": GLOBAL_GUID,
    "dbxDefault": GLOBAL_GUID,
    "SecureBootEnable": SECURE_BOOT_ENABLE_GUID,
}
SIGNATURE_DATABASES = (
    "PK",
    "KEK",
    "db",
    "dbx",
    "PKDefault",
    "KEKDefault",
    "dbDefault",
    "dbxDefault",
)
AUTHENTICATED = ("PK", "KEK", "db", "dbx")

# EFI variable attributes.
ATTR_NV, ATTR_BS, ATTR_RT = 0x1, 0x2, 0x4
ATTR_HW_ERROR, ATTR_AUTH_WRITE, ATTR_TIME_AUTH, ATTR_APPEND = 0x8, 0x10, 0x20, 0x40
ATTR_AUTHENTICATED_DB = ATTR_NV | ATTR_BS | ATTR_RT | ATTR_TIME_AUTH  # 0x27

# Signature types of the UEFI specification (section 32.4.1): name and the fixed
# SignatureSize (owner GUID + data); None = variable.  Every type the specification
# defines is known, so a firmware that uses one gets a report; a GUID outside it is an error.
CERT_X509 = "a5c059a1-94e4-4aa7-87b5-ab155c2bf072"
SIGNATURE_TYPES: Dict[str, Tuple[str, Optional[int]]] = {
    CERT_X509: ("x509", None),
    "c1c41626-504c-4092-aca9-41f936934328": ("sha256", 16 + 32),
    "826ca512-cf10-4ac9-b187-be01496631bd": ("sha1", 16 + 20),
    "0b6e5233-a65c-44c9-9407-d9ab83bfc8bd": ("sha224", 16 + 28),
    "ff3e5307-9fd0-48c9-85f1-8ad56c701e01": ("sha384", 16 + 48),
    "093e0fae-a6c4-4f50-9f1b-d41e2b89c19a": ("sha512", 16 + 64),
    "57347f87-7a9b-403a-b93c-dc4afb7a0ebc": ("sm3", 16 + 32),
    "3c5766e8-269c-4e34-aa14-ed776e85b3b6": ("rsa2048", 16 + 256),
    "e2b36190-879b-4a3d-ad8d-f2e7bba32784": ("rsa2048_sha256", 16 + 256),
    "67f8444f-8743-48f1-a328-1eaab8736080": ("rsa2048_sha1", 16 + 256),
    "3bd2a492-96c0-4079-b420-fcf98ef103ed": ("x509_sha256", 16 + 32 + 16),
    "7076876e-80c2-4ee6-aad2-28b349a6865b": ("x509_sha384", 16 + 48 + 16),
    "446dbf63-2502-4cda-bcfa-2465d2b0fe9d": ("x509_sha512", 16 + 64 + 16),
    "4aafd29d-68df-49ee-8aa9-347d375665a7": ("pkcs7", None),
}
# Authenticode digests edk2 computes (HashPeImageByType), strongest first.
DIGESTS = ("sha256", "sha1", "sha384", "sha512")

MAX_VARIABLE = 1 << 20  # no firmware variable comes near 1 MiB
MAX_VARSTORE = 64 << 20
MAX_PE = 64 << 20
# Debian's shim has two signatures; thousands of different ones are a crafted image,
# refused before the certificates of each are decoded and checked against db and dbx
# (repeats of one cost nothing: parse_pe decodes each distinct signature once).
MAX_SIGNATURES = 64
# Problems of one kind listed per variable (the rest are counted in one more).
MAX_PROBLEMS = 10


def guid_str(raw: bytes) -> str:
    return guid_text(bytes(raw))


@functools.lru_cache(maxsize=256)
def guid_text(raw: bytes) -> str:
    """A GUID's text form; cached, as thousands of entries share an owner GUID."""
    return str(uuid.UUID(bytes_le=raw))


# --- signature lists ----------------------------------------------------------------------


@dataclass
class Entry:
    """One EFI_SIGNATURE_DATA: a certificate or a hash, with its owner GUID."""

    kind: str  # x509, sha256, ...
    owner: str
    data: bytes
    cert: Optional[x509.Certificate] = None
    # False for a certificate the report could decode but firmware cannot use (PEM text).
    usable: bool = True


@dataclass
class Problem:
    """Something in a variable's signature lists that is not as the specification says.

    severity as in debadmin.findings; strict parsing refuses every problem but the
    harmless ones (STRICT_IGNORES).
    """

    code: str
    severity: str
    message: str
    strict: Optional[str] = None  # the strict parser's message, when it differs
    # True when the lists' structure itself is broken (a header, a size), False for what
    # is wrong inside a list whose entries could be walked.
    structural: bool = False


# Zero padding after a DER certificate (some firmware pads up to SignatureSize) and the
# X.509 library's warnings were accepted by the strict parser from the start.
STRICT_IGNORES = ("certificate-padding", "x509-warning")
PEM_BEGIN = re.compile(rb"-----BEGIN ([A-Za-z0-9 ]+)-----")


def parse_signature_lists(data: bytes, what: str) -> List[Entry]:
    """Every entry of the EFI_SIGNATURE_LISTs in data, checked strictly.

    Raises Error naming `what` for a truncated or oversized list, an unknown signature type,
    a size that does not fit the type, a non-empty header or an undecodable certificate.
    """
    entries: List[Entry] = []
    for item in walk_signature_lists(data):
        if isinstance(item, Entry):
            if item.usable:
                entries.append(item)
        elif item.code not in STRICT_IGNORES:
            raise Error(f"{what}: {item.strict or item.message}")
    return entries


def read_signature_lists(data: bytes) -> Tuple[List[Entry], List[Problem]]:
    """The entries of data that can be read, and a Problem for each thing that cannot.

    Real firmware is not spec-clean: PEM text in an X.509 list, padding, one broken entry
    among good ones.  The firmware skips what it cannot parse, and so does the report.
    """
    entries: List[Entry] = []
    problems: List[Problem] = []
    counts: Dict[str, int] = {}
    for item in walk_signature_lists(data):
        if isinstance(item, Entry):
            entries.append(item)
            continue
        counts[item.code] = counts.get(item.code, 0) + 1
        if counts[item.code] <= MAX_PROBLEMS:
            problems.append(item)
    # A crafted 1 MiB variable of 17-byte entries is 60,000 unreadable ones: the first few
    # of each kind are listed, the rest counted.
    for code, count in counts.items():
        if count > MAX_PROBLEMS:
            first = next(p for p in problems if p.code == code)
            problems.append(
                Problem(
                    code,
                    first.severity,
                    f"{count - MAX_PROBLEMS} more like the above ({code}), not listed",
                    structural=first.structural,
                )
            )
    return entries, problems


def walk_signature_lists(data: bytes) -> Iterator[Union[Entry, Problem]]:
    """Entries and problems in the order found; a problem in a list's header skips that
    list when its size is sound, and ends the walk when it is not."""
    offset = 0
    number = 0
    while offset < len(data):
        number += 1
        where = f"signature list {number} at byte {offset}"
        left = len(data) - offset
        if left < 28:
            padding = not data[offset:].strip(b"\0") or not data[offset:].strip(b"\xff")
            yield Problem(
                "padding" if padding else "unreadable",
                "info" if padding else "warning",
                f"{where}: truncated header ({left} of 28 bytes)"
                + (", padding" if padding else ", not read"),
                structural=not padding,
            )
            return
        type_raw, list_size, header_size, sig_size = struct.unpack_from("<16sIII", data, offset)
        if list_size > left or list_size < 28:
            # The size is what leads to the next list: nothing after this one can be read.
            if guid_str(type_raw) not in SIGNATURE_TYPES:
                why = f"unknown signature type {guid_str(type_raw)}"
            elif list_size > left:
                why = f"size {list_size} runs past the end of the data ({left} bytes left)"
            else:
                why = f"list size {list_size} is not a whole number of signatures"
            yield Problem(
                "unreadable",
                "warning",
                f"{where}: {why}; the remaining {left} bytes are not read",
                structural=True,
            )
            return
        problem = list_header_problem(guid_str(type_raw), list_size, header_size, sig_size)
        if problem:
            yield Problem(
                "unreadable", "warning", f"{where}: {problem}; list skipped", structural=True
            )
        else:
            yield from list_entries(data, offset, list_size, sig_size, guid_str(type_raw), where)
        offset += list_size


def list_header_problem(sig_type: str, list_size: int, header_size: int, sig_size: int):
    """Why a signature list's header does not fit its type (None: it does)."""
    if sig_type not in SIGNATURE_TYPES:
        return f"unknown signature type {sig_type}"
    kind, fixed = SIGNATURE_TYPES[sig_type]
    if header_size != 0:
        return f"header size {header_size} (must be 0 for {kind})"
    if sig_size <= 16 or (fixed is not None and sig_size != fixed):
        return f"signature size {sig_size} is wrong for {kind}"
    if list_size - 28 < sig_size:
        return f"list size {list_size} is not a whole number of {sig_size}-byte signatures"
    return None


def list_entries(
    data: bytes, offset: int, list_size: int, sig_size: int, sig_type: str, where: str
) -> Iterator[Union[Entry, Problem]]:
    """The entries of one list.  Like edk2 (CertCount = body / SignatureSize), the whole
    signatures are read when the list's size is not a multiple of SignatureSize (padding
    after the last one, or a SignatureSize that lies), and the rest is a finding."""
    kind = SIGNATURE_TYPES[sig_type][0]
    start = offset + 28
    count, left = divmod(list_size - 28, sig_size)
    for index in range(count):
        at = start + index * sig_size
        owner = guid_str(data[at : at + 16])
        payload = bytes(data[at + 16 : at + sig_size])
        if kind != "x509":
            yield Entry(kind, owner, payload)
            continue
        yield from x509_entry(payload, owner, f"{where}: entry {index + 1}")
    if left:
        tail = data[offset + list_size - left : offset + list_size]
        zeros = not tail.strip(b"\0") or not tail.strip(b"\xff")
        yield Problem(
            "padding" if zeros else "trailing-data",
            "info",
            f"{where}: {left} bytes of {'padding' if zeros else 'other data'} after its "
            f"last whole {sig_size}-byte signature, not read",
            f"{where}: list size {list_size} is not a whole number of {sig_size}-byte "
            "signatures",
        )


def x509_entry(payload: bytes, owner: str, where: str) -> Iterator[Union[Entry, Problem]]:
    """The certificate in one X.509 entry, and what is odd about it."""
    try:
        length = der_length(payload)
        if length > len(payload):
            raise ValueError("the DER length does not match the entry")
        cert, caught = load_certificate_recording(payload[:length])
    except Exception as exc:  # cryptography raises ValueError and friends
        pem = pem_certificate(payload)
        if pem is None:
            yield Problem(
                "unreadable",
                "warning",
                f"{where} is not a DER X.509 certificate ({exc.__class__.__name__}); skipped",
            )
            return
        cert, caught, label = pem
        text = f"PEM text ('BEGIN {label}')" if label else "base64 text without a PEM header"
        yield Problem(
            "pem-entry",
            "warning",
            f"{where} is {text}, not a DER certificate: firmware cannot "
            f"use '{short_name(cert)}' from it",
        )
        yield Entry("x509", owner, payload, cert, usable=False)
        yield from warning_problems(caught, where, cert)
        return
    tail = payload[length:]
    if tail:
        zeros = not tail.strip(b"\0")
        yield Problem(
            "certificate-padding" if zeros else "trailing-data",
            "info",
            f"{where}: {len(tail)} bytes of {'zero padding' if zeros else 'other data'} "
            "after the certificate",
            f"{where} is not a DER X.509 certificate (ValueError)",
        )
    yield Entry("x509", owner, payload[:length], cert)
    yield from warning_problems(caught, where, cert)


def warning_problems(caught: List[str], where: str, cert: x509.Certificate):
    for message in caught:
        yield Problem(
            "x509-warning",
            "info",
            f"{where} ('{short_name(cert)}'): the X.509 library warns: {message}",
        )


def short_name(cert: x509.Certificate) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for oid in (NameOID.COMMON_NAME, NameOID.ORGANIZATION_NAME):
            values = cert.subject.get_attributes_for_oid(oid)
            if values:
                return str(values[0].value)
        return cert.subject.rfc4514_string()


def pem_certificate(payload: bytes):
    """(certificate, warnings, header label) when payload is PEM text around a DER
    certificate, whatever its header says ("NEW CERTIFICATE REQUEST" on one real board)
    and wherever it starts (after 'openssl x509 -text' output), with LF or CRLF lines;
    the label is None for base64 text without a header."""
    if len(payload) < 100:  # shorter than any certificate in base64: not worth a look
        return None
    match = PEM_BEGIN.search(payload)
    if match:
        end = payload.find(b"-----END", match.end())
        body = payload[match.end() : end if end >= 0 else len(payload)]
    else:
        body = payload.rstrip(b"\0\xff")
    try:
        der = base64.b64decode(b"".join(body.split()), validate=True)
        cert, caught = load_certificate_recording(der[: der_length(der)])
    except Exception:  # binascii.Error, ValueError and friends
        return None
    return cert, caught, match.group(1).decode("ascii") if match else None


def load_certificate_recording(der: bytes) -> Tuple[x509.Certificate, List[str]]:
    """load_certificate(), and the distinct warnings the X.509 library gave on the way."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cert = load_certificate(der)
    return cert, list(dict.fromkeys(str(w.message) for w in caught))


def load_certificate(der: bytes) -> x509.Certificate:
    """A DER certificate whose fields the report reads, parsed now (names parse lazily)."""
    cert = x509.load_der_x509_certificate(der)
    cert.subject, cert.issuer, cert.serial_number  # noqa: B018
    validity(cert)
    return cert


def validity(cert: x509.Certificate) -> Tuple[datetime.datetime, datetime.datetime]:
    """notBefore and notAfter as naive UTC datetimes.

    cryptography 42 (trixie) adds the *_utc properties and deprecates the naive ones that
    38 (bookworm) has.
    """
    if hasattr(cert, "not_valid_after_utc"):
        return (
            cert.not_valid_before_utc.replace(tzinfo=None),
            cert.not_valid_after_utc.replace(tzinfo=None),
        )
    return cert.not_valid_before, cert.not_valid_after


# --- variables: efivarfs and edk2 varstores --------------------------------------------------


@dataclass
class Variable:
    name: str
    guid: str
    attributes: int
    data: bytes


def check_attributes(name: str, attributes: int, source: str) -> None:
    """Refuse attribute words no firmware sets on these variables.

    SecureBootEnable is exempt: edk2 reads its first byte whatever its attributes (it is
    NV+BS, not visible in efivarfs), and refusing the whole check over a switch the
    report only reads would leave the machine without a verdict.
    """
    if name == "SecureBootEnable":
        return
    if attributes & ~0xFF:
        raise Error(f"{source}: {name}: undefined attribute bits in 0x{attributes:08x}")
    if attributes & (ATTR_HW_ERROR | ATTR_AUTH_WRITE):
        raise Error(
            f"{source}: {name}: attributes 0x{attributes:08x} are not those of a "
            "Secure Boot variable"
        )
    if name in AUTHENTICATED and (attributes & ATTR_AUTHENTICATED_DB) != ATTR_AUTHENTICATED_DB:
        raise Error(
            f"{source}: {name}: attributes 0x{attributes:08x} lack "
            "non-volatile, runtime or time-based authenticated access (0x27)"
        )
    if not attributes & ATTR_BS:
        raise Error(f"{source}: {name}: attributes 0x{attributes:08x} lack boot-service access")


def open_regular(path: Path) -> BinaryIO:
    """path opened for reading if it is a regular file; Error for anything else.

    Opened non-blocking, so that a FIFO (or a device) in its place is refused at once
    instead of hanging the check; efivarfs variables are regular files.  Raises OSError
    (FileNotFoundError ...) as open() does.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise Error(f"{path}: not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


EFIVAR_NAME = re.compile(r"^[^/]+-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def check_efivars_dump(directory: Path) -> None:
    """Refuse a directory that holds no variable in efivarfs's NAME-GUID form: an empty
    directory or another one named by mistake would otherwise read as firmware without
    keys (a plausible report on nothing).  Every firmware has some variables (BootOrder,
    PlatformLang...), so a real dump always holds one."""
    try:
        with os.scandir(directory) as entries:
            if any(EFIVAR_NAME.match(e.name) and e.is_file() for e in entries):
                return
    except OSError as exc:
        raise Error(f"cannot read {directory}: {exc.strerror}") from None
    raise Error(
        f"{directory}: not an efivarfs dump (no file named NAME-GUID, as in "
        "/sys/firmware/efi/efivars)"
    )


def read_efivars(directory: Path) -> Dict[str, Variable]:
    """The report's variables from an efivarfs directory (NAME-GUID files)."""
    variables: Dict[str, Variable] = {}
    for name, guid in VARIABLES.items():
        path = directory / f"{name}-{guid}"
        try:
            with open_regular(path) as handle:  # efivarfs wants one read of the whole file
                raw = handle.read(MAX_VARIABLE + 5)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise Error(f"cannot read {path}: {exc.strerror}") from None
        if len(raw) < 4:
            raise Error(f"{path}: truncated ({len(raw)} bytes, no attribute word)")
        if len(raw) > MAX_VARIABLE + 4:
            raise Error(f"{path}: larger than {MAX_VARIABLE} bytes")
        attributes = struct.unpack_from("<I", raw)[0]
        check_attributes(name, attributes, str(directory))
        variables[name] = Variable(name, guid, attributes, raw[4:])
    return variables


# edk2: MdePkg/Include/Pi/PiFirmwareVolume.h, MdeModulePkg/Include/Guid/VariableFormat.h
FV_NV_GUIDS = (
    "fff12b8d-7696-4c8b-a985-2747075b4f50",  # EFI_SYSTEM_NV_DATA_FV_GUID
    "8d1b55ed-bebf-40b7-8246-d8bd7d64edbb",
)  # EDKII_NV_STORAGE_FV (some builds)
AUTH_VARIABLE_GUID = "aaf32c78-947b-439a-a180-2e144ec37792"
PLAIN_VARIABLE_GUID = "ddcf3616-3275-4164-98b6-fe85707ffe7d"
VAR_START_ID = 0x55AA
VAR_ADDED = 0x3F
VAR_IN_DELETED_TRANSITION = 0xFE
# Still set in VAR_HEADER_VALID_ONLY (0x7F) and an erased 0xFF, clear from VAR_ADDED on.
VAR_UNFINISHED = 0x40
# A variable being replaced: its new copy is not yet VAR_ADDED (what a VM killed
# mid-update leaves).  edk2 uses it when no VAR_ADDED copy exists.
VAR_ADDED_IN_DELETED_TRANSITION = VAR_ADDED & VAR_IN_DELETED_TRANSITION  # 0x3E
STORE_FORMATTED = 0x5A
STORE_HEALTHY = 0xFE


def parse_varstore(data: bytes, source: str) -> Dict[str, Variable]:
    """The report's variables from an edk2/OVMF NVRAM image, checked strictly.

    Firmware volume header, then a variable store header, then variable headers
    (authenticated or plain) back to back, 4-byte aligned.  Deleted and half-written
    entries stay in the store until reclaim; as edk2's FindVariableEx decides, the first
    entry in the VAR_ADDED state counts, else the last one in VAR_ADDED &
    VAR_IN_DELETED_TRANSITION (an update interrupted before the new copy was complete).
    """
    start, end, authenticated = parse_store_header(data, source)
    added: Dict[str, tuple] = {}
    in_transition: Dict[str, tuple] = {}
    for copy in walk_variables(data, start, end, authenticated, source):
        offset, state, attributes, name, data_at, data_size = copy
        if name not in added:
            (added if state == VAR_ADDED else in_transition)[name] = copy
    variables = {}
    # Only the copies the firmware uses: a stale one it passes over may be anything.
    for offset, _state, attributes, name, data_at, data_size in {
        **in_transition,
        **added,
    }.values():
        if data_size > MAX_VARIABLE:
            raise Error(
                f"{source}: variable at byte {offset}: {name} is {data_size} bytes, "
                f"larger than any firmware variable ({MAX_VARIABLE} bytes)"
            )
        check_attributes(name, attributes, source)
        data_copy = data[data_at : data_at + data_size]
        variables[name] = Variable(name, VARIABLES[name], attributes, data_copy)
    return variables


class BlankStore(NotApplicable):
    """An NVRAM file no firmware has written yet (a VM that never started)."""


def check_blank(data: bytes, source: str) -> None:
    """Raise BlankStore for an image of one byte value, 0x00 or 0xff.

    bookworm's AAVMF_VARS.fd is 64 MiB of zeros: edk2 (OVMF's and ArmVirtQemu's flash
    drivers) writes a firmware volume and an empty variable store into such a file at the
    first boot.  Until then there are no keys to check: not applicable, not damage."""
    if len(data) < 0x1000:  # smaller than any flash image: damage, not a blank store
        return
    for byte in (b"\0", b"\xff"):
        if data.count(byte) == len(data):
            raise BlankStore(
                f"{source}: blank NVRAM (every byte 0x{byte[0]:02x}): the VM has never "
                "started; its firmware sets up the variable store at the first boot"
            )


def parse_store_header(data: bytes, source: str) -> Tuple[int, int, bool]:
    """(offset of the first variable, end of the store, authenticated) of an NVRAM image."""
    check_blank(data, source)
    if len(data) < 0x48:
        raise Error(f"{source}: too short for a firmware volume ({len(data)} bytes)")
    (
        fs_guid,
        fv_length,
        signature,
        _attrs,
        header_length,
        _cksum,
        _ext,
        _res,
        revision,
    ) = struct.unpack_from("<16x16sQ4sIHHHBB", data, 0)
    if signature != b"_FVH":
        raise Error(f"{source}: not an edk2 firmware volume (no _FVH signature)")
    if guid_str(fs_guid) not in FV_NV_GUIDS:
        raise Error(f"{source}: firmware volume {guid_str(fs_guid)} is not a variable store")
    if fv_length > len(data) or fv_length < header_length:
        raise Error(
            f"{source}: firmware volume length {fv_length} does not fit the file "
            f"({len(data)} bytes)"
        )
    if header_length < 0x48 or header_length % 2 or header_length + 28 > fv_length:
        raise Error(f"{source}: bad firmware volume header length {header_length}")
    if sum(struct.unpack_from(f"<{header_length // 2}H", data, 0)) & 0xFFFF:
        raise Error(f"{source}: firmware volume header checksum mismatch")
    if revision != 2:
        raise Error(f"{source}: firmware volume revision {revision} (expected 2)")
    store_guid, store_size, store_format, store_state = struct.unpack_from(
        "<16sIBB", data, header_length
    )
    if guid_str(store_guid) not in (AUTH_VARIABLE_GUID, PLAIN_VARIABLE_GUID):
        raise Error(f"{source}: unknown variable store signature {guid_str(store_guid)}")
    if store_format != STORE_FORMATTED or store_state != STORE_HEALTHY:
        raise Error(
            f"{source}: variable store is not formatted and healthy "
            f"(format 0x{store_format:02x}, state 0x{store_state:02x})"
        )
    if store_size < 28 or header_length + store_size > fv_length:
        raise Error(f"{source}: variable store size {store_size} exceeds the volume")
    start = (header_length + 28 + 3) & ~3
    return start, header_length + store_size, guid_str(store_guid) == AUTH_VARIABLE_GUID


ALL_ONES = 0xFFFFFFFF
AUTH_HEADER = struct.Struct("<HBBIQ16sIII16s")
PLAIN_HEADER = struct.Struct("<HBBIII16s")
# The variables the report reads, as a varstore spells them: UTF-16 name with its NUL,
# and vendor GUID bytes (a million headers are matched without decoding one).
WANTED_RAW = {
    ((name + "\0").encode("utf-16-le"), uuid.UUID(guid).bytes_le): name
    for name, guid in VARIABLES.items()
}


@dataclass
class WalkEnd:
    """Where edk2's walk of a store ends (its NonVolatileLastVariableOffset, where it
    writes the next variable), and whether the rest of the store is erased; when it is
    not, edk2 reclaims at its next start (VariableWriteServiceInitialize) and keeps only
    the variables its walk found."""

    offset: int = 0
    erased: bool = True


def walk_variables(
    data: bytes,
    offset: int,
    end: int,
    authenticated: bool,
    source: str,
    every: bool = False,
    walk_end: Optional[WalkEnd] = None,
) -> Iterator[tuple]:
    """(offset, state, attributes, name, data offset, data size) of each valid copy
    (VAR_ADDED or VAR_ADDED & VAR_IN_DELETED_TRANSITION) of a variable the report reads;
    with every, (offset, state, attributes, raw name, raw vendor, data offset, data size)
    of every header the walk steps on.

    The walk is edk2's (VariableParsing.c: IsValidVariableHeader, GetNextVariablePtr):
    it goes on while a header starts with 0x55AA, and steps over a header whose State or
    NameSize, DataSize or Attributes is all ones by the header alone (NameSizeOfVariable
    and DataSizeOfVariable count 0 there), over any other by its sizes; no padding
    between name and data (ALIGNMENT is 1 on x86 and ARM, 8 only on Itanium), the next
    header 4-aligned.  Every header is checked; the loop is kept lean because a crafted
    64 MiB store holds a million of them.
    """
    header = AUTH_HEADER if authenticated else PLAIN_HEADER
    header_size = header.size
    unpack = header.unpack_from
    valid = (VAR_ADDED, VAR_ADDED_IN_DELETED_TRANSITION)
    unfinished = False
    while offset + header_size <= end:
        fields = unpack(data, offset)
        if fields[0] != VAR_START_ID:
            break
        # Both header layouts end in NameSize, DataSize, VendorGuid.
        state, attributes = fields[1], fields[3]
        name_size, data_size, vendor = fields[-3:]
        # edk2 writes the header (State still 0xFF), sets VAR_HEADER_VALID_ONLY (0x7F),
        # writes name and data, then sets VAR_ADDED: a variable not yet VAR_ADDED is a
        # write a power-off (virsh destroy) cut short.  Its name and data may be
        # unwritten; edk2 steps over it as above, and never reads its name.
        unfinished = state & VAR_UNFINISHED
        if unfinished:
            if state == 0xFF or ALL_ONES in (name_size, data_size, attributes):
                name_size = data_size = 0
            data_at = offset + header_size + name_size
            if every:
                yield offset, state, attributes, b"", vendor, data_at, data_size
            offset = (data_at + data_size + 3) & ~3
            continue
        if name_size < 2 or name_size % 2 or name_size > 1024:
            raise Error(f"{source}: variable at byte {offset}: bad name size {name_size}")
        if attributes == ALL_ONES:  # edk2 would step over it by its header alone
            raise Error(f"{source}: variable at byte {offset}: attributes all ones")
        data_at = offset + header_size + name_size
        if data_size > end - data_at or data_at > end:
            raise Error(
                f"{source}: variable at byte {offset}: data size {data_size} runs past the "
                "variable store"
            )
        if data[data_at - 2 : data_at] != b"\0\0":
            raise Error(f"{source}: variable at byte {offset}: name is not NUL-terminated")
        if every:
            yield (
                offset,
                state,
                attributes,
                data[offset + header_size : data_at],
                vendor,
                data_at,
                data_size,
            )
        elif state in valid:
            name = WANTED_RAW.get((data[offset + header_size : data_at], vendor))
            if name is not None:
                yield offset, state, attributes, name, data_at, data_size
        offset = (data_at + data_size + 3) & ~3
    erased = walk_end_erased(data, offset, end, header_size, bool(unfinished), source)
    if walk_end is not None:
        walk_end.offset, walk_end.erased = min(offset, end), erased


def walk_end_erased(
    data: bytes, offset: int, end: int, header_size: int, unfinished: bool, source: str
) -> bool:
    """Whether the store is erased from where walk_variables() stopped to its end; an
    Error when what is there is no write a power-off cut short."""
    erased = offset >= end or data.count(b"\xff", offset, end) == end - offset
    if not erased and not unfinished:
        # Not what a power-off leaves: after the last variable edk2 wrote in full, at
        # most the header of the next one, torn (edk2's flash driver writes byte by byte).
        torn_end = offset + header_size
        if torn_end > end:
            raise Error(f"{source}: truncated variable header at byte {offset}")
        if data.count(b"\xff", torn_end, end) != end - torn_end:
            start_id = struct.unpack_from("<H", data, offset)[0]
            if start_id == 0xFFFF:
                raise Error(f"{source}: data after the last variable, from byte {offset}")
            raise Error(
                f"{source}: corrupt variable header at byte {offset} (start 0x{start_id:04x})"
            )
    return erased


def read_bounded(path: Path, limit: int, what: str) -> bytes:
    """The whole file, refused without reading further once it exceeds limit bytes."""
    try:
        with open_regular(path) as handle:
            data = handle.read(limit + 1)
    except OSError as exc:
        raise Error(f"cannot read {path}: {exc.strerror}") from None
    if len(data) > limit:
        raise Error(f"{path}: larger than {limit >> 20} MiB, not {what}")
    return data


def read_varstore(path: Path) -> Dict[str, Variable]:
    return parse_varstore(read_bounded(path, MAX_VARSTORE, "a varstore"), str(path))


def boolean_variable(variables: Dict[str, Variable], name: str, source: str) -> Optional[bool]:
    """SecureBoot/SetupMode: exactly one byte, 0 or 1; None when absent."""
    variable = variables.get(name)
    if variable is None:
        return None
    if len(variable.data) != 1 or variable.data[0] > 1:
        raise Error(
            f"{source}: {name}: expected one byte 0 or 1, got "
            f"{variable.data[:8].hex() or 'nothing'}"
        )
    return variable.data[0] == 1


# --- PE images and their Authenticode signatures ---------------------------------------------


@dataclass
class Signature:
    """One WIN_CERTIFICATE of type PKCS#7 SignedData: the certificates it carries."""

    index: int
    certs: List[x509.Certificate]
    # The algorithm (sha256, sha1, ...) whose Authenticode digest of this image is in the
    # signed content; None when the signature does not cover the image.
    digest_algorithm: Optional[str] = None

    @property
    def digest_found(self) -> bool:
        return self.digest_algorithm is not None


@dataclass
class PeImage:
    path: str
    sha256: str  # Authenticode digest (what dbx hash entries revoke)
    signatures: List[Signature] = field(default_factory=list)
    digests: Dict[str, str] = field(default_factory=dict)  # algorithm: hex digest


def der_length(blob: bytes) -> int:
    """Length of the outer DER element of blob (tag, length, contents)."""
    if len(blob) < 2 or blob[0] != 0x30:
        raise ValueError("not a DER SEQUENCE")
    first = blob[1]
    if first < 0x80:
        return 2 + first
    count = first & 0x7F
    if count == 0 or count > 4 or len(blob) < 2 + count:
        raise ValueError("bad DER length")
    return 2 + count + int.from_bytes(blob[2 : 2 + count], "big")


def parse_pe(data: bytes, source: str) -> PeImage:
    """The Authenticode digest and signatures of a PE/COFF image, checked strictly."""
    layout = security_directory(data, source)
    digests = AuthenticodeDigests(data, *layout)
    signatures = read_signatures(data, source, layout[2], layout[3], digests)
    return PeImage(
        source,
        digests.hex("sha256"),
        signatures=signatures,
        digests={algorithm: digests.hex(algorithm) for algorithm in digests.computed},
    )


def security_directory(data: bytes, source: str) -> Tuple[int, int, int, int]:
    """(checksum offset, security directory entry offset, certificate table offset and
    size) of a PE/COFF image, its headers checked."""
    if len(data) < 0x40 or data[:2] != b"MZ":
        raise Error(f"{source}: not a PE image (no MZ header)")
    pe = struct.unpack_from("<I", data, 0x3C)[0]
    if pe > len(data) - 24 or data[pe : pe + 4] != b"PE\0\0":
        raise Error(f"{source}: not a PE image (no PE signature)")
    optional_size = struct.unpack_from("<H", data, pe + 20)[0]
    optional = pe + 24
    if optional + optional_size > len(data) or optional_size < 2:
        raise Error(f"{source}: optional header runs past the end of the file")
    magic = struct.unpack_from("<H", data, optional)[0]
    if magic not in (0x10B, 0x20B):
        raise Error(f"{source}: unknown optional header magic 0x{magic:04x}")
    rva_count_at = optional + (92 if magic == 0x10B else 108)
    if rva_count_at + 4 > optional + optional_size:
        raise Error(f"{source}: optional header too short")
    rva_count = struct.unpack_from("<I", data, rva_count_at)[0]
    security_entry = rva_count_at + 4 + 8 * 4
    if rva_count < 5 or security_entry + 8 > optional + optional_size:
        raise Error(f"{source}: image has no security data directory")
    cert_offset, cert_size = struct.unpack_from("<II", data, security_entry)
    if cert_size and (cert_offset < security_entry + 8 or cert_offset + cert_size > len(data)):
        raise Error(
            f"{source}: certificate table ({cert_offset}+{cert_size}) lies outside "
            f"the file ({len(data)} bytes)"
        )
    return optional + 64, security_entry, cert_offset, cert_size


class AuthenticodeDigests:
    """The image's Authenticode digests, each computed when first asked for (SHA-256
    always; the others only for a signature that does not sign the SHA-256 one): everything
    except the checksum, the security directory entry and the certificate table itself
    (sbsign's and pesign's layout: the table is last)."""

    def __init__(
        self, data: bytes, checksum_at: int, security_entry: int, cert_offset: int, size: int
    ):
        view = memoryview(data)  # no copies of a megabyte-sized image
        self.parts = [view[:checksum_at], view[checksum_at + 4 : security_entry]]
        if size:
            self.parts += [view[security_entry + 8 : cert_offset], view[cert_offset + size :]]
        else:
            self.parts += [view[security_entry + 8 :]]
        self.computed: Dict[str, bytes] = {}

    def raw(self, algorithm: str) -> bytes:
        if algorithm not in self.computed:
            digest = hashlib.new(algorithm)
            for part in self.parts:
                digest.update(part)
            self.computed[algorithm] = digest.digest()
        return self.computed[algorithm]

    def hex(self, algorithm: str) -> str:
        return self.raw(algorithm).hex()

    def signed_in(self, blob: bytes) -> Optional[str]:
        """The algorithm whose digest a signature's signed content holds, if any."""
        return next((a for a in DIGESTS if self.raw(a) in blob), None)


def read_signatures(
    data: bytes, source: str, cert_offset: int, cert_size: int, digests: AuthenticodeDigests
) -> List[Signature]:
    """The WIN_CERTIFICATEs of the certificate table, each with the digest it signs."""
    signatures: List[Signature] = []
    end = cert_offset + cert_size
    offset = cert_offset
    # Repeats of one signature (a crafted image has thousands) are decoded once and share
    # their certificate list.
    parsed: Dict[bytes, Tuple[List[x509.Certificate], Optional[str]]] = {}
    while cert_size and offset < end:
        where = f"{source}: WIN_CERTIFICATE {len(signatures) + 1} at byte {offset}"
        if end - offset < 8:
            raise Error(f"{where}: truncated header")
        length, revision, cert_type = struct.unpack_from("<IHH", data, offset)
        if length < 8 or offset + length > end:
            raise Error(f"{where}: length {length} runs past the certificate table")
        if revision not in (0x100, 0x200):
            raise Error(f"{where}: unknown revision 0x{revision:04x}")
        if cert_type != 2:
            raise Error(f"{where}: type {cert_type} is not PKCS#7 SignedData (2)")
        blob = data[offset + 8 : offset + length]
        if blob not in parsed:
            if len(parsed) == MAX_SIGNATURES:
                raise Error(
                    f"{source}: more than {MAX_SIGNATURES} different signatures, "
                    "not a boot loader"
                )
            parsed[blob] = (signed_certificates(blob, where), digests.signed_in(blob))
        signatures.append(Signature(len(signatures) + 1, *parsed[blob]))
        offset += (length + 7) & ~7
    return signatures


def signed_certificates(blob: bytes, where: str) -> List[x509.Certificate]:
    """The certificates a WIN_CERTIFICATE's PKCS#7 SignedData carries."""
    try:
        blob = blob[: der_length(blob)]
        with warnings.catch_warnings():
            # e.g. "negative serial number": hostile input must not print warnings.
            warnings.simplefilter("ignore")
            return list(pkcs7.load_der_pkcs7_certificates(bytes(blob)))
    except Exception as exc:  # cryptography raises ValueError and friends
        raise Error(
            f"{where}: not a PKCS#7 SignedData structure ({exc.__class__.__name__})"
        ) from None


def read_pe(path: Path) -> PeImage:
    return parse_pe(read_bounded(path, MAX_PE, "a boot loader"), str(path))


# --- certificates -------------------------------------------------------------------------------


def issued_by(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    """Whether issuer's key signed cert (names match and the signature verifies)."""
    try:
        if cert.issuer != issuer.subject:
            return False
        # Inside the try: a key cryptography cannot load raises ValueError here.
        key = issuer.public_key()
        if isinstance(key, rsa.RSAPublicKey):
            key.verify(
                cert.signature,
                cert.tbs_certificate_bytes,
                padding.PKCS1v15(),
                cert.signature_hash_algorithm,
            )
        elif isinstance(key, ec.EllipticCurvePublicKey):
            key.verify(
                cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(cert.signature_hash_algorithm)
            )
        else:
            return False
    except Exception:  # InvalidSignature, unsupported algorithms, unparseable keys
        return False
    return True


def der(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(Encoding.DER)


def fingerprint(cert: x509.Certificate, algorithm: str = "sha256") -> str:
    # hashlib over the DER: several times faster than cryptography's hash objects.
    return hashlib.new(algorithm, der(cert)).hexdigest()


def tbs_hashes(cert: x509.Certificate) -> Dict[str, str]:
    """Hashes of the to-be-signed part, as dbx's x509_sha256/384/512 entries revoke it."""
    tbs = cert.tbs_certificate_bytes
    return {
        f"x509_{algorithm}": hashlib.new(algorithm, tbs).hexdigest()
        for algorithm in ("sha256", "sha384", "sha512")
    }
