#!/usr/bin/env bash
# case_names.sh LIST — the ctest tests of each program's cases are its cases: CMakeLists.txt
# reads the names from the TEST_CASE lines of tests/PROG.c and writes LIST, a line a program
# ("path name name ..."); each must be what the program lists (--list), in its order. A case
# the reading misses (two on a line, a name from a macro) would never run under ctest.
set -u
bad=0 n=0
while read -r prog names; do
    [ -n "$prog" ] || continue
    n=$((n + 1))
    listed=$("$prog" --list | tr '\n' ' ')
    listed=${listed% }
    if [ "$listed" != "$names" ]; then
        echo "$(basename "$prog"): ctest runs the cases [$names], --list says [$listed]: configure again" \
            "(cmake), or write each TEST_CASE(\"name\", fn) on a line of its own" >&2
        bad=1
    fi
done <"$1"
[ "$n" -gt 0 ] || { echo "no programs in $1" >&2; exit 1; }
[ "$bad" = 0 ] && echo "the ctest cases of $n programs are the ones they list"
exit "$bad"
