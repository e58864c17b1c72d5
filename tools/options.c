/* options.c — the plan that `moejit bench` and `moejit prewarm` list: their --batch, --k0-policy
 * and --mode, parsed the same way, then mj_plan_build. */
#include "tools.h"
#include "moejit_private.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int tool_config_read(const char *config, const char *quant, mj_moe_config *cfg) {
    /* Without --quant, hf_quant_config.json beside config.json (as a checkpoint has it) when
     * config.json has no quantization_config of its own. */
    char beside[4096];
    if (!quant) {
        const char *slash = strrchr(config, '/');
        int dl = slash ? (int)(slash - config) + 1 : 0;
        snprintf(beside, sizeof beside, "%.*shf_quant_config.json", dl, config);
        struct stat sb;
        if (stat(beside, &sb) == 0 && S_ISREG(sb.st_mode)) quant = beside;
    }
    mj_status st = mj_moe_config_read(config, quant, cfg);
    if (st == MJ_OK && cfg->quant != MJ_QUANT_NVFP4)
        return tool_fail("%s: no NVFP4 quantization: moejit runs ModelOpt NVFP4 checkpoints; give the checkpoint's "
                         "hf_quant_config.json with --quant (or put it beside config.json)",
                         config);
    if (st != MJ_OK) return tool_fail_status(config, st);
    return 0;
}

int tool_plan_build(const char *cmd, mj_context_t ctx, const mj_moe_config *cfg, mj_parallel par, int n_ranks,
                    int shared, const char *batch, const char *k0_policy, const char *mode_text,
                    const char *config, mj_plan *plan, int32_t *n_batches) {
    int32_t *bs = NULL, nb = 0;
    int rc = 0;
    mj_k0_policy k0;
    mj_mode_policy modes;
    const char *policy;
    const mj_weight_mode mode = tool_mode_parse(mode_text, &policy);
    const mj_target t = mj_context_target(ctx);
    const char *arch = mj_target_name(t);
    plan->n = 0, plan->e = NULL;
    if (mj_batches_parse(batch, &bs, &nb) != MJ_OK) {
        rc = tool_usage(cmd, "--batch: %s", mj_last_error());
        goto out;
    }
    if (k0_policy && mj_k0_policy_parse(k0_policy, cfg->topk, &k0) != MJ_OK) {
        rc = tool_usage(cmd, "--k0-policy: %s", mj_last_error());
        goto out;
    }
    if (mj_mode_policy_parse(policy ? policy : mj_mode_policy_default(t), t, &modes) != MJ_OK) {
        rc = tool_fail("--mode for %s: %s", arch, mj_last_error());
        goto out;
    }
    mj_plan_request req = {cfg, par, n_ranks, -1, bs, nb, k0_policy ? &k0 : NULL, mode, &modes, shared};
    if (mj_plan_build(ctx, &req, plan) != MJ_OK) {
        rc = config ? tool_fail("the plan of %s for %s: %s", config, arch, mj_last_error())
                    : tool_fail("the plan for %s: %s", arch, mj_last_error());
        goto out;
    }
    if (n_batches) *n_batches = nb;
out:
    free(bs);
    return rc;
}
