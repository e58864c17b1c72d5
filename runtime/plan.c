/* plan.c — the planner (see plan.h).
 *
 * A forward of B tokens launches three kernels: the router GEMM (its ROWS grow with B up to
 * 64, in steps of 8 rows), the routing (one spec per k0; one block up to 256 tokens,
 * multi-block plain top-k above), and the experts (TPE = B rounded up to a power of two in
 * 8..64, in the mode the policy gives B; the shared sub-experts a rank runs; on a GPU a
 * specialization per kernel, mj_experts_specs). The planner asks the launchers' own knob functions for each
 * B, so it cannot drift from what a forward launches; the test "prewarm, then prepare in
 * strict mode" (tests/test_moe.c) proves it. */
#include "plan.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

static int tp_ok(int64_t I, int64_t Is, int32_t n) {
    return I % n == 0 && (I / n) % MJ_DIM_ALIGN == 0 && Is % n == 0 && (Is / n) % MJ_DIM_ALIGN == 0;
}

mj_status mj_split_check(const mj_moe_config *cfg, int64_t shared_rows, mj_parallel kind, int32_t n_ranks) {
    const int64_t I = cfg->intermediate, E = cfg->n_experts;
    if (kind == MJ_PAR_TP ? tp_ok(I, shared_rows, n_ranks) : kind != MJ_PAR_EP || E % n_ranks == 0) return MJ_OK;
    /* What works, up to 8 ranks (one node's GPUs). */
    char tp[64] = "", ep[64] = "", shared[96] = "";
    size_t nt = 0, ne = 0;
    for (int32_t n = 2; n <= 8 && n <= MJ_MAX_RANKS; n++) {
        if (tp_ok(I, shared_rows, n)) nt += (size_t)snprintf(tp + nt, sizeof tp - nt, "%s%d", nt ? ", " : "", n);
        if (E % n == 0) ne += (size_t)snprintf(ep + ne, sizeof ep - ne, "%s%d", ne ? ", " : "", n);
    }
    char works[160];
    if (!nt && !ne) snprintf(works, sizeof works, "it runs on one rank only");
    else snprintf(works, sizeof works, "up to 8 ranks, %s%s%s%s%s works", nt ? "TP " : "", tp, nt && ne ? " or " : "",
                  ne ? "EP " : "", ep);
    if (kind == MJ_PAR_TP) {
        if (shared_rows > 0)
            snprintf(shared, sizeof shared, ", its shared expert's %lld into %lld", (long long)shared_rows,
                     (long long)(shared_rows / n_ranks));
        return mj_set_error(MJ_ERR_CONFIG,
                            "TP=%d splits moe_intermediate_size %lld into slices of %lld rows%s; the expert kernels "
                            "take slices that are multiples of %d rows (their K-step): for this model, %s",
                            n_ranks, (long long)I, (long long)(I / n_ranks), shared, MJ_DIM_ALIGN, works);
    }
    return mj_set_error(MJ_ERR_CONFIG, "EP=%d: n_routed_experts %lld is not divisible by the rank count: for this model, %s",
                        n_ranks, (long long)E, works);
}

mj_status mj_plan_rank_shape(const mj_moe_config *cfg, mj_parallel par, int32_t rank, int32_t n_ranks,
                             int32_t shared, int32_t *i_local, int32_t *nsub) {
    const int32_t I = cfg->intermediate, S = cfg->n_shared;
    if (par != MJ_PAR_NONE && par != MJ_PAR_TP && par != MJ_PAR_EP)
        return mj_set_error(MJ_ERR_INVALID_ARG, "unknown split kind %d: use MJ_PAR_NONE, MJ_PAR_TP or MJ_PAR_EP",
                            (int)par);
    if (par == MJ_PAR_NONE ? n_ranks != 1 : (n_ranks < 1 || n_ranks > MJ_MAX_RANKS))
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "%d ranks: MJ_PAR_NONE is one rank; TP and EP take 1..%d ranks", n_ranks, MJ_MAX_RANKS);
    if (rank < 0 || rank >= n_ranks)
        return mj_set_error(MJ_ERR_INVALID_ARG, "rank %d of %d ranks: ranks are 0..%d", rank, n_ranks, n_ranks - 1);
    MJ_CHECK(mj_split_check(cfg, (int64_t)S * I, par, n_ranks));
    *i_local = par == MJ_PAR_TP ? I / n_ranks : I;
    *nsub = shared && S > 0 && (par != MJ_PAR_EP || rank == 0) ? S : 0;
    return MJ_OK;
}

static mj_status add(mj_plan *p, int32_t *cap, const mj_spec *s, const char *what, int32_t B) {
    for (int32_t i = 0; i < p->n; i++)
        if (mj_spec_equal(&p->e[i].spec, s)) {
            if (B < p->e[i].b_lo) p->e[i].b_lo = B;
            if (B > p->e[i].b_hi) p->e[i].b_hi = B;
            return MJ_OK;
        }
    if (p->n == *cap) {
        int32_t nc = *cap ? *cap * 2 : 16;
        mj_plan_entry *e = realloc(p->e, sizeof *e * (size_t)nc);
        if (!e) return mj_set_error(MJ_ERR_NOMEM, "the planner: out of memory");
        p->e = e, *cap = nc;
    }
    p->e[p->n++] = (mj_plan_entry){*s, what, B, B};
    return MJ_OK;
}

mj_status mj_plan_build(mj_context_t ctx, const mj_plan_request *r, mj_plan *out) {
    if (!ctx || !r || !r->cfg || !out || (r->n_batches > 0 && !r->batches))
        return mj_set_error(MJ_ERR_INVALID_ARG, "the planner: NULL argument");
    out->n = 0, out->e = NULL;
    const mj_moe_config *cfg = r->cfg;
    const mj_target target = mj_context_target(ctx);
    MJ_CHECK(mj_moe_config_validate(cfg, 1));
    mj_route_params rp;
    MJ_CHECK(mj_route_params_from_config(cfg, &rp));
    /* The ranks whose experts' shapes differ: one per distinct (I_local, nsub). */
    int32_t shapes[MJ_MAX_RANKS][2], n_shapes = 0;
    for (int32_t rk = r->rank < 0 ? 0 : r->rank; rk < (r->rank < 0 ? r->n_ranks : r->rank + 1); rk++) {
        int32_t il, ns, seen = 0;
        MJ_CHECK(mj_plan_rank_shape(cfg, r->par, rk, r->n_ranks, r->shared, &il, &ns));
        for (int32_t i = 0; i < n_shapes; i++) seen |= shapes[i][0] == il && shapes[i][1] == ns;
        if (!seen) shapes[n_shapes][0] = il, shapes[n_shapes][1] = ns, n_shapes++;
    }
    mj_mode_policy defaults;
    const mj_mode_policy *modes = r->modes;
    if (!modes && r->mode == MJ_MODE_AUTO) {
        MJ_CHECK(mj_mode_policy_parse(mj_mode_policy_default(target), target, &defaults));
        modes = &defaults;
    }
    mj_status st = MJ_OK;
    int32_t cap = 0;
    for (int32_t i = 0; i < r->n_batches; i++) {
        const int32_t B = r->batches[i];
        if (B < 1) {
            st = mj_set_error(MJ_ERR_INVALID_ARG, "batch size %d: batch sizes are at least 1", B);
            goto fail;
        }
        mj_spec s;
        mj_knobs_router_gemm kg;
        mj_router_knobs(cfg->hidden, cfg->n_experts, B, &kg);
        mj_spec_router_gemm(ctx, &kg, &s);
        MJ_CHECK_GOTO(add(out, &cap, &s, "router GEMM", B), st, fail);

        rp.k0 = cfg->topk;
        if (r->k0) MJ_CHECK_GOTO(mj_k0_policy_resolve(r->k0, B, &rp.k0), st, fail);
        mj_knobs_oea_route kr;
        if ((st = mj_route_knobs(&rp, B, &kr)) != MJ_OK) {
            st = mj_error_prefix(st, "batch size %d, k0 %d", B, rp.k0);
            goto fail;
        }
        mj_spec_oea_route(ctx, &kr, &s);
        MJ_CHECK_GOTO(add(out, &cap, &s, "routing", B), st, fail);

        mj_weight_mode m;
        MJ_CHECK_GOTO(mj_mode_resolve(modes, target, r->mode, B, &m), st, fail);
        for (int32_t j = 0; j < n_shapes; j++) {
            mj_knobs_moe_experts ke;
            mj_experts_knobs(cfg->hidden, shapes[j][0], cfg->topk, shapes[j][1], m, B, target, &ke);
            mj_spec parts[3];
            const int32_t n_parts = mj_experts_specs(ctx, &ke, parts);
            for (int32_t q = 0; q < n_parts; q++) MJ_CHECK_GOTO(add(out, &cap, &parts[q], "experts", B), st, fail);
        }
    }
    /* Each spec valid for its template (knob ranges, constraints, target) before anyone
     * compiles or records it. */
    for (int32_t i = 0; i < out->n; i++) MJ_CHECK_GOTO(mj_spec_validate(&out->e[i].spec), st, fail);
    return MJ_OK;
fail:
    mj_plan_free(out);
    return st;
}

mj_status mj_plan_get_all(mj_context_t ctx, const mj_plan *p, const char *who) {
    if (!p || p->n <= 0) return MJ_OK;
    mj_spec *specs = malloc(sizeof *specs * (size_t)p->n);
    const mj_function **fns = malloc(sizeof *fns * (size_t)p->n);
    mj_status st;
    if (specs && fns) {
        for (int32_t i = 0; i < p->n; i++) specs[i] = p->e[i].spec;
        st = mj_jit_get_many(ctx, specs, p->n, fns);
    } else {
        st = mj_set_error(MJ_ERR_NOMEM, "%s: out of memory for a plan of %d specializations", who, (int)p->n);
    }
    free(specs), free(fns);
    return st;
}

void mj_plan_free(mj_plan *p) {
    if (!p) return;
    free(p->e);
    p->e = NULL, p->n = 0;
}

mj_status mj_batches_parse(const char *text, int32_t **out, int32_t *n) {
    char shown[96];
    if (!text || !out || !n) return mj_set_error(MJ_ERR_INVALID_ARG, "batch sizes: NULL argument");
    *out = NULL, *n = 0;
    /* A bitmap over 1..MJ_MAX_BATCH: the list comes out ascending and distinct. */
    uint8_t *on = calloc(MJ_MAX_BATCH + 1, 1);
    if (!on) return mj_set_error(MJ_ERR_NOMEM, "batch sizes: out of memory");
    const char *s = text;
    int32_t count = 0;
    while (*s) {
        char *end;
        if (*s < '0' || *s > '9') goto bad;
        long lo = strtol(s, &end, 10), hi;
        s = end;
        if (*s == '-') {
            s++;
            if (*s < '0' || *s > '9') goto bad;
            hi = strtol(s, &end, 10);
            s = end;
        } else {
            hi = lo;
        }
        if (lo < 1 || hi < lo || hi > MJ_MAX_BATCH) {
            free(on);
            return mj_set_error(MJ_ERR_INVALID_ARG, "batch sizes '%s': %ld..%ld is not within 1..%d",
                                mj_printable(text, shown, sizeof shown), lo, hi, MJ_MAX_BATCH);
        }
        for (long b = lo; b <= hi; b++) count += !on[b], on[b] = 1;
        if (*s == ',') {
            if (!*++s) goto bad;
        } else if (*s) {
            goto bad;
        }
    }
    if (!count) goto bad;
    int32_t *v = malloc(sizeof *v * (size_t)count);
    if (!v) {
        free(on);
        return mj_set_error(MJ_ERR_NOMEM, "batch sizes: out of memory");
    }
    for (int32_t b = 1, k = 0; b <= MJ_MAX_BATCH; b++)
        if (on[b]) v[k++] = b;
    free(on);
    *out = v, *n = count;
    return MJ_OK;
bad:
    free(on);
    return mj_set_error(MJ_ERR_INVALID_ARG,
                        "batch sizes '%s' are malformed: write a range \"1-256\", a list \"1,2,4,8\" or both "
                        "(\"1-8,16,32\")",
                        mj_printable(text, shown, sizeof shown));
}
