/* fuzz_cache_entry.c — the cache entry decoder, mj_cache_decode (cache/entry.c).
 *
 * Each input is decoded twice: as it is, and (when long enough for one) with its last 32
 * bytes replaced by the SHA-256 of the rest, so that the fuzzer gets past the checksum into
 * the section checks and the copy-out.
 *
 * Invariants:
 *   - failure: a parse error (or out of memory) with a message, and *out all zero;
 *   - success: KEY, META and BINARY are there; encoding the entry gives as many bytes as
 *     the input (the same sections), the very input when its sections were in the
 *     encoder's order, and bytes that decode to an equal entry and encode to themselves;
 *   - any one changed byte of an encoded entry, or one byte less, fails to decode.
 */
#include "fuzz.h"
#include "cache.h"

#include <openssl/evp.h>

static int same_text(const char *a, const char *b) { return (!a && !b) || (a && b && !strcmp(a, b)); }

static int same_entry(const mj_cache_entry *a, const mj_cache_entry *b) {
    return same_text(a->key_text, b->key_text) && same_text(a->meta_json, b->meta_json) &&
           a->binary_len == b->binary_len && !memcmp(a->binary, b->binary, a->binary_len) &&
           !a->ptx == !b->ptx && a->ptx_len == b->ptx_len && (!a->ptx || !memcmp(a->ptx, b->ptx, a->ptx_len)) &&
           same_text(a->log, b->log) && same_text(a->source, b->source);
}

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Were the (verified) input's sections in ascending tag order, as the encoder writes them? */
static int canonical_order(const uint8_t *buf) {
    uint32_t count = le32(buf + 12), last = 0;
    size_t pos = 16;
    for (uint32_t i = 0; i < count; i++) {
        uint32_t tag = le32(buf + pos);
        uint64_t len = le32(buf + pos + 8) | (uint64_t)le32(buf + pos + 12) << 32;
        if (tag <= last) return 0;
        last = tag;
        pos += 16 + (size_t)len;
    }
    return 1;
}

static void check_one(const uint8_t *buf, size_t len) {
    mj_cache_entry e, e2;
    memset(&e, 0x5A, sizeof e);
    mj_clear_error();
    mj_status st = mj_cache_decode(buf, len, &e);
    if (st != MJ_OK) {
        FUZZ_CHECK(st == MJ_ERR_PARSE || st == MJ_ERR_NOMEM, "failed with %s", mj_status_string(st));
        FUZZ_CHECK(mj_last_error()[0] != '\0', "failure without a message");
        FUZZ_CHECK(fuzz_all_bytes(&e, sizeof e, 0), "failure left a partial entry");
        return;
    }
    FUZZ_CHECK(e.key_text && e.meta_json && e.binary, "a required section is missing");
    FUZZ_CHECK(e.ptx || e.ptx_len == 0, "ptx_len %zu without ptx", e.ptx_len);

    uint8_t *enc = NULL, *enc2 = NULL;
    size_t enc_len = 0, enc2_len = 0;
    FUZZ_CHECK(mj_cache_encode(&e, &enc, &enc_len) == MJ_OK, "a decoded entry does not encode");
    FUZZ_CHECK(enc_len == len, "re-encoded to %zu bytes from %zu", enc_len, len);
    if (canonical_order(buf)) FUZZ_CHECK(memcmp(enc, buf, len) == 0, "re-encoding changed the bytes");
    memset(&e2, 0x5A, sizeof e2);
    FUZZ_CHECK(mj_cache_decode(enc, enc_len, &e2) == MJ_OK, "an encoded entry does not decode: %s", mj_last_error());
    FUZZ_CHECK(same_entry(&e, &e2), "decode(encode(entry)) != entry");
    FUZZ_CHECK(mj_cache_encode(&e2, &enc2, &enc2_len) == MJ_OK, "encode failed");
    FUZZ_CHECK(enc2_len == enc_len && memcmp(enc, enc2, enc_len) == 0, "encoding is not deterministic");
    mj_cache_entry_free(&e2);

    /* Damage: one byte changed (chosen from the content), or the last byte gone. */
    size_t at = 0;
    for (size_t i = 0; i < enc_len; i++) at = at * 31 + enc[i];
    at %= enc_len;
    enc[at] ^= (uint8_t)(1u << (at % 8));
    FUZZ_CHECK(mj_cache_decode(enc, enc_len, &e2) != MJ_OK, "a flipped bit at offset %zu went unnoticed", at);
    enc[at] ^= (uint8_t)(1u << (at % 8));
    FUZZ_CHECK(mj_cache_decode(enc, enc_len - 1, &e2) != MJ_OK, "a truncated entry decoded");
    FUZZ_CHECK(fuzz_all_bytes(&e2, sizeof e2, 0), "failure left a partial entry");
    free(enc);
    free(enc2);
    mj_cache_entry_free(&e);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    check_one(data, size);
    if (size >= 48) {
        uint8_t *fixed = malloc(size);
        if (!fixed) abort();
        memcpy(fixed, data, size);
        unsigned int md_len = 0;
        if (EVP_Digest(fixed, size - 32, fixed + size - 32, &md_len, EVP_sha256(), NULL) != 1 || md_len != 32)
            abort();
        check_one(fixed, size);
        free(fixed);
    }
    return 0;
}
