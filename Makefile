# debadmin: build, install and test the Debian packages.
#
#   sudo make install   install build dependencies, build the .debs, install them with apt
#   sudo make check     install test dependencies, then run every test, in this order:
#                       shellcheck, unit tests, package build, lintian, autopkgtest,
#                       install, integration tests
#
# Adding a tool: its test dependencies go into TEST_DEPENDS below (one line); everything
# else is found by globbing bin/, debian/ and tests/integration/.

SHELL := /bin/bash
# pybuild runs the first python3.X on PATH: keep Debian's first.
export PATH := /usr/sbin:/usr/bin:/sbin:/bin
export LC_ALL := C.UTF-8

PYTHON := /usr/bin/python3
# The autopkgtest testbed's release, and the installer netboot package the tests boot:
# the host's own (each release has its numbered debian-installer-N-netboot-amd64).
RELEASE ?= $(shell . /etc/os-release 2>/dev/null; echo $${VERSION_CODENAME:-bookworm})
DI_NETBOOT := debian-installer-$(shell . /etc/os-release 2>/dev/null; echo $${VERSION_ID:-12})-netboot-amd64
BUILD := $(CURDIR)/build
VERSION := $(shell dpkg-parsechangelog -S Version 2>/dev/null || sed -n '1s/.*(\(.*\)).*/\1/p' debian/changelog)
CHANGES := $(BUILD)/debadmin_$(VERSION)_$(shell dpkg --print-architecture).changes
APT := DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 -y -q --no-install-recommends

# What the test pipeline itself runs (beyond the build dependencies).
CHECK_DEPENDS := shellcheck python3-pytest lintian autopkgtest mmdebstrap uidmap
# What the integration tests use, per tool.
TEST_DEPENDS := systemd-container
TEST_DEPENDS += acl btrfs-progs
TEST_DEPENDS += ovmf shim-signed python3-cryptography
TEST_DEPENDS += qemu-system-x86 ipxe-qemu ovmf $(DI_NETBOOT)
TEST_DEPENDS += qemu-system-arm qemu-efi-aarch64 $(subst -amd64,-arm64,$(DI_NETBOOT))
TEST_DEPENDS += radvd iproute2 procps
TEST_DEPENDS += sbuild schroot mmdebstrap uidmap btrfs-progs e2fsprogs systemd passwd

# Every shell file, found by its #! line: maintainer scripts, debian/tests, tests, bench, CI.
FIND_TREE := find . \( -path ./build -o -path ./.git \) -prune -o -type f
SH_FILES = $(shell $(FIND_TREE) -exec grep -lE '^\#!/bin/sh' {} +)
BASH_FILES = $(shell $(FIND_TREE) -exec grep -lE '^(\#!(/usr)?/bin/(env )?bash|\# shellcheck shell=bash)' {} +)

.PHONY: all install check deps check-deps shellcheck unit build lintian autopkgtest \
	install-debs integration lint clean subids

all: build

deps:
	$(APT) update
	$(APT) install build-essential dpkg-dev
	$(APT) build-dep ./

check-deps: deps
	$(APT) install $(CHECK_DEPENDS) $(TEST_DEPENDS)

install: deps build install-debs

check: check-deps shellcheck unit build lintian autopkgtest install-debs integration

shellcheck:
	shellcheck -s sh $(SH_FILES)
	shellcheck -s bash $(BASH_FILES)

unit:
	$(PYTHON) -m pytest -q tests/unit

# Build from a copy of the tree so that the .debs land in build/, not in ..
build:
	rm -rf $(BUILD)
	mkdir -p $(BUILD)/debadmin-$(VERSION)
	tar -c --exclude=./build --exclude=./.git --exclude=__pycache__ --exclude=.pytest_cache . \
		| tar -x -C $(BUILD)/debadmin-$(VERSION)
	cd $(BUILD)/debadmin-$(VERSION) && dpkg-buildpackage -us -uc
	rm -rf $(BUILD)/debadmin-$(VERSION)

lintian:
	lintian --pedantic --info --display-experimental --fail-on error,warning $(CHANGES)

# The testbed is a fresh $(RELEASE) tree made by mmdebstrap and entered with unshare:
# the tests install the packages there, not on the host.
autopkgtest: subids
	mmdebstrap --variant=minbase --include=ca-certificates $(RELEASE) $(BUILD)/testbed-$(RELEASE).tar
	rc=0; autopkgtest --apt-upgrade $(CHANGES) -- \
		unshare --release $(RELEASE) --tarball $(BUILD)/testbed-$(RELEASE).tar || rc=$$?; \
		rm -f $(BUILD)/testbed-$(RELEASE).tar; \
		if [ $$rc -ne 0 ] && [ $$rc -ne 2 ]; then \
			echo "autopkgtest failed (exit $$rc)"; exit 1; fi

# autopkgtest-virt-unshare maps root's subordinate ids; a fresh host may have none.
# The range lies above useradd's SUB_UID_MAX, so it never overlaps a user's. Root's
# line must come first: bookworm's unshare --map-auto (util-linux 2.38) takes any
# earlier line whose name is not a number for uid 0 (strtoul("name") == 0).
subids:
	for f in /etc/subuid /etc/subgid; do \
		head -n1 $$f 2>/dev/null | grep -q '^root:' && continue; \
		{ grep '^root:' $$f 2>/dev/null || echo root:600200000:65536; \
		  grep -v '^root:' $$f 2>/dev/null || true; } > $$f.new && mv $$f.new $$f; \
	done

install-debs:
	$(APT) install --reinstall $(patsubst %,./%,$(shell cd $(CURDIR) && ls build/*.deb))

integration:
	DEBADMIN_DEBS=$(BUILD) tests/integration/run

lint:
	black --check --line-length 99 lib tests bin
	flake8 lib tests

clean:
	rm -rf $(BUILD) .pytest_cache
	find . -name __pycache__ -prune -exec rm -rf {} +
