"""sbuild-fast configure: the sbuild settings block, and the backend it names."""

import logging
import os
import pwd
import shutil
from typing import Dict, Optional

from debadmin import debver, fsutil
from debadmin.errors import EXIT_OK, Error
from debadmin.sbuild_fast import sbuild as sbs
from debadmin.sbuild_fast import session as sfs

PROG = "sbuild-fast"
log = logging.getLogger("debadmin")


# sbuild reads the configuration of the user who runs it, and schroot chroots are
# built by root for the members of the sbuild group.
SCHROOT_BUILDERS_NOTE = (
    "note: sbuild reads the configuration of the user who runs it: each builder in the "
    "sbuild group needs this block in their own ~/.sbuildrc (or "
    "~/.config/sbuild/config.pl), or at least 'sbuild --chroot-mode=schroot' (the default "
    "mode of sbuild 0.90 and later is unshare)"
)


def default_mode_note(
    mode: str, sbuild_ver: Optional[str], sbuild_mode: Optional[str] = None
) -> Optional[str]:
    """What a plain 'sbuild -d DIST' does without the block, when that is not mode: sbuild
    before 0.90 (bookworm's 0.85, trixie's 0.89) defaults to schroot mode and then fails
    with 'not a member of group sbuild' for a user of unshare chroots; sbuild 0.90 and later
    (sid's 0.91) build in them in their own unshare mode, without the block's settings."""
    default = sbs.default_chroot_mode(sbuild_ver)
    if default == (sbuild_mode or mode):
        return None
    if default == mode:  # sbuild 0.90 and later, the block choosing the session backend
        return (
            f"note: sbuild {sbuild_ver} defaults to {default} mode: a plain 'sbuild -d DIST' "
            f"builds in these chroots in sbuild's own {default} mode, without the session "
            f"backend, the package cache or auto-create off (sbuild replaces a tarball older "
            f"than a week with a plain one) until this block is in place ('sbuild-fast "
            f"create --configure')"
        )
    return (
        f"note: sbuild {sbuild_ver or '(not installed)'} defaults to {default} mode "
        f"(unshare from {sbs.UNSHARE_DEFAULT_MIN} on): a plain 'sbuild -d DIST' uses these "
        f"chroots only with this block in place ('sbuild-fast create --configure'), or as "
        f"'sbuild --chroot-mode={mode}'"
    )


def chosen_backend(option: Optional[str]) -> str:
    """--backend when given; else the backend the sbuild-fast block already in the
    configuration chose (a rerun keeps the admin's earlier choice); else the session
    backend, where it works (session_backend falls back to unshare mode)."""
    if option:
        return option
    rc_path = sbs.sbuildrc_path(sbuild_ver=sbs.sbuild_version())
    earlier = sbs.block_backend(fsutil.read_text(rc_path) or "")
    if earlier:
        print(
            f"keeping the {earlier} backend that {rc_path} has "
            f"(--backend {'unshare' if earlier == 'session' else 'session'} changes it)"
        )
        return earlier
    return "session"


def session_backend(recipe: Dict, dry_run: bool) -> Optional[str]:
    """sbuild-fast's path for the block, when its session backend works here as safely as
    unshare mode (tried on the new chroot: network off for the build, root inside, nothing
    left after close); else None, with a warning, and plain builds stay in unshare mode."""
    server = shutil.which(PROG) or f"/usr/bin/{PROG}"
    if dry_run:
        return server
    sbuild_ver = sbs.sbuild_version()
    if not (sbuild_ver and debver.at_least(sbuild_ver, sfs.SBUILD_MIN)):
        log.warning(
            "sbuild %s has no autopkgtest mode to use: builds stay in unshare mode",
            sbuild_ver or "(not installed)",
        )
        return None
    cache_dir = sbs.package_cache_dir("unshare")
    user = pwd.getpwuid(os.getuid()).pw_name
    session = sfs.Session(
        sbs.user_cache_dir() / f"{recipe['name']}.tar",
        user,
        sfs.default_binds(recipe, cache_dir),
        sfs.mountpoint_parent(),
    )
    try:
        cost = sfs.self_test(session)
    except Error as exc:
        log.warning(
            "the session backend does not work here (%s): builds stay in unshare mode", exc
        )
        return None
    print(f"session backend: {cost * 1000:.1f} ms per command here")
    return server


def configure(
    mode: str, write: bool, dry_run: bool, cache: bool = False, server: Optional[str] = None
) -> int:
    sbuild_ver = sbs.sbuild_version()
    cache_dir = str(sbs.package_cache_dir(mode)) if cache and mode == "unshare" else None
    if cache_dir and not (sbuild_ver and debver.at_least(sbuild_ver, sbs.UNSHARE_BIND_MOUNTS_MIN)):
        log.warning(
            "sbuild %s cannot bind-mount the package cache: builds go without it",
            sbuild_ver or "(not installed)",
        )
    block = sbs.config_block(
        mode, sbuild_ver, sbs.tmpfs_unpack_template(), cache_dir, server, cache=cache
    )
    rc_path = sbs.sbuildrc_path(sbuild_ver=sbuild_ver)
    current = fsutil.read_text(rc_path) or ""
    merged = sbs.merge_config(current, block)
    if merged == current:
        print(f"{rc_path} already has the sbuild-fast settings")
    elif write and not dry_run:
        if not rc_path.parent.is_dir():  # ~/.config/sbuild for a first config.pl
            try:
                rc_path.parent.mkdir(mode=0o755, parents=True)
            except OSError as exc:
                raise Error(f"cannot create {rc_path.parent}: {exc.strerror}") from None
        # A ~/.sbuildrc kept in a dotfiles repository stays a symlink, its mode kept.
        fsutil.atomic_write(rc_path, merged, follow_symlinks=True)
        print(f"wrote the sbuild-fast settings to {rc_path}")
    elif write:
        print(f"would write the sbuild-fast settings to {rc_path}:")
        print(block, end="")
    else:
        print(f"sbuild settings for fast builds (add to {rc_path}, or rerun with --configure):")
        print(block, end="")
        note = default_mode_note(mode, sbuild_ver, "autopkgtest" if server else mode)
        if note:
            print(note)
    if mode == "schroot":
        print(SCHROOT_BUILDERS_NOTE)
    return EXIT_OK
