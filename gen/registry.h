/* registry.h — what the build-time reflection tool (gen/reflect.c, libclang) knows about
 * each kernel template, as C data. The tool writes build/gen/mj_registry.c (the tables
 * below, with the template bodies and preludes embedded as strings) and
 * build/gen/mj_kernels.h (template and kernel ids, typed knob structs and one typed launch
 * wrapper per kernel). Nothing reads template files at run time. */
#ifndef MJ_REGISTRY_H
#define MJ_REGISTRY_H

#include <stdint.h>

#define MJ_MAX_KNOBS 16
#define MJ_MAX_KNOB_VALUES 32
#define MJ_MAX_PARAMS 32
#define MJ_MAX_KERNELS 8       /* kernels a template may define (checked by mj_reflect)   */
#define MJ_MAX_CONSTRAINTS 16  /* MJ_CONSTRAINT lines a template may declare              */

/* The compile targets: the one table. X(ENUM SUFFIX, name, sm number, the most shared memory
 * one block may use after opting in, in bytes). Bit i of a target mask is target i, in this
 * order. */
#define MJ_TARGET_TABLE(X)                  \
    X(SM80, "sm_80", 80, 166912)            \
    X(SM86, "sm_86", 86, 101376)            \
    X(SM89, "sm_89", 89, 101376)            \
    X(SM90A, "sm_90a", 90, 232448)          \
    X(SM100A, "sm_100a", 100, 232448)       \
    X(SM120A, "sm_120a", 120, 101376)       \
    X(SM121A, "sm_121a", 121, 101376)

typedef enum mj_target {
#define MJ_TARGET_ENUM_(e, name, sm, smem) MJ_TARGET_##e,
    MJ_TARGET_TABLE(MJ_TARGET_ENUM_)
#undef MJ_TARGET_ENUM_
    MJ_TARGET_COUNT
} mj_target;

/* "sm_80 sm_86 ... sm_121a", for messages. */
#define MJ_TARGET_NAME_(e, name, sm, smem) " " name
#define MJ_TARGET_LIST (&(MJ_TARGET_TABLE(MJ_TARGET_NAME_))[1]) /* past the first space */

typedef enum mj_knob_kind { MJ_KNOB_KIND_RANGE = 0, MJ_KNOB_KIND_SET = 1 } mj_knob_kind;

typedef struct mj_knob_desc {
    const char *name;          /* the constant's name in the template, e.g. "BLOCK"      */
    const char *ctype;         /* "int", "unsigned" or "bool"                             */
    const char *doc;           /* what it does, one line                                  */
    mj_knob_kind kind;
    int32_t lo, hi;            /* RANGE: allowed lo..hi inclusive                         */
    int32_t n_values;          /* SET: the allowed values                                 */
    int32_t values[MJ_MAX_KNOB_VALUES];
} mj_knob_desc;

/* A cross-knob rule: expr (a C integer expression over the knobs) must be non-zero. */
typedef struct mj_constraint_desc {
    const char *expr;          /* "K0 <= K"                                               */
    const char *doc;           /* why, one line                                           */
} mj_constraint_desc;

typedef struct mj_param_desc {
    const char *name;          /* "x"                                                     */
    const char *ctype;         /* "const float *", as spelled in the template             */
    int32_t size;              /* bytes of the argument (on the host, for the interpreter) */
} mj_param_desc;

typedef struct mj_kernel_desc {
    const char *name;          /* entry point (extern "C" under NVRTC)                    */
    int32_t n_params;
    const mj_param_desc *params;
} mj_kernel_desc;

typedef struct mj_template_desc {
    const char *name;          /* "router_gemm"                                           */
    const char *doc;           /* one line                                                */
    const char *file;          /* path relative to the source root, for messages          */
    const char *body;          /* the template file's text, embedded                      */
    uint32_t targets;          /* mask of mj_target the template declares                 */
    int32_t pdl;               /* MJ_PDL: every kernel waits on the grid before it first
                                  touches memory (mj_grid_dep_wait), so on sm_90+ it is
                                  launched as a programmatic dependent of the one before */
    int32_t n_knobs;
    const mj_knob_desc *knobs;
    int32_t n_constraints;
    const mj_constraint_desc *constraints;
    int32_t n_kernels;         /* at most MJ_MAX_KERNELS                                  */
    const mj_kernel_desc *kernels;
} mj_template_desc;

/* The generated tables. */
extern const mj_template_desc mj_registry_templates[];
extern const int32_t mj_registry_n_templates;
/* Preludes, embedded from templates/prelude_*.h: for NVRTC and for the CPU interpreter (the
 * sim backend; "" when mj_reflect ran without --prelude-sim). */
extern const char mj_registry_prelude_cuda[];
extern const char mj_registry_prelude_sim[];

#endif
