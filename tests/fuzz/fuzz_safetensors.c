/* fuzz_safetensors.c — the safetensors reader, mj_st_parse (runtime/weights/safetensors.c).
 *
 * Input: a whole .safetensors file.
 *
 * Invariants:
 *   - failure: a parse status (or out of memory), a message, and *out untouched;
 *   - success: the header fits in the file and the data area starts right after it; every
 *     tensor has a known dtype, at most MJ_ST_MAX_DIMS dimensions, 0 <= begin <= end <= the
 *     data area's size, and exactly numel * bits / 8 bytes; names are sorted and unique and
 *     mj_st_find finds each; no two tensors' byte ranges overlap;
 *   - round trip: the tensors written again with mj_st_build_header (in file order, their
 *     bytes copied after it) parse to the same names, dtypes, shapes and bytes;
 *   - the same input parses to the same result twice.
 */
#include "fuzz.h"
#include "weights/safetensors.h"

#define PAIRWISE_MAX 512 /* overlaps are checked pair by pair on files this small */

static int cmp_begin(const void *a, const void *b) {
    const mj_st_tensor *x = *(const mj_st_tensor *const *)a, *y = *(const mj_st_tensor *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static void check_accepted(const mj_st_file *f, const uint8_t *data, size_t size) {
    FUZZ_CHECK(f->base == data && f->size == size, "base/size");
    FUZZ_CHECK(f->header_len >= 2 && f->header_len <= MJ_ST_MAX_HEADER && 8 + f->header_len <= size,
               "header length %llu of a %zu-byte file", (unsigned long long)f->header_len, size);
    FUZZ_CHECK(f->data == data + 8 + f->header_len && f->data_size == size - 8 - f->header_len, "data area");
    for (int64_t i = 0; i < f->n_tensors; i++) {
        const mj_st_tensor *t = &f->tensors[i];
        FUZZ_CHECK((unsigned)t->dtype < MJ_ST_DTYPE_COUNT, "dtype %d", (int)t->dtype);
        FUZZ_CHECK(t->ndim >= 0 && t->ndim <= MJ_ST_MAX_DIMS, "ndim %d", t->ndim);
        FUZZ_CHECK(t->begin <= t->end && t->end <= f->data_size, "range [%llu, %llu) of %llu",
                   (unsigned long long)t->begin, (unsigned long long)t->end, (unsigned long long)f->data_size);
        unsigned __int128 bits = (unsigned __int128)mj_st_dtype_bits(t->dtype);
        for (int32_t d = 0; d < t->ndim; d++) {
            FUZZ_CHECK(t->shape[d] >= 0, "negative dimension");
            bits *= (unsigned __int128)t->shape[d];
        }
        FUZZ_CHECK(bits % 8 == 0 && bits / 8 == t->end - t->begin, "size of '%s' does not match its shape", t->name);
        FUZZ_CHECK(mj_st_find(f, t->name) == t, "mj_st_find('%s')", t->name);
        if (i) FUZZ_CHECK(strcmp(f->tensors[i - 1].name, t->name) < 0, "names not sorted or repeated");
    }
    if (f->n_tensors <= PAIRWISE_MAX)
        for (int64_t i = 0; i < f->n_tensors; i++)
            for (int64_t j = i + 1; j < f->n_tensors; j++) {
                const mj_st_tensor *a = &f->tensors[i], *b = &f->tensors[j];
                int empty = a->begin == a->end || b->begin == b->end;
                FUZZ_CHECK(empty || a->end <= b->begin || b->end <= a->begin, "'%s' and '%s' overlap", a->name,
                           b->name);
            }
}

/* Write the tensors again and parse the result: the same tensors. */
static void check_round_trip(const mj_st_file *f) {
    const int64_t n = f->n_tensors;
    const mj_st_tensor **order = malloc(sizeof *order * (size_t)(n ? n : 1));
    mj_st_entry *e = malloc(sizeof *e * (size_t)(n ? n : 1));
    if (!order || !e) abort();
    for (int64_t i = 0; i < n; i++) order[i] = &f->tensors[i];
    qsort(order, (size_t)n, sizeof *order, cmp_begin);
    for (int64_t i = 0; i < n; i++) {
        e[i].name = order[i]->name;
        e[i].dtype = order[i]->dtype;
        e[i].ndim = order[i]->ndim;
        memcpy(e[i].shape, order[i]->shape, sizeof e[i].shape);
        e[i].nbytes = order[i]->end - order[i]->begin;
    }
    uint8_t *prefix = NULL;
    uint64_t plen = 0, dlen = 0;
    mj_status st = mj_st_build_header(e, n, &prefix, &plen, &dlen);
    if (st == MJ_ERR_NOMEM) goto done;
    FUZZ_CHECK(st == MJ_OK, "writing back what was read failed: %s", mj_status_string(st));
    FUZZ_CHECK(plen % 8 == 0, "the data area is not 8-byte aligned");
    uint8_t *file = malloc((size_t)(plen + dlen) + 1);
    if (!file) abort();
    memcpy(file, prefix, (size_t)plen);
    uint64_t at = plen;
    for (int64_t i = 0; i < n; i++) {
        memcpy(file + at, f->data + order[i]->begin, (size_t)e[i].nbytes);
        at += e[i].nbytes;
    }
    mj_st_file g;
    st = mj_st_parse(file, plen + dlen, "fuzz/again.safetensors", &g);
    FUZZ_CHECK(st == MJ_OK, "what was written back does not parse: %s", mj_last_error());
    FUZZ_CHECK(g.n_tensors == n, "%lld tensors, were %lld", (long long)g.n_tensors, (long long)n);
    for (int64_t i = 0; i < n; i++) {
        const mj_st_tensor *a = &f->tensors[i], *b = &g.tensors[i];
        FUZZ_CHECK(!strcmp(a->name, b->name) && a->dtype == b->dtype && a->ndim == b->ndim &&
                       !memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim) &&
                       a->end - a->begin == b->end - b->begin &&
                       !memcmp(f->data + a->begin, g.data + b->begin, (size_t)(a->end - a->begin)),
                   "tensor '%s' changed in the round trip", a->name);
    }
    mj_st_release(&g);
    free(file);
done:
    free(prefix);
    free(order);
    free(e);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* An exact-size copy: a read past the end is a read past the allocation. */
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) abort();
    if (size) memcpy(copy, data, size);
    mj_st_file f, again;
    memset(&f, 0xA5, sizeof f);
    mj_clear_error();
    mj_status st = mj_st_parse(copy, size, "fuzz/model.safetensors", &f);
    if (st != MJ_OK) {
        FUZZ_CHECK(st == MJ_ERR_PARSE || st == MJ_ERR_NOMEM, "failed with %s", mj_status_string(st));
        FUZZ_CHECK(mj_last_error()[0] != '\0', "failure without a message");
        FUZZ_CHECK(fuzz_all_bytes(&f, sizeof f, 0xA5), "failure wrote to *out");
        FUZZ_CHECK(mj_st_parse(copy, size, "fuzz/model.safetensors", &again) == st, "not deterministic");
        free(copy);
        return 0;
    }
    check_accepted(&f, copy, size);
    FUZZ_CHECK(mj_st_parse(copy, size, "fuzz/model.safetensors", &again) == MJ_OK && again.n_tensors == f.n_tensors,
               "not deterministic");
    for (int64_t i = 0; i < f.n_tensors; i++)
        FUZZ_CHECK(!strcmp(f.tensors[i].name, again.tensors[i].name) && f.tensors[i].begin == again.tensors[i].begin &&
                       f.tensors[i].end == again.tensors[i].end,
                   "two parses differ");
    mj_st_release(&again);
    check_round_trip(&f);
    mj_st_release(&f);
    free(copy);
    return 0;
}
