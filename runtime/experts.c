/* experts.c — the host side of templates/moe_experts.cu: a rank's experts packed onto the
 * device (or into host memory for the interpreter), the forward's workspace, the mode
 * policy, the choice of specialization, and the launches of one forward.
 *
 * A forward is fixed work for the host: resolve the mode, fill integer specs (one per kernel
 * on a GPU), look them up in the context's table, launch two kernels (three in W4A4) on the
 * caller's stream. Every
 * buffer was allocated by mj_experts_create, every kernel compiled by the first forward of
 * its shape (or by mj_experts_prepare), and nothing waits for the GPU: a forward can be
 * captured in a CUDA graph. How many experts are active, and which, is read by the kernels
 * from mj_route's outputs on the device.
 */
#include "experts.h"
#include "mem.h"
#include "weights/layer.h"
#include "weights/pack.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct mj_experts mj_experts;
struct mj_experts {
    mj_backend backend;
    mj_target target;
    int device;                          /* ordinal, or MJ_DEVICE_NONE (the sim)          */
    int32_t H, I, K, E;                  /* hidden, I_local, top-k, routed experts (all)   */
    int32_t n_local, expert_begin, nsub; /* routed experts held here, the first's id,
                                            shared sub-experts                             */
    int32_t mb;                          /* max batch of the workspace                    */
    int w4a4;                            /* the target has the FP4 MMA                     */
    int gated;                           /* the shared expert has a sigmoid gate (sgate)   */
    int64_t bytes_w13, bytes_s13, bytes_w2, bytes_s2; /* one packed expert                */
    uint8_t *w13, *s13, *w2, *s2;        /* [n_local + nsub] packed experts               */
    float *scal;                         /* [n_local + nsub][MJ_EXPERTS_SCAL]: w13's
                                            weight_scale_2 and input_scale, w2's, then
                                            1 / each input_scale, 2 unused                */
    uint16_t *act;                       /* [rows][I] bf16 (W4A16)                        */
    uint8_t *actq, *act_sf;              /* [rows][I/2], [rows][I/16] (W4A4)               */
    uint8_t *xq, *xsf;                   /* [xrows][H/2], [xrows][H/16] (W4A4)             */
    int32_t sms;                         /* the device's SMs (the interpreter:
                                            MJ_EXPERTS_SIM_SMS): up's STREAM grid           */
    float *upart;                        /* up's STREAM (TPE 8): a tile's pieces' sums where
                                            its pieces are over several warps, [pieces][8
                                            (K + nsub) rows][I / 16][32]                   */
    uint32_t *ucount;                    /* [8 K + nsub][I / 16]: a tile's pieces done, 0
                                            between launches                              */
    uint16_t *sgate;                     /* [H] bf16: the shared expert's sigmoid gate
                                            (Qwen2-MoE, Qwen3-Next), or NULL               */
    float *sgate_w;                      /* [mb]: each token's sigmoid(x . sgate), written
                                            by experts_up, read by experts_down (with sgate) */
    mj_mode_policy policy;               /* the mode for MJ_MODE_AUTO, by batch size      */
    unsigned owned;                      /* MJ_EXPERTS_OWN_*: which of w13, s13, w2, s2 this
                                            handle allocated (an adopted one borrows some)  */
    mj_adoption *adoption;               /* mj_experts_adopt's record (adopt.c), or NULL   */
};

/* ---- memory where the kernels run -------------------------------------------------------- */

static mj_status buf_alloc(const mj_experts *ex, size_t bytes, void **out) {
    return mj_mem_alloc(ex->device, bytes, "mj_experts_create", out);
}

static mj_status buf_put(const mj_experts *ex, void *dst, const void *src, size_t bytes) {
    return mj_mem_put(ex->device, dst, src, bytes);
}

static void buf_free(const mj_experts *ex, void *p) { mj_mem_free(ex->device, p); }

mj_status mj_experts_free(mj_experts_t ex) {
    if (!ex) return MJ_OK;
    void *weights[] = {ex->w13, ex->s13, ex->w2, ex->s2};
    for (int i = 0; i < 4; i++)
        if (ex->owned & (1u << i)) buf_free(ex, weights[i]);
    void *bufs[] = {ex->scal, ex->sgate, ex->act, ex->actq, ex->act_sf, ex->xq, ex->xsf, ex->upart, ex->ucount,
                    ex->sgate_w};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) buf_free(ex, bufs[i]);
    mj_adoption_free(ex->device, ex->adoption);
    free(ex);
    return MJ_OK;
}

/* ---- the mode policy --------------------------------------------------------------------- */

/* Whether the target has the block-scaled FP4 MMA that W4A4 runs on (sm_120a, sm_121a). */
static int has_fp4_mma(mj_target target) { return mj_target_sm(target) >= 120; }

static int mode_value(const char *s, size_t n, int32_t *v, void *arg) {
    (void)arg;
    if (n == 5 && !strncmp(s, "w4a16", 5)) return *v = MJ_MODE_W4A16, 1;
    if (n == 4 && !strncmp(s, "w4a4", 4)) return *v = MJ_MODE_W4A4, 1;
    return 0;
}

mj_status mj_mode_policy_parse(const char *text, mj_target target, mj_mode_policy *out) {
    mj_mode_policy p;
    MJ_CHECK(mj_rules_parse(text, "mode policy", "1-8:w4a16,9-:w4a4", mode_value, NULL, p.rules, MJ_MODE_POLICY_MAX_RULES,
                            &p.n_rules));
    for (int32_t i = 0; i < p.n_rules; i++)
        if (p.rules[i].v == MJ_MODE_W4A4 && !has_fp4_mma(target)) {
            char shown[96];
            return mj_set_error(MJ_ERR_UNSUPPORTED,
                                "mode policy '%s' asks for w4a4, which needs the FP4 MMA of sm_120a / sm_121a; "
                                "this context builds for %s: use \"w4a16\"",
                                mj_printable(text, shown, sizeof shown), mj_target_name(target));
        }
    *out = p;
    return MJ_OK;
}

const char *mj_mode_policy_default(mj_target target) {
    return has_fp4_mma(target) ? "1-8:w4a16,9-:w4a4" : "w4a16";
}

mj_status mj_mode_resolve(const mj_mode_policy *p, mj_target target, mj_weight_mode mode, int32_t B,
                          mj_weight_mode *resolved) {
    if (mode == MJ_MODE_AUTO) {
        int32_t v;
        if (!mj_rules_find(p->rules, p->n_rules, B, &v))
            return mj_set_error(MJ_ERR_INVALID_ARG, "the experts' mode policy has no rule for batch size %d; add one", B);
        mode = (mj_weight_mode)v;
    }
    if (mode != MJ_MODE_W4A16 && mode != MJ_MODE_W4A4)
        return mj_set_error(MJ_ERR_INVALID_ARG, "unknown weight mode %d: use MJ_MODE_W4A16, MJ_MODE_W4A4 or MJ_MODE_AUTO",
                            (int)mode);
    if (mode == MJ_MODE_W4A4 && !has_fp4_mma(target))
        return mj_set_error(MJ_ERR_UNSUPPORTED,
                            "W4A4 needs the block-scaled FP4 MMA of sm_120a / sm_121a; this context builds for %s: "
                            "use MJ_MODE_W4A16",
                            mj_target_name(target));
    *resolved = mode;
    return MJ_OK;
}

mj_status mj_experts_mode(mj_experts_t ex, mj_weight_mode mode, int32_t B, mj_weight_mode *resolved) {
    if (!ex || !resolved) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_experts_mode: NULL argument");
    return mj_mode_resolve(&ex->policy, ex->target, mode, B, resolved);
}

/* Free the forward's workspace: no workspace at all is mb 0. */
static void workspace_release(mj_experts *ex) {
    void *old[] = {ex->act, ex->actq, ex->act_sf, ex->xq, ex->xsf, ex->upart, ex->ucount, ex->sgate_w};
    for (size_t i = 0; i < sizeof old / sizeof old[0]; i++) buf_free(ex, old[i]);
    ex->act = NULL, ex->actq = ex->act_sf = ex->xq = ex->xsf = NULL, ex->upart = NULL, ex->ucount = NULL;
    ex->sgate_w = NULL, ex->mb = 0;
}

static int32_t up_stream_pieces(const mj_experts *ex);

/* The forward's workspace for up to mb tokens: the activations between the two GEMMs,
 * (W4A4) the quantized inputs, STREAM up's sums and counters (a plan of at most 8 tokens
 * runs up as a stream of pieces over a grid of resident blocks), and a gated shared expert's weights: act, actq, act_sf, xq,
 * xsf, upart, ucount, sgate_w, in bytes. */
#define WS_BUFS 8
static void workspace_sizes(const mj_experts *ex, int32_t mb, int64_t bytes[WS_BUFS]) {
    const int64_t rows = (int64_t)mb * ex->K + (int64_t)ex->nsub * mb, xrows = (int64_t)mb * (ex->K + 1);
    const int64_t H = ex->H, I = ex->I;
    bytes[0] = rows * I * 2;
    bytes[1] = ex->w4a4 ? rows * I / 2 : 0;
    bytes[2] = ex->w4a4 ? rows * I / 16 : 0;
    bytes[3] = ex->w4a4 ? xrows * H / 2 : 0;
    bytes[4] = ex->w4a4 ? xrows * H / 16 : 0;
    const int64_t pieces = up_stream_pieces(ex), slots = 8LL * ex->K < ex->E ? 8LL * ex->K : ex->E;
    bytes[5] = pieces > 0 ? pieces * 8 * (ex->K + ex->nsub) * (I / 16) * 32 * (int64_t)sizeof(float) : 0;
    bytes[6] = pieces > 0 ? (slots + ex->nsub) * (I / 16) * (int64_t)sizeof(uint32_t) : 0;
    bytes[7] = ex->gated ? (int64_t)mb * (int64_t)sizeof(float) : 0;
}

/* Replaces what was there. */
static mj_status workspace_alloc(mj_experts *ex, int32_t mb) {
    workspace_release(ex);
    int64_t bytes[WS_BUFS];
    workspace_sizes(ex, mb, bytes);
    void **bufs[WS_BUFS] = {(void **)&ex->act, (void **)&ex->actq,  (void **)&ex->act_sf, (void **)&ex->xq,
                            (void **)&ex->xsf, (void **)&ex->upart, (void **)&ex->ucount, (void **)&ex->sgate_w};
    for (int i = 0; i < WS_BUFS; i++)
        if (bytes[i]) MJ_CHECK(buf_alloc(ex, (size_t)bytes[i], bufs[i]));
    if (bytes[6]) /* the counters start at 0 (each launch leaves them so) */
        MJ_CHECK(mj_mem_zero(ex->device, ex->ucount, (size_t)bytes[6]));
    ex->mb = mb;
    return MJ_OK;
}

int64_t mj_experts_bytes_allocated(mj_experts_t ex) {
    const int64_t X = (int64_t)ex->n_local + ex->nsub;
    const int64_t per[4] = {ex->bytes_w13, ex->bytes_s13, ex->bytes_w2, ex->bytes_s2};
    int64_t total = X * MJ_EXPERTS_SCAL * (int64_t)sizeof(float) + (ex->gated ? ex->H * 2 : 0), ws[WS_BUFS];
    for (int i = 0; i < 4; i++)
        if (ex->owned & (1u << i)) total += X * per[i];
    workspace_sizes(ex, ex->mb, ws);
    for (int i = 0; i < WS_BUFS; i++) total += ws[i];
    return total;
}

mj_status mj_experts_reserve(mj_experts_t ex, int32_t max_batch) {
    if (!ex) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_experts_reserve: NULL experts");
    if (max_batch < 1 || max_batch > 65536)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_experts_reserve: max_batch %d must be in 1..65536", max_batch);
    if (max_batch <= ex->mb) return MJ_OK;
    mj_status st = workspace_alloc(ex, max_batch);
    if (st != MJ_OK) { /* keep the handle usable: no workspace at all is mb 0 */
        char why[512];
        snprintf(why, sizeof why, "%s", mj_last_error());
        workspace_release(ex);
        return mj_set_error(st, "%s", why);
    }
    return MJ_OK;
}

/* ---- packing --------------------------------------------------------------------------------- */

/* The shapes the kernels take: hidden H and intermediate I (held here) multiples of 64 within
 * the template's ranges, top-k and the shared sub-experts within theirs. `who` names the
 * caller in the errors. */
static mj_status check_shape(const char *who, int32_t H, int32_t I, int32_t K, int32_t nsub) {
    if (H % 64 || H < 64 || H > MJ_KNOB_moe_experts_H_MAX)
        return mj_set_error(MJ_ERR_UNSUPPORTED, "%s: hidden %d must be a multiple of 64 in 64..%d", who, H,
                            MJ_KNOB_moe_experts_H_MAX);
    if (I % 64 || I < 64 || I > MJ_KNOB_moe_experts_I_MAX)
        return mj_set_error(MJ_ERR_UNSUPPORTED,
                            "%s: the intermediate size held here (%d) must be a multiple of 64 in 64..%d: %s", who, I,
                            MJ_KNOB_moe_experts_I_MAX,
                            I > MJ_KNOB_moe_experts_I_MAX
                                ? "split the layer into more TP ranks (each holds moe_intermediate_size / TP)"
                                : "split the layer into fewer TP ranks, or use EP");
    if (K < 1 || K > MJ_KNOB_moe_experts_K_MAX)
        return mj_set_error(MJ_ERR_UNSUPPORTED, "%s: top-k %d; the kernels take 1..%d", who, K,
                            MJ_KNOB_moe_experts_K_MAX);
    if (nsub > MJ_KNOB_moe_experts_NSUB_MAX)
        return mj_set_error(MJ_ERR_UNSUPPORTED, "%s: a shared expert of %d x %d rows; at most %d", who, nsub, I,
                            MJ_KNOB_moe_experts_NSUB_MAX);
    return MJ_OK;
}

mj_status mj_experts_new(mj_context_t ctx, const mj_experts_shape *sh, const mj_experts_options *opts_in,
                         const char *who, mj_experts_t *out) {
    mj_experts_options opts = MJ_EXPERTS_OPTIONS_INIT;
    if (opts_in)
        MJ_CHECK(mj_struct_load(opts_in, sizeof opts, sizeof opts, &opts, "mj_experts_options",
                                "MJ_EXPERTS_OPTIONS_INIT"));
    MJ_CHECK(check_shape(who, sh->H, sh->I, sh->K, sh->nsub));
    if (opts.max_batch < 1 || opts.max_batch > 65536)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_experts_options.max_batch %d must be in 1..65536", opts.max_batch);
    mj_backend backend;
    MJ_CHECK(mj_context_backend(ctx, &backend, NULL));
    const int device = backend == MJ_BACKEND_SIM ? MJ_DEVICE_NONE : mj_context_device(ctx, NULL);
    if (backend == MJ_BACKEND_CUDA && device == MJ_DEVICE_NONE)
        return mj_set_error(MJ_ERR_NO_DEVICE,
                            "%s: the context has no device (compile-only): create it with a CUDA device, or with "
                            "backend MJ_BACKEND_SIM to run on the CPU",
                            who);
    mj_experts *ex = calloc(1, sizeof *ex);
    if (!ex) return mj_set_error(MJ_ERR_NOMEM, "out of memory");
    ex->backend = backend;
    ex->target = mj_context_target(ctx);
    ex->device = device;
    ex->sms = MJ_EXPERTS_SIM_SMS;
    if (device != MJ_DEVICE_NONE) {
        mj_device_info info;
        memset(&info, 0, sizeof info);
        mj_context_device(ctx, &info);
        if (info.sm_count > 0) ex->sms = info.sm_count;
    }
    ex->H = sh->H, ex->I = sh->I, ex->K = sh->K, ex->E = sh->E;
    ex->n_local = sh->n_local, ex->expert_begin = sh->expert_begin, ex->nsub = sh->nsub, ex->mb = opts.max_batch;
    ex->w4a4 = has_fp4_mma(ex->target);
    ex->gated = sh->gated && sh->nsub > 0;
    ex->bytes_w13 = mj_pack_w13_bytes(ex->H, ex->I), ex->bytes_s13 = mj_pack_s13_bytes(ex->H, ex->I);
    ex->bytes_w2 = mj_pack_w2_bytes(ex->H, ex->I), ex->bytes_s2 = mj_pack_s2_bytes(ex->H, ex->I);
    const char *policy = opts.mode_policy ? opts.mode_policy : mj_mode_policy_default(ex->target);
    const int64_t X = (int64_t)ex->n_local + ex->nsub;
    mj_status st;
    MJ_CHECK_GOTO(mj_mode_policy_parse(policy, ex->target, &ex->policy), st, fail);
    MJ_CHECK_GOTO(buf_alloc(ex, (size_t)X * MJ_EXPERTS_SCAL * sizeof(float), (void **)&ex->scal), st, fail);
    if (ex->gated) MJ_CHECK_GOTO(buf_alloc(ex, (size_t)ex->H * 2, (void **)&ex->sgate), st, fail);
    MJ_CHECK_GOTO(workspace_alloc(ex, ex->mb), st, fail);
    *out = ex;
    return MJ_OK;
fail:
    mj_experts_free(ex);
    return st;
}

mj_status mj_experts_alloc_weights(mj_experts_t ex, unsigned which) {
    uint8_t **bufs[] = {&ex->w13, &ex->s13, &ex->w2, &ex->s2};
    const int64_t bytes[] = {ex->bytes_w13, ex->bytes_s13, ex->bytes_w2, ex->bytes_s2};
    const int64_t X = (int64_t)ex->n_local + ex->nsub;
    for (int i = 0; i < 4; i++)
        if (which & (1u << i)) {
            MJ_CHECK(buf_alloc(ex, (size_t)(X * bytes[i]), (void **)bufs[i]));
            ex->owned |= 1u << i;
        }
    return MJ_OK;
}

void mj_experts_bind(mj_experts_t ex, uint8_t *w13, uint8_t *s13, uint8_t *w2, uint8_t *s2, mj_adoption *a) {
    if (!(ex->owned & MJ_EXPERTS_OWN_W13)) ex->w13 = w13;
    if (!(ex->owned & MJ_EXPERTS_OWN_S13)) ex->s13 = s13;
    if (!(ex->owned & MJ_EXPERTS_OWN_W2)) ex->w2 = w2;
    if (!(ex->owned & MJ_EXPERTS_OWN_S2)) ex->s2 = s2;
    ex->adoption = a;
}

mj_adoption *mj_experts_adoption(mj_experts_t ex) { return ex->adoption; }
int mj_experts_device(mj_experts_t ex) { return ex->device; }

mj_status mj_experts_create(mj_context_t ctx, mj_layer_t L, const mj_experts_options *opts,
                            mj_experts_t *out) {
    if (!ctx || !L || !out) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_experts_create: NULL context, layer or output");
    *out = NULL;
    const mj_moe_config *cfg = &L->cfg;
    const int32_t H = cfg->hidden, I = L->i_local;
    if (cfg->quant != MJ_QUANT_NVFP4)
        return mj_set_error(MJ_ERR_UNSUPPORTED, "mj_experts_create: the layer is not NVFP4-quantized");
    MJ_CHECK(check_shape("mj_experts_create", H, I, cfg->topk, 0));
    int32_t nsub = 0;
    if (L->has_shared && L->is_local > 0) {
        if (L->is_local % I)
            return mj_set_error(MJ_ERR_UNSUPPORTED,
                                "mj_experts_create: the shared expert's %d rows held here are not a multiple of the "
                                "routed experts' %d, which the kernels need to run it as sub-experts",
                                L->is_local, I);
        nsub = L->is_local / I;
    }
    /* The shared expert's gate goes where its sub-experts run (each TP rank: the whole gate). */
    const int gated = nsub > 0 && L->shared_gate != NULL;
    const mj_experts_shape sh = {H, I, cfg->topk, cfg->n_experts, L->n_local, L->expert_begin, nsub, gated};
    mj_experts *ex;
    MJ_CHECK(mj_experts_new(ctx, &sh, opts, "mj_experts_create", &ex));
    const int64_t X = (int64_t)ex->n_local + nsub;
    uint8_t *stage = NULL;
    float *scal = NULL;
    mj_status st;
    MJ_CHECK_GOTO(mj_experts_alloc_weights(ex, MJ_EXPERTS_OWN_ALL), st, fail);
    /* One expert at a time through a host staging buffer, then to where the kernels run. */
    const int64_t per = ex->bytes_w13 + ex->bytes_s13 + ex->bytes_w2 + ex->bytes_s2;
    stage = malloc((size_t)per);
    scal = calloc((size_t)X * MJ_EXPERTS_SCAL, sizeof(float));
    if (!stage || !scal) {
        st = mj_set_error(MJ_ERR_NOMEM, "mj_experts_create: out of host memory");
        goto fail;
    }
    for (int64_t x = 0; x < X; x++) {
        const mj_nvfp4_linear *w13, *w2;
        int32_t gate0 = 0, up0 = I, col0 = 0;
        if (x < ex->n_local) {
            w13 = &L->w13[x], w2 = &L->w2[x];
        } else {
            int32_t j = (int32_t)(x - ex->n_local);
            w13 = &L->shared_w13, w2 = &L->shared_w2;
            gate0 = j * I, up0 = L->is_local + j * I, col0 = j * I;
        }
        uint8_t *p13 = stage, *q13 = p13 + ex->bytes_w13, *p2 = q13 + ex->bytes_s13, *q2 = p2 + ex->bytes_w2;
        MJ_CHECK_GOTO(mj_pack_expert(w13, gate0, up0, I, w2, col0, !ex->w4a4, p13, q13, p2, q2), st, fail);
        MJ_CHECK_GOTO(buf_put(ex, ex->w13 + x * ex->bytes_w13, p13, (size_t)ex->bytes_w13), st, fail);
        MJ_CHECK_GOTO(buf_put(ex, ex->s13 + x * ex->bytes_s13, q13, (size_t)ex->bytes_s13), st, fail);
        MJ_CHECK_GOTO(buf_put(ex, ex->w2 + x * ex->bytes_w2, p2, (size_t)ex->bytes_w2), st, fail);
        MJ_CHECK_GOTO(buf_put(ex, ex->s2 + x * ex->bytes_s2, q2, (size_t)ex->bytes_s2), st, fail);
        mj_experts_scal_fill(scal + x * MJ_EXPERTS_SCAL, w13->weight_scale_2, w13->input_scale, w2->weight_scale_2,
                             w2->input_scale);
    }
    MJ_CHECK_GOTO(buf_put(ex, ex->scal, scal, (size_t)X * MJ_EXPERTS_SCAL * sizeof(float)), st, fail);
    if (gated) MJ_CHECK_GOTO(buf_put(ex, ex->sgate, L->shared_gate, (size_t)H * 2), st, fail);
    free(stage);
    free(scal);
    *out = ex;
    return MJ_OK;
fail:
    free(stage);
    free(scal);
    mj_experts_free(ex);
    return st;
}

void mj_experts_scal_fill(float *sc, float ws13, float in13, float ws2, float in2) {
    /* the template's SCAL layout */
    sc[0] = ws13, sc[1] = in13, sc[2] = ws2, sc[3] = in2;
    sc[4] = 1.0f / in13, sc[5] = 1.0f / in2; /* as mj_nvfp4_quantize_act's gs */
    sc[6] = sc[7] = 0.0f;
}

/* ---- the dispatcher ------------------------------------------------------------------------- */

static int32_t pow2_at_least(int32_t v) {
    int32_t p = 1;
    while (p < v) p *= 2;
    return p;
}

/* Dynamic shared memory of the kernels (bytes), as templates/moe_experts.cu lays it out:
 * UP_RING is its RING_BYTES (a warp's ring), DOWN_RING DRING * DSLOT, QUANT_VALUES the
 * [16 / QG][QT] floats experts_quant stages; up's sums move to shared memory past two token
 * groups (SUMS_SMEM: TPE > 16). */
#define UP_RING (5 * 1024 + 2 * 512)
#define DOWN_RING(dsteps, tpe) (MJ_EXPERTS_DRING * MJ_EXPERTS_DSLOT(dsteps, tpe))
#define QUANT_VALUES(qg) (16 / (uint32_t)(qg) * MJ_EXPERTS_QT * (uint32_t)sizeof(float))

/* Up's: each warp's ring, and with the sums in shared memory each warp's (TPE * 128 bytes)
 * and the chunk's source rows. */
static uint32_t up_smem(const mj_knobs_moe_experts *k) {
    return (uint32_t)(k->NW1 * UP_RING + (k->TPE > 16 ? k->NW1 * k->TPE * 128 + k->TPE * 4 : 0));
}
/* Down's: each warp's fragments (TPE * 64 bytes past one token group where an expert takes
 * several items: at TPE 8, or with the whole expert an item, its sums stay in registers) and
 * its ring, and the sums: each warp's (TPE * 64 bytes, DEAL 0) or
 * the block's slot tile (TPE x (K + NSUB) x 16 floats, DEAL 1);
 * DOWN_BIG the most a block of 8 down warps takes (3 blocks an SM of 228 KiB, each with the
 * system's 1 KiB). */
#define DOWN_BIG (74 * 1024)
static uint32_t down_smem(const mj_knobs_moe_experts *k) {
    const int frag = k->TPE > 8 && k->I > 64 * k->DSTEPS; /* the template's DFRAG */
    return (uint32_t)(k->NW2 * (k->TPE * 64 * (frag + 1 - k->DEAL) + DOWN_RING(k->DSTEPS, k->TPE)) +
                      k->DEAL * k->TPE * (k->K + k->NSUB) * 64);
}
/* What a down block may take: DOWN_BIG with 8 warps, else 48 KiB (no opt-in). */
static uint32_t down_budget(const mj_knobs_moe_experts *k) {
    return k->NW2 == 8 ? DOWN_BIG : MJ_SMEM_DEFAULT_LIMIT;
}

/* The specialization for B tokens: an expert takes up to TPE tokens at once (B rounded up
 * to a power of two: at decode each weight byte is read once), the up blocks split H over
 * up to 8 warps (within 48 KiB of shared memory, no opt-in), and a down block (16 hidden
 * dims) deals its experts to its warps, 4 (within 48 KiB) or 8 (where an SM has 228 KiB;
 * below), so that each warp's chain of experts is a quarter or an eighth as long. */
void mj_experts_knobs(int32_t H, int32_t I, int32_t K, int32_t nsub, mj_weight_mode mode, int32_t B,
                      mj_target target, mj_knobs_moe_experts *out) {
    mj_knobs_moe_experts k = {.MODE = mode == MJ_MODE_W4A4, .H = H, .I = I, .K = K, .NSUB = nsub};
    int32_t tpe = pow2_at_least(B);
    k.TPE = tpe < 8 ? 8 : tpe > 64 ? 64 : tpe;
    int32_t runs = (H / 64 + 3) / 4;
    k.NW1 = 8;
    while (k.NW1 > 1 && (k.NW1 > runs || up_smem(&k) > MJ_SMEM_DEFAULT_LIMIT)) k.NW1 /= 2;
    /* Up at decode (TPE 8, at most 8 tokens): STREAM, a grid of the one-warp blocks the GPU
     * holds at once, each warp an even run of the list of every tile's pieces of H (a tile's
     * pieces' sums added in piece order, whichever warps hold them). GLM-5's 144 tiles at one
     * token are 3168 warps on an H200, each 4 to 6 k-steps; at 8 tokens (about 50 experts) 26
     * k-steps a warp, every SM's warps done together, not 5 rounds of 12 blocks an SM for 4.2
     * rounds of work. One warp a block: the warps share nothing, and 24 of 80 registers fit an
     * SM where blocks of 2 took 12 of 77 (the 80th register spilled). */
    k.STREAM = 0;
    if (k.TPE == 8) k.NW1 = 1, k.STREAM = 1;
    /* W4A4's experts_quant: 8 threads a 16-value group at TPE 8 (a few tokens' rows leave most
     * SMs idle, and a thread's chain of IEEE divisions sets the pace: 2 values each), 2 past it
     * (the groups fill the GPU, and each thread repeats the group's scale) */
    k.QG = k.MODE && k.TPE == 8 ? 8 : 2;
    /* Down: an item of 4 k-steps (a whole scale run); past TPE 8 on targets whose SMs have
     * about 100 KiB of shared memory (sm_120a, sm_121a, sm_86, sm_89), items of 2, which
     * halve the rings (a warp's 7 KiB to 4 KiB): with the larger token tiles' sums, 4 warps
     * then take 24 KiB (TPE 16) or 32 KiB (TPE 32), so 3 to 4 blocks fit an SM, not 2, and
     * the H / 16 blocks of a decode batch run in one round, not two. Down's warps: 4 within
     * 48 KiB (no opt-in). Where an SM has 228 KiB (sm_90a, sm_100a; not sm_80's 164), 8
     * while a block takes at most 74 KiB, so that 3 still fit an SM (W4A16 at TPE 32 with
     * items of 2 k-steps): a decode batch's H / 16 blocks (GLM-5 at TP 8: 384 on 132 SMs)
     * keep twice the warps at work, each with half the chain of experts (a warp's own issue
     * sets down's pace there). */
    k.DSTEPS = !k.MODE && k.TPE > 8 && mj_target_smem_max(target) < 128 * 1024 ? 2 : 4;
    k.NW2 = 4;
    if (mj_target_smem_max(target) >= 3 * (DOWN_BIG + 1024)) { /* a block's 1 KiB of the system's */
        k.NW2 = 8;
        if (down_smem(&k) > DOWN_BIG && !k.MODE) k.DSTEPS = 2;
        if (down_smem(&k) > DOWN_BIG) k.NW2 = 4, k.DSTEPS = 4;
    }
    while (k.NW2 > 1 && down_smem(&k) > down_budget(&k)) k.NW2 /= 2;
    /* Then the experts dealt to the warps by place (even shares, each (token, expert) a slot of
     * the block's tile) where that tile fits the same budget and as many blocks an SM (its
     * shared memory, a block's 1 KiB of the system's); else by id, each warp's sums its own
     * (a block waits for its busiest warp: at GLM-5's B 8 with 8 warps, 11 experts, not 7). */
    if (k.NW2 > 1) {
        const uint32_t sm = (uint32_t)mj_target_smem_max(target) + 1024, by_id = sm / (down_smem(&k) + 1024);
        k.DEAL = 1;
        if (down_smem(&k) > down_budget(&k) || sm / (down_smem(&k) + 1024) < by_id)
            k.DEAL = 0;
    }
    *out = k;
}

static mj_knobs_moe_experts plan(const mj_experts *ex, mj_weight_mode mode, int32_t B) {
    mj_knobs_moe_experts k;
    mj_experts_knobs(ex->H, ex->I, ex->K, ex->nsub, mode, B, ex->target, &k);
    return k;
}

/* Up's STREAM grid for knobs k: the SMs times the blocks an SM holds (regs: the kernel's
 * registers a thread, 0 not known: the most any would leave room for). */
static int32_t up_grid(const mj_experts *ex, const mj_knobs_moe_experts *k, int32_t regs) {
    return ex->sms * mj_experts_up_blocks_sm(mj_target_sm(ex->target), regs, up_smem(k), k->NW1);
}

/* A tile's pieces in up's STREAM plans, the most of any mode the handle may run (upart holds a
 * sum a piece), 0: no plan streams. */
static int32_t up_stream_pieces(const mj_experts *ex) {
    int32_t n = 0;
    for (int m = 0; m < (ex->w4a4 ? 2 : 1); m++) {
        mj_knobs_moe_experts k = plan(ex, m ? MJ_MODE_W4A4 : MJ_MODE_W4A16, 1);
        if (k.STREAM && mj_experts_up_pieces(ex->H, k.NW1, 1) > n) n = mj_experts_up_pieces(ex->H, k.NW1, 1);
    }
    return n;
}

void mj_experts_plan(mj_experts_t ex, mj_weight_mode mode, int32_t B, mj_knobs_moe_experts *out) {
    *out = plan(ex, mode, B);
}

/* On a GPU each kernel is a specialization of its own (templates/moe_experts.cu, PART): a
 * cold compile is one kernel's, and W4A16 never compiles experts_quant. The knobs a kernel
 * does not read are pinned, so specs that differ only in them share one compile (W4A4's
 * experts_quant serves every TPE past 8, its QG 2; TPE 8's has QG 8). The interpreter builds
 * them all at once (PART 0). */
static mj_knobs_moe_experts part_knobs(const mj_knobs_moe_experts *k, int32_t part) {
    mj_knobs_moe_experts p = *k;
    p.PART = part;
    if (part == 1) p.TPE = 8, p.NW1 = 1, p.NW2 = 1, p.DSTEPS = 4, p.STREAM = 0, p.DEAL = 0;
    if (part == 2) p.NW2 = 1, p.DSTEPS = 4, p.DEAL = 0, p.QG = 2;
    if (part == 3) p.STREAM = 0, p.QG = 2;
    if (part == 3) p.NW1 = 1;
    return p;
}

int32_t mj_experts_specs(mj_context_t ctx, const mj_knobs_moe_experts *k, mj_spec out[3]) {
    mj_backend backend = MJ_BACKEND_CUDA;
    mj_context_backend(ctx, &backend, NULL);
    if (backend == MJ_BACKEND_SIM) {
        const mj_knobs_moe_experts all = part_knobs(k, 0);
        mj_spec_moe_experts(ctx, &all, &out[0]);
        return 1;
    }
    int32_t n = 0;
    for (int32_t part = k->MODE ? 1 : 2; part <= 3; part++) {
        mj_knobs_moe_experts p = part_knobs(k, part);
        mj_spec_moe_experts(ctx, &p, &out[n++]);
    }
    return n;
}

/* The functions of a forward with knobs k: experts_quant's (NULL in W4A16), up's, down's. */
static mj_status get_functions(mj_context_t ctx, const mj_knobs_moe_experts *k, const mj_function **quant,
                               const mj_function **up, const mj_function **down) {
    mj_spec s[3];
    const mj_function *f[3] = {NULL, NULL, NULL};
    const int32_t n = mj_experts_specs(ctx, k, s);
    MJ_CHECK(mj_jit_get_many(ctx, s, n, f)); /* cold: the kernels compile side by side */
    *quant = n == 2 ? NULL : f[0]; /* W4A16 on a GPU has no experts_quant */
    *up = n == 1 ? f[0] : f[n - 2];
    *down = f[n - 1];
    return MJ_OK;
}

/* The experts' packed weights (bit-placed below sm_120) and their kernels' shapes are their
 * target's: a context of another target would run kernels that read them wrongly. */
static mj_status same_target(mj_context_t ctx, const mj_experts *ex, const char *who) {
    if (mj_context_target(ctx) == ex->target) return MJ_OK;
    return mj_set_error(MJ_ERR_INVALID_ARG,
                        "%s: these experts were made for %s (their packed weights and kernel shapes are that "
                        "target's) but the context targets %s: use a context of %s, or make the experts again "
                        "with this one",
                        who, mj_target_name(ex->target), mj_target_name(mj_context_target(ctx)),
                        mj_target_name(ex->target));
}

void mj_experts_view_get(mj_experts_t ex, mj_experts_view *v) {
    *v = (mj_experts_view){ex->H, ex->I, ex->K, ex->E, ex->n_local, ex->expert_begin, ex->nsub, ex->mb,
                           ex->bytes_w13, ex->bytes_s13, ex->bytes_w2, ex->bytes_s2, ex->w13, ex->s13, ex->w2,
                           ex->s2, ex->scal, ex->act, ex->actq, ex->act_sf, ex->xq, ex->xsf, ex->sgate,
                           ex->sgate_w, !ex->w4a4, ex->ucount,
                           ex->ucount ? (8 * ex->K < ex->E ? 8 * ex->K : ex->E) + ex->nsub : 0};
}

int32_t mj_experts_up_grid(mj_experts_t ex, const mj_knobs_moe_experts *k, int32_t regs) {
    return k->STREAM ? up_grid(ex, k, regs) : 0;
}

mj_status mj_experts_set_sms(mj_experts_t ex, int32_t sms) {
    if (!ex || sms < 1 || sms > 4096)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_experts_set_sms: %d SMs; 1..4096", sms);
    ex->sms = sms;
    return MJ_OK;
}

mj_status mj_experts_prepare(mj_context_t ctx, mj_experts_t ex, mj_weight_mode mode, int32_t max_batch) {
    if (!ctx || !ex) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_experts_prepare: NULL argument");
    MJ_CHECK(same_target(ctx, ex, "mj_experts_prepare"));
    if (max_batch < 1 || max_batch > ex->mb)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_experts_prepare: max_batch %d must be in 1..%d (the workspace's)",
                            max_batch, ex->mb);
    /* The distinct kernels of every batch size, then all of them at once through
     * mj_jit_get_many's pool. A batch size's knobs are its mode's and its TPE bucket's
     * (mj_experts_knobs), so there are at most 2 modes x 4 buckets x 3 kernels. */
    mj_spec all[2 * 4 * 3];
    const mj_function *f[2 * 4 * 3];
    int32_t n_all = 0;
    for (int32_t B = 1; B <= max_batch; B++) {
        mj_weight_mode m;
        MJ_CHECK(mj_experts_mode(ex, mode, B, &m));
        mj_knobs_moe_experts k = plan(ex, m, B);
        mj_spec s[3];
        const int32_t n = mj_experts_specs(ctx, &k, s);
        for (int32_t i = 0; i < n; i++) {
            int32_t j = 0;
            while (j < n_all && !mj_spec_equal(&all[j], &s[i])) j++;
            if (j < n_all) continue;
            if (n_all == (int32_t)(sizeof all / sizeof all[0]))
                return mj_set_error(MJ_ERR_INTERNAL, "mj_experts_prepare: more than %d distinct kernels", n_all);
            all[n_all++] = s[i];
        }
    }
    MJ_CHECK(mj_jit_get_many(ctx, all, n_all, f));
    return ex->adoption ? mj_adoption_prepare(ctx, ex->adoption) : MJ_OK;
}

void mj_experts_dims(const mj_knobs_moe_experts *k, int32_t B, int32_t n_slots, int32_t up_blocks, void *stream,
                     mj_launch_dims dims[3]) {
    const uint32_t qgroups = MJ_EXPERTS_QT / (uint32_t)k->QG; /* 16-value groups an experts_quant block */
    const mj_launch_dims q = {{(uint32_t)B, (uint32_t)k->K + 1, (uint32_t)((k->H / 16 + qgroups - 1) / qgroups)},
                              {MJ_EXPERTS_QT, 1, 1}, QUANT_VALUES(k->QG), stream};
    const mj_launch_dims u = {{k->STREAM ? (uint32_t)up_blocks : (uint32_t)(k->I / 16),
                               k->STREAM ? 1u : (uint32_t)(n_slots + k->NSUB), 1},
                              {(uint32_t)k->NW1 * 32, 1, 1},
                              up_smem(k), stream};
    const mj_launch_dims d = {{(uint32_t)(k->H / 16), (uint32_t)((B + k->TPE - 1) / k->TPE), 1},
                              {(uint32_t)k->NW2 * 32, 1, 1}, down_smem(k), stream};
    dims[0] = q, dims[1] = u, dims[2] = d;
}

/* ---- a forward ---------------------------------------------------------------------------- */

mj_status mj_experts_forward(mj_context_t ctx, mj_experts_t ex, mj_weight_mode mode, const uint16_t *hidden,
                             const mj_route_outputs *route_in, int32_t B, const int32_t *num_valid, float *out,
                             void *stream) {
    return mj_experts_forward_out(ctx, ex, mode, hidden, route_in, B, num_valid, out, MJ_OUT_F32, stream);
}

mj_status mj_experts_forward_out(mj_context_t ctx, mj_experts_t ex, mj_weight_mode mode, const uint16_t *hidden,
                                 const mj_route_outputs *route_in, int32_t B, const int32_t *num_valid, void *out,
                                 mj_out_type out_type, void *stream) {
    if (!ctx || !ex || !route_in)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_experts_forward: NULL context, experts or route outputs");
    MJ_CHECK(same_target(ctx, ex, "mj_experts_forward"));
    mj_route_outputs r = MJ_ROUTE_OUTPUTS_INIT;
    MJ_CHECK(mj_struct_load(route_in, MJ_ROUTE_OUTPUTS_V1_SIZE, sizeof r, &r, "mj_route_outputs",
                            "MJ_ROUTE_OUTPUTS_INIT"));
    if (B < 0 || B > ex->mb)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "mj_experts_forward: B = %d; these experts' workspace takes 0..%d tokens (raise "
                            "mj_experts_options.max_batch)",
                            B, ex->mb);
    if (ex->adoption) MJ_CHECK(mj_adoption_usable(ex->adoption, "mj_experts_forward"));
    if (B == 0) return MJ_OK;
    if (!hidden || !out || !r.ids || !r.weights || !r.expert_counts || !r.expert_offsets || !r.active_experts ||
        !r.n_active || !r.permutation || !r.row_index)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "mj_experts_forward: NULL hidden, out or route output: the experts read ids, weights, "
                            "expert_counts, expert_offsets, active_experts, n_active, permutation and row_index "
                            "(have mj_route write them all)");
    mj_weight_mode m;
    MJ_CHECK(mj_experts_mode(ex, mode, B, &m));
    mj_knobs_moe_experts k = plan(ex, m, B);
    const mj_function *fq, *fu, *fd;
    MJ_CHECK(get_functions(ctx, &k, &fq, &fu, &fd));
    const int32_t n_slots = (int64_t)B * ex->K < ex->E ? B * ex->K : ex->E;
    const mj_ptxas_report *rep = mj_function_report(fu);
    mj_launch_dims dims[3];
    mj_experts_dims(&k, B, n_slots, k.STREAM ? up_grid(ex, &k, rep ? rep->registers : 0) : 0, stream, dims);
    if (m == MJ_MODE_W4A4) {
        MJ_CHECK(mj_launch_experts_quant(fq, dims[0], hidden, ex->scal, r.ids, r.permutation, B, num_valid, ex->mb,
                                         ex->n_local, ex->expert_begin, ex->xq, ex->xsf));
    }
    MJ_CHECK(mj_launch_experts_up(fu, dims[1], hidden, ex->xq, ex->xsf, ex->w13, ex->s13, ex->w2, ex->s2, ex->scal,
                                  r.expert_counts,
                                  r.expert_offsets, r.active_experts, r.n_active, r.row_index, B, num_valid, ex->mb,
                                  ex->n_local, ex->expert_begin, n_slots, ex->act, ex->actq, ex->act_sf, ex->upart,
                                  ex->ucount, ex->sgate, ex->sgate_w));
    return mj_launch_experts_down(fd, dims[2], ex->act, ex->actq, ex->act_sf, ex->w2, ex->s2, ex->scal, r.expert_counts,
                                  r.expert_offsets, r.active_experts, r.n_active, r.row_index, r.weights, B,
                                  num_valid, ex->mb, ex->n_local, ex->expert_begin, n_slots,
                                  out_type == MJ_OUT_BF16 ? NULL : (float *)out,
                                  out_type == MJ_OUT_BF16 ? (uint16_t *)out : NULL, ex->gated ? ex->sgate_w : NULL);
}
