"""Unit tests for journal-acl-setup: parsers, the ACL rule, config, and apply on a tree."""

import grp
import json
import os
import shutil
import subprocess

import pytest

from debadmin.errors import Error, NotApplicable
from debadmin.tools import journal_acl_setup as jas

GETFACL = """\
# file: /r/var/log/journal
# owner: 0
# group: 101
# flags: -s-
user::rwx
group::r-x
group:4:r-x
mask::r-x
other::r-x
default:user::rwx
default:group::r-x
default:group:4:r-x
default:mask::r-x
default:other::r-x

# file: /r/var/log/journal/m/odd\\040name\\012x.journal
# owner: 0
# group: 101
user::rw-
group::r--
group:4:r--\t#effective:---
mask::---
other::---

"""


def test_parse_getfacl():
    top, odd = jas.parse_getfacl(GETFACL)
    assert (top.path, top.uid, top.gid, top.flags) == ("/r/var/log/journal", 0, 101, "-s-")
    assert top.entries["group:4"] == "r-x" and top.defaults["group:4"] == "r-x"
    assert odd.path == "/r/var/log/journal/m/odd name\nx.journal"
    assert odd.entries["mask:"] == "---"


def test_parse_getfacl_garbage():
    with pytest.raises(Error):
        jas.parse_getfacl("user::rwx\n")


@pytest.mark.parametrize(
    "entries,gid,expected",
    [
        ({"user:": "rw-", "group:": "r--", "other:": "---"}, 101, True),  # owning group
        ({"user:": "rw-", "group:": "r--", "other:": "---"}, 4, False),
        (
            {"user:": "rw-", "group:": "---", "group:4": "r--", "mask:": "r--", "other:": "---"},
            4,
            True,
        ),
        (
            {"user:": "rw-", "group:": "r--", "group:4": "r--", "mask:": "---", "other:": "---"},
            4,
            False,
        ),  # masked out
        ({"user:": "rw-", "group:": "---", "other:": "r--"}, 4, True),  # falls to other
        ({"user:": "rw-", "group:": "---", "other:": "r--"}, 101, False),  # matched, never other
    ],
)
def test_group_can(entries, gid, expected):
    acl = jas.Acl(path="/x", uid=0, gid=101, entries=entries)
    assert jas.group_can(acl, gid, "r") is expected


def test_group_can_defaults_never_falls_to_other():
    """A default ACL without an entry for the group: journald's 0640 files give other ---."""
    acl = jas.Acl(path="/x", uid=0, gid=101)
    acl.defaults = {"user:": "rwx", "group:": "r-x", "mask:": "r-x", "other:": "r-x"}
    assert not jas.group_can(acl, 4, "rx", defaults=True)
    assert jas.group_can(acl, 101, "rx", defaults=True)  # the owning group's entry counts
    acl.defaults["mask:"] = "---"
    assert not jas.group_can(acl, 101, "rx", defaults=True)


def test_unescape_backslash_before_digits():
    (acl,) = jas.parse_getfacl("# file: /j/d\\\\123\\040x\nuser::rwx\n")
    assert acl.path == "/j/d\\123 x"


def test_group_can_defaults():
    acl = jas.Acl(path="/x", uid=0, gid=101, entries={"other:": "r-x"})
    assert not jas.group_can(acl, 4, "rx", defaults=True)
    acl.defaults = {
        "user:": "rwx",
        "group:": "r-x",
        "group:4": "r-x",
        "mask:": "r-x",
        "other:": "---",
    }
    assert jas.group_can(acl, 4, "rx", defaults=True)


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
    assert jas.journald_storage(root) == ("auto", None)
    (root / "etc/systemd/journald.conf").write_text("[Journal]\n#Storage=none\nStorage=volatile\n")
    assert jas.journald_storage(root)[0] == "volatile"
    usr = root / "usr/lib/systemd/journald.conf.d"
    usr.mkdir(parents=True)
    (usr / "10-a.conf").write_text("[Journal]\nStorage=persistent\n")
    (usr / "20-b.conf").write_text("[Journal]\nStorage=none\n")
    assert jas.journald_storage(root) == ("none", str(usr / "20-b.conf"))
    etc = root / "etc/systemd/journald.conf.d"
    etc.mkdir()
    (etc / "20-b.conf").write_text("[Journal]\nStorage=auto\n")  # masks the /usr one
    assert jas.journald_storage(root) == ("auto", str(etc / "20-b.conf"))
    (etc / "20-b.conf").write_text("# nothing\n")
    assert jas.journald_storage(root) == ("persistent", str(usr / "10-a.conf"))
    (etc / "30-c.conf").write_text("[Other]\nStorage=none\n")  # wrong section
    assert jas.journald_storage(root)[0] == "persistent"


def test_configured_groups(tmp_path):
    root = make_root(tmp_path)
    assert jas.configured_groups(root) == ["adm"]
    (root / "etc/default").mkdir()
    (root / "etc/default/journal-acl-setup").write_text(
        '# comment\nJOURNAL_ACL_GROUPS="adm staff"  # trailing\n'
    )
    assert jas.configured_groups(root) == ["adm", "staff"]
    (root / "etc/default/journal-acl-setup").write_text('JOURNAL_ACL_GROUPS="adm\n')
    with pytest.raises(Error, match="cannot parse"):
        jas.configured_groups(root)


@pytest.mark.parametrize("name", ["", "a;b", "$(id)", "-rf", "x" * 33, "Adm", "a b"])
def test_bad_group_names(tmp_path, name):
    with pytest.raises(Error):
        jas.resolve_groups([name], make_root(tmp_path))


def test_unknown_group(tmp_path):
    with pytest.raises(Error, match="unknown group: nosuch"):
        jas.resolve_groups(["nosuch"], make_root(tmp_path))


def test_not_applicable_without_journald(tmp_path):
    root = make_root(tmp_path)
    (root / "lib/systemd/systemd-journald").unlink()
    with pytest.raises(NotApplicable):
        jas.inspect(root, {"adm": 4})


def test_render_tmpfiles():
    text = jas.render_tmpfiles(["adm", "staff"])
    assert "group:adm" not in text
    assert "a+ /var/log/journal - - - - d:group:staff:r-x,group:staff:r-x\n" in text
    assert "a+ /var/log/journal/%m/system.journal - - - - group:staff:r--\n" in text


needs_acl_tools = pytest.mark.skipif(
    not (shutil.which("getfacl") and shutil.which("setfacl")), reason="acl not installed"
)


@needs_acl_tools
def test_check_lists_shortfalls_and_ignores_symlinks(tmp_path, capsys):
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
    assert report["ignored_symlinks"] == [str(journal / "m/link.journal")]
    kinds = {(s["kind"], s["group"], s["path"]) for s in report["shortfalls"]}
    assert ("unreadable", "staff", str(journal / "m/system@1.journal")) in kinds
    assert ("no-default-acl", "adm", str(journal / "m")) in kinds
    assert ("tmpfiles", "staff", str(root / jas.TMPFILES_DROPIN)) in kinds
    assert not any(s["path"] == str(journal / "m/link.journal") for s in report["shortfalls"])


@needs_acl_tools
def test_apply_dry_run_changes_nothing(tmp_path, capsys):
    root = make_root(tmp_path)
    rc = jas.main(["apply", "--root", str(root), "--dry-run", "-g", "staff"])
    out = capsys.readouterr().out
    assert rc == 0 and "would create" in out
    assert not (root / "var/log/journal").exists()
    assert not (root / jas.TMPFILES_DROPIN).exists()


def test_unescape_matches_real_getfacl(tmp_path):
    """A name with a backslash before digits comes back as it is on disk."""
    odd = tmp_path / "d\\123" / "é x"
    odd.mkdir(parents=True)
    paths = {a.path for a in jas.read_acls(tmp_path)}
    assert str(odd) in paths and str(odd.parent) in paths


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


def acl_of(path):
    text = subprocess.run(
        ["getfacl", "--absolute-names", "--numeric", "--", str(path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return jas.parse_getfacl(text)[0]


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
    assert jas.group_can(acl_of(journal), 5050, "rx", defaults=True)
    assert "group:50" not in acl_of(journal).entries  # the host's staff
    assert jas.read_tmpfiles_dropin(root) == {"staff": True}
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
        acl = acl_of(machine / name)
        assert jas.group_can(acl, 5050, "r") and jas.group_can(acl, 4, "r")
    for target in (outside / "secret", outside / "dir"):
        assert not acl_of(target).entries.keys() - {"user:", "group:", "other:"}
        assert not acl_of(target).defaults

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
    assert rc == 0 and "done: remove the ACL entries of group staff" in out
    assert not os.path.lexists(root / jas.TMPFILES_DROPIN)
    assert not any(jas.has_entries(a, 5050) for a in jas.read_acls(journal))
    # adm keeps what systemd's default ACLs give it on every file, archived ones too.
    adm = jas.lookup_group("adm", root)
    assert all(jas.has_entries(a, adm) for a in jas.read_acls(journal))
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
    assert jas.read_tmpfiles_dropin(root) == {"staff": True, "users": True}
    assert run_tool(capsys, "check", "--root", str(root), "-g", "staff")[0] == 0
    assert run_tool(capsys, "revert", "--root", str(root), "-g", "users")[0] == 0
    assert jas.read_tmpfiles_dropin(root) == {"staff": True}
    assert run_tool(capsys, "check", "--root", str(root), "-g", "staff")[0] == 0


@needs_acl_tools
@needs_root
def test_revert_removes_storage_dropin_with_adm_and_last_group(tmp_path, capsys):
    root = make_image(tmp_path)
    (root / "etc/systemd/journald.conf").write_text("[Journal]\nStorage=volatile\n")
    storage = root / jas.STORAGE_DROPIN
    assert run_tool(capsys, "apply", "--root", str(root), "-g", "adm", "-g", "staff")[0] == 0
    assert storage.exists()
    assert run_tool(capsys, "revert", "--root", str(root), "-g", "staff")[0] == 0
    assert storage.exists()  # adm still reads a persistent journal
    assert run_tool(capsys, "revert", "--root", str(root), "-g", "users")[0] == 0
    assert storage.exists()
    assert run_tool(capsys, "revert", "--root", str(root))[0] == 0  # adm, the default
    assert not storage.exists()


def test_check_missing_journal_reports_tmpfiles(tmp_path, capsys):
    root = make_root(tmp_path)
    rc, out, _ = run_tool(capsys, "check", "--root", str(root), "--json", "-g", "staff")
    kinds = {(s["kind"], s["group"]) for s in json.loads(out)["shortfalls"]}
    assert rc == 1 and kinds == {("missing", None), ("tmpfiles", "staff")}


def test_tmpfiles_dropin_groups(tmp_path, capsys):
    root = make_root(tmp_path)
    with open(root / "etc/group", "a", encoding="utf-8") as group:
        group.write("users:x:100:\n")
    dropin = root / jas.TMPFILES_DROPIN
    dropin.parent.mkdir(parents=True)
    dropin.write_text(jas.render_tmpfiles(["adm", "staff", "users"]))
    assert jas.read_tmpfiles_dropin(root) == {"staff": True, "users": True}
    assert jas.tmpfiles_shortfalls(root, {"staff": 50}) == []
    lines = dropin.read_text().splitlines()
    dropin.write_text("\n".join(lines[:-1]) + "\n")  # system.journal line lost
    assert jas.read_tmpfiles_dropin(root) == {"staff": False, "users": False}
    assert [s.group for s in jas.tmpfiles_shortfalls(root, {"adm": 4, "staff": 50})] == ["staff"]


def test_group_deleted_since_apply(tmp_path, capsys):
    # systemd-tmpfiles ignores a line naming an unknown group: check reports it, apply
    # leaves it out, and revert can still take it out although the group is gone.
    root = make_root(tmp_path)
    dropin = root / jas.TMPFILES_DROPIN
    dropin.parent.mkdir(parents=True)
    dropin.write_text(jas.render_tmpfiles(["staff", "ops"]))
    falls = jas.tmpfiles_shortfalls(root, {"staff": 50})
    assert [s.group for s in falls] == ["ops"] and "does not exist" in falls[0].message
    assert jas.main(["revert", "--root", str(root), "-g", "nosuch"]) == 2
    assert jas.main(["revert", "--root", str(root), "-g", "ops", "--dry-run"]) == 0
    assert jas.read_tmpfiles_dropin(root) == {"staff": True, "ops": True}
    assert jas.main(["revert", "--root", str(root), "-g", "ops"]) == 0
    assert jas.read_tmpfiles_dropin(root) == {"staff": True}
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
    dropin = root / jas.TMPFILES_DROPIN
    dropin.parent.mkdir(parents=True)
    dropin.write_text(jas.GENERATED + line + "\n")
    before = dropin.read_bytes()
    rc, out, err = run_tool(capsys, "apply", "--root", str(root), "-g", "staff")
    assert rc == 2 and err.startswith("journal-acl-setup: error: ") and err.count("\n") == 1
    rc, out, err = run_tool(capsys, "revert", "--root", str(root), "-g", "staff")
    assert rc == 2 and dropin.read_bytes() == before
    assert not (root / "var/log/journal").exists()


def test_apply_without_var_log_is_one_line(tmp_path, capsys):
    root = make_root(tmp_path)
    (root / "var/log").rmdir()
    rc, out, err = run_tool(capsys, "apply", "--root", str(root), "-g", "staff")
    assert rc == 2 and out == "" and err.count("\n") == 1 and "var/log" in err
    assert not (root / "etc/tmpfiles.d").exists()


def test_probe_acl_support_unwritable(tmp_path):
    with pytest.raises(Error, match="cannot write in"):
        jas.probe_acl_support(tmp_path / "nonexistent")


@pytest.mark.parametrize("escape", ["var/log", "etc/tmpfiles.d", "etc/systemd/journald.conf.d"])
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


def test_dry_run_lists_journald_restart_and_flush(tmp_path, capsys, monkeypatch):
    root = make_root(tmp_path)
    (root / "etc/systemd/journald.conf").write_text("[Journal]\nStorage=volatile\n")
    monkeypatch.setattr(jas, "systemd_running", lambda root: True)
    rc, out, _ = run_tool(capsys, "apply", "--root", str(root), "--dry-run")
    assert rc == 0
    assert "would restart systemd-journald\n" in out and "would run journalctl --flush\n" in out
    assert not (root / "var/log/journal").exists() and not (root / jas.STORAGE_DROPIN).exists()


@needs_acl_tools
def test_only_vanished(tmp_path):
    gone = subprocess.run(
        ["setfacl", "-m", "group:0:r--", "--", str(tmp_path / "gone")],
        capture_output=True,
        text=True,
        env=dict(os.environ, LC_ALL="C.UTF-8"),
    )
    assert gone.returncode != 0 and jas.only_vanished(gone.stderr)
    assert not jas.only_vanished(gone.stderr + "setfacl: /x: Operation not permitted\n")
    assert not jas.only_vanished("")


def test_resolve_groups_uses_nss_on_the_running_system(tmp_path, monkeypatch):
    """On / a group from LDAP or sssd (not in /etc/group) resolves; in an image it does not."""
    real = jas.grp.getgrnam

    def getgrnam(name):
        if name == "ldapadmins":
            return grp.struct_group(("ldapadmins", "x", 70000, []))
        return real(name)

    monkeypatch.setattr(jas.grp, "getgrnam", getgrnam)
    assert jas.resolve_groups(["ldapadmins"], jas.Path("/")) == {"ldapadmins": 70000}
    with pytest.raises(Error, match="unknown group"):
        jas.resolve_groups(["ldapadmins"], make_root(tmp_path))


def test_journald_main_conf_by_systemd_version(tmp_path):
    root = make_root(tmp_path)
    (root / "usr/lib/systemd").mkdir(parents=True)
    (root / "usr/lib/systemd/journald.conf").write_text("[Journal]\nStorage=volatile\n")
    shared = root / "usr/lib/x86_64-linux-gnu/systemd"
    shared.mkdir(parents=True)
    (shared / "libsystemd-shared-252.so").write_text("")
    assert jas.journald_storage(root) == ("auto", None)  # bookworm: /etc only
    (shared / "libsystemd-shared-252.so").rename(shared / "libsystemd-shared-257.so")
    assert jas.systemd_version(root) == 257
    assert jas.journald_storage(root)[0] == "volatile"  # trixie: first of etc, run, usr
    (root / "etc/systemd/journald.conf").write_text("[Journal]\n#Storage=auto\n")
    assert jas.journald_storage(root) == ("auto", None)  # /etc's file wins whole
    (root / "etc/systemd/journald.conf").unlink()
    (root / "etc/systemd/journald.conf").symlink_to("/dev/null")
    assert jas.journald_storage(root) == ("auto", None)  # masked
