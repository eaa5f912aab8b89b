"""secureboot-ca-check: Microsoft's signed db/KEK updates, read and verified as edk2 does."""

import hashlib
import json
import struct
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from asn1crypto import cms
from asn1crypto import x509 as asn1_x509
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.serialization import pkcs7
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa

from debadmin.errors import Error
from debadmin.secureboot_ca_check import efi

# Where the package installs Microsoft's objects, as published (same relative paths as
# github.com/microsoft/secureboot_objects); --payloads names another checkout.
DEFAULT_DIR = Path("/usr/share/secureboot-ca-check/secureboot_objects")
POST = "PostSignedObjects"
# Debian architecture -> Microsoft's directory name (the files are the same in each).
ARCHES = {"amd64": "amd64", "i386": "x86", "arm64": "arm64", "armhf": "arm"}
MACHINE_ARCH = {"x86_64": "amd64", "i686": "i386", "i386": "i386", "aarch64": "arm64"}
# What each db update adds (by Microsoft's file name) and the KEK update.
DB_UPDATES = {
    "DBUpdate3P2023.bin": "uefi_ca_2023",
    "DBUpdateOROM2023.bin": "option_rom_uefi_ca_2023",
    "DBUpdate2024.bin": "windows_uefi_ca_2023",
}
KEK_TARGET = "kek_2k_ca_2023"
CERTIFICATE_FILES = {
    "kek_2k_ca_2023": "PreSignedObjects/KEK/Certificates/microsoft corporation kek 2k ca 2023.der",
    "uefi_ca_2023": "PreSignedObjects/DB/Certificates/microsoft uefi ca 2023.der",
    "option_rom_uefi_ca_2023": (
        "PreSignedObjects/DB/Certificates/microsoft option rom uefi ca 2023.der"
    ),
    "windows_uefi_ca_2023": "PreSignedObjects/DB/Certificates/windows uefi ca 2023.der",
}
KEK_CA_2011 = "a1117f516a32cefcba3f2d1ace10a87972fd6bbe8fe0d0b996e09e65d802a503"
FINGERPRINTS = {
    "kek_2k_ca_2023": "3cd3f0309edae228767a976dd40d9f4affc4fbd5218f2e8cc3c9dd97e8ac6f9d",
    "uefi_ca_2023": "f6124e34125bee3fe6d79a574eaa7b91c0e7bd9d929c1a321178efd611dad901",
    "option_rom_uefi_ca_2023": "e5be3e64c6e66a281457ecdece0d6d0787577aad2a3a0144262c10c14ba8d8f1",
    "windows_uefi_ca_2023": "076f1fea90ac29155ebf77c17682f75f1fdd1be196da302dc8461e350a9ae330",
}
CERT_TYPE_PKCS7 = "4aafd29d-68df-49ee-8aa9-347d375665a7"
WIN_CERT_TYPE_EFI_GUID = 0x0EF1
SHA256_OID = bytes.fromhex("608648016503040201")
# mHashInfo's order in edk2's AuthService.c: SHA-256, SHA-384, SHA-512.
DIGEST_OIDS = [
    SHA256_OID,
    bytes.fromhex("608648016503040202"),
    bytes.fromhex("608648016503040203"),
]
SIGNED_DATA_OID = bytes.fromhex("06092a864886f70d010702")
# The attribute word an append through efivarfs carries, and thus the one the firmware
# puts in the signed data: NV|BS|RT|TIME_BASED_AUTHENTICATED_WRITE_ACCESS|APPEND_WRITE.
APPEND_ATTRIBUTES = efi.ATTR_AUTHENTICATED_DB | efi.ATTR_APPEND  # 0x67
VARIABLE_GUIDS = {
    "KEK": efi.GLOBAL_GUID,
    "db": efi.IMAGE_SECURITY_GUID,
    "dbx": efi.IMAGE_SECURITY_GUID,
}
MAX_PAYLOAD = 1 << 20
PK_MISMATCH = (
    "its signer's certificate is not byte for byte PK's first entry (edk2 builds no chain "
    "for a PK-signed write, and tolerates no padding in PK)"
)
MAX_CHAIN = 8
# Microsoft's published files that do not verify as the firmware verifies them, by
# SHA-256, with the reason: the only ones reported as published but not usable (beside
# the objects; kept by build-aux/refresh-secureboot-objects).
KNOWN_BROKEN = "known-broken.json"
HASHES = {
    "sha1": hashes.SHA1,
    "sha256": hashes.SHA256,
    "sha384": hashes.SHA384,
    "sha512": hashes.SHA512,
}


class PayloadError(Error):
    """A signed update (or a certificate) of the objects that is not what Microsoft
    published: unreadable, or failing verification against the key it was published as
    signed with, and not on the known-broken list.  Exit 2 in every mode, nothing
    written: a damaged or replaced file is never a verdict on the machine."""


# --- the file format ----------------------------------------------------------------------


@dataclass
class Payload:
    """One EFI_VARIABLE_AUTHENTICATION_2 payload: what is appended, and its signature."""

    path: str  # under PostSignedObjects/, as Microsoft publishes it
    variable: str  # KEK or db
    blob: bytes  # the whole file, as written after the attribute word
    timestamp: bytes
    p7: bytes
    data: bytes  # the EFI_SIGNATURE_LISTs appended
    adds: List[str] = field(default_factory=list)  # fingerprints of the certificates

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.blob).hexdigest()


def parse_payload(blob: bytes, path: str, variable: str) -> Payload:
    """The parts of an authenticated-variable payload, checked as edk2 checks them."""
    if len(blob) < 40:
        raise Error(f"{path}: truncated ({len(blob)} bytes)")
    length, revision, cert_type = struct.unpack_from("<IHH", blob, 16)
    cert_guid = str(uuid.UUID(bytes_le=blob[24:40]))
    if revision != 0x200 or cert_type != WIN_CERT_TYPE_EFI_GUID or cert_guid != CERT_TYPE_PKCS7:
        raise Error(f"{path}: not a WIN_CERTIFICATE_UEFI_GUID with a PKCS#7 signature")
    if length < 24 or 16 + length > len(blob):
        raise Error(f"{path}: WIN_CERTIFICATE length {length} out of bounds")
    timestamp = blob[:16]
    # EFI_TIME: Pad1, Nanosecond, TimeZone, Daylight and Pad2 must be 0 (edk2).
    if timestamp[7] or timestamp[8:12] != b"\0" * 4 or timestamp[12:16] != b"\0" * 4:
        raise Error(f"{path}: the timestamp's pad, nanosecond or time zone is not zero")
    data = blob[16 + length :]
    payload = Payload(path, variable, blob, timestamp, blob[40 : 16 + length], data)
    try:
        entries = efi.parse_signature_lists(data, path)
    except Error as exc:
        raise Error(f"{path}: the appended signature lists: {exc}") from None
    payload.adds = [efi.fingerprint(e.cert) for e in entries if e.cert is not None]
    return payload


def signed_bytes(payload: Payload, attributes: int) -> bytes:
    """What the signature covers (UEFI 2.x 8.2.2): VariableName (UTF-16LE, no NUL) ||
    VendorGuid || Attributes || TimeStamp || Data."""
    return (
        payload.variable.encode("utf-16-le")
        + uuid.UUID(VARIABLE_GUIDS[payload.variable]).bytes_le
        + struct.pack("<I", attributes)
        + payload.timestamp
        + payload.data
    )


# --- PKCS#7 verification, as edk2's Pkcs7Verify over OpenSSL --------------------------------


@dataclass
class Verdict:
    ok: bool
    reason: str = ""
    chain: List[str] = field(default_factory=list)  # signer first, anchor last (names)
    signer_in_p7: bool = True


MALFORMED = "malformed PKCS#7"


def load_der_cert(der: bytes) -> Optional[x509.Certificate]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # negative serials and friends: still certificates
            return efi.load_certificate(der)
    except Exception:
        return None


def digest_index(p7: bytes) -> Optional[int]:
    """edk2's FindHashAlgorithmIndex (AuthService.c): the index of SHA-256, SHA-384 or
    SHA-512 (mHashInfo) found at offset 13 (a bare SignedData) or 32 (wrapped in a
    ContentInfo) behind a two-byte length (the 0x82 bits set at offset 1 or 20); None,
    which VerifyTimeBasedPayload refuses.  edk2 before edk2-stable202302 looked at offset
    13 for SHA-256 only, before edk2-stable202311 for SHA-256 only (the man page says it)."""
    for index, oid in enumerate(DIGEST_OIDS):
        bare = len(p7) >= 13 + len(oid) and p7[1] & 0x82 == 0x82 and p7[13 : 13 + 9] == oid
        wrapped = len(p7) >= 32 + len(oid) and p7[20] & 0x82 == 0x82 and p7[32 : 32 + 9] == oid
        if bare or wrapped:
            return index
    return None


def signed_data(p7: bytes) -> cms.SignedData:
    """edk2's checks of the CertData, then the SignedData (wrapped or not: WrapPkcs7Data
    takes it as wrapped when the signedData OID follows a two-byte length)."""
    if digest_index(p7) is None:
        raise ValueError("no SHA-256, SHA-384 or SHA-512 digest algorithm where edk2 looks")
    if p7[4 : 4 + len(SIGNED_DATA_OID)] == SIGNED_DATA_OID:
        info = cms.ContentInfo.load(p7, strict=True)
        value = info["content"]
    else:
        value = cms.SignedData.load(p7, strict=True)
    value.native  # noqa: B018  (parse everything now: a malformed part raises here)
    return value


def verify_signature(key, signature: bytes, message: bytes, digest: str) -> bool:
    algorithm = HASHES[digest]()
    try:
        if isinstance(key, rsa.RSAPublicKey):
            key.verify(signature, message, padding.PKCS1v15(), algorithm)
        elif isinstance(key, ec.EllipticCurvePublicKey):
            key.verify(signature, message, ec.ECDSA(algorithm))
        else:
            return False
    except Exception:
        return False
    return True


# The extensions OpenSSL 3 handles (X509_supported_extension): a critical one of any other
# kind fails the chain ("unhandled critical extension"), and edk2 does not set
# X509_V_FLAG_IGNORE_CRITICAL.
SUPPORTED_EXTENSIONS = {
    "2.16.840.1.113730.1.1",  # netscape cert type
    "2.5.29.15",  # key usage
    "2.5.29.17",  # subject alternative name
    "2.5.29.19",  # basic constraints
    "2.5.29.32",  # certificate policies
    "2.5.29.31",  # CRL distribution points
    "2.5.29.37",  # extended key usage
    "1.3.6.1.5.5.7.1.7",  # IP address blocks
    "1.3.6.1.5.5.7.1.8",  # AS identifiers
    "1.3.6.1.5.5.7.48.1.5",  # OCSP no check
    "2.5.29.36",  # policy constraints
    "1.3.6.1.5.5.7.1.14",  # proxy certificate info
    "2.5.29.30",  # name constraints
    "2.5.29.33",  # policy mappings
    "2.5.29.54",  # inhibit any policy
}


def unhandled_critical(cert: x509.Certificate) -> Optional[str]:
    """The first critical extension OpenSSL does not handle (read with asn1crypto: the
    X.509 library refuses certificates with duplicate extensions, which OpenSSL reads)."""
    try:
        tbs = asn1_x509.Certificate.load(efi.der(cert))["tbs_certificate"]
        extensions = tbs["extensions"] or []
        for extension in extensions:
            oid = extension["extn_id"].dotted
            if extension["critical"].native and oid not in SUPPORTED_EXTENSIONS:
                return oid
    except Exception as exc:
        return f"unreadable extensions ({exc.__class__.__name__})"
    return None


def may_issue(cert: x509.Certificate) -> bool:
    """OpenSSL's check of a non-leaf chain member (purpose any, not strict): not a
    basicConstraints CA:FALSE, and a keyUsage, if any, allows certificate signing."""
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
        if not constraints.ca:
            return False
    except x509.ExtensionNotFound:
        pass
    except Exception:
        return False
    try:
        usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
        return usage.key_cert_sign
    except x509.ExtensionNotFound:
        return True
    except Exception:
        return False


def chain_to(
    leaf: x509.Certificate, pool: Sequence[x509.Certificate], trusted: x509.Certificate
) -> Optional[List[x509.Certificate]]:
    """The chain from leaf to trusted (trusted first at each step, partial chains allowed,
    times not checked: X509_V_FLAG_PARTIAL_CHAIN | X509_V_FLAG_NO_CHECK_TIME), or None."""
    anchor = efi.der(trusted)
    chain = [leaf]
    while len(chain) <= MAX_CHAIN:
        current = chain[-1]
        if efi.der(current) == anchor:
            return chain
        if efi.issued_by(current, trusted):
            return chain + [trusted] if may_issue(trusted) else None
        issuer = next(
            (c for c in pool if c not in chain and efi.issued_by(current, c) and may_issue(c)),
            None,
        )
        if issuer is None:
            return None
        chain.append(issuer)
    return None


def verify_p7(p7: bytes, message: bytes, trusted: x509.Certificate) -> Verdict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # negative serial numbers: still read, as OpenSSL does
        return verify_p7_quietly(p7, message, trusted)


def verify_p7_quietly(p7: bytes, message: bytes, trusted: x509.Certificate) -> Verdict:
    """Pkcs7Verify(P7Data, TrustedCert, InData): every signer's signature over the
    detached content verifies, and its certificate, found among the PKCS#7's own, chains
    to trusted (the signer itself or an issuer in its chain)."""
    try:
        sd = signed_data(p7)
        pool = certificate_pool(sd)
    except Exception as exc:
        return Verdict(False, f"{MALFORMED} ({exc.__class__.__name__}: {exc})")
    # Content inside the PKCS#7 is not an error: without PKCS7_NO_DUAL_CONTENT (edk2 does
    # not pass it) OpenSSL digests the data passed in and ignores it.
    signers = list(sd["signer_infos"])
    if not signers:
        return Verdict(False, "no signer in the PKCS#7")
    verdict = Verdict(False, "no signer")
    for info in signers:
        verdict = verify_signer(info, pool, message, trusted)
        if not verdict.ok:
            return verdict
    return verdict


def certificate_pool(sd: cms.SignedData) -> List[x509.Certificate]:
    """The PKCS#7's certificates; ValueError when one cannot be parsed: OpenSSL's
    d2i_PKCS7, which edk2's Pkcs7Verify calls first, then rejects the whole structure
    (so does OpenSSL's own PKCS#7 reader, asked through python3-cryptography)."""
    pool = []
    for choice in sd["certificates"] or []:
        if choice.name == "certificate":
            cert = load_der_cert(choice.chosen.dump())
            if cert is None:
                raise ValueError("a certificate in it cannot be parsed")
            pool.append(cert)
    wrapped = cms.ContentInfo({"content_type": "signed_data", "content": sd}).dump()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pkcs7.load_der_pkcs7_certificates(wrapped)  # ValueError where OpenSSL refuses it
    return pool


def find_signer(info, pool: Sequence[x509.Certificate]) -> Optional[x509.Certificate]:
    issuer = info["sid"].chosen["issuer"].dump()
    serial = info["sid"].chosen["serial_number"].native
    return next(
        (c for c in pool if c.serial_number == serial and c.issuer.public_bytes() == issuer),
        None,
    )


def signature_verifies(info, signer: x509.Certificate, message: bytes) -> Optional[str]:
    """None when the SignerInfo's signature (over its signed attributes, whose message
    digest must be the data's, or over the data itself) verifies; else why not."""
    digest = info["digest_algorithm"]["algorithm"].native
    if digest not in HASHES:
        return f"digest algorithm {digest} not supported"
    attrs = info["signed_attrs"]
    if attrs.native:
        found = [a["values"][0].native for a in attrs if a["type"].native == "message_digest"]
        if not found or found[0] != hashlib.new(digest, message).digest():
            return "the message digest attribute does not match the data"
        signed = b"\x31" + attrs.dump()[1:]
    else:
        signed = message
    if not verify_signature(signer.public_key(), info["signature"].native, signed, digest):
        return "the signature does not verify over the variable data"
    return None


def verify_signer(info, pool, message: bytes, trusted: x509.Certificate) -> Verdict:
    """One SignerInfo: its certificate in the pool, its signature, its chain to trusted."""
    if info["sid"].name != "issuer_and_serial_number":
        return Verdict(False, "signer identified by key identifier (not supported)")
    signer = find_signer(info, pool)
    if signer is None:
        return Verdict(False, "the signer's certificate is not in the PKCS#7", [], False)
    problem = signature_verifies(info, signer, message)
    if problem:
        return Verdict(False, problem)
    chain = chain_to(signer, pool, trusted)
    if chain is None:
        return Verdict(
            False, f"the signer ({efi.short_name(signer)}) does not chain to the trusted key"
        )
    for cert in chain:
        critical = unhandled_critical(cert)
        if critical:
            return Verdict(
                False,
                f"{efi.short_name(cert)} has a critical extension OpenSSL does not handle "
                f"({critical}): edk2's chain check refuses it",
            )
    return Verdict(True, "", [efi.short_name(c) for c in chain])


def verify_payload(payload: Payload, trusted: x509.Certificate) -> Verdict:
    return verify_p7(payload.p7, signed_bytes(payload, APPEND_ATTRIBUTES), trusted)


def first_signer_der(p7: bytes) -> Optional[bytes]:
    """The certificate of the first SignerInfo, from the PKCS#7's own certificates, as
    edk2's Pkcs7GetSigners returns it (PKCS7_get0_signers, then popped from the end: the
    last one popped, its TrustedCert, is the first signer's)."""
    try:
        sd = signed_data(p7)
        signers = list(sd["signer_infos"])
        sid = signers[0]["sid"]
        if sid.name != "issuer_and_serial_number":
            return None
        issuer = sid.chosen["issuer"].dump()
        serial = sid.chosen["serial_number"].native
        for choice in sd["certificates"] or []:
            if choice.name != "certificate":
                continue
            tbs = choice.chosen["tbs_certificate"]
            if tbs["serial_number"].native == serial and tbs["issuer"].dump() == issuer:
                return choice.chosen.dump()
    except Exception:
        return None
    return None


def verify_pk_signed(payload: Payload, pk_entry: Optional[bytes]) -> Verdict:
    """A write authorised by the PK, as edk2 checks it (AuthService.c,
    VerifyTimeBasedPayload, AuthVarTypePk: "no chaining for PK"): the first signer's
    certificate must be byte for byte the SignatureData of PK's first entry (its size is
    SignatureSize - 16: trailing padding fails), then Pkcs7Verify with that certificate
    as the trusted one."""
    if pk_entry is None:
        return Verdict(False, "the PK variable has no first entry to compare with")
    top = first_signer_der(payload.p7)
    if top is None:
        return Verdict(False, "no signer certificate in the PKCS#7", [], False)
    if top != pk_entry:
        return Verdict(False, PK_MISMATCH)
    trusted = load_der_cert(top)
    if trusted is None:
        return Verdict(False, "the PK certificate cannot be read")
    return verify_payload(payload, trusted)


def p7_certificates(payload: Payload) -> List[x509.Certificate]:
    try:
        sd = signed_data(payload.p7)
    except Exception:
        return []
    certs = [
        load_der_cert(c.chosen.dump()) for c in sd["certificates"] or [] if c.name == "certificate"
    ]
    return [c for c in certs if c is not None]


# --- the published tree -----------------------------------------------------------------------


@dataclass
class Objects:
    """A tree of Microsoft's objects (the installed copy, or --payloads DIR)."""

    root: Path
    kek_map: Dict[str, dict]
    known_broken: Dict[str, dict] = field(default_factory=dict)  # by SHA-256

    def read(self, rel: str, variable: str) -> Payload:
        path = self.root / POST / rel
        try:
            blob = efi.read_bounded(path, MAX_PAYLOAD, "a signed update")
        except Error as exc:
            raise PayloadError(str(exc)) from None
        try:
            return parse_payload(blob, rel, variable)
        except Error as exc:  # its message starts with rel
            raise PayloadError(f"{self.root / POST}/{exc}") from None

    def db_update(self, arch: str, name: str) -> Payload:
        return self.read(f"Optional/DB/{ARCHES[arch]}/{name}", "db")

    def kek_update_for(self, pk_sha1: str) -> Optional[str]:
        entry = self.kek_map.get(pk_sha1.lower())
        return f"KEK/{entry['KEKUpdate']}" if entry else None

    def certificate(self, ca: str) -> bytes:
        return efi.read_bounded(self.root / CERTIFICATE_FILES[ca], MAX_PAYLOAD, "a certificate")


def load_objects(directory: Optional[str], system: Path = Path("/")) -> Objects:
    """--payloads DIR, else the copy this package installs (under the --root)."""
    root = Path(directory) if directory else system / str(DEFAULT_DIR).lstrip("/")
    map_path = root / POST / "KEK" / "kek_update_map.json"
    if not (root / POST).is_dir():
        raise Error(
            f"{root}: no {POST} directory (--payloads names the root of a checkout of "
            "microsoft/secureboot_objects)"
        )
    try:
        kek_map = json.loads(efi.read_bounded(map_path, 16 << 20, "the KEK update map"))
    except (OSError, ValueError) as exc:
        raise Error(f"cannot read {map_path}: {exc}") from None
    if not isinstance(kek_map, dict) or not all(
        isinstance(v, dict) and isinstance(v.get("KEKUpdate"), str) for v in kek_map.values()
    ):
        raise Error(f"{map_path}: not a map of PK thumbprints to KEKUpdate files")
    for entry in kek_map.values():
        rel = Path(entry["KEKUpdate"])
        if rel.is_absolute() or ".." in rel.parts:
            raise Error(f"{map_path}: {entry['KEKUpdate']}: not a path under KEK/")
    broken = root / KNOWN_BROKEN
    if not broken.is_file():  # a checkout of Microsoft's: the list this package ships
        broken = system / str(DEFAULT_DIR).lstrip("/") / KNOWN_BROKEN
    known = read_known_broken(broken) if broken.is_file() else {}
    return Objects(root, {k.lower(): v for k, v in kek_map.items()}, known)


def read_known_broken(path: Path) -> Dict[str, dict]:
    """known-broken.json: {"files": [{"path", "sha256", "reason"}...]}, by SHA-256."""
    try:
        document = json.loads(efi.read_bounded(path, 1 << 20, "the known-broken list"))
        entries = document["files"]
        if not all(
            isinstance(e, dict) and all(isinstance(e.get(k), str) for k in KNOWN_BROKEN_KEYS)
            for e in entries
        ):
            raise ValueError("an entry is not {path, sha256, reason}")
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise Error(f"cannot read {path}: {exc}") from None
    return {e["sha256"].lower(): e for e in entries}


KNOWN_BROKEN_KEYS = ("path", "sha256", "reason")


def publisher_verdict(objects: Objects, payload: Payload) -> Tuple[Verdict, str]:
    """(the verdict, who) on a payload against the key Microsoft published it as signed
    with, whatever the machine: a db update against Microsoft's KEK CA 2011 (carried in
    its PKCS#7) or KEK 2K CA 2023 (the shipped certificate), each pinned by fingerprint; a
    KEK update against the PK certificate kek_update_map.json names for it, found by
    SHA-1 among its PKCS#7's certificates."""
    certs = p7_certificates(payload)
    if payload.variable == "db":
        who = "Microsoft's KEK CAs"
        anchors = [c for c in certs if efi.fingerprint(c) == KEK_CA_2011]
        try:
            kek_2023 = load_der_cert(objects.certificate(KEK_TARGET))
        except (Error, OSError):
            kek_2023 = None
        if kek_2023 is not None and efi.fingerprint(kek_2023) == FINGERPRINTS[KEK_TARGET]:
            anchors.append(kek_2023)
        verdict = Verdict(False, "its PKCS#7 does not carry Microsoft Corporation KEK CA 2011")
        for anchor in anchors:
            verdict = verify_payload(payload, anchor)
            if verdict.ok:
                break
        return verdict, who
    who = "the platform key kek_update_map.json names for it"
    sha1 = next(
        (s for s, e in objects.kek_map.items() if f"KEK/{e['KEKUpdate']}" == payload.path), None
    )
    if sha1 is None:
        return Verdict(False, "kek_update_map.json does not name it"), who
    pk = next((c for c in certs if efi.fingerprint(c, "sha1") == sha1), None)
    if pk is None:
        return Verdict(False, f"its PKCS#7 does not carry that certificate (SHA-1 {sha1})"), who
    return verify_payload(payload, pk), who


def check_published(objects: Objects, payload: Payload) -> Optional[dict]:
    """None when the payload verifies against the key it was published as signed with;
    its known-broken entry when it does not and these are the very bytes Microsoft
    published so (published, not usable); PayloadError otherwise (damaged or replaced)."""
    verdict, who = publisher_verdict(objects, payload)
    if verdict.ok:
        return None
    entry = objects.known_broken.get(payload.sha256)
    if entry is not None:
        return entry
    raise PayloadError(
        f"{objects.root / POST / payload.path}: does not verify against {who} "
        f"({verdict.reason}): damaged or replaced, not as Microsoft published it "
        "(refresh it or reinstall the package): nothing written"
    )


def kek_ca_2011(objects: Objects) -> Optional[x509.Certificate]:
    """Microsoft Corporation KEK CA 2011, as the db updates' PKCS#7 carry it."""
    payload = objects.db_update("amd64", "DBUpdate3P2023.bin")
    return next((c for c in p7_certificates(payload) if efi.fingerprint(c) == KEK_CA_2011), None)


def verify_tree(root: Path) -> dict:
    """Every payload of a tree against its signer, every certificate by fingerprint: what
    the refresh script and the unit tests check.  fatal: the tree must not be shipped."""
    problems: List[str] = []
    fatal = False
    objects = load_objects(str(root))
    for ca, rel in CERTIFICATE_FILES.items():
        der = objects.certificate(ca)
        if hashlib.sha256(der).hexdigest() != FINGERPRINTS[ca]:
            problems.append(f"{rel}: not the certificate of {ca}")
            fatal = True
    anchor = kek_ca_2011(objects)
    if anchor is None:
        return {
            "fatal": True,
            "problems": problems + ["no KEK CA 2011 in DBUpdate3P2023.bin"],
            "summary": "",
            "kek": {},
        }
    db_ok = 0
    for arch in ARCHES:
        for name, ca in DB_UPDATES.items():
            payload = objects.db_update(arch, name)
            verdict = verify_payload(payload, anchor)
            if not verdict.ok or FINGERPRINTS[ca] not in payload.adds:
                problems.append(f"{payload.path}: {verdict.reason or 'does not add ' + ca}")
                fatal = True
            else:
                db_ok += 1
    kek = kek_results(objects)
    bad = {path: why for path, why in kek.items() if why}
    problems += [f"{path}: {why}" for path, why in sorted(bad.items())]
    summary = (
        f"{db_ok} db updates verify against Microsoft Corporation KEK CA 2011; "
        f"{len(kek) - len(bad)} of {len(kek)} KEK updates verify against their PK (the one "
        f"kek_update_map.json names, for {len(objects.kek_map)} of them)"
        + (f" ({', '.join(sorted(bad))} do not)" if bad else "")
    )
    return {"fatal": fatal, "problems": problems, "summary": summary, "kek": kek}


def kek_results(objects: Objects) -> Dict[str, str]:
    """For each KEK update (KEK/<OEM>/*.bin): "" when it verifies against its signer, else
    why not.  The signer is the PK the map names, found by SHA-1 among the PKCS#7's
    certificates; for a file the map does not name, the self-signed certificate (else the
    signer's) among them."""
    by_file = {f"KEK/{e['KEKUpdate']}": sha1 for sha1, e in objects.kek_map.items()}
    files = sorted(
        p.relative_to(objects.root / POST).as_posix()
        for p in (objects.root / POST / "KEK").glob("*/*.bin")
    )
    results: Dict[str, str] = {}
    for rel in sorted(set(files) | set(by_file)):
        try:
            payload = objects.read(rel, "KEK")
        except Error as exc:
            results[rel] = str(exc)
            continue
        if FINGERPRINTS[KEK_TARGET] not in payload.adds:
            results[rel] = "does not add the KEK 2K CA 2023"
            continue
        certs = p7_certificates(payload)
        if rel in by_file:
            pk = next((c for c in certs if efi.fingerprint(c, "sha1") == by_file[rel]), None)
            missing = "the PK certificate named in the map is not in its PKCS#7"
        else:
            pk = next((c for c in certs if c.issuer == c.subject), certs[0] if certs else None)
            missing = "not in the map, and its PKCS#7 carries no certificate"
        if pk is None:
            results[rel] = missing
            continue
        verdict = verify_payload(payload, pk)
        results[rel] = "" if verdict.ok else verdict.reason
    return results


def payload_json(payload: Payload) -> dict:
    return {"payload": payload.path, "sha256": payload.sha256}


def pk_thumbprint(pk_certs: Sequence[x509.Certificate]) -> Optional[Tuple[str, x509.Certificate]]:
    if len(pk_certs) != 1:
        return None
    return efi.fingerprint(pk_certs[0], "sha1"), pk_certs[0]
