/* bench_gpu.c — `moejit bench` on GPU 0, timed with CUDA events after a warm-up, the median
 * of --iters, rotating several input sets, with the L2 flushed before each call (a write of
 * twice its size enqueued before the first event: the weights are the same every call) so it
 * serves nothing:
 *   copy        device-to-device copy bandwidth (bytes read + written), the yardstick;
 *   routing     the router GEMM + mj_route;
 *   experts     mj_experts_forward at the rank's shapes (W4A16; W4A4 where the target has it);
 *   layer       mj_moe_forward, eager and replayed from a CUDA graph;
 * each row with the weight bytes read, the GB/s they make and that over the copy bandwidth,
 * and the goals checked (experts at B <= 16 at >= 80% of the copy bandwidth; OEA k0 = 4
 * making the layer >= 1.4x faster than k0 = 8 at B = 32).
 *
 * Three parts: setup (gpu_open and gpu_load_layer: the device, its stream, events and
 * buffers, the layer's inputs and router), measurements (measure_*: numbers only, from
 * time_op) and the report (report_*: the JSON object and the text lines); bench_gpu runs them
 * in order, and gpu_close frees what setup made. */
#include "bench.h"

#include "moejit_private.h"

#include <stdlib.h>
#include <string.h>

#define NSETS 4 /* input sets rotated through                                                */

/* A routing's outputs in device memory: what mj_route writes for the experts. */
typedef struct routebuf {
    int32_t *ids, *nsel, *cnt, *off, *act, *na, *perm, *rix;
    float *w;
    mj_route_outputs o;
} routebuf;

/* GPU 0 and what the measurements use there. */
typedef struct gpu {
    bench *b;
    mj_context_t ctx;
    mj_device_info di;
    int driver;                   /* cuDriverGetVersion                                       */
    void *stream, *e0, *e1;
    int iters;
    uint64_t flush;               /* written before each timed call: the L2 evicted           */
    size_t flush_bytes;
    uint8_t flush_value;
    uint64_t ca, cb;              /* the copy's buffers                                       */
    size_t copy_bytes;
    /* the layer (gpu_load_layer) */
    mj_layer_t L;
    int32_t H, E, K, maxB;
    uint16_t *hidden[NSETS], *gate;
    float *bias, *logits, *out;
    void *rws;                    /* the router GEMM's workspace                              */
    size_t rws_bytes;
    routebuf rb[NSETS];
    mj_route_params rp;
    mj_experts_t ex;
    mj_moe_t moe;
    void *exec[NSETS];            /* the layer's CUDA graphs, one per input set               */
    const char *step;             /* what failed                                              */
} gpu;

#define STEP(what, call) BENCH_STEP(g->step, what, call)

/* ---- setup ------------------------------------------------------------------------------- */

/* GPU 0: its context and description, a stream, two events, the L2 flush buffer (twice the
 * L2, or 256 MiB where the driver does not say its size). */
static mj_status gpu_open(gpu *g) {
    mj_context_options o = MJ_CONTEXT_OPTIONS_INIT;
    o.cache_dir = g->b->a->cache_dir, o.device = 0, o.backend = MJ_BACKEND_CUDA; /* strict: $MOEJIT_STRICT */
    g->iters = g->b->a->iters;
    STEP("binding GPU 0", mj_cuda_bind(0));
    STEP("the GPU's context", mj_context_create(&o, &g->ctx));
    mj_context_device(g->ctx, &g->di);
    mj_cuda_driver_version(&g->driver);
    g->flush_bytes = g->di.l2_bytes > 0 ? 2 * (size_t)g->di.l2_bytes : (size_t)256 << 20;
    return MJ_OK;
}

/* What the timings need beyond the context (made after the device is reported). */
static mj_status gpu_open_timing(gpu *g) {
    STEP("a stream", mj_cuda_stream_create(&g->stream));
    STEP("the L2 flush buffer", mj_cuda_malloc(g->flush_bytes, &g->flush));
    STEP("events", mj_cuda_event_create(&g->e0));
    STEP("events", mj_cuda_event_create(&g->e1));
    return MJ_OK;
}

static mj_status routebuf_alloc(routebuf *r, int32_t B, int32_t K, int32_t E) {
    const size_t bk = 4 * (size_t)B * (size_t)K;
    MJ_CHECK(mj_mem_alloc(0, bk, "bench", (void **)&r->ids));
    MJ_CHECK(mj_mem_alloc(0, bk, "bench", (void **)&r->w));
    MJ_CHECK(mj_mem_alloc(0, 4 * (size_t)B, "bench", (void **)&r->nsel));
    MJ_CHECK(mj_mem_alloc(0, 4 * (size_t)E, "bench", (void **)&r->cnt));
    MJ_CHECK(mj_mem_alloc(0, 4 * (size_t)(E + 1), "bench", (void **)&r->off));
    MJ_CHECK(mj_mem_alloc(0, 4 * (size_t)E, "bench", (void **)&r->act));
    MJ_CHECK(mj_mem_alloc(0, 4, "bench", (void **)&r->na));
    MJ_CHECK(mj_mem_alloc(0, bk, "bench", (void **)&r->perm));
    MJ_CHECK(mj_mem_alloc(0, bk, "bench", (void **)&r->rix));
    mj_route_outputs o = MJ_ROUTE_OUTPUTS_INIT;
    o.ids = r->ids, o.weights = r->w, o.n_sel = r->nsel, o.expert_counts = r->cnt, o.expert_offsets = r->off;
    o.active_experts = r->act, o.n_active = r->na, o.permutation = r->perm, o.row_index = r->rix;
    r->o = o;
    return MJ_OK;
}

static void routebuf_free(routebuf *r) {
    void *p[] = {r->ids, r->w, r->nsel, r->cnt, r->off, r->act, r->na, r->perm, r->rix};
    for (int i = 0; i < 9; i++) mj_mem_free(0, p[i]);
    memset(r, 0, sizeof *r);
}

/* Rank 0's layer (from the checkpoint, or random) and on the device: NSETS input sets of the
 * largest batch with a routing's buffers each, the router's gate and bias (copied from the
 * layer handle), the logits and the output. */
static mj_status gpu_load_layer(gpu *g) {
    bench *b = g->b;
    double t0 = bench_now_ms();
    STEP("making the layer", bench_rank_layer(b, b->i_local, 1, &g->L));
    bench_progress(b, "layer made in %.0f ms", bench_now_ms() - t0);
    g->H = b->cfg.hidden, g->E = b->cfg.n_experts, g->K = b->cfg.topk, g->maxB = b->a->bb[b->a->n_bb - 1];
    const size_t nh = (size_t)g->maxB * (size_t)g->H;
    uint16_t *h = malloc(sizeof(uint16_t) * nh);
    if (!h) STEP("allocating", mj_set_error(MJ_ERR_NOMEM, "out of memory"));
    mj_status st = MJ_OK;
    for (int s = 0; s < NSETS && st == MJ_OK; s++) {
        bench_random_bf16(h, nh, 300 + (uint64_t)s);
        st = mj_mem_alloc(0, sizeof(uint16_t) * nh, "bench", (void **)&g->hidden[s]);
        if (st == MJ_OK) st = mj_mem_put(0, g->hidden[s], h, sizeof(uint16_t) * nh);
        if (st == MJ_OK) st = routebuf_alloc(&g->rb[s], g->maxB, g->K, g->E);
    }
    free(h);
    STEP("the input sets", st);
    const uint16_t *gate;
    const float *bias;
    STEP("the router", mj_layer_router(g->L, &gate, &bias));
    STEP("the router", mj_mem_alloc(0, 2 * (size_t)g->E * (size_t)g->H, "bench", (void **)&g->gate));
    STEP("the router", mj_mem_put(0, g->gate, gate, 2 * (size_t)g->E * (size_t)g->H));
    if (bias) {
        STEP("the router", mj_mem_alloc(0, 4 * (size_t)g->E, "bench", (void **)&g->bias));
        STEP("the router", mj_mem_put(0, g->bias, bias, 4 * (size_t)g->E));
    }
    STEP("the logits", mj_mem_alloc(0, 4 * (size_t)g->maxB * (size_t)g->E, "bench", (void **)&g->logits));
    STEP("the router's workspace", mj_router_gemm_workspace(g->maxB, g->H, g->E, &g->rws_bytes));
    if (g->rws_bytes) { /* zeroed once: every router GEMM leaves its counters at 0 again */
        STEP("the router's workspace", mj_mem_alloc(0, g->rws_bytes, "bench", &g->rws));
        STEP("the router's workspace", mj_mem_zero(0, g->rws, g->rws_bytes));
    }
    STEP("the output", mj_mem_alloc(0, 4 * (size_t)g->maxB * (size_t)g->H, "bench", (void **)&g->out));
    STEP("the routing parameters", mj_route_params_from_config(&b->cfg, &g->rp));
    return MJ_OK;
}

static void gpu_close(gpu *g) {
    for (int s = 0; s < NSETS; s++) {
        mj_cuda_graph_exec_destroy(g->exec[s]);
        mj_mem_free(0, g->hidden[s]);
        routebuf_free(&g->rb[s]);
    }
    mj_mem_free(0, g->gate), mj_mem_free(0, g->bias), mj_mem_free(0, g->logits), mj_mem_free(0, g->out);
    mj_mem_free(0, g->rws);
    if (g->ca) mj_cuda_free(g->ca);
    if (g->cb) mj_cuda_free(g->cb);
    if (g->flush) mj_cuda_free(g->flush);
    mj_experts_free(g->ex);
    mj_moe_free(g->moe);
    mj_layer_free(g->L);
    mj_cuda_event_destroy(g->e0), mj_cuda_event_destroy(g->e1);
    mj_cuda_stream_destroy(g->stream);
    mj_context_destroy(g->ctx);
}

/* ---- measurements -------------------------------------------------------------------------- */

enum { OP_COPY, OP_ROUTE, OP_EXPERTS, OP_LAYER, OP_GRAPH };
typedef struct op {
    int kind;
    int32_t B;
    mj_weight_mode mode;
} op;

/* One call of op on input set `set`, enqueued on the stream. */
static mj_status run_op(gpu *g, const op *o, int set) {
    switch (o->kind) {
    case OP_COPY: return mj_cuda_memcpy_dtod_async(g->cb, g->ca, g->copy_bytes, g->stream);
    case OP_ROUTE:
        MJ_CHECK(mj_router_gemm(g->ctx, g->hidden[set], g->gate, o->B, g->H, g->E, g->logits, g->rws, g->rws_bytes,
                                g->stream));
        return mj_route(g->ctx, &g->rp, g->logits, g->bias, o->B, NULL, &g->rb[set].o, g->stream);
    case OP_EXPERTS:
        return mj_experts_forward(g->ctx, g->ex, o->mode, g->hidden[set], &g->rb[set].o, o->B, NULL, g->out, g->stream);
    case OP_LAYER: return mj_moe_forward(g->moe, g->hidden[set], o->B, NULL, g->out, g->stream);
    default: return mj_cuda_graph_launch(g->exec[set], g->stream);
    }
}

/* Median µs of op over iters calls, each between two events, after a warm-up; before each
 * call (outside its events) a write of twice the L2 evicts what the last call left there. */
static mj_status time_op(gpu *g, const op *o, double *us) {
    const int iters = g->iters;
    double *v = malloc(sizeof(double) * (size_t)iters);
    if (!v) return mj_set_error(MJ_ERR_NOMEM, "bench: out of memory");
    /* What was written with pageable copies (the default stream) lands before the stream reads it. */
    mj_status st = mj_cuda_synchronize();
    for (int i = 0; i < 3 && st == MJ_OK; i++) st = run_op(g, o, i % NSETS);
    if (st == MJ_OK) st = mj_cuda_stream_synchronize(g->stream);
    for (int i = 0; i < iters && st == MJ_OK; i++) {
        float ms = 0;
        /* Cold L2: the weights are the same every call, so without this they would come from
         * the L2 after the first; the write is enqueued before e0, outside the timed window. */
        if ((st = mj_cuda_memset_async(g->flush, ++g->flush_value, g->flush_bytes, g->stream)) != MJ_OK) break;
        if ((st = mj_cuda_event_record(g->e0, g->stream)) != MJ_OK) break;
        if ((st = run_op(g, o, i % NSETS)) != MJ_OK) break;
        if ((st = mj_cuda_event_record(g->e1, g->stream)) != MJ_OK) break;
        if ((st = mj_cuda_event_synchronize(g->e1)) != MJ_OK) break;
        if ((st = mj_cuda_event_elapsed(g->e0, g->e1, &ms)) != MJ_OK) break;
        v[i] = 1e3 * (double)ms;
    }
    *us = st == MJ_OK ? bench_median(v, iters) : 0;
    free(v);
    return st;
}

/* Active experts of a device routing, clamped to 0..E (a stand-in driver runs no kernel). */
static mj_status read_active(gpu *g, const int32_t *na_dev, int32_t *na) {
    MJ_CHECK(mj_mem_get(0, na, na_dev, 4));
    if (*na < 0 || *na > g->E) *na = 0;
    return MJ_OK;
}

/* A device-to-device copy of copy_mb MiB (non-zero data): µs and GB/s, bytes read + written.
 * Its buffers are freed after. */
static mj_status measure_copy(gpu *g, int copy_mb, double *us, double *gbps) {
    g->copy_bytes = (size_t)copy_mb << 20;
    STEP("allocating the copy buffers", mj_cuda_malloc(g->copy_bytes, &g->ca));
    STEP("allocating the copy buffers", mj_cuda_malloc(g->copy_bytes, &g->cb));
    uint8_t fill[4096];
    for (int i = 0; i < 4096; i++) fill[i] = (uint8_t)(i * 37 + 11);
    for (size_t off = 0; off < g->copy_bytes; off += (size_t)64 << 20)
        STEP("filling the copy buffer", mj_cuda_memcpy_htod(g->ca + off, fill, 4096));
    op oc = {OP_COPY, 0, MJ_MODE_W4A16};
    STEP("timing the copy", time_op(g, &oc, us));
    *gbps = *us > 0 ? 2.0 * (double)g->copy_bytes / (*us * 1e3) : 0;
    mj_cuda_free(g->ca), mj_cuda_free(g->cb), g->ca = g->cb = 0;
    return MJ_OK;
}

/* The router GEMM + mj_route of B tokens at k0: µs. */
static mj_status measure_routing(gpu *g, int32_t B, int32_t k0, double *us) {
    op r = {OP_ROUTE, B, MJ_MODE_W4A16};
    g->rp.k0 = k0;
    STEP("timing the routing", time_op(g, &r, us));
    return MJ_OK;
}

/* The experts (g->ex, prepared for mode) of B tokens on each input set's routing at k0: µs,
 * and the active experts, the sets' mean. */
static mj_status measure_experts(gpu *g, int32_t B, int32_t k0, mj_weight_mode mode, double *us, double *active) {
    op ro = {OP_ROUTE, B, mode}, oe = {OP_EXPERTS, B, mode};
    g->rp.k0 = k0;
    double act = 0;
    for (int s = 0; s < NSETS; s++) {
        int32_t na;
        STEP("routing a set", run_op(g, &ro, s));
        STEP("routing a set", mj_cuda_stream_synchronize(g->stream));
        STEP("routing a set", read_active(g, g->rb[s].na, &na));
        act += na;
    }
    *active = act / NSETS;
    STEP("timing the experts", time_op(g, &oe, us));
    return MJ_OK;
}

/* The whole layer (g->moe, prepared) on B tokens: its k0 and mode, the active experts (the
 * input sets' mean), µs eager and replayed from a CUDA graph captured for each set. */
typedef struct layer_time {
    int32_t k0;
    mj_weight_mode mode;
    double active, us, us_graph;
} layer_time;

static mj_status measure_layer(gpu *g, int32_t B, layer_time *t) {
    STEP("the batch plan", mj_moe_batch_plan(g->moe, B, &t->k0, &t->mode));
    op ol = {OP_LAYER, B, t->mode}, og = {OP_GRAPH, B, t->mode};
    double act = 0;
    for (int s = 0; s < NSETS; s++) {
        int32_t na;
        mj_route_outputs rout = MJ_ROUTE_OUTPUTS_INIT;
        STEP("a forward", run_op(g, &ol, s));
        STEP("a forward", mj_cuda_stream_synchronize(g->stream));
        STEP("a forward", mj_moe_route_outputs(g->moe, &rout));
        STEP("a forward", read_active(g, rout.n_active, &na));
        act += na;
    }
    t->active = act / NSETS;
    STEP("timing the layer", time_op(g, &ol, &t->us));
    for (int s = 0; s < NSETS; s++) {
        void *graph = NULL;
        STEP("capturing the layer", mj_cuda_graph_capture_begin(g->stream));
        mj_status st = run_op(g, &ol, s);
        mj_status st2 = mj_cuda_graph_capture_end(g->stream, &graph);
        if (st != MJ_OK && graph) mj_cuda_graph_destroy(graph), graph = NULL; /* a failed forward's graph */
        STEP("capturing the layer", st != MJ_OK ? st : st2);
        st = mj_cuda_graph_instantiate(graph, &g->exec[s]);
        mj_cuda_graph_destroy(graph);
        STEP("instantiating the graph", st);
    }
    STEP("timing the graph replays", time_op(g, &og, &t->us_graph));
    for (int s = 0; s < NSETS; s++) mj_cuda_graph_exec_destroy(g->exec[s]), g->exec[s] = NULL;
    return MJ_OK;
}

/* ---- the report ------------------------------------------------------------------------------ */

/* root["gpu"] and its tables. */
typedef struct report {
    json_t *jg, *routing, *experts, *layer;
} report;

/* The device, the driver and the cold-L2 flush: JSON and the text's heading line. */
static void report_device(bench *b, const gpu *g, report *r) {
    const mj_device_info *di = &g->di;
    r->jg = json_object(), r->routing = json_array(), r->experts = json_array(), r->layer = json_array();
    json_object_set_new(b->root, "gpu", r->jg);
    json_object_set_new(r->jg, "device", json_string(di->name));
    json_object_set_new(r->jg, "cc", json_integer(di->cc_major * 10 + di->cc_minor));
    json_object_set_new(r->jg, "target", json_string(mj_target_name(mj_context_target(g->ctx))));
    json_object_set_new(r->jg, "sms", json_integer(di->sm_count));
    json_object_set_new(r->jg, "driver", json_integer(g->driver));
    json_object_set_new(r->jg, "routing", r->routing);
    json_object_set_new(r->jg, "experts", r->experts);
    json_object_set_new(r->jg, "layer", r->layer);
    if (di->l2_bytes <= 0)
        bench_note(b, "the driver does not say the L2's size: the flush before each timed call writes 256 MiB");
    json_object_set_new(r->jg, "l2_bytes", json_integer(di->l2_bytes));
    json_object_set_new(r->jg, "flush_bytes", json_integer((json_int_t)g->flush_bytes));
    json_object_set_new(r->jg, "cold_l2", json_true());
    bench_txt(b, "\nGPU 0: %s (sm_%d%d, %d SMs, %d MiB L2), driver %d; CUDA events, median of %d after a warm-up, %d "
                 "input sets; cold L2: %zu MiB written before each timed call, outside its events\n",
              di->name, di->cc_major, di->cc_minor, di->sm_count, di->l2_bytes >> 20, g->driver, g->iters, NSETS,
              g->flush_bytes >> 20);
}

static void report_copy(bench *b, report *r, int copy_mb, size_t copy_bytes, double us, double gbps) {
    json_t *jc = json_object();
    json_object_set_new(jc, "bytes", json_integer((json_int_t)(2 * copy_bytes)));
    json_object_set_new(jc, "us", json_real(us));
    json_object_set_new(jc, "gbps", json_real(gbps));
    json_object_set_new(r->jg, "copy", jc);
    bench_txt(b, "device-to-device copy of %d MiB: %.1f us, %.1f GB/s (read + written)\n", copy_mb, us, gbps);
}

static void report_table_head(bench *b) {
    bench_txt(b, "\n  %-11s %4s %3s %-6s %10s %12s %9s %7s\n", "what", "B", "k0", "mode", "us", "weight MB", "GB/s",
              "of copy");
}

/* A result row appended to arr and printed as a text line (label: its name there): the
 * bytes read, the GB/s they make and that over the copy bandwidth; returned for more fields. */
static json_t *report_row(bench *b, json_t *arr, const char *label, const char *what, int32_t B, int32_t k0,
                          const char *mode, double us, double bytes, double copy) {
    const double gbps = us > 0 ? bytes / (us * 1e3) : 0, of_copy = copy > 0 ? gbps / copy : 0;
    json_t *r = json_object();
    json_object_set_new(r, "what", json_string(what));
    json_object_set_new(r, "B", json_integer(B));
    json_object_set_new(r, "k0", json_integer(k0));
    if (mode) json_object_set_new(r, "mode", json_string(mode));
    json_object_set_new(r, "us", json_real(us));
    json_object_set_new(r, "bytes", json_integer((json_int_t)bytes));
    json_object_set_new(r, "gbps", json_real(gbps));
    json_object_set_new(r, "of_copy", json_real(of_copy));
    json_array_append_new(arr, r);
    bench_txt(b, "  %-11s %4d %3d %-6s %10.2f %12.3f %9.1f %7.3f\n", label, (int)B, (int)k0, mode ? mode : "", us,
              bytes / 1e6, gbps, of_copy);
    return r;
}

/* The goals, from the rows: the experts (W4A16, B <= 16) at >= 0.80 of the copy bandwidth,
 * and the layer (graph) at B 32 with k0 4 >= 1.4x faster than with k0 8. */
static void report_goals(bench *b, report *rep) {
    json_t *goals = json_object();
    double worst = -1;
    size_t i;
    json_t *r;
    json_array_foreach(rep->experts, i, r) {
        if (strcmp(json_string_value(json_object_get(r, "mode")), "W4A16") ||
            json_integer_value(json_object_get(r, "B")) > 16)
            continue;
        double f = json_real_value(json_object_get(r, "of_copy"));
        if (worst < 0 || f < worst) worst = f;
    }
    json_t *g1 = json_object();
    json_object_set_new(g1, "goal", json_string("experts W4A16 at B <= 16: >= 0.80 of the copy bandwidth"));
    json_object_set_new(g1, "worst", worst < 0 ? json_null() : json_real(worst));
    json_object_set_new(g1, "met", json_boolean(worst >= 0.8));
    json_object_set_new(goals, "experts_bandwidth", g1);
    double t8 = 0, t4 = 0;
    json_array_foreach(rep->layer, i, r) {
        if (strcmp(json_string_value(json_object_get(r, "what")), "layer_graph") ||
            json_integer_value(json_object_get(r, "B")) != 32)
            continue;
        json_int_t k0 = json_integer_value(json_object_get(r, "k0"));
        if (k0 == 8) t8 = json_real_value(json_object_get(r, "us"));
        if (k0 == 4) t4 = json_real_value(json_object_get(r, "us"));
    }
    const int both = t8 > 0 && t4 > 0, oea_met = both && t8 / t4 >= 1.4;
    json_t *g2 = json_object();
    json_object_set_new(g2, "goal", json_string("layer (graph) at B = 32: k0 4 >= 1.4x faster than k0 8"));
    json_object_set_new(g2, "speedup", both ? json_real(t8 / t4) : json_null());
    json_object_set_new(g2, "met", json_boolean(oea_met));
    json_object_set_new(goals, "oea_speedup", g2);
    json_object_set_new(rep->jg, "goals", goals);
    bench_txt(b, "\ngoals: experts W4A16 at B <= 16 >= 0.80 of copy: %s (worst %.3f); layer k0 4 vs 8 at B 32 >= 1.4x: %s",
              worst >= 0.8 ? "met" : "NOT met", worst, oea_met ? "met" : "NOT met");
    if (both) bench_txt(b, " (%.2fx)\n", t8 / t4);
    else bench_txt(b, " (B 32 with k0 8 and 4 not both measured)\n");
}

/* ---- the section ------------------------------------------------------------------------------ */

/* The tables: each row measured, then reported. copy_gbps: the yardstick of their "of copy". */

/* Routing: router GEMM + mj_route, for each k0 and B. */
static mj_status routing_table(gpu *g, report *rep, double copy_gbps) {
    bench *b = g->b;
    const bench_args *a = b->a;
    mj_status st;
    double us;
    for (int ki = 0; ki < a->n_k0; ki++)
        for (int i = 0; i < a->n_bb; i++) {
            if ((st = measure_routing(g, a->bb[i], a->k0s[ki], &us)) != MJ_OK) return st;
            report_row(b, rep->routing, "routing", "routing", a->bb[i], a->k0s[ki], NULL, us, (double)b->gate_bytes,
                       copy_gbps);
        }
    return MJ_OK;
}

/* The experts, on each set's routing: W4A16, and W4A4 where the target has it; for each k0
 * and B. The packed experts are freed after. */
static mj_status experts_table(gpu *g, report *rep, double copy_gbps) {
    bench *b = g->b;
    const bench_args *a = b->a;
    mj_status st;
    mj_experts_options eo = MJ_EXPERTS_OPTIONS_INIT;
    eo.max_batch = g->maxB;
    STEP("packing the experts", mj_experts_create(g->ctx, g->L, &eo, &g->ex));
    mj_weight_mode resolved;
    const int w4a4_ok = mj_experts_mode(g->ex, MJ_MODE_W4A4, 1, &resolved) == MJ_OK; /* the policy's own check */
    if (!w4a4_ok)
        bench_note(b, "W4A4 needs sm_120a/sm_121a: the experts are timed in W4A16 only on %s",
                   mj_target_name(mj_context_target(g->ctx)));
    for (int m = 0; m < (w4a4_ok ? 2 : 1); m++) {
        const mj_weight_mode mode = m ? MJ_MODE_W4A4 : MJ_MODE_W4A16;
        bench_progress(b, "preparing the experts (%s)", bench_mode_name(mode));
        STEP("preparing the experts", mj_experts_prepare(g->ctx, g->ex, mode, g->maxB));
        for (int ki = 0; ki < a->n_k0; ki++)
            for (int i = 0; i < a->n_bb; i++) {
                double us, active;
                if ((st = measure_experts(g, a->bb[i], a->k0s[ki], mode, &us, &active)) != MJ_OK) return st;
                const double bytes = (active + b->nsub) * (double)b->per_expert;
                json_t *r = report_row(b, rep->experts, "experts", "experts", a->bb[i], a->k0s[ki],
                                       bench_mode_name(mode), us, bytes, copy_gbps);
                json_object_set_new(r, "active", json_real(active));
                if (!m) b->active[ki * a->n_bb + i] = active; /* --predict's, after this section */
            }
    }
    mj_experts_free(g->ex), g->ex = NULL;
    b->have_active = 2; /* every (k0, B): --predict takes the GPU's active experts */
    return MJ_OK;
}

/* The whole layer, eager and replayed from CUDA graphs: for each k0 (prepared as the policy
 * "k0") and B. */
static mj_status layer_table(gpu *g, report *rep, double copy_gbps) {
    bench *b = g->b;
    const bench_args *a = b->a;
    mj_status st;
    STEP("the layer", bench_moe_make(g->ctx, g->L, b, &g->moe));
    for (int ki = 0; ki < a->n_k0; ki++) {
        char k0p[16];
        snprintf(k0p, sizeof k0p, "%d", (int)a->k0s[ki]);
        bench_progress(b, "preparing the layer (k0 %s)", k0p);
        STEP("preparing the layer", bench_moe_prepare(g->moe, b, k0p));
        for (int i = 0; i < a->n_bb; i++) {
            layer_time t;
            if ((st = measure_layer(g, a->bb[i], &t)) != MJ_OK) return st;
            const double bytes = (double)b->gate_bytes + (t.active + b->nsub) * (double)b->per_expert;
            for (int gr = 0; gr < 2; gr++) {
                json_t *r = report_row(b, rep->layer, gr ? "layer+graph" : "layer", gr ? "layer_graph" : "layer",
                                       a->bb[i], t.k0, bench_mode_name(t.mode), gr ? t.us_graph : t.us, bytes,
                                       copy_gbps);
                json_object_set_new(r, "active", json_real(t.active));
            }
        }
    }
    return MJ_OK;
}

/* The section: setup, the copy, then (TP or one rank) the layer's tables and the goals; stops
 * at the first failure (g->step says where). */
static mj_status run_gpu(gpu *g, report *rep) {
    bench *b = g->b;
    const bench_args *a = b->a;
    mj_status st;
    double us, copy_gbps;
    if ((st = gpu_open(g)) != MJ_OK) return st;
    report_device(b, g, rep);
    if ((st = gpu_open_timing(g)) != MJ_OK) return st;
    if ((st = measure_copy(g, a->copy_mb, &us, &copy_gbps)) != MJ_OK) return st;
    report_copy(b, rep, a->copy_mb, (size_t)a->copy_mb << 20, us, copy_gbps);
    if (a->par == MJ_PAR_EP) {
        bench_note(b, "the GPU measurements model a TP rank or a whole layer: with --ep only the copy is measured");
        return MJ_OK;
    }
    bench_progress(b, "the GPU's layer: H %d, E %d, %d expert rows, %d shared sub-expert(s)%s", b->cfg.hidden,
                   b->cfg.n_experts, b->i_local, b->nsub, b->ck ? " (from the checkpoint)" : " (random)");
    if ((st = gpu_load_layer(g)) != MJ_OK) return st;
    report_table_head(b);
    if ((st = routing_table(g, rep, copy_gbps)) != MJ_OK || (st = experts_table(g, rep, copy_gbps)) != MJ_OK ||
        (st = layer_table(g, rep, copy_gbps)) != MJ_OK)
        return st;
    report_goals(b, rep);
    return MJ_OK;
}

int bench_gpu(bench *b) {
    gpu g;
    memset(&g, 0, sizeof g);
    g.b = b;
    g.step = "";
    report rep = {NULL, NULL, NULL, NULL};
    mj_status st = run_gpu(&g, &rep);
    int rc = 0;
    if (st != MJ_OK) rc = tool_fail("the GPU: %s: %s: %s", g.step, mj_status_string(st), mj_last_error());
    gpu_close(&g);
    return rc;
}
