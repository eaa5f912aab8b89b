"""Unit tests for ipv6-ra-forward: names, the drop-in, status, enable/disable order, owners."""

import json
import os
import shutil
import signal
import struct
from pathlib import Path

import pytest

from debadmin.errors import Error
from debadmin.ipv6_ra_forward import main, managers, plan, solicit, stack, status, sysctls, watch
from debadmin.ipv6_ra_forward import owner as owners

MODULES = (main, plan, watch, status, stack, solicit, managers, sysctls, owners)


class _Tool:
    """The tool's modules as one namespace: raf.NAME is NAME wherever it is defined."""

    def __getattr__(self, name):
        for module in MODULES:
            if hasattr(module, name):
                return getattr(module, name)
        raise AttributeError(name)


raf = _Tool()


def patch(monkeypatch, name, value):
    """Replace NAME in every module that holds it (where it is defined and where it is
    imported), so that the modules calling it get the stand-in."""
    found = [m for m in MODULES if hasattr(m, name)]
    assert found, name
    for module in found:
        monkeypatch.setattr(module, name, value)


SRC = Path(__file__).resolve().parents[2]
DATA = SRC / "tests" / "data" / "ipv6-ra-forward"


class FixtureRoot(type(Path())):
    """A path that can carry the solicitations recorded by the host fixture."""


def make_root(tmp_path, interfaces=None, forwarding=0, default_accept_ra=1, fixture=None):
    """A tree with a fake /proc/sys/net/ipv6/conf: {name: (forwarding, accept_ra)}."""
    root = tmp_path / "root"
    if fixture:
        shutil.copytree(DATA / fixture, root)
    conf = root / raf.CONF_DIR
    values = {"all": (forwarding, 1), "default": (forwarding, default_accept_ra)}
    values.update(interfaces if interfaces is not None else {"eth0": (forwarding, 1)})
    for name, (fwd, accept_ra) in values.items():
        (conf / name).mkdir(parents=True, exist_ok=True)
        (conf / name / "forwarding").write_text(f"{fwd}\n")
        (conf / name / "accept_ra").write_text(f"{accept_ra}\n")
    (root / "etc/sysctl.d").mkdir(parents=True, exist_ok=True)
    (root / "run/lock").mkdir(parents=True, exist_ok=True)
    return root


def sysctl(root, name, key):
    return int((root / raf.CONF_DIR / name / key).read_text())


@pytest.fixture(autouse=True)
def nothing_learned_elsewhere(monkeypatch):
    """enable asks 'ip' what the other interfaces learned: never this machine's answer."""
    no_ra_learned(monkeypatch)


@pytest.fixture
def host(tmp_path, monkeypatch):
    """ROOT pointed at a fixture tree; solicitations recorded, not sent."""
    root = make_root(tmp_path, {"eth0": (0, 1), "eth0.100": (0, 1), "lan0": (0, 1)})
    root = FixtureRoot(root)
    patch(monkeypatch, "ROOT", root)
    sent = []
    patch(monkeypatch, "solicit", lambda name: sent.append(name) or True)
    root.sent = sent
    no_ra_learned(monkeypatch)
    return root


def no_ra_learned(monkeypatch, addr=(), route=()):
    """What 'ip' shows enable about the other interfaces: nothing learned, unless given."""
    patch(monkeypatch, "ra_learned", lambda: (list(addr), list(route)))


# --- names ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["eth0", "eth0.100", "enp1s0f1", "wan_1", "br-lan", "a", "x" * 15, "veth@1", "ab"]
)
def test_good_names(name):
    assert raf.validate_ifname(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "x" * 16,
        ".",
        "..",
        "eth0/1",
        "a b",
        "a\tb",
        "a\nb",
        "-rf",
        ".hidden",
        "a;b",
        "$(id)",
        "`id`",
        "a:1",
        "all",
        "default",
        "ethé0",
        "é" * 8,
        "a|b",
        "a'b",
        "*",
    ],
)
def test_bad_names(name):
    with pytest.raises(Error, match="invalid interface name"):
        raf.validate_ifname(name)


@pytest.mark.parametrize(
    "pattern,ok",
    [
        ("en*", True),
        ("eth[01]", True),
        ("wan?", True),
        ("eth0.100", True),
        ("en* x", False),
        ("$(id)*", False),
        ("all", False),
        ("../*", False),
        ("a/b", False),
    ],
)
def test_patterns(pattern, ok):
    if ok:
        assert raf.validate_pattern(pattern) == pattern
    else:
        with pytest.raises(Error):
            raf.validate_pattern(pattern)


def test_sysctl_key_swaps_dots():
    assert raf.sysctl_key("eth0.100", "accept_ra") == "net.ipv6.conf.eth0/100.accept_ra"
    assert raf.parse_sysctl_key("net.ipv6.conf.eth0/100.accept_ra") == ("eth0.100", "accept_ra")
    with pytest.raises(ValueError):
        raf.parse_sysctl_key("net.ipv4.ip_forward")


# --- the drop-in ----------------------------------------------------------------------------


def test_dropin_round_trip_and_order():
    state = raf.Persisted(["wan0", "eth0.100"], True, {"eth0.100": 1, "wan0": 0}, 0)
    text = state.render()
    keys = [line.split(" = ")[0] for line in text.splitlines() if not line.startswith("#")]
    assert keys == [
        "net.ipv6.conf.eth0/100.accept_ra",
        "net.ipv6.conf.wan0.accept_ra",
        "net.ipv6.conf.all.forwarding",
    ]
    assert raf.parse_dropin(text) == raf.Persisted(
        ["eth0.100", "wan0"], True, {"eth0.100": 1, "wan0": 0}, 0
    )


@pytest.mark.parametrize(
    "line",
    [
        "net.ipv4.ip_forward = 1",
        "net.ipv6.conf.eth0.accept_ra = 1",
        "net.ipv6.conf.all.forwarding = 0",
        "garbage",
        "net.ipv6.conf.a;b.accept_ra = 2",
    ],
)
def test_dropin_refuses_foreign_lines(line):
    with pytest.raises(Error, match="not a line ipv6-ra-forward wrote"):
        raf.parse_dropin(f"# comment\n{line}\n")


def test_enable_refuses_a_foreign_dropin(host, capsys):
    path = host / raf.DROPIN
    shutil.copy(DATA / "dropin-foreign.conf", path)
    before = path.read_text()
    assert raf.main(["enable", "eth0"]) == 2
    assert "dropin-foreign" not in capsys.readouterr().err
    assert path.read_text() == before
    assert sysctl(host, "eth0", "accept_ra") == 1 and sysctl(host, "all", "forwarding") == 0


# --- configuration --------------------------------------------------------------------------


def test_read_config(tmp_path):
    path = tmp_path / "conf"
    assert raf.read_config(tmp_path, path) == raf.Config([], True)
    path.write_text('# c\nUPLINKS="en* wan0"  # trailing\nFORWARDING=no\n')
    assert raf.read_config(tmp_path, path) == raf.Config(["en*", "wan0"], False)
    for bad in (
        'UPLINKS="en*\n',
        "UPLINKS='$(reboot)'\n",
        "FORWARDING=maybe\n",
        "OTHER=1\n",
        "UPLINKS=a/b\n",
    ):
        path.write_text(bad)
        with pytest.raises(Error):
            raf.read_config(tmp_path, path)


# --- status ---------------------------------------------------------------------------------


def ip_fixtures():
    return (
        json.loads((DATA / "ip-addr.json").read_text()),
        json.loads((DATA / "ip-route.json").read_text()),
    )


def addr_link(name, *infos):
    return {"ifname": name, "addr_info": [dict(family="inet6", **i) for i in infos]}


# As bookworm's iproute2 6.1 prints them (no "protocol"), taken in a namespace: a SLAAC
# address from radvd, and one added by 'ip -6 addr add ... valid_lft 3600'.
SLAAC = dict(local="2001:db8:1::5", prefixlen=64, scope="global", dynamic=True, mngtmpaddr=True)
LIFETIME = dict(local="2001:db8:99::9", prefixlen=128, scope="global", dynamic=True)
LINK_LOCAL = dict(local="fe80::1", prefixlen=64, scope="link")


def test_ra_addresses_and_routes():
    addr, route = ip_fixtures()
    # A tagged dump (one address says "protocol"): only kernel_ra counts there.
    assert raf.ra_addresses(addr) == {"eth0.100": ["2001:db8:2::5/64"]}
    routes = raf.ra_routes(route)
    assert routes["up0"] == [
        {"gateway": "fe80::9065:2fff:fe35:71d8", "metric": 1024, "expires": 1798}
    ]
    assert [r["gateway"] for r in routes["eth0.100"]] == ["fe80::1", "fe80::2"]


def test_ra_addresses_need_more_than_a_lifetime():
    untagged = [addr_link("up0", SLAAC, LINK_LOCAL), addr_link("lan0", LIFETIME, LINK_LOCAL)]
    assert raf.ra_addresses(untagged) == {"up0": ["2001:db8:1::5/64"]}
    temporary = dict(SLAAC, local="2001:db8:1::77", mngtmpaddr=False, temporary=True)
    assert raf.ra_addresses([addr_link("up0", temporary)]) == {"up0": ["2001:db8:1::77/64"]}
    # Linux >= 5.18 with a newer iproute2: the kernel's own tag decides.
    tagged = [
        addr_link(
            "up0", dict(SLAAC, protocol="kernel_ra"), dict(LINK_LOCAL, protocol="kernel_ll")
        ),
        addr_link("lan0", dict(LIFETIME, mngtmpaddr=True)),
    ]
    assert raf.ra_addresses(tagged) == {"up0": ["2001:db8:1::5/64"]}


@pytest.mark.parametrize(
    "accept_ra,forwarding,accepted",
    [(0, 0, False), (1, 0, True), (2, 0, True), (3, 0, True), (-1, 0, True)]
    + [(0, 1, False), (1, 1, False), (2, 1, True), (3, 1, False), (-1, 1, False)],
)
def test_accepts_ra_as_the_kernel(accept_ra, forwarding, accepted):
    # ipv6_accept_ra(): forwarding ? accept_ra == 2 : accept_ra != 0
    assert raf.accepts_ra(accept_ra, forwarding) is accepted


def test_status_odd_accept_ra_values(tmp_path):
    root = make_root(tmp_path, {"up3": (1, 3), "upm": (0, -1)}, forwarding=1)
    report = raf.collect_status(root, ["up3", "upm"], [], [], [], raf.Config(), None)
    kinds = {p["subject"]: (p["code"], p["message"]) for p in report["findings"]}
    assert kinds["up3"][0] == "ra-ignored" and "accept_ra=3" in kinds["up3"][1]
    assert "upm" not in kinds  # -1 without forwarding: the kernel accepts RAs


def test_status_explains_the_problem(tmp_path):
    root = make_root(
        tmp_path,
        {
            "up0": (1, 1),
            "eth0.100": (1, 2),
            "lo": (1, 1),
            "virbr0": (1, 0),
            "wan1": (1, 1),
            "vnet3": (1, 1),
        },
        forwarding=1,
    )
    addr, route = ip_fixtures()
    neigh = json.loads((DATA / "ip-neigh.json").read_text())
    report = raf.collect_status(root, [], addr, route, neigh, raf.Config(), None)
    assert not report["ok"] and report["forwarding"]
    messages = {p["subject"]: p["message"] for p in report["findings"]}
    assert messages["up0"] == (
        "forwarding is on and up0 has accept_ra=1: its RA default " "route will be dropped"
    )
    assert "will be lost" not in messages["eth0.100"]
    assert "neither" in messages["eth0.100"]  # accept_ra=2 only at runtime
    assert "virbr0" not in messages and "lo" not in messages  # not uplinks
    assert "vnet3" not in messages  # a plain neighbour, no router
    # No route, no address left: a router's neighbour entry alone makes no uplink (issue
    # 35: it outlives routes, and a trunk that ignores RAs keeps one for ever).
    severities = {p["subject"]: p["severity"] for p in report["findings"]}
    assert severities["wan1"] == "warning" and "add it to NOT_UPLINKS" in messages["wan1"]
    assert messages["wan1"].startswith("a router was seen on wan1, whose RAs the kernel ignores")
    wan1 = [i for i in report["interfaces"] if i["name"] == "wan1"][0]
    assert wan1["router_seen"] and not wan1["uplink"] and wan1["not_uplink"] is None
    # Named, it is looked at: then the kernel ignoring its RAs is the finding.
    named = raf.collect_status(root, ["wan1"], addr, route, neigh, raf.Config(), None)
    assert [f["message"] for f in named["findings"]] == [
        "forwarding is on and wan1 has accept_ra=1: router "
        "advertisements are ignored, it has no RA default route"
    ]
    up0 = [i for i in report["interfaces"] if i["name"] == "up0"][0]
    assert up0["accepts_ra"] is False and up0["uplink"] and up0["managed_by"] == "none"
    persisted = raf.Persisted(["eth0.100"], True)
    report = raf.collect_status(root, ["eth0.100"], addr, route, [], raf.Config(), persisted)
    assert report["ok"] and report["interfaces"][0]["persisted"]


def test_status_cli_json(host, monkeypatch, capsys):
    addr, route = ip_fixtures()
    patch(
        monkeypatch,
        "ip_json",
        lambda argv: addr if "addr" in argv else route if "route" in argv else [],
    )
    (host / raf.CONF_DIR / "all/forwarding").write_text("1\n")
    (host / raf.CONF_DIR / "eth0/forwarding").write_text("1\n")
    assert raf.main(["status", "--json", "eth0"]) == 1
    report = json.loads(capsys.readouterr().out)
    f = report["findings"][0]
    assert list(f)[:4] == ["code", "severity", "subject", "message"]
    assert (f["code"], f["severity"], f["subject"]) == ("ra-ignored", "action", "eth0")
    assert raf.main(["status", "nosuch0"]) == 2
    assert "no IPv6 interface nosuch0" in capsys.readouterr().err


# --- enable and disable ---------------------------------------------------------------------


def test_enable_order_persist_and_idempotence(host, capsys, monkeypatch):
    order = []
    real_write = raf.write_sysctl
    patch(
        monkeypatch,
        "write_sysctl",
        lambda root, n, k, v: order.append((n, k, v)) or real_write(root, n, k, v),
    )
    patch(monkeypatch, "solicit", lambda name: order.append(("solicit", name)))
    assert raf.main(["enable", "eth0.100", "eth0"]) == 0
    assert order == [
        ("eth0.100", "accept_ra", 2),
        ("eth0", "accept_ra", 2),
        ("all", "forwarding", 1),
        ("solicit", "eth0.100"),
        ("solicit", "eth0"),
    ]
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("done: write ")  # the file first: /etc read-only
    text = (host / raf.DROPIN).read_text()
    assert "net.ipv6.conf.eth0/100.accept_ra = 2\n" in text
    assert text.index("accept_ra = 2") < text.index("all.forwarding = 1")
    assert "# saved: all forwarding=0\n" in text and "# saved: eth0 accept_ra=1\n" in text
    assert sysctl(host, "lan0", "accept_ra") == 1
    assert not list((host / "etc/sysctl.d").glob(".*tmp"))
    order.clear()
    assert raf.main(["enable", "eth0"]) == 0
    assert capsys.readouterr().out == "nothing to change\n" and order == []


def test_lock_lives_where_only_root_writes(host):
    # /run/lock is world-writable: a user could create the lock file there and hold it.
    assert raf.main(["enable", "eth0"]) == 0
    assert (host / "run/ipv6-ra-forward.lock").is_file()
    assert not list((host / "run/lock").iterdir())


def test_enable_dry_run_changes_nothing(host, capsys):
    assert raf.main(["enable", "--dry-run", "eth0"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1:] == [
        "would set net.ipv6.conf.eth0.accept_ra=2 (was 1)",
        "would set net.ipv6.conf.all.forwarding=1 (was 0)",
        "would send a router solicitation on eth0",
    ]
    assert not (host / raf.DROPIN).exists() and host.sent == []
    assert sysctl(host, "eth0", "accept_ra") == 1


def test_enable_no_forwarding_no_persist(host):
    assert raf.main(["enable", "--no-forwarding", "--no-persist", "eth0"]) == 0
    assert sysctl(host, "eth0", "accept_ra") == 2 and sysctl(host, "all", "forwarding") == 0
    assert not (host / raf.DROPIN).exists() and host.sent == ["eth0"]


@pytest.mark.parametrize("bad", ["eth0;reboot", "$(reboot)", "-x", "nosuch0", "a/b", "x" * 16])
def test_enable_refuses_before_anything(host, capsys, bad):
    assert raf.main(["enable", "--", "eth0", bad]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ipv6-ra-forward: error: ")
    assert sysctl(host, "eth0", "accept_ra") == 1 and sysctl(host, "all", "forwarding") == 0
    assert not (host / raf.DROPIN).exists() and host.sent == []


def test_enable_fails_cleanly_on_read_only_etc(host, capsys):
    (host / "etc/sysctl.d").rmdir()
    assert raf.main(["enable", "eth0"]) == 2
    assert "cannot write" in capsys.readouterr().err
    assert sysctl(host, "eth0", "accept_ra") == 1 and sysctl(host, "all", "forwarding") == 0


def test_disable_restores(host, capsys):
    (host / raf.CONF_DIR / "eth0/accept_ra").write_text("0\n")
    assert raf.main(["enable", "eth0", "eth0.100"]) == 0
    assert raf.main(["disable", "eth0"]) == 0
    assert sysctl(host, "eth0", "accept_ra") == 0  # the saved value
    assert sysctl(host, "all", "forwarding") == 1  # eth0.100 still needs it
    assert raf.parse_dropin((host / raf.DROPIN).read_text()).uplinks == ["eth0.100"]
    assert raf.main(["disable", "eth0.100"]) == 0
    assert sysctl(host, "eth0.100", "accept_ra") == 1
    assert sysctl(host, "all", "forwarding") == 0  # enable had turned it on
    assert not (host / raf.DROPIN).exists()
    capsys.readouterr()
    assert raf.main(["disable", "eth0.100"]) == 0
    assert capsys.readouterr().out == "nothing to change\n"


def test_disable_leaves_forwarding_it_found_on(host):
    (host / raf.CONF_DIR / "all/forwarding").write_text("1\n")
    assert raf.main(["enable", "eth0"]) == 0
    assert raf.main(["disable", "eth0"]) == 0
    assert sysctl(host, "all", "forwarding") == 1 and sysctl(host, "eth0", "accept_ra") == 1


def test_disable_keeps_accept_ra_enable_found_at_2(host, capsys):
    # ifupdown's inet6 auto had set 2, forwarding was on: enable changes nothing at runtime.
    (host / raf.CONF_DIR / "all/forwarding").write_text("1\n")
    (host / raf.CONF_DIR / "eth0/accept_ra").write_text("2\n")
    assert raf.main(["enable", "eth0"]) == 0
    assert "# saved: eth0 accept_ra=2\n" in (host / raf.DROPIN).read_text()
    assert raf.main(["disable", "eth0"]) == 0
    assert "accept_ra=" not in capsys.readouterr().out
    assert sysctl(host, "eth0", "accept_ra") == 2 and sysctl(host, "all", "forwarding") == 1
    # A drop-in of the earlier version named eth0 with no saved line: 2 is left alone too.
    (host / raf.DROPIN).write_text(raf.Persisted(["eth0"], True).render())
    assert raf.main(["disable", "eth0"]) == 0
    assert sysctl(host, "eth0", "accept_ra") == 2 and not (host / raf.DROPIN).exists()


def test_disable_removes_a_vanished_uplink(host, capsys):
    assert raf.main(["enable", "eth0", "lan0"]) == 0
    shutil.rmtree(host / raf.CONF_DIR / "lan0")  # the USB modem was unplugged
    before = (host / raf.DROPIN).read_text()
    assert raf.main(["disable", "--no-persist", "lan0"]) == 0
    assert (host / raf.DROPIN).read_text() == before
    capsys.readouterr()
    assert raf.main(["disable", "lan0"]) == 0
    out = capsys.readouterr().out
    assert "skipped: restore accept_ra on lan0: the interface is not present\n" in out
    state = raf.parse_dropin((host / raf.DROPIN).read_text())
    assert state.uplinks == ["eth0"] and "lan0" not in state.saved_accept_ra
    assert sysctl(host, "all", "forwarding") == 1 and sysctl(host, "eth0", "accept_ra") == 2
    # Absent and not in the drop-in: still an unknown interface.
    assert raf.main(["disable", "lan0"]) == 2
    assert "no IPv6 interface lan0" in capsys.readouterr().err


def test_disable_no_persist_restores_the_saved_values(host):
    (host / raf.CONF_DIR / "eth0/accept_ra").write_text("0\n")
    assert raf.main(["enable", "eth0"]) == 0
    before = (host / raf.DROPIN).read_text()
    assert raf.main(["disable", "--no-persist", "eth0"]) == 0
    assert sysctl(host, "eth0", "accept_ra") == 0  # the saved value, not default's 1
    assert sysctl(host, "all", "forwarding") == 0  # enable had turned it on
    assert (host / raf.DROPIN).read_text() == before


def failing_forwarding(monkeypatch):
    """/proc/sys/net/ipv6/conf/all/forwarding refuses writes (a read-only /proc/sys)."""
    real_write = raf.write_sysctl

    def write(root, name, key, value):
        if (name, key) == ("all", "forwarding"):
            raise raf.Error(
                f"cannot write {raf.sysctl_path(root, name, key)}: Read-only file system"
            )
        real_write(root, name, key, value)

    patch(monkeypatch, "write_sysctl", write)


def test_failed_enable_writes_nothing(host, capsys, monkeypatch):
    failing_forwarding(monkeypatch)
    assert raf.main(["enable", "eth0"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "Read-only file system" in err
    assert not (host / raf.DROPIN).exists() and not list((host / "etc/sysctl.d").iterdir())
    assert sysctl(host, "eth0", "accept_ra") == 1 and host.sent == []
    # With a drop-in already there, it is put back byte for byte.
    monkeypatch.undo()
    patch(monkeypatch, "ROOT", host)
    patch(monkeypatch, "solicit", lambda name: True)
    assert raf.main(["enable", "--no-forwarding", "lan0"]) == 0
    before = (host / raf.DROPIN).read_bytes()
    failing_forwarding(monkeypatch)
    assert raf.main(["enable", "eth0"]) == 2
    assert (host / raf.DROPIN).read_bytes() == before
    assert sysctl(host, "eth0", "accept_ra") == 1 and sysctl(host, "lan0", "accept_ra") == 2


def test_failed_solicitation_is_reported_as_skipped(host, capsys, monkeypatch):
    patch(monkeypatch, "solicit", lambda name: False)
    assert raf.main(["enable", "eth0"]) == 0
    out = capsys.readouterr().out
    assert "done: send a router solicitation" not in out
    assert "skipped: send a router solicitation on eth0: not sent" in out


# --- who manages an interface ---------------------------------------------------------------


def test_owner_networkd_config(tmp_path):
    root = make_root(
        tmp_path, {"enp1s0": (0, 0), "lan0": (0, 1), "host0": (0, 1)}, fixture="networkd"
    )
    owner = owners.detect(root, "enp1s0")
    assert owner.name == owners.NETWORKD and owner.source.endswith("10-uplink.network")
    assert owners.detect(root, "lan0").name == owners.NOBODY  # Name=!en* wan* lan*
    assert owners.detect(root, "eth0").source.endswith("20-other.network")
    assert owners.detect(root, "wan0").source.endswith("10-uplink.network")
    assert owners.networkd_name_matches("!en* wan*", "eth0")
    assert not owners.networkd_name_matches("!en* wan*", "wan1")
    assert not owners.networkd_accepts_ra(root, Path(owner.source))
    dropin = root / "etc/systemd/network/10-uplink.network.d"
    dropin.mkdir()
    (dropin / "ra.conf").write_text("[Network]\nIPv6AcceptRA=yes\n")
    assert owners.networkd_accepts_ra(root, Path(owner.source))
    # Without networkd enabled or running, its files mean nothing.
    (root / "etc/systemd/system/multi-user.target.wants/systemd-networkd.service").unlink()
    assert owners.detect(root, "enp1s0").name == owners.NOBODY


def test_owner_networkd_state(tmp_path):
    root = make_root(tmp_path, fixture="networkd-state")
    owner = owners.detect(root, "eth0")
    assert (owner.name, owner.source) == (owners.NETWORKD, "/etc/systemd/network/50-eth0.network")


def test_owner_networkmanager(tmp_path):
    root = make_root(tmp_path, {"enp1s0": (0, 0), "wlan0": (0, 0)}, fixture="nm")
    owner = owners.detect(root, "enp1s0")
    assert (owner.name, owner.connection) == (owners.NETWORKMANAGER, "Uplink one")
    assert owners.detect(root, "wlan0").name == owners.NETWORKMANAGER  # devices/4
    text = raf.snippet(owner, "enp1s0")
    assert "nmcli connection modify 'Uplink one' ipv6.method auto\n" in text


def test_owner_ifupdown(tmp_path):
    root = make_root(tmp_path, fixture="ifupdown")
    wan = owners.detect(root, "wan0")
    assert wan.name == owners.IFUPDOWN and wan.inet6 == {"method": "auto", "accept_ra": "1"}
    assert raf.ifupdown_conflicts(wan)
    eth1 = owners.detect(root, "eth1")  # from 'source /etc/network/extra-*.cfg'
    assert eth1.name == owners.IFUPDOWN and not raf.ifupdown_conflicts(eth1)
    assert owners.detect(root, "ghost0").name == owners.NOBODY  # skipped.cfg not read
    assert owners.detect(root, "eth9").name == owners.NOBODY


IFUPDOWN_INET6 = """\
iface auto0 inet6 auto
iface autoone inet6 auto
    accept_ra 1
iface dhcp0 inet6 dhcp
iface dhcptwo inet6 dhcp
    accept_ra 2
iface static0 inet6 static
    address 2001:db8:5::1/64
iface gw0 inet6 static
    address 2001:db8:6::1/64
    gateway 2001:db8:6::ff
iface gwtwo inet6 static
    address 2001:db8:7::1/64
    gateway 2001:db8:7::ff
    accept_ra 2
iface man0 inet6 manual
iface v4only inet dhcp
"""


@pytest.mark.parametrize(
    "name,value",
    [
        ("auto0", "2"),  # interfaces(5): auto, accept_ra default "2"
        ("autoone", "1"),
        ("dhcp0", "1"),  # dhcp, default "1"
        ("dhcptwo", "2"),
        ("static0", None),  # static: no default, nothing written
        ("gw0", "0"),  # inet6.defn: gateway (if_set 0) =accept_ra?
        ("gwtwo", "2"),
        ("man0", None),
        ("v4only", None),
    ],
)
def test_ifupdown_defaults(tmp_path, name, value):
    root = make_root(tmp_path, {name: (0, 1)})
    (root / "etc/network").mkdir(parents=True)
    (root / "etc/network/interfaces").write_text(IFUPDOWN_INET6)
    owner = owners.detect(root, name)
    assert owner.name == owners.IFUPDOWN
    assert raf.ifupdown_accept_ra(owner) == value
    assert raf.ifupdown_conflicts(owner) is (value not in (None, "2"))


def test_ifupdown_enable_and_status(tmp_path, monkeypatch, capsys):
    root = make_root(
        tmp_path, {n: (0, 1) for n in ("auto0", "dhcp0", "static0", "gw0")}, forwarding=0
    )
    (root / "etc/network").mkdir(parents=True)
    (root / "etc/network/interfaces").write_text(IFUPDOWN_INET6)
    patch(monkeypatch, "ROOT", root)
    patch(monkeypatch, "solicit", lambda name: True)
    assert raf.main(["enable", "static0"]) == 0  # ifupdown writes no accept_ra there
    assert "accept_ra 2" not in capsys.readouterr().out
    assert raf.main(["enable", "dhcp0"]) == 1
    assert "'iface dhcp0 inet6' stanza" in capsys.readouterr().out
    report = raf.collect_status(root, ["dhcp0", "gw0"], [], [], [], raf.Config(), None)
    messages = [p["message"] for p in report["findings"] if p["code"] == "ifupdown"]
    assert any(m.startswith("ifupdown sets accept_ra=1 on dhcp0 at ifup") for m in messages)
    assert any(m.startswith("ifupdown sets accept_ra=0 on gw0 at ifup") for m in messages)


def test_status_trusts_ifupdown_auto_to_set_2(tmp_path):
    root = make_root(tmp_path, {"auto0": (1, 2), "eth9": (1, 2)}, forwarding=1)
    (root / "etc/network").mkdir(parents=True)
    (root / "etc/network/interfaces").write_text(IFUPDOWN_INET6)
    report = raf.collect_status(root, ["auto0", "eth9"], [], [], [], raf.Config(), None)
    assert [(p["subject"], p["code"]) for p in report["findings"]] == [("eth9", "not-persisted")]


def test_networkd_dropins_in_systemd_order(tmp_path):
    root = make_root(tmp_path, {"enp1s0": (0, 0)}, fixture="networkd")
    network = root / "etc/systemd/network/10-uplink.network"
    etc = root / "etc/systemd/network/10-uplink.network.d"
    usr = root / "usr/lib/systemd/network/10-uplink.network.d"
    etc.mkdir()
    usr.mkdir(parents=True)
    # Sorted by name across directories: 50-yes.conf, then 90-no.conf; the last wins.
    (usr / "50-yes.conf").write_text("[Network]\nIPv6AcceptRA=yes\n")
    (etc / "90-no.conf").write_text("[Network]\nIPv6AcceptRA=no\n")
    assert not owners.networkd_accepts_ra(root, network)
    (etc / "90-no.conf").unlink()
    assert owners.networkd_accepts_ra(root, network)
    # /etc masks the file of the same name in /usr/lib.
    (etc / "50-yes.conf").write_text("[Network]\nDHCP=no\n")
    assert not owners.networkd_accepts_ra(root, network)


def test_networkd_link_without_network_file(tmp_path):
    root = make_root(tmp_path, fixture="networkd-state")
    links = root / "run/systemd/netif/links/7"
    links.write_text("ADMIN_STATE=pending\nOPER_STATE=carrier\n")
    owner = owners.detect(root, "eth0")
    assert owner.name == owners.NETWORKD and owner.source.endswith("links/7")
    text = raf.snippet(owner, "eth0")
    assert "/etc/systemd/network/50-eth0.network," in text
    assert "[Match]\nName=eth0\n\n[Network]\nIPv6AcceptRA=yes\n" in text
    assert ".network.d/" not in text
    # A .network file that matches: its drop-in directory is the one to use.
    (root / "etc/systemd/network").mkdir(parents=True)
    (root / "etc/systemd/network/30-wan.network").write_text("[Match]\nName=eth*\n")
    owner = owners.detect(root, "eth0")
    assert owner.source.endswith("etc/systemd/network/30-wan.network")
    assert "/etc/systemd/network/30-wan.network.d/60-ipv6-ra-forward.conf" in raf.snippet(
        owner, "eth0", root
    )


def test_enable_does_not_fight_networkd(tmp_path, monkeypatch, capsys):
    root = make_root(tmp_path, {"enp1s0": (0, 0), "lan0": (0, 1)}, fixture="networkd")
    patch(monkeypatch, "ROOT", root)
    sent = []
    patch(monkeypatch, "solicit", sent.append)
    assert raf.main(["enable", "enp1s0", "lan0"]) == 1
    out = capsys.readouterr().out
    assert "/etc/systemd/network/10-uplink.network.d/60-ipv6-ra-forward.conf" in out
    assert "(IPv6AcceptRA=no)" in out
    assert "[Network]\nIPv6AcceptRA=yes\nIPForward=ipv6\n" in out  # no dpkg status: as 252
    assert "IPv6 forwarding left off" in out
    assert sysctl(root, "enp1s0", "accept_ra") == 0  # networkd's, untouched
    assert sysctl(root, "lan0", "accept_ra") == 2
    assert sysctl(root, "all", "forwarding") == 0  # it would cost enp1s0 its route
    assert raf.parse_dropin((root / raf.DROPIN).read_text()) == raf.Persisted(
        ["lan0"], False, {"lan0": 1}, None
    )
    assert sent == ["lan0"]
    # The admin applies the printed drop-in: now forwarding goes on.
    dropin = root / "etc/systemd/network/10-uplink.network.d"
    dropin.mkdir()
    (dropin / "ipv6-ra-forward.conf").write_text("[Network]\nIPv6AcceptRA=yes\n")
    assert raf.main(["enable", "enp1s0", "lan0"]) == 0
    assert sysctl(root, "all", "forwarding") == 1
    assert sysctl(root, "enp1s0", "accept_ra") == 0
    assert raf.main(["disable", "enp1s0", "lan0"]) == 0
    assert sysctl(root, "enp1s0", "accept_ra") == 0 and sysctl(root, "lan0", "accept_ra") == 1


def test_status_networkmanager_method(tmp_path):
    root = make_root(tmp_path, {"enp1s0": (1, 0)}, forwarding=1, fixture="nm")
    report = raf.collect_status(root, ["enp1s0"], [], [], [], raf.Config(), None)
    assert [p["code"] for p in report["findings"]] == ["networkmanager-ra"]
    assert "ipv6.method ignore" in report["findings"][0]["message"]
    keyfile = root / "etc/NetworkManager/system-connections/Uplink one.nmconnection"
    keyfile.write_text(keyfile.read_text().replace("method=ignore", "method=auto"))
    assert raf.collect_status(root, ["enp1s0"], [], [], [], raf.Config(), None)["ok"]


# --- watch ----------------------------------------------------------------------------------


def test_watch_once_applies_globs(host, capsys):
    conf = host / "conf"
    conf.write_text('UPLINKS="eth*"\n')
    assert raf.main(["watch", "--once", "--config", str(conf)]) == 0
    assert sysctl(host, "eth0", "accept_ra") == 2 and sysctl(host, "eth0.100", "accept_ra") == 2
    assert sysctl(host, "lan0", "accept_ra") == 1 and sysctl(host, "all", "forwarding") == 1
    assert not (host / raf.DROPIN).exists()  # watch never persists
    assert host.sent == ["eth0", "eth0.100"]


def test_watch_refuses_bad_patterns(host, capsys):
    conf = host / "conf"
    conf.write_text("UPLINKS='eth0 $(reboot)'\n")
    assert raf.main(["watch", "--once", "--config", str(conf)]) == 2
    assert raf.main(["watch", "--once", "--uplink", "a b"]) == 2
    assert sysctl(host, "eth0", "accept_ra") == 1


def test_watch_without_uplinks(host, capsys):
    assert raf.main(["watch", "--config", str(host / "missing")]) == 0
    assert "nothing to watch" in capsys.readouterr().out


def test_configure_new(host, capsys):
    assert raf.configure_new(host, "lan0", dry_run=False)
    assert sysctl(host, "lan0", "accept_ra") == 2 and host.sent == ["lan0"]
    assert not raf.configure_new(host, "lan0", dry_run=False)  # already done
    assert not raf.configure_new(host, "bad;name", dry_run=False)
    assert not raf.configure_new(host, "gone0", dry_run=False)  # no sysctl dir appeared
    (host / "sys/class/net/eth0").mkdir(parents=True)
    (host / "sys/class/net/eth0/flags").write_text("0x1002\n")  # down
    assert raf.configure_new(host, "eth0", dry_run=False)
    assert host.sent == ["lan0"] and sysctl(host, "eth0", "accept_ra") == 2
    (host / "sys/class/net/eth0/flags").write_text("0x1003\n")  # up
    assert raf.link_is_up(host, "eth0") and raf.link_is_up(host, "nosuch0")


class SignalingMonitor:
    """Stands in for pyudev's netlink monitor (no uevents here): each poll() runs the next
    scripted action, which sends the daemon a signal as systemctl reload and stop do."""

    def __init__(self, actions):
        self.actions = list(actions)

    def filter_by(self, subsystem):
        assert subsystem == "net"

    def start(self):
        pass

    def poll(self, timeout=None):
        if self.actions:
            self.actions.pop(0)()
        return None


def run_watch(monkeypatch, monitor, *argv):
    """raf.main(["watch", *argv]) with monitor standing in for pyudev's; the signal
    handlers watch installs are put back afterwards."""
    monkeypatch.setattr(raf.pyudev, "Context", lambda: None)
    monkeypatch.setattr(raf.pyudev.Monitor, "from_netlink", lambda context, source: monitor)
    patch(monkeypatch, "rtnetlink_socket", lambda: None)
    old = {sig: signal.getsignal(sig) for sig in (signal.SIGHUP, signal.SIGTERM)}
    try:
        return raf.main(["watch", *argv])
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def test_watch_reloads_on_sighup(host, capsys, caplog, monkeypatch):
    conf = host / "conf"
    conf.write_text('UPLINKS="eth0"\nFORWARDING=no\n')

    def edit_and_hup():
        conf.write_text('UPLINKS="eth0 lan*"\nFORWARDING=no\n')
        os.kill(os.getpid(), signal.SIGHUP)

    def break_and_hup():
        conf.write_text("UPLINKS='$(reboot)'\n")
        os.kill(os.getpid(), signal.SIGHUP)

    monitor = SignalingMonitor(
        [edit_and_hup, lambda: None, break_and_hup, lambda: None]
        + [lambda: os.kill(os.getpid(), signal.SIGTERM)]
    )
    assert run_watch(monkeypatch, monitor, "--config", str(conf)) == 0
    assert "reloaded: watching for eth0 lan*" in capsys.readouterr().out
    assert sysctl(host, "lan0", "accept_ra") == 2 and sysctl(host, "all", "forwarding") == 0
    assert "reload failed, still watching for eth0 lan*" in caplog.text
    assert not monitor.actions  # ran to the SIGTERM, not ended by a SIGHUP


def test_watch_reload_without_uplinks_changes_nothing(host, capsys, monkeypatch):
    # Emptying UPLINKS and reloading must not turn forwarding on: that would drop every
    # interface's RA default route (at start, no uplinks means nothing to watch).
    conf = host / "conf"
    conf.write_text('UPLINKS="eth0"\nFORWARDING=no\n')

    def empty_and_hup():
        conf.write_text('UPLINKS=""\nFORWARDING=yes\n')
        os.kill(os.getpid(), signal.SIGHUP)

    monitor = SignalingMonitor([empty_and_hup, lambda: os.kill(os.getpid(), signal.SIGTERM)])
    assert run_watch(monkeypatch, monitor, "--config", str(conf)) == 0
    assert "reloaded: no uplinks configured: nothing changed" in capsys.readouterr().out
    assert sysctl(host, "all", "forwarding") == 0


def test_watch_apply_failure_at_start_is_restartable(host, capsys, monkeypatch):
    # An interface gone between listing and reading is no configuration error: exit 1
    # (Restart= tries again), not 2 (RestartPreventExitStatus).
    conf = host / "conf"
    conf.write_text('UPLINKS="eth0"\nFORWARDING=yes\n')
    (host / raf.CONF_DIR / "eth0" / "accept_ra").unlink()
    assert run_watch(monkeypatch, SignalingMonitor([]), "--config", str(conf)) == 1
    err = capsys.readouterr().err
    assert err.startswith("ipv6-ra-forward: error: ") and len(err.splitlines()) == 1
    assert sysctl(host, "all", "forwarding") == 0


def test_unit_stops_restarting_on_exit_2():
    unit = (SRC / "debian/ipv6-ra-forward.ipv6-ra-forward.service").read_text()
    assert "RestartPreventExitStatus=2\n" in unit
    assert "ExecReload=/bin/kill -HUP $MAINPID\n" in unit
    # Bookworm's debhelper installs units in /lib/systemd/system, trixie's in /usr/lib.
    assert "/systemd/system/" not in (SRC / "man/ipv6-ra-forward.8").read_text()


def test_udev_source(tmp_path):
    assert raf.udev_source(tmp_path) == "kernel"


def test_router_solicitation_on_missing_interface():
    with pytest.raises(Error, match="cannot send a router solicitation on nosuch0"):
        raf.send_router_solicitation("nosuch0")


# --- one record of every uplink -------------------------------------------------------------


def networkd_eth0(tmp_path, monkeypatch, network="[Match]\nName=eth0\n\n[Network]\n"):
    """eth0 managed by systemd-networkd (runtime state), k0 by nobody; ROOT pointed there."""
    root = make_root(tmp_path, {"eth0": (0, 0), "k0": (0, 1)}, fixture="networkd-state")
    (root / "etc/systemd/network").mkdir(parents=True)
    (root / "etc/systemd/network/50-eth0.network").write_text(network)
    patch(monkeypatch, "ROOT", root)
    patch(monkeypatch, "solicit", lambda name: True)
    return root


def test_disable_one_uplink_keeps_forwarding_for_a_networkd_uplink(tmp_path, monkeypatch):
    root = networkd_eth0(
        tmp_path, monkeypatch, "[Match]\nName=eth0\n\n[Network]\nIPv6AcceptRA=yes\n"
    )
    assert raf.main(["enable", "eth0", "k0"]) == 0
    state = raf.parse_dropin((root / raf.DROPIN).read_text())
    assert state.managed == {"eth0": owners.NETWORKD} and state.uplinks == ["k0"]
    assert state.all_uplinks == ["eth0", "k0"]
    assert sysctl(root, "eth0", "accept_ra") == 0  # networkd's own, untouched
    assert raf.main(["disable", "k0"]) == 0
    assert sysctl(root, "all", "forwarding") == 1  # eth0 is still an enabled uplink
    assert sysctl(root, "k0", "accept_ra") == 1
    state = raf.parse_dropin((root / raf.DROPIN).read_text())
    assert state.managed == {"eth0": owners.NETWORKD} and state.uplinks == []
    assert state.forwarding and state.saved_forwarding == 0
    # The last uplink goes: enable had turned forwarding on, so it goes off again.
    assert raf.main(["disable", "eth0"]) == 0
    assert sysctl(root, "all", "forwarding") == 0 and not (root / raf.DROPIN).exists()


def test_disable_never_turns_off_forwarding_it_did_not_turn_on(tmp_path, monkeypatch):
    root = networkd_eth0(
        tmp_path, monkeypatch, "[Match]\nName=eth0\n\n[Network]\nIPv6AcceptRA=yes\n"
    )
    (root / raf.CONF_DIR / "all/forwarding").write_text("1\n")
    assert raf.main(["enable", "eth0"]) == 0
    assert raf.main(["disable", "eth0"]) == 0
    assert sysctl(root, "all", "forwarding") == 1 and not (root / raf.DROPIN).exists()


def test_refused_enable_writes_no_dropin(tmp_path, monkeypatch, capsys):
    root = networkd_eth0(
        tmp_path, monkeypatch, "[Match]\nName=eth0\n\n[Network]\nIPv6AcceptRA=no\n"
    )
    assert raf.main(["enable", "eth0"]) == 1
    assert "IPv6 forwarding left off" in capsys.readouterr().out
    assert not (root / raf.DROPIN).exists()
    assert not list((root / "etc/sysctl.d").iterdir())
    assert sysctl(root, "all", "forwarding") == 0


def test_dropin_round_trip_with_managed_uplinks():
    state = raf.Persisted(
        ["k0"], True, {"k0": 1}, 0, {"eth0": owners.NETWORKD, "wl0": "NetworkManager"}
    )
    text = state.render()
    assert "# uplink: eth0 systemd-networkd\n" in text
    assert raf.parse_dropin(text) == state


# --- networkd as networkd behaves -----------------------------------------------------------


def dpkg_systemd(root, version):
    (root / "var/lib/dpkg").mkdir(parents=True, exist_ok=True)
    (root / "var/lib/dpkg/status").write_text(
        "Package: libc6\nStatus: install ok installed\nVersion: 2.36-9\n\n"
        f"Package: systemd\nStatus: install ok installed\nVersion: {version}\n"
    )


@pytest.mark.parametrize(
    "version,settings,handles",
    [
        ("252.39-1~deb12u1", "", True),  # no setting: RAs kept with forwarding by sysctl
        ("257.9-1~deb13u1", "", True),
        ("252.39-1~deb12u1", "IPForward=yes", False),
        ("252.39-1~deb12u1", "IPForward=ipv6", False),
        ("252.39-1~deb12u1", "IPForward=ipv4", True),
        ("252.39-1~deb12u1", "IPMasquerade=both", False),
        ("252.39-1~deb12u1", "IPMasquerade=ipv4", True),
        ("252.39-1~deb12u1", "IPv6SendRA=yes", True),  # 252 does not tie RAs to it
        ("252.39-1~deb12u1", "IPForward=yes\nIPv6AcceptRA=yes", True),
        ("257.9-1~deb13u1", "IPForward=yes", True),  # ignored since 256
        ("257.9-1~deb13u1", "IPv6Forwarding=yes", False),
        ("257.9-1~deb13u1", "IPv6Forwarding=no\nIPMasquerade=ipv6", True),
        ("257.9-1~deb13u1", "IPMasquerade=ipv6", False),
        ("257.9-1~deb13u1", "IPv6SendRA=yes", False),
        ("257.9-1~deb13u1", "IPv6SendRA=yes\nIPv6AcceptRA=yes", True),
        ("257.9-1~deb13u1", "IPv6AcceptRA=no", False),
    ],
)
def test_networkd_ra_verdict(tmp_path, version, settings, handles):
    root = tmp_path
    dpkg_systemd(root, version)
    network = root / "etc/systemd/network/10-wan.network"
    network.parent.mkdir(parents=True)
    network.write_text(f"[Match]\nName=wan0\n\n[Network]\n{settings}\n")
    major = owners.systemd_version(root)
    assert major == int(version[:3])
    assert owners.networkd_ra_verdict(root, network, major)[0] is handles


def test_networkd_global_forwarding_257(tmp_path):
    dpkg_systemd(tmp_path, "257.9-1~deb13u1")
    network = tmp_path / "etc/systemd/network/10-wan.network"
    network.parent.mkdir(parents=True)
    network.write_text("[Match]\nName=wan0\n")
    (tmp_path / "etc/systemd/networkd.conf.d").mkdir(parents=True)
    (tmp_path / "etc/systemd/networkd.conf.d/fw.conf").write_text(
        "[Network]\nIPv6Forwarding=yes\n"
    )
    handles, why = owners.networkd_ra_verdict(tmp_path, network, 257)
    assert not handles and "networkd.conf" in why
    # 252 has no such global setting.
    assert owners.networkd_ra_verdict(tmp_path, network, 252)[0]


@pytest.mark.parametrize(
    "version,existing,expected",
    [
        (252, "", "IPv6AcceptRA=yes\nIPForward=ipv6\n"),
        (252, "IPForward=ipv4", "IPv6AcceptRA=yes\nIPForward=yes\n"),  # IPv4 stays on
        (257, "IPForward=ipv4", "IPv6AcceptRA=yes\nIPv6Forwarding=yes\n"),
    ],
)
def test_networkd_native_text(tmp_path, version, existing, expected):
    network = tmp_path / "10-wan.network"
    network.write_text(f"[Match]\nName=wan0\n[Network]\n{existing}\n")
    text, native = owners.networkd_native(tmp_path, network, version)
    assert text == "[Network]\n" + expected and not native


@pytest.mark.parametrize(
    "version,key", [("252.39-1", "IPForward=ipv6"), ("257.9-1", "IPv6Forwarding=yes")]
)
def test_enable_networkd_writes_the_native_dropin(tmp_path, monkeypatch, capsys, version, key):
    root = networkd_eth0(
        tmp_path, monkeypatch, "[Match]\nName=eth0\n\n[Network]\nIPMasquerade=both\n"
    )
    dpkg_systemd(root, version)
    assert raf.main(["enable", "eth0", "k0"]) == 1  # advice, forwarding left off
    out = capsys.readouterr().out
    assert "IPMasquerade=both without IPv6AcceptRA=yes" in out and key in out
    assert "enable --networkd" in out
    assert sysctl(root, "all", "forwarding") == 0
    assert raf.main(["enable", "--networkd", "eth0", "k0"]) == 0
    out = capsys.readouterr().out
    dropin = root / "etc/systemd/network/50-eth0.network.d/60-ipv6-ra-forward.conf"
    assert f"IPv6AcceptRA=yes\n{key}\n" in dropin.read_text()
    assert "skipped: run networkctl reload: systemd-networkd is not running" in out
    assert sysctl(root, "all", "forwarding") == 1 and sysctl(root, "eth0", "accept_ra") == 0
    assert raf.parse_dropin((root / raf.DROPIN).read_text()).managed == {"eth0": owners.NETWORKD}
    capsys.readouterr()
    assert raf.main(["enable", "--networkd", "eth0", "k0"]) == 0
    assert capsys.readouterr().out == "nothing to change\n"
    assert raf.main(["disable", "k0"]) == 0
    assert dropin.exists() and sysctl(root, "all", "forwarding") == 1
    assert raf.main(["disable", "eth0"]) == 0
    assert not dropin.exists() and sysctl(root, "all", "forwarding") == 0
    assert not dropin.parent.exists()  # the 50-eth0.network.d/ enable created goes too


def test_enable_networkd_without_settings_needs_no_advice(tmp_path, monkeypatch, capsys):
    # networkd 252 and 257 keep handling RAs with forwarding on by sysctl.
    root = networkd_eth0(tmp_path, monkeypatch)
    dpkg_systemd(root, "257.9-1")
    assert raf.main(["enable", "eth0"]) == 0
    assert sysctl(root, "all", "forwarding") == 1 and sysctl(root, "eth0", "accept_ra") == 0


# --- watch: accept_ra lowered by an ifup, names its globs match ------------------------------


def nlmsg(kind, payload):
    return struct.pack("=IHHII", 16 + len(payload), kind, 0, 0, 0) + payload


def test_netlink_indexes():
    link = nlmsg(raf.RTM_NEWLINK, struct.pack("=BBHiII", 0, 0, 1, 7, 0x1003, 0))
    addr = nlmsg(raf.RTM_NEWADDR, struct.pack("=BBBBI", 10, 64, 0, 0, 9) + b"\0" * 3)
    netconf = nlmsg(raf.RTM_NEWNETCONF, struct.pack("=B", 10) + b"\0" * 3)
    route = nlmsg(24, b"\0" * 12)  # RTM_NEWROUTE: not subscribed, ignored anyway
    assert raf.netlink_indexes(link + addr) == {7, 9}
    assert raf.netlink_indexes(route + netconf) == {raf.ALL}
    assert raf.netlink_indexes(link[:20]) == set()  # truncated: nothing made up


def test_recheck_raises_accept_ra_an_ifup_lowered(host, capsys):
    config = raf.Config(["eth*"], True)
    raf.apply_existing(host, config, False)
    host.sent.clear()
    (host / raf.CONF_DIR / "eth0/accept_ra").write_text("1\n")  # ifupdown's 'accept_ra 1'
    assert raf.recheck(host, config, {raf.ALL}, False) == ["eth0"]
    assert sysctl(host, "eth0", "accept_ra") == 2 and host.sent == ["eth0"]
    assert "eth0: set accept_ra=2 (was 1, seen on a link event)" in capsys.readouterr().out
    assert raf.recheck(host, config, {raf.ALL}, False) == []


def test_watch_leaves_names_enable_refuses(host, capsys, caplog):
    for name in ("eth$(id)", "eth0;x"):
        (host / raf.CONF_DIR / name).mkdir()
        (host / raf.CONF_DIR / name / "accept_ra").write_text("1\n")
        (host / raf.CONF_DIR / name / "forwarding").write_text("0\n")
    conf = host / "conf"
    conf.write_text('UPLINKS="eth*"\n')
    assert raf.main(["watch", "--once", "--config", str(conf)]) == 0
    assert sysctl(host, "eth$(id)", "accept_ra") == 1 and sysctl(host, "eth0;x", "accept_ra") == 1
    assert sysctl(host, "eth0", "accept_ra") == 2
    assert "ignored: invalid interface name: 'eth$(id)'" in caplog.text
    assert raf.recheck(host, raf.Config(["eth*"]), {raf.ALL}, False) == []
    assert sysctl(host, "eth$(id)", "accept_ra") == 1


def test_watch_keeps_the_uplinks_enable_recorded(host, capsys):
    assert raf.main(["enable", "--no-forwarding", "lan0"]) == 0
    config = raf.watched(host, raf.Config([], True))
    assert config.uplinks == ["lan0"] and not config.forwarding  # forwarding as recorded
    assert raf.watched(host, raf.Config(["eth0"], True)).uplinks == ["eth0", "lan0"]


def test_boot_units():
    apply = (SRC / "debian/ipv6-ra-forward.ipv6-ra-forward-apply.service").read_text()
    watch = (SRC / "debian/ipv6-ra-forward.ipv6-ra-forward.service").read_text()
    for line in (
        "Type=oneshot",
        "Before=network-pre.target",
        "Wants=network-pre.target",
        "DefaultDependencies=no",
    ):
        assert f"\n{line}" in apply
    assert "\nExecStart=/usr/bin/ipv6-ra-forward watch --once\n" in apply
    assert "\nWants=ipv6-ra-forward-apply.service\n" in watch
    assert "\nAfter=ipv6-ra-forward-apply.service" in watch


# --- status and enable cosmetics ------------------------------------------------------------


def test_user_space_slaac_addresses_count_where_the_kernel_tags_its_own():
    # trixie: the kernel tags its link-local kernel_ll; networkd's SLAAC address has no tag.
    link = addr_link("wan0", dict(LINK_LOCAL, protocol="kernel_ll"), SLAAC, LIFETIME)
    assert raf.ra_addresses([link]) == {}
    assert raf.ra_addresses([link], ["wan0"]) == {"wan0": ["2001:db8:1::5/64"]}  # not the /128


def test_status_prints_no_expiry_for_user_space_routes(host, monkeypatch, capsys):
    route = [
        {
            "dst": "default",
            "gateway": "fe80::1",
            "dev": "eth0",
            "protocol": "ra",
            "metric": 100,
            "flags": [],
        }
    ]  # NetworkManager: no kernel expiry
    patch(monkeypatch, "ip_json", lambda argv: route if "route" in argv else [])
    raf.main(["status", "eth0"])
    out = capsys.readouterr().out
    assert "  default via fe80::1 (RA)\n" in out and "None" not in out


def test_enable_on_a_down_link_does_not_warn(host, capsys, caplog):
    (host / "sys/class/net/eth0").mkdir(parents=True)
    (host / "sys/class/net/eth0/flags").write_text("0x1002\n")  # down
    assert raf.main(["enable", "eth0"]) == 0
    out, err = capsys.readouterr()
    assert "skipped: send a router solicitation on eth0: the link is down" in out
    assert err == "" and "WARNING" not in caplog.text and host.sent == []


# --- the edges: bridge ports, disable under the watcher, recreated links, tentative ------


def bridge(host, port="eth0", master="br0"):
    net = host / "sys/class/net"
    (net / master / "bridge").mkdir(parents=True)
    (net / port).mkdir(parents=True, exist_ok=True)
    (net / port / "device").mkdir()
    (net / port / "master").symlink_to(f"../{master}")


def test_enable_on_a_bridge_port_is_refused_naming_the_bridge(host, capsys):
    bridge(host)
    assert raf.main(["enable", "eth0"]) == 2
    err = capsys.readouterr().err
    assert "eth0 is a port of bridge br0" in err and "enable br0" in err
    assert err.count("\n") == 1
    assert not (host / raf.DROPIN).exists() and sysctl(host, "all", "forwarding") == 0
    assert sysctl(host, "eth0", "accept_ra") == 1 and host.sent == []
    # The watcher leaves it alone too, whatever UPLINKS matches.
    assert not raf.configure_new(host, "eth0", dry_run=False)
    conf = host / "conf"
    conf.write_text('UPLINKS="eth0"\nFORWARDING=no\n')
    assert raf.main(["watch", "--once", "--config", str(conf)]) == 0
    assert sysctl(host, "eth0", "accept_ra") == 1


def test_disable_holds_against_the_watchers_uplinks(host, capsys):
    (host / raf.DEFAULTS_FILE).parent.mkdir(parents=True, exist_ok=True)
    (host / raf.DEFAULTS_FILE).write_text('UPLINKS="eth*"\n')
    assert raf.main(["enable", "eth0"]) == 0
    assert raf.main(["disable", "eth0"]) == 0
    assert sysctl(host, "eth0", "accept_ra") == 1
    state = raf.parse_dropin((host / raf.DROPIN).read_text())
    assert state.held == ["eth0"] and state.uplinks == [] and not state.forwarding
    config = raf.watched(host, raf.read_config(host))
    assert config.held == ["eth0"]
    # The watcher's periodic look and a new-link event leave it at 1.
    assert raf.recheck(host, config, {raf.ALL}, dry_run=False) == ["eth0.100"]
    assert sysctl(host, "eth0", "accept_ra") == 1
    raf.apply_existing(host, config, dry_run=False)
    assert sysctl(host, "eth0", "accept_ra") == 1
    # enable takes it back.
    assert raf.main(["enable", "eth0"]) == 0
    assert raf.parse_dropin((host / raf.DROPIN).read_text()).held == []
    assert raf.main(["disable", "--no-persist", "eth0"]) == 0
    assert "nothing stops ipv6-ra-forward.service" in capsys.readouterr().out


def test_disable_without_a_watcher_match_holds_nothing(host):
    assert raf.main(["enable", "eth0"]) == 0
    assert raf.main(["disable", "eth0"]) == 0
    assert not (host / raf.DROPIN).exists()


@pytest.mark.parametrize(
    "setup,says",
    [
        (None, "systemd-sysctl applies /etc/sysctl.d/60-ipv6-ra-forward.conf at boot"),
        ("udev", "udev applies /etc/sysctl.d/60-ipv6-ra-forward.conf"),
        ("ifupdown", "ifupdown's 'iface br0 inet6 auto' sets accept_ra 2"),
        ("watcher", "ipv6-ra-forward.service sets accept_ra 2 and solicits (UPLINKS in"),
    ],
)
def test_enable_says_what_brings_a_recreated_bridge_back(
    tmp_path, monkeypatch, capsys, setup, says
):
    root = make_root(tmp_path, {"br0": (0, 1)})
    patch(monkeypatch, "ROOT", root)
    patch(monkeypatch, "solicit", lambda name: True)
    (root / "sys/class/net/br0/bridge").mkdir(parents=True)
    if setup == "udev":
        (root / "run/udev").mkdir(parents=True)
        (root / "run/udev/control").write_text("")
    elif setup == "ifupdown":
        (root / "etc/network").mkdir(parents=True)
        (root / "etc/network/interfaces").write_text("iface br0 inet6 auto\n")
    elif setup == "watcher":
        (root / "etc/systemd/system/multi-user.target.wants").mkdir(parents=True)
        (root / "etc/systemd/system/multi-user.target.wants/ipv6-ra-forward.service").touch()
        (root / raf.DEFAULTS_FILE).parent.mkdir(parents=True, exist_ok=True)
        (root / raf.DEFAULTS_FILE).write_text('UPLINKS="br*"\n')
    assert raf.main(["enable", "br0"]) == 0
    out = capsys.readouterr().out
    assert "when br0 is created again (ifdown/ifup, reboot): " in out and says in out
    assert raf.main(["enable", "br0"]) == 0
    assert capsys.readouterr().out == "nothing to change\n"


IF_INET6 = (
    "fe80000000000000020000fffe000001 0000000b 40 20 {flags} br0\n"
    "20010db8000000000000000000000005 0000000b 40 00 00 br0\n"
)


def test_no_solicitation_while_the_link_local_address_is_tentative(tmp_path, capsys, caplog):
    (tmp_path / "proc/net").mkdir(parents=True)
    (tmp_path / "proc/net/if_inet6").write_text(IF_INET6.format(flags="c0"))
    assert raf.link_local_tentative("br0", tmp_path)
    step = raf.solicit_step("br0", tmp_path)
    with pytest.raises(raf.Skipped, match="duplicate address detection"):
        step.action()
    raf.run_steps([step], dry_run=False)
    out = capsys.readouterr().out
    assert "skipped: send a router solicitation on br0: its link-local address is still" in out
    assert "WARNING" not in caplog.text
    (tmp_path / "proc/net/if_inet6").write_text(IF_INET6.format(flags="80"))
    assert not raf.link_local_tentative("br0", tmp_path)
    assert not raf.link_local_tentative("eth9", tmp_path)


def _etc_and_sysctls(root):
    """Every file under root/etc and root/proc/sys with its bytes, and every directory."""
    found = {}
    for top in ("etc", "proc/sys"):
        for path in sorted((root / top).rglob("*")):
            found[str(path.relative_to(root))] = None if path.is_dir() else path.read_bytes()
    return found


def test_refused_enable_with_forwarding_on_already_writes_nothing(tmp_path, monkeypatch, capsys):
    # Forwarding on before enable (a router already, a container host): the refused uplink
    # must not leave a drop-in holding only "all.forwarding = 1".
    root = networkd_eth0(
        tmp_path, monkeypatch, "[Match]\nName=eth0\n\n[Network]\nIPv6AcceptRA=no\n"
    )
    (root / raf.CONF_DIR / "all/forwarding").write_text("1\n")
    before = _etc_and_sysctls(root)
    assert raf.main(["enable", "eth0"]) == 1
    assert "IPv6AcceptRA=yes" in capsys.readouterr().out
    assert _etc_and_sysctls(root) == before


def _refusal_root(tmp_path, case, forwarding):
    """A fixture root for one refusal path of enable, and the command line that hits it."""
    if case == "nm-method":
        root = make_root(tmp_path, {"enp1s0": (forwarding, 0)}, forwarding, fixture="nm")
        return root, ["enable", "enp1s0"], 1
    if case in ("networkd-blocked", "networkd-blocked-two", "networkd-no-file"):
        root = make_root(tmp_path, {"eth0": (forwarding, 0)}, forwarding, fixture="networkd-state")
        if case != "networkd-no-file":
            (root / "etc/systemd/network").mkdir(parents=True)
            (root / "etc/systemd/network/50-eth0.network").write_text(
                "[Match]\nName=eth0\n\n[Network]\nIPForward=ipv6\n"
            )
            dpkg_systemd(root, "252.39-1~deb12u1")
            return root, ["enable", "eth0"], 1
        return root, ["enable", "--networkd", "eth0"], 2
    root = make_root(tmp_path, {"eth0": (forwarding, 1), "br0": (forwarding, 1)}, forwarding)
    (root / "sys/class/net/br0/bridge").mkdir(parents=True)
    (root / "sys/class/net/eth0").mkdir(parents=True)
    (root / "sys/class/net/eth0/master").symlink_to("../br0")
    (root / "etc/network").mkdir(parents=True)
    (root / "etc/network/interfaces").write_text("iface br0 inet6 auto\n  bridge_ports eth0\n")
    (root / "etc/default").mkdir(parents=True)
    (root / "etc/default/ipv6-ra-forward").write_text('UPLINKS=""\n')
    argv = {
        "bridge-port": ["enable", "eth0"],
        "bridge-port-last": ["enable", "br0", "eth0"],
        "unknown": ["enable", "br0", "nosuch0"],
        "bad-name": ["enable", "br0", "bad/name"],
        "networkd-other": ["enable", "--networkd", "br0", "eth0"],
    }[case]
    return root, argv, 2


@pytest.mark.parametrize("forwarding", [0, 1])
@pytest.mark.parametrize(
    "case",
    [
        "bridge-port",
        "bridge-port-last",
        "unknown",
        "bad-name",
        "networkd-other",
        "nm-method",
        "networkd-blocked",
        "networkd-no-file",
    ],
)
def test_every_refused_enable_writes_nothing(tmp_path, monkeypatch, capsys, case, forwarding):
    """Each refusal of enable, with forwarding off or already on: no file under /etc and
    no sysctl changed (issue 26: bookworm wrote its sysctl file)."""
    root, argv, code = _refusal_root(tmp_path, case, forwarding)
    patch(monkeypatch, "ROOT", root)
    patch(monkeypatch, "solicit", lambda name: True)
    before = _etc_and_sysctls(root)
    assert raf.main(argv) == code
    capsys.readouterr()
    assert _etc_and_sysctls(root) == before


# --- issue 35: what forwarding costs the other interfaces ------------------------------------


def ra_route_json(*names):
    return [
        {"dst": "default", "gateway": "fe80::1", "dev": n, "protocol": "ra", "metric": 1024}
        for n in names
    ]


def slaac_json(name, address="2001:db8:1::5"):
    info = dict(local=address, prefixlen=64, scope="global", dynamic=True, mngtmpaddr=True)
    return [addr_link(name, info)]


def test_enable_refuses_when_another_interface_would_lose_its_route(host, capsys, monkeypatch):
    no_ra_learned(monkeypatch, slaac_json("eth0.100"), ra_route_json("lan0", "eth0"))
    for argv in (["enable", "eth0"], ["enable", "--dry-run", "eth0"]):
        assert raf.main(argv) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1
        assert err.startswith("ipv6-ra-forward: error: refused: forwarding on")
        assert "lan0 (accept_ra=1) would lose its RA default route via fe80::1" in err
        assert "eth0.100 (accept_ra=1) would lose its RA address 2001:db8:1::5/64" in err
        assert "eth0 (" not in err  # the uplink keeps learning
        assert "--not-uplink eth0.100 --not-uplink lan0" in err
    assert not (host / raf.DROPIN).exists() and not (host / raf.DEFAULTS_FILE).exists()
    assert sysctl(host, "all", "forwarding") == 0 and sysctl(host, "eth0", "accept_ra") == 1
    assert host.sent == []
    # Already at 2, or managed by networkd, or forwarding on by itself: nothing to lose.
    (host / raf.CONF_DIR / "lan0/accept_ra").write_text("2\n")
    (host / raf.CONF_DIR / "eth0.100/forwarding").write_text("1\n")
    assert raf.main(["enable", "--dry-run", "eth0"]) == 0


def test_not_uplink_is_remembered_and_uplinks_too_keep_theirs(host, capsys, monkeypatch):
    no_ra_learned(monkeypatch, slaac_json("eth0.100"), ra_route_json("lan0", "eth0"))
    defaults = host / raf.DEFAULTS_FILE
    defaults.parent.mkdir(parents=True)
    defaults.write_text('# the admin\'s comment\nUPLINKS=""\nFORWARDING=yes\n')
    assert raf.main(["enable", "--dry-run", "eth0", "lan0", "--not-uplink", "eth0.100"]) == 0
    assert "would write" in capsys.readouterr().out and "NOT_UPLINKS" not in defaults.read_text()
    assert raf.main(["enable", "eth0", "lan0", "--not-uplink", "eth0.100"]) == 0
    assert f'write {defaults} (NOT_UPLINKS="eth0.100")' in capsys.readouterr().out
    assert defaults.read_text() == (
        '# the admin\'s comment\nUPLINKS=""\nFORWARDING=yes\nNOT_UPLINKS="eth0.100"\n'
    )
    assert sysctl(host, "all", "forwarding") == 1 and sysctl(host, "lan0", "accept_ra") == 2
    assert raf.read_config(host).not_uplinks == ["eth0.100"]
    # Remembered: the next enable needs no option, and leaves the file alone.
    for name in ("eth0", "lan0"):
        (host / raf.CONF_DIR / name / "forwarding").write_text("0\n")
    (host / raf.CONF_DIR / "all/forwarding").write_text("0\n")
    before = defaults.read_text()
    assert raf.main(["enable", "eth0", "lan0"]) == 0 and defaults.read_text() == before
    # Named both ways, or an uplink NOT_UPLINKS names: refused.
    assert raf.main(["enable", "eth0", "--not-uplink", "eth0"]) == 2
    assert raf.main(["enable", "eth0.100"]) == 2
    assert "eth0.100 is in NOT_UPLINKS" in capsys.readouterr().err


def test_with_assignment_replaces_the_last_or_appends():
    assert raf.with_assignment("", "K", "a") == 'K="a"\n'
    assert raf.with_assignment("A=1", "K", "a") == 'A=1\nK="a"\n'
    assert raf.with_assignment("K=x\n# c\nK=y\nB=2\n", "K", "a b") == 'K=x\n# c\nK="a b"\nB=2\n'


def test_status_ignores_what_the_admin_told_to_ignore_ras(tmp_path):
    root = make_root(tmp_path, {"trunk0": (1, 0), "mv0": (1, 2), "stor0": (1, 1)}, forwarding=1)
    neigh = [{"dst": "fe80::1", "dev": d, "router": None} for d in ("trunk0", "stor0", "mv0")]
    addr, route = slaac_json("mv0"), ra_route_json("mv0")
    config = raf.Config(uplinks=["mv0"], not_uplinks=["stor*"])
    report = raf.collect_status(root, [], addr, route, neigh, config, None)
    assert report["ok"] and report["findings"] == [] and report["not_uplinks"] == ["stor*"]
    entries = {e["name"]: e for e in report["interfaces"]}
    assert entries["trunk0"]["not_uplink"] == "accept_ra=0" and not entries["trunk0"]["uplink"]
    assert entries["stor0"]["not_uplink"].startswith("NOT_UPLINKS in ")
    assert entries["mv0"]["uplink"] and entries["mv0"]["not_uplink"] is None
    # Named, still not a finding; kept by the drop-in, accept_ra=0 is one.
    assert raf.collect_status(root, ["trunk0", "stor0"], [], [], neigh, config, None)["ok"]
    kept = raf.Persisted(["trunk0"], True)
    report = raf.collect_status(root, [], [], [], neigh, config, kept)
    assert [f["code"] for f in report["findings"]] == ["ra-disabled"]


def test_status_manager_settings_that_ignore_ras(tmp_path):
    root = make_root(tmp_path, {"eth1": (1, 0)}, forwarding=1)
    interfaces = root / "etc/network/interfaces"
    interfaces.parent.mkdir(parents=True)
    interfaces.write_text("iface eth1 inet6 auto\n    accept_ra 0\n")
    neigh = [{"dst": "fe80::1", "dev": "eth1", "router": None}]
    entry = raf.collect_status(root, ["eth1"], [], [], neigh, raf.Config(), None)
    assert (
        entry["ok"] and "accept_ra 0 in its inet6 stanza" in entry["interfaces"][0]["not_uplink"]
    )
    owner = raf.owners.Owner(raf.owners.NETWORKMANAGER, "x.nmconnection", ipv6_method="disabled")
    facts = raf.StatusFacts(root, 1, 1, {}, {}, [], set(), raf.Config(), True)
    assert (
        raf.not_uplink_reason(facts, "eth1", owner, 0) == "ipv6.method disabled (x.nmconnection)"
    )


def sysfs_link(host, name, devtype=None, master=None, lowers=()):
    net = host / "sys/class/net"
    (net / name).mkdir(parents=True, exist_ok=True)
    if devtype:
        (net / name / "uevent").write_text(f"DEVTYPE={devtype}\nINTERFACE={name}\n")
        (net / name / devtype if devtype in ("bridge",) else net / name / "x").mkdir(exist_ok=True)
    if devtype == "bond":
        (net / name / "bonding").mkdir(exist_ok=True)
    if master:
        (net / name / "master").symlink_to(f"../{master}")
        (net / name / f"upper_{master}").symlink_to(f"../{master}")
    for lower in lowers:
        (net / lower).mkdir(parents=True, exist_ok=True)
        (net / lower / f"upper_{name}").symlink_to(f"../{name}")
        (net / name / f"lower_{lower}").symlink_to(f"../{lower}")


def test_a_bond_port_under_a_bridge_is_sent_to_the_bridge_in_one_step(host, capsys):
    sysfs_link(host, "br0", "bridge")
    sysfs_link(host, "bond0", "bond", master="br0")
    sysfs_link(host, "eth0", master="bond0")
    assert raf.masters(host, "eth0") == [("bond", "bond0"), ("bridge", "br0")]
    assert raf.uppers(host, "eth0") == ["bond0"] and raf.devtype(host, "bond0") == "bond"
    assert raf.main(["enable", "eth0"]) == 2
    err = capsys.readouterr().err
    assert "eth0 is a port of bond bond0, itself a port of bridge br0;" in err
    assert err.rstrip().endswith("run 'ipv6-ra-forward enable br0'")
    assert not (host / raf.DROPIN).exists() and sysctl(host, "all", "forwarding") == 0


def test_a_vlan_lower_device_that_learns_nothing_is_sent_to_its_vlan(host, capsys, monkeypatch):
    sysfs_link(host, "eth0.100", "vlan", lowers=["eth0"])
    no_ra_learned(monkeypatch, slaac_json("eth0.100"), ra_route_json("eth0.100"))
    assert raf.main(["enable", "--dry-run", "eth0"]) == 2
    err = capsys.readouterr().err
    assert "eth0 learns nothing from router advertisements itself; VLAN eth0.100 on it" in err
    assert "run 'ipv6-ra-forward enable eth0.100'" in err
    # A trunk whose untagged network has a router is an uplink; its VLAN then must be
    # named too (or --not-uplink), since forwarding would cost it its route.
    no_ra_learned(monkeypatch, [], ra_route_json("eth0.100", "eth0"))
    assert raf.main(["enable", "--dry-run", "eth0"]) == 2
    assert "eth0.100 (accept_ra=1) would lose" in capsys.readouterr().err
    assert raf.main(["enable", "--dry-run", "eth0", "eth0.100"]) == 0


def test_messages_not_root_and_not_there_yet(host, capsys, monkeypatch):
    assert raf.main(["enable", "bond0"]) == 2
    err = capsys.readouterr().err
    assert "no interface bond0: for one that does not exist yet" in err
    assert 'UPLINKS= in /etc/default/ipv6-ra-forward (UPLINKS="bond0")' in err
    patch(monkeypatch, "ROOT", raf.Path("/"))
    monkeypatch.setattr(raf.os, "geteuid", lambda: 1000)
    for argv in (["enable", "eth0"], ["disable", "eth0"], ["watch", "--once"]):
        assert raf.main(argv) == 2
        assert "must be run as root" in capsys.readouterr().err


def test_disable_solicits_where_routes_come_back(host, capsys, monkeypatch):
    assert raf.main(["enable", "eth0"]) == 0
    host.sent.clear()
    (host / raf.CONF_DIR / "lan0/accept_ra").write_text("0\n")
    capsys.readouterr()
    assert raf.main(["disable", "--dry-run", "eth0"]) == 0
    out = capsys.readouterr().out
    assert "would send a router solicitation on eth0\n" in out
    assert "on eth0.100" in out and "on lan0" not in out
    assert raf.main(["disable", "eth0"]) == 0
    assert sysctl(host, "all", "forwarding") == 0 and sorted(host.sent) == ["eth0", "eth0.100"]


def test_router_solicitation_carries_the_source_link_layer_address(tmp_path):
    assert raf.router_solicitation(None) == bytes([133, 0, 0, 0, 0, 0, 0, 0])
    mac = bytes.fromhex("020000000001")
    packet = raf.router_solicitation(mac)
    assert len(packet) == 16 and packet[8:10] == bytes([1, 1]) and packet[10:] == mac
    (tmp_path / "proc/net").mkdir(parents=True)
    (tmp_path / "proc/net/if_inet6").write_text(
        "fe800000000000000000000000000001 03 40 20 c0     eth0\n"  # tentative
        "20010db8000000000000000000000005 04 40 00 00     eth1\n"
        "fe800000000000000000000000000002 04 40 20 80     eth1\n"
    )
    assert raf.link_local_address("eth0", tmp_path) is None
    assert raf.link_local_address("eth1", tmp_path) == "fe80::2"
    (tmp_path / "sys/class/net/eth1").mkdir(parents=True)
    (tmp_path / "sys/class/net/eth1/address").write_text("02:00:00:00:00:01\n")
    assert raf.link_layer_address("eth1", tmp_path) == mac
    assert raf.link_layer_address("eth0", tmp_path) is None


def test_watch_leaves_forwarding_off_and_says_why(host, capsys, caplog, monkeypatch):
    no_ra_learned(monkeypatch, [], ra_route_json("lan0"))
    conf = host / "conf"
    conf.write_text('UPLINKS="eth0"\n')
    assert raf.main(["watch", "--once", "--config", str(conf)]) == 0
    assert sysctl(host, "eth0", "accept_ra") == 2 and sysctl(host, "all", "forwarding") == 0
    assert (
        "forwarding left off: " in caplog.text and "lan0 (accept_ra=1) would lose" in caplog.text
    )
    assert "NOT_UPLINKS= (to let it lose it)" in caplog.text
    conf.write_text('UPLINKS="eth0"\nNOT_UPLINKS="lan*"\n')
    assert raf.main(["watch", "--once", "--config", str(conf)]) == 0
    assert sysctl(host, "all", "forwarding") == 1


def test_watch_says_a_new_interface_learns_nothing(host, caplog):
    (host / raf.CONF_DIR / "all/forwarding").write_text("1\n")
    config = raf.Config(uplinks=["eth0"])
    raf.warn_new_learner(host, config, "lan0")
    assert "lan0 appeared with accept_ra=1 while forwarding is on" in caplog.text
    caplog.clear()
    raf.warn_new_learner(host, raf.Config(uplinks=["eth0"], not_uplinks=["lan0"]), "lan0")
    assert caplog.text == ""


def test_ifupdown_advice_agrees_for_an_inet6_auto_stanza(host, capsys):
    interfaces = host / "etc/network/interfaces"
    interfaces.parent.mkdir(parents=True)
    interfaces.write_text("iface eth0 inet6 auto\n    accept_ra 1\n")
    (host / "sys/class/net/eth0").mkdir(parents=True)  # no device/: a bridge, bond or VLAN
    assert raf.main(["enable", "eth0"]) == 1
    out = capsys.readouterr().out
    assert "'iface eth0 inet6' stanza of" in out and "    accept_ra 2\n" in out
    assert "set 'accept_ra 2' in its 'iface eth0 inet6 auto' stanza" in out
    assert "use 'iface eth0 inet6 auto'" not in out  # it has that already
    interfaces.write_text("iface lan0 inet6 auto\n")
    assert "use 'iface eth0 inet6 auto'" in raf.reapply_note(host, "eth0", True)


def test_networkmanager_vlan_and_bond_profiles(tmp_path):
    connections = tmp_path / "etc/NetworkManager/system-connections"
    connections.mkdir(parents=True)
    (connections / "vlan100.nmconnection").write_text(
        "[connection]\nid=vlan100\ntype=vlan\n\n[vlan]\nparent=enp1s0\nid=100\n\n"
        "[ipv6]\nmethod=auto\n"
    )
    (connections / "bond0.nmconnection").write_text(
        "[connection]\nid=bond\ntype=bond\ninterface-name=bond0\n\n[ipv6]\nmethod=ignore\n"
    )
    (connections / "long.nmconnection").write_text(
        "[connection]\nid=long\ntype=vlan\n\n[vlan]\nparent=enp0s20f0u1u2\nid=4000\n"
    )
    (tmp_path / "run/NetworkManager").mkdir(parents=True)
    vlan = owners.nm_connection_for(tmp_path, "enp1s0.100")
    assert vlan["id"] == "vlan100" and vlan["method"] == "auto"
    assert owners.nm_connection_for(tmp_path, "bond0")["method"] == "ignore"
    assert owners.nm_connection_for(tmp_path, "enp0s20f0u.4000")["id"] == "long"
    owner = owners.detect(tmp_path, "enp1s0.100")
    assert (owner.name, owner.connection) == (owners.NETWORKMANAGER, "vlan100")
    assert "nmcli connection modify bond ipv6.method auto" in raf.snippet(
        owners.detect(tmp_path, "bond0"), "bond0", tmp_path
    )


def test_watch_names_existing_interfaces_that_learn_nothing(host, caplog):
    conf = host / "conf"
    conf.write_text('UPLINKS="eth0"\nNOT_UPLINKS="eth0.*"\n')
    assert raf.main(["watch", "--once", "--config", str(conf)]) == 0
    assert sysctl(host, "all", "forwarding") == 1
    assert "lan0 has accept_ra=1 while forwarding is on: it learns no default route" in (
        caplog.text
    )
    assert "eth0.100 has" not in caplog.text and "eth0 has" not in caplog.text


# --- bonds and VLANs as each manager configures them (tests/data/ipv6-ra-forward/stacks) ---


def stack_root(tmp_path, monkeypatch, fixture, interfaces):
    """A fixture tree of one manager's bond and VLAN configuration; the interfaces given
    exist (with IPv6 sysctls), the rest is configured only."""
    root = make_root(
        tmp_path,
        {n: (0, 0 if fixture == "networkd" else 1) for n in interfaces},
        fixture=f"stacks/{fixture}",
    )
    for name in interfaces:
        (root / "sys/class/net" / name).mkdir(parents=True)
    patch(monkeypatch, "ROOT", root)
    patch(monkeypatch, "solicit", lambda name: True)
    return root


@pytest.mark.parametrize(
    "version,key",
    [("252.39-1~deb12u1", "IPForward=ipv6"), ("257.9-1~deb13u1", "IPv6Forwarding=yes")],
)
def test_networkd_bond_and_vlan(tmp_path, monkeypatch, capsys, version, key):
    root = stack_root(tmp_path, monkeypatch, "networkd", ["eth0", "eth1"])
    dpkg_systemd(root, version)
    net = root / "etc/systemd/network"
    # The bond is not up yet: a port is sent to it, by the .network that says so.
    assert raf.main(["enable", "eth0"]) == 2
    err = capsys.readouterr().err
    assert (
        f"eth0 is a port of bond bond0 (systemd-networkd: Bond=bond0 in {net}/10-eth0.network)"
        in err
    )
    assert "run 'ipv6-ra-forward enable bond0' once bond0 exists" in err
    assert raf.main(["enable", "bond0.200"]) == 2
    err = capsys.readouterr().err
    assert (
        f"no interface bond0.200 yet: systemd-networkd makes bond0.200 (Kind=vlan in "
        f"{net}/30-bond0.200.netdev) but it does not exist now: 'networkctl reload' makes it"
        in err
    )
    assert owners.networkd_stacked_on(root, "bond0") == ["bond0.200", "bond0.300"]
    # Up (sysfs: eth0 in bond0, bond0.200 on it): the setting goes on the VLAN's .network.
    root2 = stack_root(tmp_path / "up", monkeypatch, "networkd", ["eth0", "bond0", "bond0.200"])
    dpkg_systemd(root2, version)
    sysfs_link(root2, "bond0", "bond")
    sysfs_link(root2, "eth0", master="bond0")
    sysfs_link(root2, "bond0.200", "vlan", lowers=["bond0"])
    assert raf.main(["enable", "--dry-run", "eth0"]) == 2
    assert (
        "run 'ipv6-ra-forward enable bond0' (or 'ipv6-ra-forward enable bond0.200' for the "
        "network of the VLAN on it)" in capsys.readouterr().err
    )
    (root2 / "etc/systemd/network/30-bond0.200.network.d").mkdir()
    (root2 / "etc/systemd/network/30-bond0.200.network.d/nat.conf").write_text(
        "[Network]\nIPMasquerade=both\n"
    )
    assert raf.main(["enable", "bond0.200"]) == 1  # networkd would drop RAs: advice
    out = capsys.readouterr().out
    net2 = root2 / "etc/systemd/network"
    assert (
        f"# bond0.200 is a vlan (Kind=vlan in {net2}/30-bond0.200.netdev): the setting "
        "goes on bond0.200, not on its lower device.\n"
    ) in out
    assert f"{net2}/30-bond0.200.network" in out and key in out
    assert raf.main(["enable", "--networkd", "bond0.200"]) == 0
    dropin = net2 / "30-bond0.200.network.d/60-ipv6-ra-forward.conf"
    assert f"IPv6AcceptRA=yes\n{key}\n" in dropin.read_text()
    written = sorted(str(p.relative_to(net2)) for p in net2.rglob("*") if p.is_file())
    assert [p for p in written if "ipv6-ra-forward" in p] == [
        "30-bond0.200.network.d/60-ipv6-ra-forward.conf"
    ]  # not on bond0, not on a port


def test_ifupdown_bond_bridge_and_vlan(tmp_path, monkeypatch, capsys):
    root = stack_root(tmp_path, monkeypatch, "ifupdown", ["eth0", "eth2", "eth4"])
    interfaces = root / "etc/network/interfaces"
    # bond-slaves on the bond's stanza
    assert raf.main(["enable", "eth0"]) == 2
    assert (
        f"eth0 is a port of bond bond0 (ifupdown: bond-slaves eth0 eth1 ('iface bond0 "
        f"inet') in {interfaces}); bond0 will hold"
    ) in capsys.readouterr().err
    # bond-master on the port's stanza, the bond a bridge's port: the bridge, in one step
    assert raf.main(["enable", "eth2"]) == 2
    err = capsys.readouterr().err
    assert "eth2 is a port of bond bond1 (ifupdown: bond-master bond1 in" in err
    assert "itself a port of bridge br0 (bridge_ports bond1 ('iface br0 inet6'))" in err
    assert "run 'ipv6-ra-forward enable br0' once br0 exists" in err
    assert raf.main(["enable", "vlan300"]) == 2
    assert "ifupdown makes vlan300 ('iface vlan300 inet6' (vlan) in" in capsys.readouterr().err
    assert raf.main(["enable", "bond0.200"]) == 2
    assert "'ifup bond0.200' makes it" in capsys.readouterr().err
    assert owners.ifupdown_device(root, "br0").kind == "bridge"
    assert owners.ifupdown_device(root, "bond1").kind == "bond"
    assert owners.ifupdown_device(root, "eth2") is None
    # Up: the VLAN's static stanza with a gateway would write accept_ra 0 at ifup.
    root2 = stack_root(tmp_path / "up", monkeypatch, "ifupdown", ["eth0", "bond0", "bond0.200"])
    sysfs_link(root2, "bond0", "bond")
    sysfs_link(root2, "eth0", master="bond0")
    sysfs_link(root2, "bond0.200", "vlan", lowers=["bond0"])
    assert raf.main(["enable", "bond0.200"]) == 1
    out = capsys.readouterr().out
    assert "# bond0.200 is a vlan ('iface bond0.200 inet6' (vlan) in" in out
    assert "'iface bond0.200 inet6' stanza of" in out and "    accept_ra 2\n" in out
    assert (
        sysctl(root2, "bond0.200", "accept_ra") == 2 and sysctl(root2, "bond0", "accept_ra") == 1
    )
    assert sysctl(root2, "eth0", "accept_ra") == 1


@pytest.mark.parametrize(
    "version,how",
    [
        ("nm-1.42", "master=bond0, slave-type=bond"),
        ("nm-1.52", "controller=4a9f3d4e-2b51-4c2e-9d0f-6b1f3c2a8e10, port-type=bond"),
    ],
)
def test_networkmanager_bond_and_vlan(tmp_path, monkeypatch, capsys, version, how):
    root = stack_root(tmp_path, monkeypatch, version, ["eth0", "eth1"])
    (root / "run/NetworkManager").mkdir(parents=True)
    conns = root / "etc/NetworkManager/system-connections"
    assert raf.main(["enable", "eth1"]) == 2
    err = capsys.readouterr().err
    assert (
        f"eth1 is a port of bond bond0 (NetworkManager: {how} in "
        f"{conns}/bond0-port-eth1.nmconnection)"
    ) in err
    assert "run 'ipv6-ra-forward enable bond0' once bond0 exists" in err
    assert raf.main(["enable", "bond0.200"]) == 2
    assert (
        "NetworkManager makes bond0.200 (connection vlan200 (type=vlan) in "
        in capsys.readouterr().err
    )
    # Up: the VLAN profile (its parent named by UUID, no interface-name) is found.
    root2 = stack_root(
        tmp_path / "up", monkeypatch, version, ["eth0", "eth1", "bond0", "bond0.200"]
    )
    (root2 / "run/NetworkManager").mkdir(parents=True)
    sysfs_link(root2, "bond0", "bond")
    sysfs_link(root2, "bond0.200", "vlan", lowers=["bond0"])
    owner = owners.detect(root2, "bond0.200")
    assert (owner.name, owner.connection, owner.ipv6_method) == (
        owners.NETWORKMANAGER,
        "vlan200",
        "ignore",
    )
    assert raf.main(["enable", "bond0.200"]) == 1
    out = capsys.readouterr().out
    assert "# bond0.200 is a vlan (connection vlan200 (type=vlan) in" in out
    assert "nmcli connection modify vlan200 ipv6.method auto\n" in out
    assert sysctl(root2, "all", "forwarding") == 0  # the profile first


def test_ifupdown_names_the_file_holding_the_stanza(tmp_path, monkeypatch, capsys):
    """A stanza in a file that interfaces sources (source, source-directory) is named by
    that file in findings and advice, not by /etc/network/interfaces."""
    root = make_root(tmp_path, {n: (0, 1) for n in ("dhcp0", "gw0", "eth0")}, forwarding=1)
    net = root / "etc/network"
    (net / "interfaces.d").mkdir(parents=True)
    (net / "more").mkdir()
    (net / "interfaces").write_text(
        "auto lo\niface lo inet loopback\n"
        "source interfaces.d/*\n"
        "source-directory /etc/network/more\n"
        "iface eth0 inet6 auto\n"
    )
    (net / "interfaces.d/dhcp0").write_text("iface dhcp0 inet6 dhcp\n")
    (net / "more/gw0").write_text(
        "iface gw0 inet6 static\n  address 2001:db8::2/64\n  gateway 2001:db8::1\n"
        "iface bond9 inet manual\n  bond-slaves eth0\n"
    )
    (net / "more/skipped.cfg").write_text("iface skipped0 inet6 auto\n")  # run-parts: no '.'
    where = {(st.ifname, st.family): st.source for st in owners.ifupdown_stanza_list(root)}
    assert where[("dhcp0", "inet6")] == net / "interfaces.d/dhcp0"
    assert where[("gw0", "inet6")] == root / "etc/network/more/gw0"
    assert where[("eth0", "inet6")] == net / "interfaces"
    assert ("skipped0", "inet6") not in where
    assert owners.detect(root, "dhcp0").source == str(net / "interfaces.d/dhcp0")
    master = owners.ifupdown_master(root, "eth0")
    assert (master.master, master.source) == ("bond9", str(root / "etc/network/more/gw0"))
    assert owners.ifupdown_device(root, "bond9").source == str(root / "etc/network/more/gw0")
    report = raf.collect_status(root, ["dhcp0", "gw0"], [], [], [], raf.Config(), None)
    text = "\n".join(p["message"] for p in report["findings"])
    assert f"accept_ra=0 on gw0 at ifup ({root / 'etc/network/more/gw0'})" in text
    assert f"({net / 'interfaces'})" not in text
    patch(monkeypatch, "ROOT", root)
    patch(monkeypatch, "solicit", lambda name: True)
    assert raf.main(["enable", "dhcp0"]) == 1
    assert f"'iface dhcp0 inet6' stanza of {net / 'interfaces.d/dhcp0'}" in capsys.readouterr().out


def test_ifupdown_repeated_stanzas_run_in_order(tmp_path, monkeypatch, capsys):
    """ifup runs each iface stanza of a name on its own, in file order, with its own
    options and its method's defaults (ifupdown 0.8 config.c, main.c, inet6.defn): the
    last inet6 stanza that writes accept_ra decides, and its file is the one named."""
    root = make_root(tmp_path, {n: (0, 1) for n in ("eth0", "eth1", "eth2", "eth3")}, forwarding=1)
    net = root / "etc/network"
    (net / "interfaces.d").mkdir(parents=True)
    (net / "interfaces").write_text(
        # dhcp with accept_ra 2 here; a second dhcp stanza, sourced at the end, writes
        # its default, 1
        "iface eth0 inet6 dhcp\n  accept_ra 2\n"
        # static with accept_ra 2, then static with a gateway: 0 at the end
        "iface eth1 inet6 static\n  address 2001:db8::1/64\n  accept_ra 2\n"
        "iface eth1 inet6 static\n  address 2001:db8::2/64\n  gateway 2001:db8::ff\n"
        # auto with accept_ra 1, then auto again: 2 at the end, nothing to do
        "iface eth2 inet6 auto\n  accept_ra 1\n"
        "iface eth2 inet6 auto\n  mtu 1400\n"
        # a static stanza without a gateway writes nothing: the dhcp one before decides
        "iface eth3 inet6 dhcp\n"
        "iface eth3 inet6 static\n  address 2001:db8::3/64\n"
        "source interfaces.d/*\n"
    )
    (net / "interfaces.d/more").write_text("iface eth0 inet6 dhcp\n  request_prefix 1\n")
    expect = {
        "eth0": ("1", net / "interfaces.d/more"),
        "eth1": ("0", net / "interfaces"),
        "eth2": ("2", net / "interfaces"),
        "eth3": ("1", net / "interfaces"),
    }
    for name, (value, source) in expect.items():
        owner = owners.detect(root, name)
        assert (raf.ifupdown_accept_ra(owner), owner.source) == (value, str(source)), name
    report = raf.collect_status(root, list(expect), [], [], [], raf.Config(), None)
    text = "\n".join(p["message"] for p in report["findings"] if p["code"] == "ifupdown")
    assert f"accept_ra=1 on eth0 at ifup ({net / 'interfaces.d/more'})" in text
    assert f"accept_ra=0 on eth1 at ifup ({net / 'interfaces'})" in text
    assert "eth2" not in text
    patch(monkeypatch, "ROOT", root)
    patch(monkeypatch, "solicit", lambda name: True)
    assert raf.main(["enable", "eth0"]) == 1
    assert f"'iface eth0 inet6' stanza of {net / 'interfaces.d/more'}" in capsys.readouterr().out


def test_ifupdown_lines_as_ifup_reads_them(tmp_path):
    """config.c get_line: a comment never goes on, even ending in a backslash; a
    backslash goes on only as the line's last character (not before a blank or a CR);
    an option given twice in a stanza writes its first value; source-directory (any word
    starting with source-dir) takes shell wildcards and ASCII names only; a bare auto or
    allow-* does not end a stanza; a stanza's options are named by its file."""
    root = tmp_path / "root"
    net = root / "etc/network"
    (net / "interfaces.d").mkdir(parents=True)
    (net / "dirs/a").mkdir(parents=True)
    (net / "interfaces").write_text(
        "# see C:\\\n"
        "iface eth0 inet6 dhcp\n  accept_ra 0\n  accept_ra 2\n"
        "iface eth1 inet manual\n  bond-master bond0\n"
        "iface br0 inet6 auto\n  bridge_ports \\\n    eth5 eth6\n"
        "iface br1 inet6 auto\n  bridge_ports eth7 \\ \n  accept_ra 0\n"
        "iface br2 inet6 auto\r\n  bridge_ports eth8 \\\r\n  accept_ra 0\r\n"
        "iface eth2 inet6 dhcp\n  auto\n  allow-hotplug\n  accept_ra 2\n"
        "source interfaces.d/*\n"
        "source-dir dirs/*\n"  # ifup: any word starting with source-dir
    )
    (net / "interfaces.d/mtu").write_text("iface eth1 inet manual\n  mtu 9000\n")
    (net / "dirs/a/vlan7").write_text("iface vlan7 inet6 auto\n  vlan-raw-device eth4\n")
    (net / "dirs/a/\u00e9th9").write_text("iface eth9 inet6 auto\n")  # not ASCII: skipped
    stanzas = {(st.ifname, st.family): st.options for st in owners.ifupdown_stanza_list(root)}
    assert stanzas[("eth0", "inet6")] == {"method": "dhcp", "accept_ra": "0"}
    master = owners.ifupdown_master(root, "eth1")
    assert (master.master, master.source) == ("bond0", str(net / "interfaces"))
    assert stanzas[("br0", "inet6")]["bridge_ports"] == "eth5 eth6"
    assert stanzas[("br1", "inet6")] == {
        "method": "auto",
        "bridge_ports": "eth7 \\",
        "accept_ra": "0",
    }
    assert stanzas[("br2", "inet6")] == {
        "method": "auto",
        "bridge_ports": "eth8 \\",
        "accept_ra": "0",
    }
    port = owners.ifupdown_master(root, "eth6")
    assert (port.master, port.kind) == ("br0", "bridge")
    vlan = owners.ifupdown_device(root, "vlan7")
    assert (vlan.kind, vlan.source) == ("vlan", str(net / "dirs/a/vlan7"))
    assert ("eth9", "inet6") not in stanzas
    # a bare auto or allow-* in a stanza marks its interface; the stanza goes on
    assert stanzas[("eth2", "inet6")] == {"method": "dhcp", "accept_ra": "2"}
