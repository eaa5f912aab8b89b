# -*- coding: utf-8 -*-
# Copyright: 2026 debadmin developers <debadmin@packages.debian.org>
# GNU General Public License v2.0+ (see /usr/share/common-licenses/GPL-2)
"""Run a debadmin tool on the target and map its contract to Ansible's.

Every debadmin tool keeps one contract (debadmin(7)): exit 0 ok, 1 action needed,
2 error or refused (one line on stderr; with --json possibly a JSON object with an
``error`` member on stdout), 3 not applicable; --json prints one document with a
``findings`` list; commands that change the system take --dry-run and print
``would ...`` lines, then ``done: ...`` lines when they act. The modules only pass
that through: the tool decides, the module reports.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json

EXIT_OK = 0
EXIT_ACTION = 1
EXIT_ERROR = 2
EXIT_NOT_APPLICABLE = 3

# The Debian package each tool comes from, for the message when it is missing.
PACKAGES = {
    "journal-acl-setup": "journal-acl-setup",
    "secureboot-ca-check": "secureboot-ca-check",
    "ipv6-ra-forward": "ipv6-ra-forward",
    "netboot-serialize": "netboot-serialize",
    "sbuild-fast": "sbuild-fast",
}


class Result(object):
    """One run of a tool: argv, exit status, the JSON document (or None), output."""

    def __init__(self, argv, rc, stdout, stderr):
        self.argv = argv
        self.rc = rc
        self.stdout = stdout
        self.stderr = stderr
        self.doc = parse_json(stdout)

    @property
    def findings(self):
        if isinstance(self.doc, dict) and isinstance(self.doc.get("findings"), list):
            return self.doc["findings"]
        return []

    def message(self, prog):
        """The tool's own words for an error or a refusal: the JSON ``error`` member,
        else the last line on stderr without the ``PROG: [error: ]`` prefix."""
        if isinstance(self.doc, dict):
            error = self.doc.get("error")
            if isinstance(error, dict):
                error = error.get("message") or json.dumps(error, sort_keys=True)
            if error:
                return str(error)
            reason = self.doc.get("reason")
            if reason:
                return str(reason)
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        if not lines and self.doc is None:
            lines = [line for line in self.stdout.splitlines() if line.strip()]
        if not lines:
            # A JSON report and nothing on stderr (secureboot-ca-check --json on a store
            # with Secure Boot off): the report's own words.
            said = [
                f.get("message") for f in self.findings if isinstance(f, dict) and f.get("message")
            ]
            verdicts = []
            tree_collect(self.doc, "verdict", verdicts)
            what = (
                "not applicable" if self.rc == EXIT_NOT_APPLICABLE else "exit status %d" % self.rc
            )
            if verdicts:
                what += " (verdict: %s)" % ", ".join(sorted(set(str(v) for v in verdicts)))
            return "%s: %s%s" % (prog, what, ": " + "; ".join(said) if said else "")
        line = lines[-1].strip()
        for prefix in (prog + ": error: ", prog + ": "):
            if line.startswith(prefix):
                return line[len(prefix) :]
        return line

    def changes(self):
        """The ``would ...`` / ``done: ...`` lines a state-changing command printed."""
        return [
            line.strip()
            for line in self.stdout.splitlines()
            if line.startswith("would ") or line.startswith("done: ")
        ]


def parse_json(text):
    text = text.strip()
    if not text.startswith("{"):
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def needs_action(findings):
    return any(f.get("severity") == "action" for f in findings if isinstance(f, dict))


def tree_collect(doc, key, found):
    """Every value of ``key`` anywhere in the JSON document, appended to ``found``."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            if k == key:
                found.append(v)
            tree_collect(v, key, found)
    elif isinstance(doc, list):
        for item in doc:
            tree_collect(item, key, found)


def tree_has(doc, key, test):
    """Whether any ``key`` anywhere in the JSON document passes ``test``."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            if k == key and test(v):
                return True
            if tree_has(v, key, test):
                return True
    elif isinstance(doc, list):
        return any(tree_has(item, key, test) for item in doc)
    return False


def repeated(option, values):
    """``--option VALUE`` for each value: a list option of the module as the tool's
    repeatable option."""
    argv = []
    for value in values or []:
        argv += [option, str(value)]
    return argv


def valued(params, names):
    """``--NAME VALUE`` for each of the module's options ``names`` that is set (its
    underscores as dashes)."""
    argv = []
    for name in names:
        if params[name] is not None and params[name] != "":
            argv += ["--" + name.replace("_", "-"), str(params[name])]
    return argv


def only_with(module, key, value, options):
    """Fail the task when one of ``options`` is set without ``key=value``: an option
    the tool would not take, rather than one silently ignored."""
    for option in options:
        if module.params[option] and module.params[key] != value:
            module.fail_json(msg="%s goes with %s=%s only" % (option, key, value))


def report_of(res, result):
    """The run ``res`` of a ``--json`` report, as the module's result: its exit status,
    findings, whole document and whether a finding needs action."""
    result.update(
        exit_status=res.rc,
        findings=res.findings,
        report=res.doc,
        action_needed=needs_action(res.findings),
    )
    return res


class Tool(object):
    """The tool PROG on the target, run through AnsibleModule.run_command."""

    def __init__(self, module, prog):
        self.module = module
        self.prog = prog
        self.path = module.get_bin_path(prog)
        if self.path is None:
            module.fail_json(
                msg="%s is not installed on this host: install the Debian package %s "
                "(for instance with the debadmin.tools.repository role)"
                % (prog, PACKAGES.get(prog, prog))
            )

    def run(self, args):
        argv = [self.path] + [str(a) for a in args]
        rc, stdout, stderr = self.module.run_command(
            argv, environ_update={"LC_ALL": "C.UTF-8"}, check_rc=False
        )
        return Result(argv, rc, stdout, stderr)

    def checked(self, args, ok=(EXIT_OK, EXIT_ACTION), **result):
        """Run; on exit 3 end the task ok with not_applicable and the reason; on 2 (or
        any status outside ``ok``) fail it with the tool's message. Else the Result."""
        res = self.run(args)
        if res.rc in ok:
            return res
        if res.rc == EXIT_NOT_APPLICABLE:
            self.not_applicable(res, **result)
        self.fail(res, **result)

    def report(self, args, result):
        """Run the ``--json`` report ``args`` and put it in ``result`` (report_of)."""
        return report_of(self.checked(args, **result), result)

    def dry_run_first(self, head, result, tail=(), header=None):
        """The contract of the tools that print ``would ...`` lines: run ``head
        --dry-run tail``; where it plans changes the task is changed and, unless in
        check mode, ``head tail`` runs for real, ``changed`` then coming from its
        ``done:`` lines. ``result["changes"]`` gets the lines, diff mode shows them
        under ``header``. Returns the last run."""
        res = self.checked(list(head) + ["--dry-run"] + list(tail), **result)
        result["changes"] = res.changes()
        if result["changes"]:
            result["changed"] = True
            if not self.module.check_mode:
                res = self.checked(list(head) + list(tail), **result)
                result["changes"] = res.changes()
                result["changed"] = bool(result["changes"])
            if self.module._diff:
                result["diff"] = prepared_diff(
                    result["changes"], header or "%s %s:" % (self.prog, head[0])
                )
        return res

    def not_applicable(self, res, **result):
        result.update(
            changed=result.get("changed", False),
            not_applicable=True,
            reason=res.message(self.prog),
            # Not "rc": Ansible fails any result whose rc is not 0.
            exit_status=res.rc,
            findings=res.findings,
        )
        if res.doc is not None:
            result.setdefault("report", res.doc)
        self.module.exit_json(**result)

    def fail(self, res, **result):
        result.update(
            msg=res.message(self.prog),
            rc=res.rc,
            cmd=res.argv,
            stdout=res.stdout,
            stderr=res.stderr,
            findings=res.findings,
        )
        if res.doc is not None:
            result.setdefault("report", res.doc)
        self.module.fail_json(**result)


def prepared_diff(lines, header):
    """Diff mode's free-text form: what the tool would change, one line each."""
    if not lines:
        return None
    return {"prepared": "%s\n%s\n" % (header, "\n".join("  " + line for line in lines))}
