/* target.c — compile targets: names, parsing, and the compute capability -> target map.
 * Needs neither NVRTC nor the driver. */
#include "gen.h"

#include <ctype.h>
#include <stdlib.h>
#include <strings.h>

static const char *const k_target_names[MJ_TARGET_COUNT] = {
#define NAME_(e, name, sm, smem) name,
    MJ_TARGET_TABLE(NAME_)
#undef NAME_
};

static const int k_target_sm[MJ_TARGET_COUNT] = {
#define SM_(e, name, sm, smem) sm,
    MJ_TARGET_TABLE(SM_)
#undef SM_
};

static const int k_target_smem[MJ_TARGET_COUNT] = {
#define SMEM_(e, name, sm, smem) smem,
    MJ_TARGET_TABLE(SMEM_)
#undef SMEM_
};

int mj_target_smem_max(mj_target t) {
    if ((int)t < 0 || t >= MJ_TARGET_COUNT) return 0;
    return k_target_smem[t];
}

const char *mj_target_name(mj_target t) {
    if ((int)t < 0 || t >= MJ_TARGET_COUNT) return "(invalid target)";
    return k_target_names[t];
}

int mj_target_sm(mj_target t) {
    if ((int)t < 0 || t >= MJ_TARGET_COUNT) return 0;
    return k_target_sm[t];
}

/* Compute capability -> target. A cubin for plain sm_XY runs on X.Z for Z >= Y, so 8.7
 * (Orin) takes sm_86. Arch-specific "a" cubins are meant for their exact capability: 10.3
 * is mapped to sm_100a by decision, but the driver may refuse an sm_100a cubin there
 * (CUDA_ERROR_NO_BINARY_FOR_GPU); a family target (sm_100f) or sm_103a would be exact. */
mj_status mj_target_from_cc(int major, int minor, mj_target *out) {
    if (!out) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_target_from_cc: out is NULL");
    mj_target t = MJ_TARGET_COUNT;
    switch (major * 10 + (minor >= 0 && minor <= 9 ? minor : 100)) {
    case 80: t = MJ_TARGET_SM80; break;
    case 86:
    case 87: t = MJ_TARGET_SM86; break;
    case 89: t = MJ_TARGET_SM89; break;
    case 90: t = MJ_TARGET_SM90A; break;
    case 100:
    case 103: t = MJ_TARGET_SM100A; break;
    case 120: t = MJ_TARGET_SM120A; break;
    case 121: t = MJ_TARGET_SM121A; break;
    default: break;
    }
    if (t == MJ_TARGET_COUNT)
        return mj_set_error(MJ_ERR_UNSUPPORTED,
                            "compute capability %d.%d is not supported by moejit (supported: "
                            "8.0, 8.6, 8.7, 8.9, 9.0, 10.0, 10.3, 12.0, 12.1)",
                            major, minor);
    *out = t;
    return MJ_OK;
}

/* "12" -> 12 with *end after the digits; -1 if no digits (or absurdly many). */
static int parse_uint(const char *s, const char **end) {
    int v = 0, n = 0;
    while (isdigit((unsigned char)s[n])) {
        if (n >= 4) return -1;
        v = v * 10 + (s[n] - '0');
        n++;
    }
    *end = s + n;
    return n ? v : -1;
}

mj_status mj_target_parse(const char *name, mj_target *out) {
    if (!name || !out) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_target_parse: NULL argument");
    /* "12.0": a compute capability. */
    const char *end;
    int major = parse_uint(name, &end);
    if (major >= 0 && *end == '.') {
        int minor = parse_uint(end + 1, &end);
        if (minor >= 0 && *end == '\0') return mj_target_from_cc(major, minor, out);
    }
    /* "sm_120a" or "120a". */
    const char *s = name;
    if (strncasecmp(s, "sm_", 3) == 0) s += 3;
    for (int i = 0; i < MJ_TARGET_COUNT; i++) {
        if (strcasecmp(s, k_target_names[i] + 3) == 0) {
            *out = (mj_target)i;
            return MJ_OK;
        }
    }
    /* "sm_120" or "sm_90": the plain arch of an "a" target — name the one we do build. */
    int sm = parse_uint(s, &end);
    if (sm > 0 && *end == '\0') {
        for (int i = 0; i < MJ_TARGET_COUNT; i++)
            if (k_target_sm[i] == sm)
                return mj_set_error(MJ_ERR_INVALID_ARG,
                                    "unknown target '%s': did you mean %s? (targets: %s, or a compute "
                                    "capability such as 12.0)",
                                    name, k_target_names[i], MJ_TARGET_LIST);
    }
    return mj_set_error(MJ_ERR_INVALID_ARG,
                        "unknown target '%s' (targets: %s, or a compute capability such as 12.0)",
                        name, MJ_TARGET_LIST);
}
