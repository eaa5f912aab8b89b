"""Microsoft's shipped Secure Boot objects: every payload verified against its signer."""

import datetime
import hashlib
import re
import shutil
import struct
import subprocess
import uuid
from pathlib import Path

import pytest
from asn1crypto import cms
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import Encoding, pkcs7
from cryptography.x509.oid import NameOID

from debadmin.errors import Error
from debadmin.secureboot_ca_check import efi
from debadmin.secureboot_ca_check import fix
from debadmin.secureboot_ca_check import payloads

SRC = Path(__file__).resolve().parents[2]
OBJECTS = SRC / "data" / "secureboot_objects"
MIRROR = Path("/work/.mirror/microsoft+secureboot_objects/repo")
# The KEK updates that do not verify as edk2 verifies them (OpenSSL's PKCS7_verify, as
# edk2 calls it, agrees on each): ECS's PK1 signs the appended signature lists alone, not
# the authenticated-variable data; Xiaomi's PK certificates carry a critical extension
# OpenSSL does not handle (2.5.29.4, keyUsageRestriction).
NOT_VERIFYING = {
    "KEK/ECS/KEKUpdate_ECS_PK1.bin": "does not verify over the variable data",
    **{
        f"KEK/XiaoMi/KEKUpdate_XiaoMi_PK{n}.bin": "critical extension OpenSSL does not handle"
        for n in range(1, 6)
    },
}
# Five more carry the signed data inside the PKCS#7 as well; OpenSSL digests the data
# passed in (edk2 does not ask for PKCS7_NO_DUAL_CONTENT), so they verify.
DUAL_CONTENT = {
    "KEK/ASRock/KEKUpdate_ASRock_PK1.bin",
    "KEK/ASRock/KEKUpdate_ASRock_PK2.bin",
    "KEK/ASUS/KEKUpdate_ASUS_PK4.bin",
    "KEK/ECS/KEKUpdate_ECS_PK2.bin",
    "KEK/NEC/KEKUpdate_NEC_PK1.bin",
}


@pytest.fixture(scope="module")
def objects():
    return payloads.load_objects(str(OBJECTS))


@pytest.fixture(scope="module")
def kek_2011(objects):
    cert = payloads.kek_ca_2011(objects)
    assert cert is not None and efi.fingerprint(cert) == payloads.KEK_CA_2011
    return cert


@pytest.fixture(scope="module")
def kek_results(objects):
    return payloads.kek_results(objects)


def all_files():
    return sorted(p.relative_to(OBJECTS).as_posix() for p in OBJECTS.rglob("*") if p.is_file())


def test_shipped_tree_has_what_the_tool_uses():
    files = set(all_files())
    for arch in payloads.ARCHES.values():
        for name in payloads.DB_UPDATES:
            assert f"PostSignedObjects/Optional/DB/{arch}/{name}" in files
    assert set(payloads.CERTIFICATE_FILES.values()) <= files
    assert {"README", "License.txt", "PostSignedObjects/KEK/kek_update_map.json"} <= files
    readme = (OBJECTS / "README").read_text()
    assert "github.com/microsoft/secureboot_objects" in readme
    assert re.search(r"commit\s+[0-9a-f]{40}, committed", readme)


@pytest.mark.skipif(not MIRROR.is_dir(), reason="no git copy of microsoft/secureboot_objects")
def test_shipped_bytes_are_as_published():
    """Every file but our README and known-broken.json is byte for byte the blob of the
    commit the README names."""
    readme = (OBJECTS / "README").read_text()
    commit = re.search(r"commit\s+([0-9a-f]{40})", readme).group(1)
    for rel in all_files():
        if rel in ("README", payloads.KNOWN_BROKEN):
            continue
        published = subprocess.run(
            ["git", "--git-dir", str(MIRROR), "cat-file", "blob", f"{commit}:{rel}"],
            check=True,
            stdout=subprocess.PIPE,
        ).stdout
        assert (OBJECTS / rel).read_bytes() == published, rel


def test_certificates_by_fingerprint(objects):
    for ca, fingerprint in payloads.FINGERPRINTS.items():
        assert hashlib.sha256(objects.certificate(ca)).hexdigest() == fingerprint


@pytest.mark.parametrize("arch", sorted(payloads.ARCHES))
@pytest.mark.parametrize("name", sorted(payloads.DB_UPDATES))
def test_every_db_update_verifies_against_kek_ca_2011(objects, kek_2011, arch, name):
    payload = objects.db_update(arch, name)
    assert payload.variable == "db"
    assert payload.adds == [payloads.FINGERPRINTS[payloads.DB_UPDATES[name]]]
    verdict = payloads.verify_payload(payload, kek_2011)
    assert verdict.ok, verdict.reason
    # The signer is Microsoft's KEK signing certificate, which KEK CA 2011 issued: the
    # trusted certificate is an issuer in the chain (a partial chain, as edk2 allows).
    assert verdict.chain[-1] == "Microsoft Corporation KEK CA 2011"
    assert len(verdict.chain) == 2
    # Microsoft signed the append's attribute word (0x67), not the variable's (0x27).
    plain = payloads.signed_bytes(payload, efi.ATTR_AUTHENTICATED_DB)
    assert not payloads.verify_p7(payload.p7, plain, kek_2011).ok


def test_db_updates_are_the_same_for_every_arch(objects):
    for name in payloads.DB_UPDATES:
        blobs = {objects.db_update(arch, name).blob for arch in payloads.ARCHES}
        assert len(blobs) == 1, name


def test_every_kek_update_verifies_or_is_named(kek_results):
    """Every KEK/<OEM>/*.bin against the PK kek_update_map.json names (or, for the files
    the map does not name, the self-signed certificate in its PKCS#7)."""
    files = {
        p.relative_to(OBJECTS / "PostSignedObjects").as_posix()
        for p in (OBJECTS / "PostSignedObjects/KEK").glob("*/*.bin")
    }
    assert set(kek_results) == files and len(files) > 500
    failing = {path for path, why in kek_results.items() if why}
    assert failing == set(NOT_VERIFYING)
    for path, why in NOT_VERIFYING.items():
        assert why in kek_results[path]


def test_every_mapped_kek_update_carries_its_pk(objects):
    for sha1, entry in objects.kek_map.items():
        payload = objects.read(f"KEK/{entry['KEKUpdate']}", "KEK")
        assert payloads.FINGERPRINTS["kek_2k_ca_2023"] in payload.adds
        assert any(
            efi.fingerprint(c, "sha1") == sha1 for c in payloads.p7_certificates(payload)
        ), entry["KEKUpdate"]


def test_embedded_content(objects, kek_results):
    """Those with dual content carry exactly the authenticated-variable data (with 0x67)
    and verify; ECS's PK1 carries and signs the signature lists alone."""
    for path in sorted(DUAL_CONTENT):
        payload = objects.read(path, "KEK")
        content = payloads.signed_data(payload.p7)["encap_content_info"]["content"].native
        assert content == payloads.signed_bytes(payload, payloads.APPEND_ATTRIBUTES)
        assert kek_results[path] == ""
    ecs = objects.read("KEK/ECS/KEKUpdate_ECS_PK1.bin", "KEK")
    assert payloads.signed_data(ecs.p7)["encap_content_info"]["content"].native == ecs.data
    signer = payloads.p7_certificates(ecs)[0]
    assert payloads.verify_p7(ecs.p7, ecs.data, signer).ok


def test_verify_tree_summary(kek_results):
    result = payloads.verify_tree(OBJECTS)
    assert not result["fatal"]
    assert result["summary"].startswith("12 db updates verify")
    bad = len(NOT_VERIFYING)
    assert f"{len(kek_results) - bad} of {len(kek_results)} KEK updates" in result["summary"]


# --- openssl as an independent oracle ----------------------------------------------------------


def openssl_verifies(tmp_path: Path, payload, trusted, attributes=0x67) -> bool:
    p7 = payload.p7
    if p7[4:15] != payloads.SIGNED_DATA_OID:
        p7 = cms.ContentInfo(
            {"content_type": "signed_data", "content": cms.SignedData.load(p7)}
        ).dump()
    (tmp_path / "p7.der").write_bytes(p7)
    (tmp_path / "data").write_bytes(payloads.signed_bytes(payload, attributes))
    (tmp_path / "ca.pem").write_bytes(trusted.public_bytes(Encoding.PEM))
    result = subprocess.run(
        # smime: PKCS7_verify, the call edk2 makes (cms is more lenient).
        [
            "openssl",
            "smime",
            "-verify",
            "-binary",
            "-inform",
            "DER",
            "-in",
            str(tmp_path / "p7.der"),
            "-content",
            str(tmp_path / "data"),
            "-CAfile",
            str(tmp_path / "ca.pem"),
            "-partial_chain",
            "-no_check_time",
            "-purpose",
            "any",
            "-out",
            "/dev/null",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return result.returncode == 0


needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl")


@needs_openssl
def test_openssl_agrees_on_the_db_updates(tmp_path, objects, kek_2011):
    for name in payloads.DB_UPDATES:
        payload = objects.db_update("amd64", name)
        assert openssl_verifies(tmp_path, payload, kek_2011)
        assert not openssl_verifies(tmp_path, payload, kek_2011, attributes=0x27)


@needs_openssl
def test_openssl_agrees_on_kek_updates(tmp_path, objects, kek_results):
    """A sample of the KEK updates (every 20th, the dual-content ones, the failing ones):
    the same answer.  (All 562 agree; the whole run takes 25 s.)"""
    by_file = {f"KEK/{e['KEKUpdate']}": sha1 for sha1, e in objects.kek_map.items()}
    sample = sorted(by_file)[::20] + sorted((set(NOT_VERIFYING) | DUAL_CONTENT) & set(by_file))
    for path in sample:
        payload = objects.read(path, "KEK")
        pk = next(
            c
            for c in payloads.p7_certificates(payload)
            if efi.fingerprint(c, "sha1") == by_file[path]
        )
        ours = not kek_results[path]
        assert openssl_verifies(tmp_path, payload, pk) == ours, path


# --- what the verifier refuses ----------------------------------------------------------------


def test_a_flipped_byte_in_the_data_fails(objects, kek_2011):
    payload = objects.db_update("amd64", "DBUpdate3P2023.bin")
    blob = bytearray(payload.blob)
    blob[-100] ^= 1
    tampered = payloads.parse_payload(bytes(blob), payload.path, "db")
    verdict = payloads.verify_payload(tampered, kek_2011)
    assert not verdict.ok and "does not verify" in verdict.reason


def test_another_trusted_certificate_fails(objects):
    payload = objects.db_update("amd64", "DBUpdate3P2023.bin")
    ami = objects.read("KEK/AMI/KEKUpdate_AMI_PK1.bin", "KEK")
    stranger = payloads.p7_certificates(ami)[0]
    verdict = payloads.verify_payload(payload, stranger)
    assert not verdict.ok and "does not chain" in verdict.reason


def test_the_wrong_variable_name_fails(objects, kek_2011):
    payload = objects.db_update("amd64", "DBUpdate3P2023.bin")
    payload.variable = "KEK"
    assert not payloads.verify_payload(payload, kek_2011).ok


def test_a_content_info_wrapper_is_accepted_as_edk2_does(objects, kek_2011):
    """edk2-stable202302 and later (FindHashAlgorithmIndex: the OID at offset 32 behind a
    ContentInfo, WrapPkcs7Data) accept the wrapped form; a digest OID elsewhere is not."""
    payload = objects.db_update("amd64", "DBUpdate3P2023.bin")
    wrapped = cms.ContentInfo(
        {"content_type": "signed_data", "content": cms.SignedData.load(payload.p7)}
    ).dump()
    message = payloads.signed_bytes(payload, payloads.APPEND_ATTRIBUTES)
    assert wrapped[20] & 0x82 == 0x82 and wrapped[32:41] == payloads.SHA256_OID
    assert payloads.verify_p7(wrapped, message, kek_2011).ok
    moved = wrapped[:32] + b"\x00" + wrapped[33:]
    verdict = payloads.verify_p7(moved, message, kek_2011)
    assert not verdict.ok and "where edk2 looks" in verdict.reason


@pytest.mark.parametrize(
    "mutate,message",
    [
        (lambda b: b[:30], "truncated"),
        (lambda b: b[:18] + b"\x01\x02" + b[20:], "WIN_CERTIFICATE"),
        (lambda b: b[:24] + uuid.uuid4().bytes_le + b[40:], "WIN_CERTIFICATE"),
        (lambda b: b[:16] + b"\xff\xff\xff\x7f" + b[20:], "out of bounds"),
        (lambda b: b[:8] + b"\x01" + b[9:], "time zone"),
    ],
)
def test_malformed_payloads_are_errors(objects, mutate, message):
    blob = objects.db_update("amd64", "DBUpdate3P2023.bin").blob
    with pytest.raises(Error, match=message):
        payloads.parse_payload(mutate(blob), "x.bin", "db")


def test_a_payload_tree_without_post_signed_objects_is_an_error(tmp_path):
    with pytest.raises(Error, match="no PostSignedObjects"):
        payloads.load_objects(str(tmp_path))


def test_a_map_escaping_kek_is_refused(tmp_path):
    kek = tmp_path / "PostSignedObjects" / "KEK"
    kek.mkdir(parents=True)
    (kek / "kek_update_map.json").write_text('{"aa": {"KEKUpdate": "../../etc/passwd"}}')
    with pytest.raises(Error, match="not a path under KEK"):
        payloads.load_objects(str(tmp_path))


# --- payloads made here: PK-signed writes, SHA-384/512 ----------------------------------------


def make_cert(name: str, issuer=None, ca: bool = True):
    """An RSA key and certificate (self-signed, or issued by (key, cert) issuer)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    issuer_key, issuer_cert = issuer if issuer else (key, None)
    now = datetime.datetime(2024, 1, 1)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_cert.subject if issuer_cert else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .sign(issuer_key, hashes.SHA256())
    )
    return key, cert


def make_payload(objects, signer, extra=(), digest=hashes.SHA256, wrapped=False):
    """A KEK append of the KEK 2K CA 2023, signed by signer (key, cert) over the
    authenticated-variable data; the PKCS#7 bare (as Microsoft's) or in a ContentInfo."""
    data = fix.signature_list(objects.certificate(payloads.KEK_TARGET))
    timestamp = struct.pack("<HBBBBB", 2024, 5, 1, 0, 0, 0) + bytes(9)
    shell = payloads.Payload("made.bin", "KEK", b"", timestamp, b"", data)
    message = payloads.signed_bytes(shell, payloads.APPEND_ATTRIBUTES)
    builder = (
        pkcs7.PKCS7SignatureBuilder().set_data(message).add_signer(signer[1], signer[0], digest())
    )
    for cert in extra:
        builder = builder.add_certificate(cert)
    options = [pkcs7.PKCS7Options.DetachedSignature, pkcs7.PKCS7Options.Binary]
    info = builder.sign(Encoding.DER, options + [pkcs7.PKCS7Options.NoAttributes])
    p7 = info if wrapped else cms.ContentInfo.load(info)["content"].untag().dump()
    header = struct.pack("<IHH", 24 + len(p7), 0x200, 0x0EF1)
    header += uuid.UUID(payloads.CERT_TYPE_PKCS7).bytes_le
    return payloads.parse_payload(timestamp + header + p7 + data, "made.bin", "KEK")


def pk_entry(cert, padding=b"") -> bytes:
    from debadmin.secureboot_ca_check import efivarfs

    esl = fix.signature_list(cert.public_bytes(Encoding.DER) + padding)
    return efivarfs.pk_first_entry(efi.Variable("PK", efi.GLOBAL_GUID, 0x27, esl))


@pytest.fixture(scope="module")
def pk_chain():
    root = make_cert("Test PK root")
    leaf = make_cert("Test PK signer", issuer=root, ca=False)
    return root, leaf


def test_a_pk_signed_write_needs_the_pk_itself_as_signer(objects, pk_chain):
    """edk2 (AuthService.c, VerifyTimeBasedPayload, AuthVarTypePk): the first signer's
    certificate byte for byte PK's first entry, no chain: a signer issued by the PK,
    which Pkcs7Verify with the PK as trusted certificate accepts, is refused."""
    root, leaf = pk_chain
    by_leaf = make_payload(objects, leaf, extra=[root[1]])
    assert payloads.verify_payload(by_leaf, root[1]).ok  # the chain: a KEK would accept it
    verdict = payloads.verify_pk_signed(by_leaf, pk_entry(root[1]))
    assert not verdict.ok and verdict.reason == payloads.PK_MISMATCH
    by_root = make_payload(objects, root)
    assert payloads.verify_pk_signed(by_root, pk_entry(root[1])).ok
    padded = payloads.verify_pk_signed(by_root, pk_entry(root[1], b"\0\0"))
    assert not padded.ok and padded.reason == payloads.PK_MISMATCH
    assert not payloads.verify_pk_signed(by_root, None).ok


def test_a_pk_signed_write_with_a_bad_signature_fails(objects, pk_chain):
    root, _leaf = pk_chain
    payload = make_payload(objects, root)
    payload.variable = "db"  # other signed bytes: the signature no longer covers them
    verdict = payloads.verify_pk_signed(payload, pk_entry(root[1]))
    assert not verdict.ok and "does not verify" in verdict.reason


@pytest.mark.parametrize("digest", [hashes.SHA256, hashes.SHA384, hashes.SHA512])
@pytest.mark.parametrize("wrapped", [False, True])
def test_digests_and_forms_edk2_accepts(objects, pk_chain, digest, wrapped):
    root, _leaf = pk_chain
    payload = make_payload(objects, root, digest=digest, wrapped=wrapped)
    assert payloads.digest_index(payload.p7) == [
        hashes.SHA256,
        hashes.SHA384,
        hashes.SHA512,
    ].index(digest)
    assert payloads.verify_pk_signed(payload, pk_entry(root[1])).ok


def test_sha1_is_refused_where_edk2_looks(objects, pk_chain):
    root, _leaf = pk_chain
    try:
        payload = make_payload(objects, root, digest=hashes.SHA1)
    except TypeError:  # trixie's python3-cryptography signs PKCS#7 with SHA-2 only
        pytest.skip("this python3-cryptography cannot make a SHA-1 PKCS#7 signature")
    verdict = payloads.verify_payload(payload, root[1])
    assert not verdict.ok and "where edk2 looks" in verdict.reason


def undecodable_certificate(payload):
    """DBUpdate3P2023.bin with one byte of the KEK CA 2011 copy it carries changed: an
    OID whose last byte keeps the continuation bit (DER no certificate parser takes)."""
    blob = bytearray(payload.blob)
    assert blob[2042] == 0x0E
    blob[2042] = 0xD7
    return payloads.parse_payload(bytes(blob), payload.path, "db")


def test_a_certificate_that_cannot_be_parsed_is_a_malformed_pkcs7(tmp_path, objects, kek_2011):
    """edk2's Pkcs7Verify starts with d2i_PKCS7, which rejects the whole structure when
    one of its certificates is undecodable: so does the verifier (it once skipped the
    certificate and verified through the signer's)."""
    broken = undecodable_certificate(objects.db_update("amd64", "DBUpdate3P2023.bin"))
    verdict = payloads.verify_payload(broken, kek_2011)
    assert not verdict.ok and verdict.reason.startswith("malformed PKCS#7"), verdict.reason
    if shutil.which("openssl"):
        assert not openssl_verifies(tmp_path, broken, kek_2011)


def test_a_db_update_with_a_malformed_pkcs7_stops_the_fix(tmp_path, capsys, objects):
    from test_secureboot_ca_check_efivarfs import ami_variables, run, write_efivars

    copy = tmp_path / "objects"
    shutil.copytree(OBJECTS, copy)
    for arch, folder in payloads.ARCHES.items():
        path = copy / "PostSignedObjects/Optional/DB" / folder / "DBUpdate3P2023.bin"
        path.write_bytes(
            undecodable_certificate(objects.db_update(arch, "DBUpdate3P2023.bin")).blob
        )
    efivars = write_efivars(tmp_path / "ami", ami_variables())
    rc, out, err = run(
        capsys, "--efivars", str(efivars), "--fix", "--dry-run", "--payloads", str(copy)
    )
    assert rc == 2 and out == ""
    assert "DBUpdate3P2023.bin: does not verify" in err and "malformed PKCS#7" in err
    assert len(err.strip().splitlines()) == 1
