"""secureboot-ca-check's Authenticode hash and signers of EFI binaries (pe.py), on real ones.

The hash is cross-checked with a second implementation, pesign (NSS), and with the report's
own reader (efi.parse_pe), on Debian's signed shim, MokManager and GRUB and on a signed
kernel where one is at hand (DEBADMIN_TEST_KERNEL names one unpacked from
linux-image-*-amd64; else /boot/vmlinuz-*)."""

import glob
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from debadmin.errors import Error
from debadmin.secureboot_ca_check import efi, pe

SHIM = Path("/usr/lib/shim/shimx64.efi.signed")
GRUB = Path("/usr/lib/grub/x86_64-efi-signed/grubx64.efi.signed")
UEFI_CA_2011 = "48e99b991f57fc52f76149599bff0a58c47154229b9f8d603ac40d3500248507"
needs_shim = pytest.mark.skipif(not SHIM.is_file(), reason="shim-signed is not installed")


def signed_kernels():
    """Signed kernels at hand: DEBADMIN_TEST_KERNEL (e.g. a vmlinuz unpacked from
    linux-image-*-amd64), else the host's own."""
    named = os.environ.get("DEBADMIN_TEST_KERNEL")
    found = [named] if named else sorted(glob.glob("/boot/vmlinuz-*"))
    return [Path(p) for p in found if Path(p).is_file() and os.access(p, os.R_OK)]


REAL_IMAGES = [SHIM, GRUB, Path("/usr/lib/shim/mmx64.efi.signed")]
# A signed kernel: skipped, saying so, where none is at hand.
REAL_IMAGES += signed_kernels()[:1] or [Path("/boot/vmlinuz-none-signed-at-hand")]


def pesign_hash(path: Path) -> str:
    out = subprocess.run(
        ["pesign", "--hash", "--in", str(path)],
        check=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"},
    ).stdout.decode()
    return out.split("hash:")[1].split()[0].strip().lower()


# --- pe: the Authenticode hash --------------------------------------------------------------


@pytest.mark.skipif(not shutil.which("pesign"), reason="pesign is not installed")
@pytest.mark.parametrize("path", REAL_IMAGES, ids=lambda p: p.name)
def test_the_hash_is_pesign_s(path):
    """A second implementation (pesign, NSS) and a third (the report's reader) agree."""
    if not path.is_file():
        pytest.skip(f"{path} is not installed")
    data = path.read_bytes()
    image = pe.parse(data, str(path))
    assert image.sha256 == pesign_hash(path)
    assert image.sha256 == efi.parse_pe(data, str(path)).sha256


@needs_shim
def test_the_signers_of_debian_s_shim():
    image = pe.parse(SHIM.read_bytes(), str(SHIM))
    assert [efi.short_name(s.signer) for s in image.signatures] == [
        "Microsoft Windows UEFI Driver Publisher",
        "Microsoft UEFI CA 2023 signer",
    ]
    assert UEFI_CA_2011 in {efi.fingerprint(c) for c in image.signatures[0].certs}


@needs_shim
def test_what_the_hash_leaves_out_and_what_it_covers():
    data = bytearray(SHIM.read_bytes())
    original = pe.parse(bytes(data), "shim").sha256
    headers = pe.headers(bytes(data), "shim")
    checksum = headers.OPTIONAL_HEADER.get_field_absolute_offset("CheckSum")
    entry = pe.security_entry(headers)
    changed = bytearray(data)
    changed[checksum] ^= 0xFF
    assert pe.parse(bytes(changed), "x").sha256 == original
    # The certificate table's bytes (not its entry, which must still point at it).
    changed = bytearray(data)
    changed[entry.VirtualAddress + entry.Size - 1] ^= 0xFF
    assert pe.authenticode_sha256(bytes(changed), "x") == original
    section = headers.sections[0]
    changed = bytearray(data)
    changed[section.PointerToRawData + 10] ^= 1
    assert pe.parse(bytes(changed), "x").sha256 != original


@pytest.mark.parametrize(
    "data, message",
    [
        (b"", "no MZ header"),
        (b"MZ" + bytes(100), "not a PE image"),
        (b"#!/bin/sh\n" * 10, "no MZ header"),
    ],
)
def test_what_is_no_pe_image(data, message):
    with pytest.raises(Error, match=message):
        pe.parse(data, "f")


@needs_shim
def test_a_truncated_image_is_an_error():
    data = SHIM.read_bytes()
    with pytest.raises(Error):
        pe.parse(data[: len(data) // 2], "half")
