"""The Ansible collection debadmin.tools (issue 36): documented modules, and the
modules driving the tools of this tree on localhost.

The tests that need ansible-core skip where it is not installed (it is no build
dependency; 'make check-deps' installs it). The modules run the tools of this tree
(lib/, bin/) through small wrappers on PATH, so they test this tree's code.
"""

import ast
import base64
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2]
COLLECTION = SRC / "ansible"
MODULES = sorted(p.stem for p in (COLLECTION / "plugins" / "modules").glob("*.py"))
TOOLS = sorted(p.name for p in (SRC / "bin").iterdir())
OVMF = Path("/usr/share/OVMF/OVMF_VARS_4M.ms.fd")


def module_strings(name):
    tree = ast.parse((COLLECTION / "plugins" / "modules" / f"{name}.py").read_text())
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id in ("DOCUMENTATION", "EXAMPLES", "RETURN"):
                found[node.targets[0].id] = node.value.value
    return found


def argument_spec(name):
    """The keys of the argument_spec=dict(...) the module passes to AnsibleModule."""
    tree = ast.parse((COLLECTION / "plugins" / "modules" / f"{name}.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "argument_spec":
            return {kw.arg: kw.value for kw in node.value.keywords}
    raise AssertionError(f"{name}: no argument_spec")


def test_one_module_per_tool():
    assert MODULES == sorted(tool.replace("-", "_") for tool in TOOLS)


@pytest.mark.parametrize("name", MODULES)
def test_documentation_matches_argument_spec(name):
    yaml = pytest.importorskip("yaml", reason="python3-yaml (comes with ansible-core) missing")
    strings = module_strings(name)
    assert set(strings) == {"DOCUMENTATION", "EXAMPLES", "RETURN"}
    doc = yaml.safe_load(strings["DOCUMENTATION"])
    assert doc["module"] == name
    assert set(doc["options"]) == set(argument_spec(name))
    examples = yaml.safe_load(strings["EXAMPLES"])
    assert any(f"debadmin.tools.{name}" in task for task in examples)
    returned = yaml.safe_load(strings["RETURN"])
    assert "findings" in returned or "chroots" in returned
    # 2.14 shows the newer O()/V()/RV() markup raw: the documentation sticks to C().
    for text in strings.values():
        for markup in ("O(", "V(", "RV("):
            assert f" {markup}" not in text and f"({markup}" not in text, markup


def test_collection_metadata():
    runtime = (COLLECTION / "meta" / "runtime.yml").read_text()
    assert 'requires_ansible: ">=2.14.0"' in runtime
    galaxy = (COLLECTION / "galaxy.yml").read_text()
    assert "namespace: debadmin" in galaxy and "name: tools" in galaxy


def collections_path(tmp_path):
    path = tmp_path / "collections"
    if path.exists():
        return path
    (path / "ansible_collections" / "debadmin").mkdir(parents=True)
    (path / "ansible_collections" / "debadmin" / "tools").symlink_to(COLLECTION)
    return path


def ansible_env(tmp_path):
    if not shutil.which("ansible-playbook", path="/usr/bin"):
        pytest.skip("ansible-core is not installed")
    wrappers = tmp_path / "bin"
    wrappers.mkdir(exist_ok=True)
    for tool in TOOLS:
        wrapper = wrappers / tool
        wrapper.write_text(
            f'#!/bin/sh\nPYTHONPATH={SRC / "lib"} exec {sys.executable} -W error '
            f'{SRC / "bin" / tool} "$@"\n'
        )
        wrapper.chmod(0o755)
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {
        "PATH": f"{wrappers}:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(home),
        "LC_ALL": "C.UTF-8",
        "ANSIBLE_COLLECTIONS_PATH": str(collections_path(tmp_path)),
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp"),
        "ANSIBLE_REMOTE_TEMP": str(tmp_path / "ansible-tmp"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_PYTHON_INTERPRETER": sys.executable,
        "PYTHONDONTWRITEBYTECODE": "1",
    }


@pytest.mark.parametrize("name", MODULES)
def test_ansible_doc_shows_the_module(name, tmp_path):
    env = ansible_env(tmp_path)
    result = subprocess.run(
        ["ansible-doc", f"debadmin.tools.{name}"], env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    # the title: "> DEBADMIN.TOOLS.NAME" (2.14), "> MODULE debadmin.tools.NAME" (2.19)
    title = result.stdout.splitlines()[0].lower()
    assert title.startswith("> ") and f"debadmin.tools.{name}" in title
    assert "EXAMPLES:" in result.stdout and "RETURN VALUES:" in result.stdout


def play(tmp_path, tasks, path_first=None, wrapper=()):
    """Run TASKS on localhost (connection local); the registered result of each task,
    in order (ansible-core has no JSON callback: a last task writes them out).
    path_first: a directory of commands found before the tools of this tree; wrapper:
    a command that runs ansible-playbook (the words after it)."""
    env = ansible_env(tmp_path)
    if path_first:
        env["PATH"] = f"{path_first}:{env['PATH']}"
    results = tmp_path / "results.json"
    registered = []
    for number, task in enumerate(tasks):
        task.update(register=f"r{number}", ignore_errors=True)
        registered.append(f"r{number}")
    tasks.append(
        {
            "ansible.builtin.copy": {
                "content": "{{ [%s] | to_json }}" % ", ".join(registered),
                "dest": str(results),
                "mode": "0600",
            }
        }
    )
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": tasks}])
    )
    result = subprocess.run(
        list(wrapper) + ["ansible-playbook", "-c", "local", "-i", "localhost,", str(playbook)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(results.read_text())


def three_runs(module, args):
    """Check mode with diff, apply, apply again."""
    return [
        {module: args, "check_mode": True, "diff": True},
        {module: args},
        {module: args},
    ]


def test_secureboot_fix_of_a_varstore(tmp_path):
    if not OVMF.is_file():
        pytest.skip(f"{OVMF} missing (package ovmf)")
    store = tmp_path / "VARS.fd"
    shutil.copyfile(OVMF, store)
    args = {
        "varstore": [str(store)],
        "fix": True,
        "payloads": str(SRC / "data" / "secureboot_objects"),
    }
    check, apply, again = play(tmp_path, three_runs("debadmin.tools.secureboot_ca_check", args))
    assert check["changed"] and check["action_needed"], check
    assert "Microsoft UEFI CA 2023" in check["diff"]["prepared"]
    assert apply["changed"] and not apply["action_needed"], apply
    assert apply["verdicts"] == ["ok"]
    assert not again["changed"] and again["verdicts"] == ["ok"], again
    assert len(list(tmp_path.glob("VARS.fd.*.bak"))) == 1


def test_secureboot_check_mode_writes_nothing_and_a_refusal_fails(tmp_path):
    if not OVMF.is_file():
        pytest.skip(f"{OVMF} missing (package ovmf)")
    store = tmp_path / "VARS.fd"
    shutil.copyfile(OVMF, store)
    damaged = tmp_path / "payloads"
    shutil.copytree(SRC / "data" / "secureboot_objects", damaged)
    for der in damaged.rglob("*.der"):
        der.write_bytes(der.read_bytes()[:-1] + b"\0")
    check, refused = play(
        tmp_path,
        [
            {
                "debadmin.tools.secureboot_ca_check": {
                    "varstore": [str(store)],
                    "fix": True,
                    "payloads": str(SRC / "data" / "secureboot_objects"),
                },
                "check_mode": True,
            },
            {
                "debadmin.tools.secureboot_ca_check": {
                    "varstore": [str(store)],
                    "fix": True,
                    "payloads": str(damaged),
                },
            },
        ],
    )
    assert check["changed"]
    assert refused.get("failed") and refused["msg"], refused
    assert store.read_bytes() == OVMF.read_bytes()
    assert not list(tmp_path.glob("VARS.fd.*.bak"))


def test_secureboot_not_applicable_is_ok(tmp_path):
    efivars = tmp_path / "efivars"
    efivars.mkdir()
    (result,) = play(tmp_path, [{"debadmin.tools.secureboot_ca_check": {"root": str(tmp_path)}}])
    assert not result.get("failed"), result
    assert result["not_applicable"] and result["reason"], result


def test_netboot_serialize_tree(tmp_path):
    trees = sorted(Path("/usr/lib/debian-installer/images").glob("*/amd64/text"))
    if not trees:
        pytest.skip("no installer netboot tree (debian-installer-12-netboot-amd64)")
    tree = tmp_path / "tftp"
    shutil.copytree(trees[0], tree, symlinks=True)
    before = {p: p.read_bytes() for p in tree.rglob("*.cfg") if p.is_file() and not p.is_symlink()}
    check, apply, again = play(
        tmp_path, three_runs("debadmin.tools.netboot_serialize", {"src": str(tree), "timeout": 5})
    )
    assert check["changed"] and "console=ttyS0" in check["diff"]["prepared"], check
    assert apply["changed"] and apply["report"]["written"], apply
    assert not again["changed"], again
    after = {p: p.read_bytes() for p in before}
    assert after != before
    (bad,) = play(
        tmp_path,
        [{"debadmin.tools.netboot_serialize": {"src": str(tmp_path / "play.yml")}}],
    )
    assert bad["failed"] and "tar" in bad["msg"], bad


def journal_image(tmp_path):
    """A system image for journal-acl-setup --root: the host's users and groups, a
    journald, a journal with one file."""
    if os.geteuid() != 0:
        pytest.skip("journal-acl-setup apply changes owners: needs root")
    if not shutil.which("getfacl"):
        pytest.skip("getfacl missing (package acl)")
    root = tmp_path / "image"
    (root / "etc").mkdir(parents=True)
    shutil.copyfile("/etc/group", root / "etc" / "group")
    shutil.copyfile("/etc/passwd", root / "etc" / "passwd")
    if "systemd-journal:" not in (root / "etc" / "group").read_text():
        pytest.skip("no systemd-journal group on this host")
    (root / "usr" / "lib" / "systemd").mkdir(parents=True)
    (root / "usr" / "lib" / "systemd" / "systemd-journald").touch()
    (root / "var" / "log" / "journal" / "0123").mkdir(parents=True)
    (root / "var" / "log" / "journal" / "0123" / "system.journal").write_bytes(b"x")
    return root


def acls(root):
    return subprocess.run(
        ["getfacl", "-R", "-p", str(root / "var" / "log")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def test_journal_acl_setup_on_an_image(tmp_path):
    root = journal_image(tmp_path)
    before = acls(root)
    check, apply, again = play(
        tmp_path, three_runs("debadmin.tools.journal_acl_setup", {"root": str(root)})
    )
    assert check["changed"] and check["changes"][0].startswith("would "), check
    assert apply["changed"] and not apply["action_needed"], apply
    assert not again["changed"] and again["findings"] == [], again
    assert acls(root) != before


def test_journal_acl_setup_strip_without_the_record(tmp_path):
    """state=absent with strip: revert --strip where apply's record is gone."""
    root = journal_image(tmp_path)
    if "\nstaff:" not in "\n" + (root / "etc" / "group").read_text():
        pytest.skip("no group staff on this host")
    group = {"root": str(root), "groups": ["staff"]}
    (applied,) = play(tmp_path, [{"debadmin.tools.journal_acl_setup": group}])
    assert applied["changed"] and "group:staff:" in acls(root), applied
    shutil.rmtree(root / "var" / "lib" / "journal-acl-setup")
    granted = acls(root)
    revert = dict(group, state="absent")
    strip = dict(revert, strip=True)
    refused, wrong, check, apply, again = play(
        tmp_path,
        [{"debadmin.tools.journal_acl_setup": revert}]
        + [{"debadmin.tools.journal_acl_setup": dict(group, strip=True)}]
        + three_runs("debadmin.tools.journal_acl_setup", strip),
    )
    # Without strip the tool refuses (exit 2) and says what --strip would do.
    assert refused["failed"] and "--strip" in refused["msg"], refused
    assert wrong["failed"] and wrong["msg"] == "strip goes with state=absent only", wrong
    assert check["changed"] and check["changes"][0].startswith("would "), check
    assert "journal-acl-setup revert:" in check["diff"]["prepared"], check
    assert apply["changed"] and apply["changes"], apply
    assert not again["changed"] and again["changes"] == [], again
    after = acls(root)
    assert after != granted and "group:staff:" not in after


def test_ipv6_ra_forward_not_uplinks_in_a_network_namespace(tmp_path):
    """enable with not_uplinks, in a network and mount namespace of its own (a veth pair,
    /etc/default, /etc/sysctl.d and /run private): check mode, apply, apply again."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        pytest.skip("needs root, unshare and ip for a network namespace")
    # A container without CAP_NET_ADMIN (systemd-nspawn sharing the host's network, as
    # the trixie stage runs the unit tests) can make the namespace but no link in it.
    probe = subprocess.run(
        ["unshare", "--net", "--mount", "ip", "link", "add", "p0", "type", "veth", "peer", "p1"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        pytest.skip("no network namespace with links here: " + probe.stderr.strip())
    defaults = tmp_path / "default"
    defaults.mkdir()
    args = {"uplinks": ["up0"], "not_uplinks": ["lan0"]}
    tasks = three_runs("debadmin.tools.ipv6_ra_forward", args)
    tasks.append({"debadmin.tools.ipv6_ra_forward": dict(args, state="absent")})
    tasks.append({"ansible.builtin.slurp": {"src": "/etc/default/ipv6-ra-forward"}})
    script = (
        "set -e; mount --make-rprivate /; mount -t sysfs sysfs /sys; "
        "mount -t tmpfs tmpfs /run; mount -t tmpfs tmpfs /etc/sysctl.d; "
        'mount --bind "$1" /etc/default; shift; '
        "ip link add up0 type veth peer name lan0; ip link set up0 up; ip link set lan0 up; "
        'exec "$@"'
    )
    wrapper = ["unshare", "--net", "--mount", "--fork", "sh", "-c", script, "sh", str(defaults)]
    check, apply, again, wrong, slurped = play(tmp_path, tasks, wrapper=wrapper)
    assert check["changed"], check
    assert any("NOT_UPLINKS" in line for line in check["changes"]), check
    assert "ipv6-ra-forward enable:" in check["diff"]["prepared"], check
    assert apply["changed"] and apply["report"]["forwarding"], apply
    assert apply["report"]["not_uplinks"] == ["lan0"], apply
    assert not again["changed"] and again["changes"] == [], again
    assert wrong["failed"] and wrong["msg"] == "not_uplinks goes with state=present only"
    assert 'NOT_UPLINKS="lan0"' in base64.b64decode(slurped["content"]).decode()
    assert not list(defaults.glob("*.*")), "a temporary file left"


def test_sbuild_fast_chroot_present_and_absent(tmp_path):
    """The real sbuild-fast of this tree: check mode of a create builds nothing; a chroot
    it recorded (an empty tarball and its record, as create leaves them) is kept by
    state=present, and removed by state=absent, once."""
    if not shutil.which("mmdebstrap"):
        pytest.skip("mmdebstrap is not installed")
    import pwd

    user = pwd.getpwuid(os.geteuid()).pw_name
    try:
        subuid = Path("/etc/subuid").read_text(encoding="utf-8")
    except OSError:
        subuid = ""
    if not any(line.split(":")[0] in (user, str(os.geteuid())) for line in subuid.splitlines()):
        # sbuild-fast create refuses, rightly: sbuild's unshare mode cannot run.
        pytest.skip(f"no subordinate ids for {user} in /etc/subuid")
    arch = subprocess.run(
        ["dpkg", "--print-architecture"], capture_output=True, text=True, check=True
    ).stdout.strip()
    cache = tmp_path / "home" / ".cache" / "sbuild"
    tarball = cache / f"bookworm-{arch}.tar"
    record = {
        "name": f"bookworm-{arch}",
        "dist": "bookworm",
        "arch": arch,
        "mode": "unshare",
        "path": str(tarball),
        "created": 1700000000,
        "version": "0.5.0",
    }
    chroot = {"dist": "bookworm", "arch": arch}
    module = "debadmin.tools.sbuild_fast"
    tasks = [
        {module: chroot, "check_mode": True, "diff": True},
        {"ansible.builtin.file": {"path": str(cache / ".sbuild-fast"), "state": "directory"}},
        {"ansible.builtin.copy": {"content": "", "dest": str(tarball), "mode": "0644"}},
        {
            "ansible.builtin.copy": {
                "content": json.dumps(record),
                "dest": str(cache / ".sbuild-fast" / f"bookworm-{arch}.json"),
                "mode": "0644",
            }
        },
        {module: chroot},
    ] + three_runs(module, dict(chroot, state="absent"))
    # doctor removes leftovers of killed builds (of every build of this user, root here):
    # only ever in check mode, as a dry run where this tree's tool has one.
    tasks.append({module: {"doctor": True}, "check_mode": True})
    created, _, _, _, present, check, removed, again, doctor = play(tmp_path, tasks)
    usage = subprocess.run(
        [str(tmp_path / "bin" / "sbuild-fast"), "doctor", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    if "--dry-run" in usage:
        assert doctor["doctor"]["dry_run"] is True and "findings" in doctor, doctor
    else:
        assert "doctor" not in doctor and doctor["warnings"], doctor
    assert not created.get("failed") and created["changed"], created
    assert created["changes"][0].startswith("would run: mmdebstrap "), created
    assert "would write " + str(tarball) in created["diff"]["prepared"], created
    assert created["chroots"] == [], created
    assert not present.get("failed") and not present["changed"], present
    assert [c["name"] for c in present["chroots"]] == [f"bookworm-{arch}"], present
    assert check["changed"] and f"would remove {tarball}" in check["changes"], check
    assert removed["changed"] and removed["chroots"] == [], removed
    assert not again["changed"] and not again.get("failed"), again
    assert not tarball.exists() and not (cache / ".sbuild-fast" / f"bookworm-{arch}.json").exists()


def test_sbuild_fast_doctor_in_check_mode_is_a_dry_run(tmp_path):
    """doctor removes leftovers: check mode passes --dry-run (argv of a stand-in tool),
    and where the tool has no doctor --dry-run doctor is not run at all."""
    argv_log = tmp_path / "argv"
    doctor_json = json.dumps({"findings": [{"code": "x", "severity": "info"}], "dry_run": True})
    stand_in = tmp_path / "stand-in" / "sbuild-fast"
    stand_in.parent.mkdir()

    def write_stand_in(knows_dry_run):
        refuse = (
            ""
            if knows_dry_run
            else 'case "$*" in *--dry-run*) echo "sbuild-fast: error: unrecognized '
            'arguments: --dry-run" >&2; exit 2;; esac\n'
        )
        stand_in.write_text(
            f'#!/bin/sh\necho "$*" >> {argv_log}\n{refuse}'
            f'case "$1" in list) echo \'{{"chroots": [], "caches": []}}\';;\n'
            f"doctor) echo '{doctor_json}';; esac\n"
        )
        stand_in.chmod(0o755)

    write_stand_in(True)
    module = "debadmin.tools.sbuild_fast"
    check, real = play(
        tmp_path,
        [{module: {"doctor": True}, "check_mode": True}, {module: {"doctor": True}}],
        path_first=stand_in.parent,
    )
    assert argv_log.read_text().splitlines() == [
        "list --json",
        "list --json",
        "doctor --json --dry-run",
        "list --json",
        "list --json",
        "doctor --json",
    ]
    assert check["findings"] == [{"code": "x", "severity": "info"}], check
    assert check["doctor"]["dry_run"] and not check["changed"], check
    assert real["findings"] == check["findings"], real
    argv_log.unlink()
    write_stand_in(False)
    (old,) = play(
        tmp_path, [{module: {"doctor": True}, "check_mode": True}], path_first=stand_in.parent
    )
    assert not old.get("failed") and "doctor" not in old, old
    assert any("no 'doctor --dry-run'" in w for w in old["warnings"]), old
    assert "doctor --json\n" not in argv_log.read_text()


def test_rollout_stops_at_the_first_refused_host(tmp_path):
    """The collection's playbook on three local 'hosts', one OVMF store each, serial 1:
    the first is fixed, the second's fix is refused (a damaged payload tree), and the
    third is left untouched; a fourth where the check does not apply is reported ok."""
    if not OVMF.is_file():
        pytest.skip(f"{OVMF} missing (package ovmf)")
    env = ansible_env(tmp_path)
    damaged = tmp_path / "damaged"
    shutil.copytree(SRC / "data" / "secureboot_objects", damaged)
    for der in damaged.rglob("*.der"):
        der.write_bytes(der.read_bytes()[:-1] + b"\0")
    good = SRC / "data" / "secureboot_objects"
    hosts = []
    for name, payloads in (("host1", good), ("host2", damaged), ("host3", good)):
        shutil.copyfile(OVMF, tmp_path / f"{name}.fd")
        hosts.append(
            f"{name} ansible_connection=local secureboot_rollover_payloads={payloads} "
            f"""secureboot_rollover_varstores='["{tmp_path / name}.fd"]'"""
        )
    # Secure Boot off in the store: not applicable (exit 3), reported, not failed.
    shutil.copyfile(OVMF.with_name("OVMF_VARS_4M.fd"), tmp_path / "host0.fd")
    hosts.insert(
        0,
        f"host0 ansible_connection=local "
        f"""secureboot_rollover_varstores='["{tmp_path / 'host0'}.fd"]'""",
    )
    inventory = tmp_path / "inventory.ini"
    inventory.write_text("\n".join(hosts) + "\n")
    env["ANSIBLE_PYTHON_INTERPRETER"] = sys.executable
    result = subprocess.run(
        [
            "ansible-playbook",
            "-i",
            str(inventory),
            "-e",
            "ansible_become=false",
            "debadmin.tools.secureboot_rollover",
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0, result.stdout
    assert "fatal: [host2]" in result.stdout, result.stdout
    out = result.stdout
    assert (
        "not applicable: secureboot-ca-check: not applicable (verdict: not-applicable)" in out
    ), out
    assert (tmp_path / "host1.fd").read_bytes() != OVMF.read_bytes()
    assert len(list(tmp_path.glob("host1.fd.*.bak"))) == 1
    assert (tmp_path / "host2.fd").read_bytes() == OVMF.read_bytes(), "refused, yet written"
    assert (tmp_path / "host3.fd").read_bytes() == OVMF.read_bytes(), "rollout went on"
    # The batches never reached host3 (the recap lists it, from the report play).
    batches = out.split("Secure Boot CA rollover in batches", 1)[1].split("PLAY RECAP")[0]
    assert "[host3]" not in batches, out
    assert "[host0]" in batches and "[host1]" in batches and "[host2]" in batches, out


def test_ansible_lint_production_profile(tmp_path):
    # Debian's ansible-lint on the collection as installed: roles, playbooks, metadata.
    if not shutil.which("ansible-lint", path="/usr/bin"):
        pytest.skip("ansible-lint is not installed")
    env = ansible_env(tmp_path)
    tree = tmp_path / "lint" / "ansible_collections" / "debadmin" / "tools"
    shutil.copytree(COLLECTION, tree)
    env["ANSIBLE_COLLECTIONS_PATH"] = str(tmp_path / "lint")
    result = subprocess.run(
        ["ansible-lint", "--offline", "-p", "--nocolor"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Passed with production profile" in result.stdout + result.stderr
