# Sourced by the release tests: the packages of the previous and the new release, and
# repositories made with build-aux/make-repo (what 'make repo' runs).
# shellcheck shell=bash

RELEASE_TOP=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
# Where 'make sbuild' left each release's build and 'make previous' the previous
# release's (tests/integration/run sets DEBADMIN_DEBS to build/).
RELEASE_BUILD=${DEBADMIN_RELEASE_BUILD:-$RELEASE_TOP/build}
# shellcheck disable=SC2034 # used by the tests that source this file
MAKE_REPO=$RELEASE_TOP/build-aux/make-repo

# One .changes in DIR, or nothing.
release_one_changes() { find "$1" -maxdepth 1 -name '*.changes' ! -name '*_source.changes' | sort | tail -n1; }

# previous_changes: the .changes of the previous release (make previous when missing).
previous_changes() {
    local c
    c=$(release_one_changes "$RELEASE_BUILD/previous" 2>/dev/null)
    if [ -z "$c" ]; then
        [ -d "$RELEASE_TOP/.git" ] || git -C "$RELEASE_TOP" rev-parse --git-dir >/dev/null 2>&1 ||
            skip "no build/previous and no git checkout to build the previous release from"
        make -C "$RELEASE_TOP" --no-print-directory previous BUILD="$RELEASE_BUILD" >&2 ||
            fail "make previous failed"
        c=$(release_one_changes "$RELEASE_BUILD/previous")
    fi
    [ -n "$c" ] || fail "no .changes in $RELEASE_BUILD/previous"
    echo "$c"
}

# new_changes RELEASE: the .changes of this tree's build for RELEASE (make sbuild when
# missing; release-build's own test pays for that build in 'make check').
new_changes() {
    local c
    c=$(release_one_changes "$RELEASE_BUILD/sbuild-$1" 2>/dev/null)
    if [ -z "$c" ]; then
        make -C "$RELEASE_TOP" --no-print-directory sbuild RELEASE="$1" >&2 ||
            fail "make sbuild RELEASE=$1 failed"
        c=$(release_one_changes "$RELEASE_BUILD/sbuild-$1")
    fi
    [ -n "$c" ] || fail "no .changes in $RELEASE_BUILD/sbuild-$1"
    echo "$c"
}

# changes_field FILE FIELD: one field of a .changes (Version, Binary...).
changes_field() { sed -n "s/^$2: *//p" "$1" | head -n1; }

# maintainer_key DIR: a GnuPG home in DIR with an ed25519 signing key, standing in for
# the maintainer's own; sets GNUPGHOME and SIGNING_KEY (its fingerprint).
maintainer_key() {
    export GNUPGHOME=$1
    mkdir -p "$GNUPGHOME"
    chmod 0700 "$GNUPGHOME"
    gpg --batch --quiet --pinentry-mode loopback --passphrase '' --quick-gen-key \
        'debadmin test archive key <debadmin-test@example.invalid>' ed25519 sign never 2>/dev/null ||
        fail "gpg could not make the test key"
    SIGNING_KEY=$(gpg --batch --quiet --with-colons --list-secret-keys 2>/dev/null |
        awk -F: '$1 == "fpr" { print $10; exit }')
    [ -n "$SIGNING_KEY" ] || fail "no test key fingerprint"
    export SIGNING_KEY
}

# verify_repo REPO SUITE: InRelease and Release.gpg verify with the published key alone.
verify_repo() {
    local repo=$1 suite=$2 kr
    kr=$(mktemp)
    gpg --dearmor < "$repo/debadmin-archive-keyring.asc" > "$kr"
    gpgv --keyring "$kr" "$repo/dists/$suite/InRelease" 2>/dev/null ||
        { rm -f "$kr"; fail "$suite: InRelease does not verify with debadmin-archive-keyring.asc"; }
    gpgv --keyring "$kr" "$repo/dists/$suite/Release.gpg" "$repo/dists/$suite/Release" 2>/dev/null ||
        { rm -f "$kr"; fail "$suite: Release.gpg does not verify"; }
    rm -f "$kr"
}
