"""sbuild-fast create: the mmdebstrap recipe, its run, and the chroot put in place."""

import argparse
import contextlib
import logging
import os
import pwd
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from debadmin import __version__, fsutil, proc
from debadmin.errors import Error
from debadmin.sbuild_fast import configure as sfcfg
from debadmin.sbuild_fast import leftovers
from debadmin.sbuild_fast import sbuild as sbs

PROG = "sbuild-fast"
log = logging.getLogger("debadmin")


# Excluded from every dpkg unpack in the chroot (also for build-deps installed later);
# copyright files stay, as Debian policy wants them.
DPKG_EXCLUDES = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/locale/*",
    "path-include=/usr/share/locale/locale.alias",
)

# Before debhelper pulls man-db in: otherwise man-db's postinst caches auto-update=true in
# /var/lib/man-db/auto-update and every build rebuilds the man database.
MANDB_HOOK = (
    'echo "man-db man-db/auto-update boolean false" ' '| chroot "$1" debconf-set-selections'
)
# apt runs dpkg through a symlink called dpkg that points to eatmydata (mk-sbuild's way),
# and apt-get/apt-cache themselves run under eatmydata through wrappers in /usr/local/bin,
# which comes first in sbuild's PATH: apt's own writes (lists, caches) skip fsync too.
_EMD_DIR, _WRAP_DIR = sbs.EATMYDATA_DIR, sbs.APT_WRAPPER_DIR
EATMYDATA_HOOK = (
    f'mkdir -p "$1{_EMD_DIR}" && ln -sf /usr/bin/eatmydata "$1{_EMD_DIR}/dpkg" && '
    f'printf \'Dir::Bin::dpkg "{_EMD_DIR}/dpkg";\\n\' > "$1{sbs.EATMYDATA_APT_CONF}" && '
    f'mkdir -p "$1{_WRAP_DIR}" && for t in {" ".join(sbs.APT_WRAPPERS)}; do '
    f"printf '#!/bin/sh\\n{sbs.APT_WRAPPER_TAG}\\nexec /usr/bin/eatmydata /usr/bin/%s \"$@\"\\n' "
    f'"$t" > "$1{_WRAP_DIR}/$t" && chmod 755 "$1{_WRAP_DIR}/$t" || exit 1; done'
)
# trixie's lintian depends on appstream, whose apt.conf.d/50appstream adds AppStream's
# DEP-11 Components index to every apt update. The tarball's lists were fetched before
# lintian came in, so sbuild's apt update fetched that index anew at every build (5.2 MB
# for trixie main, ~2 s of its "Update chroot"), for builds that read no AppStream data.
APPSTREAM_APT_LINES = (
    "// sbuild-fast: builds read no AppStream metadata (appstream comes with lintian)",
    'Acquire::IndexTargets::deb::DEP-11::DefaultEnabled "false";',
)
APPSTREAM_HOOK = (
    f'printf "%s\\n" {" ".join(shlex.quote(line) for line in APPSTREAM_APT_LINES)} '
    f'> "$1{sbs.APPSTREAM_APT_CONF}"'
)
# The package cache shared across builds (sbs.CACHE_MOUNTPOINT, a host directory
# bind-mounted by sbuild): apt downloads as the chroot's root, to whom the directory is
# open (its _apt is not), and apt-get runs under flock on the cache's lock file, so that
# builds sharing it wait for each other (apt's own lock there fails at once) and update
# never prunes a file an install is about to read.
CACHE_WRAPPER_TAG = "# sbuild-fast: builds sharing the package cache take turns"
# sbuild's resolver writes APT::Keep-Downloaded-Packages "false" (its
# $apt_keep_downloaded_packages, off by default) into the file APT_CONFIG names; apt
# reads apt.conf.d after that file, so this keeps the .debs whatever the user's sbuild
# configuration says.
CACHE_APT_LINES = (
    "// sbuild-fast: the package cache shared across builds",
    'APT::Sandbox::User "root";',
    'APT::Keep-Downloaded-Packages "true";',
)


# sbuild's resolver builds its dummy packages (sbuild-build-depends-main-dummy and the
# like) with one version, 0.invalid.0, at every build, and apt keeps them in the cache
# like any other .deb. apt takes a file there whose size matches without checking its
# hash, so a later build whose dummy came out the same size installed the earlier
# build's dummy, with the earlier build's dependencies ("Unmet dependencies"). They go
# before every apt-get run, under the cache's lock.
DUMMY_DEBS = f"{sbs.CACHE_MOUNTPOINT}/sbuild-build-depends-*-dummy_0.invalid.0_*.deb"


def cache_hook(eatmydata: bool) -> str:
    """The customize hook that wires the chroot for the shared package cache."""
    apt_get = "/usr/bin/eatmydata /usr/bin/apt-get" if eatmydata else "/usr/bin/apt-get"
    lock = f"{sbs.CACHE_MOUNTPOINT}/{sbs.CACHE_LOCK}"
    wrapper = ["#!/bin/sh", CACHE_WRAPPER_TAG]
    if eatmydata:
        wrapper.insert(1, sbs.APT_WRAPPER_TAG)
    locked = shlex.quote(f'rm -f {DUMMY_DEBS}; exec "$0" "$@"')
    flock = f"/usr/bin/flock -o -w {sbs.CACHE_LOCK_WAIT} {lock}"
    wrapper.append(f'exec {flock} /bin/sh -c {locked} {apt_get} "$@"')
    target = f"{_WRAP_DIR}/apt-get"
    apt_conf = " ".join(shlex.quote(line) for line in CACHE_APT_LINES)
    quoted = " ".join(shlex.quote(line) for line in wrapper)
    return (
        f'printf "%s\\n" {apt_conf} > "$1{sbs.CACHE_APT_CONF}" && '
        f'mkdir -p "$1{_WRAP_DIR}" && '
        f'printf "%s\\n" {quoted} > "$1{target}" && chmod 755 "$1{target}"'
    )


# Package lists stay (sbuild's apt update then fetches only what changed). apt's cache
# goes: the .debs, and pkgcache.bin/srcpkgcache.bin, which sbuild's apt update rebuilds
# at every build anyway (mmdebstrap's cleanup/apt/cache is 'apt-get clean').
CLEANUP_HOOK = (
    'rm -f "$1/var/lib/man-db/auto-update" && '
    f'echo "sbuild-fast {__version__}" > "$1{sbs.MARKER}"'
)


def host_codename(root: Path = Path("/")) -> str:
    for rel in ("etc/os-release", "usr/lib/os-release"):
        try:
            text = (root / rel).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition("=")
            if key == "VERSION_CODENAME" and value.strip("\"'"):
                return value.strip("\"'")
    raise Error("cannot tell the host's release from /etc/os-release: pass --dist")


def host_arch() -> str:
    return proc.run(["dpkg", "--print-architecture"]).stdout.strip()


DEFAULT_MIRROR = "http://deb.debian.org/debian"
# Keyrings of the Debian archive (bookworm ships .gpg, trixie .pgp files).
DEBIAN_KEYRING_RE = re.compile(
    r"^/(usr/share/keyrings|etc/apt/trusted\.gpg\.d)/debian-archive-[A-Za-z0-9._-]+$"
)


def release_names(path: Path) -> set:
    """Suite and Codename of an apt lists Release or InRelease file (they come first)."""
    names = set()
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            in_header = False
            for number, line in enumerate(handle):
                if number > 100 or len(names) == 2:
                    break
                if line.startswith("-----BEGIN PGP SIGNED MESSAGE"):
                    in_header = True  # Hash: lines up to the first blank line
                elif in_header:
                    in_header = bool(line.strip())
                else:
                    key, _, value = line.partition(":")
                    if key in ("Suite", "Codename") and value.strip():
                        names.add(value.strip())
    except OSError:
        pass
    return names


def suite_aliases(dist: str, root: Path = Path("/")) -> set:
    """dist and the other name of the same suite (codename or suite name, as in
    'bookworm' and 'stable'), from the Release files apt downloaded."""
    names = {dist}
    with contextlib.suppress(OSError):
        for path in sorted((root / "var/lib/apt/lists").glob("*Release")):
            pair = release_names(path)
            if dist in pair:
                names |= pair
    return names


def _debian_source(
    uri: str, suites: Sequence[str], components: Sequence[str], signed_by: str, names: set
) -> bool:
    """Whether a deb source is the Debian archive for one of names (or its -updates): not
    security, backports or a third-party repository that serves the same suite name."""
    if not sbs.URL_RE.match(uri) or "main" not in components:
        return False
    if signed_by and not all(
        DEBIAN_KEYRING_RE.match(k) for k in signed_by.replace(",", " ").split()
    ):
        return False
    return any(s.rstrip("/") in names or s in {f"{n}-updates" for n in names} for s in suites)


def _deb822_sources(text: str) -> Iterator[Tuple[str, List[str], List[str], str]]:
    for stanza in re.split(r"\n\s*\n", text):
        fields: Dict[str, str] = {}
        key = ""
        for line in stanza.splitlines():
            if line.startswith("#"):
                continue
            if line[:1].isspace():
                if key:  # a continuation line (an inline Signed-By key block)
                    fields[key] += "\n" + line.strip()
                continue
            if ":" not in line:
                continue
            key, _, value = line.partition(":")
            key = key.strip().lower()
            fields[key] = value.strip()
        if "deb" not in fields.get("types", "").split():
            continue
        if fields.get("enabled", "yes").lower() == "no":
            continue
        for uri in fields.get("uris", "").split():
            yield (
                uri,
                fields.get("suites", "").split(),
                fields.get("components", "").split(),
                fields.get("signed-by", ""),
            )


def _one_line_sources(text: str) -> Iterator[Tuple[str, List[str], List[str], str]]:
    for line in text.splitlines():
        line = line.split("#", 1)[0]
        options = " ".join(re.findall(r"\[([^]]*)\]", line))
        words = re.sub(r"\[[^]]*\]", " ", line).split()
        if len(words) < 3 or words[0] != "deb":
            continue
        signed_by = ""
        for option in options.split():
            key, _, value = option.partition("=")
            if key == "signed-by":
                signed_by = value
        yield words[1], [words[2]], words[3:], signed_by


def host_mirror(dist: Optional[str] = None, root: Path = Path("/")) -> str:
    """The Debian archive the host's apt uses for dist (default: the host's release):
    the first deb source, in apt's order, whose suite is dist or dist-updates (or the
    same suite under its other name), with component main and no keyring but Debian's;
    else deb.debian.org."""
    if dist is None:
        try:
            dist = host_codename(root)
        except Error:
            return DEFAULT_MIRROR
    names = suite_aliases(dist, root)
    sources_dir = root / "etc/apt/sources.list.d"
    paths = [root / "etc/apt/sources.list"]
    with contextlib.suppress(OSError):
        paths += sorted(p for p in sources_dir.iterdir() if p.name.endswith((".list", ".sources")))
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        parse = _deb822_sources if path.name.endswith(".sources") else _one_line_sources
        for uri, suites, components, signed_by in parse(text):
            if _debian_source(uri, suites, components, signed_by, names):
                return uri.rstrip("/")
    return DEFAULT_MIRROR


# --- mmdebstrap --------------------------------------------------------------------------


def _common_options(recipe: Dict) -> List[str]:
    options = [
        '--aptopt=APT::Install-Recommends "false"',
        '--aptopt=Acquire::Languages "none"',
    ]
    if not recipe["keep_docs"]:
        options += [f"--dpkgopt={opt}" for opt in DPKG_EXCLUDES]
    return options


def _packages(recipe: Dict) -> List[str]:
    include = list(sbs.BASE_INCLUDE)
    if recipe["eatmydata"]:
        include.append("eatmydata")
    if recipe.get("lintian"):
        include.append("lintian")
    return include + [p for p in recipe["include"] if p not in include]


def _tail(recipe: Dict, output: str) -> List[str]:
    argv = [f"--customize-hook={EATMYDATA_HOOK}"] if recipe["eatmydata"] else []
    argv.append(f"--customize-hook={APPSTREAM_HOOK}")
    if recipe.get("cache"):
        argv.append(f"--customize-hook={cache_hook(recipe['eatmydata'])}")
    argv.append(f"--customize-hook={CLEANUP_HOOK}")
    argv.append("--skip=cleanup/apt/lists")
    return argv + [recipe["dist"], output, recipe["mirror"]]


def mmdebstrap_argv(recipe: Dict, output: str, mode: str) -> List[str]:
    """The mmdebstrap command for a recipe (dist, arch, mirror, include, keep_docs, eatmydata)."""
    argv = [
        "mmdebstrap",
        f"--mode={mode}",
        "--variant=buildd",
        f"--arch={recipe['arch']}",
        f"--include={','.join(_packages(recipe))}",
        *_common_options(recipe),
        f"--essential-hook={MANDB_HOOK}",
    ]
    return argv + _tail(recipe, output)


# What a refresh must not take from the old chroot: device nodes (mmdebstrap makes its
# own, and an unprivileged user cannot) and sources.list (mmdebstrap writes it for the
# mirror of this run, so 'update --mirror' takes effect).
REFRESH_EXCLUDES = ("--exclude=./dev/*", "--exclude=./etc/apt/sources.list")
APT_NONINTERACTIVE = (
    'chroot "$1" env DEBIAN_FRONTEND=noninteractive apt-get -y -q '
    "-o Dpkg::Options::=--force-confold"
)


def mmdebstrap_refresh_argv(recipe: Dict, source: str, output: str, mode: str) -> List[str]:
    """mmdebstrap starting from the chroot at source (a tarball in unshare mode, a
    directory in schroot mode): apt update, dist-upgrade, the recipe's packages installed
    again (idempotent), autoremove, the eatmydata and man-db wiring re-applied."""
    quoted = shlex.quote(source)
    excludes = " ".join(REFRESH_EXCLUDES)
    if mode == "unshare":
        copy = f'tar -C "$1" {excludes} -xf {quoted}'
    else:
        copy = f'tar -C {quoted} {excludes} -cf - . | tar -C "$1" -xf -'
    argv = [
        "mmdebstrap",
        f"--mode={mode}",
        "--variant=custom",
        f"--arch={recipe['arch']}",
        *_common_options(recipe),
        "--skip=update,download",
        f"--setup-hook={copy}",
        '--customize-hook=chroot "$1" apt-get -q update',
        f"--customize-hook={APT_NONINTERACTIVE} dist-upgrade",
        f"--customize-hook={APT_NONINTERACTIVE} install {' '.join(_packages(recipe))}",
        f"--customize-hook={APT_NONINTERACTIVE} --purge autoremove",
    ]
    return argv + _tail(recipe, output)


_TERMINATING = False


def on_sigterm(signum, frame):  # noqa: ARG001 - signal handler signature
    global _TERMINATING
    if not _TERMINATING:
        _TERMINATING = True
        raise KeyboardInterrupt


# While mmdebstrap runs (minutes), what it is doing and for how long: its own "I:" lines,
# each with the time since the start, and the current one again after this many quiet
# seconds; the rest of its output is kept for when it fails.
PROGRESS_EVERY = 30.0
OUTPUT_KEPT = 25


class Progress:
    """mmdebstrap's output read on a thread: stages reported on stderr (unless -q)."""

    def __init__(self, stream, start: float) -> None:
        self.stream = stream
        self.start = start
        self.stage = "starting mmdebstrap"
        self.last_report = start
        self.tail: List[str] = []
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def report(self, text: str) -> None:
        self.last_report = time.monotonic()
        minutes, seconds = divmod(int(self.last_report - self.start), 60)
        if log.getEffectiveLevel() <= logging.WARNING:
            print(f"{PROG}: [{minutes}:{seconds:02d}] {text}", file=sys.stderr, flush=True)

    def _read(self) -> None:
        for line in self.stream:
            line = line.rstrip("\n")
            with self.lock:
                self.tail = (self.tail + [line])[-OUTPUT_KEPT:]
                if line.startswith("I: "):
                    self.stage = line[3:].strip()
                    self.report(self.stage)

    def tick(self) -> None:
        with self.lock:
            if time.monotonic() - self.last_report >= PROGRESS_EVERY:
                self.report(f"still: {self.stage}")


def run_mmdebstrap(argv: List[str]) -> None:
    """Run mmdebstrap in /; an interrupt (SIGINT/SIGTERM) stops it and waits for its cleanup.

    Not in the caller's directory: mmdebstrap's hooks run as the namespace's root, who
    cannot enter a home directory of mode 0700 (trixie's useradd default), and find(1)
    fails when it cannot return to its starting directory. With -v its output goes
    straight to stderr; else its stages are reported with their times (Progress)."""
    log.info("running: %s", " ".join(argv))
    env = dict(os.environ, LC_ALL="C.UTF-8")
    verbose = log.getEffectiveLevel() <= logging.DEBUG
    start = time.monotonic()
    try:
        child = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=None if verbose else subprocess.PIPE,
            stderr=None if verbose else subprocess.STDOUT,
            text=True,
            errors="replace",
            cwd="/",
        )
    except FileNotFoundError:
        raise Error("mmdebstrap: command not found") from None
    progress = None if verbose else Progress(child.stdout, start)
    try:
        while True:
            try:
                rc = child.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                if progress:
                    progress.tick()
    except KeyboardInterrupt:
        # mmdebstrap removes its own temporary tree when terminated.
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signal.SIGTERM)
        try:
            child.wait(timeout=120)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        if progress:
            progress.thread.join(timeout=5)
            progress.stream.close()
        raise
    if progress:
        progress.thread.join(timeout=5)
        progress.stream.close()
        elapsed = int(time.monotonic() - start)
        if rc != 0:
            for line in progress.tail:
                print(f"mmdebstrap: {line}", file=sys.stderr)
        else:
            progress.report(f"mmdebstrap done in {elapsed // 60}:{elapsed % 60:02d}")
    if rc != 0:
        raise Error(f"mmdebstrap failed with exit status {rc}")


@contextlib.contextmanager
def scratch_dir(parent: Path) -> Iterator[Path]:
    """A temporary directory under parent, removed on the way out whatever happens."""
    path = Path(tempfile.mkdtemp(prefix="tmp.", dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def remove_stale_scratch(parent: Path) -> None:
    """Scratch dirs left by a killed run (the caller holds the lock, so nobody uses them)."""
    try:
        entries = list(parent.iterdir())
    except FileNotFoundError:
        return
    for entry in entries:
        if entry.name.startswith("tmp.") and entry.is_dir() and not entry.is_symlink():
            log.info("removing %s, left by an interrupted run", entry)
            shutil.rmtree(entry, ignore_errors=True)


def sbuild_runs_lintian() -> bool:
    """Whether the user's sbuild runs lintian after a build ($run_lintian, on by default):
    then lintian is preinstalled, or every build installs it and its Perl dependencies
    into the throwaway chroot first."""
    sbuild_ver = sbs.sbuild_version()
    if not sbuild_ver:
        return True  # sbuild's default, once it is installed
    try:
        config = sbs.effective_sbuild_config(sbuild_ver)
    except Error:
        return True
    return config.get("run_lintian", "1").strip() not in ("", "0")


def recipe_from(args: argparse.Namespace, root: Path = Path("/")) -> Dict:
    dist = sbs.validate_dist(args.dist or host_codename(root))
    arch = sbs.validate_arch(args.arch or host_arch())
    mirror = sbs.validate_mirror(args.mirror or host_mirror(dist, root))
    return {
        "name": sbs.chroot_name(dist, arch),
        "dist": dist,
        "arch": arch,
        "mirror": mirror,
        "include": sbs.parse_include(args.include),
        "keep_docs": bool(args.keep_docs),
        "eatmydata": not args.no_eatmydata,
        "lintian": False if args.no_lintian else sbuild_runs_lintian(),
        "cache": not args.no_cache,
        "mode": args.mode,
    }


# --- create / update ---------------------------------------------------------------------


def chroot_argv(recipe: Dict, source: Optional[Path], output: str, mode: str) -> List[str]:
    if source is None:
        return mmdebstrap_argv(recipe, output, mode)
    return mmdebstrap_refresh_argv(recipe, str(source), output, mode)


def create_unshare(
    recipe: Dict,
    cache_dir: Path,
    dry_run: bool,
    refresh: bool = False,
    from_record: bool = False,
    mirror: Optional[str] = None,
) -> Dict:
    """Build the tarball (refresh: from the current one with apt update + dist-upgrade,
    when there is one) and rename it into place under the lock. from_record: the recipe
    is read again from the record under the lock (mirror overriding its mirror)."""
    name = recipe["name"]
    target = cache_dir / f"{name}.tar"
    state_dir = cache_dir / sbs.STATE_SUBDIR
    check_tarball_name(recipe, cache_dir, target)
    source = target if refresh and target.is_file() else None
    argv = chroot_argv(recipe, source, str(state_dir / "tmp.XXXXXXXXXX" / target.name), "unshare")
    if dry_run:
        result = {"name": name, "path": str(target), "changed": False, "command": argv}
        if recipe.get("cache"):
            result["cache_plan"] = unshare_cache_plan()
        return result
    if recipe.get("cache") and not from_record:
        # What would refuse the cache (no subordinate ids, no ACLs, a mask that would
        # have to widen) refuses before anything is written, not after the tarball.
        unshare_cache_plan()
    fsutil.make_dirs(cache_dir, state_dir)
    with fsutil.locked(state_dir / "lock"):
        if from_record:
            recipe = reread_recipe(state_dir, recipe, mirror)
            if recipe is None:
                return {"name": name, "path": str(target), "changed": False, "removed": True}
            if recipe.get("cache"):  # the record as it is now decides (update)
                unshare_cache_plan()
        argv = build_unshare_tarball(recipe, state_dir, target, refresh)
        state = dict(recipe, path=str(target), created=int(time.time()), version=__version__)
        sbs.write_state(state_dir, state)
    if recipe.get("cache"):
        user = pwd.getpwuid(os.geteuid()).pw_name
        writer = sbs.subordinate_root(user)
        if writer is None:
            raise Error(f"no subordinate uids for {user} in /etc/subuid: sbuild cannot run")
        sbs.ensure_cache_dir(sbs.package_cache_dir("unshare"), writer)
    return {"name": name, "path": str(target), "changed": True, "command": argv}


def check_tarball_name(recipe: Dict, cache_dir: Path, target: Path) -> None:
    """Refuse a file that would compete with the tarball in sbuild's lookup; warn about
    one sbuild finds before it."""
    others = sbs.conflicting_files(cache_dir, recipe["name"], target.name)
    if others:
        raise Error(
            f"{cache_dir / others[0]} would compete with {target.name} in sbuild's "
            "lookup: remove it first"
        )
    for shadow in sbs.shadowing_names(recipe["dist"], recipe["arch"]):
        for found in sbs.matching_files(cache_dir, shadow):
            log.warning(
                "%s is found before %s by 'sbuild -d %s'",
                cache_dir / found,
                target.name,
                recipe["dist"],
            )


def build_unshare_tarball(recipe: Dict, state_dir: Path, target: Path, refresh: bool) -> List[str]:
    """mmdebstrap into a scratch directory, then rename into place (under the caller's
    lock); the mmdebstrap argv."""
    remove_stale_scratch(state_dir)
    with scratch_dir(state_dir) as scratch:
        output = scratch / target.name
        source = target if refresh and target.is_file() else None
        if refresh and source is None:
            log.info("%s is missing: creating it from the archive", target)
        argv = chroot_argv(recipe, source, str(output), "unshare")
        run_mmdebstrap(argv)
        if not output.is_file() or output.stat().st_size == 0:
            raise Error("mmdebstrap wrote no tarball")
        os.chmod(output, 0o644)
        fsutil.fsync_path(output)
        # rename(2): a build streaming the old tarball keeps reading the old inode.
        os.replace(output, target)
        fsutil.fsync_dir(target.parent)
    return argv


def unshare_cache_plan() -> List[str]:
    """What a real create/update does for the unshare-mode package cache: the directory,
    its ACL for the chroot's root, and search ACLs on the directories above it."""
    user = pwd.getpwuid(os.geteuid()).pw_name
    writer = sbs.subordinate_root(user)
    if writer is None:
        raise Error(f"no subordinate uids for {user} in /etc/subuid: sbuild cannot run")
    cache = sbs.package_cache_dir("unshare")
    sbs.check_acl_support(cache)
    verb = "set" if cache.is_dir() else "create"
    plan = [f"would {verb} package cache {cache} with ACL u:{writer}:rwx (the chroot's root)"]
    for parent in sbs.grant_search_path(cache, writer, dry_run=True):
        plan.append(f"would add ACL u:{writer}:--x (search) on {parent}")
    return plan


def current_generation(link: Path) -> Optional[Path]:
    """The directory the schroot symlink points at, if it is there."""
    try:
        real = link.resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    return real if real.is_dir() else None


def tmpfs_overlay_dir(root: Path = Path("/")) -> Optional[str]:
    """TMPFS_OVERLAY_DIR, made (root's, 0700) when tmpfs there is big enough and nobody
    else made it first; else None, and the overlay stays on disk, with a warning."""
    fits, why = sbs.tmpfs_overlay_fit(root)
    if not fits:
        log.warning("schroot's overlay stays on disk: %s", why)
        return None
    path = root / sbs.TMPFS_OVERLAY_DIR.lstrip("/")
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        # /dev/shm is world-writable: someone else's directory or symlink is not used.
        log.warning("schroot's overlay stays on disk: %s is not root's private directory", path)
        return None
    return sbs.TMPFS_OVERLAY_DIR


def schroot_cache_fstab(root: Path = Path("/")) -> Optional[str]:
    """Make the system's package cache and the fstab that mounts it in sbuild-fast's
    schroot chroots (sbuild's profile fstab plus the cache); its setup.fstab value, or
    None (with a warning) without sbuild's profile."""
    profile = fsutil.read_text(root / sbs.SBUILD_PROFILE_FSTAB)
    if profile is None:
        log.warning("no %s: schroot builds go without the package cache", sbs.SBUILD_PROFILE_FSTAB)
        return None
    cache = sbs.package_cache_dir("schroot", root)
    sbs.ensure_cache_dir(cache)
    fstab = root / sbs.SCHROOT_FSTAB
    fstab.parent.mkdir(parents=True, exist_ok=True)
    fsutil.atomic_write(fstab, sbs.schroot_fstab(profile, sbs.SCHROOT_CACHE_DIR))
    return str(Path(sbs.SCHROOT_FSTAB).relative_to("etc/schroot"))  # relative to /etc/schroot


def create_schroot(
    recipe: Dict,
    dry_run: bool,
    root: Path = Path("/"),
    refresh: bool = False,
    from_record: bool = False,
    mirror: Optional[str] = None,
) -> Dict:
    if os.geteuid() != 0 and not dry_run:
        raise Error("--mode schroot needs root")
    name = recipe["name"]
    base = root / sbs.SCHROOT_BASE.relative_to("/")
    link = base / name
    conf = root / sbs.SCHROOT_CONF_DIR / f"sbuild-fast-{name}"
    state_dir = root / sbs.SCHROOT_STATE_DIR
    in_use = sbs.schroot_names(root, skip=conf)
    aliases = [a for a in (f"{name}-sbuild", f"{recipe['dist']}-sbuild") if a not in in_use]
    mine = {a: f"{name}-sbuild-fast" for a in aliases}
    shadow = sbs.schroot_shadow_message(
        recipe, sbs.schroot_lookup(recipe["dist"], recipe["arch"], {**in_use, **mine})
    )
    if shadow:
        log.warning("%s", shadow)
    source = current_generation(link) if refresh else None
    argv = chroot_argv(recipe, source, str(base / "tmp.XXXXXXXXXX/tree"), "root")
    if dry_run:
        return {
            "name": name,
            "path": str(link),
            "changed": False,
            "command": argv,
            "schroot_conf": str(conf),
        }
    fsutil.make_dirs(base / "gen", state_dir, root / sbs.SCHROOT_CONF_DIR)
    with fsutil.locked(base / "lock"):
        if from_record:
            recipe = reread_recipe(state_dir, recipe, mirror)
            if recipe is None:
                return {"name": name, "path": str(link), "changed": False, "removed": True}
        remove_stale_scratch(base)
        generation = base / "gen" / f"{name}.{time.strftime('%Y%m%dT%H%M%S')}"
        with scratch_dir(base) as scratch:
            tree = scratch / "tree"
            source = current_generation(link) if refresh else None
            argv = chroot_argv(recipe, source, str(tree), "root")
            run_mmdebstrap(argv)
            proc.run(["sync", "--file-system", str(tree)], check=False)
            os.rename(tree, generation)
        # Swap the symlink atomically; running sessions keep their old generation.
        new_link = base / f".{name}.new"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(new_link)
        os.symlink(os.path.relpath(generation, base), new_link)
        os.replace(new_link, link)
        fsutil.fsync_dir(base)
        overlay = tmpfs_overlay_dir(root)
        fstab = schroot_cache_fstab(root) if recipe.get("cache") else None
        fsutil.atomic_write(conf, sbs.schroot_conf(recipe, link, aliases, overlay, fstab))
        prune_generations(base, name, keep={generation.name})
        state = dict(recipe, path=str(link), created=int(time.time()), version=__version__)
        sbs.write_state(state_dir, state)
    return {
        "name": name,
        "path": str(link),
        "changed": True,
        "command": argv,
        "schroot_conf": str(conf),
    }


def prune_generations(base: Path, name: str, keep: set) -> None:
    """Keep the newest two generations: a session may still use the previous one."""
    gens = sorted(p for p in (base / "gen").glob(f"{name}.*") if p.name not in keep)
    for old in gens[:-1]:
        log.info("removing old generation %s", old)
        shutil.rmtree(old, ignore_errors=True)


def recipe_from_state(state: Dict, mirror: Optional[str] = None) -> Dict:
    """The recorded recipe, validated again: a state file is input like any other."""
    dist = sbs.validate_dist(str(state["dist"]))
    arch = sbs.validate_arch(str(state["arch"]))
    include = state.get("include", [])
    if not isinstance(include, list):
        raise Error(f"malformed record for {dist}-{arch}: include is not a list")
    return {
        "name": sbs.chroot_name(dist, arch),
        "dist": dist,
        "arch": arch,
        "mirror": sbs.validate_mirror(mirror or str(state.get("mirror") or host_mirror(dist))),
        "include": sbs.parse_include([str(p) for p in include]),
        "keep_docs": bool(state.get("keep_docs", False)),
        "eatmydata": bool(state.get("eatmydata", True)),
        # Records made before 0.2 have no "lintian": as they were made, without it.
        "lintian": bool(state.get("lintian", False)),
        # ... and before the package cache: without it.
        "cache": bool(state.get("cache", False)),
        "mode": state["mode"],
    }


def reread_recipe(state_dir: Path, recipe: Dict, mirror: Optional[str]) -> Optional[Dict]:
    """The recipe from the chroot's record as it is now (the caller holds the lock): a
    create that ran since update read the records may have changed it, and update must
    not undo that. None when the record has gone (removed meanwhile)."""
    state = sbs.load_state(state_dir / f"{recipe['name']}.json")
    if state is None or state["mode"] != recipe["mode"]:
        return None
    return recipe_from_state(state, mirror)


def build_chroot(
    recipe: Dict,
    dry_run: bool,
    would: str,
    done: str,
    refresh: bool = False,
    from_record: bool = False,
    mirror: Optional[str] = None,
) -> None:
    """Build the chroot recipe describes in its mode (or say what would be run); refresh
    starts from the current chroot instead of the archive alone; from_record (update)
    takes the recipe from the record again once the lock is held."""
    options = {"refresh": refresh, "from_record": from_record, "mirror": mirror}
    if recipe["mode"] == "schroot":
        result = create_schroot(recipe, dry_run, **options)
    else:
        result = create_unshare(recipe, sbs.user_cache_dir(), dry_run, **options)
    if result.get("removed"):
        print(f"{result['name']} was removed meanwhile: left alone")
        return
    if dry_run:
        print("would run: " + " ".join(result["command"]))
        print(f"would {would} {result['path']}")
        for line in result.get("cache_plan", []):
            print(line)
    else:
        print(f"{done} {result['path']}")


def create(args: argparse.Namespace) -> int:
    """sbuild-fast create: build the chroot, tend its cache, write the block."""
    if args.no_cache and args.cache_max:
        raise Error("--cache-max sets the cap of the package cache that --no-cache turns off")
    recipe = recipe_from(args)
    cache_max = sbs.parse_size(args.cache_max) if args.cache_max else None
    leftovers.clean_mine(args.dry_run)
    build_chroot(recipe, args.dry_run, "write", "created")
    if recipe["cache"]:
        tend_cache(recipe["mode"], args.dry_run, cache_max)
    server = None
    if recipe["mode"] == "unshare" and sfcfg.chosen_backend(args.backend) == "session":
        server = sfcfg.session_backend(recipe, args.dry_run)
    rc = sfcfg.configure(recipe["mode"], args.configure, args.dry_run, recipe["cache"], server)
    if (
        recipe["mode"] == "unshare"
        and not server
        and shutil.which("schroot")
        and sbs.tmpfs_overlay_fit()[0]
    ):
        print(SCHROOT_FASTER_NOTE)
    return rc


# Measured by bench/sbuild-fast (bench/README): sbuild runs ~105 commands in the chroot
# per build, ~70 ms each in unshare mode and ~10 ms in schroot mode.
SCHROOT_FASTER_NOTE = (
    "note: schroot mode, with its overlay on tmpfs here, is sbuild's fastest mode (about "
    "half the time per build of unshare mode): 'sbuild-fast create --mode schroot' as root, "
    "for the members of the sbuild group"
)


def mib(size: int) -> str:
    """A size for people: GiB, MiB or KiB."""
    for unit, shift in (("GiB", 30), ("MiB", 20)):
        if size >= 1 << shift:
            return f"{size / (1 << shift):.1f} {unit}"
    return f"{size / 1024:.0f} KiB"


def tend_cache(mode: str, dry_run: bool, cache_max: Optional[int] = None) -> None:
    """Set the package cache's cap (cache_max, when given) and prune the cache to it."""
    state_dir = sbs.mode_state_dir(mode)
    cache = sbs.package_cache_dir(mode)
    if cache_max is not None and not dry_run:
        state_dir.mkdir(parents=True, exist_ok=True)
        sbs.write_cache_max(state_dir, cache_max)
    limit = cache_max or sbs.read_cache_max(state_dir)
    if not cache.is_dir():
        return
    if dry_run:
        doomed = sbs.prune_plan(sbs.cache_entries(cache), limit)
        print(f"would prune {len(doomed)} files from package cache {cache} (cap {mib(limit)})")
        return
    result = sbs.prune_cache(cache, limit)
    print(
        f"package cache {cache}: {result['files']} files, {mib(result['size_bytes'])} "
        f"(cap {mib(limit)}), {result['removed_files']} pruned"
    )
