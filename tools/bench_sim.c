/* bench_sim.c — `moejit bench` on the interpreter, with or without a GPU:
 *   launch      the host time of one forward's launch path: mj_moe_forward with its launches
 *               recorded instead of run (mj_sim_capture_begin/end), so what is timed is the
 *               host work a forward does, not the kernels';
 *   bytes       the weight bytes one forward reads (the interpreter counts them) against the
 *               floor (the router's gate, each active expert and the shared expert once), for
 *               each B x k0, at the model's routing (its router at full size) with experts of
 *               --sim-intermediate rows; the same active experts at the rank's real expert
 *               size give the model's bytes, and those over each named GPU's bandwidth its
 *               floor time.
 * Set up, measured, reported: sim_open makes the layer, measure_* return numbers, report_*
 * write the rows (JSON and text). */
#include "bench.h"

#include "moejit_private.h"

#include <stdlib.h>
#include <string.h>

/* The interpreter's layer of rank 0 and what a forward needs. */
typedef struct sim {
    bench *b;
    mj_context_t ctx;
    mj_layer_t L;
    mj_moe_t moe;
    uint16_t *hidden;             /* [maxB, H]                                                */
    float *out;                   /* [maxB, H]                                                */
    double *v;                    /* [iters]: one row's timings                               */
    int64_t per_sim;              /* packed bytes of one expert of --sim-intermediate rows    */
    const char *step;             /* what failed                                              */
} sim;

#define STEP(what, call) BENCH_STEP(s->step, what, call)

/* ---- setup ------------------------------------------------------------------------------- */

static mj_status sim_open(sim *s, const char *arch) {
    bench *b = s->b;
    const bench_args *a = b->a;
    const int32_t H = b->cfg.hidden, maxB = a->bb[a->n_bb - 1];
    s->hidden = malloc(sizeof(uint16_t) * (size_t)maxB * (size_t)H);
    s->out = malloc(sizeof(float) * (size_t)maxB * (size_t)H);
    s->v = malloc(sizeof(double) * (size_t)a->iters);
    s->step = "allocating";
    if (!s->hidden || !s->out || !s->v) return MJ_ERR_NOMEM;
    bench_progress(b, "the interpreter's layer: H %d, E %d, %d expert rows, %d shared sub-expert(s)", H,
                   b->cfg.n_experts, a->sim_I, b->nsub);
    double t0 = bench_now_ms();
    STEP("creating the interpreter's layer", bench_rank_layer(b, a->sim_I, 0, &s->L));
    bench_progress(b, "layer made in %.0f ms", bench_now_ms() - t0);
    mj_context_options o = MJ_CONTEXT_OPTIONS_INIT;
    o.cache_dir = a->cache_dir, o.device = MJ_DEVICE_NONE, o.backend = MJ_BACKEND_SIM, o.target = arch, o.strict = 0;
    STEP("the interpreter's context", mj_context_create(&o, &s->ctx));
    STEP("the interpreter's layer", bench_moe_make(s->ctx, s->L, b, &s->moe));
    s->per_sim = mj_pack_expert_bytes(H, a->sim_I);
    return MJ_OK;
}

static void sim_close(sim *s) {
    mj_moe_free(s->moe);
    mj_layer_free(s->L);
    mj_context_destroy(s->ctx);
    free(s->hidden), free(s->out), free(s->v);
}

/* ---- measurements ------------------------------------------------------------------------- */

/* One forward of B tokens as prepared: its k0 and mode, its launches and the median host µs
 * of --iters recordings (after a forward that runs, to warm). */
static mj_status measure_launch_path(sim *s, int32_t B, int32_t *k0, mj_weight_mode *m, int *launches, double *us) {
    const bench_args *a = s->b->a;
    bench_random_bf16(s->hidden, (size_t)B * (size_t)s->b->cfg.hidden, 100 + (uint64_t)B);
    STEP("the batch plan", mj_moe_batch_plan(s->moe, B, k0, m));
    STEP("a forward", mj_moe_forward(s->moe, s->hidden, B, NULL, s->out, NULL)); /* warm */
    *launches = 0;
    for (int it = 0; it < a->iters; it++) {
        mj_sim_graph *g = NULL;
        double t = bench_now_ms();
        STEP("recording a forward", mj_sim_capture_begin(s->ctx));
        mj_status st = mj_moe_forward(s->moe, s->hidden, B, NULL, s->out, NULL);
        mj_status st2 = mj_sim_capture_end(s->ctx, &g);
        s->v[it] = 1e3 * (bench_now_ms() - t);
        if (st == MJ_OK) st = st2;
        if (g) *launches = mj_sim_graph_launches(g);
        mj_sim_graph_free(g);
        if (st != MJ_OK) return st; /* s->step: still "recording a forward" */
    }
    *us = bench_median(s->v, a->iters);
    return MJ_OK;
}

/* One forward of B tokens as prepared: the weight bytes it read and the experts it routed to. */
static mj_status measure_bytes(sim *s, int32_t B, unsigned long long *read, int32_t *active) {
    bench_random_bf16(s->hidden, (size_t)B * (size_t)s->b->cfg.hidden, 200 + (uint64_t)B);
    mj_sim_stream_bytes_take();
    STEP("a forward", mj_moe_forward(s->moe, s->hidden, B, NULL, s->out, NULL));
    *read = mj_sim_stream_bytes_take();
    mj_route_outputs ro = MJ_ROUTE_OUTPUTS_INIT;
    STEP("the routing", mj_moe_route_outputs(s->moe, &ro));
    *active = *ro.n_active;
    return MJ_OK;
}

/* ---- the report --------------------------------------------------------------------------- */

/* The floor of `bytes` on each named GPU, µs, into a JSON object. */
static json_t *floors(double bytes) {
    json_t *o = json_object();
    for (int g = 0; g < tool_gpu_count(); g++)
        json_object_set_new(o, tool_gpu_at(g)->name, json_real(bytes / (tool_gpu_at(g)->gbps * 1e3)));
    return o;
}

static void report_launch_head(bench *b) {
    bench_txt(b, "\nhost time of one forward's launch path (the interpreter, launches recorded not run; median of %d)\n",
              b->a->iters);
    bench_txt(b, "  %4s %3s %-6s %8s %10s\n", "B", "k0", "mode", "launches", "host us");
}

static void report_launch_row(bench *b, json_t *rows, int32_t B, int32_t k0, mj_weight_mode m, int launches,
                              double us) {
    json_t *r = json_object();
    json_object_set_new(r, "B", json_integer(B));
    json_object_set_new(r, "k0", json_integer(k0));
    json_object_set_new(r, "mode", json_string(bench_mode_name(m)));
    json_object_set_new(r, "launches", json_integer(launches));
    json_object_set_new(r, "host_us", json_real(us));
    json_array_append_new(rows, r);
    bench_txt(b, "  %4d %3d %-6s %8d %10.2f\n", (int)B, (int)k0, bench_mode_name(m), launches, us);
}

static void report_bytes_head(bench *b) {
    bench_txt(b, "\nweight bytes of one forward (rank 0), counted by the interpreter (experts of %d rows) against the\n"
                 "floor (gate + active experts + shared, each once); at the rank's expert size (H %d, I %d): bytes and\n"
                 "their floor time\n",
              b->a->sim_I, b->cfg.hidden, b->i_local);
    bench_txt(b, "  %4s %3s %6s %12s %12s %6s %12s %9s %9s %9s\n", "B", "k0", "active", "read here", "floor here",
              "ratio", "model MB", "rtx-pro us", "h200 us", "b200 us");
}

/* A row of the bytes: what the interpreter read against its floor (experts of per_sim bytes),
 * and the model's bytes (the rank's real experts) with their floor on each named GPU. */
static void report_bytes_row(bench *b, json_t *rows, int32_t B, int32_t k0, int32_t active, unsigned long long read,
                             int64_t per_sim) {
    const double floor_here = (double)b->gate_bytes + (double)(active + b->nsub) * (double)per_sim;
    const double model = (double)b->gate_bytes + (double)(active + b->nsub) * (double)b->per_expert;
    json_t *r = json_object();
    json_object_set_new(r, "B", json_integer(B));
    json_object_set_new(r, "k0", json_integer(k0));
    json_object_set_new(r, "active", json_integer(active));
    json_object_set_new(r, "read", json_integer((json_int_t)read));
    json_object_set_new(r, "floor", json_integer((json_int_t)floor_here));
    json_object_set_new(r, "ratio", json_real((double)read / floor_here));
    json_object_set_new(r, "model_bytes", json_integer((json_int_t)model));
    json_object_set_new(r, "floor_us", floors(model));
    json_array_append_new(rows, r);
    const tool_gpu *rp = tool_gpu_find("rtx-pro-6000"), *h2 = tool_gpu_find("h200"), *b2 = tool_gpu_find("b200");
    bench_txt(b, "  %4d %3d %6d %12llu %12.0f %6.3f %12.2f %9.1f %9.1f %9.1f\n", (int)B, (int)k0, (int)active, read,
              floor_here, (double)read / floor_here, model / 1e6, model / (rp->gbps * 1e3), model / (h2->gbps * 1e3),
              model / (b2->gbps * 1e3));
}

/* ---- the section ---------------------------------------------------------------------------- */

static mj_status run_sim(sim *s, const char *arch, json_t *launch_rows, json_t *byte_rows) {
    bench *b = s->b;
    const bench_args *a = b->a;
    mj_status st;
    if ((st = sim_open(s, arch)) != MJ_OK) return st;

    /* The launch path, at the plan's k0 policy. */
    bench_progress(b, "preparing the interpreter's kernels (k0 %s)", a->k0_policy ? a->k0_policy : "= top-k");
    STEP("preparing", bench_moe_prepare(s->moe, b, a->k0_policy));
    report_launch_head(b);
    for (int i = 0; i < a->n_bb; i++) {
        int32_t k0;
        mj_weight_mode m;
        int launches;
        double us;
        if ((st = measure_launch_path(s, a->bb[i], &k0, &m, &launches, &us)) != MJ_OK) return st;
        report_launch_row(b, launch_rows, a->bb[i], k0, m, launches, us);
    }

    /* Bytes per forward, B x k0. */
    report_bytes_head(b);
    for (int ki = 0; ki < a->n_k0; ki++) {
        char k0p[16];
        snprintf(k0p, sizeof k0p, "%d", (int)a->k0s[ki]);
        bench_progress(b, "bytes at k0 %s", k0p);
        STEP("preparing", bench_moe_prepare(s->moe, b, k0p));
        for (int i = 0; i < a->n_bb; i++) {
            unsigned long long read;
            int32_t na;
            if ((st = measure_bytes(s, a->bb[i], &read, &na)) != MJ_OK) return st;
            b->active[ki * a->n_bb + i] = (double)na;
            report_bytes_row(b, byte_rows, a->bb[i], a->k0s[ki], na, read, s->per_sim);
        }
    }
    b->have_active = 1;
    return MJ_OK;
}

int bench_sim(bench *b, const char *arch) {
    sim s;
    memset(&s, 0, sizeof s);
    s.b = b;
    s.step = "";
    json_t *lp = json_array(), *by = json_array();
    json_object_set_new(b->root, "launch_path", lp);
    json_object_set_new(b->root, "bytes", by);
    mj_status st = run_sim(&s, arch, lp, by);
    int rc = 0;
    if (st != MJ_OK) rc = tool_fail("the interpreter: %s: %s: %s", s.step, mj_status_string(st), mj_last_error());
    sim_close(&s);
    return rc;
}
