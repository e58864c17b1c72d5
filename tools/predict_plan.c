/* predict_plan.c — `moejit bench --predict GPU`: the performance model (predict.c) of each
 * kernel of a forward of rank 0, for every B and k0 of the tables, on a named GPU.
 *
 * The kernels are the ones the runtime would launch (the same knobs and specializations:
 * mj_router_knobs, mj_route_knobs, mj_experts_knobs / mj_experts_specs, mj_experts_dims),
 * compiled for the GPU's target through the JIT (no device: a compile-only context, the
 * kernel cache as usual), their registers and static shared memory from ptxas' report and
 * their hot loops from the cubin's SASS. What each kernel's warps iterate and keep in flight
 * comes from its template (the comments of templates/moe_experts.cu and router_gemm.cu):
 *   router_gemm   a block 16 experts x a part of H (KS parts) x a tile of ROWS rows,
 *                 NWARPS warps taking the part's runs (128 k) in turn: a run's gate (16
 *                 rows x 128 k, 4 KiB) in flight a warp; the hot loop is a run;
 *   oea_route     one block (B <= 256) of NWARPS warps: a warp's instructions are its
 *                 pieces' counts from the SASS (pm_sass_route) times its tokens, scorings
 *                 and picks (fetch_route);
 *   experts_quant (W4A4) blocks of 2 warps a (token, expert slot), a 16-value group 2 threads;
 *   experts_up    a block a (16-row tile, active expert or shared sub-expert), NW1 warps
 *                 each, splitting H: the busiest warp's k-steps (mj_experts_up_steps: pieces of
 *                 4 or 2 k-steps dealt in turn), 4 of 1 KiB in flight; at TPE 8 (STREAM) the
 *                 blocks the GPU holds, each an even run of every tile's pieces
 *                 (pm_stream_launch);
 *   experts_down  a block (16 hidden dims, TPE tokens), NW2 warps dealing the experts: each
 *                 walks ceil(experts x parts / NW2) items (an expert's DSTEPS k-steps of w2
 *                 with a scale chunk and its rows' entries), MJ_EXPERTS_DRING - 2 in flight. */
#include "predict.h"
#include "moejit_private.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SASS 64

typedef struct reader {
    char key[MAX_SASS][72];
    char *text[MAX_SASS];
    int n;
} reader;

/* The SASS of f, disassembled once per specialization. */
static const char *sass_of(reader *rd, const mj_function *f) {
    const char *key = mj_function_key(f);
    for (int i = 0; i < rd->n; i++)
        if (!strcmp(rd->key[i], key)) return rd->text[i];
    size_t len = 0;
    const void *bin = mj_function_binary(f, &len);
    char *text = NULL;
    if (tool_sass_text(bin, len, &text)) return NULL;
    if (rd->n == MAX_SASS) free(rd->text[--rd->n]);
    snprintf(rd->key[rd->n], sizeof rd->key[0], "%s", key);
    rd->text[rd->n++] = text;
    return text;
}

typedef struct kernel_row {
    const char *name;
    pm_launch l;
    pm_sass s;
    int has_sass;
    pm_route_sass rs;            /* oea_route: its pieces (has_route)                         */
    int has_route;
    int after;                   /* not the forward's first kernel: it follows one of ours */
    pm_result r;
} kernel_row;

/* The kernel of spec compiled (or from the cache) into k's launch: ptxas' registers and
 * static shared memory, and whether it launches as a programmatic dependent. NULL after the
 * error line. */
static const mj_function *load(mj_context_t ctx, const mj_spec *spec, kernel_row *k) {
    const mj_function *f = NULL;
    if (mj_jit_get(ctx, spec, &f) != MJ_OK) {
        tool_fail("--predict: compiling %s: %s", k->name, mj_last_error());
        return NULL;
    }
    const mj_ptxas_report *rep = mj_function_report(f);
    k->l.kernel = k->name;
    /* every kernel of the forward but its first follows one of ours: a programmatic
     * dependent where the runtime launches it so (runtime/jit.c: MJ_PDL templates, sm_90+) */
    k->l.pdl = k->after && mj_template_at(spec->tpl)->pdl &&
               mj_target_sm(spec->target) >= 90;
    k->l.regs = rep ? rep->registers : 0;
    k->l.smem += rep ? rep->smem_static : 0;
    return f;
}

/* The kernel of spec: its ptxas report (load) and, with use_sass, its hot loop, read from the
 * SASS of sass_spec when given (a twin whose hot loop is the one this kernel runs on the
 * data: see the experts below), else of spec. */
static int fetch(mj_context_t ctx, reader *rd, const mj_spec *spec, const mj_spec *sass_spec, kernel_row *k,
                 const tool_gpu *gpu, const pm_assume *a, int use_sass) {
    const mj_function *f = load(ctx, spec, k);
    if (!f) return 1;
    k->has_sass = 0;
    if (use_sass && sass_spec) {
        if (mj_jit_get(ctx, sass_spec, &f) != MJ_OK)
            return tool_fail("--predict: compiling %s's twin: %s", k->name, mj_last_error());
    }
    if (use_sass) {
        const char *text = sass_of(rd, f);
        if (!text) return 1;
        if (pm_sass_analyze(text, k->name, &k->s)) return tool_fail("--predict: no function %s in its SASS", k->name);
        k->has_sass = 1;
    }
    pm_stream_launch(gpu, k->has_sass ? &k->s : NULL, &k->l);
    pm_predict(gpu, a, k->has_sass ? &k->s : NULL, &k->l, &k->r);
    return 0;
}

/* The routing kernel: its pieces read from the SASS (pm_sass_route), times what a warp of
 * the one-block launch runs (pm_route_insts). */
static int fetch_route(mj_context_t ctx, reader *rd, const mj_spec *spec, const mj_knobs_oea_route *kn, int B,
                       kernel_row *k, const tool_gpu *gpu, const pm_assume *a) {
    const mj_function *f = load(ctx, spec, k);
    if (!f) return 1;
    const char *text = sass_of(rd, f);
    if (!text) return 1;
    if (pm_sass_route(text, k->name, &k->rs) || !k->rs.found)
        return tool_fail("--predict: no token loop with picks in %s's SASS", k->name);
    k->has_route = 1;
    k->l.extra = pm_route_insts(&k->rs, B, kn->NWARPS, kn->E, kn->K, kn->K0);
    k->l.extra_sm = pm_route_insts_avg(&k->rs, B, kn->NWARPS, mj_route_dispatch_warps(kn), kn->E, kn->K, kn->K0);
    pm_predict(gpu, a, NULL, &k->l, &k->r);
    return 0;
}

static json_t *result_json(const kernel_row *k) {
    json_t *o = json_object();
    json_object_set_new(o, "predicted_us", json_real(k->r.predicted_us));
    json_object_set_new(o, "floor_us", json_real(k->r.floor_us));
    json_object_set_new(o, "bound", json_string(pm_bound_names[k->r.bound]));
    json_object_set_new(o, "memory_us", json_real(k->r.t_memory));
    json_object_set_new(o, "little_us", json_real(k->r.t_little));
    json_object_set_new(o, "chain_us", json_real(k->r.t_chain));
    json_object_set_new(o, "issue_us", json_real(k->r.t_issue));
    json_object_set_new(o, "tail_us", json_real(k->r.t_tail));
    json_object_set_new(o, "tail_trips", json_real(k->r.tail_trips));
    json_object_set_new(o, "blocks", json_integer(k->l.blocks));
    json_object_set_new(o, "threads", json_integer(k->l.threads));
    json_object_set_new(o, "registers", json_integer(k->l.regs));
    json_object_set_new(o, "smem", json_integer(k->l.smem));
    json_object_set_new(o, "blocks_per_sm", json_integer(k->r.blocks_per_sm));
    json_object_set_new(o, "waves", json_real(k->r.waves));
    json_object_set_new(o, "busiest_sm_blocks", json_integer(k->r.busiest_blocks));
    json_object_set_new(o, "inflight_sm", json_real(k->r.inflight_sm));
    json_object_set_new(o, "bytes", json_real(k->l.bytes));
    json_object_set_new(o, "prefetched", json_real(k->r.prefetched));
    json_object_set_new(o, "iters_warp", json_real(k->l.iters));
    json_object_set_new(o, "insts_warp", json_real(k->r.insts_warp));
    json_object_set_new(o, "insts_sm", json_real(k->r.insts_sm));
    json_object_set_new(o, "pdl", json_boolean(k->l.pdl));
    if (k->has_route) {
        json_t *h = json_object();
        json_object_set_new(h, "token", json_real(k->rs.token));
        json_object_set_new(h, "pick", json_real(k->rs.pick));
        json_object_set_new(h, "outside", json_real(k->rs.outside));
        json_object_set_new(h, "dispatch", json_real(k->rs.dispatch));
        json_object_set_new(h, "dispatch_small", json_real(k->rs.dispatch_small));
        json_object_set_new(h, "score", json_real(k->rs.score));
        json_object_set_new(h, "score_once", json_real(k->rs.score_once));
        json_object_set_new(h, "dispatch_bars", json_real(k->rs.dispatch_bars));
        json_object_set_new(o, "route_sass", h);
    }
    if (k->has_sass) {
        json_t *h = json_object();
        json_object_set_new(h, "insts", json_real(k->s.iter_total));
        for (int c = 0; c < PM_NCLASS; c++) json_object_set_new(h, pm_class_names[c], json_real(k->s.iter[c]));
        json_object_set_new(h, "imad", json_real(k->s.iter_imad));
        json_object_set_new(h, "chain", json_integer(k->s.chain));
        json_object_set_new(h, "pre_chain", json_integer(k->s.pre_chain));
        json_object_set_new(h, "piece_end", json_real(k->s.piece_total));
        json_object_set_new(h, "tail_ldg", json_integer(k->s.tail_ldg));
        json_object_set_new(h, "tail_bytes", json_integer(k->s.tail_bytes));
        json_object_set_new(h, "tail_insts", json_integer(k->s.tail_insts));
        json_object_set_new(h, "finish", json_integer(k->s.finish));
        json_object_set_new(h, "found", json_boolean(k->s.found));
        json_object_set_new(o, "hot_loop", h);
        json_object_set_new(o, "outside", json_integer(k->s.outside));
        json_object_set_new(o, "rare", json_integer(k->s.rare));
    }
    return o;
}

int tool_predict_plan(const tool_predict_in *in, json_t *root, FILE *txt) {
    const mj_moe_config *cfg = in->cfg;
    const int32_t H = cfg->hidden, E = cfg->n_experts, K = cfg->topk, I = in->i_local, nsub = in->nsub;
    const tool_gpu *gpu = in->gpu;
    pm_assume a;
    pm_assume_default(&a);
    mj_target target;
    if (mj_target_parse(in->arch, &target) != MJ_OK) return tool_fail("--predict: %s", mj_last_error());
    mj_context_options o = MJ_CONTEXT_OPTIONS_INIT;
    o.cache_dir = in->cache_dir, o.device = MJ_DEVICE_NONE, o.backend = MJ_BACKEND_CUDA, o.target = in->arch;
    o.strict = 0;
    mj_context_t ctx = NULL;
    reader rd = {.n = 0};
    int rc = 0;
    mj_status st;
    mj_route_params rp;
    mj_mode_policy pol;
    const char *policy = NULL;
    const mj_weight_mode fixed = tool_mode_parse(in->mode, &policy);
    if ((st = mj_context_create(&o, &ctx)) != MJ_OK || (st = mj_route_params_from_config(cfg, &rp)) != MJ_OK ||
        (st = mj_mode_policy_parse(policy ? policy : mj_mode_policy_default(target), target, &pol)) != MJ_OK) {
        rc = tool_fail_status("--predict", st);
        goto out;
    }
    json_t *jp = json_object(), *rows = json_array(), *ja = json_object();
    json_object_set_new(root, "predict", jp);
    json_object_set_new(jp, "gpu", json_string(gpu->name));
    json_object_set_new(jp, "target", json_string(in->arch));
    json_object_set_new(jp, "copy_gbps", json_real(pm_copy_gbps(gpu, &a)));
    json_object_set_new(ja, "launch_us", json_real(a.launch_us));
    json_object_set_new(ja, "pdl_launch_us", json_real(a.pdl_launch_us));
    json_object_set_new(ja, "warp_cpi", json_real(a.warp_cpi));
    json_object_set_new(ja, "copy_fraction", json_real(a.copy_fraction));
    json_object_set_new(ja, "tensor_rate", json_real(a.tensor_rate));
    json_object_set_new(ja, "mem_rate", json_real(a.mem_rate));
    json_object_set_new(ja, "half_rate", json_real(a.half_rate));
    json_object_set_new(ja, "int_rate", json_real(gpu->int_rate));
    json_object_set_new(ja, "lat_ns", json_real(gpu->lat_ns));
    json_object_set_new(ja, "clock_mhz", json_real(gpu->clock_mhz));
    json_object_set_new(ja, "sms", json_integer(gpu->sms));
    json_object_set_new(jp, "assumptions", ja);
    json_object_set_new(jp, "rows", rows);
    /* where each row's active experts come from: the GPU's routing (a bench on a GPU), the
     * interpreter's, or the expected number */
    json_object_set_new(jp, "active_from", json_string(in->active_from ? in->active_from : "expected"));
    if (!in->active)
        json_array_append_new(json_object_get(root, "notes"),
                              json_string("--predict without the interpreter: active experts are the expected number "
                                          "under uniform routing (E (1 - (1 - k0/E)^B))"));
    if (txt) {
        fprintf(txt, "\nthe performance model on %s (%s), kernels for %s, rank 0 (H %d, I %d): predicted us and bound\n"
                     "per kernel; the layer against its floor (its bytes over the copy bandwidth) and against\n"
                     "the launch floor (its launches' fixed costs, then its bytes: what no layer of as many kernels beats)\n",
                gpu->name, gpu->desc, in->arch, H, I);
        pm_assume_print(txt, &a, gpu);
        fprintf(txt, "  %4s %3s %-5s %6s %-19s %-19s %-19s %-19s %-19s %9s %8s %6s %8s\n", "B", "k0", "mode", "active",
                "router_gemm", "oea_route", "experts_quant", "experts_up", "experts_down", "layer us", "floor", "x",
                "launch x");
    }
    for (int ki = 0; ki < in->n_k0; ki++) {
        for (int bi = 0; bi < in->n_bb; bi++) {
            const int32_t B = in->bb[bi], k0 = in->k0s[ki];
            double na = in->active ? in->active[ki * in->n_bb + bi] : E * (1.0 - pow(1.0 - (double)k0 / E, B));
            mj_weight_mode m = fixed;
            if ((st = mj_mode_resolve(&pol, target, fixed, B, &m)) != MJ_OK) {
                rc = tool_fail_status("--predict", st);
                goto out;
            }
            kernel_row kr[5];
            memset(kr, 0, sizeof kr);
            int nk = 0;
            /* router_gemm */
            {
                mj_knobs_router_gemm kn;
                mj_router_knobs(H, E, B, &kn);
                mj_spec s;
                mj_spec_router_gemm(ctx, &kn, &s);
                kernel_row *k = &kr[nk++];
                k->after = nk > 1;
                mj_router_dims d;
                mj_router_grid(&kn, B, &d);
                k->name = "router_gemm";
                k->l.blocks = (int64_t)d.et * d.ks * d.rt, k->l.threads = kn.NWARPS * 32;
                k->l.bytes = in->gate_bytes, k->l.iters = (d.rpz + kn.NWARPS - 1) / kn.NWARPS, k->l.extra = -1;
                k->l.inflight = 16.0 * MJ_ROUTER_RUN * 2; /* a run's gate: 16 rows of bf16 */
                if ((rc = fetch(ctx, &rd, &s, NULL, k, gpu, &a, 1))) goto out;
            }
            /* oea_route */
            {
                mj_route_params p = rp;
                p.k0 = k0;
                mj_knobs_oea_route kn;
                if ((st = mj_route_knobs(&p, B, &kn)) != MJ_OK) {
                    rc = tool_fail_status("--predict: the routing", st);
                    goto out;
                }
                mj_spec s;
                mj_spec_oea_route(ctx, &kn, &s);
                kernel_row *k = &kr[nk++];
                k->after = nk > 1;
                k->name = "oea_route";
                k->l.blocks = 1, k->l.threads = kn.NWARPS * 32;
                k->l.smem = (int)mj_route_dyn_smem(&kn, B); /* dynamic; load adds the static */
                k->l.bytes = 4.0 * B * E, k->l.iters = 0;
                if ((rc = fetch_route(ctx, &rd, &s, &kn, B, k, gpu, &a))) goto out;
            }
            /* the experts */
            mj_knobs_moe_experts kx;
            mj_experts_knobs(H, I, K, nsub, m, B, target, &kx);
            mj_spec xs[3];
            const int32_t nx = mj_experts_specs(ctx, &kx, xs);
            const int32_t n_slots = (int64_t)B * K < E ? B * K : E;
            mj_launch_dims dims[3];
            mj_experts_dims(&kx, B, n_slots, 1, NULL, dims); /* up's STREAM grid: pm_stream_launch's */
            const double items = na + nsub, w13 = (double)mj_pack_w13_bytes(H, I) + mj_pack_s13_bytes(H, I),
                         w2 = (double)mj_pack_w2_bytes(H, I) + mj_pack_s2_bytes(H, I);
            /* Past one token group an expert chunk of at most 8 tokens runs a one-group path
             * of its own (down from TPE 16, its sums in registers; up past two groups, TPE 32
             * and 64, where the groups' sums are in shared memory), the groups' loop only past
             * 8; the SASS holds both, and the hot loop read from it would count both paths.
             * When the active experts average at most 8 routed rows (B K / active: an upper
             * bound), the hot loop is read from the TPE 8 twin, whose one path is that one;
             * the launch (grid, registers, shared memory) stays this kernel's. Up at TPE 16
             * keeps its own: both its groups' MMAs run on one path. */
            mj_spec twin[3];
            int use_twin = 0;
            if (kx.TPE > 8 && na > 0 && (double)B * K / na <= 8.0) {
                mj_knobs_moe_experts k8 = kx;
                k8.TPE = 8;
                use_twin = mj_experts_specs(ctx, &k8, twin) == nx;
            }
            double pf_down = 0; /* down's share of up's prefetch */
            for (int32_t x = 0; x < nx; x++) {
                const int part = nx - x == 3 ? 1 : nx - x == 2 ? 2 : 3;
                const mj_launch_dims *d = &dims[part - 1];
                kernel_row *k = &kr[nk++];
                k->after = nk > 1;
                k->l.threads = (int)d->block[0], k->l.smem = (int)d->smem, k->l.extra = -1;
                if (part == 1) {
                    k->name = "experts_quant";
                    k->l.blocks = (int64_t)d->grid[0] * d->grid[1] * d->grid[2], k->l.bytes = 2.0 * B * H, k->l.iters = 1;
                } else if (part == 2) {
                    k->name = "experts_up";
                    k->l.blocks = (int64_t)(I / 16) * (int64_t)ceil(items), k->l.bytes = items * w13;
                    k->l.iters = mj_experts_up_steps(H, kx.NW1), k->l.inflight = 4 * 1024.0;
                    /* the shared sub-experts' bytes (up's, then down's), prefetched into L2
                     * by up's blocks while the kernels after the router GEMM run (the routing,
                     * W4A4's quantization: their time past their launches, at the copy
                     * bandwidth); pm_predict counts it where the kernel is a programmatic
                     * dependent */
                    double window = 0;
                    for (int i = 1; i < nk - 1; i++) window += kr[i].r.predicted_us - pm_launch_us(&a, &kr[i].l);
                    const double pf_window = window * pm_copy_gbps(gpu, &a) * 1e3; /* each past its launch */
                    k->l.prefetched = fmin(nsub * w13, pf_window);
                    /* down's, after up's in the window, if up's bytes (every one passes through
                     * L2) and down's prefetched fit in half the L2 (else counted as gone by the
                     * time down reads them) */
                    const double down_pf = fmin(nsub * w2, pf_window - k->l.prefetched);
                    pf_down = k->l.bytes + down_pf <= 0.5 * gpu->l2_mib * 1048576.0 ? down_pf : 0;
                    if (kx.STREAM) {
                        k->l.stream_unit = mj_experts_up_pieces(H, kx.NW1, 1);
                        k->l.stream_pieces = items * (I / 16) * k->l.stream_unit;
                        k->l.stream_spp = mj_experts_up_spp(H, kx.NW1, 1);
                        /* the fold (templates/moe_experts.cu, up_fold): a pass a pair of the
                         * unit's tokens (the shared sub-experts' every token, at most TPE), a
                         * lane 8 bytes a piece of it, from the first warp's slot on: the whole
                         * unit at worst */
                        const int nc = B < kx.TPE ? B : kx.TPE;
                        k->l.stream_fold_passes = (nc + 1) / 2;
                        k->l.stream_fold_bytes = k->l.stream_unit * 8.0;
                    }
                } else {
                    k->name = "experts_down";
                    k->l.prefetched = pf_down;
                    const int parts = (I / 64 + kx.DSTEPS - 1) / kx.DSTEPS;
                    k->l.blocks = (int64_t)d->grid[0] * d->grid[1], k->l.bytes = items * w2;
                    /* a block waits for its busiest warp: dealt by place (DEAL 1, the shared
                     * sub-experts places after the list's) an even share, by id (DEAL 0) the
                     * busiest share of random ids */
                    const long nr = lround(na);
                    k->l.iters = kx.DEAL ? parts * (double)((nr + nsub + kx.NW2 - 1) / kx.NW2)
                                         : parts * pm_busiest_share((int)nr, kx.NW2, nsub);
                    k->l.inflight = (MJ_EXPERTS_DRING - 2) * (double)MJ_EXPERTS_DSLOT(kx.DSTEPS, kx.TPE);
                }
                const int twin_part = use_twin && (part == 3 || (part == 2 && kx.TPE > 16));
                if ((rc = fetch(ctx, &rd, &xs[x], twin_part ? &twin[x] : NULL, k, gpu, &a, 1))) goto out;
            }
            /* the layer: the kernels one after another; its floor the bytes bench counts */
            double pred = 0, slow = 0, launches = 0, hidden = 0;
            pm_bound lb = PM_BOUND_MEMORY;
            for (int i = 0; i < nk; i++) {
                pred += kr[i].r.predicted_us;
                launches += pm_launch_us(&a, &kr[i].l);
                hidden += kr[i].r.prefetched / (pm_copy_gbps(gpu, &a) * 1e3); /* read under another kernel */
                if (kr[i].r.predicted_us > slow) slow = kr[i].r.predicted_us, lb = kr[i].r.bound;
            }
            const double floor = (in->gate_bytes + items * in->per_expert) / (pm_copy_gbps(gpu, &a) * 1e3);
            json_t *r = json_object(), *jk = json_object(), *jl = json_object();
            json_object_set_new(r, "B", json_integer(B));
            json_object_set_new(r, "k0", json_integer(k0));
            json_object_set_new(r, "mode", json_string(m == MJ_MODE_W4A4 ? "W4A4" : "W4A16"));
            json_object_set_new(r, "active", json_real(na));
            for (int i = 0; i < nk; i++) json_object_set_new(jk, kr[i].name, result_json(&kr[i]));
            json_object_set_new(r, "kernels", jk);
            json_object_set_new(jl, "predicted_us", json_real(pred));
            json_object_set_new(jl, "floor_us", json_real(floor));
            json_object_set_new(jl, "bound", json_string(pm_bound_names[lb]));
            json_object_set_new(jl, "of_floor", json_real(pred / floor));
            /* what no layer of these launches beats: their fixed costs, then the bytes (but
             * those read while another kernel runs) */
            json_object_set_new(jl, "launch_floor_us", json_real(launches + floor - hidden));
            json_object_set_new(r, "layer", jl);
            json_array_append_new(rows, r);
            if (txt) {
                char cell[5][32];
                const char *order[5] = {"router_gemm", "oea_route", "experts_quant", "experts_up", "experts_down"};
                for (int c = 0; c < 5; c++) {
                    snprintf(cell[c], sizeof cell[c], "-");
                    for (int i = 0; i < nk; i++)
                        if (!strcmp(kr[i].name, order[c]))
                            snprintf(cell[c], sizeof cell[c], "%7.1f %-8s", kr[i].r.predicted_us,
                                     pm_bound_names[kr[i].r.bound]);
                }
                fprintf(txt, "  %4d %3d %-5s %6.1f %-19s %-19s %-19s %-19s %-19s %9.1f %8.1f %6.2f %8.2f\n", (int)B, (int)k0,
                        m == MJ_MODE_W4A4 ? "W4A4" : "W4A16", na, cell[0], cell[1], cell[2], cell[3], cell[4], pred,
                        floor, pred / floor, (launches + floor - hidden) / floor);
            }
        }
    }
out:
    for (int i = 0; i < rd.n; i++) free(rd.text[i]);
    mj_context_destroy(ctx);
    return rc;
}
