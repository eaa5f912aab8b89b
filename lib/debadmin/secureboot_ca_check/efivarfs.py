"""secureboot-ca-check --fix on firmware: Microsoft's signed updates appended through efivarfs."""

import base64
import datetime
import ctypes
import errno
import fcntl
import json
import logging
import os
import re
import signal
import struct
import sys
import warnings
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from cryptography import x509

from debadmin import fsutil
from debadmin.errors import Error, NotApplicable
from debadmin.output import emit_json
from debadmin.secureboot_ca_check import efi
from debadmin.secureboot_ca_check import payloads

log = logging.getLogger("debadmin")

EFIVARS = "sys/firmware/efi/efivars"
BACKUP_DIR = "var/lib/secureboot-ca-check"
LOCK = "run/lock/secureboot-ca-check.lock"
PROG = "secureboot-ca-check"
NAMES = {
    "kek_2k_ca_2023": "Microsoft Corporation KEK 2K CA 2023",
    "uefi_ca_2023": "Microsoft UEFI CA 2023",
    "option_rom_uefi_ca_2023": "Microsoft Option ROM UEFI CA 2023",
    "windows_uefi_ca_2023": "Windows UEFI CA 2023",
}
# FS_IOC_GETFLAGS / FS_IOC_SETFLAGS (_IOR/_IOW('f', 1/2, long)); the kernel reads an int.
LONG = struct.calcsize("l")
FS_IOC_GETFLAGS = (2 << 30) | (LONG << 16) | (ord("f") << 8) | 1
FS_IOC_SETFLAGS = (1 << 30) | (LONG << 16) | (ord("f") << 8) | 2
FS_IMMUTABLE_FL = 0x10
LUKS_MAGIC = b"LUKS\xba\xbe"
BITLOCKER_SIGNATURE = b"-FVE-FS-"
MAX_LUKS_JSON = 4 << 20
# luksmeta (clevis's store on LUKS1) puts its header, magic "LUKSMETA", in the gap
# between the 592-byte LUKS1 header with its key slots and the payload.
LUKS1_HEADER = 592
LUKSMETA_MAGIC = b"LUKSMETA"
# Where systemd looks for credentials (systemd.exec(5), "Credentials"), and its units.
CREDSTORE_DIRS = ["etc", "run", "usr/local/lib", "usr/lib"]
UNIT_DIRS = [
    "etc/systemd/system",
    "run/systemd/system",
    "usr/local/lib/systemd/system",
    "usr/lib/systemd/system",
    "lib/systemd/system",
    "etc/systemd/user",
    "usr/lib/systemd/user",
]
ENCRYPTED_CREDENTIAL = re.compile(
    r"^[ \t]*(SetCredentialEncrypted|LoadCredentialEncrypted)[ \t]*=", re.MULTILINE
)


# --- what the firmware holds, and the plan ----------------------------------------------------


def certs_of(variable: Optional[efi.Variable]) -> List[x509.Certificate]:
    if variable is None:
        return []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        entries, _problems = efi.read_signature_lists(variable.data)
    return [e.cert for e in entries if e.cert is not None and e.usable]


def pk_first_entry(variable: Optional[efi.Variable]) -> Optional[bytes]:
    """The SignatureData of PK's first entry, as edk2 takes it for a PK-authorised write
    (AuthService.c, VerifyTimeBasedPayload): first EFI_SIGNATURE_LIST, first
    EFI_SIGNATURE_DATA after its header, SignatureSize - 16 bytes (the owner GUID off),
    whatever the list's type; None when PK is absent or too short to hold one."""
    if variable is None:
        return None
    data = variable.data
    if len(data) < 28:
        return None
    list_size, header_size, size = struct.unpack_from("<III", data, 16)
    start = 28 + header_size
    if size <= 16 or list_size > len(data) or start + size > list_size:
        return None
    return data[start + 16 : start + size]


def fingerprints(variable: Optional[efi.Variable]) -> set:
    return {efi.fingerprint(c) for c in certs_of(variable)}


def machine_arch() -> str:
    return payloads.MACHINE_ARCH.get(os.uname().machine, "amd64")


# The UEFI loader names that say the architecture (shimx64.efi, grubaa64.efi,
# BOOTX64.EFI, fbia32.efi, mmx64.efi), as Debian architectures.
LOADER_ARCH = re.compile(r"(?:shim|grub|boot|fb|mm)(x64|aa64|ia32|arm)\.efi", re.I)
LOADER_SUFFIXES = {"x64": "amd64", "aa64": "arm64", "ia32": "i386", "arm": "armhf"}
BOOT_ENTRY = re.compile(r"Boot([0-9A-F]{4})-" + efi.GLOBAL_GUID)
MAX_BOOT_ENTRY = 1 << 16


def boot_arch(data: bytes) -> Optional[Tuple[str, str]]:
    """(Debian architecture, loader path) from an EFI_LOAD_OPTION's file path nodes
    (media device path, file path: UCS-2), or None when none names its architecture."""
    if len(data) < 6:
        return None
    length = struct.unpack_from("<H", data, 4)[0]
    at = 6
    while at + 1 < len(data) and data[at : at + 2] != b"\0\0":  # the description
        at += 2
    at += 2
    end = min(at + length, len(data))
    while at + 4 <= end:
        kind, subtype, size = struct.unpack_from("<BBH", data, at)
        if size < 4:
            return None
        if kind == 4 and subtype == 4:
            path = data[at + 4 : at + size].decode("utf-16-le", "replace").rstrip("\0")
            match = LOADER_ARCH.search(path.rsplit("\\", 1)[-1])
            if match and path.lower().endswith(".efi"):
                return LOADER_SUFFIXES[match.group(1).lower()], path
        at += size
    return None


def firmware_arch(directory: Path) -> Optional[Tuple[str, str]]:
    """(Debian architecture, where it was read) from the Boot#### entries of an efivarfs
    directory or dump: BootCurrent's first, then BootOrder's, then the others; None when
    none names a loader whose name says it."""
    try:
        names = sorted(n for n in os.listdir(directory) if BOOT_ENTRY.fullmatch(n))
    except OSError:
        return None

    def read(name: str) -> bytes:
        try:
            with efi.open_regular(directory / name) as handle:
                return handle.read(MAX_BOOT_ENTRY)[4:]
        except (OSError, Error):
            return b""

    order = [read(f"BootCurrent-{efi.GLOBAL_GUID}")[:2]]
    raw = read(f"BootOrder-{efi.GLOBAL_GUID}")
    order += [raw[i : i + 2] for i in range(0, len(raw) - 1, 2)]
    numbers = [f"{struct.unpack('<H', o)[0]:04X}" for o in order if len(o) == 2]
    wanted = [f"Boot{n}-{efi.GLOBAL_GUID}" for n in dict.fromkeys(numbers)]
    for name in [n for n in wanted if n in names] + [n for n in names if n not in wanted]:
        found = boot_arch(read(name))
        if found:
            return found[0], f"{name.split('-')[0]}: {found[1]}"
    return None


def choose_arch(directory: Path, option: Optional[str], dump: bool) -> Tuple[str, str]:
    """(architecture, why): --arch, else what the Boot#### entries say, else (this
    machine's firmware, or a dump that does not say) the host's."""
    if option:
        return option, "--arch"
    found = firmware_arch(directory)
    if found:
        return found[0], f"the loader of {found[1]}"
    host = machine_arch()
    return host, ("the host's (no Boot#### entry names it)" if dump else "the host's")


def plan(
    variables: Dict[str, efi.Variable], objects: payloads.Objects, arch: str, source: str
) -> dict:
    """The steps, verified: every db update signed by a KEK (or PK) entry of the firmware,
    then the KEK update signed by its PK.  Error (nothing written) for setup mode, a
    missing KEK or db, or a payload that should verify and does not."""
    setup = efi.boolean_variable(variables, "SetupMode", source)
    if setup:
        raise Error(
            f"{source}: the firmware is in Setup Mode (no PK enrolled): authenticated appends "
            "are not how keys are enrolled there; enrol keys in the firmware setup first"
        )
    for name in ("KEK", "db"):
        if name not in variables:
            raise Error(f"{source}: no {name} variable: nothing to append to")
    pk_certs = certs_of(variables.get("PK"))
    pk_entry = pk_first_entry(variables.get("PK"))
    kek_certs = certs_of(variables["KEK"])
    held = {"KEK": fingerprints(variables["KEK"]), "db": fingerprints(variables["db"])}
    result: dict = {
        "source": source,
        "payloads": str(objects.root),
        "arch": arch,
        "secure_boot": efi.boolean_variable(variables, "SecureBoot", source),
        "setup_mode": setup,
        "pk": None,
        "kek_update": {"published": False, "payload": None, "sha256": None, "reason": None},
        "present": [],
        "steps": [],
        "remaining": [],
        "options": [],
    }
    if len(pk_certs) == 1:
        result["pk"] = {
            "subject": efi.short_name(pk_certs[0]),
            "sha1": efi.fingerprint(pk_certs[0], "sha1"),
            "sha256": efi.fingerprint(pk_certs[0]),
        }
    for name, ca in payloads.DB_UPDATES.items():
        if payloads.FINGERPRINTS[ca] in held["db"]:
            result["present"].append(ca)
            continue
        payload = objects.db_update(arch, name)
        check_adds(payload, ca)
        broken = payloads.check_published(objects, payload)
        step = None if broken else db_step(payload, ca, kek_certs, pk_entry)
        if broken:
            result["remaining"].append(remaining(ca, "db", not_usable(payload, broken)))
        elif step is None:
            result["remaining"].append(
                remaining(ca, "db", "no certificate of this KEK (or PK) signed its update")
            )
        else:
            result["steps"].append(step)
    kek_step(result, variables, objects, held["KEK"], pk_certs, pk_entry)
    if result["remaining"]:
        result["options"] = options(variables, result)
    return result


def not_usable(payload: payloads.Payload, entry: dict) -> str:
    """Why a file on the known-broken list is never written."""
    return (
        f"{payload.path}: published by Microsoft as it is, but not usable ({entry['reason']}): "
        "not written"
    )


def kek_step(result, variables, objects, held, pk_certs, pk_entry) -> None:
    """The KEK update signed by this PK: a step, or what remains and the options."""
    kek = result["kek_update"]
    target = payloads.KEK_TARGET
    if payloads.FINGERPRINTS[target] in held:
        # Already there: the update is looked up in the map, not read (a truncated or
        # missing file does not matter then).
        found, _ = lookup_kek_update(objects, pk_certs, read=False)
        kek.update(found)
        result["present"].append(target)
        return
    found, payload = lookup_kek_update(objects, pk_certs)
    kek.update(found)
    verdict = None
    if payload is not None:
        check_adds(payload, target)
        # A damaged or replaced file stops everything (PayloadError); one Microsoft
        # published broken (ECS's PK1, Xiaomi's PK1-PK5) is never written, and the db
        # updates, which do not depend on it, go ahead.
        broken = payloads.check_published(objects, payload)
        verdict = (
            payloads.Verdict(False) if broken else payloads.verify_pk_signed(payload, pk_entry)
        )
        if broken:
            kek["reason"] = not_usable(payload, broken)
        elif verdict.reason == payloads.PK_MISMATCH:
            kek["reason"] = f"{payload.path}: {verdict.reason}"
        elif not verdict.ok:
            kek["reason"] = (
                f"{payload.path}: does not verify against this machine's PK "
                f"({verdict.reason}): not written"
            )
    if verdict is None or not verdict.ok:
        result["remaining"].append(remaining(target, "KEK", kek["reason"]))
        return
    result["steps"].append(step_json(payload, target, verdict, pk_certs[0]))


def check_adds(payload: payloads.Payload, ca: str) -> None:
    if payloads.FINGERPRINTS[ca] not in payload.adds:
        raise payloads.PayloadError(f"{payload.path}: does not hold {NAMES[ca]}: nothing written")


def remaining(ca: str, variable: str, reason: str) -> dict:
    return {"ca": ca, "name": NAMES[ca], "variable": variable, "reason": reason}


def step_json(payload: payloads.Payload, ca: str, verdict, signer: x509.Certificate) -> dict:
    return {
        "variable": payload.variable,
        "payload": payload.path,
        "sha256": payload.sha256,
        "adds": [ca],
        "name": NAMES[ca],
        "signed_by": efi.short_name(signer),
        "signed_by_sha256": efi.fingerprint(signer),
        "chain": verdict.chain,
        "verified": True,
        "status": "planned",
        "error": None,
        "warning": None,
        "_payload": payload,
    }


def db_step(
    payload: payloads.Payload,
    ca: str,
    kek_certs: List[x509.Certificate],
    pk_entry: Optional[bytes],
) -> Optional[dict]:
    """The step for a db update as edk2 authorises it (AuthVariableLib.c: ProcessVarWithPk,
    then ProcessVarWithKek): PK's first entry byte for byte as the signer (no chain), else
    each KEK certificate as a trust anchor of Pkcs7Verify.  None when no certificate of
    either is in its chain; Error when one is and the signature fails."""
    by_pk = payloads.verify_pk_signed(payload, pk_entry)
    if by_pk.ok:
        return step_json(payload, ca, by_pk, payloads.load_der_cert(pk_entry))
    carried = {efi.fingerprint(c) for c in payloads.p7_certificates(payload)}
    failures = []
    if pk_entry is not None and payloads.first_signer_der(payload.p7) == pk_entry:
        failures.append(f"PK: {by_pk.reason}")
    for trusted in kek_certs:
        verdict = payloads.verify_payload(payload, trusted)
        if verdict.ok:
            return step_json(payload, ca, verdict, trusted)
        if efi.fingerprint(trusted) in carried or verdict.reason.startswith(payloads.MALFORMED):
            failures.append(f"{efi.short_name(trusted)}: {verdict.reason}")
    if failures:
        raise payloads.PayloadError(
            f"{payload.path}: does not verify ({'; '.join(failures)}): nothing written"
        )
    return None


def lookup_kek_update(
    objects: payloads.Objects, pk_certs: List[x509.Certificate], read: bool = True
):
    """(the JSON of the look-up, the payload or None) for the machine's PK; without read,
    from the map alone (no payload, no sha256)."""
    found = {"published": False, "payload": None, "sha256": None, "reason": None}
    if len(pk_certs) != 1:
        found[
            "reason"
        ] = "the PK is not one usable X.509 certificate: no KEK update can be matched to it"
        return found, None
    sha1 = efi.fingerprint(pk_certs[0], "sha1")
    rel = objects.kek_update_for(sha1)
    if rel is None:
        found["reason"] = (
            f"Microsoft publishes no KEK update signed by this PK ({efi.short_name(pk_certs[0])},"
            f" SHA-1 {sha1})"
        )
        return found, None
    if not read:
        found.update({"published": True, "payload": rel})
        return found, None
    payload = objects.read(rel, "KEK")
    # The map is keyed by a thumbprint: confirm by the certificate itself.
    pk_der = efi.der(pk_certs[0])
    if not any(efi.der(c) == pk_der for c in payloads.p7_certificates(payload)):
        log.debug("%s: the PKCS#7 does not carry the PK certificate itself", rel)
    found.update({"published": True, "payload": rel, "sha256": payload.sha256})
    return found, payload


def options(variables: Dict[str, efi.Variable], result: dict) -> List[str]:
    """What can bring what the plan leaves: for the KEK, and for db where this KEK holds
    no certificate that signs Microsoft's db updates (the KEK CA 2011)."""
    left = {r["variable"] for r in result["remaining"]}
    text = []
    kek_2023 = payloads.FINGERPRINTS[payloads.KEK_TARGET]
    if "db" in left and payloads.KEK_CA_2011 not in fingerprints(variables.get("KEK")):
        if any(s["variable"] == "KEK" for s in result["steps"]):
            text.append(
                "the KEK update planned here first: Microsoft signs its later db updates with "
                "the KEK 2K CA 2023 it adds (fwupd's 'UEFI Signature Database' device applies "
                "them); the db updates published now are signed with the Microsoft Corporation "
                "KEK CA 2011, which this KEK lacks"
            )
        elif kek_2023 in fingerprints(variables.get("KEK")):
            text.append(
                "db updates signed with the KEK 2K CA 2023 this KEK holds, once Microsoft "
                "publishes them (fwupd's 'UEFI Signature Database' device); the ones "
                "published now are signed with the KEK CA 2011, which this KEK lacks"
            )
    wanted = " and ".join(
        name
        for name, var in (("the KEK 2K CA 2023", "KEK"), ("the Microsoft UEFI CA 2023", "db"))
        if var in left
    )
    text.append(
        f"a firmware (BIOS/UEFI) update from the machine's maker that adds {wanted}"
        + (" (or a KEK update the maker has Microsoft publish)" if "KEK" in left else "")
    )
    text += default_options(variables, left)
    if "KEK" in left:
        text.append(
            "Microsoft's documented platform-key replacement: a new PK from the maker, signed "
            "by the current one, whose owner signs a KEK update"
        )
    if "db" in left:
        text.append(
            "keys of your own: with the private key of a certificate in this KEK, sign a db "
            "append of Microsoft's certificates (shipped in "
            f"{payloads.DEFAULT_DIR}/PreSignedObjects/DB/Certificates) with efitools "
            "(cert-to-efi-sig-list, sign-efi-sig-list -a) and write it with efi-updatevar -a"
        )
    return text


def default_options(variables: Dict[str, efi.Variable], left: set) -> List[str]:
    """Restoring the factory keys, where the defaults hold what is missing."""
    kek_defaults = fingerprints(variables.get("KEKDefault"))
    db_defaults = fingerprints(variables.get("dbDefault"))
    has_kek = payloads.FINGERPRINTS[payloads.KEK_TARGET] in kek_defaults
    has_db = payloads.FINGERPRINTS["uefi_ca_2023"] in db_defaults
    if "KEK" in left and has_kek:
        return [
            "this firmware's factory-default keys (KEKDefault) already hold the KEK 2K CA "
            "2023: restoring the factory keys in the firmware setup loads it"
            + ("" if has_db else " (dbDefault lacks the UEFI CA 2023: run --fix again after)")
        ]
    if "db" in left and has_db:
        return [
            "this firmware's factory-default keys (dbDefault) already hold the Microsoft UEFI "
            "CA 2023: restoring the factory keys in the firmware setup loads it"
            + ("" if has_kek or "KEK" not in left else " (KEKDefault lacks the KEK 2K CA 2023)")
        ]
    return []


# --- measured boot: what changing db or KEK (PCR 7) would lock out ---------------------------


def pcr7_in(value) -> bool:
    if isinstance(value, str):
        return "7" in [p.strip() for p in value.replace(",", " ").split()]
    if isinstance(value, list):
        return any(pcr7_in(v) if isinstance(v, (str, list)) else v == 7 for v in value)
    return value == 7


def jwe_header(compact_or_json) -> dict:
    """The protected header of a JWE (compact string, or clevis's flattened JSON)."""
    protected = (
        compact_or_json.split(".")[0]
        if isinstance(compact_or_json, str)
        else compact_or_json.get("protected", "")
    )
    raw = base64.urlsafe_b64decode(protected + "=" * (-len(protected) % 4))
    return json.loads(raw)


def clevis_pcr7(header: dict, depth: int = 0) -> bool:
    clevis = header.get("clevis", {})
    if clevis.get("pin") == "tpm2":
        return pcr7_in(clevis.get("tpm2", {}).get("pcr_ids", ""))
    if clevis.get("pin") == "sss" and depth < 4:
        return any(
            clevis_pcr7(jwe_header(j), depth + 1) for j in clevis.get("sss", {}).get("jwe", [])
        )
    return False


def luks2_tokens_pcr7(metadata: dict) -> List[str]:
    """The LUKS2 tokens whose key is sealed to PCR 7: systemd-tpm2 (tpm2-pcrs, or a
    pcrlock policy) and clevis tpm2 pins (also inside sss)."""
    found = []
    for number, token in sorted((metadata.get("tokens") or {}).items()):
        if not isinstance(token, dict):
            found.append(f"token {number} (unreadable: assumed bound to PCR 7)")
            continue
        kind = token.get("type")
        try:
            if kind == "systemd-tpm2" and (
                pcr7_in(token.get("tpm2-pcrs", [])) or token.get("tpm2_pcrlock")
            ):
                found.append(f"token {number} (systemd-tpm2)")
            elif kind == "clevis" and clevis_pcr7(jwe_header(token.get("jwe", {}))):
                found.append(f"token {number} (clevis tpm2)")
        except (ValueError, AttributeError, TypeError):
            found.append(f"token {number} ({kind}, unreadable: assumed bound to PCR 7)")
    return found


def luks2_metadata(head: bytes) -> Optional[dict]:
    """The JSON area of a LUKS2 header (cryptsetup's on-disk format), or None when the
    device is not LUKS2.  A JSON area that is not an object is damaged input: Error."""
    if head[:6] != LUKS_MAGIC or struct.unpack_from(">H", head, 6)[0] != 2:
        return None
    size = struct.unpack_from(">Q", head, 8)[0]
    area = head[4096 : min(size, len(head))]
    try:
        metadata = json.loads(area.split(b"\0", 1)[0])
    except ValueError:
        return {"tokens": {"?": {"type": "unreadable"}}}
    if not isinstance(metadata, dict) or not isinstance(metadata.get("tokens", {}), dict):
        raise ValueError("damaged LUKS2 header: its JSON area is not an object with tokens")
    return metadata


def luksmeta_slots(head: bytes) -> bool:
    """Whether a LUKS1 header is followed by a luksmeta area (where clevis stores its
    bindings, tpm2 ones included: their PCRs are in the JWE, encrypted, not readable)."""
    return (
        head[:6] == LUKS_MAGIC
        and struct.unpack_from(">H", head, 6)[0] == 1
        and (LUKSMETA_MAGIC in head[LUKS1_HEADER:])
    )


def udev_fs_type(root: Path, name: str) -> Optional[str]:
    """What udev's blkid probe found on a block device (ID_FS_TYPE, "" for none), from
    its database (/run/udev/data/bMAJOR:MINOR, what libudev reads); None when udev has
    no probe result for it."""
    try:
        number = (root / "sys/class/block" / name / "dev").read_text().strip()
        lines = (root / "run/udev/data" / f"b{number}").read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    props = dict(line[2:].split("=", 1) for line in lines if line.startswith("E:") and "=" in line)
    if "ID_FS_TYPE" in props:
        return props["ID_FS_TYPE"]
    return "" if "ID_PART_TABLE_TYPE" in props else None


def device_size_zero(root: Path, name: str) -> bool:
    try:
        return (root / "sys/class/block" / name / "size").read_text().strip() == "0"
    except OSError:
        return False


def read_head(device: Path) -> bytes:
    """The first 16 KiB of a device, its whole LUKS2 header, or its LUKS1 header with
    the space up to the payload (luksmeta); OSError as the device answered."""
    fd = os.open(device, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        head = os.pread(fd, 16384, 0)
        if head[:6] == LUKS_MAGIC and len(head) >= 108:
            version = struct.unpack_from(">H", head, 6)[0]
            if version == 2:
                size = struct.unpack_from(">Q", head, 8)[0]
            else:
                size = struct.unpack_from(">I", head, 104)[0] * 512
            if 16384 < size <= MAX_LUKS_JSON:
                head = os.pread(fd, size, 0)
        return head
    finally:
        os.close(fd)


def device_secrets(device: Path, head: bytes) -> List[dict]:
    shown = f"/dev/{device.name}"
    if head[3:11] == BITLOCKER_SIGNATURE:
        return [{"kind": "bitlocker", "device": shown, "detail": "BitLocker"}]
    if luksmeta_slots(head):
        detail = "LUKS1 with luksmeta slots (clevis: maybe a tpm2 pin on PCR 7)"
        return [{"kind": "luks1-clevis", "device": shown, "detail": detail}]
    try:
        metadata = luks2_metadata(head)
    except ValueError as exc:
        # Its tokens cannot be read: one may be bound to PCR 7 (fail closed, but
        # overridable like any other secret).
        detail = f"{exc}: its tokens cannot be read, one may be bound to PCR 7"
        return [{"kind": "luks2-damaged", "device": shown, "detail": detail}]
    tokens = luks2_tokens_pcr7(metadata) if metadata is not None else []
    return [{"kind": "luks2-tpm2", "device": shown, "detail": t} for t in tokens]


def block_device_secrets(root: Path) -> List[dict]:
    """Every block device holding a LUKS2 volume with a PCR 7 token, LUKS1 with clevis's
    luksmeta, or BitLocker.  udev's probe picks the devices to open; without udev data
    each is read (non-blocking; size 0 skipped).  A device that cannot be read is an
    "unchecked" entry: it may hold such a secret (fail closed)."""
    found: List[dict] = []
    sysblock = root / "sys/class/block"
    try:
        names = sorted(os.listdir(sysblock))
    except OSError as exc:
        detail = (
            f"cannot be listed ({exc.strerror}): a block device may hold a secret sealed to PCR 7"
        )
        return [{"kind": "unchecked", "device": "/sys/class/block", "detail": detail}]
    for name in names:
        kind = udev_fs_type(root, name)
        if kind is not None and kind not in ("crypto_LUKS", "BitLocker"):
            continue
        if kind is None and device_size_zero(root, name):
            continue
        device = root / "dev" / name
        try:
            head = read_head(device)
        except OSError as exc:
            if exc.errno == errno.ENOMEDIUM:
                continue
            found.append(
                {
                    "kind": "unchecked",
                    "device": f"/dev/{name}",
                    "detail": f"cannot be read ({exc.strerror}): may hold a secret sealed "
                    "to PCR 7",
                }
            )
            continue
        found += device_secrets(device, head)
    return found


def crypttab_secrets(root: Path) -> List[dict]:
    """The /etc/crypttab entries that may unlock with the TPM: tpm2-device= and other
    tpm2- options (systemd-cryptsetup), a keyscript= (Debian's cryptsetup runs it: it
    may ask the TPM), a detached header= (its tokens are not on the device)."""
    found = []
    path = root / "etc/crypttab"
    if not os.path.lexists(path):
        return found
    text = efi.read_bounded(path, 1 << 20, "crypttab").decode("utf-8", "replace")
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 4 or fields[0].startswith("#"):
            continue
        options = fields[3].split(",")
        reasons = [o for o in options if o.startswith("tpm2-")]
        reasons += [o for o in options if o.startswith(("keyscript=", "header="))]
        if reasons:
            found.append(
                {
                    "kind": "crypttab",
                    "device": fields[1],
                    "detail": f"/etc/crypttab {fields[0]}: {', '.join(reasons)}",
                }
            )
    return found


def credential_secrets(root: Path) -> List[dict]:
    """systemd's encrypted credentials (credstore.encrypted, *.cred: systemd-creds may
    have sealed them to the TPM) and systemd-homed home areas (LUKS, maybe TPM-bound)."""
    found = []
    places = [(f"{d}/credstore.encrypted", "*") for d in CREDSTORE_DIRS]
    places += [(f"{d}/credstore", "*.cred") for d in CREDSTORE_DIRS]
    places += [("var/lib/systemd/home", "*.identity"), ("home", "*.home")]
    for where, pattern in places:
        directory = root / where
        try:
            names = sorted(p.name for p in directory.glob(pattern))
        except OSError:
            continue
        if names:
            kind = "homed" if where in ("home", "var/lib/systemd/home") else "credential"
            found.append(
                {
                    "kind": kind,
                    "device": f"/{where}",
                    "detail": f"{', '.join(names[:3])}{' ...' if len(names) > 3 else ''}: "
                    "may be sealed to the TPM (PCR 7)",
                }
            )
    return found


def unit_files(directory: Path):
    """The unit files and drop-ins under a unit directory (symbolic links, which point
    at units read where they are, and masks, skipped)."""
    for top, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(top, d))]
        for name in sorted(files):
            path = Path(top) / name
            if not path.is_symlink():
                yield path


def unit_credential_secrets(root: Path) -> List[dict]:
    """Units that decrypt a credential (SetCredentialEncrypted=, LoadCredentialEncrypted=):
    systemd-creds may have sealed it to the TPM."""
    found = []
    for where in UNIT_DIRS:
        for path in unit_files(root / where):
            try:
                with open(path, "rb") as handle:
                    text = handle.read(1 << 20).decode("utf-8", "replace")
            except OSError:
                continue
            keys = sorted(set(ENCRYPTED_CREDENTIAL.findall(text)))
            if keys:
                shown = f"/{path.relative_to(root)}"
                detail = f"{', '.join(k + '=' for k in keys)}: may be sealed to the TPM (PCR 7)"
                found.append({"kind": "credential", "device": shown, "detail": detail})
    return found


def measured_boot_secrets(root: Path) -> List[dict]:
    """Everything the change of PCR 7 may lock out, as far as it can be detected (the
    man page lists what cannot)."""
    return (
        block_device_secrets(root)
        + crypttab_secrets(root)
        + credential_secrets(root)
        + unit_credential_secrets(root)
    )


# --- writing through efivarfs --------------------------------------------------------------


def get_flags(fd: int) -> Optional[int]:
    try:
        buf = fcntl.ioctl(fd, FS_IOC_GETFLAGS, bytes(LONG))
    except OSError as exc:
        if exc.errno in (errno.ENOTTY, errno.EOPNOTSUPP, errno.EINVAL):
            return None  # no inode flags here (not efivarfs, or an old tmpfs)
        raise
    return struct.unpack_from("<i", buf)[0]


def set_flags(fd: int, flags: int) -> None:
    fcntl.ioctl(fd, FS_IOC_SETFLAGS, struct.pack("<i", flags) + bytes(LONG - 4))


def read_variable(path: Path) -> bytes:
    """The data of an efivarfs file (one read of the whole file, as efivarfs wants)."""
    with efi.open_regular(path) as handle:
        raw = handle.read(efi.MAX_VARIABLE + 5)
    return raw[4:]


class WriteError(Exception):
    """A step of an append that failed: phase is "open", "flags" (reading or clearing the
    immutable flag), "write" or "restore" (the flag, after a write that succeeded)."""

    def __init__(self, phase: str, exc: OSError):
        super().__init__(phase, exc)
        self.phase = phase
        self.errno = exc.errno
        self.strerror = exc.strerror
        self.restore: Optional[str] = None

    def describe(self) -> str:
        return f"{errno.errorcode.get(self.errno, self.errno)}: {self.strerror}"


# What efivarfs's write returns for the firmware's answer (the kernel's efi_status_to_err:
# EFI_INVALID_PARAMETER -> EINVAL, EFI_DEVICE_ERROR -> EIO, EFI_SECURITY_VIOLATION ->
# EACCES, EFI_OUT_OF_RESOURCES -> ENOSPC, EFI_WRITE_PROTECTED -> EROFS).  Any other
# errno of the write, or of the open or the ioctl, is not the firmware's.
FIRMWARE_ERRNOS = {errno.EINVAL, errno.EIO, errno.EACCES, errno.ENOSPC, errno.EROFS}


def write_once(path: Path, data: bytes) -> None:
    try:
        out = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise WriteError("open", exc) from None
    try:
        written = os.write(out, data)
        if written != len(data):
            raise OSError(errno.EIO, f"short write ({written} of {len(data)} bytes)")
    except OSError as exc:
        raise WriteError("write", exc) from None
    finally:
        os.close(out)


def restore_flag(fd: int, flags: int) -> Optional[OSError]:
    try:
        set_flags(fd, flags)
    except OSError as exc:
        return exc
    return None


def append(path: Path, blob: bytes) -> None:
    """One append write (attribute word 0x67, then the payload), the immutable flag
    cleared for it and restored after, whatever ends the write (an interruption too);
    WriteError naming the phase that failed (a write error carries a failure to restore
    the flag in its restore attribute)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise WriteError("open", exc) from None
    try:
        flags = None
        try:
            current = get_flags(fd)
            if current is not None and current & FS_IMMUTABLE_FL:
                set_flags(fd, current & ~FS_IMMUTABLE_FL)
                flags = current
        except OSError as exc:
            raise WriteError("flags", exc) from None
        try:
            write_once(path, struct.pack("<I", payloads.APPEND_ATTRIBUTES) + blob)
        except BaseException as exc:
            failure = restore_flag(fd, flags) if flags is not None else None
            if failure is not None and isinstance(exc, WriteError):
                exc.restore = WriteError("restore", failure).describe()
            raise
        failure = restore_flag(fd, flags) if flags is not None else None
        if failure is not None:
            raise WriteError("restore", failure)
    finally:
        os.close(fd)


def failed_step(step: dict, error: WriteError) -> None:
    """What a failed write was: the firmware's refusal, or an error before it."""
    if error.phase == "write" and error.errno in FIRMWARE_ERRNOS:
        step["status"] = "refused"
        step["error"] = error.describe()
    else:
        step["status"] = "failed"
        what = {"open": "cannot open the variable", "flags": "cannot clear its immutable flag"}
        step["error"] = f"{what.get(error.phase, 'the write failed')}: {error.describe()}"
    if error.restore:
        step["warning"] = f"setting the immutable flag again failed: {error.restore}"


# Signals held back from clearing the immutable flag to the read-back of each step: an
# interruption then comes between steps, with the flag set again and the step known.
BLOCKED_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


def variable_path(directory: Path, name: str) -> Path:
    return directory / f"{name}-{payloads.VARIABLE_GUIDS[name]}"


def apply(directory: Path, result: dict) -> bool:
    """Each step in order, signals blocked while it runs; stops at the first failure,
    then (all accepted) reads every variable written again.  True when all is as it
    should be."""
    for step in result["steps"]:
        step["status"] = "running"
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, BLOCKED_SIGNALS)
        try:
            ok = apply_step(directory, step)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        if not ok:
            return False
    return final_check(directory, result)


def read_for_step(path: Path, step: dict, status: str, what: str) -> Optional[bytes]:
    """The variable's data; None, with step's status and error set, when it cannot be
    read."""
    try:
        return read_variable(path)
    except OSError as exc:
        step["status"] = status
        step["error"] = f"cannot {what}: {exc.strerror}"
        return None


def apply_step(directory: Path, step: dict) -> bool:
    payload: payloads.Payload = step["_payload"]
    path = variable_path(directory, payload.variable)
    before = read_for_step(path, step, "failed", "read the variable before the write")
    if before is None:
        return False
    try:
        append(path, payload.blob)
    except WriteError as error:
        if error.phase != "restore":
            failed_step(step, error)
            return False
        step["warning"] = (
            "the write succeeded; setting the immutable flag again failed: " + error.describe()
        )
    return read_back(path, payload, before, step)


def raw_entries(data: bytes) -> Optional[set]:
    """Every EFI_SIGNATURE_DATA of data as (list type, the entry's bytes: owner and
    data); None when data is not a clean run of signature lists."""
    found = set()
    offset = 0
    while offset < len(data):
        if len(data) - offset < 28:
            return None
        list_size, header_size, size = struct.unpack_from("<III", data, offset + 16)
        body = offset + 28 + header_size
        end = offset + list_size
        if size == 0 or end > len(data) or body > end or (end - body) % size:
            return None
        kind = data[offset : offset + 16]
        found.update((kind, data[i : i + size]) for i in range(body, end, size))
        offset = end
    return found


def compare_append(before: bytes, appended: bytes, now: bytes) -> Tuple[str, Optional[str]]:
    """(status, what is wrong): "applied" when now holds every entry held before and
    every entry appended, and nothing else (the firmware drops duplicates); "damaged"
    when an entry held before is gone or another appeared (a replace, not an append);
    "not-accepted" when the variable is as it was."""
    old, added, got = raw_entries(before), raw_entries(appended), raw_entries(now)
    if old is None:  # firmware data the walk cannot split: its bytes must lead
        old = set()
        if now[: len(before)] != before:
            return "damaged", "what it held before is no longer at its start"
        got = raw_entries(now[len(before) :])
    if got is None:
        return "damaged", "it is no longer a run of signature lists"
    lost, extra = old - got, got - old - (added or set())
    if lost or extra:
        return "damaged", (
            f"{len(lost)} entries held before are gone, {len(extra)} entries that "
            "were neither held nor appended are there"
        )
    if added and not added <= got:
        return "not-accepted", "the write succeeded but the variable does not hold it"
    return "applied", None


def read_back(path: Path, payload: payloads.Payload, before: bytes, step: dict) -> bool:
    now = read_for_step(path, step, "unknown", "read it back")
    if now is None:
        return False
    status, error = compare_append(before, payload.data, now)
    if status == "applied" and not holds(payload.variable, now, step["adds"]):
        status, error = "not-accepted", "the write succeeded but the variable does not hold it"
    step["status"], step["error"] = status, error
    return status == "applied"


def holds(name: str, data: bytes, cas: List[str]) -> bool:
    variable = efi.Variable(name, payloads.VARIABLE_GUIDS[name], 0, data)
    held = {efi.fingerprint(c) for c in certs_of(variable)}
    return all(payloads.FINGERPRINTS[ca] in held for ca in cas)


def final_check(directory: Path, result: dict) -> bool:
    """Every variable written, read once more after the last step: each CA added is
    there (a later write must not have undone an earlier one)."""
    for step in result["steps"]:
        name = step["variable"]
        data = read_for_step(variable_path(directory, name), step, "unknown", "read it again")
        if data is None:
            return False
        if not holds(name, data, step["adds"]):
            step["status"] = "damaged"
            step["error"] = "read again after the last step, the variable no longer holds it"
            return False
    return True


def backup_keys(root: Path, variables: Dict[str, efi.Variable], now: datetime.datetime) -> Path:
    """PK, KEK, db and dbx as they are, as EFI_SIGNATURE_LIST files (NAME.esl: what the
    firmware setup's key management, or efi-updatevar, loads), in a new directory under
    ROOT/var/lib/secureboot-ca-check; Error when it cannot be written (nothing is)."""
    base = root / BACKUP_DIR
    name = f"backup-{now.strftime('%Y%m%dT%H%M%SZ')}"
    directory = base / name
    try:
        os.makedirs(base, mode=0o755, exist_ok=True)
        number = 1
        while True:
            try:
                os.mkdir(directory, 0o700)
                break
            except FileExistsError:
                number += 1
                directory = base / f"{name}-{number}"
        for name in ("PK", "KEK", "db", "dbx"):
            if name in variables:
                fsutil.atomic_write(directory / f"{name}.esl", variables[name].data, mode=0o600)
        fsutil.fsync_dir(directory)
    except OSError as exc:
        raise Error(
            f"cannot save the keys in {directory}: {exc.strerror}: nothing written"
        ) from None
    except Error as exc:
        raise Error(f"{exc}: the keys are not saved: nothing written") from None
    return directory


# --- efivarfs, the real one -----------------------------------------------------------------

EFIVARFS_MAGIC = 0xDE5E81E4
# Tests write to a plain directory standing in for efivarfs: they set this (and only
# they: no option or environment variable of the command sets it).
ACCEPT_ANY_FILESYSTEM = False


def filesystem_magic(directory: Path) -> int:
    """statfs(2)'s f_type (the first field, a long, of struct statfs)."""
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(512)
    if libc.statfs(os.fsencode(directory), buf) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return struct.unpack_from("l", buf.raw)[0] & 0xFFFFFFFF


def check_efivarfs(directory: Path) -> None:
    """Writes go to efivarfs only: a plain directory (a copy, a wrong --root) is refused."""
    if ACCEPT_ANY_FILESYSTEM:
        return
    try:
        magic = filesystem_magic(directory)
    except OSError as exc:
        raise Error(f"{directory}: cannot tell its file system: {exc.strerror}") from None
    if magic != EFIVARFS_MAGIC:
        raise Error(
            f"{directory}: not efivarfs (file system magic {magic:#x}): nothing written "
            "(a dump is planned with --efivars DIR --fix --dry-run)"
        )


# --- the command ------------------------------------------------------------------------


def render(result: dict) -> List[str]:
    lines = [f"{result['source']}:"]
    folder = payloads.ARCHES[result["arch"]]
    lines.append(
        f"  architecture: {result['arch']} ({result.get('arch_from', 'given')}): "
        f"{payloads.POST}/Optional/DB/{folder}/"
    )
    pk = result["pk"]
    lines.append(f"  PK: {pk['subject'] + ' (SHA-1 ' + pk['sha1'] + ')' if pk else 'not usable'}")
    kek = result["kek_update"]
    if kek["published"] and kek["reason"]:
        lines.append(f"  KEK update for this PK: published ({kek['payload']}), not usable")
    elif kek["published"]:
        lines.append(
            f"  KEK update for this PK: published ({kek['payload']}); fwupd can apply it too"
        )
    else:
        lines.append(f"  KEK update for this PK: none ({kek['reason']})")
    for ca in result["present"]:
        lines.append(f"  already present: {NAMES[ca]}")
    verbs = {
        "planned": "would append",
        "applied": "appended",
        "refused": "REFUSED by the firmware:",
        "failed": "NOT written:",
        "not-accepted": "NOT accepted:",
        "unknown": "written, not read back:",
        "damaged": "DAMAGED (the firmware did not append):",
        "interrupted": "interrupted (may be written):",
        "not-run": "not attempted:",
    }
    for step in result["steps"]:
        line = (
            f"  {verbs[step['status']]} {step['name']} to {step['variable']} "
            f"({step['payload']}, sha256 {step['sha256'][:16]}..., signed by "
            f"{step['signed_by']}: verified)"
        )
        lines.append(line + (f": {step['error']}" if step["error"] else ""))
    for item in result["remaining"]:
        lines.append(f"  remains: {item['name']} in {item['variable']}: {item['reason']}")
    if result["options"]:
        lines.append("  options:")
        lines.extend(f"    - {text}" for text in result["options"])
    if result.get("backup"):
        lines.append(f"  keys as they were saved in: {result['backup']}")
    for secret in result.get("measured_boot", []):
        lines.append(f"  PCR 7 secret: {secret['device']}: {secret['detail']}")
    if not result["steps"] and not result["remaining"]:
        lines.append("  nothing to change")
    return lines


def firmware_directory(args) -> Path:
    """The efivarfs directory (or --efivars dump) the fix reads."""
    dump = bool(args.efivars)
    if dump and not args.dry_run:
        raise Error("--efivars DIR --fix plans from a dump: add --dry-run")
    if args.root and not Path(args.root).is_dir():
        # A root the admin named is bad input, not a host without UEFI (as for the check).
        raise Error(f"{args.root}: no such directory")
    directory = Path(args.efivars) if dump else Path(args.root or "/") / EFIVARS
    if not directory.is_dir():
        if dump:
            raise Error(f"{directory}: no such directory")
        raise NotApplicable(
            f"{directory} does not exist: this system did not boot with UEFI "
            "(or efivarfs is not mounted)"
        )
    if dump:
        efi.check_efivars_dump(directory)
    return directory


def check_secrets(result: dict, args) -> None:
    """Refuse (Error) the write when secrets are bound to PCR 7, or may be, unless the
    admin holds their recovery keys; a warning in a dry run."""
    if not result["steps"] or not result["measured_boot"] or args.i_have_recovery_keys:
        return
    names = ", ".join(f"{s['device']} ({s['detail']})" for s in result["measured_boot"])
    message = (
        f"changing db and KEK changes PCR 7, and these secrets are (or may be) bound to it: "
        f"{names}; have their recovery keys at hand and pass --i-have-recovery-keys"
    )
    if not args.dry_run:
        raise Error(message + ": nothing written")
    print(f"{PROG}: warning: {message}", file=sys.stderr)


def run_steps(directory: Path, result: dict, variables: dict, root: Path) -> int:
    """Save the keys, then apply the plan: 0, or 2 when a step failed (the rest then
    not run).  Whatever ends it after the keys are saved (an interruption, a bug), what
    was applied is said on stderr."""
    check_efivarfs(directory)
    now = datetime.datetime.now(datetime.timezone.utc)
    result["backup"] = str(backup_keys(root, variables, now))
    try:
        ok = apply(directory, result)
    except BaseException:
        for step in result["steps"]:
            if step["status"] == "running":
                step["status"] = "interrupted"
        print(f"{PROG}: {summary(result)}", file=sys.stderr)
        raise
    result["written"] = any(s["status"] == "applied" for s in result["steps"])
    if ok:
        return 0
    for step in result["steps"]:
        if step["status"] == "planned":
            step["status"] = "not-run"
    return 2


def summary(result: dict) -> str:
    """What was written when the run ended before its end, and where the keys are."""
    applied = [s["payload"] for s in result["steps"] if s["status"] == "applied"]
    broken = [s["payload"] for s in result["steps"] if s["status"] == "interrupted"]
    text = f"stopped: applied: {', '.join(applied) or 'nothing'}"
    if broken:
        text += f"; interrupted during (may be written): {', '.join(broken)}"
    return text + f"; the keys as they were are in {result['backup']}"


def report_failure(result: dict) -> None:
    failed = next(s for s in result["steps"] if s["error"])
    applied = [s["payload"] for s in result["steps"] if s["status"] == "applied"]
    how = {
        "refused": "refused by the firmware",
        "failed": "not written",
        "damaged": f"{failed['variable']} DAMAGED, the firmware did not append",
    }.get(failed["status"], failed["status"])
    line = (
        f"{PROG}: error: {failed['payload']}: {how}: {failed['error']}; "
        f"applied before it: {', '.join(applied) or 'nothing'}"
    )
    if failed["warning"]:
        line += f"; {failed['warning']}"
    if failed["status"] == "damaged":
        line += (
            f"; restore the keys saved in {result['backup']} in the firmware setup "
            "(see secureboot-ca-check(8), The risks)"
        )
    print(line, file=sys.stderr)


def cmd_fix_firmware(args) -> int:
    """--fix on the running machine's efivarfs, or --efivars DIR --fix --dry-run."""
    return run_locked(args, fix_firmware)


def run_locked(args, fix) -> int:
    """fix(args, directory, root) on the firmware directory, under the lock that keeps two
    writers of the firmware's variables apart (a dry run writes nothing: no lock)."""
    directory = firmware_directory(args)
    root = Path(args.root or "/")
    if args.dry_run:
        return fix(args, directory, root)
    lock = root / LOCK
    try:
        os.makedirs(lock.parent, exist_ok=True)
    except OSError as exc:
        raise Error(f"cannot create {lock.parent}: {exc.strerror}") from None
    with fsutil.locked(lock, wait=False):
        return fix(args, directory, root)


def fix_firmware(args, directory: Path, root: Path) -> int:
    dump = bool(args.efivars)
    objects = payloads.load_objects(args.payloads, root)
    variables = efi.read_efivars(directory)
    arch, arch_from = choose_arch(directory, getattr(args, "arch", None), dump)
    result = plan(variables, objects, arch, str(directory))
    result["arch_from"] = arch_from
    result.update({"dry_run": bool(args.dry_run), "written": False, "measured_boot": []})
    result["recovery_keys_confirmed"] = bool(args.i_have_recovery_keys)
    result["backup"] = None
    if not dump:
        result["measured_boot"] = measured_boot_secrets(root)
    check_secrets(result, args)
    status = 0
    if result["steps"] and not args.dry_run:
        status = run_steps(directory, result, variables, root)
    if status == 0 and result["remaining"]:
        status = 1
    result["exit_status"] = status
    for step in result["steps"]:
        del step["_payload"]
    if args.json:
        emit_json({"fix": result, "exit_status": status})
    else:
        print("\n".join(render(result)))
    for step in result["steps"]:
        if step.get("warning") and not step["error"]:
            print(f"{PROG}: warning: {step['payload']}: {step['warning']}", file=sys.stderr)
    if status == 2:
        report_failure(result)
    return status
