#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: 2026 debadmin developers <debadmin@packages.debian.org>
# GNU General Public License v2.0+ (see /usr/share/common-licenses/GPL-2)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: netboot_serialize
short_description: Debian installer netboot tree on a serial console
version_added: "1.0.0"
description:
  - Runs C(netboot-serialize) on the target (package C(netboot-serialize)) on a netboot
    tree (TFTP root) or netboot.tar.gz, in place or into C(output).
  - The module first runs C(netboot-serialize --dry-run --json); when the tree is already
    serialized as asked nothing runs and C(changed=false), else it runs the tool, and
    C(changed) is the tool's own C(written).
  - Exit status 2 (a source that is not an installer netboot tree, a refused tarball...)
    fails the task with the tool's message.
  - See netboot-serialize(8) on the target.
author:
  - debadmin developers (@debadmin)
requirements:
  - netboot-serialize on the target
attributes:
  check_mode:
    support: full
    description: Runs the tool with C(--dry-run); nothing is written.
  diff_mode:
    support: full
    description: The unified diff the tool prints with C(--dry-run).
options:
  src:
    description:
      - The netboot tree or tarball (C(SOURCE)).
    type: path
    required: true
  output:
    description:
      - Write this tree or tarball instead of editing C(src) (C(--output)).
    type: path
  console:
    description:
      - Serial console as C(DEVICE,BAUD), for instance C(ttyS1,115200n8) (C(--console)).
    type: str
  also_vga:
    description:
      - Keep a VGA console too (C(--also-vga)); false drops it (C(--no-also-vga)); unset
        keeps what an earlier run chose.
    type: bool
  extra_args:
    description:
      - Arguments appended to every kernel command line (C(--extra-args)).
    type: str
  timeout:
    description:
      - Boot the default entry after this many seconds (C(--timeout)).
    type: int
  default:
    description:
      - Entry booted on timeout (C(--default)).
    type: str
    choices: [install, expert, rescue, auto]
  sha256sums:
    description:
      - Check the tarball C(src) against the installer's SHA256SUMS first (C(--sha256sums)).
    type: path
"""

EXAMPLES = r"""
- name: Serialize the TFTP root on ttyS1
  debadmin.tools.netboot_serialize:
    src: /srv/tftp
    console: ttyS1,115200n8
    timeout: 5
  register: netboot

- name: A serialized copy of the downloaded tarball
  debadmin.tools.netboot_serialize:
    src: /srv/netboot.tar.gz
    output: /srv/netboot-serial.tar.gz
"""

RETURN = r"""
report:
  description: The JSON document of the run (mode, source, console, serialized, changes,
    written, and with check mode the diff).
  returned: always
  type: dict
findings:
  description: The tool's findings (not-serialized files, a missing grub.cfg...).
  returned: always
  type: list
  elements: dict
changes:
  description: The files that change, with what changes in each.
  returned: always
  type: list
  elements: dict
not_applicable:
  description: True when the tool exited 3.
  returned: always
  type: bool
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.debadmin.tools.plugins.module_utils.debadmin import Tool, valued

PROG = "netboot-serialize"


def main():
    module = AnsibleModule(
        argument_spec=dict(
            src=dict(type="path", required=True),
            output=dict(type="path"),
            console=dict(type="str"),
            also_vga=dict(type="bool"),
            extra_args=dict(type="str"),
            timeout=dict(type="int"),
            default=dict(type="str", choices=["install", "expert", "rescue", "auto"]),
            sha256sums=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    tool = Tool(module, PROG)
    args = ["--json"] + valued(p, ("output", "console", "timeout", "default", "sha256sums"))
    if p["extra_args"] is not None:
        # = keeps arguments that begin with a dash from being taken as options.
        args.append("--extra-args=" + p["extra_args"])
    if p["also_vga"] is not None:
        args.append("--also-vga" if p["also_vga"] else "--no-also-vga")
    args += ["--", p["src"]]
    result = dict(changed=False, not_applicable=False)

    plan = tool.checked(["--dry-run"] + args, **result)
    doc = plan.doc or {}
    # With --output the destination is written even when the source is serialized.
    result["changed"] = bool(doc.get("changes")) or bool(p["output"] and not doc.get("serialized"))
    if p["output"] and not result["changed"]:
        result["changed"] = not os.path.exists(p["output"])
    if result["changed"] and module._diff and doc.get("diff"):
        result["diff"] = {"prepared": doc["diff"]}
    if result["changed"] and not module.check_mode:
        done = tool.checked(args, **result)
        doc = done.doc or {}
        result["changed"] = bool(doc.get("written"))
        plan = done
    result.update(report=doc, findings=plan.findings, changes=doc.get("changes", []))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
