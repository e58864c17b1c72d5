/* gpus.c — the GPUs `moejit inspect --roofline` and `moejit bench` (its floors and its
 * --predict model, tools/predict.c) know by name.
 *
 * Sources (public figures; what is not published is marked "assumed"):
 *   bandwidth, SMs, boost clock: NVIDIA's product pages and datasheets (H200, H100 SXM, A100
 *     SXM 80 GB, L40S, B200 / HGX B200, RTX PRO 6000 Blackwell Workstation, GeForce RTX 5090
 *     and 4090, DGX Spark), and the architecture whitepapers (GH100: 132 SMs on the SXM part;
 *     GB202: 188 SMs on the RTX PRO 6000, 170 on the 5090; AD102: 142 on the L40S, 128 on the
 *     4090; GA100: 108). B200's SM count (148) and clock are from NVIDIA's Blackwell
 *     architecture technical brief and public spec sheets, the clock approximate; GB10's
 *     48 SMs (6144 CUDA cores) from DGX Spark's page, its clock assumed.
 *   per-SM limits (registers, shared memory for blocks, warps, blocks): the CUDA C++
 *     Programming Guide, "Features and Technical Specifications" by compute capability
 *     (8.0: 164 KiB, 64 warps, 32 blocks; 8.9 / 12.x: 100 KiB, 48 warps, 24 blocks; 9.0 /
 *     10.0: 228 KiB, 64 warps, 32 blocks; 65536 registers each).
 *   integer pipe: a scheduler issues 16 lanes of INT32 a cycle on Ampere, Ada and Hopper (the
 *     throughput table of the same guide: 64 results per SM per cycle for 32-bit integer add/
 *     logic against 128 FP32), so half a warp-instruction; Blackwell's GB202 cores run INT32 or
 *     FP32 (RTX Blackwell whitepaper): a whole one. B200 is kept at the half rate (assumed:
 *     not published for sm_100).
 *   copy bandwidth: measured only on the H200 (bench/results/2026-12-04-h200-*: 4189 GB/s,
 *     0.87 of peak); others get pm_assume's copy_fraction of the peak.
 *   L2 cache: the architecture whitepapers (H100 SXM: 50 MB; A100: 40 MB; AD102 parts: 96 MB on
 *     the L40S, 72 MB on the 4090; GB202: 128 MB whole on the RTX PRO 6000, 96 MB on the 5090);
 *     the H200's 60 MiB as its CUDA driver reported it in our run of 2026-12-04
 *     (bench/results/2026-12-04-h200-by-id, gpu.l2_bytes); B200's 126 MB as measured by Chips
 *     and Cheese ("Nvidia's B200: Keeping the CUDA Juggernaut Rolling", 2025); GB10's is not
 *     published: 24 MB assumed. The model uses it only to tell whether what up prefetched for
 *     down can still be in L2 when down runs.
 *   DRAM latency of a dependent load, with the GPU busy: assumed. Pointer-chasing
 *     microbenchmarks published for Volta to Hopper put an idle HBM access at roughly
 *     450-600 ns; the H200's down kernel (a dependent chain per expert) measured ~2.8 µs per
 *     chain of 4-5 loads, about 600 ns each, which is what HBM parts use here. GDDR parts are
 *     assumed a little slower (700 ns); LPDDR5x (GB10) 800 ns. */
#include "tools.h"

#include <stdio.h>
#include <string.h>

static const tool_gpu k_gpus[] = {
    /* name, desc, peak GB/s, arch, SMs, MHz, copy, int, lat ns, regs, smem, warps, blocks, L2 MiB,
     * what the CUDA driver's device name holds */
    {"rtx-pro-6000", "RTX PRO 6000 Blackwell (sm_120, 96 GB GDDR7)", 1792.0, "sm_120a", 188, 2617, 0, 1.0, 700,
     65536, 100 * 1024, 48, 24, 128, "RTX PRO 6000"},
    {"rtx-5090", "GeForce RTX 5090 (sm_120, 32 GB GDDR7)", 1792.0, "sm_120a", 170, 2407, 0, 1.0, 700, 65536,
     100 * 1024, 48, 24, 96, "RTX 5090"},
    {"gb10", "DGX Spark GB10 (sm_121, 128 GB LPDDR5x)", 273.0, "sm_121a", 48, 2400, 0, 1.0, 800, 65536, 100 * 1024,
     48, 24, 24, "GB10"},
    {"b200", "B200 (sm_100, 180 GB HBM3e)", 8000.0, "sm_100a", 148, 1965, 0, 0.5, 600, 65536, 228 * 1024, 64, 32,
     126, "B200"},
    {"h200", "H200 SXM (sm_90, 141 GB HBM3e)", 4800.0, "sm_90a", 132, 1980, 4189.0, 0.5, 600, 65536, 228 * 1024, 64,
     32, 60, "H200"},
    {"h100", "H100 SXM (sm_90, 80 GB HBM3)", 3352.0, "sm_90a", 132, 1980, 0, 0.5, 600, 65536, 228 * 1024, 64, 32, 50, "H100"},
    {"a100", "A100 SXM 80 GB (sm_80, HBM2e)", 2039.0, "sm_80", 108, 1410, 0, 0.5, 600, 65536, 164 * 1024, 64, 32, 40, "A100"},
    {"l40s", "L40S (sm_89, 48 GB GDDR6)", 864.0, "sm_89", 142, 2520, 0, 0.5, 700, 65536, 100 * 1024, 48, 24, 96, "L40S"},
    {"rtx-4090", "GeForce RTX 4090 (sm_89, 24 GB GDDR6X)", 1008.0, "sm_89", 128, 2520, 0, 0.5, 700, 65536,
     100 * 1024, 48, 24, 72, "RTX 4090"},
};

const tool_gpu *tool_gpu_find(const char *name) {
    for (size_t i = 0; name && i < sizeof k_gpus / sizeof k_gpus[0]; i++)
        if (!strcmp(k_gpus[i].name, name)) return &k_gpus[i];
    return NULL;
}

const tool_gpu *tool_gpu_for_device(const char *device_name) {
    for (size_t i = 0; device_name && i < sizeof k_gpus / sizeof k_gpus[0]; i++)
        if (strstr(device_name, k_gpus[i].device)) return &k_gpus[i];
    return NULL;
}

const char *tool_gpu_names(void) {
    static char names[256];
    if (!names[0])
        for (size_t i = 0, n = 0; i < sizeof k_gpus / sizeof k_gpus[0] && n < sizeof names; i++)
            n += (size_t)snprintf(names + n, sizeof names - n, "%s%s", i ? ", " : "", k_gpus[i].name);
    return names;
}

int tool_gpu_count(void) { return (int)(sizeof k_gpus / sizeof k_gpus[0]); }
const tool_gpu *tool_gpu_at(int i) { return i >= 0 && i < tool_gpu_count() ? &k_gpus[i] : NULL; }
