#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: 2026 debadmin developers <debadmin@packages.debian.org>
# GNU General Public License v2.0+ (see /usr/share/common-licenses/GPL-2)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: sbuild_fast
short_description: sbuild chroots with debhelper and eatmydata preinstalled
version_added: "1.0.0"
description:
  - Runs C(sbuild-fast) on the target (package C(sbuild-fast)) as the user the task runs
    as. With C(state=present) it creates the chroot of C(dist) when C(sbuild-fast list
    --json) does not have it; C(state=latest) also refreshes it (C(sbuild-fast update));
    C(state=absent) removes it. C(changed) follows what C(sbuild-fast list --json) shows
    before and after, so a second run reports C(changed=false).
  - With C(doctor=true) the findings of C(sbuild-fast doctor --json) are returned. Doctor
    removes the leftovers of killed builds; in check mode it runs with C(--dry-run), which
    only reports them (a target whose sbuild-fast lacks C(doctor --dry-run) skips doctor
    in check mode, with a warning).
  - Exit status 2 of the tool fails the task with its message.
  - See sbuild-fast(1) on the target.
author:
  - debadmin developers (@debadmin)
requirements:
  - sbuild-fast on the target
attributes:
  check_mode:
    support: full
    description: Runs the tool with C(--dry-run); nothing is built.
  diff_mode:
    support: full
    description: What the tool would do, in its words.
options:
  dist:
    description:
      - The distribution of the chroot (C(--dist)); required unless only C(doctor) is
        asked for.
    type: str
  arch:
    description:
      - The architecture (C(--arch)); default the host's.
    type: str
  mode:
    description:
      - Unshare tarball (the default) or schroot chroot (C(--mode)).
    type: str
    choices: [unshare, schroot]
    default: unshare
  state:
    description:
      - C(present) creates a missing chroot, C(latest) also refreshes an existing one,
        C(absent) removes it.
    type: str
    choices: [present, latest, absent]
    default: present
  include:
    description:
      - More packages to preinstall when the chroot is created (C(--include)).
    type: list
    elements: str
    default: []
  mirror:
    description:
      - The Debian archive (C(--mirror)).
    type: str
  configure:
    description:
      - Write the sbuild settings block on create (C(--configure)).
    type: bool
    default: false
  doctor:
    description:
      - Also run C(sbuild-fast doctor --json) (in check mode C(doctor --json --dry-run))
        and return its findings.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: A fast bookworm chroot for the builder user
  become: true
  become_user: builder
  debadmin.tools.sbuild_fast:
    dist: bookworm
    configure: true

- name: What slows builds down here
  debadmin.tools.sbuild_fast:
    doctor: true
  register: doctor
"""

RETURN = r"""
chroots:
  description: The chroots of C(sbuild-fast list --json) after the run.
  returned: always
  type: list
  elements: dict
findings:
  description: The findings of C(sbuild-fast doctor --json).
  returned: always
  type: list
  elements: dict
doctor:
  description: The whole document of C(sbuild-fast doctor --json).
  returned: with doctor (in check mode, where the tool has C(doctor --dry-run))
  type: dict
changes:
  description: What the tool printed it would do (check mode) or did.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.debadmin.tools.plugins.module_utils.debadmin import Tool

PROG = "sbuild-fast"


def chroots(tool, result):
    doc = tool.checked(["list", "--json"], **result).doc or {}
    return doc.get("chroots", [])


def match(chroot, p, arch):
    return (
        chroot.get("dist") == p["dist"]
        and chroot.get("mode") == p["mode"]
        and (arch is None or chroot.get("arch") == arch)
        and chroot.get("present", True)
    )


def run_doctor(module, tool, result):
    """doctor --json; in check mode with --dry-run, since doctor removes the leftovers
    of killed builds. A tool older than doctor --dry-run is not run in check mode."""
    if not module.check_mode:
        doctor = tool.checked(["doctor", "--json"], **result)
    else:
        doctor = tool.run(["doctor", "--json", "--dry-run"])
        said = doctor.message(tool.prog)
        if doctor.rc == 2 and "unrecognized arguments" in said and "--dry-run" in said:
            module.warn(
                "sbuild-fast on this host has no 'doctor --dry-run': doctor, which removes "
                "leftovers of killed builds, is not run in check mode"
            )
            return
        if doctor.rc not in (0, 1):
            doctor = tool.checked(["doctor", "--json", "--dry-run"], **result)
    result["doctor"] = doctor.doc
    result["findings"] = doctor.findings


def main():
    module = AnsibleModule(
        argument_spec=dict(
            dist=dict(type="str"),
            arch=dict(type="str"),
            mode=dict(type="str", default="unshare", choices=["unshare", "schroot"]),
            state=dict(type="str", default="present", choices=["present", "latest", "absent"]),
            include=dict(type="list", elements="str", default=[]),
            mirror=dict(type="str"),
            configure=dict(type="bool", default=False),
            doctor=dict(type="bool", default=False),
        ),
        required_one_of=[("dist", "doctor")],
        supports_check_mode=True,
    )
    p = module.params
    tool = Tool(module, PROG)
    result = dict(changed=False, changes=[], findings=[], not_applicable=False)
    dry = ["--dry-run"] if module.check_mode else []
    arch = ["--arch", p["arch"]] if p["arch"] else []
    before = chroots(tool, result)
    have = [c for c in before if match(c, p, p["arch"])]

    command = None
    if p["dist"] and p["state"] == "absent" and have:
        command = ["remove", "--mode", p["mode"]] + arch + dry + ["--", p["dist"]]
    elif p["dist"] and p["state"] != "absent" and not have:
        command = ["create", "--dist", p["dist"], "--mode", p["mode"]] + arch
        for package in p["include"]:
            command += ["--include", package]
        if p["mirror"]:
            command += ["--mirror", p["mirror"]]
        if p["configure"]:
            command.append("--configure")
        command += dry
    elif p["dist"] and p["state"] == "latest":
        command = ["update", "--mode", p["mode"]] + dry + ["--", p["dist"]]
    if command:
        res = tool.checked(command, ok=(0,), **result)
        result["changes"] = [line for line in res.stdout.splitlines() if line.strip()]
        if module.check_mode:
            result["changed"] = True
        if module._diff and result["changes"]:
            result["diff"] = {"prepared": "\n".join(result["changes"]) + "\n"}

    after = chroots(tool, result)
    if not module.check_mode and command:
        # An update replaces the tarball: its record (modified, size) changes.
        result["changed"] = after != before
    result["chroots"] = after
    if p["doctor"]:
        run_doctor(module, tool, result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
