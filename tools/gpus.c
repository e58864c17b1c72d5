/* gpus.c — the GPUs `moejit inspect --roofline` and `moejit bench` know by name: their peak
 * DRAM bandwidth, which bounds a decode MoE layer from below (it reads its active experts'
 * weights and little else). Vendor figures. */
#include "tools.h"

#include <string.h>

static const tool_gpu k_gpus[] = {
    {"rtx-pro-6000", "RTX PRO 6000 Blackwell (sm_120, 96 GB GDDR7)", 1792.0},
    {"rtx-5090", "GeForce RTX 5090 (sm_120, 32 GB GDDR7)", 1792.0},
    {"gb10", "DGX Spark GB10 (sm_121, 128 GB LPDDR5x)", 273.0},
    {"b200", "B200 (sm_100, 180 GB HBM3e)", 8000.0},
    {"h200", "H200 SXM (sm_90, 141 GB HBM3e)", 4800.0},
    {"h100", "H100 SXM (sm_90, 80 GB HBM3)", 3352.0},
    {"a100", "A100 SXM 80 GB (sm_80, HBM2e)", 2039.0},
    {"l40s", "L40S (sm_89, 48 GB GDDR6)", 864.0},
    {"rtx-4090", "GeForce RTX 4090 (sm_89, 24 GB GDDR6X)", 1008.0},
};

const tool_gpu *tool_gpu_find(const char *name) {
    for (size_t i = 0; name && i < sizeof k_gpus / sizeof k_gpus[0]; i++)
        if (!strcmp(k_gpus[i].name, name)) return &k_gpus[i];
    return NULL;
}

const char *tool_gpu_names(void) {
    return "rtx-pro-6000, rtx-5090, gb10, b200, h200, h100, a100, l40s, rtx-4090";
}

int tool_gpu_count(void) { return (int)(sizeof k_gpus / sizeof k_gpus[0]); }
const tool_gpu *tool_gpu_at(int i) { return i >= 0 && i < tool_gpu_count() ? &k_gpus[i] : NULL; }
