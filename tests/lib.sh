# lib.sh — what the shell tests (driver.sh, test_gpu_scripts.sh) share, sourced once their
# arguments are made absolute: they run in a new temporary directory, removed on exit, and
# count checks with ok/bad; finish prints "N passed, N failed" and its status is the test's.
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
cd "$T" || exit 1
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
finish() {
    echo "$pass passed, $fail failed"
    [ "$fail" = 0 ]
}
