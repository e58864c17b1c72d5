/* fuzz.h — what the libFuzzer harnesses share.
 *
 * Each harness (fuzz_*.c) defines LLVMFuzzerTestOneInput and checks invariants of what it
 * parses: a violated one prints what and where, then abort()s, which libFuzzer reports as a
 * crash and saves as a reproducer. Built with clang and MJ_FUZZ=ON they are libFuzzer
 * programs; otherwise replay.c gives them a main() that runs the files it is given once
 * (the seed corpora become ctest tests that way). */
#ifndef MJ_FUZZ_H
#define MJ_FUZZ_H

#include "base.h" /* moejit.h, and mj_clear_error */

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_CHECK(cond, ...)                                                            \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "%s:%d: invariant violated: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                                \
            fprintf(stderr, "\n(last error: %s)\n", mj_last_error());                    \
            abort();                                                                     \
        }                                                                                \
    } while (0)

/* A NUL-terminated copy of the input (what the C-string parsers take). */
static inline char *fuzz_cstr(const uint8_t *data, size_t size) {
    char *s = malloc(size + 1);
    if (!s) abort();
    if (size) memcpy(s, data, size);
    s[size] = '\0';
    return s;
}

/* Is every byte of the struct equal to `byte`? (An output left untouched on failure.) */
static inline int fuzz_all_bytes(const void *p, size_t n, unsigned char byte) {
    const unsigned char *q = p;
    for (size_t i = 0; i < n; i++)
        if (q[i] != byte) return 0;
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
