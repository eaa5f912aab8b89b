# Sourced by integration tests: skips, failures, and booted systemd-nspawn containers.
# shellcheck shell=bash

skip() { echo "SKIP: $*" >&2; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }
ok() { echo "ok: $*"; }

require_root() { [ "$(id -u)" = 0 ] || skip "needs root"; }
require_cmd() {
    local c
    for c in "$@"; do command -v "$c" >/dev/null || skip "$c is not installed"; done
}

# The .debs built by 'make build' (DEBADMIN_DEBS, set by tests/integration/run).
debs_dir() {
    local dir=${DEBADMIN_DEBS:-}
    if [ -z "$dir" ] || ! ls "$dir"/python3-debadmin_*.deb >/dev/null 2>&1; then
        skip "no built packages in '${dir:-DEBADMIN_DEBS unset}': run 'make build' first"
    fi
    echo "$dir"
}

# mirror_for RELEASE: the archive the host's apt uses (deb.debian.org by default).
mirror_for() {
    local uri
    uri=$(sed -n 's/^URIs: *\([^ ]*debian\)\/\?$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1)
    echo "${uri:-http://deb.debian.org/debian}"
}

# ct_make_root RELEASE DIR PKG,PKG [mmdebstrap options...]: a bootable tree.
ct_make_root() {
    local release=$1 dir=$2 pkgs=$3
    shift 3
    # shellcheck disable=SC2016 # $1 is mmdebstrap's, expanded by its hook
    mmdebstrap --quiet --variant=minbase \
        --include="systemd,systemd-sysv,dbus,$pkgs" \
        --customize-hook='echo debadmin-test > "$1/etc/hostname"' \
        "$@" "$release" "$dir" "$(mirror_for "$release")" ||
        fail "mmdebstrap $release failed"
}

CT_PID=""
CT_NSPAWN_PID=""
CT_LOG=""

# ct_boot DIR LOG [nspawn options...]: boot DIR, wait until systemd is up.
ct_boot() {
    local dir=$1 state
    CT_LOG=$2
    shift 2
    systemd-nspawn -D "$dir" --boot --register=no --keep-unit --console=read-only \
        --link-journal=no "$@" >"$CT_LOG" 2>&1 &
    CT_NSPAWN_PID=$!
    for _ in $(seq 1 120); do
        # Only the container's init: nspawn's short-lived intermediate child is a child too.
        CT_PID=$(pgrep -x -P "$CT_NSPAWN_PID" systemd | head -n1 || true)
        [ -n "$CT_PID" ] && break
        sleep 0.5
    done
    [ -n "$CT_PID" ] || { tail -n 30 "$CT_LOG"; fail "container did not start"; }
    for _ in $(seq 1 120); do
        state=$(ct systemctl is-system-running 2>/dev/null || true)
        case $state in running|degraded) return 0 ;; esac
        sleep 0.5
    done
    tail -n 30 "$CT_LOG"
    fail "container did not finish booting (state: $state)"
}

# ct CMD...: run a command inside the booted container.
ct() { nsenter --target "$CT_PID" --all --wdns=/ -- env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C.UTF-8 "$@"; }

ct_stop() {
    [ -n "$CT_NSPAWN_PID" ] || return 0
    kill -TERM "$CT_NSPAWN_PID" 2>/dev/null || true
    for _ in $(seq 1 60); do
        kill -0 "$CT_NSPAWN_PID" 2>/dev/null || break
        sleep 0.5
    done
    kill -KILL "$CT_NSPAWN_PID" 2>/dev/null || true
    wait "$CT_NSPAWN_PID" 2>/dev/null || true
    CT_NSPAWN_PID="" CT_PID=""
}
