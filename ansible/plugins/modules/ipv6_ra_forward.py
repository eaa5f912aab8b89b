#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: 2026 debadmin developers <debadmin@packages.debian.org>
# GNU General Public License v2.0+ (see /usr/share/common-licenses/GPL-2)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: ipv6_ra_forward
short_description: IPv6 forwarding that keeps the uplinks' router advertisements
version_added: "1.0.0"
description:
  - Runs C(ipv6-ra-forward) on the target (package C(ipv6-ra-forward)). With C(state=present)
    it sets accept_ra=2 on the C(uplinks), then turns forwarding on (C(ipv6-ra-forward
    enable)); with C(state=absent) it undoes that (C(ipv6-ra-forward disable)); with
    C(state=checked) it only reports (C(ipv6-ra-forward status --json)).
  - The module first runs the command with C(--dry-run) and runs it for real only when
    that printed changes, so a second run reports C(changed=false).
  - Exit status 2 (an error, or a refused enable, for instance one that would take the
    RA route of an interface not named an uplink) fails the task with the tool's
    message. Exit status 1 of enable (another network manager owns an uplink, its
    configuration printed) ends the task ok with C(action_needed) and the tool's output
    in C(stdout_lines).
  - See ipv6-ra-forward(8) on the target.
author:
  - debadmin developers (@debadmin)
requirements:
  - ipv6-ra-forward on the target
attributes:
  check_mode:
    support: full
    description: Runs the tool with C(--dry-run); nothing is changed.
  diff_mode:
    support: full
    description: Shows the steps the tool lists (its C(would) lines).
options:
  state:
    description:
      - C(present) enables, C(absent) disables, C(checked) only reports.
    type: str
    choices: [present, absent, checked]
    default: present
  uplinks:
    description:
      - The uplink interfaces, whose router advertisements are kept. Required unless
        C(state=checked).
    type: list
    elements: str
    default: []
  forwarding:
    description:
      - Turn forwarding on; false only sets accept_ra=2 (C(--no-forwarding)).
    type: bool
    default: true
  persist:
    description:
      - Also write C(/etc/sysctl.d/60-ipv6-ra-forward.conf); false changes the running
        system only (C(--no-persist)).
    type: bool
    default: true
  networkd:
    description:
      - Give uplinks that systemd-networkd manages networkd's own configuration
        (C(--networkd)).
    type: bool
    default: false
  not_uplinks:
    description:
      - With C(state=present), interfaces that may lose their RA-learned routes and
        addresses when forwarding goes on (C(--not-uplink), repeated). Without them an
        enable that would cost another interface its RA route is refused and fails the
        task. The tool remembers them in C(NOT_UPLINKS) of
        C(/etc/default/ipv6-ra-forward), so a second run changes nothing.
    type: list
    elements: str
    default: []
"""

EXAMPLES = r"""
- name: Forward IPv6 and keep the RA default route of eth0
  debadmin.tools.ipv6_ra_forward:
    uplinks: [eth0]
  register: ra

- name: Interfaces and their RA routes
  ansible.builtin.debug:
    var: ra.report.interfaces

- name: Forward IPv6 through eth0; the VLAN eth0.20 may lose its RA route
  debadmin.tools.ipv6_ra_forward:
    uplinks: [eth0]
    not_uplinks: [eth0.20]

- name: Back to the state before
  debadmin.tools.ipv6_ra_forward:
    state: absent
    uplinks: [eth0]
"""

RETURN = r"""
findings:
  description: The findings of C(ipv6-ra-forward status --json) after the run.
  returned: always
  type: list
  elements: dict
report:
  description: The whole JSON document of C(ipv6-ra-forward status --json) after the run
    (forwarding, default_accept_ra, dropin, interfaces, findings, ok).
  returned: always
  type: dict
action_needed:
  description: Whether a finding of severity action is left, or enable printed
    configuration another network manager needs.
  returned: always
  type: bool
changes:
  description: What the tool did (its C(done:) lines) or would do in check mode (its
    C(would) lines).
  returned: always
  type: list
  elements: str
stdout_lines:
  description: The output of enable or disable.
  returned: when enable or disable ran
  type: list
  elements: str
not_applicable:
  description: True when the tool exited 3.
  returned: always
  type: bool
exit_status:
  description: Exit status of the last status run.
  returned: always
  type: int
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.debadmin.tools.plugins.module_utils.debadmin import (
    EXIT_ACTION,
    Tool,
    only_with,
    repeated,
)

PROG = "ipv6-ra-forward"


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", default="present", choices=["present", "absent", "checked"]),
            uplinks=dict(type="list", elements="str", default=[]),
            forwarding=dict(type="bool", default=True),
            persist=dict(type="bool", default=True),
            networkd=dict(type="bool", default=False),
            not_uplinks=dict(type="list", elements="str", default=[]),
        ),
        required_if=[("state", "present", ("uplinks",)), ("state", "absent", ("uplinks",))],
        supports_check_mode=True,
    )
    p = module.params
    only_with(module, "state", "present", ("not_uplinks",))
    tool = Tool(module, PROG)
    result = dict(changed=False, changes=[], not_applicable=False)
    enable_rc = 0

    if p["state"] != "checked":
        if p["state"] == "present":
            command = ["enable"] + (["--no-forwarding"] if not p["forwarding"] else [])
            command += ["--networkd"] if p["networkd"] else []
            command += repeated("--not-uplink", p["not_uplinks"])
        else:
            command = ["disable"]
        command += ["--no-persist"] if not p["persist"] else []
        last = tool.dry_run_first(command, result, tail=["--"] + p["uplinks"])
        result["stdout_lines"] = last.stdout.splitlines()
        enable_rc = last.rc

    tool.report(["status", "--json"], result)
    # enable exits 1 where another network manager needs the configuration it printed.
    result["action_needed"] = result["action_needed"] or enable_rc == EXIT_ACTION
    module.exit_json(**result)


if __name__ == "__main__":
    main()
