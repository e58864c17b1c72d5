/* gen.h — the generator: compile targets, specializations (template + knob values +
 * target), rendering a specialization to source, and manifest lines. Depends on base/ and
 * the registry (gen/registry.h) alone: nothing here knows about devices, NVRTC or the cache.
 * Not installed, not public. */
#ifndef MJ_GEN_H
#define MJ_GEN_H

#include "base.h"
#include "registry.h"

#include <stddef.h>
#include <stdint.h>

/* ---- targets (gen/target.c) ---------------------------------------------------------- */
const char *mj_target_name(mj_target t);                /* "sm_120a"                       */
mj_status mj_target_parse(const char *name, mj_target *out); /* "sm_120a" / "120a" / "12.0" */
int mj_target_sm(mj_target t);                          /* 120                             */
/* The most shared memory (bytes) one block may use on the target, after opting in. */
int mj_target_smem_max(mj_target t);
/* Compute capability -> target: 12.0 -> sm_120a, 9.0 -> sm_90a, 8.6 -> sm_86 ... */
mj_status mj_target_from_cc(int major, int minor, mj_target *out);
/* The target kernels are built for when nothing names one: a context with neither a target
 * in its options nor a device (runtime/jit.c), and the `moejit` command's --arch default. */
#define MJ_DEFAULT_TARGET MJ_TARGET_SM120A

/* ---- the registry (gen/registry.c) ----------------------------------------------------
 * The library carries the product templates (build/gen/mj_registry.c). A test program
 * links a second generated table (its fixtures), which adds itself at start-up through
 * mj_registry_extend: its templates are numbered after the product ones. */
int32_t mj_registry_count(void);
/* Template `index` (0..mj_registry_count()-1), or NULL. */
const mj_template_desc *mj_template_at(int32_t index);
const mj_template_desc *mj_template_find(const char *name, int32_t *index);
/* Called once, before any other thread uses the registry. */
void mj_registry_extend(const mj_template_desc *templates, int32_t n);

/* ---- specializations (gen/render.c) --------------------------------------------------- */
/* A specialization: template + knob values + target. Everything that selects a kernel. */
typedef struct mj_spec {
    int32_t tpl;                        /* index into the registry                         */
    mj_target target;
    mj_backend backend;
    int32_t knobs[MJ_MAX_KNOBS];        /* in the template's declaration order; rest 0    */
} mj_spec;

/* Check every knob against its declared range/set, then the template's constraints, and
 * the target against the template's. A violated constraint names itself. */
mj_status mj_spec_validate(const mj_spec *s);
/* Whether two specializations select the same kernel (template, target, backend, knobs). */
int mj_spec_equal(const mj_spec *a, const mj_spec *b);
/* Render the specialization's source (malloc'd, NUL-terminated): a comment header naming
 * every knob and the target, the knobs as #defines, the backend's prelude, the body.
 * Deterministic: same spec, same bytes. */
mj_status mj_render(const mj_spec *s, char **source, size_t *len);
/* One JSON line {"template":..., "knobs":{...}, "arch":...} (malloc'd, no newline). */
mj_status mj_spec_to_json(const mj_spec *s, char **line);
/* Parse such a line; `where` labels errors ("manifest.jsonl:3"). Every knob of the
 * template must be given as an integer, once, and nothing else. */
mj_status mj_spec_from_json(const char *line, const char *where, mj_spec *out);
/* "router_gemm H=6144 E=256 ROWS=8 NWARPS=4 sm_120a" for messages (buf of at least 256
 * bytes). */
const char *mj_spec_describe(const mj_spec *s, char *buf, size_t len);

/* ---- knob constraints (gen/constraint.c) ----------------------------------------------
 * A template declares cross-knob rules as C integer expressions over its knobs,
 * MJ_CONSTRAINT("K0 <= K", "phase 1 cannot take more experts than top-k"). The same small
 * evaluator checks them at build time (mj_reflect: they parse and name only knobs) and at
 * render time (mj_spec_validate). Besides the knobs, the name SM is the target's sm number
 * (120 for sm_120a), for rules such as "MODE == 0 || SM >= 120". Operators: ( ) ! - * / % + - << >> < <= > >= == != & ^ |
 * && ||, integer literals, knob names; 64-bit arithmetic, division by zero is an error. */
/* Evaluate expr with knob values; *value gets the result. Returns 0 on success, else -1 and
 * a message in err. */
int mj_constraint_eval(const char *expr, const char *const *names, const int32_t *values, int n,
                       int64_t *value, char *err, size_t err_len);

#endif /* MJ_GEN_H */
