#!/bin/sh
# Installs Debian's chromium for the browser tests in tests/test_inspect_html.py (they skip without it).
# Needs root and the Debian archive; does nothing when a chromium is already on PATH, and never
# fails the build: without chromium the browser tests skip and say why.
# Called from the Makefile's test target; by hand: sh tests/browser_setup.sh
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "browser_setup: not root or no apt-get; the browser tests will be skipped (install Debian's chromium to run them)" >&2
    exit 0
fi
if apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; then
    echo "browser_setup: installed $(chromium --version 2>/dev/null)" >&2
else
    echo "browser_setup: could not install chromium; the browser tests will be skipped" >&2
fi
exit 0
