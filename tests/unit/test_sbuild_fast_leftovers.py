"""sbuild-fast leftovers: which trees are provably the user's and provably dead."""

import os
import shutil
from pathlib import Path

import pytest

from debadmin.sbuild_fast import leftovers as sfl


def fake_proc(
    root: Path, pid: int, comm: str, ppid: int, start: int, argv=(), state: str = "S"
) -> None:
    d = root / str(pid)
    d.mkdir()
    # fields after the command name: state ppid ... (starttime is the 22nd field)
    fields = [state, str(ppid)] + ["0"] * 17 + [str(start)] + ["0"] * 10
    (d / "stat").write_text(f"{pid} ({comm}) " + " ".join(fields) + "\n")
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")


def test_start_time_reads_past_a_command_name_with_spaces_and_parentheses(tmp_path):
    fake_proc(tmp_path, 42, "a (b) c", 1, 12345)
    assert sfl.start_time(42, tmp_path) == 12345
    assert sfl.start_time(43, tmp_path) is None
    assert sfl.server_alive(42, 12345, tmp_path)
    # the same pid, started at another time: another process, the server is dead
    assert not sfl.server_alive(42, 999, tmp_path)
    assert not sfl.server_alive(43, 12345, tmp_path)
    # killed and not yet reaped: its descriptors are closed, its session is dead
    fake_proc(tmp_path, 44, "sbuild-fast", 1, 777, state="Z")
    assert sfl.start_time(44, tmp_path) == 777
    assert not sfl.server_alive(44, 777, tmp_path)


def test_other_sbuild_runs_skips_the_callers_ancestors(tmp_path):
    fake_proc(tmp_path, 1, "init", 0, 1, ["/sbin/init"])
    fake_proc(tmp_path, 10, "sbuild", 1, 5, ["/usr/bin/perl", "/usr/bin/sbuild", "-d", "x"])
    fake_proc(tmp_path, 11, "sbuild-fast", 10, 6, ["/usr/bin/python3", "/usr/bin/sbuild-fast"])
    uid = os.getuid()
    # our own sbuild (an ancestor) does not count
    assert not sfl.other_sbuild_runs(uid, tmp_path, me=11)
    fake_proc(tmp_path, 20, "sbuild", 1, 7, ["/usr/bin/perl", "-w", "/usr/bin/sbuild"])
    assert sfl.other_sbuild_runs(uid, tmp_path, me=11)
    # another user's sbuild does not count
    assert not sfl.other_sbuild_runs(uid + 1, tmp_path, me=11)
    # sbuild further into perl's command line (perl -I lib -w /usr/bin/sbuild) counts too
    shutil.rmtree(tmp_path / "20")
    assert not sfl.other_sbuild_runs(uid, tmp_path, me=11)
    fake_proc(tmp_path, 21, "perl", 1, 8, ["/usr/bin/perl", "-I", "lib", "-w", "/usr/bin/sbuild"])
    assert sfl.other_sbuild_runs(uid, tmp_path, me=11)


# The user the find tests play: the caller, or (as root, whose trees are never taken)
# an unprivileged uid the tree is given to.
USER = os.getuid() or 4242


def make(parent: Path, name: str, content: bool = False, uid: int = USER) -> Path:
    path = parent / name
    path.mkdir()
    if content:
        (path / "usr").mkdir()
        (path / "usr" / "file").write_text("x")
    if os.getuid() == 0:
        for item in [path, *path.rglob("*")]:
            os.lchown(item, uid, uid)
    return path


def test_find_takes_only_dead_trees_of_the_user_with_the_right_names(tmp_path):
    uid = USER
    dead_mp = make(tmp_path, "sbuild-fast.100.5000.abcd1234")
    dead_tree = make(tmp_path, "sbuild-fast-session.100.5000.xyz_9876", True)
    make(tmp_path, "sbuild-fast.200.6000.live0000")  # a running server
    make(tmp_path, "sbuild-fast.junk")  # no pid and start time: not ours to judge
    make(tmp_path, "tmp.sbuild.short")  # not sbuild's ten characters
    unshare_tree = make(tmp_path, "tmp.sbuild.AbCdE12345", True)
    (tmp_path / "sbuild-fast.300.7000.link0000").symlink_to(dead_tree)
    (tmp_path / "sbuild-fast.400.8000.file0000").write_text("")

    def alive(pid: int, start: int) -> bool:
        return (pid, start) == (200, 6000)

    found = sfl.find([tmp_path, tmp_path], uid, uid, alive, lambda: False)
    assert [(f.path, f.kind) for f in found] == [
        (dead_tree, "session tree"),
        (dead_mp, "session mount point"),
        (unshare_tree, "unshare-mode tree"),
    ]
    # another sbuild of the user runs: it may be unpacking into tmp.sbuild.*
    found = sfl.find([tmp_path], uid, uid, alive, lambda: True)
    assert unshare_tree not in [f.path for f in found]
    # another user's (or another user's subordinate ids'): nothing
    assert sfl.find([tmp_path], uid + 1, uid + 1, alive, lambda: False) == []


def test_find_takes_the_session_tree_only_from_the_subordinate_root(tmp_path):
    uid = USER
    make(tmp_path, "sbuild-fast-session.100.5000.abcd1234")
    mp = make(tmp_path, "sbuild-fast.100.5000.abcd1234")
    # the session tree is the subordinate root's (uid + 1 here): ours is not one
    found = sfl.find([tmp_path], uid, uid + 1, lambda p, s: False, lambda: False)
    assert [f.path for f in found] == [mp]


def test_remove_takes_the_tree_and_its_directory(tmp_path):
    uid = USER
    tree = make(tmp_path, "tmp.sbuild.AbCdE12345", True)
    empty = make(tmp_path, "sbuild-fast.1.2.abcd1234")
    # root's is never removed, whatever its name
    assert sfl.remove(sfl.Leftover(tree, "unshare-mode tree", 0), 0, []) == "not-ours"
    assert sfl.remove(sfl.Leftover(tree, "unshare-mode tree", 0), uid, []) == "not-ours"
    assert tree.exists()
    # the mapping's argv prefix: none here (the files are the caller's own)
    assert sfl.remove(sfl.Leftover(tree, "unshare-mode tree", uid), uid, []) == "removed"
    assert sfl.remove(sfl.Leftover(empty, "session mount point", uid), uid, []) == "removed"
    assert not tree.exists() and not empty.exists()
    # what cannot be removed is said, not hidden
    stuck = make(tmp_path, "tmp.sbuild.ZZZZZ12345", True)
    assert sfl.remove(sfl.Leftover(stuck, "unshare-mode tree", uid), uid, ["false"]) == "failed"
    assert stuck.exists()


def test_remove_dry_run_writes_nothing(tmp_path):
    uid = USER
    tree = make(tmp_path, "tmp.sbuild.AbCdE12345", True)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    leftover = sfl.Leftover(tree, "unshare-mode tree", uid)
    assert sfl.remove(leftover, uid, [], dry_run=True) == "would-remove"
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before


def test_root_owned_leftovers_are_reported_never_entered(tmp_path):
    if os.getuid() != 0:
        pytest.skip("needs root to make root-owned trees")
    user = 4242
    tree = make(tmp_path, "tmp.sbuild.AbCdE12345", True, uid=0)
    mp = make(tmp_path, "sbuild-fast.1.2.abcd1234", uid=0)
    found = sfl.find([tmp_path], user, user + 1, lambda p, s: False, lambda: False)
    assert [(f.path, f.owner) for f in found] == [(mp, 0), (tree, 0)]
    for item in found:
        assert sfl.remove(item, user, [], dry_run=False) == "not-ours"
    assert tree.exists() and (tree / "usr" / "file").exists() and mp.exists()
    # a user's tree with a file of root's inside it is left whole
    mine = make(tmp_path, "tmp.sbuild.Mine123456", True, uid=user)
    # inside the user's mapping root's file shows as the overflow id: here it is that id
    os.chown(mine / "usr" / "file", sfl.overflow_id("uid"), 0)
    item = sfl.Leftover(mine, "unshare-mode tree", user)
    assert sfl.remove(item, user, [], dry_run=True) == "not-ours"
    assert sfl.remove(item, user, []) == "not-ours"
    assert (mine / "usr" / "file").exists()
    # and nothing at all is looked for when the user is root or maps root
    assert sfl.find([tmp_path], 0, 100000, lambda p, s: False, lambda: False) == []
    assert sfl.find([tmp_path], user, 0, lambda p, s: False, lambda: False) == []


def test_clean_warns_once_about_what_stays(tmp_path, monkeypatch, caplog):
    uid = os.getuid()
    stuck = sfl.Leftover(tmp_path / "tmp.sbuild.ZZZZZ12345", "unshare-mode tree", uid + 1)
    monkeypatch.setattr(sfl, "dead_leftovers", lambda *a, **k: [stuck])
    monkeypatch.setattr(sfl, "remove", lambda *a, **k: "failed")
    record = tmp_path / "leftovers-warned"
    caplog.set_level("INFO", logger="sbuild-fast")
    for _ in range(3):
        assert sfl.clean("u", uid, ["false"], record=record) == []
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1
    # the one warning names the command that removes it
    assert "unshare --map-auto --map-root-user rm -rf" in warnings[0].getMessage()
    assert record.read_text() == f"{stuck.path}\n"
    # once it is gone, the record goes too
    monkeypatch.setattr(sfl, "dead_leftovers", lambda *a, **k: [])
    sfl.clean("u", uid, ["false"], record=record)
    assert not record.exists()


def test_candidate_dirs_are_absolute_and_unique(monkeypatch):
    monkeypatch.setenv("TMPDIR", "/tmp")
    dirs = sfl.candidate_dirs(["/dev/shm", "relative", None, "/srv/unpack"])
    assert dirs == [Path(d) for d in ("/tmp", "/var/tmp", "/dev/shm", "/srv/unpack")]


def test_doctor_reports_each_leftover_removed_or_not():
    from debadmin.sbuild_fast import doctor as sfd

    facts = {
        "leftovers": [
            {
                "path": "/var/tmp/sbuild-fast-session.1.2.x",
                "kind": "session tree",
                "removed": True,
                "status": "removed",
            },
            {
                "path": "/dev/shm/tmp.sbuild.AbCdE12345",
                "kind": "unshare-mode tree",
                "removed": False,
                "status": "failed",
            },
            {
                "path": "/tmp/tmp.sbuild.Would12345",
                "kind": "unshare-mode tree",
                "removed": False,
                "status": "would-remove",
            },
            {
                "path": "/tmp/tmp.sbuild.Roots12345",
                "kind": "unshare-mode tree",
                "removed": False,
                "status": "not-ours",
            },
        ]
    }
    findings = sfd.rule_leftovers(facts)
    assert [(f["code"], f["severity"], f["subject"]) for f in findings] == [
        ("leftover-removed", "info", "/var/tmp/sbuild-fast-session.1.2.x"),
        ("leftover", "action", "/dev/shm/tmp.sbuild.AbCdE12345"),
        ("leftover", "action", "/tmp/tmp.sbuild.Would12345"),
        ("leftover-not-ours", "warning", "/tmp/tmp.sbuild.Roots12345"),
    ]
    assert findings[0]["message"] == (
        "removed the leftover session tree /var/tmp/sbuild-fast-session.1.2.x"
    )
    assert "unshare --map-auto --map-root-user rm -rf --one-file-system -- " in (
        findings[1]["message"]
    )
    assert findings[2]["message"].startswith("would remove the leftover")
    assert "rm -rf --one-file-system -- /tmp/tmp.sbuild.Roots12345" in findings[3]["message"]
    assert sfd.rule_leftovers({}) == []
    assert sfd.rule_leftovers in sfd.RULES


def test_doctor_dry_run_removes_nothing_and_opens_no_session(monkeypatch, tmp_path):
    from debadmin.sbuild_fast import doctor as sfd

    uid = os.getuid()
    tree = make(tmp_path, "tmp.sbuild.AbCdE12345", True)
    leftover = sfl.Leftover(tree, "unshare-mode tree", uid)
    monkeypatch.setattr(sfl, "dead_leftovers", lambda *a, **k: [leftover])
    monkeypatch.setattr(sfl, "removal_argv", lambda: [])
    out = sfd.remove_leftovers(None, dry_run=True)
    assert tree.exists() and (tree / "usr" / "file").exists()
    expected = "not-ours" if uid == 0 else "would-remove"
    assert out == [
        {"path": str(tree), "kind": "unshare-mode tree", "removed": False, "status": expected}
    ]
    # the probes that write (a session unpacks the chroot, schroot opens a session)
    monkeypatch.setattr(sfd, "command_cost", lambda mode, chroot: 0.01)
    assert sfd.command_cost_read_only("session", "x") is None
    assert sfd.command_cost_read_only("schroot", "x") is None
    assert sfd.command_cost_read_only("unshare", None) == 0.01
