"""sbuild-fast remove: a chroot sbuild-fast made, and only such a chroot."""

import argparse
import contextlib
import os
import shutil
from pathlib import Path

from debadmin import fsutil
from debadmin.errors import EXIT_OK, Error
from debadmin.sbuild_fast import create as sfc
from debadmin.sbuild_fast import sbuild as sbs


def remove(args: argparse.Namespace) -> int:
    """sbuild-fast remove: one chroot sbuild-fast recorded, and its record."""
    dist = sbs.validate_dist(args.dist)
    arch = sbs.validate_arch(args.arch or sfc.host_arch())
    name = sbs.chroot_name(dist, arch)
    if args.mode == "schroot":
        base = sbs.SCHROOT_BASE
        paths = [
            Path("/") / sbs.SCHROOT_CONF_DIR / f"sbuild-fast-{name}",
            base / name,
            Path("/") / sbs.SCHROOT_STATE_DIR / f"{name}.json",
        ]
        paths += sorted((base / "gen").glob(f"{name}.*"))
        lock = base / "lock"
    else:
        cache = sbs.user_cache_dir()
        record = cache / sbs.STATE_SUBDIR / f"{name}.json"
        paths = [cache / f"{name}.tar", record]
        lock = cache / sbs.STATE_SUBDIR / "lock"
        # sbuild's cache directory is shared with tarballs made by hand or by
        # sbuild-createchroot: only one sbuild-fast recorded is its to remove.
        if not record.exists() and paths[0].exists():
            raise Error(f"{paths[0]} was not made by sbuild-fast (no {record}): left alone")
    existing = [p for p in paths if p.exists() or p.is_symlink()]
    if not existing:
        raise Error(f"no sbuild-fast chroot {name} ({args.mode} mode)")
    if args.dry_run:
        for path in existing:
            print(f"would remove {path}")
        return EXIT_OK
    if args.mode == "schroot" and os.geteuid() != 0:
        raise Error("--mode schroot needs root")
    holding = fsutil.locked(lock) if lock.parent.is_dir() else contextlib.nullcontext()
    with holding:
        for path in existing:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                fsutil.remove_file(path)
            print(f"removed {path}")
        # Directories the last chroot leaves empty go too; the lock file stays, as
        # another run may be waiting on it.
        leftovers = (
            [base / "gen", Path("/") / sbs.SCHROOT_STATE_DIR] if args.mode == "schroot" else []
        )
        for directory in leftovers:
            with contextlib.suppress(OSError):
                directory.rmdir()
    return EXIT_OK
