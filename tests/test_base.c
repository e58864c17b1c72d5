/* test_base.c — the helpers every layer shares (base/): context added to an error as it is
 * passed up (mj_error_prefix).
 */
#include "base.h"
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

int main(void) {
    test_error_prefix();
    return test_finish();
}
