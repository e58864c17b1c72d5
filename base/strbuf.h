/* strbuf.h — a growable string (base/strbuf.c): what generated source and long messages are
 * built in. Not installed, not public. */
#ifndef MJ_STRBUF_H
#define MJ_STRBUF_H

#include "base.h"

#include <stdarg.h>
#include <stddef.h>

/* Start from MJ_STRBUF_INIT (all zero). data is NUL-terminated once anything was added (an
 * empty string is added as "": data is then "" and not NULL). A failed allocation sets oom,
 * frees nothing, and makes every later call do nothing: check oom once, at the end. */
typedef struct mj_strbuf {
    char *data;
    size_t len, cap;
    int oom;
} mj_strbuf;
#define MJ_STRBUF_INIT {NULL, 0, 0, 0}

void mj_sb_append(mj_strbuf *b, const char *s, size_t n);
void mj_sb_puts(mj_strbuf *b, const char *s);
void mj_sb_printf(mj_strbuf *b, const char *fmt, ...) MJ_PRINTF(2, 3);
void mj_sb_vprintf(mj_strbuf *b, const char *fmt, va_list ap);
/* The text, owned by the caller (free), and b empty again; NULL after a failed allocation
 * (the text is then freed). Never NULL otherwise: "" when nothing was added. */
char *mj_sb_take(mj_strbuf *b);
void mj_sb_free(mj_strbuf *b);

#endif /* MJ_STRBUF_H */
