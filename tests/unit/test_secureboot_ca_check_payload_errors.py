"""secureboot-ca-check: a payload that fails verification is an error in every mode; only
the files Microsoft published broken (known-broken.json) are "published, not usable"."""

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from debadmin.secureboot_ca_check import payloads

from test_secureboot_ca_check_efivarfs import (
    OBJECTS,
    ami_variables,
    fake_machine,
    ovmf_variables,
    run,
    write_efivars,
)
from test_secureboot_ca_check_fix import libvirt_host, make_store, ms_variables

POST = "PostSignedObjects"
KEK_UPDATE = "KEK/AMI/KEKUpdate_AMI_PK1.bin"  # the one ami_variables()' PK signs
DB_UPDATE = "Optional/DB/{arch}/DBUpdate3P2023.bin"
CERTIFICATE = payloads.CERTIFICATE_FILES["uefi_ca_2023"]
BROKEN = {
    "KEK/ECS/KEKUpdate_ECS_PK1.bin",
    *(f"KEK/XiaoMi/KEKUpdate_XiaoMi_PK{n}.bin" for n in range(1, 6)),
}


def flip(path: Path, offset: int) -> None:
    blob = bytearray(path.read_bytes())
    blob[offset] ^= 0x01
    path.write_bytes(bytes(blob))


def damaged_copy(tmp_path: Path, kind: str) -> Path:
    """A copy of the shipped objects with one bit changed in one kind of file: the KEK
    update's or the db update's signed time stamp, or the certificate's last byte."""
    copy = tmp_path / "objects"
    shutil.copytree(OBJECTS, copy)
    if kind == "kek":
        flip(copy / POST / KEK_UPDATE, 0)
    elif kind == "db":
        for arch in payloads.ARCHES.values():
            flip(copy / POST / DB_UPDATE.format(arch=arch), 0)
    else:
        flip(copy / CERTIFICATE, -1)
    return copy


def damaged_file(kind: str) -> str:
    return {"kek": KEK_UPDATE, "db": DB_UPDATE.format(arch="amd64"), "cert": CERTIFICATE}[kind]


def assert_refused(rc, out, err, kind):
    assert rc == 2, (out, err)
    assert damaged_file(kind) in err and "nothing written" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("kind", ["kek", "db"])
def test_a_flipped_bit_in_a_signed_update_is_an_error_in_every_firmware_mode(
    tmp_path, capsys, kind
):
    """The check, the plan of a dump and --fix on this machine: exit 2, the file named on
    stderr, nothing written; with --json, one object with an error member."""
    copy = damaged_copy(tmp_path, kind)
    efivars = write_efivars(tmp_path / "ami", ami_variables())
    for mode in ([], ["--fix", "--dry-run"]):
        rc, out, err = run(capsys, "--efivars", str(efivars), *mode, "--payloads", str(copy))
        assert_refused(rc, out, err, kind)
        assert out == ""
        rc, out, err = run(
            capsys, "--efivars", str(efivars), *mode, "--json", "--payloads", str(copy)
        )
        assert rc == 2 and damaged_file(kind) in json.loads(out)["error"]
    root = fake_machine(tmp_path / "machine", ami_variables())
    efivars = root / "sys/firmware/efi/efivars"
    before = {p: p.read_bytes() for p in efivars.iterdir()}
    rc, out, err = run(capsys, "--root", str(root), "--fix", "--payloads", str(copy))
    assert_refused(rc, out, err, kind)
    assert {p: p.read_bytes() for p in efivars.iterdir()} == before
    assert not (root / "var/lib/secureboot-ca-check").exists()


def test_a_db_update_is_checked_even_where_this_kek_cannot_use_it(tmp_path, capsys):
    """A KEK without the KEK CA 2011: the db updates are read for the plan, and a damaged
    one is still an error (it is Microsoft's signature that fails, not the machine's)."""
    copy = damaged_copy(tmp_path, "db")
    efivars = write_efivars(tmp_path / "own", ovmf_variables(KEK=ovmf_variables()["PK"]))
    rc, out, err = run(capsys, "--efivars", str(efivars), "--payloads", str(copy))
    assert_refused(rc, out, err, "db")


def test_another_vendors_kek_update_under_the_name_is_an_error(tmp_path, capsys):
    copy = tmp_path / "objects"
    shutil.copytree(OBJECTS, copy)
    shutil.copyfile(copy / POST / "KEK/ECS/KEKUpdate_ECS_PK2.bin", copy / POST / KEK_UPDATE)
    efivars = write_efivars(tmp_path / "ami", ami_variables())
    rc, out, err = run(
        capsys, "--efivars", str(efivars), "--fix", "--dry-run", "--payloads", str(copy)
    )
    assert_refused(rc, out, err, "kek")
    assert "does not carry that certificate" in err


def test_a_flipped_bit_in_a_certificate_is_an_error_for_a_varstore(tmp_path, capsys):
    copy = damaged_copy(tmp_path, "cert")
    store = tmp_path / "VARS.fd"
    store.write_bytes(make_store(ms_variables()))
    before = store.read_bytes()
    for mode in ([], ["--fix"], ["--fix", "--dry-run"]):
        rc, out, err = run(
            capsys,
            "--root",
            str(tmp_path),
            "--varstore",
            str(store),
            *mode,
            "--payloads",
            str(copy),
        )
        assert_refused(rc, out, err, "cert")
    assert store.read_bytes() == before and list(tmp_path.glob("VARS.fd.*")) == []


def test_a_flipped_bit_in_a_certificate_is_an_error_for_libvirt(tmp_path, capsys):
    root = libvirt_host(tmp_path, qcow2=False)
    installed = root / str(payloads.DEFAULT_DIR).lstrip("/")
    shutil.copytree(damaged_copy(tmp_path, "cert"), installed)
    for mode in ([], ["--fix"]):
        rc, out, err = run(capsys, "--libvirt", "--root", str(root), *mode)
        assert_refused(rc, out, err, "cert")
    assert list((root / "var/lib/libvirt/qemu/nvram").glob("*.bak")) == []


def test_the_known_broken_list_is_what_does_not_verify():
    """known-broken.json names exactly the published files that fail, by their SHA-256,
    each with a reason; nothing else the package ships is on it."""
    objects = payloads.load_objects(str(OBJECTS))
    assert {e["path"] for e in objects.known_broken.values()} == BROKEN
    for sha256, entry in objects.known_broken.items():
        blob = (OBJECTS / POST / entry["path"]).read_bytes()
        assert hashlib.sha256(blob).hexdigest() == sha256 and entry["reason"]
        assert payloads.check_published(objects, objects.read(entry["path"], "KEK")) == entry


@pytest.mark.parametrize("rel", sorted(BROKEN))
def test_a_known_broken_file_is_published_not_usable_and_a_changed_copy_an_error(
    tmp_path, capsys, rel
):
    from test_secureboot_ca_check_efivarfs import efi, fix

    objects = payloads.load_objects(str(OBJECTS))
    sha1 = next(s for s, e in objects.kek_map.items() if f"KEK/{e['KEKUpdate']}" == rel)
    payload = objects.read(rel, "KEK")
    pk = next(c for c in payloads.p7_certificates(payload) if efi.fingerprint(c, "sha1") == sha1)
    efivars = write_efivars(tmp_path / "d", ovmf_variables(PK=fix.signature_list(efi.der(pk))))
    rc, out, err = run(
        capsys, "--efivars", str(efivars), "--fix", "--dry-run", "--payloads", str(OBJECTS)
    )
    assert rc == 1 and f"published ({rel}), not usable" in out, err
    copy = tmp_path / "objects"
    shutil.copytree(OBJECTS, copy)
    flip(copy / POST / rel, 0)
    rc, out, err = run(
        capsys, "--efivars", str(efivars), "--fix", "--dry-run", "--payloads", str(copy)
    )
    assert rc == 2 and rel in err and "not usable" not in out


def test_the_list_of_the_package_applies_to_a_checkout_without_one(tmp_path):
    """--payloads names a checkout of Microsoft's repository, which has no list: the one
    this package ships (under --root) is used."""
    copy = tmp_path / "checkout"
    shutil.copytree(OBJECTS, copy)
    (copy / payloads.KNOWN_BROKEN).unlink()
    root = tmp_path / "root"
    installed = root / str(payloads.DEFAULT_DIR).lstrip("/")
    installed.mkdir(parents=True)
    shutil.copyfile(OBJECTS / payloads.KNOWN_BROKEN, installed / payloads.KNOWN_BROKEN)
    assert len(payloads.load_objects(str(copy), root).known_broken) == len(BROKEN)
    assert payloads.load_objects(str(copy), tmp_path / "none").known_broken == {}


def test_a_malformed_list_is_an_error(tmp_path):
    copy = tmp_path / "objects"
    shutil.copytree(OBJECTS, copy)
    (copy / payloads.KNOWN_BROKEN).write_text('{"files": [{"path": 1}]}')
    with pytest.raises(payloads.Error, match="known-broken.json"):
        payloads.load_objects(str(copy))
