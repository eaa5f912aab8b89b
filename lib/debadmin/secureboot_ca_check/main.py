"""secureboot-ca-check: does this machine need the 2026 Secure Boot CA updates?

The command line: which sources to read, then checks.py's reports as text, JSON or
metrics, or one of the fixes (fix.py, libvirt.py, efivarfs.py)."""

import argparse
import datetime
import json
import logging
import sys
import warnings
from pathlib import Path
from typing import List, Optional

from cryptography.utils import CryptographyDeprecationWarning

from debadmin import cli, metrics
from debadmin.errors import EXIT_ACTION, EXIT_NOT_APPLICABLE, EXIT_OK, Error, NotApplicable
from debadmin.findings import finding
from debadmin import output
from debadmin.output import emit_json
from debadmin.secureboot_ca_check import PROG, checks, dbx, efi, efivarfs, fix, payloads

log = logging.getLogger("debadmin")


# --- command line ------------------------------------------------------------------------------


def collect(args: argparse.Namespace, now: datetime.datetime) -> List[dict]:
    if args.root and not Path(args.root).is_dir():
        # A root the admin named is bad input, not a host without UEFI.
        raise Error(f"{args.root}: no such directory")
    root = Path(args.root or "/")
    reports = []
    if args.efivars or not args.varstore:
        reports.append(efivars_report(args, root, now))
    reports += [varstore_report(args, path, root, now) for path in args.varstore or []]
    for report in reports:
        log.debug(
            "%s: %s (%s)",
            checks.printable(report["source"]["path"]),
            report["verdict"],
            ", ".join(f["code"] for f in report["findings"]) or "no findings",
        )
    return reports


def efivars_report(args: argparse.Namespace, root: Path, now: datetime.datetime) -> dict:
    """The report on this machine's efivarfs (under --root), or on the --efivars dump."""
    directory = Path(args.efivars) if args.efivars else root / checks.EFIVARS
    if args.efivars and not directory.is_dir():
        # A directory the admin named is bad input, not a host without UEFI.
        raise Error(f"{directory}: no such directory")
    if not directory.is_dir():
        raise NotApplicable(
            f"{directory} does not exist: this system did not boot "
            "with UEFI (or efivarfs is not mounted)"
        )
    if args.efivars:
        efi.check_efivars_dump(directory)
    variables = efi.read_efivars(directory)
    log.debug(
        "%s: read %s",
        checks.printable(str(directory)),
        ", ".join(sorted(variables)) or "nothing",
    )
    # A dump named by --efivars is another machine's: none of this host's facts (its
    # shims, its fwupd) belong in its report, unless --root names that machine's tree.
    host = not args.efivars or bool(args.root)
    shims = [Path(args.shim)] if args.shim else (checks.default_shims(root) if host else [])
    log.debug("shims to check: %s", checks.printable(", ".join(map(str, shims))) or "none")
    return checks.build_report(
        "efivars",
        str(directory),
        variables,
        shims,
        root,
        now,
        host=host,
        payloads_dir=args.payloads,
        arch=args.arch,
    )


def varstore_report(
    args: argparse.Namespace, path: str, root: Path, now: datetime.datetime
) -> dict:
    """The report on one NVRAM file, raw or qcow2; a blank one is not applicable."""
    try:
        variables = fix.read_varstore(Path(path))
    except efi.BlankStore as exc:
        return checks.blank_report("varstore", path, str(exc))
    log.debug("%s: read %s", checks.printable(path), ", ".join(sorted(variables)) or "nothing")
    shims = [Path(args.shim)] if args.shim else []
    return checks.build_report(
        "varstore", path, variables, shims, root, now, host=False, payloads_dir=args.payloads
    )


def evaluate(args: argparse.Namespace, now: datetime.datetime) -> List[dict]:
    """collect(), with whatever the parsers did not foresee turned into an error.

    Python exits 1 on an uncaught exception, and 1 means "action needed" to the service
    and to scripts: a hostile or unforeseen input must exit 2 with one line instead.
    """
    try:
        with warnings.catch_warnings(record=True) as caught:
            # Whatever checks.build_report() did not turn into findings: to the debug log, never
            # to stderr (hostile input gets a report or one error line).
            warnings.simplefilter("always")
            try:
                return collect(args, now)
            finally:
                for message in dict.fromkeys(str(w.message) for w in caught):
                    log.debug("warning from a library: %s", checks.printable(message))
    except Error:
        raise
    except Exception as exc:
        log.debug("unexpected failure", exc_info=True)
        raise Error(
            checks.printable(f"cannot evaluate the input ({exc.__class__.__name__}: {exc})")
        ) from None


def combined_status(reports: List[dict]) -> int:
    codes = [r["exit_status"] for r in reports]
    if EXIT_ACTION in codes:
        return EXIT_ACTION
    if EXIT_OK in codes:
        return EXIT_OK
    return EXIT_NOT_APPLICABLE


def json_document(reports: List[dict], status: int) -> dict:
    """The --json document: every report, and all their findings in one list, each
    with the path of the source it is about."""
    findings = [
        {**f, "source": report["source"]["path"]} for report in reports for f in report["findings"]
    ]
    return {"reports": reports, "findings": findings, "exit_status": status}


ENCODE = json.JSONEncoder(ensure_ascii=False).encode  # one encoder, not one per value


def json_text(value, level: int = 0) -> str:
    """value as json.dumps(value, indent=2, ensure_ascii=False) lays it out, except that a
    dict or list holding no dict or list (one certificate, one finding) is one line.

    With indent, json encodes in Python, token by token: 0.45 s of CPU for the 13 MB
    report of a crafted store of 9,300 certificates; its C encoder, used here for each
    record, takes a fifth of that (bench/secureboot-ca-check)."""
    if isinstance(value, dict) and any(isinstance(v, (dict, list)) for v in value.values()):
        pad = "  " * (level + 1)
        items = (
            f"{pad}{ENCODE(key)}: {json_text(item, level + 1)}" for key, item in value.items()
        )
        return "{\n" + ",\n".join(items) + "\n" + "  " * level + "}"
    if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        pad = "  " * (level + 1)
        items = (pad + json_text(item, level + 1) for item in value)
        return "[\n" + ",\n".join(items) + "\n" + "  " * level + "]"
    return ENCODE(value)


def print_json(document: dict) -> None:
    """debadmin.output.emit_json's document, laid out by json_text."""
    output.write_json_text(json_text(document))


def not_applicable(args: argparse.Namespace, textfile: Optional[Path], exc: Error) -> int:
    """No UEFI here: a verdict, not an error.  One info line on stderr (none with
    --quiet: exit status 3 says it), or with --json a document saying so."""
    if textfile:
        checks.write_metrics(textfile, [], exc.code)
    metrics.findings([finding("no-uefi", "info", str(exc))])
    if args.json:
        emit_json(
            {
                "applicable": False,
                "reason": str(exc),
                "reports": [],
                "findings": [finding("no-uefi", "info", str(exc))],
                "exit_status": exc.code,
            }
        )
    elif getattr(args, "verbosity", 0) != -1:  # --quiet: nothing, exit 3 says it
        print(f"{PROG}: {exc}", file=sys.stderr)
    return exc.code


def cmd_check(args: argparse.Namespace) -> int:
    now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    quiet = getattr(args, "verbosity", 0) == -1
    textfile = checks.textfile_directory(args.textfile_dir)
    try:
        reports = evaluate(args, now)
    except NotApplicable as exc:
        return not_applicable(args, textfile, exc)
    except Error as exc:
        if textfile:
            try:
                checks.write_metrics(textfile, [], exc.code)
            except Error as failure:
                # Both on one line: the check's own error is what the admin needs first.
                raise Error(f"{exc}; {failure}") from None
        raise
    status = combined_status(reports)
    metrics.findings(f for report in reports for f in report["findings"])
    for name, help_text, samples in checks.metric_families(reports):
        metrics.gauge(name, help_text, samples)
    if textfile:
        # Before the report: a failure to write the metric then prints one error line only.
        checks.write_metrics(textfile, reports, status)
    if args.json:
        print_json(json_document(reports, status))
    else:
        texts = [checks.render_text(r, quiet) for r in reports]
        print("\n".join(text for text in texts if text), end="")
    return status


def build_parser() -> argparse.ArgumentParser:
    parser = cli.new_parser(
        PROG,
        "Report whether this machine's Secure Boot keys need the 2023 Microsoft CA updates.",
        epilog="exit status: 0 nothing to do, 1 action needed, 2 error, 3 not applicable",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--efivars",
        metavar="DIR",
        help="read variables from DIR in efivarfs format " "(default: /sys/firmware/efi/efivars)",
    )
    parser.add_argument(
        "--varstore",
        metavar="FILE",
        action="append",
        help="read an OVMF/edk2 NVRAM file instead (repeatable, one report " "per file)",
    )
    parser.add_argument(
        "--shim",
        metavar="FILE",
        help="check this signed shim (default on the host: "
        "/boot/efi/EFI/debian/shimx64.efi and "
        "/usr/lib/shim/shimx64.efi.signed)",
    )
    parser.add_argument(
        "--root",
        metavar="DIR",
        help="look for efivars, shims and the dpkg status under DIR (default: /)",
    )
    parser.add_argument(
        "--textfile-dir",
        metavar="DIR",
        help="also write a node_exporter textfile metric into DIR " "(an empty value means none)",
    )
    # Fixing VM NVRAM files: secureboot_ca_check_fix and secureboot_ca_check_libvirt.
    parser.add_argument(
        "--fix",
        action="store_true",
        help="add the missing 2023 Microsoft CAs: to this machine's firmware through "
        "efivarfs with Microsoft's signed updates (verified first); to the --varstore files "
        "(or, with --libvirt, the NVRAM of every shut-off VM), keeping a backup beside each; "
        "with --efivars DIR and --dry-run, plan from a dump",
    )
    parser.add_argument(
        "--cert",
        metavar="FILE",
        action="append",
        help="with --fix: a 2023 Microsoft CA certificate (DER or PEM) to add; repeatable",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="with --fix: list what would be added (and verify every signed update)",
    )
    parser.add_argument(
        "--payloads",
        metavar="DIR",
        help="root of a checkout of microsoft/secureboot_objects to use instead of the "
        "copy this package ships (/usr/share/secureboot-ca-check/secureboot_objects)",
    )
    parser.add_argument(
        "--arch",
        choices=sorted(payloads.ARCHES),
        help="the firmware's architecture, for the db updates' folder (default: what its "
        "Boot#### entries' loader names say, else this host's)",
    )
    parser.add_argument(
        "--i-have-recovery-keys",
        action="store_true",
        help="with --fix on this machine: write even though LUKS or BitLocker keys are "
        "sealed to PCR 7 (they will ask for their recovery keys at the next boot)",
    )
    parser.add_argument(
        "--libvirt",
        action="store_true",
        help="check the NVRAM of every libvirt domain (virsh, else /etc/libvirt/qemu/*.xml)",
    )
    # dbx: secureboot_ca_check.dbx (the boot path checked before any write).
    parser.add_argument(
        "--dbx",
        action="store_true",
        help="with --fix: append Microsoft's latest dbx update for this architecture instead "
        "of the CA updates, after checking every EFI binary on the ESPs and the installed "
        "shim and GRUB images against it",
    )
    parser.add_argument(
        "--dbx-update",
        metavar="FILE",
        help="with --fix --dbx: this dbx update instead (a path under PostSignedObjects/, "
        "e.g. Optional/DBX/DBXUpdate2024.bin)",
    )
    parser.add_argument(
        "--esp",
        metavar="DIR",
        action="append",
        help="with --fix --dbx: also check the EFI binaries under DIR (a copy of a dump's "
        "ESP); repeatable",
    )
    # debadmin(7) metrics for runs on this machine's firmware, not a VM's NVRAM or an image.
    parser.set_defaults(
        func=dispatch,
        metrics=lambda a: not (a.varstore or a.libvirt or a.root),
        metrics_command=lambda a: "fix" if a.fix else "check",
    )
    return parser


def dispatch(args: argparse.Namespace) -> int:
    """The report, or one of the fixing modes (in their own modules)."""
    firmware = check_modes(args)
    if not (args.libvirt or args.fix):
        return cmd_check(args)
    from debadmin.secureboot_ca_check import libvirt

    if args.dbx:
        command = dbx.cmd_fix_dbx
    elif firmware:
        command = efivarfs.cmd_fix_firmware
    else:
        command = libvirt.cmd_libvirt if args.libvirt else fix.cmd_fix
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CryptographyDeprecationWarning)
            return command(args)
    except NotApplicable as exc:  # a blank NVRAM file: a verdict, said as cmd_check says it
        if args.json:
            emit_json({"applicable": False, "reason": str(exc), "exit_status": exc.code})
        elif getattr(args, "verbosity", 0) != -1:
            print(f"{PROG}: {checks.printable(str(exc))}", file=sys.stderr)
        return exc.code
    except Error:
        raise
    except Exception as exc:
        # One line, never a traceback.  A varstore's writes are atomic (the old file or the
        # new one); firmware writes are not undone: cmd_fix_firmware has already said on
        # stderr what was applied and where the keys are saved.
        log.debug("unexpected failure", exc_info=True)
        raise Error(checks.printable(f"cannot fix ({exc.__class__.__name__}: {exc})")) from None


def check_modes(args: argparse.Namespace) -> bool:
    """Refuse options that do not go together; whether --fix works on this machine's
    firmware (no --varstore or --libvirt)."""
    if args.libvirt and (args.varstore or args.efivars or args.shim or args.textfile_dir):
        raise Error(
            "--libvirt reads the domains' NVRAM: no --varstore, --efivars, --shim "
            "or --textfile-dir with it"
        )
    if (args.cert or args.dry_run or args.i_have_recovery_keys) and not args.fix:
        raise Error("--cert, --dry-run and --i-have-recovery-keys go with --fix")
    if (args.dbx_update or args.esp) and not args.dbx:
        raise Error("--dbx-update and --esp go with --fix --dbx")
    if args.dbx and not args.fix:
        raise Error("--dbx goes with --fix (the check always says whether dbx is behind)")
    if args.arch and (args.varstore or args.libvirt):
        raise Error("--arch goes with this machine's firmware or --efivars DIR")
    return bool(args.fix) and check_fix_modes(args)


def check_fix_modes(args: argparse.Namespace) -> bool:
    """check_modes() for --fix: one kind of source, and the options of that kind."""
    if args.shim or args.textfile_dir:
        raise Error("--fix changes variables: no --shim or --textfile-dir")
    if args.efivars and (args.varstore or args.libvirt):
        raise Error("--fix works on one kind of source: --efivars, --varstore or --libvirt")
    if args.dbx and args.libvirt:
        # Each VM's boot path is inside its own disk, which --libvirt does not open.
        raise Error(
            "--fix --dbx does not take --libvirt: each VM's ESP must be checked first; fix "
            "one shut-off VM with --varstore NVRAM_FILE --esp COPY_OF_ITS_ESP; nothing written"
        )
    firmware = not (args.varstore or args.libvirt)
    if args.cert and firmware:
        raise Error("--cert goes with --varstore or --libvirt: firmware takes signed updates")
    if args.i_have_recovery_keys and not firmware:
        raise Error("--i-have-recovery-keys goes with --fix on this machine's firmware")
    return firmware


def main(argv: Optional[List[str]] = None) -> int:
    return cli.run(PROG, build_parser(), argv)
