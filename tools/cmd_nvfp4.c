/* cmd_nvfp4.c — `moejit nvfp4 quantize|dequantize`: the ModelOpt NVFP4 layout as .npy files. */
#include "tools.h"

#include <stdlib.h>
#include <string.h>

static const char k_help[] =
    "usage: moejit nvfp4 quantize IN.npy OUTPREFIX\n"
    "       moejit nvfp4 dequantize PREFIX OUT.npy\n"
    "\n"
    "quantize reads a float32 [N, K] matrix (K a multiple of 16) and writes, as ModelOpt does:\n"
    "  OUTPREFIX.weight.npy          uint8 [N, K/2]  two E2M1 codes a byte, even element low\n"
    "  OUTPREFIX.weight_scale.npy    uint8 [N, K/16] E4M3 block scales (one per 16 elements)\n"
    "  OUTPREFIX.weight_scale_2.npy  float32 scalar  amax / (6 * 448)\n"
    "dequantize reads those three files and writes float32 [N, K].\n"
    "A NaN or Inf in the input is an error naming its index. Outputs are written to\n"
    "temporary files beside them and renamed into place when all are complete: on an error,\n"
    "earlier outputs of the same names are left as they were and nothing is half-written.\n"
    "\n"
    "options:\n"
    "  -h, --help      this text\n"
    "  -V, --version   print the version\n";

static void part_path(char *buf, size_t len, const char *prefix, const char *part) {
    snprintf(buf, len, "%s.%s.npy", prefix, part);
}

static int quantize(const char *in, const char *prefix) {
    char err[512], sh[128];
    npy_array a;
    if (npy_load(in, "<f4", &a, err, sizeof err)) return tool_fail("%s", err);
    int rc = 1;
    uint8_t *q = NULL, *sf = NULL;
    if (a.ndim != 2) {
        tool_fail("%s: expected a float32 matrix [N, K], got shape %s", in, npy_shape_str(&a, sh, sizeof sh));
        goto done;
    }
    int64_t n = a.shape[0], k = a.shape[1];
    if (n < 1) {
        tool_fail("%s: shape %s: the matrix has no rows; quantize wants at least one row [N >= 1, K]", in,
                  npy_shape_str(&a, sh, sizeof sh));
        goto done;
    }
    if (k < 1 || k % MJ_NVFP4_GROUP) {
        tool_fail("%s: shape %s: K must be a positive multiple of %d (one NVFP4 block)", in,
                  npy_shape_str(&a, sh, sizeof sh), MJ_NVFP4_GROUP);
        goto done;
    }
    char p1[4096], p2[4096], p3[4096];
    part_path(p1, sizeof p1, prefix, "weight");
    part_path(p2, sizeof p2, prefix, "weight_scale");
    part_path(p3, sizeof p3, prefix, "weight_scale_2");
    /* The outputs are refused (a special file, a link) before any work, as run's is. */
    if (npy_check_output(p1, err, sizeof err) || npy_check_output(p2, err, sizeof err) ||
        npy_check_output(p3, err, sizeof err)) {
        tool_fail("%s", err);
        goto done;
    }
    q = malloc((size_t)(n * k / 2));
    sf = malloc((size_t)(n * k / 16));
    float s2;
    if (!q || !sf) {
        tool_fail("out of memory");
        goto done;
    }
    mj_status s = mj_nvfp4_quantize(a.data, n, k, in, q, sf, &s2);
    if (s != MJ_OK) {
        tool_fail_status("quantize", s);
        goto done;
    }
    int64_t s_w[2] = {n, k / 2}, s_s[2] = {n, k / 16};
    /* Three files, all replaced or none: write every temporary first, and rename only when
     * all three are complete (a failure removes our temporaries, never an earlier output). */
    npy_out o[3];
    int written = 0;
    if (npy_write_temp(&o[0], p1, "|u1", 1, 2, s_w, q, err, sizeof err) == 0) written++;
    if (written == 1 && npy_write_temp(&o[1], p2, "|u1", 1, 2, s_s, sf, err, sizeof err) == 0) written++;
    if (written == 2 && npy_write_temp(&o[2], p3, "<f4", 4, 0, NULL, &s2, err, sizeof err) == 0) written++;
    if (written < 3) {
        for (int i = 0; i < written; i++) npy_discard(&o[i]);
        tool_fail("%s (no output was changed)", err);
        goto done;
    }
    for (int i = 0; i < 3; i++) {
        if (npy_commit(&o[i], err, sizeof err)) {
            for (int j = i + 1; j < 3; j++) npy_discard(&o[j]);
            if (i == 0) tool_fail("%s (no output was changed)", err);
            else tool_fail("%s (%s%s%s already replaced: run again)", err, p1, i > 1 ? " and " : "", i > 1 ? p2 : "");
            goto done;
        }
    }
    rc = 0;
done:
    free(q), free(sf);
    npy_free(&a);
    return rc;
}

static int dequantize(const char *prefix, const char *out) {
    char err[512], sh[128], sh2[128], p[4096];
    npy_array w = {0}, s = {0}, s2 = {0};
    float *x = NULL;
    int rc = 1;
    part_path(p, sizeof p, prefix, "weight");
    if (npy_load(p, "|u1", &w, err, sizeof err)) goto fail_err;
    part_path(p, sizeof p, prefix, "weight_scale");
    if (npy_load(p, "|u1", &s, err, sizeof err)) goto fail_err;
    part_path(p, sizeof p, prefix, "weight_scale_2");
    if (npy_load(p, "<f4", &s2, err, sizeof err)) goto fail_err;
    if (w.ndim != 2 || s.ndim != 2 || w.shape[1] < 1 || w.shape[1] % 8 || s.shape[0] != w.shape[0] ||
        s.shape[1] * 8 != w.shape[1]) {
        tool_fail("%s: shapes do not match: weight %s needs weight_scale [N, K/16] = [%lld, %lld], got %s",
                  prefix, npy_shape_str(&w, sh, sizeof sh), (long long)(w.ndim == 2 ? w.shape[0] : -1),
                  (long long)(w.ndim == 2 ? w.shape[1] / 8 : -1), npy_shape_str(&s, sh2, sizeof sh2));
        goto done;
    }
    if (s2.count != 1) {
        tool_fail("%s: weight_scale_2 must be a scalar, got shape %s", prefix, npy_shape_str(&s2, sh, sizeof sh));
        goto done;
    }
    int64_t n = w.shape[0], k = w.shape[1] * 2;
    x = malloc(sizeof *x * (size_t)(n * k));
    if (!x) {
        tool_fail("out of memory");
        goto done;
    }
    mj_status st = mj_nvfp4_dequantize(w.data, s.data, *(float *)s2.data, n, k, x);
    if (st != MJ_OK) {
        tool_fail_status("dequantize", st);
        goto done;
    }
    int64_t shape[2] = {n, k};
    if (npy_save(out, "<f4", 4, 2, shape, x, err, sizeof err)) goto fail_err;
    rc = 0;
    goto done;
fail_err:
    tool_fail("%s", err);
done:
    free(x);
    npy_free(&w), npy_free(&s), npy_free(&s2);
    return rc;
}

int cmd_nvfp4(int argc, char **argv) {
    if (argc >= 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        fputs(k_help, stdout);
        return 0;
    }
    if (argc >= 2 && (!strcmp(argv[1], "-V") || !strcmp(argv[1], "--version"))) {
        tool_print_version();
        return 0;
    }
    if (argc >= 3 && (!strcmp(argv[2], "-h") || !strcmp(argv[2], "--help"))) {
        fputs(k_help, stdout);
        return 0;
    }
    if (argc != 4) return tool_usage("nvfp4", "expected 'quantize IN.npy OUTPREFIX' or 'dequantize PREFIX OUT.npy'");
    if (!strcmp(argv[1], "quantize")) return quantize(argv[2], argv[3]);
    if (!strcmp(argv[1], "dequantize")) return dequantize(argv[2], argv[3]);
    return tool_usage("nvfp4", "unknown action '%s' (quantize or dequantize)", argv[1]);
}
