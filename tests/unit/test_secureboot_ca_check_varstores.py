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
