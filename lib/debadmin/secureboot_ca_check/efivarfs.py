"""secureboot-ca-check --fix on firmware: Microsoft's signed updates appended through efivarfs."""

import base64
import errno
import fcntl
import json
import logging
import os
import struct
import sys
import warnings
from pathlib import Path
from typing import Dict, List, Optional

from cryptography import x509

from debadmin.errors import Error, NotApplicable
from debadmin.output import emit_json
from debadmin.secureboot_ca_check import efi
from debadmin.secureboot_ca_check import payloads

log = logging.getLogger("debadmin")

EFIVARS = "sys/firmware/efi/efivars"
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


# --- what the firmware holds, and the plan ----------------------------------------------------


def certs_of(variable: Optional[efi.Variable]) -> List[x509.Certificate]:
    if variable is None:
        return []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        entries, _problems = efi.read_signature_lists(variable.data)
    return [e.cert for e in entries if e.cert is not None and e.usable]


def fingerprints(variable: Optional[efi.Variable]) -> set:
    return {efi.fingerprint(c) for c in certs_of(variable)}


def machine_arch() -> str:
    return payloads.MACHINE_ARCH.get(os.uname().machine, "amd64")


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
        step = db_step(payload, ca, kek_certs, pk_certs)
        if step is None:
            result["remaining"].append(
                remaining(ca, "db", "no certificate of this KEK (or PK) signed its update")
            )
        else:
            result["steps"].append(step)
    kek = result["kek_update"]
    target = payloads.KEK_TARGET
    found, payload = lookup_kek_update(objects, pk_certs)
    kek.update(found)
    if payloads.FINGERPRINTS[target] in held["KEK"]:
        result["present"].append(target)
    else:
        if payload is None:
            result["remaining"].append(remaining(target, "KEK", kek["reason"]))
            result["options"] = options(variables)
        else:
            check_adds(payload, target)
            verdict = payloads.verify_payload(payload, pk_certs[0])
            if not verdict.ok:
                raise Error(
                    f"{payload.path}: does not verify against this machine's PK "
                    f"({verdict.reason}): nothing written"
                )
            result["steps"].append(step_json(payload, target, verdict, pk_certs[0]))
    return result


def check_adds(payload: payloads.Payload, ca: str) -> None:
    if payloads.FINGERPRINTS[ca] not in payload.adds:
        raise Error(f"{payload.path}: does not hold {NAMES[ca]}: nothing written")


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
        "_payload": payload,
    }


def db_step(
    payload: payloads.Payload,
    ca: str,
    kek_certs: List[x509.Certificate],
    pk_certs: List[x509.Certificate],
) -> Optional[dict]:
    """The step for a db update when a KEK (then PK) certificate verifies it, as edk2 tries
    them; None when none is in its chain; Error when one is and the signature fails."""
    carried = {efi.fingerprint(c) for c in payloads.p7_certificates(payload)}
    failures = []
    for trusted in kek_certs + pk_certs:
        verdict = payloads.verify_payload(payload, trusted)
        if verdict.ok:
            return step_json(payload, ca, verdict, trusted)
        if efi.fingerprint(trusted) in carried:
            failures.append(f"{efi.short_name(trusted)}: {verdict.reason}")
    if failures:
        raise Error(f"{payload.path}: does not verify ({'; '.join(failures)}): nothing written")
    return None


def lookup_kek_update(objects: payloads.Objects, pk_certs: List[x509.Certificate]):
    """(the JSON of the look-up, the payload or None) for the machine's PK."""
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
    payload = objects.read(rel, "KEK")
    # The map is keyed by a thumbprint: confirm by the certificate itself.
    pk_der = efi.der(pk_certs[0])
    if not any(efi.der(c) == pk_der for c in payloads.p7_certificates(payload)):
        log.debug("%s: the PKCS#7 does not carry the PK certificate itself", rel)
    found.update({"published": True, "payload": rel, "sha256": payload.sha256})
    return found, payload


def options(variables: Dict[str, efi.Variable]) -> List[str]:
    text = [
        "a firmware (BIOS/UEFI) update from the machine's maker that adds the Microsoft "
        "Corporation KEK 2K CA 2023 (or a KEK update the maker has Microsoft publish)",
    ]
    defaults = fingerprints(variables.get("KEKDefault"))
    if payloads.FINGERPRINTS[payloads.KEK_TARGET] in defaults:
        db_defaults = fingerprints(variables.get("dbDefault"))
        has_db = payloads.FINGERPRINTS["uefi_ca_2023"] in db_defaults
        text.append(
            "this firmware's factory-default keys (KEKDefault) already hold the KEK 2K CA "
            "2023: restoring the factory keys in the firmware setup loads it"
            + ("" if has_db else " (dbDefault lacks the UEFI CA 2023: run --fix again after)")
        )
    text.append(
        "Microsoft's documented platform-key replacement: a new PK from the maker, signed "
        "by the current one, whose owner signs a KEK update"
    )
    return text


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
    """The JSON area of a LUKS2 header (cryptsetup's on-disk format), or None."""
    if head[:6] != LUKS_MAGIC or struct.unpack_from(">H", head, 6)[0] != 2:
        return None
    size = struct.unpack_from(">Q", head, 8)[0]
    area = head[4096 : min(size, len(head))]
    try:
        return json.loads(area.split(b"\0", 1)[0])
    except ValueError:
        return {"tokens": {"?": {"type": "unreadable"}}}


def measured_boot_secrets(root: Path) -> List[dict]:
    """Every block device holding a LUKS2 volume with a PCR 7 token, or BitLocker."""
    found = []
    sysblock = root / "sys/class/block"
    try:
        names = sorted(os.listdir(sysblock))
    except OSError:
        return found
    for name in names:
        device = root / "dev" / name
        try:
            fd = os.open(device, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            log.debug("%s: not checked for PCR 7 secrets: %s", device, exc.strerror)
            continue
        try:
            head = os.pread(fd, 16384, 0)
            if head[:6] == LUKS_MAGIC and len(head) >= 16:
                size = struct.unpack_from(">Q", head, 8)[0]
                if 16384 < size <= MAX_LUKS_JSON:
                    head = os.pread(fd, size, 0)
        except OSError as exc:
            log.debug("%s: not checked for PCR 7 secrets: %s", device, exc.strerror)
            continue
        finally:
            os.close(fd)
        if head[3:11] == BITLOCKER_SIGNATURE:
            found.append({"kind": "bitlocker", "device": f"/dev/{name}", "detail": "BitLocker"})
            continue
        metadata = luks2_metadata(head)
        if metadata is not None:
            for token in luks2_tokens_pcr7(metadata):
                found.append({"kind": "luks2-tpm2", "device": f"/dev/{name}", "detail": token})
    return found


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


def append(path: Path, blob: bytes) -> None:
    """One append write (attribute word 0x67, then the payload), the immutable flag
    cleared for it and restored after; OSError as the firmware answered."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        flags = get_flags(fd)
        if flags is not None and flags & FS_IMMUTABLE_FL:
            set_flags(fd, flags & ~FS_IMMUTABLE_FL)
        try:
            out = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                data = struct.pack("<I", payloads.APPEND_ATTRIBUTES) + blob
                written = os.write(out, data)
                if written != len(data):
                    raise OSError(errno.EIO, f"short write ({written} of {len(data)} bytes)")
            finally:
                os.close(out)
        finally:
            if flags is not None and flags & FS_IMMUTABLE_FL:
                set_flags(fd, flags)
    finally:
        os.close(fd)


def apply(directory: Path, result: dict) -> bool:
    """Each step in order; stops at the first refusal.  True when every step was accepted."""
    for step in result["steps"]:
        payload: payloads.Payload = step["_payload"]
        guid = payloads.VARIABLE_GUIDS[payload.variable]
        path = directory / f"{payload.variable}-{guid}"
        try:
            append(path, payload.blob)
        except OSError as exc:
            step["status"] = "refused"
            step["error"] = f"{errno.errorcode.get(exc.errno, exc.errno)}: {exc.strerror}"
            return False
        try:
            now = read_variable(path)
        except OSError as exc:
            step["status"] = "unknown"
            step["error"] = f"cannot read it back: {exc.strerror}"
            return False
        held = {efi.fingerprint(c) for c in certs_of(efi.Variable(payload.variable, guid, 0, now))}
        if all(payloads.FINGERPRINTS[ca] in held for ca in step["adds"]):
            step["status"] = "applied"
        else:
            step["status"] = "not-accepted"
            step["error"] = "the write succeeded but the variable does not hold it"
            return False
    return True


# --- the command ------------------------------------------------------------------------


def render(result: dict) -> List[str]:
    lines = [f"{result['source']}:"]
    pk = result["pk"]
    lines.append(f"  PK: {pk['subject'] + ' (SHA-1 ' + pk['sha1'] + ')' if pk else 'not usable'}")
    kek = result["kek_update"]
    if kek["published"]:
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
        "not-accepted": "NOT accepted:",
        "unknown": "written, not read back:",
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
        lines.append("  options for the KEK:")
        lines.extend(f"    - {text}" for text in result["options"])
    for secret in result.get("measured_boot", []):
        lines.append(f"  PCR 7 secret: {secret['device']}: {secret['detail']}")
    if not result["steps"] and not result["remaining"]:
        lines.append("  nothing to change")
    return lines


def cmd_fix_firmware(args) -> int:
    """--fix on the running machine's efivarfs, or --efivars DIR --fix --dry-run."""
    dump = bool(args.efivars)
    if dump and not args.dry_run:
        raise Error("--efivars DIR --fix plans from a dump: add --dry-run")
    root = Path(args.root or "/")
    directory = Path(args.efivars) if dump else root / EFIVARS
    if not directory.is_dir():
        if dump:
            raise Error(f"{directory}: no such directory")
        raise NotApplicable(
            f"{directory} does not exist: this system did not boot with UEFI "
            "(or efivarfs is not mounted)"
        )
    objects = payloads.load_objects(args.payloads, root)
    variables = efi.read_efivars(directory)
    arch = "amd64" if dump else machine_arch()  # Microsoft's files are the same for each
    result = plan(variables, objects, arch, str(directory))
    result.update({"dry_run": bool(args.dry_run), "written": False, "measured_boot": []})
    result["recovery_keys_confirmed"] = bool(args.i_have_recovery_keys)
    if not dump:
        result["measured_boot"] = measured_boot_secrets(root)
    if result["steps"] and result["measured_boot"] and not args.i_have_recovery_keys:
        names = ", ".join(f"{s['device']} ({s['detail']})" for s in result["measured_boot"])
        message = (
            f"changing db and KEK changes PCR 7, and these secrets are bound to it: {names}; "
            "have their recovery keys at hand and pass --i-have-recovery-keys"
        )
        if not args.dry_run:
            raise Error(message + ": nothing written")
        print(f"secureboot-ca-check: warning: {message}", file=sys.stderr)
    status = 0
    if result["steps"] and not args.dry_run:
        ok = apply(directory, result)
        result["written"] = any(s["status"] == "applied" for s in result["steps"])
        if not ok:
            for step in result["steps"]:
                if step["status"] == "planned":
                    step["status"] = "not-run"
            status = 2
    if status == 0 and result["remaining"]:
        status = 1
    result["exit_status"] = status
    for step in result["steps"]:
        del step["_payload"]
    if args.json:
        emit_json({"fix": result, "exit_status": status})
    else:
        print("\n".join(render(result)))
    if status == 2:
        failed = next(s for s in result["steps"] if s["error"])
        applied = [s["payload"] for s in result["steps"] if s["status"] == "applied"]
        how = "refused by the firmware" if failed["status"] == "refused" else failed["status"]
        print(
            f"secureboot-ca-check: error: {failed['payload']}: {how}: {failed['error']}; "
            f"applied before it: {', '.join(applied) or 'nothing'}",
            file=sys.stderr,
        )
    return status
