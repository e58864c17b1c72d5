/* run_layer.c — load one MoE layer from a checkpoint and run one forward.
 *
 *   run_layer CHECKPOINT_DIR [LAYER]
 *
 * The kernels run on moejit's CPU interpreter (the same generated kernels a GPU runs, with
 * host buffers), so this runs anywhere; examples/nccl_rank.c is the GPU version, with
 * device buffers, NCCL and a CUDA graph. The batch is 4 tokens of random hidden states; the
 * program prints the routing's active experts and the first outputs, and checks the output
 * against the CPU reference. Build: cc run_layer.c -lmoejit -lm (see the README). */
#include <moejit.h>

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>

#define CHECK(call)                                                                       \
    do {                                                                                  \
        mj_status s_ = (call);                                                            \
        if (s_ != MJ_OK) {                                                                \
            fprintf(stderr, "%s: %s: %s\n", #call, mj_status_string(s_), mj_last_error()); \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s CHECKPOINT_DIR [LAYER]\n", argv[0]);
        return 2;
    }
    /* The checkpoint: its config, and the layer's weights (the whole layer: one rank). */
    mj_checkpoint_t ck;
    CHECK(mj_checkpoint_open(argv[1], &ck));
    mj_moe_config cfg;
    CHECK(mj_checkpoint_config(ck, &cfg));
    int32_t layer, n;
    if (argc > 2) layer = atoi(argv[2]);
    else CHECK(mj_checkpoint_moe_layers(ck, &layer, 1, &n));
    mj_layer_t weights;
    CHECK(mj_layer_load(ck, layer, MJ_PAR_NONE, 0, 1, &weights));

    /* A context on the interpreter, building kernels as for an RTX PRO 6000 (sm_120a). */
    mj_context_options co = MJ_CONTEXT_OPTIONS_INIT;
    co.backend = MJ_BACKEND_SIM, co.device = MJ_DEVICE_NONE, co.target = "sm_120a";
    mj_context_t ctx;
    CHECK(mj_context_create(&co, &ctx));

    /* The layer, prepared for batches of 1..4 tokens with OEA at k0 = 4 (or top-k). */
    mj_moe_t moe;
    CHECK(mj_moe_create(ctx, weights, NULL, &moe));
    mj_moe_prepare_options po = MJ_MOE_PREPARE_OPTIONS_INIT;
    po.max_batch = 4;
    char k0[16];
    snprintf(k0, sizeof k0, "%d", cfg.topk < 4 ? cfg.topk : 4);
    po.k0_policy = k0;
    CHECK(mj_moe_prepare(moe, &po));

    /* One forward. */
    const int B = 4, H = cfg.hidden;
    uint16_t *hidden = malloc(sizeof(uint16_t) * B * H);
    float *out = malloc(sizeof(float) * B * H), *want = malloc(sizeof(float) * B * H);
    srand(1);
    for (int i = 0; i < B * H; i++) {
        float x = (float)rand() / RAND_MAX * 2.0f - 1.0f;
        uint32_t u;
        memcpy(&u, &x, 4);
        hidden[i] = (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16); /* to bf16, rounded */
    }
    CHECK(mj_moe_forward(moe, hidden, B, NULL, out, NULL));
    mj_route_outputs r = MJ_ROUTE_OUTPUTS_INIT;
    CHECK(mj_moe_route_outputs(moe, &r));
    int32_t k0_used;
    mj_weight_mode mode;
    CHECK(mj_moe_batch_plan(moe, B, &k0_used, &mode));
    printf("layer %d on the interpreter (sm_120a): %d tokens, %d active experts (k0 %d, %s)\n", layer, B,
           *r.n_active, k0_used, mode == MJ_MODE_W4A4 ? "W4A4" : "W4A16");
    printf("out[0][0..3] = %.5f %.5f %.5f %.5f\n", out[0], out[1], out[2], out[3]);

    /* The CPU reference of the same layer. */
    CHECK(mj_moe_forward_ref(weights, mode, hidden, B, B, k0_used, want, NULL));
    double num = 0, den = 0;
    for (int i = 0; i < B * H; i++) num += (double)(out[i] - want[i]) * (out[i] - want[i]), den += (double)want[i] * want[i];
    double rel = sqrt(num / (den > 0 ? den : 1));
    printf("relative L2 vs the CPU reference: %.2e\n", rel);

    free(hidden), free(out), free(want);
    mj_moe_free(moe);
    mj_context_destroy(ctx);
    mj_layer_free(weights);
    mj_checkpoint_close(ck);
    return rel <= (mode == MJ_MODE_W4A4 ? 5e-2 : 2e-3) ? 0 : 1;
}
