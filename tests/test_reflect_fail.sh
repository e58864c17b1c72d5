#!/usr/bin/env bash
# test_reflect_fail.sh — the build-time reflection tool (gen/reflect.c) must refuse broken
# kernel templates with a one-line message that names the file, the line and the problem,
# and must accept a good one.
#
# usage: test_reflect_fail.sh PATH/TO/mj_reflect SRCDIR
#
# Each case writes a small template into a scratch directory, runs the tool on it and
# checks the exit status and stderr against an extended regular expression.
set -u

if [ $# -ne 2 ]; then
    echo "usage: $0 PATH/TO/mj_reflect SRCDIR" >&2
    exit 2
fi
tool=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

passed=0
failed=0

# reflect FILE...: run the tool with the project's preludes, outputs into $work/out.
reflect() {
    mkdir -p "$work/out"
    "$tool" --root "$work" \
        --reflect-prelude "$src/gen/reflect_prelude.h" \
        --prelude-cuda "$src/templates/prelude_cuda.h" \
        --out-c "$work/out/mj_registry.c" --out-h "$work/out/mj_kernels.h" "$@"
}

ok() { passed=$((passed + 1)); echo "ok   $1"; }
bad() {
    failed=$((failed + 1))
    echo "FAIL $1: $2"
    [ -s "$work/$1.err" ] && sed 's/^/     | /' "$work/$1.err"
}

# expect_fail NAME REGEX: the template text comes on stdin (written to $work/NAME.cu);
# the tool must exit non-zero and its stderr must match REGEX.
expect_fail() {
    local name=$1 regex=$2
    cat >"$work/$name.cu"
    if reflect "$work/$name.cu" 2>"$work/$name.err" >/dev/null; then
        bad "$name" "the tool accepted the template"
    elif ! grep -Eq -- "$regex" "$work/$name.err"; then
        bad "$name" "stderr does not match /$regex/"
    else
        ok "$name"
    fi
}

# The declarations every good template opens with; cases below vary them.
head='MJ_TEMPLATE(t, "a test template")
MJ_TARGETS("sm_80 sm_120a")
MJ_KNOB_RANGE(BLOCK, int, 32, 256, "threads per block")'
kernel='MJ_KERNEL void k(int n, float *y) { if ((int)threadIdx.x < n) y[threadIdx.x] = BLOCK; }'

expect_fail no_template 'no_template\.cu:[0-9]+: error: .*MJ_TEMPLATE' <<EOF
MJ_TARGETS("sm_80")
$kernel
EOF

expect_fail two_templates 'two_templates\.cu:2: error: .*second MJ_TEMPLATE' <<EOF
MJ_TEMPLATE(first, "one")
MJ_TEMPLATE(second, "two")
MJ_TARGETS("sm_80")
MJ_KNOB_RANGE(BLOCK, int, 32, 256, "threads per block")
$kernel
EOF

expect_fail unknown_target "unknown_target\.cu:2: error: .*unknown target 'sm_75'" <<EOF
MJ_TEMPLATE(t, "a test template")
MJ_TARGETS("sm_80 sm_75")
MJ_KNOB_RANGE(BLOCK, int, 32, 256, "threads per block")
$kernel
EOF

expect_fail range_lo_gt_hi 'range_lo_gt_hi\.cu:3: error: .*BLOCK.*LO 512 > HI 256' <<EOF
MJ_TEMPLATE(t, "a test template")
MJ_TARGETS("sm_80")
MJ_KNOB_RANGE(BLOCK, int, 512, 256, "threads per block")
$kernel
EOF

expect_fail duplicate_knob 'duplicate_knob\.cu:4: error: .*duplicate knob name BLOCK' <<EOF
$head
MJ_KNOB_SET(BLOCK, int, "64 128", "threads per block again")
$kernel
EOF

expect_fail syntax_error 'syntax_error\.cu:6:[0-9]+: error: ' <<EOF
$head

MJ_KERNEL void k(int n, float *y) {
    int i = (int)threadIdx.x
    if (i < n) y[i] = BLOCK;
}
EOF

expect_fail struct_param 'struct_param\.cu:5: error: kernel k: parameter p has type .*struct' <<EOF
$head
struct pair { int a, b; };
MJ_KERNEL void k(struct pair p, float *y) { y[0] = p.a + BLOCK; }
EOF

expect_fail non_void_kernel 'non_void_kernel\.cu:4: error: kernel k returns int' <<EOF
$head
MJ_KERNEL int k(int n, float *y) { return n + BLOCK; }
EOF

expect_fail no_kernel 'no_kernel\.cu:[0-9]+: error: no MJ_KERNEL' <<EOF
$head
MJ_DEVICE int helper(int v) { return v * BLOCK; }
EOF

# A few more ways to get the declarations wrong.
expect_fail no_targets 'no_targets\.cu:[0-9]+: error: .*MJ_TARGETS' <<EOF
MJ_TEMPLATE(t, "a test template")
MJ_KNOB_RANGE(BLOCK, int, 32, 256, "threads per block")
$kernel
EOF

expect_fail bad_knob_type "bad_knob_type\.cu:3: error: knob BLOCK: type 'float'" <<EOF
MJ_TEMPLATE(t, "a test template")
MJ_TARGETS("sm_80")
MJ_KNOB_RANGE(BLOCK, float, 32, 256, "threads per block")
$kernel
EOF

expect_fail set_repeats 'set_repeats\.cu:3: error: knob BLOCK: value 64 listed twice' <<EOF
MJ_TEMPLATE(t, "a test template")
MJ_TARGETS("sm_80")
MJ_KNOB_SET(BLOCK, int, "64 128 64", "threads per block")
$kernel
EOF

expect_fail array_param 'array_param\.cu:4: error: kernel k: parameter y has type' <<EOF
$head
MJ_KERNEL void k(int n, float y[4]) { y[0] = n + BLOCK; }
EOF

# More kernels than the registry holds a template (MJ_MAX_KERNELS): refused at build time,
# not found at launch.
{
    echo "$head"
    for i in 1 2 3 4 5 6 7 8 9; do echo "MJ_KERNEL void k$i(int n, float *y) { y[0] = n + BLOCK; }"; done
} | expect_fail too_many_kernels 'too_many_kernels\.cu:12: error: template t defines 9 kernels; at most 8'

# Cross-knob constraints: each must parse and name only knobs declared before it.
expect_fail constraint_unknown_knob "constraint_unknown_knob\.cu:4: error: MJ_CONSTRAINT: unknown knob name at column 1 of \"VEC <= 4\"" <<EOF
$head
MJ_CONSTRAINT("VEC <= 4", "at most four")
$kernel
EOF
expect_fail constraint_syntax 'constraint_syntax\.cu:4: error: MJ_CONSTRAINT: expected .\).' <<EOF
$head
MJ_CONSTRAINT("(BLOCK % 32 == 0", "whole warps")
$kernel
EOF
expect_fail constraint_no_doc 'constraint_no_doc\.cu:4: error: MJ_CONSTRAINT\("BLOCK >= 64"\): say why in its doc' <<EOF
$head
MJ_CONSTRAINT("BLOCK >= 64", "")
$kernel
EOF

# A kernel name used by two templates.
cat >"$work/dup_a.cu" <<EOF
$head
$kernel
EOF
sed 's/MJ_TEMPLATE(t,/MJ_TEMPLATE(t2,/' "$work/dup_a.cu" >"$work/dup_b.cu"
if reflect "$work/dup_a.cu" "$work/dup_b.cu" 2>"$work/duplicate_kernel.err" >/dev/null; then
    bad duplicate_kernel "the tool accepted two kernels named k"
elif ! grep -Eq 'dup_[ab]\.cu:[0-9]+: error: kernel name k is also used in' "$work/duplicate_kernel.err"; then
    bad duplicate_kernel "stderr does not name the duplicate kernel"
else
    ok duplicate_kernel
fi

# A FIFO named as a template: refused at once by base/file.c's rule (a plain open would wait
# for a writer forever; timeout turns that into a failure here).
mkfifo "$work/fifo.cu"
mkdir -p "$work/out"
if timeout 60 "$tool" --root "$work" --reflect-prelude "$src/gen/reflect_prelude.h" \
        --prelude-cuda "$src/templates/prelude_cuda.h" \
        --out-c "$work/out/mj_registry.c" --out-h "$work/out/mj_kernels.h" "$work/fifo.cu" \
        2>"$work/fifo.err" >/dev/null; then
    bad fifo "the tool accepted a FIFO"
elif ! grep -Eq 'fifo\.cu is not a regular file \(a FIFO\): refused' "$work/fifo.err"; then
    bad fifo "stderr does not say the template is a FIFO"
else
    ok fifo
fi
rm -f "$work/fifo.cu"

# A good template: accepted, and the outputs name it.
cat >"$work/good.cu" <<EOF
$head
MJ_KNOB_SET(VEC, int, "1 2 4", "elements per thread")
MJ_CONSTRAINT("BLOCK % 32 == 0 && BLOCK * VEC <= 512 || VEC == 1", "whole warps, bounded work")
MJ_DEVICE float twice(float v) { return 2.0f * v; }
MJ_KERNEL void good_kernel(int n, const float *MJ_RESTRICT x, float *MJ_RESTRICT y) {
    int i = ((int)blockIdx.x * BLOCK + (int)threadIdx.x) * VEC;
    if (i < n) y[i] = twice(x[i]);
}
EOF
if ! reflect "$work/good.cu" 2>"$work/good.err"; then
    bad good "the tool refused a good template"
elif ! grep -q 'MJ_TPL_t = 0' "$work/out/mj_kernels.h" ||
     ! grep -q 'mj_launch_good_kernel' "$work/out/mj_kernels.h" ||
     ! grep -q 'typedef struct mj_knobs_t {' "$work/out/mj_kernels.h" ||
     ! grep -q '#define MJ_KNOB_t_VEC_MAX 4' "$work/out/mj_kernels.h" ||
     ! grep -q '.expr = "BLOCK % 32 == 0 && BLOCK \* VEC <= 512 || VEC == 1"' "$work/out/mj_registry.c" ||
     ! grep -q '.file = "good.cu"' "$work/out/mj_registry.c"; then
    bad good "the outputs do not describe the template"
else
    ok good
fi

# The preludes are embedded with their `#include "NAME"` lines replaced by NAME's text
# (templates/prelude_fp.h): NVRTC reads no files. A prelude naming a file that is not
# beside it, or one that includes itself, is refused at the line of the #include.
# prelude_case NAME REGEX: the prelude text comes on stdin ($work/NAME.h); good.cu is the
# template; the tool must exit non-zero with stderr matching REGEX.
prelude_case() {
    local name=$1 regex=$2
    cat >"$work/$name.h"
    mkdir -p "$work/out"
    if "$tool" --root "$work" --reflect-prelude "$src/gen/reflect_prelude.h" --prelude-cuda "$work/$name.h" \
        --out-c "$work/out/p.c" --out-h "$work/out/p.h" "$work/good.cu" 2>"$work/$name.err" >/dev/null; then
        bad "$name" "the tool accepted the prelude"
    elif ! grep -Eq -- "$regex" "$work/$name.err"; then
        bad "$name" "stderr does not match /$regex/"
    else
        ok "$name"
    fi
}
prelude_case prelude_missing_include 'prelude_missing_include\.h:3: error: #include "no_such_fp\.h": cannot read' <<EOF
/* a prelude */
#define MJ_KERNEL
#include "no_such_fp.h"
EOF
prelude_case prelude_self_include 'prelude_self_include\.h:2: error: #include "prelude_self_include\.h": includes nest deeper' <<EOF
/* includes itself */
#include "prelude_self_include.h"
EOF
prelude_case prelude_include_path 'prelude_include_path\.h:1: error: #include "\.\./x\.h": a prelude includes only files beside it' <<EOF
#include "../x.h"
EOF
# The good run above embedded the project's CUDA prelude: prelude_fp.h's text, no #include.
if ! grep -q 'mj_e4m3_enc_c' "$work/out/mj_registry.c" || ! grep -q 'mj_e2m1_enc_c' "$work/out/mj_registry.c" ||
    grep -q 'include \\"prelude_fp' "$work/out/mj_registry.c"; then
    bad prelude_inlined "the embedded CUDA prelude does not hold templates/prelude_fp.h's text in place of its #include"
else
    ok prelude_inlined
fi

# The templates are named on the command line: a symbolic link there is followed (the rule in
# base/file.c), and the registry names the file it leads to.
mkdir -p "$work/linked"
ln -s ../good.cu "$work/linked/alias.cu"
if ! reflect "$work/linked/alias.cu" 2>"$work/linked.err"; then
    bad linked "the tool refused a template named through a symbolic link"
elif ! grep -q '.file = "good.cu"' "$work/out/mj_registry.c"; then
    bad linked "the registry does not name the file the link leads to"
else
    ok linked
fi

# MJ_PDL: every kernel of the template must wait on the grid before it (it is launched as a
# programmatic dependent); one that does not is refused, naming it; one that does is accepted
# and the registry marks the template.
expect_fail pdl_no_wait 'pdl_no_wait\.cu:6: error: kernel k2: the template declares MJ_PDL, so the kernel must call mj_grid_dep_wait' <<EOF
$head
MJ_PDL("waits")
MJ_KERNEL void k1(int n, float *y) { mj_grid_dep_wait(); if ((int)threadIdx.x < n) y[threadIdx.x] = BLOCK; }
MJ_KERNEL void k2(int n, float *y) { if ((int)threadIdx.x < n) y[threadIdx.x] = BLOCK; }
EOF
cat >"$work/pdl_ok.cu" <<EOF
$head
MJ_PDL("waits")
MJ_KERNEL void k(int n, float *y) { mj_grid_dep_wait(); if ((int)threadIdx.x < n) y[threadIdx.x] = BLOCK; }
EOF
if ! reflect "$work/pdl_ok.cu" 2>"$work/pdl_ok.err" >/dev/null; then
    bad pdl_ok "the tool refused a template whose kernels all wait"
elif ! grep -q '.pdl = 1' "$work/out/mj_registry.c"; then
    bad pdl_ok "the registry does not mark the MJ_PDL template"
else
    ok pdl_ok
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
