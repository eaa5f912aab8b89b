#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: 2026 debadmin developers <debadmin@packages.debian.org>
# GNU General Public License v2.0+ (see /usr/share/common-licenses/GPL-2)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: secureboot_ca_check
short_description: Whether Secure Boot needs the 2023 Microsoft CAs, and adding them
version_added: "1.0.0"
description:
  - Runs C(secureboot-ca-check --json) on the target (package C(secureboot-ca-check)) and
    returns its verdicts and findings. The firmware of the host is read by default; C(varstore)
    reads OVMF/edk2 NVRAM files, C(libvirt) the NVRAM of every libvirt domain.
  - With C(fix=true) it adds the missing 2023 CAs (C(--fix)). The module first runs
    C(--fix --dry-run --json) and fixes only when that plans an addition, so a second run
    reports C(changed=false). In check mode only the dry run happens.
  - Exit status 2 (an error, or a refused fix such as a damaged payload tree or sealed
    disk keys) fails the task with the tool's message. Exit status 3 (no UEFI, Secure Boot
    off) ends it ok with C(not_applicable) and C(reason).
  - A verdict that needs action does not fail the task; test C(action_needed) in a later
    task. See secureboot-ca-check(8) on the target for the findings and the fix.
author:
  - debadmin developers (@debadmin)
requirements:
  - secureboot-ca-check on the target
attributes:
  check_mode:
    support: full
    description: Runs C(--fix --dry-run); nothing is written.
  diff_mode:
    support: full
    description: Lists the certificates the fix adds, per file or variable.
options:
  fix:
    description:
      - Add the missing 2023 Microsoft CAs (C(--fix)).
    type: bool
    default: false
  varstore:
    description:
      - OVMF/edk2 NVRAM files to check (and fix) instead of the firmware (C(--varstore),
        repeated).
    type: list
    elements: path
    default: []
  libvirt:
    description:
      - Check (and with C(fix), fix) the NVRAM of every libvirt domain (C(--libvirt)).
    type: bool
    default: false
  efivars:
    description:
      - Read the variables from this efivarfs dump (C(--efivars)).
    type: path
  root:
    description:
      - Look for efivars, shims and the dpkg status under this directory (C(--root)).
    type: path
  shim:
    description:
      - Check this signed shim (C(--shim)).
    type: path
  payloads:
    description:
      - A checkout of microsoft/secureboot_objects to use instead of the packaged copy
        (C(--payloads)).
    type: path
  certs:
    description:
      - 2023 Microsoft CA certificates to add with C(fix) (C(--cert), repeated).
    type: list
    elements: path
    default: []
  i_have_recovery_keys:
    description:
      - With C(fix) on firmware, write even though disk keys are sealed to PCR 7
        (C(--i-have-recovery-keys)).
    type: bool
    default: false
  textfile_dir:
    description:
      - Also write a node_exporter textfile metric into this directory (C(--textfile-dir)).
    type: path
"""

EXAMPLES = r"""
- name: Verdict of this host's firmware
  debadmin.tools.secureboot_ca_check:
  register: secureboot

- name: Hosts that need the update
  ansible.builtin.debug:
    msg: "{{ secureboot.verdicts }}"
  when: secureboot.action_needed

- name: Add the 2023 CAs to a VM's NVRAM file (shut off)
  debadmin.tools.secureboot_ca_check:
    varstore: [/var/lib/libvirt/qemu/nvram/vm1_VARS.fd]
    fix: true

- name: Every shut-off libvirt VM of a hypervisor
  debadmin.tools.secureboot_ca_check:
    libvirt: true
    fix: true
"""

RETURN = r"""
findings:
  description: The findings of the check after the run (code, severity, subject, message,
    source).
  returned: always
  type: list
  elements: dict
report:
  description: The whole JSON document of the check after the run.
  returned: when the tool applies
  type: dict
verdicts:
  description: The verdict of each report (firmware, varstore or libvirt domain), in order.
  returned: always
  type: list
  elements: str
action_needed:
  description: Whether a finding of severity action is left after the run.
  returned: always
  type: bool
fixes:
  description: The JSON document of C(--fix) (or C(--fix --dry-run) in check mode).
  returned: with fix
  type: dict
not_applicable:
  description: True when the tool exited 3 (no UEFI, Secure Boot off or in setup mode).
  returned: always
  type: bool
reason:
  description: Why the tool does not apply here.
  returned: when not_applicable
  type: str
exit_status:
  description: Exit status of the last check (0 nothing to do, 1 action needed).
  returned: always
  type: int
"""

import json

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.debadmin.tools.plugins.module_utils.debadmin import (
    Tool,
    needs_action,
    prepared_diff,
    repeated,
    report_of,
    tree_has,
    valued,
)

PROG = "secureboot-ca-check"


def planned(doc):
    """Whether a --fix --dry-run document plans to add anything (varstore, libvirt or
    firmware shape: an ``added`` or ``steps`` list that is not empty)."""
    return tree_has(doc, "added", lambda v: bool(v)) or tree_has(
        doc,
        "steps",
        lambda v: isinstance(v, list)
        and any(isinstance(s, dict) and s.get("status") not in ("present", "skipped") for s in v),
    )


def plan_lines(doc):
    lines = []
    for item in doc.get("fixes", []) if isinstance(doc, dict) else []:
        for added in item.get("added", []):
            lines.append(
                "%s: add %s to %s" % (item.get("path"), added.get("name"), added.get("variable"))
            )
    if not lines and doc:
        lines = json.dumps(doc, indent=1, sort_keys=True).splitlines()
    return lines


def verdicts(doc):
    found = []
    if not isinstance(doc, dict):
        return found
    for key in ("reports", "domains"):
        for item in doc.get(key, []) or []:
            if isinstance(item, dict) and "verdict" in item:
                found.append(item["verdict"])
    if "verdict" in doc:
        found.append(doc["verdict"])
    return found


def main():
    module = AnsibleModule(
        argument_spec=dict(
            fix=dict(type="bool", default=False),
            varstore=dict(type="list", elements="path", default=[]),
            libvirt=dict(type="bool", default=False),
            efivars=dict(type="path"),
            root=dict(type="path"),
            shim=dict(type="path"),
            payloads=dict(type="path"),
            certs=dict(type="list", elements="path", default=[]),
            i_have_recovery_keys=dict(type="bool", default=False),
            textfile_dir=dict(type="path"),
        ),
        mutually_exclusive=[("varstore", "libvirt")],
        supports_check_mode=True,
    )
    p = module.params
    tool = Tool(module, PROG)
    source = repeated("--varstore", p["varstore"]) + (["--libvirt"] if p["libvirt"] else [])
    source += valued(p, ("efivars", "root", "shim", "payloads"))
    fix_args = repeated("--cert", p["certs"])
    fix_args += ["--i-have-recovery-keys"] if p["i_have_recovery_keys"] else []
    result = dict(changed=False, not_applicable=False)

    before = tool.checked(["--json"] + source, **result)
    if p["fix"] and needs_action(before.findings):
        plan = tool.checked(["--json", "--fix", "--dry-run"] + source + fix_args, **result)
        result["fixes"] = plan.doc
        if planned(plan.doc):
            result["changed"] = True
            if module._diff:
                result["diff"] = prepared_diff(plan_lines(plan.doc), "secureboot-ca-check --fix:")
            if not module.check_mode:
                done = tool.checked(["--json", "--fix"] + source + fix_args, **result)
                result["fixes"] = done.doc
                result["changed"] = tree_has(done.doc, "written", lambda v: v is True)

    after = before
    if result["changed"] and not module.check_mode:
        after = tool.checked(["--json"] + source, **result)
    if p["textfile_dir"]:
        # The metric of the state after the run, written by the tool itself.
        after = tool.checked(["--json", "--textfile-dir", p["textfile_dir"]] + source, **result)
    report_of(after, result)
    result["verdicts"] = verdicts(after.doc)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
