"""secureboot-ca-check's rules: findings from a gathered report, next steps from findings.

Each rule reads the report build_report() gathered (variables, Microsoft CAs, shims,
fwupd) and returns findings in the shared shape (debadmin.findings); next_steps() then
reads the findings (and the kind of source), never the report: whatever the advice
depends on, such as fwupd's version, is a finding first.
"""

from typing import Callable, Dict, Iterable, List, Optional, Tuple

from debadmin.errors import EXIT_ACTION, EXIT_NOT_APPLICABLE, EXIT_OK
from debadmin.findings import finding, needs_action

Finding = Dict
Known = Dict[str, Tuple[str, str, str]]

PCR7_WARNING = (
    "Changing KEK or db changes the TPM's PCR 7: before the update, suspend BitLocker on any "
    "Windows installation (manage-bde -protectors -disable C:), and after it reseal "
    "TPM-sealed LUKS keys (systemd-cryptenroll --wipe-slot=tpm2 --tpm2-device=auto "
    "--tpm2-pcrs=7 DEVICE) or keep a recovery passphrase at hand."
)
ALL_VARIABLES = ("PK", "KEK", "db", "dbx", "KEKDefault", "dbDefault")


class Facts:
    """The gathered report, with the questions every rule asks of it."""

    def __init__(self, report: dict, known: Known):
        self.report = report
        self.known = known
        self.dbs = report["variables"]
        self.cas = report["microsoft_cas"]
        keyed = [c for var in ("KEK", "db") for c in self.certificates(var)]
        # KEK or db hold Microsoft's CAs (or copies): the 2023 rollover concerns this source.
        self.managed = any(c["microsoft_ca"] or c["lookalike"] for c in keyed)

    def has(self, ca_id: str, var: str) -> bool:
        return bool(self.cas[ca_id][f"in_{var.lower()}"])

    def certificates(self, var: str) -> List[dict]:
        return (self.dbs[var] or {}).get("certificates", [])

    def name(self, ca_id: str) -> str:
        return next(name for (i, name, _home) in self.known.values() if i == ca_id)

    @property
    def lacks_2023(self) -> bool:
        """KEK or db needs a 2023 update (what missing_2023() reports as action)."""
        return self.managed and not (
            self.has("kek_2k_ca_2023", "KEK") and self.has("uefi_ca_2023", "db")
        )


# --- rules: facts -> findings ------------------------------------------------------------------


def read_problems(facts: Facts) -> Iterable[Finding]:
    """What could not be read, or is odd, in each variable (the verdict comes from the rest)."""
    for var, problems in facts.report["_facts"]["problems"].items():
        for problem in problems:
            yield finding(
                problem["code"], problem["severity"], f"{var}: {problem['message']}", var
            )


def pk_unusable(facts: Facts) -> Iterable[Finding]:
    if facts.report["_facts"]["pk_unusable"]:
        yield finding(
            "pk-unusable",
            "warning",
            "PK holds no certificate the firmware can use: no KEK update signed with the "
            "platform key (as fwupd's are) can be applied",
            "PK",
        )


def secure_boot_disabled(facts: Facts) -> Iterable[Finding]:
    value = facts.report["_facts"]["secure_boot_enable"]
    if value is not None and value != 1 and not facts.report["setup_mode"]:
        yield finding(
            "secure-boot-disabled",
            "info",
            f"SecureBootEnable is {value}: Secure Boot is switched off in the firmware setup, "
            "the firmware does not enforce it",
            "SecureBootEnable",
        )


def lookalikes(facts: Facts) -> Iterable[Finding]:
    for var in ALL_VARIABLES:
        for cert in facts.certificates(var):
            if cert["lookalike"]:
                yield finding(
                    "lookalike",
                    "info" if var == "dbx" else "action",
                    f"{var}: '{cert['subject_cn']}' claims to be Microsoft's but its SHA-256 "
                    f"fingerprint {cert['sha256'][:16]}... is not a known Microsoft CA",
                    var,
                    name=cert["subject_cn"],
                )


def test_keys(facts: Facts) -> Iterable[Finding]:
    where: Dict[str, List[str]] = {}
    for var in ("PK", "KEK", "db"):
        for cert in facts.certificates(var):
            if cert["test_key"]:
                where.setdefault(cert["subject_cn"], []).append(var)
    for name, variables in where.items():
        yield finding(
            "test-key",
            "warning",
            f"{', '.join(variables)}: '{name}' is a publicly known test key: whoever has its "
            "private key can change the Secure Boot keys",
            variables[0],
            variables=variables,
        )


def setup_mode(facts: Facts) -> Iterable[Finding]:
    if facts.report["setup_mode"]:
        yield finding(
            "setup-mode", "warning", "the firmware is in Setup Mode: anyone can enrol keys"
        )


def missing_2023(facts: Facts) -> Iterable[Finding]:
    if facts.managed and not facts.has("kek_2k_ca_2023", "KEK"):
        yield finding(
            "kek-2023-missing",
            "action",
            "KEK lacks Microsoft Corporation KEK 2K CA 2023: no db or dbx update signed "
            "after KEK CA 2011 expires (2026-06-24) can be applied",
            "KEK",
        )
    if facts.managed and not facts.has("uefi_ca_2023", "db"):
        yield finding(
            "db-uefi-ca-2023-missing",
            "action",
            "db lacks Microsoft UEFI CA 2023: shims and option ROMs signed only by it "
            "will not boot",
            "db",
        )


def update_means(facts: Facts) -> Iterable[Finding]:
    """What the update steps depend on, when an update is due: fwupd, and whether KEK
    holds the KEK CA 2011 that signs the db update."""
    if not facts.lacks_2023:
        return
    offline = facts.report.get("offline_fix") or {}
    if offline.get("available"):
        yield finding(
            "offline-fix-available",
            "info",
            "secureboot-ca-check --fix can add "
            + ", ".join(ca for step in offline["steps"] for ca in step["adds"])
            + " without the network, from Microsoft's published objects shipped with it",
            None,
            adds=[ca for step in offline["steps"] for ca in step["adds"]],
        )
    if offline.get("kek_update_published") is not None and not facts.has("kek_2k_ca_2023", "KEK"):
        published = offline["kek_update_published"]
        yield finding(
            "kek-update-published" if published else "kek-update-unpublished",
            "info",
            f"Microsoft publishes a KEK update signed by this PK ({offline['kek_update']})"
            if published
            else "Microsoft publishes no KEK update signed by this PK: neither fwupd nor "
            "--fix can add the KEK 2K CA 2023",
            "PK",
        )
    fwupd = facts.report["fwupd"]
    if fwupd is None:
        pass
    elif not fwupd["installed"]:
        yield finding(
            "fwupd-missing",
            "info",
            f"fwupd is not installed (the 2023 updates need {fwupd['minimum']} or later)",
            "fwupd",
            minimum=fwupd["minimum"],
        )
    elif not fwupd["recent_enough"]:
        yield finding(
            "fwupd-too-old",
            "info",
            f"fwupd {fwupd['version']} is older than {fwupd['minimum']}, the first with "
            "the 2023 updates",
            "fwupd",
            version=fwupd["version"],
            minimum=fwupd["minimum"],
        )
    if not facts.has("uefi_ca_2023", "db") and facts.has("kek_ca_2011", "KEK"):
        yield finding(
            "db-update-signable",
            "info",
            "KEK holds Microsoft Corporation KEK CA 2011, which signs the db update "
            "(Microsoft UEFI CA 2023)",
            "KEK",
        )
    elif not facts.has("uefi_ca_2023", "db"):
        yield finding(
            "db-update-unsignable",
            "info",
            "KEK lacks Microsoft Corporation KEK CA 2011, which signs Microsoft's published "
            "db updates: neither fwupd nor --fix can apply them with this KEK",
            "KEK",
        )


def revoked_2023(facts: Facts) -> Iterable[Finding]:
    if facts.has("uefi_ca_2023", "dbx") or facts.has("kek_2k_ca_2023", "dbx"):
        yield finding("ca-2023-revoked", "action", "dbx revokes a 2023 Microsoft CA", "dbx")


def optional_2023(facts: Facts) -> Iterable[Finding]:
    if not facts.managed:
        return
    if facts.has("windows_production_pca_2011", "db") and not facts.has(
        "windows_uefi_ca_2023", "db"
    ):
        yield finding(
            "db-windows-uefi-ca-2023-missing",
            "info",
            "db lacks Windows UEFI CA 2023 (matters only for Windows boot managers)",
            "db",
        )
    if facts.has("uefi_ca_2011", "db") and not facts.has("option_rom_uefi_ca_2023", "db"):
        yield finding(
            "db-option-rom-ca-2023-missing",
            "info",
            "db lacks Microsoft Option ROM UEFI CA 2023 (add-in cards whose firmware is "
            "signed only by it will not initialise)",
            "db",
        )


def expired(facts: Facts) -> Iterable[Finding]:
    for var in ("KEK", "db"):
        for cert in facts.certificates(var):
            if cert["microsoft_ca"] and cert["expired"]:
                yield finding(
                    "expired",
                    "info",
                    f"{var}: {cert['subject_cn']} expired on {cert['not_after'][:10]} "
                    "(firmware does not check expiry: this alone breaks nothing)",
                    var,
                )


def defaults(facts: Facts) -> Iterable[Finding]:
    if not facts.managed:
        return
    lacking = [
        (var, ca_id)
        for var, ca_id in (("KEKDefault", "kek_2k_ca_2023"), ("dbDefault", "uefi_ca_2023"))
        if facts.dbs[var] is not None and not facts.has(ca_id, var)
    ]
    if lacking:
        yield finding(
            "defaults-lack-2023",
            "warning",
            "; ".join(f"{var} lacks {facts.name(ca_id)}" for var, ca_id in lacking)
            + ": 'restore factory keys' in the firmware setup would drop the 2023 "
            "certificates again",
            lacking[0][0],
            variables=[var for var, _ca in lacking],
        )


def shims(facts: Facts) -> Iterable[Finding]:
    if not facts.report["secure_boot_active"]:
        return
    uefi_ca_2011 = {fp for fp, (ca_id, _n, _h) in facts.known.items() if ca_id == "uefi_ca_2011"}
    for shim in facts.report["shims"]:
        if not shim["accepted"]:
            yield finding(
                "shim-not-accepted",
                "action" if facts.managed else "warning",
                f"{shim['path']} would not boot with this firmware: {refusal(shim)}",
                shim["path"],
                revoked_by=revoked_by(shim),
            )
        elif (
            facts.managed
            and not shim["hash_in_db"]
            and {
                fp
                for sig in shim["signatures"]
                if sig["accepted"]
                for fp in sig["chains_to_db_sha256"]
            }
            <= uefi_ca_2011
        ):
            yield finding(
                "shim-2011-only",
                "info",
                f"{shim['path']} boots only through Microsoft Corporation UEFI CA 2011",
                shim["path"],
            )


def revoked_by(shim: dict) -> Optional[str]:
    """What dbx revokes that refuses the shim (its hash, or certificates), or None."""
    if shim["hash_in_dbx"]:
        return "its Authenticode hash"
    names = [n for s in shim["signatures"] if s["digest_matches"] for n in s["revoked_by_dbx"]]
    return ", ".join(dict.fromkeys(names)) or None


def refusal(shim: dict) -> str:
    """Why the firmware refuses a shim, in the order edk2 checks."""
    sigs = shim["signatures"]
    revoked = [s for s in sigs if s["revoked_by_dbx"] and s["digest_matches"]]
    if shim["hash_in_dbx"]:
        return "dbx revokes its Authenticode hash"
    if revoked:
        names = ", ".join(n for s in revoked for n in s["revoked_by_dbx"])
        return (
            f"dbx revokes {names}, which signature {revoked[0]['index']} carries or chains "
            "to, and the firmware refuses an image when any of its signatures is revoked"
        )
    if not sigs:
        return "it is not signed and db does not hold its hash"
    if not any(s["digest_matches"] for s in sigs):
        return "no signature covers this image (changed after signing?)"
    return "no signature chains to a certificate in db"


RULES: Tuple[Callable[[Facts], Iterable[Finding]], ...] = (
    read_problems,
    pk_unusable,
    secure_boot_disabled,
    lookalikes,
    test_keys,
    setup_mode,
    missing_2023,
    update_means,
    revoked_2023,
    optional_2023,
    expired,
    defaults,
    shims,
)


# --- next steps: findings -> advice ------------------------------------------------------------


def next_steps(findings: List[Finding], source_kind: str) -> List[str]:
    """The advice, from the findings alone (source_kind: efivars or varstore)."""
    codes = {f["code"] for f in findings}
    # What must not wait for the next reboot comes first.
    steps = shim_steps(findings)
    steps += [
        f"Find out who enrolled the look-alike '{f['name']}' in {f['subject']} and remove it "
        "(a firmware update or 'restore factory keys' from the machine maker)."
        for f in findings
        if f["code"] == "lookalike" and f["severity"] == "action"
    ]
    if codes & {"kek-2023-missing", "db-uefi-ca-2023-missing"}:
        steps += update_steps(findings, source_kind)
    if "defaults-lack-2023" in codes:
        steps.append(
            "Do not use 'restore factory keys' in the firmware setup until a "
            "firmware update from the maker brings 2023 defaults."
        )
    if "test-key" in codes:
        steps.append(
            "Ask the machine maker for a firmware update with a real platform key, "
            "or enrol your own PK, KEK and db."
        )
    return steps


def shim_steps(findings: List[Finding]) -> List[str]:
    """For each refused shim: the revocation when dbx refuses it, else the missing CA."""
    steps = []
    refused = [f for f in findings if f["code"] == "shim-not-accepted"]
    for f in refused:
        if f["severity"] != "action":
            continue
        if f["revoked_by"]:
            steps.append(
                f"Do not reboot into {f['subject']}: dbx revokes {f['revoked_by']}, and no "
                "CA in db changes that. Install a shim that dbx does not revoke (apt install "
                "shim-signed from the current point release, then check again) before the "
                "next reboot."
            )
        elif not any(s.startswith("Do not reboot into the new shim") for s in steps):
            steps.append(
                "Do not reboot into the new shim before db holds a CA it chains to "
                "(Microsoft UEFI CA 2023 or 2011)."
            )
    return steps


VM_STEP = (
    "For this virtual machine: shut it down, then run "
    "'secureboot-ca-check --varstore FILE --fix' (or --libvirt --fix for "
    "every shut-off libvirt VM); it adds the missing 2023 CAs and keeps a backup "
    "of the NVRAM file beside it. Boot the VM and check again."
)
KEY_DEVICE, DB_DEVICE = "'UEFI Key Exchange Key'", "'UEFI Signature Database'"


def update_steps(findings: List[Finding], source_kind: str) -> List[str]:
    """How to get the missing 2023 certificates into KEK and db: one route per
    variable, so that no step undoes another (a KEK that no signed update can reach is
    not sent to fwupd for one)."""
    if source_kind == "varstore":
        # Inside a VM fwupd cannot update KEK (no Microsoft-signed KEK payload exists
        # for OVMF's PK), and only sid's ovmf templates hold the 2023 CAs: the NVRAM
        # file is fixed offline instead.
        return [VM_STEP, PCR7_WARNING]
    codes = {f["code"] for f in findings}
    steps = []
    if "offline-fix-available" in codes:
        steps.append(
            "Offline, verified before anything is written: 'secureboot-ca-check --fix "
            "--dry-run' shows the plan, 'secureboot-ca-check --fix' applies it "
            "(Microsoft's signed updates; see secureboot-ca-check(8))."
        )
    devices = fwupd_devices(codes)
    if devices:
        steps += fwupd_steps(findings, devices, alternative="offline-fix-available" in codes)
    steps += kek_route(codes)
    if "db-uefi-ca-2023-missing" in codes and "db-update-signable" in codes:
        steps.append(
            "The db update (Microsoft UEFI CA 2023) is signed with KEK CA 2011, "
            "which this machine has: it can be applied now."
        )
    if "db-uefi-ca-2023-missing" in codes and "db-update-unsignable" in codes:
        steps.append(db_route(codes))
    steps.append(PCR7_WARNING)
    return steps


def db_route(codes: set) -> str:
    """What brings the Microsoft UEFI CA 2023 into db when KEK lacks the KEK CA 2011 that
    signs Microsoft's db updates."""
    ways = []
    if "kek-update-published" in codes:
        ways.append(
            "apply the KEK update published for this PK first (fwupd or --fix): Microsoft "
            "signs its later db updates with the KEK 2K CA 2023 it adds"
        )
    if kek_blocked(codes):  # the step above already sends the admin to the maker
        ways.append("the maker's firmware update named above, if it brings the 2023 CAs")
    else:
        ways.append("install the maker's firmware (BIOS) update that brings the 2023 CAs")
    if "defaults-lack-2023" not in codes:
        ways.append("restore factory keys if dbDefault holds the Microsoft UEFI CA 2023")
    ways.append(
        "with keys of your own, sign a db append of the certificate with a key of this KEK "
        "(efitools: cert-to-efi-sig-list, sign-efi-sig-list -a; efi-updatevar -a)"
    )
    return (
        "Microsoft's db updates are signed with the KEK CA 2011, which this KEK lacks, so "
        "neither fwupd nor --fix can add the Microsoft UEFI CA 2023: " + "; or ".join(ways) + "."
    )


def kek_blocked(codes: set) -> bool:
    """No signed KEK update can reach this KEK: the PK cannot verify one, or Microsoft
    publishes none for it."""
    return "kek-2023-missing" in codes and bool(codes & {"pk-unusable", "kek-update-unpublished"})


def fwupd_devices(codes: set) -> List[str]:
    """The fwupd devices that can still bring something: none for a KEK no signed update
    reaches, the db only when a KEK certificate here signs its update."""
    if not kek_blocked(codes):
        return [KEY_DEVICE, DB_DEVICE]
    if "db-uefi-ca-2023-missing" in codes and "db-update-signable" in codes:
        return [DB_DEVICE]
    return []


def fwupd_steps(findings: List[Finding], devices: List[str], alternative: bool) -> List[str]:
    """fwupd's install or upgrade when due, then its run for the devices that can update."""
    steps = []
    fwupd = {f["code"]: f for f in findings if f["subject"] == "fwupd"}
    if "fwupd-missing" in fwupd:
        steps.append(
            f"Install fwupd {fwupd['fwupd-missing']['minimum']} or later: apt install fwupd"
        )
    elif "fwupd-too-old" in fwupd:
        old = fwupd["fwupd-too-old"]
        steps.append(
            f"Upgrade fwupd ({old['version']}) to {old['minimum']} or later: apt install fwupd"
        )
    which = " and ".join(devices)
    steps.append(
        ("Or, online: " if alternative else "Run: ")
        + "fwupdmgr refresh && fwupdmgr get-updates && fwupdmgr update "
        + f"(device{'s' if len(devices) > 1 else ''} {which})."
    )
    return steps


def kek_route(codes: set) -> List[str]:
    """What brings the KEK 2K CA 2023 when no update from fwupd or --fix can."""
    if "kek-2023-missing" not in codes:
        return []
    if "pk-unusable" in codes:
        return [
            "The KEK update must be signed by the platform key, and this machine's PK is "
            "not a certificate the firmware can use: no signed KEK update can apply "
            "(neither fwupd's nor --fix's). Install the maker's firmware (BIOS) update, or "
            "clear the keys in the firmware setup and enrol a PK of your own, then KEK and "
            "db (efitools)."
        ]
    if "kek-update-unpublished" in codes:
        # Not when the defaults lack a 2023 certificate: another step warns against it.
        restore = (
            ""
            if "defaults-lack-2023" in codes
            else ", or restore factory keys if KEKDefault holds the KEK 2K CA 2023"
        )
        return [
            "Microsoft publishes no KEK update signed by this machine's platform key, so "
            "neither fwupd nor --fix can add the KEK 2K CA 2023: install the maker's "
            f"firmware (BIOS) update{restore}; enrolling by hand is the last resort."
        ]
    if "kek-update-published" in codes:
        return []  # fwupd or --fix above applies it
    return [
        "The KEK update must be signed by the machine maker's platform key: "
        "if LVFS offers none for this machine, install the maker's firmware "
        "(BIOS) update; enrolling by hand (efitools) is the last resort."
    ]


# --- verdict -----------------------------------------------------------------------------------


def assess(report: dict, known: Known) -> None:
    """Add microsoft_managed, findings, next steps and the verdict to a gathered report."""
    facts = Facts(report, known)
    findings = [f for rule in RULES for f in rule(facts)]
    report["microsoft_managed"] = facts.managed
    report["findings"] = findings
    report["next_steps"] = next_steps(findings, report["source"]["kind"])
    if not report["secure_boot_active"]:
        report["verdict"], report["exit_status"] = "not-applicable", EXIT_NOT_APPLICABLE
    elif needs_action(findings):
        report["verdict"], report["exit_status"] = "action-needed", EXIT_ACTION
    else:
        report["verdict"], report["exit_status"] = "ok", EXIT_OK
