/* bench_experts.c — what the expert GEMMs cost, as far as this machine can tell without a GPU:
 *
 *   bytes   the weight bytes one forward reads, counted by the interpreter, against the floor
 *           (every active expert's packed bytes once), for GLM-5's routing (256 experts, top-8,
 *           B in {1, 8, 32, 64}, k0 in {8, 4}); the experts are small here so the interpreter
 *           is quick, and the GLM-5 column scales the active count by a GLM-5 expert at TP 8
 *           (H 6144, I_local 256: 2654208 bytes), with the floor on named GPUs;
 *   compile the cold NVRTC compile of the GLM-5 decode plan's specializations (median of 3).
 *
 * A benchmark target (make bench_experts), not a test: it prints numbers. */
#include "experts.h"
#include "sim/sim.h"
#include "test.h"
#include "weights/pack.h"

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(void) {
    const char *cache = test_shared_cache();
    mj_context_options o = MJ_CONTEXT_OPTIONS_INIT;
    o.cache_dir = cache, o.device = MJ_DEVICE_NONE, o.backend = MJ_BACKEND_SIM, o.target = "sm_120a";
    mj_context_t ctx = NULL;
    if (mj_context_create(&o, &ctx) != MJ_OK) return fprintf(stderr, "%s\n", mj_last_error()), 1;

    /* GLM-5's router and routing; small experts. */
    mj_moe_config c;
    mj_moe_config_glm5(&c);
    c.intermediate = 64; /* the router sees H = 6144; the experts are 6144 x 64 */
    mj_layer_t L = NULL;
    if (mj_layer_create_random(&c, 1, &L) != MJ_OK) return fprintf(stderr, "%s\n", mj_last_error()), 1;
    mj_experts_options eo = MJ_EXPERTS_OPTIONS_INIT;
    eo.max_batch = 64;
    mj_experts_t ex = NULL;
    if (mj_experts_create(ctx, L, &eo, &ex) != MJ_OK) return fprintf(stderr, "%s\n", mj_last_error()), 1;
    mj_experts_view v;
    mj_experts_view_get(ex, &v);
    const int64_t per = v.bytes_w13 + v.bytes_s13 + v.bytes_w2 + v.bytes_s2;
    const int64_t glm = mj_pack_w13_bytes(6144, 256) + mj_pack_s13_bytes(6144, 256) + mj_pack_w2_bytes(6144, 256) +
                        mj_pack_s2_bytes(6144, 256);
    printf("weight bytes of one forward (W4A16), GLM-5 routing (E 256, top-8, 1 shared), counted by the interpreter\n");
    printf("%4s %3s %8s %14s %14s %6s %14s %12s %10s\n", "B", "k0", "experts", "read (here)", "floor (here)", "ratio",
           "GLM-5 TP8 MB", "RTX PRO us", "H200 us");
    static const int Bs[] = {1, 8, 32, 64};
    uint64_t rng = 7;
    for (int bi = 0; bi < 4; bi++)
        for (int k0 = 8; k0 >= 4; k0 -= 4) {
            const int B = Bs[bi], H = 6144, K = 8, E = 256;
            uint16_t *hidden = malloc(sizeof(uint16_t) * (size_t)B * H);
            for (int64_t i = 0; i < (int64_t)B * H; i++) hidden[i] = mj_f32_to_bf16((float)mj_rng_normal(&rng));
            float *logits = malloc(sizeof(float) * (size_t)B * E), *w = malloc(sizeof(float) * (size_t)B * K);
            int32_t *ids = malloc(4 * (size_t)B * K), *nsel = malloc(4 * (size_t)B), *cnt = malloc(4 * E),
                    *off = malloc(4 * (E + 1)), *act = malloc(4 * E), *perm = malloc(4 * (size_t)B * K),
                    *rix = malloc(4 * (size_t)B * K), na = 0;
            mj_route_params p;
            mj_router_ref(L, hidden, B, logits);
            mj_route_params_from_config(&c, &p);
            p.k0 = k0;
            mj_route_ref(&p, logits, L->bias, B, B, ids, w, nsel, NULL);
            mj_route_dispatch_ref(ids, nsel, B, K, E, cnt, off, act, &na, perm, rix);
            mj_route_outputs ro = MJ_ROUTE_OUTPUTS_INIT;
            ro.ids = ids, ro.weights = w, ro.n_sel = nsel, ro.expert_counts = cnt, ro.expert_offsets = off;
            ro.active_experts = act, ro.n_active = &na, ro.permutation = perm, ro.row_index = rix;
            float *out = malloc(sizeof(float) * (size_t)B * H);
            mj_sim_stream_bytes_take();
            if (mj_experts_forward(ctx, ex, MJ_MODE_W4A16, hidden, &ro, B, NULL, out, NULL) != MJ_OK)
                return fprintf(stderr, "%s\n", mj_last_error()), 1;
            unsigned long long got = mj_sim_stream_bytes_take();
            int64_t floor_here = (int64_t)(na + v.nsub) * per, glm_bytes = (int64_t)(na + v.nsub) * glm;
            printf("%4d %3d %8d %14llu %14lld %6.3f %14.1f %12.1f %10.1f\n", B, k0, na + v.nsub, got, (long long)floor_here,
                   (double)got / (double)floor_here, glm_bytes / 1e6, glm_bytes / 1792e3, glm_bytes / 4800e3);
            free(hidden), free(logits), free(w), free(ids), free(nsel), free(cnt), free(off), free(act), free(perm);
            free(rix), free(out);
        }
    mj_experts_free(ex);
    mj_layer_free(L);
    mj_context_destroy(ctx);

    printf("\ncold NVRTC compile of the GLM-5 decode plan (H 6144, I_local 256, one shared), median of 3, ms\n");
    static const char *targets[] = {"sm_120a", "sm_90a"};
    for (int t = 0; t < 2; t++)
        for (int mode = 0; mode < (t == 0 ? 2 : 1); mode++)
            for (int tpe = 8; tpe <= 64; tpe *= 2) {
                double ms[3];
                for (int rep = 0; rep < 3; rep++) {
                    char *dir = test_tmpdir("bench-compile");
                    mj_context_options co = MJ_CONTEXT_OPTIONS_INIT;
                    co.cache_dir = dir, co.device = MJ_DEVICE_NONE, co.backend = MJ_BACKEND_CUDA, co.target = targets[t];
                    mj_context_t cc = NULL;
                    mj_context_create(&co, &cc);
                    mj_knobs_moe_experts k = {.MODE = mode, .H = 6144, .I = 256, .K = 8, .TPE = tpe,
                                              .NW1 = tpe == 64 ? 4 : 8, .NW2 = 2, .NSUB = 1};
                    mj_spec s[3];
                    const mj_function *f;
                    const int32_t n = mj_experts_specs(cc, &k, s); /* one per kernel a forward launches */
                    double t0 = test_now_ms();
                    for (int32_t q = 0; q < n; q++)
                        if (mj_jit_get(cc, &s[q], &f) != MJ_OK) return fprintf(stderr, "%s\n", mj_last_error()), 1;
                    ms[rep] = test_now_ms() - t0;
                    mj_context_destroy(cc);
                    test_rm_rf(dir);
                    free(dir);
                }
                qsort(ms, 3, sizeof ms[0], cmp_d);
                printf("  %-7s %-5s TPE %2d: %7.1f\n", targets[t], mode ? "W4A4" : "W4A16", tpe, ms[1]);
            }
    return 0;
}
