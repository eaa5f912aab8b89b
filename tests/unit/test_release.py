"""The per-release versions of make sbuild (build-aux/sbuild-release) sort for upgrades."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2]
SCRIPT = SRC / "build-aux" / "sbuild-release"

needs_dpkg = pytest.mark.skipif(not shutil.which("dpkg"), reason="dpkg is not installed")


def version_for(release, version):
    result = subprocess.run(
        ["bash", str(SCRIPT), "--version-for", release, version],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0 and result.stderr == "", result.stderr
    return result.stdout.strip()


def dpkg_lt(a, b):
    return subprocess.run(["dpkg", "--compare-versions", a, "lt", b], check=False).returncode == 0


def changelog_version():
    top = (SRC / "debian/changelog").read_text().splitlines()[0]
    return re.match(r"debadmin \(([^)~]+)", top).group(1)


def test_release_suffixes():
    assert version_for("bookworm", "0.2.0") == "0.2.0~deb12u1"
    assert version_for("trixie", "0.2.0") == "0.2.0~deb13u1"


def test_unknown_release_is_refused():
    result = subprocess.run(
        ["bash", str(SCRIPT), "--version-for", "sid", "0.2.0"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2 and result.stdout == ""
    assert (
        result.stderr == "sbuild-release: error: unknown release 'sid' (bookworm, trixie, forky)\n"
    )


@needs_dpkg
def test_versions_sort_for_upgrades():
    """0.1.0 < bookworm's build < trixie's build < the plain release < Debian's own upload:
    a release upgrade takes the trixie build, and a plain or Debian build replaces both."""
    order = [
        "0.1.0",
        version_for("bookworm", "0.2.0"),
        version_for("trixie", "0.2.0"),
        "0.2.0",
        "0.2.0-1",
        "0.2.0+deb13u1",
    ]
    for older, newer in zip(order, order[1:]):
        assert dpkg_lt(older, newer), f"{older} does not sort below {newer}"


@needs_dpkg
def test_this_release_upgrades_the_previous():
    version = changelog_version()
    for release in ("bookworm", "trixie"):
        assert dpkg_lt("0.1.0", version_for(release, version))
    assert dpkg_lt(version_for("bookworm", version), version_for("trixie", version))
