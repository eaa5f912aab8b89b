"""sbuild-fast doctor: gather facts about the host, sbuild and the chroots, then judge them.

gather_facts() reads the system (findmnt, btrfs, the tarballs, sbuild's configuration,
/etc/subuid...) into one facts record; each rule_* function reads only that record and
returns findings in debadmin's shared shape.  Tests build facts records by hand.
"""

import os
import pwd
import re
import shutil
import tarfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from debadmin import proc
from debadmin.errors import EXIT_ACTION, EXIT_OK, Error
from debadmin.findings import finding, needs_action, text_lines
from debadmin.output import emit_json
from debadmin.sbuild_fast import sbuild as sbs
from debadmin.sbuild_fast import leftovers as sfl
from debadmin.sbuild_fast import session as sfs

Facts = Dict
Findings = List[Dict]


def zstd_level(options: str) -> Optional[int]:
    """The zstd level of a btrfs compress=/compress-force= mount option (3 when unset)."""
    for opt in options.split(","):
        key, _, value = opt.partition("=")
        if key in ("compress", "compress-force") and value.startswith("zstd"):
            _, _, level = value.partition(":")
            return int(level) if level.isdigit() else 3
    return None


def btrfs_property_compression(path: Path) -> Optional[str]:
    if not shutil.which("btrfs"):
        return None
    result = proc.run(["btrfs", "property", "get", str(path), "compression"], check=False)
    match = re.search(r"compression=(\S+)", result.stdout)
    return match.group(1) if match else None


SUBID_COUNT = 65536
SUBID_MIN = 100000  # shadow's default SUB_UID_MIN / SUB_GID_MIN
ZSTD_STALL_LEVEL = 10  # btrfs zstd levels from here on stall fsync-heavy builds


def subid_ranges(path: Path) -> List[Tuple[str, int, int]]:
    """The (owner, first id, count) lines of an /etc/subuid or /etc/subgid file."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    ranges = []
    for line in text.splitlines():
        fields = line.strip().split(":")
        if len(fields) == 3 and fields[1].isdigit() and fields[2].isdigit():
            ranges.append((fields[0], int(fields[1]), int(fields[2])))
    return ranges


def user_subids(path: Path, user: str) -> Optional[Tuple[int, int]]:
    """(first id, count) that sbuild's unshare mode takes for user: the first line whose
    owner is the user's name (Sbuild::Utility::read_subuid_subgid; a line for the numeric
    uid or a second line for the name is never read)."""
    for owner, start, count in subid_ranges(path):
        if owner == user:
            return start, count
    return None


def read_subids(path: Path, user: str) -> int:
    """How many subordinate ids sbuild's unshare mode gets for user from path."""
    entry = user_subids(path, user)
    return entry[1] if entry else 0


def free_subid_range(path: Path) -> Tuple[int, int]:
    """A range of SUBID_COUNT ids after every range path hands out (first, last)."""
    end = max([start + count for _, start, count in subid_ranges(path)] + [SUBID_MIN])
    return end, end + SUBID_COUNT - 1


def subid_advice(path: Path, kind: str, user: str) -> str:
    """The usermod commands that give user a range sbuild can use."""
    flag = f"sub{kind[3:]}s"  # subuids / subgids
    mine = [(start, count) for owner, start, count in subid_ranges(path) if owner == user]
    big = [i for i, (_, count) in enumerate(mine) if count >= SUBID_COUNT]
    # sbuild reads only the first line for the user: shorter ones before a big one go.
    keep = big[0] if big else len(mine)
    commands = [f"usermod --del-{flag} {a}-{a + max(n, 1) - 1} {user}" for a, n in mine[:keep]]
    if not big:
        first, last = free_subid_range(path)
        commands.append(f"usermod --add-{flag} {first}-{last} {user}")
    return " && ".join(commands)


# The apt-get wrapper's command: eatmydata, behind the package cache's flock when it has one.
APT_GET_UNDER_EATMYDATA = r"^exec (\S*/flock .*)?/usr/bin/eatmydata /usr/bin/apt-get "


# Members whose presence alone is a fact of the chroot.
PRESENT_MEMBERS = {
    "./usr/bin/dh": "debhelper",
    "./bin/dh": "debhelper",
    "./usr/bin/fakeroot": "fakeroot",
    "./usr/bin/fakeroot-sysv": "fakeroot",
    "./usr/bin/lintian": "lintian",
    "./usr/bin/eatmydata": "eatmydata",
    "./var/lib/man-db/auto-update": "mandb_auto_update",
    "." + sbs.MARKER: "marker",
}


def _member_text(tar: tarfile.TarFile, member: tarfile.TarInfo, limit: int) -> str:
    handle = tar.extractfile(member)
    return handle.read(limit).decode("utf-8", "replace") if handle else ""


def _content_facts(tar: tarfile.TarFile, member: tarfile.TarInfo, name: str) -> Dict[str, bool]:
    """The facts a member's content (or link target) tells: eatmydata wired into dpkg and
    apt, docs excluded."""
    if name == "." + sbs.EATMYDATA_DIR + "/dpkg":
        return {"eatmydata_dpkg": member.issym() and member.linkname.endswith("/eatmydata")}
    if not member.isfile():
        return {}
    if name == "./" + sbs.EATMYDATA_APT_CONF.lstrip("/"):
        text = _member_text(tar, member, 4096)
        return {"apt_uses_eatmydata": f'"{sbs.EATMYDATA_DIR}/dpkg"' in text}
    if name == f".{sbs.APT_WRAPPER_DIR}/apt-get":
        text = _member_text(tar, member, 4096)
        return {
            "apt_under_eatmydata": sbs.APT_WRAPPER_TAG in text
            and bool(re.search(APT_GET_UNDER_EATMYDATA, text, re.M))
        }
    if name == "./etc/dpkg/dpkg.cfg.d/99mmdebstrap":
        text = _member_text(tar, member, 65536)
        return {"docs_excluded": "path-exclude=/usr/share/doc/*" in text}
    return {}


def inspect_tarball(path: Path) -> Dict[str, bool]:
    """What the chroot really holds: debhelper, eatmydata wired into apt, man-db off."""
    found = {
        "debhelper": False,
        "fakeroot": False,
        "lintian": False,
        "eatmydata": False,
        "eatmydata_dpkg": False,
        "apt_uses_eatmydata": False,
        "apt_under_eatmydata": False,
        "mandb_auto_update": False,
        "marker": False,
        "docs_excluded": False,
        "apt_lists": False,
    }
    try:
        with tarfile.open(path, "r|*") as tar:
            for member in tar:
                name = member.name if member.name.startswith("./") else "./" + member.name
                if name in PRESENT_MEMBERS:
                    found[PRESENT_MEMBERS[name]] = True
                elif name.startswith("./var/lib/apt/lists/") and name.endswith("_Packages"):
                    found["apt_lists"] = True
                else:
                    found.update(_content_facts(tar, member, name))
    except (OSError, tarfile.TarError, EOFError) as exc:
        raise Error(f"cannot read {path}: {exc}") from None
    return found


def inspect_directory(path: Path, conf: Path) -> Dict[str, bool]:
    """What a schroot-mode chroot holds, and whether schroot prefixes commands with eatmydata."""
    try:
        conf_text = conf.read_text(encoding="utf-8", errors="replace")
    except OSError:
        conf_text = ""
    return {
        "debhelper": (path / "usr/bin/dh").exists(),
        "fakeroot": (path / "usr/bin/fakeroot").exists(),
        "lintian": (path / "usr/bin/lintian").exists(),
        "eatmydata": (path / "usr/bin/eatmydata").exists(),
        "command_prefix_eatmydata": bool(
            re.search(r"^command-prefix=eatmydata\b", conf_text, re.M)
        ),
        "mandb_auto_update": (path / "var/lib/man-db/auto-update").exists(),
        "marker": (path / sbs.MARKER.lstrip("/")).exists(),
    }


# --- gathering ------------------------------------------------------------------------------


def installed_versions() -> Dict[str, Optional[str]]:
    versions = {}
    for pkg in ("sbuild", "mmdebstrap"):
        result = proc.run(["dpkg-query", "-W", "-f", "${Version}", pkg], check=False)
        versions[pkg] = result.stdout.strip() or None
    return versions


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _chroot_facts(
    state: Dict, facts: Facts, cache_dir: Path, root: Path, inspect: bool, schroot_names: Dict
) -> Dict:
    """describe() of a record plus what sbuild's lookup and the chroot's content say."""
    info = sbs.describe(state, facts["now"])
    if not info["present"]:
        return info
    if state["mode"] == "unshare":
        info["shadowed_by"] = [
            str(cache_dir / found)
            for shadow in sbs.shadowing_names(state["dist"], state["arch"])
            for found in sbs.matching_files(cache_dir, shadow)
        ]
        info["competing"] = [
            str(cache_dir / other)
            for other in sbs.conflicting_files(cache_dir, state["name"], f"{state['name']}.tar")
        ]
        if inspect:
            try:
                info["content"] = inspect_tarball(Path(info["path"]))
            except Error as exc:
                info["content_error"] = str(exc)
    else:
        own_conf = root / sbs.SCHROOT_CONF_DIR / f"sbuild-fast-{state['name']}"
        info["schroot_conf"] = str(own_conf)
        info["schroot_shadow"] = sbs.schroot_shadow_message(
            state, sbs.schroot_lookup(state["dist"], state["arch"], schroot_names)
        )
        if inspect:
            info["content"] = inspect_directory(Path(info["path"]), own_conf)
    return info


def _checked_dirs(
    facts: Facts, states: Sequence[Dict], build_dirs: Sequence[Path], root: Path
) -> List[Tuple[str, Path]]:
    """(role, directory) of the filesystems builds write to: the unpack dir, the build
    dirs, the chroot store, schroot's overlay directory."""
    template = facts["sbuild_config"].get("unshare_tmpdir_template") or (
        "/tmp/tmp.sbuild.XXXXXXXXXX"
    )
    checked = []
    if facts["unshare_used"]:
        checked.append(("unpack", root / Path(template).parent.relative_to("/")))
    checked += [("build", Path(d)) for d in build_dirs]
    if facts["unshare_used"] or not states:
        checked.append(("store", Path(facts["cache_dir"])))
    if any(s["mode"] == "schroot" for s in states):
        # schroot sessions write into an overlay directory over the chroot store.
        checked.append(("store", root / sbs.SCHROOT_BASE.relative_to("/")))
        checked += [("overlay", d) for d in sbs.schroot_overlay_dirs(states, root)]
    return checked


def gather_facts(
    cache_dir: Path,
    config: Dict[str, str],
    build_dirs: Sequence[Path],
    states: List[Dict],
    versions: Dict[str, Optional[str]],
    now: float,
    root: Path = Path("/"),
    inspect: bool = True,
    uid: Optional[int] = None,
    config_error: Optional[str] = None,
    fs_probe: Optional[Callable[[Path], Tuple[Optional[str], str]]] = None,
    btrfs_probe: Optional[Callable[[Path], Optional[str]]] = None,
    cost_probe: Optional[Callable[[str, Optional[str]], Optional[float]]] = None,
    caches: Optional[List[Dict]] = None,
) -> Facts:
    """Everything the rules judge, read once. uid: the user who builds (default: the
    caller); fs_probe/btrfs_probe: how filesystems are read (findmnt, btrfs property);
    cost_probe(mode, schroot chroot): seconds per command in the chroot (default: not
    timed); caches: the package caches (sbs.package_caches), none by default."""
    fs_probe = fs_probe or sbs.fs_of
    btrfs_probe = btrfs_probe or btrfs_property_compression
    uid = os.getuid() if uid is None else uid
    mode = config.get("chroot_mode", "")
    sbuild_ver = versions.get("sbuild")
    facts: Facts = {
        "now": now,
        "versions": dict(versions),
        "sbuild_config": config,
        "config_error": config_error,
        "user": _user_name(uid),
        "uid": uid,
        "cache_dir": str(cache_dir),
        "chroot_mode": mode,
        "session_backend": sbs.uses_session_backend(config),
        "unshare_used": mode in ("unshare", "autopkgtest")
        or any(s["mode"] == "unshare" for s in states),
    }
    # A user with no chroot yet is about to make one in unshare mode, the default.
    if facts["unshare_used"] or (not states and uid != 0):
        facts.update(_subid_facts(root, facts["user"]))
    facts.update(_auto_create_facts(config, sbuild_ver))
    names = sbs.schroot_names(root) if any(s["mode"] == "schroot" for s in states) else {}
    facts["chroots"] = [_chroot_facts(s, facts, cache_dir, root, inspect, names) for s in states]
    facts["filesystems"] = [
        _filesystem_facts(role, directory, fs_probe, btrfs_probe)
        for role, directory in _checked_dirs(facts, states, build_dirs, root)
    ]
    facts["tmpfs_unpack_template"] = sbs.tmpfs_unpack_template(root, fs_probe)
    fits, why = sbs.tmpfs_overlay_fit(root, fs_probe)
    facts["tmpfs_overlay"] = {"fits": fits, "reason": why}
    facts["schroot_installed"] = (root / "usr/bin/schroot").exists()
    facts["caches"] = list(caches or [])
    facts["command_cost"] = _command_costs(facts, cost_probe) if cost_probe else {}
    return facts


def _subid_facts(root: Path, user: str) -> Facts:
    """The user's subordinate ids, and advice on them, as unshare mode needs them."""
    facts: Facts = {"subid_advice": {}}
    for kind in ("subuid", "subgid"):
        path = root / "etc" / kind
        facts[kind] = read_subids(path, user)
        facts["subid_advice"][kind] = subid_advice(path, kind, user)
    return facts


def _auto_create_facts(config: Dict[str, str], sbuild_ver: Optional[str]) -> Facts:
    """sbuild's mmdebstrap auto-create: whether it would replace an old tarball."""
    max_age = sbs.auto_create_max_age(config, sbuild_ver)
    return {
        "auto_create_trap": max_age is not None,
        "auto_create_max_age": max_age,
        "auto_create_keeps_tarball": config.get("unshare_mmdebstrap_keep_tarball", "").strip()
        not in ("", "0"),
    }


def _filesystem_facts(
    role: str,
    directory: Path,
    fs_probe: Callable[[Path], Tuple[Optional[str], str]],
    btrfs_probe: Callable[[Path], Optional[str]],
) -> Dict:
    """One checked directory's filesystem, with btrfs's compression where it is btrfs."""
    fstype, options = fs_probe(directory)
    entry = {"role": role, "path": str(directory), "fstype": fstype, "options": options}
    if fstype == "btrfs":
        entry["zstd_level"] = zstd_level(options)
        entry["compression_property"] = btrfs_probe(directory)
    return entry


def _first_present(facts: Facts, mode: str) -> Optional[Dict]:
    for chroot in facts["chroots"]:
        if chroot["mode"] == mode and chroot["present"]:
            return chroot
    return None


def _command_costs(
    facts: Facts, cost_probe: Callable[[str, Optional[str]], Optional[float]]
) -> Dict[str, Optional[float]]:
    """Seconds per command in the chroot, by the modes in use."""
    costs: Dict[str, Optional[float]] = {}
    if facts["unshare_used"]:
        costs["unshare"] = cost_probe("unshare", None)
        # Only where plain builds use it: starting a session on a chroot
        # that cannot hold one has been seen to hang (an autopkgtest testbed without
        # subordinate ids), and doctor must answer.
        chroot = _first_present(facts, "unshare") if facts.get("session_backend") else None
        if chroot:
            costs["session"] = cost_probe("session", chroot["name"])
    chroot = _first_present(facts, "schroot")
    if chroot:
        costs["schroot"] = cost_probe("schroot", f"{chroot['name']}-sbuild-fast")
    return costs


def command_cost(mode: str, chroot: Optional[str]) -> Optional[float]:
    """gather()'s cost_probe: one sbuild-style command in the chroot, timed."""
    if mode == "unshare":
        return sbs.unshare_command_cost(sbs.sbuild_version())
    if mode == "session":
        return session_command_cost(chroot) if chroot else None
    return sbs.schroot_command_cost(chroot) if chroot else None


def command_cost_read_only(mode: str, chroot: Optional[str]) -> Optional[float]:
    """command_cost for --dry-run: unshare mode's timing writes nothing; a session unpacks
    the chroot and schroot writes a session's files, so they are not timed (None)."""
    return command_cost(mode, chroot) if mode == "unshare" else None


def session_command_cost(name: str) -> Optional[float]:
    """Seconds per command through the session backend, on the user's chroot name (it
    unpacks the tarball once, as a build does), or None where the backend does not work."""
    state = sbs.load_state(sbs.user_cache_dir() / sbs.STATE_SUBDIR / f"{name}.json")
    if state is None:
        return None
    session = sfs.Session(
        Path(state["path"]),
        _user_name(os.getuid()),
        sfs.default_binds(state, sbs.package_cache_dir("unshare")),
        sfs.mountpoint_parent(),
    )
    try:
        return sfs.self_test(session)
    except Error:
        return None


def gather(build_dirs: Sequence[Path], root: Path = Path("/"), dry_run: bool = False) -> Facts:
    """gather_facts() for the calling user on this host; dry_run: nothing is written
    anywhere (no leftover removed, no chroot unpacked or schroot session opened to time
    a command)."""
    versions = installed_versions()
    config: Dict[str, str] = {}
    config_error = None
    if versions["sbuild"]:
        try:
            config = sbs.effective_sbuild_config(versions["sbuild"])
        except Error as exc:
            config_error = str(exc)
    states = sbs.all_states()
    facts = gather_facts(
        sbs.user_cache_dir(),
        config,
        build_dirs,
        states,
        versions,
        time.time(),
        root=root,
        config_error=config_error,
        cost_probe=command_cost_read_only if dry_run else command_cost,
        caches=sbs.package_caches(states),
    )
    facts["leftovers"] = remove_leftovers(config.get("unshare_tmpdir_template"), dry_run)
    facts["dry_run"] = dry_run
    return facts


def remove_leftovers(template: Optional[str], dry_run: bool = False) -> List[Dict]:
    """The calling user's dead leftovers (trees of killed sessions, of failed unshare-mode
    builds), each removed (with dry_run, each judged only): the doctor's one change, as
    every sbuild-fast start makes it. Root's are reported, never touched."""
    uid = os.getuid()
    extra = [os.path.dirname(template)] if template else []
    found = sfl.dead_leftovers(_user_name(uid), uid, extra)
    out = []
    for item in found:
        status = sfl.remove(item, uid, sfl.removal_argv(), dry_run=dry_run)
        out.append(
            {
                "path": str(item.path),
                "kind": item.kind,
                "removed": status == "removed",
                "status": status,
            }
        )
    return out


# --- rules: facts in, findings out ----------------------------------------------------------


def rule_sbuild_config(facts: Facts) -> Findings:
    # sbuild itself fails on this configuration: the first thing to fix.
    if not facts.get("config_error"):
        return []
    return [finding("sbuild-config", "action", facts["config_error"])]


def rule_subids(facts: Facts) -> Findings:
    found = []
    for kind in ("subuid", "subgid"):
        count = facts.get(kind)
        if count is None or count >= SUBID_COUNT:
            continue
        found.append(
            finding(
                f"no-{kind}",
                "action",
                f"sbuild's unshare mode takes the first line for {facts['user']} in "
                f"/etc/{kind}: {count} ids, it needs {SUBID_COUNT}: "
                + facts["subid_advice"][kind],
                f"/etc/{kind}",
            )
        )
    return found


def rule_chroot_mode(facts: Facts) -> Findings:
    mode = facts["chroot_mode"]
    if mode == "unshare" or not any(c["mode"] == "unshare" for c in facts["chroots"]):
        return []
    if facts.get("session_backend"):
        return [
            finding(
                "session-backend",
                "info",
                "plain 'sbuild -d DIST' builds go through sbuild-fast's session backend "
                "(sbuild's autopkgtest mode): one namespace set per build, entered per "
                "command, the build without network, every process killed when it ends; "
                "'sbuild --chroot-mode=unshare' builds in sbuild's unshare mode",
            )
        ]
    return [
        finding(
            "chroot-mode",
            "action",
            f"sbuild's chroot_mode is {mode or 'unset'}: plain 'sbuild -d DIST' "
            "ignores the sbuild-fast tarballs (run 'sbuild-fast create --configure')",
        )
    ]


def rule_auto_create(facts: Facts) -> Findings:
    max_age = facts["auto_create_max_age"]
    if max_age is None or not facts["unshare_used"]:
        return []
    what = "overwrites it with" if facts["auto_create_keeps_tarball"] else "builds in"
    return [
        finding(
            "auto-create",
            "action",
            f"sbuild {facts['versions'].get('sbuild')} re-creates unshare chroots whose "
            f"tarball is {max_age / 86400:g} days old and {what} a plain mmdebstrap chroot "
            "($unshare_mmdebstrap_auto_create is on): run 'sbuild-fast create --configure', "
            "or set $unshare_mmdebstrap_auto_create = 0 in the sbuild configuration",
        )
    ]


def chroot_age(chroot: Dict, facts: Facts) -> Findings:
    since = chroot["modified"] if chroot["modified"] is not None else chroot["created"]
    age = facts["now"] - since
    replaced_at = facts["auto_create_max_age"] if chroot["mode"] == "unshare" else None
    if replaced_at is not None and age >= replaced_at - sbs.AGE_MARGIN:
        message = (
            f"{chroot['name']} is {chroot['age_days']} days old and sbuild re-creates it "
            f"plainly at {replaced_at / 86400:g} days: run 'sbuild-fast update' or "
            "enable sbuild-fast-update.timer"
        )
    elif chroot["age_days"] > sbs.MAX_AGE_DAYS:
        message = (
            f"{chroot['name']} is {chroot['age_days']} days old: run "
            "'sbuild-fast update' or enable sbuild-fast-update.timer"
        )
    else:
        return []
    return [finding("old-chroot", "action", message, chroot["path"])]


def chroot_lookup(chroot: Dict, facts: Facts) -> Findings:
    """Other files or schroot chroots that sbuild takes instead of ours."""
    found = [
        finding(
            "shadowed",
            "action",
            f"'sbuild -d {chroot['dist']}' takes {Path(path).name} before {chroot['name']}.tar",
            path,
        )
        for path in chroot.get("shadowed_by", ())
    ]
    found += [
        finding(
            "competing-file",
            "action",
            f"{Path(path).name} competes with {chroot['name']}.tar in sbuild's lookup",
            path,
        )
        for path in chroot.get("competing", ())
    ]
    if chroot.get("schroot_shadow"):
        found.append(
            finding("shadowed", "action", chroot["schroot_shadow"], chroot["schroot_conf"])
        )
    return found


def _eatmydata_wired(chroot: Dict) -> bool:
    content = chroot["content"]
    if chroot["mode"] == "unshare":
        keys = ("eatmydata", "eatmydata_dpkg", "apt_uses_eatmydata", "apt_under_eatmydata")
    else:
        keys = ("eatmydata", "command_prefix_eatmydata")
    return all(content.get(k) for k in keys)


def chroot_content(chroot: Dict, facts: Facts) -> Findings:  # noqa: ARG001 - rule signature
    """What the tarball or directory really holds."""
    path = chroot["path"]
    if chroot.get("content_error"):
        return [
            finding(
                "unreadable",
                "action",
                f"{chroot['content_error']}: run 'sbuild-fast update --recreate "
                f"{chroot['dist']}'",
                path,
            )
        ]
    content = chroot.get("content")
    if content is None:
        return []
    found = [
        finding("not-preinstalled", "action", f"{key} is missing from {path}", path)
        for key in ("debhelper", "fakeroot")
        if not content[key]
    ]
    if chroot.get("eatmydata", True) and not _eatmydata_wired(chroot):
        if chroot["mode"] == "unshare":
            message = (
                f"apt and dpkg in {path} do not run under eatmydata: "
                f"run 'sbuild-fast update {chroot['dist']}'"
            )
        else:
            message = f"schroot does not run {chroot['name']}-sbuild-fast under eatmydata"
        found.append(finding("no-eatmydata", "action", message, path))
    if content["mandb_auto_update"]:
        where = f"from {path}" if chroot["mode"] == "unshare" else f"in {path}"
        found.append(
            finding(
                "man-db", "action", f"man-db rebuilds its database in every build {where}", path
            )
        )
    return found


def chroot_lintian(chroot: Dict, facts: Facts) -> Findings:
    """sbuild runs lintian by default, and installs it (with its Perl dependencies) into
    every throwaway chroot that lacks it: measured 9 s of a 19 s build."""
    run_lintian = facts["sbuild_config"].get("run_lintian")
    content = chroot.get("content")
    if (
        run_lintian is None
        or run_lintian.strip() in ("", "0")
        or content is None
        or content.get("lintian")
        or chroot.get("lintian") is False  # left out on purpose (create --no-lintian)
    ):
        return []
    return [
        finding(
            "lintian-not-preinstalled",
            "warning",
            f"sbuild runs lintian after every build and installs it into a throwaway copy of "
            f"{chroot['name']} each time: run 'sbuild-fast create --dist {chroot['dist']}"
            + (" --mode schroot" if chroot["mode"] == "schroot" else "")
            + "' to preinstall it (or 'sbuild --no-run-lintian')",
            chroot["path"],
        )
    ]


CHROOT_RULES = (chroot_age, chroot_lookup, chroot_content, chroot_lintian)


def rule_chroots(facts: Facts) -> Findings:
    found: Findings = []
    for chroot in facts["chroots"]:
        if not chroot["present"]:
            found.append(
                finding(
                    "missing",
                    "action",
                    f"{chroot['path']} is gone: run 'sbuild-fast create --dist {chroot['dist']}'",
                    chroot["path"],
                )
            )
            continue
        for rule in CHROOT_RULES:
            found += rule(chroot, facts)
    return found


def btrfs_level(fs: Dict) -> Optional[int]:
    """The zstd level btrfs compresses with: the mount option's, or the directory's
    compression property's when higher."""
    level = fs.get("zstd_level")
    prop = fs.get("compression_property")
    if prop and prop.startswith("zstd"):
        _, _, plevel = prop.partition(":")
        level = max(level or 0, int(plevel) if plevel.isdigit() else 3)
    return level


def filesystem_findings(fs: Dict, facts: Facts) -> Findings:
    found = []
    directory, fstype, options = fs["path"], fs["fstype"], fs["options"]
    if fs["role"] == "unpack" and fstype != "tmpfs":
        tmpl = facts.get("tmpfs_unpack_template")
        hint = f"set $unshare_tmpdir_template = '{tmpl}'" if tmpl else "mount a tmpfs for it"
        found.append(
            finding(
                "unpack-not-tmpfs",
                "action",
                f"sbuild unpacks every chroot into {directory} ({fstype}), not tmpfs: {hint}",
                directory,
            )
        )
    level = btrfs_level(fs) if fstype == "btrfs" else None
    if level is not None and level >= ZSTD_STALL_LEVEL:
        found.append(
            finding(
                "btrfs-compression",
                "action",
                f"{directory} is btrfs with zstd level {level}: "
                "compression at write-back stalls fsync-heavy builds (a 2026 report "
                "measured zstd:15 doubling build times); use compress=zstd:3 or lower",
                directory,
            )
        )
    if re.search(r"(^|,)(sync|dirsync)(,|$)", options or ""):
        found.append(
            finding(
                "sync-mount",
                "action",
                f"{directory} is mounted {options}: every write waits for the disk",
                directory,
            )
        )
    if (
        fstype in ("btrfs", "zfs", "nfs", "nfs4")
        and fs["role"] != "store"
        and any(not c.get("eatmydata", True) for c in facts["chroots"])
    ):
        found.append(
            finding(
                "fsync-heavy",
                "action",
                f"{directory} is {fstype} and a chroot runs dpkg without eatmydata",
                directory,
            )
        )
    return found


def rule_filesystems(facts: Facts) -> Findings:
    return [f for fs in facts["filesystems"] for f in filesystem_findings(fs, facts)]


def rule_schroot_overlay(facts: Facts) -> Findings:
    """Where schroot sessions write: tmpfs when it is big enough (sbuild's fastest mode)."""
    found = []
    for fs in facts["filesystems"]:
        if fs["role"] != "overlay" or fs["fstype"] == "tmpfs":
            continue
        if facts["tmpfs_overlay"]["fits"]:
            found.append(
                finding(
                    "overlay-not-tmpfs",
                    "warning",
                    f"schroot sessions write their overlay to {fs['path']} ({fs['fstype']}): "
                    "'sbuild-fast update --mode schroot' moves it to tmpfs "
                    f"({facts['tmpfs_overlay']['reason']})",
                    fs["path"],
                )
            )
        else:
            found.append(
                finding(
                    "overlay-not-tmpfs",
                    "info",
                    f"schroot sessions write their overlay to {fs['path']} ({fs['fstype']}); "
                    f"not to tmpfs, as {facts['tmpfs_overlay']['reason']}",
                    fs["path"],
                )
            )
    return found


def rule_schroot_mode(facts: Facts) -> Findings:
    """schroot mode with its overlay on tmpfs is sbuild's fastest mode: say so to a user of
    unshare chroots on a host that could have one, unless the session backend (below
    schroot mode's cost per command) is what their builds use."""
    chroots = facts["chroots"]
    if (
        not chroots
        or facts.get("session_backend")
        or any(c["mode"] == "schroot" for c in chroots)
        or not facts.get("schroot_installed")
        or not facts["tmpfs_overlay"]["fits"]
    ):
        return []
    return [
        finding(
            "schroot-faster",
            "info",
            "schroot mode with its overlay on tmpfs is sbuild's fastest mode (about half "
            "the time of unshare mode per build, bench/README): 'sbuild-fast create --mode "
            "schroot' as root, for the members of the sbuild group",
        )
    ]


def rule_command_cost(facts: Facts) -> Findings:
    """What sbuild itself costs per build in each mode in use: its floor, which no chroot
    and no setting removes."""
    found = []
    for mode, cost in sorted(facts.get("command_cost", {}).items()):
        if cost is None:
            continue
        floor = cost * sbs.COMMANDS_PER_BUILD
        bound = "at least " if mode == "unshare" else ""
        what = "with the session backend" if mode == "session" else f"in {mode} mode"
        found.append(
            finding(
                "command-cost",
                "info",
                f"sbuild runs about {sbs.COMMANDS_PER_BUILD} commands in the chroot per build; "
                f"here each costs {bound}{cost * 1000:.0f} ms {what}, so {bound}"
                f"{floor:.1f} s of every build is sbuild's own: the floor {what}, "
                "which no chroot or setting removes",
                mode,
                seconds_per_command=round(cost, 4),
                floor_seconds=round(floor, 1),
            )
        )
    return found


def rule_package_cache(facts: Facts) -> Findings:
    """The package cache shared across builds: its size against its cap, and what keeps
    builds from using or pruning it."""
    found = []
    for cache in facts.get("caches", []):
        path, mode = cache["path"], cache["mode"]
        if not cache["present"]:
            found.append(
                finding(
                    "package-cache-missing",
                    "action",
                    f"the {mode} package cache {path} is gone (sbuild cannot bind-mount it): "
                    f"run 'sbuild-fast update{' --mode schroot' if mode == 'schroot' else ''}'",
                    path,
                )
            )
            continue
        found.append(
            finding(
                "package-cache",
                "info",
                f"package cache ({mode}): {cache['files']} .debs, "
                f"{cache['size_bytes'] / 1048576:.1f} MiB of its "
                f"{cache['max_bytes'] / 1048576:.0f} MiB cap (pruned by 'sbuild-fast update')",
                path,
                size_bytes=cache["size_bytes"],
                max_bytes=cache["max_bytes"],
                files=cache["files"],
            )
        )
    return found


def rule_distclean(facts: Facts) -> Findings:
    """sbuild 0.89.3 and later with $clean_apt_cache on (the default from 0.91.3): its
    'apt-get distclean' before each build deletes the package cache's .debs."""
    if facts["sbuild_config"].get("clean_apt_cache") != "1":
        return []
    return [
        finding(
            "distclean-empties-cache",
            "action",
            f"sbuild {facts['versions'].get('sbuild')} runs 'apt-get distclean' before each "
            "build ($clean_apt_cache is on), which empties the package cache mounted on "
            "/var/cache/apt/archives: run 'sbuild-fast create --configure', or set "
            "$clean_apt_cache = 0 in the sbuild configuration",
            cache["path"],
        )
        for cache in facts.get("caches", [])
        if cache["present"]
    ]


def rule_not_installed(facts: Facts) -> Findings:
    return [
        finding("not-installed", "action", f"{pkg} is not installed")
        for pkg, version in facts["versions"].items()
        if not version
    ]


def _leftover_finding(item: Dict) -> Dict:
    status = item.get("status") or ("removed" if item["removed"] else "failed")
    what = f"the leftover {item['kind']} {item['path']}"
    path = item["path"]
    if status == "removed":
        return finding("leftover-removed", "info", f"removed {what}", path)
    if status == "would-remove":
        return finding("leftover", "action", f"would remove {what}", path)
    if status == "not-ours":
        return finding(
            "leftover-not-ours",
            "warning",
            f"{what} is root's or holds files of root or another user: left alone; once no "
            f"build uses it, root removes it with 'rm -rf --one-file-system -- {path}'",
            path,
        )
    return finding(
        "leftover",
        "action",
        f"cannot remove {what}: remove it with '{sfl.removal_command(Path(path))}'",
        path,
    )


def rule_leftovers(facts: Facts) -> Findings:
    """A tree a killed session or a failed unshare-mode build left: removed (info), to be
    removed (--dry-run) or that cannot be (action), or not the user's to remove (warning)."""
    return [_leftover_finding(item) for item in facts.get("leftovers", [])]


def rule_no_chroot(facts: Facts) -> Findings:
    if facts["chroots"]:
        return []
    return [
        finding(
            "no-chroot",
            "action",
            "no sbuild-fast chroot: run 'sbuild-fast create'",
            facts["cache_dir"],
        )
    ]


RULES: Tuple[Callable[[Facts], Findings], ...] = (
    rule_sbuild_config,
    rule_subids,
    rule_chroot_mode,
    rule_auto_create,
    rule_chroots,
    rule_filesystems,
    rule_schroot_overlay,
    rule_schroot_mode,
    rule_command_cost,
    rule_package_cache,
    rule_distclean,
    rule_not_installed,
    rule_no_chroot,
    rule_leftovers,
)


def doctor_findings(facts: Facts) -> Findings:
    """Every rule's findings, in RULES order."""
    return [f for rule in RULES for f in rule(facts)]


# --- the report -----------------------------------------------------------------------------

# Facts that only the rules need: not part of the JSON document.
INTERNAL_FACTS = ("now", "config_error", "uid", "unshare_used", "subid_advice")


def report(facts: Facts, as_json: bool) -> int:
    findings = doctor_findings(facts)
    action = needs_action(findings)
    if as_json:
        public = {k: v for k, v in facts.items() if k not in INTERNAL_FACTS}
        emit_json({**public, "findings": findings, "ok": not action})
    else:
        for pkg, version in facts["versions"].items():
            print(f"{pkg}: {version or 'not installed'}")
        for fs in facts["filesystems"]:
            print(f"{fs['role']} dir {fs['path']}: {fs['fstype']} ({fs['options']})")
        for c in facts["chroots"]:
            print(f"chroot {c['name']} ({c['mode']}): {c['age_days']} days old, {c['path']}")
        for line in text_lines(findings):
            print(line)
        if not action:
            print("nothing to fix")
    return EXIT_ACTION if action else EXIT_OK
