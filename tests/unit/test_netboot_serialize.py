"""netboot-serialize on copies of the real text and gtk netboot trees of Debian 12."""

import io
import json
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from debadmin.tools import netboot_serialize as ns
from debadmin.tools import netboot_serialize_tar as nst

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
    """A copy of a real tree's configuration files with the symlinks as Debian ships them."""
    shutil.copytree(DATA / flavour, dest, symlinks=True)
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
        ("ttyS0,115200n8", (0, 115200)),
        ("ttyS1,115200", (1, 115200)),
        ("ttyS3,9600n8", (3, 9600)),
    ],
)
def test_parse_console(spec, expected):
    assert ns.parse_console(spec) == expected


@pytest.mark.parametrize(
    "spec",
    [
        "ttyS9,fast",
        "ttyS1",
        "ttyS4,115200",
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


@pytest.mark.parametrize("seconds", ["0", "3600", "-5"])
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
    assert title in ns.grub_entries(grub)


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
    "first,second",
    [
        (["--console", "ttyS0,115200n8"], ["--console", "ttyS1,115200n8"]),
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
        ),
        (["--also-vga", "--extra-args", "x=1"], ["--console", "ttyS3,38400", "--extra-args", "y"]),
        (["--console", "ttyS2,115200"], []),
    ],
)
def test_another_console_replaces_the_first(capsys, tmp_path, first, second):
    for flavour in ("text", "gtk"):
        a, b = tmp_path / f"a-{flavour}", tmp_path / f"b-{flavour}"
        copy_fixture(flavour, a)
        copy_fixture(flavour, b)
        assert run(capsys, a, *first)[0] == 0
        assert run(capsys, a, *second)[0] == 0
        assert run(capsys, b, *second)[0] == 0
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
            for old, new in zip(
                pristine[name][1].decode().splitlines(), entry[1].decode().splitlines()
            ):
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
        tar.extractall(unpacked)
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
    if kind == "through-symlink" and where == "start":
        pytest.skip("needs the real tree's directory first")
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

    def half(path, members, out, replace, compress):
        out.write(b"half a tarball")
        raise KeyboardInterrupt

    monkeypatch.setattr(nst, "rewrite", half)
    code, _, _ = run(capsys, source, "-o", dest, "--console", "ttyS1,115200n8")
    assert code == 130
    assert dest.read_bytes() == old
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_in_place_write_failure_is_one_line(capsys, tree):
    directory = tree / BS
    os.chmod(directory, 0o555)
    try:
        if os.access(directory, os.W_OK):
            pytest.skip("running as root: a read-only directory is still writable")
        code, _, err = run(capsys, tree)
        assert code == 2 and err.startswith("netboot-serialize: error: cannot write")
    finally:
        os.chmod(directory, 0o755)


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
