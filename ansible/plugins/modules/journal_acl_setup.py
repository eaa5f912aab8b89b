#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: 2026 debadmin developers <debadmin@packages.debian.org>
# GNU General Public License v2.0+ (see /usr/share/common-licenses/GPL-2)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: journal_acl_setup
short_description: Persistent systemd journal readable by the admin groups
version_added: "1.0.0"
description:
  - Runs C(journal-acl-setup) on the target (package C(journal-acl-setup)) and maps its
    result to Ansible's. With C(state=present) it makes the journal persistent and
    readable by C(groups) (C(journal-acl-setup apply)); with C(state=absent) it removes
    what apply granted (C(journal-acl-setup revert)); with C(state=checked) it only
    reports (C(journal-acl-setup check --json)).
  - The tool decides what to change. The module first runs the command with
    C(--dry-run), and runs it for real only when that printed changes, so a second run
    reports C(changed=false).
  - Exit status 2 of the tool (an error, or a refused command) fails the task with the
    tool's message; exit status 3 (no systemd-journald, no systemd-journal group) ends
    it ok with C(not_applicable) and C(reason).
  - See journal-acl-setup(8) on the target for what each finding means.
author:
  - debadmin developers (@debadmin)
requirements:
  - journal-acl-setup on the target
attributes:
  check_mode:
    support: full
    description: Runs the tool with C(--dry-run); nothing is written.
  diff_mode:
    support: full
    description: Shows the changes the tool lists (its C(would ...) lines).
options:
  state:
    description:
      - C(present) applies, C(absent) reverts, C(checked) only reports.
    type: str
    choices: [present, absent, checked]
    default: present
  groups:
    description:
      - Groups that must read the journal (C(--group), repeated). Empty means the
        tool's default, C(JOURNAL_ACL_GROUPS) of C(/etc/default/journal-acl-setup),
        else C(adm).
    type: list
    elements: str
    default: []
  root:
    description:
      - Act on the system image mounted at this directory (C(--root)).
    type: path
  revert_all:
    description:
      - With C(state=absent), revert every group granted but C(adm) and leave the
        configuration as it is (C(revert --all)).
    type: bool
    default: false
  strip:
    description:
      - With C(state=absent), where the record of apply
        (C(/var/lib/journal-acl-setup/acl-state.sqlite)) is missing or empty, remove the
        groups' ACL entries under the journal and narrow the masks, restoring nothing
        (C(revert --strip)). Without it such a revert fails with the tool's message.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Journal persistent and readable by adm and sudo
  debadmin.tools.journal_acl_setup:
    groups: [adm, sudo]
  register: journal

- name: Show what is left (findings of severity warning, for instance)
  ansible.builtin.debug:
    var: journal.findings

- name: Only report
  debadmin.tools.journal_acl_setup:
    state: checked
  register: journal_report

- name: Take back the grant of the sudo group
  debadmin.tools.journal_acl_setup:
    state: absent
    groups: [sudo]

- name: Take it back where apply's record was lost (a restored backup, for instance)
  debadmin.tools.journal_acl_setup:
    state: absent
    groups: [sudo]
    strip: true
"""

RETURN = r"""
findings:
  description: The findings of C(journal-acl-setup check --json) after the run (each
    with code, severity, subject, message).
  returned: always
  type: list
  elements: dict
  sample: [{"code": "no-default-acl", "severity": "action", "subject": "/var/log/journal",
            "message": "/var/log/journal has no default ACL for group adm", "group": "adm"}]
report:
  description: The whole JSON document of C(journal-acl-setup check --json) after the run.
  returned: when the tool applies
  type: dict
action_needed:
  description: Whether a finding of severity action is left after the run.
  returned: always
  type: bool
changes:
  description: What the tool changed (its C(done:) lines) or, in check mode, would change
    (its C(would) lines), in its own words.
  returned: always
  type: list
  elements: str
not_applicable:
  description: True when the tool exited 3 (not applicable on this host).
  returned: always
  type: bool
reason:
  description: Why the tool does not apply here.
  returned: when not_applicable
  type: str
exit_status:
  description: Exit status of the last run of the tool.
  returned: always
  type: int
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.debadmin.tools.plugins.module_utils.debadmin import (
    Tool,
    only_with,
    repeated,
    valued,
)

PROG = "journal-acl-setup"


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", default="present", choices=["present", "absent", "checked"]),
            groups=dict(type="list", elements="str", default=[]),
            root=dict(type="path"),
            revert_all=dict(type="bool", default=False),
            strip=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    p = module.params
    only_with(module, "state", "absent", ("revert_all", "strip"))
    tool = Tool(module, PROG)
    common = repeated("--group", p["groups"]) + valued(p, ("root",))
    result = dict(changed=False, changes=[], not_applicable=False)
    if p["state"] == "present":
        tool.dry_run_first(["apply"] + common, result)
    elif p["state"] == "absent":
        revert = ["revert"] + (["--all"] if p["revert_all"] else [])
        revert += ["--strip"] if p["strip"] else []
        tool.dry_run_first(revert + common, result)
    tool.report(["check", "--json"] + common, result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
