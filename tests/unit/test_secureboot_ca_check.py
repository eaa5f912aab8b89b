"""Unit tests for secureboot-ca-check: parsers on real and generated inputs, verdicts, fuzz."""

import base64
import datetime
import gzip
import hashlib
import json
import logging
import os
import signal
import random
import re
import struct
import uuid
import warnings
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs7
from cryptography.x509.oid import NameOID

from debadmin.errors import Error
from debadmin.secureboot_ca_check import main as sbc
from debadmin.secureboot_ca_check import checks
from debadmin.secureboot_ca_check import efi

DATA = Path(__file__).resolve().parents[1] / "data" / "secureboot-ca-check"
REAL = DATA / "real"
# Microsoft's objects: the source tree's copy, else (a copy of the tests run against the
# installed package) the package's.
PAYLOADS = Path(__file__).resolve().parents[2] / "data" / "secureboot_objects"
if not PAYLOADS.is_dir():
    PAYLOADS = Path("/usr/share/secureboot-ca-check/secureboot_objects")
OVMF = Path("/usr/share/OVMF")
SHIM = Path("/usr/lib/shim/shimx64.efi.signed")
needs_ovmf = pytest.mark.skipif(
    not (OVMF / "OVMF_VARS_4M.ms.fd").is_file(), reason="ovmf is not installed"
)
needs_shim = pytest.mark.skipif(not SHIM.is_file(), reason="shim-signed is not installed")
SHA256_TYPE = "c1c41626-504c-4092-aca9-41f936934328"
SHA1_TYPE = "826ca512-cf10-4ac9-b187-be01496631bd"
X509_SHA256_TYPE = "3bd2a492-96c0-4079-b420-fcf98ef103ed"
UEFI_CA_2011 = "48e99b991f57fc52f76149599bff0a58c47154229b9f8d603ac40d3500248507"
NOW = datetime.datetime(2026, 11, 21, 12, 0, 0)


# --- builders ------------------------------------------------------------------------------


def guid(text: str) -> bytes:
    return uuid.UUID(text).bytes_le


def esl(sig_type: str, payloads, owner: str = efi.MICROSOFT_OWNER) -> bytes:
    size = 16 + len(payloads[0])
    body = b"".join(guid(owner) + p for p in payloads)
    return guid(sig_type) + struct.pack("<III", 28 + len(body), 0, size) + body


def cert_esl(*certs: x509.Certificate, owner: str = efi.MICROSOFT_OWNER) -> bytes:
    return b"".join(
        esl(efi.CERT_X509, [c.public_bytes(serialization.Encoding.DER)], owner) for c in certs
    )


def make_cert(
    cn: str,
    org: str = "Example",
    days: int = 3650,
    expired: bool = False,
    issuer=None,
    issuer_key=None,
):
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, cn),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, org),
        ]
    )
    start = NOW - datetime.timedelta(days=days + 10 if expired else 10)
    end = NOW - datetime.timedelta(days=5) if expired else NOW + datetime.timedelta(days=days)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer.subject if issuer else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .sign(issuer_key or key, hashes.SHA256())
    )
    return cert, key


def real_cert(name: str) -> x509.Certificate:
    return x509.load_der_x509_certificate((REAL / name).read_bytes())


def write_efivars(directory: Path, variables: dict, attributes: dict = None) -> Path:
    """An efivarfs-format directory: NAME-GUID files, a u32 attribute word, then the data."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in variables.items():
        attrs = (attributes or {}).get(name)
        if attrs is None:
            attrs = (
                0x27
                if name in efi.AUTHENTICATED
                else (0x06 if name.endswith("Default") or name == "SetupMode" else 0x06)
            )
        (directory / f"{name}-{efi.VARIABLES[name]}").write_bytes(struct.pack("<I", attrs) + data)
    return directory


def ms_variables(**extra) -> dict:
    """The real PK/KEK/db/dbx of Debian's OVMF_VARS_4M.ms.fd, Secure Boot on."""
    variables = {
        name: (REAL / f"ovmf-ms-{name}.esl").read_bytes() for name in ("PK", "KEK", "db", "dbx")
    }
    variables.update(SecureBoot=b"\x01", SetupMode=b"\x00")
    variables.update(extra)
    return variables


def make_varstore(variables, states=None, size=0x84000) -> bytes:
    """An edk2 NVRAM image like OVMF's 4M one: FV header, auth store header, variables."""
    header_length = 72
    fv = bytearray(b"\xff" * size)
    header = struct.pack(
        "<16s16sQ4sIHHHBB",
        b"\0" * 16,
        guid(efi.FV_NV_GUIDS[0]),
        size,
        b"_FVH",
        0x4FEFF,
        header_length,
        0,
        0,
        0,
        2,
    )
    header += struct.pack("<II", size // 0x1000, 0x1000) + struct.pack("<II", 0, 0)
    checksum = (-sum(struct.unpack(f"<{len(header) // 2}H", header))) & 0xFFFF
    header = header[:50] + struct.pack("<H", checksum) + header[52:]
    fv[:header_length] = header
    store_size = 0x3FFB8
    fv[header_length : header_length + 28] = struct.pack(
        "<16sIBBHI", guid(efi.AUTH_VARIABLE_GUID), store_size, 0x5A, 0xFE, 0, 0
    )
    offset = header_length + 28
    for name, data, *extra in variables:  # extra: [state[, attributes]]
        vendor = efi.VARIABLES.get(name, efi.GLOBAL_GUID)
        raw_name = (name + "\0").encode("utf-16-le")
        attrs = extra[1] if len(extra) > 1 else 0x27 if name in efi.AUTHENTICATED else 0x07
        state = extra[0] if extra else (states or {}).get(name, efi.VAR_ADDED)
        var = (
            struct.pack(
                "<HBBIQ16sIII16s",
                0x55AA,
                state,
                0,
                attrs,
                0,
                b"\0" * 16,
                0,
                len(raw_name),
                len(data),
                guid(vendor),
            )
            + raw_name
            + data
        )
        fv[offset : offset + len(var)] = var
        offset = (offset + len(var) + 3) & ~3
    return bytes(fv)


def run(capsys, *argv):
    rc = sbc.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def run_json(capsys, *argv):
    rc, out, err = run(capsys, "--json", *argv)
    return rc, json.loads(out)


# --- signature lists -------------------------------------------------------------------------


def test_real_ovmf_lists_identify_microsoft_by_fingerprint():
    kek = efi.parse_signature_lists((REAL / "ovmf-ms-KEK.esl").read_bytes(), "KEK")
    db = efi.parse_signature_lists((REAL / "ovmf-ms-db.esl").read_bytes(), "db")
    dbx = efi.parse_signature_lists((REAL / "ovmf-ms-dbx.esl").read_bytes(), "dbx")
    ids = [checks.KNOWN_CAS.get(efi.fingerprint(e.cert), ("-",))[0] for e in kek + db]
    assert ids == ["-", "kek_ca_2011", "windows_production_pca_2011", "uefi_ca_2011"]
    assert [e.owner for e in db] == [efi.MICROSOFT_OWNER] * 2
    assert [(e.kind, len(e.data)) for e in dbx] == [("sha256", 32)]


def test_real_shim_ca_certificates_match_the_reference_table():
    for name, ca_id in (
        ("microsoft-uefi-ca-2011.der", "uefi_ca_2011"),
        ("microsoft-uefi-ca-2023.der", "uefi_ca_2023"),
    ):
        assert checks.KNOWN_CAS[efi.fingerprint(real_cert(name))][0] == ca_id


@pytest.mark.parametrize(
    "mutate,message",
    [
        (lambda d: d[:20], "truncated header"),
        (lambda d: d[:-1], "runs past the end"),
        (lambda d: d[:16] + struct.pack("<I", len(d) + 100) + d[20:], "runs past the end"),
        (
            lambda d: guid("01234567-89ab-cdef-0123-456789abcdef") + d[16:],
            "unknown signature type",
        ),
        (lambda d: d[:20] + struct.pack("<I", 4) + d[24:], "header size 4"),
        (lambda d: d[:24] + struct.pack("<I", 16) + d[28:], "signature size 16"),
        (lambda d: d[:16] + struct.pack("<I", 28) + d[20:28], "not a whole number"),
        (lambda d: d[:44] + b"\x31" + d[45:], "not a DER X.509 certificate"),
        (lambda d: d + b"\0" * 10, "truncated header"),
    ],
)
def test_malformed_signature_lists(mutate, message):
    data = (REAL / "ovmf-ms-db.esl").read_bytes()
    with pytest.raises(Error, match=message):
        efi.parse_signature_lists(mutate(data), "db")


def test_sha256_list_with_wrong_entry_size():
    data = esl(SHA256_TYPE, [b"\0" * 20])
    with pytest.raises(Error, match="signature size 36 is wrong for sha256"):
        efi.parse_signature_lists(data, "dbx")


def test_zero_padded_certificate_is_accepted_garbage_is_not():
    der = real_cert("microsoft-uefi-ca-2023.der").public_bytes(serialization.Encoding.DER)
    entries = efi.parse_signature_lists(esl(efi.CERT_X509, [der + b"\0" * 16]), "db")
    assert checks.KNOWN_CAS[efi.fingerprint(entries[0].cert)][0] == "uefi_ca_2023"
    with pytest.raises(Error, match="entry 1 is not a DER X.509 certificate"):
        efi.parse_signature_lists(esl(efi.CERT_X509, [der + b"\0junk"]), "db")
    with pytest.raises(Error, match="entry 1 is not a DER X.509 certificate"):
        efi.parse_signature_lists(esl(efi.CERT_X509, [der[:-1]]), "db")


def test_empty_variable_has_no_entries():
    assert efi.parse_signature_lists(b"", "dbx") == []


# --- efivarfs ----------------------------------------------------------------------------------


def test_real_ms_keys_need_action(tmp_path, capsys):
    efivars = write_efivars(tmp_path / "efivars", ms_variables())
    rc, doc = run_json(capsys, "--efivars", str(efivars), "--root", str(tmp_path))
    assert rc == doc["exit_status"] == 1
    report = doc["reports"][0]
    assert report["verdict"] == "action-needed"
    assert report["secure_boot_active"] and report["pk_owner"].startswith("Debian UEFI")
    codes = {f["code"]: f["severity"] for f in report["findings"]}
    assert codes["kek-2023-missing"] == "action"
    assert codes["db-uefi-ca-2023-missing"] == "action"
    assert codes["expired"] == "info"
    cas = report["microsoft_cas"]
    assert cas["kek_ca_2011"]["in_kek"] and cas["uefi_ca_2011"]["in_db"]
    assert cas["kek_2k_ca_2023"]["in_kek"] is False and cas["uefi_ca_2023"]["in_db"] is False
    assert cas["kek_2k_ca_2023"]["in_kekdefault"] is None  # variable absent
    kek = report["variables"]["KEK"]["certificates"]
    assert kek[1]["microsoft_ca"] == "kek_ca_2011" and kek[1]["expired"]
    assert kek[1]["not_after"] == "2026-06-24T20:51:29Z"
    assert any("PCR 7" in step for step in report["next_steps"])
    assert any("fwupd" in step for step in report["next_steps"])


def test_db_with_uefi_ca_2023_leaves_only_the_kek(tmp_path, capsys):
    db = (REAL / "ovmf-ms-db.esl").read_bytes() + cert_esl(real_cert("microsoft-uefi-ca-2023.der"))
    efivars = write_efivars(tmp_path / "efivars", ms_variables(db=db))
    rc, doc = run_json(capsys, "--efivars", str(efivars), "--root", str(tmp_path))
    codes = {f["code"] for f in doc["reports"][0]["findings"]}
    assert rc == 1
    assert "kek-2023-missing" in codes and "db-uefi-ca-2023-missing" not in codes


def test_all_2023_present_is_ok(tmp_path):
    """The verdict logic with a KEK stand-in: no Debian package ships the real KEK 2023."""
    stand_in, _ = make_cert("Stand-in KEK 2023", org="Test")
    known = {fp: v for fp, v in checks.KNOWN_CAS.items() if v[0] != "kek_2k_ca_2023"}
    known[efi.fingerprint(stand_in)] = ("kek_2k_ca_2023", "Stand-in KEK 2023", "KEK")
    kek = (REAL / "ovmf-ms-KEK.esl").read_bytes() + cert_esl(stand_in)
    db = (REAL / "ovmf-ms-db.esl").read_bytes() + cert_esl(real_cert("microsoft-uefi-ca-2023.der"))
    efivars = write_efivars(tmp_path / "efivars", ms_variables(KEK=kek, db=db))
    report = checks.build_report(
        "efivars", str(efivars), efi.read_efivars(efivars), [], tmp_path, NOW, known
    )
    assert report["verdict"] == "ok" and report["exit_status"] == 0
    assert not [f for f in report["findings"] if f["severity"] == "action"]
    # Factory defaults without the 2023 certificates: a warning, not an action.
    efivars2 = write_efivars(
        tmp_path / "efivars2",
        ms_variables(
            KEK=kek,
            db=db,
            KEKDefault=(REAL / "ovmf-ms-KEK.esl").read_bytes(),
            dbDefault=(REAL / "ovmf-ms-db.esl").read_bytes(),
        ),
    )
    report = checks.build_report(
        "efivars", str(efivars2), efi.read_efivars(efivars2), [], tmp_path, NOW, known
    )
    assert report["exit_status"] == 0
    warning = [f for f in report["findings"] if f["code"] == "defaults-lack-2023"]
    assert warning and "KEKDefault" in warning[0]["message"]
    assert "dbDefault" in warning[0]["message"]
    assert any("restore factory keys" in s for s in report["next_steps"])


def test_lookalike_is_flagged(tmp_path, capsys):
    fake, _ = make_cert("Microsoft Corporation KEK 2K CA 2023", org="Microsoft Corporation")
    kek = (REAL / "ovmf-ms-KEK.esl").read_bytes() + cert_esl(fake)
    efivars = write_efivars(tmp_path / "efivars", ms_variables(KEK=kek))
    rc, doc = run_json(capsys, "--efivars", str(efivars), "--root", str(tmp_path))
    report = doc["reports"][0]
    certs = report["variables"]["KEK"]["certificates"]
    assert certs[-1]["lookalike"] and certs[-1]["microsoft_ca"] is None
    assert report["microsoft_cas"]["kek_2k_ca_2023"]["in_kek"] is False
    codes = {f["code"]: f["severity"] for f in report["findings"]}
    assert rc == 1 and codes["lookalike"] == "action" and "kek-2023-missing" in codes
    rc, out, _ = run(capsys, "--efivars", str(efivars), "--root", str(tmp_path))
    assert "LOOK-ALIKE" in out


def test_test_key_pk_and_expired_cert(tmp_path, capsys):
    ami, _ = make_cert("DO NOT TRUST - AMI Test PK", org="AMI")
    old, _ = make_cert("Old own db key", expired=True)
    efivars = write_efivars(
        tmp_path / "efivars",
        {
            "SecureBoot": b"\x01",
            "SetupMode": b"\x00",
            "PK": cert_esl(ami, owner=efi.GLOBAL_GUID),
            "KEK": cert_esl(ami),
            "db": cert_esl(old),
            "dbx": b"",
        },
    )
    rc, doc = run_json(capsys, "--efivars", str(efivars), "--root", str(tmp_path))
    report = doc["reports"][0]
    # Only the owner's keys: nothing to do about the Microsoft CAs, but warned.
    assert rc == 0 and report["microsoft_managed"] is False
    assert report["pk_owner"] == "DO NOT TRUST - AMI Test PK"
    warnings = [f for f in report["findings"] if f["code"] == "test-key"]
    assert warnings and warnings[0]["message"].startswith("PK, KEK:")
    db = report["variables"]["db"]["certificates"][0]
    assert db["expired"] and not db["test_key"]


def test_secure_boot_off_is_not_applicable_but_reported(tmp_path, capsys):
    efivars = write_efivars(tmp_path / "efivars", ms_variables(SecureBoot=b"\x00"))
    rc, out, err = run(capsys, "--efivars", str(efivars), "--root", str(tmp_path))
    assert rc == 3 and err == ""
    assert "Microsoft Corporation KEK CA 2011" in out and "Verdict: not applicable" in out


def test_setup_mode_is_not_active(tmp_path, capsys):
    efivars = write_efivars(tmp_path / "efivars", ms_variables(SetupMode=b"\x01"))
    rc, doc = run_json(capsys, "--efivars", str(efivars), "--root", str(tmp_path))
    assert rc == 3 and any(f["code"] == "setup-mode" for f in doc["reports"][0]["findings"])


def test_no_uefi(tmp_path, capsys):
    rc, out, err = run(capsys, "--root", str(tmp_path))
    assert rc == 3 and out == ""
    assert err.count("\n") == 1 and "did not boot with UEFI" in err


@pytest.mark.parametrize(
    "name,attrs,data,message",
    [
        ("db", 0xDEADBEEF, b"", "undefined attribute bits"),
        ("db", 0x07, b"", "lack non-volatile, runtime or time-based"),
        ("KEK", 0x3F, b"", "not those of a Secure Boot variable"),
        ("SecureBoot", 0x06, b"\x01\x00", "expected one byte"),
        ("SecureBoot", 0x06, b"\x07", "expected one byte"),
        ("SetupMode", 0x01, b"\x00", "lack boot-service access"),
    ],
)
def test_malformed_efivars(tmp_path, capsys, name, attrs, data, message):
    variables = ms_variables()
    variables[name] = data
    efivars = write_efivars(tmp_path / "efivars", variables, {name: attrs})
    rc, out, err = run(capsys, "--efivars", str(efivars), "--root", str(tmp_path))
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


def test_oversized_efivars_file(tmp_path, capsys):
    efivars = write_efivars(tmp_path / "efivars", ms_variables())
    (efivars / f"dbx-{efi.IMAGE_SECURITY_GUID}").write_bytes(b"\x27\0\0\0" + b"\0" * (2 << 20))
    rc, out, err = run(capsys, "--efivars", str(efivars), "--root", str(tmp_path))
    assert rc == 2 and out == "" and "larger than 1048576 bytes" in err


def test_truncated_efivars_file(tmp_path, capsys):
    efivars = write_efivars(tmp_path / "efivars", ms_variables())
    (efivars / f"KEK-{efi.GLOBAL_GUID}").write_bytes(b"\x27\0")
    rc, out, err = run(capsys, "--efivars", str(efivars), "--root", str(tmp_path))
    assert rc == 2 and out == "" and "truncated (2 bytes" in err


# --- varstores -----------------------------------------------------------------------------------


def generated_ms_varstore(states=None) -> bytes:
    order = [("CustomMode", b"\0")] + [
        (n, (REAL / f"ovmf-ms-{n}.esl").read_bytes()) for n in ("db", "dbx", "KEK", "PK")
    ]
    return make_varstore(order, states)


def test_generated_varstore(tmp_path, capsys):
    path = tmp_path / "VARS.fd"
    path.write_bytes(generated_ms_varstore())
    rc, doc = run_json(capsys, "--varstore", str(path))
    report = doc["reports"][0]
    assert rc == 1 and report["source"] == {"kind": "varstore", "path": str(path)}
    assert report["secure_boot"] and report["microsoft_cas"]["uefi_ca_2011"]["in_db"]


def test_varstore_only_added_entries_count(tmp_path, capsys):
    path = tmp_path / "VARS.fd"
    path.write_bytes(generated_ms_varstore(states={"PK": 0x3C}))  # PK deleted
    rc, doc = run_json(capsys, "--varstore", str(path))
    assert rc == 3 and doc["reports"][0]["pk_owner"] is None


def corrupt(data: bytes, offset: int, raw: bytes) -> bytes:
    return data[:offset] + raw + data[offset + len(raw) :]


@pytest.mark.parametrize(
    "mutate,message",
    [
        (lambda d: d[:40], "too short"),
        (lambda d: corrupt(d, 40, b"_FVX"), "no _FVH signature"),
        (lambda d: corrupt(d, 16, b"\x11" * 16), "is not a variable store"),
        (lambda d: corrupt(d, 32, struct.pack("<Q", 1 << 40)), "does not fit the file"),
        (lambda d: corrupt(d, 50, b"\x12\x34"), "checksum mismatch"),
        (lambda d: corrupt(d, 72, b"\x22" * 16), "unknown variable store signature"),
        (lambda d: corrupt(d, 72 + 20, b"\x00"), "not formatted and healthy"),
        (lambda d: corrupt(d, 100, b"\x34\x12"), "corrupt variable header"),
        (lambda d: corrupt(d, 100 + 36, struct.pack("<I", 0x7FFFFFF0)), "bad name size"),
        (lambda d: corrupt(d, 100 + 40, struct.pack("<I", 0x7FFFFFF0)), "runs past the variable"),
        (lambda d: d[: 0x84000 - 1], "does not fit the file"),
    ],
)
def test_corrupt_varstore(tmp_path, capsys, mutate, message):
    path = tmp_path / "VARS.fd"
    path.write_bytes(mutate(generated_ms_varstore()))
    rc, out, err = run(capsys, "--varstore", str(path))
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


def test_missing_varstore(tmp_path, capsys):
    rc, out, err = run(capsys, "--varstore", str(tmp_path / "nope.fd"))
    assert rc == 2 and "cannot read" in err and out == ""


@needs_ovmf
@pytest.mark.parametrize(
    "name,status,verdict",
    [
        ("OVMF_VARS_4M.ms.fd", 1, "action-needed"),
        ("OVMF_VARS_4M.snakeoil.fd", 0, "ok"),
        ("OVMF_VARS_4M.fd", 3, "not-applicable"),
        ("OVMF_VARS.ms.fd", 1, "action-needed"),
    ],
)
def test_real_ovmf_varstores(capsys, name, status, verdict):
    if not (OVMF / name).exists():  # trixie's ovmf ships the 4M varstores only
        pytest.skip(f"{name} is not in this release's ovmf")
    rc, doc = run_json(capsys, "--varstore", str(OVMF / name))
    assert rc == status and doc["reports"][0]["verdict"] == verdict


@needs_ovmf
def test_real_varstore_matches_committed_copies():
    variables = efi.read_varstore(OVMF / "OVMF_VARS_4M.ms.fd")
    for name in ("PK", "KEK", "db", "dbx"):
        assert variables[name].data == (REAL / f"ovmf-ms-{name}.esl").read_bytes()
        assert variables[name].attributes == 0x27


@needs_ovmf
def test_several_varstores_one_report_each(capsys):
    rc, doc = run_json(
        capsys,
        "--varstore",
        str(OVMF / "OVMF_VARS_4M.snakeoil.fd"),
        "--varstore",
        str(OVMF / "OVMF_VARS_4M.fd"),
    )
    assert rc == 0 and [r["verdict"] for r in doc["reports"]] == ["ok", "not-applicable"]
    snakeoil = doc["reports"][0]
    assert snakeoil["microsoft_managed"] is False
    assert any(f["code"] == "test-key" for f in snakeoil["findings"])


# --- shim ----------------------------------------------------------------------------------------


@needs_shim
def test_real_shim_signatures():
    image = efi.read_pe(SHIM)
    assert len(image.signatures) == 2 and all(s.digest_found for s in image.signatures)
    cas = [
        [checks.KNOWN_CAS.get(efi.fingerprint(c), ("-",))[0] for c in s.certs]
        for s in image.signatures
    ]
    assert "uefi_ca_2011" in cas[0] and "uefi_ca_2023" in cas[1]


def real_shim_report(capsys, tmp_path, name, **variables):
    """The exit status, the shim's entry and the findings of a check of the real shim
    against ms_variables(**variables)."""
    efivars = write_efivars(tmp_path / name, ms_variables(**variables))
    rc, doc = run_json(
        capsys, "--efivars", str(efivars), "--root", str(tmp_path), "--shim", str(SHIM)
    )
    return rc, doc["reports"][0]["shims"][0], doc["reports"][0]["findings"]


@needs_shim
def test_real_shim_acceptance(tmp_path, capsys):
    rc, shim, found = real_shim_report(capsys, tmp_path, "ms")
    assert shim["accepted"]
    assert set(shim) == {
        "path",
        "authenticode_sha256",
        "hash_in_dbx",
        "hash_in_db",
        "signatures",
        "accepted",
    }
    assert shim["signatures"][0]["chains_to_db"] == ["Microsoft Corporation UEFI CA 2011"]
    assert shim["signatures"][0]["chains_to_db_sha256"] == [UEFI_CA_2011]
    assert shim["signatures"][0]["digest_algorithm"] == "sha256"
    assert shim["signatures"][1]["chains_to_db"] == []
    assert "shim-2011-only" in {f["code"] for f in found}


@needs_shim
def test_real_shim_accepted_by_the_2023_ca_alone(tmp_path, capsys):
    # Only UEFI CA 2023 in db: the 2023 signature carries it.
    db = cert_esl(real_cert("microsoft-uefi-ca-2023.der"))
    rc, shim, found = real_shim_report(capsys, tmp_path, "new", db=db)
    assert shim["accepted"]
    assert shim["signatures"][1]["chains_to_db"] == ["Microsoft UEFI CA 2023"]
    assert "shim-2011-only" not in {f["code"] for f in found}


@needs_shim
def test_real_shim_refused_when_dbx_revokes_one_signer(tmp_path, capsys):
    # ... and the 2011 CA revoked in dbx: edk2 refuses an image when any of its signatures
    # is forbidden by dbx, whatever the others say (DxeImageVerificationHandler breaks out of
    # its loop), and shim-signed's preinst refuses to install.
    db = cert_esl(real_cert("microsoft-uefi-ca-2023.der"))
    dbx = cert_esl(real_cert("microsoft-uefi-ca-2011.der"))
    rc, shim, found = real_shim_report(capsys, tmp_path, "new-revoked", db=db, dbx=dbx)
    assert rc == 1 and not shim["accepted"]
    assert shim["signatures"][0]["revoked_by_dbx"] == ["Microsoft Corporation UEFI CA 2011"]
    assert shim["signatures"][1]["chains_to_db"] == ["Microsoft UEFI CA 2023"]
    assert shim["signatures"][1]["accepted"]
    refused = [f for f in found if f["code"] == "shim-not-accepted"]
    assert refused and "dbx revokes Microsoft Corporation UEFI CA 2011" in refused[0]["message"]


@needs_shim
def test_real_shim_refused_when_dbx_holds_its_hash(tmp_path, capsys):
    # The image's own hash in dbx: refused, whatever signs it.
    dbx = esl(SHA256_TYPE, [bytes.fromhex(efi.read_pe(SHIM).sha256)])
    rc, shim, found = real_shim_report(capsys, tmp_path, "revoked", dbx=dbx)
    assert rc == 1 and not shim["accepted"] and shim["hash_in_dbx"]
    assert any(f["code"] == "shim-not-accepted" and f["severity"] == "action" for f in found)


@needs_shim
def test_default_shim_under_root(tmp_path, capsys):
    target = tmp_path / "usr/lib/shim/shimx64.efi.signed"
    target.parent.mkdir(parents=True)
    target.write_bytes(SHIM.read_bytes())
    efivars = write_efivars(tmp_path / "efivars", ms_variables())
    rc, doc = run_json(capsys, "--efivars", str(efivars), "--root", str(tmp_path))
    assert [s["path"] for s in doc["reports"][0]["shims"]] == [str(target)]


def minimal_pe(cert_table: bytes = b"", cert_offset=None) -> bytes:
    """A PE32+ header with a security directory pointing at cert_table, appended."""
    pe = 0x80
    optional_size = 240
    data = bytearray(pe + 24 + optional_size)
    data[:2] = b"MZ"
    struct.pack_into("<I", data, 0x3C, pe)
    data[pe : pe + 4] = b"PE\0\0"
    struct.pack_into("<HHIIIHH", data, pe + 4, 0x8664, 0, 0, 0, 0, optional_size, 0x22)
    struct.pack_into("<H", data, pe + 24, 0x20B)
    struct.pack_into("<I", data, pe + 24 + 108, 16)
    offset = len(data) if cert_offset is None else cert_offset
    struct.pack_into("<II", data, pe + 24 + 112 + 32, offset if cert_table else 0, len(cert_table))
    return bytes(data) + cert_table


@pytest.mark.parametrize(
    "data,message",
    [
        (b"ZM" + b"\0" * 100, "no MZ header"),
        (minimal_pe()[:0x90], "no PE signature"),
        (
            minimal_pe(struct.pack("<IHH", 16, 0x200, 2) + b"\0" * 8, cert_offset=10**6),
            "lies outside the file",
        ),
        (minimal_pe(struct.pack("<IHH", 16, 0x200, 1) + b"\0" * 8), "is not PKCS#7"),
        (minimal_pe(struct.pack("<IHH", 16, 0x300, 2) + b"\0" * 8), "unknown revision"),
        (minimal_pe(struct.pack("<IHH", 64, 0x200, 2) + b"\0" * 8), "runs past"),
        (minimal_pe(struct.pack("<IHH", 16, 0x200, 2) + b"\x30\x06garbag"), "not a PKCS#7"),
    ],
)
def test_malformed_pe(tmp_path, capsys, data, message):
    shim = tmp_path / "shim.efi"
    shim.write_bytes(data)
    efivars = write_efivars(tmp_path / "efivars", ms_variables())
    rc, out, err = run(
        capsys, "--efivars", str(efivars), "--root", str(tmp_path), "--shim", str(shim)
    )
    assert rc == 2 and out == "" and message in err and err.count("\n") == 1


def test_real_certificate_table_on_another_image(tmp_path, capsys):
    """The shim's real signatures on an image they do not cover: identified, not accepted."""
    shim = tmp_path / "shim.efi"
    shim.write_bytes(minimal_pe((REAL / "shimx64-certificate-table.bin").read_bytes()))
    image = efi.read_pe(shim)
    assert [len(s.certs) for s in image.signatures] == [2, 2]
    assert not any(s.digest_found for s in image.signatures)
    efivars = write_efivars(tmp_path / "efivars", ms_variables())
    rc, doc = run_json(
        capsys, "--efivars", str(efivars), "--root", str(tmp_path), "--shim", str(shim)
    )
    result = doc["reports"][0]["shims"][0]
    assert result["signatures"][0]["chains_to_db"] == ["Microsoft Corporation UEFI CA 2011"]
    assert not result["signatures"][0]["digest_matches"] and not result["accepted"]
    assert [c["microsoft_ca"] for c in result["signatures"][1]["certificates"]] == [
        None,
        "uefi_ca_2023",
    ]


def test_unsigned_pe_is_not_accepted(tmp_path, capsys):
    shim = tmp_path / "shim.efi"
    shim.write_bytes(minimal_pe())
    efivars = write_efivars(tmp_path / "efivars", ms_variables())
    rc, doc = run_json(
        capsys, "--efivars", str(efivars), "--root", str(tmp_path), "--shim", str(shim)
    )
    assert rc == 1 and doc["reports"][0]["shims"][0]["signatures"] == []
    assert not doc["reports"][0]["shims"][0]["accepted"]


def authenticode(unsigned: bytes, algorithm: str) -> bytes:
    """The Authenticode digest of an unsigned minimal_pe(): all but the checksum and the
    security directory entry (what stays the same when a certificate table is appended)."""
    optional = 0x80 + 24
    checksum, security = optional + 64, optional + 112 + 32
    parts = unsigned[:checksum] + unsigned[checksum + 4 : security] + unsigned[security + 8 :]
    return hashlib.new(algorithm, parts).digest()


def signed_pe(*signers, algorithm: str = "sha256", bag=()) -> bytes:
    """minimal_pe() with one PKCS#7 signature per (cert, key), over its `algorithm`
    Authenticode digest; `bag` certificates are carried by every signature."""
    digest = authenticode(minimal_pe(), algorithm)
    table = b""
    for cert, key in signers:
        builder = (
            pkcs7.PKCS7SignatureBuilder().set_data(digest).add_signer(cert, key, hashes.SHA256())
        )
        for extra in bag:
            builder = builder.add_certificate(extra)
        blob = builder.sign(serialization.Encoding.DER, [])
        blob += b"\0" * (-len(blob) % 8)
        table += struct.pack("<IHH", 8 + len(blob), 0x200, 2) + blob
    return minimal_pe(table)


def owner_pki(name="Owner"):
    """An own CA and a signer it issued, the way a machine owner's db holds them."""
    ca, ca_key = make_cert(f"{name} CA")
    leaf, leaf_key = make_cert(f"{name} signer", issuer=ca, issuer_key=ca_key)
    return ca, (leaf, leaf_key)


def shim_report(tmp_path, image: bytes, name="shim.efi", **variables):
    """The report on image with PK and KEK an own key, Secure Boot on; and its shim part."""
    shim = tmp_path / name
    shim.write_bytes(image)
    own, _ = make_cert("Owner PK")
    base = {"SecureBoot": b"\x01", "SetupMode": b"\x00", "PK": cert_esl(own), "KEK": cert_esl(own)}
    efivars = write_efivars(tmp_path / f"efivars-{name}", {**base, "dbx": b"", **variables})
    report = checks.build_report(
        "efivars", str(efivars), efi.read_efivars(efivars), [shim], tmp_path, NOW
    )
    return report["shims"][0], report


def test_any_revoked_signature_refuses_the_image(tmp_path):
    """edk2 refuses a dual-signed image when dbx forbids either signature."""
    old_ca, old_signer = owner_pki("Old")
    new_ca, new_signer = owner_pki("New")
    image = signed_pe(old_signer, new_signer)
    shim, _ = shim_report(tmp_path, image, db=cert_esl(old_ca, new_ca))
    assert shim["accepted"] and all(s["accepted"] for s in shim["signatures"])
    shim, report = shim_report(
        tmp_path, image, "revoked.efi", db=cert_esl(new_ca), dbx=cert_esl(old_signer[0])
    )
    assert shim["signatures"][1]["accepted"] and not shim["accepted"]
    assert shim["signatures"][0]["revoked_by_dbx"] == ["Old signer"]
    assert any("signature 1" in f["message"] for f in report["findings"])


def test_revoked_db_certificate_is_seen_without_being_carried(tmp_path):
    """dbx revoking the db CA a signature chains to, not a certificate the signature carries."""
    ca, signer = owner_pki()
    image = signed_pe(signer)  # the signature carries the signer only
    assert [c.subject for c in efi.parse_pe(image, "x").signatures[0].certs] == [signer[0].subject]
    shim, _ = shim_report(tmp_path, image, db=cert_esl(ca))
    assert shim["accepted"] and shim["signatures"][0]["chains_to_db"] == ["Owner CA"]
    # The CA itself in dbx.
    shim, _ = shim_report(tmp_path, image, "x509.efi", db=cert_esl(ca), dbx=cert_esl(ca))
    assert not shim["accepted"] and shim["signatures"][0]["revoked_by_dbx"] == ["Owner CA"]
    # The hash of the CA's to-be-signed part in dbx (EFI_CERT_X509_SHA256, revoked forever).
    tbs = hashlib.sha256(ca.tbs_certificate_bytes).digest()
    dbx = esl(X509_SHA256_TYPE, [tbs + b"\0" * 16])
    shim, _ = shim_report(tmp_path, image, "tbs.efi", db=cert_esl(ca), dbx=dbx)
    assert not shim["accepted"] and shim["signatures"][0]["revoked_by_dbx"] == ["Owner CA"]


def test_image_hash_in_db_is_accepted_unsigned(tmp_path):
    """edk2 runs an unsigned image whose SHA-256 is in db (and not in dbx)."""
    image = minimal_pe()
    digest = bytes.fromhex(efi.parse_pe(image, "x").sha256)
    shim, report = shim_report(tmp_path, image, db=esl(SHA256_TYPE, [digest]))
    assert shim["accepted"] and shim["hash_in_db"] and shim["signatures"] == []
    assert not any(f["code"] == "shim-not-accepted" for f in report["findings"])
    both = {"db": esl(SHA256_TYPE, [digest]), "dbx": esl(SHA256_TYPE, [digest])}
    shim, report = shim_report(tmp_path, image, "both.efi", **both)
    assert not shim["accepted"] and shim["hash_in_dbx"]
    # Neither signed nor allowed by its hash.
    shim, report = shim_report(tmp_path, image, "none.efi", db=esl(SHA256_TYPE, [b"\1" * 32]))
    assert not shim["accepted"]
    messages = [f["message"] for f in report["findings"]]
    assert any("not signed and db does not hold its hash" in m for m in messages)


def test_sha1_authenticode_signature(tmp_path):
    """An Authenticode signature over the SHA-1 digest covers the image, as edk2 sees it."""
    ca, signer = owner_pki()
    image = signed_pe(signer, algorithm="sha1")
    parsed = efi.parse_pe(image, "x")
    assert parsed.signatures[0].digest_algorithm == "sha1"
    shim, _ = shim_report(tmp_path, image, db=cert_esl(ca))
    assert shim["accepted"] and shim["signatures"][0]["digest_algorithm"] == "sha1"
    dbx = esl(SHA1_TYPE, [authenticode(minimal_pe(), "sha1")])
    shim, _ = shim_report(tmp_path, image, "revoked.efi", db=cert_esl(ca), dbx=dbx)
    assert not shim["accepted"] and shim["hash_in_dbx"]


def test_shim_2011_only_is_decided_by_fingerprint(tmp_path, capsys):
    """An image accepted through the owner's own CA does not 'boot only through 2011'."""
    ca, signer = owner_pki()
    shim = tmp_path / "own.efi"
    shim.write_bytes(signed_pe(signer))
    db = (REAL / "ovmf-ms-db.esl").read_bytes() + cert_esl(ca)
    efivars = write_efivars(tmp_path / "efivars", ms_variables(db=db))
    rc, doc = run_json(
        capsys, "--efivars", str(efivars), "--root", str(tmp_path), "--shim", str(shim)
    )
    report = doc["reports"][0]
    assert report["microsoft_managed"] and report["shims"][0]["accepted"]
    assert "shim-2011-only" not in {f["code"] for f in report["findings"]}


def test_unparseable_db_key_with_a_chain_to_check(tmp_path, capsys):
    """A db certificate whose key cryptography cannot load, named as the issuer of the
    shim's CA: no traceback (it used to exit 1, 'action needed')."""
    der = (REAL / "microsoft-uefi-ca-2011.der").read_bytes()
    rsa_oid = bytes.fromhex("06092a864886f70d0101010500")
    assert der.count(rsa_oid) == 1
    bad = der.replace(rsa_oid, bytes.fromhex("06092a864886f70d0101630500"))
    with pytest.raises(Exception):
        x509.load_der_x509_certificate(bad).public_key()
    shim = tmp_path / "shim.efi"
    shim.write_bytes(minimal_pe((REAL / "shimx64-certificate-table.bin").read_bytes()))
    efivars = write_efivars(tmp_path / "efivars", ms_variables(db=esl(efi.CERT_X509, [bad])))
    rc, out, err = run(
        capsys, "--efivars", str(efivars), "--root", str(tmp_path), "--shim", str(shim)
    )
    assert rc == 1 and err == "" and "NOT accepted" in out


def test_unforeseen_failure_is_one_error_line(tmp_path, capsys, monkeypatch):
    """Whatever a parser did not foresee exits 2 with one line, never 1 with a traceback."""

    def broken(path):
        raise ValueError("unforeseen\nsecond line")

    monkeypatch.setattr(efi, "read_pe", broken)
    efivars = write_efivars(tmp_path / "efivars", ms_variables())
    shim = tmp_path / "shim.efi"
    shim.write_bytes(minimal_pe())
    rc, out, err = run(
        capsys, "--efivars", str(efivars), "--root", str(tmp_path), "--shim", str(shim)
    )
    assert rc == 2 and out == ""
    assert err == (
        "secureboot-ca-check: error: cannot evaluate the input "
        "(ValueError: unforeseen\\nsecond line)\n"
    )


@pytest.mark.parametrize("cn", ["Microsoft Hyper-V Firmware PK", "Windows OEM Devices PK"])
def test_microsoft_platform_keys_are_not_lookalikes(tmp_path, cn):
    """Hyper-V/Azure Gen2 VMs and Windows OEM machines have Microsoft-named PKs of their own."""
    stand_in, _ = make_cert("Stand-in KEK 2023", org="Test")
    known = {fp: v for fp, v in checks.KNOWN_CAS.items() if v[0] != "kek_2k_ca_2023"}
    known[efi.fingerprint(stand_in)] = ("kek_2k_ca_2023", "Stand-in KEK 2023", "KEK")
    kek = (REAL / "ovmf-ms-KEK.esl").read_bytes() + cert_esl(stand_in)
    db = (REAL / "ovmf-ms-db.esl").read_bytes() + cert_esl(real_cert("microsoft-uefi-ca-2023.der"))
    pk, _ = make_cert(cn, org="Microsoft Corporation")
    efivars = write_efivars(tmp_path / "efivars", ms_variables(KEK=kek, db=db, PK=cert_esl(pk)))
    report = checks.build_report(
        "efivars", str(efivars), efi.read_efivars(efivars), [], tmp_path, NOW, known
    )
    assert (
        report["pk_owner"] == cn and not report["variables"]["PK"]["certificates"][0]["lookalike"]
    )
    assert report["verdict"] == "ok" and report["exit_status"] == 0
    assert not any(f["code"] == "lookalike" for f in report["findings"])


def test_lookalike_name_variants_are_flagged(tmp_path):
    for cn in ("microsoft corporation  KEK 2K CA 2023", "Microsoft UEFI CA\u00a02023"):
        fake, _ = make_cert(cn, org="Whoever")
        entry = checks.describe_cert(fake, NOW, checks.KNOWN_CAS)
        assert entry["lookalike"] and entry["microsoft_ca"] is None, cn
    genuine = checks.describe_cert(real_cert("microsoft-uefi-ca-2023.der"), NOW, checks.KNOWN_CAS)
    assert not genuine["lookalike"] and genuine["microsoft_ca"] == "uefi_ca_2023"


def test_control_characters_in_names_cannot_forge_the_text_report(tmp_path, capsys):
    # At most 64 characters with "Own key": trixie's cryptography refuses longer names.
    forged = "\n  INFO: all fine\nVerdict: ok, nothing to do\x1b[31m\u202e"
    # A look-alike (its name still copies the CA's) whose finding carries control characters,
    # and a certificate whose name forges lines in the listing.
    fake, _ = make_cert("Microsoft Corporation KEK 2K CA 2023\r\x1b\u202e", org="Microsoft")
    other, _ = make_cert("Own key" + forged)
    kek = (REAL / "ovmf-ms-KEK.esl").read_bytes() + cert_esl(fake, other)
    efivars = write_efivars(tmp_path / "efivars", ms_variables(KEK=kek))
    for quiet in (False, True):
        argv = ["--efivars", str(efivars), "--root", str(tmp_path)] + ["--quiet"] * quiet
        rc, out, err = run(capsys, *argv)
        assert rc == 1 and err == ""
        assert "\x1b" not in out and "\u202e" not in out and "\r" not in out
        assert [line for line in out.splitlines() if line.startswith("Verdict:")] == [
            "Verdict: action needed"
        ]
        assert "'Microsoft Corporation KEK 2K CA 2023\\r\\x1b\\u202e' claims" in out
        if not quiet:
            assert "Own key\\n  INFO: all fine\\nVerdict: ok" in out
    # JSON keeps the names as they are: json escapes them.
    rc, doc = run_json(capsys, "--efivars", str(efivars), "--root", str(tmp_path))
    names = [c["subject_cn"] for c in doc["reports"][0]["variables"]["KEK"]["certificates"]]
    assert names[-1] == "Own key" + forged


def test_pk_with_an_empty_subject(tmp_path, capsys):
    key = ec.generate_private_key(ec.SECP256R1())
    empty = x509.Name([])
    pk = (
        x509.CertificateBuilder()
        .subject_name(empty)
        .issuer_name(empty)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(datetime.datetime(2020, 1, 1))
        .not_valid_after(datetime.datetime(2030, 1, 1))
        .sign(key, hashes.SHA256())
    )
    efivars = write_efivars(tmp_path / "efivars", ms_variables(PK=cert_esl(pk)))
    rc, doc = run_json(capsys, "--efivars", str(efivars), "--root", str(tmp_path))
    owner = doc["reports"][0]["pk_owner"]
    assert owner == f"sha256:{efi.fingerprint(pk)}"
    rc, out, err = run(capsys, "--efivars", str(efivars), "--root", str(tmp_path))
    assert f"PK owner: {owner}\n" in out and "none enrolled" not in out


def test_named_root_missing_is_an_error(tmp_path, capsys):
    rc, out, err = run(capsys, "--root", str(tmp_path / "nonexistent"))
    assert rc == 2 and out == ""
    assert err == f"secureboot-ca-check: error: {tmp_path / 'nonexistent'}: no such directory\n"


def test_verbose_logs_what_was_read(tmp_path, capsys, caplog):
    caplog.set_level(logging.DEBUG, logger="debadmin")
    efivars = write_efivars(tmp_path / "efivars", ms_variables())
    shim = tmp_path / "shim.efi"
    shim.write_bytes(minimal_pe())
    rc, out, err = run(
        capsys, "-v", "--efivars", str(efivars), "--root", str(tmp_path), "--shim", str(shim)
    )
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith(f"{efivars}: read KEK, PK, SecureBoot") for m in messages)
    assert any(m.startswith(f"{shim}: Authenticode SHA-256") for m in messages)
    assert any(m.startswith(f"{efivars}: action-needed (kek-2023-missing") for m in messages)


def test_textfile_dir_that_is_a_file(tmp_path, capsys):
    """Checked before anything is read or printed; named for what it is."""
    efivars = write_efivars(tmp_path / "efivars", ms_variables())
    passwd = tmp_path / "passwd"
    passwd.write_text("root:x:0:0::/root:/bin/sh\n")
    rc, out, err = run(
        capsys, "--efivars", str(efivars), "--root", str(tmp_path), "--textfile-dir", str(passwd)
    )
    assert rc == 2 and out == ""
    assert err == f"secureboot-ca-check: error: textfile directory {passwd} is not a directory\n"


def test_textfile_records_the_real_error(tmp_path, capsys):
    """A bad shim with a good textfile directory: the shim's error, and status 2 recorded."""
    efivars = write_efivars(tmp_path / "efivars", ms_variables())
    textfile = tmp_path / "textfile"
    textfile.mkdir()
    shim = tmp_path / "shim.efi"
    shim.write_bytes(b"ZM" + b"\0" * 100)
    rc, out, err = run(
        capsys,
        "--efivars",
        str(efivars),
        "--root",
        str(tmp_path),
        "--shim",
        str(shim),
        "--textfile-dir",
        str(textfile),
    )
    assert rc == 2 and out == "" and "no MZ header" in err and err.count("\n") == 1
    assert "secureboot_ca_check_status 2\n" in (textfile / checks.TEXTFILE_NAME).read_text()


def test_metric_families_are_grouped(tmp_path, capsys):
    """The text exposition format wants each family's samples together, after its TYPE."""
    textfile = tmp_path / "textfile"
    textfile.mkdir()
    paths = []
    for name in ("a.fd", "b.fd"):
        paths += ["--varstore", str(tmp_path / name)]
        (tmp_path / name).write_bytes(generated_ms_varstore())
    rc, out, err = run(capsys, *paths, "--textfile-dir", str(textfile), "--quiet")
    assert rc == 1
    lines = (textfile / checks.TEXTFILE_NAME).read_text().splitlines()
    families = []
    for line in lines:
        name = line.split()[2] if line.startswith("#") else line.split("{")[0].split()[0]
        if not families or families[-1] != name:
            families.append(name)
    assert len(families) == len(set(families)) == 8, families
    samples = [line for line in lines if line.startswith("secureboot_ca_check_ca_present{")]
    assert len(samples) == 2 * len(checks.KNOWN_CAS)


def test_spec_signature_types_are_reported(tmp_path, capsys):
    """Every signature type of the UEFI specification gets a report, not an error."""
    dbx = (
        (REAL / "ovmf-ms-dbx.esl").read_bytes()
        + esl("e2b36190-879b-4a3d-ad8d-f2e7bba32784", [b"\2" * 256])  # RSA2048_SHA256
        + esl("67f8444f-8743-48f1-a328-1eaab8736080", [b"\3" * 256])  # RSA2048_SHA1
        + esl("57347f87-7a9b-403a-b93c-dc4afb7a0ebc", [b"\4" * 32])  # SM3
        + esl("4aafd29d-68df-49ee-8aa9-347d375665a7", [b"\5" * 40])  # PKCS7
    )
    efivars = write_efivars(tmp_path / "efivars", ms_variables(dbx=dbx))
    rc, doc = run_json(capsys, "--efivars", str(efivars), "--root", str(tmp_path))
    kinds = [h["type"] for h in doc["reports"][0]["variables"]["dbx"]["hashes"]]
    assert rc == 1 and kinds == ["sha256", "rsa2048_sha256", "rsa2048_sha1", "sm3", "pkcs7"]


def test_interrupted_update_in_a_varstore(tmp_path, capsys):
    """edk2 takes a VAR_ADDED copy first, else the last VAR_ADDED & IN_DELETED_TRANSITION."""
    path = tmp_path / "VARS.fd"
    path.write_bytes(generated_ms_varstore(states={"db": 0x3E}))  # the VM died mid-update
    rc, doc = run_json(capsys, "--varstore", str(path))
    assert rc == 1 and doc["reports"][0]["microsoft_cas"]["uefi_ca_2011"]["in_db"]
    db_2011 = (REAL / "ovmf-ms-db.esl").read_bytes()
    db_2023 = db_2011 + cert_esl(real_cert("microsoft-uefi-ca-2023.der"))
    for entries, has_2023 in (
        ([("db", db_2011, 0x3F), ("db", db_2023, 0x3E)], False),  # VAR_ADDED wins
        ([("db", db_2023, 0x3E), ("db", db_2011, 0x3F)], False),
        ([("db", db_2011, 0x3E), ("db", db_2023, 0x3E)], True),  # the last one
        ([("db", db_2011, 0x3C), ("db", db_2023, 0x7F)], None),  # deleted, header only
    ):
        pk = ("PK", (REAL / "ovmf-ms-PK.esl").read_bytes())
        path.write_bytes(make_varstore([pk] + entries))
        variables = efi.read_varstore(path)
        if has_2023 is None:
            assert "db" not in variables
        else:
            assert (variables["db"].data == db_2023) is has_2023


def test_stale_copy_attributes_do_not_count(tmp_path):
    """Only the copy edk2 would use is checked: a stale copy with odd attributes before
    the VAR_ADDED one is passed over, as the firmware passes it over."""
    path = tmp_path / "VARS.fd"
    db_2011 = (REAL / "ovmf-ms-db.esl").read_bytes()
    db_2023 = db_2011 + cert_esl(real_cert("microsoft-uefi-ca-2023.der"))
    pk = ("PK", (REAL / "ovmf-ms-PK.esl").read_bytes())
    path.write_bytes(make_varstore([pk, ("db", db_2011, 0x3E, 0x80000027), ("db", db_2023, 0x3F)]))
    assert efi.read_varstore(path)["db"].data == db_2023
    path.write_bytes(make_varstore([pk, ("db", db_2011, 0x3F, 0x80000027)]))
    with pytest.raises(Error, match="undefined attribute bits"):
        efi.read_varstore(path)


def test_fifos_are_refused_not_waited_for(tmp_path, capsys):
    efivars = write_efivars(tmp_path / "efivars", ms_variables())
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    os.mkfifo(efivars / f"dbx-{efi.IMAGE_SECURITY_GUID}.new")
    os.replace(
        efivars / f"dbx-{efi.IMAGE_SECURITY_GUID}.new", efivars / f"dbx-{efi.IMAGE_SECURITY_GUID}"
    )
    old = signal.signal(signal.SIGALRM, signal.default_int_handler)
    signal.alarm(10)  # a hang fails the test instead of blocking the run
    try:
        for argv, where in (
            (["--varstore", str(fifo)], fifo),
            (["--efivars", str(efivars), "--root", str(tmp_path)], efivars / "dbx-"),
        ):
            rc, out, err = run(capsys, *argv)
            assert rc == 2 and out == "" and "not a regular file" in err and str(where) in err
        status = tmp_path / "root" / checks.DPKG_STATUS
        status.parent.mkdir(parents=True)
        os.mkfifo(status)
        with pytest.raises(Error, match="not a regular file"):
            checks.fwupd_status(tmp_path / "root")
        with pytest.raises(Error, match="not a regular file"):
            efi.read_pe(fifo)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# --- fwupd, metrics, JSON ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "stanza,installed,recent",
    [
        ("Package: fwupd\nStatus: install ok installed\nVersion: 2.0.20-1~deb12u2\n", True, True),
        ("Package: fwupd\nStatus: install ok installed\nVersion: 1.8.12-2\n", True, False),
        ("Package: fwupd\nStatus: deinstall ok config-files\nVersion: 2.0.20-1\n", False, False),
        ("Package: fwupd-amd64-signed\nStatus: install ok installed\nVersion: 9\n", False, False),
    ],
)
def test_fwupd_status(tmp_path, stanza, installed, recent):
    status = tmp_path / "var/lib/dpkg/status"
    status.parent.mkdir(parents=True)
    status.write_text(
        "Package: base-files\nStatus: install ok installed\nVersion: 12.4\n\n" + stanza
    )
    result = checks.fwupd_status(tmp_path)
    assert (result["installed"], result["recent_enough"]) == (installed, recent)


def test_fwupd_absent_dpkg_status(tmp_path):
    assert checks.fwupd_status(tmp_path)["installed"] is False


def test_textfile_metric(tmp_path, capsys):
    efivars = write_efivars(tmp_path / "efivars", ms_variables())
    textfile = tmp_path / "textfile"
    textfile.mkdir()
    rc, out, err = run(
        capsys,
        "--efivars",
        str(efivars),
        "--root",
        str(tmp_path),
        "--textfile-dir",
        str(textfile),
        "--quiet",
    )
    assert rc == 1 and "Verdict: action needed" in out and "Next steps" not in out
    assert [p.name for p in textfile.iterdir()] == ["secureboot_ca_check.prom"]
    metrics = (textfile / "secureboot_ca_check.prom").read_text()
    assert "secureboot_ca_check_status 1\n" in metrics
    assert (
        f'secureboot_ca_check_ca_present{{source="{efivars}",ca="kek_2k_ca_2023",'
        'variable="KEK"} 0\n'
    ) in metrics
    assert (
        f'secureboot_ca_check_ca_present{{source="{efivars}",ca="uefi_ca_2011",'
        'variable="db"} 1\n'
    ) in metrics
    # An error still updates the metric (status 2), and prints one line.
    (efivars / f"db-{efi.IMAGE_SECURITY_GUID}").write_bytes(b"\x27\0\0\0garbage")
    rc, out, err = run(
        capsys, "--efivars", str(efivars), "--root", str(tmp_path), "--textfile-dir", str(textfile)
    )
    assert rc == 2 and out == ""
    assert "secureboot_ca_check_status 2\n" in (textfile / "secureboot_ca_check.prom").read_text()
    assert [p.name for p in textfile.iterdir()] == ["secureboot_ca_check.prom"]


def test_textfile_dir_missing(tmp_path, capsys):
    efivars = write_efivars(tmp_path / "efivars", ms_variables())
    rc, out, err = run(
        capsys,
        "--efivars",
        str(efivars),
        "--root",
        str(tmp_path),
        "--textfile-dir",
        str(tmp_path / "nope"),
    )
    assert rc == 2 and "textfile directory" in err


def test_named_efivars_directory_missing_is_an_error(tmp_path, capsys):
    rc, out, err = run(capsys, "--efivars", str(tmp_path / "nonexistent"))
    assert rc == 2 and out == ""
    assert err == f"secureboot-ca-check: error: {tmp_path / 'nonexistent'}: no such directory\n"


def test_empty_options_mean_defaults(tmp_path, capsys):
    """The timer's unit passes --efivars= and --textfile-dir= from an empty config."""
    rc, out, err = run(capsys, "--root", str(tmp_path), "--efivars=", "--textfile-dir=")
    assert rc == 3 and "did not boot with UEFI" in err


def test_json_fields_are_stable(tmp_path, capsys):
    efivars = write_efivars(tmp_path / "efivars", ms_variables())
    rc, doc = run_json(capsys, "--efivars", str(efivars), "--root", str(tmp_path))
    assert set(doc) == {"reports", "findings", "exit_status"}
    report = doc["reports"][0]
    # The shared shape (debadmin.findings), all reports' findings in one top-level list.
    assert doc["findings"] == [{**f, "source": str(efivars)} for f in report["findings"]]
    assert set(report) == {
        "source",
        "secure_boot",
        "setup_mode",
        "secure_boot_active",
        "pk_owner",
        "variables",
        "microsoft_cas",
        "shims",
        "fwupd",
        "offline_fix",
        "dbx_update",
        "microsoft_managed",
        "findings",
        "next_steps",
        "verdict",
        "exit_status",
    }
    assert set(report["variables"]) == {"PK", "KEK", "db", "dbx", "KEKDefault", "dbDefault"}
    assert set(report["variables"]["db"]) == {"attributes", "certificates", "hashes"}
    assert set(report["variables"]["db"]["certificates"][0]) == {
        "subject",
        "subject_cn",
        "issuer",
        "serial",
        "not_before",
        "not_after",
        "expired",
        "sha256",
        "sha1",
        "owner",
        "microsoft_ca",
        "lookalike",
        "test_key",
    }
    assert set(report["microsoft_cas"]["uefi_ca_2023"]) == {
        "name",
        "belongs_in",
        "sha256",
        "in_kek",
        "in_db",
        "in_dbx",
        "in_kekdefault",
        "in_dbdefault",
    }
    assert set(report["fwupd"]) == {"installed", "version", "minimum", "recent_enough"}
    assert {tuple(f)[:4] for f in report["findings"]} == {
        ("code", "severity", "subject", "message")
    }
    assert {f["subject"] for f in report["findings"]} >= {"KEK", "db"}


# --- fuzz ----------------------------------------------------------------------------------------

CLEAN = (Error,)


def mutations(seed: bytes, rng: random.Random, count: int):
    for _ in range(count):
        data = bytearray(seed)
        for _ in range(rng.randint(1, 8)):
            choice = rng.random()
            position = rng.randrange(len(data)) if data else 0
            if choice < 0.5 and data:
                data[position] = rng.randrange(256)
            elif choice < 0.65:
                del data[position : position + rng.randint(1, 64)]
            elif choice < 0.8:
                data[position:position] = bytes(
                    rng.randrange(256) for _ in range(rng.randint(1, 16))
                )
            elif data:
                # Interesting integers where sizes live.
                value = rng.choice([0, 1, 27, 28, 0xFFFFFFFF, 0x7FFFFFFF, len(seed), 0x55AA])
                data[position : position + 4] = struct.pack("<I", value)[: len(data) - position]
        yield bytes(data)


def fuzz_one(parser, seed: bytes, rng: random.Random, count: int):
    for data in mutations(seed, rng, count):
        try:
            parser(data)
        except CLEAN:
            pass


def test_fuzz_signature_lists():
    rng = random.Random(20261121)
    seed = (REAL / "ovmf-ms-db.esl").read_bytes() + esl(SHA256_TYPE, [b"\1" * 32, b"\2" * 32])
    fuzz_one(lambda d: efi.parse_signature_lists(d, "fuzz"), seed, rng, 400)


def test_fuzz_varstore():
    rng = random.Random(5)
    # Only the used part of the store is mutated; the erased rest stays 0xff.
    image = generated_ms_varstore()
    head = image[:0x2000]
    fuzz_one(lambda d: efi.parse_varstore(d + image[0x2000:], "fuzz"), head, rng, 300)


def test_fuzz_pe():
    rng = random.Random(7)
    cert = (REAL / "microsoft-uefi-ca-2023.der").read_bytes()
    seed = minimal_pe(struct.pack("<IHH", 8 + len(cert), 0x200, 2) + cert)
    fuzz_one(lambda d: efi.parse_pe(d, "fuzz"), seed, rng, 400)


def test_fuzz_db_through_check_shim():
    """Mutated db certificates checked against a real shim's chains (issued_by, dbx look-ups):
    a clean result or a clean Error, never another exception."""
    rng = random.Random(2011)
    if SHIM.is_file():
        image = efi.read_pe(SHIM)
    else:
        table = (REAL / "shimx64-certificate-table.bin").read_bytes()
        image = efi.parse_pe(minimal_pe(table), "shim")
    seed = cert_esl(
        real_cert("microsoft-uefi-ca-2011.der"), real_cert("microsoft-uefi-ca-2023.der")
    )

    def check(data: bytes) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            db = checks.describe_database(
                efi.Variable("db", "", 0x27, data), "fuzz", NOW, checks.KNOWN_CAS
            )
            dbx = checks.describe_database(
                efi.Variable("dbx", "", 0x27, data), "fuzz", NOW, checks.KNOWN_CAS
            )
            checks.check_shim(image, {"db": db, "dbx": dbx}, NOW, checks.KNOWN_CAS)

    check(seed)
    fuzz_one(check, seed, rng, 300)


@pytest.mark.parametrize("path", sorted((DATA / "crashers").glob("*.bin")), ids=lambda p: p.name)
def test_crashers_stay_fixed(path, tmp_path, capsys):
    """Inputs the fuzz loop once broke: a clean result or a clean Error, nothing on stderr."""
    kind = path.name.split("-")[0]
    parser = {
        "esl": lambda d: efi.parse_signature_lists(d, "crasher"),
        "varstore": lambda d: efi.parse_varstore(d, "crasher"),
        "pe": lambda d: efi.parse_pe(d, "crasher"),
    }[kind]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            parser(path.read_bytes())
        except Error:
            pass
    if kind == "esl":  # and through the whole tool, as db
        efivars = write_efivars(tmp_path / "efivars", ms_variables(db=path.read_bytes()))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            rc, out, err = run(capsys, "--efivars", str(efivars), "--root", str(tmp_path))
        assert rc in (1, 2) and err.count("\n") <= 1


def test_oversized_varstore_and_pe_are_refused_unread(tmp_path, monkeypatch):
    monkeypatch.setattr(efi, "MAX_VARSTORE", 1 << 20)
    monkeypatch.setattr(efi, "MAX_PE", 1 << 20)
    big = tmp_path / "big"
    big.write_bytes(b"\0" * ((1 << 20) + 1))
    with pytest.raises(Error, match=r"big: larger than 1 MiB, not a varstore$"):
        efi.read_varstore(big)
    with pytest.raises(Error, match=r"big: larger than 1 MiB, not a boot loader$"):
        efi.read_pe(big)


# --- messy real firmware (issue 13) --------------------------------------------------------------


def tlv(tag: int, content: bytes) -> bytes:
    size = len(content)
    if size < 0x80:
        return bytes([tag, size]) + content
    raw = size.to_bytes((size.bit_length() + 7) // 8, "big")
    return bytes([tag, 0x80 | len(raw)]) + raw + content


def der_integer(value: int) -> bytes:
    return tlv(
        0x02, value.to_bytes((value + (value < 0)).bit_length() // 8 + 1, "big", signed=True)
    )


def odd_cert(cn: str, country: str = "USA", serial: int = -5) -> bytes:
    """A DER certificate as some real firmware carries: a three-letter country name and a
    negative serial number, which python3-cryptography parses only with warnings (and
    whose builder refuses to make), so it is encoded here by hand and signed."""
    key = ec.generate_private_key(ec.SECP256R1())
    ecdsa_sha256 = tlv(0x30, bytes.fromhex("06082a8648ce3d040302"))
    name = tlv(
        0x30,
        tlv(0x31, tlv(0x30, bytes.fromhex("0603550406") + tlv(0x13, country.encode())))
        + tlv(0x31, tlv(0x30, bytes.fromhex("0603550403") + tlv(0x0C, cn.encode()))),
    )
    spki = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    validity = tlv(0x30, tlv(0x17, b"200101000000Z") + tlv(0x17, b"400101000000Z"))
    tbs = tlv(
        0x30,
        tlv(0xA0, der_integer(2))
        + der_integer(serial)
        + ecdsa_sha256
        + name
        + validity
        + name
        + spki,
    )
    signature = key.sign(tbs, ec.ECDSA(hashes.SHA256()))
    return tlv(0x30, tbs + ecdsa_sha256 + tlv(0x03, b"\0" + signature))


def pem_text(der: bytes, label: str = "NEW CERTIFICATE REQUEST") -> bytes:
    """PEM text as one real board stores its PK inside an X.509 signature list."""
    body = base64.encodebytes(der).replace(b"\n", b"")
    lines = [body[i : i + 64] for i in range(0, len(body), 64)]
    return b"\r\n".join(
        [f"-----BEGIN {label}-----".encode(), *lines, f"-----END {label}-----".encode(), b""]
    )


def supermicro_variables() -> dict:
    """Shaped like the dump of the real Supermicro board: a PEM PK with a country "USA" and
    a negative serial, KEK with an unparseable entry among good ones, db with odd padding
    after one certificate and zero bytes after its last list."""
    own, kek_2011 = [
        e.cert.public_bytes(serialization.Encoding.DER)
        for e in efi.parse_signature_lists((REAL / "ovmf-ms-KEK.esl").read_bytes(), "KEK")
    ]
    garbage = b"\x30\x82\x01\x00" + b"\x5a" * (len(kek_2011) - 4)
    uefi_2011 = (REAL / "microsoft-uefi-ca-2011.der").read_bytes()
    return ms_variables(
        PK=esl(efi.CERT_X509, [pem_text(odd_cert("Supermicro PK"))], owner=efi.GLOBAL_GUID),
        KEK=cert_esl(x509.load_der_x509_certificate(own))
        + esl(efi.CERT_X509, [garbage, kek_2011]),
        db=esl(efi.CERT_X509, [uefi_2011 + b"\xff" * 12]) + b"\0" * 12,
    )


@pytest.mark.parametrize("quiet", [False, True])
def test_messy_firmware_gets_a_verdict_and_findings(tmp_path, capsys, quiet):
    efivars = write_efivars(tmp_path / "efivars", supermicro_variables())
    argv = ["--efivars", str(efivars), "--root", str(tmp_path)] + ["--quiet"] * quiet
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a library warning would be an exception here
        rc, out, err = run(capsys, *argv)
        assert rc == 1 and err == "" and "Verdict: action needed" in out
        rc, doc = run_json(capsys, *argv)
    report = doc["reports"][0]
    found = {(f["code"], f["subject"]): f for f in report["findings"]}
    # The verdict comes from what could be read: KEK and db lack the 2023 CAs.
    assert found[("kek-2023-missing", "KEK")]["severity"] == "action"
    assert found[("db-uefi-ca-2023-missing", "db")]["severity"] == "action"
    assert report["microsoft_cas"]["kek_ca_2011"]["in_kek"]
    assert report["microsoft_cas"]["uefi_ca_2011"]["in_db"]
    # Each oddity is a finding on its variable.
    assert "BEGIN NEW CERTIFICATE REQUEST" in found[("pem-entry", "PK")]["message"]
    assert found[("pk-unusable", "PK")]["severity"] == "warning"
    assert "Country names" in found[("x509-warning", "PK")]["message"] or "length" in (
        found[("x509-warning", "PK")]["message"]
    )
    assert (
        "list 2 at byte 1005: entry 1 is not a DER X.509"
        in found[("unreadable", "KEK")]["message"]
    )
    assert "12 bytes of other data" in found[("trailing-data", "db")]["message"]
    assert found[("padding", "db")]["severity"] == "info"
    # The PEM PK names the owner but is no usable certificate.
    assert report["pk_owner"] == "Supermicro PK"
    assert report["variables"]["PK"]["certificates"] == []
    assert any("PK is not a certificate the firmware can use" in s for s in report["next_steps"])
    assert [c["microsoft_ca"] for c in report["variables"]["KEK"]["certificates"]] == [
        None,
        "kek_ca_2011",
    ]


def test_pem_certificate_with_its_usual_header_and_a_broken_one(tmp_path):
    der = (REAL / "microsoft-uefi-ca-2023.der").read_bytes()
    entries, problems = efi.read_signature_lists(
        esl(efi.CERT_X509, [pem_text(der, "CERTIFICATE")])
        + esl(efi.CERT_X509, [pem_text(der)[:40] + b"!!!!" + pem_text(der)[44:]])
    )
    assert [e.usable for e in entries] == [False]
    assert checks.KNOWN_CAS[efi.fingerprint(entries[0].cert)][0] == "uefi_ca_2023"
    assert [p.code for p in problems] == ["pem-entry", "unreadable"]
    # A PEM copy of UEFI CA 2023 in db does not count: firmware cannot use it.
    efivars = write_efivars(
        tmp_path / "efivars",
        ms_variables(
            db=(REAL / "ovmf-ms-db.esl").read_bytes() + esl(efi.CERT_X509, [pem_text(der)])
        ),
    )
    report = checks.build_report(
        "efivars", str(efivars), efi.read_efivars(efivars), [], tmp_path, NOW
    )
    assert report["microsoft_cas"]["uefi_ca_2023"]["in_db"] is False
    assert {"pem-entry", "db-uefi-ca-2023-missing"} <= {f["code"] for f in report["findings"]}


@pytest.mark.parametrize(
    "shape,label",
    [
        ("crlf", "BEGIN NEW CERTIFICATE REQUEST"),
        ("lf", "BEGIN NEW CERTIFICATE REQUEST"),
        ("lower", "BEGIN x509 certificate"),
        ("late", "BEGIN NEW CERTIFICATE REQUEST"),
        ("nul", "BEGIN NEW CERTIFICATE REQUEST"),
        ("bare", "base64 text without a PEM header"),
        ("bare-crlf", "base64 text without a PEM header"),
    ],
)
def test_pk_as_text_in_every_shape_names_its_owner(tmp_path, capsys, shape, label):
    """PEM with CRLF or LF lines, a lower-case label, 'openssl x509 -text' output before
    it, NUL padding after it, or base64 without any header: a pem-entry finding, the owner
    named, the PK not usable."""
    der = odd_cert("Vendor PK", country="DE", serial=9)
    crlf = pem_text(der)
    lf = crlf.replace(b"\r\n", b"\n")
    blob = {
        "crlf": crlf,
        "lf": lf,
        "lower": lf.replace(b"NEW CERTIFICATE REQUEST", b"x509 certificate"),
        "late": b"Certificate:\n" + b"    Data: ...\n" * 30 + lf,
        "nul": lf + b"\0" * 7,
        "bare": base64.encodebytes(der),
        "bare-crlf": base64.encodebytes(der).replace(b"\n", b"\r\n") + b"\0\0",
    }[shape]
    pk = esl(efi.CERT_X509, [blob], owner=efi.GLOBAL_GUID)
    efivars = write_efivars(tmp_path / "efivars", ms_variables(PK=pk))
    rc, doc = run_json(capsys, "--efivars", str(efivars), "--root", str(tmp_path))
    report = doc["reports"][0]
    found = {(f["code"], f["subject"]): f for f in report["findings"]}
    assert rc == 1 and report["pk_owner"] == "Vendor PK"
    assert label in found[("pem-entry", "PK")]["message"]
    assert ("pk-unusable", "PK") in found and ("unreadable", "PK") not in found


@pytest.mark.parametrize(
    "name,data,message",
    [
        ("KEK", b"\x27garbage", "KEK: signature list 1 at byte 0: truncated header"),
        (
            "db",
            esl(efi.CERT_X509, [b"\x30\x03abc"])[:24] + struct.pack("<I", 100) + b"x" * 60,
            "db: signature list 1 at byte 0: list size 49 is not a whole number of 100-byte",
        ),
        (
            "db",
            guid("01234567-89ab-cdef-0123-456789abcdef")
            + struct.pack("<III", 60, 0, 32)
            + b"x" * 32,
            "unknown signature type",
        ),
    ],
)
def test_kek_or_db_unreadable_at_all_is_an_error(tmp_path, capsys, name, data, message):
    efivars = write_efivars(tmp_path / "efivars", ms_variables(**{name: data}))
    rc, out, err = run(capsys, "--efivars", str(efivars), "--root", str(tmp_path))
    assert rc == 2 and out == "" and err.count("\n") == 1 and message in err


def test_db_of_undecodable_entries_beside_a_readable_kek_is_a_report(tmp_path, capsys):
    """A sound list whose every entry cannot be decoded has been read: none of its entries
    is one of Microsoft's CAs (they decode, and are known by fingerprint).  Only when KEK
    and db together yield no certificate is there nothing to judge."""
    garbage = esl(efi.CERT_X509, [b"\x30\x03abc"]) + esl(efi.CERT_X509, [b"\x30\x82" + b"z" * 90])
    efivars = write_efivars(tmp_path / "efivars", ms_variables(db=garbage))
    rc, doc = run_json(capsys, "--efivars", str(efivars), "--root", str(tmp_path))
    found = {(f["code"], f["subject"]): f for f in doc["reports"][0]["findings"]}
    assert rc == 1 and found[("db-uefi-ca-2023-missing", "db")]["severity"] == "action"
    assert "list 2 at byte 49: entry 1 is not a DER" in found[("unreadable", "db")]["message"]
    efivars = write_efivars(tmp_path / "both", ms_variables(db=garbage, KEK=garbage))
    rc, out, err = run(capsys, "--efivars", str(efivars), "--root", str(tmp_path))
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert "KEK and db hold no certificate that can be read; KEK: signature list 1" in err


def test_error_naming_a_pem_certificate_stays_one_line(tmp_path, capsys):
    """KEK of PEM text only, db undecodable: the error names the PEM certificate, whose
    name must not forge lines or colours on stderr."""
    cert, _ = make_cert("Evil\nVerdict: ok\x1b[31m")
    pem = pem_text(cert.public_bytes(serialization.Encoding.DER))
    variables = ms_variables(
        KEK=esl(efi.CERT_X509, [pem]), db=esl(efi.CERT_X509, [b"\x30\x03abc"])
    )
    efivars = write_efivars(tmp_path / "efivars", variables)
    rc, out, err = run(capsys, "--efivars", str(efivars), "--root", str(tmp_path))
    assert rc == 2 and out == "" and err.count("\n") == 1 and "\x1b" not in err
    assert "'Evil\\nVerdict: ok\\x1b[31m' from it" in err


@pytest.mark.parametrize("tail", [b"\0" * 10, b"\xff" * 3, b"junk"])
def test_list_size_beyond_whole_signatures_is_read_as_edk2_does(tmp_path, capsys, tail):
    """edk2 reads (SignatureListSize - 28) / SignatureSize entries: padding inside a list
    after its last signature (or a SignatureSize that lies) loses no certificate."""
    one = cert_esl(real_cert("microsoft-uefi-ca-2023.der"))
    padded = one[:16] + struct.pack("<I", len(one) + len(tail)) + one[20:] + tail
    entries, problems = efi.read_signature_lists(padded)
    assert [checks.KNOWN_CAS[efi.fingerprint(e.cert)][0] for e in entries] == ["uefi_ca_2023"]
    code = "trailing-data" if tail == b"junk" else "padding"
    assert [(p.code, p.severity) for p in problems] == [(code, "info")]
    assert f"{len(tail)} bytes of" in problems[0].message
    with pytest.raises(Error, match="is not a whole number of"):
        efi.parse_signature_lists(padded, "db")
    db = (REAL / "ovmf-ms-db.esl").read_bytes() + padded
    efivars = write_efivars(tmp_path / "efivars", ms_variables(db=db))
    rc, doc = run_json(capsys, "--efivars", str(efivars), "--root", str(tmp_path))
    assert doc["reports"][0]["microsoft_cas"]["uefi_ca_2023"]["in_db"] is True


def test_unreadable_pk_and_dbx_are_findings(tmp_path, capsys):
    efivars = write_efivars(
        tmp_path / "efivars", ms_variables(PK=b"\x01\x02\x03", dbx=b"\x00" * 40 + b"\x11")
    )
    rc, doc = run_json(capsys, "--efivars", str(efivars), "--root", str(tmp_path))
    codes = {(f["code"], f["subject"]) for f in doc["reports"][0]["findings"]}
    assert rc == 1
    assert {("unreadable", "PK"), ("pk-unusable", "PK"), ("unreadable", "dbx")} <= codes
    assert doc["reports"][0]["pk_owner"] is None


def test_empty_and_padding_only_variables_are_not_errors(tmp_path, capsys):
    efivars = write_efivars(tmp_path / "efivars", ms_variables(dbx=b"\0" * 12))
    rc, doc = run_json(capsys, "--efivars", str(efivars), "--root", str(tmp_path))
    assert rc == 1
    assert ("padding", "dbx") in {(f["code"], f["subject"]) for f in doc["reports"][0]["findings"]}


def test_library_warnings_never_reach_stderr(tmp_path, capsys, caplog):
    """Country "USA" and a negative serial in db (DER): findings and debug lines only."""
    caplog.set_level(logging.DEBUG, logger="debadmin")
    odd = odd_cert("Vendor db key")
    db = (REAL / "ovmf-ms-db.esl").read_bytes() + esl(efi.CERT_X509, [odd])
    efivars = write_efivars(tmp_path / "efivars", ms_variables(db=db))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for argv in ([], ["-q"], ["-v"]):
            rc, out, err = run(capsys, "--efivars", str(efivars), "--root", str(tmp_path), *argv)
            assert rc == 1 and "warn" not in err.lower().replace("warning from a library", "")
            assert "UserWarning" not in err and "Deprecation" not in err
            if argv != ["-v"]:
                assert err == ""
        rc, doc = run_json(capsys, "--efivars", str(efivars), "--root", str(tmp_path))
    messages = [f["message"] for f in doc["reports"][0]["findings"] if f["code"] == "x509-warning"]
    assert any("negative serial" in m for m in messages)
    assert all("'Vendor db key'" in m for m in messages) and len(messages) == 2
    assert doc["reports"][0]["variables"]["db"]["certificates"][-1]["serial"] == "-5"
    # An error on the same input stays one line.
    shim = tmp_path / "shim.efi"
    shim.write_bytes(b"ZM" + b"\0" * 100)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rc, out, err = run(
            capsys, "--efivars", str(efivars), "--root", str(tmp_path), "--shim", str(shim)
        )
    assert rc == 2 and out == "" and err.count("\n") == 1 and "no MZ header" in err


@pytest.mark.parametrize("revoke", ["hash", "certificate"])
def test_dbx_refusal_names_the_revocation(tmp_path, revoke):
    """db holds the CA the shim chains to (and the 2011 and 2023 Microsoft CAs): the step
    is about the revocation, not about waiting for a CA in db."""
    ca, signer = owner_pki()
    image = signed_pe(signer)
    shim = tmp_path / "shim.efi"
    shim.write_bytes(image)
    db = (
        (REAL / "ovmf-ms-db.esl").read_bytes()
        + cert_esl(real_cert("microsoft-uefi-ca-2023.der"))
        + cert_esl(ca)
    )
    dbx = (
        esl(SHA256_TYPE, [bytes.fromhex(efi.parse_pe(image, "x").sha256)])
        if revoke == "hash"
        else cert_esl(ca)
    )
    efivars = write_efivars(tmp_path / "efivars", ms_variables(db=db, dbx=dbx))
    report = checks.build_report(
        "efivars", str(efivars), efi.read_efivars(efivars), [shim], tmp_path, NOW
    )
    refused = [f for f in report["findings"] if f["code"] == "shim-not-accepted"]
    assert refused and refused[0]["severity"] == "action"
    named = "its Authenticode hash" if revoke == "hash" else "Owner CA"
    assert refused[0]["revoked_by"] == named
    steps = [s for s in report["next_steps"] if str(shim) in s]
    assert steps and f"dbx revokes {named}" in steps[0]
    assert not any("before db holds a CA" in s for s in report["next_steps"])
    # Not revoked, only unknown to db: the old advice stands.
    efivars = write_efivars(tmp_path / "efivars2", ms_variables())
    report = checks.build_report(
        "efivars", str(efivars), efi.read_efivars(efivars), [shim], tmp_path, NOW
    )
    assert any("before db holds a CA" in s for s in report["next_steps"])


@pytest.mark.parametrize(
    "value,status,verdict",
    [(b"\x00", 3, "not-applicable"), (b"\x01", 1, "action-needed"), (None, 1, "action-needed")],
)
def test_secure_boot_enable_in_a_varstore(tmp_path, capsys, value, status, verdict):
    """edk2's AuthVariableLib: with a PK, SecureBoot follows SecureBootEnable (created as 1
    when absent); 0, switched off in the firmware setup, does not enforce."""
    order = [(n, (REAL / f"ovmf-ms-{n}.esl").read_bytes()) for n in ("db", "dbx", "KEK", "PK")]
    if value is not None:
        order.append(("SecureBootEnable", value, efi.VAR_ADDED, 0x03))
    path = tmp_path / "VARS.fd"
    path.write_bytes(make_varstore(order))
    rc, doc = run_json(capsys, "--varstore", str(path))
    report = doc["reports"][0]
    assert rc == status and report["verdict"] == verdict
    assert report["secure_boot"] is (value != b"\x00") and report["setup_mode"] is False
    disabled = [f for f in report["findings"] if f["code"] == "secure-boot-disabled"]
    assert bool(disabled) is (value == b"\x00")
    if disabled:
        assert disabled[0]["subject"] == "SecureBootEnable"


@pytest.mark.parametrize(
    "cn",
    [
        "Micr\u043esoft UEFI CA 2023",  # Cyrillic o
        "Microsoft UEFI \u0421\u0410 2023",  # Cyrillic CA
        "Microsoft Corporation \u039a\u0395\u039a 2K CA 2023",  # Greek KEK
        "M\u0456crosoft Option ROM UEFI CA 2023",  # Ukrainian i
        "Micr\u00f6soft UEFI CA 2O23",  # an accent, a letter O for the zero
        "Windows UEFI CA 2\u200b023",  # a zero-width space
        "\uff2d\uff49\uff43\uff52\uff4f\uff53\uff4f\uff46\uff54 UEFI CA 2023",  # fullwidth
        "Micr\u03bfsoft UEFI CA 2023",  # Greek omicron
        "Micro\u200dsoft UEFI CA 2023 ",  # a zero-width joiner, a trailing space
        "Microsoft\u00a0Option ROM UEFI CA 2023\u00ad",  # no-break space, soft hyphen
        "Micr\u0585soft UEFI CA 2023",  # Armenian oh
        "\u13b7icrosoft UEFI CA 2023",  # Cherokee M
        "\ua4dficrosoft UEFI CA 2023",  # Lisu M
        "\u1d0dicrosoft Corporation KEK 2K CA 2023",  # Latin small capital M
        "Microsoft UEFI C\u0251 2023",  # Latin alpha
        "rnicrosoft UEFI CA 2023",  # r n for m
        "\U0001d40cicrosoft UEFI CA 2023",  # mathematical bold M
    ],
)
def test_confusable_copies_of_2023_names_are_lookalikes(tmp_path, capsys, cn):
    fake, _ = make_cert(cn, org="Microsoft Corporation")
    assert checks.describe_cert(fake, NOW, checks.KNOWN_CAS)["lookalike"]
    db = (REAL / "ovmf-ms-db.esl").read_bytes() + cert_esl(fake)
    efivars = write_efivars(tmp_path / "efivars", ms_variables(db=db))
    rc, doc = run_json(capsys, "--efivars", str(efivars), "--root", str(tmp_path))
    flagged = [f for f in doc["reports"][0]["findings"] if f["code"] == "lookalike"]
    assert rc == 1 and flagged and flagged[0]["subject"] == "db" and flagged[0]["name"] == cn


@pytest.mark.parametrize(
    "cn",
    [
        "\u041a\u043e\u0440\u043f\u043e\u0440\u0430\u0446\u0438\u044f PK",
        "Microsoft UEFI CA 2024",
        # Microsoft's own names that are not the seven CAs (their issuers, platform keys).
        "Microsoft Corporation Third Party Marketplace Root",
        "Microsoft RSA Devices Root CA 2021",
        "Microsoft Root Certificate Authority 2010",
        "Microsoft Hyper-V Firmware PK",
        "Microsoft Windows PCA 2010",
        "Microsoft Corporation KEK CA 2023",
        "Microsoft Windows Production PCA 2023",
        "Microsoft UEFI CA 2023 Test",
    ],
)
def test_other_names_are_not_lookalikes(cn):
    cert, _ = make_cert(cn)
    assert not checks.describe_cert(cert, NOW, checks.KNOWN_CAS)["lookalike"]


# --- crafted large inputs (timings: bench/secureboot-ca-check) ----------------------------------


def test_oversized_variable_in_a_varstore_is_refused(tmp_path, capsys, monkeypatch):
    """A variable larger than any firmware writes (a crafted 63 MiB dbx) is refused before
    it is copied or parsed, as in efivarfs."""
    monkeypatch.setattr(efi, "MAX_VARIABLE", 4096)
    path = tmp_path / "VARS.fd"
    big = esl(SHA256_TYPE, [bytes([n % 256]) * 32 for n in range(100)])
    path.write_bytes(make_varstore([("PK", (REAL / "ovmf-ms-PK.esl").read_bytes()), ("dbx", big)]))
    rc, out, err = run(capsys, "--varstore", str(path))
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert f"dbx is {len(big)} bytes, larger than any firmware variable (4096 bytes)" in err
    # A stale copy that large is passed over, as the firmware passes it over.
    pk = ("PK", (REAL / "ovmf-ms-PK.esl").read_bytes())
    path.write_bytes(make_varstore([pk, ("dbx", big, 0x3C), ("dbx", b"")]))
    assert efi.read_varstore(path)["dbx"].data == b""


def test_many_small_variables_are_walked(tmp_path):
    tiny = [(f"v{n}", b"") for n in range(2000)]
    pk = ("PK", (REAL / "ovmf-ms-PK.esl").read_bytes())
    path = tmp_path / "VARS.fd"
    path.write_bytes(make_varstore(tiny + [pk, ("db", b"\x01")], size=0x84000))
    variables = efi.read_varstore(path)
    assert sorted(variables) == ["PK", "db"] and variables["db"].data == b"\x01"


def test_repeated_signatures_are_decoded_once(tmp_path, monkeypatch):
    ca, signer = owner_pki()
    image = signed_pe(signer)
    pe = efi.parse_pe(image, "x")
    table = image[len(minimal_pe()) :]
    repeated = minimal_pe(table * 50)
    parsed = efi.parse_pe(repeated, "x")
    assert len(parsed.signatures) == 50
    assert len({id(s.certs) for s in parsed.signatures}) == 1
    shim, _ = shim_report(tmp_path, repeated, db=cert_esl(ca))
    assert shim["accepted"] and len(shim["signatures"]) == 50
    assert [s["index"] for s in shim["signatures"]] == list(range(1, 51))
    assert shim["signatures"][49]["chains_to_db"] == ["Owner CA"]
    assert pe.signatures[0].digest_algorithm == parsed.signatures[0].digest_algorithm
    # Different signatures beyond the limit: refused before each is decoded and checked.
    other = signed_pe(owner_pki("Other")[1])[len(minimal_pe()) :]
    monkeypatch.setattr(efi, "MAX_SIGNATURES", 1)
    efi.parse_pe(minimal_pe(table * 3), "x")
    with pytest.raises(Error, match="more than 1 different signatures, not a boot loader"):
        efi.parse_pe(minimal_pe(table + other), "x")


def test_large_db_and_dbx_are_indexed_not_scanned(tmp_path):
    """The shim's chain found among hundreds of db certificates, and its revocation among
    hundreds of dbx certificates and x509_sha256 hashes, in db's order."""
    ca, signer = owner_pki()
    image = signed_pe(signer)
    crowd = [make_cert(f"Crowd {n}")[0] for n in range(300)]
    tbs = [esl(X509_SHA256_TYPE, [bytes([n]) * 32 + b"\0" * 16]) for n in range(200)]
    db = cert_esl(*crowd[:150], ca, *crowd[150:])
    shim, _ = shim_report(tmp_path, image, db=db, dbx=cert_esl(*crowd) + b"".join(tbs))
    assert shim["accepted"] and shim["signatures"][0]["chains_to_db"] == ["Owner CA"]
    real_tbs = hashlib.sha256(ca.tbs_certificate_bytes).digest()
    dbx = cert_esl(*crowd) + b"".join(tbs) + esl(X509_SHA256_TYPE, [real_tbs + b"\0" * 16])
    shim, _ = shim_report(tmp_path, image, "revoked.efi", db=db, dbx=dbx)
    assert not shim["accepted"] and shim["signatures"][0]["revoked_by_dbx"] == ["Owner CA"]


# --- hosts without UEFI (issue 11) ---------------------------------------------------------------


@pytest.mark.parametrize("quiet", [[], ["--quiet"]])
def test_no_uefi_is_an_info_line_not_an_error(tmp_path, capsys, quiet):
    """On a BIOS host the verdict (exit 3) is one line, never 'error:'; with --quiet (the
    weekly service) nothing: the exit status and the metric say it."""
    rc, out, err = run(capsys, "--root", str(tmp_path), *quiet)
    assert rc == 3 and out == ""
    if quiet:  # quiet on exit 3: the status (and the metric) say it (issue 26)
        assert err == ""
        return
    assert err == (
        f"secureboot-ca-check: {tmp_path / checks.EFIVARS} does not exist: this system did not "
        "boot with UEFI (or efivarfs is not mounted)\n"
    )
    assert "error" not in err


def test_no_uefi_json_is_a_document(tmp_path, capsys):
    textfile = tmp_path / "textfile"
    textfile.mkdir()
    rc, out, err = run(capsys, "--json", "--root", str(tmp_path), "--textfile-dir", str(textfile))
    doc = json.loads(out)
    assert rc == doc["exit_status"] == 3 and err == ""
    assert doc["applicable"] is False and "did not boot with UEFI" in doc["reason"]
    assert doc["reports"] == []
    assert doc["findings"] == [
        {"code": "no-uefi", "severity": "info", "subject": None, "message": doc["reason"]}
    ]
    assert "secureboot_ca_check_status 3\n" in (textfile / checks.TEXTFILE_NAME).read_text()


def test_garbage_db_names_the_unknown_type_first(tmp_path, capsys):
    """As debian/tests/secureboot-ca-check checks: text where a signature list should be
    is an unknown type first, whatever its size field says."""
    efivars = write_efivars(
        tmp_path / "efivars", ms_variables(db=b"garbage-that-is-no-signature-list")
    )
    rc, out, err = run(capsys, "--efivars", str(efivars), "--root", str(tmp_path))
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert "db: signature list 1 at byte 0: unknown signature type" in err


def test_fuzz_messy_variables_through_the_report(tmp_path):
    """Mutated messy variables (PEM PK, a broken entry among good ones, padding) as PK, KEK,
    db and dbx: a report or one clean Error, never another exception or a stray warning."""
    rng = random.Random(1313)
    messy = supermicro_variables()
    base = {name: messy[name] for name in ("SecureBoot", "SetupMode", "PK", "KEK", "db", "dbx")}
    for number, name in enumerate(["PK", "KEK", "db", "dbx"] * 40):
        data = next(mutations(messy[name], rng, 1))
        variables = {
            n: efi.Variable(n, efi.VARIABLES[n], 0x27 if n in efi.AUTHENTICATED else 0x06, d)
            for n, d in {**base, name: data}.items()
        }
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            try:
                report = checks.build_report(
                    "efivars", f"fuzz{number}", variables, [], tmp_path, NOW
                )
            except Error as exc:
                assert "\n" not in str(exc) and name in ("KEK", "db")
                continue
        json.dumps(report)
        assert report["verdict"] in ("ok", "action-needed", "not-applicable")


# --- the man page's JSON section against a real run ----------------------------------------------

MAN_PAGE = Path(__file__).resolve().parents[2] / "man" / "secureboot-ca-check.8"
# Outside the source tree (test-real-inputs runs a copy against the installed package):
# the installed page.
INSTALLED_MAN_PAGE = Path("/usr/share/man/man8/secureboot-ca-check.8.gz")


def man_json_words() -> set:
    """Every bold word of the man page's 'JSON fields' section (keys, codes, values)."""
    if MAN_PAGE.is_file():
        text = MAN_PAGE.read_text()
    else:
        text = gzip.decompress(INSTALLED_MAN_PAGE.read_bytes()).decode()
    section = text[text.index(".SS JSON fields") : text.index(".SH EXIT STATUS")]
    words = set()
    for line in section.splitlines():
        macro, _, rest = line.partition(" ")
        rest = rest.replace("\\-", "-").replace("\\(dq", "'")
        args = [a.replace('"', "") for a in re.findall(r'"[^"]*"|\S+', rest)]
        bold = {".B": args, ".BR": args[0::2], ".RB": args[1::2], ".BI": args[0::2]}
        for arg in bold.get(macro, []):
            words.update(re.findall(r"[A-Za-z0-9_][A-Za-z0-9_-]*", arg))
    return words


def json_keys(value) -> set:
    if isinstance(value, dict):
        return set(value).union(*(json_keys(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(json_keys(v) for v in value))
    return set()


def test_man_page_json_section_matches_a_real_run(tmp_path, capsys):
    """Every key of real --json output (messy firmware, a shim, a look-alike, a test key,
    no UEFI) and every finding code is documented; every documented snake_case key exists."""
    ca, signer = owner_pki()
    shim = tmp_path / "shim.efi"
    shim.write_bytes(signed_pe(signer))
    fake, _ = make_cert("Micr\u043esoft UEFI CA 2023", org="Microsoft Corporation")
    snakeoil, _ = make_cert("Debian OVMF Secure Boot Enrollment Key snakeoil")
    variables = supermicro_variables()
    variables["db"] = cert_esl(fake, ca, snakeoil) + variables["db"]
    variables["dbx"] = esl(SHA256_TYPE, [bytes.fromhex(efi.read_pe(shim).sha256)])
    variables["KEKDefault"] = (REAL / "ovmf-ms-KEK.esl").read_bytes()
    variables["dbDefault"] = (REAL / "ovmf-ms-db.esl").read_bytes()
    efivars = write_efivars(tmp_path / "efivars", variables)
    rc, doc = run_json(
        capsys, "--efivars", str(efivars), "--root", str(tmp_path), "--shim", str(shim)
    )
    assert rc == 1 and doc["reports"][0]["shims"][0]["signatures"]
    (tmp_path / "empty").mkdir()
    rc, no_uefi = run_json(capsys, "--root", str(tmp_path / "empty"))
    # And --fix on firmware, planned from the same dump with the shipped objects.
    rc, fixdoc = run_json(
        capsys, "--efivars", str(efivars), "--fix", "--dry-run", "--payloads", str(PAYLOADS)
    )
    assert rc in (0, 1) and "fix" in fixdoc
    fixdoc["fix"]["measured_boot"] = [{"kind": "bitlocker", "device": "/dev/x", "detail": "x"}]
    documented = man_json_words()
    keys = json_keys(doc) | json_keys(no_uefi) | json_keys(fixdoc)
    codes = {f["code"] for d in (doc, no_uefi) for f in d["findings"]}
    assert {"pem-entry", "unreadable", "lookalike", "test-key", "shim-not-accepted"} <= codes
    assert keys - documented == set()
    assert codes - documented == set()
    snake = {w for w in documented if re.fullmatch(r"[a-z0-9]+(_[a-z0-9]+)+", w)}
    values = set(doc["reports"][0]["microsoft_cas"]) | {k for k, _ in efi.SIGNATURE_TYPES.values()}
    # Keys of --fix and --libvirt output, which test_secureboot_ca_check_fix checks.
    fix_keys = {
        "recovery_keys_confirmed",
        "dry_run",
        "saved_state",
        "nvram_exists",
        "template_from",
        "created_from",
    }
    assert snake - keys - values - fix_keys == set()


@pytest.mark.parametrize(
    "value,attributes,status",
    [
        (b"\x01", 0x01, 1),  # NV only: still the switch edk2 reads
        (b"\x00", 0x02, 3),
        (b"\x00", 0x0B, 3),  # odd bits: not a reason to refuse the whole check
        (b"\x01\x00", 0x03, 1),  # edk2 reads the first byte
        (b"\x00\x01", 0x03, 3),
        (b"\x02", 0x03, 3),  # only 1 enables
        (b"", 0x03, 3),
    ],
)
def test_odd_secure_boot_enable_is_read_as_edk2_reads_it(
    tmp_path, capsys, value, attributes, status
):
    order = [(n, (REAL / f"ovmf-ms-{n}.esl").read_bytes()) for n in ("db", "dbx", "KEK", "PK")]
    path = tmp_path / "VARS.fd"
    path.write_bytes(make_varstore(order + [("SecureBootEnable", value, 0x3F, attributes)]))
    rc, doc = run_json(capsys, "--varstore", str(path))
    assert rc == status
    disabled = [f for f in doc["reports"][0]["findings"] if f["code"] == "secure-boot-disabled"]
    assert bool(disabled) is (status == 3)
    if value == b"":
        assert disabled[0]["message"].startswith("SecureBootEnable is empty:")
    # Not read from efivarfs (it has no runtime access), so never a reason for an error.
    efivars = write_efivars(
        tmp_path / "efivars", ms_variables(SecureBootEnable=value), {"SecureBootEnable": 0x01}
    )
    rc, out, err = run(capsys, "--efivars", str(efivars), "--root", str(tmp_path))
    assert rc == 1 and err == ""


def test_next_steps_come_from_findings_alone():
    """No report, no variables: the advice is made from findings (issue 17 item 4)."""
    from debadmin.findings import finding
    from debadmin.secureboot_ca_check import rules

    found = [
        finding("kek-2023-missing", "action", "KEK lacks it", "KEK"),
        finding("db-uefi-ca-2023-missing", "action", "db lacks it", "db"),
        finding("fwupd-too-old", "info", "old", "fwupd", version="1.8.12-2", minimum="2.0.20"),
        finding("db-update-signable", "info", "KEK CA 2011 signs it", "KEK"),
        finding("shim-not-accepted", "action", "refused", "/x/shim.efi", revoked_by="Old CA"),
    ]
    steps = rules.next_steps(found, "varstore")
    # Not rebooting into a refused shim cannot wait: first, before the update steps.
    assert steps[0].startswith("Do not reboot into /x/shim.efi")
    assert steps[1].startswith("For this virtual machine:")
    assert "--varstore FILE --fix" in steps[1]
    # A VM's NVRAM is fixed offline: fwupd inside the VM cannot update KEK.
    assert not any("fwupd" in s for s in steps)
    steps = rules.next_steps(found, "efivars")
    assert "Upgrade fwupd (1.8.12-2) to 2.0.20 or later: apt install fwupd" in steps
    assert any("signed with KEK CA 2011, which this machine has" in s for s in steps)
    assert any(s.startswith("Do not reboot into /x/shim.efi: dbx revokes Old CA") for s in steps)
    plain = rules.next_steps(
        found[:2] + [finding("fwupd-missing", "info", "-", "fwupd", minimum="2.0.20")], "efivars"
    )
    assert "Install fwupd 2.0.20 or later: apt install fwupd" in plain
    assert not any("KEK CA 2011" in s or "virtual machine" in s for s in plain)
    assert rules.next_steps([], "efivars") == []


def test_update_means_are_findings_only_when_an_update_is_due(tmp_path):
    report = checks.build_report(
        "efivars",
        "x",
        {
            n: efi.Variable(n, efi.VARIABLES[n], 0x27 if n in efi.AUTHENTICATED else 0x06, d)
            for n, d in ms_variables().items()
        },
        [],
        tmp_path,
        NOW,
    )
    codes = {f["code"] for f in report["findings"]}
    assert {"fwupd-missing", "db-update-signable"} <= codes
    kek = (REAL / "ovmf-ms-KEK.esl").read_bytes()
    db = (REAL / "ovmf-ms-db.esl").read_bytes() + cert_esl(real_cert("microsoft-uefi-ca-2023.der"))
    fake_kek_2023, _ = make_cert("Stand-in KEK 2023")
    known = {
        **checks.KNOWN_CAS,
        efi.fingerprint(fake_kek_2023): ("kek_2k_ca_2023", "Stand-in", "KEK"),
    }
    variables = ms_variables(KEK=kek + cert_esl(fake_kek_2023), db=db)
    report = checks.build_report(
        "efivars",
        "x",
        {
            n: efi.Variable(n, efi.VARIABLES[n], 0x27 if n in efi.AUTHENTICATED else 0x06, d)
            for n, d in variables.items()
        },
        [],
        tmp_path,
        NOW,
        known,
    )
    assert report["verdict"] == "ok"
    assert not {"fwupd-missing", "db-update-signable"} & {f["code"] for f in report["findings"]}


@pytest.mark.parametrize("cn", ["L" * 70, ""])
def test_names_only_newer_cryptography_warns_about(tmp_path, capsys, cn):
    """cryptography 43 (trixie) warns about a common name longer than 64 characters or
    empty, 38 (bookworm) does not: an x509-warning finding where the library warns,
    nothing on stderr on either, the same verdict."""
    import cryptography

    db = (REAL / "ovmf-ms-db.esl").read_bytes() + esl(
        efi.CERT_X509, [odd_cert(cn, country="DE", serial=5)]
    )
    efivars = write_efivars(tmp_path / "efivars", ms_variables(db=db))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rc, out, err = run(capsys, "--efivars", str(efivars), "--root", str(tmp_path))
        assert rc == 1 and err == ""
        rc, doc = run_json(capsys, "--efivars", str(efivars), "--root", str(tmp_path))
    report = doc["reports"][0]
    warned = [f for f in report["findings"] if f["code"] == "x509-warning"]
    newer = int(cryptography.__version__.split(".")[0]) >= 42
    assert bool(warned) is newer and rc == 1
    assert all("Attribute's length must be >= 1 and <= 64" in f["message"] for f in warned)
    assert report["variables"]["db"]["certificates"][-1]["subject_cn"] == cn


def test_thousands_of_unreadable_entries_are_counted_not_listed(tmp_path, capsys):
    """A crafted db of 1-byte 'certificates' (60,000 in 1 MiB) made one finding each: 120 MB
    of JSON, 800 MB and 6 s. The first few of a kind are listed, the rest counted."""
    tiny = esl(efi.CERT_X509, [b"\x30"] * 3000)
    entries, problems = efi.read_signature_lists(tiny)
    assert entries == [] and len(problems) == efi.MAX_PROBLEMS + 1
    assert (
        problems[-1].message
        == f"{3000 - efi.MAX_PROBLEMS} more like the above (unreadable), not listed"
    )
    with pytest.raises(Error, match="entry 1 is not a DER X.509"):
        efi.parse_signature_lists(tiny, "db")
    efivars = write_efivars(tmp_path / "efivars", ms_variables(dbx=tiny, dbDefault=tiny))
    rc, doc = run_json(capsys, "--efivars", str(efivars), "--root", str(tmp_path))
    unreadable = [f for f in doc["findings"] if f["code"] == "unreadable"]
    assert rc == 1 and len(unreadable) == 2 * (efi.MAX_PROBLEMS + 1)


@pytest.mark.parametrize(
    "value",
    [
        {},
        [],
        {"a": [], "b": {}, "c": [1, "x", None], "d": [{"e": True}], "f": {"g": [[]]}},
        [[1], {"k": "\u00e9\u043e"}, "s"],
        "plain",
        None,
    ],
)
def test_json_text_is_the_same_document_as_json_dumps(value):
    text = sbc.json_text(value)
    assert json.loads(text) == value
    if isinstance(value, (dict, list)) and value:
        assert text.splitlines()[0] in ("{", "[")


def test_json_text_of_a_real_report_one_certificate_a_line(tmp_path, capsys):
    efivars = write_efivars(tmp_path / "efivars", supermicro_variables())
    rc, doc = run_json(capsys, "--efivars", str(efivars), "--root", str(tmp_path))
    text = sbc.json_text(doc)
    assert json.loads(text) == doc
    assert text == sbc.json_text(json.loads(json.dumps(doc, indent=2)))
    lines = text.splitlines()
    cert = doc["reports"][0]["variables"]["KEK"]["certificates"][0]
    assert any(line.strip().startswith('{"subject": ') for line in lines), cert


# --- edges (issue 26): dumps that are not dumps, --quiet on exit 3, next steps -------------


def test_efivars_dir_that_is_no_dump_is_an_error(tmp_path, capsys):
    """An empty directory, or one of files without the NAME-GUID form, would read as a
    firmware without keys: refused, one line, no report."""
    empty = tmp_path / "empty"
    empty.mkdir()
    other = tmp_path / "other"
    other.mkdir()
    (other / "PK").write_bytes(b"\x27\0\0\0" + (REAL / "ovmf-ms-PK.esl").read_bytes())
    (other / "notes.txt").write_text("hello")
    (other / f"db-{efi.IMAGE_SECURITY_GUID}").mkdir()  # a directory is no variable
    for directory in (empty, other):
        for extra in ([], ["--json"], ["--quiet"], ["--fix", "--dry-run"]):
            rc, out, err = run(capsys, "--efivars", str(directory), *extra)
            assert rc == 2 and err.count("\n") == 1, (directory, extra)
            assert "not an efivarfs dump" in err and "error:" in err
            # With --json the one object says it (issue 34 item 3); else stdout is empty.
            if "--json" in extra:
                assert json.loads(out) == {
                    "error": err.split("error: ", 1)[1][:-1],
                    "exit_status": 2,
                }
            else:
                assert out == ""
    # One variable in the form is enough: a firmware without Secure Boot keys is a report.
    (other / f"db-{efi.IMAGE_SECURITY_GUID}").rmdir()
    write_efivars(other, {"SecureBoot": b"\0"})
    rc, out, err = run(capsys, "--efivars", str(other))
    assert rc == 3 and "Verdict: not applicable" in out and err == ""


def test_quiet_prints_nothing_on_exit_3(tmp_path, capsys):
    off = write_efivars(tmp_path / "off", ms_variables(SecureBoot=b"\0"))
    rc, out, err = run(capsys, "--efivars", str(off), "--quiet")
    assert (rc, out, err) == (3, "", "")
    rc, out, err = run(capsys, "--efivars", str(off))
    assert rc == 3 and "Verdict: not applicable" in out
    # Beside a source that needs action, only that one is shown.
    store = tmp_path / "VARS.fd"
    store.write_bytes(make_varstore(list(ms_variables().items())))
    rc, out, err = run(capsys, "--efivars", str(off), "--varstore", str(store), "--quiet")
    assert rc == 1 and err == "" and f"== {off}" not in out and f"== {store}" in out
    # Errors still reach stderr with --quiet.
    rc, out, err = run(capsys, "--efivars", str(tmp_path / "missing"), "--quiet")
    assert rc == 2 and "error:" in err


def test_pk_unusable_is_never_sent_to_fwupd_for_a_kek_update(tmp_path, capsys):
    """The Supermicro-shaped dump (PEM text as its PK): one route for KEK, the maker's
    firmware; fwupd only for the db update its KEK CA 2011 signs."""
    efivars = write_efivars(tmp_path / "efivars", supermicro_variables())
    rc, doc = run_json(capsys, "--efivars", str(efivars), "--root", str(tmp_path))
    steps = doc["reports"][0]["next_steps"]
    assert rc == 1
    assert not any("UEFI Key Exchange Key" in s for s in steps), steps
    assert any("no signed KEK update can apply" in s for s in steps)
    fwupd = [s for s in steps if "fwupdmgr" in s]
    assert len(fwupd) <= 1 and all("'UEFI Signature Database'" in s for s in fwupd)


KEK_CODES = ("kek-update-published", "kek-update-unpublished", None)
DB_CODES = ("db-update-signable", "db-update-unsignable", None)
FWUPD_CODES = ("fwupd-missing", "fwupd-too-old", None)


def step_findings(flags: dict) -> list:
    from debadmin.findings import finding

    found = []
    for code in ("kek-2023-missing", "db-uefi-ca-2023-missing"):
        if flags[code]:
            found.append(finding(code, "action", code, code.split("-")[0]))
    for code in ("pk-unusable", "offline-fix-available"):
        if flags[code]:
            found.append(finding(code, "info", code, None, adds=["uefi_ca_2023"]))
    if flags["db"]:
        found.append(finding(flags["db"], "info", "-", "KEK"))
    if flags["kek"]:
        found.append(finding(flags["kek"], "info", "-", "PK"))
    if flags["fwupd"]:
        found.append(
            finding(flags["fwupd"], "info", "-", "fwupd", version="1.8.12", minimum="2.0.20")
        )
    if flags["defaults"]:
        found.append(finding("defaults-lack-2023", "warning", "-", "KEKDefault"))
    return found


def step_flag_combinations():
    """Every combination of the findings the advice reads where something needs action."""
    from itertools import product

    names = ("kek-2023-missing", "db-uefi-ca-2023-missing", "pk-unusable")
    names += ("offline-fix-available", "defaults")
    for values in product((False, True), repeat=len(names)):
        for kek, fwupd, db in product(KEK_CODES, FWUPD_CODES, DB_CODES):
            flags = dict(zip(names, values), kek=kek, fwupd=fwupd, db=db)
            if flags["kek-2023-missing"] or flags["db-uefi-ca-2023-missing"]:
                yield flags


def assert_one_route(steps, flags):
    """fwupd runs once where it can update something, never for a blocked KEK alone."""
    text = "\n".join(steps)
    run_fwupd = [s for s in steps if "fwupdmgr update" in s]
    kek_blocked = flags["kek-2023-missing"] and (
        flags["pk-unusable"] or flags["kek"] == "kek-update-unpublished"
    )
    if kek_blocked:
        assert "UEFI Key Exchange Key" not in text, flags
        routes = [s for s in steps if "maker's firmware (BIOS) update" in s]
        assert len(routes) == 1, flags
    db_by_fwupd = flags["db-uefi-ca-2023-missing"] and flags["db"] == "db-update-signable"
    assert len(run_fwupd) == (0 if kek_blocked and not db_by_fwupd else 1), flags
    if not run_fwupd:  # no fwupd to install for nothing
        assert "apt install fwupd" not in text, flags
    if run_fwupd and flags["offline-fix-available"]:
        assert run_fwupd[0].startswith("Or, online:"), flags
    assert not ("can be applied now" in text and not db_by_fwupd), flags
    assert_db_route(text, flags)


def assert_db_route(text, flags):
    """A db no published update reaches: the ways that can, never none (issue 34 item 2)."""
    db_blocked = flags["db-uefi-ca-2023-missing"] and flags["db"] == "db-update-unsignable"
    assert ("which this KEK lacks" in text) == db_blocked, flags
    if db_blocked:
        assert "firmware" in text and "sign-efi-sig-list" in text, flags


def test_next_steps_never_contradict_each_other():
    """Every combination of the findings the advice reads (issue 26 item 4): one route
    for KEK, fwupd only for what it can update, and never 'restore factory keys' beside
    'do not restore factory keys'."""
    from debadmin.secureboot_ca_check import rules

    checked = 0
    for flags in step_flag_combinations():
        steps = rules.next_steps(step_findings(flags), "efivars")
        text = "\n".join(steps)
        assert_one_route(steps, flags)
        if "Do not use 'restore factory keys'" in text:
            assert "or restore factory keys" not in text, flags
        assert rules.PCR7_WARNING in steps and text.count("PCR 7") == 1, flags
        checked += 1
    assert checked == 3 * 2**3 * 9 * 3
