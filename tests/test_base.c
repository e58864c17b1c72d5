/* test_base.c — the helpers every layer shares (base/): context added to an error as it is
 * passed up (mj_error_prefix); the growable string (mj_strbuf).
 */
#include "base.h"
#include "strbuf.h"
#include "test.h"

#include <pthread.h>

/* ---- mj_error_prefix ------------------------------------------------------------------------ */

static void *other_thread_error(void *arg) {
    (void)arg;
    mj_set_error(MJ_ERR_IO, "the other thread's own");
    mj_error_prefix(MJ_ERR_IO, "there");
    return strcmp(mj_last_error(), "there: the other thread's own") == 0 ? (void *)1 : NULL;
}

static void test_error_prefix(void) {
    mj_set_error(MJ_ERR_CONFIG, "hidden_size %d is not a multiple of 64", 100);
    mj_status s = mj_error_prefix(MJ_ERR_CONFIG, "%s, layer %d", "config.json", 3);
    CHECK(s == MJ_ERR_CONFIG, "the status is kept: %s", mj_status_string(s));
    CHECK(!strcmp(mj_last_error(), "config.json, layer 3: hidden_size 100 is not a multiple of 64"),
          "prefixed: \"%s\"", mj_last_error());
    /* Twice: the context of each caller on the way up. */
    mj_error_prefix(MJ_ERR_CONFIG, "mj_moe_create");
    CHECK(!strcmp(mj_last_error(), "mj_moe_create: config.json, layer 3: hidden_size 100 is not a multiple of 64"),
          "prefixed twice: \"%s\"", mj_last_error());

    /* No detail: the prefix alone, no dangling ": ". */
    mj_clear_error();
    mj_error_prefix(MJ_ERR_INTERNAL, "where");
    CHECK(!strcmp(mj_last_error(), "where"), "no detail: \"%s\"", mj_last_error());

    /* An argument that is the detail itself is read before the buffer is rewritten. */
    mj_set_error(MJ_ERR_IO, "abc");
    mj_error_prefix(MJ_ERR_IO, "%s", mj_last_error());
    CHECK(!strcmp(mj_last_error(), "abc: abc"), "the detail as an argument: \"%s\"", mj_last_error());

    /* A detail that fills the buffer: cut at its end, the prefix whole, still terminated. */
    static char long_text[5000];
    memset(long_text, 'x', sizeof long_text - 1);
    mj_set_error(MJ_ERR_IO, "%s", long_text);
    mj_error_prefix(MJ_ERR_IO, "front");
    size_t n = strlen(mj_last_error());
    CHECK(n == 4095 && !strncmp(mj_last_error(), "front: xxx", 10), "a long detail: %zu bytes, \"%.12s\"", n,
          mj_last_error());

    /* The detail is the calling thread's: another thread's prefix does not touch it. */
    mj_set_error(MJ_ERR_CONFIG, "mine");
    pthread_t th;
    void *ok = NULL;
    CHECK(pthread_create(&th, NULL, other_thread_error, NULL) == 0, "pthread_create");
    pthread_join(th, &ok);
    CHECK(ok != NULL, "the other thread saw its own detail, prefixed");
    CHECK(!strcmp(mj_last_error(), "mine"), "this thread's detail: \"%s\"", mj_last_error());
}

/* ---- mj_strbuf ------------------------------------------------------------------------------ */

static void test_strbuf(void) {
    /* Nothing added: "" (not NULL). */
    mj_strbuf b = MJ_STRBUF_INIT;
    char *s = mj_sb_take(&b);
    CHECK(s && !strcmp(s, ""), "an empty builder gives \"\"");
    free(s);
    CHECK(!b.data && !b.len && !b.cap && !b.oom, "take leaves the builder empty");

    /* Appends and formats, across many reallocations; always NUL-terminated. */
    mj_sb_puts(&b, "a");
    mj_sb_append(&b, "bcd", 2);
    mj_sb_printf(&b, "[%d]", 42);
    CHECK(b.len == 7 && !strcmp(b.data, "abc[42]"), "appended: \"%s\" (%zu)", b.data ? b.data : "(null)", b.len);
    size_t want = b.len;
    for (int i = 0; i < 1000; i++) {
        mj_sb_printf(&b, "%05d,", i);
        want += 6;
    }
    CHECK(b.len == want && strlen(b.data) == want && !strncmp(b.data + 7, "00000,00001,", 12) &&
              !strcmp(b.data + want - 6, "00999,"),
          "1000 formats: %zu bytes (want %zu)", b.len, want);
    /* One format longer than the room left (and than the first allocation). */
    char big[3000];
    memset(big, 'q', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    mj_sb_printf(&b, "<%s>", big);
    want += sizeof big + 1;
    CHECK(b.len == want && strlen(b.data) == want && b.data[want - 1] == '>' && b.data[want - 2] == 'q',
          "a long format: %zu bytes (want %zu)", b.len, want);
    mj_sb_free(&b);
    CHECK(!b.data && !b.len, "free leaves the builder empty");

    /* After a failed allocation every call does nothing and take gives NULL. */
    mj_sb_puts(&b, "kept?");
    b.oom = 1;
    mj_sb_puts(&b, "more");
    mj_sb_printf(&b, "%d", 7);
    CHECK(b.len == 5 && !strcmp(b.data, "kept?"), "nothing added after oom: \"%s\"", b.data);
    CHECK(mj_sb_take(&b) == NULL && !b.data && !b.oom, "take after oom: NULL, and the text freed");
}

int main(void) {
    test_error_prefix();
    test_strbuf();
    return test_finish();
}
