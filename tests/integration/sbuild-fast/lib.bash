# Sourced by the sbuild-fast integration tests: a non-root build user with
# subordinate ids, commands run as that user, and a tiny debhelper package.
# shellcheck shell=bash

SBF_USER=${SBF_USER:-sbfast-test}
SBF_HOME=""

# sbf_make_user: create SBF_USER with subuid/subgid ranges (once).
sbf_make_user() {
    if ! id "$SBF_USER" >/dev/null 2>&1; then
        useradd --create-home --shell /bin/bash "$SBF_USER" || fail "useradd $SBF_USER"
    fi
    local kind start
    for kind in subuid subgid; do
        if ! grep -q "^$SBF_USER:" "/etc/$kind"; then
            # After the highest range in use, so that it overlaps nobody's.
            start=$(awk -F: 'BEGIN {m = 100000} $2 + $3 > m {m = $2 + $3} END {print m}' "/etc/$kind")
            usermod "--add-sub${kind#sub}s" "$start-$((start + 65535))" "$SBF_USER" ||
                fail "cannot add a $kind range"
        fi
    done
    SBF_HOME=$(getent passwd "$SBF_USER" | cut -d: -f6)
}

# as_user CMD...: run CMD as SBF_USER in its home, with a clean environment.
as_user() {
    (cd "$SBF_HOME" && runuser -u "$SBF_USER" -- env -i HOME="$SBF_HOME" USER="$SBF_USER" \
        LOGNAME="$SBF_USER" PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C.UTF-8 "$@")
}

# sbf_user_pids: every process of the test user and of its subordinate ids (what
# mmdebstrap and sbuild run inside their user namespaces): the test made the user,
# so they are all ours.
sbf_user_pids() {
    local uid first=0 count=0
    uid=$(id -u "$SBF_USER" 2>/dev/null) || return 0
    IFS=: read -r _ first count < <(grep "^$SBF_USER:" /etc/subuid | head -n1) || true
    ps -e -o pid=,uid= | awk -v u="$uid" -v f="$first" -v c="$count" \
        '$2 == u || (c > 0 && $2 >= f && $2 < f + c) {print $1}'
}

sbf_kill_user_procs() {
    local pids
    pids=$(sbf_user_pids)
    # shellcheck disable=SC2086 # one pid per word
    [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
}

# sbf_make_package DIR: a tiny native debhelper package and its .dsc, as SBF_USER.
sbf_make_package() {
    local dir=$1
    # shellcheck disable=SC2016 # expanded by the inner shell
    as_user sh -euc '
        d=$1/sbfast-hello-1.0
        mkdir -p "$d/debian/source"
        echo "3.0 (native)" > "$d/debian/source/format"
        cat > "$d/debian/control" <<CTRL
Source: sbfast-hello
Section: misc
Priority: optional
Maintainer: sbuild-fast test <test@example.org>
Build-Depends: debhelper-compat (= 13)
Standards-Version: 4.6.2
Rules-Requires-Root: no

Package: sbfast-hello
Architecture: all
Depends: \${misc:Depends}
Description: tiny package built by the sbuild-fast tests
 It installs one shell script.
CTRL
        printf "sbfast-hello (1.0) unstable; urgency=medium\n\n  * Test.\n\n -- sbuild-fast test <test@example.org>  Sat, 21 Nov 2026 22:00:00 +0000\n" \
            > "$d/debian/changelog"
        printf "#!/usr/bin/make -f\n%%:\n\tdh \$@\n" > "$d/debian/rules"
        chmod +x "$d/debian/rules"
        printf "#!/bin/sh\necho hello from sbuild-fast\n" > "$d/sbfast-hello"
        echo "sbfast-hello usr/bin" > "$d/debian/sbfast-hello.install"
        cd "$1" && dpkg-source -b sbfast-hello-1.0 >/dev/null
    ' sh "$dir"
}

# sbf_make_cached_package DIR: a tiny native package that Build-Depends on pax (85 kB,
# in no chroot), and its .dsc, as SBF_USER: what the package cache keeps between builds.
sbf_make_cached_package() {
    # shellcheck disable=SC2016 # expanded by the inner shell
    as_user sh -euc "$SBF_CACHED_PACKAGE_SCRIPT" sh "$1"
}
# The script, also run as another user inside a trixie tree: sh -euc SCRIPT sh DIR.
# shellcheck disable=SC2016 # expanded by the shell that runs it
SBF_CACHED_PACKAGE_SCRIPT='
    d=$1/sbfast-cached-1.0
    mkdir -p "$d/debian/source"
    echo "3.0 (native)" > "$d/debian/source/format"
    printf "%s\n" "Source: sbfast-cached" "Section: misc" "Priority: optional" \
        "Maintainer: sbuild-fast test <test@example.org>" \
        "Build-Depends: debhelper-compat (= 13), pax" "Standards-Version: 4.6.2" \
        "Rules-Requires-Root: no" "" "Package: sbfast-cached" "Architecture: all" \
        "Depends: \${misc:Depends}" "Description: tiny package with a build dependency" \
        " Built by the sbuild-fast tests of the package cache." > "$d/debian/control"
    printf "sbfast-cached (1.0) unstable; urgency=medium\n\n  * Test.\n\n -- sbuild-fast test <test@example.org>  Sat, 21 Nov 2026 22:00:00 +0000\n" \
        > "$d/debian/changelog"
    printf "#!/usr/bin/make -f\n%%:\n\tdh \$@\n" > "$d/debian/rules"
    chmod +x "$d/debian/rules"
    cd "$1" && dpkg-source -b sbfast-cached-1.0 >/dev/null
'

# sbf_pax_fetched LOG: whether the build in LOG downloaded pax from the archive (apt's
# "Get:N http://... pax" line; a .deb from the package cache is not fetched).
sbf_pax_fetched() {
    grep -Eq '^Get:[0-9]+ https?://[^ ]+ [^ ]+ [^ ]+ pax ' "$1"
}

# mmdebstrap's own temporary trees that a SIGKILL left in /tmp, owned by the user
# or by its subordinate ids.
sbf_remove_mmdebstrap_leftovers() {
    local uid first count dir owner
    uid=$(id -u "$SBF_USER" 2>/dev/null) || return 0
    IFS=: read -r _ first count < <(grep "^$SBF_USER:" /etc/subuid | head -n1) || return 0
    for dir in "${TMPDIR:-/tmp}"/mmdebstrap.*; do
        [ -d "$dir" ] || continue
        owner=$(stat -c %u "$dir")
        if [ "$owner" = "$uid" ] || { [ "$owner" -ge "$first" ] && [ "$owner" -lt $((first + count)) ]; }; then
            rm -rf --one-file-system "$dir" || true
        fi
    done
}

# sbf_make_tree RELEASE ROOT DEBS LOG [PKG...]: a RELEASE tree in ROOT with sbuild,
# mmdebstrap, what unshare-mode sbuild needs on its host, PKG... and the built
# python3-debadmin and sbuild-fast packages from DEBS installed; output to LOG.
# It is made to become the root of a mount namespace (sbf_in_root), so that the
# tests and the bench can run another release's sbuild on this host.
sbf_make_tree() {
    local release=$1 root=$2 debs=$3 log=$4
    shift 4
    local extra=""
    [ $# = 0 ] || extra=,$(IFS=,; echo "$*")
    mmdebstrap --quiet --variant=apt \
        --include="sbuild,mmdebstrap,uidmap,iproute2,mount,passwd,ca-certificates,python3$extra" \
        "$release" "$root" "$(mirror_for "$release")" > "$log" 2>&1 ||
        { tail -n 20 "$log"; fail "mmdebstrap $release failed"; }
    cp /etc/resolv.conf "$root/etc/resolv.conf"
    mkdir -p "$root/srv/debs"
    cp "$debs"/python3-debadmin_*_all.deb "$debs"/sbuild-fast_*_all.deb "$root/srv/debs/"
    # mmdebstrap leaves no package lists: fetch them for the packages' dependencies.
    chroot "$root" sh -c 'apt-get update -q && apt-get install -y -q --no-install-recommends /srv/debs/*.deb' >> "$log" 2>&1 ||
        { tail -n 20 "$log"; fail "installing the packages in the $release tree"; }
}

# sbf_in_root ROOT CMD...: CMD with ROOT as the real root of a private mount
# namespace (pivot_root; user namespaces cannot be made inside a chroot, and
# nspawn's /proc over-mounts forbid unprivileged proc mounts). The host's /dev
# (and so /dev/shm) is shared; every mount dies with the namespace.
sbf_in_root() {
    # shellcheck disable=SC2016 # expanded by the inner shell
    unshare --mount --propagation private -- /bin/bash -euc '
        root=$1; shift
        mount --bind "$root" "$root"
        mount -t proc proc "$root/proc"
        mount --rbind /sys "$root/sys"
        mount --rbind /dev "$root/dev"
        mount -t tmpfs tmpfs "$root/tmp"
        mount -t tmpfs tmpfs "$root/run"
        mkdir -p "$root/.oldroot"
        cd "$root"
        pivot_root . .oldroot
        umount -l /.oldroot
        cd /
        exec "$@"
    ' sbf_in_root "$1" "${@:2}"
}

# Two tiny packages for the session backend's guarantees, as SBF_CACHED_PACKAGE_SCRIPT
# (sh -euc SCRIPT sh DIR HOST): sbfast-net's build connects to HOST:80 (it prints
# SBFAST-NETWORK-REACHED, else SBFAST-NETWORK-UNREACHABLE and fails); sbfast-daemon's
# build starts 'sleep 98765' detached (setsid, nohup) and shows it running in a later
# step (SBFAST-DAEMON-RUNNING): nothing of it may be left once sbuild returns.
# shellcheck disable=SC2016,SC2034 # expanded by the shell that runs it; used by the tests
SBF_GUARANTEE_PACKAGES_SCRIPT='
    for p in net daemon; do
        d=$1/sbfast-$p-1.0
        mkdir -p "$d/debian/source"
        echo "3.0 (native)" > "$d/debian/source/format"
        printf "%s\n" "Source: sbfast-$p" "Section: misc" "Priority: optional" \
            "Maintainer: sbuild-fast test <test@example.org>" \
            "Build-Depends: debhelper-compat (= 13)" "Standards-Version: 4.6.2" \
            "Rules-Requires-Root: no" "" "Package: sbfast-$p" "Architecture: all" \
            "Depends: \${misc:Depends}" "Description: sbuild-fast test package" \
            " Built by the sbuild-fast tests of the session backend." > "$d/debian/control"
        printf "sbfast-$p (1.0) unstable; urgency=medium\n\n  * Test.\n\n -- sbuild-fast test <test@example.org>  Sat, 21 Nov 2026 22:00:00 +0000\n" \
            > "$d/debian/changelog"
    done
    printf "%s\n" "#!/usr/bin/make -f" "%:" "	dh \$@" "override_dh_auto_build:" \
        "	perl -MIO::Socket::INET -e '"'"'exit(IO::Socket::INET->new(PeerAddr => \"$2:80\", Timeout => 10) ? 0 : 1)'"'"' && echo SBFAST-NETWORK-REACHED || { echo SBFAST-NETWORK-UNREACHABLE; exit 1; }" \
        > "$1/sbfast-net-1.0/debian/rules"
    printf "%s\n" "#!/usr/bin/make -f" "%:" "	dh \$@" "override_dh_auto_build:" \
        "	setsid nohup sleep 98765 > /dev/null 2>&1 < /dev/null &" \
        "override_dh_auto_install:" \
        "	sleep 1; grep -qs 9876[5] /proc/[0-9]*/cmdline && echo SBFAST-DAEMON-RUNNING" \
        > "$1/sbfast-daemon-1.0/debian/rules"
    chmod +x "$1"/sbfast-*-1.0/debian/rules
    cd "$1" && dpkg-source -b sbfast-net-1.0 >/dev/null && dpkg-source -b sbfast-daemon-1.0 >/dev/null
'

# sbf_mirror_host: the host name of the archive the tests use.
sbf_mirror_host() {
    mirror_for "${1:-bookworm}" | sed -E 's#^[a-z]+://([^/:]+).*#\1#'
}

# sbf_daemon_pids: processes of the sbfast-daemon build left anywhere on the host.
sbf_daemon_pids() {
    pgrep -f '^sleep 98765$' || true
}

# sbf_install_sid_sbuild ROOT LOG: sid's sbuild and libsbuild-perl over trixie's in the
# tree ROOT (sbf_make_tree trixie), their dependencies from trixie. sid's Release file
# expires within a week when nobody refreshes it (sid's Valid-Until), so the .debs come
# from sid's index read with check-valid-until=no: still verified against the archive
# keyring, as apt-get download verifies them; sid's index lives in a directory of its
# own and goes, so the tree's apt knows trixie only.
sbf_install_sid_sbuild() {
    local root=$1 log=$2 opts
    opts="-o Dir::Etc::SourceList=/srv/sid/sid.list -o Dir::Etc::SourceParts=/srv/sid/parts"
    opts+=" -o Dir::State::Lists=/srv/sid/lists -o Dir::Cache=/srv/sid/cache"
    mkdir -p "$root/srv/sid/parts" "$root/srv/sid/lists/partial" "$root/srv/sid/cache/archives/partial"
    echo "deb [check-valid-until=no] $(mirror_for sid) sid main" > "$root/srv/sid/sid.list"
    # shellcheck disable=SC2016 # expanded by the inner shell
    chroot "$root" sh -euc 'cd /srv/sid && apt-get $1 update -q &&
        apt-get $1 download sbuild libsbuild-perl &&
        apt-get install -y -q --no-install-recommends ./sbuild_*_all.deb ./libsbuild-perl_*_all.deb' \
        sh "$opts" >> "$log" 2>&1 || { tail -n 20 "$log"; fail "installing sid's sbuild in the trixie tree"; }
    rm -rf "$root/srv/sid"
}

# sbf_make_escape_packages DIR SECRET OWNER: in DIR, sbfast-escapedep_1.0_all.deb, whose
# postinst (run by apt as the chroot's root) tries every way out of the chroot to the
# host file SECRET (it holds SBFAST-HOST-SECRET): SECRET's path itself, /proc/1/root,
# /proc/PID/root and cwd of every process it sees, every directory descriptor of those
# processes (a descriptor inherited from sbuild), and chroot("x"), chdir("..") x 64,
# chroot("."), which also tries to write next to SECRET; it prints
# SBFAST-ESCAPE-<WAY>-REACHED or -BLOCKED for each and always succeeds; and the source
# package sbfast-escape, which build-depends on it. OWNER (chown's USER: or UID:GID)
# gets the files.
sbf_make_escape_packages() {
    local dir=$1 secret=$2 owner=$3 d
    d=$dir/escapedep
    mkdir -p "$d/DEBIAN"
    printf "%s\n" "Package: sbfast-escapedep" "Version: 1.0" "Architecture: all" \
        "Maintainer: sbuild-fast test <test@example.org>" \
        "Description: tries to leave the chroot from its postinst" > "$d/DEBIAN/control"
    cat > "$d/DEBIAN/postinst" <<POSTINST
#!/usr/bin/perl
use strict;
use warnings;
my \$secret = "$secret";
(my \$dir = \$secret) =~ s{/[^/]*\$}{};
my \$up = "../" x 64;
sub reads { open(my \$f, "<", \$_[0]) or return 0; my \$l = <\$f> // ""; return \$l =~ /SBFAST-HOST-SECRET/ ? 1 : 0; }
my %r;
print "SBFAST-ESCAPE-PROBE-RAN\n";
\$r{PATH} = reads(\$secret);
\$r{PROC1ROOT} = reads("/proc/1/root\$secret");
my @pids = map { m{^/proc/([0-9]+)\$} ? \$1 : () } glob("/proc/[0-9]*");
\$r{PROCROOT} = grep { reads("/proc/\$_/root\$secret") || reads("/proc/\$_/cwd/\$up\$secret") } @pids;
\$r{FD} = grep { -d \$_ && (reads("\$_/\$up\$secret") || reads("\$_/" . (\$secret =~ s{.*/}{}r))) } glob("/proc/[0-9]*/fd/*");
my \$pid = fork();
if (\$pid == 0) {
    mkdir "/sbfast-escape-x";
    chroot("/sbfast-escape-x") or exit 2;
    chdir("..") for 1 .. 64;
    chroot(".") or exit 2;
    if (open(my \$w, ">", "\$dir/written-by-the-build")) { print \$w "escaped\n"; close \$w; }
    exit(reads(\$secret) ? 0 : 1);
}
waitpid(\$pid, 0);
\$r{CHROOT} = \$? == 0 ? 1 : 0;
rmdir "/sbfast-escape-x";
print "SBFAST-ESCAPE-\$_-", (\$r{\$_} ? "REACHED" : "BLOCKED"), "\n" for sort keys %r;
exit 0;
POSTINST
    chmod 755 "$d/DEBIAN/postinst"
    dpkg-deb --root-owner-group -b "$d" "$dir/sbfast-escapedep_1.0_all.deb" > /dev/null
    d=$dir/sbfast-escape-1.0
    mkdir -p "$d/debian/source"
    echo "3.0 (native)" > "$d/debian/source/format"
    printf "%s\n" "Source: sbfast-escape" "Section: misc" "Priority: optional" \
        "Maintainer: sbuild-fast test <test@example.org>" \
        "Build-Depends: debhelper-compat (= 13), sbfast-escapedep" "Standards-Version: 4.6.2" \
        "Rules-Requires-Root: no" "" "Package: sbfast-escape" "Architecture: all" \
        "Depends: \${misc:Depends}" "Description: sbuild-fast test package" \
        " Built by the sbuild-fast tests of the session's containment." > "$d/debian/control"
    printf "sbfast-escape (1.0) unstable; urgency=medium\n\n  * Test.\n\n -- sbuild-fast test <test@example.org>  Sat, 21 Nov 2026 22:00:00 +0000\n" \
        > "$d/debian/changelog"
    printf "#!/usr/bin/make -f\n%%:\n\tdh \$@\n" > "$d/debian/rules"
    chmod +x "$d/debian/rules"
    (cd "$dir" && dpkg-source -b sbfast-escape-1.0 > /dev/null)
    chown -R "$owner" "$dir"
}

# sbf_escape_ways LOG: the ways out that the probe in LOG reached ("" when none), and
# fails unless the probe ran.
sbf_escape_ways() {
    grep -q '^SBFAST-ESCAPE-PROBE-RAN' "$1" || fail "the escape probe did not run: $(tail -n 20 "$1")"
    sed -n 's/^SBFAST-ESCAPE-\([A-Z0-9]*\)-REACHED$/\1/p' "$1" | tr '\n' ' ' | sed 's/ $//'
}
