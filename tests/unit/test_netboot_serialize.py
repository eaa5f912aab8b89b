"""netboot-serialize on copies of the real text and gtk netboot trees of Debian 12."""

import contextlib
import ctypes
import gzip
import io
import json
import os
import resource
import shutil
import stat
import subprocess
import tarfile
from pathlib import Path
from typing import Optional

import pytest

from debadmin.netboot_serialize import main as ns
from debadmin.netboot_serialize import menus, settings
from debadmin.netboot_serialize import tar as nst

DATA = Path(__file__).resolve().parents[1] / "data" / "netboot-serialize"
BS = "debian-installer/amd64/boot-screens/"
GRUB = "debian-installer/amd64/grub/grub.cfg"
SYSLINUX_KERNEL_FILES = ["txt.cfg", "adtxt.cfg", "rqtxt.cfg", "drk.cfg", "addrk.cfg", "rqdrk.cfg"]
SPEECH_FILES = ["spk.cfg", "adspk.cfg", "rqspk.cfg"]


def snapshot(top: Path) -> dict:
    """Every entry below top: ('link', target) or ('file', bytes, mode) or ('dir',)."""
    result = {}
    for name in ns.tree_names(top):
        path = top / name
        if path.is_symlink():
            result[name] = ("link", os.readlink(path))
        elif path.is_dir():
            result[name] = ("dir",)
        else:
            result[name] = ("file", path.read_bytes(), os.stat(path).st_mode & 0o7777)
    return result


def copy_fixture(flavour: str, dest: Path) -> Path:
    """A copy of a real tree's configuration files with the symlinks as Debian ships them,
    with the modes Debian ships (no group or other write), whatever the checkout's umask:
    Python 3.13's tar filter drops those bits, and the tests compare modes."""
    shutil.copytree(DATA / flavour, dest, symlinks=True)
    for path in [dest, *dest.rglob("*")]:
        if not path.is_symlink():
            path.chmod(stat.S_IMODE(path.stat().st_mode) & ~0o022)
    for line in (DATA / "symlinks").read_text().splitlines():
        path, target = line.split()
        (dest / path).parent.mkdir(parents=True, exist_ok=True)
        (dest / path).symlink_to(target)
    return dest


@pytest.fixture(params=["text", "gtk"])
def tree(request, tmp_path):
    return copy_fixture(request.param, tmp_path / request.param)


def run(capsys, *argv):
    code = ns.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def make_tarball(tree: Path, path: Path) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        tar.add(tree, arcname=".")
    return path


# --- console specs and arguments -------------------------------------------------------------


@pytest.mark.parametrize(
    "spec,expected",
    [
        ("ttyS0,115200n8", ("ttyS0", 115200)),
        ("ttyS1,115200", ("ttyS1", 115200)),
        ("ttyS3,9600n8", ("ttyS3", 9600)),
        ("ttyS31,115200", ("ttyS31", 115200)),
        ("ttyAMA0,115200n8", ("ttyAMA0", 115200)),
        ("hvc0,9600", ("hvc0", 9600)),
    ],
)
def test_parse_console(spec, expected):
    assert ns.parse_console(spec) == expected


@pytest.mark.parametrize(
    "spec",
    [
        "ttyS9,fast",
        "ttyS1",
        "ttyS32,115200",
        "ttyAMA4,115200",
        "ttyS1,12345",
        "ttyS1,115200e7",
        "tty0",
        "ttyS1,115200n8;reboot",
        "",
    ],
)
def test_bad_console_exits_2_and_writes_nothing(capsys, tree, spec):
    before = snapshot(tree)
    code, out, err = run(capsys, tree, "--console", spec)
    assert code == 2
    assert err.startswith("netboot-serialize: error: invalid console") and err.count("\n") == 1
    assert snapshot(tree) == before


@pytest.mark.parametrize(
    "extra", ["console=tty0", "a='b c'", "x=$(reboot)", "a=1 --- b --- c", "foo}bar"]
)
def test_bad_extra_args_exit_2(capsys, tree, extra):
    before = snapshot(tree)
    code, _, err = run(capsys, tree, "--extra-args", extra)
    assert code == 2 and "error:" in err
    assert snapshot(tree) == before


def test_default_needs_timeout(capsys, tree):
    code, _, err = run(capsys, tree, "--default", "expert")
    assert code == 2 and "--default needs --timeout" in err


@pytest.mark.parametrize("seconds", ["3600", "-5"])
def test_bad_timeout(capsys, tree, seconds):
    code, _, _ = run(capsys, tree, "--timeout", seconds)
    assert code == 2


# --- per file kind -----------------------------------------------------------------------------


def test_syslinux_cfg_serial_first_directive(capsys, tree):
    assert run(capsys, tree, "--console", "ttyS1,115200n8")[0] == 0
    lines = (tree / BS / "syslinux.cfg").read_text().splitlines()
    directives = [ln for ln in lines if ln.strip() and not ln.startswith("#")]
    assert directives[0] == "serial 1 115200"
    assert "timeout 0" in lines and not any(ln.startswith("ontimeout") for ln in lines)
    assert lines[0] == "# D-I config version 2.0"
    prompt = [
        ln
        for ln in (tree / BS / "prompt.cfg").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    assert prompt[0] == "serial 1 115200"


def test_kernel_lines_syslinux(capsys, tree):
    assert run(capsys, tree, "--console", "ttyS1,115200n8")[0] == 0
    files = SYSLINUX_KERNEL_FILES + (SPEECH_FILES if tree.name == "gtk" else [])
    appends = []
    for name in files:
        for line in (tree / BS / name).read_text().splitlines():
            if line.strip().startswith("append"):
                appends.append(line)
    assert len(appends) == (8 if tree.name == "text" else 12)
    for line in appends:
        assert "vga=788" not in line
        pre, post = line.split(" --- ")
        assert post.rstrip().endswith("console=ttyS1,115200n8"), line
        assert "console=" not in pre
        assert "initrd=debian-installer/amd64/initrd.gz" in pre


def test_kernel_lines_grub(capsys, tree):
    assert run(capsys, tree, "--console", "ttyS2,57600")[0] == 0
    text = (tree / GRUB).read_text()
    linux = [ln for ln in text.splitlines() if ln.strip().startswith("linux ")]
    assert len(linux) == (26 if tree.name == "text" else 27)
    for line in linux:
        assert "vga=788" not in line
        assert line.startswith("    " if "    linux" in line else "")
        assert line.split(" --- ")[-1].endswith("console=ttyS2,57600n8") or line.endswith(
            "--- console=ttyS2,57600n8"
        ), line


def test_grub_serial_block_after_gfxterm(capsys, tree):
    assert run(capsys, tree, "--console", "ttyS1,115200n8")[0] == 0
    lines = (tree / GRUB).read_text().splitlines()
    gfx = lines.index("  terminal_output gfxterm")
    serial = lines.index("serial --unit=1 --speed=115200 --word=8 --parity=no --stop=1")
    assert lines[gfx + 1] == "fi" and serial == gfx + 3
    assert lines[serial + 1 : serial + 3] == [
        "terminal_input serial console",
        "terminal_output serial console",
    ]
    # After this block nothing switches the terminal back to gfxterm.
    assert not any("terminal_output" in ln and "gfxterm" in ln for ln in lines[serial:])


def test_speech_never_boots_by_itself(capsys, tmp_path):
    tree = tmp_path / "gtk"
    copy_fixture("gtk", tree)
    assert b"\ntimeout 300\n" in (tree / BS / "spk.cfg").read_bytes()
    assert run(capsys, tree)[0] == 0
    active = [
        ln
        for ln in (tree / BS / "spk.cfg").read_text().splitlines()
        if ln.strip() and not ln.lstrip().startswith("#")
    ]
    assert not any(
        ln.split()[0] in ("timeout", "ontimeout") or ln.startswith("menu autoboot")
        for ln in active
    )
    # With an unattended timeout the default is the text installer, never speech.
    assert run(capsys, tree, "--timeout", "10")[0] == 0
    syslinux = (tree / BS / "syslinux.cfg").read_text()
    ontimeout = [ln for ln in syslinux.splitlines() if ln.startswith("ontimeout")]
    assert len(ontimeout) == 1 and "speakup" not in ontimeout[0]
    assert 'set default="Install"' in (tree / GRUB).read_text()
    for name in ns.tree_names(tree):
        if name.endswith(".cfg") and (tree / name).is_file():
            for line in (tree / name).read_text().splitlines():
                if (
                    line.split()[:1] in (["timeout"], ["ontimeout"])
                    and name != BS + "syslinux.cfg"
                ):
                    assert line.split()[1] == "0", (name, line)


def test_help_files_and_symlinks_untouched(capsys, tree):
    before = snapshot(tree)
    assert run(capsys, tree, "--console", "ttyS1,115200n8", "--also-vga")[0] == 0
    after = snapshot(tree)
    assert set(before) == set(after)
    for name, entry in before.items():
        if entry[0] == "link":
            assert after[name] == entry  # pxelinux.cfg/default stays a symlink
        elif name.endswith(".txt") or name == "version.info" or name.endswith("menu.cfg"):
            assert after[name] == entry, name
    assert b"\x0f0f" in after[BS + "f1.txt"][1]  # control bytes kept
    assert (tree / "debian-installer/amd64/pxelinux.cfg/default").is_symlink()


def test_also_vga(capsys, tree):
    assert run(capsys, tree, "--console", "ttyS1,115200", "--also-vga")[0] == 0
    line = [ln for ln in (tree / BS / "txt.cfg").read_text().splitlines() if "append" in ln][0]
    assert line == (
        "\tappend vga=788 initrd=debian-installer/amd64/initrd.gz --- quiet "
        "console=tty0 console=ttyS1,115200n8 "
    )


def test_extra_args_around_separator(capsys, tree):
    assert (
        run(
            capsys,
            tree,
            "--extra-args",
            "auto=true url=http://10.0.0.1/p.cfg --- " "net.ifnames=0",
        )[0]
        == 0
    )
    line = [ln for ln in (tree / BS / "rqtxt.cfg").read_text().splitlines() if "append" in ln][0]
    assert line == (
        "\tappend initrd=debian-installer/amd64/initrd.gz rescue/enable=true "
        "auto=true url=http://10.0.0.1/p.cfg --- quiet net.ifnames=0 "
        "console=ttyS0,115200n8 "
    )
    grub = (tree / GRUB).read_text()
    assert (
        "linux    /debian-installer/amd64/linux auto=true url=http://10.0.0.1/p.cfg --- "
        "quiet net.ifnames=0 console=ttyS0,115200n8\n"
    ) in grub


@pytest.mark.parametrize(
    "entry,label,title",
    [
        ("install", "install", "Install"),
        ("expert", "expert", "Advanced options ...>... Expert install"),
        ("rescue", "rescue", "Advanced options ...>... Rescue mode"),
        ("auto", "auto", "Advanced options ...>... Automated install"),
    ],
)
def test_timeout_and_default(capsys, tree, entry, label, title):
    assert run(capsys, tree, "--timeout", "7", "--default", entry)[0] == 0
    syslinux = (tree / BS / "syslinux.cfg").read_text().splitlines()
    assert "timeout 70" in syslinux
    ontimeout = [ln for ln in syslinux if ln.startswith("ontimeout ")]
    menu = ns.labels(
        {
            n: (tree / n).read_bytes()
            for n in ns.tree_names(tree)
            if n.startswith(BS) and n.endswith(".cfg")
        }
    )
    kernel, append = menu[label]
    assert ontimeout == [f"ontimeout {kernel} {append}"]
    assert "console=ttyS0,115200n8" in append
    grub = (tree / GRUB).read_bytes()
    assert b"set timeout=7\n" in grub and f'set default="{title}"\n'.encode() in grub
    assert title in menus.grub_entries(grub)


# --- idempotence and clean replacement ---------------------------------------------------------


def test_second_run_changes_no_byte(capsys, tree):
    assert run(capsys, tree, "--console", "ttyS1,115200n8", "--timeout", "5")[0] == 0
    before = snapshot(tree)
    stamps = {n: os.lstat(tree / n).st_mtime_ns for n in before}
    code, out, _ = run(capsys, tree, "--console", "ttyS1,115200n8", "--timeout", "5")
    assert code == 0 and "nothing to change" in out
    assert snapshot(tree) == before
    assert {n: os.lstat(tree / n).st_mtime_ns for n in before} == stamps


@pytest.mark.parametrize(
    "first,second,fresh",
    [
        (["--console", "ttyS0,115200n8"], ["--console", "ttyS1,115200n8"], None),
        (
            [
                "--console",
                "ttyS0,9600",
                "--extra-args",
                "a=1 --- b=2",
                "--timeout",
                "3",
                "--default",
                "expert",
            ],
            ["--console", "ttyS1,115200n8", "--also-vga"],
            # What the second run keeps from the first.
            ["--console", "ttyS1,115200n8", "--also-vga", "--extra-args", "a=1 --- b=2"]
            + ["--timeout", "3", "--default", "expert"],
        ),
        (
            ["--also-vga", "--extra-args", "x=1"],
            ["--console", "ttyS3,38400", "--extra-args", "y", "--no-also-vga"],
            None,
        ),
        (["--console", "ttyS2,115200"], [], ["--console", "ttyS2,115200"]),
        (
            ["--console", "ttyS2,115200", "--timeout", "9", "--also-vga", "--extra-args", "x"],
            ["--console", "ttyS0,115200", "--timeout", "0", "--no-also-vga", "--extra-args", ""],
            [],
        ),
    ],
)
def test_another_console_replaces_the_first(capsys, tmp_path, first, second, fresh):
    for flavour in ("text", "gtk"):
        a, b = tmp_path / f"a-{flavour}", tmp_path / f"b-{flavour}"
        copy_fixture(flavour, a)
        copy_fixture(flavour, b)
        assert run(capsys, a, *first)[0] == 0
        assert run(capsys, a, *second)[0] == 0
        assert run(capsys, b, *(second if fresh is None else fresh))[0] == 0
        assert snapshot(a) == snapshot(b)


def test_also_vga_then_serial_only_restores_vga_position(capsys, tmp_path):
    pristine = snapshot(copy_fixture("gtk", tmp_path / "pristine"))
    tree = tmp_path / "gtk"
    copy_fixture("gtk", tree)
    assert run(capsys, tree)[0] == 0
    assert run(capsys, tree, "--also-vga")[0] == 0
    # Every vga=788 is back where d-i had it, only console= words were added.
    for name, entry in snapshot(tree).items():
        if entry[0] == "file" and (name.endswith(".cfg")) and "append" in entry[1].decode():
            lines = [
                ln for ln in entry[1].decode().splitlines() if not ln.startswith(settings.MARKER)
            ]
            for old, new in zip(pristine[name][1].decode().splitlines(), lines):
                if old.strip().startswith("append"):
                    assert new.startswith(old.rstrip()), (old, new)


# --- check, dry run, JSON ----------------------------------------------------------------------


def test_check(capsys, tree):
    code, out, _ = run(capsys, tree, "--check", "--console", "ttyS1,115200n8")
    assert code == 1
    assert f"differs: {BS}txt.cfg" in out and f"differs: {GRUB}" in out
    assert run(capsys, tree, "--console", "ttyS1,115200n8")[0] == 0
    code, out, _ = run(capsys, tree, "--check", "--console", "ttyS1,115200n8")
    assert code == 0 and "ok:" in out
    code, out, _ = run(capsys, tree, "--check", "--console", "ttyS0,115200n8")
    assert code == 1 and "differs" in out


def test_dry_run_writes_nothing(capsys, tree):
    before = snapshot(tree)
    code, out, _ = run(capsys, tree, "--dry-run", "--console", "ttyS1,115200n8")
    assert code == 0
    assert f"--- a/{BS}txt.cfg" in out and "+serial 1 115200" in out
    assert "-\tappend vga=788 initrd=debian-installer/amd64/initrd.gz --- quiet \n" in out
    assert snapshot(tree) == before


def test_json(capsys, tree):
    code, out, _ = run(capsys, tree, "--check", "--json", "--console", "ttyS1,115200n8")
    doc = json.loads(out)
    assert code == 1
    assert doc["mode"] == "check" and doc["serialized"] is False
    assert doc["debian_version"] == "12 (bookworm)"
    assert doc["installer_build"] == "20230607+deb12u15"
    assert doc["console"] == "ttyS1,115200n8" and doc["source_kind"] == "tree"
    assert {c["path"] for c in doc["changes"]} >= {BS + "txt.cfg", GRUB, BS + "syslinux.cfg"}
    assert {f["subject"] for f in doc["findings"]} == {c["path"] for c in doc["changes"]}
    assert all(list(f)[:4] == ["code", "severity", "subject", "message"] for f in doc["findings"])
    code, out, _ = run(capsys, tree, "--json", "--console", "ttyS1,115200n8")
    assert json.loads(out)["written"] is True
    code, out, _ = run(capsys, tree, "--json", "--dry-run", "--console", "ttyS1,115200n8")
    doc = json.loads(out)
    assert doc["serialized"] is True and doc["diff"] == "" and doc["written"] is False


# --- trees that are not netboot trees --------------------------------------------------------


def test_not_a_netboot_tree(capsys, tmp_path):
    (tmp_path / "empty").mkdir()
    code, _, err = run(capsys, tmp_path / "empty")
    assert code == 2 and "not a Debian installer netboot tree" in err
    code, _, err = run(capsys, tmp_path / "missing")
    assert code == 2 and "does not exist" in err


# The layouts of Debian's netboot packages without a boot menu (file names as shipped).
NO_MENU_TREES = {
    "ppc64el": (
        ["version.info", "debian-installer/ppc64el/initrd.gz", "debian-installer/ppc64el/vmlinux"],
        "petitboot",
    ),
    "armhf": (
        ["version.info", "boot.scr.uimg", "debian-installer/armhf/initrd.gz"]
        + ["debian-installer/armhf/vmlinuz", "debian-installer/armhf/tftpboot.scr"],
        "setenv console",
    ),
    "mips64el": (
        ["loongson-3/initrd.gz", "loongson-3/vmlinuz-6.1.0-50-loongson-3", "loongson-3/boot.cfg"]
        + ["malta/initrd.gz", "malta/vmlinuz-6.1.0-50-5kc-malta", "malta/netboot"],
        "loongson-3/ and 1 more",
    ),
    "armel": (
        ["kirkwood/network-console/qnap/ts-41x/initrd.gz"]
        + ["kirkwood/network-console/qnap/ts-41x/uImage", "kirkwood/x/flash-debian"],
        "firmware loader",
    ),
}


@pytest.mark.parametrize("arch", sorted(NO_MENU_TREES))
def test_trees_without_a_boot_menu_say_what_to_do(capsys, tmp_path, arch):
    names, says = NO_MENU_TREES[arch]
    for name in names:
        (tmp_path / arch / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / arch / name).write_bytes(b"")
    before = listing(tmp_path)
    code, _, err = run(capsys, tmp_path / arch)
    assert code == 2 and "no boot menu" in err and says in err and err.count("\n") == 1
    assert listing(tmp_path) == before


def test_parent_of_text_and_gtk_names_both(capsys, tmp_path):
    copy_fixture("text", tmp_path / "amd64/text")
    copy_fixture("gtk", tmp_path / "amd64/gtk")
    code, _, err = run(capsys, tmp_path / "amd64")
    assert code == 2 and "give SOURCE/gtk or SOURCE/text" in err
    path = make_tarball(tmp_path / "amd64", tmp_path / "both.tar.gz")
    code, _, err = run(capsys, path, "-o", tmp_path / "out")
    assert code == 2 and "give SOURCE/gtk or SOURCE/text" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(not shutil.which("zstd"), reason="zstd not installed")
def test_zstd_tarball_is_named_as_such(capsys, tree, tmp_path):
    plain = tmp_path / "netboot.tar"
    with tarfile.open(plain, "w") as tar:
        tar.add(tree, arcname=".")
    subprocess.run(["zstd", "-q", "--rm", str(plain)], check=True)
    path = tmp_path / "netboot.tar.zst"
    data = path.read_bytes()
    code, _, err = run(capsys, path, "-o", tmp_path / "out")
    assert code == 2 and "zstd-compressed" in err and "tar --zstd -xf" in err
    assert path.read_bytes() == data and not (tmp_path / "out").exists()


def test_pax_global_header_survives(capsys, tree, tmp_path):
    path = tmp_path / "netboot.tar.gz"
    with tarfile.open(
        path, "w:gz", format=tarfile.PAX_FORMAT, pax_headers={"comment": "git 0123abc"}
    ) as tar:
        tar.add(tree, arcname=".")
    out = tmp_path / "out.tar.xz"
    assert run(capsys, path, "-o", out)[0] == 0
    assert run(capsys, path)[0] == 0
    for written in (path, out):
        with tarfile.open(written) as tar:
            tar.getmembers()
            assert tar.pax_headers == {"comment": "git 0123abc"}
        assert run(capsys, written, "--check")[0] == 0


def test_symlinked_config_is_refused(capsys, tree, tmp_path):
    outside = tmp_path / "outside.cfg"
    outside.write_text("label x\n\tappend vga=788 --- quiet\n")
    (tree / BS / "txt.cfg").unlink()
    (tree / BS / "txt.cfg").symlink_to(outside)
    before = snapshot(tree)
    code, _, err = run(capsys, tree)
    assert code == 2 and "symlinks are not edited" in err
    assert snapshot(tree) == before and outside.read_text().startswith("label x")


def test_output_inside_source_is_refused(capsys, tree):
    code, _, err = run(capsys, tree, "--output", tree / "sub.tar.gz")
    assert code == 2 and "inside the source tree" in err


# --- tarballs ----------------------------------------------------------------------------------


def test_tarball_to_tarball_and_tree(capsys, tree, tmp_path):
    source = make_tarball(tree, tmp_path / "netboot.tar.gz")
    out1, out2 = tmp_path / "s1.tar.gz", tmp_path / "s2.tar.gz"
    assert run(capsys, source, "-o", out1, "--console", "ttyS1,115200n8")[0] == 0
    assert run(capsys, source, "-o", out2, "--console", "ttyS1,115200n8")[0] == 0
    assert out1.read_bytes() == out2.read_bytes()  # deterministic
    assert run(capsys, out1, "--check", "--console", "ttyS1,115200n8")[0] == 0
    # The serialized tarball run again changes nothing.
    code, out, _ = run(capsys, out1, "--console", "ttyS1,115200n8")
    assert code == 0 and "nothing to change" in out
    assert out1.read_bytes() == out2.read_bytes()
    # Same tree as serializing the unpacked tree in place.
    assert run(capsys, source, "-o", tmp_path / "unpacked", "--console", "ttyS1,115200n8")[0] == 0
    assert run(capsys, tree, "--console", "ttyS1,115200n8")[0] == 0
    assert snapshot(tmp_path / "unpacked") == snapshot(tree)
    unpacked = tmp_path / "from-tar"
    unpacked.mkdir()
    with tarfile.open(out1) as tar:
        # The 'tar' filter where this Python has filters (3.14 changes the default).
        tar.extractall(unpacked, **({"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}))
    assert snapshot(unpacked) == snapshot(tree)
    # Another console replaces the tree output whole.
    assert run(capsys, source, "-o", tmp_path / "unpacked", "--console", "ttyS0,9600")[0] == 0
    assert run(capsys, tmp_path / "unpacked", "--check", "--console", "ttyS0,9600")[0] == 0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_tree_to_tarball(capsys, tree, tmp_path):
    before = snapshot(tree)
    dest = tmp_path / "out.tar"
    assert run(capsys, tree, "--output", dest, "--console", "ttyS1,115200n8")[0] == 0
    assert snapshot(tree) == before  # the source is not edited
    with tarfile.open(dest) as tar:
        names = tar.getnames()
        assert "./pxelinux.0" in names and tar.getmember("./pxelinux.0").issym()
        assert tar.getmember(f"./{BS}txt.cfg").uname == "root"
    assert run(capsys, dest, "--check", "--console", "ttyS1,115200n8")[0] == 0
    first = dest.read_bytes()
    assert run(capsys, tree, "--output", dest, "--console", "ttyS1,115200n8")[0] == 0
    assert dest.read_bytes() == first


def test_tarball_in_place(capsys, tree, tmp_path):
    source = make_tarball(tree, tmp_path / "netboot.tar.gz")
    assert run(capsys, source, "--console", "ttyS1,115200n8")[0] == 0
    assert run(capsys, source, "--check", "--console", "ttyS1,115200n8")[0] == 0


# --- hostile tarballs ----------------------------------------------------------------------


def add(tar, name, data=b"x", **attrs):
    info = tarfile.TarInfo(name)
    for key, value in attrs.items():
        setattr(info, key, value)
    if info.isreg():
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    else:
        tar.addfile(info)


def hostile(tmp_path, tree, extra):
    """A real netboot tarball with one hostile member added (at the end or the start)."""
    path = tmp_path / "hostile.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        extra(tar, "start")
        tar.add(tree, arcname=".")
        extra(tar, "end")
    return path


HOSTILE = {
    "absolute": lambda t: add(t, "/etc/evil.cfg"),
    "dotdot": lambda t: add(t, "./debian-installer/../../evil"),
    "dotdot-deep": lambda t: add(t, "debian-installer/amd64/../../../evil"),
    "symlink-absolute": lambda t: add(t, "./evil", type=tarfile.SYMTYPE, linkname="/etc/passwd"),
    "symlink-up": lambda t: add(
        t, "./debian-installer/evil", type=tarfile.SYMTYPE, linkname="../../etc"
    ),
    "symlink-chain": lambda t: (
        add(t, "./r", type=tarfile.SYMTYPE, linkname="."),
        add(t, "./e", type=tarfile.SYMTYPE, linkname="r/.."),
    ),
    "through-symlink": lambda t: (
        add(t, "./d", type=tarfile.SYMTYPE, linkname="debian-installer"),
        add(t, "./d/amd64/evil.cfg"),
    ),
    "chardev": lambda t: add(t, "./null", type=tarfile.CHRTYPE, devmajor=1, devminor=3),
    "blockdev": lambda t: add(t, "./sda", type=tarfile.BLKTYPE, devmajor=8, devminor=0),
    "fifo": lambda t: add(t, "./fifo", type=tarfile.FIFOTYPE),
    "hardlink-outside": lambda t: add(t, "./evil", type=tarfile.LNKTYPE, linkname="../etc/shadow"),
    "hardlink-absolute": lambda t: add(t, "./evil", type=tarfile.LNKTYPE, linkname="/etc/shadow"),
    "hardlink-missing": lambda t: add(t, "./evil", type=tarfile.LNKTYPE, linkname="nothere"),
    "duplicate": lambda t: add(t, "./version.info", b"Debian version: 99\n"),
}


@pytest.mark.parametrize("where", ["start", "end"])
@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_hostile_tarball_writes_nothing(capsys, tmp_path, kind, where):
    src = tmp_path / "src"
    copy_fixture("text", src)
    path = hostile(tmp_path, src, lambda t, w: HOSTILE[kind](t) if w == where else None)
    for dest in (tmp_path / "out", tmp_path / "out.tar.gz", None):
        before = sorted(p.name for p in tmp_path.iterdir())
        data = path.read_bytes()
        argv = [path] + (["--output", dest] if dest else [])
        code, out, err = run(capsys, *argv)
        assert code == 2, (kind, out, err)
        assert (
            err.startswith("netboot-serialize: error: refusing tarball") and err.count("\n") == 1
        ), err
        assert sorted(p.name for p in tmp_path.iterdir()) == before
        assert path.read_bytes() == data


def test_absurd_sizes_and_counts(capsys, tmp_path, monkeypatch):
    src = tmp_path / "src"
    copy_fixture("text", src)
    path = make_tarball(src, tmp_path / "n.tar.gz")
    monkeypatch.setattr(nst, "MAX_MEMBER_SIZE", 1000)
    code, _, err = run(capsys, path, "-o", tmp_path / "o1")
    assert code == 2 and "bytes" in err and not (tmp_path / "o1").exists()
    monkeypatch.undo()
    monkeypatch.setattr(nst, "MAX_MEMBERS", 10)
    code, _, err = run(capsys, path, "-o", tmp_path / "o2")
    assert code == 2 and "more than 10 members" in err and not (tmp_path / "o2").exists()
    monkeypatch.undo()
    monkeypatch.setattr(nst, "MAX_TOTAL_SIZE", 5000)
    code, _, err = run(capsys, path, "-o", tmp_path / "o3")
    assert code == 2 and "unpacked" in err and not (tmp_path / "o3").exists()


def test_garbage_and_truncated_tarballs(capsys, tmp_path):
    src = tmp_path / "src"
    copy_fixture("gtk", src)
    good = make_tarball(src, tmp_path / "n.tar.gz").read_bytes()
    (tmp_path / "trunc.tar.gz").write_bytes(good[: len(good) // 2])
    (tmp_path / "junk.tar.gz").write_bytes(b"\x1f\x8b not really gzip" * 10)
    for name in ("trunc.tar.gz", "junk.tar.gz"):
        code, _, err = run(capsys, tmp_path / name, "-o", tmp_path / "out")
        assert code == 2 and "tarball" in err and not (tmp_path / "out").exists()


def test_tarball_that_is_not_netboot(capsys, tmp_path):
    path = tmp_path / "other.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        add(tar, "./hello.txt", b"hi")
    code, _, err = run(capsys, path, "-o", tmp_path / "out")
    assert code == 2 and "not a Debian installer netboot tree" in err
    assert not (tmp_path / "out").exists()


def test_symlinks_inside_are_fine():
    tree = nst._Tree()
    tree.kinds.update({"a": "dir", "a/b": "dir"})
    tree.links["a/up"] = ".."
    assert tree.resolve("a/up") == ""
    tree.links["a/b/up2"] = "../.."
    assert tree.resolve("a/b/up2") == ""
    tree.links["a/b/out"] = "../../.."
    assert tree.resolve("a/b/out") is None
    tree.links["loop"] = "loop"
    assert tree.resolve("loop") is None


# --- interrupted writes leave nothing half-written --------------------------------------------


def test_interrupted_tree_output_leaves_nothing(capsys, tree, tmp_path, monkeypatch):
    source = make_tarball(tree, tmp_path / "netboot.tar.gz")
    dest = tmp_path / "out"
    assert run(capsys, source, "-o", dest, "--console", "ttyS0,9600")[0] == 0
    before = snapshot(dest)

    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(ns, "put_tree_in_place", boom)
    code, _, err = run(capsys, source, "-o", dest, "--console", "ttyS1,115200n8")
    assert code == 130 and "interrupted" in err
    assert snapshot(dest) == before  # the old tree, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [tree.name, "netboot.tar.gz", "out"]
    )


def test_interrupted_tarball_output_leaves_old_tarball(capsys, tree, tmp_path, monkeypatch):
    source = make_tarball(tree, tmp_path / "netboot.tar.gz")
    dest = tmp_path / "out.tar.gz"
    assert run(capsys, source, "-o", dest)[0] == 0
    old = dest.read_bytes()

    def half(path, members, out, replace, compression):
        out.write(b"half a tarball")
        raise KeyboardInterrupt

    monkeypatch.setattr(nst, "rewrite", half)
    code, _, _ = run(capsys, source, "-o", dest, "--console", "ttyS1,115200n8")
    assert code == 130
    assert dest.read_bytes() == old
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def run_without_dac_override(*argv):
    """ns.main in a forked child holding no capabilities, so that permission bits apply
    even when the tests run as root (as CI does): (exit code, stdout, stderr)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        result = [99, "", "child failed"]
        try:
            os.close(read_fd)
            # capset(2): _LINUX_CAPABILITY_VERSION_3, this process; empty sets.
            header = (ctypes.c_uint32 * 2)(0x20080522, 0)
            if ctypes.CDLL(None, use_errno=True).capset(header, (ctypes.c_uint32 * 6)()):
                raise OSError(ctypes.get_errno(), "capset")
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = ns.main([str(a) for a in argv])
            result = [code, out.getvalue(), err.getvalue()]
        except BaseException as exc:
            result = [99, "", repr(exc)]
        finally:
            os.write(write_fd, json.dumps(result).encode())
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    code, out, err = json.loads(data)
    assert "Traceback" not in err
    return code, out, err


def test_in_place_write_failure_is_one_line(tree):
    before = snapshot(tree)
    os.chmod(tree / BS, 0o555)
    try:
        code, _, err = run_without_dac_override(tree)
    finally:
        os.chmod(tree / BS, 0o755)
    assert code == 2 and err.startswith("netboot-serialize: error: cannot write"), err
    assert err.count("\n") == 1
    assert snapshot(tree) == before


def test_in_place_write_failure_as_file_size_limit(capsys, tree):
    """The same through RLIMIT_FSIZE, which binds root too (Python ignores SIGXFSZ)."""
    before = snapshot(tree)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64, hard))
    try:
        code, _, err = run(capsys, tree)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert code == 2 and err.startswith("netboot-serialize: error: cannot write"), err
    assert err.count("\n") == 1
    assert snapshot(tree) == before


@pytest.mark.parametrize("output", [False, True])
def test_unreadable_directory_is_an_error(tree, tmp_path, output):
    """os.walk would skip it silently: here the grub directory, leaving UEFI on VGA."""
    before = snapshot(tree)
    listing = sorted(p.name for p in tmp_path.iterdir())
    os.chmod(tree / "debian-installer/amd64/grub", 0)
    try:
        argv = [tree] + (["--output", tmp_path / "out"] if output else [])
        code, _, err = run_without_dac_override(*argv)
    finally:
        os.chmod(tree / "debian-installer/amd64/grub", 0o755)
    assert code == 2 and err.startswith("netboot-serialize: error: cannot read"), err
    assert "grub" in err and err.count("\n") == 1
    assert snapshot(tree) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == listing


def test_huge_config_member_is_refused(capsys, tmp_path):
    src = copy_fixture("text", tmp_path / "src")
    path = tmp_path / "big.tar"
    with tarfile.open(path, "w") as tar:
        for name in sorted(ns.tree_names(src)):
            if name != BS + "txt.cfg":
                tar.add(src / name, arcname="./" + name, recursive=False)
        add(tar, "./" + BS + "txt.cfg", b"#" * (2 << 20))
    code, _, err = run(capsys, path, "-o", tmp_path / "out")
    assert code == 2 and "too big for a boot config" in err
    assert not (tmp_path / "out").exists()


# --- --output onto what exists ------------------------------------------------------------------


def listing(top: Path) -> dict:
    """Every entry below top with its bytes, for 'nothing changed anywhere' assertions."""
    return {
        name: (top / name).read_bytes() if (top / name).is_file() else None
        for name in ns.tree_names(top)
    }


def test_output_holding_the_source_is_refused(capsys, tmp_path):
    """netboot-serialize tftp/netboot.tar --output tftp swapped out and deleted the source."""
    src = copy_fixture("text", tmp_path / "src")
    tftp = tmp_path / "tftp"
    tftp.mkdir()
    make_tarball(src, tftp / "netboot.tar.gz")
    (tftp / "other-os.txt").write_text("keep me\n")
    shutil.copytree(src, tftp / "tree", symlinks=True)
    before = listing(tmp_path)
    for source in (tftp / "netboot.tar.gz", tftp / "tree"):
        code, _, err = run(capsys, source, "--output", tftp)
        assert code == 2 and "holds the source" in err and err.count("\n") == 1, err
        assert listing(tmp_path) == before


def test_output_with_foreign_files_is_refused(capsys, tmp_path):
    src = copy_fixture("gtk", tmp_path / "src")
    dest = tmp_path / "tftp"
    dest.mkdir()
    (dest / "other-os").mkdir()
    (dest / "other-os" / "vmlinuz").write_bytes(b"kernel")
    before = listing(tmp_path)
    for source in (src, make_tarball(src, tmp_path / "netboot.tar.gz")):
        before = listing(tmp_path)
        code, _, err = run(capsys, source, "--output", dest)
        assert code == 2 and err.count("\n") == 1
        assert "refusing to replace" in err and "other-os" in err and "1 more" in err, err
        assert listing(tmp_path) == before


def test_output_onto_an_empty_or_earlier_directory(capsys, tmp_path):
    src = copy_fixture("text", tmp_path / "src")
    dest = tmp_path / "tftp"
    dest.mkdir(mode=0o750)  # tftpd-hpa's /srv/tftp exists before the first run
    assert run(capsys, src, "--output", dest)[0] == 0
    assert run(capsys, dest, "--check")[0] == 0
    assert stat.S_IMODE(dest.stat().st_mode) == 0o750
    # The installer's own directory is replaced whole: a text tree may follow the larger
    # gtk tree (as trixie's follows bookworm's, whose GRUB has modules trixie's lacks),
    # and keeps the console the root was serialized for.
    gtk = copy_fixture("gtk", tmp_path / "gtk")
    assert run(capsys, gtk, "--output", dest, "--console", "ttyS1,9600")[0] == 0
    code, out, _ = run(capsys, src, "--output", dest)
    assert code == 0 and f"kept from the earlier run in {dest}: --console ttyS1,9600n8" in out
    assert not (dest / BS / "gtk").exists()
    assert run(capsys, dest, "--check", "--console", "ttyS1,9600")[0] == 0
    # Anything else the new tree lacks is the admin's: refused.
    assert run(capsys, gtk, "--output", dest)[0] == 0
    (dest / "preseed.cfg").write_text("d-i debian-installer/locale string C\n")
    before = listing(tmp_path)
    code, _, err = run(capsys, src, "--output", dest)
    assert code == 2 and "refusing to replace" in err and "preseed.cfg" in err
    assert listing(tmp_path) == before


def test_rerun_keeps_the_earlier_choices(capsys, tree):
    first = ["--console", "ttyS1,9600", "--also-vga", "--extra-args", "a=1 --- b=2"]
    assert run(capsys, tree, *first, "--timeout", "5", "--default", "rescue")[0] == 0
    before = snapshot(tree)
    code, out, _ = run(capsys, tree)
    assert code == 0 and "nothing to change" in out
    assert (
        f"kept from the earlier run in {tree}: --console ttyS1,9600n8 --also-vga "
        "--extra-args 'a=1 --- b=2' --timeout 5 --default rescue"
    ) in out
    assert snapshot(tree) == before
    assert run(capsys, tree, "--check")[0] == 0
    # One choice changed, the others kept; --timeout 0 and --no-also-vga undo theirs.
    code, out, _ = run(capsys, tree, "--json", "--timeout", "0", "--no-also-vga")
    document = json.loads(out)
    assert code == 0 and document["kept"] == [
        "--console ttyS1,9600n8",
        "--extra-args 'a=1 --- b=2'",
    ]
    assert document["timeout"] is None and document["also_vga"] is False
    expected = copy_fixture(tree.name, tree.parent / "expected")
    assert run(capsys, expected, "--console", "ttyS1,9600", "--extra-args", "a=1 --- b=2")[0] == 0
    assert snapshot(tree) == snapshot(expected)
    code, out, _ = run(capsys, tree, "--extra-args", "")
    assert code == 0 and "--extra-args" not in out.splitlines()[1]


def test_rerun_keeps_timeout_of_a_tree_serialized_before_it_was_recorded(capsys, tree):
    """The settings comment of 0.1.0 and of 0.2.0 before this held no timeout: read it from
    what the run wrote (GRUB's set timeout/default, syslinux's timeout/ontimeout)."""
    assert run(capsys, tree, "--timeout", "7", "--default", "expert")[0] == 0
    for name in (GRUB, BS + "syslinux.cfg"):
        data = (tree / name).read_text()
        (tree / name).write_text(data.replace(" timeout=7 default=expert", ""))
    layout, files = ns.read_tree(tree)
    assert ns.recorded_settings(files, layout).timeout == 7
    assert ns.recorded_settings(files, layout).default == "expert"
    # Without GRUB's block, syslinux.cfg's timeout and ontimeout say the same.
    kept = [
        ln
        for ln in (tree / GRUB).read_text().splitlines(True)
        if not ln.startswith(settings.MARKER) and not ln.startswith("set ")
    ]
    (tree / GRUB).write_text("".join(kept))
    layout, files = ns.read_tree(tree)
    found = ns.recorded_settings(files, layout)
    assert (found.timeout, found.default) == (7, "expert")


def test_second_output_run_writes_nothing(capsys, tree, tmp_path):
    source = make_tarball(tree, tmp_path / "netboot.tar.gz")
    for src in (tree, source):
        for dest in (tmp_path / "out", tmp_path / "out.tar.gz"):
            assert run(capsys, src, "--output", dest, "--console", "ttyS1,115200n8")[0] == 0
            stamp = os.lstat(dest)
            inodes = (
                {n: os.lstat(dest / n).st_ino for n in ns.tree_names(dest)}
                if dest.is_dir()
                else {}
            )
            code, out, _ = run(capsys, src, "--output", dest, "--console", "ttyS1,115200n8")
            assert code == 0 and "nothing to change" in out and "changed:" not in out, out
            assert (os.lstat(dest).st_ino, os.lstat(dest).st_mtime_ns) == (
                stamp.st_ino,
                stamp.st_mtime_ns,
            )
            if dest.is_dir():
                assert {n: os.lstat(dest / n).st_ino for n in ns.tree_names(dest)} == inodes
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    code, out, _ = run(capsys, source, "--json", "-o", tmp_path / "out", "-c", "ttyS1,115200")
    assert json.loads(out)["written"] is False
    code, out, _ = run(capsys, source, "-o", tmp_path / "out", "-c", "ttyS2,115200")
    assert code == 0 and out.endswith(f"wrote {tmp_path / 'out'} (ttyS2,115200n8)\n")


def test_output_dot(capsys, tmp_path, monkeypatch):
    src = copy_fixture("text", tmp_path / "src")
    work = tmp_path / "work"
    work.mkdir()
    (work / "mine.txt").write_text("keep\n")
    monkeypatch.chdir(work)
    code, _, err = run(capsys, src, "--output", ".")
    assert code == 2 and "refusing to replace" in err and "mine.txt" in err
    assert (work / "mine.txt").read_text() == "keep\n"
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.chdir(empty)
    assert run(capsys, src, "--output", ".")[0] == 0
    assert run(capsys, empty, "--check")[0] == 0


def test_output_root_and_empty_name(capsys, tree):
    before = snapshot(tree)
    code, _, err = run(capsys, tree, "--output", "/")
    assert code == 2 and "root directory" in err and err.count("\n") == 1
    code, _, err = run(capsys, tree, "--output", "")
    assert code == 2 and "--output needs" in err and err.count("\n") == 1
    assert snapshot(tree) == before  # "" used to mean: edit in place


def test_unsupported_output_compression_is_refused(capsys, tree, tmp_path):
    code, _, err = run(capsys, tree, "--output", tmp_path / "netboot.tar.zst")
    assert code == 2 and ".tar.xz" in err
    assert not (tmp_path / "netboot.tar.zst").exists()


# --- interrupted runs ---------------------------------------------------------------------------


def partial_run(tree: Path, argv, only) -> None:
    """What an interrupted in-place run leaves: the files in only rewritten, the rest old."""
    args = ns.build_parser().parse_args([str(tree)] + argv)
    layout, files = ns.read_tree(tree)
    for change in ns.serialize(files, layout, settings.settings_from(args)):
        if only(change.path):
            (tree / change.path).write_bytes(change.new)


FIRST = ["--console", "ttyS0,9600", "--extra-args", "a=1 --- b=2", "--timeout", "3"]
# Every choice explicit: a rerun keeps what it does not name (test_rerun_keeps_...).
SECOND = ["--console", "ttyS1,115200n8", "--also-vga", "--extra-args", "c=3", "--timeout", "0"]


@pytest.mark.parametrize("flavour", ["text", "gtk"])
@pytest.mark.parametrize("first", [None, FIRST])
def test_interrupted_in_place_run_is_repaired(capsys, tmp_path, flavour, first):
    """Whatever subset of files an interrupted run rewrote, the next run gets it right."""
    expected = copy_fixture(flavour, tmp_path / "expected")
    assert run(capsys, expected, *SECOND)[0] == 0
    probe = copy_fixture(flavour, tmp_path / "probe")
    if first:
        assert run(capsys, probe, *first)[0] == 0
    layout, files = ns.read_tree(probe)
    names = [
        c.path
        for c in ns.serialize(
            files,
            layout,
            settings.settings_from(ns.build_parser().parse_args([str(probe)] + SECOND)),
        )
    ]
    assert BS + "syslinux.cfg" in names and BS + "txt.cfg" in names
    subsets = [{n} for n in names] + [set(names) - {n} for n in names]
    for i, subset in enumerate(subsets):
        tree = copy_fixture(flavour, tmp_path / f"t{i}")
        if first:
            assert run(capsys, tree, *first)[0] == 0
        partial_run(tree, SECOND, lambda path: path in subset)
        assert run(capsys, tree, *SECOND)[0] == 0
        assert snapshot(tree) == snapshot(expected), sorted(subset)


def serialized_by_0_1_0(capsys, path):
    """The gtk tree serialized with FIRST as 0.1.0 left it: the settings comment in
    syslinux.cfg alone, none in the other menu files."""
    tree = copy_fixture("gtk", path)
    assert run(capsys, tree, *FIRST)[0] == 0
    for name in ns.tree_names(tree):
        if name.startswith(BS) and not name.endswith("syslinux.cfg") and name.endswith(".cfg"):
            data = (tree / name).read_bytes()
            kept = [
                ln for ln in data.splitlines(True) if not ln.startswith(settings.MARKER.encode())
            ]
            (tree / name).write_bytes(b"".join(kept))
    return tree


def test_tree_serialized_by_0_1_0_is_undone(capsys, tmp_path):
    """0.1.0 kept its settings in syslinux.cfg only: menu files without a marker of their
    own but with console= words fall back to it."""
    tree = serialized_by_0_1_0(capsys, tmp_path / "old")
    assert run(capsys, tree, *SECOND)[0] == 0
    expected = copy_fixture("gtk", tmp_path / "expected")
    assert run(capsys, expected, *SECOND)[0] == 0
    assert snapshot(tree) == snapshot(expected)


def test_check_on_a_tree_serialized_by_0_1_0(capsys, tmp_path):
    """The same settings, written by 0.1.0 (no per-file comment): --check lists the
    comment-only files but exits 0; a real difference still exits 1."""
    tree = serialized_by_0_1_0(capsys, tmp_path / "old")
    code, out, _ = run(capsys, tree, "--check", *FIRST)
    assert code == 0 and ns.COMMENT_ONLY in out
    assert run(capsys, tree, "--check", *SECOND)[0] == 1


# --- GRUB syntax of what is written -----------------------------------------------------------


@pytest.mark.parametrize("extra", ["a|b", "a&b", "a<b", "a>b", "#x", "a=1 --- #c"])
def test_grub_syntax_characters_are_refused(capsys, tree, extra):
    before = snapshot(tree)
    code, _, err = run(capsys, tree, "--extra-args", extra)
    assert code == 2 and "refusing kernel argument" in err and err.count("\n") == 1
    assert snapshot(tree) == before


@pytest.mark.skipif(not shutil.which("grub-script-check"), reason="grub-common not installed")
@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--also-vga", "--timeout", "5", "--default", "rescue"],
        ["--extra-args", "url=http://10.0.0.1/p.cfg?a=b#x a#b (x) --- net.ifnames=0 *"],
    ],
)
def test_grub_cfg_passes_grub_script_check(capsys, tree, argv):
    assert run(capsys, tree, *argv)[0] == 0
    check = subprocess.run(
        ["grub-script-check", str(tree / GRUB)], capture_output=True, text=True, check=False
    )
    assert check.returncode == 0, check.stdout + check.stderr


# --- tarballs: memory, compression, errors ----------------------------------------------------


def test_only_the_layouts_configs_are_read(capsys, tmp_path):
    """A *.cfg of another directory is never read, however big: it is no boot config."""
    src = copy_fixture("text", tmp_path / "src")
    path = tmp_path / "n.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        tar.add(src, arcname=".")
        add(tar, "./debian-installer/other/boot-screens/big.cfg", b"#" * (2 << 20))
    assert run(capsys, path, "-o", tmp_path / "out")[0] == 0
    assert (tmp_path / "out/debian-installer/other/boot-screens/big.cfg").stat().st_size == 2 << 20


def test_boot_configs_over_the_total_are_refused(capsys, tmp_path, monkeypatch):
    src = copy_fixture("text", tmp_path / "src")
    path = tmp_path / "n.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        tar.add(src, arcname=".")
        for i in range(8):
            add(tar, f"./{BS}pad{i}.cfg", b"#" * 100_000)
    monkeypatch.setattr(nst, "MAX_WANTED_TOTAL", 500_000)
    code, _, err = run(capsys, path, "-o", tmp_path / "out")
    assert code == 2 and "boot configs are over 500000 bytes" in err
    assert not (tmp_path / "out").exists()


def test_huge_gnu_long_name_is_refused_unread(capsys, tmp_path):
    """tarfile reads a GNU long name whole: 8 MiB of name is refused before that read."""
    path = tmp_path / "long.tar.gz"
    info = tarfile.TarInfo("././@LongLink")
    info.type, info.size = tarfile.GNUTYPE_LONGNAME, 8 << 20
    with gzip.open(path, "wb", compresslevel=1) as out:
        out.write(info.tobuf(format=tarfile.GNU_FORMAT))
        out.write(b"a" * (8 << 20))
        out.write(tarfile.TarInfo("x").tobuf(format=tarfile.GNU_FORMAT) + b"\0" * 1024)
    code, _, err = run(capsys, path, "-o", tmp_path / "out")
    assert code == 2 and "refusing tarball: a header or name of over" in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "suffix,mode,magic",
    [(".tar.xz", "w:xz", b"\xfd7zXZ\0"), (".tar.bz2", "w:bz2", b"BZh"), (".tar", "w", None)],
)
def test_in_place_tarball_keeps_its_compression(capsys, tree, tmp_path, suffix, mode, magic):
    path = tmp_path / f"netboot{suffix}"
    with tarfile.open(path, mode) as tar:
        tar.add(tree, arcname=".")
    os.chmod(path, 0o600)
    assert run(capsys, path, "--console", "ttyS1,115200n8")[0] == 0
    head = path.read_bytes()[:6]
    assert (
        head.startswith(magic) if magic else tarfile.is_tarfile(path) and head[:2] != b"\x1f\x8b"
    )
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert run(capsys, path, "--check", "--console", "ttyS1,115200n8")[0] == 0
    # --output picks the compression by name.
    out = tmp_path / f"out{suffix}"
    assert run(capsys, path, "--output", out)[0] == 0
    assert out.read_bytes()[:6].startswith(magic) if magic else True
    assert run(capsys, out, "--check")[0] == 0


@pytest.mark.parametrize("name", ["junk.tar", "junk.tar.gz", "empty.tar"])
def test_not_a_tar_archive_is_one_line(capsys, tmp_path, name):
    (tmp_path / name).write_bytes(b"" if name == "empty.tar" else b"this is no archive\n" * 40)
    code, _, err = run(capsys, tmp_path / name, "-o", tmp_path / "out")
    assert code == 2 and err.count("\n") == 1, err
    assert "not a tar archive" in err
    assert not (tmp_path / "out").exists()


# --- owners and hard links --------------------------------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="giving files to another user needs root")
def test_in_place_edit_keeps_owner_group_and_mode(capsys, tree, tmp_path):
    txt = tree / BS / "txt.cfg"
    os.chown(txt, 1234, 4321)
    os.chmod(txt, 0o640)
    tarball = make_tarball(tree, tmp_path / "n.tar.gz")
    os.chown(tarball, 1234, 4321)
    os.chmod(tarball, 0o604)
    assert run(capsys, tree)[0] == 0
    assert run(capsys, tarball)[0] == 0
    for path, mode in ((txt, 0o640), (tarball, 0o604)):
        st = path.stat()
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (1234, 4321, mode), path
    assert run(capsys, tree, "--check")[0] == 0


def test_in_place_edit_refuses_an_owner_it_cannot_keep(tree):
    if os.geteuid() == 0:
        os.chown(tree / BS / "txt.cfg", 1234, 4321)
        code, _, err = run_without_dac_override(tree)  # without CAP_CHOWN
    else:
        pytest.skip("needs a file of another user")
    assert code == 2 and "cannot keep the owner" in err, err
    assert (tree / BS / "txt.cfg").stat().st_uid == 1234
    assert b"console=" not in (tree / BS / "syslinux.cfg").read_bytes()


def test_hard_links_are_packed(capsys, tree, tmp_path):
    os.link(tree / BS / "f1.txt", tree / "help.txt")
    os.link(tree / BS / "txt.cfg", tree / "install.cfg")
    before = (tree / BS / "txt.cfg").read_bytes()
    dest = tmp_path / "out.tar.gz"
    assert run(capsys, tree, "--output", dest)[0] == 0
    with tarfile.open(dest) as tar:
        assert tar.getmember("./help.txt").islnk() or tar.getmember(f"./{BS}f1.txt").islnk()
        install, txt = tar.getmember("./install.cfg"), tar.getmember(f"./{BS}txt.cfg")
        assert install.isreg() and txt.isreg()
        assert tar.extractfile(install).read() == before  # as the in-place edit leaves it
        assert b"console=ttyS0" in tar.extractfile(txt).read()
    assert run(capsys, dest, "--output", tmp_path / "tree")[0] == 0
    assert (tmp_path / "tree/help.txt").read_bytes() == (tree / BS / "f1.txt").read_bytes()


# --- damaged downloads: read to the end, refused before anything is written -------------------

COMPRESSORS = {
    ".tar.gz": lambda data: gzip.compress(data, mtime=0),
    ".tar.xz": lambda data: __import__("lzma").compress(data),
    ".tar.bz2": lambda data: __import__("bz2").compress(data),
    ".tar": lambda data: data,
}
DECOMPRESSOR_COMMANDS = {".tar.gz": "gzip", ".tar.xz": "xz", ".tar.bz2": "bzip2", ".tar": "tar"}


def real_tarball(tmp_path: Path, suffix: str, name: str = "netboot") -> Path:
    """The text tree with a kernel and an initrd of incompressible bytes, packed by GNU tar
    as Debian's netboot.tar.gz is (so the damage lands in data as well as in headers).
    The compression is Python's, the same formats: trixie's minbase has no xz or bzip2."""
    tree = copy_fixture("text", tmp_path / f"{name}-tree")
    rng = __import__("random").Random(14)
    for member, size in (("linux", 300_000), ("initrd.gz", 600_000)):
        (tree / "debian-installer/amd64" / member).write_bytes(rng.randbytes(size))
    plain = subprocess.run(
        [
            "tar",
            "-C",
            tree,
            "--sort=name",
            "--mtime=@0",
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            "-cf",
            "-",
            ".",
        ],
        check=True,
        capture_output=True,
    ).stdout
    path = tmp_path / f"{name}{suffix}"
    path.write_bytes(COMPRESSORS[suffix](plain))
    shutil.rmtree(tree)
    return path


def gnu_tar_lists(path: Path) -> Optional[bool]:
    """Whether GNU tar lists the archive without an error; None where it cannot try for
    want of the decompressor (trixie's minbase has neither xz nor bzip2)."""
    suffix = next(s for s in DECOMPRESSOR_COMMANDS if path.name.endswith(s))
    if not shutil.which(DECOMPRESSOR_COMMANDS[suffix]):
        return None
    return subprocess.run(["tar", "-tf", path], capture_output=True).returncode == 0


def assert_refused_everywhere(capsys, tmp_path: Path, path: Path, expected: str) -> None:
    """Exit 2 and one line in place, with --output (tree and tarball) and with --check;
    the source keeps its bytes and nothing new appears."""
    before = path.read_bytes()
    listing_before = sorted(os.listdir(tmp_path))
    for argv in ([], ["-o", tmp_path / "out"], ["-o", tmp_path / "out.tar.gz"], ["--check"]):
        code, out, err = run(capsys, path, *argv)
        assert code == 2, (argv, out, err)
        assert err.count("\n") == 1 and expected in err, (argv, err)
        assert path.read_bytes() == before
        assert sorted(os.listdir(tmp_path)) == listing_before, argv


@pytest.mark.parametrize("suffix", [".tar.gz", ".tar.xz", ".tar.bz2"])
@pytest.mark.parametrize("where", [0.2, 0.5, 0.8, 0.999])
def test_bit_flip_in_compressed_tarball_is_refused(capsys, tmp_path, suffix, where):
    path = real_tarball(tmp_path, suffix)
    data = bytearray(path.read_bytes())
    data[int(len(data) * where)] ^= 0x10
    path.write_bytes(bytes(data))
    if where < 0.99:
        # Near the end the flip may land in what follows tar's end-of-archive marker,
        # which GNU tar never decompresses (it stops at the marker and exits 0): the
        # very damage it cannot see, and this tool must.
        assert gnu_tar_lists(path) is not True
    assert_refused_everywhere(capsys, tmp_path, path, "damaged tarball")


@pytest.mark.parametrize("suffix", [".tar.gz", ".tar.xz", ".tar.bz2", ".tar"])
def test_cut_member_is_refused(capsys, tmp_path, suffix):
    path = real_tarball(tmp_path, suffix)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    assert gnu_tar_lists(path) is not True
    assert_refused_everywhere(capsys, tmp_path, path, "truncated download?")


def corrupt_header(tmp_path: Path, member: str, suffix: str) -> Path:
    """A plain archive whose header of member is damaged (its checksum no longer fits),
    compressed afterwards so that only the tar layer is wrong."""
    plain = real_tarball(tmp_path, ".tar", "plain")
    data = bytearray(plain.read_bytes())
    with tarfile.open(plain) as tar:
        offset = tar.getmember(member).offset
    data[offset + 130] ^= 0x01  # in the uid field
    plain.unlink()
    path = tmp_path / f"netboot{suffix}"
    opener = {".tar": open, ".tar.gz": gzip.open}[suffix]
    with opener(path, "wb") as out:
        out.write(bytes(data))
    return path


@pytest.mark.parametrize("suffix", [".tar", ".tar.gz"])
@pytest.mark.parametrize(
    "member", ["./debian-installer/amd64/initrd.gz", "./debian-installer/amd64/linux"]
)
def test_corrupt_header_mid_archive_is_refused(capsys, tmp_path, suffix, member):
    path = corrupt_header(tmp_path, member, suffix)
    # tarfile alone stops quietly there; GNU tar reports "Skipping to next header".
    with tarfile.open(path) as tar:
        assert member not in tar.getnames()
    result = subprocess.run(["tar", "-tf", path], capture_output=True, text=True)
    assert result.returncode == 2 and "Skipping to next header" in result.stderr
    assert_refused_everywhere(capsys, tmp_path, path, "damaged or unreadable tar header")


@pytest.mark.parametrize("suffix", [".tar.gz", ".tar.xz", ".tar.bz2", ".tar"])
def test_trailing_garbage_is_refused(capsys, tmp_path, suffix):
    path = real_tarball(tmp_path, suffix)
    with open(path, "ab") as out:
        out.write(b"<html>502 Bad Gateway</html>\n")
    assert_refused_everywhere(capsys, tmp_path, path, "data after the end")


def test_data_after_the_end_marker_inside_the_compression_is_refused(capsys, tmp_path):
    plain = real_tarball(tmp_path, ".tar", "plain").read_bytes()
    path = tmp_path / "netboot.tar.gz"
    with gzip.open(path, "wb") as out:
        out.write(plain + b"more data after the end of the archive".ljust(512, b"\0"))
    assert_refused_everywhere(capsys, tmp_path, path, "data after the end-of-archive marker")


def test_archive_without_end_marker_is_refused(capsys, tmp_path):
    plain = real_tarball(tmp_path, ".tar", "plain").read_bytes()
    path = tmp_path / "netboot.tar.gz"
    with gzip.open(path, "wb") as out:
        # Cut after the last member's last block: it is whole, only the end marker is gone.
        out.write(plain[: -(-len(plain.rstrip(b"\0")) // 512) * 512])
    assert_refused_everywhere(capsys, tmp_path, path, "no end-of-archive marker")


@pytest.mark.parametrize("suffix", [".tar.gz", ".tar.xz", ".tar.bz2", ".tar"])
def test_undamaged_real_tarball_is_serialized_whole(capsys, tmp_path, suffix):
    path = real_tarball(tmp_path, suffix)
    with tarfile.open(path) as tar:
        before = {m.name: m.size for m in tar if m.isreg()}
    assert run(capsys, path)[0] == 0
    assert gnu_tar_lists(path) is not False
    with tarfile.open(path) as tar:
        after = {m.name: m.size for m in tar if m.isreg()}
    assert after.keys() == before.keys()
    assert run(capsys, path, "--check")[0] == 0


def test_concatenated_gzip_members_and_xz_padding_are_read(capsys, tmp_path):
    plain = real_tarball(tmp_path, ".tar", "plain").read_bytes()
    half = len(plain) // 2
    two = tmp_path / "two.tar.gz"
    two.write_bytes(gzip.compress(plain[:half]) + gzip.compress(plain[half:]))
    padded = tmp_path / "padded.tar.xz"
    padded.write_bytes(__import__("lzma").compress(plain) + b"\0" * 8)
    for path in (two, padded):
        code, _, err = run(capsys, path, "-o", tmp_path / f"{path.name}.out.tar")
        assert code == 0, err


def test_sparse_member_keeps_its_data(capsys, tmp_path):
    tree = copy_fixture("text", tmp_path / "tree")
    sparse = tree / "debian-installer/amd64/sparse.img"
    with open(sparse, "wb") as out:
        out.seek(1 << 20)
        out.write(b"data after a hole")
        out.seek(3 << 20)
        out.write(b"and at the end")
    path = tmp_path / "netboot.tar.gz"
    subprocess.run(["tar", "-C", tree, "--sparse", "-czf", path, "."], check=True)
    with tarfile.open(path) as tar:
        assert tar.getmember("./debian-installer/amd64/sparse.img").issparse()
    for out in (tmp_path / "out.tar.gz", tmp_path / "out"):
        assert run(capsys, path, "-o", out)[0] == 0
    with tarfile.open(tmp_path / "out.tar.gz") as tar:
        data = tar.extractfile("./debian-installer/amd64/sparse.img").read()
    assert data == sparse.read_bytes()
    assert (tmp_path / "out/debian-installer/amd64/sparse.img").read_bytes() == data
    unpacked = tmp_path / "gnu"
    unpacked.mkdir()
    subprocess.run(["tar", "-C", unpacked, "-xzf", tmp_path / "out.tar.gz"], check=True)
    assert (unpacked / "debian-installer/amd64/sparse.img").read_bytes() == data


# --- architectures and consoles ---------------------------------------------------------------

ARM64_GRUB = "debian-installer/arm64/grub/grub.cfg"


def test_arm64_grub_only_tree_defaults_to_ttyama0(capsys, tmp_path):
    tree = tmp_path / "arm64"
    shutil.copytree(DATA / "arm64", tree)
    code, out, err = run(capsys, tree)
    assert code == 0, err
    cfg = (tree / ARM64_GRUB).read_text()
    linux = [ln for ln in cfg.splitlines() if ln.strip().startswith("linux")]
    assert linux and all(ln.endswith(" console=ttyAMA0,115200n8") for ln in linux)
    assert "terminal_output console" in cfg and "serial --unit" not in cfg
    assert run(capsys, tree, "--check")[0] == 0
    assert run(capsys, tree, "--check", "--console", "ttyS0,115200")[0] == 1


def test_arm64_tarball_with_an_8250_console(capsys, tmp_path):
    tree = tmp_path / "arm64"
    shutil.copytree(DATA / "arm64", tree)
    path = make_tarball(tree, tmp_path / "netboot.tar.gz")
    assert run(capsys, path, "--console", "ttyS2,9600")[0] == 0
    with tarfile.open(path) as tar:
        cfg = tar.extractfile("./" + ARM64_GRUB).read().decode()
    # GRUB on arm64 has no com2 (its 8250 driver is x86 only): the menu goes to the
    # firmware console, the kernel to the 8250 asked for.
    assert "serial --unit" not in cfg and "console=ttyS2,9600n8" in cfg
    assert "terminal_output console\n" in cfg


def test_syslinux_tree_refuses_a_console_syslinux_cannot_drive(capsys, tree):
    before = snapshot(tree)
    code, _, err = run(capsys, tree, "--console", "ttyAMA0,115200")
    assert code == 2 and "syslinux" in err and err.count("\n") == 1
    assert snapshot(tree) == before


def test_grub_serial_unit_for_high_ports(capsys, tmp_path):
    """An x86 tree with GRUB alone (no syslinux, which drives ttyS0..3 only)."""
    tree = tmp_path / "amd64"
    shutil.copytree(DATA / "arm64/debian-installer/arm64", tree / "debian-installer/amd64")
    assert run(capsys, tree, "--console", "ttyS17,115200")[0] == 0
    assert "serial --unit=17 " in (tree / GRUB).read_text()


@pytest.mark.parametrize("arch", ["arm64", "riscv64"])
def test_grub_off_x86_never_names_a_com_port(capsys, tmp_path, arch):
    tree = tmp_path / arch
    shutil.copytree(DATA / "arm64/debian-installer/arm64", tree / f"debian-installer/{arch}")
    assert run(capsys, tree, "--console", "ttyS0,115200")[0] == 0
    cfg = (tree / f"debian-installer/{arch}/grub/grub.cfg").read_text()
    assert "serial " not in cfg and "terminal_output serial" not in cfg
    assert "terminal_input console\nterminal_output console\n" in cfg


def test_several_architectures_are_refused_by_name(capsys, tmp_path, tree):
    shutil.copytree(DATA / "arm64/debian-installer/arm64", tree / "debian-installer/arm64")
    before = snapshot(tree)
    code, _, err = run(capsys, tree)
    assert code == 2 and "(amd64, arm64)" in err
    assert snapshot(tree) == before


def test_symlinked_grub_directory_is_refused(capsys, tmp_path, tree):
    grub = tree / "debian-installer/amd64/grub"
    grub.rename(tmp_path / "real-grub")
    grub.symlink_to(tmp_path / "real-grub")
    code, _, err = run(capsys, tree, "--check")
    assert code == 2 and "symlinked directory" in err


def test_tree_without_grub_cfg_warns(capsys, caplog, tree):
    (tree / GRUB).unlink()
    code, _, err = run(capsys, tree)
    assert code == 0
    assert "UEFI clients stay on their VGA console" in caplog.text


def test_quiet_prints_nothing(capsys, tree):
    assert run(capsys, tree, "-q", "--check") == (1, "", "")
    code, out, err = run(capsys, tree, "-q")
    assert (code, out, err) == (0, "", "")
    code, out, err = run(capsys, tree, "--quiet", "--check")
    assert (code, out, err) == (0, "", "")
    assert "console=" in run(capsys, tree, "-q", "--dry-run", "--console", "ttyS1,9600")[1]


def test_sha256sums(capsys, tmp_path):
    path = real_tarball(tmp_path, ".tar.gz")
    digest = __import__("hashlib").sha256(path.read_bytes()).hexdigest()
    other = "0" * 64
    sums = tmp_path / "SHA256SUMS"
    sums.write_text(
        f"{other}  ./netboot/gtk/netboot.tar.gz\n{digest}  ./netboot/netboot.tar.gz\n"
        f"{other}  ./netboot/debian-installer/amd64/linux\n"
    )
    assert run(capsys, path, "--sha256sums", sums, "--check")[0] == 1
    # A download that does not match is refused before it is read or touched.
    data = bytearray(path.read_bytes())
    data[1000] ^= 1
    path.write_bytes(bytes(data))
    code, _, err = run(capsys, path, "--sha256sums", sums)
    assert code == 2 and "does not match its SHA256SUMS entry" in err and err.count("\n") == 1
    assert path.read_bytes() == bytes(data)
    sums.write_text(f"{digest}  ./netboot/other.tar.gz\n")
    code, _, err = run(capsys, path, "--sha256sums", sums)
    assert code == 2 and "lists no file named netboot.tar.gz" in err
    code, _, err = run(capsys, path, "--sha256sums", tmp_path / "missing")
    assert code == 2 and "cannot read --sha256sums" in err


def test_sha256sums_needs_a_tarball(capsys, tree, tmp_path):
    (tmp_path / "SHA256SUMS").write_text("")
    code, _, err = run(capsys, tree, "--sha256sums", tmp_path / "SHA256SUMS")
    assert code == 2 and "not a directory tree" in err


def test_json_findings_under_check(capsys, tree):
    (tree / GRUB).unlink()
    code, out, _ = run(capsys, tree, "--check", "--json")
    doc = json.loads(out)
    assert code == 1
    codes = {(f["code"], f["severity"]) for f in doc["findings"]}
    assert ("not-serialized", "action") in codes and ("no-grub-cfg", "warning") in codes
    assert run(capsys, tree, "-q")[0] == 0
    code, out, _ = run(capsys, tree, "--check", "--json")
    assert code == 0
    assert [f["code"] for f in json.loads(out)["findings"]] == ["no-grub-cfg"]


def test_padding_bomb_after_the_end_marker_is_refused(capsys, tmp_path, monkeypatch):
    plain = real_tarball(tmp_path, ".tar", "plain").read_bytes()
    path = tmp_path / "netboot.tar.gz"
    monkeypatch.setattr(nst, "MAX_READ", 1 << 20)
    with gzip.open(path, "wb") as out:
        out.write(plain + b"\0" * (2 << 20))
    assert_refused_everywhere(capsys, tmp_path, path, "of padding after the end-of-archive")
