/* moe.c — the whole MoE layer on one rank: mj_moe_create packs this rank's experts and the
 * router where the kernels run, mj_moe_prepare compiles what the planner (plan.c) lists for
 * the batch sizes asked and sizes the workspace, and mj_moe_forward is the decode step:
 *
 *   hidden [B, H] bf16 --router GEMM--> logits [B, E] f32 --mj_route (k0)--> ids, weights,
 *   dispatch --experts (this rank's slice, + shared)--> out [B, H] f32 --all-reduce--> out
 *
 * Every rank routes every token (the router is replicated), so the ranks agree on the
 * routing without talking; only the partial outputs are summed. A forward does host work
 * only (table lookups, launches): no allocation, no sync, no compile, so it can be captured
 * in a CUDA graph; the token count it obeys is read on the device (num_valid). */
#include "comm/comm.h"
#include "weights/layer.h"
#include "mem.h"
#include "plan.h"

#include <stdio.h>
#include <stdlib.h>

struct mj_moe {
    mj_context_t ctx;
    mj_target target;
    int device;                   /* ordinal, or MJ_DEVICE_NONE (the interpreter)            */
    mj_moe_config cfg;
    mj_moe_options opt;
    mj_experts_t ex;              /* this rank's experts, packed                             */
    uint16_t *gate;               /* [E, H] bf16, where the kernels run                      */
    float *bias;                  /* [E] or NULL                                             */
    mj_route_params route;        /* from the config; k0 set per forward                     */
    /* What prepare set up: per batch size 1..mb, its k0 and mode; k0 0: not prepared. */
    int32_t mb;
    struct batch_plan { int8_t k0, mode; } *batch; /* [mb + 1]                              */
    /* The forward's workspace (for mb tokens): the logits, and mj_route's outputs as the
     * forward hands them to mj_route and the experts. */
    float *logits;                /* [mb, E]                                                 */
    void *rws;                    /* the router GEMM's workspace (NULL: none needed)        */
    size_t rws_bytes;
    mj_route_outputs r;
};

static void workspace_free(mj_moe_t m) {
    mj_route_outputs *r = &m->r;
    void *bufs[] = {m->logits,         r->ids,            r->weights,        r->n_sel,       r->expert_counts,
                    r->expert_offsets, r->active_experts, r->n_active,       r->permutation, r->row_index};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) mj_mem_free(m->device, bufs[i]);
    if (m->rws) mj_mem_free(m->device, m->rws);
    m->logits = NULL, m->rws = NULL, m->rws_bytes = 0;
    *r = (mj_route_outputs)MJ_ROUTE_OUTPUTS_INIT;
    free(m->batch);
    m->batch = NULL, m->mb = 0;
}

mj_status mj_moe_free(mj_moe_t m) {
    if (!m) return MJ_OK;
    workspace_free(m);
    mj_experts_free(m->ex);
    mj_mem_free(m->device, m->gate);
    mj_mem_free(m->device, m->bias);
    free(m);
    return MJ_OK;
}

mj_status mj_moe_create(mj_context_t ctx, mj_layer_t layer, const mj_moe_options *opts_in, mj_moe_t *out) {
    if (!ctx || !layer || !out) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_moe_create: NULL context, layer or output");
    *out = NULL;
    mj_moe_options o = MJ_MOE_OPTIONS_INIT;
    if (opts_in)
        MJ_CHECK(mj_struct_load(opts_in, sizeof o, sizeof o, &o, "mj_moe_options", "MJ_MOE_OPTIONS_INIT"));
    int32_t il, nsub;
    mj_status st = mj_plan_rank_shape(&layer->cfg, o.parallel, o.rank, o.n_ranks, o.shared_expert != 0, &il, &nsub);
    if (st != MJ_OK) return mj_error_prefix(st, "mj_moe_create");
    if (o.n_ranks > 1 && !o.comm)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "mj_moe_create: %d ranks need a communicator to sum their outputs (mj_moe_options.comm: "
                            "mj_comm_nccl_init_rank, mj_comm_nccl_wrap or mj_comm_loopback_create)",
                            o.n_ranks);
    if (o.comm) {
        int32_t cr, cn;
        mj_backend be;
        MJ_CHECK(mj_context_backend(ctx, &be, NULL));
        const int loop = mj_comm_kind(o.comm) == MJ_COMM_LOOPBACK;
        if (loop != (be == MJ_BACKEND_SIM))
            return mj_set_error(MJ_ERR_INVALID_ARG,
                                "mj_moe_create: a %s communicator with a %s context: loopback ranks sum host "
                                "buffers (the interpreter), NCCL device buffers (a GPU)",
                                loop ? "loopback" : "NCCL", be == MJ_BACKEND_SIM ? "interpreter" : "GPU");
        MJ_CHECK(mj_comm_info(o.comm, &cr, &cn));
        if (cr != o.rank || cn != o.n_ranks)
            return mj_set_error(MJ_ERR_INVALID_ARG,
                                "mj_moe_create: the communicator is rank %d of %d, the options say rank %d of %d", cr,
                                cn, o.rank, o.n_ranks);
    }
    /* This rank's slice: the layer as given when it is that slice, else cut from the whole. */
    mj_layer_t slice = NULL, L = layer;
    const int whole = layer->par == MJ_PAR_NONE;
    if (!whole && (layer->par != o.parallel || layer->rank != o.rank || layer->n_ranks != o.n_ranks))
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "mj_moe_create: the layer is rank %d of a %s=%d split, the options ask for rank %d of "
                            "%s=%d: pass the whole layer or this rank's slice",
                            layer->rank, layer->par == MJ_PAR_TP ? "TP" : "EP", layer->n_ranks, o.rank,
                            o.parallel == MJ_PAR_TP ? "TP" : o.parallel == MJ_PAR_EP ? "EP" : "none", o.n_ranks);
    if (whole && o.parallel != MJ_PAR_NONE) {
        if ((st = mj_layer_shard(layer, o.parallel, o.rank, o.n_ranks, &slice)) != MJ_OK)
            return mj_error_prefix(st, "mj_moe_create");
        L = slice;
    }
    /* Without the shared expert: the same slice, seen without it (a shallow copy). */
    struct mj_layer noshared;
    if (!o.shared_expert && L->has_shared) {
        noshared = *L;
        noshared.has_shared = 0, noshared.is_local = 0;
        L = &noshared;
    }
    mj_moe_t m = calloc(1, sizeof *m);
    if (!m) {
        mj_layer_free(slice);
        return mj_set_error(MJ_ERR_NOMEM, "mj_moe_create: out of memory");
    }
    m->ctx = ctx, m->cfg = layer->cfg, m->opt = o, m->r = (mj_route_outputs)MJ_ROUTE_OUTPUTS_INIT;
    m->target = mj_context_target(ctx);
    mj_backend backend;
    MJ_CHECK_GOTO(mj_context_backend(ctx, &backend, NULL), st, fail);
    m->device = backend == MJ_BACKEND_SIM ? MJ_DEVICE_NONE : mj_context_device(ctx, NULL);
    mj_experts_options eo = MJ_EXPERTS_OPTIONS_INIT;
    eo.max_batch = 1, eo.mode_policy = o.mode_policy;
    if ((st = mj_experts_create(ctx, L, &eo, &m->ex)) != MJ_OK) {
        st = mj_error_prefix(st, "mj_moe_create");
        goto fail;
    }
    const size_t E = (size_t)m->cfg.n_experts, H = (size_t)m->cfg.hidden;
    MJ_CHECK_GOTO(mj_mem_alloc(m->device, E * H * 2, "mj_moe_create", (void **)&m->gate), st, fail);
    MJ_CHECK_GOTO(mj_mem_put(m->device, m->gate, L->gate, E * H * 2), st, fail);
    if (L->bias) {
        MJ_CHECK_GOTO(mj_mem_alloc(m->device, E * 4, "mj_moe_create", (void **)&m->bias), st, fail);
        MJ_CHECK_GOTO(mj_mem_put(m->device, m->bias, L->bias, E * 4), st, fail);
    }
    MJ_CHECK_GOTO(mj_route_params_from_config(&m->cfg, &m->route), st, fail);
    if (!o.rsf_in_weights) m->route.routed_scaling_factor = 1.0f;
    mj_layer_free(slice);
    *out = m;
    return MJ_OK;
fail:
    mj_layer_free(slice);
    mj_moe_free(m);
    return st;
}

mj_status mj_moe_prepare(mj_moe_t m, const mj_moe_prepare_options *opts_in) {
    if (!m) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_moe_prepare: NULL handle");
    mj_moe_prepare_options o = MJ_MOE_PREPARE_OPTIONS_INIT;
    if (opts_in)
        MJ_CHECK(mj_struct_load(opts_in, sizeof o, sizeof o, &o, "mj_moe_prepare_options",
                                "MJ_MOE_PREPARE_OPTIONS_INIT"));
    /* The batch sizes, ascending and distinct. */
    int32_t nb = o.batches ? o.n_batches : o.max_batch;
    if (nb < 1 || (!o.batches && o.max_batch > MJ_MAX_BATCH))
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "mj_moe_prepare: %s %d: give max_batch in 1..%d or a non-empty list of batch sizes",
                            o.batches ? "n_batches" : "max_batch", nb, MJ_MAX_BATCH);
    int32_t *bs = malloc(sizeof *bs * (size_t)nb);
    if (!bs) return mj_set_error(MJ_ERR_NOMEM, "mj_moe_prepare: out of memory");
    int32_t mb = 0;
    for (int32_t i = 0; i < nb; i++) {
        bs[i] = o.batches ? o.batches[i] : i + 1;
        if (bs[i] < 1 || bs[i] > MJ_MAX_BATCH) {
            int32_t bad = bs[i];
            free(bs);
            return mj_set_error(MJ_ERR_INVALID_ARG, "mj_moe_prepare: batch size %d is not within 1..%d", bad,
                                MJ_MAX_BATCH);
        }
        if (bs[i] > mb) mb = bs[i];
    }
    mj_k0_policy k0p;
    mj_mode_policy modes;
    mj_status st = MJ_OK;
    mj_plan plan = {0, NULL};
    struct batch_plan *batch = NULL;
    if (o.k0_policy) MJ_CHECK_GOTO(mj_k0_policy_parse(o.k0_policy, m->cfg.topk, &k0p), st, out);
    MJ_CHECK_GOTO(mj_mode_policy_parse(m->opt.mode_policy ? m->opt.mode_policy : mj_mode_policy_default(m->target),
                                       m->target, &modes),
                  st, out);
    mj_plan_request req = {&m->cfg, m->opt.parallel, m->opt.n_ranks, m->opt.rank, bs, nb,
                           o.k0_policy ? &k0p : NULL, o.mode, &modes, m->opt.shared_expert != 0};
    MJ_CHECK_GOTO(mj_plan_build(m->ctx, &req, &plan), st, out);
    /* Every kernel of the plan, built side by side (mj_jit_get_many's pool). */
    MJ_CHECK_GOTO(mj_plan_get_all(m->ctx, &plan, "mj_moe_prepare"), st, out);
    /* Per batch size: its k0 and mode (resolved here, so a forward only reads). */
    if (!(batch = calloc((size_t)mb + 1, sizeof *batch))) {
        st = mj_set_error(MJ_ERR_NOMEM, "mj_moe_prepare: out of memory");
        goto out;
    }
    for (int32_t i = 0; i < nb; i++) {
        int32_t k0 = m->cfg.topk;
        mj_weight_mode md;
        if (o.k0_policy) MJ_CHECK_GOTO(mj_k0_policy_resolve(&k0p, bs[i], &k0), st, out);
        MJ_CHECK_GOTO(mj_mode_resolve(&modes, m->target, o.mode, bs[i], &md), st, out);
        batch[bs[i]] = (struct batch_plan){(int8_t)k0, (int8_t)md};
    }
    /* The workspace, for the largest batch. */
    workspace_free(m);
    const size_t E = (size_t)m->cfg.n_experts, K = (size_t)m->cfg.topk, B = (size_t)mb;
    mj_route_outputs *r = &m->r;
    struct { void **p; size_t bytes; } bufs[] = {
        {(void **)&m->logits, B * E * 4},         {(void **)&r->ids, B * K * 4},
        {(void **)&r->weights, B * K * 4},        {(void **)&r->n_sel, B * 4},
        {(void **)&r->expert_counts, E * 4},      {(void **)&r->expert_offsets, (E + 1) * 4},
        {(void **)&r->active_experts, E * 4},     {(void **)&r->n_active, 4},
        {(void **)&r->permutation, B * K * 4},    {(void **)&r->row_index, B * K * 4}};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        MJ_CHECK_GOTO(mj_mem_alloc(m->device, bufs[i].bytes, "mj_moe_prepare", bufs[i].p), st, fail_ws);
    MJ_CHECK_GOTO(mj_router_gemm_workspace(mb, m->cfg.hidden, m->cfg.n_experts, &m->rws_bytes), st, fail_ws);
    if (m->rws_bytes) { /* zeroed once: every router GEMM leaves its counters at 0 again */
        MJ_CHECK_GOTO(mj_mem_alloc(m->device, m->rws_bytes, "mj_moe_prepare", &m->rws), st, fail_ws);
        MJ_CHECK_GOTO(mj_mem_zero(m->device, m->rws, m->rws_bytes), st, fail_ws);
    }
    MJ_CHECK_GOTO(mj_experts_reserve(m->ex, mb), st, fail_ws);
    m->mb = mb, m->batch = batch;
    batch = NULL;
    goto out;
fail_ws:
    workspace_free(m);
out:
    if (st != MJ_OK) st = mj_error_prefix(st, "mj_moe_prepare");
    mj_plan_free(&plan);
    free(bs), free(batch);
    return st;
}

mj_status mj_moe_batch_plan(mj_moe_t m, int32_t B, int32_t *k0, mj_weight_mode *mode) {
    if (!m) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_moe_batch_plan: NULL handle");
    if (B < 1 || B > m->mb || !m->batch[B].k0)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_moe_batch_plan: batch size %d was not prepared", B);
    if (k0) *k0 = m->batch[B].k0;
    if (mode) *mode = (mj_weight_mode)m->batch[B].mode;
    return MJ_OK;
}

mj_status mj_moe_route_outputs(mj_moe_t m, mj_route_outputs *out) {
    if (!m || !out) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_moe_route_outputs: NULL argument");
    MJ_CHECK(mj_struct_load(out, MJ_ROUTE_OUTPUTS_V1_SIZE, sizeof m->r, &(mj_route_outputs){0},
                            "mj_route_outputs", "MJ_ROUTE_OUTPUTS_INIT"));
    mj_struct_store(out, &m->r, sizeof m->r);
    return MJ_OK;
}

mj_status mj_moe_forward(mj_moe_t m, const uint16_t *hidden, int32_t B, const int32_t *num_valid, float *out,
                         void *stream) {
    if (!m || (B > 0 && (!hidden || !out)))
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_moe_forward: NULL handle, hidden or out");
    if (B == 0) return MJ_OK; /* every rank has the same B: no one waits in the all-reduce */
    if (B < 0 || B > m->mb || !m->batch[B].k0)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "mj_moe_forward: batch size %d was not prepared (%s): add it to mj_moe_prepare's batch "
                            "sizes, or pad the batch to a prepared size and pass num_valid",
                            B, m->mb ? "prepared: up to the largest, see mj_moe_prepare" : "mj_moe_prepare was not called");
    mj_status st;
    const mj_moe_config *c = &m->cfg;
    if ((st = mj_router_gemm(m->ctx, hidden, m->gate, B, c->hidden, c->n_experts, m->logits, m->rws, m->rws_bytes,
                             stream)) != MJ_OK)
        return mj_error_prefix(st, "mj_moe_forward");
    mj_route_params p = m->route;
    p.k0 = m->batch[B].k0;
    if ((st = mj_route(m->ctx, &p, m->logits, m->bias, B, num_valid, &m->r, stream)) != MJ_OK)
        return mj_error_prefix(st, "mj_moe_forward");
    if ((st = mj_experts_forward(m->ctx, m->ex, (mj_weight_mode)m->batch[B].mode, hidden, &m->r, B, num_valid, out,
                                 stream)) != MJ_OK)
        return mj_error_prefix(st, "mj_moe_forward");
    if (m->opt.n_ranks > 1 &&
        (st = mj_comm_all_reduce_f32(m->opt.comm, out, out, (int64_t)B * c->hidden, stream)) != MJ_OK)
        return mj_error_prefix(st, "mj_moe_forward");
    return MJ_OK;
}
