#!/bin/sh
# Runs a command (the Makefile's pytest runs) where only loopback is up: in a network namespace of its own
# (`unshare -n`, then `ip link set lo up`). Ray binds its cluster to the machine's interface address even when
# asked for 127.0.0.1 (ray.init(_node_ip_address=...), `ray start --node-ip-address`); in the namespace it
# binds 127.0.0.1, and so do the Slurm daemons and vLLM's engine: test traffic cannot leave the machine.
#
#   sh tests/loopback.sh .venv/bin/python -m pytest -q tests/test_ray_run.py
#
# Needs root, unshare (util-linux) and ip (iproute2: installed with apt-get when missing). Where any of it is
# missing or `unshare -n` is refused (an unprivileged container), the command runs as is after a note saying
# why. Nothing inside the namespace reaches PyPI or the Debian archive: installs happen before (the Makefile's
# prerequisites). The command sees SPCLI_NETNS: `loopback` inside the namespace, `shared: <why>` where it runs
# as is; tests/conftest.py's ray_cluster fails on a non-loopback Ray address unless it says `shared`.
# Daemons stay in the namespace they started in: a Slurm cluster a run leaves up (SLURM_CI_KEEP=1, a killed run)
# is reachable only from there, and one up outside cannot be reached from inside (its `tests/slurm/cluster.sh up`
# times out); `tests/slurm/cluster.sh down`, from anywhere, stops it.
set -eu

if [ "$#" = 0 ]; then
    echo "usage: sh tests/loopback.sh COMMAND [ARG...]" >&2
    exit 2
fi
if [ "${SPCLI_NETNS:-}" = loopback ]; then  # called from inside one already
    exec "$@"
fi

as_is() {
    echo "loopback.sh: running without a network namespace of its own ($1): the tests may bind the machine's addresses" >&2
    SPCLI_NETNS="shared: $1"
    export SPCLI_NETNS
    shift
    exec "$@"
}

why=""
if [ "$(id -u)" != 0 ]; then
    why="not root"
elif ! command -v unshare >/dev/null 2>&1; then
    why="no unshare (util-linux)"
elif ! command -v ip >/dev/null 2>&1; then
    if ! command -v apt-get >/dev/null 2>&1; then
        why="no ip (iproute2) and no apt-get to install it"
    else
        echo "loopback.sh: installing iproute2 (for ip)" >&2
        sh "$(dirname "$0")/apt_install.sh" iproute2 || why="no ip (iproute2), and apt-get could not install it"
    fi
fi
if [ -z "$why" ] && ! err=$(unshare -n true 2>&1); then
    why="unshare -n refused: $err"
fi
if [ -n "$why" ]; then
    as_is "$why" "$@"
fi

SPCLI_NETNS=loopback
export SPCLI_NETNS
# lo gets a second address, 127.0.0.2: glibc's getaddrinfo(AI_ADDRCONFIG) counts no IPv4 address where 127.0.0.1
# is the only one, and slurmdbd's listening socket asks for IPv4 that way ("Name or service not known", then exit)
exec unshare -n sh -c 'ip link set lo up && ip addr add 127.0.0.2/8 dev lo ||
    { echo "loopback.sh: cannot bring lo up in the namespace" >&2; exit 1; }
exec "$@"' loopback.sh "$@"
