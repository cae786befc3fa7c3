#!/bin/sh
# Installs Debian's chromium for the browser tests in tests/test_inspect_html.py (they skip without it).
# Does nothing when a chromium is already on PATH. Without root or apt-get it says so and exits 0: the browser
# tests skip, and tests/skips.py allows that skip only on such a machine. Where it could install (root, apt-get)
# and the install fails, it exits 1. `make test` installs chromium with the other system packages
# (tests/system_packages.sh); by hand: sh tests/browser_setup.sh
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "browser_setup: not root or no apt-get; the browser tests will be skipped (install Debian's chromium to run them)" >&2
    exit 0
fi
if sh "$(dirname "$0")/apt_install.sh" chromium; then
    echo "browser_setup: installed $(chromium --version 2>/dev/null)" >&2
else
    echo "browser_setup: apt-get could not install chromium" >&2
    exit 1
fi
