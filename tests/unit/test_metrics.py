"""debadmin.metrics: every tool's node_exporter textfile in one shape (debadmin(7),
METRICS), written by cli.run() where a run ends, and the example alerting rules of the
Ansible collection under promtool (skipped where prometheus is not installed)."""

import argparse
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from debadmin import cli, metrics
from debadmin.errors import Error
from debadmin.findings import finding
from debadmin.ipv6_ra_forward import main as ipv6
from debadmin.journal_acl_setup import main as jas
from debadmin.netboot_serialize import main as nbs
from debadmin.sbuild_fast import main as sbf
from debadmin.secureboot_ca_check import main as sbc
from test_secureboot_ca_check import ms_variables, write_efivars

SRC = Path(__file__).resolve().parents[2]
RULES = SRC / "ansible" / "examples" / "prometheus"


def parse(text):
    """{(name, frozenset(labels)): value} of a textfile, and the families' HELP/TYPE
    lines; asserts the exposition format's shape as node_exporter reads it."""
    samples, typed = {}, []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            typed.append(line.split()[2])
            assert line.endswith(" gauge")
            continue
        if line.startswith("# HELP "):
            continue
        head, value = line.rsplit(" ", 1)
        name, _, labels = head.partition("{")
        assert name in typed, f"{name} has no TYPE line before its samples"
        pairs = frozenset(tuple(p.split("=", 1)) for p in labels.rstrip("}").split('",') if p)
        pairs = frozenset((k, v.strip('"')) for k, v in pairs)
        samples[(name, pairs)] = float(value)
    assert len(typed) == len(set(typed)), "a family's samples must be together"
    return samples


def namespace(**values):
    return argparse.Namespace(**values)


# --- the textfile ----------------------------------------------------------------------------


def test_render_counts_findings_by_severity_and_names_by_tool():
    found = [
        finding("a", "action", "x"),
        finding("b", "action", "y"),
        finding("c", "warning", "z"),
    ]
    text = metrics.render("journal-acl-setup", "apply", 1, 1700000000.7, found)
    samples = parse(text)
    tool = ("tool", "journal_acl_setup")
    assert samples == {
        ("debadmin_findings", frozenset({tool, ("severity", "action")})): 2,
        ("debadmin_findings", frozenset({tool, ("severity", "warning")})): 1,
        ("debadmin_findings", frozenset({tool, ("severity", "info")})): 0,
        ("debadmin_journal_acl_setup_exit_status", frozenset({("command", "apply")})): 1,
        (
            "debadmin_journal_acl_setup_last_run_timestamp_seconds",
            frozenset({("command", "apply")}),
        ): 1700000000,
    }
    # The shared family's HELP is the same in every tool's file (node_exporter merges
    # a family across files and refuses differing HELP texts).
    other = metrics.render("sbuild-fast", "update", 0, 1, [])
    help_line = f"# HELP debadmin_findings {metrics.FINDINGS_HELP}"
    assert help_line in text.splitlines() and help_line in other.splitlines()


def test_render_tool_gauges_prefixed_and_escaped():
    text = metrics.render(
        "secureboot-ca-check",
        "check",
        0,
        5,
        [],
        [("ca_present", "Whether.", [({"source": 'a"b\\c\nd', "ca": "x"}, 1)])],
    )
    assert 'debadmin_secureboot_ca_check_ca_present{source="a\\"b\\\\c\\nd",ca="x"} 1\n' in text
    assert "# TYPE debadmin_secureboot_ca_check_ca_present gauge\n" in text


def test_gauge_names_are_checked_and_replaced():
    metrics.start()
    with pytest.raises(ValueError):
        metrics.gauge("Bad-Name", "x", [])
    metrics.gauge("n", "first", [({}, 1)])
    metrics.gauge("n", "second", [({}, 2)])
    assert metrics._gauges == [("n", "second", [({}, 2)])]
    metrics.start()
    assert metrics._gauges == [] and metrics._findings == []


# --- when a run writes -----------------------------------------------------------------------


def test_finish_writes_atomically(tmp_path):
    args = namespace(command="apply", metrics=True, dry_run=False)
    metrics.findings([finding("a", "action", "x")])
    path = metrics.finish("journal-acl-setup", args, 1, tmp_path)
    assert path == tmp_path / "debadmin_journal_acl_setup.prom"
    assert os.listdir(tmp_path) == [path.name]  # no temp file left
    assert (path.stat().st_mode & 0o777) == 0o644
    samples = parse(path.read_text())
    key = frozenset({("tool", "journal_acl_setup"), ("severity", "action")})
    assert samples[("debadmin_findings", key)] == 1
    # The run is over: the next one starts with nothing recorded.
    assert metrics._findings == []


@pytest.mark.parametrize(
    "args",
    [
        namespace(command="apply", metrics=True, dry_run=True),
        namespace(command="check", metrics=False),
        namespace(command="check"),
        namespace(command="apply", metrics=lambda a: False),
        None,
    ],
    ids=["dry-run", "declared-false", "undeclared", "function-false", "no-args"],
)
def test_finish_writes_nothing_unless_wanted(tmp_path, args):
    assert metrics.finish("journal-acl-setup", args, 0, tmp_path) is None
    assert os.listdir(tmp_path) == []


def test_finish_quiet_without_the_directory(tmp_path):
    args = namespace(command="apply", metrics=True)
    assert metrics.finish("ipv6-ra-forward", args, 0, tmp_path / "missing") is None
    assert not (tmp_path / "missing").exists()


def test_finish_failure_is_an_error(tmp_path):
    (tmp_path / "debadmin_sbuild_fast.prom").mkdir()  # what rename cannot replace
    with pytest.raises(Error, match="cannot write"):
        metrics.finish("sbuild-fast", namespace(command="update", metrics=True), 0, tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["debadmin_sbuild_fast.prom"]


def toy_parser(func):
    parser = cli.new_parser("toy-tool", "A toy.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("apply")
    p.add_argument("-n", "--dry-run", action="store_true")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=func, metrics=True)
    p = sub.add_parser("check")
    p.set_defaults(func=func)
    return parser


def test_cli_run_records_an_error_exit(no_host_metrics, capsys):
    no_host_metrics.mkdir()

    def fail(args):
        metrics.findings([finding("x", "warning", "half done")])
        raise Error("refused")

    assert cli.run("toy-tool", toy_parser(fail), ["apply"]) == 2
    assert capsys.readouterr().err == "toy-tool: error: refused\n"
    samples = parse((no_host_metrics / "debadmin_toy_tool.prom").read_text())
    assert samples[("debadmin_toy_tool_exit_status", frozenset({("command", "apply")}))] == 2
    key = frozenset({("tool", "toy_tool"), ("severity", "warning")})
    assert samples[("debadmin_findings", key)] == 1


def test_cli_run_dry_run_and_undeclared_write_nothing(no_host_metrics, capsys):
    no_host_metrics.mkdir()
    parser = toy_parser(lambda args: 0)
    assert cli.run("toy-tool", parser, ["apply", "--dry-run"]) == 0
    assert cli.run("toy-tool", parser, ["check"]) == 0
    assert os.listdir(no_host_metrics) == []


def test_cli_run_write_failure_is_a_warning_not_the_exit_status(no_host_metrics, capsys, caplog):
    no_host_metrics.mkdir()
    (no_host_metrics / "debadmin_toy_tool.prom").mkdir()
    assert cli.run("toy-tool", toy_parser(lambda args: 1), ["apply", "--json"]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out) == {"error": "failed: see the message on stderr", "exit_status": 1}
    # On stderr as 'toy-tool: warning: ...' (cli.run's logging); pytest captures it here.
    [record] = caplog.records
    assert record.levelname == "WARNING"
    assert record.getMessage().startswith("warning: metrics not written: cannot write ")


# --- what each tool declares -----------------------------------------------------------------


@pytest.mark.parametrize(
    "parser, argv, command",
    [
        (jas.build_parser, ["apply"], "apply"),
        (jas.build_parser, ["revert"], "revert"),
        (jas.build_parser, ["check"], None),
        (jas.build_parser, ["apply", "--dry-run"], None),
        (jas.build_parser, ["apply", "--root", "/srv/image"], None),
        (sbc.build_parser, [], "check"),
        (sbc.build_parser, ["--efivars", "/srv/efivars"], "check"),
        (sbc.build_parser, ["--fix"], "fix"),
        (sbc.build_parser, ["--fix", "--dry-run"], None),
        (sbc.build_parser, ["--varstore", "vm.fd"], None),
        (sbc.build_parser, ["--fix", "--varstore", "vm.fd"], None),
        (sbc.build_parser, ["--libvirt"], None),
        (ipv6.build_parser, ["enable", "eth0"], "enable"),
        (ipv6.build_parser, ["disable", "eth0"], "disable"),
        (ipv6.build_parser, ["watch", "--once"], "watch"),
        (ipv6.build_parser, ["enable", "--dry-run", "eth0"], None),
        (ipv6.build_parser, ["status"], None),
        (nbs.build_parser, ["tree"], "apply"),
        (nbs.build_parser, ["--check", "tree"], None),
        (nbs.build_parser, ["--dry-run", "tree"], None),
        (sbf.build_parser, ["update"], "update"),
        (sbf.build_parser, ["create", "--dist", "bookworm"], "create"),
        (sbf.build_parser, ["remove", "bookworm"], "remove"),
        (sbf.build_parser, ["update", "--dry-run"], None),
        (sbf.build_parser, ["list"], None),
    ],
)
def test_tools_declare_their_timer_and_changing_commands(parser, argv, command):
    args = parser().parse_args(argv)
    assert metrics.wanted(args) == (command is not None)
    if command:
        assert metrics.command_of(args) == command


def test_secureboot_ca_check_metrics_match_its_report(no_host_metrics, tmp_path, capsys):
    """The timer's run: findings counted as --json lists them, the per-source gauges
    under the debadmin_ names, the old --textfile-dir names still written as before."""
    no_host_metrics.mkdir()
    efivars = write_efivars(tmp_path / "efivars", ms_variables())
    old = tmp_path / "old"
    old.mkdir()
    shim = Path("/nonexistent-shim.efi")
    rc = sbc.main(["--json", "--efivars", str(efivars), "--textfile-dir", str(old)])
    document = json.loads(capsys.readouterr().out)
    assert rc == document["exit_status"] == 1 and not shim.exists()
    samples = parse((no_host_metrics / "debadmin_secureboot_ca_check.prom").read_text())
    for severity in ("action", "warning", "info"):
        key = frozenset({("tool", "secureboot_ca_check"), ("severity", severity)})
        expected = sum(f["severity"] == severity for f in document["findings"])
        assert samples[("debadmin_findings", key)] == expected
    assert (
        samples[("debadmin_secureboot_ca_check_exit_status", frozenset({("command", "check")}))]
        == 1
    )
    source = frozenset({("source", str(efivars))})
    assert samples[("debadmin_secureboot_ca_check_action_needed", source)] == 1
    assert samples[("debadmin_secureboot_ca_check_secure_boot_active", source)] == 1
    assert "secureboot_ca_check_status 1\n" in (old / "secureboot_ca_check.prom").read_text()


# --- the example alerting rules --------------------------------------------------------------

promtool = pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool (Debian's prometheus) is not installed"
)


@promtool
def test_example_rules_check():
    run = subprocess.run(
        ["promtool", "check", "rules", "debadmin-rules.yml"],
        cwd=RULES,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SUCCESS: 4 rules found" in run.stdout


@promtool
def test_example_rules_unit_tests():
    run = subprocess.run(
        ["promtool", "test", "rules", "debadmin-rules.test.yml"],
        cwd=RULES,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SUCCESS" in run.stdout


@promtool
def test_textfile_passes_promtool_lint():
    text = metrics.render(
        "secureboot-ca-check",
        "check",
        1,
        1,
        [finding("a", "action", "x")],
        [("dbx_behind", "Whether.", [({"source": "/x"}, 1)])],
    )
    run = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, text=True
    )
    assert run.returncode == 0 and run.stdout == "" and run.stderr == "", run.stdout + run.stderr
