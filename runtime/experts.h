/* experts.h — the expert kernels' host side, as tests and tools see it (runtime/experts.c).
 * Not public. */
#ifndef MJ_EXPERTS_H
#define MJ_EXPERTS_H

#include "jit.h"
#include "mj_kernels.h"

/* Everything a packed experts handle holds: dimensions, the packed weights and the forward
 * workspace (host pointers on the interpreter, device pointers on a GPU). Routed rows of
 * the activations are [0, mb K), shared sub-expert j's are mb K + j mb + token; the W4A4
 * quantized input of the shared experts is at row mb K + token. */
#define MJ_EXPERTS_SCAL 8 /* floats of scal an expert: templates/moe_experts.cu's SCAL layout */
/* experts_down's ring, templates/moe_experts.cu's DRING and DSLOT: items a warp's ring holds
 * (DRING - 2 in flight while one computes) and the bytes of one (DSTEPS k-steps of w2, a scale
 * chunk, the top-k entries of the expert's first rows in the token tile:
 * all 16 at TPE 16, else 8, one token group). test_experts holds them against the template. */
#define MJ_EXPERTS_DRING 3
#define MJ_EXPERTS_DSLOT(dsteps, tpe) ((dsteps) * 512 + 256 + 4 * ((tpe) == 16 ? 16 : 8))
/* experts_up's k-steps a piece (the template's SPP): runs of 4 where a tile's runs deal
 * evenly to its NW1 warps (without STREAM) or its last run is 1 or 2 k-steps (H / 64 modulo
 * 4), else half-runs (2). */
static inline int32_t mj_experts_up_spp(int32_t H, int32_t nw1, int32_t stream) {
    const int32_t ks = H / 64, runs = (ks + 3) / 4;
    return (stream || runs % nw1 != 0) && ks % 4 != 1 && ks % 4 != 2 ? 2 : 4;
}
/* A tile's pieces (the template's PIECES1). */
static inline int32_t mj_experts_up_pieces(int32_t H, int32_t nw1, int32_t stream) {
    const int32_t spp = mj_experts_up_spp(H, nw1, stream);
    return (H / 64 + spp - 1) / spp;
}

/* experts_up's k-steps for its busiest warp without STREAM: a tile's H / 64 k-steps in pieces
 * of mj_experts_up_spp, dealt to the warps in turn, a short last piece counted whole (its loop
 * runs the step, the MMAs skipped). With STREAM a block's run is ceil(pieces / blocks) of the
 * list of every tile's pieces, dealt to its warps the same way. */
static inline int32_t mj_experts_up_steps(int32_t H, int32_t nw1) {
    const int32_t spp = mj_experts_up_spp(H, nw1, 0);
    return (mj_experts_up_pieces(H, nw1, 0) + nw1 - 1) / nw1 * spp;
}

/* n blocks of nw1 warps an SM, fewer so that their warps are a multiple of the SM's 4
 * schedulers where that leaves any: STREAM's runs are even, so the scheduler with one warp
 * more would set the pace (25 warps an SM are 7 on one). The grid's rule and the model's. */
static inline int32_t mj_experts_stream_round(int32_t n, int32_t nw1) {
    if (n * nw1 > 4 && (n * nw1) % 4) n -= ((n * nw1) % 4 + nw1 - 1) / nw1;
    return n < 1 ? 1 : n;
}

/* experts_up's blocks an SM, for STREAM's grid (the SMs times this: every block resident at
 * once, none waiting for a second round) and the model (pm_stream_launch): what a block's registers a thread
 * (0: not known, as on the interpreter), its shared memory (bytes, with 1 KiB a block the
 * system's) and nw1 warps leave room for. The limits an SM by compute capability sm (the CUDA
 * C++ Programming Guide's table): 65536 registers, allocated by 256 a warp; 8.0: 164 KiB, 64
 * warps, 32 blocks; 8.6: 100 KiB, 48 warps, 16 blocks; 8.9 and 12.x: 100 KiB, 48, 24; 9.0 and
 * 10.0: 228 KiB, 64, 32 (tools/gpus.c holds the same per GPU). */
static inline int32_t mj_experts_up_blocks_sm(int sm, int32_t regs, int64_t smem, int32_t nw1) {
    const int big = sm == 90 || sm == 100;
    const int64_t smem_sm = (sm == 80 ? 164 : big ? 228 : 100) * 1024LL;
    int32_t n = sm == 86 ? 16 : sm == 80 || big ? 32 : 24;
    const int32_t warps = sm == 80 || big ? 64 : 48;
    if (warps / nw1 < n) n = warps / nw1;
    if (regs > 0) {
        const int32_t rw = (regs * 32 + 255) / 256 * 256;
        if (65536 / (rw * nw1) < n) n = 65536 / (rw * nw1);
    }
    if (smem_sm / (smem + 1024) < n) n = (int32_t)(smem_sm / (smem + 1024));
    return mj_experts_stream_round(n, nw1);
}
/* The SMs the interpreter's STREAM grid is sized for: a small GPU, so that the tests' shapes
 * split tiles over blocks and runs over tiles. */
#define MJ_EXPERTS_SIM_SMS 1
#define MJ_EXPERTS_QT 64 /* experts_quant's threads a block, the template's QT */
typedef struct mj_experts_view {
    int32_t H, I, K, E, n_local, expert_begin, nsub, mb;
    int64_t bytes_w13, bytes_s13, bytes_w2, bytes_s2; /* one packed expert */
    uint8_t *w13, *s13, *w2, *s2;
    float *scal;                                      /* [n_local + nsub][MJ_EXPERTS_SCAL] */
    uint16_t *act;
    uint8_t *actq, *act_sf, *xq, *xsf;
    uint16_t *sgate;                                  /* [H] bf16 shared-expert gate, or NULL */
    float *sgate_w;                                   /* [mb] its weights (workspace), or NULL */
    int placed;                                       /* the code words are bit-placed for W4A16
                                                         (mj_pack_place_word): the target has no
                                                         FP4 MMA (sm below 120, the kernels'
                                                         MJ_TARGET_SM < 120) */
    uint32_t *ucount;                                 /* up's STREAM counters, [ucount_tiles][I / 16]
                                                         (0 between forwards), or NULL */
    int32_t ucount_tiles;
} mj_experts_view;
void mj_experts_view_get(mj_experts_t ex, mj_experts_view *out);
/* Up's STREAM grid for knobs k (0 without STREAM): the SMs the handle was made for times the
 * blocks an SM holds (regs: the kernel's registers a thread, 0: not known). */
int32_t mj_experts_up_grid(mj_experts_t ex, const mj_knobs_moe_experts *k, int32_t regs);
/* Size up's STREAM grid for sms SMs (tests: the interpreter's runs over grids of any size). */
mj_status mj_experts_set_sms(mj_experts_t ex, int32_t sms);

/* Grow the forward's workspace to max_batch tokens (nothing when it is that big already).
 * On failure the handle has no workspace (a forward of any B > 0 is refused) until a
 * reserve succeeds. Not during a captured graph's life: the buffers move. */
mj_status mj_experts_reserve(mj_experts_t ex, int32_t max_batch);

/* The knobs of a forward of B tokens in (resolved) mode (PART 0; mj_experts_specs turns
 * them into the specializations fetched); mj_experts_knobs is the same choice from the
 * shapes alone (H, I_local, top-k, shared sub-experts) and the target, for the planner. */
/* mj_experts_forward with the output's type: MJ_OUT_F32 (out: float [B, H]) or MJ_OUT_BF16
 * (out: bf16 [B, H], written by experts_down from the same f32 sums, rounded to nearest even). */
mj_status mj_experts_forward_out(mj_context_t ctx, mj_experts_t ex, mj_weight_mode mode, const uint16_t *hidden,
                                 const mj_route_outputs *route_in, int32_t B, const int32_t *num_valid, void *out,
                                 mj_out_type out_type, void *stream);

void mj_experts_knobs(int32_t H, int32_t I, int32_t K, int32_t nsub, mj_weight_mode mode, int32_t B,
                      mj_target target, mj_knobs_moe_experts *out);
/* The specializations a forward with knobs k (from mj_experts_knobs) fetches, into out[],
 * in launch order; returns how many: on a GPU one per kernel (templates/moe_experts.cu,
 * PART: experts_quant in W4A4 only, experts_up, experts_down), on the interpreter one
 * holding all three. The forward, mj_experts_prepare and the planner all ask this. */
int32_t mj_experts_specs(mj_context_t ctx, const mj_knobs_moe_experts *k, mj_spec out[3]);
/* The launches of a forward with knobs k of B tokens (n_slots: min(B K, E)) on stream:
 * dims[0] experts_quant's (W4A4 only), [1] experts_up's, [2] experts_down's; up_blocks: up's
 * grid with STREAM (the GPU's SMs times mj_experts_up_blocks_sm), else unread. The forward
 * launches these, and the performance model (tools/predict_plan.c) reads them. */
void mj_experts_dims(const mj_knobs_moe_experts *k, int32_t B, int32_t n_slots, int32_t up_blocks, void *stream,
                     mj_launch_dims dims[3]);
/* The mode policy ("w4a16", "1-8:w4a16,9-:w4a4"): parsed for a target (w4a4 needs sm_120+),
 * its default there, and the mode a batch of B takes (MJ_MODE_AUTO by the policy; an
 * explicit mode checked against the target). */
#define MJ_MODE_POLICY_MAX_RULES 16
typedef struct mj_mode_policy {
    int32_t n_rules;
    mj_rule rules[MJ_MODE_POLICY_MAX_RULES];
} mj_mode_policy;
mj_status mj_mode_policy_parse(const char *text, mj_target target, mj_mode_policy *out);
const char *mj_mode_policy_default(mj_target target);
mj_status mj_mode_resolve(const mj_mode_policy *p, mj_target target, mj_weight_mode mode, int32_t B,
                          mj_weight_mode *resolved);

void mj_experts_plan(mj_experts_t ex, mj_weight_mode mode, int32_t B, mj_knobs_moe_experts *out);

/* ---- handles made from other weights than a layer's (runtime/adopt.c) ----------------------
 * mj_experts_new makes a handle of these shapes with its scalars (uninitialized on a GPU)
 * and workspace but no weights; mj_experts_alloc_weights gives it buffers of its own for
 * some of w13, s13, w2, s2 (MJ_EXPERTS_OWN_*, freed with it), mj_experts_bind points the
 * others at someone else's memory (never freed) and attaches the adoption record, which
 * mj_experts_free frees with mj_adoption_free. mj_experts_scal_fill writes one expert's
 * MJ_EXPERTS_SCAL scalars. */
typedef struct mj_experts_shape {
    int32_t H, I, K, E, n_local, expert_begin, nsub;
    int32_t gated;             /* the shared expert (nsub > 0) has a sigmoid gate: its [H] bf16
                                  buffer and a [mb] f32 workspace for its weights */
} mj_experts_shape;
#define MJ_EXPERTS_OWN_W13 1u
#define MJ_EXPERTS_OWN_S13 2u
#define MJ_EXPERTS_OWN_W2 4u
#define MJ_EXPERTS_OWN_S2 8u
#define MJ_EXPERTS_OWN_ALL 15u
typedef struct mj_adoption mj_adoption;
mj_status mj_experts_new(mj_context_t ctx, const mj_experts_shape *sh, const mj_experts_options *opts,
                         const char *who, mj_experts_t *out);
mj_status mj_experts_alloc_weights(mj_experts_t ex, unsigned which);
void mj_experts_bind(mj_experts_t ex, uint8_t *w13, uint8_t *s13, uint8_t *w2, uint8_t *s2, mj_adoption *a);
mj_adoption *mj_experts_adoption(mj_experts_t ex);
int mj_experts_device(mj_experts_t ex);
/* Bytes where the kernels run this handle allocated: scalars, workspace, its own weights. */
int64_t mj_experts_bytes_allocated(mj_experts_t ex);
void mj_experts_scal_fill(float *sc, float ws13, float in13, float ws2, float in2);
/* adopt.c's side: free the record (NULL is fine); compile its dispatch kernel (prepare);
 * whether a forward may run (not after mj_experts_release). */
void mj_adoption_free(int device, mj_adoption *a);
mj_status mj_adoption_prepare(mj_context_t ctx, mj_adoption *a);
mj_status mj_adoption_usable(const mj_adoption *a, const char *who);

#endif
