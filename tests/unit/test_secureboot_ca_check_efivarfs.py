"""secureboot-ca-check --fix on firmware: the plan on real dumps, refusals, the write path."""

import base64
import errno
import json
import os
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from debadmin.secureboot_ca_check import main as sbc

from debadmin.secureboot_ca_check import checks
from debadmin.secureboot_ca_check import efi
from debadmin.secureboot_ca_check import efivarfs
from debadmin.secureboot_ca_check import fix
from debadmin.secureboot_ca_check import payloads

SRC = Path(__file__).resolve().parents[2]
OBJECTS = SRC / "data" / "secureboot_objects"
REAL = SRC / "tests" / "data" / "secureboot-ca-check" / "real"
GUIDS = {**efi.VARIABLES}
DB_FILES = ["DBUpdate3P2023.bin", "DBUpdateOROM2023.bin", "DBUpdate2024.bin"]


def write_efivars(directory: Path, variables: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in variables.items():
        attributes = 0x27 if name in efi.AUTHENTICATED else 0x06
        (directory / f"{name}-{GUIDS[name]}").write_bytes(struct.pack("<I", attributes) + data)
    return directory


def ovmf_variables(**extra) -> dict:
    """The real PK, KEK and db of Debian 12's OVMF_VARS_4M.ms.fd: Debian's PK, KEK CA 2011."""
    variables = {n: (REAL / f"ovmf-ms-{n}.esl").read_bytes() for n in ("PK", "KEK", "db", "dbx")}
    variables.update(SecureBoot=b"\x01", SetupMode=b"\x00")
    variables.update(extra)
    return variables


def ami_test_pk() -> bytes:
    """The "DO NOT TRUST - AMI Test PK" certificate that shipped in real machines, as the
    PKCS#7 of Microsoft's KEK update for it carries it."""
    objects = payloads.load_objects(str(OBJECTS))
    payload = objects.read("KEK/AMI/KEKUpdate_AMI_PK1.bin", "KEK")
    (cert,) = payloads.p7_certificates(payload)
    assert efi.fingerprint(cert, "sha1") == "9a3056b5260f628645b4d9ac61aebd8060305c3e"
    return efi.der(cert)


def ami_variables(**extra) -> dict:
    """A machine whose PK is AMI's test PK, with Microsoft's KEK CA 2011 in KEK."""
    return ovmf_variables(PK=fix.signature_list(ami_test_pk()), **extra)


def run(capsys, *argv):
    rc = sbc.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def plan_json(capsys, efivars: Path, *extra):
    rc, out, err = run(
        capsys,
        "--efivars",
        str(efivars),
        "--fix",
        "--dry-run",
        "--json",
        "--payloads",
        str(OBJECTS),
        *extra,
    )
    return rc, (json.loads(out) if out else None), err


# --- the plan, on real dumps ---------------------------------------------------------------


def test_plan_on_debian_ovmf_dump(tmp_path, capsys):
    """Debian's OVMF keys: the three db updates verify against the KEK CA 2011 in KEK;
    Microsoft publishes no KEK update for Debian's PK: exit 1, the KEK remains."""
    efivars = write_efivars(tmp_path / "ovmf", ovmf_variables())
    rc, doc, err = plan_json(capsys, efivars)
    assert rc == 1, err
    fixing = doc["fix"]
    assert [s["payload"] for s in fixing["steps"]] == [
        f"Optional/DB/amd64/{name}" for name in DB_FILES
    ]
    for step in fixing["steps"]:
        published = OBJECTS / "PostSignedObjects" / step["payload"]
        assert step["sha256"] == __import__("hashlib").sha256(published.read_bytes()).hexdigest()
        assert step["variable"] == "db" and step["verified"] and step["status"] == "planned"
        assert step["signed_by"] == "Microsoft Corporation KEK CA 2011"
    assert fixing["kek_update"]["published"] is False
    assert [r["ca"] for r in fixing["remaining"]] == ["kek_2k_ca_2023"]
    assert any("firmware" in o for o in fixing["options"])
    assert fixing["measured_boot"] == [] and fixing["written"] is False
    assert doc["exit_status"] == 1


def test_plan_on_ami_test_pk_dump(tmp_path, capsys):
    """A PK with a published KEK update: four steps, db first, then KEK, exit 0."""
    efivars = write_efivars(tmp_path / "ami", ami_variables())
    rc, doc, err = plan_json(capsys, efivars)
    assert rc == 0, err
    steps = doc["fix"]["steps"]
    assert [s["variable"] for s in steps] == ["db", "db", "db", "KEK"]
    assert steps[-1]["payload"] == "KEK/AMI/KEKUpdate_AMI_PK1.bin"
    assert steps[-1]["signed_by"] == "DO NOT TRUST - AMI Test PK"
    assert doc["fix"]["kek_update"] == {
        "published": True,
        "payload": "KEK/AMI/KEKUpdate_AMI_PK1.bin",
        "sha256": steps[-1]["sha256"],
        "reason": None,
    }
    assert doc["fix"]["pk"]["sha1"] == "9a3056b5260f628645b4d9ac61aebd8060305c3e"
    assert doc["fix"]["remaining"] == []


def test_plan_text(tmp_path, capsys):
    efivars = write_efivars(tmp_path / "ami", ami_variables())
    rc, out, err = run(
        capsys, "--efivars", str(efivars), "--fix", "--dry-run", "--payloads", str(OBJECTS)
    )
    assert rc == 0 and err == ""
    assert "KEK update for this PK: published (KEK/AMI/KEKUpdate_AMI_PK1.bin)" in out
    assert "would append Microsoft Corporation KEK 2K CA 2023 to KEK" in out


def test_nothing_to_do_when_all_four_are_present(tmp_path, capsys):
    objects = payloads.load_objects(str(OBJECTS))
    kek = ovmf_variables()["KEK"] + fix.signature_list(objects.certificate("kek_2k_ca_2023"))
    db = ovmf_variables()["db"] + b"".join(
        fix.signature_list(objects.certificate(ca)) for ca in payloads.DB_UPDATES.values()
    )
    efivars = write_efivars(tmp_path / "done", ami_variables(KEK=kek, db=db))
    rc, doc, err = plan_json(capsys, efivars)
    assert rc == 0 and doc["fix"]["steps"] == [] and len(doc["fix"]["present"]) == 4


def test_setup_mode_is_refused(tmp_path, capsys):
    efivars = write_efivars(tmp_path / "setup", ovmf_variables(SetupMode=b"\x01"))
    rc, doc, err = plan_json(capsys, efivars)
    assert rc == 2 and "Setup Mode" in doc["error"] and "Setup Mode" in err


def test_a_pk_that_is_no_certificate_leaves_the_kek(tmp_path, capsys):
    two = fix.signature_list(ami_test_pk()) * 2
    efivars = write_efivars(tmp_path / "two", ovmf_variables(PK=two))
    rc, doc, err = plan_json(capsys, efivars)
    assert rc == 1 and len(doc["fix"]["steps"]) == 3
    assert "not one usable X.509 certificate" in doc["fix"]["remaining"][0]["reason"]


def test_factory_defaults_with_kek_2023_are_an_option(tmp_path, capsys):
    objects = payloads.load_objects(str(OBJECTS))
    kek_default = fix.signature_list(objects.certificate("kek_2k_ca_2023"))
    GUIDS.setdefault("KEKDefault", efi.GLOBAL_GUID)
    efivars = write_efivars(tmp_path / "d", ovmf_variables(KEKDefault=kek_default))
    rc, doc, err = plan_json(capsys, efivars)
    assert rc == 1 and any("KEKDefault" in o for o in doc["fix"]["options"])


def test_a_kek_without_the_2011_ca_gets_no_db_update(tmp_path, capsys):
    efivars = write_efivars(tmp_path / "own", ovmf_variables(KEK=ovmf_variables()["PK"]))
    rc, doc, err = plan_json(capsys, efivars)
    assert rc == 1 and doc["fix"]["steps"] == []
    assert {r["ca"] for r in doc["fix"]["remaining"]} == {
        "uefi_ca_2023",
        "option_rom_uefi_ca_2023",
        "windows_uefi_ca_2023",
        "kek_2k_ca_2023",
    }
    # What can be done, for db as for the KEK (issue 34 item 2).
    options = doc["fix"]["options"]
    assert any("firmware" in o and "Microsoft UEFI CA 2023" in o for o in options)
    assert any("sign-efi-sig-list" in o for o in options)
    assert not any("planned here first" in o for o in options)
    rc, out, err = run(capsys, "--efivars", str(efivars), "--payloads", str(OBJECTS))
    assert rc == 1 and "db-update-unsignable" not in out
    assert "KEK lacks Microsoft Corporation KEK CA 2011" in out
    assert "which this KEK lacks" in out and "sign-efi-sig-list" in out


def test_a_kek_without_the_2011_ca_is_sent_to_its_kek_update_first(tmp_path, capsys):
    """The PK has a published KEK update: it is planned, and the options say to apply it
    first; the maker's firmware and factory defaults holding db's 2023 CA too."""
    objects = payloads.load_objects(str(OBJECTS))
    db_default = fix.signature_list(objects.certificate("uefi_ca_2023"))
    GUIDS.setdefault("dbDefault", efi.GLOBAL_GUID)
    variables = ami_variables(KEK=fix.signature_list(ami_test_pk()), dbDefault=db_default)
    efivars = write_efivars(tmp_path / "ami", variables)
    rc, doc, err = plan_json(capsys, efivars)
    assert rc == 1, err
    fixing = doc["fix"]
    assert [s["variable"] for s in fixing["steps"]] == ["KEK"]
    assert {r["variable"] for r in fixing["remaining"]} == {"db"}
    assert any("planned here first" in o for o in fixing["options"])
    assert any("dbDefault" in o for o in fixing["options"])
    rc, out, err = run(
        capsys, "--efivars", str(efivars), "--fix", "--dry-run", "--payloads", str(OBJECTS)
    )
    assert rc == 1 and "options for the KEK" not in out and "options:" in out


@pytest.fixture
def tampered(tmp_path):
    """A copy of the objects whose DBUpdate3P2023.bin has one bit of its signed time stamp
    flipped."""
    copy = tmp_path / "objects"
    shutil.copytree(OBJECTS, copy)
    for arch in payloads.ARCHES.values():
        path = copy / "PostSignedObjects/Optional/DB" / arch / "DBUpdate3P2023.bin"
        blob = bytearray(path.read_bytes())
        blob[0] ^= 0x01
        path.write_bytes(bytes(blob))
    return copy


def test_a_payload_that_does_not_verify_stops_everything(tmp_path, capsys, tampered):
    efivars = write_efivars(tmp_path / "ami", ami_variables())
    rc, out, err = run(
        capsys, "--efivars", str(efivars), "--fix", "--dry-run", "--payloads", str(tampered)
    )
    assert rc == 2 and out == ""
    assert "Optional/DB/amd64/DBUpdate3P2023.bin: does not verify" in err
    assert "nothing written" in err


def test_a_dump_is_planned_only(tmp_path, capsys):
    efivars = write_efivars(tmp_path / "ami", ami_variables())
    rc, out, err = run(capsys, "--efivars", str(efivars), "--fix", "--payloads", str(OBJECTS))
    assert rc == 2 and "add --dry-run" in err


# --- the report: offline fix, and nothing of the host in a dump's report ----------------------


def test_report_on_a_dump_says_whether_a_fix_is_available(tmp_path, capsys):
    efivars = write_efivars(tmp_path / "ami", ami_variables())
    textfile = tmp_path / "prom"
    textfile.mkdir()
    rc, out, err = run(
        capsys,
        "--efivars",
        str(efivars),
        "--json",
        "--payloads",
        str(OBJECTS),
        "--textfile-dir",
        str(textfile),
    )
    report = json.loads(out)["reports"][0]
    assert report["offline_fix"]["available"] is True
    assert report["offline_fix"]["kek_update_published"] is True
    assert report["offline_fix"]["kek_update"] == "KEK/AMI/KEKUpdate_AMI_PK1.bin"
    codes = {f["code"] for f in report["findings"]}
    assert {"offline-fix-available", "kek-update-published"} <= codes
    # A dump is another machine: no fwupd, no shim of this host.
    assert report["fwupd"] is None and report["shims"] == []
    assert not {"fwupd-missing", "fwupd-too-old"} & codes
    prom = (textfile / checks.TEXTFILE_NAME).read_text()
    assert f'secureboot_ca_check_offline_fix_available{{source="{efivars}"}} 1' in prom
    assert f'secureboot_ca_check_kek_update_published{{source="{efivars}"}} 1' in prom


def test_report_says_when_no_kek_update_exists(tmp_path, capsys):
    efivars = write_efivars(tmp_path / "ovmf", ovmf_variables())
    rc, out, err = run(capsys, "--efivars", str(efivars), "--payloads", str(OBJECTS))
    assert rc == 1
    assert "KEK update for this PK: none published" in out
    assert "Offline fix (--fix, no network): available" in out


# --- measured boot ----------------------------------------------------------------------------


def luks2_header(tokens: dict) -> bytes:
    """A LUKS2 binary header (magic, version 2, header size) and its JSON area."""
    metadata = {"keyslots": {}, "tokens": tokens, "segments": {}, "digests": {}, "config": {}}
    area = json.dumps(metadata).encode()
    head = bytearray(16384)
    head[0:6] = efivarfs.LUKS_MAGIC
    struct.pack_into(">HQ", head, 6, 2, 16384)
    head[4096 : 4096 + len(area)] = area
    return bytes(head)


def b64url(value: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


def clevis_token(pin: dict) -> dict:
    return {"type": "clevis", "keyslots": ["1"], "jwe": {"protected": b64url({"clevis": pin})}}


@pytest.mark.parametrize(
    "tokens,found",
    [
        ({"0": {"type": "systemd-tpm2", "keyslots": ["1"], "tpm2-pcrs": [7]}}, True),
        ({"0": {"type": "systemd-tpm2", "keyslots": ["1"], "tpm2-pcrs": [0, 2]}}, False),
        ({"0": {"type": "systemd-tpm2", "tpm2-pcrs": [], "tpm2_pcrlock": True}}, True),
        ({"0": clevis_token({"pin": "tpm2", "tpm2": {"pcr_ids": "0,7"}})}, True),
        ({"0": clevis_token({"pin": "tpm2", "tpm2": {"pcr_ids": "1"}})}, False),
        ({"0": clevis_token({"pin": "tang", "tang": {"url": "http://t"}})}, False),
        (
            {
                "0": clevis_token(
                    {
                        "pin": "sss",
                        "sss": {
                            "t": 1,
                            "jwe": [
                                b64url({"clevis": {"pin": "tpm2", "tpm2": {"pcr_ids": [7]}}})
                                + "..."
                            ],
                        },
                    }
                )
            },
            True,
        ),
        ({"0": {"type": "clevis", "jwe": {"protected": "!!"}}}, True),
        ({}, False),
    ],
)
def test_luks2_tokens(tokens, found):
    metadata = efivarfs.luks2_metadata(luks2_header(tokens))
    assert bool(efivarfs.luks2_tokens_pcr7(metadata)) == found


def fake_machine(tmp_path: Path, variables: dict, devices: dict = None) -> Path:
    """A root whose efivarfs is a plain directory on tmpfs standing in for efivarfs, and
    whose block devices are files holding real on-disk headers."""
    root = tmp_path / "root"
    write_efivars(root / efivarfs.EFIVARS, variables)
    (root / "sys/class/block").mkdir(parents=True)
    for name, content in (devices or {}).items():
        (root / "sys/class/block" / name).mkdir()
        (root / "dev").mkdir(exist_ok=True)
        (root / "dev" / name).write_bytes(content)
    return root


def snapshot(root: Path) -> dict:
    directory = root / efivarfs.EFIVARS
    return {p.name: p.read_bytes() for p in directory.iterdir()}


BITLOCKER = b"\xeb\x58\x90-FVE-FS-" + bytes(501)
LUKS_PCR7 = luks2_header({"0": {"type": "systemd-tpm2", "keyslots": ["1"], "tpm2-pcrs": [7]}})


@pytest.mark.parametrize("device", [BITLOCKER, LUKS_PCR7])
def test_pcr7_secrets_refuse_the_write(tmp_path, capsys, device):
    root = fake_machine(tmp_path, ami_variables(), {"sda2": device})
    before = snapshot(root)
    rc, out, err = fix_root(capsys, root)
    assert rc == 2 and out == ""
    assert "/dev/sda2" in err and "--i-have-recovery-keys" in err and "nothing written" in err
    assert snapshot(root) == before


def test_pcr7_secrets_are_a_warning_in_a_dry_run(tmp_path, capsys):
    root = fake_machine(tmp_path, ami_variables(), {"sda2": BITLOCKER, "sda1": bytes(4096)})
    rc, out, err = fix_root(capsys, root, "--dry-run", "--json")
    assert rc == 0 and "--i-have-recovery-keys" in err
    assert json.loads(out)["fix"]["measured_boot"] == [
        {"kind": "bitlocker", "device": "/dev/sda2", "detail": "BitLocker"}
    ]


# --- the write path, on a directory standing in for efivarfs ----------------------------------


@pytest.fixture
def tmpfs(tmp_path):
    """A directory on tmpfs (/dev/shm), which has inode flags as efivarfs has (Linux 6.0+);
    pytest's own directory where /dev/shm is not writable."""
    base = Path("/dev/shm")
    if not (base.is_dir() and os.access(base, os.W_OK)):
        yield tmp_path
        return
    directory = Path(tempfile.mkdtemp(prefix="secureboot-ca-check.", dir=base))
    try:
        yield directory
    finally:
        for path in directory.rglob("*"):
            if path.is_file() and not path.is_symlink():
                chattr("-i", path)
        shutil.rmtree(directory, ignore_errors=True)


def chattr(flag: str, path: Path) -> bool:
    """chattr +i / -i: e2fsprogs' chattr where it is installed (an independent writer of
    the flag), else the ioctl itself (a minimal build chroot has no e2fsprogs)."""
    if shutil.which("chattr") is not None:
        return subprocess.run(["chattr", flag, str(path)], capture_output=True).returncode == 0
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        flags = efivarfs.get_flags(fd)
        if flags is None:
            return False
        if flag == "+i":
            efivarfs.set_flags(fd, flags | efivarfs.FS_IMMUTABLE_FL)
        else:
            efivarfs.set_flags(fd, flags & ~efivarfs.FS_IMMUTABLE_FL)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


@pytest.fixture
def any_filesystem(monkeypatch):
    """The tests' own stand-in for efivarfs: a plain directory accepted for writing."""
    monkeypatch.setattr(efivarfs, "ACCEPT_ANY_FILESYSTEM", True)


def test_the_write_is_the_append_word_and_the_published_bytes(tmpfs, capsys, any_filesystem):
    """On a plain file system the variable does not grow as firmware makes it grow: it
    is replaced by what was written, and the read-back finds the entries held before gone
    ("damaged", exit 2, the backup named) and stops before the next step.  What was
    written is exactly the attribute word 0x67 and Microsoft's file; the immutable flag
    (where it can be set) is set again after the write."""
    root = fake_machine(tmpfs, ami_variables())
    db = root / efivarfs.EFIVARS / f"db-{efi.IMAGE_SECURITY_GUID}"
    kek = root / efivarfs.EFIVARS / f"KEK-{efi.GLOBAL_GUID}"
    kek_before = kek.read_bytes()
    immutable = chattr("+i", db)
    try:
        rc, out, err = fix_root(capsys, root, "--json")
        if immutable:
            with open(db, "rb") as handle:
                assert efivarfs.get_flags(handle.fileno()) & efivarfs.FS_IMMUTABLE_FL
    finally:
        if immutable:
            chattr("-i", db)
    assert rc == 2
    doc = json.loads(out)
    steps = doc["fix"]["steps"]
    assert [s["status"] for s in steps] == ["damaged", "not-run", "not-run", "not-run"]
    assert steps[0]["error"] == "it is no longer a run of signature lists"
    assert doc["fix"]["backup"] and doc["fix"]["backup"] in err
    published = (OBJECTS / "PostSignedObjects/Optional/DB/amd64/DBUpdate3P2023.bin").read_bytes()
    assert db.read_bytes() == struct.pack("<I", 0x67) + published
    assert kek.read_bytes() == kek_before
    assert "Optional/DB/amd64/DBUpdate3P2023.bin" in err and "applied before it: nothing" in err


def test_immutable_flag_is_cleared_for_the_write(tmpfs):
    """Without clearing it, root's write to an immutable file fails with EPERM."""
    path = tmpfs / "var"
    path.write_bytes(b"\x27\0\0\0old")
    if not chattr("+i", path):
        pytest.skip("cannot set the immutable flag here (not root, or no inode flags)")
    try:
        with pytest.raises(PermissionError):
            with open(path, "r+b") as handle:
                handle.write(b"x")
        efivarfs.append(path, b"payload")
        with open(path, "rb") as handle:
            assert efivarfs.get_flags(handle.fileno()) & efivarfs.FS_IMMUTABLE_FL
    finally:
        chattr("-i", path)
    assert path.read_bytes() == struct.pack("<I", 0x67) + b"payload"


REFUSE = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
from debadmin.secureboot_ca_check import efivarfs
from debadmin.secureboot_ca_check.main import main
efivarfs.ACCEPT_ANY_FILESYSTEM = True
real = efivarfs.write_once
def write_once(path, data):
    # the limit for the variable's write only: the keys are saved before it
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, limit[1]))
    try:
        real(path, data)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limit)
efivarfs.write_once = write_once
sys.exit(main(sys.argv[1:]))
"""


def test_a_failed_write_is_reported_with_its_errno(tmpfs):
    """A real errno from a real file system (EFBIG: the file size limit), which is not
    an answer of the firmware: reported as not written, with its errno, exit 2, nothing
    more attempted."""
    root = fake_machine(tmpfs, ami_variables())
    before = snapshot(root)
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            REFUSE,
            "--root",
            str(root),
            "--fix",
            "--json",
            "--payloads",
            str(OBJECTS),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(SRC / "lib"), "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert result.returncode == 2, result.stderr
    steps = json.loads(result.stdout)["fix"]["steps"]
    assert steps[0]["status"] == "failed" and "EFBIG" in steps[0]["error"]
    assert {s["status"] for s in steps[1:]} == {"not-run"}
    assert "DBUpdate3P2023.bin: not written: the write failed: EFBIG" in result.stderr
    assert "firmware" not in result.stderr
    assert snapshot(root) == before
    assert errno.EFBIG and resource.RLIMIT_FSIZE and signal.SIGXFSZ


def test_no_uefi_is_not_applicable(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    rc, out, err = run(capsys, "--root", str(tmp_path / "empty"), "--fix", "--dry-run")
    assert rc == 3 and "did not boot with UEFI" in err and out == ""


# --- what is and is not the firmware's refusal -------------------------------------------------


def test_an_open_error_is_not_a_firmware_refusal(tmp_path):
    with pytest.raises(efivarfs.WriteError) as caught:
        efivarfs.append(tmp_path / "absent", b"payload")
    assert caught.value.phase == "open" and caught.value.errno == errno.ENOENT
    step = {"status": "planned", "error": None}
    efivarfs.failed_step(step, caught.value)
    assert step == {
        "status": "failed",
        "error": "cannot open the variable: ENOENT: " + os.strerror(errno.ENOENT),
    }


@pytest.mark.parametrize("code", [errno.EINVAL, errno.EIO, errno.EACCES, errno.ENOSPC])
def test_a_write_error_the_firmware_returns_is_a_refusal(code):
    step = {"status": "planned", "error": None}
    efivarfs.failed_step(step, efivarfs.WriteError("write", OSError(code, os.strerror(code))))
    assert step["status"] == "refused" and step["error"].startswith(errno.errorcode[code])
    step = {"status": "planned", "error": None}
    efivarfs.failed_step(step, efivarfs.WriteError("flags", OSError(code, os.strerror(code))))
    assert step["status"] == "failed" and "immutable flag" in step["error"]


def test_a_flag_not_restored_after_a_write_is_a_warning(
    tmpfs, capsys, any_filesystem, monkeypatch
):
    """The write succeeded, restoring the immutable flag did not (EPERM, as a lost
    CAP_LINUX_IMMUTABLE gives): the step is not called refused, and the report says the
    write succeeded and what failed."""
    root = fake_machine(tmpfs, ami_variables())
    db = root / efivarfs.EFIVARS / f"db-{efi.IMAGE_SECURITY_GUID}"
    if not chattr("+i", db):
        pytest.skip("cannot set the immutable flag here (not root, or no inode flags)")
    real_set_flags = efivarfs.set_flags

    def set_flags(fd, flags):
        if flags & efivarfs.FS_IMMUTABLE_FL:
            raise PermissionError(errno.EPERM, os.strerror(errno.EPERM))
        real_set_flags(fd, flags)

    monkeypatch.setattr(efivarfs, "set_flags", set_flags)
    try:
        rc, out, err = fix_root(capsys, root, "--json")
    finally:
        chattr("-i", db)
    step = json.loads(out)["fix"]["steps"][0]
    assert step["status"] == "damaged"  # a plain file: replaced, not appended
    assert step["warning"].startswith("the write succeeded; setting the immutable flag again")
    assert "EPERM" in step["warning"] and "refused" not in err
    assert "write succeeded" in err


def test_a_plain_directory_is_not_written_as_efivarfs(tmp_path, capsys):
    root = fake_machine(tmp_path, ami_variables())
    before = snapshot(root)
    rc, out, err = fix_root(capsys, root)
    assert rc == 2 and "not efivarfs" in err and "nothing written" in err
    assert len(err.strip().splitlines()) == 1
    assert snapshot(root) == before


def test_statfs_reads_the_file_system_magic(tmp_path):
    """/proc is procfs (0x9fa0) everywhere: the magic is read from statfs(2) itself."""
    assert efivarfs.filesystem_magic(Path("/proc")) == 0x9FA0
    assert efivarfs.filesystem_magic(tmp_path) != efivarfs.EFIVARFS_MAGIC
    with pytest.raises(OSError):
        efivarfs.filesystem_magic(tmp_path / "absent")


@pytest.mark.skipif(
    not Path("/sys/firmware/efi/efivars").is_dir(), reason="this host has no efivarfs"
)
def test_the_real_efivarfs_is_accepted():
    efivarfs.check_efivarfs(Path("/sys/firmware/efi/efivars"))


# --- what the change of PCR 7 may lock out ----------------------------------------------------


def fix_root(capsys, root: Path, *extra):
    """secureboot-ca-check --root ROOT --fix EXTRA... with the shipped payloads."""
    return run(capsys, "--root", str(root), "--fix", *extra, "--payloads", str(OBJECTS))


def secrets_json(capsys, root: Path, *extra):
    rc, out, err = fix_root(capsys, root, "--dry-run", "--json", *extra)
    return rc, json.loads(out)["fix"]["measured_boot"], err


def test_an_unreadable_device_refuses_the_write(tmp_path, capsys):
    """A block device that cannot be read may hold a secret: the write is refused naming
    it (fail closed), unless the admin holds the recovery keys."""
    root = fake_machine(tmp_path, ami_variables(), {"sda1": bytes(4096)})
    (root / "sys/class/block/sdb").mkdir()
    (root / "dev/sdb").mkdir()  # a real EISDIR from pread(2)
    before = snapshot(root)
    rc, out, err = fix_root(capsys, root)
    assert rc == 2 and out == "" and snapshot(root) == before
    assert "/dev/sdb (cannot be read" in err and "--i-have-recovery-keys" in err
    assert "/dev/sda1" not in err
    rc, found, err = secrets_json(capsys, root)
    assert [(s["kind"], s["device"]) for s in found] == [("unchecked", "/dev/sdb")]
    rc, found, err = secrets_json(capsys, root, "--i-have-recovery-keys")
    assert rc == 0 and "warning" not in err


def test_a_damaged_luks2_header_is_a_secret_that_can_be_overridden(
    tmp_path, capsys, any_filesystem, monkeypatch
):
    """A LUKS2 JSON area that is not an object: its tokens cannot be read, so one may be
    bound to PCR 7: refused by default (it was refused with no way past it), written with
    --i-have-recovery-keys."""
    head = bytearray(LUKS_PCR7)
    area = b'["not", "an", "object"]'
    head[4096 : 4096 + 16384 - 4096] = area + bytes(16384 - 4096 - len(area))
    root = fake_machine(tmp_path, ami_variables(), {"vda3": bytes(head)})
    rc, found, err = secrets_json(capsys, root)
    assert rc == 0 and [(s["kind"], s["device"]) for s in found] == [
        ("luks2-damaged", "/dev/vda3")
    ]
    assert "damaged LUKS2 header" in found[0]["detail"]
    before = snapshot(root)
    rc, out, err = fix_root(capsys, root)
    assert rc == 2 and "/dev/vda3" in err and "nothing written" in err
    assert snapshot(root) == before
    firmware(monkeypatch)
    rc, out, err = fix_root(capsys, root, "--i-have-recovery-keys")
    assert rc == 0, err


def test_a_luks2_token_that_is_not_an_object_is_assumed_bound():
    metadata = efivarfs.luks2_metadata(luks2_header({"0": ["systemd-tpm2"]}))
    assert efivarfs.luks2_tokens_pcr7(metadata) == ["token 0 (unreadable: assumed bound to PCR 7)"]


def udev_data(root: Path, name: str, number: str, lines: str) -> None:
    (root / "sys/class/block" / name / "dev").write_text(number + "\n")
    (root / "run/udev/data").mkdir(parents=True, exist_ok=True)
    (root / "run/udev/data" / f"b{number}").write_text(lines)


def test_udev_picks_the_devices_to_open(tmp_path, capsys):
    """Devices udev probed as something else are not opened (an unreadable one then does
    not matter); crypto_LUKS ones are read; a size-0 device without udev data is skipped."""
    devices = {"sda": bytes(4096), "sda1": bytes(4096), "sda2": LUKS_PCR7, "sdc": b""}
    root = fake_machine(tmp_path, ami_variables(), devices)
    (root / "dev/sda1").unlink()
    (root / "dev/sda1").mkdir()  # unreadable, but udev says ext4
    udev_data(root, "sda", "8:0", "S:disk/by-id/x\nE:ID_PART_TABLE_TYPE=gpt\n")
    udev_data(root, "sda1", "8:1", "E:ID_FS_TYPE=ext4\nE:ID_FS_USAGE=filesystem\n")
    udev_data(root, "sda2", "8:2", "E:ID_FS_TYPE=crypto_LUKS\nE:ID_FS_VERSION=2\n")
    (root / "sys/class/block/sdc/size").write_text("0\n")
    (root / "dev/sdc").unlink()  # would be ENOENT if it were opened
    rc, found, err = secrets_json(capsys, root)
    assert [(s["kind"], s["device"]) for s in found] == [("luks2-tpm2", "/dev/sda2")]


def test_luks1_with_luksmeta_is_a_secret(tmp_path, capsys):
    """clevis binds LUKS1 through luksmeta slots (its JWE encrypted: PCRs not readable)."""
    head = bytearray(2 << 20)
    head[0:6] = efivarfs.LUKS_MAGIC
    struct.pack_into(">H", head, 6, 1)
    struct.pack_into(">I", head, 104, 4096)  # payload offset, in 512-byte sectors
    plain = bytes(head)
    head[2068480 : 2068480 + 8] = efivarfs.LUKSMETA_MAGIC
    root = fake_machine(tmp_path, ami_variables(), {"sdb1": bytes(head), "sdb2": plain})
    rc, found, err = secrets_json(capsys, root)
    assert [(s["kind"], s["device"]) for s in found] == [("luks1-clevis", "/dev/sdb1")]


@pytest.mark.skipif(
    shutil.which("cryptsetup") is None or shutil.which("luksmeta") is None,
    reason="no cryptsetup or luksmeta",
)
def test_luks1_formatted_by_cryptsetup_and_luksmeta(tmp_path, capsys):
    image = tmp_path / "luks1.img"
    image.write_bytes(bytes(8 << 20))
    subprocess.run(
        [
            "cryptsetup",
            "luksFormat",
            "--type",
            "luks1",
            "--pbkdf-force-iterations",
            "1000",
            "-q",
            str(image),
            "-",
        ],
        input=b"passphrase",
        check=True,
        capture_output=True,
    )
    root = fake_machine(tmp_path, ami_variables(), {"sdd1": image.read_bytes()})
    assert secrets_json(capsys, root)[1] == []
    subprocess.run(["luksmeta", "init", "-f", "-d", str(image)], check=True, capture_output=True)
    (root / "dev/sdd1").write_bytes(image.read_bytes())
    assert [s["kind"] for s in secrets_json(capsys, root)[1]] == ["luks1-clevis"]


CRYPTTAB = """\
# <target> <source> <key file> <options>
root UUID=1111 none luks,discard
data /dev/sdb2 none luks,tpm2-device=auto
swap /dev/sdb3 /dev/urandom swap,cipher=aes-xts-plain64
home /dev/sdb4 none luks,keyscript=/lib/cryptsetup/scripts/decrypt_tpm
vault /dev/sdb5 none luks,header=/boot/vault.header
short /dev/sdb6
"""


def test_crypttab_entries_that_may_use_the_tpm(tmp_path, capsys):
    root = fake_machine(tmp_path, ami_variables())
    (root / "etc").mkdir()
    (root / "etc/crypttab").write_text(CRYPTTAB)
    rc, found, err = secrets_json(capsys, root)
    assert [(s["kind"], s["device"]) for s in found] == [
        ("crypttab", "/dev/sdb2"),
        ("crypttab", "/dev/sdb4"),
        ("crypttab", "/dev/sdb5"),
    ]
    assert "tpm2-device=auto" in found[0]["detail"] and "header=" in found[2]["detail"]
    rc, out, err = fix_root(capsys, root)
    assert rc == 2 and "/etc/crypttab data" in err


def test_an_unlistable_sys_class_block_is_unchecked(tmp_path, capsys):
    """Without ROOT/sys/class/block no block device can be checked: fail closed."""
    root = fake_machine(tmp_path, ami_variables())
    (root / "sys/class/block").rmdir()
    rc, found, err = secrets_json(capsys, root)
    assert [(s["kind"], s["device"]) for s in found] == [("unchecked", "/sys/class/block")]
    rc, out, err = fix_root(capsys, root)
    assert rc == 2 and "--i-have-recovery-keys" in err


def test_more_credential_stores_and_units(tmp_path, capsys):
    root = fake_machine(tmp_path, ami_variables())
    files = {
        "run/credstore.encrypted/token": "x",
        "usr/local/lib/credstore.encrypted/key": "x",
        "etc/systemd/system/app.service": "[Service]\nExecStart=/bin/true\n",
        "etc/systemd/system/web.service.d/creds.conf": "[Service]\n"
        "LoadCredentialEncrypted=tls.key:/srv/tls.key.cred\n",
        "usr/lib/systemd/system/db.service": "[Service]\nSetCredentialEncrypted=pw: \\\n k=\n",
        "usr/lib/systemd/system/off.service": "[Service]\n# SetCredentialEncrypted=pw:\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    rc, found, err = secrets_json(capsys, root)
    assert [(s["kind"], s["device"]) for s in found] == [
        ("credential", "/run/credstore.encrypted"),
        ("credential", "/usr/local/lib/credstore.encrypted"),
        ("credential", "/etc/systemd/system/web.service.d/creds.conf"),
        ("credential", "/usr/lib/systemd/system/db.service"),
    ]
    assert found[2]["detail"].startswith("LoadCredentialEncrypted=:")


def test_systemd_credentials_and_homed_areas(tmp_path, capsys):
    root = fake_machine(tmp_path, ami_variables())
    for name in ("etc/credstore.encrypted/db-password", "etc/credstore/plain", "home/alice.home"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"x")
    rc, found, err = secrets_json(capsys, root)
    assert [(s["kind"], s["device"]) for s in found] == [
        ("credential", "/etc/credstore.encrypted"),
        ("homed", "/home"),
    ]


def test_a_padded_pk_gets_no_kek_update(tmp_path, capsys):
    """PK's first entry with two zero bytes after the certificate (as some firmware stores
    it): edk2 compares SignatureSize - 16 bytes with the signer's certificate, so the
    KEK update would be refused; it remains, the db updates are planned, exit 1."""
    padded = fix.signature_list(ami_test_pk() + b"\0\0")
    efivars = write_efivars(tmp_path / "padded", ovmf_variables(PK=padded))
    rc, doc, err = plan_json(capsys, efivars)
    assert rc == 1, err
    assert [s["variable"] for s in doc["fix"]["steps"]] == ["db", "db", "db"]
    (kek,) = doc["fix"]["remaining"]
    assert kek["variable"] == "KEK"
    assert kek["reason"] == "KEK/AMI/KEKUpdate_AMI_PK1.bin: " + payloads.PK_MISMATCH


# --- the read-back: an append, not a replace; the keys saved first ---------------------------


def firmware(monkeypatch, replace: bool = False):
    """A stand-in for the firmware behind efivarfs: the authenticated append edk2 does
    (AuthVariableLib's FilterSignatureList: entries already held are dropped), or, with
    replace, one that ignores APPEND_WRITE and replaces the variable with the lists."""

    def write(path: Path, data: bytes) -> None:
        assert struct.unpack_from("<I", data)[0] == payloads.APPEND_ATTRIBUTES
        name = path.name.split("-", 1)[0]
        appended = payloads.parse_payload(data[4:], "x", name).data
        old = path.read_bytes()
        if replace:
            path.write_bytes(old[:4] + appended)
            return
        held = efivarfs.raw_entries(old[4:])
        lists, offset = b"", 0
        while offset < len(appended):
            size, header, each = struct.unpack_from("<III", appended, offset + 16)
            body = offset + 28 + header
            kind = appended[offset : offset + 16]
            new = [
                appended[i : i + each]
                for i in range(body, offset + size, each)
                if (kind, appended[i : i + each]) not in held
            ]
            if new:
                head = struct.pack("<III", 28 + header + each * len(new), header, each)
                lists += kind + head + appended[offset + 28 : body] + b"".join(new)
            offset += size
        path.write_bytes(old + lists)

    monkeypatch.setattr(efivarfs, "write_once", write)


def test_appends_are_applied_and_the_keys_saved_first(
    tmp_path, capsys, any_filesystem, monkeypatch
):
    firmware(monkeypatch)
    variables = ami_variables()
    root = fake_machine(tmp_path, variables)
    rc, out, err = fix_root(capsys, root, "--json")
    assert rc == 0, err
    doc = json.loads(out)["fix"]
    assert [s["status"] for s in doc["steps"]] == ["applied"] * 4
    backup = Path(doc["backup"])
    assert backup.parent == root / "var/lib/secureboot-ca-check"
    assert backup.name.startswith("backup-") and backup.name.endswith("Z")
    for name in ("PK", "KEK", "db", "dbx"):
        if name in variables:
            assert (backup / f"{name}.esl").read_bytes() == variables[name]
    assert "KEK.esl" in os.listdir(backup) and "db.esl" in os.listdir(backup)
    # Run again: nothing to change, and no second backup.
    rc, out, err = fix_root(capsys, root)
    assert rc == 0 and "nothing to change" in out
    assert len(os.listdir(backup.parent)) == 1


def test_a_firmware_that_replaces_the_variable_is_damage(
    tmp_path, capsys, any_filesystem, monkeypatch
):
    """The firmware took the write but replaced db with the new list: every entry held
    before is gone although the new CA is there.  Status "damaged", exit 2, nothing more
    written, one stderr line naming the saved keys."""
    firmware(monkeypatch, replace=True)
    root = fake_machine(tmp_path, ami_variables())
    kek = root / efivarfs.EFIVARS / f"KEK-{efi.GLOBAL_GUID}"
    kek_before = kek.read_bytes()
    rc, out, err = fix_root(capsys, root, "--json")
    assert rc == 2
    doc = json.loads(out)["fix"]
    assert [s["status"] for s in doc["steps"]] == ["damaged", "not-run", "not-run", "not-run"]
    assert kek.read_bytes() == kek_before
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "db DAMAGED" in lines[0] and doc["backup"] in lines[0]
    assert (Path(doc["backup"]) / "db.esl").read_bytes() == ami_variables()["db"]


def test_compare_append():
    one = fix.signature_list(b"one-certificate")
    two = fix.signature_list(b"two-certificate")
    assert efivarfs.compare_append(one, two, one + two) == ("applied", None)
    # The firmware dropped the duplicate: still an append.
    assert efivarfs.compare_append(one, one + two, one + two) == ("applied", None)
    assert efivarfs.compare_append(one, two, one)[0] == "not-accepted"
    assert efivarfs.compare_append(one, two, two)[0] == "damaged"
    assert efivarfs.compare_append(one, two, one + two + b"\0" * 30)[0] == "damaged"
    three = fix.signature_list(b"three-certificate")
    assert efivarfs.compare_append(one, two, one + two + three)[0] == "damaged"
    # Data the walk cannot split: its bytes must stay at the start.
    odd = b"\1" * 20
    assert efivarfs.compare_append(odd, two, odd + two) == ("applied", None)
    assert efivarfs.compare_append(odd, two, two)[0] == "damaged"


def test_a_later_write_that_undoes_an_earlier_one_is_damage(
    tmp_path, capsys, any_filesystem, monkeypatch
):
    """The final read of every variable written: db lost the UEFI CA 2023 while KEK was
    written."""
    firmware(monkeypatch)
    real = efivarfs.write_once
    root = fake_machine(tmp_path, ami_variables())
    db = root / efivarfs.EFIVARS / f"db-{efi.IMAGE_SECURITY_GUID}"
    original = db.read_bytes()

    def write(path, data):
        real(path, data)
        if path.name.startswith("KEK-"):
            db.write_bytes(original)

    monkeypatch.setattr(efivarfs, "write_once", write)
    rc, out, err = fix_root(capsys, root, "--json")
    assert rc == 2
    steps = json.loads(out)["fix"]["steps"]
    assert steps[0]["status"] == "damaged" and "no longer holds it" in steps[0]["error"]
    assert "restore the keys saved in" in err


@pytest.mark.parametrize(
    "rel", ["KEK/ECS/KEKUpdate_ECS_PK1.bin", "KEK/XiaoMi/KEKUpdate_XiaoMi_PK1.bin"]
)
def test_a_kek_update_that_does_not_verify_remains(tmp_path, capsys, rel):
    """A KEK update Microsoft published broken (on known-broken.json) is a remaining
    item with its reason (never written); the db updates are still planned; exit 1."""
    objects = payloads.load_objects(str(OBJECTS))
    sha1 = next(s for s, e in objects.kek_map.items() if f"KEK/{e['KEKUpdate']}" == rel)
    payload = objects.read(rel, "KEK")
    pk = next(c for c in payloads.p7_certificates(payload) if efi.fingerprint(c, "sha1") == sha1)
    efivars = write_efivars(tmp_path / "d", ovmf_variables(PK=fix.signature_list(efi.der(pk))))
    rc, report, err = plan_json(capsys, efivars)
    assert rc == 1, err
    doc = report["fix"]
    assert [s["variable"] for s in doc["steps"]] == ["db", "db", "db"]
    assert [r["variable"] for r in doc["remaining"]] == ["KEK"]
    assert rel in doc["remaining"][0]["reason"]
    assert "published by Microsoft as it is, but not usable" in doc["remaining"][0]["reason"]
    assert doc["kek_update"]["published"] and doc["options"]
    rc, out, err = run(
        capsys, "--efivars", str(efivars), "--fix", "--dry-run", "--payloads", str(OBJECTS)
    )
    assert rc == 1 and f"published ({rel}), not usable" in out and "fwupd can" not in out


# --- interruptions, the immutable flag, the lock ----------------------------------------------


def immutable_db(root: Path) -> Path:
    db = root / efivarfs.EFIVARS / f"db-{efi.IMAGE_SECURITY_GUID}"
    if not chattr("+i", db):
        pytest.skip("cannot set the immutable flag here (not root, or no inode flags)")
    return db


def is_immutable(path: Path) -> bool:
    with open(path, "rb") as handle:
        return bool(efivarfs.get_flags(handle.fileno()) & efivarfs.FS_IMMUTABLE_FL)


def test_an_interruption_in_the_write_restores_the_flag(
    tmpfs, capsys, any_filesystem, monkeypatch
):
    """KeyboardInterrupt raised as the firmware's write returns (a signal arriving then,
    before signals were blocked): the flag is set again and stderr says what was
    applied, what may be written and where the keys are."""
    firmware(monkeypatch)
    root = fake_machine(tmpfs, ami_variables())
    db = immutable_db(root)
    real = efivarfs.write_once

    def write_then_interrupt(path, data):
        real(path, data)
        raise KeyboardInterrupt

    monkeypatch.setattr(efivarfs, "write_once", write_then_interrupt)
    try:
        rc, out, err = fix_root(capsys, root)
        assert is_immutable(db)
    finally:
        chattr("-i", db)
    assert rc == 130
    assert "stopped: applied: nothing; interrupted during (may be written): " in err
    assert "Optional/DB/amd64/DBUpdate3P2023.bin" in err
    assert "the keys as they were are in " + str(root / "var/lib/secureboot-ca-check") in err


def test_a_signal_during_a_step_waits_for_its_read_back(
    tmpfs, capsys, any_filesystem, monkeypatch
):
    """SIGHUP sent during the first write is held until that step is read back: it is
    applied, nothing more is written, and stderr says so."""
    firmware(monkeypatch)
    root = fake_machine(tmpfs, ami_variables())
    real = efivarfs.write_once
    calls = []

    def write_and_signal(path, data):
        calls.append(path.name)
        real(path, data)
        os.kill(os.getpid(), signal.SIGHUP)

    def hangup(signum, frame):
        raise KeyboardInterrupt

    monkeypatch.setattr(efivarfs, "write_once", write_and_signal)
    previous = signal.signal(signal.SIGHUP, hangup)
    try:
        rc, out, err = fix_root(capsys, root)
    finally:
        signal.signal(signal.SIGHUP, previous)
    assert rc == 130 and len(calls) == 1
    assert "stopped: applied: Optional/DB/amd64/DBUpdate3P2023.bin; the keys" in err
    assert "interrupted during" not in err


def test_a_flag_not_restored_after_a_refused_write_is_said(
    tmpfs, capsys, any_filesystem, monkeypatch
):
    root = fake_machine(tmpfs, ami_variables())
    db = immutable_db(root)
    real_set_flags = efivarfs.set_flags

    def refused(path, data):
        raise efivarfs.WriteError("write", OSError(errno.EACCES, os.strerror(errno.EACCES)))

    def set_flags(fd, flags):
        if flags & efivarfs.FS_IMMUTABLE_FL:
            raise PermissionError(errno.EPERM, os.strerror(errno.EPERM))
        real_set_flags(fd, flags)

    monkeypatch.setattr(efivarfs, "write_once", refused)
    monkeypatch.setattr(efivarfs, "set_flags", set_flags)
    try:
        rc, out, err = fix_root(capsys, root, "--json")
    finally:
        chattr("-i", db)
    assert rc == 2
    step = json.loads(out)["fix"]["steps"][0]
    assert step["status"] == "refused" and step["error"].startswith("EACCES")
    assert "immutable flag again failed: EPERM" in step["warning"]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "refused by the firmware" in lines[0] and "EPERM" in lines[0]


def test_a_root_that_does_not_exist_is_an_error(tmp_path, capsys):
    for extra in ([], ["--dry-run"]):
        rc, out, err = run(capsys, "--root", str(tmp_path / "none"), "--fix", *extra)
        assert rc == 2 and err.strip().endswith("none: no such directory"), err


def test_a_second_fix_meanwhile_is_refused(tmp_path, capsys, any_filesystem):
    root = fake_machine(tmp_path, ami_variables())
    before = snapshot(root)
    lock = root / "run/lock/secureboot-ca-check.lock"
    lock.parent.mkdir(parents=True)
    with efivarfs.fsutil.locked(lock):
        rc, out, err = fix_root(capsys, root, "--i-have-recovery-keys")
    assert rc == 2 and "locked by another process" in err and out == ""
    assert snapshot(root) == before
    assert not (root / "var/lib/secureboot-ca-check").exists()


def test_the_kek_update_is_not_read_when_kek_holds_the_2023_ca(tmp_path, capsys):
    """A truncated KEK update file does not matter on a machine whose KEK already holds
    the KEK 2K CA 2023: the map is read, the file is not."""
    copy = tmp_path / "objects"
    shutil.copytree(OBJECTS, copy)
    (copy / "PostSignedObjects/KEK/AMI/KEKUpdate_AMI_PK1.bin").write_bytes(bytes(10))
    objects = payloads.load_objects(str(OBJECTS))
    kek = ovmf_variables()["KEK"] + fix.signature_list(objects.certificate("kek_2k_ca_2023"))
    db = ovmf_variables()["db"] + b"".join(
        fix.signature_list(objects.certificate(ca)) for ca in payloads.DB_UPDATES.values()
    )
    efivars = write_efivars(tmp_path / "done", ami_variables(KEK=kek, db=db))
    rc, out, err = run(
        capsys, "--efivars", str(efivars), "--fix", "--dry-run", "--json", "--payloads", str(copy)
    )
    assert rc == 0, err
    doc = json.loads(out)["fix"]
    assert doc["steps"] == [] and len(doc["present"]) == 4
    assert doc["kek_update"]["published"]
    assert doc["kek_update"]["payload"] == "KEK/AMI/KEKUpdate_AMI_PK1.bin"
    # Where the KEK lacks it, the truncated file is an error, as before.
    efivars = write_efivars(tmp_path / "ami", ami_variables(db=db))
    rc, out, err = run(
        capsys, "--efivars", str(efivars), "--fix", "--dry-run", "--payloads", str(copy)
    )
    assert rc == 2 and "truncated" in err
