#!/bin/sh
# apt-get update, then apt-get install PACKAGE..., taking turns with every other install of the test set-up
# (tests/system_packages.sh, tests/browser_setup.sh, tests/slurm/cluster.sh, tests/loopback.sh): `make test -j3`
# starts its prerequisites side by side, and apt-get fails at once on a lock another apt-get holds ("Could not
# get lock /var/lib/apt/lists/lock"). Ours wait on one flock(1) file; an apt-get outside them (unattended
# upgrades) is waited for by apt's own DPkg::Lock::Timeout (install) and by retrying update, whose lists lock
# apt 2.6 does not wait on.
#
#   sh tests/apt_install.sh [--no-install-recommends] PACKAGE...
#
# Exit status: apt-get's (0 installed). Needs root and apt-get: the callers check both first.
set -eu
[ "$#" -gt 0 ] || { echo "usage: sh tests/apt_install.sh [--no-install-recommends] PACKAGE..." >&2; exit 2; }
LOCK=${SPCLI_APT_LOCK:-/tmp/spcli-apt.lock}
WAIT_S=600
exec 9>"$LOCK"
if command -v flock >/dev/null 2>&1; then
    flock -w "$WAIT_S" 9 || { echo "apt_install: $LOCK held for ${WAIT_S}s by another install" >&2; exit 1; }
fi
export DEBIAN_FRONTEND=noninteractive
tries=0
until apt-get -o DPkg::Lock::Timeout="$WAIT_S" update -qq; do
    tries=$((tries + 1))
    [ "$tries" -lt 6 ] || { echo "apt_install: apt-get update failed $tries times" >&2; exit 1; }
    echo "apt_install: apt-get update failed (another apt-get holding its lists lock?); again in 10 s" >&2
    sleep 10
done
apt-get -o DPkg::Lock::Timeout="$WAIT_S" install -y -qq "$@" >/dev/null
