#!/usr/bin/env bash
# Install what the integration tests need (sshd, network namespaces, Open MPI,
# Slurm's daemons and client with munge for the namespace Slurm cluster,
# and headless Chromium with a font for the report's browser test)
# on a Debian/Ubuntu machine. Idempotent: does nothing when all is installed.
# Without root (or without apt) it only reports what is missing; the
# integration tests then skip, unless GPUVET_REQUIRE_CLUSTER=1 makes that an error.
set -euo pipefail

PACKAGES=(openssh-server openssh-client iproute2 openmpi-bin libopenmpi-dev procps util-linux passwd
          chromium fonts-dejavu-core slurmctld slurmd slurm-client munge)

installed() {
    [ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null)" = "installed" ]
}

missing=()
if command -v dpkg-query >/dev/null 2>&1; then
    for pkg in "${PACKAGES[@]}"; do
        installed "$pkg" || missing+=("$pkg")
    done
else
    for tool in /usr/sbin/sshd ssh ssh-keygen ip mpirun pgrep nsenter unshare runuser useradd \
                chromium slurmctld slurmd srun munged; do
        command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
    done
fi

if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi

fail() {
    echo "test-deps: $1" >&2
    if [ "${GPUVET_REQUIRE_CLUSTER:-0}" = "1" ]; then
        exit 1
    fi
    echo "test-deps: the integration tests will be skipped" >&2
    exit 0
}

if ! command -v apt-get >/dev/null 2>&1; then
    fail "missing ${missing[*]} and no apt-get to install them"
fi
if [ "$(id -u)" -ne 0 ]; then
    fail "missing ${missing[*]}; run as root: sudo $0"
fi

echo "test-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
