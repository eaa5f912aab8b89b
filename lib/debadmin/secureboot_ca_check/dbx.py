"""secureboot-ca-check --fix --dbx: Microsoft's dbx update, offline, never locking out the boot path.

The plan: the architecture's latest DBXUpdate.bin (or the --dbx-update named), verified
against the firmware's PK or KEK as edk2 verifies an authenticated append, applied only
when dbx lacks some of its entries.  Before any write every EFI binary the machine may
boot (each file on each mounted ESP, or --esp copies; the signed shim and GRUB images of
the installed packages, which their next upgrade puts on the ESP) is checked against the
entries the update adds, by Authenticode hash and by signer: one hit refuses the step.
"""

import errno
import hashlib
import json
import logging
import os
import re
import stat
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

from cryptography import x509

from debadmin.errors import Error
from debadmin.output import emit_json
from debadmin.secureboot_ca_check import efi, efivarfs, fix, payloads, pe

log = logging.getLogger("debadmin")
PROG = "secureboot-ca-check"

LATEST = "DBX/{arch}/DBXUpdate.bin"  # under PostSignedObjects/, per Microsoft's arch name
DBX_DIRS = ("DBX/", "Optional/DBX/")
INFO = "PreSignedObjects/DBX/dbx_info_msft_latest.json"
ESP_TYPE = "c12a7328-f81f-11d2-ba4b-00a0c93ec93b"
ESP_MOUNTS = ("/boot/efi", "/efi")
PACKAGE_IMAGES = ("usr/lib/shim/*.efi.signed", "usr/lib/grub/*-efi-signed/*.efi.signed")
MAX_ESP_FILES = 20000
MOUNTINFO_ESCAPE = re.compile(r"\\([0-7]{3})")


# --- the update and what it adds -------------------------------------------------------------


def update_path(rel: Optional[str], arch: str) -> str:
    """The update's path under PostSignedObjects/: --dbx-update's (checked), or the
    architecture's latest."""
    if rel is None:
        return LATEST.format(arch=payloads.ARCHES[arch])
    text = rel[len(payloads.POST) + 1 :] if rel.startswith(payloads.POST + "/") else rel
    parts = Path(text).parts
    if Path(text).is_absolute() or ".." in parts or not text.startswith(DBX_DIRS):
        raise Error(
            f"--dbx-update {rel}: not a dbx update under {payloads.POST}/ "
            "(e.g. Optional/DBX/DBXUpdate2024.bin)"
        )
    return text


def read_update(objects: payloads.Objects, rel: str) -> payloads.Payload:
    return objects.read(rel, "dbx")


def entry_keys(data: bytes, what: str) -> Dict[Tuple[str, bytes], efi.Entry]:
    """The entries of signature lists by (kind, data): an owner GUID does not make a
    hash or a certificate another revocation."""
    return {(e.kind, e.data): e for e in efi.parse_signature_lists(data, what)}


def held_keys(variable: Optional[efi.Variable]) -> Set[Tuple[str, bytes]]:
    """What dbx holds (readable entries; a damaged list in it is the report's business)."""
    if variable is None:
        return set()
    entries, _problems = efi.read_signature_lists(variable.data)
    return {(e.kind, e.data) for e in entries}


@dataclass
class Additions:
    """The entries of an update that dbx lacks."""

    hashes: Dict[str, efi.Entry] = field(default_factory=dict)  # hex SHA-256
    certs: List[x509.Certificate] = field(default_factory=list)
    other: List[str] = field(default_factory=list)  # entries no image is matched against

    @property
    def count(self) -> int:
        return len(self.hashes) + len(self.certs) + len(self.other)


def additions(payload: payloads.Payload, dbx: Optional[efi.Variable]) -> Tuple[int, Additions]:
    """(entries in the update, those dbx lacks)."""
    entries = entry_keys(payload.data, payload.path)
    held = held_keys(dbx)
    missing = Additions()
    for key, entry in entries.items():
        if key in held:
            continue
        if entry.kind == "sha256":
            missing.hashes[entry.data.hex()] = entry
        elif entry.kind == "x509" and entry.cert is not None:
            missing.certs.append(entry.cert)
        else:
            missing.other.append(unmatched_name(entry))
    return len(entries), missing


def unmatched_name(entry: efi.Entry) -> str:
    """An entry of a kind no image is matched against (another digest, a certificate that
    does not parse), as the refusal names it."""
    if entry.kind == "x509":
        return f"x509 (unparsable, sha256 {hashlib.sha256(entry.data).hexdigest()})"
    return f"{entry.kind} {entry.data.hex()}"


def verify(
    payload: payloads.Payload, variables: Dict[str, efi.Variable]
) -> Tuple[Optional[dict], str]:
    """(who signed it, as the firmware would accept it, or None; why not).  Error when a
    certificate of the firmware is in its PKCS#7 and the signature still fails (a
    damaged file)."""
    pk_entry = efivarfs.pk_first_entry(variables.get("PK"))
    by_pk = payloads.verify_pk_signed(payload, pk_entry)
    if by_pk.ok:
        return signer_json(payloads.load_der_cert(pk_entry), by_pk, "PK"), ""
    carried = {efi.fingerprint(c) for c in payloads.p7_certificates(payload)}
    failures = []
    for trusted in efivarfs.certs_of(variables.get("KEK")):
        verdict = payloads.verify_payload(payload, trusted)
        if verdict.ok:
            return signer_json(trusted, verdict, "KEK"), ""
        if efi.fingerprint(trusted) in carried or verdict.reason.startswith(payloads.MALFORMED):
            failures.append(f"{efi.short_name(trusted)}: {verdict.reason}")
    if failures:
        raise Error(f"{payload.path}: does not verify ({'; '.join(failures)}): nothing written")
    signers = ", ".join(sorted({efi.short_name(c) for c in payloads.p7_certificates(payload)}))
    return None, (
        f"no certificate of this KEK (or PK) signed it (its PKCS#7 carries: {signers}); "
        "the KEK needs Microsoft's KEK CA first (see the CA update, --fix)"
    )


def signer_json(cert: x509.Certificate, verdict: payloads.Verdict, anchor: str) -> dict:
    return {
        "signed_by": efi.short_name(cert),
        "signed_by_sha256": efi.fingerprint(cert),
        "trusted_in": anchor,
        "chain": verdict.chain,
    }


# --- the boot path -------------------------------------------------------------------------


def unescape(text: str) -> str:
    return MOUNTINFO_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), text)


def partition_type(root: Path, number: str) -> Optional[str]:
    """ID_PART_ENTRY_TYPE of a block device from udev's database (MAJOR:MINOR)."""
    try:
        lines = (root / "run/udev/data" / f"b{number}").read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    for line in lines:
        if line.startswith("E:ID_PART_ENTRY_TYPE="):
            return line.split("=", 1)[1].strip().lower()
    return None


def mounted_esps(root: Path) -> List[str]:
    """Mount points of the ESPs: vfat mounts of an EFI System Partition (by its GPT
    type, as udev probed it), or on /boot/efi or /efi."""
    try:
        text = (root / "proc/self/mountinfo").read_text()
    except OSError as exc:
        raise Error(f"cannot read the mount table: {exc.strerror}") from None
    found: List[str] = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        dash = fields.index("-")
        if len(fields) < dash + 2 or len(fields) < 5:
            continue
        number, mount_point, fstype = fields[2], unescape(fields[4]), fields[dash + 1]
        if fstype == "autofs" and mount_point in ESP_MOUNTS:
            # systemd's automount of the ESP: walking it mounts it.
            if mount_point not in found:
                found.append(mount_point)
            continue
        if fstype not in ("vfat", "msdos"):
            continue
        if mount_point in ESP_MOUNTS or partition_type(root, number) == ESP_TYPE:
            if mount_point not in found:
                found.append(mount_point)
    return found


def package_images(root: Path) -> List[Path]:
    return sorted(p for pattern in PACKAGE_IMAGES for p in root.glob(pattern) if p.is_file())


def package_of(path: str) -> str:
    """What to update for an image (a package, or what puts it on the ESP)."""
    name = os.path.basename(path).lower()
    if "/usr/lib/grub/" in path or name.startswith(("grub", "gcd")):
        return "GRUB: upgrade grub-efi-ARCH-signed and run grub-install (or dpkg-reconfigure)"
    if "/usr/lib/shim/" in path or name.startswith(("shim", "mm", "fb", "boot")):
        return "shim: upgrade shim-signed (its postinst puts it on the ESP)"
    return "this file: replace it with a version the update does not revoke, or remove it"


def judge(image: pe.Image, missing: Additions) -> List[dict]:
    """Each entry of the update that would block the image: its hash, or a certificate
    its signature chains to (edk2's IsForbiddenByDbx: any signature, any chain member)."""
    hits = []
    entry = missing.hashes.get(image.sha256)
    if entry is not None:
        hits.append({"type": "sha256", "entry": image.sha256, "owner": entry.owner})
    for signature in image.signatures:
        # A signer not found (identified by key identifier): any certificate it carries.
        leaves = [signature.signer] if signature.signer else signature.certs
        for cert in missing.certs:
            if any(payloads.chain_to(leaf, signature.certs, cert) for leaf in leaves):
                hits.append(
                    {
                        "type": "x509",
                        "entry": efi.short_name(cert),
                        "sha256": efi.fingerprint(cert),
                        "signature": signature.index,
                    }
                )
    return hits


def check_image(data: bytes, path: str, origin: str, missing: Additions) -> dict:
    result = {"path": path, "origin": origin, "sha256": None, "signers": [], "hits": []}
    try:
        image = pe.parse(data, path)
    except Error as exc:
        result.update({"verdict": "unreadable", "reason": str(exc)})
        return result
    result["sha256"] = image.sha256
    result["signers"] = [efi.short_name(s.signer) for s in image.signatures if s.signer]
    result["hits"] = judge(image, missing)
    result["verdict"] = "revoked" if result["hits"] else "ok"
    if result["hits"]:
        result["update_first"] = package_of(path)
    return result


def walk_esp(top: str, label: str, missing: Additions, results: List[dict]) -> int:
    """Every regular file under top, by descriptors (no symlink followed below top); the
    PE images judged into results; the number of other files.  top itself is opened
    (a symlink the admin named followed, an idle automount mounted) and walked from its
    descriptor: fwalk on the name yields nothing when the lstat before its open differs
    from the directory opened."""
    try:
        topfd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            raise Error(
                f"{top}: no such directory (an ESP, or a copy of one, for --esp)"
            ) from None
        raise Error(f"cannot read the ESP {top}: {exc.strerror}") from None
    try:
        return walk_fd(topfd, top, label, missing, results)
    finally:
        os.close(topfd)


def walk_fd(topfd: int, top: str, label: str, missing: Additions, results: List[dict]) -> int:
    others = 0
    count = 0
    try:
        walker = os.fwalk(".", dir_fd=topfd, follow_symlinks=False, onerror=raise_error)
        for dirpath, _dirs, files, dirfd in walker:
            for name in sorted(files):
                count += 1
                if count > MAX_ESP_FILES:
                    raise Error(f"{top}: more than {MAX_ESP_FILES} files: not an ESP")
                shown = os.path.join(label, os.path.relpath(dirpath, "."), name).replace(
                    "/./", "/"
                )
                data = read_at(dirfd, name, shown)
                if data is None:
                    others += 1
                elif isinstance(data, str):
                    results.append(
                        {
                            "path": shown,
                            "origin": "esp",
                            "verdict": "unreadable",
                            "reason": data,
                            "sha256": None,
                            "signers": [],
                            "hits": [],
                        }
                    )
                else:
                    results.append(check_image(data, shown, "esp", missing))
    except OSError as exc:
        raise Error(f"cannot read the ESP {top}: {exc.strerror}") from None
    return others


def raise_error(exc: OSError) -> None:
    raise exc


def read_at(dirfd: int, name: str, shown: str):
    """A PE file's bytes; None for what is no PE image (or no regular file); the
    reason when it cannot be read."""
    try:
        fd = os.open(
            name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dirfd
        )
    except OSError as exc:
        if exc.errno == 40:  # ELOOP: a symbolic link, which the firmware does not follow
            return None
        return f"cannot open: {exc.strerror}"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        if os.pread(fd, 2, 0) != b"MZ":
            return None
        return pe.read_fd(fd, shown)
    except Error as exc:
        return str(exc)
    except OSError as exc:  # EIO: listed as what could not be judged
        return f"cannot read: {exc.strerror}"
    finally:
        os.close(fd)


def boot_path(
    root: Path, esps: List[str], discover: bool, packages: bool, missing: Additions
) -> dict:
    """Every binary checked, its verdict; the ESPs walked."""
    results: List[dict] = []
    tops = [(top, top) for top in esps]
    if discover:
        tops += [(str(root / m.lstrip("/")), m) for m in mounted_esps(root)]
    if discover and not tops:
        raise Error(
            "no EFI system partition is mounted (none on /boot/efi or /efi, no vfat mount "
            "of the ESP partition type): mount it first, or name it with --esp DIR; "
            "nothing written"
        )
    skipped = 0
    empty = []
    for top, label in tops:
        before = len(results)
        skipped += walk_esp(top, label, missing, results)
        if len(results) == before:
            empty.append(label)
    if packages:
        for path in package_images(root):
            try:
                data = efi.read_bounded(path, efi.MAX_PE, "a boot loader")
            except Error as exc:
                results.append(
                    {
                        "path": str(path),
                        "origin": "package",
                        "verdict": "unreadable",
                        "reason": str(exc),
                        "sha256": None,
                        "signers": [],
                        "hits": [],
                    }
                )
                continue
            results.append(check_image(data, str(path), "package", missing))
    return {
        "esps": [label for _top, label in tops],
        "empty_esps": empty,
        "binaries": results,
        "other_files": skipped,
    }


def refusal(checked: dict, payload_path: str, missing: Additions) -> Optional[str]:
    """Why the write is refused: an ESP without a PE image (not mounted, or the wrong
    directory), entries no image is matched against, a boot-path image that could not be
    judged or that the update revokes; None when nothing stands in the way."""
    parts = [
        f"{label} holds no PE image (not the ESP, or not mounted): nothing was checked there"
        for label in checked.get("empty_esps", [])
    ]
    if missing.other:
        parts.append(
            "the update adds entries this tool cannot match against the boot path: "
            + ", ".join(missing.other[:5])
            + (f" and {len(missing.other) - 5} more" if len(missing.other) > 5 else "")
        )
    for binary in checked["binaries"]:
        if binary["verdict"] == "unreadable":
            reason = binary["reason"].replace(f"{binary['path']}: ", "", 1)
            parts.append(f"{binary['path']} could not be judged ({reason})")
        elif binary["verdict"] == "revoked":
            hit = binary["hits"][0]
            parts.append(
                f"{binary['path']} is revoked by its {hit['type']} entry {hit['entry']}; "
                f"update first: {binary['update_first']}"
            )
    if not parts:
        return None
    return f"{payload_path}: refused, nothing written: " + "; ".join(parts)


# --- the plan --------------------------------------------------------------------------------


def plan(
    variables: Dict[str, efi.Variable],
    objects: payloads.Objects,
    rel: str,
    source: str,
    arch: str,
) -> Tuple[dict, payloads.Payload, Additions]:
    setup = efi.boolean_variable(variables, "SetupMode", source)
    if setup:
        raise Error(
            f"{source}: the firmware is in Setup Mode (no PK enrolled): authenticated appends "
            "are not how keys are enrolled there"
        )
    if "dbx" not in variables:
        raise Error(f"{source}: no dbx variable: nothing to append to")
    payload = read_update(objects, rel)
    total, missing = additions(payload, variables["dbx"])
    result: dict = {
        "source": source,
        "payloads": str(objects.root),
        "arch": arch,
        "payload": payload.path,
        "sha256": payload.sha256,
        "entries": total,
        "missing": missing.count,
        "status": "present" if not missing.count else "planned",
        "signer": None,
        "reason": None,
        "checked": None,
        "backup": None,
        "written": False,
        "error": None,
    }
    if missing.count:
        signer, reason = verify(payload, variables)
        result["signer"], result["reason"] = signer, reason or None
        if signer is None:
            result["status"] = "not-possible"
    return result, payload, missing


def render(result: dict) -> List[str]:
    lines = [f"{result['source']}:"]
    text = {
        "present": "dbx already holds every entry of",
        "planned": "would append to dbx",
        "applied": "appended to dbx",
        "not-possible": "cannot append to dbx",
        "refused": "REFUSED",
    }.get(result["status"], result["status"])
    lines.append(
        f"  {text}: {result['payload']} ({result['entries']} entries, "
        f"{result['missing']} not in dbx; sha256 {result['sha256'][:16]}...)"
    )
    if result["signer"]:
        lines.append(
            f"  signed by {result['signer']['signed_by']} (in {result['signer']['trusted_in']}):"
            " verified"
        )
    if result["reason"]:
        lines.append(f"  {result['reason']}")
    checked = result["checked"]
    if checked:
        lines.append(
            f"  ESPs checked: {', '.join(checked['esps']) or 'none (name a copy with --esp DIR)'}"
        )
        for binary in checked["binaries"]:
            line = f"  {binary['verdict']}: {binary['path']}"
            if binary["sha256"]:
                line += f" (sha256 {binary['sha256'][:16]}...)"
            for hit in binary["hits"]:
                line += f"; revoked by {hit['type']} {hit['entry']}"
            if binary.get("reason"):
                line += f": {binary['reason']}"
            lines.append(line)
    if result["backup"]:
        lines.append(f"  keys as they were saved in: {result['backup']}")
    lines += fix.block_device_note(result)
    return lines


def output(args, result: dict, status: int) -> None:
    if args.json:
        emit_json({"dbx": result, "exit_status": status})
    else:
        print("\n".join(render(result)))


def cmd_fix_dbx(args) -> int:
    """--fix --dbx on this machine's efivarfs, an --efivars dump (--dry-run) or one
    --varstore file."""
    if args.varstore:
        return fix_varstore(args)
    return efivarfs.run_locked(args, fix_dbx)


def fix_dbx(args, directory: Path, root: Path) -> int:
    dump = bool(args.efivars)
    host = not dump or bool(args.root)
    arch = getattr(args, "arch", None) or efivarfs.machine_arch()
    objects = payloads.load_objects(args.payloads, root)
    variables = efi.read_efivars(directory)
    rel = update_path(args.dbx_update, arch)
    result, payload, missing = plan(variables, objects, rel, str(directory), arch)
    if result["status"] == "present":
        output(args, result, 0)
        return 0
    if result["status"] == "not-possible":
        output(args, result, 1)
        return 1
    result["checked"] = boot_path(root, args.esp or [], not dump, host, missing)
    problem = refusal(result["checked"], payload.path, missing)
    if problem:
        result.update({"status": "refused", "error": problem})
        output(args, result, 2)
        raise Error(problem)
    if not dump:
        secrets = efivarfs.measured_boot_secrets(root)
        if secrets and not args.i_have_recovery_keys:
            names = ", ".join(f"{s['device']} ({s['detail']})" for s in secrets)
            message = (
                f"changing dbx changes PCR 7, and these secrets are (or may be) bound to it: "
                f"{names}; have their recovery keys at hand and pass --i-have-recovery-keys"
            )
            if not args.dry_run:
                result.update({"status": "refused", "error": message + ": nothing written"})
                output(args, result, 2)
                raise Error(message + ": nothing written")
            print(f"{PROG}: warning: {message}", file=sys.stderr)
    if args.dry_run:
        output(args, result, 0)
        return 0
    return apply(args, directory, root, result, payload, variables)


def apply(args, directory, root, result, payload, variables) -> int:
    """The append through efivarfs (efivarfs.run_steps: the keys saved first, the
    immutable flag, the read-back), then dbx read again: every entry there."""
    step = {
        "variable": "dbx",
        "payload": payload.path,
        "sha256": payload.sha256,
        "adds": [],
        "name": "dbx update",
        "signed_by": result["signer"]["signed_by"],
        "status": "planned",
        "error": None,
        "warning": None,
        "_payload": payload,
    }
    steps = {"steps": [step]}
    status = efivarfs.run_steps(directory, steps, variables, root)
    result["backup"] = steps.get("backup")
    if status == 0:
        now = efi.read_efivars(directory).get("dbx")
        _total, left = additions(payload, now)
        if left.count:
            status = 2
            step["status"], step["error"] = "not-accepted", (
                f"dbx still lacks {left.count} of its entries after the write"
            )
    result["written"] = step["status"] in ("applied", "not-accepted", "damaged")
    result["status"] = "applied" if status == 0 else step["status"]
    result["error"] = step["error"]
    output(args, result, status)
    if step.get("warning"):
        print(f"{PROG}: warning: {payload.path}: {step['warning']}", file=sys.stderr)
    if status:
        raise Error(
            f"{payload.path}: {step['status']}: {step['error']}; the keys as they were are "
            f"in {result['backup']}"
        )
    return 0


# --- an NVRAM file ---------------------------------------------------------------------------


def new_entries(appended: bytes, held: bytes) -> bytes:
    """The signature lists of appended without the entries held already: what edk2's
    authenticated append (FilterSignatureList) adds."""
    have = efivarfs.raw_entries(held) or set()
    lists, offset = b"", 0
    while offset < len(appended):
        size, header, each = struct.unpack_from("<III", appended, offset + 16)
        body = offset + 28 + header
        kind = appended[offset : offset + 16]
        fresh = [
            appended[i : i + each]
            for i in range(body, offset + size, each)
            if (kind, appended[i : i + each]) not in have
        ]
        if fresh:
            head = struct.pack("<III", 28 + header + each * len(fresh), header, each)
            lists += kind + head + appended[offset + 28 : body] + b"".join(fresh)
        offset += size
    return lists


@dataclass
class StorePlan:
    """fix.fix_file's plan: the JSON, and the new store (or None)."""

    result: dict
    new_bytes: Optional[Tuple[bytes, memoryview]] = None

    def as_json(self) -> dict:
        return dict(self.result)


def fix_varstore(args) -> int:
    """--varstore FILE --fix --dbx: planned, the boot path (--esp) checked, then the
    update's new entries appended to dbx in the store as edk2 appends them, under the
    lock, with a backup (fix.fix_file)."""
    if len(args.varstore) != 1:
        raise Error("--fix --dbx takes one --varstore FILE (each VM has its own ESP)")
    if args.efivars:
        raise Error("--fix works on one kind of source: --efivars, --varstore or --libvirt")
    root = Path(args.root or "/")
    objects = payloads.load_objects(args.payloads, root)
    arch = getattr(args, "arch", None) or efivarfs.machine_arch()
    rel = update_path(args.dbx_update, arch)
    if not args.esp and not args.dry_run:
        raise Error(
            "--varstore FILE --fix --dbx checks the VM's boot path first: name a copy of its "
            "ESP (or the ESP mounted read-only) with --esp DIR; nothing written"
        )
    seen: dict = {}

    def planner(data: bytes, source: str, _certs) -> StorePlan:
        store = fix.walk_store(data, source)
        variables = efi.parse_varstore(data, source)
        if "PK" not in variables or "KEK" not in variables:
            raise Error(f"{source}: no PK or KEK enrolled: nothing can sign a dbx update")
        result, payload, missing = plan(variables, objects, rel, source, arch)
        if result["status"] != "planned":
            return StorePlan(result)
        if "checked" not in seen:
            seen["checked"] = boot_path(root, args.esp or [], False, bool(args.root), missing)
        result["checked"] = seen["checked"]
        problem = refusal(result["checked"], payload.path, missing)
        if problem:
            result.update({"status": "refused", "error": problem})
            seen["refused"] = result
            raise Error(problem)
        slot = store.current("dbx", efi.IMAGE_SECURITY_GUID)
        if (
            slot is None
            or slot.attributes & efi.ATTR_AUTHENTICATED_DB != efi.ATTR_AUTHENTICATED_DB
        ):
            raise Error(f"{source}: dbx is not an authenticated variable")
        held = bytes(data[slot.data_at : slot.end])
        updates = {("dbx", efi.IMAGE_SECURITY_GUID): held + new_entries(payload.data, held)}
        new = fix.rewrite(store, updates)
        fix.check_rewrite(data, new, store, updates, source)
        return StorePlan(result, (new, memoryview(data)[store.end :]))

    path = Path(args.varstore[0])
    try:
        result = fix.fix_file(path, {}, dry_run=True, root=root, planner=planner)
        if not args.dry_run and result["status"] == "planned":
            result = fix.fix_file(path, {}, dry_run=False, root=root, planner=planner)
            result["status"] = "applied" if result["written"] else result["status"]
    except Error:
        if "refused" in seen:
            output(args, seen["refused"], 2)
        raise
    code = 1 if result["status"] == "not-possible" else 0
    output(args, result, code)
    return code


# --- the weekly check ------------------------------------------------------------------------


def status(
    variables: Dict[str, efi.Variable], payloads_dir: Optional[str], root: Path, arch: str
) -> Optional[dict]:
    """Whether dbx holds every entry of Microsoft's latest dbx update (None when there is
    no dbx, or no copy of Microsoft's objects to compare with)."""
    if "dbx" not in variables:
        return None
    try:
        objects = payloads.load_objects(payloads_dir, root)
        payload = read_update(objects, update_path(None, arch))
        total, missing = additions(payload, variables["dbx"])
    except Error as exc:
        log.debug("dbx: no comparison with Microsoft's latest: %s", exc)
        return None
    return {
        "latest": payload.path,
        "entries": total,
        "missing": missing.count,
        "behind": bool(missing.count),
    }


# --- the published tree ----------------------------------------------------------------------


def verify_tree(root: Path) -> dict:
    """Every dbx update of a tree against Microsoft Corporation KEK CA 2011 and the
    entry list's JSON: what the refresh script and the unit tests check."""
    objects = payloads.load_objects(str(root))
    anchor = payloads.kek_ca_2011(objects)
    problems: List[str] = []
    files = sorted(
        p.relative_to(root / payloads.POST).as_posix()
        for d in DBX_DIRS
        for p in (root / payloads.POST / d).rglob("*.bin")
    )
    for arch in payloads.ARCHES:
        if LATEST.format(arch=payloads.ARCHES[arch]) not in files:
            problems.append(f"{LATEST.format(arch=payloads.ARCHES[arch])}: missing")
    ok = 0
    for rel in files:
        try:
            payload = read_update(objects, rel)
        except Error as exc:
            problems.append(str(exc))
            continue
        verdict = payloads.verify_payload(payload, anchor) if anchor else None
        if verdict is None or not verdict.ok:
            problems.append(f"{rel}: {verdict.reason if verdict else 'no KEK CA 2011'}")
        else:
            ok += 1
    try:
        info = json.loads(efi.read_bounded(root / INFO, 16 << 20, "the dbx list"))
        if not isinstance(info, dict) or not isinstance(info.get("images"), dict):
            raise ValueError("no images")
    except (Error, OSError, ValueError) as exc:
        problems.append(f"{INFO}: {exc}")
    return {
        "fatal": bool(problems),
        "problems": problems,
        "summary": f"{ok} dbx updates verify against Microsoft Corporation KEK CA 2011",
    }
