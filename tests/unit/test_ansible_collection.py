"""The Ansible collection debadmin.tools (issue 36): documented modules, and the
modules driving the tools of this tree on localhost.

The tests that need ansible-core skip where it is not installed (it is no build
dependency; 'make check-deps' installs it). The modules run the tools of this tree
(lib/, bin/) through small wrappers on PATH, so they test this tree's code.
"""

import ast
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


def play(tmp_path, tasks):
    """Run TASKS on localhost (connection local); the registered result of each task,
    in order (ansible-core has no JSON callback: a last task writes them out)."""
    env = ansible_env(tmp_path)
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
        ["ansible-playbook", "-c", "local", "-i", "localhost,", str(playbook)],
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


def test_journal_acl_setup_on_an_image(tmp_path):
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

    def acls():
        return subprocess.run(
            ["getfacl", "-R", "-p", str(root / "var")], capture_output=True, text=True, check=True
        ).stdout

    before = acls()
    check, apply, again = play(
        tmp_path, three_runs("debadmin.tools.journal_acl_setup", {"root": str(root)})
    )
    assert check["changed"] and check["changes"][0].startswith("would "), check
    assert apply["changed"] and not apply["action_needed"], apply
    assert not again["changed"] and again["findings"] == [], again
    assert acls() != before


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
