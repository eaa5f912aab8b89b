"""secureboot-ca-check's checks: what a set of firmware variables holds, what it needs
and why, as text, JSON and metrics; for this machine, a varstore and a libvirt domain."""

import datetime
import functools
import hashlib
import logging
import re
import time
import unicodedata
import warnings
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import apt_pkg
from cryptography import x509
from cryptography.x509.oid import NameOID

from debadmin import debver, fsutil
from debadmin.errors import EXIT_NOT_APPLICABLE, Error
from debadmin.findings import finding
from debadmin.secureboot_ca_check import dbx, efi, efivarfs, payloads, rules

log = logging.getLogger("debadmin")

EFIVARS = "sys/firmware/efi/efivars"
DPKG_STATUS = "var/lib/dpkg/status"
FWUPD_MINIMUM = "2.0.20"
TEXTFILE_NAME = "secureboot_ca_check.prom"
REPORTED_VARIABLES = ("PK", "KEK", "db", "dbx", "KEKDefault", "dbDefault")
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

# --- certificates ----------------------------------------------------------------------------


def iso(moment: datetime.datetime) -> str:
    return moment.replace(tzinfo=None).strftime("%Y-%m-%dT%H:%M:%SZ")


# Letters of other scripts that look like Latin ones (the Cyrillic and Greek part of
# Unicode's confusables), and digits that look like letters: a name copied with one of
# them is still a copy.  Both sides of a comparison go through the same map.
HOMOGLYPHS = str.maketrans(
    {
        **dict.fromkeys("АаＡ", "a"),
        **dict.fromkeys("ВвЬ", "b"),
        **dict.fromkeys("Сс", "c"),
        **dict.fromkeys("ԁ", "d"),
        **dict.fromkeys("ЕеЁё", "e"),
        **dict.fromkeys("НнҺһ", "h"),
        **dict.fromkeys("ІіЇїıΙι1ӏӀlℓ", "l"),
        **dict.fromkeys("Јј", "j"),
        **dict.fromkeys("Кк", "k"),
        **dict.fromkeys("Мм", "m"),
        **dict.fromkeys("Пп", "n"),
        **dict.fromkeys("Оо0Οοσ", "o"),
        **dict.fromkeys("РрΡρ", "p"),
        **dict.fromkeys("Ԛԛ", "q"),
        **dict.fromkeys("Ѕѕ", "s"),
        **dict.fromkeys("ТтΤτ", "t"),
        **dict.fromkeys("υ", "u"),
        **dict.fromkeys("ν", "v"),
        **dict.fromkeys("Ԝԝ", "w"),
        **dict.fromkeys("ХхΧχ", "x"),
        **dict.fromkeys("УуҮүΥ", "y"),
        **dict.fromkeys("Ζ", "z"),
        **dict.fromkeys("Αα", "a"),
        **dict.fromkeys("Ββ", "b"),
        **dict.fromkeys("Εε", "e"),
        **dict.fromkeys("Ηη", "h"),
        **dict.fromkeys("Κκ", "k"),
        **dict.fromkeys("Μ", "m"),
        **dict.fromkeys("Ν", "n"),
        "i": "l",  # i, l, 1 and I are told apart by nobody reading a certificate name
        # Latin small capitals and IPA letters (after casefold, which leaves them).
        **dict.fromkeys("ᴀɑ", "a"),
        **dict.fromkeys("ʙ", "b"),
        **dict.fromkeys("ᴄ", "c"),
        **dict.fromkeys("ᴅ", "d"),
        **dict.fromkeys("ᴇ", "e"),
        **dict.fromkeys("ꜰ", "f"),
        **dict.fromkeys("ɢɡ", "g"),
        **dict.fromkeys("ʜ", "h"),
        **dict.fromkeys("ɪɩʟ", "l"),
        **dict.fromkeys("ᴊ", "j"),
        **dict.fromkeys("ᴋ", "k"),
        **dict.fromkeys("ᴍ", "m"),
        **dict.fromkeys("ɴ", "n"),
        **dict.fromkeys("ᴏ", "o"),
        **dict.fromkeys("ᴘ", "p"),
        **dict.fromkeys("ʀ", "r"),
        **dict.fromkeys("ꜱ", "s"),
        **dict.fromkeys("ᴛ", "t"),
        **dict.fromkeys("ᴜ", "u"),
        **dict.fromkeys("ᴠ", "v"),
        **dict.fromkeys("ᴡ", "w"),
        **dict.fromkeys("ʏ", "y"),
        **dict.fromkeys("ᴢ", "z"),
        # Armenian, and Cherokee and Lisu capitals (casefold keeps Cherokee capitals).
        **dict.fromkeys("օՕ", "o"),
        **dict.fromkeys("ո", "n"),
        **dict.fromkeys("սՍ", "u"),
        **dict.fromkeys("հ", "h"),
        **dict.fromkeys("ցԳ", "g"),
        **dict.fromkeys("Ꭺꓮ", "a"),
        **dict.fromkeys("Ᏼꓐ", "b"),
        **dict.fromkeys("Ꮯꓚ", "c"),
        **dict.fromkeys("Ꭰꓓ", "d"),
        **dict.fromkeys("Ꭼꓰ", "e"),
        **dict.fromkeys("ꓝ", "f"),
        **dict.fromkeys("Ꮐꓖ", "g"),
        **dict.fromkeys("Ꮋꓧ", "h"),
        **dict.fromkeys("Ꮮꓲꓡ", "l"),
        **dict.fromkeys("Ꭻꓙ", "j"),
        **dict.fromkeys("Ꮶꓗ", "k"),
        **dict.fromkeys("Ꮇꓟ", "m"),
        **dict.fromkeys("ꓠ", "n"),
        **dict.fromkeys("ꓳ", "o"),
        **dict.fromkeys("Ꮲꓑ", "p"),
        **dict.fromkeys("ꓣ", "r"),
        **dict.fromkeys("Ꮪꓢ", "s"),
        **dict.fromkeys("Ꭲꓔ", "t"),
        **dict.fromkeys("ꓴ", "u"),
        **dict.fromkeys("Ꮩꓦ", "v"),
        **dict.fromkeys("Ꮃꓪ", "w"),
        **dict.fromkeys("ꓫ", "x"),
        **dict.fromkeys("ꓬ", "y"),
        **dict.fromkeys("Ꮓꓜ", "z"),
    }
)
# Letter pairs that read as one letter in most fonts ("rn" for "m").
PAIRS = (("rn", "m"), ("vv", "w"))

NOT_ALNUM = re.compile("[^a-z0-9]")


def name_key(text: str) -> str:
    """A name reduced to what a reader compares: no case, spacing, punctuation,
    compatibility forms, accents or look-alike letters of other scripts
    ("Microsoft  Corporation KEK-CA 2011" and "Міcrоsoft Corporation KEK CA 2011" with
    Cyrillic letters are both "mlcrosoftcorporatlonkekca2ol1")."""
    if text.isascii():  # the common case, without a Python loop over every character
        key = NOT_ALNUM.sub("", text.lower().translate(HOMOGLYPHS))
    else:
        decomposed = unicodedata.normalize("NFKD", text)
        # Accents go (NFKD splits them off), then case: capital I folds to i, then to l.
        bare = "".join(ch for ch in decomposed if not unicodedata.combining(ch)).casefold()
        key = "".join(ch for ch in bare.translate(HOMOGLYPHS) if ch.isalnum())
    for pair, letter in PAIRS:
        key = key.replace(pair, letter)
    return key


def lookalike_names(known: Dict[str, Tuple[str, str, str]]) -> frozenset:
    names = tuple(name for table in (KNOWN_CAS, known) for _id, name, _home in table.values())
    return name_keys(names)


@functools.lru_cache(maxsize=8)
def name_keys(names: Tuple[str, ...]) -> frozenset:
    return frozenset(name_key(name) for name in names)


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
    der = efi.der(cert)
    sha256 = hashlib.sha256(der).hexdigest()
    not_before, not_after = efi.validity(cert)
    ca = known.get(sha256)
    # Each property access parses the name again (and repeats the library's warnings).
    subject_name, issuer_name = cert.subject, cert.issuer
    subject, issuer = subject_name.rfc4514_string(), issuer_name.rfc4514_string()
    cn = common_name(subject_name)
    # A look-alike copies the name of one of Microsoft's CAs.  Other certificates that name
    # Microsoft are genuine often enough (Hyper-V's and Windows OEM devices' platform keys)
    # that flagging them would alarm for nothing.
    copies_name = name_key(cn) in lookalike_names(known)
    return {
        "subject": subject,
        "subject_cn": cn,
        "issuer": issuer,
        "serial": format(cert.serial_number, "x"),
        "not_before": iso(not_before),
        "not_after": iso(not_after),
        "expired": not_after < now,
        "sha256": sha256,
        "sha1": hashlib.sha1(der).hexdigest(),
        "owner": owner,
        "microsoft_ca": ca[0] if ca else None,
        "lookalike": copies_name and ca is None,
        "test_key": bool(TEST_KEY.search(subject) or TEST_KEY.search(issuer)),
    }


def describe_database(
    variable: Optional[efi.Variable],
    source: str,
    now: datetime.datetime,
    known: Dict[str, Tuple[str, str, str]],
) -> Optional[dict]:
    """The JSON form of a signature database, from what of it can be read.

    Private keys (removed before output): _entries, the entries firmware can use;
    _unusable, certificates decoded from entries firmware cannot use (PEM text);
    _problems, what could not be read or is odd, in the shape of a finding.
    """
    if variable is None:
        return None
    entries, problems = efi.read_signature_lists(variable.data)
    for problem in problems:
        log.debug("%s: %s: %s", printable(source), variable.name, printable(problem.message))
    usable = [e for e in entries if e.usable]
    return {
        "attributes": variable.attributes,
        "certificates": [describe_cert(e.cert, now, known, e.owner) for e in usable if e.cert],
        "hashes": [
            {"type": e.kind, "owner": e.owner, "value": e.data.hex()}
            for e in usable
            if e.cert is None
        ],
        "_entries": usable,
        "_unusable": [
            describe_cert(e.cert, now, known, e.owner) for e in entries if not e.usable and e.cert
        ],
        "_problems": [
            {"code": p.code, "severity": p.severity, "message": p.message} for p in problems
        ],
        # Nothing walked: no list of it had a sound header.
        "_read_nothing": bool(variable.data)
        and not entries
        and all(p.structural or p.severity == "info" for p in problems),
    }


def check_readable(databases: Dict[str, Optional[dict]], source: str) -> None:
    """Refuse a source whose KEK or db cannot be read at all: no verdict is possible.

    "At all": the signature-list structure of KEK or db is broken before a single list
    (nothing is known of what it holds), or KEK and db together yield no certificate while
    entries of them could not be decoded.  Anything less (one bad entry, every entry of KEK
    undecodable beside a readable db, PEM text, padding, an unreadable PK or dbx) is a
    finding and the verdict comes from the rest: Microsoft's CAs are recognised by their
    fingerprints, and an entry that cannot be decoded is none of them.
    """
    failures = {
        name: [p for p in database["_problems"] if p["severity"] != "info"]
        for name, database in databases.items()
        if name in ("KEK", "db") and database is not None
    }
    for name, database in databases.items():
        if failures.get(name) and database["_read_nothing"]:
            raise Error(printable(f"{source}: {name}: {failures[name][0]['message']}"))
    if any(failures.values()) and not any(databases[name]["certificates"] for name in failures):
        name = next(name for name in failures if failures[name])
        # The message may name a certificate (PEM text): no forged lines on stderr.
        raise Error(
            printable(
                f"{source}: KEK and db hold no certificate that can be read; "
                f"{name}: {failures[name][0]['message']}"
            )
        )


# --- shim ------------------------------------------------------------------------------------


def default_shims(root: Path) -> List[Path]:
    found = []
    for pattern in SHIM_CANDIDATES:
        for arch in SHIM_ARCHES:
            path = root / pattern.format(arch=arch)
            if path.is_file():
                found.append(path)
    return found


class CertIndex:
    """db or dbx certificates, indexed for the shim checks: by fingerprint and by subject
    (so that finding who issued a certificate costs one look-up, not a signature check
    per certificate of a crafted 3,000-certificate db)."""

    def __init__(self, certs: Sequence[x509.Certificate], hashes: set = frozenset()):
        self.certs = list(certs)
        self.order = {id(c): n for n, c in enumerate(self.certs)}
        self.fingerprints = {efi.fingerprint(c): c for c in self.certs}
        self.by_subject: Dict[x509.Name, List[x509.Certificate]] = {}
        for cert in self.certs:
            self.by_subject.setdefault(cert.subject, []).append(cert)
        # dbx's x509_sha256/384/512 entries: the hash of a to-be-signed part, then a time.
        self.tbs: Dict[str, set] = {}
        for kind, value in hashes:
            if kind.startswith("x509_"):
                size = hashlib.new(kind[5:]).digest_size * 2
                self.tbs.setdefault(kind, set()).add(value[:size])

    def issuers(self, cert: x509.Certificate) -> List[x509.Certificate]:
        """The certificates here whose key signed cert."""
        return [c for c in self.by_subject.get(cert.issuer, []) if efi.issued_by(cert, c)]

    def holds(self, cert: x509.Certificate) -> bool:
        """cert itself is here, as a certificate or as the hash of its to-be-signed part."""
        return efi.fingerprint(cert) in self.fingerprints or any(
            tbs in self.tbs.get(kind, ()) for kind, tbs in efi.tbs_hashes(cert).items()
        )


def revocations(
    certs: Sequence[x509.Certificate], dbx_certs: List[x509.Certificate], dbx_hashes: set
) -> List[str]:
    """Names of the certificates among certs that dbx revokes."""
    return revoked_names(certs, CertIndex(dbx_certs, dbx_hashes))


def revoked_names(certs: Sequence[x509.Certificate], dbx: CertIndex) -> List[str]:
    """Names of the certificates among certs that dbx revokes.

    A dbx certificate revokes itself and whatever it issued (edk2 verifies the signature
    with each dbx certificate as the trust anchor); an x509_sha256/384/512 entry revokes the
    certificate whose to-be-signed part has that hash.
    """
    revoked: List[str] = []
    for cert in certs:
        names = [display_name(cert)] if dbx.holds(cert) else []
        names += [display_name(revoker) for revoker in dbx.issuers(cert)]
        revoked += [name for name in names if name not in revoked]
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
    db, dbx, db_hashes, dbx_hashes = signature_indexes(databases)
    # edk2 hashes an unsigned image with SHA-256, a signed one with each signature's
    # algorithm.
    algorithms = {"sha256"} | {s.digest_algorithm for s in image.signatures if s.digest_found}
    image_hashes = {(a, image.digests[a]) for a in algorithms}
    hash_revoked = bool(image_hashes & dbx_hashes)
    hash_allowed = bool(image_hashes & db_hashes)
    signatures = judge_signatures(image, db, dbx, now, known)
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


def signature_indexes(
    databases: Dict[str, Optional[dict]]
) -> Tuple["CertIndex", "CertIndex", set, set]:
    """db's and dbx's certificates indexed, and their hashes as (kind, hex) pairs."""
    db_entries = (databases.get("db") or {}).get("_entries", [])
    dbx_entries = (databases.get("dbx") or {}).get("_entries", [])
    db_hashes = {(e.kind, e.data.hex()) for e in db_entries if not e.cert}
    dbx_hashes = {(e.kind, e.data.hex()) for e in dbx_entries if not e.cert}
    db = CertIndex([e.cert for e in db_entries if e.cert])
    dbx = CertIndex([e.cert for e in dbx_entries if e.cert], dbx_hashes)
    return db, dbx, db_hashes, dbx_hashes


def judge_signatures(
    image: efi.PeImage,
    db: CertIndex,
    dbx: CertIndex,
    now: datetime.datetime,
    known: Dict[str, Tuple[str, str, str]],
) -> List[dict]:
    """judge_signature() for each of the image's signatures.

    A crafted image repeats one signature thousands of times: parse_pe gives repeats
    the same certificate list, and each distinct one is judged once."""
    signatures = []
    judged: Dict[tuple, dict] = {}
    for sig in image.signatures:
        key = (id(sig.certs), sig.digest_algorithm)
        if key not in judged:
            judged[key] = judge_signature(sig, db, dbx, now, known)
        signatures.append({"index": sig.index, **judged[key]})
    return signatures


def judge_signature(
    sig: efi.Signature,
    db: CertIndex,
    dbx: CertIndex,
    now: datetime.datetime,
    known: Dict[str, Tuple[str, str, str]],
) -> dict:
    """One signature's part of check_shim(): what it chains to in db, what dbx revokes."""
    found = {}
    for cert in sig.certs:
        same = db.fingerprints.get(efi.fingerprint(cert))
        for anchor in ([same] if same is not None else []) + db.issuers(cert):
            found[id(anchor)] = anchor
    anchors = sorted(found.values(), key=lambda a: db.order[id(a)])  # in db's order
    revoked_by = revoked_names(list(sig.certs) + anchors, dbx)
    return {
        "certificates": [describe_cert(c, now, known) for c in sig.certs],
        "digest_algorithm": sig.digest_algorithm,
        "digest_matches": sig.digest_found,
        "chains_to_db": [display_name(a) for a in anchors],
        "chains_to_db_sha256": [efi.fingerprint(a) for a in anchors],
        "revoked_by_dbx": revoked_by,
        "accepted": bool(anchors) and not revoked_by and sig.digest_found,
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


# --- the offline fix ---------------------------------------------------------------------------


def offline_fix(
    kind: str,
    path: str,
    variables: Dict[str, efi.Variable],
    root: Path,
    payloads_dir: Optional[str],
    arch_option: Optional[str] = None,
) -> dict:
    """Whether --fix can add what is missing without the network, from Microsoft's objects
    as this package ships them (or --payloads DIR): for firmware, the verified plan (the
    db updates its KEK signs, the KEK update its PK signs); for a varstore, the four
    certificates."""
    result = {
        "available": False,
        "steps": [],
        "kek_update_published": None,
        "kek_update": None,
        "error": None,
        "arch": None,
        "arch_from": None,
    }
    try:
        if kind == "varstore":
            from debadmin.secureboot_ca_check import fix

            certs = fix.shipped_certs(root, payloads_dir)
            held = {
                var: {
                    efi.fingerprint(e.cert)
                    for e in efi.read_signature_lists(variables[var].data)[0]
                    if e.cert is not None
                }
                for var in ("KEK", "db")
                if var in variables
            }
            missing = [t[0] for t in fix.TARGETS if t[3] not in held.get(t[2], set())]
            result["steps"] = [
                {"variable": fix.TARGETS_BY_ID[ca][2], "adds": [ca]}
                for ca in missing
                if ca in certs
            ]
            result["available"] = bool(result["steps"]) and len(held) == 2
            return result
        objects = payloads.load_objects(payloads_dir, root)
        arch, result["arch_from"] = efivarfs.choose_arch(Path(path), arch_option, True)
        result["arch"] = arch
        plan = efivarfs.plan(variables, objects, arch, path)
    except payloads.PayloadError:
        raise  # a damaged payload is no verdict on the machine: exit 2
    except Error as exc:
        result["error"] = str(exc)
        return result
    result["steps"] = [
        {
            "variable": s["variable"],
            "adds": s["adds"],
            "payload": s["payload"],
            "sha256": s["sha256"],
        }
        for s in plan["steps"]
    ]
    result["available"] = bool(plan["steps"])
    result["kek_update_published"] = plan["kek_update"]["published"]
    result["kek_update"] = plan["kek_update"]["payload"]
    return result


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


def build_report(
    kind: str,
    path: str,
    variables: Dict[str, efi.Variable],
    shims: Sequence[Path],
    root: Path,
    now: datetime.datetime,
    known: Dict[str, Tuple[str, str, str]] = KNOWN_CAS,
    host: bool = True,
    payloads_dir: Optional[str] = None,
    arch: Optional[str] = None,
) -> dict:
    """The report for one set of firmware variables (efivarfs or a varstore).

    host: the source is this machine's own firmware (efivarfs under the root), so facts
    of the root (fwupd) belong in it; a varstore or a dump gets none of them.

    The X.509 library warns (a country name of three letters, a negative serial number)
    each time such a certificate's fields are read: the warnings of the entries became
    findings when they were read, the rest go to the debug log, never to stderr.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = gather(kind, path, variables, shims, root, now, known, host)
        report["offline_fix"] = offline_fix(kind, path, variables, root, payloads_dir, arch)
        rules.assess(report, known)
        dbx_finding(report, variables, root, payloads_dir)
    for message in dict.fromkeys(str(w.message) for w in caught):
        log.debug("%s: warning from a library: %s", printable(path), printable(message))
    for database in report["variables"].values():
        for key in [k for k in database or () if k.startswith("_")]:
            del database[key]
    del report["_facts"]
    return report


def dbx_finding(report: dict, variables, root: Path, payloads_dir: Optional[str]) -> None:
    """dbx against Microsoft's latest dbx update: report["dbx"], and a warning (the exit
    status stays: a dbx update is applied with care, --fix --dbx) when dbx lacks some of
    its entries."""
    state = dbx.status(variables, payloads_dir, root, efivarfs.machine_arch())
    report["dbx_update"] = state
    if state and state["behind"] and report["secure_boot_active"]:
        report["findings"].append(
            finding(
                "dbx-behind",
                "warning",
                f"dbx lacks {state['missing']} of the {state['entries']} entries of Microsoft's "
                f"latest dbx update ({state['latest']}): secureboot-ca-check --fix --dbx "
                "--dry-run shows what it would revoke on this machine",
                "dbx",
            )
        )


def blank_report(kind: str, path: str, reason: str) -> dict:
    """The report on a blank NVRAM file (efi.BlankStore): not applicable, in the shape of
    every report, its one finding saying why."""
    databases: Dict[str, Optional[dict]] = {name: None for name in REPORTED_VARIABLES}
    message = reason[len(path) + 2 :] if reason.startswith(f"{path}: ") else reason
    return {
        "source": {"kind": kind, "path": path},
        "secure_boot": None,
        "setup_mode": None,
        "secure_boot_active": False,
        "pk_owner": None,
        "variables": databases,
        "microsoft_cas": presence(databases, KNOWN_CAS),
        "shims": [],
        "fwupd": None,
        "offline_fix": None,
        "dbx_update": None,
        "microsoft_managed": False,
        "findings": [finding("blank-nvram", "info", message, path)],
        "next_steps": [],
        "verdict": "not-applicable",
        "exit_status": EXIT_NOT_APPLICABLE,
    }


def firmware_state(
    kind: str, variables: Dict[str, efi.Variable], path: str
) -> Tuple[Optional[bool], Optional[bool], Union[int, str, None]]:
    """(SecureBoot, SetupMode, SecureBootEnable's first byte, "empty" or None) of a source.

    An NVRAM file has no live SecureBoot variable: it is decided as edk2's AuthVariableLib
    decides at boot.  User mode when a PK variable exists (whether or not it holds a
    usable certificate); Secure Boot then enforces unless SecureBootEnable (switched in
    the firmware setup) exists and is not 1.
    """
    if kind != "varstore":
        return (
            efi.boolean_variable(variables, "SecureBoot", path),
            efi.boolean_variable(variables, "SetupMode", path),
            None,
        )
    pk = variables.get("PK")
    user_mode = pk is not None and bool(pk.data)
    enable = variables.get("SecureBootEnable")
    # edk2 reads the first byte, whatever the size; of an empty one the byte after it,
    # which is never 1 in a store (0xff erased, 0xaa a header).
    value = (enable.data[0] if enable.data else "empty") if enable is not None else None
    return user_mode and value in (None, 1), not user_mode, value


def pk_owner(pk: Optional[dict]) -> Optional[str]:
    """The first PK certificate's name (one only decoded from PEM text if need be); an
    empty subject still names an enrolled PK: by its fingerprint then."""
    certs = (pk["certificates"] + pk["_unusable"]) if pk else []
    if not certs:
        return None
    return certs[0]["subject_cn"] or f"sha256:{certs[0]['sha256']}"


def gather(
    kind: str,
    path: str,
    variables: Dict[str, efi.Variable],
    shims: Sequence[Path],
    root: Path,
    now: datetime.datetime,
    known: Dict[str, Tuple[str, str, str]],
    host: bool = True,
) -> dict:
    """What the rules judge: the report's facts, and private ones under _facts."""
    databases = {
        name: describe_database(variables.get(name), path, now, known)
        for name in efi.SIGNATURE_DATABASES
    }
    check_readable(databases, path)
    secure_boot, setup_mode, secure_boot_enable = firmware_state(kind, variables, path)
    images = [efi.read_pe(p) for p in shims]
    for image in images:
        log.debug(
            "%s: Authenticode SHA-256 %s, %d signature(s)",
            printable(image.path),
            image.sha256,
            len(image.signatures),
        )
    shown = REPORTED_VARIABLES
    return {
        "source": {"kind": kind, "path": path},
        "secure_boot": secure_boot,
        "setup_mode": setup_mode,
        "secure_boot_active": bool(secure_boot) and not setup_mode,
        "pk_owner": pk_owner(databases["PK"]),
        "variables": {name: databases[name] for name in shown},
        "microsoft_cas": presence(databases, known),
        "shims": [check_shim(image, databases, now, known) for image in images],
        "fwupd": fwupd_status(root) if host and kind == "efivars" else None,
        "_facts": {
            "secure_boot_enable": secure_boot_enable,
            "problems": {name: databases[name]["_problems"] for name in shown if databases[name]},
            "pk_unusable": bool(databases["PK"])
            and bool(variables["PK"].data)
            and not databases["PK"]["certificates"],
        },
    }


# --- output ------------------------------------------------------------------------------------


def printable(text: str) -> str:
    """text with control, format and other non-printable characters escaped.

    Certificate names come from the firmware: a newline or a terminal escape in one must
    not forge lines (a fake verdict) or colours in the text report and the log.
    """
    if text.isprintable():
        return text  # the common case, without a Python loop over every character
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


VERDICTS = {
    "ok": "ok, nothing to do",
    "action-needed": "action needed",
    "not-applicable": "not applicable (Secure Boot is not active)",
}


def render_text(report: dict, quiet: bool = False) -> str:
    """The text report of one source; with quiet, only its findings and verdict, and
    nothing at all for a source the check does not apply to (exit status 3)."""
    if quiet and report["verdict"] == "not-applicable":
        return ""
    src = report["source"]
    blank = [f for f in report["findings"] if f["code"] == "blank-nvram"]
    if blank:
        return (
            printable(f"== {src['path']} ({src['kind']}): not applicable: {blank[0]['message']}")
            + "\n"
        )
    lines = [f"== {src['path']} ({src['kind']})"]
    if not quiet:
        lines += state_lines(report)
        lines += [line for shim in report["shims"] for line in shim_lines(shim)]
        lines += fwupd_lines(report["fwupd"])
        lines += offline_lines(report)
    if report["findings"]:
        lines.append("Findings:")
        lines.extend(f"  {f['severity'].upper()}: {f['message']}" for f in report["findings"])
    if report["next_steps"] and not quiet:
        lines.append("Next steps:")
        lines.extend(f"  {n}. {step}" for n, step in enumerate(report["next_steps"], 1))
    lines.append(f"Verdict: {VERDICTS[report['verdict']]}")
    return "\n".join(printable(line) for line in lines) + "\n"


def state_lines(report: dict) -> List[str]:
    """Secure Boot's state, the PK's owner and what each signature database holds."""

    def state(value):
        return {True: "on", False: "off", None: "unknown"}[value]

    owner = report["pk_owner"]
    lines = [
        f"Secure Boot: {state(report['secure_boot'])}, "
        f"Setup Mode: {state(report['setup_mode'])}",
        f"PK owner: {owner if owner is not None else 'none enrolled'}",
    ]
    for name, database in report["variables"].items():
        if database is None:
            lines.append(f"{name}: not present")
            continue
        certs, hashes = database["certificates"], database["hashes"]
        lines.append(f"{name}: {len(certs)} certificate(s), {len(hashes)} hash(es)")
        lines.extend(f"  {cert_line(c)}" for c in certs)
    return lines


def shim_lines(shim: dict) -> List[str]:
    """Whether the firmware accepts a shim, and what each of its signatures chains to."""
    lines = [
        f"shim {shim['path']}: "
        f"{'accepted' if shim['accepted'] else 'NOT accepted'} by this firmware"
        + (" (db holds its hash)" if shim["hash_in_db"] else "")
    ]
    for sig in shim["signatures"]:
        chain = " <- ".join(c["subject_cn"] or c["sha256"] for c in sig["certificates"])
        anchors = ", ".join(sig["chains_to_db"]) or "no db certificate"
        revoked = (
            f", revoked by dbx ({', '.join(sig['revoked_by_dbx'])})"
            if sig["revoked_by_dbx"]
            else ""
        )
        covers = "" if sig["digest_matches"] else ", does NOT cover this image"
        lines.append(f"  signature {sig['index']}: {chain}: chains to {anchors}{revoked}{covers}")
    return lines


def fwupd_lines(fw: Optional[dict]) -> List[str]:
    if fw is None:
        return []
    return [
        "fwupd: "
        + (f"{fw['version']} installed" if fw["installed"] else "not installed")
        + ("" if fw["recent_enough"] else f" (need {fw['minimum']} or later)")
    ]


def offline_lines(report: dict) -> List[str]:
    offline = report.get("offline_fix")
    if not offline:
        return []
    lines = []
    if report["source"]["kind"] == "efivars" and offline["error"] is None:
        if offline["kek_update_published"]:
            lines.append(
                f"KEK update for this PK: published by Microsoft ({offline['kek_update']}); "
                "fwupd can apply it too"
            )
        else:
            lines.append(
                "KEK update for this PK: none published (neither --fix nor fwupd can add the "
                "KEK 2K CA 2023)"
            )
    if offline["available"]:
        adds = ", ".join(ca for step in offline["steps"] for ca in step["adds"])
        lines.append(f"Offline fix (--fix, no network): available, adds {adds}")
        if offline.get("arch"):
            lines.append(
                f"  with the {offline['arch']} updates "
                f"(Optional/DB/{payloads.ARCHES[offline['arch']]}/; "
                f"architecture: {offline['arch_from']})"
            )
    elif offline["error"]:
        lines.append(f"Offline fix: not planned ({offline['error']})")
    return lines


def prom_escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def metric_families(reports: List[dict]) -> List[tuple]:
    """The per-source gauges: (name, help, [(labels, value)]), in both the
    secureboot_ca_check_NAME textfile of --textfile-dir and, as
    debadmin_secureboot_ca_check_NAME, the debadmin(7) one."""
    sources = [{"source": r["source"]["path"]} for r in reports]
    return [
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
            "offline_fix_available",
            "Whether --fix can add missing 2023 CAs offline, from Microsoft's signed "
            "updates or certificates shipped with the package.",
            [
                (src, int(bool((r.get("offline_fix") or {}).get("available"))))
                for src, r in zip(sources, reports)
            ],
        ),
        (
            "kek_update_published",
            "Whether Microsoft publishes a KEK update signed by the source's PK.",
            [
                (src, int(r["offline_fix"]["kek_update_published"]))
                for src, r in zip(sources, reports)
                if (r.get("offline_fix") or {}).get("kek_update_published") is not None
            ],
        ),
        (
            "dbx_behind",
            "Whether dbx lacks entries of Microsoft's latest dbx update.",
            [
                (src, int(r["dbx_update"]["behind"]))
                for src, r in zip(sources, reports)
                if r.get("dbx_update")
            ],
        ),
        (
            "ca_present",
            "Whether a Microsoft CA is in the variable it belongs in.",
            [
                (
                    {**src, "ca": ca_id, "variable": row["belongs_in"]},
                    int(bool(row[f"in_{row['belongs_in'].lower()}"])),
                )
                for src, r in zip(sources, reports)
                for ca_id, row in r["microsoft_cas"].items()
            ],
        ),
    ]


def render_metrics(reports: List[dict], status: int, now: float) -> str:
    """The --textfile-dir textfile (the names before debadmin(7)'s scheme, kept for
    one more release): each family's HELP, TYPE and samples together."""
    families = [
        (
            "status",
            "Exit status of secureboot-ca-check: 0 ok, 1 action needed, 2 error, "
            "3 not applicable.",
            [({}, status)],
        ),
        ("last_run_timestamp_seconds", "When the check last ran.", [({}, f"{now:.0f}")]),
    ]
    if reports:
        families += metric_families(reports)
    out = []
    for name, help_text, samples in families:
        metric = f"secureboot_ca_check_{name}"
        out += [f"# HELP {metric} {help_text}", f"# TYPE {metric} gauge"]
        for labels, value in samples:
            text = ",".join(f'{key}="{prom_escape(val)}"' for key, val in labels.items())
            out.append(f"{metric}{{{text}}} {value}" if text else f"{metric} {value}")
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
