/* nccl_rank.c — one process per GPU: a tensor-parallel MoE layer over NCCL, captured in a
 * CUDA graph and replayed, as a serving engine's decode step would run it.
 *
 *   nccl_rank CHECKPOINT_DIR RANK N_RANKS ID_FILE
 *
 * Start N_RANKS processes (rank 0 .. N_RANKS-1, GPU r for rank r). Rank 0 makes the NCCL
 * unique id and writes it to ID_FILE; the others wait for the file and read it (a real
 * engine passes it through its own launcher, torch.distributed's store, MPI, ...). Every
 * rank loads only its slice of the layer, prepares the batch sizes it will see, captures one
 * forward of the largest batch in a CUDA graph, and replays it for smaller token counts by
 * writing the count to the device (num_valid): no compile, no allocation, no host sync per
 * step. Every rank prints the same checksum. Build: cc nccl_rank.c -lmoejit -lcudart. */
#include <moejit.h>

#include <cuda_runtime.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MJ(call)                                                                          \
    do {                                                                                  \
        mj_status s_ = (call);                                                            \
        if (s_ != MJ_OK) {                                                                \
            fprintf(stderr, "rank %d: %s: %s: %s\n", rank, #call, mj_status_string(s_), mj_last_error()); \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)
#define CU(call)                                                                          \
    do {                                                                                  \
        cudaError_t e_ = (call);                                                          \
        if (e_ != cudaSuccess) {                                                          \
            fprintf(stderr, "rank %d: %s: %s\n", rank, #call, cudaGetErrorString(e_));   \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

static int rank;

/* The id through a file: written to a temporary name and renamed, so a reader sees all of
 * it or nothing. */
static void share_id(const char *path, mj_comm_id *id) {
    if (rank == 0) {
        MJ(mj_comm_nccl_unique_id(id));
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        FILE *f = fopen(tmp, "wb");
        if (!f || fwrite(id, sizeof *id, 1, f) != 1 || fclose(f) || rename(tmp, path)) {
            perror(path);
            exit(1);
        }
        return;
    }
    for (int tries = 0; tries < 600; tries++) {
        FILE *f = fopen(path, "rb");
        if (f) {
            size_t got = fread(id, sizeof *id, 1, f);
            fclose(f);
            if (got == 1) return;
        }
        usleep(100000);
    }
    fprintf(stderr, "rank %d: no NCCL id in %s after 60 s\n", rank, path);
    exit(1);
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s CHECKPOINT_DIR RANK N_RANKS ID_FILE\n", argv[0]);
        return 2;
    }
    rank = atoi(argv[2]);
    const int n = atoi(argv[3]);
    CU(cudaSetDevice(rank));
    mj_comm_id id;
    share_id(argv[4], &id);
    mj_comm_t comm;
    MJ(mj_comm_nccl_init_rank(&id, n, rank, &comm));

    mj_checkpoint_t ck;
    MJ(mj_checkpoint_open(argv[1], &ck));
    mj_moe_config cfg;
    MJ(mj_checkpoint_config(ck, &cfg));
    int32_t layer, nl;
    MJ(mj_checkpoint_moe_layers(ck, &layer, 1, &nl));
    mj_layer_t slice; /* only this rank's rows are read */
    MJ(mj_layer_load(ck, layer, MJ_PAR_TP, rank, n, &slice));

    mj_context_options co = MJ_CONTEXT_OPTIONS_INIT;
    co.device = rank, co.backend = MJ_BACKEND_CUDA;
    mj_context_t ctx;
    MJ(mj_context_create(&co, &ctx));
    mj_moe_options mo = MJ_MOE_OPTIONS_INIT;
    mo.parallel = MJ_PAR_TP, mo.rank = rank, mo.n_ranks = n, mo.comm = comm;
    mj_moe_t moe;
    MJ(mj_moe_create(ctx, slice, &mo, &moe));
    mj_layer_free(slice);
    /* The engine's graph buckets, OEA by batch size. */
    static const int32_t buckets[] = {1, 2, 4, 8, 16, 32};
    mj_moe_prepare_options po = MJ_MOE_PREPARE_OPTIONS_INIT;
    po.batches = buckets, po.n_batches = 6, po.k0_policy = "1-3:8,4-:4";
    MJ(mj_moe_prepare(moe, &po));

    const int B = 32, H = cfg.hidden;
    uint16_t *h_hidden = malloc(sizeof(uint16_t) * B * H);
    float *h_out = malloc(sizeof(float) * B * H);
    srand(7); /* the same tokens on every rank, as tensor parallelism has them */
    for (int i = 0; i < B * H; i++) h_hidden[i] = (uint16_t)(0x3C00 + (rand() & 0x00FF) - 0x80); /* bf16 near 1/128.. */
    uint16_t *hidden;
    float *out;
    int32_t *num_valid;
    CU(cudaMalloc((void **)&hidden, sizeof(uint16_t) * B * H));
    CU(cudaMalloc((void **)&out, sizeof(float) * B * H));
    CU(cudaMalloc((void **)&num_valid, sizeof(int32_t)));
    CU(cudaMemcpy(hidden, h_hidden, sizeof(uint16_t) * B * H, cudaMemcpyHostToDevice));
    cudaStream_t stream;
    CU(cudaStreamCreate(&stream));

    /* Capture one decode step of the bucket B = 32, then replay it for 32, 20 and 5 tokens. */
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CU(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    MJ(mj_moe_forward(moe, hidden, B, num_valid, out, stream));
    CU(cudaStreamEndCapture(stream, &graph));
    CU(cudaGraphInstantiate(&exec, graph, 0));
    static const int32_t counts[] = {32, 20, 5};
    for (int t = 0; t < 3; t++) {
        CU(cudaMemcpyAsync(num_valid, &counts[t], sizeof(int32_t), cudaMemcpyHostToDevice, stream));
        CU(cudaGraphLaunch(exec, stream));
        CU(cudaMemcpyAsync(h_out, out, sizeof(float) * B * H, cudaMemcpyDeviceToHost, stream));
        CU(cudaStreamSynchronize(stream));
        double sum = 0;
        for (int i = 0; i < B * H; i++) sum += h_out[i];
        printf("rank %d: %2d tokens: checksum %.6e\n", rank, counts[t], sum);
    }
    CU(cudaGraphExecDestroy(exec));
    CU(cudaGraphDestroy(graph));
    cudaFree(hidden), cudaFree(out), cudaFree(num_valid);
    cudaStreamDestroy(stream);
    mj_moe_free(moe);
    mj_context_destroy(ctx);
    mj_comm_free(comm);
    mj_checkpoint_close(ck);
    free(h_hidden), free(h_out);
    return 0;
}
