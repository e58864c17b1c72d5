/* fuzz_manifest.c — one prewarm manifest line, mj_spec_from_json (gen/render.c), against the
 * product templates and the test fixtures (linked in: more knob kinds, templates without
 * knobs, fewer targets).
 *
 * Invariants:
 *   - failure: a parse / invalid-argument / unsupported status with a message, *out
 *     untouched;
 *   - success: the spec validates, names a registered template, leaves the knob slots past
 *     the template's zero, and has a known backend;
 *   - round trip: mj_spec_to_json, then mj_spec_from_json, gives the same spec, and writing
 *     that again gives the same line;
 *   - a valid spec renders, twice to the same bytes, and the source names its target.
 */
#include "fuzz.h"
#include "gen.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *line = fuzz_cstr(data, size);
    mj_spec s, s2;
    memset(&s, 0x5A, sizeof s);
    mj_clear_error();
    mj_status st = mj_spec_from_json(line, "fuzz.jsonl:1", &s);
    free(line);
    if (st != MJ_OK) {
        FUZZ_CHECK(st == MJ_ERR_PARSE || st == MJ_ERR_INVALID_ARG || st == MJ_ERR_UNSUPPORTED,
                   "failed with %s", mj_status_string(st));
        FUZZ_CHECK(mj_last_error()[0] != '\0', "failure without a message");
        FUZZ_CHECK(fuzz_all_bytes(&s, sizeof s, 0x5A), "failure wrote to *out");
        return 0;
    }
    FUZZ_CHECK(mj_spec_validate(&s) == MJ_OK, "accepted an invalid spec: %s", mj_last_error());
    const mj_template_desc *t = mj_template_at(s.tpl);
    FUZZ_CHECK(t != NULL, "template index %d", s.tpl);
    for (int i = t->n_knobs; i < MJ_MAX_KNOBS; i++) FUZZ_CHECK(s.knobs[i] == 0, "knob slot %d = %d", i, s.knobs[i]);
    FUZZ_CHECK(s.backend == MJ_BACKEND_CUDA || s.backend == MJ_BACKEND_SIM, "backend %d", (int)s.backend);

    char *out = NULL, *out2 = NULL;
    FUZZ_CHECK(mj_spec_to_json(&s, &out) == MJ_OK && out, "a valid spec does not write: %s", mj_last_error());
    memset(&s2, 0x5A, sizeof s2);
    FUZZ_CHECK(mj_spec_from_json(out, "roundtrip", &s2) == MJ_OK, "'%s' does not read back: %s", out, mj_last_error());
    FUZZ_CHECK(memcmp(&s, &s2, sizeof s) == 0, "'%s' reads back as a different spec", out);
    FUZZ_CHECK(mj_spec_to_json(&s2, &out2) == MJ_OK && !strcmp(out, out2), "'%s' then '%s'", out, out2);

    char *src = NULL, *src2 = NULL;
    size_t n = 0, n2 = 0;
    FUZZ_CHECK(mj_render(&s, &src, &n) == MJ_OK, "'%s' does not render: %s", out, mj_last_error());
    FUZZ_CHECK(mj_render(&s, &src2, &n2) == MJ_OK && n == n2 && !memcmp(src, src2, n), "'%s' renders differently twice", out);
    FUZZ_CHECK(strlen(src) == n, "rendered length %zu, strlen %zu", n, strlen(src));
    char want[64];
    snprintf(want, sizeof want, "#define MJ_TARGET_SM %d\n", mj_target_sm(s.target));
    FUZZ_CHECK(strstr(src, want) != NULL, "'%s': the source does not say %s", out, want);
    free(src), free(src2), free(out), free(out2);
    return 0;
}
