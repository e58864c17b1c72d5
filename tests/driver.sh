#!/usr/bin/env bash
# driver.sh — every subcommand and flag of `moejit`, run in a temporary directory.
# usage: driver.sh PATH/TO/moejit SOURCE_DIR PATH/TO/libcuda_stub.so
# Each check prints nothing when it passes; a failure prints what was expected. The last
# line is "N passed, N failed".
set -u
MJ=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
SRC=$(cd "$2" && pwd)
STUB=$(cd "$(dirname "$3")" && pwd)/$(basename "$3")
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# expect_rc WANT CMD...: the command's exit code is WANT; its stdout/stderr land in out/err.
expect_rc() {
    local want=$1
    shift
    "$@" >out 2>err
    local rc=$?
    if [ "$rc" = "$want" ]; then ok; else bad "rc $rc (want $want): $* :: $(head -c 400 err)"; fi
}
# expect_fail CMD...: non-zero exit, exactly one line on stderr, nothing on stdout.
expect_fail() {
    "$@" >out 2>err
    local rc=$?
    if [ "$rc" != 0 ] && [ "$(wc -l <err)" = 1 ] && [ ! -s out ]; then ok
    else bad "want one-line failure: rc $rc, stderr $(wc -l <err) lines: $* :: $(head -c 400 err)"; fi
}
contains() { # contains FILE TEXT
    if grep -qF -- "$2" "$1"; then ok; else bad "$1 lacks '$2': $(head -c 400 "$1")"; fi
}
# json_check EXPR: a Python expression over j (the JSON in out) that must be true.
json_check() {
    if python3 -c "import json,sys; j=json.load(open('out')); sys.exit(0 if ($1) else 1)"; then ok
    else bad "json check failed: $1 :: $(head -c 600 out)"; fi
}

# mknpy FILE DESCR SHAPE PACKFMT VALUES...: write a .npy (v1) with perl.
mknpy() {
    local f=$1 descr=$2 shape=$3 fmt=$4
    shift 4
    perl -e '
        my ($f, $descr, $shape, $fmt, @v) = @ARGV;
        my $d = "{\x27descr\x27: \x27$descr\x27, \x27fortran_order\x27: False, \x27shape\x27: $shape, }";
        my $pad = (64 - (10 + length($d) + 1) % 64) % 64;
        my $h = $d . (" " x $pad) . "\n";
        open(my $o, ">:raw", $f) or die;
        print $o "\x93NUMPY\x01\x00" . pack("v", length($h)) . $h;
        print $o pack("$fmt*", @v) if @v;
        close $o;' "$f" "$descr" "$shape" "$fmt" "$@"
}

# ---- top level --------------------------------------------------------------------------
expect_rc 0 "$MJ" --help;       contains out "usage: moejit"; contains out "route"; contains out "demo"
expect_rc 0 "$MJ" -h;           contains out "nvfp4"; contains out "bench"
expect_rc 0 "$MJ" --version;    contains out "moejit 0."
expect_rc 0 "$MJ" -V;           contains out "moejit 0."
expect_rc 2 "$MJ";              contains err "usage"
expect_rc 2 "$MJ" frobnicate;   contains err "unknown command"
for c in route nvfp4 demo; do
    expect_rc 0 "$MJ" $c --help; contains out "usage: moejit $c"
    expect_rc 0 "$MJ" $c -h;     contains out "usage: moejit $c"
    expect_rc 0 "$MJ" $c --version; contains out "moejit 0."
done

# ---- route ---------------------------------------------------------------------------------
# The hand-worked example of test_route_ref: 3 tokens x 8 experts.
mknpy l.npy '<f4' '(3, 8)' 'f<' \
    4 3 2 1 0 -1 -2 -3 \
    3 4 -3 -2 -1 0 1 2 \
    -3 -2 4 3 -1 0 1 2
expect_rc 0 "$MJ" route --topk 4 l.npy
json_check 'j["ids"] == [[0,1,2,3],[1,0,7,6],[2,3,7,6]] and j["experts_per_token"] == [4,4,4]'
json_check 'j["k0"] == 4 and j["topk"] == 4 and j["experts"] == 8 and j["tokens"] == 3 and j["valid"] == 3'
json_check 'abs(sum(j["weights"][0]) - 1.0) < 1e-6 and j["retained_mass"] == 1.0'
json_check 'j["unique_experts_before"] == 6 and j["unique_experts_after"] == 6'
# OEA k0=2: S_base = {0,1} u {1,0} u {2,3}; token 1 walks 7,6,5,4 (not in it), then 3, 2.
expect_rc 0 "$MJ" route --topk 4 --k0 2 l.npy
json_check 'j["ids"] == [[0,1,2,3],[1,0,3,2],[2,3,1,0]]'
json_check 'j["experts_per_token"] == [4,4,4] and j["unique_experts_after"] == 4 and j["retained_mass"] < 1'
# The generated kernels on the interpreter give the reference's answer.
expect_rc 0 "$MJ" route --backend sim --topk 4 --k0 2 l.npy
json_check 'j["ids"] == [[0,1,2,3],[1,0,3,2],[2,3,1,0]] and j["experts_per_token"] == [4,4,4]'
cp out sim.json
expect_rc 0 "$MJ" route --backend ref --topk 4 --k0 2 l.npy
cmp -s out sim.json && ok || bad "sim and ref routes differ: $(cat sim.json) vs $(cat out)"
expect_rc 0 "$MJ" route --backend sim --topk 4 --k0-policy "1-2:4,3-:2" l.npy
json_check 'j["k0"] == 2 and j["ids"][1] == [1,0,3,2]'
expect_fail "$MJ" route --backend sim --topk 4 --k0-policy "1-2:4" l.npy;   contains err "batch size 3"
expect_fail "$MJ" route --topk 4 --k0 2 --k0-policy 2 l.npy
expect_fail "$MJ" route --backend tpu l.npy;                                contains err "ref, sim or cuda"
# Without a driver the cuda backend is one clear error (a GPU machine runs the GPU tests).
MOEJIT_LIBCUDA=/nonexistent/libcuda.so.1 expect_fail "$MJ" route --backend cuda --topk 4 l.npy
contains err "no CUDA driver"
# With the stub driver (kernels do not run, calls are checked): memory is allocated in a
# current context, the route kernel is loaded and launched.
MJ_STUB_LOG=$T/stub.log MOEJIT_LIBCUDA=$STUB MOEJIT_CACHE_DIR=$T/stubcache expect_rc 0 "$MJ" route --backend cuda --topk 4 --valid 2 l.npy
contains stub.log "cuLaunchKernel oea_route grid 1,1,1"
grep -q "without a current context" stub.log && bad "a driver call without a context: $(cat stub.log)" || ok
expect_rc 0 "$MJ" route --topk 2 --rsf 2.5 l.npy
json_check 'abs(sum(j["weights"][0]) - 2.5) < 1e-5'
expect_rc 0 "$MJ" route --topk 2 --no-renorm l.npy
json_check 'abs(j["weights"][0][0] - 1/(1+2.718281828459045**-4)) < 1e-6'
expect_rc 0 "$MJ" route --topk 2 --scoring softmax --no-renorm l.npy
json_check 'j["ids"][0] == [0,1] and 0.5 < j["weights"][0][0] < 0.7'
expect_rc 0 "$MJ" route --topk 2 --n-group 4 --topk-group 1 l.npy
json_check 'j["ids"][1] == [1,0] and j["ids"][2] == [2,3]'
expect_rc 0 "$MJ" route --topk 2 --n-group 4 --topk-group 2 l.npy
json_check 'j["ids"][0] == [0,1]'
# The group score: 4 groups of 2, keep 1. Group 0 (4, -10) has the best expert, group 1
# (3.5, 3.5) the best pair: the top-2 sum (noaux_tc, the default) keeps group 1, the max
# (group_limited_greedy) group 0; sigmoid and softmax alike, reference and kernel alike.
mknpy g.npy '<f4' '(1, 8)' 'f<' 4 -10 3.5 3.5 -10 -10 -10 -10
expect_rc 0 "$MJ" route --topk 2 --n-group 4 --topk-group 1 g.npy;                        json_check 'j["ids"] == [[2,3]]'
expect_rc 0 "$MJ" route --topk 2 --n-group 4 --topk-group 1 --group-score top2-sum g.npy; json_check 'j["ids"] == [[2,3]]'
expect_rc 0 "$MJ" route --topk 2 --n-group 4 --topk-group 1 --group-score max g.npy;      json_check 'j["ids"] == [[0,1]]'
expect_rc 0 "$MJ" route --backend sim --topk 2 --n-group 4 --topk-group 1 --group-score max g.npy
json_check 'j["ids"] == [[0,1]]'
expect_rc 0 "$MJ" route --backend sim --scoring softmax --topk 2 --n-group 4 --topk-group 1 g.npy
json_check 'j["ids"] == [[2,3]]'
expect_rc 0 "$MJ" route --backend sim --scoring softmax --topk 2 --n-group 4 --topk-group 1 --group-score max g.npy
json_check 'j["ids"] == [[0,1]]'
expect_fail "$MJ" route --group-score sum g.npy;        contains err "--group-score wants top2-sum or max"
expect_rc 0 "$MJ" route --help;                         contains out "--group-score"; contains out "group_limited_greedy"
# From a config: group_limited_greedy (DeepSeek-V2) scores by the max; the flag overrides it.
cat >v2.json <<'EOF'
{"hidden_size": 64, "moe_intermediate_size": 64, "n_routed_experts": 8, "num_experts_per_tok": 2,
 "n_group": 4, "topk_group": 1, "topk_method": "group_limited_greedy", "scoring_func": "softmax",
 "norm_topk_prob": false, "routed_scaling_factor": 1.0}
EOF
expect_rc 0 "$MJ" route --config v2.json g.npy;                           json_check 'j["ids"] == [[0,1]]'
expect_rc 0 "$MJ" route --config v2.json --group-score top2-sum g.npy;    json_check 'j["ids"] == [[2,3]]'
sed 's/group_limited_greedy/noaux_tc/' v2.json >v3.json
expect_rc 0 "$MJ" route --config v3.json g.npy;                           json_check 'j["ids"] == [[2,3]]'
sed 's/group_limited_greedy/sparsemixer/' v2.json >bad_method.json
expect_fail "$MJ" route --config bad_method.json g.npy; contains err "topk_method 'sparsemixer' is not supported"
expect_rc 0 "$MJ" route --topk 4 --k0 2 --valid 1 l.npy
json_check 'j["experts_per_token"] == [2,0,0] and j["ids"] == [[0,1],[],[]] and j["valid"] == 1'
mknpy b.npy '<f4' '(8,)' 'f<' 0 0 0 0 0 0 0 5
expect_rc 0 "$MJ" route --topk 1 --bias b.npy --no-renorm l.npy
json_check 'j["ids"] == [[7],[7],[7]] and abs(j["weights"][0][0] - 1/(1+2.718281828459045**3)) < 1e-6'
mknpy one.npy '<f4' '(8,)' 'f<' 0 1 2 3 4 5 6 7
expect_rc 0 "$MJ" route --topk 3 one.npy
json_check 'j["ids"] == [[7,6,5]]'
# --config: GLM-5 wants 256 experts.
expect_fail "$MJ" route --config "$SRC/tests/data/model/glm5_moe_config.json" l.npy
contains err "256"
python3 - <<'EOF'
import struct
E = 256
vals = [((i * 37) % 101) / 10.0 for i in range(2 * E)]
d = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, %d), }" % E
pad = (64 - (10 + len(d) + 1) % 64) % 64
h = (d + " " * pad + "\n").encode()
open("l256.npy", "wb").write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h + struct.pack("<%df" % len(vals), *vals))
EOF
expect_rc 0 "$MJ" route --config "$SRC/tests/data/model/glm5_moe_config.json" l256.npy
json_check 'j["topk"] == 8 and j["experts"] == 256 and abs(sum(j["weights"][0]) - 2.5) < 1e-5'
expect_rc 0 "$MJ" route --config "$SRC/tests/data/model/glm5_moe_config.json" --topk 4 --k0 2 l256.npy
json_check 'j["topk"] == 4 and j["k0"] == 2'
# Bad inputs and flags: one line on stderr, non-zero exit.
expect_fail "$MJ" route missing.npy;                     contains err "missing.npy"
mknpy i.npy '<i4' '(3, 8)' 'l<' 1 2 3 4 5 6 7 8 1 2 3 4 5 6 7 8 1 2 3 4 5 6 7 8
expect_fail "$MJ" route i.npy;                           contains err "expected '<f4'"
head -c 100 l.npy >trunc.npy
expect_fail "$MJ" route trunc.npy;                       contains err "truncated"
head -c 5 l.npy >short.npy
expect_fail "$MJ" route short.npy
echo "hello world, not numpy" >txt.npy
expect_fail "$MJ" route txt.npy;                         contains err "bad magic"
mkdir dir.npy
expect_fail "$MJ" route dir.npy;                         contains err "dir.npy: is a directory"
# A FIFO (no writer) is refused at once, not waited on; timeout turns a hang into rc 124.
mkfifo fifo.npy
expect_fail timeout 10 "$MJ" route fifo.npy;             contains err "fifo.npy: not a regular file"
expect_fail timeout 10 "$MJ" route --bias fifo.npy l.npy; contains err "fifo.npy: not a regular file"
expect_fail timeout 10 "$MJ" nvfp4 quantize fifo.npy qf; contains err "fifo.npy: not a regular file"
[ -p fifo.npy ] && ok || bad "fifo.npy is no longer a FIFO"
mknpy fo.npy '<f4' '(3, 8)' 'f<' ; perl -pi -e 's/False/True /' fo.npy
expect_fail "$MJ" route fo.npy;                          contains err "Fortran"
mknpy b3.npy '<f4' '(3,)' 'f<' 0 0 0
expect_fail "$MJ" route --bias b3.npy l.npy;             contains err "bias must be [8]"
mknpy l3.npy '<f4' '(2, 2, 2)' 'f<' 1 2 3 4 5 6 7 8
expect_fail "$MJ" route l3.npy;                          contains err "[B, E]"
# Dimensions are checked as the file gives them (int64) before they are narrowed: header-only
# files with a 0 dimension load, and 4294967304 must not become 8.
mknpy bigE.npy '<f4' '(0, 4294967304)' 'f<'
expect_fail "$MJ" route bigE.npy;                        contains err "4294967304 experts"; contains err "8..1024"
expect_fail "$MJ" route --backend ref bigE.npy;          contains err "4294967304 experts"; contains err "1..65536"
mknpy bigB.npy '<f4' '(4294967304, 0)' 'f<'
expect_fail "$MJ" route --backend ref bigB.npy;          contains err "4294967304 tokens"; contains err "16777216"
mknpy negB.npy '<f4' '(3000000000, 0)' 'f<'
expect_fail "$MJ" route --backend ref negB.npy;          contains err "3000000000 tokens"
mknpy e4.npy '<f4' '(0, 4)' 'f<'
expect_fail "$MJ" route --backend sim --topk 2 e4.npy;   contains err "4 experts"; contains err "8..1024"
mknpy e2000.npy '<f4' '(0, 2000)' 'f<'
expect_fail "$MJ" route e2000.npy;                       contains err "2000 experts"; contains err "8..1024"
expect_rc 0 "$MJ" route --backend ref e2000.npy
json_check 'j["experts"] == 2000 and j["tokens"] == 0 and j["ids"] == []'
expect_fail "$MJ" route --topk 9 l.npy
expect_fail "$MJ" route --topk 4 --k0 5 l.npy
expect_fail "$MJ" route --topk x l.npy;                  contains err "--topk"
expect_fail "$MJ" route --rsf nan l.npy
for x in 0 -0 -1 -2.5 1e-60 inf 1e40; do
    expect_fail "$MJ" route --rsf "$x" l.npy;            contains err "--rsf wants a positive finite number"
done
expect_rc 2 "$MJ" route --rsf 0 l.npy
expect_rc 0 "$MJ" route --topk 2 --rsf 0.5 l.npy;        json_check 'abs(sum(j["weights"][0]) - 0.5) < 1e-6'
expect_fail "$MJ" route --scoring tanh l.npy;            contains err "sigmoid or softmax"
expect_fail "$MJ" route --n-group 3 l.npy
expect_fail "$MJ" route --valid 4 l.npy;                 contains err "--valid"
expect_fail "$MJ" route --bogus l.npy
expect_fail "$MJ" route
expect_fail "$MJ" route --config nothere.json l.npy;     contains err "nothere.json"

# ---- nvfp4 -------------------------------------------------------------------------------
# 2 x 32: row 0 = 0..31 / 4, row 1 = -(0..31) / 8.
mknpy m.npy '<f4' '(2, 32)' 'f<' $(perl -e 'print join(" ", (map { $_ / 4 } 0..31), (map { -$_ / 8 } 0..31))')
expect_rc 0 "$MJ" nvfp4 quantize m.npy q
for p in weight weight_scale weight_scale_2; do [ -f "q.$p.npy" ] && ok || bad "q.$p.npy missing"; done
expect_rc 0 "$MJ" nvfp4 dequantize q d.npy
python3 - <<'EOF' && ok || bad "nvfp4 round trip"
import struct
def load(f):
    b = open(f, "rb").read()
    hl = struct.unpack("<H", b[8:10])[0]
    return b[10:10 + hl].decode(), b[10 + hl:]
h, data = load("d.npy")
assert "'<f4'" in h and "(2, 32)" in h, h
x = struct.unpack("<64f", data)
src = [i / 4 for i in range(32)] + [-i / 8 for i in range(32)]
for a, b in zip(x, src):
    blk = 31 / 4 if b >= 0 else 31 / 8
    assert abs(a - b) <= 0.5 * blk / 6 * 2 + 1e-6, (a, b)
h, data = load("q.weight.npy")
assert "(2, 16)" in h and len(data) == 32, h
h, data = load("q.weight_scale.npy")
assert "(2, 2)" in h and len(data) == 4, h
h, data = load("q.weight_scale_2.npy")
assert "()" in h and abs(struct.unpack("<f", data)[0] - 7.75 / (6 * 448)) < 1e-9, h
EOF
# NaN in the input: error naming the index, nothing written.
mknpy nan.npy '<f4' '(1, 16)' 'f<' 0 1 2 3 4 5 6 7 8 9 10 11 12 13 NaN 15
rm -f qn.*
expect_fail "$MJ" nvfp4 quantize nan.npy qn;             contains err "NaN"; contains err "14"
[ -z "$(ls qn.* 2>/dev/null)" ] && ok || bad "files left after a failed quantize"
# A failed re-run leaves the outputs of an earlier run as they were: a NaN input...
mkdir keep && cp q.weight.npy q.weight_scale.npy q.weight_scale_2.npy keep/
expect_fail "$MJ" nvfp4 quantize nan.npy q;              contains err "NaN"
for p in weight weight_scale weight_scale_2; do cmp -s "q.$p.npy" "keep/q.$p.npy" && ok || bad "q.$p.npy changed by a failed run"; done
# ... and a run that can write two of its three outputs but not the third (a directory is
# in the way): nothing is replaced, and no temporary is left.
mknpy m2.npy '<f4' '(2, 32)' 'f<' $(perl -e 'print join(" ", map { $_ / 3 - 5 } 0..63)')
"$MJ" nvfp4 quantize m.npy r >/dev/null 2>&1 && cp r.weight.npy r.weight_scale.npy keep/
rm -f r.weight_scale_2.npy && mkdir r.weight_scale_2.npy
expect_fail "$MJ" nvfp4 quantize m2.npy r;               contains err "r.weight_scale_2.npy"; contains err "directory"
for p in weight weight_scale; do cmp -s "r.$p.npy" "keep/r.$p.npy" && ok || bad "r.$p.npy removed or changed by a failed run: $(ls -d r.* 2>&1)"; done
[ -z "$(ls -d r.*.tmp.* 2>/dev/null)" ] && ok || bad "temporaries left: $(ls -d r.*)"
rmdir r.weight_scale_2.npy
expect_rc 0 "$MJ" nvfp4 quantize m2.npy r
cmp -s r.weight.npy keep/r.weight.npy && bad "r.weight.npy not replaced by a successful run" || ok
mknpy k15.npy '<f4' '(1, 15)' 'f<' 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15
expect_fail "$MJ" nvfp4 quantize k15.npy qk;             contains err "multiple of 16"
expect_fail "$MJ" nvfp4 quantize l3.npy qk
mknpy n0.npy '<f4' '(0, 16)' 'f<'
expect_fail "$MJ" nvfp4 quantize n0.npy qk;              contains err "no rows"
grep -q "multiple of 16" err && bad "a matrix with no rows reported as a K problem: $(cat err)" || ok
mknpy k0.npy '<f4' '(2, 0)' 'f<'
expect_fail "$MJ" nvfp4 quantize k0.npy qk;              contains err "K must be a positive multiple of 16"
[ -z "$(ls qk.* 2>/dev/null)" ] && ok || bad "files left after a failed quantize: $(ls qk.*)"
expect_fail "$MJ" nvfp4 quantize missing.npy qk
expect_fail "$MJ" nvfp4 dequantize nothere d2.npy;       contains err "nothere.weight.npy"
cp q.weight.npy z.weight.npy; cp q.weight_scale_2.npy z.weight_scale_2.npy
mknpy z.weight_scale.npy '|u1' '(2, 3)' 'C' 56 56 56 56 56 56
expect_fail "$MJ" nvfp4 dequantize z d3.npy;             contains err "shapes do not match"
[ ! -f d3.npy ] && ok || bad "d3.npy written after a failure"
expect_fail "$MJ" nvfp4 squash m.npy q
expect_fail "$MJ" nvfp4 quantize m.npy
# Outputs are written through unpredictable temporaries beside them (O_EXCL): a symlink
# planted at the old predictable name <out>.tmp.<pid> is not followed, and its target is left
# alone. The shell that plants the links execs the command, so $$ is the command's pid.
mkdir sl && printf 'precious\n' >sl/target
planted() { # planted "OUTNAMES" CMD...: in sl/, with a link to target at each OUTNAME.tmp.<pid>
    local names=$1
    shift
    (cd sl && NAMES=$names bash -c 'for f in $NAMES; do ln -s target "$f.tmp.$$"; done; exec "$@"' planted "$@") >out 2>err
}
planted "q.weight.npy q.weight_scale.npy q.weight_scale_2.npy" "$MJ" nvfp4 quantize ../m.npy q
[ $? = 0 ] && ok || bad "quantize with planted links failed: $(cat err)"
planted "d.npy" "$MJ" nvfp4 dequantize q d.npy
[ $? = 0 ] && ok || bad "dequantize with planted links failed: $(cat err)"
[ "$(cat sl/target)" = precious ] && ok || bad "a planted symlink's target was overwritten: $(head -c 80 sl/target | od -c | head -2)"
for f in q.weight.npy q.weight_scale.npy q.weight_scale_2.npy d.npy; do
    [ -f "sl/$f" ] && [ ! -L "sl/$f" ] && cmp -s "sl/$f" "$f" && ok || bad "sl/$f is not the regular file it should be: $(ls -l "sl/$f")"
done
[ "$(find sl -type l | wc -l)" = 4 ] && [ "$(find sl -type l -lname target | wc -l)" = 4 ] && ok || bad "planted links were moved: $(ls -l sl)"
[ "$(find sl -type f | wc -l)" = 5 ] && ok || bad "temporaries left behind: $(ls -l sl)"
want_mode=$(printf '%o' $((0666 & ~$(umask))))
[ "$(stat -c %a sl/q.weight.npy)" = "$want_mode" ] && ok || bad "output mode $(stat -c %a sl/q.weight.npy), want $want_mode"

# ---- demo -------------------------------------------------------------------------------
# A checkpoint written, read back on 8 loopback ranks, TP and EP, with and without OEA,
# each run checked against the reference; the table and the GLM-5-size projection.
DC="--cache-dir $T/democache"
mkdir -p demotmp   # a TMPDIR of its own: another process's demo in /tmp cannot confuse the check
TMPDIR=$T/demotmp expect_rc 0 "$MJ" demo --hidden 128 --intermediate 512 --experts 32 --batch 8 --k0 2 --seed 3 $DC
contains out "checkpoint: layer 3 of a GLM-5-shaped model (hidden 128, intermediate 512, 32 experts, top-8"
contains out "TP=8 top-k"; contains out "TP=8 OEA k0=2"; contains out "EP=8 top-k"; contains out "EP=8 OEA k0=2"
[ "$(grep -c ' ok$' out)" = 4 ] && ok || bad "demo: want 4 runs ok: $(cat out)"
contains out "At GLM-5's size (hidden 6144, intermediate 2048)"
[ -z "$(ls -A demotmp)" ] && ok || bad "demo left files in its TMPDIR: $(ls -A demotmp)"
expect_rc 0 "$MJ" demo --hidden 128 --intermediate 512 --experts 16 --topk 4 --batch 4 --mode w4a4 $DC
contains out "W4A4"
[ "$(grep -c ' ok$' out)" = 4 ] && ok || bad "demo w4a4: want 4 runs ok: $(cat out)"
# --keep: the checkpoint stays, and `moejit run` reads it.
expect_rc 0 "$MJ" demo --hidden 128 --intermediate 512 --experts 16 --topk 4 --batch 2 --keep kept $DC
[ -f kept/config.json ] && [ -f kept/hf_quant_config.json ] && ok || bad "demo --keep: $(ls kept)"
# ---- run ---------------------------------------------------------------------------------
expect_rc 0 "$MJ" run --help; contains out "usage: moejit run"; contains out "--check"
# Four tokens of the kept checkpoint's hidden size (128).
mknpy x.npy '<f4' '(4, 128)' f $(awk 'BEGIN { srand(11); for (i = 0; i < 512; i++) printf "%.6f ", rand() * 2 - 1 }')
RUN="$MJ run --checkpoint kept --input x.npy $DC"
expect_rc 0 $RUN --output y_ref.npy --backend ref --k0 2
contains err "reference W4A16, k0 2"
expect_rc 0 $RUN --output y_sim.npy --backend sim --k0 2
contains err "interpreter on 1 rank (whole layer), W4A16, k0 2"
python3 - y_ref.npy y_sim.npy <<'PY' && ok || bad "run: the interpreter's output is not the reference's"
import struct, sys, math
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<H", b[8:10])[0]
    assert b"(4, 128)" in b[10:10 + n] and b"<f4" in b[10:10 + n]
    return struct.unpack("<512f", b[10 + n:])
a, r = load(sys.argv[2]), load(sys.argv[1])
num = sum((x - y) ** 2 for x, y in zip(a, r)); den = sum(y * y for y in r)
assert den > 0 and math.sqrt(num / den) < 2e-3, math.sqrt(num / den)
PY
expect_rc 0 $RUN --output y_tp.npy --backend sim --tp 2 --k0 2 --check
contains out "check: relative L2"; contains err "on 2 ranks (TP)"
expect_rc 0 $RUN --output y_ep.npy --backend sim --ep 4 --k0-policy "1-2:4,3-:2" --mode w4a4 --check --num-valid 3
contains out "(W4A4; tolerance 5e-02)"; contains err "B 4 (3 valid)"; contains err "EP"
# The default backend (auto): no GPU here (or fewer than the ranks), so the interpreter.
MOEJIT_LIBCUDA=/nonexistent/libcuda.so.1 expect_rc 0 $RUN --output y_auto.npy --tp 2 --k0 2 --check
contains err "interpreter on 2 ranks (TP)"; contains out "check: relative L2"
expect_rc 2 $RUN --output y.npy --k0 2 --k0-policy 2;   contains err "not both"
expect_rc 2 $RUN --output y.npy --backend ref --tp 2;  contains err "whole layer"
expect_rc 2 $RUN --output y.npy --backend ref --check; contains err "no kernels to check"
expect_rc 2 $RUN --output y.npy --num-valid 9;         contains err "exceeds"
expect_rc 2 "$MJ" run --checkpoint kept --output y.npy; contains err "required"
expect_fail $RUN --output y.npy --backend sim --tp 3;   contains err "TP=3"
expect_fail $RUN --output y.npy --backend sim --layer 7
expect_fail $RUN --output y.npy --backend cuda;        contains err "GPU"
mknpy x64.npy '<f4' '(4, 64)' f $(seq 256)
expect_fail "$MJ" run --checkpoint kept --input x64.npy --output y.npy $DC; contains err "[B, 128]"
mknpy xnan.npy '<f4' '(1, 128)' f nan $(seq 127)
expect_fail "$MJ" run --checkpoint kept --input xnan.npy --output y.npy $DC; contains err "not finite"
# A bad tensor in one rank's slice (a NaN block scale in expert 15: EP rank 1's share, TP's
# every rank's): that rank's load fails, and every rank stops before the forward instead of
# waiting for it in the all-reduce (300 s); the message names the tensor, not the
# communicator. Under `timeout`, so a wait fails the check instead of hanging the suite.
cp -r kept keptnan
python3 - keptnan model.layers.3.mlp.experts.15.down_proj.weight_scale <<'PY' && ok || bad "could not plant a NaN scale"
import json, os, struct, sys
d, name = sys.argv[1], sys.argv[2]
idx = os.path.join(d, "model.safetensors.index.json")
shard = json.load(open(idx))["weight_map"][name] if os.path.exists(idx) else "model.safetensors"
p = os.path.join(d, shard)
b = bytearray(open(p, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
begin = json.loads(b[8:8 + n])[name]["data_offsets"][0]
b[8 + n + begin + 3] = 0x7F                     # the e4m3 NaN
open(p, "wb").write(b)
PY
for split in "--ep 2" "--tp 2" "--ep 4"; do
    SECONDS=0
    expect_fail timeout 100 $RUN --checkpoint keptnan --output ynan.npy --backend sim $split
    [ "$SECONDS" -lt 60 ] && ok || bad "run $split with a bad tensor took $SECONDS s (a rank waited for the failed one)"
    contains err "experts.15.down_proj.weight_scale"; contains err "NaN"
    grep -q "MJ_ERR_COMM\|communicator" err && bad "run $split blamed the communicator: $(cat err)" || ok
done
[ ! -e ynan.npy ] && ok || bad "a failed run wrote its output"
# Finite in float32, infinite in bf16 (above 3.3895e38, either sign): refused like Inf.
mknpy xbig.npy '<f4' '(2, 128)' f $(seq 128) $(seq 127) -3.3962e38
expect_fail "$MJ" run --checkpoint kept --input xbig.npy --output y.npy --backend ref $DC
contains err "element 255 (row 1)"; contains err "infinity in bf16"
mknpy xbig.npy '<f4' '(1, 128)' f 3.4e38 $(seq 127)
expect_fail "$MJ" run --checkpoint kept --input xbig.npy --output y.npy $DC; contains err "element 0 (row 0)"
# --check where the layer overflows float32 (finite bf16 input near 1e37): no "relative L2
# nan" and no blame on the kernels; each side's NaN/Inf counted, exit 1.
mknpy xhuge.npy '<f4' '(1, 128)' f $(awk 'BEGIN { srand(5); for (i = 0; i < 128; i++) printf "%.6e ", (rand() * 2 - 1) * 1e37 }')
expect_rc 1 "$MJ" run --checkpoint kept --input xhuge.npy --output yhuge.npy --backend sim --check $DC
contains err "--check: not compared: the CPU reference holds 128 non-finite values"
contains err "and the kernels' output 128 non-finite values"; contains err "overflows float32"
grep -q "further from the reference\|relative L2\|nan" err out && bad "run --check on non-finite values: $(cat out err)" || ok
expect_fail "$MJ" run --checkpoint nowhere --input x.npy --output y.npy $DC
[ ! -e y.npy ] && ok || bad "a failed run wrote its output"
# A special file at --output is refused and stays what it was (rename would make a FIFO, a
# device node or a link to one a regular file): a FIFO, a link to /dev/null; and for
# nvfp4 dequantize, a device node of our own where this machine lets us make one.
mkfifo yfifo.npy && ln -s /dev/null ynull.npy
expect_fail $RUN --output yfifo.npy --backend ref;      contains err "FIFO"; contains err "regular file"
[ -p yfifo.npy ] && ok || bad "run --output replaced a FIFO: $(ls -l yfifo.npy)"
expect_fail $RUN --output ynull.npy --backend ref;      contains err "link to a character device"
[ -L ynull.npy ] && [ "$(readlink ynull.npy)" = /dev/null ] && ok || bad "run --output replaced a link: $(ls -l ynull.npy)"
expect_fail "$MJ" nvfp4 dequantize q ynull.npy;         contains err "character device"
[ -L ynull.npy ] && ok || bad "nvfp4 dequantize replaced a link: $(ls -l ynull.npy)"
if mknod ychr.npy c 1 3 2>/dev/null; then
    expect_fail "$MJ" nvfp4 dequantize q ychr.npy;      contains err "is a character device"
    [ -c ychr.npy ] && ok || bad "nvfp4 dequantize replaced a device node: $(ls -l ychr.npy)"
fi
# A link is refused whatever it points to (to a regular file too: /dev/stdout is such a link
# when stdout is a file), before any work: nvfp4 quantize writes nothing.
ln -s "$PWD/x.npy" ylink.npy
expect_fail $RUN --output ylink.npy --backend ref;      contains err "symbolic link to a regular file"
[ -L ylink.npy ] && ok || bad "run --output replaced a link to a regular file: $(ls -l ylink.npy)"
ln -s "$PWD/x.npy" yq.weight.npy
expect_fail "$MJ" nvfp4 quantize x.npy yq;             contains err "yq.weight.npy: is a symbolic link"
[ -L yq.weight.npy ] && [ ! -e yq.weight_scale.npy ] && ok || bad "nvfp4 quantize wrote past a refused output: $(ls yq.*)"
rm ylink.npy yq.weight.npy
[ -z "$(ls ./*.tmp.* 2>/dev/null)" ] && ok || bad "temporaries left: $(ls ./*.tmp.*)"

# ---- prewarm --config ---------------------------------------------------------------------
GLM5="$SRC/tests/data/model/glm5_moe_config.json"
# GLM-5's plan at TP 8 for sm_120a: router GEMM ROWS 8/16/32/64, plain top-k routing (8 warps up
# to 4 tokens, 16 up to 16, 32 past), experts TPE 8 (W4A16 at 1-8 tokens: up, down) and TPE
# 16/32/64 (W4A4: up, down, and one experts_quant for all three): 16 specializations, listed.
Q="--quant $SRC/tests/data/model/hf_quant_config.example.json"
expect_rc 1 "$MJ" prewarm --config "$GLM5" --tp 8 --dry-run --cache-dir "$T/pc"; contains err "--quant"
expect_rc 0 "$MJ" prewarm --config "$GLM5" $Q --tp 8 --dry-run --cache-dir "$T/pc"
contains err "plan for sm_120a: H 6144, E 256, top-8, TP, 256 batch sizes (1-256), k0 = top-k"
contains err "16 specializations"
[ "$(wc -l <out)" = 16 ] && [ "$(grep -c '"arch":"sm_120a"' out)" = 16 ] && ok || bad "dry run: $(cat out)"
[ "$(grep -c '"template":"oea_route".*"NWARPS":16' out)" = 1 ] && [ "$(grep -c '"template":"oea_route".*"NWARPS":32' out)" = 1 ] &&
    ok || bad "dry run routing past 8 and 16 tokens: $(cat out)"
[ "$(grep -c '"template":"moe_experts"' out)" = 9 ] && ok || bad "dry run experts: $(cat out)"
[ "$(grep -c '"PART":1' out)" = 1 ] && [ "$(grep -c '"PART":2' out)" = 4 ] && [ "$(grep -c '"PART":3' out)" = 4 ] &&
    ok || bad "dry run experts, one specialization per kernel: $(cat out)"
# An FP8 quantization_config inside config.json beside an NVFP4 hf_quant_config.json: refused
# naming both (prewarm and bench read the pair as the loader does), where the file silently won.
mkdir -p qc && cp "$SRC/tests/data/config/deepseek_fp8.json" qc/config.json &&
    cp "$SRC/tests/data/model/hf_quant_config.example.json" qc/hf_quant_config.json
expect_rc 1 "$MJ" prewarm --config qc/config.json --tp 8 --dry-run --cache-dir "$T/pc"
contains err "disagrees with qc/hf_quant_config.json"; contains err "quantization 'fp8'"
expect_rc 1 "$MJ" bench --config qc/config.json --no-compile --no-sim --no-gpu
contains err "disagrees with qc/hf_quant_config.json"
expect_rc 0 "$MJ" prewarm --config "$GLM5" $Q --ep 8 --k0-policy "1-3:8,4-:4" --arch sm_90a --dry-run --cache-dir "$T/pc"
contains err "mode w4a16"
[ "$(grep -c '"MODE":1' out)" = 0 ] && ok || bad "sm_90a plan has W4A4: $(cat out)"
# The kept checkpoint's config, 1-4 tokens, for real (router GEMM ROWS 8, routing, experts up and
# down): compiled, then all cached.
expect_rc 0 "$MJ" prewarm --config kept/config.json --tp 2 --batch 1-4 --k0-policy 2 --cache-dir "$T/pc" -q
contains out "4 specializations: 4 compiled, 0 already cached, 0 failed"
expect_rc 0 "$MJ" prewarm --config kept/config.json --tp 2 --batch 1,2,3,4 --k0-policy 2 --cache-dir "$T/pc" -q
contains out "4 specializations: 0 compiled, 4 already cached"
# On a terminal, a progress bar ([###...] done/total) that is erased before the summary.
if command -v script >/dev/null; then
    script -qec "\"$MJ\" prewarm --config kept/config.json --tp 2 --batch 1-4 --k0-policy 2 --cache-dir \"$T/pc\"" \
        /dev/null >tty.out 2>&1 </dev/null && ok || bad "prewarm on a terminal failed: $(head -c 400 tty.out)"
    contains tty.out "[##############################] 4/4 "
    contains tty.out "$(printf '\r\033[K')prewarm: 4 specializations: 0 compiled, 4 already cached"
else
    bad "no 'script' (bsdutils) to give prewarm a terminal"
fi
# What a prewarm stores is what a run needs: the same settings in strict mode compile
# nothing (the interpreter's objects: --backend sim).
expect_rc 0 "$MJ" prewarm --config kept/config.json --tp 2 --batch 4 --k0-policy 2 --backend sim --cache-dir "$T/pc" -q
contains out "specializations:"; contains out "0 failed"
expect_rc 2 "$MJ" prewarm --backend sim m.jsonl; contains err "go with --config"
expect_rc 2 "$MJ" prewarm --config kept/config.json --backend rocm; contains err "--backend"
MOEJIT_STRICT=1 expect_rc 0 "$MJ" run --checkpoint kept --input x.npy --output y_strict.npy --backend sim \
    --tp 2 --k0-policy 2 --cache-dir "$T/pc" --check
contains err "on 2 ranks (TP)"; contains out "check: relative L2"
MOEJIT_STRICT=1 expect_rc 1 "$MJ" run --checkpoint kept --input x.npy --output y_strict.npy --backend sim \
    --ep 2 --k0-policy 2 --cache-dir "$T/pc"
contains err "MOEJIT_STRICT"
expect_rc 2 "$MJ" prewarm --config kept/config.json m.jsonl;   contains err "not both"
expect_rc 2 "$MJ" prewarm --tp 2 m.jsonl;                       contains err "go with --config"
expect_rc 2 "$MJ" prewarm --config kept/config.json --tp 2 --ep 2; contains err "once"
expect_rc 2 "$MJ" prewarm --config kept/config.json --batch 0;  contains err "--batch"
expect_rc 2 "$MJ" prewarm --config kept/config.json --k0-policy 9 --dry-run; contains err "--k0-policy"
expect_rc 1 "$MJ" prewarm --config kept/config.json --mode w4a4 --arch sm_90a --dry-run; contains err "sm_90a"
expect_rc 1 "$MJ" prewarm --config kept/config.json --k0-policy 2 --batch 1-300 --dry-run; contains err "batch size 257"

expect_fail "$MJ" demo --hidden 100;                     contains err "64"
expect_fail "$MJ" demo --intermediate 640;               contains err "512"
expect_fail "$MJ" demo --experts 20;                     contains err "8"
expect_fail "$MJ" demo --k0 9
expect_fail "$MJ" demo --mode int8
expect_fail "$MJ" demo extra

# ---- prewarm and inspect ---------------------------------------------------------------
for c in prewarm inspect; do
    expect_rc 0 "$MJ" $c --help; contains out "usage: moejit $c"
    expect_rc 0 "$MJ" $c -V;     contains out "moejit 0."
done
C=$T/cache
cat >m.jsonl <<'EOF'
# two router GEMM variants and a route kernel
{"template": "router_gemm", "knobs": {"H": 512, "E": 64, "ROWS": 8, "NWARPS": 4}, "arch": "sm_120a"}
{"template": "router_gemm", "knobs": {"H": 512, "E": 64, "ROWS": 16, "NWARPS": 4}, "arch": "sm_120a"}

{"template": "oea_route", "knobs": {"E": 64, "K": 4, "K0": 2, "NG": 1, "TG": 1, "GSCORE": 0, "SCORING": 0, "RENORM": 1, "NWARPS": 4}, "arch": "sm_120a"}
EOF
MOEJIT_RECORD=$T/rec.jsonl expect_rc 0 "$MJ" prewarm --cache-dir "$C" -j 2 m.jsonl
contains out "3 specializations: 3 compiled, 0 already cached, 0 failed"
contains err "compiled router_gemm H=512 E=64 ROWS=8 NWARPS=4 sm_120a"
[ "$(stat -c %a "$C")" = 700 ] && ok || bad "cache dir mode $(stat -c %a "$C")"
expect_rc 0 "$MJ" prewarm --cache-dir "$C" -q m.jsonl
contains out "0 compiled, 3 already cached, 0 failed"
expect_rc 0 "$MJ" prewarm --cache-dir "$C" --arch sm_80 --arch sm_120a m.jsonl
contains out "6 specializations: 3 compiled, 3 already cached, 0 failed"
# What a run recorded replays into an empty cache.
[ "$(wc -l <rec.jsonl)" = 3 ] && ok || bad "MOEJIT_RECORD wrote $(wc -l <rec.jsonl) lines, want 3"
expect_rc 0 "$MJ" prewarm --cache-dir "$T/cache2" rec.jsonl
contains out "3 compiled, 0 already cached"
# Stores that fail: with a file-size limit (SIGXFSZ ignored) between the route kernel's entry
# size and the router GEMMs' (taken from the cache just filled), writing the route kernel's
# entry fails with EFBIG, as on a full disk; the router GEMMs' land. prewarm says how many
# could not be stored and exits 1.
sizes=$(stat -c %s "$T"/cache2/v1/entries/*.mjc | sort -n | tr '\n' ' ')
read -r s1 s2 s3 rest <<<"$sizes"
if [ -n "$s3" ] && [ -z "$rest" ] && [ $((s3 - s2)) -gt 4096 ]; then ok
else bad "entry sizes $sizes: want 3, the biggest 4 KiB past the others"; s2=0 s3=204800; fi
lim=$(( (s2 + s3) / 2 / 1024 ))
expect_rc 1 bash -c 'trap "" XFSZ; ulimit -f "$2"; exec "$0" prewarm -q --cache-dir "$1" m.jsonl' "$MJ" "$T/cache_fsz" "$lim"
contains out "3 specializations: 3 compiled, 0 already cached, 0 failed, 1 not stored"
contains err "could not store"; contains err "File too large"
contains err "1 of the 3 compiled kernels could not be stored in the cache $T/cache_fsz"
[ "$(ls "$T/cache_fsz/v1/entries" | wc -l)" = 2 ] && ok || bad "entries after failed stores: $(ls -l "$T/cache_fsz/v1/entries")"
# A cache prewarm cannot write is an error before anything is compiled (the library's
# warning, then one error line; nothing on stdout): a regular file where the directory
# should be, a directory that cannot be created, one other users can write (unsafe), and a
# read-only one. Permission bits do not stop root, so as root the read-only case runs as uid
# 65534 (nobody, through setpriv) on a cache it owns with mode 0500, as test_cache does.
touch "$T/a_file"
expect_rc 1 "$MJ" prewarm --cache-dir "$T/a_file" m.jsonl
contains err "$T/a_file is not a directory"; contains err "nothing was compiled"
[ ! -s out ] && ok || bad "prewarm into a regular file printed: $(cat out)"
expect_rc 1 "$MJ" prewarm --cache-dir "$T/a_file/cache" m.jsonl
contains err "cannot create $T/a_file/cache: Not a directory"; contains err "nothing was compiled"
[ ! -s out ] && ok || bad "prewarm below a regular file printed: $(cat out)"
mkdir -p "$T/ww" && chmod 777 "$T/ww"
expect_rc 1 "$MJ" prewarm --cache-dir "$T/ww" m.jsonl
contains err "writable by other users"; contains err "nothing was compiled"
[ ! -s out ] && [ ! -e "$T/ww/v1" ] && ok || bad "prewarm into an unsafe cache: $(cat out; ls "$T/ww")"
RO=$T/ro
mkdir -p "$RO/cache/v1/entries" "$RO/cache/v1/locks" "$RO/cache/v1/quarantine" "$RO/cache/v1/tmp"
cp m.jsonl "$RO/m.jsonl" && chmod 644 "$RO/m.jsonl"
if [ "$(id -u)" = 0 ]; then
    chmod 711 "$T" && chmod 755 "$RO" && chown -R 65534:65534 "$RO/cache"
    as_ro() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
else
    as_ro() { "$@"; }
fi
find "$RO/cache" -type d -exec chmod 500 {} +
expect_rc 1 as_ro "$MJ" prewarm --cache-dir "$RO/cache" "$RO/m.jsonl"
contains err "cache directory $RO/cache is not writable"; contains err "Permission denied"
contains err "nothing was compiled"
[ ! -s out ] && ok || bad "prewarm into a read-only cache printed: $(cat out)"
find "$RO/cache" -type d -exec chmod 700 {} +

# Worker threads that cannot be started (the test hook MOEJIT_TEST_FAIL_THREADS=N fails
# every thread after the first N with EAGAIN; ulimit -u does not bind root): prewarm says so
# and does the work on the threads it has, the main thread included.
MOEJIT_TEST_FAIL_THREADS=0 expect_rc 0 "$MJ" prewarm -j 4 --cache-dir "$T/cache_thr0" m.jsonl
contains out "3 specializations: 3 compiled, 0 already cached, 0 failed, 0 not stored"
contains err "could start only 0 of 3 worker threads"
MOEJIT_TEST_FAIL_THREADS=1 expect_rc 0 "$MJ" prewarm -j 3 --cache-dir "$T/cache_thr1" m.jsonl
contains out "3 specializations: 3 compiled, 0 already cached, 0 failed, 0 not stored"
contains err "could start only 1 of 3 worker threads"
[ "$(ls "$T/cache_thr0/v1/entries" | wc -l)" = 3 ] && [ "$(ls "$T/cache_thr1/v1/entries" | wc -l)" = 3 ] && ok ||
    bad "prewarm without threads stored $(ls "$T/cache_thr0/v1/entries" | wc -l) and $(ls "$T/cache_thr1/v1/entries" | wc -l) entries"
# A cap smaller than one entry: every store evicts the one before, so prewarm warns.
MOEJIT_CACHE_MAX_BYTES=1000 expect_rc 0 "$MJ" prewarm -q --cache-dir "$T/cache_tiny" m.jsonl
contains err "is larger than the cache cap of 1000 bytes"
[ "$(grep -c warning err)" = 1 ] && ok || bad "want one warning: $(cat err)"
# Bad manifests, bad flags.
printf '{"template": "router_gemm", "knobs": {"H": 512, "E": 64, "ROWS": 8, "NWARPS": 4}, "arch": "sm_120a"}\n{"template": nope\n' >bad.jsonl
expect_fail "$MJ" prewarm --cache-dir "$C" bad.jsonl;   contains err "bad.jsonl:2"
printf '{"template": "no_such", "knobs": {}, "arch": "sm_120a"}\n{"template": "router_gemm", "knobs": {"H": 512, "E": 5000, "ROWS": 8, "NWARPS": 4}, "arch": "sm_120a"}\n' >unk.jsonl
expect_rc 1 "$MJ" prewarm --cache-dir "$C" unk.jsonl
contains out "2 failed"; contains err "no_such"; contains err "E = 5000"
# A knob given twice, or a boolean for an int knob, is a mistake: not "the last" or 1.
printf '{"template": "router_gemm", "knobs": {"H": 512, "E": 64, "ROWS": 8, "ROWS": 16, "NWARPS": 4}, "arch": "sm_120a"}\n' >dup.jsonl
expect_fail "$MJ" prewarm --cache-dir "$C" dup.jsonl;   contains err "dup.jsonl:1"; contains err "duplicate"
printf '{"template": "router_gemm", "knobs": {"H": 512, "E": 64, "ROWS": true, "NWARPS": 4}, "arch": "sm_120a"}\n' >bool.jsonl
expect_rc 1 "$MJ" prewarm --cache-dir "$C" bool.jsonl; contains err "ROWS of router_gemm must be an integer"
expect_fail "$MJ" prewarm --arch sm_75 m.jsonl;          contains err "sm_75"
expect_fail "$MJ" prewarm -j 0 m.jsonl
expect_fail "$MJ" prewarm nothere.jsonl;                  contains err "nothere.jsonl"
mkdir -p manifest_dir
expect_fail "$MJ" prewarm --cache-dir "$C" manifest_dir;  contains err "manifest_dir: is a directory"
expect_fail "$MJ" prewarm

# The command carries the product templates only (test fixtures live in the tests).
expect_rc 0 "$MJ" inspect templates
contains out "router_gemm"; contains out "knob H"; contains out "kernel oea_route("
grep -q fixture out && bad "inspect templates lists test fixtures" || ok
# Cross-knob constraints are listed with their reasons (one of each template's).
contains out "constraint K0 <= K  (phase 1 keeps at most top-k experts)"
contains out "constraint H % 64 == 0  (the gate row splits"
contains out "constraint MODE == 0 || SM >= 120"
# The repository stands alone: nothing it ships points at documents outside it.
if grep -rInE "(SPEC|DESIGN|STYLE)\.md|\.\./shared" "$SRC/include" "$SRC/README.md" "$SRC/docs" "$SRC/base" \
        "$SRC/gen" "$SRC/cache" "$SRC/runtime" "$SRC/templates" "$SRC/tools" "$SRC/examples" >refs 2>&1
then bad "references outside the repository: $(head -c 400 refs)"; else ok; fi
# The documentation: README.md stays a front door (at most 200 lines) holding the test command
# CI runs (.ci/run), and every relative link of README.md and docs/*.md names a file of the tree
# (and, into a .md file, one of its headings).
[ "$(wc -l <"$SRC/README.md")" -le 200 ] && ok || bad "README.md has $(wc -l <"$SRC/README.md") lines (at most 200)"
grep -qxF "bash scripts/test.sh" "$SRC/README.md" && grep -qF "bash scripts/test.sh" "$SRC/.ci/run" && ok \
    || bad "README.md's test command is not the one .ci/run runs"
python3 - "$SRC" <<'PY' >links 2>&1 && ok || bad "documentation links: $(head -c 600 links)"
import os, re, sys
src = sys.argv[1]
def slug(h):  # a heading's anchor as GitHub makes it
    h = re.sub(r"[^\w\- ]", "", h.strip().lower())
    return h.replace(" ", "-")
def anchors(path):
    text = re.sub(r"^```.*?^```", "", open(path, encoding="utf-8").read(), flags=re.M | re.S)
    return {slug(m) for m in re.findall(r"^#+ (.*)$", text, flags=re.M)}
docs = ["README.md"] + ["docs/" + f for f in sorted(os.listdir(os.path.join(src, "docs"))) if f.endswith(".md")]
broken = []
for doc in docs:
    path = os.path.join(src, doc)
    text = re.sub(r"^```.*?^```", "", open(path, encoding="utf-8").read(), flags=re.M | re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
        if not os.path.exists(full):
            broken.append("%s: %s (no such file)" % (doc, target))
        elif anchor and full.endswith(".md") and anchor not in anchors(full):
            broken.append("%s: %s (no such heading)" % (doc, target))
print("\n".join(broken))
sys.exit(1 if broken else 0)
PY
# The README's C example compiles against today's header.
awk '/^```c$/ {f = 1; next} /^```$/ {f = 0} f' "$SRC/README.md" >readme_example.c
[ -s readme_example.c ] && ${CC:-cc} -std=c11 -Wall -Wextra -Werror -fsyntax-only -I"$SRC/include" readme_example.c 2>cc_err \
    && ok || bad "README.md's C example does not compile: $(head -c 400 cc_err)"
expect_rc 0 "$MJ" inspect --cache-dir "$C" list
contains out "6 entries"; contains out "oea_route"; contains out "sm_80"
key=$(awk 'NR>1 && $2=="router_gemm" && / sm_120a / {print $1; exit}' out)
[ -n "$key" ] && ok || bad "no router_gemm sm_120a entry in the list"
expect_rc 0 "$MJ" inspect --cache-dir "$C" show "$key"
contains out "template   router_gemm"; contains out "registers"; contains out "source-sha256"
expect_rc 0 "$MJ" inspect --cache-dir "$C" show "$key" --source; contains out "#define ROWS"; contains out "MJ_KERNEL void router_gemm"
expect_rc 0 "$MJ" inspect --cache-dir "$C" show "$key" --ptx;    contains out ".entry router_gemm"
expect_rc 0 "$MJ" inspect --cache-dir "$C" show "$key" --log;    contains out "ptxas"
expect_rc 0 "$MJ" inspect --cache-dir "$C" show "$key" --json
json_check 'j["template"] == "router_gemm" and j["arch"] == "sm_120a" and j["ptxas"]["spill_stores"] == 0 and len(j["key"]) == 64'
# SASS: scripts/setup.sh installs nvdisasm; without one the command says how to get it.
expect_rc 0 "$MJ" inspect --cache-dir "$C" show "$key" --sass
contains out "router_gemm"; contains out "LDG.E"
expect_fail env PATH=/nonexistent MOEJIT_NVDISASM= "$MJ" inspect --cache-dir "$C" show "$key" --sass; contains err "nvdisasm"
# An expert GEMM entry says what it reads per active expert, and the floor on a named GPU:
# GLM-5 at TP 8 (H 6144, I_local 256) is 2654208 bytes an expert, 9 experts for one token on
# an RTX PRO 6000 at 1792 GB/s: 13.3 us.
printf '{"template":"moe_experts","knobs":{"MODE":0,"H":6144,"I":256,"K":8,"TPE":8,"NW1":8,"NW2":2,"NSUB":1,"PART":0,"STREAM":0,"DSTEPS":4,"DEAL":0,"QG":2},"arch":"sm_120a"}\n' >ex.jsonl
EC=$T/ecache
expect_rc 0 "$MJ" prewarm -q --cache-dir "$EC" ex.jsonl
ekey=$("$MJ" inspect --cache-dir "$EC" list | awk '$2=="moe_experts" {print $1; exit}')
expect_rc 0 "$MJ" inspect --cache-dir "$EC" show "$ekey" --roofline rtx-pro-6000
contains out "moves      2654208 bytes per active expert"; contains out "1.48 us per active expert on rtx-pro-6000"
contains out "reads 9 experts: 13.3 us"
# On a GPU each expert kernel is an entry of its own: the entry says which share it reads.
printf '{"template":"moe_experts","knobs":{"MODE":0,"H":6144,"I":256,"K":8,"TPE":8,"NW1":8,"NW2":1,"NSUB":1,"PART":2,"STREAM":0,"DSTEPS":4,"DEAL":0,"QG":2},"arch":"sm_120a"}\n' >up.jsonl
expect_rc 0 "$MJ" prewarm -q --cache-dir "$T/upcache" up.jsonl
ukey=$("$MJ" inspect --cache-dir "$T/upcache" list | awk '$2=="moe_experts" {print $1; exit}')
expect_rc 0 "$MJ" inspect --cache-dir "$T/upcache" show "$ukey" --roofline rtx-pro-6000
contains out "this entry is experts_up: w13 and its scales"
expect_rc 0 "$MJ" inspect --cache-dir "$C" show "$key" --roofline h200; contains out "only expert GEMM entries"
expect_fail "$MJ" inspect --cache-dir "$EC" show "$ekey" --roofline tpu-v5;  contains err "rtx-pro-6000"
expect_fail "$MJ" inspect --cache-dir "$C" show zzzz;           contains err "not a key"
expect_fail "$MJ" inspect --cache-dir "$C" show 0123456789abcdef0123;  contains err "no cache entry"
expect_rc 0 "$MJ" inspect --cache-dir "$C" --stats
contains out "entries     6"; contains out "quarantine  0"; contains out "writable    yes"
contains out "totals over 3 processes"
grep -qE '^  compiles +6$' out && ok || bad "stats totals: $(cat out)"
# A FIFO at stats.json blocks neither --stats nor a process's exit (which adds its totals),
# and a symlink there is never written through.
mv "$C/v1/stats.json" stats.saved && mkfifo "$C/v1/stats.json"
expect_rc 0 timeout 10 "$MJ" inspect --cache-dir "$C" --stats; contains out "totals      none yet"
expect_rc 0 timeout 60 "$MJ" prewarm --cache-dir "$C" -q m.jsonl; contains out "3 already cached"
[ -f "$C/v1/stats.json" ] && [ ! -p "$C/v1/stats.json" ] && ok || bad "stats.json after a FIFO: $(ls -l "$C/v1")"
echo '{"processes": 99}' >outside.json
rm "$C/v1/stats.json" && ln -s "$T/outside.json" "$C/v1/stats.json"
expect_rc 0 "$MJ" prewarm --cache-dir "$C" -q m.jsonl
[ "$(cat outside.json)" = '{"processes": 99}' ] && [ ! -L "$C/v1/stats.json" ] && ok || bad "stats.json symlink followed: $(cat outside.json)"
mv stats.saved "$C/v1/stats.json"
# The cap shown is the one in force: a $MOEJIT_CACHE_MAX_BYTES that is not a byte count is
# named in one warning and the default is used.
MOEJIT_CACHE_MAX_BYTES=1e9 expect_rc 0 "$MJ" inspect --cache-dir "$C" --stats
contains out 'cap         1073741824 bytes (default; $MOEJIT_CACHE_MAX_BYTES is not valid)'
contains err 'MOEJIT_CACHE_MAX_BYTES="1e9" is not a byte count'
[ "$(grep -c warning err)" = 1 ] && ok || bad "want one warning: $(cat err)"
MOEJIT_CACHE_MAX_BYTES=5000000 expect_rc 0 "$MJ" inspect --cache-dir "$C" --stats
contains out 'cap         5000000 bytes ($MOEJIT_CACHE_MAX_BYTES)'
[ ! -s err ] && ok || bad "a good cap warned: $(cat err)"
expect_rc 0 "$MJ" inspect --cache-dir "$C" verify;             contains out "6 entries ok, 0 bad"
# Corrupt one entry: verify finds it, quarantines it, and the next prewarm rebuilds it.
f=$(ls "$C"/v1/entries/*.mjc | head -1)
perl -e 'open(F, "+<:raw", $ARGV[0]) or die; seek(F, 200, 0); read(F, $b, 1); seek(F, 200, 0); print F chr(ord($b) ^ 1); close F' "$f"
expect_rc 1 "$MJ" inspect --cache-dir "$C" verify;             contains out "5 entries ok, 1 bad"
expect_rc 0 "$MJ" inspect --cache-dir "$C" --stats;            contains out "quarantine  1"
expect_rc 0 "$MJ" prewarm --cache-dir "$C" --arch sm_80 --arch sm_120a m.jsonl
contains out "1 compiled, 5 already cached"
# A FIFO at an entry's name (open() on it would wait for a writer forever): list shows it
# at once, verify counts it bad and moves it to quarantine, a lookup misses at once.
fkey=$(basename "$(ls "$C"/v1/entries/*.mjc | head -1)" .mjc)
rm "$C/v1/entries/$fkey.mjc" && mkfifo "$C/v1/entries/$fkey.mjc"
expect_rc 0 timeout 10 "$MJ" inspect --cache-dir "$C" list
contains out "${fkey:0:12}  (does not verify"; contains out "6 entries"
expect_rc 1 timeout 10 "$MJ" inspect --cache-dir "$C" verify; contains out "5 entries ok, 1 bad"
[ ! -e "$C/v1/entries/$fkey.mjc" ] && [ -n "$(find "$C/v1/quarantine" -name "$fkey.*.bad" -type p)" ] && ok ||
    bad "verify did not move the FIFO to quarantine: $(ls -l "$C/v1/entries" "$C/v1/quarantine")"
mkfifo "$C/v1/entries/$fkey.mjc"
expect_rc 0 timeout 60 "$MJ" prewarm --cache-dir "$C" --arch sm_80 --arch sm_120a m.jsonl
contains out "1 compiled, 5 already cached"
[ -f "$C/v1/entries/$fkey.mjc" ] && [ "$(find "$C/v1/quarantine" -name "$fkey.*.bad" -type p | wc -l)" = 2 ] && ok ||
    bad "prewarm did not quarantine the FIFO and store the entry: $(ls -l "$C/v1/quarantine")"
expect_rc 0 "$MJ" inspect --cache-dir "$C" gc --max-bytes 0;   contains out "evicted 6 entries"
expect_rc 0 "$MJ" inspect --cache-dir "$C" list;               contains out "0 entries"
expect_fail "$MJ" inspect --cache-dir "$C" gc --max-bytes -5
expect_fail "$MJ" inspect --cache-dir "$C" frob
expect_fail "$MJ" inspect
# An unsafe cache directory is refused with a warning, never read.
mkdir -p "$T/open" && chmod 777 "$T/open"
"$MJ" inspect --cache-dir "$T/open" list >out 2>err
[ $? != 0 ] && grep -q "writable by other users" err && ok || bad "unsafe directory not refused: $(cat err)"
# inspect is a view: on a directory that does not exist it fails and creates nothing.
for sub in list --stats verify gc "show 0123"; do
    expect_fail "$MJ" inspect --cache-dir "$T/nothere/cache" $sub
    contains err "cache directory $T/nothere/cache does not exist"
done
[ ! -e "$T/nothere" ] && ok || bad "inspect created $(find "$T/nothere")"
# verify on a read-only cache (uid 65534 on a 0500 cache, as for prewarm above) says what
# happened to a bad entry: nothing moved.
bad_name=$(printf '%064d' 0).mjc
printf 'not an entry' >"$RO/cache/v1/entries/$bad_name"
[ "$(id -u)" = 0 ] && chown -R 65534:65534 "$RO/cache"
find "$RO/cache" -type d -exec chmod 500 {} +
expect_rc 1 as_ro "$MJ" inspect --cache-dir "$RO/cache" verify
contains out "verify: 0 entries ok, 1 bad (left in place: cache directory $RO/cache is not writable"
grep -q "moved to quarantine" out && bad "verify claims a move: $(cat out)" || ok
[ -f "$RO/cache/v1/entries/$bad_name" ] && [ -z "$(ls "$RO/cache/v1/quarantine")" ] && ok || bad "read-only verify moved files"
expect_fail as_ro "$MJ" inspect --cache-dir "$RO/cache" gc --max-bytes 0; contains err "nothing can be evicted"
expect_rc 0 as_ro "$MJ" inspect --cache-dir "$RO/cache" --stats; contains out "writable    no"
find "$RO/cache" -type d -exec chmod 700 {} +

# ---- make-checkpoint ---------------------------------------------------------------------
GLM5="$SRC/tests/data/model/glm5_moe_config.json"
SMALL="--hidden 128 --intermediate 128 --experts 8 --topk 2"
expect_rc 0 "$MJ" make-checkpoint --help;    contains out "usage: moejit make-checkpoint"; contains out "--shard-mb"
expect_rc 0 "$MJ" make-checkpoint -V;        contains out "moejit 0."
expect_rc 0 "$MJ" --help;                    contains out "make-checkpoint"
# Two layers in 0.1 MB shards: an index, several shards, the overrides in config.json.
expect_rc 0 "$MJ" make-checkpoint --config "$GLM5" --out ck --seed 5 $SMALL --layers 3-4 --shard-mb 0.1
contains out "planned: MoE layers 3..4 (2 layers), hidden 128, intermediate 128, 8 experts, top-2, 1 shared"
contains out "wrote ck"
planned=$(sed -n 's/.*shards, \([0-9]*\) bytes.*/\1/p' out)
[ "$planned" = "$(cat ck/* | wc -c)" ] && ok || bad "planned $planned bytes, wrote $(cat ck/* | wc -c)"
python3 - ck <<'PY' && ok || bad "ck is not the checkpoint it should be: $(ls ck)"
import json, os, struct, sys
d = sys.argv[1]
c = json.load(open(os.path.join(d, "config.json")))
assert (c["hidden_size"], c["moe_intermediate_size"], c["n_routed_experts"], c["num_experts_per_tok"]) == (128, 128, 8, 2)
assert c["first_k_dense_replace"] == 3 and c["model_type"] == "glm_moe_dsa"   # the source's other keys
q = json.load(open(os.path.join(d, "hf_quant_config.json")))
assert q["quantization"]["quant_algo"] == "NVFP4" and q["quantization"]["group_size"] == 16
wm = json.load(open(os.path.join(d, "model.safetensors.index.json")))["weight_map"]
assert len(wm) == 2 * (2 + 9 * 12), len(wm)                 # router + bias, 8 experts + shared
shards = sorted(set(wm.values()))
assert len(shards) > 2 and sorted(f for f in os.listdir(d) if f.endswith(".safetensors")) == shards
for s in shards:                                             # every tensor where the index says
    b = open(os.path.join(d, s), "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    assert all(wm[k] == s for k in h if k != "__metadata__")
    assert n % 8 == 0 and max(v["data_offsets"][1] for k, v in h.items() if k != "__metadata__") == len(b) - 8 - n
e = "model.layers.4.mlp.experts.7.down_proj."
assert wm[e + "weight"] and wm[e + "weight_scale_2"] and "model.layers.4.mlp.gate.e_score_correction_bias" in wm
PY
# Defaults: the first MoE layer (first_k_dense_replace 3), one file, no index; --quant copied.
expect_rc 0 "$MJ" make-checkpoint --config "$GLM5" --quant "$SRC/tests/data/model/hf_quant_config.example.json" \
    --out ck1 --seed 5 $SMALL
contains out "planned: MoE layer 3, "; contains out "1 shard,"
[ -f ck1/model.safetensors ] && [ ! -e ck1/model.safetensors.index.json ] && ok || bad "one shard: $(ls ck1)"
cmp -s ck1/hf_quant_config.json "$SRC/tests/data/model/hf_quant_config.example.json" && ok || bad "--quant not copied"
# The same seed, the same layer: the same bytes.
expect_rc 0 "$MJ" make-checkpoint --config "$GLM5" --out ck2 --seed 5 $SMALL --layers 3
cmp -s ck1/model.safetensors ck2/model.safetensors && ok || bad "same seed and layer, different tensors"
# Refusals, before anything is written; nothing left behind.
before=$(ls -A | wc -l)
expect_fail "$MJ" make-checkpoint --config "$GLM5" --out ck --seed 5 $SMALL;             contains err "not empty"
expect_fail "$MJ" make-checkpoint --config "$GLM5" --out x --seed 5 $SMALL --layers 0-2; contains err "dense"
expect_fail "$MJ" make-checkpoint --config "$GLM5" --out x --seed 5 $SMALL --layers 90;  contains err "past the model's last layer"
expect_fail "$MJ" make-checkpoint --config "$GLM5" --out x --seed 5 --hidden 100;        contains err "hidden_size 100"
expect_fail "$MJ" make-checkpoint --config "$GLM5" --out x --seed 5 $SMALL --quant "$SRC/tests/data/config/hf_quant_fp8.json"
contains err "not supported"
expect_fail "$MJ" make-checkpoint --config "$GLM5" --out x --seed 5 --hidden 16384 --intermediate 16384 \
    --experts 4096 --layers 3-77
contains err "will not fit"
expect_fail "$MJ" make-checkpoint --config nonexistent.json --out x --seed 5;            contains err "nonexistent.json"
ln -s ck1 linked_out
expect_fail "$MJ" make-checkpoint --config "$GLM5" --out linked_out --seed 5 $SMALL;     contains err "symbolic link"
rm linked_out
[ "$(ls -A | wc -l)" = "$before" ] && [ ! -e x ] && ok || bad "failures left files: $(ls -A)"
# --config names the caller's own file: a symbolic link there is followed (base/file.c), as a
# Hugging Face cache snapshot's config.json is one; the same tensors as through the file.
ln -s "$GLM5" linked.json
expect_rc 0 "$MJ" make-checkpoint --config linked.json --out ck_linked --seed 5 $SMALL --layers 3
cmp -s ck1/model.safetensors ck_linked/model.safetensors && ok || bad "--config through a link: other tensors"
rm -rf linked.json ck_linked
# Mixtral and MiniMax-M2: block_sparse_moe names (w1 gate, w3 up, w2 down), the overrides on
# the family's keys (num_local_experts, intermediate_size), and the layer run on the
# interpreter, whole and over 2 EP ranks, against the CPU reference (--check).
FAM="$SRC/tests/data/config/families"
python3 - "$FAM/MiniMax-M2.5.abridged.json" minimax.json <<'PY' && ok || bad "could not write minimax.json"
import json, sys
c = json.load(open(sys.argv[1]))
del c["quantization_config"]          # FP8 as published; the NVFP4 export's hf_quant_config.json replaces it
json.dump(c, open(sys.argv[2], "w"))
PY
mknpy xf.npy '<f4' '(4, 128)' f $(awk 'BEGIN { srand(5); for (i = 0; i < 512; i++) printf "%.6f ", rand() * 2 - 1 }')
for fam in mixtral minimax; do
    cfg="$FAM/Mixtral-8x7B-v0.1.json"; [ $fam = minimax ] && cfg=minimax.json
    expect_rc 0 "$MJ" make-checkpoint --config "$cfg" --out ck_$fam --seed 3 $SMALL --layers 0-1
    contains out "planned: MoE layers 0..1 (2 layers), hidden 128, intermediate 128, 8 experts, top-2, 0 shared"
    python3 - ck_$fam $fam <<'PY' && ok || bad "ck_$fam does not have the family's names and keys"
import json, os, struct, sys
d, fam = sys.argv[1], sys.argv[2]
c = json.load(open(os.path.join(d, "config.json")))
assert (c["hidden_size"], c["intermediate_size"], c["num_local_experts"], c["num_experts_per_tok"]) == (128, 128, 8, 2)
assert "moe_intermediate_size" not in c and "n_routed_experts" not in c
b = open(os.path.join(d, "model.safetensors"), "rb").read()
h = json.loads(b[8:8 + struct.unpack("<Q", b[:8])[0]])
names = [k for k in h if k != "__metadata__"]
assert all(k.split(".")[2] in ("0", "1") and k.split(".")[3] == "block_sparse_moe" for k in names)
p = "model.layers.1.block_sparse_moe."
for e in (0, 7):
    for w in ("w1", "w2", "w3"):
        for f in ("weight", "weight_scale", "weight_scale_2", "input_scale"):
            assert "%sexperts.%d.%s.%s" % (p, e, w, f) in h
assert h[p + "experts.0.w1.weight"]["shape"] == [128, 64] and h[p + "experts.0.w2.weight"]["shape"] == [128, 64]
assert (p + "e_score_correction_bias" in h) == (fam == "minimax") and p + "gate.weight" in h
assert len(names) == 2 * (1 + (fam == "minimax") + 8 * 12)
q = json.load(open(os.path.join(d, "hf_quant_config.json")))
assert "model.layers.*.block_sparse_moe.gate" in q["quantization"]["exclude_modules"]
PY
    expect_rc 0 "$MJ" run --checkpoint ck_$fam --layer 1 --input xf.npy --output yf.npy --backend sim --check $DC
    contains out "check: relative L2"
    expect_rc 0 "$MJ" run --checkpoint ck_$fam --layer 1 --input xf.npy --output yf.npy --backend sim --ep 2 --check $DC
    contains err "interpreter on 2 ranks (EP)"
done
# Qwen2-MoE and Qwen3-Next: one shared expert (mlp.shared_expert.*, shared_expert_intermediate_size
# wide: 8 and 1 expert widths, kept so under --intermediate) scaled by sigmoid(x . gate), the gate
# mlp.shared_expert_gate.weight bf16 [1, H] (excluded from quantization, as ModelOpt does); run on
# the interpreter whole, over 2 TP ranks (each scales its slice by the whole gate) and over 2 EP
# ranks (rank 0 runs it), against the CPU reference (--check).
for fam in qwen2 qwen3next; do
    cfg="$FAM/Qwen2-57B-A14B.json"; ratio=8; [ $fam = qwen3next ] && cfg="$FAM/Qwen3-Next-80B-A3B-Thinking.json" && ratio=1
    expect_rc 0 "$MJ" make-checkpoint --config "$cfg" --out ck_$fam --seed 3 $SMALL --layers 0-1
    contains out "top-2, $ratio shared (one expert $((ratio * 128)) wide, sigmoid-gated)"
    python3 - ck_$fam $ratio <<'PY' && ok || bad "ck_$fam does not have Qwen's shared expert and its gate"
import json, os, struct, sys
d, ratio = sys.argv[1], int(sys.argv[2])
c = json.load(open(os.path.join(d, "config.json")))
assert (c["hidden_size"], c["moe_intermediate_size"], c["num_experts"]) == (128, 128, 8)
assert c["shared_expert_intermediate_size"] == ratio * 128
b = open(os.path.join(d, "model.safetensors"), "rb").read()
h = json.loads(b[8:8 + struct.unpack("<Q", b[:8])[0]])
p = "model.layers.1.mlp."
assert h[p + "shared_expert_gate.weight"]["dtype"] == "BF16" and h[p + "shared_expert_gate.weight"]["shape"] == [1, 128]
assert h[p + "shared_expert.gate_proj.weight"]["shape"] == [ratio * 128, 64]
assert h[p + "shared_expert.down_proj.weight"]["shape"] == [128, ratio * 64]
assert not any(".shared_experts." in k for k in h)
q = json.load(open(os.path.join(d, "hf_quant_config.json")))
assert "model.layers.*.mlp.shared_expert_gate" in q["quantization"]["exclude_modules"]
PY
    expect_rc 0 "$MJ" run --checkpoint ck_$fam --layer 1 --input xf.npy --output yf.npy --backend sim --check $DC
    contains out "check: relative L2"
    for split in "--tp 2" "--ep 2"; do
        expect_rc 0 "$MJ" run --checkpoint ck_$fam --layer 1 --input xf.npy --output yf.npy --backend sim $split --check $DC
        contains out "check: relative L2"
    done
done
# A shared_expert_gate the config does not declare (shared_expert_intermediate_size 0) is
# refused, naming it.
python3 - "$FAM/Qwen2-57B-A14B.json" qwen_noshared.json <<'PY' && ok || bad "could not write qwen_noshared.json"
import json, sys
c = json.load(open(sys.argv[1]))
c["shared_expert_intermediate_size"] = 0
json.dump(c, open(sys.argv[2], "w"))
PY
expect_rc 0 "$MJ" make-checkpoint --config qwen_noshared.json --out ck_qwen_noshared --seed 3 $SMALL --layers 1
python3 - ck_qwen_noshared/model.safetensors <<'PY' && ok || bad "could not add a gate to ck_qwen_noshared"
import json, struct, sys
p = sys.argv[1]
b = open(p, "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h, data = json.loads(b[8:8 + n]), b[8 + n:]
assert not any("shared_expert" in k for k in h)
h["model.layers.1.mlp.shared_expert_gate.weight"] = {"dtype": "BF16", "shape": [1, 128],
    "data_offsets": [len(data), len(data) + 256]}
t = json.dumps(h).encode()
t += b" " * (-len(t) % 8)
open(p, "wb").write(struct.pack("<Q", len(t)) + t + data + b"\x80\x3f" * 128)
PY
expect_fail "$MJ" run --checkpoint ck_qwen_noshared --layer 1 --input xf.npy --output yf.npy --backend sim $DC
contains err "model.layers.1.mlp.shared_expert_gate.weight"; contains err "sigmoid gate, which the config does not declare"
# A tensor of the block that the config makes the loader skip is refused naming it: a selection
# bias on Mixtral, whose router has none.
python3 - ck_mixtral/model.safetensors <<'PY' && ok || bad "could not add a bias to ck_mixtral"
import json, struct, sys
p = sys.argv[1]
b = open(p, "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h, data = json.loads(b[8:8 + n]), b[8 + n:]
h["model.layers.1.block_sparse_moe.e_score_correction_bias"] = {"dtype": "F32", "shape": [8],
    "data_offsets": [len(data), len(data) + 32]}
t = json.dumps(h).encode()
t += b" " * (-len(t) % 8)
open(p, "wb").write(struct.pack("<Q", len(t)) + t + data + struct.pack("<8f", *[0.5] * 8))
PY
expect_fail "$MJ" run --checkpoint ck_mixtral --layer 1 --input xf.npy --output yf.npy --backend sim $DC
contains err "model.layers.1.block_sparse_moe.e_score_correction_bias"; contains err "a selection bias"
expect_rc 2 "$MJ" make-checkpoint --out x --seed 5;                       contains err "--config is required"
expect_rc 2 "$MJ" make-checkpoint --config "$GLM5" --seed 5;              contains err "--out is required"
expect_rc 2 "$MJ" make-checkpoint --config "$GLM5" --out x;               contains err "--seed is required"
expect_rc 2 "$MJ" make-checkpoint --config "$GLM5" --out x --seed -1;     contains err "--seed"
expect_rc 2 "$MJ" make-checkpoint --config "$GLM5" --out x --seed 1 --layers 5-3; contains err "before the first"
expect_rc 2 "$MJ" make-checkpoint --config "$GLM5" --out x --seed 1 --layers 3x; contains err "--layers"
expect_rc 2 "$MJ" make-checkpoint --config "$GLM5" --out x --seed 1 --shard-mb 0; contains err "--shard-mb"
expect_rc 2 "$MJ" make-checkpoint --config "$GLM5" --out x --seed 1 extra; contains err "unexpected argument"
[ ! -e x ] && ok || bad "a usage error wrote x"

# ---- bench -------------------------------------------------------------------------------
# A small model (H 256, E 16, top-4, TP 2: experts of 128 rows a rank), few reps and calls.
BENCH="bench --config $GLM5 $Q --hidden 256 --intermediate 256 --experts 16 --topk 4 --tp 2 --batch 1-8
       --k0-policy 1-3:4,4-:2 --bench-batch 1,2,8 --k0 8,4,2 --iters 5 --copy-mb 8 --cache-dir $T/benchcache -q"
expect_rc 0 "$MJ" bench --help; contains out "--bench-batch"; contains out "--k0-policy"
expect_rc 2 "$MJ" bench --k0 0;                 contains err "--k0"
expect_rc 2 "$MJ" bench --tp 2 --ep 2;          contains err "one of --tp and --ep"
expect_rc 2 "$MJ" bench --sim-intermediate 65;  contains err "multiple of 64"
expect_rc 2 "$MJ" bench --bench-batch 300;      contains err "out of 1..256"
expect_rc 2 "$MJ" bench --config "$GLM5" --checkpoint ck1; contains err "not both"
expect_rc 2 "$MJ" bench --frobnicate;           contains err "unknown option"
expect_fail "$MJ" bench --config "$GLM5" $Q --hidden 256 --intermediate 256 --experts 16 --topk 4 --tp 8
contains err "multiples of 64"
# GLM-4.5-Air (I 1408) at TP 8: 176-row slices; the refusal says what works instead.
expect_fail "$MJ" prewarm --config "$SRC/tests/data/config/families/GLM-4.5-Air.json" $Q --tp 8 --dry-run
contains err "slices of 176 rows"; contains err "up to 8 ranks, TP 2 or EP 2, 4, 8 works"
# Without a GPU: the plan compiled (cold, disk, memory), the launch path's host time, the
# bytes counted equal to the floor, and the floor on named GPUs.
MOEJIT_COMPILE_THREADS=2 MOEJIT_LIBCUDA=/nonexistent/libcuda.so.1 expect_rc 0 "$MJ" $BENCH --reps 1 --json
json_check 'j["gpu"] is None and j["target"] == "sm_120a" and j["config"]["i_local"] == 128'
# ...and the whole plan at once, as prepare and prewarm compile it, on the pool's threads
json_check 'j["plan"]["compile_threads"] == 2 and 0 < j["plan"]["cold_plan_ms"] < 60000 and j["plan"]["cold_total_ms"] > 0'
json_check 'any("no GPU" in n for n in j["notes"]) and any("above top-k" in n for n in j["notes"])'
json_check 'len(j["plan"]["specializations"]) >= 3 and all(r["cold_ms"] > 0 and r["disk_ms"] > 0 and r["mem_us"] > 0 for r in j["plan"]["specializations"])'
json_check '{r["what"] for r in j["plan"]["specializations"]} == {"router GEMM", "routing", "experts"}'
json_check '[(r["B"], r["k0"]) for r in j["launch_path"]] == [(1, 4), (2, 4), (8, 2)] and all(r["launches"] >= 4 and r["host_us"] > 0 for r in j["launch_path"])'
json_check '[(r["B"], r["k0"]) for r in j["bytes"]] == [(b, k) for k in (4, 2) for b in (1, 2, 8)]'
json_check 'all(r["read"] == r["floor"] and r["ratio"] == 1.0 and 1 <= r["active"] <= 16 for r in j["bytes"])'
json_check 'all(r["model_bytes"] == 2*16*256 + (r["active"] + 1) * j["config"]["expert_bytes"] for r in j["bytes"])'
json_check 'all(abs(r["floor_us"]["h200"] - r["model_bytes"] / 4.8e6) < 1e-3 for r in j["bytes"])'
json_check 'all(a["active"] >= b["active"] for a in j["bytes"] for b in j["bytes"] if a["B"] == b["B"] and a["k0"] > b["k0"])'
# The performance model (bench --predict, no GPU) of GLM-5 at TP 8, B 1, 8, 32: every
# kernel of a forward with a prediction above its floor and a bound, the layer's sum; it
# reads SASS, so it needs nvdisasm (else a skip that says so).
expect_rc 2 "$MJ" bench --predict h300;         contains err "unknown GPU"
if command -v nvdisasm >/dev/null || [ -x /usr/local/cuda/bin/nvdisasm ]; then
  MOEJIT_LIBCUDA=/nonexistent/libcuda.so.1 expect_rc 0 "$MJ" bench --tp 8 --batch 1-32 \
    --bench-batch 1,8,32 --k0 8,4 --no-compile --no-sim --predict h200 --cache-dir "$T/predcache" -q --json
  json_check 'j["target"] == "sm_90a" and j["predict"]["gpu"] == "h200" and j["predict"]["active_from"] == "expected" and [(r["B"], r["k0"]) for r in j["predict"]["rows"]] == [(b, k) for k in (8, 4) for b in (1, 8, 32)]'
  json_check 'all(sorted(r["kernels"]) == ["experts_down", "experts_up", "oea_route", "router_gemm"] and r["mode"] == "W4A16" for r in j["predict"]["rows"])'
  json_check 'all(k["predicted_us"] >= k["floor_us"] > 0 and k["bound"] in ("memory", "issue", "latency", "waves") for r in j["predict"]["rows"] for k in list(r["kernels"].values()) + [r["layer"]])'
  json_check 'all(abs(r["layer"]["predicted_us"] - sum(k["predicted_us"] for k in r["kernels"].values())) < 1e-3 * r["layer"]["predicted_us"] and r["layer"]["of_floor"] >= 1 for r in j["predict"]["rows"])'
  json_check 'all(r["kernels"]["experts_up"]["hot_loop"]["tensor"] > 0 and r["kernels"]["oea_route"]["bound"] == "waves" for r in j["predict"]["rows"])'
  json_check 'all(a["layer"]["predicted_us"] < b["layer"]["predicted_us"] for a in j["predict"]["rows"] for b in j["predict"]["rows"] if a["k0"] == b["k0"] and a["B"] < b["B"])'
  # oea_route's pieces read from its SASS (a pick's REDUX loop, a token's loop, the dispatch),
  # a warp's instructions made of them: OEA at B 32 (k0 4, a token a warp) scores once
  json_check 'all(0 < r["kernels"]["oea_route"]["route_sass"]["pick"] < r["kernels"]["oea_route"]["route_sass"]["token"] and r["kernels"]["oea_route"]["route_sass"]["dispatch"] > 0 for r in j["predict"]["rows"])'
  # and the block's sigmoid scores (block_scores, its loop a pair's math): at B 32 on 32 warps
  # each thread 8 of the 32 x 256 pairs
  json_check 'all(abs(k["insts_warp"] - (s["outside"] + s["dispatch"] + s["token"] + 8 * s["pick"] + s["score_once"] + 8 * s["score"])) < 1e-6 and 0 < s["score"] < s["score_once"] + s["score"] < 200 for r in j["predict"]["rows"] if r["B"] == 32 for k in [r["kernels"]["oea_route"]] for s in [k["route_sass"]])'
  # sm_90a: every kernel after the router GEMM is a programmatic dependent, with its fixed cost
  json_check 'all([n for n, k in r["kernels"].items() if k["pdl"]] == ["oea_route", "experts_up", "experts_down"] for r in j["predict"]["rows"]) and j["predict"]["assumptions"]["pdl_launch_us"] < j["predict"]["assumptions"]["launch_us"]'
  # B 32 (TPE 32): a few routed rows an expert, so the one-group registers' path runs, and
  # the hot loops are read from the TPE 8 twin: up's within 15 % of B 8's (B 8's is STREAM's,
  # whose loop also adds or stores its pieces' sums), not the groups' loop's (down's: checked below)
  json_check 'all(abs(a - b) <= 0.15 * a for a, b in [[r["kernels"][k]["hot_loop"]["insts"] for r in j["predict"]["rows"] if r["k0"] == 8 and r["B"] in (8, 32)] for k in ("experts_up",)])'
  # sm_90a's down: 8 warps a block (256 threads) at B 1 to 32, items of 4 k-steps (a whole
  # expert at I 256) at every B: its token groups one at a time in registers, so no fragments
  # wait in shared memory and 8 warps with items of 4 fit 3 blocks an SM at TPE 32 too (2
  # k-steps there before: twice the items, each with its own issue, epilogue and next expert)
  json_check 'all(r["kernels"]["experts_down"]["threads"] == 256 and r["kernels"]["experts_down"]["hot_loop"]["tensor"] == 16 and r["kernels"]["experts_down"]["blocks_per_sm"] == 3 for r in j["predict"]["rows"])'
  # up at B 1 to 8 (TPE 8, STREAM): blocks of one warp, as many as the H200 holds at once
  # (132 SMs times its blocks an SM, rounded to a multiple of 4 warps: one round, every
  # scheduler as busy), each an even run of the (active + 1 shared) x 16 tiles x 48 half-run
  # pieces: a warp's k-steps, 2 a piece
  json_check 'all(u["threads"] == 32 and u["blocks"] == 132 * u["busiest_sm_blocks"] and u["busiest_sm_blocks"] % 4 == 0 and u["blocks_per_sm"] - 4 < u["busiest_sm_blocks"] <= u["blocks_per_sm"] and u["iters_warp"] == 2 * -(-(r["active"] + 1) * 16 * 48 // u["blocks"]) and u["iters_warp"] >= 4 for r in j["predict"]["rows"] if r["B"] <= 8 for u in [r["kernels"]["experts_up"]])'
  # up's fold (a split tile's later pieces, added in order by the warp that completes it):
  # 16 pieces' float pairs in flight a lane (templates/moe_experts.cu, up_fold), so the
  # busiest tile (the shared expert's: min(B, 8) tokens) waits on L2 ceil(tokens / 2) x 3
  # times (a piece's two floats at a time, it was 48 x 4 for each pair of values); none in
  # the tiles' launch at B 32
  json_check 'all(u["hot_loop"]["tail_bytes"] >= 128 and u["tail_trips"] == -(-min(r["B"], 8) // 2) * -(-48 * 8 // u["hot_loop"]["tail_bytes"]) and u["tail_us"] > 0 for r in j["predict"]["rows"] if r["B"] <= 8 for u in [r["kernels"]["experts_up"]]) and all(r["kernels"]["experts_up"]["tail_us"] == 0 for r in j["predict"]["rows"] if r["B"] > 8)'
  # and the rest of what the warp completing a tile runs (the `if (last)` around the fold: the
  # fold's passes and its last trip of fewer pieces, the SwiGLU epilogue) found in the SASS,
  # counted once a tile, not a segment
  json_check 'all(150 <= u["hot_loop"]["finish"] <= 500 and u["outside"] > u["hot_loop"]["finish"] + u["hot_loop"]["tail_insts"] for r in j["predict"]["rows"] if r["B"] <= 8 for u in [r["kernels"]["experts_up"]])'
  # up's piece end in STREAM (a piece's sums added to the running sum, stored where the run
  # began inside the tile, zeroed: about 32 instructions behind a branch) counted once a piece
  # of 2 k-steps, not every step; the tiles' launch at B 32 has none
  json_check 'all(16 <= r["kernels"]["experts_up"]["hot_loop"]["piece_end"] <= 48 if r["B"] <= 8 else r["kernels"]["experts_up"]["hot_loop"]["piece_end"] == 0 for r in j["predict"]["rows"])'
  # a work item's start, before the hot loop: the active list, an expert's offset and count,
  # its rows' entries, the activations: 3 to 6 dependent loads in up and down (reported)
  json_check 'all(3 <= r["kernels"][k]["hot_loop"]["pre_chain"] <= 6 for r in j["predict"]["rows"] for k in ("experts_up", "experts_down"))'
  # W4A16's k-steps on sm_90a: the codes bit-placed (runtime/weights/pack.c), so a bf16 pair
  # is a shift and a mask (in code order: up 325 instructions, 246 integer; down 978, 666),
  # and up's halves unrolled (rolled: 372, 286)
  json_check 'all(k["insts"] <= 275 and 100 <= k["int"] <= 195 and k["tensor"] == 8 for r in j["predict"]["rows"] for k in [r["kernels"]["experts_up"]["hot_loop"]])'
  # down's hot loop is the ring of a chunk's items (the chunk's places read outside it), an
  # item's slot carrying its rows' top-k entries (the weight its one dependent load: chain 1),
  # the epilogue by row: 550 at 4 k-steps (601, 488 at 2, before the dequantization's
  # placement; 842 and 679 with the entry and then the weight loaded an element; 880 and 703
  # with every expert's id, offset and searches in it)
  json_check 'all(k["insts"] <= 600 and k["int"] <= 380 and k["chain"] == 1 for r in j["predict"]["rows"] for k in [r["kernels"]["experts_down"]["hot_loop"]])'
  # oea_route's dispatch: ranks by bit masks and a scan with every thread (about 450; 667 with
  # per-warp segments and warp 0's serial walks)
  json_check 'all(r["kernels"]["oea_route"]["route_sass"]["dispatch"] <= 520 for r in j["predict"]["rows"])'
  # oea_route's picks at E 256: a lane sorts its 8 experts once a token, so a pick is two
  # REDUXes and the winning lane's step down its list (79 when that lane scanned its experts
  # again)
  json_check 'all(r["kernels"]["oea_route"]["route_sass"]["pick"] <= 40 for r in j["predict"]["rows"])'
  # and its short dispatch (B x k <= 32: warp 0 sorts the entries across its lanes, every
  # thread binary-searches its experts' offsets; about 270), which B 1's warp counts in place
  # of the whole one (about 450); left out of the blocks of 16 and 32 warps (B 5 to 32 at top-8)
  json_check 'all((0 < s["dispatch_small"] <= 300 < s["dispatch"]) if r["B"] <= 4 else s["dispatch_small"] == 0 for r in j["predict"]["rows"] for s in [r["kernels"]["oea_route"]["route_sass"]])'
  # B 5 to 8 route on 16 warps (4 sigmoid pairs a thread, not 8), B 1 on 8 (the short dispatch)
  json_check 'all(r["kernels"]["oea_route"]["threads"] == (256 if r["B"] <= 4 else 512 if r["B"] <= 16 else 1024) for r in j["predict"]["rows"])'
  # at B 1 the token's 256 experts over the block's 256 threads: the score loop once
  json_check 'all(abs(k["insts_warp"] - (s["outside"] + s["dispatch_small"] + s["token"] + 8 * s["pick"] + s["score_once"] + s["score"])) < 1e-6 for r in j["predict"]["rows"] if r["B"] == 1 for k in [r["kernels"]["oea_route"]] for s in [k["route_sass"]])'
  # the router GEMM on the bf16 MMA: 16 experts a block, H in 12 parts (192 blocks of 4 warps
  # up to 64 rows), 8 MMAs a run of 128 k at B <= 8 (the FMA kernel's loop had none: 461
  # warp-instructions a group of 8 rows)
  json_check 'all(k["blocks"] == 192 and k["threads"] == 128 and k["hot_loop"]["tensor"] == (8 if r["B"] <= 8 else 32) and k["hot_loop"]["insts"] <= (100 if r["B"] <= 8 else 260) for r in j["predict"]["rows"] for k in [r["kernels"]["router_gemm"]])'
  # up, a programmatic dependent, prefetches the shared expert's weights and scales into L2
  # while the routing runs (one block: 3 us and more, the memory idle): all of them, which
  # its memory term leaves out (its floor keeps them); nothing else is prefetched
  json_check 'all(abs(u["prefetched"] / (u["bytes"] / (r["active"] + 1)) - 1) < 1e-5 and abs(u["memory_us"] - u["floor_us"] * (1 - u["prefetched"] / u["bytes"])) < 1e-5 * u["floor_us"] and all(k["prefetched"] == 0 for n, k in r["kernels"].items() if n not in ("experts_up", "experts_down")) for r in j["predict"]["rows"] for u in [r["kernels"]["experts_up"]])'
  # and down's, which stay in L2 (60 MiB) while up reads its bytes where those and down's
  # prefetched fit in half of it: B 1 (9 experts' 16 MB at k0 8), not B 8 or 32
  json_check 'all((abs(d["prefetched"] / (d["bytes"] / (r["active"] + 1)) - 1) < 1e-5) if r["B"] == 1 else d["prefetched"] == 0 for r in j["predict"]["rows"] for d in [r["kernels"]["experts_down"]])'
  # the launch floor: the first kernel's launch, the programmatic dependents', then the bytes
  # but those read from L2 after a prefetch under the routing
  json_check 'all(abs(r["layer"]["launch_floor_us"] - (r["layer"]["floor_us"] - sum(k["floor_us"] - k["memory_us"] for k in r["kernels"].values())) - a["launch_us"] - 3 * a["pdl_launch_us"]) < 1e-3 and r["layer"]["launch_floor_us"] <= r["layer"]["predicted_us"] for r in j["predict"]["rows"] for a in [j["predict"]["assumptions"]])'
  MOEJIT_LIBCUDA=/nonexistent/libcuda.so.1 expect_rc 0 "$MJ" bench --tp 8 --batch 1-8 --bench-batch 1 \
    --k0 8 --no-compile --no-sim --predict rtx-pro-6000 --cache-dir "$T/predcache" -q
  contains out "the performance model on rtx-pro-6000"; contains out "model assumptions"; contains out "experts_down"
  # B 16 (TPE 16): down's one-group path runs (about 1.3 rows an expert), so its hot loop is the
  # TPE 8 twin's (2 k-steps, one group: 8 MMAs), not both paths' (16); up keeps its own (both
  # token groups' MMAs on its one path: 16)
  MOEJIT_LIBCUDA=/nonexistent/libcuda.so.1 expect_rc 0 "$MJ" bench --tp 8 --batch 1-16 --bench-batch 16 \
    --k0 8 --no-compile --no-sim --predict rtx-pro-6000 --mode w4a16 --cache-dir "$T/predcache" -q --json
  json_check '[r["B"] for r in j["predict"]["rows"]] == [16] and all(r["kernels"]["experts_down"]["hot_loop"]["tensor"] == 8 and r["kernels"]["experts_up"]["hot_loop"]["tensor"] == 16 for r in j["predict"]["rows"])'
  # A softmax model's routing (Qwen3: a token's scores its warp's, no block_scores; softmax's
  # own loops load global memory with no pick inside, which --predict once took for the
  # token loop and refused with "no token loop with picks"): top-8 at B 1
  MOEJIT_LIBCUDA=/nonexistent/libcuda.so.1 expect_rc 0 "$MJ" bench --config "$SRC/tests/data/config/families/Qwen3-30B-A3B.json" \
    --quant "$SRC/tests/data/model/hf_quant_config.example.json" --tp 1 --batch 1-4 --bench-batch 1 --k0 4 --no-compile \
    --no-sim --predict h200 --mode w4a16 --cache-dir "$T/predcache" -q --json
  json_check 'all(s["score"] == 0 and 0 < s["pick"] < s["token"] and abs(k["insts_warp"] - (s["outside"] + s["dispatch_small"] + s["token"] + 8 * s["pick"])) < 1e-6 for r in j["predict"]["rows"] for k in [r["kernels"]["oea_route"]] for s in [k["route_sass"]])'
else
  echo "SKIP bench --predict: no nvdisasm"
fi
MOEJIT_LIBCUDA=/nonexistent/libcuda.so.1 expect_rc 0 "$MJ" $BENCH --no-compile
contains out "host time of one forward's launch path"; contains out "no GPU"; contains out "router GEMM"
# The GPU paths' host logic through the stub driver: kernels do not run, a kernel takes 10 us
# and a copy moves 1000 GB/s on the stub's clock; every forward captured in a CUDA graph
# without a call the capture forbids.
MJ_STUB_LOG=$T/bstub.log MOEJIT_LIBCUDA=$STUB expect_rc 0 "$MJ" $BENCH --no-compile --json
json_check 'j["gpu"]["device"] == "moejit stub GPU" and j["gpu"]["target"] == "sm_120a" and abs(j["gpu"]["copy"]["gbps"] - 1000) < 1e-3'
json_check 'len(j["gpu"]["routing"]) == 6 and all(abs(r["us"] - 20) < 1e-3 for r in j["gpu"]["routing"])'
json_check 'sorted({r["mode"] for r in j["gpu"]["experts"]}) == ["W4A16", "W4A4"] and len(j["gpu"]["experts"]) == 12'
json_check '[r["what"] for r in j["gpu"]["layer"]] == ["layer", "layer_graph"] * 6 and all(r["us"] > 0 and r["bytes"] > 0 for r in j["gpu"]["layer"])'
json_check 'all(a["us"] == b["us"] for a, b in zip(j["gpu"]["layer"][::2], j["gpu"]["layer"][1::2]))'
json_check 'set(j["gpu"]["goals"]) == {"experts_bandwidth", "oea_speedup"} and j["gpu"]["goals"]["oea_speedup"]["speedup"] is None'
[ "$(grep -c 'cuStreamEndCapture: [1-9]' bstub.log)" = 24 ] && ok || bad "want 24 captured graphs: $(grep -c cuStreamEndCapture bstub.log)"
grep -q "refused\|without a current context\|invalidated\|^unordered" bstub.log && bad "bench broke a driver rule: $(grep -m3 'refused\|context\|invalidated\|^unordered' bstub.log)" || ok
# Cold L2: before each timed call (31 rows x 5 calls) a write of twice the stub's 128 MiB L2,
# enqueued just before the call's first event (outside the window: routing's 2 kernels time
# exactly 20 us above, not 20 us + the 268 us the write takes on the stub's clock).
json_check 'j["gpu"]["cold_l2"] is True and j["gpu"]["l2_bytes"] == 128 << 20 and j["gpu"]["flush_bytes"] == 256 << 20'
[ "$(grep -c '^cuMemsetD8Async 268435456 bytes$' bstub.log)" = 155 ] && ok || bad "want 155 L2 flushes: $(grep -c cuMemsetD8Async bstub.log)"
[ "$(grep -A1 '^cuMemsetD8Async' bstub.log | grep -c '^cuEventRecord')" = 155 ] && ok || bad "an L2 flush not followed by the timed call's first event"
MOEJIT_LIBCUDA=$STUB expect_rc 0 "$MJ" $BENCH --no-compile --k0 4 --bench-batch 8 --no-sim
contains out "cold L2: 256 MiB written before each timed call"
expect_rc 0 "$MJ" bench --help; contains out "cold-L2"
# With a GPU (the stub's) and --predict, the model runs after the GPU's tables and takes the
# active experts the GPU's routing measured (the stub runs no kernel: 0, but the same ones)
if command -v nvdisasm >/dev/null || [ -x /usr/local/cuda/bin/nvdisasm ]; then
  MOEJIT_LIBCUDA=$STUB expect_rc 0 "$MJ" $BENCH --no-compile --no-sim --json --predict rtx-pro-6000
  json_check 'j["predict"]["active_from"] == "gpu" and [(r["B"], r["k0"], r["active"]) for r in j["predict"]["rows"]] == [(r["B"], r["k0"], r["active"]) for r in j["gpu"]["experts"] if r["mode"] == "W4A16"]'
fi
# --predict auto: the GPU this bench finds, by the driver's name of it (run.sh's); a name the
# model does not know is a note (the measurements stand), no GPU an error that says to name one
if command -v nvdisasm >/dev/null || [ -x /usr/local/cuda/bin/nvdisasm ]; then
  MJ_STUB_NAME="NVIDIA H200" MJ_STUB_CC=9.0 MOEJIT_LIBCUDA=$STUB expect_rc 0 "$MJ" $BENCH --no-compile --no-sim --json --predict auto
  json_check 'j["gpu"]["device"] == "NVIDIA H200" and j["predict"]["gpu"] == "h200" and j["predict"]["active_from"] == "gpu"'
fi
MOEJIT_LIBCUDA=$STUB expect_rc 0 "$MJ" $BENCH --no-compile --no-sim --json --predict auto
json_check '"predict" not in j and "gpu" in j and any("knows no GPU named like" in n and "moejit stub GPU" in n for n in j["notes"])'
expect_rc 1 "$MJ" $BENCH --no-compile --no-sim --no-gpu --predict auto
contains err "no GPU here (or --no-gpu): name the one to model"
# The model failing (here: no nvdisasm) fails the command, but the GPU's measurements are
# still printed (run.sh's bench.json keeps them)
MOEJIT_NVDISASM=/nonexistent/nvdisasm MOEJIT_LIBCUDA=$STUB expect_rc 1 "$MJ" $BENCH --no-compile --no-sim --json --predict rtx-pro-6000
contains err "nvdisasm"
json_check 'len(j["gpu"]["experts"]) > 0 and "predict" not in j and any("--predict failed" in n for n in j["notes"])'
# An H200 (sm_90): the plan and the GPU runs for sm_90a, W4A4 left out and said so.
MJ_STUB_CC=9.0 MOEJIT_LIBCUDA=$STUB expect_rc 0 "$MJ" $BENCH --no-compile --json --k0 4 --bench-batch 8 --no-sim
json_check 'j["target"] == "sm_90a" and j["gpu"]["target"] == "sm_90a" and {r["mode"] for r in j["gpu"]["experts"]} == {"W4A16"}'
json_check 'j["gpu"]["l2_bytes"] == 60 << 20 and j["gpu"]["flush_bytes"] == 120 << 20'
json_check 'j["launch_path"] is None and j["bytes"] is None and len(j["gpu"]["layer"]) == 2'
json_check 'any("W4A4 needs sm_120a" in n for n in j["notes"])'
# A forward that fails inside a capture whose end succeeds: one error line, and (in the ASan
# build, where a leak report would add lines) the captured graph freed.
MJ_STUB_FAIL_CAPTURED_LAUNCH=1 MOEJIT_LIBCUDA=$STUB expect_fail "$MJ" $BENCH --no-compile --no-sim --json --k0 4 --bench-batch 1
contains err "capturing the layer"
# --no-gpu skips the GPU even with one.
MOEJIT_LIBCUDA=$STUB expect_rc 0 "$MJ" $BENCH --no-compile --json --no-gpu --k0 4 --bench-batch 1
json_check 'j["gpu"] is None and any("--no-gpu" in n for n in j["notes"])'
# A bench that did not do its job fails: no specialization compiled (no NVRTC), or a driver
# that loads but is not one (only no driver or no device is "no GPU").
MOEJIT_NVRTC=/nonexistent MOEJIT_LIBCUDA=$STUB expect_rc 1 "$MJ" $BENCH --reps 1 --no-sim --no-gpu
contains err "did not compile for sm_120a"; contains err "MOEJIT_NVRTC=/nonexistent"
MOEJIT_LIBCUDA=libm.so.6 expect_rc 1 "$MJ" $BENCH --no-compile --no-sim; contains err "has no symbol cuGetErrorName"
MOEJIT_LIBCUDA=/nonexistent/libcuda.so.1 expect_rc 0 "$MJ" $BENCH --no-compile --no-sim; contains out "no GPU"
# --checkpoint: the layer the measurements are of (rank 0's slice) is loaded, so validated,
# with a GPU or without; a checkpoint whose layer does not load is an error naming the tensor,
# before anything is measured. A small checkpoint (H 128, E 8, top-2).
"$MJ" make-checkpoint --config "$GLM5" --out bck --seed 9 $SMALL >/dev/null && cp -r bck bcknan && ok || bad "bench: no checkpoint"
python3 - bcknan model.layers.3.mlp.experts.7.down_proj.weight_scale <<'PY' && ok || bad "could not plant a NaN scale in bcknan"
import json, os, struct, sys
d, name = sys.argv[1], sys.argv[2]
p = os.path.join(d, "model.safetensors")
b = bytearray(open(p, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
begin = json.loads(b[8:8 + n])[name]["data_offsets"][0]
b[8 + n + begin + 3] = 0x7F                     # the e4m3 NaN
open(p, "wb").write(b)
PY
BCK="--k0 2 --bench-batch 1 --iters 2 --copy-mb 8 --no-compile --no-sim --cache-dir $T/benchcache -q"
MOEJIT_LIBCUDA=/nonexistent/libcuda.so.1 expect_rc 0 "$MJ" bench --checkpoint bck $BCK --json
json_check 'j["gpu"] is None and j["config"]["checkpoint"] == "bck" and j["config"]["experts"] == 8'
for split in "" "--tp 2"; do
    MOEJIT_LIBCUDA=/nonexistent/libcuda.so.1 expect_fail "$MJ" bench --checkpoint bcknan $BCK $split
    contains err "bcknan: loading layer 3"; contains err "experts.7.down_proj.weight_scale"; contains err "NaN"
    expect_fail "$MJ" bench --checkpoint bcknan $BCK --no-gpu --json $split; contains err "experts.7.down_proj.weight_scale"
done
# With a (stub) GPU the layer loaded up front is the one the GPU's run measures.
MOEJIT_LIBCUDA=$STUB expect_rc 0 "$MJ" bench --checkpoint bck $BCK --json
json_check 'j["gpu"]["device"] == "moejit stub GPU" and [r["what"] for r in j["gpu"]["layer"]] == ["layer", "layer_graph"]'
MOEJIT_LIBCUDA=$STUB expect_fail "$MJ" bench --checkpoint bcknan $BCK; contains err "experts.7.down_proj.weight_scale"
# The default k0 policy at most top-k; a given one above top-k stays an error.
expect_rc 0 "$MJ" bench --config "$GLM5" $Q --topk 4 --no-compile --no-sim --no-gpu --json -q
json_check 'j["plan"]["k0_policy"] == "1-3:4,4-:4"'
expect_rc 2 "$MJ" bench --config "$GLM5" $Q --topk 4 --k0-policy 1-3:8 --no-compile --no-sim --no-gpu -q
contains err "k0 8 must be in 1..4"

# ---- models ------------------------------------------------------------------------------
expect_rc 0 "$MJ" models --help;  contains out "usage: moejit models"; contains out "--json"
expect_rc 0 "$MJ" --help;         contains out "models"
expect_rc 0 "$MJ" models
contains out "mixtral (Mixtral-8x7B, Mixtral-8x22B): supported"
contains out "model.layers.L.block_sparse_moe.experts.E.{w1,w3,w2}"
contains out "gpt_oss (gpt-oss): refused"; contains out "clamped SwiGLU"
contains out "renormalize: norm_topk_prob, when top_k > 1"
contains out "qwen3_next (Qwen3-Next-80B-A3B, its MoE layers): supported"
contains out "shared expert: shared_expert_intermediate_size wide (5632 when absent; 0: none), its output x sigmoid(x . shared_expert_gate)"
expect_rc 0 "$MJ" models --json
json_check 'len(j["families"]) == 13 and len({f["model_type"] for f in j["families"]}) == 13'
json_check '{f["model_type"] for f in j["families"] if not f["supported"]} == {"llama4", "llama4_text", "gpt_oss"}'
json_check '[(f["model_type"], f["shared_expert"]["width_key"], f["shared_expert"]["default"], f["tensors"]["shared_expert_gate"]) for f in j["families"] if f["supported"] and f["shared_expert"]["gate"]] == [("qwen2_moe", "shared_expert_intermediate_size", 5632, "model.layers.L.mlp.shared_expert_gate.weight (bf16 [1, H])"), ("qwen3_next", "shared_expert_intermediate_size", 512, "model.layers.L.mlp.shared_expert_gate.weight (bf16 [1, H])")]'
json_check '[(f["model_type"], f["shared_expert"]["allowed"], f["shared_expert"]["width_key"]) for f in j["families"] if f["model_type"] in ("glm_moe_dsa", "mixtral")] == [("glm_moe_dsa", True, "n_shared_experts"), ("mixtral", False, None)]'
json_check '[(f["defaults"]["n_group"], f["defaults"]["topk_group"], f["defaults"]["routed_scaling_factor"], f["renormalize"]) for f in j["families"] if f["model_type"] == "deepseek_v3"] == [(8, 4, 2.5, "norm_topk_prob, when top_k > 1")]'
json_check '[(f["experts_key"], f["width_key"], f["renormalize"], f["tensors"]["bias"], f["routing_keys_read"]) for f in j["families"] if f["model_type"] == "mixtral"] == [("num_local_experts", "intermediate_size", "always", None, False)]'
json_check '[f["tensors"]["bias"] for f in j["families"] if f["model_type"] == "minimax_m2"] == ["model.layers.L.block_sparse_moe.e_score_correction_bias (unless use_routing_bias is false)"]'
json_check 'all(f["source"] and (not f["supported"] or f["defaults"]["scoring_func"] in ("sigmoid", "softmax")) for f in j["families"])'
python3 - "$SRC/tests/data/config/families" <<'PY' && ok || bad "models --json names a config the tests do not have"
import json, os, sys
j = json.load(open("out"))
for f in j["families"]:
    v = f["verified"].split(" ")[0]
    assert not v or os.path.isfile(os.path.join(sys.argv[1], v)), v
PY
expect_rc 2 "$MJ" models extra;   contains err "takes no operands"
expect_rc 2 "$MJ" models --frob

# ---- standard output that cannot be written -------------------------------------------
# A command whose output is lost did not do its job: exit 1, one line on stderr.
full() { # full CMD...: run with stdout on /dev/full
    "$@" >/dev/full 2>err
    local rc=$?
    if [ "$rc" = 1 ] && [ "$(wc -l <err)" = 1 ] && grep -q "standard output" err; then ok
    else bad "stdout on /dev/full: rc $rc (want 1), stderr $(wc -l <err) lines: $* :: $(head -c 300 err)"; fi
}
full "$MJ" --help
full "$MJ" --version
full "$MJ" route --help
full "$MJ" route --topk 4 l.npy
full "$MJ" route --backend sim --topk 4 --k0 2 l.npy
full "$MJ" nvfp4 --help
full "$MJ" demo --hidden 128 --intermediate 512 --experts 16 --topk 4 --batch 2 $DC
full "$MJ" prewarm --cache-dir "$T/cache2" -q rec.jsonl
full "$MJ" inspect templates
full "$MJ" models
full "$MJ" models --json
full "$MJ" inspect --cache-dir "$T/cache2" list
full "$MJ" inspect --cache-dir "$T/cache2" --stats
full "$MJ" make-checkpoint --config "$GLM5" --out fullck --seed 1 $SMALL
[ ! -e fullck ] && ok || bad "make-checkpoint wrote a checkpoint though its output was lost"
# A command with nothing to print does not fail for it.
expect_rc 0 "$MJ" nvfp4 quantize m.npy full_q >/dev/full

finish
