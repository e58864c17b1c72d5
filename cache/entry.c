/* entry.c — the cache's key hash and its entry file format, in memory only.
 *
 * A cache entry is one file that verifies itself: whoever reads it can tell, without any
 * other file, whether it is complete and undamaged. That is what lets the cache survive a
 * writer killed mid-write, a full disk, a bad sector or a careless `cp`: a file that does not
 * verify is never used, only moved aside (see cache.c).
 *
 * The format (all integers little-endian, whatever the host):
 *
 *     offset  size  field
 *     0       8     magic "MOEJITC\n"        (the newline catches text-mode mangling)
 *     8       4     u32 format version        (MJ_CACHE_FORMAT; 1)
 *     12      4     u32 section count
 *     16      ...   sections, each:
 *                     u32 tag                 (KEY=1 META=2 BINARY=3 PTX=4 LOG=5 SOURCE=6)
 *                     u32 reserved, 0
 *                     u64 length
 *                     length bytes
 *     end-32  32    SHA-256 of every byte before it
 *
 * KEY (the full key text), META (a JSON object) and BINARY (the cubin) are required; PTX,
 * LOG and SOURCE are present only when the entry has them. Each tag appears at most once.
 * Text sections are stored without a terminating NUL; the decoder adds one, so every text
 * the caller gets back is a C string. KEY, META, LOG and SOURCE may not contain a NUL byte
 * (they travel as C strings, so one would silently cut them short); PTX carries its own
 * length (NVRTC's PTX size counts a trailing NUL) and may.
 *
 * The decoder checks, in this order, and names the first thing that is wrong:
 *   1. the size (at least a header and a checksum: 48 bytes),
 *   2. the magic, then the version — before the checksum, because a future format may
 *      checksum differently and "written by a newer moejit" is the useful message,
 *   3. the section walk: every section header and body lies inside the file, with no
 *      unsigned overflow (lengths are compared against what is left, never added), the
 *      reserved field is 0, each tag is known and not repeated, and the last section ends
 *      exactly where the checksum begins,
 *   4. the checksum,
 *   5. that KEY, META and BINARY are all there.
 * Nothing is handed out before all of that has passed.
 */
#include "cache.h"

#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

enum {
    TAG_KEY = 1,
    TAG_META = 2,
    TAG_BINARY = 3,
    TAG_PTX = 4,
    TAG_LOG = 5,
    TAG_SOURCE = 6,
    TAG_COUNT = 7, /* one past the last tag */
};

static const char *const k_tag_name[TAG_COUNT] = {
    [TAG_KEY] = "KEY", [TAG_META] = "META", [TAG_BINARY] = "BINARY",
    [TAG_PTX] = "PTX", [TAG_LOG] = "LOG",   [TAG_SOURCE] = "SOURCE",
};

#define HEADER_BYTES 16u         /* magic, version, count      */
#define SECTION_HEADER_BYTES 16u /* tag, reserved, length      */
#define CHECKSUM_BYTES 32u       /* SHA-256                    */
#define MAGIC_BYTES 8u

/* ---------------------------------------------------------------------------------------
 * SHA-256 and the key hash
 * ------------------------------------------------------------------------------------- */

static int sha256(const void *data, size_t len, uint8_t md[CHECKSUM_BYTES]) {
    unsigned int md_len = 0;
    if (EVP_Digest(data, len, md, &md_len, EVP_sha256(), NULL) != 1) return 0;
    return md_len == CHECKSUM_BYTES;
}

/* On the (allocation) failure of OpenSSL itself, hex is left empty: every cache call
 * rejects an empty key hex as an invalid argument, so the failure cannot go unnoticed. */
void mj_key_hash(const char *key_text, char hex[MJ_KEY_HEX_LEN + 1]) {
    static const char digits[] = "0123456789abcdef";
    uint8_t md[CHECKSUM_BYTES];
    hex[0] = '\0';
    if (!key_text || !sha256(key_text, strlen(key_text), md)) return;
    for (int i = 0; i < 32; i++) {
        hex[2 * i] = digits[md[i] >> 4];
        hex[2 * i + 1] = digits[md[i] & 15];
    }
    hex[MJ_KEY_HEX_LEN] = '\0';
}

/* ---------------------------------------------------------------------------------------
 * Little-endian fields
 * ------------------------------------------------------------------------------------- */

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* ---------------------------------------------------------------------------------------
 * Entries
 * ------------------------------------------------------------------------------------- */

void mj_cache_entry_free(mj_cache_entry *e) {
    if (!e) return;
    free(e->key_text);
    free(e->meta_json);
    free(e->binary);
    free(e->ptx);
    free(e->log);
    free(e->source);
    memset(e, 0, sizeof *e);
}

/* ---------------------------------------------------------------------------------------
 * Encoding
 * ------------------------------------------------------------------------------------- */

typedef struct section {
    uint32_t tag;
    const void *data;
    size_t len;
} section;

mj_status mj_cache_encode(const mj_cache_entry *e, uint8_t **buf, size_t *len) {
    if (!e || !buf || !len) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_cache_encode: NULL argument");
    *buf = NULL;
    *len = 0;
    if (!e->key_text || !e->meta_json || !e->binary)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "mj_cache_encode: an entry needs key_text, meta_json and binary");
    if (!e->ptx && e->ptx_len)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_cache_encode: ptx_len %zu with no ptx",
                            e->ptx_len);

    section s[TAG_COUNT];
    int n = 0;
    s[n++] = (section){TAG_KEY, e->key_text, strlen(e->key_text)};
    s[n++] = (section){TAG_META, e->meta_json, strlen(e->meta_json)};
    s[n++] = (section){TAG_BINARY, e->binary, e->binary_len};
    if (e->ptx) s[n++] = (section){TAG_PTX, e->ptx, e->ptx_len};
    if (e->log) s[n++] = (section){TAG_LOG, e->log, strlen(e->log)};
    if (e->source) s[n++] = (section){TAG_SOURCE, e->source, strlen(e->source)};

    /* Size, guarding every addition against wrap-around. */
    size_t total = HEADER_BYTES + CHECKSUM_BYTES;
    for (int i = 0; i < n; i++) {
        if (s[i].len > SIZE_MAX - total - SECTION_HEADER_BYTES)
            return mj_set_error(MJ_ERR_INVALID_ARG, "mj_cache_encode: entry too large");
        total += SECTION_HEADER_BYTES + s[i].len;
    }

    uint8_t *out = malloc(total);
    if (!out) return mj_set_error(MJ_ERR_NOMEM, "mj_cache_encode: %zu bytes", total);

    uint8_t *p = out;
    memcpy(p, MJ_CACHE_MAGIC, MAGIC_BYTES);
    put_u32(p + 8, MJ_CACHE_FORMAT);
    put_u32(p + 12, (uint32_t)n);
    p += HEADER_BYTES;
    for (int i = 0; i < n; i++) {
        put_u32(p, s[i].tag);
        put_u32(p + 4, 0);
        put_u64(p + 8, (uint64_t)s[i].len);
        p += SECTION_HEADER_BYTES;
        if (s[i].len) memcpy(p, s[i].data, s[i].len);
        p += s[i].len;
    }
    if (!sha256(out, total - CHECKSUM_BYTES, p)) {
        free(out);
        return mj_set_error(MJ_ERR_INTERNAL, "mj_cache_encode: SHA-256 failed (OpenSSL)");
    }
    *buf = out;
    *len = total;
    return MJ_OK;
}

/* ---------------------------------------------------------------------------------------
 * Decoding
 * ------------------------------------------------------------------------------------- */

static mj_status parse_error(const char *fmt, ...) MJ_PRINTF(1, 2);
static mj_status parse_error(const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return mj_set_error(MJ_ERR_PARSE, "cache entry: %s", msg);
}

/* A malloc'd copy of len bytes plus a NUL (so that binary, too, is never a NULL pointer
 * even when empty). */
static void *copy_section(const uint8_t *p, size_t len) {
    if (len == SIZE_MAX) return NULL;
    uint8_t *q = malloc(len + 1);
    if (!q) return NULL;
    if (len) memcpy(q, p, len);
    q[len] = 0;
    return q;
}

mj_status mj_cache_decode(const uint8_t *buf, size_t len, mj_cache_entry *out) {
    if (!out || (!buf && len)) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_cache_decode: NULL argument");
    memset(out, 0, sizeof *out);

    mj_status ret = MJ_OK;
    mj_cache_entry e = {0};
    const uint8_t *where[TAG_COUNT] = {0}; /* each tag's body, NULL while unseen */
    size_t size[TAG_COUNT] = {0};

    /* 1-2: size, magic, version. */
    if (len < HEADER_BYTES + CHECKSUM_BYTES) {
        ret = parse_error("short file: %zu bytes, an entry is at least %u", len,
                          HEADER_BYTES + CHECKSUM_BYTES);
        goto exit;
    }
    if (memcmp(buf, MJ_CACHE_MAGIC, MAGIC_BYTES) != 0) {
        ret = parse_error("wrong magic (not a moejit cache entry)");
        goto exit;
    }
    uint32_t version = get_u32(buf + 8);
    if (version != MJ_CACHE_FORMAT) {
        ret = parse_error("unsupported format version %u (this moejit reads version %d)",
                          version, MJ_CACHE_FORMAT);
        goto exit;
    }

    /* 3: the section walk. pos and body_end are offsets; what is left is body_end - pos,
     * and a length is only ever compared with it, so no sum can wrap around. */
    uint32_t count = get_u32(buf + 12);
    size_t body_end = len - CHECKSUM_BYTES;
    size_t pos = HEADER_BYTES;
    for (uint32_t i = 0; i < count; i++) {
        if (body_end - pos < SECTION_HEADER_BYTES) {
            ret = parse_error("section %u of %u: header at offset %zu runs past the end of the "
                              "data (%zu bytes)", i + 1, count, pos, body_end);
            goto exit;
        }
        uint32_t tag = get_u32(buf + pos);
        uint32_t reserved = get_u32(buf + pos + 4);
        uint64_t slen = get_u64(buf + pos + 8);
        pos += SECTION_HEADER_BYTES;
        if (tag == 0 || tag >= TAG_COUNT) {
            ret = parse_error("section %u: unknown tag %u", i + 1, tag);
            goto exit;
        }
        if (reserved != 0) {
            ret = parse_error("section %u (%s): reserved field is %u, not 0", i + 1,
                              k_tag_name[tag], reserved);
            goto exit;
        }
        if (where[tag]) {
            ret = parse_error("section %u: duplicate %s section", i + 1, k_tag_name[tag]);
            goto exit;
        }
        if (slen > (uint64_t)(body_end - pos)) {
            ret = parse_error("section %u (%s): length %llu runs past the end of the data "
                              "(%zu bytes left)", i + 1, k_tag_name[tag],
                              (unsigned long long)slen, body_end - pos);
            goto exit;
        }
        where[tag] = buf + pos;
        size[tag] = (size_t)slen;
        pos += (size_t)slen;
    }
    if (pos != body_end) {
        ret = parse_error("%zu unexpected bytes after the last of %u sections", body_end - pos,
                          count);
        goto exit;
    }

    /* 4: the checksum. */
    uint8_t md[CHECKSUM_BYTES];
    if (!sha256(buf, body_end, md)) {
        ret = mj_set_error(MJ_ERR_INTERNAL, "mj_cache_decode: SHA-256 failed (OpenSSL)");
        goto exit;
    }
    if (memcmp(md, buf + body_end, CHECKSUM_BYTES) != 0) {
        ret = parse_error("checksum mismatch (the file is corrupted)");
        goto exit;
    }

    /* 5: required sections, and no NUL inside the C-string sections. */
    static const int required[] = {TAG_KEY, TAG_META, TAG_BINARY};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
        if (!where[required[i]]) {
            ret = parse_error("missing %s section", k_tag_name[required[i]]);
            goto exit;
        }
    }
    static const int c_strings[] = {TAG_KEY, TAG_META, TAG_LOG, TAG_SOURCE};
    for (size_t i = 0; i < sizeof c_strings / sizeof c_strings[0]; i++) {
        int t = c_strings[i];
        if (where[t] && memchr(where[t], 0, size[t])) {
            ret = parse_error("%s section contains a NUL byte", k_tag_name[t]);
            goto exit;
        }
    }

    /* Everything verified: copy out. */
    e.key_text = copy_section(where[TAG_KEY], size[TAG_KEY]);
    e.meta_json = copy_section(where[TAG_META], size[TAG_META]);
    e.binary = copy_section(where[TAG_BINARY], size[TAG_BINARY]);
    e.binary_len = size[TAG_BINARY];
    int nomem = !e.key_text || !e.meta_json || !e.binary;
    if (where[TAG_PTX]) {
        e.ptx = copy_section(where[TAG_PTX], size[TAG_PTX]);
        e.ptx_len = size[TAG_PTX];
        nomem |= !e.ptx;
    }
    if (where[TAG_LOG]) nomem |= !(e.log = copy_section(where[TAG_LOG], size[TAG_LOG]));
    if (where[TAG_SOURCE])
        nomem |= !(e.source = copy_section(where[TAG_SOURCE], size[TAG_SOURCE]));
    if (nomem) {
        ret = mj_set_error(MJ_ERR_NOMEM, "mj_cache_decode: out of memory (%zu-byte entry)", len);
        goto exit;
    }
    *out = e;
    memset(&e, 0, sizeof e);

exit:
    mj_cache_entry_free(&e);
    return ret;
}
