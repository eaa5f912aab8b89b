# debadmin: build, install and test the Debian packages.
#
#   make install   (root) install build dependencies, build the .debs, install them with apt
#   make check     (root) install test dependencies, then run every test, in this order:
#                  shellcheck, unit tests, package build, lintian, autopkgtest (host's
#                  release), trixie (the quick start in a fresh trixie root: build with
#                  trixie's Python, trixie's lintian, autopkgtest in a trixie testbed),
#                  install, integration tests
#   make repo      the signed apt repository build/repo/ (suites bookworm and trixie, component
#                  main, public key build/repo/debadmin-archive-keyring.asc) from the sbuild
#                  builds in build/sbuild-RELEASE/ (made first where missing), by reprepro
#                  (installed first as root), about 15 min on 2 cores with both builds.
#                  Signed with your key and in your name: make repo SIGNING_KEY=<fingerprint>
#                  DEBFULLNAME='Name' DEBEMAIL=address (key from your GnuPG keyring, GNUPGHOME;
#                  the name is the builds' Maintainer); without SIGNING_KEY with a throwaway
#                  key, and it says so: such a repository is for tests, never for publishing.
#   make previous  the previous release (PREVIOUS_TAG) built from git into build/previous/,
#                  for the upgrade tests
#   Run as a normal user with sudo, build/ stays the user's.
#   make sbuild RELEASE=bookworm|trixie   the release build, as Debian's builders make it:
#                  sbuild in unshare mode, a stock chroot, version VERSION~deb12u1 or
#                  ~deb13u1, into build/sbuild-RELEASE/ (HACKING.md, "Cutting a release")
#
# Adding a tool: follow the checklist in HACKING.md. Here it needs its TEST_DEPENDS_TOOL
# line below (empty if its tests need nothing more); tests/unit/test_registration.py
# fails for a tool in bin/ that misses this or any other registration.

SHELL := /bin/bash
# pybuild runs the first python3.X on PATH: keep Debian's first.
export PATH := /usr/sbin:/usr/bin:/sbin:/bin
export LC_ALL := C.UTF-8

PYTHON := /usr/bin/python3
# The autopkgtest testbed's release, and the installer netboot package the tests boot:
# the host's own (each release has its numbered debian-installer-N-netboot-amd64); the
# other release's is fetched by the test itself (netboot-serialize/fetch-netboot, apt
# with a throwaway configuration, verified with debian-archive-keyring).
RELEASE ?= $(shell . /etc/os-release 2>/dev/null; echo $${VERSION_CODENAME:-bookworm})
DI_NETBOOT := debian-installer-$(shell . /etc/os-release 2>/dev/null; echo $${VERSION_ID:-12})-netboot-amd64
BUILD := $(CURDIR)/build
VERSION := $(shell dpkg-parsechangelog -S Version 2>/dev/null || sed -n '1s/.*(\(.*\)).*/\1/p' debian/changelog)
CHANGES := $(BUILD)/debadmin_$(VERSION)_$(shell dpkg --print-architecture).changes
APT := DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 -y -q --no-install-recommends

# What the test pipeline itself runs (beyond the build dependencies).
CHECK_DEPENDS := shellcheck python3-pytest python3-hypothesis radon lintian autopkgtest mmdebstrap uidmap \
	sbuild faketime ansible-core ansible-lint prometheus
# make repo's tools (tests/integration/release uses them and piuparts too).
REPO_DEPENDS := reprepro gnupg
# What the integration tests use: the containers of tests/integration/lib, then per tool.
TOOLS := $(notdir $(wildcard bin/*))
TEST_DEPENDS_journal-acl-setup := acl btrfs-progs
TEST_DEPENDS_secureboot-ca-check := ovmf shim-signed python3-cryptography python3-asn1crypto \
	python3-pefile pesign grub-efi-amd64-signed openssl e2fsprogs qemu-utils qemu-system-x86 mmdebstrap cryptsetup-bin luksmeta
TEST_DEPENDS_netboot-serialize := qemu-system-x86 ipxe-qemu ovmf $(DI_NETBOOT) \
	qemu-system-arm qemu-efi-aarch64 $(subst -amd64,-arm64,$(DI_NETBOOT)) debian-archive-keyring
# Not here: qemu-system-misc opensbi u-boot-qemu, for the opt-in riscv64 boot
# (DEBADMIN_TEST_RISCV64=1 tests/integration/netboot-serialize/test-qemu-riscv64, ~5 min).
TEST_DEPENDS_ipv6-ra-forward := radvd iproute2 procps qemu-system-x86 mmdebstrap cpio
TEST_DEPENDS_sbuild-fast := sbuild schroot mmdebstrap uidmap btrfs-progs e2fsprogs systemd passwd
# sid's sbuild, opt-in and needing nothing more here (it goes into a trixie tree):
# DEBADMIN_TEST_SID=1 tests/integration/sbuild-fast/test-sid-sbuild, ~5 min.
TEST_DEPENDS_release := $(REPO_DEPENDS) piuparts git
# The collection's fleet test: ansible-core over ssh to containers, a repository by
# make-repo, the OVMF store the rollout fixes.
TEST_DEPENDS_ansible-collection := ansible-core openssh-client $(REPO_DEPENDS) ovmf
# debadmin(7)'s metrics on node_exporter's /metrics (the OVMF store secureboot-ca-check reads).
TEST_DEPENDS_metrics := ovmf
TEST_DEPENDS := systemd-container \
	$(foreach tool,$(TOOLS) release ansible-collection metrics,$(TEST_DEPENDS_$(tool)))

# Every shell file, found by its #! line: maintainer scripts, debian/tests, tests, bench, CI.
FIND_TREE := find . \( -path ./build -o -path ./build-trixie -o -path ./.git \) -prune -o -type f
SH_FILES = $(shell $(FIND_TREE) -exec sh -c 'for f; do head -n1 "$$f" | grep -q "^\#!/bin/sh" && echo "$$f"; done' sh {} +)
BASH_FILES = $(shell $(FIND_TREE) -exec grep -lE '^(\#!(/usr)?/bin/(env )?bash|\# shellcheck shell=bash)' {} +)

.PHONY: all install check deps check-deps shellcheck unit build dist sbuild lintian autopkgtest \
	autopkgtest-run install-debs integration lint clean subids trixie trixie-run repo previous

# $(call need,COMMAND...,TARGET): stop with a hint when a command is missing.
need = @for c in $(1); do command -v $$c >/dev/null || { \
	echo "make $@: $$c is not installed: run 'make $(2)' first (as root, or with sudo)" >&2; \
	exit 2; }; done
# Build dependencies (python3-pytest and what the unit tests import among them).
need_builddeps = @command -v dpkg-checkbuilddeps >/dev/null && dpkg-checkbuilddeps || { \
	echo "make $@: build dependencies missing: run 'make deps' first (as root, or with sudo)" >&2; \
	exit 2; }
need_root = @[ "$$(id -u)" = 0 ] || { echo "make $@: run as root (or with sudo)" >&2; exit 2; }
# Files made as root (sudo make ...) go back to the owner of the source tree.
give_back = [ "$$(id -u)" != 0 ] || chown -R "$$(stat -c %u:%g $(CURDIR))" $(1)

# $(call run_or_skip,PROBE,TARGET): make TARGET where this machine can run what it needs
# (tests/integration/lib/can-run PROBE), else end with one SKIP line and the reason, exit 0:
# inside a container nested nspawn or unshare usually cannot run. A probe that fails
# otherwise fails the stage; so does anything TARGET does once the probe has passed.
run_or_skip = @rc=0; reason=$$($(CURDIR)/tests/integration/lib/can-run $(1)) || rc=$$?; \
	case $$rc in \
	0) $(MAKE) --no-print-directory $(2) ;; \
	77) echo "=== $@: SKIP: $$reason" ;; \
	*) echo "make $@: tests/integration/lib/can-run $(1) failed (exit $$rc)" >&2; exit 2 ;; \
	esac

all: build

deps:
	$(need_root)
	$(APT) update
	$(APT) install build-essential dpkg-dev
	$(APT) build-dep ./

check-deps: deps
	$(need_root)
	$(APT) install $(CHECK_DEPENDS) $(TEST_DEPENDS)

install: deps build install-debs

# 'trixie' runs the quick start in a fresh trixie root; the integration test of the
# quick start then proves it again on bookworm only (DEBADMIN_QUICKSTART_DONE).
check: export DEBADMIN_QUICKSTART_DONE := trixie
check: check-deps shellcheck unit build lintian autopkgtest trixie install-debs integration

shellcheck:
	$(call need,shellcheck,check-deps)
	shellcheck -s sh $(SH_FILES)
	shellcheck -s bash $(BASH_FILES)

# Warnings are errors (pyproject.toml); no cache or bytecode left in the tree.
unit:
	$(need_builddeps)
	@echo "=== unit tests: $$($(PYTHON) --version), warnings as errors"
	PYTHONDONTWRITEBYTECODE=1 $(PYTHON) -m pytest -q -p no:cacheprovider tests/unit

# The tree as a package is built from: no build output, no caches, no group or other write
# bits (a checkout made with umask 002 builds the same source package).
COPY_TREE = tar -c --mode=go-w --exclude=./build --exclude=./build-trixie --exclude=./.git \
	--exclude=__pycache__ --exclude=.pytest_cache --exclude='*.egg-info' . | tar -x -C

# Build from a copy of the tree so that the .debs land in build/, not in ..
# Only what this build makes goes first: the files directly in build/ (the .debs, the
# source, .changes, .buildinfo); build/repo, build/sbuild-* and build/previous stay.
build:
	$(need_builddeps)
	rm -rf $(BUILD)/debadmin-$(VERSION)
	[ ! -d $(BUILD) ] || find $(BUILD) -maxdepth 1 -type f \( -name '*.deb' -o -name '*.changes' \
		-o -name '*.buildinfo' -o -name '*.dsc' -o -name 'debadmin_*.tar.*' \) -delete
	mkdir -p $(BUILD)/debadmin-$(VERSION)
	$(COPY_TREE) $(BUILD)/debadmin-$(VERSION)
	cd $(BUILD)/debadmin-$(VERSION) && dpkg-buildpackage -us -uc
	rm -rf $(BUILD)/debadmin-$(VERSION)
	$(call give_back,$(BUILD))

# The source package alone (build/debadmin_VERSION.dsc and .tar.xz), what make sbuild builds.
# A directory of its own per run: two make sbuild at once (bookworm, trixie) each make one.
dist:
	mkdir -p $(BUILD)
	set -e; tmp=$$(mktemp -d $(BUILD)/dist.XXXXXX); trap 'rm -rf "$$tmp"' EXIT; \
		mkdir $$tmp/debadmin-$(VERSION); \
		$(COPY_TREE) $$tmp/debadmin-$(VERSION); \
		(cd $$tmp && dpkg-source -b debadmin-$(VERSION)); \
		mv -f $$tmp/debadmin_$(VERSION).tar.* $$tmp/debadmin_$(VERSION).dsc $(BUILD)/
	$(call give_back,$(BUILD))

# Build the source for Debian $(RELEASE) as Debian's builders do: sbuild in unshare mode
# with a stock chroot (mmdebstrap --variant=buildd, ~/.cache/sbuild/RELEASE-ARCH.tar.zst,
# made again when older than a day), as a normal user (as root: as the build user
# debadmin-sbuild, made with subordinate ids), into build/sbuild-$(RELEASE)/, version
# VERSION~debNNu1 (build-aux/sbuild-release says why and how).
sbuild: dist
	$(call need,sbuild mmdebstrap newuidmap,check-deps)
	build-aux/sbuild-release $(RELEASE) $(BUILD)/debadmin_$(VERSION).dsc $(BUILD)/sbuild-$(RELEASE)
	$(call give_back,$(BUILD))

lintian:
	$(call need,lintian,check-deps)
	@[ -f $(CHANGES) ] || { echo "make $@: no $(CHANGES): run 'make build' first" >&2; exit 2; }
	@echo "=== lintian --pedantic $$(lintian --version) on $(CHANGES)"
	lintian --pedantic --info --display-experimental --fail-on error,warning $(CHANGES)
	@echo "=== lintian: no errors or warnings"

# The testbed is a fresh $(RELEASE) tree made by mmdebstrap and entered with unshare:
# the tests install the packages there, not on the host.
# Through a pipe: the testbed's /dev/stdout and /dev/stderr are links to /proc/self/fd/N,
# and a '>' to one of them there truncates a log file make's output is redirected to.
# Skipped, with the reason, where autopkgtest-virt-unshare cannot make its namespaces.
autopkgtest: subids
	$(call need,autopkgtest mmdebstrap newuidmap,check-deps)
	@[ -f $(CHANGES) ] || { echo "make $@: no $(CHANGES): run 'make build' first" >&2; exit 2; }
	$(call run_or_skip,unshare,autopkgtest-run)

autopkgtest-run:
	@echo "=== autopkgtest: $(RELEASE) testbed, packages of $(CHANGES)"
	mmdebstrap --variant=minbase --include=ca-certificates $(RELEASE) $(BUILD)/testbed-$(RELEASE).tar
	rc=0; set -o pipefail; autopkgtest --apt-upgrade $(CHANGES) -- \
		unshare --release $(RELEASE) --tarball $(BUILD)/testbed-$(RELEASE).tar 2>&1 | cat || rc=$$?; \
		rm -f $(BUILD)/testbed-$(RELEASE).tar; \
		if [ $$rc -ne 0 ] && [ $$rc -ne 2 ]; then \
			echo "autopkgtest $(RELEASE) failed (exit $$rc)"; exit 1; fi; \
		echo "=== autopkgtest $(RELEASE): passed (exit $$rc: 2 is some tests skipped)"

# autopkgtest-virt-unshare maps root's subordinate ids; a fresh host may have none.
# The range lies above useradd's SUB_UID_MAX, so it never overlaps a user's. Root's
# line must come first: bookworm's unshare --map-auto (util-linux 2.38) takes any
# earlier line whose name is not a number for uid 0 (strtoul("name") == 0).
subids:
	$(need_root)
	for f in /etc/subuid /etc/subgid; do \
		head -n1 $$f 2>/dev/null | grep -q '^root:' && continue; \
		{ grep '^root:' $$f 2>/dev/null || echo root:600200000:65536; \
		  grep -v '^root:' $$f 2>/dev/null || true; } > $$f.new && mv $$f.new $$f; \
	done

install-debs:
	$(need_root)
	@ls build/*.deb >/dev/null 2>&1 || { echo "make $@: no build/*.deb: run 'make build' first" >&2; exit 2; }
	$(APT) install --reinstall $(patsubst %,./%,$(shell cd $(CURDIR) && ls build/*.deb))

integration:
	$(need_root)
	DEBADMIN_DEBS=$(BUILD) tests/integration/run

lint:
	$(call need,black flake8,check-deps)
	black --check --line-length 99 lib tests bin
	flake8 lib tests

# Debian 13 as the README's reader meets it, built once per run: the quick start in a
# fresh minbase trixie root (tests/integration/quickstart/fresh-root: its build runs the
# unit tests with trixie's Python 3.13), trixie's lintian on that build, and the
# autopkgtests in a trixie testbed on the packages built there (kept in build-trixie/).
TRIXIE := $(CURDIR)/build-trixie
TRIXIE_SRC := $(TRIXIE)/root/root/debadmin
# Skipped, with the reason, where systemd-nspawn cannot start a container.
trixie: subids
	$(need_root)
	$(call need,systemd-nspawn,check-deps)
	$(call run_or_skip,nspawn,trixie-run)

trixie-run:
	$(call need,mmdebstrap autopkgtest,check-deps)
	rm -rf $(TRIXIE)
	@echo "=== trixie: quick start in a fresh trixie root (build, unit tests with Python 3.13)"
	tests/integration/quickstart/fresh-root trixie $(TRIXIE)
	find $(TRIXIE_SRC)/build -maxdepth 1 -type f -exec cp -t $(TRIXIE) {} +
	@echo "=== trixie: lintian --pedantic on the trixie build"
	systemd-nspawn -q --register=no --keep-unit --console=pipe -D $(TRIXIE)/root --chdir=/root/debadmin \
		sh -c '$(APT) install lintian >/dev/null && lintian --version && \
		lintian --pedantic --info --display-experimental --fail-on error,warning \
		build/$(notdir $(CHANGES))'
	@echo "=== trixie: lintian --pedantic: no errors or warnings"
	rm -rf $(TRIXIE)/root
	$(MAKE) --no-print-directory autopkgtest RELEASE=trixie BUILD=$(TRIXIE)
	$(call give_back,$(TRIXIE))

# The signed apt repository, from the sbuild builds of every release (release-specific
# versions, see HACKING.md "Releases"); a normal user can make it. reprepro and gpg are
# installed when missing (as root; a normal user is told the package). A build in
# build/sbuild-RELEASE/ is used when it names the same publisher (DEBFULLNAME, DEBEMAIL;
# without them the source's Maintainer), else made again. A line per stage, with the
# time since the start; the last line names what was made.
REPO_RELEASES := bookworm trixie
SIGNING_KEY ?=
repo:
	@for c in reprepro:reprepro gpg:gnupg; do \
		[ -x "$$(command -v $${c%%:*})" ] && continue; \
		if [ "$$(id -u)" = 0 ]; then \
			echo "=== make repo: installing $${c#*:} (for $${c%%:*})"; \
			$(APT) install $${c#*:} >/dev/null || exit 2; \
		else echo "make $@: $${c%%:*} is not installed: sudo apt-get install $${c#*:}" >&2; exit 2; fi; \
	done
	@publisher=$$(build-aux/sbuild-release --publisher) || exit 2; \
	if [ -n "$(SIGNING_KEY)" ] && [ -z "$$publisher" ]; then \
		echo "make $@: SIGNING_KEY given: name the publisher too, as dch reads them:" \
			"make repo SIGNING_KEY=... DEBFULLNAME='Your Name' DEBEMAIL=you@example.org" >&2; exit 2; fi; \
	by=$${publisher:-$$(dpkg-parsechangelog -S Maintainer)}; \
	start=$$(date +%s); \
	for r in $(REPO_RELEASES); do \
		c=$$(ls $(BUILD)/sbuild-$$r/*.changes 2>/dev/null | head -n1); \
		if [ -n "$$c" ] && grep -qxF "Changed-By: $$by" "$$c"; then \
			echo "=== make repo: $$r: using the build $$c ($$(( $$(date +%s) - start )) s)"; continue; fi; \
		[ -z "$$c" ] || echo "=== make repo: $$r: $$c is not by $$by: building again"; \
		echo "=== make repo: $$r: make sbuild RELEASE=$$r (sbuild, unit tests, lintian: about 7 min)"; \
		$(MAKE) --no-print-directory sbuild RELEASE=$$r || exit; \
		echo "=== make repo: $$r: built ($$(( $$(date +%s) - start )) s)"; \
	done; \
	rm -rf $(BUILD)/repo.new $(BUILD)/repo.new.reprepro; \
	DEBADMIN_REPO_START=$$start DEBADMIN_REPO_PUBLISHER="$$publisher" build-aux/make-repo \
		$(if $(SIGNING_KEY),--key $(SIGNING_KEY)) $(BUILD)/repo.new \
		$(foreach r,$(REPO_RELEASES),$$(for c in $(BUILD)/sbuild-$(r)/*.changes; do echo $(r)=$$c; done)) \
		|| exit; \
	rm -rf $(BUILD)/repo $(BUILD)/repo.reprepro; \
	mv $(BUILD)/repo.new.reprepro $(BUILD)/repo.reprepro; \
	mv $(BUILD)/repo.new $(BUILD)/repo; \
	$(call give_back,$(BUILD)); \
	echo "=== make repo: done in $$(( $$(date +%s) - start )) s: publish $(BUILD)/repo/" \
		"(dists/, pool/; public key $(BUILD)/repo/debadmin-archive-keyring.asc);" \
		"reprepro's state for the next run: $(BUILD)/repo.reprepro/"

# The previous release, for the upgrade tests: built from its tag (a fresh clone may
# have no tags: then from its commit), without its unit tests. Its packages are all
# Architecture: all, so one build serves every release.
PREVIOUS_TAG := v0.4.1
PREVIOUS_COMMIT := 224161d92102c69fa9143222ff75a88256c84a36
previous:
	$(need_builddeps)
	$(call need,git,check-deps)
	rm -rf $(BUILD)/previous
	mkdir -p $(BUILD)/previous/src
	ref=$$(git rev-parse -q --verify '$(PREVIOUS_TAG)^{commit}' || echo $(PREVIOUS_COMMIT)) && \
		git archive "$$ref" | tar -x -C $(BUILD)/previous/src
	cd $(BUILD)/previous/src && DEB_BUILD_OPTIONS=nocheck dpkg-buildpackage -us -uc -b >../build.log 2>&1 || \
		{ tail -n 30 ../build.log; exit 1; }
	rm -rf $(BUILD)/previous/src
	ls $(BUILD)/previous/*.changes
	$(call give_back,$(BUILD))

clean:
	rm -rf $(BUILD) $(TRIXIE) .pytest_cache
	find . -name __pycache__ -prune -exec rm -rf {} +
