"""secureboot-ca-check: a dump's plan uses the dump's architecture (--arch, else its
Boot#### entries' loader names, else the host's) and names that folder."""

import json
import struct
from pathlib import Path

import pytest

from debadmin.secureboot_ca_check import efi, efivarfs, payloads

from test_secureboot_ca_check_efivarfs import OBJECTS, ami_variables, run, write_efivars


def load_option(description: str, path: str) -> bytes:
    """An EFI_LOAD_OPTION as firmware stores it: a hard-drive node, a file path node
    (media, file path: UCS-2 with its NUL), the end node."""
    hard_drive = struct.pack("<BBH", 4, 1, 42) + bytes(38)
    text = (path + "\0").encode("utf-16-le")
    file_path = struct.pack("<BBH", 4, 4, 4 + len(text)) + text
    end = struct.pack("<BBH", 0x7F, 0xFF, 4)
    nodes = hard_drive + file_path + end
    name = (description + "\0").encode("utf-16-le")
    return struct.pack("<IH", 1, len(nodes)) + name + nodes


def add_boot(directory: Path, number: int, data: bytes) -> None:
    name = f"Boot{number:04X}-{efi.GLOBAL_GUID}"
    (directory / name).write_bytes(struct.pack("<I", 7) + data)


def set_order(directory: Path, name: str, numbers) -> None:
    data = b"".join(struct.pack("<H", n) for n in numbers)
    (directory / f"{name}-{efi.GLOBAL_GUID}").write_bytes(struct.pack("<I", 7) + data)


def arm64_dump(tmp_path: Path) -> Path:
    efivars = write_efivars(tmp_path / "arm", ami_variables())
    add_boot(efivars, 0, load_option("UEFI Shell", "\\EFI\\tools\\Shell.efi"))
    add_boot(efivars, 1, load_option("debian", "\\EFI\\debian\\shimaa64.efi"))
    add_boot(efivars, 2, load_option("fallback", "\\EFI\\BOOT\\BOOTX64.EFI"))
    set_order(efivars, "BootOrder", [0, 1, 2])
    return efivars


def plan(capsys, efivars: Path, *extra):
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
    assert rc == 0, err
    return json.loads(out)["fix"]


@pytest.mark.parametrize(
    "loader,arch",
    [
        ("\\EFI\\debian\\shimaa64.efi", "arm64"),
        ("\\EFI\\debian\\shimx64.efi", "amd64"),
        ("\\EFI\\BOOT\\BOOTAA64.EFI", "arm64"),
        ("\\EFI\\debian\\grubia32.efi", "i386"),
        ("\\EFI\\BOOT\\BOOTARM.EFI", "armhf"),
        ("\\EFI\\Microsoft\\Boot\\bootmgfw.efi", None),
    ],
)
def test_loader_names(loader, arch):
    found = efivarfs.boot_arch(load_option("x", loader))
    assert (found[0] if found else None) == arch


def test_the_boot_order_decides_and_the_folder_is_named(tmp_path, capsys):
    efivars = arm64_dump(tmp_path)
    fixing = plan(capsys, efivars)
    assert fixing["arch"] == "arm64" and "Boot0001" in fixing["arch_from"]
    db_steps = [s["payload"] for s in fixing["steps"] if s["variable"] == "db"]
    assert db_steps and all(p.startswith("Optional/DB/arm64/") for p in db_steps)
    # BootCurrent comes first: the entry the machine booted.
    set_order(efivars, "BootCurrent", [2])
    assert plan(capsys, efivars)["arch"] == "amd64"
    # The text names the folder; the report's offline fix too.
    rc, out, err = run(
        capsys, "--efivars", str(efivars), "--fix", "--dry-run", "--payloads", str(OBJECTS)
    )
    assert "architecture: amd64 (the loader of Boot0002: \\EFI\\BOOT\\BOOTX64.EFI)" in out
    rc, out, err = run(capsys, "--efivars", str(efivars), "--json", "--payloads", str(OBJECTS))
    offline = json.loads(out)["reports"][0]["offline_fix"]
    assert offline["arch"] == "amd64" and "Boot0002" in offline["arch_from"]
    assert all("/amd64/" in s["payload"] for s in offline["steps"] if s["variable"] == "db")


def test_arch_option_wins(tmp_path, capsys):
    fixing = plan(capsys, arm64_dump(tmp_path), "--arch", "armhf")
    assert fixing["arch"] == "armhf" and fixing["arch_from"] == "--arch"
    assert all(s["payload"].startswith("Optional/DB/arm/") for s in fixing["steps"][:3])


def test_without_boot_entries_the_host_decides(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(efivarfs, "machine_arch", lambda: "arm64")
    fixing = plan(capsys, write_efivars(tmp_path / "plain", ami_variables()))
    assert fixing["arch"] == "arm64" and "host" in fixing["arch_from"]


def test_damaged_boot_entries_are_passed_over(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(efivarfs, "machine_arch", lambda: "amd64")
    efivars = write_efivars(tmp_path / "odd", ami_variables())
    add_boot(efivars, 1, b"\1")
    add_boot(efivars, 2, struct.pack("<IH", 1, 900) + b"\0\0" + struct.pack("<BBH", 4, 4, 2))
    set_order(efivars, "BootOrder", [2, 1, 7])
    assert plan(capsys, efivars)["arch"] == "amd64"


def test_arch_is_refused_with_varstores(capsys):
    rc, out, err = run(capsys, "--varstore", "x.fd", "--arch", "arm64")
    assert rc == 2 and "--arch goes with" in err
    assert set(payloads.ARCHES) == {"amd64", "i386", "arm64", "armhf"}
