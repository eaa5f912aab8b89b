"""Unit tests for secureboot-ca-check --fix and --libvirt: the edk2 store writer, its
refusals, fuzzed stores and certificates, libvirt domains."""

import datetime
import fcntl
import importlib
import json
import os
import random
import re
import shutil
import struct
import subprocess
import uuid
import zlib
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from debadmin.secureboot_ca_check import main as sbc

from debadmin.secureboot_ca_check import checks
from debadmin.secureboot_ca_check import efi
from debadmin.secureboot_ca_check import fix

DATA = Path(__file__).resolve().parents[1] / "data" / "secureboot-ca-check"
REAL = DATA / "real"
UEFI_CA_2023_DER = REAL / "microsoft-uefi-ca-2023.der"
OVMF_MS = Path("/usr/share/OVMF/OVMF_VARS_4M.ms.fd")
# The certificates python3-virt-firmware ships (trixie); SECUREBOOT_TEST_CERTS may name
# another directory holding them (tests/data/secureboot-ca-check/fetch-certs fills one).
CERT_DIR = Path(
    os.environ.get("SECUREBOOT_TEST_CERTS", "/usr/lib/python3/dist-packages/virt/firmware/certs")
)
needs_ms_certs = pytest.mark.skipif(
    not (CERT_DIR / "MicrosoftCorporationKEK2KCA2023.pem").is_file(),
    reason="no 2023 Microsoft certificates (python3-virt-firmware or SECUREBOOT_TEST_CERTS)",
)
needs_qemu_img = pytest.mark.skipif(not shutil.which("qemu-img"), reason="no qemu-img")
FTW_AT = 0x41000
STORE_AT = 72
FIRST_VAR = 100


def guid(text: str) -> bytes:
    return uuid.UUID(text).bytes_le


# --- builders ------------------------------------------------------------------------------


def ftw_block(queue: bytes = b"") -> bytes:
    """An FTW working block header as OVMF's templates carry it, then the queue."""
    header = bytearray(guid(fix.FTW_SIGNATURES[0]) + b"\xff" * 8 + struct.pack("<Q", 0xFE0))
    struct.pack_into("<I", header, 16, zlib.crc32(bytes(header)))
    header[20] = 0xFE
    return bytes(header) + queue


def variable(name, data, state=efi.VAR_ADDED, attrs=None, vendor=None, count=0, stamp=None):
    vendor = vendor or efi.VARIABLES.get(name, efi.GLOBAL_GUID)
    raw_name = (name + "\0").encode("utf-16-le")
    attrs = attrs if attrs is not None else (0x27 if name in efi.AUTHENTICATED else 0x07)
    blob = (
        struct.pack(
            "<HBBIQ16sIII16s",
            0x55AA,
            state,
            0,
            attrs,
            count,
            stamp or bytes(16),
            0,
            len(raw_name),
            len(data),
            guid(vendor),
        )
        + raw_name
        + data
    )
    return blob + b"\xff" * (-len(blob) % 4)


def make_store(variables, store_size=0x3FFB8, size=0x84000, queue=b"", ftw=True) -> bytes:
    """An edk2 NVRAM image laid out as OVMF's 4M one: FV header, authenticated store,
    variables, FTW working block at 0x41000."""
    fv = bytearray(b"\xff" * size)
    header = struct.pack(
        "<16s16sQ4sIHHHBB",
        bytes(16),
        guid(efi.FV_NV_GUIDS[0]),
        size,
        b"_FVH",
        0x4FEFF,
        STORE_AT,
        0,
        0,
        0,
        2,
    )
    header += struct.pack("<IIII", size // 0x1000, 0x1000, 0, 0)
    checksum = (-sum(struct.unpack(f"<{len(header) // 2}H", header))) & 0xFFFF
    fv[:STORE_AT] = header[:50] + struct.pack("<H", checksum) + header[52:]
    fv[STORE_AT : STORE_AT + 28] = struct.pack(
        "<16sIBBHI", guid(efi.AUTH_VARIABLE_GUID), store_size, 0x5A, 0xFE, 0, 0
    )
    body = b"".join(variables)
    fv[FIRST_VAR : FIRST_VAR + len(body)] = body
    if ftw:
        block = ftw_block(queue)
        fv[FTW_AT : FTW_AT + len(block)] = block
    return bytes(fv)


STAMP = struct.pack("<HBBBBBBIhBB", 2025, 3, 10, 2, 53, 39, 0, 0, 0, 0, 0)


def ms_variables():
    """CustomMode, then the real PK/KEK/db/dbx of Debian's OVMF_VARS_4M.ms.fd."""
    out = [variable("CustomMode", b"\0", vendor="c076ec0c-7028-4399-a072-71ee5c448b9f")]
    for name in ("db", "dbx", "KEK", "PK"):
        out.append(
            variable(name, (REAL / f"ovmf-ms-{name}.esl").read_bytes(), count=7, stamp=STAMP)
        )
    return out


def make_ca(cn: str) -> x509.Certificate:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    now = datetime.datetime(2026, 1, 1)
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=3650))
        .sign(key, hashes.SHA256())
    )


@pytest.fixture(scope="module")
def fake_cas():
    """Four generated CAs standing in for the 2023 ones (Microsoft's are not committed)."""
    return {target[0]: make_ca(f"Fake {target[1]}") for target in fix.TARGETS}


@pytest.fixture
def fakes(monkeypatch, tmp_path, fake_cas):
    """fix.TARGETS pointing at the generated CAs; their PEM files; the DER of each."""
    monkeypatch.setattr(
        fix,
        "TARGETS",
        tuple((t[0], t[1], t[2], efi.fingerprint(fake_cas[t[0]])) for t in fix.TARGETS),
    )
    files = {}
    for ca_id, cert in fake_cas.items():
        path = tmp_path / f"{ca_id}.pem"
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        files[ca_id] = path
    return files


def der(cert):
    return cert.public_bytes(serialization.Encoding.DER)


def run(capsys, *argv):
    rc = sbc.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def cert_args(files, ids=None):
    out = []
    for ca_id, path in files.items():
        if ids is None or ca_id in ids:
            out += ["--cert", str(path)]
    return out


def backups(path: Path):
    return sorted(path.parent.glob(path.name + ".*.bak"))


def slots(data: bytes):
    return fix.walk_store(data, "test").slots


# --- the writer ------------------------------------------------------------------------------


def test_targets_are_the_known_cas():
    for ca_id, name, home, sha256 in fix.TARGETS:
        assert checks.KNOWN_CAS[sha256] == (ca_id, name, home)


def assert_appended_as_edk2(original, new):
    """KEK and db rewritten as edk2's variable driver does: the old ones deleted in place,
    the new ones added after the last variable, nothing else in the volume touched."""
    # Header, FV checksum, FTW block and the rest of the volume untouched.
    assert new[:FIRST_VAR] == original[:FIRST_VAR]
    assert new[0x40000:] == original[0x40000:]
    before, after = slots(original), slots(new)
    # The old KEK and db deleted in place (0x3f & 0xfe & 0xfd), the rest unchanged.
    assert [s.offset for s in after[: len(before)]] == [s.offset for s in before]
    states = {s.name: s.state for s in after[: len(before)]}
    assert states == {"CustomMode": 0x3F, "db": 0x3C, "dbx": 0x3F, "KEK": 0x3C, "PK": 0x3F}
    kek, db = after[len(before) :]
    assert (kek.name, db.name) == ("KEK", "db")
    assert kek.offset == (before[-1].end + 3) & ~3 and db.offset == (kek.end + 3) & ~3
    for slot in (kek, db):
        header = fix.VAR_HEADER.unpack_from(new, slot.offset)
        # StartId, VAR_ADDED, attributes NV|BS|RT|TIME_BASED_AUTH, count and time kept.
        assert header[:5] == (0x55AA, 0x3F, 0, 0x27, 7) and header[5] == STAMP
        assert header[6] == 0
    assert new[db.end : 0x40000].strip(b"\xff") == b""


def assert_certs_appended(new, fake_cas):
    """The 2023 CAs at the end of KEK and db, owned by Microsoft, the old db kept."""
    variables = efi.parse_varstore(new, "new")
    kek_certs = [e.cert for e in efi.parse_signature_lists(variables["KEK"].data, "KEK")]
    db_entries = efi.parse_signature_lists(variables["db"].data, "db")
    assert der(kek_certs[-1]) == der(fake_cas["kek_2k_ca_2023"])
    assert [der(e.cert) for e in db_entries[-3:]] == [
        der(fake_cas[i])
        for i in ("uefi_ca_2023", "windows_uefi_ca_2023", "option_rom_uefi_ca_2023")
    ]
    assert all(e.owner == efi.MICROSOFT_OWNER for e in db_entries[-3:])
    assert variables["db"].data.startswith((REAL / "ovmf-ms-db.esl").read_bytes())


def test_fix_appends_as_edk2_does(tmp_path, capsys, fakes, fake_cas):
    path = tmp_path / "VARS.fd"
    original = make_store(ms_variables())
    path.write_bytes(original)
    os.chmod(path, 0o600)
    rc, out, err = run(
        capsys, "--root", str(tmp_path), "--varstore", str(path), "--fix", *cert_args(fakes)
    )
    assert rc == 0 and err == "", err
    assert "added Microsoft UEFI CA 2023 to db" in out
    new = path.read_bytes()
    assert len(new) == len(original) and os.stat(path).st_mode & 0o777 == 0o600
    (backup,) = backups(path)
    assert backup.read_bytes() == original and os.stat(backup).st_mode & 0o777 == 0o600
    assert_appended_as_edk2(original, new)
    assert_certs_appended(new, fake_cas)
    # Idempotent: a second run changes nothing and writes no backup.
    rc, out, _ = run(
        capsys, "--root", str(tmp_path), "--varstore", str(path), "--fix", *cert_args(fakes)
    )
    assert rc == 0 and "nothing to change" in out
    assert path.read_bytes() == new and len(backups(path)) == 1


def test_dry_run_and_json(tmp_path, capsys, fakes):
    path = tmp_path / "VARS.fd"
    original = make_store(ms_variables())
    path.write_bytes(original)
    rc, out, err = run(
        capsys,
        "--root",
        str(tmp_path),
        "--varstore",
        str(path),
        "--fix",
        "--dry-run",
        "--json",
        *cert_args(fakes, {"kek_2k_ca_2023", "uefi_ca_2023"}),
    )
    doc = json.loads(out)
    assert rc == 0 and err == ""
    (result,) = doc["fixes"]
    assert [a["ca"] for a in result["added"]] == ["kek_2k_ca_2023", "uefi_ca_2023"]
    assert [u["ca"] for u in result["unavailable"]] == [
        "windows_uefi_ca_2023",
        "option_rom_uefi_ca_2023",
    ]
    assert result["written"] is False and doc["dry_run"] is True
    assert path.read_bytes() == original and backups(path) == []


def test_missing_required_certificate_exits_1(tmp_path, capsys, fakes):
    path = tmp_path / "VARS.fd"
    path.write_bytes(make_store(ms_variables()))
    rc, out, _ = run(
        capsys,
        "--root",
        str(tmp_path),
        "--varstore",
        str(path),
        "--fix",
        *cert_args(fakes, {"uefi_ca_2023"}),
    )
    assert rc == 1 and "not added: Microsoft Corporation KEK 2K CA 2023" in out
    variables = efi.read_varstore(path)
    assert len(efi.parse_signature_lists(variables["db"].data, "db")) == 3


def test_installed_certificates_are_found_under_root(tmp_path, capsys, fakes):
    certs = tmp_path / fix.CERT_DIRS[0]
    certs.mkdir(parents=True)
    for ca_id, pem in fakes.items():
        shutil.copy(pem, certs / f"{ca_id}.pem")
    (certs / "unrelated.pem").write_bytes(
        make_ca("Other").public_bytes(serialization.Encoding.PEM)
    )
    (certs / "broken.pem").write_bytes(
        b"-----BEGIN CERTIFICATE-----\n!!\n-----END CERTIFICATE-----"
    )
    path = tmp_path / "VARS.fd"
    path.write_bytes(make_store(ms_variables()))
    rc, out, err = run(capsys, "--root", str(tmp_path), "--varstore", str(path), "--fix")
    assert rc == 0 and out.count("  added ") == 4, out


def test_reclaim_when_the_store_is_full(tmp_path, capsys, fakes):
    junk = []
    size = len(b"".join(ms_variables()))
    while size < 0x3FFB8 - 28 - 4200:
        junk.append(variable("Junk", b"\0" * 4000, state=0x3C))
        size += len(junk[-1])
    # An in-transition copy without a VAR_ADDED twin is kept, as VAR_ADDED.
    half = variable("Half", b"x", state=0x3E, vendor="11111111-2222-3333-4444-555555555555")
    path = tmp_path / "VARS.fd"
    original = make_store(ms_variables() + junk + [half])
    path.write_bytes(original)
    rc, out, err = run(
        capsys, "--root", str(tmp_path), "--varstore", str(path), "--fix", *cert_args(fakes)
    )
    assert rc == 0, err
    new = path.read_bytes()
    after = slots(new)
    assert [(s.name, s.state) for s in after] == [
        ("CustomMode", 0x3F),
        ("dbx", 0x3F),
        ("PK", 0x3F),
        ("Half", 0x3F),
        ("KEK", 0x3F),
        ("db", 0x3F),
    ]
    assert after[0].offset == FIRST_VAR and new[after[-1].end : 0x40000].strip(b"\xff") == b""
    assert new[:FIRST_VAR] == original[:FIRST_VAR] and new[0x40000:] == original[0x40000:]
    assert efi.parse_varstore(new, "new")["PK"].data == (REAL / "ovmf-ms-PK.esl").read_bytes()


def test_not_enough_room_is_refused(tmp_path, capsys, fakes):
    path = tmp_path / "VARS.fd"
    used = len(b"".join(ms_variables()))
    original = make_store(ms_variables(), store_size=28 + 4 + used + 600)
    path.write_bytes(original)
    rc, out, err = run(
        capsys, "--root", str(tmp_path), "--varstore", str(path), "--fix", *cert_args(fakes)
    )
    assert rc == 2 and out == "" and "not enough room" in err and err.count("\n") == 1
    assert path.read_bytes() == original and backups(path) == []


def pending_write(complete: bool) -> bytes:
    header = struct.pack("<B3x16s4xQQ", 0xF8 if complete else 0xFC, bytes(16), 1, 0)
    record = struct.pack("<B7xQQQq", 0xFD, 0, 0, 0x40000, 0)  # spare done, target not
    return header + record


@pytest.mark.parametrize(
    "store,message",
    [
        (lambda: make_store(ms_variables(), queue=pending_write(False)), "did not finish"),
        (lambda: make_store(ms_variables(), ftw=False), "no fault-tolerant write working block"),
        (
            lambda: make_store(ms_variables())[: FTW_AT + 16]
            + b"\0"
            + make_store(ms_variables())[FTW_AT + 17 :],
            "working block is damaged",
        ),
        (lambda: make_store([variable("CustomMode", b"\0")]), "no KEK variable"),
        (
            lambda: make_store(
                [
                    variable("KEK", efi_esl(make_ca("Owner KEK"))),
                    variable("db", (REAL / "ovmf-ms-db.esl").read_bytes()),
                ]
            ),
            "holds no Microsoft KEK CA",
        ),
        (lambda: b"\1" + b"\0" * 4095, "no _FVH signature"),
        (lambda: b"QFI\xfb" + b"\0" * 100, "qemu-img"),
    ],
)
def test_refused_stores(tmp_path, capsys, fakes, store, message):
    path = tmp_path / "VARS.fd"
    original = store()
    path.write_bytes(original)
    rc, out, err = run(
        capsys, "--root", str(tmp_path), "--varstore", str(path), "--fix", *cert_args(fakes)
    )
    assert rc == 2 and out == "" and message in err and err.count("\n") == 1, err
    assert path.read_bytes() == original and backups(path) == []


def test_completed_ftw_write_is_fine(tmp_path, capsys, fakes):
    path = tmp_path / "VARS.fd"
    path.write_bytes(make_store(ms_variables(), queue=pending_write(True)))
    rc, _, err = run(
        capsys, "--root", str(tmp_path), "--varstore", str(path), "--fix", *cert_args(fakes)
    )
    assert rc == 0, err


def efi_esl(cert) -> bytes:
    return fix.signature_list(der(cert))


def test_locked_file_is_refused(tmp_path, capsys, fakes):
    """A running qemu holds OFD locks on its NVRAM (a read lock on some bytes)."""
    path = tmp_path / "VARS.fd"
    original = make_store(ms_variables())
    path.write_bytes(original)
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_RDLCK, 0, 100, 1, 0))
        rc, out, err = run(
            capsys, "--root", str(tmp_path), "--varstore", str(path), "--fix", *cert_args(fakes)
        )
    finally:
        os.close(fd)
    assert rc == 2 and "locked by another process" in err
    assert path.read_bytes() == original and backups(path) == []


def test_symlink_is_refused(tmp_path, capsys, fakes):
    path = tmp_path / "VARS.fd"
    path.write_bytes(make_store(ms_variables()))
    (tmp_path / "link.fd").symlink_to(path)
    rc, _, err = run(
        capsys,
        "--root",
        str(tmp_path),
        "--varstore",
        str(tmp_path / "link.fd"),
        "--fix",
        *cert_args(fakes),
    )
    assert rc == 2 and "symbolic link" in err


def test_all_files_checked_before_the_first_is_written(tmp_path, capsys, fakes):
    good, bad = tmp_path / "good.fd", tmp_path / "bad.fd"
    good.write_bytes(make_store(ms_variables()))
    bad.write_bytes(make_store(ms_variables())[:-1])
    before = good.read_bytes()
    rc, _, err = run(
        capsys,
        "--root",
        str(tmp_path),
        "--varstore",
        str(good),
        "--varstore",
        str(bad),
        "--fix",
        *cert_args(fakes),
    )
    assert rc == 2 and good.read_bytes() == before and backups(good) == []


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--fix", "--cert", "y"], "--cert goes with --varstore"),
        (["--varstore", "x", "--i-have-recovery-keys"], "go with --fix"),
        (["--varstore", "x", "--fix", "--i-have-recovery-keys"], "this machine's firmware"),
        (["--varstore", "x", "--cert", "y"], "go with --fix"),
        (["--varstore", "x", "--dry-run"], "go with --fix"),
        (["--libvirt", "--varstore", "x"], "--libvirt reads"),
        (["--varstore", "x", "--fix", "--efivars", "y"], "one kind of source"),
        (["--fix", "--shim", "y"], "no --shim"),
    ],
)
def test_option_combinations(capsys, argv, message):
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and message in err and out == ""


# --- certificates ----------------------------------------------------------------------------


def test_real_uefi_ca_2023_der_and_pem(tmp_path, capsys):
    """The real certificate (committed copy from shim-signed), DER and PEM."""
    raw = UEFI_CA_2023_DER.read_bytes()
    pem = tmp_path / "ca.pem"
    pem.write_bytes(x509.load_der_x509_certificate(raw).public_bytes(serialization.Encoding.PEM))
    for cert in (UEFI_CA_2023_DER, pem):
        path = tmp_path / "VARS.fd"
        path.write_bytes(make_store(ms_variables()))
        for old in backups(path):
            old.unlink()
        rc, out, err = run(
            capsys, "--root", str(tmp_path), "--varstore", str(path), "--fix", "--cert", str(cert)
        )
        # KEK 2K CA 2023 has no certificate here: still action needed.
        assert rc == 1 and "added Microsoft UEFI CA 2023 to db" in out, err
        report = checks.build_report(
            "varstore", "x", efi.read_varstore(path), [], tmp_path, datetime.datetime(2026, 11, 1)
        )
        assert report["microsoft_cas"]["uefi_ca_2023"]["in_db"]
        assert not report["microsoft_cas"]["kek_2k_ca_2023"]["in_kek"]


def test_one_changed_byte_is_refused(tmp_path, capsys):
    raw = bytearray(UEFI_CA_2023_DER.read_bytes())
    raw[-10] ^= 0x01  # in the signature: still parses, another fingerprint
    cert = tmp_path / "ca.der"
    cert.write_bytes(raw)
    path = tmp_path / "VARS.fd"
    original = make_store(ms_variables())
    path.write_bytes(original)
    rc, out, err = run(
        capsys, "--root", str(tmp_path), "--varstore", str(path), "--fix", "--cert", str(cert)
    )
    assert rc == 2 and "is not one of the four Microsoft 2023 CAs" in err
    assert path.read_bytes() == original and backups(path) == []


def test_fuzzed_certificates_never_write(tmp_path, capsys):
    raw = UEFI_CA_2023_DER.read_bytes()
    pem = x509.load_der_x509_certificate(raw).public_bytes(serialization.Encoding.PEM)
    path = tmp_path / "VARS.fd"
    original = make_store(ms_variables())
    path.write_bytes(original)
    cert = tmp_path / "cert"
    rng = random.Random(13)
    for _ in range(150):
        blob = bytearray(rng.choice((raw, pem)))
        choice = rng.random()
        if choice < 0.3:
            blob = blob[: rng.randrange(len(blob))]
        elif choice < 0.8:
            for _ in range(rng.randint(1, 4)):
                blob[rng.randrange(len(blob))] ^= 1 << rng.randrange(8)
        else:
            blob += bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        cert.write_bytes(bytes(blob))
        rc, out, err = run(
            capsys,
            "--root",
            str(tmp_path),
            "--varstore",
            str(path),
            "--fix",
            "--dry-run",
            "--cert",
            str(cert),
        )
        assert "Traceback" not in err and err.count("\n") <= 1
        if rc != 1:  # a flip in PEM whitespace may leave the certificate intact
            assert rc == 2 and out == ""
        assert path.read_bytes() == original


# --- fuzzed stores ----------------------------------------------------------------------------


def test_fuzzed_stores_never_partially_written(tmp_path, capsys, fakes):
    base = make_store(ms_variables())
    rng = random.Random(7)
    path = tmp_path / "VARS.fd"
    hot = (
        list(range(0, 0x48))
        + list(range(STORE_AT, FIRST_VAR + 64))
        + list(range(FTW_AT, FTW_AT + 48))
    )
    used = len(b"".join(ms_variables()))
    for index in range(200):
        data = bytearray(base)
        choice = rng.random()
        if choice < 0.2:
            data = data[: rng.randrange(len(data))]
        elif choice < 0.6:
            for _ in range(rng.randint(1, 3)):
                data[rng.choice(hot)] ^= 1 << rng.randrange(8)
        else:
            for _ in range(rng.randint(1, 3)):
                data[FIRST_VAR + rng.randrange(used)] = rng.randrange(256)
        path.write_bytes(bytes(data))
        for old in backups(path):
            old.unlink()
        rc, out, err = run(
            capsys, "--root", str(tmp_path), "--varstore", str(path), "--fix", *cert_args(fakes)
        )
        assert "Traceback" not in err and rc in (0, 1, 2), (index, err)
        if rc == 2:
            assert err.count("\n") == 1 and out == "", err
            assert path.read_bytes() == bytes(data) and backups(path) == [], index
        else:
            # Accepted: the result reads back and the backup is the input.
            new = path.read_bytes()
            fix.walk_store(new, "fuzz")
            if new != bytes(data):
                assert backups(path)[0].read_bytes() == bytes(data)


# --- real stores ---------------------------------------------------------------------------------


@pytest.mark.skipif(not OVMF_MS.is_file(), reason="ovmf is not installed")
def test_real_ovmf_template(tmp_path, capsys, fakes):
    path = tmp_path / "VARS.fd"
    shutil.copy(OVMF_MS, path)
    rc, out, err = run(
        capsys, "--root", str(tmp_path), "--varstore", str(path), "--fix", *cert_args(fakes)
    )
    assert rc == 0, err
    new = path.read_bytes()
    original = OVMF_MS.read_bytes()
    assert new[0x40000:] == original[0x40000:] and len(new) == len(original)


@needs_ms_certs
@pytest.mark.skipif(not OVMF_MS.is_file(), reason="ovmf is not installed")
def test_real_template_with_real_certificates(tmp_path, capsys):
    path = tmp_path / "VARS.fd"
    shutil.copy(OVMF_MS, path)
    certs = [
        "--cert",
        str(CERT_DIR / "MicrosoftCorporationKEK2KCA2023.pem"),
        "--cert",
        str(CERT_DIR / "MicrosoftUEFICA2023.pem"),
        "--cert",
        str(CERT_DIR / "WindowsUEFICA2023.pem"),
    ]
    rc, out, err = run(capsys, "--root", str(tmp_path), "--varstore", str(path), "--fix", *certs)
    assert rc == 0, err
    rc, out, err = run(capsys, "--varstore", str(path))
    assert rc == 0 and "nothing to do" in out


@needs_qemu_img
def test_qcow2_store(tmp_path, capsys, fakes, fake_cas):
    raw = tmp_path / "raw.fd"
    raw.write_bytes(make_store(ms_variables()))
    path = tmp_path / "VARS.qcow2"
    subprocess.run(
        ["qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(raw), str(path)], check=True
    )
    original = path.read_bytes()
    rc, out, err = run(
        capsys, "--root", str(tmp_path), "--varstore", str(path), "--fix", *cert_args(fakes)
    )
    assert rc == 0, err
    assert path.read_bytes()[:4] == b"QFI\xfb" and backups(path)[0].read_bytes() == original
    back = tmp_path / "back.fd"
    subprocess.run(
        ["qemu-img", "convert", "-f", "qcow2", "-O", "raw", str(path), str(back)], check=True
    )
    kek = efi.parse_varstore(back.read_bytes(), "x")["KEK"].data
    assert kek.endswith(der(fake_cas["kek_2k_ca_2023"]))


# --- libvirt ---------------------------------------------------------------------------------


DOMAIN_XML = """<!--
WARNING: THIS IS AN AUTO-GENERATED FILE. CHANGES TO IT ARE LIKELY TO BE
OVERWRITTEN AND LOST. Changes to this xml configuration should be made using:
  virsh edit {name}
or other application using the libvirt API.
-->

<domain type='kvm'>
  <name>{name}</name>
  <uuid>{uuid}</uuid>
  <memory unit='KiB'>2097152</memory>
  <currentMemory unit='KiB'>2097152</currentMemory>
  <vcpu placement='static'>2</vcpu>
  <os{firmware}>
    <type arch='x86_64' machine='pc-q35-7.2'>hvm</type>
{loader}  </os>
  <features>
    <acpi/>
    <apic/>
    <smm state='on'/>
  </features>
  <cpu mode='host-passthrough' check='none' migratable='on'/>
  <on_poweroff>destroy</on_poweroff>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
  </devices>
</domain>
"""
CODE = "/usr/share/OVMF/OVMF_CODE_4M.ms.fd"
LOADER = """    <loader readonly='yes' secure='yes' type='pflash'>{code}</loader>
    <nvram template='/usr/share/OVMF/OVMF_VARS_4M.ms.fd'{fmt}>{path}</nvram>
"""
LOADER_SOURCE = """    <loader readonly='yes' secure='yes' type='pflash'>{code}</loader>
    <nvram template='/usr/share/OVMF/OVMF_VARS_4M.ms.fd' type='file' format='qcow2'>
      <source file='{path}'/>
    </nvram>
"""


def libvirt_host(tmp_path: Path, qcow2: bool):
    root = tmp_path / "root"
    (root / "etc/libvirt/qemu").mkdir(parents=True)
    nvram = root / "var/lib/libvirt/qemu/nvram"
    nvram.mkdir(parents=True)
    (root / "run/libvirt/qemu").mkdir(parents=True)
    store = make_store(ms_variables())
    domains = {"web": "raw", "db1": "running", "legacy": "bios"}
    if qcow2:
        domains["win"] = "qcow2"
    for name, kind in domains.items():
        loader = ""
        if kind in ("raw", "running"):
            path = f"/var/lib/libvirt/qemu/nvram/{name}_VARS.fd"
            (root / path.lstrip("/")).write_bytes(store)
            loader = LOADER.format(code=CODE, fmt="", path=path)
        elif kind == "qcow2":
            path = f"/var/lib/libvirt/qemu/nvram/{name}_VARS.qcow2"
            raw = tmp_path / "tmp.fd"
            raw.write_bytes(store)
            subprocess.run(
                [
                    "qemu-img",
                    "convert",
                    "-f",
                    "raw",
                    "-O",
                    "qcow2",
                    str(raw),
                    str(root / path.lstrip("/")),
                ],
                check=True,
            )
            loader = LOADER_SOURCE.format(code=CODE, path=path)
        if kind == "running":
            (root / f"run/libvirt/qemu/{name}.pid").write_text("4242")
        (root / f"etc/libvirt/qemu/{name}.xml").write_text(
            DOMAIN_XML.format(
                name=name,
                uuid=uuid.uuid4(),
                firmware=" firmware='efi'" if kind != "bios" else "",
                loader=loader,
            )
        )
    return root


@pytest.mark.parametrize("qcow2", [False, pytest.param(True, marks=needs_qemu_img)])
def test_libvirt_check_and_fix(tmp_path, capsys, fakes, qcow2):
    root = libvirt_host(tmp_path, qcow2)
    rc, out, err = run(capsys, "--libvirt", "--root", str(root), "--json")
    doc = json.loads(out)
    verdicts = {d["domain"]: (d["verdict"], d.get("running")) for d in doc["domains"]}
    expected = {
        "web": ("action-needed", False),
        "db1": ("action-needed", True),
        "legacy": ("no-nvram", None),
    }
    if qcow2:
        expected["win"] = ("action-needed", False)
    assert rc == 1 and verdicts == expected, err
    rc, out, err = run(capsys, "--libvirt", "--root", str(root), "--fix", *cert_args(fakes))
    # The report knows the real fingerprints only: with the stand-ins it still says 1.
    assert rc == 1, err
    assert "domain db1 (running): action-needed" in out
    assert "not fixed: running: shut it down" in out
    nvram = root / "var/lib/libvirt/qemu/nvram"
    running = nvram / "db1_VARS.fd"
    assert running.read_bytes() == make_store(ms_variables()) and backups(running) == []
    fixed = ["web_VARS.fd"] + (["win_VARS.qcow2"] if qcow2 else [])
    for name in fixed:
        assert len(backups(nvram / name)) == 1, name
    assert out.count("  added Microsoft Corporation KEK 2K CA 2023 to KEK") == len(fixed)
    (root / "run/libvirt/qemu/db1.pid").unlink()
    rc, out, err = run(
        capsys, "--libvirt", "--root", str(root), "--fix", *cert_args(fakes), "--json"
    )
    doc = {d["domain"]: d for d in json.loads(out)["domains"]}
    assert doc["db1"]["fix"]["written"] and len(backups(running)) == 1
    assert all(not doc[n.split("_")[0]]["fix"]["written"] for n in fixed)


def test_libvirt_not_installed_and_broken_xml(tmp_path, capsys):
    rc, out, err = run(capsys, "--libvirt", "--root", str(tmp_path))
    assert rc == 3 and "libvirt is not installed" in err and "error" not in err and out == ""
    rc, out, err = run(capsys, "--libvirt", "--root", str(tmp_path), "--json")
    doc = json.loads(out)
    assert rc == 3 and doc["applicable"] is False and doc["exit_status"] == 3 and err == ""
    assert "libvirt is not installed" in doc["reason"] and doc["domains"] == []
    (tmp_path / "etc/libvirt/qemu").mkdir(parents=True)
    (tmp_path / "etc/libvirt/qemu/bad.xml").write_text("<domain><name>x</name>")
    rc, out, err = run(capsys, "--libvirt", "--root", str(tmp_path))
    assert rc == 2 and "domain bad: error:" in out and "not well-formed" in out
    assert err == ""


def test_libvirt_missing_nvram_is_an_error_verdict(tmp_path, capsys):
    root = libvirt_host(tmp_path, False)
    (root / "var/lib/libvirt/qemu/nvram/web_VARS.fd").unlink()
    rc, out, _ = run(capsys, "--libvirt", "--root", str(root))
    assert rc == 2 and "domain web (shut off): error:" in out
    assert "domain db1 (running): action-needed" in out


def test_no_certificate_at_all_is_an_error(tmp_path, capsys):
    path = tmp_path / "VARS.fd"
    original = make_store(ms_variables())
    path.write_bytes(original)
    rc, out, err = run(capsys, "--root", str(tmp_path), "--varstore", str(path), "--fix")
    assert rc == 2 and "pass them with --cert FILE" in err and out == ""
    assert path.read_bytes() == original


def test_certificates_from_a_template_store(tmp_path, capsys, fakes, fake_cas):
    """sid's OVMF_VARS_4M.ms.fd enrols all four: a template under the root is a source."""
    kek = (REAL / "ovmf-ms-KEK.esl").read_bytes() + efi_esl(fake_cas["kek_2k_ca_2023"])
    db = (REAL / "ovmf-ms-db.esl").read_bytes() + b"".join(
        efi_esl(fake_cas[i])
        for i in ("uefi_ca_2023", "windows_uefi_ca_2023", "option_rom_uefi_ca_2023")
    )
    template = tmp_path / fix.TEMPLATE_STORES[0]
    template.parent.mkdir(parents=True)
    template.write_bytes(make_store([variable("KEK", kek), variable("db", db)]))
    path = tmp_path / "VARS.fd"
    path.write_bytes(make_store(ms_variables()))
    rc, out, err = run(capsys, "--root", str(tmp_path), "--varstore", str(path), "--fix")
    assert rc == 0 and out.count("  added ") == 4 and "OVMF_VARS_4M.ms.fd (db)" in out, err


def test_libvirt_firmware_autoselection_default_nvram(tmp_path, capsys):
    root = tmp_path / "root"
    (root / "etc/libvirt/qemu").mkdir(parents=True)
    (root / "var/lib/libvirt/qemu/nvram").mkdir(parents=True)
    (root / "var/lib/libvirt/qemu/nvram/auto_VARS.fd").write_bytes(make_store(ms_variables()))
    (root / "etc/libvirt/qemu/auto.xml").write_text(
        DOMAIN_XML.format(name="auto", uuid=uuid.uuid4(), firmware=" firmware='efi'", loader="")
    )
    rc, out, err = run(capsys, "--libvirt", "--root", str(root), "--json")
    (domain,) = json.loads(out)["domains"]
    assert rc == 1 and domain["nvram"] == "/var/lib/libvirt/qemu/nvram/auto_VARS.fd", err


# --- review: qcow2 options, backups, concurrent writers, exact certificate bytes ----------


def qemu_img_info(path: Path) -> dict:
    result = subprocess.run(
        ["qemu-img", "info", "--output=json", "-f", "qcow2", str(path)],
        check=True,
        capture_output=True,
    )
    return json.loads(result.stdout)


@needs_qemu_img
def test_qcow2_keeps_its_options_and_snapshots(tmp_path, capsys, fakes, fake_cas):
    """libvirt keeps internal snapshots of a VM in its qcow2 NVRAM: rewriting must not drop
    them (nor change the cluster size or other options the file was made with)."""
    raw = tmp_path / "raw.fd"
    raw.write_bytes(make_store(ms_variables()))
    path = tmp_path / "VARS.qcow2"
    subprocess.run(
        ["qemu-img", "convert", "-f", "raw", "-O", "qcow2", "-o"]
        + ["cluster_size=65536,lazy_refcounts=on", str(raw), str(path)],
        check=True,
    )
    subprocess.run(["qemu-img", "snapshot", "-c", "before-upgrade", str(path)], check=True)
    rc, out, err = run(
        capsys, "--root", str(tmp_path), "--varstore", str(path), "--fix", *cert_args(fakes)
    )
    assert rc == 0, err
    info = qemu_img_info(path)
    assert info["cluster-size"] == 65536
    assert info["format-specific"]["data"]["lazy-refcounts"] is True
    assert [s["name"] for s in info.get("snapshots", [])] == ["before-upgrade"]
    back = tmp_path / "back.fd"
    subprocess.run(
        ["qemu-img", "convert", "-f", "qcow2", "-O", "raw", str(path), str(back)], check=True
    )
    kek = efi.parse_varstore(back.read_bytes(), "x")["KEK"].data
    assert kek.endswith(der(fake_cas["kek_2k_ca_2023"]))


@needs_qemu_img
def test_qcow2_with_a_backing_file_is_refused(tmp_path, capsys, fakes):
    base = tmp_path / "base.fd"
    base.write_bytes(make_store(ms_variables()))
    path = tmp_path / "VARS.qcow2"
    subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(base), "-F", "raw", str(path)],
        check=True,
    )
    original = path.read_bytes()
    rc, out, err = run(
        capsys, "--root", str(tmp_path), "--varstore", str(path), "--fix", *cert_args(fakes)
    )
    assert rc == 2 and "backing file" in err and err.count("\n") == 1
    assert path.read_bytes() == original and backups(path) == []


def test_qcow2_header_refusals(tmp_path):
    header = bytearray(b"QFI\xfb" + struct.pack(">I", 3) + bytes(96))
    struct.pack_into(">Q", header, 24, 540672)
    fix.check_qcow2(bytes(header), tmp_path)
    for at, fmt, value, message in (
        (72, ">Q", 4, "external data file"),
        (72, ">Q", 2, "corrupt"),
        (32, ">I", 1, "encrypted"),
        (24, ">Q", 1 << 40, "larger than a varstore"),
    ):
        bad = bytearray(header)
        struct.pack_into(fmt, bad, at, value)
        with pytest.raises(fix.Error, match=message):
            fix.check_qcow2(bytes(bad), tmp_path)
    with pytest.raises(fix.Error, match="truncated"):
        fix.check_qcow2(bytes(header[:80]), tmp_path)


class FrozenClock:
    """datetime for fix: every backup made in the same second."""

    timezone = datetime.timezone

    class datetime(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime.datetime(2026, 11, 23, 12, 0, 0, tzinfo=tz)


def test_a_backup_is_never_replaced(tmp_path, capsys, fakes, monkeypatch):
    """Two runs in one second (KEK first, then db): the first backup, the only copy of the
    original, must survive."""
    monkeypatch.setattr(fix, "datetime", FrozenClock)
    path = tmp_path / "VARS.fd"
    original = make_store(ms_variables())
    path.write_bytes(original)
    base = ["--root", str(tmp_path), "--varstore", str(path), "--fix"]
    rc, _, err = run(capsys, *base, *cert_args(fakes, ["kek_2k_ca_2023"]))
    assert rc == 1, err
    rc, _, err = run(capsys, *base, *cert_args(fakes, ["uefi_ca_2023"]))
    assert rc == 0, err
    found = backups(path)
    assert len(found) == 2 and original in [b.read_bytes() for b in found]


@pytest.mark.parametrize("how", ["in place", "renamed over"])
def test_file_changed_while_fixing_is_not_overwritten(tmp_path, capsys, fakes, monkeypatch, how):
    """A writer that takes no lock (virt-fw-vars, a copy from a template) changes the file
    after --fix read it: its change must not be lost."""
    path = tmp_path / "VARS.fd"
    path.write_bytes(make_store(ms_variables()))
    theirs = make_store(ms_variables()[1:])
    plan_fix = fix.plan_fix

    def racing(*args):
        plan = plan_fix(*args)
        if how == "in place":
            with open(path, "r+b") as handle:
                handle.write(theirs)
        else:
            other = tmp_path / "other"
            other.write_bytes(theirs)
            os.replace(other, path)
        return plan

    monkeypatch.setattr(fix, "plan_fix", racing)
    rc, _, err = run(
        capsys, "--root", str(tmp_path), "--varstore", str(path), "--fix", *cert_args(fakes)
    )
    assert rc == 2 and "changed while --fix read it" in err and err.count("\n") == 1
    assert path.read_bytes() == theirs and backups(path) == []


def test_padded_template_entry_is_written_without_the_padding(tmp_path, capsys, fakes, fake_cas):
    """Firmware pads certificates with zeros up to SignatureSize; what --fix copies from a
    template must be the certificate alone (the bytes whose SHA-256 is the known one)."""

    def padded_esl(cert):
        raw = der(cert) + bytes(12)
        return (
            guid(efi.CERT_X509)
            + struct.pack("<III", 28 + 16 + len(raw), 0, 16 + len(raw))
            + guid(efi.MICROSOFT_OWNER)
            + raw
        )

    kek = (REAL / "ovmf-ms-KEK.esl").read_bytes() + padded_esl(fake_cas["kek_2k_ca_2023"])
    template = tmp_path / fix.TEMPLATE_STORES[0]
    template.parent.mkdir(parents=True)
    template.write_bytes(make_store([variable("KEK", kek), variable("db", b"")]))
    path = tmp_path / "VARS.fd"
    path.write_bytes(make_store(ms_variables()))
    rc, out, err = run(capsys, "--root", str(tmp_path), "--varstore", str(path), "--fix")
    assert "added Microsoft Corporation KEK 2K CA 2023" in out, err
    new_kek = efi.parse_varstore(path.read_bytes(), "x")["KEK"].data
    assert new_kek.endswith(efi_esl(fake_cas["kek_2k_ca_2023"]))


# --- review: libvirt domains whose memory is kept, hostile definitions ----------------------


def test_libvirt_domain_with_a_managed_save_is_not_fixed(tmp_path, capsys, fakes):
    """The flash contents are saved with the memory: the next start writes the saved store
    back over the file and the fix would be silently gone."""
    root = libvirt_host(tmp_path, False)
    path = root / "var/lib/libvirt/qemu/save/web.save"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"LibvirtQemudSave")
    nvram = root / "var/lib/libvirt/qemu/nvram/web_VARS.fd"
    original = nvram.read_bytes()
    rc, out, err = run(capsys, "--libvirt", "--root", str(root), "--fix", *cert_args(fakes))
    assert "domain web (shut off): action-needed" in out, err
    assert "has a managed save image" in out and "managedsave-remove" in out
    assert nvram.read_bytes() == original and backups(nvram) == []


@pytest.mark.parametrize(
    "path, message",
    [
        ("/var/lib/libvirt/qemu/nvram/../../../../usr/share/OVMF/x.fd", "'..'"),
        ("/usr/share/OVMF/OVMF_VARS_4M.ms.fd", "under /usr"),
        ("web_VARS.fd", "not an absolute path"),
    ],
)
def test_libvirt_nvram_paths_outside_a_vm_are_refused(tmp_path, capsys, fakes, path, message):
    """A definition naming the firmware template (or a path with ..) as the NVRAM: --fix
    must not change the template every new VM is made from."""
    root = libvirt_host(tmp_path, False)
    template = root / "usr/share/OVMF/OVMF_VARS_4M.ms.fd"
    template.parent.mkdir(parents=True)
    template.write_bytes(make_store(ms_variables()))
    (root / "usr/share/OVMF/x.fd").write_bytes(make_store(ms_variables()))
    xml = root / "etc/libvirt/qemu/web.xml"
    xml.write_text(xml.read_text().replace("/var/lib/libvirt/qemu/nvram/web_VARS.fd", path))
    rc, out, err = run(capsys, "--libvirt", "--root", str(root), "--fix", *cert_args(fakes))
    assert rc == 2 and "domain web: error:" in out and message in out, out + err
    assert backups(template) == [] and backups(root / "usr/share/OVMF/x.fd") == []


def test_libvirt_definition_with_a_dtd_is_refused(tmp_path, capsys):
    root = libvirt_host(tmp_path, False)
    xml = root / "etc/libvirt/qemu/web.xml"
    text = xml.read_text().replace(
        "<domain type='kvm'>", "<!DOCTYPE domain [<!ENTITY p 'x'>]>\n<domain type='kvm'>"
    )
    xml.write_text(text)
    rc, out, err = run(capsys, "--libvirt", "--root", str(root), "--json")
    doc = {d["domain"]: d for d in json.loads(out)["domains"]}
    assert rc == 2 and doc["web"]["verdict"] == "error" and "DOCTYPE" in doc["web"]["error"]
    # The other domains are still checked.
    assert doc["db1"]["verdict"] == "action-needed"


def test_a_db_ca_in_kek_does_not_count_as_present_in_db(tmp_path, capsys, fakes, fake_cas):
    """UEFI CA 2023 enrolled in KEK by mistake: db still lacks it and must get it."""
    variables = ms_variables()
    kek = (REAL / "ovmf-ms-KEK.esl").read_bytes() + efi_esl(fake_cas["uefi_ca_2023"])
    variables[3] = variable("KEK", kek, count=7, stamp=STAMP)
    path = tmp_path / "VARS.fd"
    path.write_bytes(make_store(variables))
    rc, out, err = run(
        capsys, "--root", str(tmp_path), "--varstore", str(path), "--fix", *cert_args(fakes)
    )
    assert rc == 0 and "added Microsoft UEFI CA 2023 to db" in out, out + err
    db = efi.parse_varstore(path.read_bytes(), "x")["db"].data
    assert efi_esl(fake_cas["uefi_ca_2023"]) in db


def test_an_in_transition_copy_is_marked_deleted_too(tmp_path, capsys, fakes):
    """A VM stopped mid-update leaves KEK in VAR_IN_DELETED_TRANSITION beside the new
    copy; edk2's UpdateVariable marks both deleted when it writes the next one."""
    esl = (REAL / "ovmf-ms-KEK.esl").read_bytes()
    variables = ms_variables()
    variables.insert(3, variable("KEK", esl, state=efi.VAR_ADDED_IN_DELETED_TRANSITION))
    path = tmp_path / "VARS.fd"
    path.write_bytes(make_store(variables))
    rc, out, err = run(
        capsys, "--root", str(tmp_path), "--varstore", str(path), "--fix", *cert_args(fakes)
    )
    assert rc == 0, err
    states = [s.state for s in slots(path.read_bytes()) if s.name == "KEK"]
    assert states == [0x3C, 0x3C, efi.VAR_ADDED]


# --- never-started domains: the verdict on the template libvirt will copy ----------------


FIRMWARE = REAL / "firmware"  # bookworm's ovmf descriptors for x86_64


def never_started_host(tmp_path: Path, os_attrs: str, loader: str, descriptors=True):
    """A host with one domain that has no NVRAM file yet, Debian's OVMF templates (the
    .ms one with the 2011 keys, the plain one with none) and its firmware descriptors."""
    root = tmp_path / "root"
    (root / "etc/libvirt/qemu").mkdir(parents=True)
    (root / "var/lib/libvirt/qemu/nvram").mkdir(parents=True)
    (root / "usr/share/OVMF").mkdir(parents=True)
    (root / "usr/share/OVMF/OVMF_VARS_4M.ms.fd").write_bytes(make_store(ms_variables()))
    (root / "usr/share/OVMF/OVMF_VARS_4M.fd").write_bytes(make_store([]))
    if descriptors:
        shutil.copytree(FIRMWARE, root / "usr/share/qemu/firmware")
    (root / "etc/libvirt/qemu/new.xml").write_text(
        DOMAIN_XML.format(name="new", uuid=uuid.uuid4(), firmware=os_attrs, loader=loader)
    )
    return root


def test_never_started_domain_gets_the_verdict_of_its_template(tmp_path, capsys, fakes):
    """libvirt copies <nvram template=> at the first start: that is what the VM gets."""
    loader = LOADER.format(code=CODE, fmt="", path="/var/lib/libvirt/qemu/nvram/new_VARS.fd")
    root = never_started_host(tmp_path, "", loader)
    rc, out, err = run(capsys, "--libvirt", "--root", str(root), "--json")
    (domain,) = json.loads(out)["domains"]
    assert rc == 1 and domain["verdict"] == "action-needed", err
    assert domain["nvram_exists"] is False and domain["running"] is False
    assert domain["template"] == "/usr/share/OVMF/OVMF_VARS_4M.ms.fd"
    assert domain["template_from"] == "the domain definition"
    assert domain["report"]["source"]["path"].endswith("usr/share/OVMF/OVMF_VARS_4M.ms.fd")
    rc, out, err = run(capsys, "--libvirt", "--root", str(root))
    assert (
        rc == 1
        and (
            "domain new (shut off): NVRAM /var/lib/libvirt/qemu/nvram/new_VARS.fd not created "
            "yet; verdict on template /usr/share/OVMF/OVMF_VARS_4M.ms.fd (from the domain "
            "definition): action-needed"
        )
        in out
    ), out


def test_fix_creates_a_never_started_domains_nvram_from_its_template(tmp_path, capsys, fakes):
    loader = LOADER.format(code=CODE, fmt="", path="/var/lib/libvirt/qemu/nvram/new_VARS.fd")
    root = never_started_host(tmp_path, "", loader)
    nvram = root / "var/lib/libvirt/qemu/nvram/new_VARS.fd"
    template = root / "usr/share/OVMF/OVMF_VARS_4M.ms.fd"
    original = template.read_bytes()
    rc, out, err = run(
        capsys, "--libvirt", "--root", str(root), "--fix", "--dry-run", *cert_args(fakes)
    )
    assert "would create /var" not in out and f"would create {nvram} from {template}" in out
    assert not nvram.exists() and os.listdir(nvram.parent) == [], err
    rc, out, err = run(capsys, "--libvirt", "--root", str(root), "--fix", *cert_args(fakes))
    assert f"created {nvram} from {template}" in out, out + err
    assert "added Microsoft UEFI CA 2023 to db" in out.replace("Fake ", "")
    assert template.read_bytes() == original and os.listdir(nvram.parent) == ["new_VARS.fd"]
    assert stat_mode(nvram) == 0o600
    variables = efi.parse_varstore(nvram.read_bytes(), "x")
    assert variables["KEK"].data.endswith(der(fake_cas_of(fakes, "kek_2k_ca_2023")))
    assert variables["PK"].data == efi.parse_varstore(original, "x")["PK"].data
    # Created: from now on it is the domain's own NVRAM, checked and fixed as any.
    rc, out, err = run(capsys, "--libvirt", "--root", str(root), "--json")
    (domain,) = json.loads(out)["domains"]
    assert domain["nvram_exists"] is True and "template" not in domain


def stat_mode(path: Path) -> int:
    return os.stat(path).st_mode & 0o777


def fake_cas_of(files, ca_id):
    return x509.load_pem_x509_certificate(files[ca_id].read_bytes())


def test_fix_never_creates_over_a_file_that_appeared(tmp_path, capsys, fakes, monkeypatch):
    """libvirt may create the file (a start) between the check and the write: the file
    it made is kept, the fix refused."""
    loader = LOADER.format(code=CODE, fmt="", path="/var/lib/libvirt/qemu/nvram/new_VARS.fd")
    root = never_started_host(tmp_path, "", loader)
    nvram = root / "var/lib/libvirt/qemu/nvram/new_VARS.fd"
    real_plan = fix.plan_fix

    def libvirt_starts_it(*args, **kwargs):
        nvram.write_bytes(b"libvirt's copy")
        return real_plan(*args, **kwargs)

    monkeypatch.setattr(fix, "plan_fix", libvirt_starts_it)
    rc, out, err = run(capsys, "--libvirt", "--root", str(root), "--fix", *cert_args(fakes))
    assert rc == 2 and "was created meanwhile" in out, out + err
    assert nvram.read_bytes() == b"libvirt's copy"
    assert sorted(os.listdir(nvram.parent)) == ["new_VARS.fd"]


@pytest.mark.parametrize(
    "features, template",
    [
        # No wish: the first descriptor by name that fits, 40-...-secure-enrolled.
        ("", "/usr/share/OVMF/OVMF_VARS_4M.ms.fd"),
        (
            "<firmware><feature enabled='yes' name='secure-boot'/>"
            "<feature enabled='no' name='enrolled-keys'/></firmware>",
            "/usr/share/OVMF/OVMF_VARS_4M.fd",
        ),
        (
            "<firmware><feature enabled='no' name='secure-boot'/></firmware>",
            "/usr/share/OVMF/OVMF_VARS_4M.fd",
        ),
    ],
)
def test_autoselected_firmware_template_as_libvirt_selects_it(
    tmp_path, capsys, fakes, features, template
):
    """<os firmware='efi'> (bookworm's libvirt keeps no template in the definition): the
    template of the first firmware descriptor that fits the domain."""
    root = never_started_host(tmp_path, " firmware='efi'", f"    {features}\n" if features else "")
    rc, out, err = run(capsys, "--libvirt", "--root", str(root), "--json")
    (domain,) = json.loads(out)["domains"]
    assert domain["nvram"] == "/var/lib/libvirt/qemu/nvram/new_VARS.fd", err
    assert domain["template"] == template and domain["nvram_exists"] is False
    assert domain["template_from"].startswith("/usr/share/qemu/firmware/")
    if template.endswith(".ms.fd"):
        assert rc == 1 and domain["verdict"] == "action-needed"
    else:
        # No keys enrolled: the VM will run in setup mode, Secure Boot not enforced.
        assert domain["verdict"] != "action-needed", domain["verdict"]
    # A template libvirt picked by itself is not created by --fix: libvirt may pick
    # another (its rules change between releases) and a store of another firmware build
    # does not boot; it says how to let libvirt create it.
    rc, out, err = run(capsys, "--libvirt", "--root", str(root), "--fix", *cert_args(fakes))
    assert not (root / "var/lib/libvirt/qemu/nvram/new_VARS.fd").exists()
    if template.endswith(".ms.fd"):
        assert "not fixed: NVRAM not created yet" in out and "virsh start --paused new" in out


def test_descriptor_in_etc_replaces_or_hides_the_one_in_usr(tmp_path, capsys):
    root = never_started_host(tmp_path, " firmware='efi'", "")
    etc = root / "etc/qemu/firmware"
    etc.mkdir(parents=True)
    (etc / "40-edk2-x86_64-secure-enrolled.json").write_text("")  # masked
    rc, out, err = run(capsys, "--libvirt", "--root", str(root), "--json")
    (domain,) = json.loads(out)["domains"]
    assert domain["template"] == "/usr/share/OVMF/OVMF_VARS_4M.fd", err
    assert domain["template_from"] == "/usr/share/qemu/firmware/50-edk2-x86_64-secure.json"
    mine = json.loads((FIRMWARE / "60-edk2-x86_64.json").read_text())
    mine["mapping"]["nvram-template"]["filename"] = "/usr/share/OVMF/OVMF_VARS_4M.ms.fd"
    (etc / "10-mine.json").write_text(json.dumps(mine))
    rc, out, err = run(capsys, "--libvirt", "--root", str(root), "--json")
    (domain,) = json.loads(out)["domains"]
    assert domain["template_from"] == "/etc/qemu/firmware/10-mine.json" and rc == 1, err


def test_legacy_loader_template_from_qemu_conf(tmp_path, capsys):
    """A loader path no descriptor names: libvirt takes qemu.conf's nvram list."""
    loader = "    <loader readonly='yes' type='pflash'>/opt/fw/CODE.fd</loader>\n"
    root = never_started_host(tmp_path, "", loader)
    (root / "etc/libvirt/qemu.conf").write_text(
        '# nvram = [ "/opt/fw/CODE.fd:/nowhere" ]\n'
        'nvram = [\n  "/opt/other.fd:/x",\n'
        '  "/opt/fw/CODE.fd:/usr/share/OVMF/OVMF_VARS_4M.ms.fd"\n]\n'
    )
    rc, out, err = run(capsys, "--libvirt", "--root", str(root), "--json")
    (domain,) = json.loads(out)["domains"]
    assert domain["template"] == "/usr/share/OVMF/OVMF_VARS_4M.ms.fd", err
    assert domain["template_from"] == "/etc/libvirt/qemu.conf (nvram)" and rc == 1


def test_no_template_found_is_an_error_verdict(tmp_path, capsys):
    root = never_started_host(tmp_path, " firmware='efi'", "", descriptors=False)
    rc, out, err = run(capsys, "--libvirt", "--root", str(root))
    assert rc == 2 and "not created" not in out
    assert "no such file, and no template (no firmware descriptor" in out, out


def test_files_are_read_when_libvirt_is_not_asked_and_it_says_so(tmp_path, capsys):
    root = libvirt_host(tmp_path, False)
    rc, out, err = run(capsys, "--libvirt", "--root", str(root), "--json")
    doc = json.loads(out)
    assert doc["source"] == "files" and "transient domains are not seen" in doc["note"]
    assert all(d["transient"] is False for d in doc["domains"])
    rc, out, err = run(capsys, "--libvirt", "--root", str(root))
    assert out.startswith("domains from files: --root names another tree: read ")


def test_a_running_vms_store_is_read_until_two_reads_agree(tmp_path, monkeypatch):
    libvirt = importlib.import_module("debadmin.secureboot_ca_check.libvirt")
    reads = iter([b"a", b"b", b"c", b"c"])
    slept = []
    monkeypatch.setattr(fix, "read_nvram", lambda path: next(reads))
    monkeypatch.setattr("time.sleep", slept.append)
    assert libvirt.read_running(tmp_path) == b"c"
    assert slept == [0.05, 0.1]  # the first retry at once, then pauses growing
    reads = iter([b"%d" % i for i in range(len(libvirt.RUNNING_PAUSES) + 1)] + [b"x"])
    slept.clear()
    with pytest.raises(sbc.Error, match="changed between reads"):
        libvirt.read_running(tmp_path)
    assert slept == [p for p in libvirt.RUNNING_PAUSES if p]
    assert next(reads) == b"x"  # no read after the last pause's disagreed


def test_live_definition_from_virsh_dumpxml(tmp_path):
    """What virsh dumpxml prints for a running transient domain: the <nvram> libvirt
    chose, the template it copied."""
    libvirt = importlib.import_module("debadmin.secureboot_ca_check.libvirt")
    xml = DOMAIN_XML.format(
        name="tr",
        uuid=uuid.uuid4(),
        firmware="",
        loader=LOADER.format(code=CODE, fmt="", path="/var/lib/libvirt/qemu/nvram/tr_VARS.fd"),
    ).split("-->", 1)[1]
    domain = libvirt.parse_domain(libvirt.check_xml_text(xml.encode(), "virsh"), "virsh", "x")
    assert domain.nvram == "/var/lib/libvirt/qemu/nvram/tr_VARS.fd"
    assert domain.template == "/usr/share/OVMF/OVMF_VARS_4M.ms.fd"
    with pytest.raises(sbc.Error, match="DOCTYPE"):
        libvirt.check_xml_text(b"<!DOCTYPE x []><domain/>", "virsh")


def test_libvirt_json_keys_are_in_the_man_page(tmp_path, capsys, fakes):
    loader = LOADER.format(code=CODE, fmt="", path="/var/lib/libvirt/qemu/nvram/new_VARS.fd")
    root = never_started_host(tmp_path, "", loader)
    rc, out, err = run(
        capsys, "--libvirt", "--root", str(root), "--fix", *cert_args(fakes), "--json"
    )
    first = json.loads(out)
    keys = set(first) | {k for d in first["domains"] for k in d if k != "report"}
    (new,) = first["domains"]
    assert new["fix"]["created_from"] and new["template_from"], err
    keys |= set(new["fix"])
    page = (Path(__file__).resolve().parents[2] / "man/secureboot-ca-check.8").read_text()
    words = set(re.findall(r"[a-z_]+", page.replace("\\-", "-")))
    assert keys - words == set(), keys - words


# --- a VM powered off (virsh destroy) while its firmware wrote a variable ---------------


def unfinished(state: int, sizes: bool = True) -> bytes:
    """A variable edk2 was writing: header, then (VAR_HEADER_VALID_ONLY) name and data
    not yet programmed; or (sizes=False) a header whose sizes were not written yet."""
    blob = bytearray(variable("Boot0007", b"\x01" * 90, state=state))
    blob[60:] = b"\xff" * (len(blob) - 60)
    if not sizes:
        blob[36:48] = b"\xff" * 12
    return bytes(blob)


def edk2_sees(data: bytes):
    """What edk2 finds in a store, written here from its sources, not from the tool's
    reader: the walk of MdeModulePkg VariableParsing.c (IsValidVariableHeader,
    GetNextVariablePtr; NameSizeOfVariable and DataSizeOfVariable count 0 when State,
    NameSize, DataSize or Attributes is all ones), FindVariableEx's choice of copy, and
    whether VariableWriteServiceInitialize finds the rest free (else it reclaims, and
    keeps only what the walk found).  ({name: data}, where the walk ends, rest free)."""
    end = STORE_AT + struct.unpack_from("<I", data, STORE_AT + 16)[0]
    offset, added, transition = FIRST_VAR, {}, {}
    while offset < end and struct.unpack_from("<H", data, offset)[0] == 0x55AA:
        state, attributes = data[offset + 2], struct.unpack_from("<I", data, offset + 4)[0]
        name_size, data_size = struct.unpack_from("<II", data, offset + 36)
        if state == 0xFF or 0xFFFFFFFF in (name_size, data_size, attributes):
            name_size = data_size = 0
        name = data[offset + 60 : offset + 60 + name_size].decode("utf-16-le", "replace")
        value = data[offset + 60 + name_size : offset + 60 + name_size + data_size]
        if state == 0x3F:
            added.setdefault(name.rstrip("\0"), value)
        elif state == 0x3E:
            transition[name.rstrip("\0")] = value
        offset = (offset + 60 + name_size + data_size + 3) & ~3
    return {**transition, **added}, offset, data[offset:end].count(0xFF) == end - offset


def assert_edk2_sees_the_fix(before: bytes, after: bytes, fakes) -> None:
    seen_before, _, _ = edk2_sees(before)
    seen, _, free = edk2_sees(after)
    assert free, "edk2 would reclaim the fixed store and drop what follows its end"
    assert seen["KEK"].startswith(seen_before["KEK"])
    assert seen["KEK"].endswith(der(fake_cas_of(fakes, "kek_2k_ca_2023")))
    assert seen["db"].startswith(seen_before["db"])
    assert der(fake_cas_of(fakes, "uefi_ca_2023")) in seen["db"]
    assert {k: v for k, v in seen.items() if k not in ("KEK", "db")} == {
        k: v for k, v in seen_before.items() if k not in ("KEK", "db")
    }


@pytest.mark.parametrize("state", [0x7F, 0xFF])
def test_an_interrupted_variable_write_is_stepped_over(tmp_path, capsys, fakes, state):
    """Found by test-libvirt-nspawn: a VM destroyed while OVMF wrote a variable left one
    whose name was unwritten, and the check refused the whole store."""
    path = tmp_path / "VARS.fd"
    tail = unfinished(state)
    path.write_bytes(make_store(ms_variables() + [tail]))
    rc, out, err = run(capsys, "--varstore", str(path), "--json")
    assert rc == 1 and json.loads(out)["reports"][0]["verdict"] == "action-needed", err
    before = path.read_bytes()
    at = before.index(tail)
    rc, out, err = run(capsys, "--varstore", str(path), "--fix", *cert_args(fakes))
    assert rc == 0 and "added" in out, err
    after = path.read_bytes()
    # Kept as edk2 keeps it until it reclaims; the new copies where edk2 writes its next
    # variable: after the sizes of a VAR_HEADER_VALID_ONLY one, right after the header
    # of one still 0xFF (edk2 counts its sizes as 0, and its walk ends in its name).
    kept = len(tail) if state == 0x7F else 60
    assert after[at : at + kept] == tail[:kept]
    assert after[at + kept : at + kept + 2] == b"\xaa\x55"
    assert_edk2_sees_the_fix(before, after, fakes)


def test_an_interrupted_header_without_sizes_is_the_header_alone(tmp_path, capsys, fakes):
    path = tmp_path / "VARS.fd"
    path.write_bytes(make_store(ms_variables() + [unfinished(0xFF, sizes=False)]))
    rc, out, err = run(capsys, "--varstore", str(path), "--json")
    assert rc == 1, err
    before = path.read_bytes()
    rc, out, err = run(capsys, "--varstore", str(path), "--fix", *cert_args(fakes))
    assert rc == 0 and "added" in out, err
    assert_edk2_sees_the_fix(before, path.read_bytes(), fakes)


@pytest.mark.parametrize("how", ["state", "attributes", "torn"])
def test_fix_compacts_a_store_edk2_would_reclaim(tmp_path, capsys, fakes, how):
    """A header edk2 steps over alone (State 0xFF, or all-ones attributes) though its name
    and data were programmed, or the next header torn: edk2's walk ends there and, the
    rest not free, it reclaims at its next start.  --fix appended after it: the new KEK
    and db were dropped and the old copies marked deleted, no KEK, no db at all."""
    if how == "state":
        tail = variable("Boot0007", b"\x01" * 90, state=0xFF)
    elif how == "attributes":
        tail = variable("Boot0007", b"\x01" * 90, state=0x7F, attrs=0xFFFFFFFF)
    else:  # the header of the next variable torn after its first byte
        tail = b"\xaa"
    path = tmp_path / "VARS.fd"
    path.write_bytes(make_store(ms_variables() + [tail]))
    before = path.read_bytes()
    assert not edk2_sees(before)[2]
    rc, out, err = run(capsys, "--varstore", str(path), "--json")
    assert rc == 1 and json.loads(out)["reports"][0]["verdict"] == "action-needed", err
    rc, out, err = run(capsys, "--varstore", str(path), "--fix", *cert_args(fakes))
    assert rc == 0 and "added" in out, err
    after = path.read_bytes()
    assert_edk2_sees_the_fix(before, after, fakes)
    assert "Boot0007".encode("utf-16-le") not in after[: STORE_AT + 0x3FFB8]
    assert backups(path)


def test_a_half_written_name_size_does_not_hide_the_keys(tmp_path, capsys):
    """A VAR_HEADER_VALID_ONLY variable with an odd or huge NameSize is stepped over by
    its sizes, as edk2 does: the check read none of the later variables and said setup
    mode (exit 3)."""
    for name_size in (17, 18, 2000):
        blob = bytearray(variable("Boot0007", b"\x01" * 90, state=0x7F)[:60])
        struct.pack_into("<I", blob, 36, name_size)
        blob += b"\x01" * (name_size + 90)
        blob += b"\xff" * (-len(blob) % 4)
        variables = ms_variables()
        path = tmp_path / f"VARS{name_size}.fd"
        path.write_bytes(make_store(variables[:1] + [bytes(blob)] + variables[1:]))
        seen = sorted(edk2_sees(path.read_bytes())[0])
        assert seen == ["CustomMode", "KEK", "PK", "db", "dbx"], name_size
        rc, out, err = run(capsys, "--varstore", str(path), "--json")
        report = json.loads(out)["reports"][0]
        assert rc == 1 and report["verdict"] == "action-needed", (name_size, err)


def test_bytes_after_the_last_finished_variable_are_damage(tmp_path, capsys, fakes):
    """Not what a power-off leaves: exit 2 for the check and for --fix, nothing written."""
    path = tmp_path / "VARS.fd"
    path.write_bytes(make_store(ms_variables() + [b"\xff" * 64 + b"garbage"]))
    original = path.read_bytes()
    rc, out, err = run(capsys, "--varstore", str(path))
    assert rc == 2 and "after the last variable" in err
    rc, out, err = run(capsys, "--varstore", str(path), "--fix", *cert_args(fakes))
    assert rc == 2 and out == "" and path.read_bytes() == original and backups(path) == []


def test_a_broken_descriptor_leaves_no_template(tmp_path, capsys):
    """libvirt reads every descriptor before it selects: one it cannot parse, and no
    domain with firmware autoselection starts."""
    root = never_started_host(tmp_path, " firmware='efi'", "")
    (root / "usr/share/qemu/firmware/70-broken.json").write_text("{")
    rc, out, err = run(capsys, "--libvirt", "--root", str(root))
    assert rc == 2 and "70-broken.json is not a firmware descriptor libvirt can read" in out


def test_one_vm_that_cannot_be_written_does_not_stop_the_others(tmp_path, capsys, fakes):
    """An OSError while creating one VM's NVRAM (here: its directory does not exist)
    aborted the whole --libvirt --fix with exit 2 and nothing on stdout, after another
    VM had been written."""
    root = never_started_host(
        tmp_path, "", LOADER.format(code=CODE, fmt="", path="/var/lib/libvirt/qemu/nvram/a.fd")
    )
    missing = LOADER.format(code=CODE, fmt="", path="/srv/vms/zzz_VARS.fd")
    (root / "etc/libvirt/qemu/zzz.xml").write_text(
        DOMAIN_XML.format(name="zzz", uuid=uuid.uuid4(), firmware="", loader=missing)
    )
    rc, out, err = run(
        capsys, "--libvirt", "--root", str(root), "--fix", "--json", *cert_args(fakes)
    )
    assert rc == 2, err
    new, zzz = json.loads(out)["domains"]
    assert new["fix"]["written"] and (root / "var/lib/libvirt/qemu/nvram/a.fd").is_file()
    assert len(new["fix"]["added"]) == 4 and new["exit_status"] != 2
    assert zzz["exit_status"] == 2 and "fix" not in zzz
    assert zzz["skipped"] == (
        "refused: cannot write /srv/vms/zzz_VARS.fd: No such file or directory"
    )
    assert not (root / "srv").exists()
    rc, out, err = run(capsys, "--libvirt", "--root", str(root), "--fix", *cert_args(fakes))
    assert rc == 2 and "not fixed: refused: cannot write /srv/vms/zzz_VARS.fd" in out


FAKE_VIRSH = """#!/bin/sh
# virsh as libvirt 9-11 answers: 'gone' stops (a transient domain) between 'list' and
# 'dumpxml', for which virshLookupDomainInternal() prints only "failed to get domain";
# 'broken' is still there but its definition cannot be read.
shift 2
case "$1" in
list)
    case "$*" in *--state-shutoff*|*--with-managed-save*) exit 0;; esac
    [ -e "$STATE/gone" ] || echo {gone}
    echo {broken}
    case "$*" in *--transient*) ;; *) echo {good};; esac
    exit 0;;
dumpxml)
    case "$2" in
    {good}) cat "$STATE/good.xml"; exit 0;;
    {gone}) touch "$STATE/gone";;
    esac
    echo "error: failed to get domain '$2'" >&2; exit 1;;
domname)
    [ "$2" = {broken} ] && echo broken-vm && exit 0
    echo "error: failed to get domain '$2'" >&2; exit 1;;
esac
exit 1
"""


def test_a_domain_gone_between_list_and_dumpxml_is_skipped(tmp_path, monkeypatch):
    """Real virsh never says "Domain not found" there: the domain that went away was an
    error verdict (exit 2); the one whose definition cannot be read is named by its name
    and not said to be persistent when libvirt lists it as transient."""
    libvirt = importlib.import_module("debadmin.secureboot_ca_check.libvirt")
    ids = {k: str(uuid.uuid4()) for k in ("gone", "broken", "good")}
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "virsh").write_text(FAKE_VIRSH.format(**ids))
    (bindir / "virsh").chmod(0o755)
    (tmp_path / "good.xml").write_text(
        DOMAIN_XML.format(name="good", uuid=ids["good"], firmware="", loader="")
    )
    monkeypatch.setenv("STATE", str(tmp_path))
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    domains, source = libvirt.read_domains(Path("/"))
    assert source["source"] == "libvirt"
    assert source["note"] == (
        "not checked, gone while they were read (transient domains that stopped): " + ids["gone"]
    )
    broken, good = domains
    assert good.name == "good" and good.error is None and good.transient is False
    assert broken.name == "broken-vm" and broken.transient is True
    assert broken.error == f"virsh dumpxml {ids['broken']}: error: failed to get domain " + (
        f"'{ids['broken']}'"
    )
    assert "note: not checked, gone" in libvirt.render([], False, source)


@pytest.mark.parametrize(
    "loader",
    [
        "    <loader stateless='yes'/>\n",
        "    <loader type='rom'/>\n",
        "    <loader readonly='yes' type='rom'>/usr/share/OVMF/OVMF.fd</loader>\n",
    ],
)
def test_stateless_and_rom_loaders_have_no_nvram(tmp_path, capsys, fakes, loader):
    """libvirt gives such a loader no NVRAM file: it had a made-up NAME_VARS.fd and a
    template's action-needed verdict that --fix could never clear."""
    root = never_started_host(tmp_path, " firmware='efi'", loader)
    rc, out, err = run(capsys, "--libvirt", "--root", str(root), "--json")
    (domain,) = json.loads(out)["domains"]
    assert rc == 3 and domain["verdict"] == "no-nvram" and domain["nvram"] is None, out
    assert "no NVRAM file" in domain["reason"] and "template" not in domain
    rc, out, err = run(capsys, "--libvirt", "--root", str(root), "--fix", *cert_args(fakes))
    assert rc == 3 and "domain new (shut off): no UEFI NVRAM (" in out, out
    assert "keeps no variables between boots" in out
    assert list((root / "var/lib/libvirt/qemu/nvram").iterdir()) == []


def test_stateless_loader_matches_no_flash_template(tmp_path):
    libvirt = importlib.import_module("debadmin.secureboot_ca_check.libvirt")
    os_element = libvirt.ElementTree.fromstring(
        "<os firmware='efi'><type arch='x86_64' machine='pc-q35-7.2'>hvm</type>"
        "<loader stateless='yes'/></os>"
    )
    document = json.loads((FIRMWARE / "50-edk2-x86_64-secure.json").read_text())
    assert not libvirt.descriptor_matches(document, os_element, (False, False))
    os_element.remove(os_element.find("loader"))
    assert libvirt.descriptor_matches(document, os_element, (False, False))


def test_template_links_under_root_stay_in_root(tmp_path, capsys, fakes):
    """Under --root, a template that is a symbolic link (Debian's /usr/share/OVMF has
    such links) was followed out of the tree: this host's file was judged, and --fix
    built the VM's NVRAM from it."""
    root = never_started_host(
        tmp_path, "", LOADER.format(code=CODE, fmt="", path="/var/lib/libvirt/qemu/nvram/a.fd")
    )
    ovmf = root / "usr/share/OVMF"
    marked = make_store([variable("OnlyInRoot", b"\1")] + ms_variables())
    (ovmf / "OVMF_VARS_4M.ms.fd").write_bytes(marked)
    (ovmf / "abs.fd").symlink_to("/usr/share/OVMF/OVMF_VARS_4M.ms.fd")
    (ovmf / "escape.fd").symlink_to("../../../../../../../../../../etc/hostname")
    (root / "etc/passwd").write_text("x")  # a file the host has, with other contents
    (ovmf / "passwd.fd").symlink_to("/etc/passwd")
    for name in ("abs", "escape", "passwd"):
        loader = LOADER.format(code=CODE, fmt="", path=f"/var/lib/libvirt/qemu/nvram/{name}.fd")
        loader = loader.replace("OVMF_VARS_4M.ms.fd", f"{name}.fd")
        (root / f"etc/libvirt/qemu/{name}.xml").write_text(
            DOMAIN_XML.format(name=name, uuid=uuid.uuid4(), firmware="", loader=loader)
        )
    rc, out, err = run(capsys, "--libvirt", "--root", str(root), "--json")
    domains = {d["domain"]: d for d in json.loads(out)["domains"]}
    assert domains["abs"]["verdict"] == "action-needed", domains["abs"]
    assert domains["abs"]["report"]["source"]["path"] == str(ovmf / "OVMF_VARS_4M.ms.fd")
    assert domains["escape"]["error"] == f"template {root}/etc/hostname: no such file"
    assert domains["passwd"]["error"].startswith(f"{root}/etc/passwd: ")
    rc, out, err = run(capsys, "--libvirt", "--root", str(root), "--fix", *cert_args(fakes))
    made = root / "var/lib/libvirt/qemu/nvram/abs.fd"
    assert "OnlyInRoot".encode("utf-16-le") in made.read_bytes(), out


def test_nvram_directory_links_under_root_stay_in_root(tmp_path, capsys):
    libvirt = importlib.import_module("debadmin.secureboot_ca_check.libvirt")
    (tmp_path / "var/lib").mkdir(parents=True)
    (tmp_path / "srv").mkdir()
    (tmp_path / "var/lib/libvirt").symlink_to("/srv")
    domain = libvirt.Domain("x", "x.xml", "/var/lib/libvirt/x_VARS.fd")
    assert libvirt.nvram_path(domain, tmp_path) == tmp_path / "srv/x_VARS.fd"
    assert libvirt.in_root(Path("/"), "/usr/share/OVMF/x") == Path("/usr/share/OVMF/x")


# --- edges (issue 26): qcow2 checked, blank stores not applicable ----------------------------


OVMF_PLAIN = Path("/usr/share/OVMF/OVMF_VARS_4M.fd")
AAVMF_BLANK = Path("/usr/share/AAVMF/AAVMF_VARS.fd")


def to_qcow2(raw: Path, path: Path) -> Path:
    subprocess.run(
        ["qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(raw), str(path)], check=True
    )
    return path


def blank_template(path: Path) -> Path:
    """bookworm's AAVMF_VARS.fd (64 MiB of zeros) when installed, else the same made here."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if AAVMF_BLANK.is_file() and not AAVMF_BLANK.read_bytes().strip(b"\0"):
        shutil.copyfile(AAVMF_BLANK, path)
    else:
        with open(path, "wb") as out:
            out.truncate(64 << 20)
    return path


@needs_qemu_img
@pytest.mark.skipif(not (OVMF_MS.is_file() and OVMF_PLAIN.is_file()), reason="ovmf not installed")
def test_qcow2_varstore_is_checked_as_its_raw_copy(tmp_path, capsys):
    """What trixie's libvirt writes (qcow2) is checked, not only fixed: the same report as
    the raw file it was made from, whatever the file's format."""
    for template, code in ((OVMF_MS, 1), (OVMF_PLAIN, 3)):
        path = to_qcow2(template, tmp_path / (template.stem + ".qcow2"))
        rc, out, err = run(capsys, "--varstore", str(path), "--root", str(tmp_path), "--json")
        rc_raw, out_raw, _ = run(
            capsys, "--varstore", str(template), "--root", str(tmp_path), "--json"
        )
        assert rc == rc_raw == code and err == "", err
        report, raw = json.loads(out)["reports"][0], json.loads(out_raw)["reports"][0]
        assert report["source"]["path"] == str(path)
        report["source"] = raw["source"]
        assert report == raw
    # The text report too, and a damaged qcow2 is still one error line.
    rc, out, err = run(capsys, "--varstore", str(tmp_path / "OVMF_VARS_4M.ms.qcow2"))
    assert rc == 1 and "kek-2023-missing" not in out and "KEK lacks" in out and err == ""
    broken = tmp_path / "broken.qcow2"
    broken.write_bytes(b"QFI\xfb" + b"\0" * 100)
    rc, out, err = run(capsys, "--varstore", str(broken))
    assert rc == 2 and out == "" and err.count("\n") == 1 and "error:" in err


@pytest.mark.parametrize("qcow2", [False, pytest.param(True, marks=needs_qemu_img)])
def test_blank_varstore_is_not_applicable(tmp_path, capsys, fakes, qcow2):
    blank = blank_template(tmp_path / "AAVMF_VARS.fd")
    if qcow2:
        blank = to_qcow2(blank, tmp_path / "AAVMF_VARS.qcow2")
    rc, out, err = run(capsys, "--varstore", str(blank))
    assert rc == 3 and err == "" and out.count("\n") == 1
    assert out.startswith(f"== {blank} (varstore): not applicable: blank NVRAM")
    assert "never started" in out
    rc, out, err = run(capsys, "--varstore", str(blank), "--quiet")
    assert (rc, out, err) == (3, "", "")
    rc, out, err = run(capsys, "--varstore", str(blank), "--json")
    doc = json.loads(out)
    assert rc == doc["exit_status"] == 3 and err == ""
    assert doc["reports"][0]["verdict"] == "not-applicable"
    assert [f["code"] for f in doc["findings"]] == ["blank-nvram"]
    # Beside a store that needs action: that one's verdict, the blank one's line.
    store = tmp_path / "VARS.fd"
    store.write_bytes(make_store(ms_variables()))
    rc, out, err = run(capsys, "--varstore", str(blank), "--varstore", str(store), "--quiet")
    assert rc == 1 and err == "" and "blank NVRAM" not in out and f"== {store}" in out
    # --fix has nothing to add to: a verdict, not an error; nothing written.
    argv = ["--varstore", str(blank), "--fix", "--root", str(tmp_path), *cert_args(fakes)]
    rc, out, err = run(capsys, *argv)
    assert rc == 3 and out == "" and "blank NVRAM" in err and "error" not in err
    assert not list(tmp_path.glob("*.bak"))


def add_domain(root: Path, name: str, arch: str, loader: str) -> None:
    xml = DOMAIN_XML.format(name=name, uuid=uuid.uuid4(), firmware="", loader=loader)
    (root / f"etc/libvirt/qemu/{name}.xml").write_text(
        xml.replace("arch='x86_64' machine='pc-q35-7.2'", f"arch='{arch}' machine='virt'")
    )


def test_libvirt_never_started_aarch64_vm_is_not_applicable(tmp_path, capsys):
    """bookworm's blank AAVMF template: that domain is not applicable, the others are
    judged as usual, and the run's status comes from them (issue 26)."""
    root = libvirt_host(tmp_path, False)
    blank_template(root / "usr/share/AAVMF/AAVMF_VARS.fd")
    loader = (
        "    <loader readonly='yes' type='pflash'>/usr/share/AAVMF/AAVMF_CODE.fd</loader>\n"
        "    <nvram template='/usr/share/AAVMF/AAVMF_VARS.fd'>"
        "/var/lib/libvirt/qemu/nvram/arm_VARS.fd</nvram>\n"
    )
    add_domain(root, "arm", "aarch64", loader)
    rc, out, err = run(capsys, "--libvirt", "--root", str(root), "--json")
    doc = {d["domain"]: d for d in json.loads(out)["domains"]}
    assert rc == 1 and err == ""
    assert doc["arm"]["verdict"] == "not-applicable" and doc["arm"]["exit_status"] == 3
    assert doc["arm"]["nvram_exists"] is False
    assert doc["web"]["verdict"] == "action-needed"
    rc, out, err = run(capsys, "--libvirt", "--root", str(root))
    assert rc == 1 and err == ""
    assert (
        "domain arm (shut off): NVRAM /var/lib/libvirt/qemu/nvram/arm_VARS.fd not created" in out
    )
    assert "not applicable: blank NVRAM (every byte 0x00)" in out
    # Created by a first start that never got as far as the firmware: the same verdict.
    blank_template(root / "var/lib/libvirt/qemu/nvram/arm_VARS.fd")
    for name in ("web", "db1", "legacy"):
        (root / f"etc/libvirt/qemu/{name}.xml").unlink()
    rc, out, err = run(capsys, "--libvirt", "--root", str(root))
    assert rc == 3 and err == "" and "domain arm (shut off): not-applicable" in out
    rc, out, err = run(capsys, "--libvirt", "--root", str(root), "--quiet")
    assert (rc, out, err) == (3, "", "")


def test_the_check_and_a_dry_run_open_the_file_read_only(tmp_path, capsys, fakes, monkeypatch):
    """A read-only NVRAM file (a read-only mount, a copy without write permission) is
    checked and dry-run fixed (the CA update and dbx's): opened O_RDONLY, no lock taken,
    while a running VM's lock is still seen."""
    if not OVMF_MS.exists():
        pytest.skip("ovmf is not installed")
    path = tmp_path / "VARS.fd"
    shutil.copyfile(OVMF_MS, path)
    original = path.read_bytes()
    path.chmod(0o444)
    opened = []
    real_open = os.open

    def spy(name, flags, *rest, **kwargs):
        if os.fspath(name) == str(path):
            opened.append(flags & os.O_ACCMODE)
        return real_open(name, flags, *rest, **kwargs)

    monkeypatch.setattr(os, "open", spy)
    rc, out, err = run(capsys, "--varstore", str(path), "--json")
    assert rc == 1 and err == "" and json.loads(out)["reports"][0]["source"]["path"] == str(path)
    rc, out, err = run(capsys, "--varstore", str(path), "--fix", "--dry-run", *cert_args(fakes))
    assert rc == 0 and "would add" in out and err == ""
    rc, out, err = run(capsys, "--varstore", str(path), "--fix", "--dbx", "--dry-run", "--json")
    assert rc == 0 and json.loads(out)["dbx"]["status"] == "planned" and err == ""
    assert len(opened) == 3 and set(opened) == {os.O_RDONLY}, opened
    assert path.read_bytes() == original and backups(path) == []
    # Asking for a lock is not taking one: a running qemu's read lock is still found.
    fd = real_open(path, os.O_RDONLY)
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_RDLCK, 0, 100, 1, 0))
        rc, out, err = run(
            capsys, "--varstore", str(path), "--fix", "--dry-run", *cert_args(fakes)
        )
    finally:
        os.close(fd)
    assert rc == 2 and "locked by another process" in err
    # And the write itself still opens it for writing (refused here: not writable, unless
    # root, who may write it anyway).
    rc, out, err = run(capsys, "--varstore", str(path), "--fix", *cert_args(fakes))
    assert opened[-1] == os.O_RDWR


def test_libvirt_fix_dbx_is_refused_before_anything_is_read(tmp_path, capsys, monkeypatch):
    """--libvirt --fix --dbx: each VM's ESP is in its own disk, so it is refused as a
    usage error (exit 2, one line, a JSON object with --json), no domain read, no file
    written; the way is --varstore with --esp."""
    root = libvirt_host(tmp_path, False)
    nvram = root / "var/lib/libvirt/qemu/nvram"
    before = {p: p.read_bytes() for p in nvram.iterdir()}
    from debadmin.secureboot_ca_check import libvirt

    def never(*args, **kwargs):
        raise AssertionError("a domain was read")

    monkeypatch.setattr(libvirt, "cmd_libvirt", never)
    for extra in ([], ["--dry-run"], ["--json"], ["--dbx-update", "DBX/amd64/DBXUpdate.bin"]):
        rc, out, err = run(capsys, "--libvirt", "--root", str(root), "--fix", "--dbx", *extra)
        assert rc == 2 and len(err.splitlines()) == 1, (extra, err)
        assert "--fix --dbx does not take --libvirt" in err and "--esp" in err
        if "--json" in extra:
            doc = json.loads(out)
            assert doc["exit_status"] == 2 and "--libvirt" in doc["error"]
        else:
            assert out == ""
    assert {p: p.read_bytes() for p in nvram.iterdir()} == before


def test_a_block_device_fix_says_only_this_hosts_openers_are_seen():
    """A VM on another cluster node, or qemu through librbd, holds no /dev node here."""
    result = {"path": "/dev/pve/vm-100-disk-1", "added": [], "present": [], "unavailable": []}
    assert not any("note:" in line for line in fix.render_fix(dict(result, format="raw"), True))
    lines = fix.render_fix(dict(result, format="block device"), True)
    (note,) = [line for line in lines if "note:" in line]
    assert "another cluster node" in note and "librbd" in note and "qm status VMID" in note
