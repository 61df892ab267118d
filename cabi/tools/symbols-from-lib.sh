#!/usr/bin/env bash
# Prints the public symbols a shared library defines, as NAME@@VERSION, sorted:
# those at their default version. Hidden compatibility aliases (NAME@VERSION)
# and unversioned symbols are left out.
#
#   tools/symbols-from-lib.sh /usr/lib/x86_64-linux-gnu/libibverbs.so.1 > symbols.txt
#
# symbols.txt is this output for Debian bookworm's libibverbs1 44.0-2.
set -euo pipefail
lib=${1:?usage: $0 LIBRARY.so}
readelf --dyn-syms -W "$lib" | awk '$7 != "UND" && $8 ~ /@@/ { print $8 }' | LC_ALL=C sort -u
