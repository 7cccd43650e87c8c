#!/usr/bin/env bash
# The Debian chroots CI runs the suite in: CPython 3.14 and 3.15 from Debian
# sid (Debian 12's libc is too old for them), and linux arm64 (bookworm's
# python3, 3.11) under qemu-user.  Needs root, as CI is.
#
#   scripts/ci_chroot.sh provision sid|arm64|dev     # make it, or reuse it if complete
#   scripts/ci_chroot.sh run sid|arm64|dev CMD...    # run CMD inside, in the repository
#   scripts/ci_chroot.sh path sid|arm64|dev          # where it lives
#
# dev is not CI's: sid's interpreters plus valgrind and the host's pyenv
# CPython 3.11 and 3.13 (bound in read-only at their own paths, with the
# libraries their modules load), so that benchmarks/interpreter_table.sh
# measures 3.11, 3.13, 3.14 and 3.15 with one gcc and one libc.
#
# SPANPACK_CHROOTS (default /var/cache/spanpack/chroots) holds them, as ci-sid,
# ci-arm64 and ci-dev.  A chroot is complete when its marker file holds this script's
# recipe for it; provisioning writes the marker last, so an interrupted run is
# picked up (or, before debootstrap finished, started over) by the next one.
#
# Mounts: every mount (/proc, /sys, /dev, the repository, the host's pip
# sources) is made inside a private mount namespace (unshare) that lives only as
# long as the command, so none is ever left behind and none is visible from the
# host: nothing outside the namespace (an rm -rf of a chroot included) can
# reach the host's files through one.
set -euo pipefail

CHROOTS="${SPANPACK_CHROOTS:-/var/cache/spanpack/chroots}"
MIRROR="${SPANPACK_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

die() { echo "ci_chroot: $*" >&2; exit 1; }
log() { echo "ci_chroot: $*" >&2; }

# --- what each chroot is -----------------------------------------------------
recipe() {
    EXTRA_BINDS=""
    case "$1" in
        sid)
            SUITE=sid ARCH=amd64
            PACKAGES="ca-certificates gcc libc6-dev python3.14 python3.14-dev python3.14-venv python3.15 python3.15-dev python3.15-venv"
            ;;
        dev)
            SUITE=sid ARCH=amd64
            PACKAGES="ca-certificates gcc libc6-dev python3.14 python3.14-dev python3.14-venv python3.15 python3.15-dev python3.15-venv valgrind libssl3t64 zlib1g libbz2-1.0 liblzma5 libffi8 libsqlite3-0 libuuid1"
            for minor in 3.11 3.13; do
                HOST_PYTHON="$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/$minor.* 2>/dev/null | sort -V | tail -n 1)"
                [ -n "$HOST_PYTHON" ] || die "dev: no pyenv CPython $minor on the host (${PYENV_ROOT:-$HOME/.pyenv}/versions/$minor.*)"
                EXTRA_BINDS="$EXTRA_BINDS $HOST_PYTHON"
            done
            ;;
        arm64)
            SUITE=bookworm ARCH=arm64
            PACKAGES="ca-certificates gcc libc6-dev python3 python3-dev python3-venv"
            ;;
        *) die "unknown chroot '$1' (sid, arm64 or dev)" ;;
    esac
    DIR="$CHROOTS/ci-$1"
    MARKER="$DIR/.spanpack-provisioned"
    BOOTSTRAPPED="$DIR/.spanpack-debootstrapped"
    RECIPE="suite=$SUITE arch=$ARCH packages=$PACKAGES"
}

# --- host side ----------------------------------------------------------------
need_root() { [ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot, mount)"; }

# CI provisions both chroots at once, and on a fresh machine both need host
# packages: one host apt at a time (flock), and apt itself waits for dpkg's
# lock rather than failing when something else holds it.
apt_install_host() {
    log "installing on the host: $*"
    (
        flock 8
        local apt=(apt-get -o DPkg::Lock::Timeout=600)
        DEBIAN_FRONTEND=noninteractive "${apt[@]}" install -y --no-install-recommends "$@" >&2 \
            || { "${apt[@]}" update >&2 && DEBIAN_FRONTEND=noninteractive "${apt[@]}" install -y --no-install-recommends "$@" >&2; }
    ) 8>/var/lock/spanpack-host-apt.lock
}

host_tools() {
    command -v debootstrap >/dev/null || apt_install_host debootstrap
    command -v unshare >/dev/null || die "unshare (util-linux) not found"
    [ "$ARCH" = amd64 ] && return 0
    # arm64 binaries run through qemu-user; the F flag has the kernel open the
    # interpreter when it is registered, so it works inside the chroot too.
    if [ ! -e /usr/libexec/qemu-binfmt/aarch64-binfmt-P ] && ! command -v qemu-aarch64-static >/dev/null; then
        apt_install_host qemu-user-static binfmt-support
    fi
    command -v update-binfmts >/dev/null || apt_install_host binfmt-support
    if [ ! -e /proc/sys/fs/binfmt_misc/status ]; then
        mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
    fi
    [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || update-binfmts --enable qemu-aarch64 >&2 || true
    local entry=/proc/sys/fs/binfmt_misc/qemu-aarch64
    [ -e "$entry" ] || die "no qemu-aarch64 binfmt handler after update-binfmts --enable qemu-aarch64"
    grep -qx enabled "$entry" || update-binfmts --enable qemu-aarch64 >&2
    grep -q '^flags: .*F' "$entry" || die "the qemu-aarch64 binfmt handler lacks the F flag: $(grep flags "$entry")"
}

# Mount points made inside the namespace; each also exists as an empty
# directory in the chroot.  Read-only binds for what pip reads.
PIP_SOURCES="/opt/pypi /opt/pypi-more /opt/wheels"

# Copies of the host's files that apt and pip inside need: DNS, CA
# certificates, pip's configuration (index and find-links pointing at the
# PIP_SOURCES bound in at the same paths, constraints).  Each file is replaced
# atomically (another run may be reading it), and only when it differs.
copy_in() {
    local source=$1 target="$DIR$1"
    if [ -d "$source" ]; then
        local file
        for file in "$source"/*; do [ -e "$file" ] && copy_in "$file"; done
        return 0
    fi
    cmp -s "$source" "$target" 2>/dev/null && return 0
    mkdir -p "$(dirname "$target")"
    cp -L "$source" "$target.spanpack-new.$$"
    mv -f "$target.spanpack-new.$$" "$target"
}

sync_host_files() {
    local source
    for source in /etc/resolv.conf /usr/local/share/ca-certificates \
        /etc/pip.conf /etc/xdg/pip /root/.config/pip /root/.pip; do
        [ -e "$source" ] && copy_in "$source"
    done
    return 0
}

# Runs "$@" (a command for the chroot) in a private mount namespace with
# /proc, /sys, /dev, the repository, the pip sources and the recipe's
# EXTRA_BINDS mounted (all but the repository read-only).
in_chroot() {
    local binds="$ROOT"
    local source
    for source in $PIP_SOURCES $EXTRA_BINDS; do [ -d "$source" ] && binds="$binds $source"; done
    unshare --mount --propagation private -- /bin/bash -euc '
        dir=$1 root=$2 binds=$3; shift 3
        mount -t proc proc "$dir/proc"
        mount -t sysfs sysfs "$dir/sys"
        mount --bind /dev "$dir/dev"
        mount -t tmpfs -o mode=1777 tmpfs "$dir/dev/shm"
        mount -t devpts -o newinstance,ptmxmode=0666 devpts "$dir/dev/pts"
        mkdir -p "$dir/tmp"
        for source in $binds; do
            mkdir -p "$dir$source"
            mount --bind "$source" "$dir$source"
            [ "$source" = "$root" ] || mount -o remount,bind,ro "$dir$source"
        done
        exec chroot "$dir" /usr/bin/env -i \
            HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
            LANG=C.UTF-8 TERM="${TERM:-dumb}" DEBIAN_FRONTEND=noninteractive \
            SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
            REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt \
            PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 ${PIP_DEFAULT_TIMEOUT:+PIP_DEFAULT_TIMEOUT=$PIP_DEFAULT_TIMEOUT} \
            ${PIP_FIND_LINKS:+PIP_FIND_LINKS="$PIP_FIND_LINKS"} ${PIP_INDEX_URL:+PIP_INDEX_URL="$PIP_INDEX_URL"} \
            ${PIP_EXTRA_INDEX_URL:+PIP_EXTRA_INDEX_URL="$PIP_EXTRA_INDEX_URL"} \
            ${CI:+CI="$CI"} ${SPANPACK_CI_ENV:-} \
            /bin/bash -c "cd \"\$0\" && exec \"\$@\"" "$root" "$@"
    ' ci_chroot "$DIR" "$ROOT" "$binds" "$@"
}

# Removes an incomplete chroot.  Mounts only ever exist inside the
# namespaces above, but check: refuse if anything is mounted below it here.
remove_incomplete() {
    local real
    real="$(realpath "$DIR")"
    if awk -v d="$real/" 'index($5 "/", d) == 1 { found = 1 } END { exit !found }' /proc/self/mountinfo; then
        die "$DIR has something mounted below it; not removing it (unmount first)"
    fi
    log "removing the incomplete $DIR"
    rm -rf --one-file-system "${DIR:?}"
}

complete() { [ -f "$MARKER" ] && [ "$(cat "$MARKER")" = "$RECIPE" ]; }

provision() {
    need_root
    host_tools
    mkdir -p "$CHROOTS"
    if complete; then
        log "reusing $DIR"
        return 0
    fi
    exec 9>"$DIR.lock"
    flock 9  # one provisioner per chroot; `run` waits for it too
    if complete; then
        log "reusing $DIR (provisioned by another run meanwhile)"
        return 0
    fi
    local start=$SECONDS
    if [ -e "$DIR" ] && [ ! -f "$BOOTSTRAPPED" ]; then
        remove_incomplete
    fi
    if [ ! -e "$DIR" ]; then
        log "debootstrap $SUITE ($ARCH) into $DIR"
        debootstrap --arch="$ARCH" --variant=minbase "$SUITE" "$DIR" "$MIRROR" >&2
        echo "suite=$SUITE arch=$ARCH" >"$BOOTSTRAPPED"
        log "debootstrap done in $((SECONDS - start)) s"
    fi
    # sid's Release file on the mirror is past its Valid-Until date.
    cat >"$DIR/etc/apt/apt.conf.d/90spanpack" <<'EOF'
Acquire::Check-Valid-Until "false";
APT::Install-Recommends "false";
APT::Get::Assume-Yes "true";
EOF
    sync_host_files
    local apt_start=$SECONDS
    # shellcheck disable=SC2086
    in_chroot /bin/sh -c "apt-get update && apt-get install $PACKAGES && update-ca-certificates && apt-get clean" >&2
    log "apt inside done in $((SECONDS - apt_start)) s"
    echo "$RECIPE" >"$MARKER"
    log "$DIR provisioned in $((SECONDS - start)) s"
}

run() {
    need_root
    host_tools
    complete || die "$DIR is not provisioned (scripts/ci_chroot.sh provision $NAME)"
    exec 9>"$DIR.lock"
    flock -s 9  # not while a provisioner works on it
    sync_host_files
    in_chroot "$@"
}

[ $# -ge 2 ] || die "usage: $0 provision|run|path sid|arm64|dev [CMD...]"
ACTION=$1 NAME=$2
shift 2
recipe "$NAME"
case "$ACTION" in
    provision) provision ;;
    run) [ $# -gt 0 ] || die "run: no command"; run "$@" ;;
    path) echo "$DIR" ;;
    *) die "unknown action '$ACTION'" ;;
esac
