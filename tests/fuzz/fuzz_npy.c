/* fuzz_npy.c — the .npy reader (tools/npy.c, npy_parse: the same preamble and header parser
 * npy_load uses) on arbitrary bytes.
 *
 * Invariants:
 *   - failure: -1, a reason in err, *out all zero (no partial result);
 *   - success: 0 <= ndim <= NPY_MAX_DIMS, the shape's product is count, itemsize is the
 *     dtype's size (1..16), and the data is exactly the input's last count * itemsize bytes;
 *   - asking for the dtype it found succeeds with the same array; asking for "<f4" succeeds
 *     exactly when the dtype is f4 (whatever its byte-order character);
 *   - round trip: npy_header (what npy_save writes) for the array, then its data, parses
 *     back to the same dtype, shape and data.
 */
#include "fuzz.h"
#include "npy.h"

#include <ctype.h>

static int same_array(const npy_array *a, const npy_array *b) {
    if (strcmp(a->dtype, b->dtype) || a->ndim != b->ndim || a->count != b->count ||
        a->itemsize != b->itemsize)
        return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    size_t bytes = (size_t)a->count * a->itemsize;
    return bytes == 0 || memcmp(a->data, b->data, bytes) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[512];
    npy_array a, b;
    err[0] = '\0';
    int rc = npy_parse(data, size, "fuzz.npy", NULL, &a, err, sizeof err);
    if (rc != 0) {
        FUZZ_CHECK(rc == -1, "npy_parse returned %d", rc);
        FUZZ_CHECK(err[0] != '\0', "failure without a reason");
        FUZZ_CHECK(fuzz_all_bytes(&a, sizeof a, 0), "failure left a partial result");
        /* A dtype filter can only reject more. */
        FUZZ_CHECK(npy_parse(data, size, "fuzz.npy", "<f4", &b, err, sizeof err) == -1,
                   "accepted with want=<f4 but not with any dtype");
        return 0;
    }

    FUZZ_CHECK(a.ndim >= 0 && a.ndim <= NPY_MAX_DIMS, "ndim %d", a.ndim);
    int64_t prod = 1;
    for (int i = 0; i < a.ndim; i++) {
        FUZZ_CHECK(a.shape[i] >= 0, "shape[%d] = %lld", i, (long long)a.shape[i]);
        prod *= a.shape[i];
    }
    FUZZ_CHECK(prod == a.count, "count %lld, shape product %lld", (long long)a.count, (long long)prod);
    size_t dl = strlen(a.dtype);
    FUZZ_CHECK(dl >= 3 && dl < sizeof a.dtype, "dtype '%s'", a.dtype);
    FUZZ_CHECK(a.dtype[0] == '<' || a.dtype[0] == '|' || a.dtype[0] == '=', "dtype '%s'", a.dtype);
    FUZZ_CHECK(a.itemsize >= 1 && a.itemsize <= 16, "itemsize %zu", a.itemsize);
    FUZZ_CHECK(a.itemsize == (size_t)atoi(a.dtype + 2), "itemsize %zu for dtype '%s'", a.itemsize, a.dtype);
    FUZZ_CHECK(a.data != NULL, "no data pointer");
    size_t bytes = (size_t)a.count * a.itemsize;
    FUZZ_CHECK(bytes <= size, "%zu data bytes from a %zu-byte input", bytes, size);
    FUZZ_CHECK(bytes == 0 || memcmp(a.data, data + size - bytes, bytes) == 0,
               "data is not the input's last %zu bytes", bytes);

    /* want = the dtype found: same array. */
    FUZZ_CHECK(npy_parse(data, size, "fuzz.npy", a.dtype, &b, err, sizeof err) == 0,
               "rejected with want='%s', its own dtype: %s", a.dtype, err);
    FUZZ_CHECK(same_array(&a, &b), "want='%s' gave a different array", a.dtype);
    npy_free(&b);
    int is_f4 = strcmp(a.dtype + 1, "f4") == 0;
    rc = npy_parse(data, size, "fuzz.npy", "<f4", &b, err, sizeof err);
    FUZZ_CHECK((rc == 0) == is_f4, "dtype '%s', want=<f4 -> %d", a.dtype, rc);
    if (rc == 0) {
        FUZZ_CHECK(b.itemsize == 4, "f4 with itemsize %zu", b.itemsize);
        npy_free(&b);
    }

    /* Round trip through the writer's header, for dtypes it can spell (no quotes). */
    int plain = 1;
    for (size_t i = 1; i < dl; i++) plain &= isalnum((unsigned char)a.dtype[i]) != 0;
    if (plain) {
        char hdr[NPY_MAX_HEADER];
        int hb = npy_header(a.dtype, a.ndim, a.shape, hdr, sizeof hdr);
        FUZZ_CHECK(hb > 10 && hb <= NPY_MAX_HEADER && hb % 64 == 0, "npy_header -> %d", hb);
        uint8_t *file = malloc((size_t)hb + bytes + 1);
        if (!file) abort();
        memcpy(file, hdr, (size_t)hb);
        if (bytes) memcpy(file + hb, a.data, bytes);
        rc = npy_parse(file, (size_t)hb + bytes, "roundtrip.npy", NULL, &b, err, sizeof err);
        FUZZ_CHECK(rc == 0, "what npy_header wrote does not parse: %s", err);
        FUZZ_CHECK(same_array(&a, &b), "round trip changed the array (dtype '%s')", a.dtype);
        npy_free(&b);
        free(file);
    }
    npy_free(&a);
    return 0;
}
