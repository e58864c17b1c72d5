/* test_sim.c — the sim backend: kernel templates compiled by the host C compiler and run on
 * the CPU with CUDA's execution model, through the JIT (mj_context_spec, mj_jit_get, the
 * typed launch wrappers). Barriers, shared memory, indices, every warp collective against
 * CUDA's documented results, bit intrinsics, atomics across blocks, the JIT fixtures against
 * the CPU, deadlocks and traps reported (not hung), the disk cache, keys, context options. */
#include "cache.h"
#include "jit.h"
#include "mj_test_registry.h"
#include "sim/sim.h"
#include "test.h"
#include "ref/ref.h"

#include <float.h>
#include <ftw.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>


/* The function of template `name` with knobs for context c (NULL on failure). */
static const mj_function *get(mj_context_t c, const char *name, const int32_t *knobs) {
    mj_spec s;
    const mj_function *f = NULL;
    mj_status st = mj_context_spec(c, name, knobs, &s);
    CHECK(st == MJ_OK, "spec %s: %s", name, mj_last_error());
    if (st != MJ_OK) return NULL;
    st = mj_jit_get(c, &s, &f);
    CHECK(st == MJ_OK, "get %s: %s", name, mj_last_error());
    return st == MJ_OK ? f : NULL;
}

static mj_launch_dims dims3(uint32_t gx, uint32_t gy, uint32_t gz, uint32_t bx, uint32_t by, uint32_t bz,
                            uint32_t smem) {
    mj_launch_dims d = {{gx, gy, gz}, {bx, by, bz}, smem, NULL};
    return d;
}
static mj_launch_dims dims1(uint32_t g, uint32_t b) { return dims3(g, 1, 1, b, 1, 1, 0); }

/* ---- CUDA's documented shuffle results (CUDA C++ Programming Guide, warp shuffle) ---- */
static int ref_shfl(const int *in, int lane, int op, int arg, int width) {
    int base = lane - lane % width, sub = lane % width, src = lane;
    switch (op) {
    case 0: src = base + (arg & (width - 1)); break;         /* srcLane modulo width   */
    case 1: src = sub >= arg ? lane - arg : lane; break;      /* lower delta unchanged  */
    case 2: src = sub + arg < width ? lane + arg : lane; break;
    default: {                                                /* later groups: own value */
        int j = lane ^ arg;
        src = j / width <= lane / width ? j : lane;
    }
    }
    return in[src];
}

static void test_context(const char *dir) {
    mj_backend b = MJ_BACKEND_COUNT;
    const char *tname = NULL;
    mj_context_t c = test_new_context(dir, MJ_BACKEND_SIM, NULL, 0);
    if (!c) return;
    CHECK_OK(mj_context_backend(c, &b, &tname));
    CHECK(b == MJ_BACKEND_SIM && tname && !strcmp(tname, "sm_120a"), "sim ctx: backend %d target %s", b,
          tname ? tname : "");
    mj_spec s;
    int32_t knobs[2] = {128, 4};
    CHECK_OK(mj_context_spec(c, "fixture_saxpy", knobs, &s));
    CHECK(s.backend == MJ_BACKEND_SIM && s.target == MJ_TARGET_SM120A && s.knobs[0] == 128 && s.knobs[1] == 4 &&
              s.knobs[2] == 0, "spec from context");
    CHECK_STATUS(mj_context_spec(c, "no_such_template", knobs, &s), MJ_ERR_INVALID_ARG);
    CHECK(strstr(mj_last_error(), "no_such_template") != NULL, "msg %s", mj_last_error());
    CHECK_STATUS(mj_context_spec(c, "fixture_saxpy", NULL, &s), MJ_ERR_INVALID_ARG);
    int32_t bad[2] = {128, 3};
    CHECK_STATUS(mj_context_spec(c, "fixture_saxpy", bad, &s), MJ_ERR_INVALID_ARG);
    CHECK(strstr(mj_last_error(), "VEC") != NULL, "msg %s", mj_last_error());
    mj_context_destroy(c);

    c = test_new_context(dir, MJ_BACKEND_SIM, "sm_90a", 0);
    CHECK_OK(mj_context_backend(c, &b, &tname));
    CHECK(tname && !strcmp(tname, "sm_90a"), "target option: %s", tname ? tname : "");
    CHECK_OK(mj_context_spec(c, "fixture_saxpy", knobs, &s));
    CHECK(s.target == MJ_TARGET_SM90A, "spec target");
    int32_t sk[2] = {256, 4};
    CHECK_STATUS(mj_context_spec(c, "fixture_sim_sync", sk, &s), MJ_ERR_UNSUPPORTED); /* sm_80 sm_120a */
    mj_context_destroy(c);

    c = test_new_context(dir, MJ_BACKEND_AUTO, NULL, 0); /* no device asked for: the sim */
    CHECK_OK(mj_context_backend(c, &b, NULL));
    CHECK(b == MJ_BACKEND_SIM, "auto without a device: %d", b);
    mj_context_destroy(c);
    c = test_new_context(dir, MJ_BACKEND_CUDA, "120a", 0); /* compile-only CUDA, as before */
    CHECK_OK(mj_context_backend(c, &b, &tname));
    CHECK(b == MJ_BACKEND_CUDA && !strcmp(tname, "sm_120a"), "cuda compile-only: %d %s", b, tname);
    mj_context_destroy(c);

    mj_context_options o = MJ_CONTEXT_OPTIONS_INIT;
    o.cache_dir = dir;
    o.device = MJ_DEVICE_NONE;
    o.backend = 7;
    mj_context_t bc = NULL;
    CHECK_STATUS(mj_context_create(&o, &bc), MJ_ERR_INVALID_ARG);
    o.backend = MJ_BACKEND_SIM;
    o.target = "sm_75";
    CHECK(mj_context_create(&o, &bc) != MJ_OK && strstr(mj_last_error(), "target"), "bad target: %s",
          mj_last_error());
    CHECK_STATUS(mj_context_backend(NULL, &b, NULL), MJ_ERR_INVALID_ARG);
}

static void test_render_and_keys(void) {
    int32_t tpl = -1;
    CHECK(mj_template_find("fixture_saxpy", &tpl) != NULL, "saxpy");
    mj_spec s;
    memset(&s, 0, sizeof s);
    s.tpl = tpl;
    s.target = MJ_TARGET_SM120A;
    s.backend = MJ_BACKEND_SIM;
    s.knobs[0] = 256, s.knobs[1] = 4;
    char *a = NULL, *b2 = NULL, *cu = NULL;
    size_t la = 0, lb = 0, lc = 0;
    CHECK_OK(mj_render(&s, &a, &la));
    CHECK_OK(mj_render(&s, &b2, &lb));
    CHECK(a && b2 && la == lb && !memcmp(a, b2, la), "sim render not deterministic");
    mj_spec sc = s;
    sc.backend = MJ_BACKEND_CUDA;
    CHECK_OK(mj_render(&sc, &cu, &lc));
    if (!a || !cu) return;
    CHECK(strstr(a, "fixture_saxpy for sm_120a (sim)") && strstr(a, "#define MJ_SIM 1") &&
              !strstr(a, "extern \"C\""), "sim header/prelude");
    CHECK(strstr(a, "MJ_SIM_ENTRY void mj_sim_entry_fixture_saxpy(void **args) {\n"
                    "    fixture_saxpy(*(int *)args[0], *(float *)args[1], *(const float **)args[2], "
                    "*(float **)args[3]);\n}\n"), "trampoline: %s", strstr(a, "mj_sim_entry") ? strstr(a, "mj_sim_entry") : "");
    CHECK(strstr(a, "#define MJ_SIM 1") < strstr(a, "#define BLOCK 256"), "sim prelude before the knobs");
    CHECK(strstr(cu, "(cuda)") && !strstr(cu, "mj_sim_entry"), "cuda render unchanged");
    const char *ver = NULL;
    CHECK_OK(mj_sim_compiler(&ver));
    CHECK(ver && !strncmp(ver, "sim ", 4) && strlen(ver) > 6, "compiler %s", ver ? ver : "");
    char *ks = NULL, *kc = NULL;
    char hs[MJ_KEY_HEX_LEN + 1], hc[MJ_KEY_HEX_LEN + 1];
    CHECK_OK(mj_key_text(&s, a, la, ver ? ver : "sim", mj_sim_options(), &ks));
    CHECK_OK(mj_key_text(&sc, cu, lc, "nvrtc 13.0", mj_nvrtc_options(MJ_TARGET_SM120A), &kc));
    if (ks && kc) {
        mj_key_hash(ks, hs);
        mj_key_hash(kc, hc);
        CHECK(strcmp(hs, hc) != 0 && strstr(ks, "backend sim\n") && strstr(kc, "backend cuda\n") &&
                  strstr(ks, "-fPIC"), "keys: %s / %s", ks, kc);
        /* Same source, other options (an ASan build): another key. */
        char *k2 = NULL;
        CHECK_OK(mj_key_text(&s, a, la, ver ? ver : "sim", "-std=gnu11 -O2 -fsanitize=address", &k2));
        char h2[MJ_KEY_HEX_LEN + 1];
        if (k2) mj_key_hash(k2, h2);
        CHECK(k2 && strcmp(h2, hs) != 0, "options in the key");
        free(k2);
    }
    char *line = NULL;
    CHECK_OK(mj_spec_to_json(&s, &line));
    CHECK(line && strstr(line, "\"backend\":\"sim\""), "line %s", line ? line : "");
    mj_spec back;
    if (line) CHECK_OK(mj_spec_from_json(line, "t", &back));
    CHECK(line && !memcmp(&back, &s, sizeof s), "sim manifest round trip");
    CHECK_STATUS(mj_spec_from_json("{\"template\":\"fixture_saxpy\",\"knobs\":{\"BLOCK\":256,\"VEC\":4},"
                                   "\"arch\":\"sm_120a\",\"backend\":\"tpu\"}", "m", &back), MJ_ERR_INVALID_ARG);
    free(line), free(ks), free(kc), free(a), free(b2), free(cu);
}

/* The JIT fixtures on the sim against the CPU. */
static void test_jit_fixtures(mj_context_t c) {
    int32_t kn[2] = {128, 4};
    const mj_function *f = get(c, "fixture_saxpy", kn);
    if (f) {
        CHECK(mj_function_report(f)->registers == 0, "sim report");
        enum { N = 10000 };
        float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y), *want = malloc(N * sizeof *want);
        for (int i = 0; i < N; i++) x[i] = (float)(i % 97) * 0.25f, y[i] = (float)(i % 13) - 6.0f;
        for (int i = 0; i < N; i++) want[i] = 1.5f * x[i] + y[i];
        uint32_t g = (N + 128 * 4 - 1) / (128 * 4);
        CHECK_OK(mj_launch_fixture_saxpy(f, dims1(g, 128), N, 1.5f, x, y));
        int bad = 0;
        for (int i = 0; i < N; i++) bad += fabsf(y[i] - want[i]) > 1e-6f * fabsf(want[i]) + 1e-6f;
        CHECK(bad == 0, "saxpy: %d of %d differ", bad, N);
        free(x), free(y), free(want);
    }
    int32_t kb[3] = {128, 4, 128};
    f = get(c, "fixture_block_sum", kb);
    if (f) {
        enum { N = 100000 };
        float *x = malloc(N * sizeof *x);
        double total = 0;
        for (int i = 0; i < N; i++) x[i] = (float)((i * 7) % 11), total += x[i];
        int nb = (N + 512 - 1) / 512;
        float *out = calloc((size_t)nb, sizeof *out);
        CHECK_OK(mj_launch_fixture_block_sum(f, dims1((uint32_t)nb, 128), x, N, out));
        int bad = 0;
        for (int b = 0; b < nb; b++) {
            double s = 0;
            for (int i = b * 512; i < (b + 1) * 512 && i < N; i++) s += x[i];
            bad += out[b] != (float)s;
        }
        CHECK(bad == 0, "block sums: %d of %d differ", bad, nb);
        CHECK_OK(mj_launch_fixture_block_sum_final(f, dims1(1, 128), out, nb));
        CHECK(out[0] == (float)total, "total %.1f want %.1f", out[0], total);
        free(x), free(out);
    }
}

static void test_sync(mj_context_t c) {
    int32_t kn[2] = {256, 4};
    const mj_function *f = get(c, "fixture_sim_sync", kn);
    if (!f) return;
    /* reverse through static shared memory */
    enum { NB = 64, B = 256 };
    int *in = malloc(NB * B * sizeof *in), *out = malloc(NB * B * sizeof *out);
    for (int i = 0; i < NB * B; i++) in[i] = i * 3 + 1, out[i] = -1;
    CHECK_OK(mj_launch_fixture_sim_reverse(f, dims1(NB, B), in, out));
    int bad = 0;
    for (int b = 0; b < NB; b++)
        for (int t = 0; t < B; t++) bad += out[b * B + t] != in[b * B + B - 1 - t];
    CHECK(bad == 0, "reverse: %d wrong", bad);
    free(in), free(out);

    /* multi-dimensional blocks and grids */
    const uint32_t shapes[][6] = {{3, 2, 2, 4, 3, 2}, {2, 1, 3, 8, 8, 4}, {5, 3, 1, 32, 1, 1}, {1, 1, 1, 1, 1, 1},
                                  {2, 2, 2, 1, 1, 64}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const uint32_t *sh = shapes[k];
        int nt = (int)(sh[3] * sh[4] * sh[5]), nblk = (int)(sh[0] * sh[1] * sh[2]), n = nt * nblk;
        int *coords = malloc((size_t)n * 12 * sizeof *coords), *next = malloc((size_t)n * sizeof *next);
        CHECK_OK(mj_launch_fixture_sim_dims(f, dims3(sh[0], sh[1], sh[2], sh[3], sh[4], sh[5], 0), coords, next));
        bad = 0;
        for (int g = 0; g < n; g++) {
            int blk = g / nt, lin = g % nt;
            int want[12] = {lin % (int)sh[3], (lin / (int)sh[3]) % (int)sh[4], lin / (int)(sh[3] * sh[4]),
                            blk % (int)sh[0], (blk / (int)sh[0]) % (int)sh[1], blk / (int)(sh[0] * sh[1]),
                            (int)sh[3], (int)sh[4], (int)sh[5], (int)sh[0], (int)sh[1], (int)sh[2]};
            bad += memcmp(coords + (size_t)g * 12, want, sizeof want) != 0;
            bad += next[g] != blk * nt + (lin + 1) % nt;
        }
        CHECK(bad == 0, "dims grid (%u,%u,%u) block (%u,%u,%u): %d wrong", sh[0], sh[1], sh[2], sh[3], sh[4],
              sh[5], bad);
        free(coords), free(next);
    }

    /* dynamic shared memory */
    enum { DB = 96, DN = 5 };
    float fin[DB * DN], fout[DB * DN];
    for (int i = 0; i < DB * DN; i++) fin[i] = (float)(i % 17), fout[i] = -1;
    CHECK_OK(mj_launch_fixture_sim_dynsmem(f, dims3(DN, 1, 1, DB, 1, 1, DB * sizeof(float)), fin, fout));
    bad = 0;
    for (int b = 0; b < DN; b++)
        for (int t = 0; t < DB; t++)
            bad += fout[b * DB + t] != fin[b * DB + t] + 2.0f * fin[b * DB + (t + 1) % DB];
    CHECK(bad == 0, "dynamic smem: %d wrong", bad);

    /* the lane hook and vector types */
    int lanes[200];
    CHECK_OK(mj_launch_fixture_sim_lane(f, dims1(2, 100), lanes));
    bad = 0;
    for (int i = 0; i < 200; i++) bad += lanes[i] != (i % 100) % 32;
    CHECK(bad == 0, "mj_lane_id: %d wrong", bad);
    enum { V = 64 };
    float vx[4 * V], vy[4 * V];
    int vxi[4 * V], vyi[4 * V];
    unsigned yu2[2 * V], yu4[4 * V];
    for (int i = 0; i < 4 * V; i++) vx[i] = (float)i * 0.5f, vxi[i] = i * 11 - 7;
    CHECK_OK(mj_launch_fixture_sim_vec(f, dims1(2, V / 2), vx, vy, vxi, vyi, yu2, yu4));
    bad = 0;
    for (int i = 0; i < V; i++) {
        const float *a = vx + 4 * i;
        const int *p = vxi + 4 * i;
        bad += vy[4 * i] != a[0] + a[1] || vy[4 * i + 1] != a[2] * a[3] || vy[4 * i + 2] != a[0] ||
               vy[4 * i + 3] != (float)i;
        bad += vyi[4 * i] != p[3] || vyi[4 * i + 1] != p[2] || vyi[4 * i + 2] != p[1] || vyi[4 * i + 3] != p[0];
        bad += yu2[2 * i] != (unsigned)p[0] * 2u || yu2[2 * i + 1] != (unsigned)i;
        bad += yu4[4 * i] != (unsigned)i || yu4[4 * i + 1] != (unsigned)p[1] || yu4[4 * i + 2] != 7u ||
               yu4[4 * i + 3] != (unsigned)(p[0] + p[3]);
    }
    CHECK(bad == 0, "vector types: %d wrong", bad);

    /* 256 blocks x 256 threads, 4 rounds (8 barriers): timed, and the same on one worker,
     * three workers and with the ucontext switch. */
    enum { RB = 256, RT = 256, R = 4 };
    float *x = malloc(RB * RT * sizeof *x), *x0 = malloc(RB * RT * sizeof *x0);
    for (int i = 0; i < RB * RT; i++) x0[i] = (float)(i % 1000);
    const char *modes[][2] = {{NULL, NULL}, {"MOEJIT_SIM_THREADS", "1"}, {"MOEJIT_SIM_THREADS", "3"},
                              {"MOEJIT_SIM_UCONTEXT", "1"}};
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        if (modes[m][0]) setenv(modes[m][0], modes[m][1], 1);
        memcpy(x, x0, RB * RT * sizeof *x);
        double t0 = test_now_ms();
        CHECK_OK(mj_launch_fixture_sim_rounds(f, dims1(RB, RT), x));
        double ms = test_now_ms() - t0;
        printf("sim: %d blocks x %d threads, %d barriers: %.1f ms (%s%s%s)\n", RB, RT, 2 * R, ms,
               modes[m][0] ? modes[m][0] : "default", modes[m][0] ? "=" : "", modes[m][0] ? modes[m][1] : "");
        if (modes[m][0]) unsetenv(modes[m][0]);
        bad = 0;
        for (int b = 0; b < RB; b++)
            for (int t = 0; t < RT; t++) bad += x[b * RT + t] != x0[b * RT + (t + R) % RT] + (float)R;
        CHECK(bad == 0, "rounds (%s): %d wrong", modes[m][0] ? modes[m][0] : "default", bad);
    }
    free(x), free(x0);

    /* bad launches are refused before anything runs */
    CHECK_STATUS(mj_launch_fixture_sim_lane(f, dims3(1, 1, 1, 0, 1, 1, 0), lanes), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_launch_fixture_sim_lane(f, dims3(1, 1, 1, 64, 32, 1, 0), lanes), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_launch_fixture_sim_lane(f, dims3(1, 70000, 1, 32, 1, 1, 0), lanes), MJ_ERR_INVALID_ARG);
    CHECK(strstr(mj_last_error(), "fixture_sim_lane") != NULL, "msg %s", mj_last_error());
}

static void test_warp(mj_context_t c) {
    const mj_function *f = get(c, "fixture_sim_warp", NULL);
    if (!f) return;
    int in[64], out[64];
    for (int i = 0; i < 64; i++) in[i] = 100 + 7 * i;
    /* every shuffle, full mask, against the documented result */
    const int args[] = {0, 1, 2, 3, 5, 8, 15, 16, 31};
    const int idx_extra[] = {33, -1, 40, -31};
    int n_cases = 0, bad_cases = 0;
    for (int op = 0; op < 4; op++)
        for (int w = 1; w <= 32; w *= 2)
            for (size_t ai = 0; ai < sizeof args / sizeof args[0] + (op == 0 ? 4 : 0); ai++) {
                int arg = ai < sizeof args / sizeof args[0] ? args[ai] : idx_extra[ai - sizeof args / sizeof args[0]];
                mj_status st = mj_launch_fixture_sim_shfl(f, dims1(1, 64), in, out, op, arg, w, 0xFFFFFFFFu);
                int bad = st != MJ_OK;
                for (int t = 0; t < 64 && !bad; t++) bad += out[t] != ref_shfl(in + (t / 32) * 32, t % 32, op, arg, w);
                n_cases++;
                if (bad) {
                    bad_cases++;
                    fprintf(stderr, "shfl op %d arg %d width %d: %s\n", op, arg, w, st ? mj_last_error() : "wrong");
                }
            }
    CHECK(bad_cases == 0, "%d of %d shuffle cases wrong", bad_cases, n_cases);
    /* partial masks: the other lanes keep out of it */
    struct { unsigned mask; int op, arg, width; } pm[] = {
        {0x0000FFFFu, 3, 1, 16}, {0x0000FFFFu, 3, 8, 32}, {0xFFFF0000u, 3, 4, 32}, {0xFFFF0000u, 2, 3, 16},
        {0x55555555u, 0, 4, 32}, {0x55555555u, 3, 2, 32}, {0x00000001u, 0, 0, 32}, {0xF0F0F0F0u, 1, 0, 32},
    };
    for (size_t k = 0; k < sizeof pm / sizeof pm[0]; k++) {
        CHECK_OK(mj_launch_fixture_sim_shfl(f, dims1(1, 64), in, out, pm[k].op, pm[k].arg, pm[k].width, pm[k].mask));
        int bad = 0;
        for (int t = 0; t < 64; t++) {
            int want = (pm[k].mask >> (t % 32) & 1) ? ref_shfl(in + (t / 32) * 32, t % 32, pm[k].op, pm[k].arg, pm[k].width) : -1;
            bad += out[t] != want;
        }
        CHECK(bad == 0, "partial mask 0x%08x op %d arg %d: %d wrong", pm[k].mask, pm[k].op, pm[k].arg, bad);
    }
    /* reading a lane outside the mask, and a width that is not a power of two, are reported */
    CHECK_STATUS(mj_launch_fixture_sim_shfl(f, dims1(1, 32), in, out, 2, 16, 32, 0x0000FFFFu), MJ_ERR_KERNEL);
    CHECK(strstr(mj_last_error(), "not in the mask") && strstr(mj_last_error(), "__shfl_down_sync"), "msg %s",
          mj_last_error());
    CHECK_STATUS(mj_launch_fixture_sim_shfl(f, dims1(1, 32), in, out, 3, 1, 3, 0xFFFFFFFFu), MJ_ERR_KERNEL);
    CHECK(strstr(mj_last_error(), "power of two") != NULL, "msg %s", mj_last_error());
    /* a mask without the caller, and a mask naming lanes the block lacks (a 20-thread block) */
    CHECK_STATUS(mj_launch_fixture_sim_shfl(f, dims1(1, 20), in, out, 0, 0, 32, 0xFFFFFFFFu), MJ_ERR_KERNEL);
    CHECK(strstr(mj_last_error(), "lane 20, which does not exist") != NULL, "msg %s", mj_last_error());

    /* other value types */
    float fi[32], fo[32];
    unsigned ui[32], uo[32];
    long long li[32], lo[32];
    double di[32], dout[32];
    for (int i = 0; i < 32; i++)
        fi[i] = (float)i * 1.25f - 3.0f, ui[i] = 0xF0000000u + (unsigned)i, li[i] = -(1ll << 40) * i - 5,
        di[i] = 1e300 / (i + 1);
    CHECK_OK(mj_launch_fixture_sim_shfl_types(f, dims1(1, 32), fi, fo, ui, uo, li, lo, di, dout));
    int bad = 0;
    for (int i = 0; i < 32; i++) {
        bad += fo[i] != fi[i ^ 1];
        bad += uo[i] != (i + 3 < 32 ? ui[i + 3] : ui[i]);
        bad += lo[i] != li[31 - i];
        bad += dout[i] != (i >= 2 ? di[i - 2] : di[i]);
    }
    CHECK(bad == 0, "shuffle types: %d wrong", bad);

    /* votes */
    int pred[64];
    unsigned ballot[64];
    int any[64], all[64];
    const unsigned masks[] = {0xFFFFFFFFu, 0x0F0F0F0Fu, 0x80000001u, 1u << 5, 0xFFFF0000u};
    const int patterns = 4;
    for (size_t mi = 0; mi < sizeof masks / sizeof masks[0]; mi++)
        for (int p = 0; p < patterns; p++) {
            for (int t = 0; t < 64; t++)
                pred[t] = p == 0 ? 0 : p == 1 ? 1 : p == 2 ? (t * 7 % 5 == 0) * (t + 1) : (t != 31 && t != 37);
            memset(ballot, 0xEE, sizeof ballot);
            CHECK_OK(mj_launch_fixture_sim_vote(f, dims1(1, 64), pred, ballot, any, all, masks[mi]));
            bad = 0;
            for (int t = 0; t < 64; t++) {
                unsigned m = masks[mi];
                if (!(m >> (t % 32) & 1)) {
                    bad += ballot[t] != 0xEEEEEEEEu;
                    continue;
                }
                unsigned want = 0;
                for (int l = 0; l < 32; l++)
                    if ((m >> l & 1) && pred[(t / 32) * 32 + l]) want |= 1u << l;
                bad += ballot[t] != want || any[t] != (want != 0) || all[t] != (want == m);
            }
            CHECK(bad == 0, "votes mask 0x%08x pattern %d: %d wrong", masks[mi], p, bad);
        }

    /* __syncwarp, full and half masks */
    int sw[64], sw2[64];
    CHECK_OK(mj_launch_fixture_sim_syncwarp(f, dims1(1, 64), in, sw, sw2));
    bad = 0;
    for (int t = 0; t < 64; t++) {
        int base = t - t % 32;
        bad += sw[t] != 3 * in[base + (t % 32 + 5) % 32];
    }
    for (int t = 0; t < 64; t++) bad += sw2[t] != sw[(t - t % 32) + ((t % 32) ^ 1)];
    CHECK(bad == 0, "syncwarp: %d wrong", bad);

    /* bit intrinsics */
    enum { NX = 40 };
    unsigned x[NX], brev[NX];
    int popc[NX], ffs[NX], clz[NX];
    uint64_t rng = 12345;
    for (int i = 0; i < NX; i++) x[i] = (unsigned)mj_rng_next(&rng) >> (i % 32);
    x[0] = 0, x[1] = 1, x[2] = 0x80000000u, x[3] = 0xFFFFFFFFu, x[4] = 0x00010000u;
    CHECK_OK(mj_launch_fixture_sim_bits(f, dims1(2, 32), x, popc, ffs, clz, brev, NX));
    bad = 0;
    for (int i = 0; i < NX; i++) {
        int pc = 0, fs = 0, cz = 32;
        unsigned rv = 0;
        for (int bit = 0; bit < 32; bit++) {
            if (x[i] >> bit & 1) {
                pc++;
                if (!fs) fs = bit + 1;
                cz = 31 - bit;
            }
            if (x[i] >> bit & 1) rv |= 1u << (31 - bit);
        }
        bad += popc[i] != pc || ffs[i] != fs || clz[i] != cz || brev[i] != rv;
    }
    CHECK(bad == 0, "bit intrinsics: %d wrong", bad);

    /* unsigned warp reductions, each warp its own: values past 2^31 (an int compare would
     * take them for the smallest), every lane equal, the extremes 0 and 2^32 - 1 */
    unsigned rin[64], rmx[64], rmn[64];
    for (int pat = 0; pat < 4; pat++) {
        for (int t = 0; t < 64; t++)
            rin[t] = pat == 0 ? (unsigned)mj_rng_next(&rng) : pat == 1 ? 0x80000000u + (unsigned)(t * 37 % 64)
                   : pat == 2 ? 7u : (t % 32 == 9 ? 0u : t % 32 == 30 ? 0xFFFFFFFFu : 5u + (unsigned)t);
        memset(rmx, 0xEE, sizeof rmx), memset(rmn, 0xEE, sizeof rmn);
        CHECK_OK(mj_launch_fixture_sim_redux(f, dims1(1, 64), rin, rmx, rmn));
        bad = 0;
        for (int t = 0; t < 64; t++) {
            unsigned hi = 0, lw = 0xFFFFFFFFu;
            for (int l = 0; l < 32; l++) {
                const unsigned v = rin[(t / 32) * 32 + l];
                hi = v > hi ? v : hi, lw = v < lw ? v : lw;
            }
            bad += rmx[t] != hi || rmn[t] != lw;
        }
        CHECK(bad == 0, "warp reductions, pattern %d: %d lanes wrong", pat, bad);
    }

    unsigned act[40];
    CHECK_OK(mj_launch_fixture_sim_active(f, dims1(1, 40), act, 32));
    CHECK(act[0] == 0xFFFFFFFFu && act[31] == 0xFFFFFFFFu && act[32] == 0xFFu && act[39] == 0xFFu,
          "activemask %08x %08x %08x", act[0], act[31], act[32]);
    CHECK_OK(mj_launch_fixture_sim_active(f, dims1(1, 40), act, 20));
    CHECK(act[0] == 0xFFFFFu && act[19] == 0xFFFFFu && act[20] == 0 && act[32] == 0xFFu,
          "divergent activemask %08x %08x %08x", act[0], act[20], act[32]);
}

static void test_atomics(mj_context_t c) {
    const mj_function *f = get(c, "fixture_sim_atomic", NULL);
    if (!f) return;
    enum { NB = 1000, T = 32, N = NB * T };
    int count = 0, imax = INT32_MIN, imin = INT32_MAX, cas = 0, exch = -1, dec = 0, full = 0;
    float fsum = 0;
    unsigned usum = 0, bits = 0;
    unsigned long long u64 = 0;
    int *exch_old = malloc(N * sizeof *exch_old);
    CHECK_OK(mj_launch_fixture_sim_atomic(f, dims1(NB, T), &count, &fsum, &imax, &imin, &usum, &u64, &cas, &exch,
                                          exch_old, &bits, &dec, &full));
    double want_f = 0;
    int want_max = INT32_MIN, want_min = INT32_MAX;
    unsigned want_u = 0;
    unsigned long long want_64 = 0;
    for (int g = 0; g < N; g++) {
        want_f += g % 7;
        int h = (int)(((unsigned)g * 2654435761u) >> 8) - (1 << 23);
        if (h > want_max) want_max = h;
        if (h < want_min) want_min = h;
        want_u += (unsigned)g;
        want_64 += (unsigned long long)g << 20;
    }
    CHECK(count == NB, "block count %d", count);
    CHECK(fsum == (float)want_f, "float sum %.1f want %.1f", fsum, want_f);
    CHECK(imax == want_max && imin == want_min, "max %d/%d min %d/%d", imax, want_max, imin, want_min);
    CHECK(usum == want_u && u64 == want_64, "unsigned sums");
    CHECK(cas == 2 * N, "CAS loop %d", cas);
    CHECK(bits == 0xFFFFFFFFu && dec == -N && full == NB, "or %08x sub %d shared %d", bits, dec, full);
    /* exchange: the old values and the last one are every value once (a chain) */
    char *seen = calloc(N + 1, 1);
    int dup = 0;
    for (int g = 0; g < N; g++) {
        int v = exch_old[g] + 1; /* -1 .. N-1 -> 0 .. N */
        if (v < 0 || v > N || seen[v]++) dup++;
    }
    if (exch < 0 || exch >= N || seen[exch + 1]++) dup++;
    CHECK(dup == 0, "exchange chain broken (%d)", dup);
    free(seen), free(exch_old);
}

/* cp.async: a copy's bytes are poison (0xFF) from the copy until the wait that covers its
 * group; bytes are counted with the streamed loads; a thread that queues more than the sim
 * holds traps, by name. */
static void test_cp_async(mj_context_t c) {
    const mj_function *f = get(c, "fixture_sim_cp_async", (int32_t[MJ_MAX_KNOBS]){0});
    if (!f) return;
    uint32_t src[3 * 32 * 4], out[8 * 32 * 4];
    for (int i = 0; i < 3 * 32 * 4; i++) src[i] = 1000u + (uint32_t)i;
    memset(out, 0, sizeof out);
    mj_sim_stream_bytes_take();
    CHECK_OK(mj_launch_fixture_sim_cp_async(f, dims3(1, 1, 1, 32, 1, 1, 3 * 32 * 16), src, out));
    CHECK(mj_sim_stream_bytes_take() == 6 * 32 * 16, "cp.async bytes are counted as streamed");
    int bad[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int t = 0; t < 32; t++)
        for (int q = 0; q < 4; q++) {
            const uint32_t s0 = src[(0 * 32 + t) * 4 + q], s1x = src[(1 * 32 + (t ^ 1)) * 4 + q];
            const uint32_t s2 = src[(2 * 32 + t) * 4 + q];
            bad[0] += out[(0 * 32 + t) * 4 + q] != 0xFFFFFFFFu; /* before any wait: poison     */
            bad[1] += out[(1 * 32 + t) * 4 + q] != s0;          /* wait_group(2): group 0 is in */
            bad[2] += out[(2 * 32 + t) * 4 + q] != 0xFFFFFFFFu; /* ...group 2 not yet          */
            bad[3] += out[(3 * 32 + t) * 4 + q] != s2;          /* wait_group(0): all of them   */
            bad[4] += out[(4 * 32 + t) * 4 + q] != s1x;         /* another lane's, after a sync */
            bad[5] += out[(5 * 32 + t) * 4 + q] != 0xFFFFFFFFu; /* a slot being refilled        */
            bad[6] += out[(6 * 32 + t) * 4 + q] != 0xFFFFFFFFu; /* older copy in, newer pending */
            bad[7] += out[(7 * 32 + t) * 4 + q] != s0;          /* the newer one landed         */
        }
    CHECK(!bad[0] && !bad[1] && !bad[2] && !bad[3] && !bad[4] && !bad[5] && !bad[6] && !bad[7],
          "cp.async reads: before wait %d, group 0 %d, group 2 early %d, all %d, across lanes %d, refilled %d, "
          "two copies %d/%d wrong",
          bad[0], bad[1], bad[2], bad[3], bad[4], bad[5], bad[6], bad[7]);
    const mj_function *fo = get(c, "fixture_sim_cp_async", (int32_t[MJ_MAX_KNOBS]){1});
    if (!fo) return;
    CHECK_STATUS(mj_launch_fixture_sim_cp_async(fo, dims3(1, 1, 1, 32, 1, 1, 3 * 32 * 16), src, out), MJ_ERR_KERNEL);
    CHECK(strstr(mj_last_error(), "queued more than 32 cp.async copies without a wait") &&
              strstr(mj_last_error(), "thread (0,0,0)"),
          "cp.async overflow: %s", mj_last_error());
}

static void test_deadlocks(mj_context_t c) {
    const mj_function *f = get(c, "fixture_sim_deadlock", NULL);
    if (!f) return;
    int out[64 * 64];
    double t0 = test_now_ms();
    CHECK_STATUS(mj_launch_fixture_sim_dl_one(f, dims1(8, 64), out), MJ_ERR_KERNEL);
    const char *e = mj_last_error();
    CHECK(strstr(e, "fixture_sim_dl_one") && strstr(e, "block (0,0,0)") && strstr(e, "thread (0,0,0)") &&
              strstr(e, "__syncthreads") && strstr(e, "sim_deadlock.cu:") && strstr(e, "thread (1,0,0) has exited"),
          "dl_one: %s", e);
    CHECK_STATUS(mj_launch_fixture_sim_dl_halfwarp(f, dims1(4, 32), out), MJ_ERR_KERNEL);
    e = mj_last_error();
    CHECK(strstr(e, "fixture_sim_dl_halfwarp") && strstr(e, "block (0,0,0), thread (0,0,0)") &&
              strstr(e, "__shfl_sync") && strstr(e, "lane 16") && strstr(e, "exited"), "halfwarp: %s", e);
    CHECK_STATUS(mj_launch_fixture_sim_dl_divergent(f, dims1(2, 32), out), MJ_ERR_KERNEL);
    e = mj_last_error();
    CHECK(strstr(e, "fixture_sim_dl_divergent") && strstr(e, "thread (0,0,0)") && strstr(e, "thread (16,0,0)") &&
              strstr(e, "divergent"), "divergent: %s", e);
    CHECK_STATUS(mj_launch_fixture_sim_dl_mixed(f, dims1(1, 64), out), MJ_ERR_KERNEL);
    e = mj_last_error();
    CHECK(strstr(e, "fixture_sim_dl_mixed") && strstr(e, "__shfl_xor_sync") && strstr(e, "lane 16") &&
              strstr(e, "__syncthreads"), "mixed: %s", e);
    printf("a deadlock reads: %s\n", e);
    CHECK_STATUS(mj_launch_fixture_sim_trap(f, dims1(64, 64), out, 5, 7), MJ_ERR_KERNEL);
    e = mj_last_error();
    CHECK(strstr(e, "fixture_sim_trap (sim), block (5,0,0), thread (7,0,0): called __trap()"), "trap: %s", e);
    printf("a trap reads: %s\n", e);
    double ms = test_now_ms() - t0;
    CHECK(ms < 5000, "deadlock reports took %.0f ms", ms);
    /* the function still works after failed launches */
    CHECK_OK(mj_launch_fixture_sim_trap(f, dims1(64, 64), out, -1, -1));
    int bad = 0;
    for (int i = 0; i < 64 * 64; i++) bad += out[i] != 1;
    CHECK(bad == 0, "trap kernel without a trap: %d wrong", bad);
}

/* A second context on the same directory loads from disk and compiles nothing. */
static void test_cache(const char *dir, mj_context_t first) {
    int32_t kn[2] = {128, 4};
    const mj_function *f1 = get(first, "fixture_saxpy", kn);
    mj_context_t c2 = test_new_context(dir, MJ_BACKEND_SIM, NULL, 0);
    if (!c2 || !f1) return;
    const mj_function *f2 = get(c2, "fixture_saxpy", kn);
    mj_jit_stats st;
    CHECK_OK(mj_context_stats(c2, &st));
    CHECK(st.disk_hits == 1 && st.compiles == 0, "disk hits %lld compiles %lld", (long long)st.disk_hits,
          (long long)st.compiles);
    if (f2) {
        CHECK(!strcmp(mj_function_key(f1), mj_function_key(f2)), "same key");
        float x[256], y[256];
        for (int i = 0; i < 256; i++) x[i] = (float)i, y[i] = 1.0f;
        CHECK_OK(mj_launch_fixture_saxpy(f2, dims1(1, 64), 256, 2.0f, x, y));
        int bad = 0;
        for (int i = 0; i < 256; i++) bad += y[i] != 2.0f * (float)i + 1.0f;
        CHECK(bad == 0, "saxpy from disk: %d wrong", bad);
        /* The entry: a shared object, no PTX, metadata says sim. */
        char path[4200];
        mj_cache_entry e;
        memset(&e, 0, sizeof e);
        snprintf(path, sizeof path, "%s/v%d/entries/%s.mjc", dir, MJ_CACHE_FORMAT, mj_function_key(f2));
        CHECK_OK(mj_cache_read_file(path, &e));
        CHECK(e.binary_len > 4 && !memcmp(e.binary, "\177ELF", 4) && !e.ptx && e.meta_json &&
                  strstr(e.meta_json, "\"backend\":\"sim\"") && strstr(e.meta_json, "\"registers\":0") &&
                  strstr(e.key_text, "backend sim\n"),
              "entry: %s", e.meta_json ? e.meta_json : "(none)");
        mj_cache_entry_free(&e);
    }
    /* A sim manifest line prewarms (here: already cached). */
    int was = -1;
    CHECK_OK(mj_prewarm_json(c2, "{\"template\":\"fixture_saxpy\",\"knobs\":{\"BLOCK\":128,\"VEC\":4},"
                                 "\"arch\":\"sm_120a\",\"backend\":\"sim\"}", &was));
    CHECK(was == 1, "prewarm of a cached sim entry: was_cached %d", was);
    mj_context_destroy(c2);
}

/* The compiled object is read from the temporary directory made for it, never through a
 * symbolic link (base/file.c): a compiler ($CC, here a wrapper) that leaves a link there has
 * not produced a usable kernel, and the error says so. */
static void test_compile_output_link(void) {
    char *dir = test_tmpdir("sim-cc");
    CHECK(dir != NULL, "a temporary directory");
    if (!dir) return;
    char script[600], real[600], cc[700];
    snprintf(script, sizeof script, "%s/cc_link.sh", dir);
    snprintf(real, sizeof real, "%s/real.so", dir);
    FILE *f = fopen(script, "w");
    CHECK(f != NULL, "writing %s", script);
    if (!f) return;
    fprintf(f, "out=; prev=\n"
               "for a in \"$@\"; do [ \"$prev\" = -o ] && out=$a; prev=$a; done\n"
               "${MJ_TEST_REAL_CC:-cc} \"$@\" || exit $?\n"
               "[ -z \"$out\" ] || { mv \"$out\" '%s' && ln -s '%s' \"$out\"; }\n",
            real, real);
    fclose(f);
    const char *old = getenv("CC");
    char *saved = old ? strdup(old) : NULL;
    setenv("MJ_TEST_REAL_CC", saved && *saved ? saved : "cc", 1);
    snprintf(cc, sizeof cc, "sh %s", script);
    setenv("CC", cc, 1);
    mj_compile_result r;
    mj_status st = mj_sim_compile("int mj_test_linked = 1;\n", "linked_fixture", &r);
    if (saved) setenv("CC", saved, 1);
    else unsetenv("CC");
    unsetenv("MJ_TEST_REAL_CC");
    const char *e = mj_last_error();
    CHECK(st == MJ_ERR_COMPILE && r.cubin == NULL, "a symbolic link as the compiled object: %s: %s",
          mj_status_string(st), st == MJ_OK ? "(loaded through the link)" : e);
    CHECK(st != MJ_ERR_COMPILE || (strstr(e, "exit status 0, but its output is not usable") &&
                                   strstr(e, "kernel.so is a symbolic link: refused")),
          "the error says why: %s", e);
    CHECK(access(real, F_OK) == 0, "the wrapper ran (%s)", real);
    const char *kept = st == MJ_ERR_COMPILE ? strstr(e, "source kept at ") : NULL;
    if (kept) { /* the sim's own temporary directory, kept for the source */
        char path[600];
        kept += strlen("source kept at ");
        snprintf(path, sizeof path, "%.*s", (int)strcspn(kept, ";"), kept);
        char *slash = strrchr(path, '/');
        if (slash) *slash = '\0';
        if (strstr(path, "moejit-sim-")) test_rm_rf(path);
    }
    mj_compile_result_free(&r);
    free(saved);
    test_rm_rf(dir);
    free(dir);
}

static void test_compile_error(void) {
    mj_compile_result r;
    CHECK_STATUS(mj_sim_compile("int broken = ;\n", "broken_fixture", &r), MJ_ERR_COMPILE);
    const char *e = mj_last_error(), *kept = strstr(e, "source kept at ");
    CHECK(strstr(e, "broken_fixture") && kept && r.log && strlen(r.log) > 0, "compile error: %s", e);
    if (kept) {
        char path[600];
        kept += strlen("source kept at ");
        size_t n = strcspn(kept, ";");
        snprintf(path, sizeof path, "%.*s", (int)n, kept);
        struct stat sb;
        CHECK(stat(path, &sb) == 0, "kept source %s missing", path);
        char *slash = strrchr(path, '/');
        if (slash) *slash = '\0';
        if (strstr(path, "moejit-sim-")) test_rm_rf(path);
    }
    mj_compile_result_free(&r);
    test_compile_output_link();
}

/* ---- the MMA hooks against CuTe's layouts -----------------------------------------------
 * The sim computes mma.sync from the PTX ISA's fragment figures (runtime/sim/sim.c). Here
 * the fragments are placed by an independent description, CuTe's TV layouts
 * (cute/atom/mma_traits_sm80.hpp and mma_traits_sm120.hpp): a (thread, value) pair maps to
 * an offset m + M k in the M x K operand (n + N k for B, m + M n for C). The answer must be
 * the scalar D = A B + C, exactly (the sim sums in double and rounds once; so does this). */
typedef struct cute_layout {
    int rank;
    int shape[6], stride[6];
} cute_layout;

/* Offset of (thread t, value v): t splits over the first `tr` modes, v over the rest, each
 * in colexicographic order (the first mode fastest). */
static int cute_offset(const cute_layout *L, int tr, int t, int v) {
    int off = 0;
    for (int i = 0; i < L->rank; i++) {
        int *x = i < tr ? &t : &v;
        off += (*x % L->shape[i]) * L->stride[i];
        *x /= L->shape[i];
    }
    return off;
}

static float bf16_val(uint16_t h) { return mj_bf16_to_f32(h); }

static void test_mma(mj_context_t c, uint64_t *rng) {
    /* bf16 m16n8k16: SM80_16x8x16_F32BF16BF16F32_TN. */
    const cute_layout A16 = {5, {4, 8, 2, 2, 2}, {32, 1, 16, 8, 128}};
    const cute_layout B16 = {4, {4, 8, 2, 2}, {16, 1, 8, 64}};
    const cute_layout C8 = {4, {4, 8, 2, 2}, {32, 1, 16, 8}};
    /* e2m1 m16n8k64 block-scaled: SM120 16x8x64 TN. */
    const cute_layout A64 = {5, {4, 8, 8, 2, 2}, {128, 1, 16, 8, 512}};
    const cute_layout B64 = {4, {4, 8, 8, 2}, {64, 1, 8, 256}};
    for (int kind = 1; kind <= 2; kind++) {
        const int K = kind == 1 ? 16 : 64, per_reg = kind == 1 ? 2 : 8;
        const cute_layout *LA = kind == 1 ? &A16 : &A64, *LB = kind == 1 ? &B16 : &B64;
        uint16_t A[16][64], B[64][8]; /* bf16 bits, or e2m1 codes */
        uint8_t sfa[16][4], sfb[8][4];
        float C[16][8];
        for (int m = 0; m < 16; m++)
            for (int k = 0; k < K; k++)
                A[m][k] = kind == 1 ? mj_f32_to_bf16((float)mj_rng_normal(rng)) : (uint16_t)(mj_rng_next(rng) & 15);
        for (int k = 0; k < K; k++)
            for (int n = 0; n < 8; n++)
                B[k][n] = kind == 1 ? mj_f32_to_bf16((float)mj_rng_normal(rng)) : (uint16_t)(mj_rng_next(rng) & 15);
        for (int m = 0; m < 16; m++)
            for (int n = 0; n < 8; n++) C[m][n] = (float)mj_rng_normal(rng);
        for (int q = 0; q < 4; q++) { /* scales 2^-4 .. 2^3, a subnormal and a zero among them */
            for (int m = 0; m < 16; m++) sfa[m][q] = (uint8_t)(0x18 + mj_rng_next(rng) % 0x38);
            for (int n = 0; n < 8; n++) sfb[n][q] = (uint8_t)(0x18 + mj_rng_next(rng) % 0x38);
        }
        sfa[3][1] = 0x01, sfb[5][2] = 0x03, sfa[12][3] = 0x00;
        /* Lane fragments from the CuTe layouts. */
        uint32_t fa[32][4] = {{0}}, fb[32][2] = {{0}}, fsf[32][2] = {{0}};
        float fc[32][4], fd[32][4];
        for (int t = 0; t < 32; t++) {
            for (int v = 0; v < 4 * per_reg; v++) {
                int off = cute_offset(LA, 2, t, v), m = off % 16, k = off / 16;
                fa[t][v / per_reg] |= (uint32_t)A[m][k] << ((v % per_reg) * (kind == 1 ? 16 : 4));
            }
            for (int v = 0; v < 2 * per_reg; v++) {
                int off = cute_offset(LB, 2, t, v), n = off % 8, k = off / 8;
                fb[t][v / per_reg] |= (uint32_t)B[k][n] << ((v % per_reg) * (kind == 1 ? 16 : 4));
            }
            for (int v = 0; v < 4; v++) {
                int off = cute_offset(&C8, 2, t, v);
                fc[t][v] = C[off % 16][off / 16];
            }
            /* SFA ((2,2,8),64):((8,0,1),16): thread (t0,t1,t2) holds row t2 + 8 t0; thread id 0
             * is t1 = 0. SFB ((4,8),64):((0,1),8): thread (t0, t1) holds column t1; id 0 is
             * t0 = 0. A lane that supplies none gets noise: it must be ignored. */
            int t0 = t % 2, t1 = (t / 2) % 2, t2 = t / 4;
            fsf[t][0] = t1 == 0 ? 0 : 0x7F7F7F7Fu;
            if (t1 == 0)
                for (int q = 0; q < 4; q++) fsf[t][0] |= (uint32_t)sfa[t2 + 8 * t0][q] << (8 * q);
            fsf[t][1] = t % 4 == 0 ? 0 : 0x7F7F7F7Fu;
            if (t % 4 == 0)
                for (int q = 0; q < 4; q++) fsf[t][1] |= (uint32_t)sfb[t / 4][q] << (8 * q);
        }
        int32_t kn[MJ_MAX_KNOBS] = {kind};
        const mj_function *f = get(c, "fixture_sim_mma", kn);
        if (!f) return;
        CHECK_OK(mj_launch_fixture_mma(f, dims1(1, 32), &fa[0][0], &fb[0][0], &fc[0][0], &fsf[0][0], &fd[0][0], 32));
        int bad = 0;
        for (int t = 0; t < 32; t++)
            for (int v = 0; v < 4; v++) {
                int off = cute_offset(&C8, 2, t, v), m = off % 16, n = off / 16;
                double acc = 0;
                for (int k = 0; k < K; k++)
                    acc += kind == 1 ? (double)bf16_val(A[m][k]) * bf16_val(B[k][n])
                                     : (double)mj_e2m1_decode((uint8_t)A[m][k]) * mj_e4m3_decode(sfa[m][k / 16]) *
                                           ((double)mj_e2m1_decode((uint8_t)B[k][n]) * mj_e4m3_decode(sfb[n][k / 16]));
                float want = (float)(acc + (double)C[m][n]);
                if (fd[t][v] != want) {
                    if (bad++ < 4)
                        fprintf(stderr, "  mma kind %d lane %d d%d (D[%d][%d]): %.9g want %.9g\n", kind, t, v, m, n,
                                (double)fd[t][v], (double)want);
                }
            }
        CHECK(bad == 0, "mma kind %d: %d of 128 outputs differ from the scalar D = A B + C", kind, bad);
        /* The check can fail: the same data with two of lane 5's A registers swapped. */
        uint32_t tmp = fa[5][1];
        fa[5][1] = fa[5][2], fa[5][2] = tmp;
        float fd2[32][4];
        CHECK_OK(mj_launch_fixture_mma(f, dims1(1, 32), &fa[0][0], &fb[0][0], &fc[0][0], &fsf[0][0], &fd2[0][0], 32));
        CHECK(memcmp(fd, fd2, sizeof fd) != 0, "mma kind %d: a swapped fragment went unnoticed", kind);
        /* Fewer than 32 lanes at the MMA: refused, not computed from garbage. */
        CHECK_STATUS(mj_launch_fixture_mma(f, dims1(1, 32), &fa[0][0], &fb[0][0], &fc[0][0], &fsf[0][0], &fd2[0][0], 16),
                     MJ_ERR_KERNEL);
        CHECK(strstr(mj_last_error(), "mma.sync") && strstr(mj_last_error(), "every lane"), "partial mma: %s",
              mj_last_error());
    }
    /* The conversion hooks against the reference's rounding: every E2M1 midpoint and code,
     * every E4M3 byte's value and the midpoints between neighbours, saturation, -0.0. */
    {
        enum { NC = 2048 };
        static float xs[NC];
        static uint32_t e2[NC / 2], e4[NC];
        int n = 0;
        static const float e2m1_points[] = {0, 0.25f, 0.5f, 0.75f, 1, 1.25f, 1.5f, 1.75f, 2, 2.5f, 3, 3.5f, 4, 5, 6, 7, 1e9f};
        for (size_t i = 0; i < sizeof e2m1_points / sizeof e2m1_points[0]; i++)
            for (int sg = -1; sg <= 1; sg += 2) {
                float v = e2m1_points[i] * (float)sg;
                xs[n++] = v, xs[n++] = nextafterf(v, 0), xs[n++] = nextafterf(v, 1e30f * (float)sg);
            }
        for (int b = 0; b < 0x7F && n + 3 < NC; b++) { /* E4M3 values and the midpoints above them */
            float v = mj_e4m3_decode((uint8_t)b), up = mj_e4m3_decode((uint8_t)(b + 1));
            xs[n++] = v, xs[n++] = b < 0x7E ? (v + up) / 2 : 460.0f, xs[n++] = -v;
        }
        xs[n++] = -0.0f, xs[n++] = 464.0f, xs[n++] = 1e-30f;
        if (n % 2) xs[n++] = 0.1f;
        const mj_function *fc = get(c, "fixture_sim_mma", (int32_t[MJ_MAX_KNOBS]){1});
        if (fc) {
            CHECK_OK(mj_launch_fixture_cvt(fc, dims1(2, 64), xs, n, e2, e4));
            int bad = 0;
            for (int i = 0; i < n; i++) {
                uint32_t want4 = mj_e4m3_encode(xs[i]);
                if (e4[i] != want4 && bad++ < 3) fprintf(stderr, "  e4m3(%.9g) = 0x%02x want 0x%02x\n", (double)xs[i], e4[i], want4);
            }
            for (int i = 0; i < n / 2; i++) {
                uint32_t want2 = mj_e2m1_encode(xs[2 * i]) | (uint32_t)mj_e2m1_encode(xs[2 * i + 1]) << 4;
                if (e2[i] != want2 && bad++ < 6)
                    fprintf(stderr, "  e2m1(%.9g, %.9g) = 0x%02x want 0x%02x\n", (double)xs[2 * i], (double)xs[2 * i + 1], e2[i], want2);
            }
            CHECK(bad == 0, "%d conversions differ from the reference's rounding (of %d values)", bad, n);
        }
    }
    /* The weight stream: counted, 16 bytes a load, across blocks and workers. */
    int32_t kn[MJ_MAX_KNOBS] = {1};
    const mj_function *f = get(c, "fixture_sim_mma", kn);
    if (!f) return;
    enum { N = 1000 };
    static uint32_t src[4 * N], dst[4 * N];
    for (int i = 0; i < 4 * N; i++) src[i] = (uint32_t)mj_rng_next(rng);
    mj_sim_stream_bytes_take();
    CHECK_OK(mj_launch_fixture_stream_copy(f, dims1(4, 64), src, dst, N));
    CHECK(!memcmp(src, dst, sizeof src), "stream copy");
    unsigned long long n = mj_sim_stream_bytes_take();
    CHECK(n == 16ull * N, "stream bytes %llu, want %d", n, 16 * N);
    CHECK(mj_sim_stream_bytes_take() == 0, "the count restarts after a take");
}

/* The conversion hooks (mj_cvt_e4m3, mj_cvt_e2m1x2) in a kernel on the interpreter, on the
 * rule of templates/prelude_fp.h (the GPU's cvt.rn.satfinite): a code's sign bit is x's, so
 * +0.0 gives +0 and -0.0 or a negative that rounds to zero gives -0 (E4M3 0x80, E2M1 8);
 * past the largest finite value, Inf included, comes that value with x's sign. The
 * reference's encoders (runtime/ref/nvfp4.c) must give the same bytes. Each value is
 * converted in both nibbles of an E2M1 pair. */
static void test_cvt_rule(mj_context_t c) {
    const test_cvt_case *k = test_cvt_cases;
    enum { N = TEST_CVT_N };
    float xs[2 * N];
    uint32_t e2[N], e4[2 * N];
    for (int i = 0; i < N; i++) xs[2 * i] = k[i].x, xs[2 * i + 1] = k[(i + 1) % N].x;
    memset(e2, 0xEE, sizeof e2), memset(e4, 0xEE, sizeof e4);
    const mj_function *fc = get(c, "fixture_sim_mma", (int32_t[MJ_MAX_KNOBS]){1});
    if (!fc) return;
    CHECK_OK(mj_launch_fixture_cvt(fc, dims1(1, 64), xs, 2 * N, e2, e4));
    int bad = 0;
    for (int i = 0; i < N; i++) {
        const int n = (i + 1) % N;
        const uint32_t w4[2] = {k[i].e4m3, k[n].e4m3}, w2 = k[i].e2m1 | k[n].e2m1 << 4;
        for (int h = 0; h < 2; h++) {
            const float x = xs[2 * i + h];
            if ((e4[2 * i + h] != w4[h] || mj_e4m3_encode(x) != w4[h]) && bad++ < 6)
                fprintf(stderr, "  e4m3(%g): kernel 0x%02x, reference 0x%02x, want 0x%02x\n", (double)x, e4[2 * i + h],
                        mj_e4m3_encode(x), w4[h]);
        }
        const uint32_t r2 = mj_e2m1_encode(xs[2 * i]) | (uint32_t)mj_e2m1_encode(xs[2 * i + 1]) << 4;
        if ((e2[i] != w2 || r2 != w2) && bad++ < 6)
            fprintf(stderr, "  e2m1(%g, %g): kernel 0x%02x, reference 0x%02x, want 0x%02x\n", (double)xs[2 * i],
                    (double)xs[2 * i + 1], e2[i], r2, w2);
    }
    CHECK(bad == 0, "%d conversions break the sign / saturation rule", bad);
}

/* What the cases share (setup): a fresh kernel cache directory (the compiles are this run's
 * own), and a context on it, made on first use (sim_ctx). */
static char g_dir[] = "/tmp/mj-test-sim-XXXXXX";
static mj_context_t g_ctx;
static double g_t0;

static int setup(void) {
    char *dir = mkdtemp(g_dir);
    CHECK(dir != NULL, "mkdtemp failed");
    if (!dir) return test_finish();
    unsetenv("MOEJIT_RECORD");
    unsetenv("MOEJIT_STRICT");
    g_t0 = test_now_ms();
    return 0;
}

static void teardown(void) {
    if (g_ctx) {
        mj_jit_stats st;
        CHECK_OK(mj_context_stats(g_ctx, &st));
        printf("sim: %lld compiles, %.0f ms in the host compiler\n", (long long)st.compiles, st.compile_ms);
        mj_context_destroy(g_ctx);
    }
    printf("sim tests: %.0f ms\n", test_now_ms() - g_t0);
    test_rm_rf(g_dir);
}

static mj_context_t sim_ctx(void) {
    if (!g_ctx) g_ctx = test_new_context(g_dir, MJ_BACKEND_SIM, NULL, 0);
    return g_ctx;
}

static void case_context(void) { test_context(g_dir); }
static void case_jit_fixtures(void) {
    if (sim_ctx()) test_jit_fixtures(g_ctx);
}
static void case_sync(void) {
    if (sim_ctx()) test_sync(g_ctx);
}
static void case_warp(void) {
    if (sim_ctx()) test_warp(g_ctx);
}
static void case_atomics(void) {
    if (sim_ctx()) test_atomics(g_ctx);
}
static void case_cp_async(void) {
    if (sim_ctx()) test_cp_async(g_ctx);
}
static void case_deadlocks(void) {
    if (sim_ctx()) test_deadlocks(g_ctx);
}
static void case_mma(void) {
    if (!sim_ctx()) return;
    uint64_t rng = test_seed(77);
    test_mma(g_ctx, &rng);
}
static void case_cvt_rule(void) {
    if (sim_ctx()) test_cvt_rule(g_ctx);
}
static void case_cache(void) {
    if (sim_ctx()) test_cache(g_dir, g_ctx);
}

static const test_case cases[] = {
    TEST_CASE("context", case_context),
    TEST_CASE("render_and_keys", test_render_and_keys),
    TEST_CASE("jit_fixtures", case_jit_fixtures),
    TEST_CASE("sync", case_sync),
    TEST_CASE("warp", case_warp),
    TEST_CASE("atomics", case_atomics),
    TEST_CASE("cp_async", case_cp_async),
    TEST_CASE("deadlocks", case_deadlocks),
    TEST_CASE("mma", case_mma),
    TEST_CASE("cvt_rule", case_cvt_rule),
    TEST_CASE("cache", case_cache),
    TEST_CASE("compile_error", test_compile_error),
};

int main(int argc, char **argv) { return test_main(argc, argv, cases, TEST_N(cases), setup, teardown); }
