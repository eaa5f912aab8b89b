"""secureboot-ca-check: does this machine need the 2026 Secure Boot CA updates?"""

import argparse
import datetime
import logging
import re
import time
import unicodedata
import warnings
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import apt_pkg
from cryptography import x509
from cryptography.utils import CryptographyDeprecationWarning
from cryptography.x509.oid import NameOID

from debadmin import cli, debver, fsutil
from debadmin.errors import EXIT_ACTION, EXIT_NOT_APPLICABLE, EXIT_OK, Error, NotApplicable
from debadmin.output import emit_json
from debadmin.tools import secureboot_ca_check_efi as efi

PROG = "secureboot-ca-check"
log = logging.getLogger("debadmin")

EFIVARS = "sys/firmware/efi/efivars"
DPKG_STATUS = "var/lib/dpkg/status"
FWUPD_MINIMUM = "2.0.20"
TEXTFILE_NAME = "secureboot_ca_check.prom"
# Where shim-signed puts the signed shim, and where grub-install copies it to the ESP.
SHIM_CANDIDATES = ("boot/efi/EFI/debian/shim{arch}.efi", "usr/lib/shim/shim{arch}.efi.signed")
SHIM_ARCHES = ("x64", "aa64", "ia32")

# Microsoft's Secure Boot CAs, by SHA-256 fingerprint (shared/reference/secureboot.md).
KNOWN_CAS: Dict[str, Tuple[str, str, str]] = {
    # fingerprint: (id, subject CN, variable it belongs in)
    "a1117f516a32cefcba3f2d1ace10a87972fd6bbe8fe0d0b996e09e65d802a503": (
        "kek_ca_2011",
        "Microsoft Corporation KEK CA 2011",
        "KEK",
    ),
    "3cd3f0309edae228767a976dd40d9f4affc4fbd5218f2e8cc3c9dd97e8ac6f9d": (
        "kek_2k_ca_2023",
        "Microsoft Corporation KEK 2K CA 2023",
        "KEK",
    ),
    "48e99b991f57fc52f76149599bff0a58c47154229b9f8d603ac40d3500248507": (
        "uefi_ca_2011",
        "Microsoft Corporation UEFI CA 2011",
        "db",
    ),
    "f6124e34125bee3fe6d79a574eaa7b91c0e7bd9d929c1a321178efd611dad901": (
        "uefi_ca_2023",
        "Microsoft UEFI CA 2023",
        "db",
    ),
    "e5be3e64c6e66a281457ecdece0d6d0787577aad2a3a0144262c10c14ba8d8f1": (
        "option_rom_uefi_ca_2023",
        "Microsoft Option ROM UEFI CA 2023",
        "db",
    ),
    "e8e95f0733a55e8bad7be0a1413ee23c51fcea64b3c8fa6a786935fddcc71961": (
        "windows_production_pca_2011",
        "Microsoft Windows Production PCA 2011",
        "db",
    ),
    "076f1fea90ac29155ebf77c17682f75f1fdd1be196da302dc8461e350a9ae330": (
        "windows_uefi_ca_2023",
        "Windows UEFI CA 2023",
        "db",
    ),
}
# Certificates whose private keys are public: AMI's "DO NOT TRUST" (PKfail), Debian's
# OVMF snakeoil keys.
TEST_KEY = re.compile(r"do not (trust|ship)|snakeoil", re.I)

PCR7_WARNING = (
    "Changing KEK or db changes the TPM's PCR 7: before the update, suspend BitLocker on any "
    "Windows installation (manage-bde -protectors -disable C:), and after it reseal "
    "TPM-sealed LUKS keys (systemd-cryptenroll --wipe-slot=tpm2 --tpm2-device=auto "
    "--tpm2-pcrs=7 DEVICE) or keep a recovery passphrase at hand."
)


# --- certificates ----------------------------------------------------------------------------


def iso(moment: datetime.datetime) -> str:
    return moment.replace(tzinfo=None).strftime("%Y-%m-%dT%H:%M:%SZ")


def name_key(text: str) -> str:
    """A name reduced to what a reader compares: no case, spacing, punctuation or
    compatibility forms ("Microsoft  Corporation KEK-CA 2011" is "microsoftcorporationkekca2011").
    """
    return "".join(ch for ch in unicodedata.normalize("NFKC", text).casefold() if ch.isalnum())


def lookalike_names(known: Dict[str, Tuple[str, str, str]]) -> set:
    return {name_key(name) for table in (KNOWN_CAS, known) for _id, name, _home in table.values()}


def common_name(name: x509.Name) -> str:
    for oid in (NameOID.COMMON_NAME, NameOID.ORGANIZATION_NAME):
        values = name.get_attributes_for_oid(oid)
        if values:
            return str(values[0].value)
    return name.rfc4514_string()


def describe_cert(
    cert: x509.Certificate,
    now: datetime.datetime,
    known: Dict[str, Tuple[str, str, str]],
    owner: Optional[str] = None,
) -> dict:
    """The JSON form of one certificate, with Microsoft CAs identified by fingerprint."""
    sha256 = efi.fingerprint(cert)
    not_before, not_after = efi.validity(cert)
    ca = known.get(sha256)
    subject = cert.subject.rfc4514_string()
    # A look-alike copies the name of one of Microsoft's CAs.  Other certificates that name
    # Microsoft are genuine often enough (Hyper-V's and Windows OEM devices' platform keys)
    # that flagging them would alarm for nothing.
    copies_name = name_key(common_name(cert.subject)) in lookalike_names(known)
    return {
        "subject": subject,
        "subject_cn": common_name(cert.subject),
        "issuer": cert.issuer.rfc4514_string(),
        "serial": format(cert.serial_number, "x"),
        "not_before": iso(not_before),
        "not_after": iso(not_after),
        "expired": not_after < now,
        "sha256": sha256,
        "sha1": efi.fingerprint(cert, "sha1"),
        "owner": owner,
        "microsoft_ca": ca[0] if ca else None,
        "lookalike": copies_name and ca is None,
        "test_key": bool(
            TEST_KEY.search(subject) or TEST_KEY.search(cert.issuer.rfc4514_string())
        ),
    }


def describe_database(
    variable: Optional[efi.Variable],
    source: str,
    now: datetime.datetime,
    known: Dict[str, Tuple[str, str, str]],
) -> Optional[dict]:
    if variable is None:
        return None
    entries = efi.parse_signature_lists(variable.data, f"{source}: {variable.name}")
    return {
        "attributes": variable.attributes,
        "certificates": [describe_cert(e.cert, now, known, e.owner) for e in entries if e.cert],
        "hashes": [
            {"type": e.kind, "owner": e.owner, "value": e.data.hex()}
            for e in entries
            if e.cert is None
        ],
        "_entries": entries,  # removed before output
    }


# --- shim ------------------------------------------------------------------------------------


def default_shims(root: Path) -> List[Path]:
    found = []
    for pattern in SHIM_CANDIDATES:
        for arch in SHIM_ARCHES:
            path = root / pattern.format(arch=arch)
            if path.is_file():
                found.append(path)
    return found


def revocations(
    certs: Sequence[x509.Certificate], dbx_certs: List[x509.Certificate], dbx_hashes: set
) -> List[str]:
    """Names of the certificates among certs that dbx revokes.

    A dbx certificate revokes itself and whatever it issued (edk2 verifies the signature
    with each dbx certificate as the trust anchor); an x509_sha256/384/512 entry revokes the
    certificate whose to-be-signed part has that hash.
    """
    dbx_fps = {efi.fingerprint(c) for c in dbx_certs}
    revoked: List[str] = []

    def add(name: str) -> None:
        if name not in revoked:
            revoked.append(name)

    for cert in certs:
        if efi.fingerprint(cert) in dbx_fps or any(
            value.startswith(tbs)
            for kind, tbs in efi.tbs_hashes(cert).items()
            for entry_kind, value in dbx_hashes
            if entry_kind == kind
        ):
            add(display_name(cert))
        for revoker in dbx_certs:
            if efi.issued_by(cert, revoker):
                add(display_name(revoker))
    return revoked


def display_name(cert: x509.Certificate) -> str:
    return common_name(cert.subject) or f"sha256:{efi.fingerprint(cert)}"


def check_shim(
    image: efi.PeImage,
    databases: Dict[str, Optional[dict]],
    now: datetime.datetime,
    known: Dict[str, Tuple[str, str, str]],
) -> dict:
    """Whether the firmware's db/dbx accept the image, signature by signature.

    As edk2's DxeImageVerificationHandler and shim-signed's preinst decide: the image is
    refused when dbx holds its Authenticode hash or revokes any signature that covers it
    (a certificate the signature carries, one that issued them, or the db certificate it
    chains to); otherwise it is accepted when a signature covers the image and chains to a
    db certificate (one of its certificates, or their issuer), or when db holds its hash.
    """
    db_entries = (databases.get("db") or {}).get("_entries", [])
    dbx_entries = (databases.get("dbx") or {}).get("_entries", [])
    db_certs = [e.cert for e in db_entries if e.cert]
    db_hashes = {(e.kind, e.data.hex()) for e in db_entries if not e.cert}
    dbx_certs = [e.cert for e in dbx_entries if e.cert]
    dbx_hashes = {(e.kind, e.data.hex()) for e in dbx_entries if not e.cert}
    # edk2 hashes an unsigned image with SHA-256, a signed one with each signature's
    # algorithm.
    algorithms = {"sha256"} | {s.digest_algorithm for s in image.signatures if s.digest_found}
    image_hashes = {(a, image.digests[a]) for a in algorithms}
    hash_revoked = bool(image_hashes & dbx_hashes)
    hash_allowed = bool(image_hashes & db_hashes)
    signatures = []
    for sig in image.signatures:
        anchors: List[x509.Certificate] = []
        for anchor in db_certs:
            if anchor not in anchors and any(
                efi.fingerprint(anchor) == efi.fingerprint(cert) or efi.issued_by(cert, anchor)
                for cert in sig.certs
            ):
                anchors.append(anchor)
        revoked_by = revocations(list(sig.certs) + anchors, dbx_certs, dbx_hashes)
        signatures.append(
            {
                "index": sig.index,
                "certificates": [describe_cert(c, now, known) for c in sig.certs],
                "digest_algorithm": sig.digest_algorithm,
                "digest_matches": sig.digest_found,
                "chains_to_db": [display_name(a) for a in anchors],
                "chains_to_db_sha256": [efi.fingerprint(a) for a in anchors],
                "revoked_by_dbx": revoked_by,
                "accepted": bool(anchors) and not revoked_by and sig.digest_found,
            }
        )
    # A revoked signature that does not cover the image is not checked against dbx by
    # edk2 (its Authenticode verification fails first): it neither accepts nor refuses.
    signature_revoked = any(s["revoked_by_dbx"] and s["digest_matches"] for s in signatures)
    return {
        "path": image.path,
        "authenticode_sha256": image.sha256,
        "hash_in_dbx": hash_revoked,
        "hash_in_db": hash_allowed,
        "signatures": signatures,
        "accepted": not hash_revoked
        and not signature_revoked
        and (hash_allowed or any(s["accepted"] for s in signatures)),
    }


# --- fwupd -----------------------------------------------------------------------------------


def fwupd_status(root: Path = Path("/")) -> dict:
    """fwupd's installed version from ROOT/var/lib/dpkg/status, and whether it is recent."""
    path = root / DPKG_STATUS
    version = None
    try:
        with efi.open_regular(path) as handle:
            for section in apt_pkg.TagFile(handle):
                if section.get("Package") == "fwupd" and section.get("Status", "").endswith(
                    " installed"
                ):
                    version = section.get("Version")
    except FileNotFoundError:
        pass
    except (OSError, SystemError) as exc:
        raise Error(f"cannot read {path}: {exc}") from None
    return {
        "installed": version is not None,
        "version": version,
        "minimum": FWUPD_MINIMUM,
        "recent_enough": version is not None and debver.at_least(version, FWUPD_MINIMUM),
    }


# --- the verdict -----------------------------------------------------------------------------


def presence(databases: Dict[str, Optional[dict]], known) -> Dict[str, dict]:
    """For each Microsoft CA: in which variables it was found (None: variable absent)."""
    table = {}
    for sha256, (ca_id, name, home) in known.items():
        row = {"name": name, "belongs_in": home, "sha256": sha256}
        for var in ("KEK", "db", "dbx", "KEKDefault", "dbDefault"):
            database = databases.get(var)
            row[f"in_{var.lower()}"] = (
                None
                if database is None
                else any(c["sha256"] == sha256 for c in database["certificates"])
            )
        table[ca_id] = row
    return table


def finding(code: str, severity: str, message: str) -> dict:
    return {"code": code, "severity": severity, "message": message}


def assess(report: dict, known) -> None:
    """Add findings, next steps and the verdict to a report."""
    dbs = report["variables"]
    cas = report["microsoft_cas"]
    findings: List[dict] = []
    steps: List[str] = []

    def has(ca_id: str, var: str) -> bool:
        return bool(cas[ca_id][f"in_{var.lower()}"])

    keyed = [c for var in ("KEK", "db") for c in (dbs[var] or {}).get("certificates", [])]
    managed = any(c["microsoft_ca"] or c["lookalike"] for c in keyed)
    report["microsoft_managed"] = managed

    test_keys: Dict[str, List[str]] = {}
    for var in ("PK", "KEK", "db", "dbx", "KEKDefault", "dbDefault"):
        for cert in (dbs[var] or {}).get("certificates", []):
            if cert["lookalike"]:
                severity = "info" if var == "dbx" else "action"
                findings.append(
                    finding(
                        "lookalike",
                        severity,
                        f"{var}: '{cert['subject_cn']}' claims to be Microsoft's but its SHA-256 "
                        f"fingerprint {cert['sha256'][:16]}... is not a known Microsoft CA",
                    )
                )
                if severity == "action":
                    steps.append(
                        f"Find out who enrolled the look-alike '{cert['subject_cn']}' in "
                        f"{var} and remove it (a firmware update or 'restore factory "
                        "keys' from the machine maker)."
                    )
            if cert["test_key"] and var in ("PK", "KEK", "db"):
                test_keys.setdefault(cert["subject_cn"], []).append(var)
    for name, where in test_keys.items():
        findings.append(
            finding(
                "test-key",
                "warning",
                f"{', '.join(where)}: '{name}' is a publicly known test key: whoever has its "
                "private key can change the Secure Boot keys",
            )
        )

    if report["setup_mode"]:
        findings.append(
            finding(
                "setup-mode", "warning", "the firmware is in Setup Mode: anyone can enrol keys"
            )
        )

    kek_missing = managed and not has("kek_2k_ca_2023", "KEK")
    db_missing = managed and not has("uefi_ca_2023", "db")
    if kek_missing:
        findings.append(
            finding(
                "kek-2023-missing",
                "action",
                "KEK lacks Microsoft Corporation KEK 2K CA 2023: no db or dbx update signed "
                "after KEK CA 2011 expires (2026-06-24) can be applied",
            )
        )
    if db_missing:
        findings.append(
            finding(
                "db-uefi-ca-2023-missing",
                "action",
                "db lacks Microsoft UEFI CA 2023: shims and option ROMs signed only by it "
                "will not boot",
            )
        )
    if has("uefi_ca_2023", "dbx") or has("kek_2k_ca_2023", "dbx"):
        findings.append(finding("ca-2023-revoked", "action", "dbx revokes a 2023 Microsoft CA"))
    if (
        managed
        and has("windows_production_pca_2011", "db")
        and not has("windows_uefi_ca_2023", "db")
    ):
        findings.append(
            finding(
                "db-windows-uefi-ca-2023-missing",
                "info",
                "db lacks Windows UEFI CA 2023 (matters only for Windows boot managers)",
            )
        )
    if managed and has("uefi_ca_2011", "db") and not has("option_rom_uefi_ca_2023", "db"):
        findings.append(
            finding(
                "db-option-rom-ca-2023-missing",
                "info",
                "db lacks Microsoft Option ROM UEFI CA 2023 (add-in cards whose firmware is "
                "signed only by it will not initialise)",
            )
        )
    for var in ("KEK", "db"):
        for cert in (dbs[var] or {}).get("certificates", []):
            if cert["microsoft_ca"] and cert["expired"]:
                findings.append(
                    finding(
                        "expired",
                        "info",
                        f"{var}: {cert['subject_cn']} expired on {cert['not_after'][:10]} "
                        "(firmware does not check expiry: this alone breaks nothing)",
                    )
                )
    lacking_defaults = []
    if managed:
        for var, ca_id in (("KEKDefault", "kek_2k_ca_2023"), ("dbDefault", "uefi_ca_2023")):
            if dbs[var] is not None and not has(ca_id, var):
                lacking_defaults.append(f"{var} lacks {known_name(known, ca_id)}")
    if lacking_defaults:
        findings.append(
            finding(
                "defaults-lack-2023",
                "warning",
                "; ".join(lacking_defaults) + ": 'restore factory keys' in the firmware setup "
                "would drop the 2023 certificates again",
            )
        )

    uefi_ca_2011 = [fp for fp, (ca_id, _n, _h) in known.items() if ca_id == "uefi_ca_2011"]
    for shim in report["shims"] if report["secure_boot_active"] else []:
        if not shim["accepted"]:
            why = refusal(shim)
            findings.append(
                finding(
                    "shim-not-accepted",
                    "action" if managed else "warning",
                    f"{shim['path']} would not boot with this firmware: {why}",
                )
            )
        elif (
            managed
            and not shim["hash_in_db"]
            and {
                fp
                for sig in shim["signatures"]
                if sig["accepted"]
                for fp in sig["chains_to_db_sha256"]
            }
            <= set(uefi_ca_2011)
        ):
            findings.append(
                finding(
                    "shim-2011-only",
                    "info",
                    f"{shim['path']} boots only through Microsoft Corporation UEFI CA 2011",
                )
            )

    fwupd = report["fwupd"]
    if kek_missing or db_missing:
        if report["source"]["kind"] == "varstore":
            steps.append(
                "For this virtual machine: update the ovmf package and recreate the "
                "VM's NVRAM from a template that holds the 2023 certificates, or run "
                "fwupd inside the VM."
            )
        if not fwupd["installed"]:
            steps.append(f"Install fwupd {FWUPD_MINIMUM} or later: apt install fwupd")
        elif not fwupd["recent_enough"]:
            steps.append(
                f"Upgrade fwupd ({fwupd['version']}) to {FWUPD_MINIMUM} or later: "
                "apt install fwupd"
            )
        steps.append(
            "Run: fwupdmgr refresh && fwupdmgr get-updates && fwupdmgr update "
            "(devices 'UEFI Key Exchange Key' and 'UEFI Signature Database')."
        )
        if kek_missing:
            steps.append(
                "The KEK update must be signed by the machine maker's platform key: "
                "if LVFS offers none for this machine, install the maker's firmware "
                "(BIOS) update; enrolling by hand (efitools) is the last resort."
            )
        if db_missing and has("kek_ca_2011", "KEK"):
            steps.append(
                "The db update (Microsoft UEFI CA 2023) is signed with KEK CA 2011, "
                "which this machine has: it can be applied now."
            )
        steps.append(PCR7_WARNING)
    if lacking_defaults:
        steps.append(
            "Do not use 'restore factory keys' in the firmware setup until a "
            "firmware update from the maker brings 2023 defaults."
        )
    if any(f["code"] == "shim-not-accepted" and f["severity"] == "action" for f in findings):
        steps.append(
            "Do not reboot into the new shim before db holds a CA it chains to "
            "(Microsoft UEFI CA 2023 or 2011)."
        )
    if any(f["code"] == "test-key" for f in findings):
        steps.append(
            "Ask the machine maker for a firmware update with a real platform key, "
            "or enrol your own PK, KEK and db."
        )

    report["findings"] = findings
    report["next_steps"] = steps
    if not report["secure_boot_active"]:
        report["verdict"], report["exit_status"] = "not-applicable", EXIT_NOT_APPLICABLE
    elif any(f["severity"] == "action" for f in findings):
        report["verdict"], report["exit_status"] = "action-needed", EXIT_ACTION
    else:
        report["verdict"], report["exit_status"] = "ok", EXIT_OK


def refusal(shim: dict) -> str:
    """Why the firmware refuses a shim, in the order edk2 checks."""
    sigs = shim["signatures"]
    revoked = [s for s in sigs if s["revoked_by_dbx"] and s["digest_matches"]]
    if shim["hash_in_dbx"]:
        return "dbx revokes its Authenticode hash"
    if revoked:
        names = ", ".join(n for s in revoked for n in s["revoked_by_dbx"])
        return (
            f"dbx revokes {names}, which signature {revoked[0]['index']} carries or chains "
            "to, and the firmware refuses an image when any of its signatures is revoked"
        )
    if not sigs:
        return "it is not signed and db does not hold its hash"
    if not any(s["digest_matches"] for s in sigs):
        return "no signature covers this image (changed after signing?)"
    return "no signature chains to a certificate in db"


def known_name(known, ca_id: str) -> str:
    return next(name for (i, name, _home) in known.values() if i == ca_id)


def build_report(
    kind: str,
    path: str,
    variables: Dict[str, efi.Variable],
    shims: Sequence[Path],
    root: Path,
    now: datetime.datetime,
    known: Dict[str, Tuple[str, str, str]] = KNOWN_CAS,
) -> dict:
    """The report for one set of firmware variables (efivarfs or a varstore)."""
    databases = {
        name: describe_database(variables.get(name), path, now, known)
        for name in efi.SIGNATURE_DATABASES
    }
    pk = databases["PK"]
    pk_enrolled = bool(pk and pk["certificates"])
    if kind == "varstore":
        # An NVRAM file has no live SecureBoot variable: with a PK the firmware enforces.
        secure_boot, setup_mode = pk_enrolled, not pk_enrolled
    else:
        secure_boot = efi.boolean_variable(variables, "SecureBoot", path)
        setup_mode = efi.boolean_variable(variables, "SetupMode", path)
    images = [efi.read_pe(p) for p in shims]
    for image in images:
        log.debug(
            "%s: Authenticode SHA-256 %s, %d signature(s)",
            printable(image.path),
            image.sha256,
            len(image.signatures),
        )
    report = {
        "source": {"kind": kind, "path": path},
        "secure_boot": secure_boot,
        "setup_mode": setup_mode,
        "secure_boot_active": bool(secure_boot) and not setup_mode,
        # An empty subject still names an enrolled PK: by its fingerprint then.
        "pk_owner": (
            (pk["certificates"][0]["subject_cn"] or f"sha256:{pk['certificates'][0]['sha256']}")
            if pk_enrolled
            else None
        ),
        "variables": {
            name: databases[name] for name in ("PK", "KEK", "db", "dbx", "KEKDefault", "dbDefault")
        },
        "microsoft_cas": presence(databases, known),
        "shims": [check_shim(image, databases, now, known) for image in images],
        "fwupd": fwupd_status(root),
    }
    assess(report, known)
    for database in databases.values():
        if database is not None:
            database.pop("_entries", None)
    return report


# --- output ------------------------------------------------------------------------------------


def printable(text: str) -> str:
    """text with control, format and other non-printable characters escaped.

    Certificate names come from the firmware: a newline or a terminal escape in one must
    not forge lines (a fake verdict) or colours in the text report and the log.
    """
    out = []
    for ch in text:
        if ch.isprintable():
            out.append(ch)
        elif ch in "\n\r\t":
            out.append(repr(ch)[1:-1])
        elif ord(ch) < 0x100:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) < 0x10000:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    return "".join(out)


def cert_line(cert: dict) -> str:
    tags = []
    if cert["microsoft_ca"]:
        tags.append("Microsoft, fingerprint verified")
    if cert["lookalike"]:
        tags.append("LOOK-ALIKE: fingerprint unknown")
    if cert["test_key"]:
        tags.append("TEST KEY")
    when = ("expired " if cert["expired"] else "expires ") + cert["not_after"][:10]
    name = cert["subject_cn"] or f"(empty subject, SHA-256 {cert['sha256'][:16]}...)"
    return f"{name} ({when}{''.join('; ' + t for t in tags)})"


def render_text(report: dict, quiet: bool = False) -> str:
    lines = []
    src = report["source"]
    lines.append(f"== {src['path']} ({src['kind']})")
    if not quiet:

        def state(value):
            return {True: "on", False: "off", None: "unknown"}[value]

        lines.append(
            f"Secure Boot: {state(report['secure_boot'])}, "
            f"Setup Mode: {state(report['setup_mode'])}"
        )
        owner = report["pk_owner"]
        lines.append(f"PK owner: {owner if owner is not None else 'none enrolled'}")
        for name, database in report["variables"].items():
            if database is None:
                lines.append(f"{name}: not present")
                continue
            certs, hashes = database["certificates"], database["hashes"]
            lines.append(f"{name}: {len(certs)} certificate(s), {len(hashes)} hash(es)")
            lines.extend(f"  {cert_line(c)}" for c in certs)
        for shim in report["shims"]:
            lines.append(
                f"shim {shim['path']}: "
                f"{'accepted' if shim['accepted'] else 'NOT accepted'} by this firmware"
                + (" (db holds its hash)" if shim["hash_in_db"] else "")
            )
            for sig in shim["signatures"]:
                chain = " <- ".join(c["subject_cn"] or c["sha256"] for c in sig["certificates"])
                anchors = ", ".join(sig["chains_to_db"]) or "no db certificate"
                revoked = (
                    f", revoked by dbx ({', '.join(sig['revoked_by_dbx'])})"
                    if sig["revoked_by_dbx"]
                    else ""
                )
                covers = "" if sig["digest_matches"] else ", does NOT cover this image"
                lines.append(
                    f"  signature {sig['index']}: {chain}: chains to {anchors}"
                    f"{revoked}{covers}"
                )
        fw = report["fwupd"]
        lines.append(
            "fwupd: "
            + (f"{fw['version']} installed" if fw["installed"] else "not installed")
            + ("" if fw["recent_enough"] else f" (need {fw['minimum']} or later)")
        )
    if report["findings"]:
        lines.append("Findings:")
        lines.extend(f"  {f['severity'].upper()}: {f['message']}" for f in report["findings"])
    if report["next_steps"] and not quiet:
        lines.append("Next steps:")
        lines.extend(f"  {n}. {step}" for n, step in enumerate(report["next_steps"], 1))
    verdict = {
        "ok": "ok, nothing to do",
        "action-needed": "action needed",
        "not-applicable": "not applicable (Secure Boot is not active)",
    }
    lines.append(f"Verdict: {verdict[report['verdict']]}")
    return "\n".join(printable(line) for line in lines) + "\n"


def prom_escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_metrics(reports: List[dict], status: int, now: float) -> str:
    """The node_exporter textfile: each family's HELP, TYPE and samples together."""
    families = [
        (
            "status",
            "Exit status of secureboot-ca-check: 0 ok, 1 action needed, 2 error, "
            "3 not applicable.",
            [("", status)],
        ),
        ("last_run_timestamp_seconds", "When the check last ran.", [("", f"{now:.0f}")]),
    ]
    if reports:
        sources = [f'source="{prom_escape(r["source"]["path"])}"' for r in reports]
        families += [
            (
                "secure_boot_active",
                "Whether Secure Boot enforces.",
                [(src, int(r["secure_boot_active"])) for src, r in zip(sources, reports)],
            ),
            (
                "action_needed",
                "Whether the source needs action.",
                [(src, int(r["verdict"] == "action-needed")) for src, r in zip(sources, reports)],
            ),
            (
                "ca_present",
                "Whether a Microsoft CA is in the variable it belongs in.",
                [
                    (
                        f'{src},ca="{ca_id}",variable="{row["belongs_in"]}"',
                        int(bool(row[f"in_{row['belongs_in'].lower()}"])),
                    )
                    for src, r in zip(sources, reports)
                    for ca_id, row in r["microsoft_cas"].items()
                ],
            ),
        ]
    out = []
    for name, help_text, samples in families:
        metric = f"secureboot_ca_check_{name}"
        out += [f"# HELP {metric} {help_text}", f"# TYPE {metric} gauge"]
        out += [
            f"{metric}{{{labels}}} {value}" if labels else f"{metric} {value}"
            for labels, value in samples
        ]
    return "\n".join(out) + "\n"


def textfile_directory(value: Optional[str]) -> Optional[Path]:
    """The --textfile-dir, checked before anything is read (None: no metric)."""
    if not value:
        return None
    target = Path(value)
    if not target.exists():
        raise Error(f"textfile directory {target} does not exist")
    if not target.is_dir():
        raise Error(f"textfile directory {target} is not a directory")
    return target


def write_metrics(target: Path, reports: List[dict], status: int) -> None:
    fsutil.atomic_write(target / TEXTFILE_NAME, render_metrics(reports, status, time.time()))


# --- command line ------------------------------------------------------------------------------


def collect(args: argparse.Namespace, now: datetime.datetime) -> List[dict]:
    if args.root and not Path(args.root).is_dir():
        # A root the admin named is bad input, not a host without UEFI.
        raise Error(f"{args.root}: no such directory")
    root = Path(args.root or "/")
    reports = []
    explicit_shims = [Path(args.shim)] if args.shim else []
    if args.efivars or not args.varstore:
        directory = Path(args.efivars) if args.efivars else root / EFIVARS
        if args.efivars and not directory.is_dir():
            # A directory the admin named is bad input, not a host without UEFI.
            raise Error(f"{directory}: no such directory")
        if not directory.is_dir():
            raise NotApplicable(
                f"{directory} does not exist: this system did not boot "
                "with UEFI (or efivarfs is not mounted)"
            )
        variables = efi.read_efivars(directory)
        log.debug(
            "%s: read %s", printable(str(directory)), ", ".join(sorted(variables)) or "nothing"
        )
        shims = explicit_shims or default_shims(root)
        log.debug("shims to check: %s", printable(", ".join(map(str, shims))) or "none")
        reports.append(build_report("efivars", str(directory), variables, shims, root, now))
    for path in args.varstore or []:
        variables = efi.read_varstore(Path(path))
        log.debug("%s: read %s", printable(path), ", ".join(sorted(variables)) or "nothing")
        reports.append(build_report("varstore", path, variables, explicit_shims, root, now))
    for report in reports:
        log.debug(
            "%s: %s (%s)",
            printable(report["source"]["path"]),
            report["verdict"],
            ", ".join(f["code"] for f in report["findings"]) or "no findings",
        )
    return reports


def evaluate(args: argparse.Namespace, now: datetime.datetime) -> List[dict]:
    """collect(), with whatever the parsers did not foresee turned into an error.

    Python exits 1 on an uncaught exception, and 1 means "action needed" to the service
    and to scripts: a hostile or unforeseen input must exit 2 with one line instead.
    """
    try:
        with warnings.catch_warnings():
            # cryptography warns about e.g. negative serial numbers each time they are read:
            # hostile input gets a report or one error line, never library warnings.
            warnings.simplefilter("ignore", CryptographyDeprecationWarning)
            return collect(args, now)
    except Error:
        raise
    except Exception as exc:
        log.debug("unexpected failure", exc_info=True)
        raise Error(
            printable(f"cannot evaluate the input ({exc.__class__.__name__}: {exc})")
        ) from None


def combined_status(reports: List[dict]) -> int:
    codes = [r["exit_status"] for r in reports]
    if EXIT_ACTION in codes:
        return EXIT_ACTION
    if EXIT_OK in codes:
        return EXIT_OK
    return EXIT_NOT_APPLICABLE


def cmd_check(args: argparse.Namespace) -> int:
    now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    quiet = getattr(args, "verbosity", 0) == -1
    textfile = textfile_directory(args.textfile_dir)
    try:
        reports = evaluate(args, now)
    except Error as exc:
        if textfile:
            try:
                write_metrics(textfile, [], exc.code)
            except Error as failure:
                # Both on one line: the check's own error is what the admin needs first.
                raise Error(f"{exc}; {failure}") from None
        raise
    status = combined_status(reports)
    if textfile:
        # Before the report: a failure to write the metric then prints one error line only.
        write_metrics(textfile, reports, status)
    if args.json:
        emit_json({"reports": reports, "exit_status": status})
    else:
        print("\n".join(render_text(r, quiet) for r in reports), end="")
    return status


def build_parser() -> argparse.ArgumentParser:
    parser = cli.new_parser(
        PROG,
        "Report whether this machine's Secure Boot keys need the 2023 Microsoft CA updates.",
        epilog="exit status: 0 nothing to do, 1 action needed, 2 error, 3 not applicable",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--efivars",
        metavar="DIR",
        help="read variables from DIR in efivarfs format " "(default: /sys/firmware/efi/efivars)",
    )
    parser.add_argument(
        "--varstore",
        metavar="FILE",
        action="append",
        help="read an OVMF/edk2 NVRAM file instead (repeatable, one report " "per file)",
    )
    parser.add_argument(
        "--shim",
        metavar="FILE",
        help="check this signed shim (default on the host: "
        "/boot/efi/EFI/debian/shimx64.efi and "
        "/usr/lib/shim/shimx64.efi.signed)",
    )
    parser.add_argument(
        "--root",
        metavar="DIR",
        help="look for efivars, shims and the dpkg status under DIR (default: /)",
    )
    parser.add_argument(
        "--textfile-dir",
        metavar="DIR",
        help="also write a node_exporter textfile metric into DIR " "(an empty value means none)",
    )
    # Fixing VM NVRAM files: secureboot_ca_check_fix and secureboot_ca_check_libvirt.
    parser.add_argument(
        "--fix",
        action="store_true",
        help="add the missing 2023 Microsoft CAs to the --varstore files (or, with "
        "--libvirt, to the NVRAM of every shut-off VM); keeps a backup beside each",
    )
    parser.add_argument(
        "--cert",
        metavar="FILE",
        action="append",
        help="with --fix: a 2023 Microsoft CA certificate (DER or PEM) to add; repeatable",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="with --fix: list what would be added"
    )
    parser.add_argument(
        "--libvirt",
        action="store_true",
        help="check the NVRAM of every libvirt domain (/etc/libvirt/qemu/*.xml)",
    )
    parser.set_defaults(func=dispatch)
    return parser


def dispatch(args: argparse.Namespace) -> int:
    """The report, or one of the fixing modes (in their own modules)."""
    if args.libvirt and (args.varstore or args.efivars or args.shim or args.textfile_dir):
        raise Error(
            "--libvirt reads the domains' NVRAM: no --varstore, --efivars, --shim "
            "or --textfile-dir with it"
        )
    if (args.cert or args.dry_run) and not args.fix:
        raise Error("--cert and --dry-run go with --fix")
    if args.fix and not (args.varstore or args.libvirt):
        raise Error("--fix needs --varstore FILE or --libvirt")
    if args.fix and (args.efivars or args.shim or args.textfile_dir):
        raise Error("--fix changes NVRAM files only: no --efivars, --shim or --textfile-dir")
    if not (args.libvirt or args.fix):
        return cmd_check(args)
    # Imported here: secureboot_ca_check_libvirt imports this module.
    from debadmin.tools import secureboot_ca_check_fix, secureboot_ca_check_libvirt

    command = secureboot_ca_check_libvirt.cmd_libvirt if args.libvirt else None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CryptographyDeprecationWarning)
            return (command or secureboot_ca_check_fix.cmd_fix)(args)
    except Error:
        raise
    except Exception as exc:  # one line, never a traceback (the writes are atomic)
        log.debug("unexpected failure", exc_info=True)
        raise Error(printable(f"cannot fix ({exc.__class__.__name__}: {exc})")) from None


def main(argv: Optional[List[str]] = None) -> int:
    return cli.run(PROG, build_parser(), argv)
