/* strbuf.c — a growable string: appends, printf, and the text handed over at the end. */
#include "strbuf.h"

#include <stdio.h>
#include <stdlib.h>

/* Room for n more bytes and the NUL; 0 when there is none (oom is then set). */
static int reserve(mj_strbuf *b, size_t n) {
    if (b->oom) return 0;
    if (n > SIZE_MAX / 2 - b->len) return b->oom = 1, 0;
    size_t need = b->len + n + 1;
    if (need <= b->cap) return 1;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p) return b->oom = 1, 0;
    b->data = p;
    b->cap = cap;
    return 1;
}

void mj_sb_append(mj_strbuf *b, const char *s, size_t n) {
    if (!reserve(b, n)) return;
    if (n) memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void mj_sb_puts(mj_strbuf *b, const char *s) { mj_sb_append(b, s, strlen(s)); }

void mj_sb_vprintf(mj_strbuf *b, const char *fmt, va_list ap) {
    if (b->oom) return;
    va_list again;
    va_copy(again, ap);
    size_t room = b->data ? b->cap - b->len : 0;
    int n = vsnprintf(room ? b->data + b->len : NULL, room, fmt, ap);
    if (n >= 0 && (size_t)n < room) {
        b->len += (size_t)n;
    } else if (n >= 0 && reserve(b, (size_t)n)) {
        vsnprintf(b->data + b->len, (size_t)n + 1, fmt, again);
        b->len += (size_t)n;
    } else {
        b->oom = 1; /* n < 0: a format that cannot be written, the text is incomplete */
        if (b->data) b->data[b->len] = '\0'; /* what a cut-off attempt wrote is not kept */
    }
    va_end(again);
}

void mj_sb_printf(mj_strbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    mj_sb_vprintf(b, fmt, ap);
    va_end(ap);
}

char *mj_sb_take(mj_strbuf *b) {
    if (!b->oom && !b->data) mj_sb_append(b, "", 0);
    char *s = b->oom ? NULL : b->data;
    if (!s) free(b->data);
    *b = (mj_strbuf)MJ_STRBUF_INIT;
    return s;
}

void mj_sb_free(mj_strbuf *b) {
    free(b->data);
    *b = (mj_strbuf)MJ_STRBUF_INIT;
}
