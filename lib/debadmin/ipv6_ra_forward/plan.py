"""The steps of enable and disable, and what forwarding would cost the other interfaces."""

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Tuple

from debadmin import fsutil, proc
from debadmin.errors import Error
from debadmin.ipv6_ra_forward import owner as owners
from debadmin.ipv6_ra_forward.sysctls import (
    Config,
    DEFAULTS_FILE,
    DROPIN,
    Persisted,
    ipv6_interfaces,
    matches,
    read_config,
    read_dropin,
    read_sysctl,
    sysctl_key,
    sysctl_path,
    write_sysctl,
)
from debadmin.ipv6_ra_forward.solicit import TENTATIVE, link_local_tentative, solicit
from debadmin.ipv6_ra_forward.managers import (
    ifupdown_accept_ra,
    ifupdown_conflicts,
    manager_keeps_ra,
    networkd_dropin,
    networkd_path,
    snippet,
)
from debadmin.ipv6_ra_forward.status import accepts_ra, ip_json, ra_addresses, ra_routes
from debadmin.ipv6_ra_forward.stack import link_is_up, master_of

log = logging.getLogger("debadmin")


@dataclass
class Loss:
    """An interface that would lose what it learned from RAs when forwarding goes on."""

    name: str
    accept_ra: int
    routes: List[Dict[str, object]]
    addresses: List[str]

    def text(self) -> str:
        what = []
        if self.routes:
            gateways = ", ".join(str(r.get("gateway")) for r in self.routes)
            what.append(f"its RA default route via {gateways}")
        if self.addresses:
            what.append(f"its RA address {' '.join(self.addresses)}")
        return f"{self.name} (accept_ra={self.accept_ra}) would lose {' and '.join(what)}"


def ra_learned() -> Tuple[list, list]:
    """What ip shows now: 'ip -6 addr show' and 'ip -6 route show default', as JSON."""
    return ip_json(["-6", "addr", "show"]), ip_json(["-6", "route", "show", "default"])


def forwarding_losses(
    root: Path, keep: Iterable[str], not_uplinks: Iterable[str], addr_json: list, route_json: list
) -> List[Loss]:
    """The interfaces that would lose an RA default route or address if all.forwarding went
    to 1 now, apart from those in keep (the uplinks) and those not_uplinks matches.

    Writing conf/all/forwarding sets every interface's forwarding; from then on the kernel
    accepts RAs only where accept_ra is 2, and drops what the others learned. networkd
    and NetworkManager learn in user space, whatever the kernel's forwarding.
    """
    keep, not_uplinks = set(keep), list(not_uplinks)
    routes, addresses = ra_routes(route_json), ra_addresses(addr_json)
    losses = []
    for name in ipv6_interfaces(root):
        if name == "lo" or name in keep or matches(not_uplinks, name):
            continue
        if not routes.get(name) and not addresses.get(name):
            continue
        try:
            accept_ra = read_sysctl(root, name, "accept_ra")
            forwarding = read_sysctl(root, name, "forwarding")
        except Error:
            continue  # gone meanwhile
        if accepts_ra(accept_ra, 1) or not accepts_ra(accept_ra, forwarding):
            continue  # accept_ra 2 keeps learning; 0 (or forwarding on) learned nothing
        if owners.detect(root, name).handles_ra_itself:
            continue
        losses.append(Loss(name, accept_ra, routes.get(name, []), addresses.get(name, [])))
    return losses


def losses_message(losses: List[Loss], watcher: bool = False) -> str:
    """One line: what forwarding would cost, and the two ways on (enable's options, or
    the watcher's configuration)."""
    names = [loss.name for loss in losses]
    them = "it" if len(names) == 1 else "them"
    if watcher:
        how = (
            f"add {them} to UPLINKS= (to keep learning) or NOT_UPLINKS= (to let {them} "
            f"lose it) in /{DEFAULTS_FILE}, then reload ipv6-ra-forward.service"
        )
    else:
        options = " ".join(f"--not-uplink {n}" for n in names)
        how = f"name {them} as uplinks too, or add {options} if {them} may lose it"
    return (
        "forwarding on (it sets every interface's forwarding) would cost other interfaces "
        "what they learned from router advertisements: "
        + "; ".join(loss.text() for loss in losses)
        + f"; {how}"
    )


class Skipped(Exception):
    """A step that could not be done and need not be: the command carries on."""


@dataclass
class Step:
    """One change: what it does, how, and how to take it back when a later step fails."""

    text: str
    action: Callable[[], object]
    undo: Optional[Callable[[], object]] = None


def sysctl_step(
    root: Path, ifname: str, key: str, value: int, current: int, why: str = ""
) -> Step:
    return Step(
        f"set {sysctl_key(ifname, key)}={value} ({why or f'was {current}'})",
        lambda: write_sysctl(root, ifname, key, value),
        lambda: write_sysctl(root, ifname, key, current),
    )


def restorer(path: Path) -> Callable[[], None]:
    """An undo that puts path back as it is now: its bytes, or no file at all."""
    try:
        old: Optional[bytes] = path.read_bytes()
    except FileNotFoundError:
        old = None
    except OSError as exc:
        raise Error(f"cannot read {path}: {exc.strerror}") from None

    def restore() -> None:
        if old is None:
            fsutil.remove_file(path)
        else:
            fsutil.atomic_write(path, old)

    return restore


def dropin_step(root: Path, text: Optional[str]) -> Step:
    """Write the drop-in, or remove it when text is None; the undo puts back what was there."""
    path = root / DROPIN
    restore = restorer(path)
    if text is None:
        return Step(f"remove {path}", lambda: fsutil.remove_file(path), restore)
    return Step(f"write {path}", lambda: fsutil.atomic_write(path, text), restore)


def file_removal_step(path: Path, remove_empty_parent: bool = False) -> Step:
    """Remove path (and its directory when remove_empty_parent and nothing else is in it:
    the FILE.network.d/ that enable --networkd created)."""
    old = path.read_bytes()

    def action() -> None:
        fsutil.remove_file(path)
        if remove_empty_parent:
            try:
                path.parent.rmdir()
            except OSError:
                pass  # not empty: the admin's drop-ins stay, and so does their directory

    def undo() -> None:
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        fsutil.atomic_write(path, old)

    return Step(f"remove {path}", action, undo)


def solicit_step(name: str, root: Path = Path("/")) -> Step:
    def action() -> None:
        if not link_is_up(root, name):
            # Not worth a warning: the kernel solicits by itself when the link comes up,
            # and accept_ra is 2 by then.
            raise Skipped("the link is down; the kernel solicits when it comes up")
        if link_local_tentative(name, root):
            raise Skipped(TENTATIVE)
        if not solicit(name):
            raise Skipped("not sent (see the warning above)")

    return Step(f"send a router solicitation on {name}", action)


def run_steps(steps: List[Step], dry_run: bool) -> None:
    """Run the steps in order, then print one line each.

    When a step fails, the steps done so far are undone, newest first, and the error goes
    on: a failed command leaves the drop-in and the sysctls as it found them (say a
    read-only /proc/sys after the drop-in was written) and prints only the error.
    """
    if dry_run:
        for step in steps:
            print(f"would {step.text}")
        return
    lines: List[str] = []
    done: List[Step] = []
    try:
        for step in steps:
            try:
                step.action()
            except Skipped as exc:
                lines.append(f"skipped: {step.text}: {exc}")
                continue
            done.append(step)
            lines.append(f"done: {step.text}")
    except Error:
        for step in reversed(done):
            if step.undo is not None:
                try:
                    step.undo()
                except Error as exc:
                    log.error("could not undo '%s': %s", step.text, exc)
        raise
    for line in lines:
        print(line, flush=True)


def networkd_native_step(root: Path, owner: owners.Owner, ifname: str) -> Optional[Step]:
    """Write networkd's native configuration for ifname, or None when it is there already.

    Refused (an error) when no .network file matches the link: a drop-in would extend
    nothing, and writing a whole .network file is the admin's decision.
    """
    path = networkd_path(root, owner)
    dropin = networkd_dropin(root, owner)
    if path is not None and dropin is not None and not path.is_file():
        # networkd's state names a file that has gone since: a drop-in would extend nothing.
        raise Error(
            f"systemd-networkd manages {ifname} with {owner.source}, which no longer exists:"
            f" --networkd needs a .network file to extend ('networkctl reload' first)"
        )
    if path is None or dropin is None:
        raise Error(
            f"systemd-networkd manages {ifname} but no .network file matches it"
            f" ({owner.source}): --networkd needs one to extend"
        )
    text, native = owners.networkd_native(root, path, owners.systemd_version(root))
    if native:
        return None
    content = f"# Written by ipv6-ra-forward enable --networkd; removed by disable.\n{text}"
    restore = restorer(dropin)

    def write() -> None:
        dropin.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        fsutil.atomic_write(dropin, content)

    return Step(f"write {dropin} ({ifname}: networkd's own configuration)", write, restore)


def networkd_running(root: Path) -> bool:
    return root == Path("/") and (root / "run/systemd/netif/links").is_dir()


def networkd_reload_step(root: Path) -> Step:
    """'networkctl reload': networkd reconfigures the links whose .network changed."""

    def action() -> None:
        if not networkd_running(root):
            raise Skipped("systemd-networkd is not running; it reads the files when it starts")
        proc.run(["networkctl", "reload"], timeout=60)

    return Step("run networkctl reload", action)


@dataclass
class EnablePlan:
    """What plan_enable gathers, uplink by uplink, before it orders the steps."""

    state: Persisted
    steps: List[Step] = field(default_factory=list)  # the sysctls, in their order
    networkd_steps: List[Step] = field(default_factory=list)
    snippets: List[str] = field(default_factory=list)
    solicit_on: List[str] = field(default_factory=list)
    kernel_uplinks: List[str] = field(default_factory=list)
    blocked: bool = False  # an uplink's manager needs configuration first
    accepted: List[str] = field(default_factory=list)
    not_uplinks: List[str] = field(default_factory=list)  # may lose their RA routes
    losses: List[Loss] = field(default_factory=list)  # forwarding left off for them

    def accept(self, name: str) -> None:
        """name is enabled (again): the watcher may keep it again."""
        self.accepted.append(name)
        if name in self.state.held:
            self.state.held.remove(name)


def plan_managed_uplink(
    plan: EnablePlan, root: Path, owner: owners.Owner, name: str, networkd: bool
) -> None:
    """An uplink networkd or NetworkManager handles RAs of: networkd's own configuration
    (--networkd), recorded when the manager keeps RAs with forwarding on, else refused with
    the configuration it needs."""
    if networkd and owner.name == owners.NETWORKD:
        step = networkd_native_step(root, owner, name)
        if step is not None:
            plan.networkd_steps.append(step)
            plan.state.managed[name] = owner.name
            plan.accept(name)
            return
    if not manager_keeps_ra(root, owner):
        plan.snippets.append(snippet(owner, name, root))
        plan.blocked = True
        return
    # Recorded like any other uplink: disable must know it is still enabled.
    plan.state.managed[name] = owner.name
    plan.accept(name)


def plan_kernel_uplink(plan: EnablePlan, root: Path, owner: owners.Owner, name: str) -> None:
    """An uplink whose RAs the kernel handles (ifupdown's or nobody's): accept_ra=2."""
    state = plan.state
    plan.accept(name)
    if ifupdown_conflicts(owner):
        plan.snippets.append(snippet(owner, name, root))
    plan.kernel_uplinks.append(name)
    current = read_sysctl(root, name, "accept_ra")
    if current != 2 or name not in state.uplinks:
        # Recorded even when it is 2 already (ifupdown's inet6 auto sets 2): disable
        # then leaves 2 in place instead of lowering it while forwarding stays on.
        state.saved_accept_ra.setdefault(name, current)
    if current != 2:
        plan.steps.append(sysctl_step(root, name, "accept_ra", 2, current))
        plan.solicit_on.append(name)
    if name not in state.uplinks:
        state.uplinks.append(name)


def plan_forwarding(plan: EnablePlan, root: Path, uplinks: List[str]) -> None:
    """all.forwarding=1, unless an uplink's manager would lose the route with it."""
    state = plan.state
    current = read_sysctl(root, "all", "forwarding")
    if current == 1:
        # Nothing to turn on; recorded when an uplink is enabled (a refused enable
        # writes no drop-in that holds forwarding alone).
        state.forwarding = state.forwarding or bool(plan.accepted)
    elif plan.blocked:
        # Forwarding now would cost those uplinks their route: the manager comes first.
        plan.snippets.append(
            "# IPv6 forwarding left off: apply the configuration above, then run\n"
            f"# ipv6-ra-forward enable {' '.join(uplinks)}\n"
        )
    else:
        addr_json, route_json = ra_learned()
        keep = set(uplinks) | set(state.all_uplinks)
        plan.losses = forwarding_losses(root, keep, plan.not_uplinks, addr_json, route_json)
        if plan.losses:
            return  # refused by the caller; nothing of forwarding is planned
        plan.steps.append(sysctl_step(root, "all", "forwarding", 1, current))
        plan.solicit_on = list(plan.kernel_uplinks)
        if state.saved_forwarding is None:
            state.saved_forwarding = current
        state.forwarding = True


def plan_enable(
    root: Path,
    uplinks: List[str],
    forwarding: bool,
    persist: bool,
    networkd: bool = False,
    not_uplinks: Iterable[str] = (),
    losses: Optional[List[Loss]] = None,
) -> Tuple[List[Step], List[str], List[str]]:
    """The steps of enable in their order, the uplinks to solicit on, and the snippets.

    With networkd, a link that systemd-networkd manages gets networkd's own configuration
    (a drop-in with IPv6AcceptRA=yes and its forwarding setting) instead of advice.
    Everything is read and checked here; nothing is written until the steps run.
    Interfaces that forwarding would cost an RA route or address (not_uplinks apart) go
    to losses, and then forwarding is not planned: the caller refuses or says so.
    """
    previous = read_dropin(root) if persist else None
    plan = EnablePlan((previous or Persisted()).copy(), not_uplinks=list(not_uplinks))
    for name in uplinks:
        owner = owners.detect(root, name)
        if owner.handles_ra_itself:
            plan_managed_uplink(plan, root, owner, name, networkd)
        else:
            plan_kernel_uplink(plan, root, owner, name)
    if forwarding:
        plan_forwarding(plan, root, uplinks)
    steps = plan.steps
    writes: List[Step] = []
    text = plan.state.render()
    if persist and not plan.state.empty and (previous is None or previous.render() != text):
        # An empty state (every uplink refused) writes nothing, not a header-only file.
        # First: where /etc cannot be written, the running system stays untouched too;
        # where a sysctl write fails later, run_steps puts the old file back.
        writes.append(dropin_step(root, text))
    if plan.networkd_steps:
        # networkd's configuration before any sysctl: a failure leaves the system as it was.
        writes.extend([*plan.networkd_steps, networkd_reload_step(root)])
    steps = writes + steps
    for name in plan.solicit_on:
        steps.append(solicit_step(name, root))
    if losses is not None:
        losses.extend(plan.losses)
    return steps, plan.solicit_on, plan.snippets


def with_assignment(text: str, key: str, value: str) -> str:
    """text of a shell-style /etc/default file with KEY="value": its last assignment
    replaced in place (comments and the rest kept), or one appended."""
    lines = text.splitlines(keepends=True)
    line = f'{key}="{value}"\n'
    for index in range(len(lines) - 1, -1, -1):
        if lines[index].strip().partition("=")[0].strip() == key and "=" in lines[index]:
            lines[index] = line
            return "".join(lines)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    return "".join(lines) + line


def not_uplinks_step(root: Path, config: Config, names: List[str]) -> Optional[Step]:
    """Remember --not-uplink names in NOT_UPLINKS= of /etc/default/ipv6-ra-forward."""
    new = [n for n in names if not matches(config.not_uplinks, n)]
    if not new:
        return None
    path = root / DEFAULTS_FILE
    value = " ".join(config.not_uplinks + new)
    try:
        text = path.read_text(encoding="utf-8") if path.exists() else ""
    except (OSError, UnicodeDecodeError) as exc:
        raise Error(f"cannot read {path}: {exc}") from None
    content = with_assignment(text, "NOT_UPLINKS", value)
    restore = restorer(path)
    return Step(
        f'write {path} (NOT_UPLINKS="{value}")',
        lambda: fsutil.atomic_write(path, content),
        restore,
    )


def watcher_covers(root: Path, ifname: str, persist: bool) -> Optional[str]:
    """How ipv6-ra-forward.service would take ifname up again, or None when it would not."""
    if not owners._service_enabled(root, "ipv6-ra-forward.service"):
        return None
    try:
        config = read_config(root)
    except Error:
        return None
    if matches(config.uplinks, ifname):
        return f"UPLINKS in /{DEFAULTS_FILE} matches it"
    if persist and config.uplinks:
        return f"it is in /{DROPIN}"
    if persist:
        return None  # watch with no UPLINKS watches nothing
    return None


def ifupdown_way(owner: owners.Owner, ifname: str) -> str:
    """How ifupdown would set accept_ra 2 itself: the stanza the interface has, with
    accept_ra 2, rather than 'use inet6 auto' to one that has it already."""
    inet6 = owner.inet6 if owner.name == owners.IFUPDOWN else None
    if inet6 is None:
        return f"use 'iface {ifname} inet6 auto'"
    method = inet6.get("method", "")
    if method == "auto":
        return f"set 'accept_ra 2' in its 'iface {ifname} inet6 auto' stanza ({owner.source})"
    return (
        f"set 'accept_ra 2' in its 'iface {ifname} inet6 {method}' stanza ({owner.source}),"
        " or use method auto"
    )


def reapply_note(root: Path, ifname: str, persist: bool) -> str:
    """One line: what sets accept_ra=2 again when ifname is created anew (ifdown/ifup of a
    bridge, a reboot), and whether the route then comes back at once."""
    owner = owners.detect(root, ifname)
    if owner.handles_ra_itself:
        return ""
    prefix = f"when {ifname} is created again (ifdown/ifup, reboot): "
    if ifupdown_accept_ra(owner) == "2":
        method = (owner.inet6 or {}).get("method", "auto")
        return (
            prefix + f"ifupdown's 'iface {ifname} inet6 {method}' sets accept_ra 2 "
            "before the link comes up, and the kernel solicits"
        )
    why = watcher_covers(root, ifname, persist)
    if why:
        return prefix + f"ipv6-ra-forward.service sets accept_ra 2 and solicits ({why})"
    if persist and (root / "run/udev/control").exists():
        return (
            prefix + f"udev applies /{DROPIN} (systemd's 99-systemd.rules), but sends no "
            "router solicitation: if the link is up by then, the route waits for the "
            "router's next advertisement (radvd: up to 10 minutes); for it at once, "
            f"{ifupdown_way(owner, ifname)} or set UPLINKS={ifname} with "
            "ipv6-ra-forward.service enabled"
        )
    if persist:
        return (
            prefix + f"systemd-sysctl applies /{DROPIN} at boot; no udev runs here to "
            f"apply it to a recreated {ifname}: {ifupdown_way(owner, ifname)} or enable "
            "ipv6-ra-forward.service"
        )
    return prefix + "nothing: --no-persist changed the running system only"


def disable_target(
    name: str, state: Persisted, owner: owners.Owner, default_accept_ra: int
) -> Optional[int]:
    """The accept_ra disable gives an uplink back, or None when it leaves it alone."""
    if name in state.saved_accept_ra:
        return state.saved_accept_ra[name]
    if owner.handles_ra_itself:
        log.info("%s is managed by its network manager: accept_ra left alone", name)
        return None
    if name in state.uplinks:
        # Named without a saved value (written by an earlier version, which recorded
        # none when accept_ra was 2 already): 2 is what enable found.
        return None
    return default_accept_ra if default_accept_ra != 2 else 1


def plan_disable_uplinks(
    root: Path, uplinks: List[str], state: Persisted
) -> Tuple[List[Step], List[Step], List[str]]:
    """Per uplink: the accept_ra steps, the removals of networkd drop-ins, and notes."""
    steps: List[Step] = []
    networkd_steps: List[Step] = []
    notes: List[str] = []
    default_accept_ra = read_sysctl(root, "default", "accept_ra")
    for name in uplinks:
        if not sysctl_path(root, name, "accept_ra").exists():
            notes.append(f"skipped: restore accept_ra on {name}: the interface is not present")
            continue
        owner = owners.detect(root, name)
        dropin = networkd_dropin(root, owner)
        if dropin is not None and dropin.exists():
            networkd_steps.append(file_removal_step(dropin, remove_empty_parent=True))
        target = disable_target(name, state, owner, default_accept_ra)
        if target is None:
            continue
        current = read_sysctl(root, name, "accept_ra")
        if current != target:
            steps.append(sysctl_step(root, name, "accept_ra", target, current))
    return steps, networkd_steps, notes


def relearning(root: Path, accept_ra: Dict[str, int]) -> List[str]:
    """The interfaces that learn from RAs again once forwarding is off: the kernel's
    (not networkd's or NetworkManager's), with accept_ra 1 or 2 (accept_ra: the values
    disable gives back), not a port of a bridge or bond, and up. The kernel does not
    solicit when forwarding goes off, so each gets a solicitation."""
    names = []
    for name in ipv6_interfaces(root):
        if name == "lo" or master_of(root, name) or not link_is_up(root, name):
            continue
        try:
            value = accept_ra.get(name, read_sysctl(root, name, "accept_ra"))
        except Error:
            continue
        if value and not owners.detect(root, name).handles_ra_itself:
            names.append(name)
    return names


def held_after_disable(
    root: Path, state: Persisted, uplinks: List[str], persist: bool, notes: List[str]
) -> List[str]:
    """The uplinks to record as held: UPLINKS of the watcher matches them.

    The watcher would raise accept_ra again at once. Recorded as held in the drop-in,
    which the watcher reads at each event, an uplink is left alone until 'enable' names
    it again.
    """
    try:
        patterns = read_config(root).uplinks
    except Error:
        patterns = []
    matched = [n for n in uplinks if matches(patterns, n)]
    if not persist and matched:
        notes.append(
            f"note: UPLINKS in /{DEFAULTS_FILE} matches "
            + " ".join(matched)
            + ": with --no-persist nothing stops ipv6-ra-forward.service raising it again"
        )
    # No longer matched: nothing to hold.
    return [n for n in sorted(set(state.held) | set(matched)) if matches(patterns, n)]


def disable_dropin_step(
    root: Path, previous: Optional[Persisted], remaining: List[str], held: List[str]
) -> Optional[Step]:
    """The drop-in without the disabled uplinks (removed when nothing is left), or None."""
    if previous is None and not held:
        return None
    base = previous or Persisted()
    new = Persisted(
        [n for n in base.uplinks if n in remaining],
        base.forwarding and bool(remaining),
        {k: v for k, v in base.saved_accept_ra.items() if k in remaining},
        base.saved_forwarding if remaining else None,
        {k: v for k, v in base.managed.items() if k in remaining},
        held,
    )
    if new.empty:
        return dropin_step(root, None) if previous is not None else None
    if previous is None or new.render() != previous.render():
        return dropin_step(root, new.render())
    return None


def plan_disable(root: Path, uplinks: List[str], persist: bool) -> Tuple[List[Step], List[str]]:
    """The steps of disable, and notes on what it leaves alone."""
    steps: List[Step] = []
    # Read with --no-persist too: the recorded values are what the running system gets back.
    previous = read_dropin(root)
    state = previous or Persisted()
    # Every uplink enable recorded counts, also those networkd or NetworkManager handle.
    remaining = [n for n in state.all_uplinks if n not in uplinks]
    forwarding_off = (
        previous is not None
        and not remaining
        and state.saved_forwarding == 0
        and read_sysctl(root, "all", "forwarding") == 1
    )
    if forwarding_off:
        steps.append(sysctl_step(root, "all", "forwarding", 0, 1, "enable turned it on"))
    uplink_steps, networkd_steps, notes = plan_disable_uplinks(root, uplinks, state)
    steps.extend(uplink_steps)
    if forwarding_off:
        given_back = {
            name: state.saved_accept_ra[name] for name in uplinks if name in state.saved_accept_ra
        }
        steps.extend(solicit_step(name, root) for name in relearning(root, given_back))
    held = held_after_disable(root, state, uplinks, persist, notes)
    dropin = disable_dropin_step(root, previous, remaining, held) if persist else None
    if dropin is not None:
        steps.insert(0, dropin)
    if networkd_steps and persist:
        steps.extend([*networkd_steps, networkd_reload_step(root)])
    return steps, notes
