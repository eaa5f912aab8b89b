"""Import debadmin from the tree under test, never from an installed python3-debadmin.

pybuild runs the tests from its build directory (which holds debadmin/ and comes first on
sys.path); anywhere else the source tree's lib/ goes first.

Two markers for the few tests that cannot run everywhere the package builds; each skips,
saying why, only where its need is missing, and runs under 'make unit' as root:

  @pytest.mark.needs_root         the tool only acts on files root owns (journal-acl-setup
                                  skips anything else), and only root can make them
  @pytest.mark.needs_mapped_ids   the test writes ACL entries for the ids sbuild's chroots
                                  map (100000, a subordinate root); sbuild in unshare mode
                                  builds in a user namespace that maps 65536 ids from 0,
                                  where the kernel refuses any other id with EINVAL
"""

import os
import sys
from pathlib import Path

import pytest

if not (Path.cwd() / "debadmin" / "__init__.py").is_file():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "lib"))

# The subordinate ids the sbuild-fast and posixacl tests grant ACL entries to.
MAPPED_IDS_NEEDED = (100000,)


def unmapped(ids, map_file):
    """The ids of IDS that /proc/self/{uid,gid}_map does not map into this namespace."""
    try:
        lines = Path(map_file).read_text(encoding="ascii").splitlines()
    except OSError:
        return []  # no user namespaces in this kernel: every id is the kernel's own
    ranges = [tuple(int(n) for n in line.split()) for line in lines if line.strip()]
    return [i for i in ids if not any(inner <= i < inner + count for inner, _, count in ranges)]


def missing_need(item):
    """Why ITEM cannot run here, or None."""
    if item.get_closest_marker("needs_root") and os.geteuid() != 0:
        return (
            f"needs root (uid {os.geteuid()} here): the tool acts only on files root owns, "
            "and only root can make them"
        )
    if item.get_closest_marker("needs_mapped_ids"):
        for kind in ("uid", "gid"):
            ids = unmapped(MAPPED_IDS_NEEDED, f"/proc/self/{kind}_map")
            if ids:
                return (
                    f"{kind} {', '.join(map(str, ids))} is not mapped in this user namespace "
                    "(an unshare-mode build maps 65536 ids): the kernel refuses ACL entries "
                    "for it"
                )
    return None


def pytest_configure(config):
    config.addinivalue_line("markers", "needs_root: skip, saying why, unless run as root")
    config.addinivalue_line(
        "markers",
        "needs_mapped_ids: skip, saying why, where uid/gid 100000 is not mapped "
        "(sbuild's unshare mode)",
    )


def pytest_runtest_setup(item):
    reason = missing_need(item)
    if reason:
        pytest.skip(reason)


@pytest.fixture(autouse=True)
def no_host_metrics(tmp_path_factory, monkeypatch):
    """Tools' runs never write the host's node_exporter textfiles (debadmin.metrics):
    the directory they write is one that does not exist, unless a test sets another."""
    from debadmin import metrics

    missing = tmp_path_factory.mktemp("textfile")
    missing.rmdir()  # a path of this test's own, made by the test that wants it
    monkeypatch.setattr(metrics, "DIRECTORY", missing)
    return missing
