"""journal-acl-setup: revert, the journal tree given back as apply found it.

For each directory and file under the journal, by descriptor (walk.walk):

- apply recorded it (state.Store) and it still holds exactly what apply made of the
  record for the groups it granted it: it gets the record back, byte for byte (ACL,
  default ACL, mode), once none of those groups is left, else what apply makes of the
  record for the groups left.  Entries of a reverted group it inherited from a default
  ACL apply gave (recorded as inherited) are taken out of the record first.
- apply recorded it and it was changed since (by hand): the reverted groups' entries
  apply added go, an entry the group had before gets its old rights back, the mask is
  narrowed to what is left; everything else stays as the admin left it.
- apply did not record it (a file made since, inheriting its directory's default ACL):
  it loses the entries of the reverted groups that its directory's default ACL holds
  from apply, and nothing else.

A recorded inode the walk does not meet (moved out, hard-linked since, skipped) or
that refuses its ACL keeps its record and is a problem: revert says so, exits 1, and a
later revert finishes the job.  --strip (strip=True) ignores the records: every entry
of the groups goes, masks narrowed, nothing restored.
"""

from __future__ import annotations  # annotations stay text: typing is never imported

import os

from debadmin.journal_acl_setup import walk as walker

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Set, Tuple

    Entries = Dict[Tuple[int, int], int]

G = walker.GROUP


class Outcome:
    """What one revert walk did: paths changed (would change), problems as (path or
    None, message), what it passed over and only says (symbolic links...), the records
    it met (the setup records' keys; the others counted)."""

    __slots__ = ("touched", "problems", "notes", "met", "met_count")

    def __init__(self) -> None:
        self.touched = 0
        self.problems: List[Tuple[Optional[str], str]] = []
        self.notes: List[str] = []
        self.met: Set[Tuple[int, int]] = set()  # the journal's setup records met
        self.met_count = 0  # records of the groups met: counted, not kept (200,000 of them)


def _gids_in(entries: Optional[Entries]) -> Set[int]:
    return {ident for tag, ident in (entries or {}) if tag == G}


def _put_back(
    entries: Optional[Entries], base: Optional[Entries], gids: Set[int], access: bool
) -> Optional[Entries]:
    """entries with the gids' entries as base had them (taken out where base had none),
    the mask narrowed to what is left; None when nothing changes."""
    if entries is None:
        return None
    base = base or {}
    result = walker.strip_groups(entries, gids, {} if access else None)
    if result is None:
        return None
    back = {(G, g): base[(G, g)] for g in gids if (G, g) in base}
    if back:
        result = dict(result)
        result.update(back)
        mask = entries.get((walker.MASK, walker.UNDEFINED))
        if mask is not None:
            result[(walker.MASK, walker.UNDEFINED)] = mask
    return None if result == entries else result


def revoke(
    journal_fd: int,
    journal: str,
    gone: Set[int],
    uids: Set[int],
    store: Any,
    dry_run: bool,
    strip: bool = False,
    setup: bool = False,
    stock: Set[int] = frozenset(),
) -> Outcome:
    """Revert the groups gone under the directory open as journal_fd (the caller
    closes it).  See the module's docstring.  setup: also give back what apply's setup
    steps changed (ownership.py), where it is still what they left.  stock: gids of
    gone whose entries on the journal directory are systemd's own unless recorded
    (adm): not taken from files below it that apply did not record."""
    outcome = Outcome()
    skips = walker.Skips()
    # directory -> gids its default ACL has from apply; the journal's parent: every
    # group gone but systemd's own.
    from_apply: Dict[str, Set[int]] = {journal.rpartition("/")[0]: set(gone) - set(stock)}
    state = None if strip else store
    setups = state.setup_keys() if setup and state is not None else set()
    # The records naming the groups, counted before the walk: those it does not meet
    # (moved out, hard-linked since) are what is left of them once it is done.
    recorded = 0
    if state is not None and state.db is not None:
        recorded = state.count_holding(gone)
    if state is not None and state.db is not None and not dry_run:
        state.begin(defer=True)
    for node in walker.walk(journal_fd, journal, uids, skips):
        parent = from_apply.get(node.path.rpartition("/")[0], set(gone))
        try:
            if _visit(node, setups, gone, state, parent, from_apply, outcome, dry_run):
                outcome.touched += 1
        except walker.AclError as exc:
            outcome.problems.append((node.path, f"{exc} (its record is kept)"))
    _unmet_setup(outcome, setups, journal)
    if state is not None and state.db is not None:
        if not dry_run:
            state.commit()
        unmet = recorded - outcome.met_count
        if unmet:
            outcome.problems.append(
                (
                    None,
                    f"{unmet} file(s) or directories apply changed were not found under "
                    f"{walker.shown(journal)} as apply left them (moved out, hard-linked "
                    "since, or skipped): their records are kept for a later revert",
                )
            )
    for skip in skips.items():
        if skip.code == "skipped-hardlink" or skip.action:
            outcome.problems.append((skip.path, skip.message))
        else:
            outcome.notes.append(skip.message)
    return outcome


def _visit(node, setups, gone, state, parent, from_apply, outcome, dry_run) -> bool:
    """One inode: as the journal's setup recorded it (setups: their keys), or as any."""
    if setups:
        from debadmin.journal_acl_setup import state as acl_state

        key = (node.st.st_ino, acl_state.generation(node.fd))
        if key in setups:
            return _setup_node(node, key, gone, state, parent, from_apply, outcome, dry_run)
    return _node(node, gone, state, parent, from_apply, outcome, dry_run)


def _unmet_setup(outcome: Outcome, setups: Set[Tuple[int, int]], journal: str) -> None:
    unmet = setups - outcome.met
    if unmet:
        outcome.problems.append(
            (
                None,
                f"{len(unmet)} of the journal's directories or active files whose "
                f"owner, mode or ACLs apply set up were not found under {walker.shown(journal)}"
                ": their records are kept for a later revert",
            )
        )


# What an inode holds, parsed, and what apply made of a record, depend on the attributes,
# mode, group, gids and type alone, and a journal has a few distinct ones: each worked out
# once (up to MEMO_MAX).  The entries are shared: read only, never changed in place.
MEMO_MAX = 4096
_HELD: Dict[Tuple[bytes, bytes, int, bool], Tuple[Entries, Optional[Entries]]] = {}
_MADE: Dict[tuple, Tuple[Optional[Entries], Tuple[Entries, Optional[Entries]]]] = {}


def _generation():
    """state.generation, the module imported on first use (sqlite3 with it)."""
    from debadmin.journal_acl_setup.state import generation

    return generation


def _held(node: walker.Node) -> Tuple[Entries, Optional[Entries]]:
    """What the inode holds, parsed (its access ACL, else its mode's; its default ACL)."""
    access_raw, default_raw = node.raw()
    seen = (access_raw, default_raw, node.st.st_mode, node.is_dir)
    held = _HELD.get(seen)
    if held is None:
        held = (
            walker.parse(access_raw) or walker.from_mode(node.st.st_mode),
            walker.parse(default_raw) if node.is_dir else None,
        )
        if len(_HELD) < MEMO_MAX:
            _HELD[seen] = held
    return held


def _made(record: Any, node: walker.Node):
    """The record's default ACL, parsed, and what apply made of the record for its
    groups: (base_default, (access, default))."""
    mode, gids = record[1], record[4]
    seen = (record[2], record[3], mode, node.st.st_gid, frozenset(gids), node.is_dir)
    applied = _MADE.get(seen)
    if applied is None:
        base = walker.parse(record[2]) or walker.from_mode(mode)
        base_default = walker.parse(record[3]) if node.is_dir else None
        made = walker.grant_all(base, base_default, node.st.st_gid, gids, node.is_dir)
        applied = (base_default, made)
        if len(_MADE) < MEMO_MAX:
            _MADE[seen] = applied
    return applied


def _node(
    node: walker.Node,
    gone: Set[int],
    store: Any,
    parent: Set[int],
    from_apply: Dict[str, Set[int]],
    outcome: Outcome,
    dry_run: bool,
) -> bool:
    """Revert one inode; whether it changed (would change)."""
    access, default = _held(node)
    record = None
    if store is not None and store.db is not None:
        key = (node.st.st_ino, _generation()(node.fd))
        record = store.lookup(*key)
    if record is None:
        strip = gone if store is None else gone & parent
        if node.is_dir:
            from_apply[node.path] = parent & walker.named_gids(default)
        return _set(node, access, default, strip, None, None, dry_run)
    gids, later = record[4], record[5]
    base_default, made = _made(record, node)
    if node.is_dir:
        from_apply[node.path] = later | {
            g for g in gids if (base_default or {}).get((G, g)) != (made[1] or {}).get((G, g))
        }
    hit = gone & (gids | later)
    if not hit:
        return False
    outcome.met_count += 1
    if made != (access, default):
        # Changed since apply: take off what apply gave, leave the rest as it is.  An
        # entry it inherited from a reverted group is apply's, not one to give back.
        old_access, old_default, mode, base, base_default = _without(record, gone, node.is_dir)
        changed = _set(node, access, default, hit, base, base_default, dry_run)
        if not dry_run:
            _keep(
                store,
                key,
                gids - gone,
                later - gone,
                old_access,
                old_default,
                mode,
                base,
                base_default,
            )
        return changed
    return _restore(node, key, record, made, gone, store, dry_run)


_WITHOUT: Dict[tuple, tuple] = {}
_TARGET: Dict[tuple, tuple] = {}


def _without(record: Any, gone: Set[int], is_dir: bool):
    """The record's raw access and default ACL, mode, and parsed entries, without the
    entries it inherited from a group in gone (apply's, not the inode's own).  Worked
    out once per distinct record (up to MEMO_MAX); shared, never changed in place."""
    seen = (record[1], record[2], record[3], frozenset(gone & record[5]), is_dir)
    found = _WITHOUT.get(seen)
    if found is None:
        found = _without_once(record, gone, is_dir)
        if len(_WITHOUT) < MEMO_MAX:
            _WITHOUT[seen] = found
    return found


def _without_once(record: Any, gone: Set[int], is_dir: bool):
    _, mode, old_access, old_default, _, later = record
    base = walker.parse(old_access) or walker.from_mode(mode)
    base_default = walker.parse(old_default) if is_dir else None
    inherited = gone & later
    if inherited:
        stripped = walker.strip_groups(base, inherited, {})
        if stripped is not None:
            base, mode = stripped, walker.mode_of(stripped, mode)
            old_access = walker.attribute(base)
        stripped = walker.strip_groups(base_default, inherited)
        if stripped is not None:
            base_default, old_default = stripped, walker.posixacl.pack(stripped)
    return old_access, old_default, mode, base, base_default


def _keep(store, key, left, later, old_access, old_default, mode, base, base_default) -> None:
    """After a revert changed an inode by hand-changed rules: its record stays for the
    groups still applied (and the ones it inherited), or, when none is left, as a
    record of nothing granted if what it held before holds a group's entries (so a
    revert of that group knows they were there), else it goes."""
    if left or later:
        store.set_base(*key, old_access, old_default, mode, later)
        store.set_gids(*key, left)
    elif walker.named_gids(base) | walker.named_gids(base_default):
        store.set_base(*key, old_access, old_default, mode, ())
        store.set_gids(*key, ())
    else:
        store.forget(*key)


def _setup_node(
    node: walker.Node,
    key: Tuple[int, int],
    gone: Set[int],
    store: Any,
    parent: Set[int],
    from_apply: Dict[str, Set[int]],
    outcome: Outcome,
    dry_run: bool,
) -> bool:
    """An inode whose owner, mode or ACLs apply's setup steps changed (ownership.py):
    first what apply granted it afterwards, as any inode; then, where it holds what the
    setup steps left, what it held before them; else it is left as it is, a problem, its
    record kept."""
    from debadmin.journal_acl_setup import ownership

    before = store.setup_lookup(*key)
    default_before = walker.parse(before[4]) if node.is_dir else None
    record = store.lookup(*key)
    if record is not None:
        _node(node, gone, store, parent, from_apply, outcome, dry_run)
    if node.is_dir:
        # What its default ACL held of gone after the setup steps and not before came
        # from them (systemd-tmpfiles' lines for adm): files made since lose it too.
        held = walker.parse(record[3]) if record is not None else node.acls()[1]
        from_apply[node.path] = from_apply.get(node.path, set()) | (
            gone & walker.named_gids(held) - walker.named_gids(default_before)
        )
    outcome.met.add(key)
    if dry_run:
        return True
    after = before[5]
    if after is not None and ownership.current(node) != after:
        outcome.problems.append(
            (
                node.path,
                f"{walker.shown(node.path)} was changed since apply set up its owner, mode "
                "and ACLs: left as it is (its record is kept)",
            )
        )
        return False
    ownership.give_back(node, before)
    store.forget_setup(*key)
    return True


def _set(
    node: walker.Node,
    access: Entries,
    default: Optional[Entries],
    gids: Set[int],
    base: Optional[Entries],
    base_default: Optional[Entries],
    dry_run: bool,
) -> bool:
    """Take the entries of gids off the inode, or give them back what base had; whether
    that changes it."""
    new_access = _put_back(access, base, gids, True)
    new_default = _put_back(default, base_default, gids, False) if node.is_dir else None
    if new_access is None and new_default is None:
        return False
    if not dry_run:
        node.set_acls(new_access, new_default)
    return True


def _restore(
    node: walker.Node,
    key: Tuple[int, int],
    record: Any,
    made: Tuple[Entries, Optional[Entries]],
    gone: Set[int],
    store: Any,
    dry_run: bool,
) -> bool:
    """An inode that holds what apply made of its record: the record back, without
    the entries it inherited from the groups gone, or what apply makes of that for the
    groups left."""
    gids, later = record[4], record[5]
    inherited = gone & later
    # Entries it inherited from apply's default ACL: not part of what it gets back.
    old_access, old_default, mode, base, base_default = _without(record, gone, node.is_dir)

    def rebase() -> None:
        # Only once the inode took what it is given: a refused write (AclError) keeps
        # the record as it was, for the next revert to find the entries it inherited.
        if inherited:
            store.set_base(*key, old_access, old_default, mode, later - gone)

    left = gids - gone
    if not left:
        if not dry_run:
            walker.restore(node, old_access, old_default, mode)
            rebase()
            if walker.named_gids(base) | walker.named_gids(base_default):
                # What it held before holds a group's entries: kept, so that a revert of
                # that group knows they were there before its apply.
                store.set_gids(*key, ())
            else:
                store.forget(*key)
        return True
    seen = (old_access, old_default, mode, node.st.st_gid, frozenset(left), node.is_dir)
    found = _TARGET.get(seen)
    if found is None:
        target = walker.grant_all(base, base_default, node.st.st_gid, left, node.is_dir)
        packed = walker.posixacl.pack(target[0])
        default = None if target[1] is None else walker.posixacl.pack(target[1])
        found = (target, packed, default)
        if len(_TARGET) < MEMO_MAX:
            _TARGET[seen] = found
    target, packed_access, packed_default = found
    if target == made:
        if not dry_run:
            rebase()
        return bool(inherited)
    if not dry_run:
        node.set_attributes(packed_access, packed_default if node.is_dir else None)
        rebase()
        store.set_gids(*key, left)
    return True


def stripped_paths(journal_fd: int, journal: str, gone: Set[int], uids: Set[int]) -> int:
    """How many paths under the journal hold an entry of gone (what --strip changes)."""
    return revoke(journal_fd, journal, gone, uids, None, dry_run=True, strip=True).touched


def close(fd: int) -> None:
    os.close(fd)
