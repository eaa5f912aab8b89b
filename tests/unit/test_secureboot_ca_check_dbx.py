"""secureboot-ca-check --fix --dbx: the dbx plan, the boot-path check, the write, the finding.

Real inputs: Debian's signed shim and GRUB (and a signed kernel where one is at hand), the
dbx updates Microsoft published as this package ships them, the real keys of Debian's
OVMF_VARS_4M.ms.fd; a test-owned PK and KEK sign the dbx updates that revoke."""

import datetime
import json
import os
import shutil
import struct
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
from debadmin.secureboot_ca_check import checks, dbx, efi, efivarfs, fix, payloads, pe
from debadmin.secureboot_ca_check import main as sbc
from test_secureboot_ca_check_efivarfs import firmware as append_firmware

SRC = Path(__file__).resolve().parents[2]
OBJECTS = SRC / "data" / "secureboot_objects"
REAL = SRC / "tests" / "data" / "secureboot-ca-check" / "real"
SHIM = Path("/usr/lib/shim/shimx64.efi.signed")
GRUB = Path("/usr/lib/grub/x86_64-efi-signed/grubx64.efi.signed")
SHA256_TYPE = "c1c41626-504c-4092-aca9-41f936934328"
UEFI_CA_2011 = "48e99b991f57fc52f76149599bff0a58c47154229b9f8d603ac40d3500248507"
needs_shim = pytest.mark.skipif(not SHIM.is_file(), reason="shim-signed is not installed")
needs_grub = pytest.mark.skipif(
    not GRUB.is_file(), reason="grub-efi-amd64-signed is not installed"
)


# --- the shipped dbx updates ---------------------------------------------------------------


def test_shipped_dbx_updates_verify():
    result = dbx.verify_tree(OBJECTS)
    assert result["problems"] == [] and not result["fatal"]
    assert result["summary"].startswith("6 dbx updates verify")
    for arch in payloads.ARCHES.values():
        assert (OBJECTS / payloads.POST / "DBX" / arch / "DBXUpdate.bin").is_file()
    info = json.loads((OBJECTS / dbx.INFO).read_text())
    listed = {e["authenticodeHash"].lower() for e in info["images"]["x64"]}
    objects = payloads.load_objects(str(OBJECTS))
    update = dbx.read_update(objects, "DBX/amd64/DBXUpdate.bin")
    hashes = {e.data.hex() for e in efi.parse_signature_lists(update.data, "u")}
    # What the x64 update revokes is what Microsoft's list says it revokes.
    assert hashes <= listed | {e.get("flatHash", "").lower() for e in info["images"]["x64"]}


@pytest.mark.parametrize(
    "name, expected",
    [
        (None, "DBX/amd64/DBXUpdate.bin"),
        ("Optional/DBX/DBXUpdate2024.bin", "Optional/DBX/DBXUpdate2024.bin"),
        ("PostSignedObjects/Optional/DBX/DBXUpdate2024.bin", "Optional/DBX/DBXUpdate2024.bin"),
    ],
)
def test_update_paths(name, expected):
    assert dbx.update_path(name, "amd64") == expected


@pytest.mark.parametrize(
    "name", ["/etc/passwd", "DBX/../KEK/x.bin", "Optional/DB/amd64/DBUpdate2024.bin"]
)
def test_update_paths_outside_dbx_are_refused(name):
    with pytest.raises(Error, match="not a dbx update"):
        dbx.update_path(name, "amd64")


# --- the plan on a real dump ---------------------------------------------------------------


def write_efivars(directory: Path, variables: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in variables.items():
        attributes = 0x27 if name in efi.AUTHENTICATED else 0x06
        path = directory / f"{name}-{efi.VARIABLES[name]}"
        path.write_bytes(struct.pack("<I", attributes) + data)
    return directory


def ovmf_variables(**extra) -> dict:
    """The real PK, KEK, db and dbx of Debian 12's OVMF_VARS_4M.ms.fd."""
    variables = {n: (REAL / f"ovmf-ms-{n}.esl").read_bytes() for n in ("PK", "KEK", "db", "dbx")}
    variables.update(SecureBoot=b"\x01", SetupMode=b"\x00")
    variables.update(extra)
    return variables


def run(capsys, *argv):
    rc = sbc.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def dbx_json(capsys, *argv):
    rc, out, err = run(capsys, "--fix", "--dbx", "--json", "--payloads", str(OBJECTS), *argv)
    return rc, (json.loads(out) if out else None), err


def latest_data() -> bytes:
    objects = payloads.load_objects(str(OBJECTS))
    return dbx.read_update(objects, dbx.update_path(None, "amd64")).data


@pytest.fixture(autouse=True)
def amd64(monkeypatch):
    monkeypatch.setattr(efivarfs, "machine_arch", lambda: "amd64")


def esp_copy(tmp_path: Path, *images: Path) -> Path:
    esp = tmp_path / "esp"
    (esp / "EFI/debian").mkdir(parents=True)
    for image in images:
        shutil.copyfile(image, esp / "EFI/debian" / image.name.replace(".signed", ""))
    (esp / "EFI/debian/grub.cfg").write_text("configfile $prefix/grub.cfg\n")
    return esp


@needs_shim
@needs_grub
def test_plan_on_debian_ovmf_dump(tmp_path, capsys):
    """Debian's OVMF keys: Microsoft's latest amd64 dbx update verifies against the KEK CA
    2011 in KEK; Debian's shim and GRUB on the ESP copy are not revoked by it."""
    efivars = write_efivars(tmp_path / "efivars", ovmf_variables())
    esp = esp_copy(tmp_path, SHIM, GRUB)
    rc, doc, err = dbx_json(capsys, "--efivars", str(efivars), "--dry-run", "--esp", str(esp))
    assert rc == 0, err
    result = doc["dbx"]
    assert result["payload"] == "DBX/amd64/DBXUpdate.bin"
    assert result["status"] == "planned" and result["missing"] == result["entries"] > 400
    assert result["signer"]["signed_by"] == "Microsoft Corporation KEK CA 2011"
    assert result["signer"]["trusted_in"] == "KEK"
    binaries = {Path(b["path"]).name: b for b in result["checked"]["binaries"]}
    assert set(binaries) == {"shimx64.efi", "grubx64.efi"}  # grub.cfg is no PE image
    assert binaries["shimx64.efi"]["sha256"] == pe.parse(SHIM.read_bytes(), "s").sha256
    assert {b["verdict"] for b in binaries.values()} == {"ok"}
    assert result["checked"]["other_files"] == 1
    assert result["written"] is False
    assert sorted(os.listdir(efivars)) == sorted(
        f"{n}-{efi.VARIABLES[n]}" for n in ovmf_variables()
    )


def test_a_dbx_holding_the_update_is_a_no_op(tmp_path, capsys):
    efivars = write_efivars(
        tmp_path / "efivars",
        ovmf_variables(dbx=(REAL / "ovmf-ms-dbx.esl").read_bytes() + latest_data()),
    )
    rc, doc, err = dbx_json(capsys, "--efivars", str(efivars), "--dry-run")
    assert rc == 0
    assert doc["dbx"]["status"] == "present" and doc["dbx"]["missing"] == 0
    assert doc["dbx"]["checked"] is None
    rc, out, err = run(capsys, "--efivars", str(efivars), "--payloads", str(OBJECTS), "--json")
    assert rc == 1  # the CA update is still needed; dbx is not behind
    report = json.loads(out)["reports"][0]
    assert report["dbx_update"]["behind"] is False
    assert "dbx-behind" not in {f["code"] for f in report["findings"]}


def test_the_check_says_dbx_is_behind(tmp_path, capsys):
    efivars = write_efivars(tmp_path / "efivars", ovmf_variables())
    textfile = tmp_path / "textfile"
    textfile.mkdir()
    argv = ["--efivars", str(efivars), "--json", "--textfile-dir", str(textfile)]
    rc, out, err = run(capsys, *argv, "--payloads", str(OBJECTS))
    assert rc == 1  # for the CAs: the warning does not change the exit status
    report = json.loads(out)["reports"][0]
    assert report["dbx_update"]["behind"] is True
    assert report["dbx_update"]["latest"] == "DBX/amd64/DBXUpdate.bin"
    (behind,) = [f for f in report["findings"] if f["code"] == "dbx-behind"]
    assert behind["severity"] == "warning"
    metrics = (textfile / checks.TEXTFILE_NAME).read_text()
    assert f'secureboot_ca_check_dbx_behind{{source="{efivars}"}} 1' in metrics


# --- a test-owned PK and KEK, a dbx update that revokes -------------------------------------


def make_cert(name: str, ca: bool = True):
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime(2024, 1, 1)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return key, cert


@pytest.fixture(scope="module")
def owned():
    """A PK and a KEK the test owns (the KEK signs the dbx updates)."""
    return {"PK": make_cert("Test PK"), "KEK": make_cert("Test KEK")}


def hash_list(digests) -> bytes:
    owner = uuid.UUID(efi.MICROSOFT_OWNER).bytes_le
    body = b"".join(owner + bytes.fromhex(d) for d in digests)
    return uuid.UUID(SHA256_TYPE).bytes_le + struct.pack("<III", 28 + len(body), 0, 48) + body


def signed_dbx_update(signer, data: bytes) -> bytes:
    """An authenticated dbx append of data, signed by signer (key, cert) as Microsoft
    signs theirs (bare PKCS#7 SignedData, detached)."""
    timestamp = struct.pack("<HBBBBB", 2025, 2, 1, 0, 0, 0) + bytes(9)
    shell = payloads.Payload("made.bin", "dbx", b"", timestamp, b"", data)
    message = payloads.signed_bytes(shell, payloads.APPEND_ATTRIBUTES)
    options = [
        pkcs7.PKCS7Options.DetachedSignature,
        pkcs7.PKCS7Options.Binary,
        pkcs7.PKCS7Options.NoAttributes,
    ]
    info = (
        pkcs7.PKCS7SignatureBuilder()
        .set_data(message)
        .add_signer(signer[1], signer[0], hashes.SHA256())
        .sign(Encoding.DER, options)
    )
    p7 = cms.ContentInfo.load(info)["content"].untag().dump()
    header = struct.pack("<IHH", 24 + len(p7), 0x200, 0x0EF1)
    header += uuid.UUID(payloads.CERT_TYPE_PKCS7).bytes_le
    return timestamp + header + p7 + data


def owned_tree(tmp_path: Path, name: str, blob: bytes) -> Path:
    """A --payloads tree: the shipped objects, and the test's update under Optional/DBX."""
    tree = tmp_path / "objects"
    if not tree.exists():
        shutil.copytree(OBJECTS, tree)
    (tree / payloads.POST / "Optional/DBX" / name).write_bytes(blob)
    return tree


def owned_variables(owned, **extra) -> dict:
    return ovmf_variables(
        PK=fix.signature_list(efi.der(owned["PK"][1])),
        KEK=fix.signature_list(efi.der(owned["KEK"][1])),
        **extra,
    )


@needs_shim
@needs_grub
def test_an_update_that_revokes_grub_is_refused(tmp_path, capsys, owned):
    """The test's KEK signs a dbx update holding the Authenticode hash of Debian's GRUB:
    refused before any write, GRUB and the entry named, every binary listed."""
    grub_hash = pe.parse(GRUB.read_bytes(), "grub").sha256
    blob = signed_dbx_update(owned["KEK"], hash_list([grub_hash, "ab" * 32]))
    tree = owned_tree(tmp_path, "Revoke.bin", blob)
    efivars = write_efivars(tmp_path / "efivars", owned_variables(owned))
    before = {p.name: p.read_bytes() for p in efivars.iterdir()}
    esp = esp_copy(tmp_path, SHIM, GRUB)
    argv = ["--efivars", str(efivars), "--dry-run", "--esp", str(esp), "--json"]
    argv += ["--fix", "--dbx", "--payloads", str(tree), "--dbx-update", "Optional/DBX/Revoke.bin"]
    rc, out, err = run(capsys, *argv)
    assert rc == 2
    result = json.loads(out)["dbx"]
    assert result["status"] == "refused" and result["signer"]["signed_by"] == "Test KEK"
    verdicts = {Path(b["path"]).name: b["verdict"] for b in result["checked"]["binaries"]}
    assert verdicts == {"grubx64.efi": "revoked", "shimx64.efi": "ok"}
    (revoked,) = [b for b in result["checked"]["binaries"] if b["verdict"] == "revoked"]
    assert revoked["hits"] == [
        {"type": "sha256", "entry": grub_hash, "owner": efi.MICROSOFT_OWNER}
    ]
    assert "grub-install" in revoked["update_first"]
    assert err.count("\n") == 1 and "grubx64.efi is revoked by its sha256 entry" in err
    assert grub_hash in err
    assert {p.name: p.read_bytes() for p in efivars.iterdir()} == before


@needs_shim
def test_an_x509_entry_revokes_through_the_chain(tmp_path, capsys, owned):
    """Microsoft Corporation UEFI CA 2011 as an X.509 dbx entry: Debian's shim, whose
    first signature chains to it, is blocked (edk2 refuses an image any of whose
    signatures dbx forbids), though its second chains to the 2023 CA."""
    image = pe.parse(SHIM.read_bytes(), "shim")
    ca_2011 = next(c for c in image.signatures[0].certs if efi.fingerprint(c) == UEFI_CA_2011)
    blob = signed_dbx_update(owned["KEK"], fix.signature_list(efi.der(ca_2011)))
    tree = owned_tree(tmp_path, "RevokeCA.bin", blob)
    efivars = write_efivars(tmp_path / "efivars", owned_variables(owned))
    esp = esp_copy(tmp_path, SHIM)
    rc, doc, err = dbx_json(
        capsys,
        "--efivars",
        str(efivars),
        "--dry-run",
        "--esp",
        str(esp),
        "--payloads",
        str(tree),
        "--dbx-update",
        "Optional/DBX/RevokeCA.bin",
    )
    assert rc == 2
    (shim,) = [b for b in doc["dbx"]["checked"]["binaries"] if b["origin"] == "esp"]
    assert shim["verdict"] == "revoked"
    assert shim["hits"][0]["type"] == "x509"
    assert shim["hits"][0]["entry"] == "Microsoft Corporation UEFI CA 2011"
    assert shim["hits"][0]["signature"] == 1
    assert "shim-signed" in shim["update_first"]


def test_an_update_no_kek_certificate_signs_cannot_be_appended(tmp_path, capsys, owned):
    """Microsoft's update on a machine whose KEK is the test's alone: exit 1, nothing
    checked or written."""
    efivars = write_efivars(tmp_path / "efivars", owned_variables(owned))
    rc, doc, err = dbx_json(capsys, "--efivars", str(efivars), "--dry-run")
    assert rc == 1
    assert doc["dbx"]["status"] == "not-possible"
    assert "no certificate of this KEK" in doc["dbx"]["reason"]


def test_a_damaged_update_is_refused(tmp_path, capsys):
    objects = payloads.load_objects(str(OBJECTS))
    blob = bytearray(dbx.read_update(objects, "DBX/amd64/DBXUpdate.bin").blob)
    blob[-5] ^= 1  # a revoked hash, changed by one bit
    tree = owned_tree(tmp_path, "Damaged.bin", bytes(blob))
    efivars = write_efivars(tmp_path / "efivars", ovmf_variables())
    rc, doc, err = dbx_json(
        capsys,
        "--efivars",
        str(efivars),
        "--dry-run",
        "--payloads",
        str(tree),
        "--dbx-update",
        "Optional/DBX/Damaged.bin",
    )
    # With --json a refusal is still one object on stdout, the stderr line beside it.
    assert rc == 2 and doc == {"error": err.strip().split(": ", 2)[2], "exit_status": 2}
    assert "Optional/DBX/Damaged.bin: does not verify" in err and "nothing written" in err


def test_options_go_together(tmp_path, capsys):
    for argv in (["--dbx"], ["--esp", str(tmp_path)], ["--fix", "--dbx-update", "x"]):
        rc, out, err = run(capsys, *argv)
        assert rc == 2 and "error:" in err and out == ""
    efivars = write_efivars(tmp_path / "efivars", ovmf_variables())
    rc, out, err = run(capsys, "--efivars", str(efivars), "--fix", "--dbx")
    assert rc == 2 and "--dry-run" in err


# --- the boot path of this machine, and the write ------------------------------------------


def fake_machine(tmp_path: Path, variables: dict) -> Path:
    """A root with efivars on a plain directory, an ESP mounted at /boot/efi and one
    found by its partition type, and the packages' signed images."""
    root = tmp_path / "root"
    write_efivars(root / efivarfs.EFIVARS, variables)
    (root / "sys/class/block").mkdir(parents=True)
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/mountinfo").write_text(
        "22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw\n"
        "30 22 259:1 / /boot/efi rw,relatime shared:9 - vfat /dev/nvme0n1p1 rw,fmask=0077\n"
        "31 22 8:17 / /mnt/second\\040esp rw,relatime - vfat /dev/sdb1 rw\n"
        "32 22 8:18 / /mnt/usb rw,relatime - vfat /dev/sdb2 rw\n"
    )
    (root / "run/udev/data").mkdir(parents=True)
    (root / "run/udev/data/b8:17").write_text(
        "E:ID_PART_ENTRY_TYPE=C12A7328-F81F-11D2-BA4B-00A0C93EC93B\n"
    )
    (root / "run/udev/data/b8:18").write_text(
        "E:ID_PART_ENTRY_TYPE=ebd0a0a2-b9e5-4433-87c0-68b6b72699c7\n"
    )
    for mount in ("boot/efi/EFI/debian", "mnt/second esp/EFI/BOOT", "mnt/usb"):
        (root / mount).mkdir(parents=True)
    for image in (SHIM, GRUB):
        shutil.copyfile(image, root / "boot/efi/EFI/debian" / image.name.replace(".signed", ""))
        target = root / str(image).lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(image, target)
    shutil.copyfile(SHIM, root / "mnt/second esp/EFI/BOOT/BOOTX64.EFI")
    shutil.copyfile(GRUB, root / "mnt/usb/not-an-esp.efi")
    os.symlink("/usr/lib/shim/shimx64.efi.signed", root / "boot/efi/EFI/debian/link.efi")
    return root


def test_mounted_esps(tmp_path):
    root = tmp_path / "root"
    (root / "proc/self").mkdir(parents=True)
    (root / "run/udev/data").mkdir(parents=True)
    (root / "proc/self/mountinfo").write_text(
        "30 22 259:1 / /efi rw - vfat /dev/nvme0n1p1 rw\n"
        "31 22 8:17 / /srv/a\\040b rw - vfat /dev/sdb1 rw\n"
        "32 22 8:18 / /boot/efi rw - ext4 /dev/sdb2 rw\n"
    )
    (root / "run/udev/data/b8:17").write_text("E:ID_PART_ENTRY_TYPE=" + dbx.ESP_TYPE + "\n")
    assert dbx.mounted_esps(root) == ["/efi", "/srv/a b"]
    (root / "proc/self/mountinfo").write_text(
        "40 22 0:50 / /boot/efi rw - autofs systemd-1 rw,fd=48\n"
        "41 22 0:51 / /media/x rw - autofs systemd-1 rw\n"
    )
    assert dbx.mounted_esps(root) == ["/boot/efi"]


def test_no_mounted_esp_refuses(tmp_path, capsys):
    root = tmp_path / "root"
    write_efivars(root / efivarfs.EFIVARS, ovmf_variables())
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/mountinfo").write_text("22 1 259:2 / / rw - ext4 /dev/sda2 rw\n")
    rc, doc, err = dbx_json(capsys, "--root", str(root), "--dry-run")
    assert rc == 2 and doc == {"error": err.strip().split(": ", 2)[2], "exit_status": 2}
    assert "no EFI system partition is mounted" in err and "--esp" in err


def firmware(monkeypatch):
    """A stand-in for the firmware behind efivarfs: edk2's authenticated append (entries
    already held dropped), on any file system."""
    append_firmware(monkeypatch)
    monkeypatch.setattr(efivarfs, "ACCEPT_ANY_FILESYSTEM", True)


@needs_shim
@needs_grub
def test_the_update_is_applied_once(tmp_path, capsys, monkeypatch):
    firmware(monkeypatch)
    root = fake_machine(tmp_path, ovmf_variables())
    rc, doc, err = dbx_json(capsys, "--root", str(root), "--dry-run")
    assert rc == 0, err
    checked = doc["dbx"]["checked"]
    assert checked["esps"] == ["/boot/efi", "/mnt/second esp"]
    paths = sorted(b["path"] for b in checked["binaries"])
    assert paths == sorted(
        [
            "/boot/efi/EFI/debian/grubx64.efi",
            "/boot/efi/EFI/debian/shimx64.efi",
            "/mnt/second esp/EFI/BOOT/BOOTX64.EFI",
            str(root / "usr/lib/grub/x86_64-efi-signed/grubx64.efi.signed"),
            str(root / "usr/lib/shim/shimx64.efi.signed"),
        ]
    )
    rc, doc, err = dbx_json(capsys, "--root", str(root))
    assert rc == 0, err
    result = doc["dbx"]
    assert result["status"] == "applied" and result["written"] is True
    dbx_now = efi.read_efivars(root / efivarfs.EFIVARS)["dbx"].data
    assert dbx_now == (REAL / "ovmf-ms-dbx.esl").read_bytes() + latest_data()
    backup = Path(result["backup"])
    assert (backup / "dbx.esl").read_bytes() == (REAL / "ovmf-ms-dbx.esl").read_bytes()
    # A second run: nothing to do, nothing written.
    rc, doc, err = dbx_json(capsys, "--root", str(root))
    assert rc == 0 and doc["dbx"]["status"] == "present" and doc["dbx"]["written"] is False
    assert efi.read_efivars(root / efivarfs.EFIVARS)["dbx"].data == dbx_now


@needs_shim
@needs_grub
def test_a_revoked_package_image_refuses_the_write(tmp_path, capsys, monkeypatch, owned):
    """GRUB is revoked in the package only (the ESP holds another build): still refused,
    since its next upgrade would put it on the ESP."""
    firmware(monkeypatch)
    root = fake_machine(tmp_path, owned_variables(owned))
    package_grub = root / "usr/lib/grub/x86_64-efi-signed/grubx64.efi.signed"
    grub_hash = pe.parse(package_grub.read_bytes(), "grub").sha256
    tree = owned_tree(
        tmp_path, "Revoke.bin", signed_dbx_update(owned["KEK"], hash_list([grub_hash]))
    )
    os.unlink(root / "boot/efi/EFI/debian/grubx64.efi")
    before = efi.read_efivars(root / efivarfs.EFIVARS)["dbx"].data
    rc, out, err = run(
        capsys,
        "--root",
        str(root),
        "--fix",
        "--dbx",
        "--payloads",
        str(tree),
        "--dbx-update",
        "Optional/DBX/Revoke.bin",
    )
    assert rc == 2
    assert f"{package_grub} is revoked by its sha256 entry {grub_hash}" in err
    assert "REFUSED" in out and f"revoked: {package_grub}" in out
    assert efi.read_efivars(root / efivarfs.EFIVARS)["dbx"].data == before
    assert not (root / efivarfs.BACKUP_DIR).exists()


# --- an NVRAM file -------------------------------------------------------------------------

OVMF_MS = Path("/usr/share/OVMF/OVMF_VARS_4M.ms.fd")
needs_ovmf = pytest.mark.skipif(not OVMF_MS.is_file(), reason="ovmf is not installed")


@needs_ovmf
@needs_shim
@needs_grub
def test_a_varstore_gets_the_update_as_edk2_appends_it(tmp_path, capsys):
    store = tmp_path / "VM_VARS.fd"
    shutil.copyfile(OVMF_MS, store)
    esp = esp_copy(tmp_path, SHIM, GRUB)
    rc, doc, err = dbx_json(capsys, "--varstore", str(store), "--dry-run")
    assert rc == 0 and doc["dbx"]["status"] == "planned"
    assert doc["dbx"]["checked"]["esps"] == [] and store.read_bytes() == OVMF_MS.read_bytes()
    # A write needs the VM's ESP.
    rc, doc, err = dbx_json(capsys, "--varstore", str(store))
    assert rc == 2 and "--esp DIR" in err and store.read_bytes() == OVMF_MS.read_bytes()
    rc, doc, err = dbx_json(capsys, "--varstore", str(store), "--esp", str(esp))
    assert rc == 0, err
    result = doc["dbx"]
    assert result["status"] == "applied" and result["written"] is True
    assert Path(result["backup"]).read_bytes() == OVMF_MS.read_bytes()
    before = efi.read_varstore(OVMF_MS)["dbx"].data
    after = efi.read_varstore(store)
    assert after["dbx"].data == before + latest_data()
    for name in ("PK", "KEK", "db"):
        assert after[name].data == efi.read_varstore(OVMF_MS)[name].data
    # The report agrees, and a second run changes nothing.
    rc, out, err = run(capsys, "--varstore", str(store), "--payloads", str(OBJECTS), "--json")
    assert json.loads(out)["reports"][0]["dbx_update"]["behind"] is False
    written = store.read_bytes()
    rc, doc, err = dbx_json(capsys, "--varstore", str(store), "--esp", str(esp))
    assert rc == 0 and doc["dbx"]["status"] == "present" and store.read_bytes() == written


@needs_ovmf
@needs_grub
def test_a_varstore_whose_grub_the_update_revokes_is_left_alone(tmp_path, capsys, owned):
    """A store whose PK and KEK the test owns, an update signed by that KEK revoking the
    guest's GRUB (a copy of its ESP): refused, the store unchanged, no backup."""
    data = OVMF_MS.read_bytes()
    walked = fix.walk_store(data, "ovmf")
    updates = {
        ("PK", efi.GLOBAL_GUID): fix.signature_list(efi.der(owned["PK"][1])),
        ("KEK", efi.GLOBAL_GUID): fix.signature_list(efi.der(owned["KEK"][1])),
    }
    store = tmp_path / "OWNED_VARS.fd"
    store.write_bytes(fix.rewrite(walked, updates) + data[walked.end :])
    grub_hash = pe.parse(GRUB.read_bytes(), "grub").sha256
    blob = signed_dbx_update(owned["KEK"], hash_list([grub_hash]))
    tree = owned_tree(tmp_path, "Revoke.bin", blob)
    esp = esp_copy(tmp_path, GRUB)
    before = store.read_bytes()
    argv = ["--varstore", str(store), "--esp", str(esp), "--payloads", str(tree)]
    rc, doc, err = dbx_json(capsys, *argv, "--dbx-update", "Optional/DBX/Revoke.bin")
    assert rc == 2
    assert doc["dbx"]["status"] == "refused"
    assert doc["dbx"]["checked"]["binaries"][0]["verdict"] == "revoked"
    assert "grubx64.efi is revoked" in err
    assert store.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["OWNED_VARS.fd", "esp", "objects"]
    # The same update, unrevoked GRUB elsewhere: applied, signed by the test's KEK.
    other = signed_dbx_update(owned["KEK"], hash_list(["cd" * 32]))
    owned_tree(tmp_path, "Other.bin", other)
    rc, doc, err = dbx_json(capsys, *argv, "--dbx-update", "Optional/DBX/Other.bin")
    assert rc == 0, err
    assert doc["dbx"]["signer"]["signed_by"] == "Test KEK"
    assert efi.read_varstore(store)["dbx"].data.endswith(hash_list(["cd" * 32])[28:])


@needs_shim
def test_a_signature_whose_signer_is_not_found_is_judged_by_its_certificates():
    image = pe.parse(SHIM.read_bytes(), "shim")
    first = image.signatures[0]
    ca_2011 = next(c for c in first.certs if efi.fingerprint(c) == UEFI_CA_2011)
    image.signatures = [pe.Signature(1, None, first.certs)]
    hits = dbx.judge(image, dbx.Additions(certs=[ca_2011]))
    assert [h["entry"] for h in hits] == ["Microsoft Corporation UEFI CA 2011"]
    assert dbx.judge(image, dbx.Additions(hashes={"00" * 32: None})) == []


# --- what the boot-path check cannot see refuses the write ----------------------------------


@needs_shim
@needs_grub
def test_an_esp_named_by_a_symlink_is_walked(tmp_path, capsys):
    """--esp naming a symbolic link to the ESP: the link the admin named is followed (as
    the open of an idle automount point mounts it); nothing below it is."""
    efivars = write_efivars(tmp_path / "efivars", ovmf_variables())
    esp = esp_copy(tmp_path, SHIM, GRUB)
    os.symlink("../esp", esp / "EFI/loop")
    link = tmp_path / "esp-link"
    os.symlink(esp, link)
    rc, doc, err = dbx_json(capsys, "--efivars", str(efivars), "--dry-run", "--esp", str(link))
    assert rc == 0, err
    checked = doc["dbx"]["checked"]
    assert checked["esps"] == [str(link)] and checked["empty_esps"] == []
    assert sorted(b["path"] for b in checked["binaries"]) == [
        f"{link}/EFI/debian/grubx64.efi",
        f"{link}/EFI/debian/shimx64.efi",
    ]
    assert {b["verdict"] for b in checked["binaries"]} == {"ok"}


@pytest.mark.parametrize("content", ["nothing", "grub.cfg only"])
def test_an_esp_without_pe_images_refuses(tmp_path, capsys, content):
    """An --esp directory with no PE image (the wrong directory, an ESP not mounted):
    nothing was checked there, so the write is refused."""
    efivars = write_efivars(tmp_path / "efivars", ovmf_variables())
    esp = tmp_path / "esp"
    (esp / "EFI/debian").mkdir(parents=True)
    if content != "nothing":
        (esp / "EFI/debian/grub.cfg").write_text("configfile $prefix/grub.cfg\n")
    rc, doc, err = dbx_json(capsys, "--efivars", str(efivars), "--dry-run", "--esp", str(esp))
    assert rc == 2
    result = doc["dbx"]
    assert result["status"] == "refused" and result["checked"]["empty_esps"] == [str(esp)]
    assert err.count("\n") == 1
    assert f"{esp} holds no PE image" in err and "nothing written" in err


def test_an_esp_that_is_no_directory_refuses(tmp_path, capsys):
    efivars = write_efivars(tmp_path / "efivars", ovmf_variables())
    (tmp_path / "file").write_text("x")
    for esp in (tmp_path / "missing", tmp_path / "file"):
        rc, out, err = run(
            capsys, "--efivars", str(efivars), "--dry-run", "--esp", str(esp),
            "--fix", "--dbx", "--payloads", str(OBJECTS),
        )  # fmt: skip
        assert rc == 2 and f"{esp}: no such directory" in err


@needs_shim
@needs_grub
def test_an_empty_mounted_esp_refuses_the_write(tmp_path, capsys, monkeypatch):
    """An ESP in the mount table whose walk finds no PE image (an automount that did not
    mount, the wrong file system): refused, dbx as it was, no backup."""
    firmware(monkeypatch)
    root = fake_machine(tmp_path, ovmf_variables())
    os.unlink(root / "mnt/second esp/EFI/BOOT/BOOTX64.EFI")
    before = efi.read_efivars(root / efivarfs.EFIVARS)["dbx"].data
    rc, doc, err = dbx_json(capsys, "--root", str(root))
    assert rc == 2
    assert doc["dbx"]["status"] == "refused" and doc["dbx"]["written"] is False
    assert doc["dbx"]["checked"]["empty_esps"] == ["/mnt/second esp"]
    assert "/mnt/second esp holds no PE image" in err
    assert efi.read_efivars(root / efivarfs.EFIVARS)["dbx"].data == before
    assert not (root / efivarfs.BACKUP_DIR).exists()


def broken_pe(path: Path) -> str:
    path.write_bytes(b"MZ" + bytes(200))
    return "not a PE image"


def huge_pe(path: Path) -> str:
    with path.open("wb") as f:
        f.write(b"MZ")
        f.truncate(efi.MAX_PE + 1)
    return "larger than"


@needs_shim
@pytest.mark.parametrize("make", [broken_pe, huge_pe])
def test_an_image_that_cannot_be_judged_refuses(tmp_path, capsys, make):
    """A file on the ESP that looks like a PE image (MZ) and cannot be parsed or read:
    it may be what the firmware boots, so the write is refused; every verdict listed."""
    efivars = write_efivars(tmp_path / "efivars", ovmf_variables())
    esp = esp_copy(tmp_path, SHIM)
    why = make(esp / "EFI/BOOT.EFI")
    rc, doc, err = dbx_json(capsys, "--efivars", str(efivars), "--dry-run", "--esp", str(esp))
    assert rc == 2
    result = doc["dbx"]
    assert result["status"] == "refused"
    verdicts = {Path(b["path"]).name: b["verdict"] for b in result["checked"]["binaries"]}
    assert verdicts == {"BOOT.EFI": "unreadable", "shimx64.efi": "ok"}
    assert err.count("\n") == 1 and f"{esp}/EFI/BOOT.EFI could not be judged ({why}" in err


@needs_shim
@needs_grub
def test_an_unreadable_image_refuses_the_write(tmp_path, capsys, monkeypatch):
    firmware(monkeypatch)
    root = fake_machine(tmp_path, ovmf_variables())
    broken_pe(root / "boot/efi/EFI/debian/fwupdx64.efi")
    before = efi.read_efivars(root / efivarfs.EFIVARS)["dbx"].data
    rc, out, err = run(capsys, "--root", str(root), "--fix", "--dbx", "--payloads", str(OBJECTS))
    assert rc == 2
    assert "REFUSED" in out and "unreadable: /boot/efi/EFI/debian/fwupdx64.efi" in out
    assert "/boot/efi/EFI/debian/fwupdx64.efi could not be judged" in err
    assert efi.read_efivars(root / efivarfs.EFIVARS)["dbx"].data == before
    assert not (root / efivarfs.BACKUP_DIR).exists()


SHA1_TYPE = "826ca512-cf10-4ac9-b187-be01496631bd"


def sha1_list(digests) -> bytes:
    owner = uuid.UUID(efi.MICROSOFT_OWNER).bytes_le
    body = b"".join(owner + bytes.fromhex(d) for d in digests)
    return uuid.UUID(SHA1_TYPE).bytes_le + struct.pack("<III", 28 + len(body), 0, 36) + body


@needs_shim
@needs_grub
def test_entries_the_tool_cannot_match_refuse(tmp_path, capsys, monkeypatch, owned):
    """An update adding SHA-1 entries (edk2 blocks an image by its SHA-1 Authenticode
    digest too; this tool matches SHA-256 and X.509 only): refused, the entries named,
    nothing written, every verdict still listed."""
    firmware(monkeypatch)
    root = fake_machine(tmp_path, owned_variables(owned))
    blob = signed_dbx_update(owned["KEK"], hash_list(["ab" * 32]) + sha1_list(["cd" * 20]))
    tree = owned_tree(tmp_path, "Sha1.bin", blob)
    before = efi.read_efivars(root / efivarfs.EFIVARS)["dbx"].data
    argv = ["--root", str(root), "--payloads", str(tree), "--dbx-update", "Optional/DBX/Sha1.bin"]
    rc, doc, err = dbx_json(capsys, *argv)
    assert rc == 2
    result = doc["dbx"]
    assert result["status"] == "refused" and result["missing"] == 2
    assert {b["verdict"] for b in result["checked"]["binaries"]} == {"ok"}
    assert err.count("\n") == 1
    assert "entries this tool cannot match against the boot path: sha1 " + "cd" * 20 in err
    assert efi.read_efivars(root / efivarfs.EFIVARS)["dbx"].data == before
    assert not (root / efivarfs.BACKUP_DIR).exists()
