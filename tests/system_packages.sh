#!/bin/sh
# The Debian packages the test suite needs, installed one after another before the tests enter their network
# namespace (tests/loopback.sh: no archive there): chromium (tests/test_inspect_html.py's browser tests), Slurm's
# packages (tests/slurm/cluster.sh: the real cluster), iproute2 (tests/loopback.sh's `ip`). The Makefile's
# system-packages target, a prerequisite of both suites.
#
# Exit 0: everything is there, or was installed; or it cannot be installed here (not root, no apt-get): that
# is said, the tests that need it skip with that reason, and tests/skips.py allows those skips only on such a
# machine. Exit 1: this machine could install (root, apt-get) and the install failed: `make test` fails.
set -eu
cd "$(dirname "$0")/.."

missing=""
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || missing=" chromium"
slurm_missing=""
for package in $(bash tests/slurm/cluster.sh packages); do
    dpkg -s "$package" >/dev/null 2>&1 || slurm_missing="$slurm_missing $package"
done
command -v ip >/dev/null 2>&1 || missing="$missing iproute2"
[ -n "$missing$slurm_missing" ] || exit 0

why=""
if [ "$(id -u)" != 0 ]; then
    why="not root"
elif ! command -v apt-get >/dev/null 2>&1; then
    why="no apt-get"
fi
if [ -n "$why" ]; then
    echo "system_packages: cannot install$missing$slurm_missing ($why): the tests that need them will skip, saying so" >&2
    exit 0
fi
if [ -n "$missing" ]; then
    echo "system_packages: installing$missing" >&2
    # shellcheck disable=SC2086
    sh tests/apt_install.sh $missing || { echo "system_packages: apt-get could not install$missing" >&2; exit 1; }
fi
if [ -n "$slurm_missing" ]; then
    bash tests/slurm/cluster.sh install || { echo "system_packages: Slurm's packages failed to install" >&2; exit 1; }
fi
