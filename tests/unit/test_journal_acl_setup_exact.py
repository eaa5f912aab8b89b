"""journal-acl-setup: nobody but the granted groups gains a right, and revert gives back
exactly what was there (issue 33), on real files through the command line."""

import contextlib
import os
import shutil
import sqlite3
import subprocess

import pytest

from debadmin.journal_acl_setup import main as jas
from debadmin.journal_acl_setup import journaldir as jdir
from debadmin.journal_acl_setup import walk as jwalk

W = jwalk
MACHINE_ID = "0123456789abcdef0123456789abcdef"
GROUPS = (
    "root:x:0:\nadm:x:4:\nsystemd-journal:x:1999:\nstaff:x:5050:\nops:x:5060:\nusers:x:5100:\n"
)
STOCK_TMPFILES = """\
z /var/log/journal 2755 root systemd-journal - -
a+ /var/log/journal - - - - d:group::r-x,d:group:4:r-x,group::r-x,group:4:r-x
z /var/log/journal/%m 2755 root systemd-journal - -
a+ /var/log/journal/%m - - - - d:group:4:r-x,group:4:r-x
a+ /var/log/journal/%m/system.journal - - - - group:4:r--
"""

pytestmark = [
    pytest.mark.needs_root,
    pytest.mark.skipif(
        not (shutil.which("getfacl") and shutil.which("setfacl")), reason="acl not installed"
    ),
    pytest.mark.skipif(not shutil.which("systemd-tmpfiles"), reason="apply runs systemd-tmpfiles"),
]


def image(tmp_path):
    """A system image with its journal set up as systemd sets it up (first apply done
    for adm), so that what a group's apply and revert do is all that changes."""
    root = tmp_path / "root"
    for directory in ("etc/systemd", "lib/systemd", "var/log", "usr/lib/tmpfiles.d"):
        (root / directory).mkdir(parents=True)
    (root / "lib/systemd/systemd-journald").write_text("")
    (root / "etc/group").write_text(GROUPS)
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (root / "etc/machine-id").write_text(MACHINE_ID + "\n")
    (root / "usr/lib/tmpfiles.d/systemd.conf").write_text(STOCK_TMPFILES)
    machine = root / "var/log/journal" / MACHINE_ID
    machine.mkdir(parents=True)
    assert jas.main(["apply", "--root", str(root), "-q"]) == 0
    return root, machine


def tree(root):
    """getfacl -R and stat of the journal: what revert must give back."""
    journal = root / "var/log/journal"
    acls = subprocess.run(
        ["getfacl", "-RPn", "--absolute-names", str(journal)],
        capture_output=True,
        check=True,
        env=dict(os.environ, LC_ALL="C.UTF-8"),
    ).stdout.decode()
    modes = {}
    for top, dirs, files in os.walk(journal):
        for name in dirs + files:
            st = os.lstat(os.path.join(top, name))
            modes[os.path.join(top, name)] = (st.st_mode, st.st_uid, st.st_gid)
    return acls, modes


def setfacl(path, spec):
    subprocess.run(["setfacl", "-m", spec, str(path)], check=True)


def acl(path):
    return W.entries(W.posix1e.ACL(file=str(path)))


def run(capsys, *argv):
    rc = jas.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_a_wider_mask_gives_nobody_else_a_right(tmp_path, capsys):
    root, machine = image(tmp_path)
    masked = machine / "masked.journal"
    masked.write_text("x")
    os.chmod(masked, 0o640)
    setfacl(masked, "u:77:r--,g:88:rw-,m::---")
    sub = machine / "sub"
    sub.mkdir()
    os.chmod(sub, 0o750)
    setfacl(sub, "u:77:rwx,m::--x")
    setfacl(sub, "d:u:77:rwx,d:m::---")
    before = tree(root)
    mask_before = {p: W.effective(acl(p)) for p in (masked, sub)}
    assert run(capsys, "apply", "--root", str(root), "-g", "staff")[0] == 0
    for path in (masked, sub):
        after = W.effective(acl(path))
        assert after.pop((W.GROUP, 5050)) == (W.R | W.X if path == sub else W.R)
        assert after == mask_before[path]
    default = W.entries(W.posix1e.ACL(filedef=str(sub)))
    assert W.effective(default)[(W.USER, 77)] == 0  # behind the old --- default mask
    assert run(capsys, "revert", "--root", str(root), "-g", "staff")[0] == 0
    assert tree(root) == before


def test_revert_keeps_the_groups_own_earlier_entries(tmp_path, capsys):
    root, machine = image(tmp_path)
    readable, masked = machine / "readable.journal", machine / "masked.journal"
    for path in (readable, masked):
        path.write_text("x")
        os.chmod(path, 0o670)
    setfacl(readable, "g:5050:r--")
    setfacl(masked, "g:5050:r--,m::-w-")
    before = tree(root)
    assert run(capsys, "apply", "--root", str(root), "-g", "staff")[0] == 0
    assert W.group_can(acl(masked), 0, 5050, W.R)
    assert run(capsys, "revert", "--root", str(root), "-g", "staff")[0] == 0
    assert tree(root) == before
    assert acl(readable)[(W.GROUP, 5050)] == W.R and acl(masked)[(W.MASK, W.UNDEFINED)] == W.W


@pytest.mark.parametrize("order", [("staff", "ops"), ("ops", "staff")])
def test_two_groups_in_either_order_end_exact(tmp_path, capsys, order):
    """apply staff; (journald writes a file); apply ops; revert in either order."""
    root, machine = image(tmp_path)
    old = machine / "system@1.journal"
    old.write_text("x")
    os.chmod(old, 0o600)
    before = tree(root)
    assert run(capsys, "apply", "--root", str(root), "-g", "staff")[0] == 0
    fd = os.open(machine / "system@2.journal", os.O_CREAT | os.O_WRONLY, 0o640)
    os.close(fd)
    assert run(capsys, "apply", "--root", str(root), "-g", "ops")[0] == 0
    state = root / "var/lib/journal-acl-setup/acl-state.sqlite"
    for group in order:
        rc, out, err = run(capsys, "revert", "--root", str(root), "-g", group)
        assert (rc, err) == (0, ""), out
    new = acl(machine / "system@2.journal")
    assert not {(W.GROUP, 5050), (W.GROUP, 5060)} & set(new)
    os.unlink(machine / "system@2.journal")
    assert tree(root) == before
    with contextlib.closing(
        sqlite3.connect(state)
    ) as db:  # adm's (the image's first apply) is left
        assert db.execute("SELECT name FROM applied").fetchall() == [("adm",)]


@pytest.mark.parametrize("how", ["deleted", "empty"])
def test_revert_without_a_state_file_refuses(tmp_path, capsys, how):
    root, machine = image(tmp_path)
    (machine / "system@1.journal").write_text("x")
    os.chmod(machine / "system@1.journal", 0o600)
    assert run(capsys, "apply", "--root", str(root), "-g", "staff")[0] == 0
    state = root / "var/lib/journal-acl-setup/acl-state.sqlite"
    state.unlink()
    if how == "empty":
        state.write_bytes(b"")
    granted = tree(root)
    config = (root / jdir.DEFAULTS_FILE).read_text()
    rc, out, err = run(capsys, "revert", "--root", str(root), "-g", "staff")
    assert rc == 2 and out == ""
    assert f"{state} is {'missing' if how == 'deleted' else 'empty'}" in err
    assert "--strip" in err and "nothing changed" in err
    assert tree(root) == granted and (root / jdir.DEFAULTS_FILE).read_text() == config
    assert state.exists() == (how == "empty")
    rc, out, err = run(capsys, "revert", "--root", str(root), "-g", "staff", "--strip")
    assert rc == 0, (out, err)
    assert "group:5050" not in tree(root)[0], (out, tree(root)[0])


def test_unknown_group_blocks_nothing_and_quiet_keeps_the_warning(tmp_path, capsys):
    root, machine = image(tmp_path)
    (machine / "system@1.journal").write_text("x")
    os.chmod(machine / "system@1.journal", 0o600)
    before = tree(root)
    assert run(capsys, "apply", "--root", str(root), "-g", "staff")[0] == 0
    (root / jdir.DEFAULTS_FILE).write_text('JOURNAL_ACL_GROUPS="adm staff nosuch"\n')
    rc, out, err = run(capsys, "revert", "--root", str(root), "--all", "-q")
    assert rc == 0 and out == ""
    assert err == (
        "journal-acl-setup: warning: group nosuch does not exist and was never applied: "
        "nothing of it to revert\n"
    )
    assert tree(root) == before
    rc, _, err = run(capsys, "apply", "--root", str(root), "-g", "nosuch", "-g", "ops", "-q")
    assert rc == 0 and "group nosuch does not exist" in err


def test_a_file_revert_cannot_reach_keeps_its_record(tmp_path, capsys):
    root, machine = image(tmp_path)
    linked = machine / "system@1.journal"
    linked.write_text("x")
    os.chmod(linked, 0o600)
    before = tree(root)
    assert run(capsys, "apply", "--root", str(root), "-g", "staff")[0] == 0
    os.link(linked, tmp_path / "elsewhere")
    rc, out, _ = run(capsys, "revert", "--root", str(root), "-g", "staff")
    assert rc == 1 and "not restored" in out and "hard links" in out
    # the group stays applied, and revert says so rather than "done: forget staff"
    assert "done: forget" not in out and "kept staff applied in " in out, out
    state = root / "var/lib/journal-acl-setup/acl-state.sqlite"
    with contextlib.closing(sqlite3.connect(state)) as db:
        assert db.execute("SELECT count(*) FROM acl WHERE gids != ''").fetchone()[0] == 1
        assert [r[0] for r in db.execute("SELECT name FROM applied")] == ["adm", "staff"]
    os.unlink(tmp_path / "elsewhere")
    rc, out, _ = run(capsys, "revert", "--root", str(root), "-g", "staff")
    assert rc == 0, out
    assert tree(root) == before


def test_dry_runs_write_nothing(tmp_path, capsys):
    root, machine = image(tmp_path)
    state_dir = root / "var/lib/journal-acl-setup"
    shutil.rmtree(state_dir, ignore_errors=True)
    before = tree(root)
    assert run(capsys, "apply", "--root", str(root), "-g", "staff", "-n")[0] == 0
    assert run(capsys, "revert", "--root", str(root), "-g", "staff", "-n")[0] == 0
    assert not state_dir.exists() and tree(root) == before
    assert run(capsys, "apply", "--root", str(root), "-g", "staff")[0] == 0
    state = state_dir / "acl-state.sqlite"
    data = state.read_bytes()
    assert run(capsys, "revert", "--root", str(root), "-g", "staff", "-n")[0] == 0
    assert state.read_bytes() == data


LIB = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(jas.__file__))))
TOOL = ["-c", "import sys; from debadmin.journal_acl_setup import main; sys.exit(main.main())"]


@pytest.mark.skipif(not shutil.which("unshare"), reason="needs unshare for a bind mount")
def test_a_bind_mounted_directory_is_reported(tmp_path):
    root, machine = image(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    script = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"]
        + [str(tmp_path / "elsewhere"), str(machine), jas_python(), *TOOL]
        + ["check", "--root", str(root)],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=LIB),
    )
    if "unshare" in result.stderr:
        pytest.skip(f"no mount namespace here: {result.stderr.strip()}")
    assert result.returncode == 1, result
    assert f"{machine} is a bind mount: not walked" in result.stdout


def jas_python():
    import sys

    return sys.executable


def test_the_lock_holds_however_the_root_is_spelt(tmp_path):
    """The journal's parent directory itself is locked: an apply through --root with
    another spelling (or from a container's host) waits for the one holding it."""
    import fcntl

    root, _ = image(tmp_path)
    fd = os.open(root / "var/log", os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        spelt = "/" + str(root / "var/..")  # //tmp/.../root/var/..
        with pytest.raises(subprocess.TimeoutExpired):
            subprocess.run(
                [jas_python(), *TOOL, "apply", "--root", spelt, "-g", "staff", "-q"],
                env=dict(os.environ, PYTHONPATH=LIB),
                capture_output=True,
                timeout=3,
            )
    finally:
        os.close(fd)
    assert (W.GROUP, 5050) not in acl(root / "var/log/journal")  # it waited, did nothing


def test_check_lists_ten_paths_and_counts_the_rest(tmp_path, capsys):
    """check keeps no list of every unreadable file (constant memory): ten, then a count."""
    root, machine = image(tmp_path)
    for number in range(25):
        (machine / f"system@{number:02}.journal").write_text("x")
        os.chmod(machine / f"system@{number:02}.journal", 0o600)
    rc, out, _ = run(capsys, "check", "--root", str(root), "-g", "adm")
    assert rc == 1
    assert out.count("group adm cannot read") == 10
    assert "unreadable: 15 more for group adm" in out


def test_a_lost_state_file_is_not_taken_for_the_admins_entries(tmp_path, capsys):
    """The state file deleted, the boot-time apply makes a new one: the group's entries
    there are apply's (the drop-in names it), so revert still takes them off."""
    root, machine = image(tmp_path)
    (machine / "system@1.journal").write_text("x")
    os.chmod(machine / "system@1.journal", 0o600)
    assert run(capsys, "apply", "--root", str(root), "-g", "staff")[0] == 0
    (root / "var/lib/journal-acl-setup/acl-state.sqlite").unlink()
    assert run(capsys, "apply", "--root", str(root), "-q")[0] == 0  # JOURNAL_ACL_GROUPS
    rc, out, err = run(capsys, "revert", "--root", str(root), "-g", "staff")
    assert (rc, err) == (0, ""), out
    assert "group:5050" not in tree(root)[0], (out, tree(root)[0])


def test_revert_names_what_it_passes_over(tmp_path, capsys, caplog):
    """A symbolic link in the journal is never followed, by revert as by apply, and revert
    says so once (it walks twice: the plan, then the change), as apply does."""
    root, machine = image(tmp_path)
    (machine / "system.journal").write_text("log\n")
    (machine / "shadow.journal").symlink_to("/etc/shadow")
    assert run(capsys, "apply", "--root", str(root), "-g", "staff")[0] == 0
    caplog.clear()
    rc, _out, err = run(capsys, "revert", "--root", str(root), "-g", "staff")
    assert rc == 0, err
    said = [(r.levelname, r.getMessage()) for r in caplog.records if "shadow" in r.getMessage()]
    assert said == [("WARNING", f"{machine}/shadow.journal is a symbolic link, never followed")]


def regid(root, gid):
    (root / "etc/group").write_text(GROUPS.replace("staff:x:5050:", f"staff:x:{gid}:"))


def records(root, gid):
    """How many records of the state database still name gid (granted or inherited)."""
    state = root / "var/lib/journal-acl-setup/acl-state.sqlite"
    if not state.exists():
        return 0
    with contextlib.closing(sqlite3.connect(state)) as db:
        rows = db.execute("SELECT gids, later FROM acl").fetchall()
    return sum(str(gid) in (granted + " " + later).split() for granted, later in rows)


def test_revert_after_the_gid_changed_takes_the_recorded_gid(tmp_path, capsys):
    root, machine = image(tmp_path)
    (machine / "system.journal").write_text("x")
    before = tree(root)
    assert run(capsys, "apply", "--root", str(root), "-g", "staff")[0] == 0
    regid(root, 5051)
    rc, out, err = run(capsys, "revert", "--root", str(root), "-g", "staff")
    assert rc == 0, out + err
    assert tree(root) == before
    assert records(root, 5050) == 0


def test_revert_takes_the_current_gid_too_where_apply_made_its_entries(tmp_path, capsys):
    """staff applied as 5050, renumbered and applied again as 5051 (the 5050 records
    left behind), then back to 5050: revert takes both, by the records."""
    root, machine = image(tmp_path)
    (machine / "system.journal").write_text("x")
    before = tree(root)
    assert run(capsys, "apply", "--root", str(root), "-g", "staff")[0] == 0
    regid(root, 5051)
    assert run(capsys, "apply", "--root", str(root), "-g", "staff")[0] == 0
    regid(root, 5050)
    rc, out, err = run(capsys, "revert", "--root", str(root), "-g", "staff")
    assert rc == 0, out + err
    assert tree(root) == before
    assert records(root, 5050) == records(root, 5051) == 0


def test_records_of_a_gid_no_applied_group_has_are_reported(tmp_path, capsys):
    root, machine = image(tmp_path)
    (machine / "system.journal").write_text("x")
    assert run(capsys, "apply", "--root", str(root), "-g", "staff", "-g", "ops")[0] == 0
    regid(root, 5051)
    assert run(capsys, "apply", "--root", str(root), "-g", "staff")[0] == 0
    _, _, err = run(capsys, "revert", "--root", str(root), "-g", "ops")
    assert "name gid 5050, which no applied group has" in err
    # said, and left: nothing says whose they are now
    assert (W.GROUP, 5050) in W.entries(W.posix1e.ACL(filedef=str(machine)))


def test_a_refused_write_keeps_the_whole_record(tmp_path, capsys, monkeypatch):
    """A file that inherited staff's default entry, recorded by a later apply of ops:
    its base is rewritten only once the revert of staff wrote it."""
    root, machine = image(tmp_path)
    assert run(capsys, "apply", "--root", str(root), "-g", "staff")[0] == 0
    late = machine / "late.journal"
    late.write_text("x")
    os.chmod(late, 0o640)  # others do not read it: ops needs an entry, and a record
    assert (W.GROUP, 5050) in acl(late)
    assert run(capsys, "apply", "--root", str(root), "-g", "ops")[0] == 0
    real, refused = W.Node.set_attributes, []

    def refuse(node, access, default):
        if node.path.endswith("/late.journal") and not refused:
            refused.append(node.path)
            raise W.AclError(f"cannot set the ACL of {W.shown(node.path)}: refused", "refused")
        return real(node, access, default)

    monkeypatch.setattr(W.Node, "set_attributes", refuse)
    rc, out, _ = run(capsys, "revert", "--root", str(root), "-g", "staff")
    assert rc == 1 and refused
    shown = W.shown(refused[0])
    line = f"not restored: cannot set the ACL of {shown}: refused (its record is kept)"
    assert line in out.splitlines(), out
    assert (W.GROUP, 5050) in acl(late)
    rc, out, err = run(capsys, "revert", "--root", str(root), "-g", "staff")
    assert rc == 0, out + err
    assert (W.GROUP, 5050) not in acl(late)
    assert (W.GROUP, 5060) in acl(late)


def test_apply_killed_halfway_reverts_exactly(tmp_path, capsys):
    """apply records and changes in one walk, each batch's records committed before
    its changes: SIGKILL between two changes leaves no change without its record."""
    import signal

    from debadmin.journal_acl_setup import grant as jgrant

    batch = 64
    root, machine = image(tmp_path)
    for i in range(3 * batch):
        path = machine / f"system@{i:04d}.journal"
        path.write_text("")
        os.chmod(path, 0o600 if i % 2 else 0o640)
    before = tree(root)
    pid = os.fork()
    if pid == 0:  # the child: apply in batches of 64, killed at its 84th change
        try:
            calls = [0]
            real = W.Node.set_attributes

            def set_acls(node, access, default):
                calls[0] += 1
                if calls[0] == batch + 20:
                    os.kill(os.getpid(), signal.SIGKILL)
                return real(node, access, default)

            W.Node.set_attributes = set_acls
            jgrant.batch_size = lambda: batch
            jas.main(["apply", "--root", str(root), "-q", "-g", "staff"])
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    granted = sum("group:5050:r--" in line for line in tree(root)[0].splitlines())
    assert batch <= granted < 2 * batch  # halfway indeed
    rc, out, err = run(capsys, "revert", "--root", str(root), "-g", "staff")
    assert rc == 0, (out, err)
    assert tree(root) == before


def test_batch_size_follows_the_descriptor_limit():
    """The soft descriptor limit is raised (up to the hard one) to make room for a batch."""
    import resource

    from debadmin.journal_acl_setup import grant as jgrant

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (300, hard))
    try:
        room = jgrant.BATCH_MAX + 256
        if hard != resource.RLIM_INFINITY:
            room = min(room, hard)
        assert jgrant.batch_size() == max(16, min(jgrant.BATCH_MAX, room - 256))
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == max(300, room)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
