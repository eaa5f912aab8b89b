"""sbuild-fast update: the recorded chroots refreshed and replaced atomically."""

import argparse
import sys
from pathlib import Path

from debadmin.errors import EXIT_OK, Error
from debadmin.sbuild_fast import create as sfc
from debadmin.sbuild_fast import leftovers
from debadmin.sbuild_fast import sbuild as sbs


def update(args: argparse.Namespace) -> int:
    """sbuild-fast update: refresh (or recreate) the chroots recorded, one by one."""
    dists = [sbs.validate_dist(d) for d in args.dist]
    cache_max = sbs.parse_size(args.cache_max) if args.cache_max else None
    leftovers.clean_mine(args.dry_run)
    if args.mode == "schroot":
        states = sbs.read_states(Path("/") / sbs.SCHROOT_STATE_DIR)
    else:
        states = sbs.read_states(sbs.user_cache_dir() / sbs.STATE_SUBDIR)
    states = [s for s in states if s["mode"] == args.mode and (not dists or s["dist"] in dists)]
    missing = [d for d in dists if d not in {s["dist"] for s in states}]
    if missing:
        raise Error(f"no sbuild-fast chroot for {', '.join(missing)}: run 'sbuild-fast create'")
    if not states:
        print("no sbuild-fast chroots: nothing to update")
        return EXIT_OK
    # One chroot that cannot be refreshed (a suite gone from the mirror) must not keep
    # the others stale: each is tried, the failures reported, exit 2 at the end.
    failed = []
    for state in states:
        try:
            recipe = sfc.recipe_from_state(state, args.mirror)
            sfc.build_chroot(
                recipe,
                args.dry_run,
                "replace",
                "updated",
                refresh=not args.recreate,
                from_record=True,
                mirror=args.mirror,
            )
        except Error as exc:
            if len(states) == 1:
                raise
            print(f"sbuild-fast: error: {state['name']}: {exc}", file=sys.stderr)
            failed.append(state["name"])
    if any(s.get("cache") for s in states) or cache_max is not None:
        sfc.tend_cache(args.mode, args.dry_run, cache_max)
    if failed:
        raise Error(f"not updated: {', '.join(failed)}")
    return EXIT_OK
