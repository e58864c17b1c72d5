/* fuzz_k0_policy.c — the per-batch-size k0 policy, mj_k0_policy_parse and
 * mj_k0_policy_resolve (runtime/route.c).
 *
 * Input: one byte for top-k (1..32), then the policy text.
 *
 * Invariants:
 *   - failure: invalid argument, a message, *out untouched; top-k 0 always fails;
 *   - success: 1..MJ_K0_POLICY_MAX_RULES rules, each 1 <= lo <= hi with k0 in 1..topk, no
 *     two overlapping;
 *   - resolve, for every B in 1..4096 and a few large ones, succeeds exactly when a rule
 *     covers B, with that rule's k0 (so in 1..topk);
 *   - a larger top-k accepts the same text as the same policy;
 *   - round trip: the rules written back as "LO-HI:K0,..." parse to the same policy.
 */
#include "fuzz.h"

#include <limits.h>

static int covering(const mj_k0_policy *p, int32_t B) {
    for (int32_t i = 0; i < p->n_rules; i++)
        if (B >= p->rules[i].b_lo && B <= p->rules[i].b_hi) return i;
    return -1;
}

static void check_resolve(const mj_k0_policy *p, int32_t topk, int32_t B) {
    int32_t k0 = -12345;
    mj_status st = mj_k0_policy_resolve(p, B, &k0);
    int r = covering(p, B);
    if (r < 0) {
        FUZZ_CHECK(st == MJ_ERR_INVALID_ARG && k0 == -12345, "B=%d, no rule covers it, resolve -> %s k0=%d", B,
                   mj_status_string(st), k0);
        return;
    }
    FUZZ_CHECK(st == MJ_OK, "B=%d is covered by rule %d, resolve -> %s", B, r + 1, mj_status_string(st));
    FUZZ_CHECK(k0 >= 1 && k0 <= topk, "B=%d -> k0 %d, top-k %d", B, k0, topk);
    FUZZ_CHECK(k0 == p->rules[r].k0, "B=%d -> k0 %d, its rule says %d", B, k0, p->rules[r].k0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    int32_t topk = 1 + data[0] % 32;
    char *text = fuzz_cstr(data + 1, size - 1);
    mj_k0_policy p, q;
    memset(&p, 0x5A, sizeof p);
    mj_clear_error();
    mj_status st = mj_k0_policy_parse(text, topk, &p);
    FUZZ_CHECK(mj_k0_policy_parse(text, 0, &q) == MJ_ERR_INVALID_ARG, "top-k 0 accepted");
    if (st != MJ_OK) {
        FUZZ_CHECK(st == MJ_ERR_INVALID_ARG, "failed with %s", mj_status_string(st));
        FUZZ_CHECK(mj_last_error()[0] != '\0', "failure without a message");
        FUZZ_CHECK(fuzz_all_bytes(&p, sizeof p, 0x5A), "failure wrote to *out");
        free(text);
        return 0;
    }
    FUZZ_CHECK(p.n_rules >= 1 && p.n_rules <= MJ_K0_POLICY_MAX_RULES, "%d rules", p.n_rules);
    for (int32_t i = 0; i < p.n_rules; i++) {
        FUZZ_CHECK(p.rules[i].b_lo >= 1 && p.rules[i].b_lo <= p.rules[i].b_hi, "rule %d: %d..%d", i + 1,
                   p.rules[i].b_lo, p.rules[i].b_hi);
        FUZZ_CHECK(p.rules[i].k0 >= 1 && p.rules[i].k0 <= topk, "rule %d: k0 %d, top-k %d", i + 1, p.rules[i].k0, topk);
        for (int32_t j = 0; j < i; j++)
            FUZZ_CHECK(p.rules[i].b_hi < p.rules[j].b_lo || p.rules[i].b_lo > p.rules[j].b_hi,
                       "rules %d and %d overlap", j + 1, i + 1);
    }
    for (int32_t B = 1; B <= 4096; B++) check_resolve(&p, topk, B);
    const int32_t big[] = {0, -1, INT32_MIN, 65535, 65536, 1 << 20, INT32_MAX - 1, INT32_MAX};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) check_resolve(&p, topk, big[i]);
    /* No rule covers B <= 0 (every lo is >= 1), so those must fail: covered by check_resolve. */

    memset(&q, 0x5A, sizeof q);
    FUZZ_CHECK(mj_k0_policy_parse(text, topk + 7, &q) == MJ_OK, "a larger top-k refuses it");
    FUZZ_CHECK(memcmp(&p, &q, sizeof p) == 0, "a larger top-k reads it differently");

    char canon[16 * 40] = "";
    size_t n = 0;
    for (int32_t i = 0; i < p.n_rules; i++) {
        if (p.rules[i].b_hi == INT32_MAX)
            n += (size_t)snprintf(canon + n, sizeof canon - n, "%s%d-:%d", i ? "," : "", p.rules[i].b_lo, p.rules[i].k0);
        else
            n += (size_t)snprintf(canon + n, sizeof canon - n, "%s%d-%d:%d", i ? "," : "", p.rules[i].b_lo,
                                  p.rules[i].b_hi, p.rules[i].k0);
    }
    memset(&q, 0x5A, sizeof q);
    FUZZ_CHECK(mj_k0_policy_parse(canon, topk, &q) == MJ_OK, "'%s' (from '%s') does not parse", canon, text);
    FUZZ_CHECK(memcmp(&p, &q, sizeof p) == 0, "'%s' (from '%s') parses differently", canon, text);
    free(text);
    return 0;
}
