"""Unit tests for journal-acl-setup: parsers, the ACL rule, config, and apply on a tree."""

import errno
import gc
import grp
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from debadmin.errors import Error, NotApplicable
from debadmin.journal_acl_setup import main as jas
from debadmin.journal_acl_setup import dropin as jdropin
from debadmin.journal_acl_setup import groups as jgroups
from debadmin.journal_acl_setup import journald as jconf
from debadmin.journal_acl_setup import journaldir as jdir
from debadmin.journal_acl_setup import plan as jplan
from debadmin.journal_acl_setup import scan as jscan
from debadmin.journal_acl_setup import walk as jwalk

W = jwalk
G, M, GO, O, U = W.GROUP, W.MASK, W.GROUP_OBJ, W.OTHER, W.UNDEFINED


def getfacl(path):
    """An independent reading of a file's ACL: getfacl's text, as {"group:4": "r--"}."""
    text = subprocess.run(
        ["getfacl", "--absolute-names", "--numeric", "--omit-header", "--", str(path)],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ, LC_ALL="C.UTF-8"),
    ).stdout
    entries = {}
    for line in text.splitlines():
        spec = line.split("\t", 1)[0].split("#", 1)[0].strip()
        if spec:
            kind, _, rest = spec.rpartition(":")
            entries[kind.rstrip(":")] = rest
    return entries


def test_entries_roundtrip_through_pylibacl():
    items = {(W.USER_OBJ, U): 6, (G, 50): 4, (G, 4): 5, (GO, U): 4, (M, U): 4, (O, U): 0}
    acl = W.to_acl(items)
    assert acl.valid()
    assert W.entries(acl) == items
    assert W.text(acl) == b"u::rw-,g::r--,g:4:r-x,g:50:r--,m::r--,o::---"  # numeric ids
    assert W.text(None) == b"" and W.entries(W.posix1e.ACL()) is None


def test_default_acl_by_magic_link_stays_on_the_open_directory(tmp_path):
    """A directory renamed away and replaced by a symlink after it was opened: the default
    ACL set and read through /proc/self/fd/N is the opened directory's, never the link
    target's (the swap race, deterministic)."""
    walked, moved, secret = tmp_path / "sub", tmp_path / "moved", tmp_path / "secret"
    walked.mkdir()
    secret.mkdir()
    fd = os.open(walked, W.O_DIR)
    try:
        walked.rename(moved)
        walked.symlink_to(secret)
        node = W.Node(str(walked), fd, os.fstat(fd), True)
        access, _ = node.acls()
        node.set_acls(None, W.granted(W.default_base(access), 5050, W.R | W.X))
        assert node.acls()[1][(G, 5050)] == W.R | W.X
    finally:
        os.close(fd)
    assert W.entries(W.posix1e.ACL(filedef=str(secret))) is None
    assert W.entries(W.posix1e.ACL(file=str(secret))) == W.from_mode(secret.stat().st_mode)
    assert W.entries(W.posix1e.ACL(filedef=str(moved)))[(G, 5050)] == W.R | W.X
    # What the magic link prevents: the same call by the walked name lands on the secret.
    W.to_acl({**W.from_mode(0o755), (G, 4): 5, (M, U): 5}).applyto(
        str(walked), W.posix1e.ACL_TYPE_DEFAULT
    )
    assert W.entries(W.posix1e.ACL(filedef=str(secret)))[(G, 4)] == W.R | W.X


@pytest.mark.parametrize(
    "entries,gid,expected",
    [
        ({(W.USER_OBJ, U): 6, (GO, U): 4, (O, U): 0}, 101, True),  # owning group
        ({(W.USER_OBJ, U): 6, (GO, U): 4, (O, U): 0}, 4, False),
        ({(W.USER_OBJ, U): 6, (GO, U): 0, (G, 4): 4, (M, U): 4, (O, U): 0}, 4, True),
        ({(W.USER_OBJ, U): 6, (GO, U): 4, (G, 4): 4, (M, U): 0, (O, U): 0}, 4, False),  # masked
        ({(W.USER_OBJ, U): 6, (GO, U): 0, (O, U): 4}, 4, True),  # falls to other
        ({(W.USER_OBJ, U): 6, (GO, U): 0, (O, U): 4}, 101, False),  # matched, never other
    ],
)
def test_group_can(entries, gid, expected):
    assert W.group_can(entries, 101, gid, W.R) is expected


def test_group_can_defaults_never_falls_to_other():
    """A default ACL without an entry for the group: journald's 0640 files give other ---."""
    defaults = {(W.USER_OBJ, U): 7, (GO, U): 5, (M, U): 5, (O, U): 5}
    assert not W.group_can(defaults, 101, 4, 5, default=True)
    assert W.group_can(defaults, 101, 101, 5, default=True)  # the owning group's entry
    defaults[(M, U)] = 0
    assert not W.group_can(defaults, 101, 101, 5, default=True)
    assert not W.group_can(None, 101, 101, 5, default=True)


def test_granted_keeps_the_mask():
    """setfacl -n: a 0640 file keeps its r-- mask; only missing bits are added."""
    inherited = {(W.USER_OBJ, U): 6, (GO, U): 5, (G, 4): 5, (M, U): 4, (O, U): 0}
    result = W.granted(inherited, 50, W.R)
    assert result[(M, U)] == 4 and result[(G, 50)] == 4
    plain = W.from_mode(0o600)
    result = W.granted(plain, 50, W.R)
    assert result[(M, U)] == 4  # a new mask covers the group class and the new entry
    assert W.without(result, {50}) == {**plain, (M, U): 4}
    assert W.without(plain, {50}) is None


def make_root(tmp_path):
    root = tmp_path / "root"
    (root / "etc/systemd").mkdir(parents=True)
    (root / "lib/systemd").mkdir(parents=True)
    (root / "lib/systemd/systemd-journald").write_text("")
    (root / "var/log").mkdir(parents=True)
    gid = os.getgid()
    (root / "etc/group").write_text(
        f"root:x:0:\nadm:x:4:\nsystemd-journal:x:{gid}:\nstaff:x:50:\n"
    )
    return root


def test_journald_storage_order(tmp_path):
    root = make_root(tmp_path)
    assert jconf.journald_storage(root) == ("auto", None)
    (root / "etc/systemd/journald.conf").write_text("[Journal]\n#Storage=none\nStorage=volatile\n")
    assert jconf.journald_storage(root)[0] == "volatile"
    usr = root / "usr/lib/systemd/journald.conf.d"
    usr.mkdir(parents=True)
    (usr / "10-a.conf").write_text("[Journal]\nStorage=persistent\n")
    (usr / "20-b.conf").write_text("[Journal]\nStorage=none\n")
    assert jconf.journald_storage(root) == ("none", str(usr / "20-b.conf"))
    etc = root / "etc/systemd/journald.conf.d"
    etc.mkdir()
    (etc / "20-b.conf").write_text("[Journal]\nStorage=auto\n")  # masks the /usr one
    assert jconf.journald_storage(root) == ("auto", str(etc / "20-b.conf"))
    (etc / "20-b.conf").write_text("# nothing\n")
    assert jconf.journald_storage(root) == ("persistent", str(usr / "10-a.conf"))
    (etc / "30-c.conf").write_text("[Other]\nStorage=none\n")  # wrong section
    assert jconf.journald_storage(root)[0] == "persistent"


def test_configured_groups(tmp_path):
    root = make_root(tmp_path)
    assert jgroups.configured_groups(root) == ["adm"]
    (root / "etc/default").mkdir()
    (root / "etc/default/journal-acl-setup").write_text(
        '# comment\nJOURNAL_ACL_GROUPS="adm staff"  # trailing\n'
    )
    assert jgroups.configured_groups(root) == ["adm", "staff"]
    (root / "etc/default/journal-acl-setup").write_text('JOURNAL_ACL_GROUPS="adm\n')
    with pytest.raises(Error, match="cannot parse"):
        jgroups.configured_groups(root)


@pytest.mark.parametrize("name", ["", "a;b", "$(id)", "-rf", "x" * 33, "Adm", "a b"])
def test_bad_group_names(tmp_path, name):
    with pytest.raises(Error):
        jgroups.resolve_groups([name], make_root(tmp_path))


def test_unknown_group(tmp_path):
    with pytest.raises(Error, match="unknown group: nosuch"):
        jgroups.resolve_groups(["nosuch"], make_root(tmp_path))


def test_not_applicable_without_journald(tmp_path):
    root = make_root(tmp_path)
    (root / "lib/systemd/systemd-journald").unlink()
    with pytest.raises(NotApplicable):
        jscan.inspect(root, {"adm": 4})


def test_render_tmpfiles():
    text = jdropin.render_tmpfiles(["adm", "staff"])
    assert "group:adm" not in text
    assert "a+ /var/log/journal - - - - d:group:staff:r-x,group:staff:r-x\n" in text
    assert "a+ /var/log/journal/%m/system.journal - - - - group:staff:r--\n" in text


needs_acl_tools = pytest.mark.skipif(
    not (shutil.which("getfacl") and shutil.which("setfacl")), reason="acl not installed"
)


def codes_of(report):
    return {(f["code"], f.get("group"), f["subject"]) for f in report["findings"]}


@needs_acl_tools
@pytest.mark.needs_root
def test_check_lists_findings_and_ignores_symlinks(tmp_path, capsys):
    root = make_root(tmp_path)
    journal = root / "var/log/journal"
    (journal / "m").mkdir(parents=True)
    (journal / "m/system@1.journal").write_text("x")
    os.chmod(journal / "m/system@1.journal", 0o600)
    secret = tmp_path / "secret"
    secret.write_text("s")
    os.chmod(secret, 0o600)
    (journal / "m/link.journal").symlink_to(secret)
    rc = jas.main(["check", "--root", str(root), "--json", "-g", "adm", "-g", "staff"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 1 and not report["ok"]
    found = codes_of(report)
    link = str(journal / "m/link.journal")
    assert ("ignored-symlink", None, link) in found
    assert ("unreadable", "staff", str(journal / "m/system@1.journal")) in found
    assert ("no-default-acl", "adm", str(journal / "m")) in found
    assert ("boot-grant-missing", "staff", str(root / jdir.TMPFILES_DROPIN)) in found
    assert [f["severity"] for f in report["findings"] if f["subject"] == link] == ["warning"]
    for item in report["findings"]:
        assert list(item)[:4] == ["code", "severity", "subject", "message"]


def test_walk_reports_a_name_swapped_for_a_symlink(tmp_path, monkeypatch):
    """A name read as a directory and a symlink by the time it is opened is not followed."""
    top = tmp_path / "top"
    top.mkdir()
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret/s.journal").write_text("s")
    (top / "sub").symlink_to(tmp_path / "secret")
    monkeypatch.setattr(W, "_kind", lambda entry: "dir")  # as if read before the swap
    fd = os.open(top, W.O_DIR)
    skips = []
    try:
        paths = [n.path for n in W.walk(fd, str(top), {os.geteuid()}, skips)]
    finally:
        os.close(fd)
    assert paths == [str(top)]
    assert [(s.code, s.action) for s in skips] == [("changed-while-reading", True)]


def test_walk_skips_hard_links_and_foreign_owners(tmp_path):
    top = tmp_path / "top"
    top.mkdir()
    (top / "one.journal").write_text("1")
    (top / "two.journal").write_text("2")
    os.link(top / "two.journal", tmp_path / "elsewhere")
    fd = os.open(top, W.O_DIR)
    skips = []
    try:
        paths = [n.path for n in W.walk(fd, str(top), {os.geteuid()}, skips)]
        assert paths == [str(top), str(top / "one.journal")]
        assert [s.code for s in skips] == ["skipped-hardlink"]
        skips.clear()
        assert [n.path for n in W.walk(fd, str(top), {os.geteuid() + 1}, skips)] == [str(top)]
        assert [s.code for s in skips] == ["skipped-owner", "skipped-owner"]
    finally:
        os.close(fd)


def walked(top, uids, open_files):
    """What walk yields (path, fd open, read ACL attribute) and skips, by path."""
    fd = os.open(top, W.O_DIR)
    skips, seen = [], []
    try:
        for node in W.walk(fd, str(top), uids, skips, open_files=open_files):
            if node.fd >= 0:  # not a batch of files read by name
                seen.append((node.path, node.st.st_ino, node.raw()[0]))
            seen += [
                (f"{node.path}/{n}", os.stat(f"{node.path}/{n}").st_ino, acl)
                for n, _, _, acl in node.files
            ]
    finally:
        os.close(fd)
    return sorted(seen), sorted((s.path, s.code, s.action) for s in skips)


@needs_acl_tools
def test_walk_by_name_reads_what_the_open_walk_reads(tmp_path):
    """check's walk (files read by name in their open directory, never opened) yields
    the same files, ACL attributes and skips as the walk that opens every file, and puts
    the working directory back."""
    top = tmp_path / "top"
    (top / "m").mkdir(parents=True)
    (top / "m/acl.journal").write_text("a")
    (top / "m/plain.journal").write_text("p")
    (top / "m/linked.journal").write_text("l")
    os.link(top / "m/linked.journal", tmp_path / "elsewhere")
    (top / "m/link.journal").symlink_to(tmp_path / "elsewhere")
    os.mkfifo(top / "m/fifo")
    subprocess.run(["setfacl", "-m", "g:4:r", str(top / "m/acl.journal")], check=True)
    subprocess.run(["setfacl", "-m", "d:g:4:rx", str(top / "m")], check=True)
    cwd = os.getcwd()
    for uids in ({os.geteuid()}, {os.geteuid() + 1}):
        by_name = walked(top, uids, open_files=False)
        assert by_name == walked(top, uids, open_files=True)
        assert os.getcwd() == cwd
    fd = os.open(top, W.O_DIR)
    try:  # files come in batches of their directory (fd -1), never on their own
        nodes = list(W.walk(fd, str(top), {os.geteuid()}, [], open_files=False))
        assert [n.is_dir for n in nodes] == [True, True, False] and len(nodes[2].files) == 2
        assert nodes[2].fd == -1 and nodes[2].path == str(top / "m")
    finally:
        os.close(fd)
    paths, skips = walked(top, {os.geteuid()}, open_files=False)
    assert [p for p, _, _ in paths] == [
        str(top / n) for n in ("", "m", "m/acl.journal", "m/plain.journal")
    ]
    assert W.parse(paths[2][2])[(G, 4)] == W.R and paths[3][2] == b""
    assert [(p[len(str(top)) :], code) for p, code, _ in skips] == [
        ("/m/fifo", "skipped-type"),
        ("/m/link.journal", "ignored-symlink"),
        ("/m/linked.journal", "skipped-hardlink"),
    ]


def test_walk_by_name_opens_files_where_it_cannot_change_directory(tmp_path, monkeypatch):
    top = tmp_path / "top"
    top.mkdir()
    (top / "system.journal").write_text("s")
    expected = walked(top, {os.geteuid()}, open_files=True)

    def refuse(fd):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "chdir", refuse)
    assert walked(top, {os.geteuid()}, open_files=False) == expected


@needs_acl_tools
def test_walk_by_name_reads_through_the_magic_link_without_a_way_back(tmp_path, monkeypatch):
    """Started in a directory it cannot search (no O_PATH of "."), check still reads
    files by name, through /proc/self/fd/N/NAME: its verdict does not depend on where
    it was started (a user cannot open a 0640 journal file, but can read its ACL)."""
    top = tmp_path / "top"
    top.mkdir()
    (top / "system.journal").write_text("s")
    subprocess.run(["setfacl", "-m", "g:4:r", str(top / "system.journal")], check=True)
    expected = walked(top, {os.geteuid()}, open_files=False)
    real_open = os.open

    def no_dot(path, flags, *args, **kwargs):
        if path == ".":
            raise PermissionError(13, "Permission denied")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", no_dot)
    monkeypatch.setattr(os, "chdir", lambda fd: pytest.fail("chdir without a way back"))
    assert walked(top, {os.geteuid()}, open_files=False) == expected
    fd = real_open(top, W.O_DIR)
    try:
        (_, batch) = W.walk(fd, str(top), {os.geteuid()}, [], open_files=False)
        assert [name for name, *_ in batch.files] == ["system.journal"]
    finally:
        os.close(fd)


def test_walk_by_name_reports_a_file_swapped_for_a_symlink(tmp_path, monkeypatch):
    """A name read as a regular file and a symlink by the time it is read is not
    followed: its target's ACL is never read, and check needs action."""
    top = tmp_path / "top"
    top.mkdir()
    (tmp_path / "secret.journal").write_text("s")
    (top / "system.journal").symlink_to(tmp_path / "secret.journal")
    monkeypatch.setattr(W, "_kind", lambda entry: "file")  # as if read before the swap
    assert walked(top, {os.geteuid()}, open_files=False) == (
        [(str(top), top.stat().st_ino, b"")],
        [(str(top / "system.journal"), "changed-while-reading", True)],
    )


@needs_acl_tools
def test_parse_reads_the_kernel_attribute_as_libacl_does(tmp_path):
    path = tmp_path / "d"
    path.mkdir()
    subprocess.run(
        ["setfacl", "-m", "u:1234:rwx,g:4:r-x,g:50:r,m::rx,o::-,d:g:4:rx", str(path)], check=True
    )
    for attribute, kind in ((W.ACCESS_XATTR, "file"), (W.DEFAULT_XATTR, "filedef")):
        data = os.getxattr(path, attribute)
        assert W.parse(data) == W.entries(W.posix1e.ACL(**{kind: str(path)}))
    assert W.parse(b"") is None
    for damaged in (data[:-1], b"\x01\x00\x00\x00" + data[4:], data[:4] + b"\x40" + data[5:]):
        with pytest.raises(W.AclError):
            W.parse(damaged)


START_UP_PROBE = """
import gc, sys
from debadmin.journal_acl_setup.main import main
sys.argv[0] = "journal-acl-setup"
rc = main()  # as bin/journal-acl-setup calls it
shunned = ("logging", "typing", "shutil")
print("imported:", *(m for m in shunned if m in sys.modules), file=sys.stderr)
print("collecting:", gc.isenabled(), file=sys.stderr)
print("frozen:", gc.get_freeze_count() > 0, file=sys.stderr)
sys.exit(rc)
"""


def test_start_up_imports_neither_logging_nor_typing(tmp_path):
    """check and a quiet apply never import logging, typing or shutil (argparse's help
    formatter would; start-up time, the bench's
    2x getfacl target); a message that is shown (-v) still comes through logging, set up
    as the command line said.  Run as the command, main() freezes what is left for the
    interpreter's exit."""
    root = make_root(tmp_path)
    lib = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(jas.__file__))))

    def probe(*argv):
        return subprocess.run(
            [sys.executable, "-c", START_UP_PROBE, *argv, "--root", str(root), "-g", "adm"],
            capture_output=True,
            text=True,
            env=dict(os.environ, PYTHONPATH=lib, LC_ALL="C.UTF-8"),
        )

    check = probe("check")
    assert (check.returncode, check.stderr) == (
        1,
        "imported:\ncollecting: True\nfrozen: True\n",
    ), check.stderr
    quiet = probe("apply", "--dry-run")
    assert (quiet.returncode, quiet.stderr) == (
        0,
        "imported:\ncollecting: True\nfrozen: True\n",
    ), quiet.stderr
    verbose = probe("apply", "--dry-run", "-v")
    assert verbose.returncode == 0 and verbose.stderr == (
        "journal-acl-setup: systemd is not running here: journald not asked to flush\n"
        "imported: logging\ncollecting: True\nfrozen: True\n"
    )
    # Called with arguments (tests, the completion generator), nothing is frozen.
    assert jas.main(["check", "--root", str(root), "-g", "adm"]) == 1
    assert gc.get_freeze_count() == 0


@needs_acl_tools
def test_apply_dry_run_changes_nothing(tmp_path, capsys):
    root = make_root(tmp_path)
    rc = jas.main(["apply", "--root", str(root), "--dry-run", "-g", "staff"])
    out = capsys.readouterr().out
    assert rc == 0 and "would create" in out
    assert not (root / "var/log/journal").exists()
    assert not (root / jdir.TMPFILES_DROPIN).exists()


needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("systemd-tmpfiles"),
    reason="a real apply makes root the owner of the journal (needs root and systemd-tmpfiles)",
)
MACHINE_ID = "0123456789abcdef0123456789abcdef"
# Gids that differ from any host's, so that a name resolved on the host shows up.
IMAGE_GROUPS = "root:x:0:\nadm:x:4:\nsystemd-journal:x:1999:\nstaff:x:5050:\nusers:x:5100:\n"
STOCK_TMPFILES = """\
z /var/log/journal 2755 root systemd-journal - -
a+ /var/log/journal - - - - d:group::r-x,d:group:4:r-x,group::r-x,group:4:r-x
z /var/log/journal/%m 2755 root systemd-journal - -
a+ /var/log/journal/%m - - - - d:group:4:r-x,group:4:r-x
a+ /var/log/journal/%m/system.journal - - - - group:4:r--
"""


def make_image(tmp_path):
    """A system image as apply --root meets it: systemd's tmpfiles.d, a machine id."""
    root = make_root(tmp_path)
    (root / "etc/group").write_text(IMAGE_GROUPS)
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (root / "etc/machine-id").write_text(MACHINE_ID + "\n")
    (root / "usr/lib/tmpfiles.d").mkdir(parents=True)
    (root / "usr/lib/tmpfiles.d/systemd.conf").write_text(STOCK_TMPFILES)
    return root


def can(path, gid, want=W.R, default=False):
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        node = W.Node(str(path), fd, st, os.path.isdir(path))
        access, defaults = node.acls()
    finally:
        os.close(fd)
    return W.group_can(defaults if default else access, st.st_gid, gid, want, default)


def run_tool(capsys, *argv):
    rc = jas.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@needs_acl_tools
@needs_root
def test_apply_fresh_image_with_extra_group(tmp_path, capsys):
    """No journal yet, a second group: the first apply does it all, with the image's gids."""
    root = make_image(tmp_path)
    rc, out, err = run_tool(capsys, "apply", "--root", str(root), "-g", "adm", "-g", "staff")
    assert (rc, err) == (0, ""), out
    journal = root / "var/log/journal"
    assert can(journal, 5050, W.R | W.X, default=True)
    assert "group:50" not in getfacl(journal)  # the host's staff
    assert getfacl(journal)["default:group:5050"] == "r-x"
    assert os.stat(journal).st_mode & 0o7777 == 0o2755
    assert jdropin.read_tmpfiles_dropin(root) == {"staff": True}
    assert jgroups.configured_groups(root) == ["adm", "staff"]  # apply -g says so
    assert run_tool(capsys, "check", "--root", str(root), "-g", "adm", "-g", "staff")[0] == 0


@needs_acl_tools
@needs_root
def test_apply_tree_trap_idempotent_revert(tmp_path, capsys):
    """apply on a hand-made tree: 0640 files gain ACLs, a symlink's target never does."""
    root = make_image(tmp_path)
    journal = root / "var/log/journal"
    machine = journal / MACHINE_ID
    machine.mkdir(parents=True)
    for name in ("system.journal", "system@0001.journal", "user-1000.journal"):
        (machine / name).write_text("log")
        os.chmod(machine / name, 0o640)
    outside = tmp_path / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "secret").write_text("s")
    os.chmod(outside / "secret", 0o600)
    (machine / "trap.journal").symlink_to(outside / "secret")
    (journal / "dirtrap").symlink_to(outside / "dir")
    args = ["--root", str(root), "-g", "adm", "-g", "staff"]

    rc, out, _ = run_tool(capsys, "apply", *args)
    assert rc == 0, out
    for name in ("system@0001.journal", "user-1000.journal"):
        acl = getfacl(machine / name)
        assert acl["group:5050"] == "r--" and acl["group:4"] == "r--"
        assert acl["mask"] == "r--"  # kept: setfacl -n, not a recalculated r-x
        assert os.stat(machine / name).st_mode & 0o777 == 0o640
    for target in (outside / "secret", outside / "dir"):
        assert set(getfacl(target)) == {"user", "group", "other"}

    acls_before = subprocess.run(
        ["getfacl", "-RPn", "--absolute-names", str(journal)], capture_output=True, check=True
    ).stdout
    rc, out, _ = run_tool(capsys, "apply", *args)
    assert rc == 0 and out.startswith("nothing to change")
    assert (
        subprocess.run(
            ["getfacl", "-RPn", "--absolute-names", str(journal)], capture_output=True, check=True
        ).stdout
        == acls_before
    )

    rc, out, _ = run_tool(capsys, "revert", *args)
    assert rc == 0 and "done: restore the ACLs under" in out
    assert not os.path.lexists(root / jdir.TMPFILES_DROPIN)
    remaining = subprocess.run(
        ["getfacl", "-RPn", "--absolute-names", str(journal)], capture_output=True, check=True
    ).stdout.decode()
    assert "group:5050:" not in remaining
    # adm keeps what systemd's default ACLs give it on every file, archived ones too.
    assert remaining.count("\ngroup:4:") == remaining.count("# file:")
    assert sorted(os.listdir(machine)) == sorted(
        ["system.journal", "system@0001.journal", "user-1000.journal", "trap.journal"]
    )
    rc, out, _ = run_tool(capsys, "revert", *args)
    assert rc == 0 and out.startswith("nothing to change")


@needs_acl_tools
@needs_root
def test_apply_keeps_groups_of_earlier_runs(tmp_path, capsys):
    root = make_image(tmp_path)
    assert run_tool(capsys, "apply", "--root", str(root), "-g", "staff")[0] == 0
    assert run_tool(capsys, "apply", "--root", str(root), "-g", "users")[0] == 0
    assert jdropin.read_tmpfiles_dropin(root) == {"staff": True, "users": True}
    assert run_tool(capsys, "check", "--root", str(root), "-g", "staff")[0] == 0
    assert run_tool(capsys, "revert", "--root", str(root), "-g", "users")[0] == 0
    assert jdropin.read_tmpfiles_dropin(root) == {"staff": True}
    assert run_tool(capsys, "check", "--root", str(root), "-g", "staff")[0] == 0


@needs_acl_tools
@needs_root
@pytest.mark.parametrize("storage", ["none", "volatile"])
def test_explicit_storage_stands(tmp_path, capsys, caplog, storage):
    """The admin's Storage=none|volatile: check exits 3 (not applicable) saying so, apply
    never overrides."""
    root = make_image(tmp_path)
    conf = root / "etc/systemd/journald.conf.d/local.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text(f"[Journal]\nStorage={storage}\n")
    rc, out, _ = run_tool(capsys, "check", "--root", str(root), "--json")
    report = json.loads(out)
    assert rc == 3 and [f["code"] for f in report["findings"]] == ["storage-disabled"]
    assert report["findings"][0]["subject"] == str(conf)
    rc, out, _ = run_tool(capsys, "check", "--root", str(root))
    assert rc == 3 and out.startswith(f"not applicable: journald Storage={storage} (set in")
    assert "action:" not in out
    rc, out, err = run_tool(capsys, "apply", "--root", str(root))
    assert rc == 0 and f"Storage={storage}" in caplog.text
    assert os.listdir(conf.parent) == ["local.conf"]
    assert not (root / "var/log/journal").exists()
    assert jconf.journald_storage(root) == (storage, str(conf))
    assert run_tool(capsys, "apply", "--root", str(root), "-q") == (0, "", "")


@needs_acl_tools
@needs_root
def test_revert_persists_in_the_configuration(tmp_path, capsys):
    root = make_image(tmp_path)
    (root / "etc/default").mkdir()
    defaults = root / jdir.DEFAULTS_FILE
    defaults.write_text('# keep me\nJOURNAL_ACL_GROUPS="adm staff users"\n')
    assert run_tool(capsys, "apply", "--root", str(root))[0] == 0
    rc, out, _ = run_tool(capsys, "revert", "--root", str(root), "-g", "staff")
    assert rc == 0 and "remove staff from JOURNAL_ACL_GROUPS" in out
    assert defaults.read_text() == '# keep me\nJOURNAL_ACL_GROUPS="adm users"\n'
    # What the boot unit runs grants nothing of staff again.
    assert "apply" not in run_tool(capsys, "apply", "--root", str(root), "--dry-run")[1]
    assert "group:5050" not in getfacl(root / "var/log/journal")
    # apply -g then a plain revert undoes it.
    assert run_tool(capsys, "apply", "--root", str(root), "-g", "staff")[0] == 0
    assert jgroups.configured_groups(root) == ["adm", "users", "staff"]
    assert run_tool(capsys, "revert", "--root", str(root))[0] == 0
    assert jgroups.configured_groups(root) == ["adm"]
    assert set(getfacl(root / "var/log/journal")) >= {"group:4"}
    assert not {"group:5050", "group:5100"} & set(getfacl(root / "var/log/journal"))


@needs_acl_tools
@needs_root
def test_revert_all_keeps_the_configuration(tmp_path, capsys):
    """What prerm runs on removal: every group but adm, the admin's file left alone."""
    root = make_image(tmp_path)
    assert run_tool(capsys, "apply", "--root", str(root), "-g", "staff", "-g", "users")[0] == 0
    before = (root / jdir.DEFAULTS_FILE).read_text()
    assert run_tool(capsys, "revert", "--root", str(root), "--all", "-q") == (0, "", "")
    assert (root / jdir.DEFAULTS_FILE).read_text() == before
    assert not (root / jdir.TMPFILES_DROPIN).exists()
    text = subprocess.run(
        ["getfacl", "-RPn", str(root / "var/log/journal")], capture_output=True, check=True
    ).stdout.decode()
    assert "group:5050" not in text and "group:5100" not in text
    assert run_tool(capsys, "revert", "--root", str(root), "--all", "-g", "staff")[0] == 2


@needs_acl_tools
@needs_root
def test_symlinked_journal(tmp_path, capsys):
    """Followed as journald follows it when root's; refused when anyone else's."""
    root = make_image(tmp_path)
    (root / "srv/journal").mkdir(parents=True)
    (root / "var/log/journal").symlink_to("../../srv/journal")
    assert run_tool(capsys, "apply", "--root", str(root), "-g", "staff")[0] == 0
    assert getfacl(root / "srv/journal")["default:group:5050"] == "r-x"
    assert run_tool(capsys, "check", "--root", str(root), "-g", "staff")[0] == 0
    os.lchown(root / "var/log/journal", 1000, 1000)
    rc, out, err = run_tool(capsys, "check", "--root", str(root))
    assert rc == 2 and "owned by uid 1000, not root" in err and err.count("\n") == 1
    os.lchown(root / "var/log/journal", 0, 0)
    os.chown(root / "srv/journal", 1000, 1000)
    rc, out, err = run_tool(capsys, "apply", "--root", str(root))
    assert rc == 2 and "owned by uid 1000" in err


@needs_acl_tools
@needs_root
def test_apply_skips_hard_links_and_foreign_files(tmp_path, capsys, caplog):
    root = make_image(tmp_path)
    assert run_tool(capsys, "apply", "--root", str(root))[0] == 0
    machine = root / "var/log/journal" / MACHINE_ID
    machine.mkdir()
    outside = tmp_path / "shadow"
    outside.write_text("secret")
    os.chmod(outside, 0o600)
    os.link(outside, machine / "linked.journal")
    (machine / "alice.journal").write_text("x")
    os.chown(machine / "alice.journal", 1000, 1000)
    subprocess.run(["setfacl", "-b", str(machine / "alice.journal")], check=True)  # inherited
    os.chmod(machine / "alice.journal", 0o600)
    rc, out, _ = run_tool(capsys, "check", "--root", str(root), "--json", "-g", "staff")
    severities = {f["code"]: f["severity"] for f in json.loads(out)["findings"]}
    assert severities["skipped-hardlink"] == "warning"
    assert severities["skipped-owner"] == "warning"
    rc, out, err = run_tool(capsys, "apply", "--root", str(root), "-g", "staff")
    assert rc == 0 and "hard links" in caplog.text and "uid 1000" in caplog.text
    assert set(getfacl(outside)) == {"user", "group", "other"}
    assert set(getfacl(machine / "alice.journal")) == {"user", "group", "other"}


def test_check_missing_journal_reports_tmpfiles(tmp_path, capsys):
    root = make_root(tmp_path)
    rc, out, _ = run_tool(capsys, "check", "--root", str(root), "--json", "-g", "staff")
    kinds = {(f["code"], f.get("group")) for f in json.loads(out)["findings"]}
    assert rc == 1 and kinds == {("journal-missing", None), ("boot-grant-missing", "staff")}


def test_tmpfiles_dropin_groups(tmp_path, capsys):
    root = make_root(tmp_path)
    with open(root / "etc/group", "a", encoding="utf-8") as group:
        group.write("users:x:100:\n")
    dropin = root / jdir.TMPFILES_DROPIN
    dropin.parent.mkdir(parents=True)
    dropin.write_text(jdropin.render_tmpfiles(["adm", "staff", "users"]))
    assert jdropin.read_tmpfiles_dropin(root) == {"staff": True, "users": True}
    assert jdropin.tmpfiles_findings(root, {"staff": 50}) == []
    lines = dropin.read_text().splitlines()
    dropin.write_text("\n".join(lines[:-1]) + "\n")  # system.journal line lost
    assert jdropin.read_tmpfiles_dropin(root) == {"staff": False, "users": False}
    assert [f["group"] for f in jdropin.tmpfiles_findings(root, {"adm": 4, "staff": 50})] == [
        "staff"
    ]


@pytest.mark.needs_root
def test_group_deleted_since_apply(tmp_path, capsys):
    # systemd-tmpfiles ignores a line naming an unknown group: check reports it, apply
    # leaves it out, and revert can still take it out although the group is gone.
    root = make_root(tmp_path)
    dropin = root / jdir.TMPFILES_DROPIN
    dropin.parent.mkdir(parents=True)
    dropin.write_text(jdropin.render_tmpfiles(["staff", "ops"]))
    falls = jdropin.tmpfiles_findings(root, {"staff": 50})
    assert [f["group"] for f in falls] == ["ops"] and "does not exist" in falls[0]["message"]
    assert jas.main(["revert", "--root", str(root), "-g", "nosuch"]) == 2
    assert jas.main(["revert", "--root", str(root), "-g", "ops", "--dry-run"]) == 0
    assert jdropin.read_tmpfiles_dropin(root) == {"staff": True, "ops": True}
    assert jas.main(["revert", "--root", str(root), "-g", "ops"]) == 0
    assert jdropin.read_tmpfiles_dropin(root) == {"staff": True}
    assert "remove ops from" in capsys.readouterr().out


@pytest.mark.parametrize(
    "line",
    [
        "a+ /etc/shadow - - - - group:staff:r--",
        "a /var/log/journal - - - - group:staff:r-x",
        "a+ /var/log/journal - - - - group:staff:rwx",
        "a+ /var/log/journal - - - - group:St;aff:r-x",
        "a+ /var/log/journal 0755 - - - group:staff:r-x",
    ],
)
def test_tmpfiles_dropin_malformed(tmp_path, capsys, line):
    root = make_root(tmp_path)
    dropin = root / jdir.TMPFILES_DROPIN
    dropin.parent.mkdir(parents=True)
    dropin.write_text(jdropin.GENERATED + line + "\n")
    before = dropin.read_bytes()
    rc, out, err = run_tool(capsys, "apply", "--root", str(root), "-g", "staff")
    assert rc == 2 and err.startswith("journal-acl-setup: error: ") and err.count("\n") == 1
    rc, out, err = run_tool(capsys, "revert", "--root", str(root), "-g", "staff")
    assert rc == 2 and dropin.read_bytes() == before
    assert not (root / "var/log/journal").exists()


@pytest.mark.needs_root
def test_apply_without_var_log_is_one_line(tmp_path, capsys):
    root = make_root(tmp_path)
    (root / "var/log").rmdir()
    rc, out, err = run_tool(capsys, "apply", "--root", str(root), "-g", "staff")
    assert rc == 2 and out == "" and err.count("\n") == 1 and "var/log" in err
    assert not (root / "etc/tmpfiles.d").exists()


def test_probe_acl_support_unwritable(tmp_path):
    with pytest.raises(Error, match="cannot write in"):
        jdir.probe_acl_support(tmp_path / "nonexistent")


@pytest.mark.parametrize("escape", ["var/log", "etc/tmpfiles.d", "etc/default"])
@pytest.mark.needs_root
def test_refuses_symlinks_out_of_the_image(tmp_path, capsys, escape):
    root = make_root(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    link = root / escape
    if link.is_dir():
        link.rmdir()
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(outside)
    (root / "etc/systemd/journald.conf").write_text("[Journal]\nStorage=volatile\n")
    for command in ("check", "apply", "revert"):
        rc, out, err = run_tool(capsys, command, "--root", str(root), "-g", "staff")
        assert rc == 2 and "outside" in err and err.count("\n") == 1, (command, out, err)
    assert os.listdir(outside) == []


@pytest.mark.needs_root
def test_refuses_absolute_symlink_meant_inside_the_image(tmp_path, capsys):
    """var/log -> /persist/log means ROOT/persist/log; resolved on the host it is not."""
    root = make_root(tmp_path)
    (root / "var/log").rmdir()
    (root / "var/log").symlink_to("/nonexistent-persist/log")
    rc, _, err = run_tool(capsys, "apply", "--root", str(root))
    assert rc == 2 and "outside" in err


@needs_acl_tools
@needs_root
def test_symlink_inside_the_image_is_followed(tmp_path, capsys):
    root = make_image(tmp_path)
    (root / "persist/log").mkdir(parents=True)
    (root / "var/log").rmdir()
    (root / "var/log").symlink_to("../persist/log")
    assert run_tool(capsys, "apply", "--root", str(root))[0] == 0
    assert (root / "persist/log/journal").is_dir()


def test_dry_run_lists_the_flush(tmp_path, capsys, monkeypatch):
    root = make_root(tmp_path)
    monkeypatch.setattr(jplan, "systemd_running", lambda root: True)
    rc, out, _ = run_tool(capsys, "apply", "--root", str(root), "--dry-run")
    assert rc == 0 and "would create" in out and "would run journalctl --flush\n" in out
    assert "restart" not in out
    assert not (root / "var/log/journal").exists()


def test_resolve_groups_uses_nss_on_the_running_system(tmp_path, monkeypatch):
    """On / a group from LDAP or sssd (not in /etc/group) resolves; in an image it does not."""
    real = jgroups.grp.getgrnam

    def getgrnam(name):
        if name == "ldapadmins":
            return grp.struct_group(("ldapadmins", "x", 70000, []))
        return real(name)

    monkeypatch.setattr(jgroups.grp, "getgrnam", getgrnam)
    assert jgroups.resolve_groups(["ldapadmins"], jas.Path("/")) == {"ldapadmins": 70000}
    with pytest.raises(Error, match="unknown group"):
        jgroups.resolve_groups(["ldapadmins"], make_root(tmp_path))


def test_journald_main_conf_by_systemd_version(tmp_path):
    root = make_root(tmp_path)
    (root / "usr/lib/systemd").mkdir(parents=True)
    (root / "usr/lib/systemd/journald.conf").write_text("[Journal]\nStorage=volatile\n")
    shared = root / "usr/lib/x86_64-linux-gnu/systemd"
    shared.mkdir(parents=True)
    (shared / "libsystemd-shared-252.so").write_text("")
    assert jconf.journald_storage(root) == ("auto", None)  # bookworm: /etc only
    (shared / "libsystemd-shared-252.so").rename(shared / "libsystemd-shared-257.so")
    assert jconf.systemd_version(root) == 257
    assert jconf.journald_storage(root)[0] == "volatile"  # trixie: first of etc, run, usr
    (root / "etc/systemd/journald.conf").write_text("[Journal]\n#Storage=auto\n")
    assert jconf.journald_storage(root) == ("auto", None)  # /etc's file wins whole
    (root / "etc/systemd/journald.conf").unlink()
    (root / "etc/systemd/journald.conf").symlink_to("/dev/null")
    assert jconf.journald_storage(root) == ("auto", None)  # masked


@pytest.mark.needs_root
def test_odd_names_report_on_one_line_and_valid_json(tmp_path, capsys):
    """A name with a newline or bytes that are not UTF-8 (anyone who can write in the tree
    can make one): each message stays one escaped line, the JSON subject decodes back to the
    exact name, and a strict UTF-8 stdout (capsys, a UTF-8 locale) gets no traceback."""
    root = make_root(tmp_path)
    machine = root / "var/log/journal/m"
    machine.mkdir(parents=True)
    names = [b"bad\xffname.journal", b"nl\nok: fake.journal", b"esc\x1b[2J.journal"]
    for name in names:
        path = os.path.join(os.fsencode(machine), name)
        with open(path, "w", encoding="utf-8"):
            pass
        os.chmod(path, 0o600)
    rc, out, err = run_tool(capsys, "check", "--root", str(root), "-g", "staff")
    assert rc == 1 and err == ""
    assert "bad\\xffname.journal" in out and "nl\\x0aok: fake.journal" in out
    assert "esc\\x1b[2J.journal" in out and "\x1b" not in out
    assert not any(line.startswith("ok:") for line in out.splitlines())
    rc, out, err = run_tool(capsys, "check", "--root", str(root), "-g", "staff", "--json")
    assert rc == 1 and err == ""
    subjects = {
        os.fsencode(f["subject"]) for f in json.loads(out)["findings"] if f["code"] == "unreadable"
    }
    assert subjects == {os.path.join(os.fsencode(machine), name) for name in names}


def test_group_names_end_at_the_end(tmp_path):
    """re's "$" matches before a final newline: "adm\\n" is no group name."""
    for name in ("adm\n", "staff$\n"):
        with pytest.raises(Error, match="invalid group name"):
            jgroups.validate_group_name(name)
    assert jgroups.validate_group_name("machine$") == "machine$"


@pytest.mark.needs_root
def test_apply_g_never_requotes_shell_from_the_configuration(tmp_path, capsys):
    """A configured value that is harmless single-quoted ('$(...)') is refused, never
    written back in double quotes, where a shell sourcing the file would run it."""
    root = make_root(tmp_path)
    (root / "etc/default").mkdir()
    defaults = root / jdir.DEFAULTS_FILE
    defaults.write_text("# mine\nJOURNAL_ACL_GROUPS='adm $(touch /tmp/pwned)'\n")
    before = defaults.read_bytes()
    for argv in (
        ["apply", "-g", "staff"],
        ["apply", "-g", "staff", "-n"],
        ["revert", "-g", "adm"],
    ):
        rc, out, err = run_tool(capsys, *argv, "--root", str(root))
        assert rc == 2 and "invalid group name" in err and err.count("\n") == 1, argv
        assert defaults.read_bytes() == before
    assert not (root / "var/log/journal").exists()


WALK_IN_MOUNTS = r"""
set -e
top=$1/top
mkdir -p "$top/a/loop" "$top/b" "$top/c" "$1/outside"
echo s > "$1/outside/secret"
mount --bind "$top" "$top/a/loop"
mount --bind "$1/outside" "$top/b"
mount -t tmpfs tmpfs "$top/c"
echo t > "$top/c/other.journal"
exec "$2" -c '
import os, sys
from debadmin.journal_acl_setup import walk as W
fd = os.open(sys.argv[1], W.O_DIR)
skips = []
for node in W.walk(fd, sys.argv[1], {0}, skips):
    print("walked", node.path[len(sys.argv[1]):])
for skip in skips:
    print(skip.code, skip.path[len(sys.argv[1]):])
' "$top"
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare"), reason="bind mounts need root and unshare"
)
def test_walk_stays_on_its_mount(tmp_path):
    """A bind mount below the journal (of the journal itself: a loop; of a directory from
    outside it) and another filesystem mounted there are not walked, in a mount namespace
    of the test's own."""
    lib = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(jas.__file__))))
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", WALK_IN_MOUNTS, "sh"]
        + [str(tmp_path), sys.executable],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=lib),
    )
    if result.returncode != 0 and "unshare" in result.stderr:
        pytest.skip(f"no mount namespace here: {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == [
        "bind-mount /a/loop",
        "bind-mount /b",
        "skipped-mount /c",
        "walked ",
        "walked /a",
    ]


@needs_acl_tools
@needs_root
def test_no_proc_refuses_before_any_change(tmp_path, capsys, monkeypatch):
    """Without /proc (a chroot, an image being built) default ACLs cannot be set by
    descriptor: apply and revert refuse in one line and change nothing, never by name."""
    root = make_image(tmp_path)
    assert run_tool(capsys, "apply", "--root", str(root), "-g", "staff")[0] == 0
    journal = root / "var/log/journal"
    os.chmod(journal, 0o755)
    (journal / "m").mkdir()
    before = subprocess.run(
        ["getfacl", "-RPn", "--absolute-names", str(root)], capture_output=True, check=True
    ).stdout
    monkeypatch.setattr(W, "magic_link", lambda fd: f"{tmp_path}/no-proc/self/fd/{fd}")
    for argv in (["apply", "-g", "staff"], ["revert", "-g", "staff"]):
        rc, out, err = run_tool(capsys, *argv, "--root", str(root))
        assert rc == 2 and "is /proc mounted?" in err and err.count("\n") == 1, (argv, out)
        after = subprocess.run(
            ["getfacl", "-RPn", "--absolute-names", str(root)], capture_output=True, check=True
        ).stdout
        assert after == before and os.stat(journal).st_mode & 0o7777 == 0o755
        assert jdropin.read_tmpfiles_dropin(root) == {"staff": True}
    os.chmod(journal, 0o2755)
    (root / jdir.TMPFILES_DROPIN).unlink()  # only the drop-in left to write: not half of it
    rc, out, err = run_tool(capsys, "apply", "--root", str(root), "-g", "staff")
    assert rc == 2 and "is /proc mounted?" in err and out == ""
    assert not (root / jdir.TMPFILES_DROPIN).exists()


def test_apply_g_keeps_a_symlinked_configuration(tmp_path, capsys):
    """/etc/default/journal-acl-setup as a link to a managed file: the target is updated,
    the link and the comments stay."""
    root = make_root(tmp_path)
    (root / "etc/default").mkdir()
    (root / "etc/site").mkdir()
    target = root / "etc/site/journal-acl-setup"
    target.write_text('# managed\nJOURNAL_ACL_GROUPS="adm"\n# end\n')
    (root / jdir.DEFAULTS_FILE).symlink_to("../site/journal-acl-setup")
    jgroups.write_configured_groups(root, ["adm", "staff"])
    assert os.readlink(root / jdir.DEFAULTS_FILE) == "../site/journal-acl-setup"
    assert target.read_text() == '# managed\nJOURNAL_ACL_GROUPS="adm staff"\n# end\n'


PRERM = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "debian/journal-acl-setup.prerm",
)


@pytest.mark.parametrize(
    "action,rc,warned",
    [("remove", 0, False), ("remove", 3, False), ("remove", 2, True), ("upgrade", 0, False)],
)
def test_prerm_never_fails_and_never_reverts_on_upgrade(tmp_path, action, rc, warned):
    """prerm runs revert --all on remove only; no journald (exit 3) is no warning; an
    error is one line; the apt transaction never fails."""
    fake = tmp_path / "bin/journal-acl-setup"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/calls\nexit {rc}\n')
    fake.chmod(0o755)
    env = {"PATH": f"{fake.parent}:/usr/bin:/bin"}
    result = subprocess.run(
        ["sh", PRERM, action], capture_output=True, text=True, env=env, check=False
    )
    assert result.returncode == 0 and result.stdout == ""
    assert (result.stderr.count("\n") == 1) is warned and (result.stderr == "") is not warned
    calls = (tmp_path / "calls").read_text() if (tmp_path / "calls").exists() else ""
    assert calls == ("revert --all --quiet\n" if action == "remove" else "")


@pytest.mark.skipif(os.geteuid() != 0, reason="files of two owners need root")
def test_walk_skips_root_files_in_a_users_directory(tmp_path):
    """The owner of a directory in the journal (systemd-journal-remote) can keep a hard
    link to a root file whose other name is replaced since (fs.protected_hardlinks=0: an
    old /etc/shadow), leaving one link: it is not the directory owner's, so no ACL."""
    top = tmp_path / "top"
    (top / "remote").mkdir(parents=True)
    (top / "remote/remote-host.journal").write_text("r")
    (top / "remote/old-shadow").write_text("s")
    os.chown(top / "remote", 64100, 64100)
    os.chown(top / "remote/remote-host.journal", 64100, 64100)
    fd = os.open(top, W.O_DIR)
    skips = []
    try:
        paths = [n.path[len(str(top)) :] for n in W.walk(fd, str(top), {0, 64100}, skips)]
    finally:
        os.close(fd)
    assert sorted(paths) == ["", "/remote", "/remote/remote-host.journal"]
    assert [(s.code, s.path[len(str(top)) :]) for s in skips] == [
        ("skipped-owner", "/remote/old-shadow")
    ]


@needs_root
def test_symlinked_journal_through_a_users_directory(tmp_path, capsys):
    """root's link /var/log/journal -> /srv/logs/journal, /srv/logs a user's: the user can
    point journal anywhere (at /etc) at any moment, so the link is not followed."""
    root = make_image(tmp_path)
    (root / "srv/logs/journal").mkdir(parents=True)
    os.chown(root / "srv/logs", 1000, 1000)
    (root / "var/log/journal").symlink_to("../../srv/logs/journal")
    for argv in (["check"], ["apply", "-g", "staff"]):
        rc, out, err = run_tool(capsys, *argv, "--root", str(root))
        assert rc == 2 and "not root's alone (owner uid 1000" in err and err.count("\n") == 1
    assert "group:5050" not in getfacl(root / "srv/logs/journal")
    os.chown(root / "srv/logs", 0, 0)
    os.chmod(root / "srv/logs", 0o777)
    assert run_tool(capsys, "check", "--root", str(root))[0] == 2
    os.chmod(root / "srv/logs", 0o755)
    (root / "srv/logs/journal").rename(root / "srv/logs/real")
    (root / "srv/logs/journal").symlink_to("real")
    rc, out, err = run_tool(capsys, "check", "--root", str(root))
    assert rc == 2 and "another symbolic link" in err


# --- issue 25: refusals, exact revert, unknown groups, bounded walk -------------------------


def test_grant_all_is_the_same_in_any_order_and_strip_never_widens():
    """revert recomputes what apply made: grant_all must not depend on the order of gids;
    an unrecorded file loses the groups' entries, its mask narrowed, never widened."""
    admin = {(W.USER_OBJ, U): 6, (W.USER, 77): 4, (GO, U): 4, (M, U): 0, (O, U): 0}
    one, _ = W.grant_all(admin, None, 1999, {50, 60}, False)
    two, _ = W.grant_all(W.grant_all(admin, None, 1999, {60}, False)[0], None, 1999, {50}, False)
    assert one == two and one[(M, U)] == W.R and one[(G, 50)] == one[(G, 60)] == W.R
    # user 77 and the owning group read nothing through the --- mask: they still do not
    assert one[(W.USER, 77)] == one[(GO, U)] == 0
    stripped = W.strip_groups(one, {50, 60}, W.from_mode(0o640))
    assert stripped[(M, U)] == 0  # what user 77 and the owning group need, as it was
    inherited = {(W.USER_OBJ, U): 6, (GO, U): 4, (G, 50): 5, (M, U): 4, (O, U): 0}
    assert W.strip_groups(inherited, {50}, W.from_mode(0o640)) == W.from_mode(0o640)
    assert W.strip_groups(inherited, {60}, W.from_mode(0o640)) is None
    default = {(W.USER_OBJ, U): 7, (GO, U): 5, (G, 50): 5, (M, U): 5, (O, U): 0}
    assert W.strip_groups(default, {50}) == {(W.USER_OBJ, U): 7, (GO, U): 5, (O, U): 0}


def test_a_default_acl_losing_its_mask_keeps_the_owning_group_masked():
    """Without a mask, a default ACL's owning group entry is what later files give their
    group: what the mask let it have, never the wider entry behind it."""
    default = {(W.USER_OBJ, U): 7, (GO, U): 7, (G, 50): 5, (M, U): 5, (O, U): 0}
    assert W.strip_groups(default, {50}) == {(W.USER_OBJ, U): 7, (GO, U): 5, (O, U): 0}
    access = {(W.USER_OBJ, U): 7, (GO, U): 7, (G, 4): 5, (M, U): 5, (O, U): 0}
    assert W.default_base(access) == {(W.USER_OBJ, U): 7, (GO, U): 5, (O, U): 0}
    assert W.default_base(W.from_mode(0o750)) == W.from_mode(0o750)


def test_skips_keep_every_action_and_summarise_the_rest():
    skips = W.Skips()
    for i in range(1000):
        skips.append(W.Skip("ignored-symlink", f"/j/l{i:04d}", f"/j/l{i:04d} is a link"))
    skips.append(W.Skip("changed-while-reading", "/j/x", "swapped", action=True))
    items = skips.items()
    assert len(skips) == 1001 and len(items) == W.Skips.EXAMPLES + 2
    assert items[-1].code == "ignored-symlink" and "990 more" in items[-1].message
    assert [s.path for s in items if s.action] == ["/j/x"]


@pytest.mark.needs_root
def test_check_summarises_many_symlinks(tmp_path, capsys):
    root = make_image(tmp_path)
    machine = root / "var/log/journal" / MACHINE_ID
    machine.mkdir(parents=True)
    for i in range(300):
        (machine / f"l{i}.journal").symlink_to("/etc/shadow")
    rc, out, _ = run_tool(capsys, "check", "--root", str(root), "--json")
    codes = [f["code"] for f in json.loads(out)["findings"]]
    assert codes.count("ignored-symlink") == W.Skips.EXAMPLES + 1, codes


def test_unknown_group_is_a_warning(tmp_path):
    root = make_root(tmp_path)
    groups, unknown = jgroups.resolve_known(["adm", "gone"], root)
    assert groups == {"adm": 4} and [f["code"] for f in unknown] == ["unknown-group"]
    assert unknown[0]["severity"] == "warning"
    with pytest.raises(Error, match="unknown group: gone"):
        jgroups.resolve_known(["gone"], root)
    with pytest.raises(Error, match="invalid group name"):
        jgroups.resolve_known(["adm", "Bad!"], root)


def test_apply_and_revert_need_root(tmp_path, capsys, monkeypatch):
    root = make_root(tmp_path)
    monkeypatch.setattr(jas.os, "geteuid", lambda: 1000)
    for command in ("apply", "revert"):
        rc, out, err = run_tool(capsys, command, "--root", str(root))
        assert rc == 2 and f"{command} must be run as root" in err and "denied" not in err
    assert not (root / "var/log/journal").exists()


def test_mount_id_unknown_fails_closed(tmp_path, monkeypatch):
    top = tmp_path / "top"
    (top / "m").mkdir(parents=True)
    monkeypatch.setattr(W, "mount_id", lambda fd: None)
    fd = os.open(top, W.O_DIR)
    skips = []
    try:
        nodes = [n.path for n in W.walk(fd, str(top), {os.geteuid()}, skips)]
    finally:
        os.close(fd)
    assert nodes == [str(top)]
    assert [(s.code, s.action) for s in skips] == [("unknown-mount", True)]


def test_open_checked_never_opens_a_fifo(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "file").write_text("x")
    fd = os.open(tmp_path, W.O_DIR)
    try:
        with pytest.raises(OSError) as exc:  # would block in open() without O_PATH first
            W.open_checked(fd, "fifo", False)
        assert exc.value.errno == errno.ELOOP
        opened, st = W.open_checked(fd, "file", False)
        os.close(opened)
        assert st.st_ino == os.stat(tmp_path / "file").st_ino
    finally:
        os.close(fd)


def test_unchanged_directories(tmp_path):
    """grant.unchanged vouches for a directory only where its mtime is what the walk
    saw and older than the coarse clock when the walk began: any change since sets a
    later one (a whole second may be a cut one: two seconds older)."""
    from debadmin.journal_acl_setup import grant as jgrant

    d = tmp_path / "d"
    d.mkdir()
    old = (int(time.time()) - 10) * jgrant.SECOND + 123_456_789  # a nanosecond time
    os.utime(d, ns=(old, old))
    st = os.stat(d)
    seen = [(str(d), st.st_dev, st.st_ino, st.st_mtime_ns)]
    start = jgrant.coarse_ns()
    assert jgrant.unchanged(seen, start)
    assert jgrant.unchanged(seen, old + 1)
    assert not jgrant.unchanged(seen, old)  # changed in the tick the walk began
    (d / "new.journal").write_text("x")  # a name added since
    assert not jgrant.unchanged(seen, start)
    os.utime(d, ns=(old, old))
    assert jgrant.unchanged(seen, start)
    os.rename(d, tmp_path / "moved")
    (tmp_path / "d").mkdir()  # another directory at that path
    os.utime(tmp_path / "d", ns=(old, old))
    assert not jgrant.unchanged(seen, start)
    whole = old - old % jgrant.SECOND  # a filesystem keeping seconds
    assert not jgrant.unchanged([(str(d), st.st_dev, st.st_ino, whole)], whole + jgrant.SECOND)
    assert [jgrant._cut(t) for t in (old, old - 89, old - 789, old - 123_456_789)] == [
        1,
        100,
        1000,
        2 * jgrant.SECOND,
    ]
    # The walk's start waits out the tick of a change made just before (apply's probe).
    (tmp_path / "moved" / "probe").write_text("x")
    fd = os.open(tmp_path / "moved", W.O_DIR)
    try:
        assert jgrant.clock_past(fd) > os.fstat(fd).st_mtime_ns
    finally:
        os.close(fd)


def aged_journal(root):
    """An image's journal with a machine directory of old files, every directory's
    mtime set long before (the grant walk vouches for what nobody changed since)."""
    machine = root / "var/log/journal" / MACHINE_ID
    machine.mkdir(parents=True)
    for d in (machine, machine.parent):  # as systemd-tmpfiles made them: no setup step
        os.chown(d, 0, 1999)
        os.chmod(d, 0o2755)
    for i in range(3):
        (machine / f"system@{i}.journal").write_text("x")
        os.chmod(machine / f"system@{i}.journal", 0o640)
    old = time.time() - 3600
    for d in (machine, machine.parent):
        os.utime(d, (old, old))
    return machine


@needs_acl_tools
@needs_root
def test_apply_scans_again_only_where_the_grant_walk_cannot_vouch(tmp_path, capsys, monkeypatch):
    """One walk where nothing changed meanwhile; a file made in a walked directory while
    the grant walk ran (before its default ACL was set) sends apply back over the tree,
    which finds it: exit 1, named."""
    scans = []
    real_scan = jscan.scan

    def counting(*args, **kwargs):
        scans.append(kwargs.get("enough", args[5] if len(args) > 5 else False))
        return real_scan(*args, **kwargs)

    monkeypatch.setattr(jscan, "scan", counting)
    root = make_image(tmp_path / "a")
    aged_journal(root)
    rc, out, err = run_tool(capsys, "apply", "--root", str(root), "-g", "adm", "-g", "staff")
    assert (rc, err) == (0, ""), out
    assert scans == [True]  # the scan before apply (up to the first unreadable file) alone

    scans.clear()
    root = make_image(tmp_path / "b")
    machine = aged_journal(root)
    real_walk = W.walk

    def journald_writes(fd, path, uids, skips, open_files=True):
        for node in real_walk(fd, path, uids, skips, open_files):
            if not node.is_dir and not (machine / "system.journal").exists():
                fresh = os.open(machine / "system.journal", os.O_CREAT | os.O_WRONLY, 0o640)
                os.close(fresh)
            yield node

    monkeypatch.setattr(W, "walk", journald_writes)
    rc, out, err = run_tool(capsys, "apply", "--root", str(root), "-g", "adm")
    assert scans == [True, False]  # the tree scanned again after the grant walk
    assert rc == 1, (out, err)
    assert f"still: group adm cannot read {machine / 'system.journal'}" in out
    monkeypatch.setattr(W, "walk", real_walk)

    # Nor where the walk skipped a file (its second link may go meanwhile) or the clock
    # was set back by an hour while it ran (a change since may have an older mtime).
    from debadmin.journal_acl_setup import grant as jgrant

    for case in ("hard link", "clock"):
        scans.clear()
        root = make_image(tmp_path / case.replace(" ", "-"))
        machine = aged_journal(root)
        if case == "hard link":
            os.link(machine / "system@0.journal", root / "elsewhere")
        else:
            offsets = iter([0, -3600 * jgrant.SECOND])
            monkeypatch.setattr(jgrant, "clock_offset", lambda: next(offsets))
        rc, out, err = run_tool(capsys, "apply", "--root", str(root), "-g", "adm")
        assert scans == [True, False], case
        assert rc == 0, (case, out, err)


def test_check_storage_disabled_is_not_applicable_in_text(tmp_path, capsys):
    root = make_image(tmp_path)
    conf = root / "etc/systemd/journald.conf.d/local.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text("[Journal]\nStorage=volatile\n")
    rc, out, _ = run_tool(capsys, "check", "--root", str(root))
    assert rc == 3 and "not applicable" in out


def test_linked_journald_conf_d_out_of_the_image_is_refused(tmp_path, capsys):
    root = make_image(tmp_path)
    outside = tmp_path / "host-conf.d"
    outside.mkdir()
    (root / "etc/systemd/journald.conf.d").symlink_to(outside)
    rc, _, err = run_tool(capsys, "check", "--root", str(root))
    assert rc == 2 and "outside" in err


@needs_acl_tools
@needs_root
def test_refused_grant_is_listed_and_the_rest_granted(tmp_path, capsys, monkeypatch):
    """One file refusing its ACL (ENOSPC) stops nothing: apply exits 1 naming it."""
    root = make_image(tmp_path)
    remote = root / "var/log/journal/remote"
    machine = root / "var/log/journal" / MACHINE_ID
    remote.mkdir(parents=True)
    machine.mkdir()
    for path in (remote / "full.journal", machine / "system@1.journal"):
        path.write_text("x")
        os.chmod(path, 0o640)
    real = W.Node.set_attributes

    def set_acls(node, access, default):
        if node.path.endswith("full.journal"):
            raise W.AclError(
                f"cannot set the ACL of {node.path}: No space left on device",
                "No space left on device",
            )
        return real(node, access, default)

    monkeypatch.setattr(W.Node, "set_attributes", set_acls)
    rc, out, err = run_tool(capsys, "apply", "--root", str(root), "-g", "staff")
    assert rc == 1, (out, err)
    assert f"not granted: {remote}/full.journal: No space left on device\n" in out, out
    assert can(machine / "system@1.journal", 5050)
    assert jdropin.read_tmpfiles_dropin(root) == {"staff": True}


@needs_acl_tools
@needs_root
def test_revert_restores_the_admins_mask_exactly(tmp_path, capsys):
    root = make_image(tmp_path)
    journal = root / "var/log/journal"
    machine = journal / MACHINE_ID
    machine.mkdir(parents=True)
    os.chmod(journal, 0o755)
    os.chmod(machine, 0o755)
    masked = machine / "masked.journal"
    masked.write_text("x")
    os.chmod(masked, 0o640)
    subprocess.run(["setfacl", "-m", "u:77:r--,m::---", str(masked)], check=True)
    active = machine / "system.journal"
    active.write_text("x")
    os.chmod(active, 0o600)
    before = getfacl(masked)
    # a hand-made journal: root:root 0755, the active file 0600, no ACL anywhere
    made = {p: (os.stat(p), getfacl(p)) for p in (journal, machine, active)}
    assert run_tool(capsys, "apply", "--root", str(root), "-g", "staff")[0] == 0
    assert getfacl(masked)["mask"] == "r--"
    # a file "journald" creates after apply inherits staff
    fd = os.open(machine / "system@2.journal", os.O_CREAT | os.O_WRONLY, 0o640)
    os.close(fd)
    assert "group:5050" in getfacl(machine / "system@2.journal")
    assert run_tool(capsys, "revert", "--root", str(root), "-g", "staff")[0] == 0
    assert getfacl(masked) == before
    after = getfacl(machine / "system@2.journal")
    # systemd's adm defaults (tmpfiles ran) stay, staff goes, the mask is not widened
    assert after == {
        "user": "rw-",
        "group": "r-x",
        "group:4": "r-x",
        "mask": "r--",
        "other": "---",
    }
    # The journal's setup (owner, mode, systemd-tmpfiles' ACLs) stays, as adm's entries
    # do; its record stays for revert --adm, which gives the hand-made journal back.
    state = root / "var/lib/journal-acl-setup/acl-state.sqlite"
    assert os.stat(journal).st_mode & 0o7777 == 0o2755
    assert state.exists()
    rc, out, err = run_tool(capsys, "revert", "--root", str(root), "--all", "--adm")
    assert (rc, err) == (0, ""), out
    for path, (st, acl) in made.items():
        now = os.stat(path)
        assert (now.st_uid, now.st_gid, now.st_mode) == (st.st_uid, st.st_gid, st.st_mode), path
        assert getfacl(path) == acl, path
    assert getfacl(masked) == before
    # made after apply: loses what apply's defaults (systemd-tmpfiles' adm included) gave
    assert getfacl(machine / "system@2.journal") == {"user": "rw-", "group": "r--", "other": "---"}
    assert not state.exists()


@needs_root
def test_no_op_apply_does_not_flush(tmp_path, capsys, monkeypatch):
    root = make_image(tmp_path)
    assert run_tool(capsys, "apply", "--root", str(root), "-q")[0] == 0
    monkeypatch.setattr(jplan, "systemd_running", lambda root: True)
    monkeypatch.setattr(jplan, "run_commands", lambda: pytest.fail("journalctl run"))
    rc, out, _ = run_tool(capsys, "apply", "--root", str(root))
    assert rc == 0 and out == "nothing to change: the journal is already set up\n"


@needs_acl_tools
@needs_root
def test_a_hand_made_journal_is_recorded_before_its_setup_changes(tmp_path, capsys, monkeypatch):
    """apply stopped right after it set the journal directory's owner and mode (before
    systemd-tmpfiles): the record was on disk first, and revert --adm gives it back."""
    root = make_image(tmp_path)
    journal = root / "var/log/journal"
    journal.mkdir(parents=True)
    os.chmod(journal, 0o750)
    made = os.stat(journal)

    def killed(*args):
        raise jas.Error("killed")

    monkeypatch.setattr(jplan, "tmpfiles", killed)
    assert run_tool(capsys, "apply", "--root", str(root), "-g", "staff")[0] == 2
    assert os.stat(journal).st_mode & 0o7777 == 0o2755
    monkeypatch.undo()
    rc, out, err = run_tool(capsys, "revert", "--root", str(root), "--all", "--adm", "-n")
    assert rc == 0 and "would restore" in out, (out, err)
    assert os.stat(journal).st_mode & 0o7777 == 0o2755  # -n changed nothing
    rc, out, err = run_tool(capsys, "revert", "--root", str(root), "--all", "--adm")
    assert (rc, err) == (0, ""), out
    now = os.stat(journal)
    assert (now.st_uid, now.st_gid, now.st_mode) == (made.st_uid, made.st_gid, made.st_mode)
    assert not (root / "var/lib/journal-acl-setup/acl-state.sqlite").exists()


@needs_root
def test_apply_reads_until_the_first_unreadable_file_a_dry_run_all(tmp_path, capsys):
    """apply's scan before its grant walk stops at the first path a group cannot read
    (the walk and the scan after it read them all); check and a dry run list each."""
    root = make_image(tmp_path)
    machine = root / "var/log/journal" / MACHINE_ID
    machine.mkdir(parents=True)
    for i in range(40):
        (machine / f"system@{i:04d}.journal").write_text("")
        os.chmod(machine / f"system@{i:04d}.journal", 0o600)
    journal = root / "var/log/journal"
    fd = jdir.open_journal(journal)
    try:
        uids = jdir.journal_uids(root)
        full, checked = jscan.scan(fd, journal, {"staff": 5050}, uids, keep=50)
        first, partly = jscan.scan(fd, journal, {"staff": 5050}, uids, keep=50, enough=True)
    finally:
        os.close(fd)
    unreadable = [f for f in full if f["code"] == "unreadable"]
    assert len(unreadable) == 40 and checked == 42, (checked, full)
    assert [f["code"] for f in first] in (["unreadable"], ["no-default-acl"]), first
    assert partly < checked
    rc, out, _ = run_tool(capsys, "apply", "--root", str(root), "-g", "staff", "-n")
    assert rc == 0 and out.count("would ") >= 2, out
    rc, out, err = run_tool(capsys, "apply", "--root", str(root), "-g", "staff")
    assert (rc, err) == (0, ""), out
    rc, out, _ = run_tool(capsys, "check", "--root", str(root), "-g", "staff")
    assert rc == 0 and "(42 paths checked)" in out, out
