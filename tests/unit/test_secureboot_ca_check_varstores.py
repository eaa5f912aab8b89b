"""secureboot-ca-check --varstore: a file a package owns is refused; block devices and
stores at the start of a larger (padded) volume."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from debadmin.secureboot_ca_check import fix

from test_secureboot_ca_check_fix import (
    OVMF_MS,
    backups,
    cert_args,
    fake_cas,  # noqa: F401  (a fixture fakes uses)
    fakes,  # noqa: F401
    make_store,
    ms_variables,
    run,
)


def packaged_root(tmp_path: Path) -> Path:
    """A root whose dpkg database says ovmf owns its OVMF_VARS_4M.ms.fd."""
    root = tmp_path / "root"
    info = root / "var/lib/dpkg/info"
    info.mkdir(parents=True)
    (info / "ovmf.list").write_text(
        "/.\n/usr\n/usr/share/OVMF\n/usr/share/OVMF/OVMF_VARS_4M.ms.fd\n"
    )
    (info / "libc6:amd64.list").write_text("/usr/lib/x86_64-linux-gnu/libc.so.6\n")
    store = root / "usr/share/OVMF/OVMF_VARS_4M.ms.fd"
    store.parent.mkdir(parents=True)
    store.write_bytes(make_store(ms_variables()))
    return root


def test_package_owner(tmp_path):
    root = packaged_root(tmp_path)
    assert fix.package_owner(root / "usr/share/OVMF/OVMF_VARS_4M.ms.fd", root) == "ovmf"
    assert fix.package_owner(root / "usr/lib/x86_64-linux-gnu/libc.so.6", root) == "libc6"
    assert fix.package_owner(root / "usr/share/OVMF", root) == "ovmf"
    assert fix.package_owner(root / "usr/share/OVMF/OVMF_VARS_4M", root) is None
    assert fix.package_owner(tmp_path / "elsewhere.fd", root) is None
    # A name that reaches the file through a link (usr-merge's /lib) is the same file.
    (root / "lib").symlink_to("usr/lib")
    assert fix.package_owner(root / "lib/x86_64-linux-gnu/libc.so.6", root) == "libc6"
    assert fix.package_owner(tmp_path / "x.fd", tmp_path / "no-dpkg") is None


@pytest.mark.parametrize("extra", [[], ["--dry-run"], ["--json"]])
def test_a_packaged_file_is_refused_and_a_copy_fixed(tmp_path, capsys, fakes, extra):
    root = packaged_root(tmp_path)
    store = root / "usr/share/OVMF/OVMF_VARS_4M.ms.fd"
    before = store.read_bytes()
    rc, out, err = run(
        capsys, "--root", str(root), "--varstore", str(store), "--fix", *extra, *cert_args(fakes)
    )
    assert rc == 2 and "belongs to the package ovmf" in err and "copy it" in err
    assert len(err.strip().splitlines()) == 1
    if "--json" in extra:
        assert "belongs to the package ovmf" in json.loads(out)["error"]
    assert store.read_bytes() == before and backups(store) == []
    copy = tmp_path / "vm_VARS.fd"
    shutil.copyfile(store, copy)
    rc, out, err = run(
        capsys, "--root", str(root), "--varstore", str(copy), "--fix", *extra, *cert_args(fakes)
    )
    assert rc == 0, err
    # The check reads a packaged file as any other.
    rc, out, err = run(capsys, "--root", str(root), "--varstore", str(store))
    assert rc == 1


@pytest.mark.skipif(
    not OVMF_MS.is_file()
    or subprocess.run(["dpkg", "-S", str(OVMF_MS)], capture_output=True).returncode,
    reason="ovmf is not installed",
)
def test_the_installed_ovmf_template_is_refused(tmp_path, capsys):
    """Debian's own template, by the host's dpkg database (the README's old example)."""
    before = OVMF_MS.read_bytes()
    rc, out, err = run(capsys, "--varstore", str(OVMF_MS), "--fix", "--dry-run")
    assert rc == 2 and "belongs to the package ovmf" in err
    assert OVMF_MS.read_bytes() == before


# --- a store at the start of a larger volume ----------------------------------------------------

VOLUME = 4 << 20  # a Proxmox VE efidisk on LVM-thin: the 528 KiB store, zeros to 4 MiB


def padded(tmp_path: Path) -> Path:
    path = tmp_path / "efidisk.raw"
    path.write_bytes(make_store(ms_variables()).ljust(VOLUME, b"\0"))
    return path


def test_a_padded_store_is_found_and_the_padding_kept(tmp_path, capsys, fakes):
    path = padded(tmp_path)
    store_size = len(make_store(ms_variables()))
    rc, out, err = run(capsys, "--root", str(tmp_path), "--varstore", str(path), "--json")
    assert rc == 1, err
    rc, out, err = run(
        capsys, "--root", str(tmp_path), "--varstore", str(path), "--fix", *cert_args(fakes)
    )
    assert rc == 0, err
    new = path.read_bytes()
    assert len(new) == VOLUME and new[store_size:] == bytes(VOLUME - store_size)
    assert new[:store_size] != make_store(ms_variables())
    (backup,) = backups(path)
    assert backup.read_bytes() == make_store(ms_variables()).ljust(VOLUME, b"\0")
    # A second run changes nothing.
    rc, out, err = run(
        capsys, "--root", str(tmp_path), "--varstore", str(path), "--fix", *cert_args(fakes)
    )
    assert rc == 0 and "nothing to change" in out and path.read_bytes() == new


def test_what_follows_the_volume_is_not_a_store(tmp_path, capsys, fakes):
    """Padding that is not erased or zero (another volume's data after the store) is
    copied as it is, never read as variables."""
    path = tmp_path / "efidisk.raw"
    store = make_store(ms_variables())
    path.write_bytes(store + b"\x5a" * 4096)
    rc, out, err = run(
        capsys, "--root", str(tmp_path), "--varstore", str(path), "--fix", *cert_args(fakes)
    )
    assert rc == 0, err
    assert path.read_bytes()[len(store) :] == b"\x5a" * 4096


def test_a_link_to_a_regular_file_is_still_refused(tmp_path, capsys, fakes):
    """Only a block device is reached through a link (/dev/pve/vm-100-disk-1)."""
    path = padded(tmp_path)
    link = tmp_path / "link.fd"
    link.symlink_to(path.name)
    rc, out, err = run(
        capsys, "--root", str(tmp_path), "--varstore", str(link), "--fix", *cert_args(fakes)
    )
    assert rc == 2 and "symbolic link" in err


def test_device_helpers(tmp_path):
    from debadmin.secureboot_ca_check import blockdev

    assert not blockdev.is_block_device(padded(tmp_path))
    assert blockdev.volume_length(make_store(ms_variables())) == len(make_store(ms_variables()))
    assert blockdev.volume_length(b"short") is None
    proc = tmp_path / "proc"
    (proc / "42").mkdir(parents=True)
    words = [b"qemu-system-x86_64", b"-id", b"100", b"-name", b"vm", b"-m", b"512"]
    (proc / "42/cmdline").write_bytes(b"\0".join(words) + b"\0")
    assert blockdev.command(proc, 42) == "qemu-system-x86_64 -id 100 -name ..."
    (proc / "43").mkdir()
    (proc / "43/comm").write_text("kvm\n")
    assert blockdev.command(proc, 43) == "kvm"


@pytest.mark.needs_root
def test_a_read_only_device_is_read_and_refused_for_writing(tmp_path):
    """root opens a read-only device O_RDWR and only the write fails (EPERM): its
    read-only flag is asked first."""
    from debadmin.errors import Error
    from debadmin.secureboot_ca_check import blockdev

    image = padded(tmp_path)
    try:
        device = subprocess.run(
            ["losetup", "--find", "--show", "--read-only", str(image)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"no loop device here: {exc}")
    try:
        assert blockdev.read_device(Path(device))[:16] == image.read_bytes()[:16]
        with pytest.raises(Error, match="a read-only block device"):
            blockdev.open_device(Path(device), write=True)
    finally:
        subprocess.run(["losetup", "-d", device], check=False)
