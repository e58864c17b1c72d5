/* replay.c — main() for a harness built without libFuzzer (gcc, or MJ_FUZZ off): run
 * LLVMFuzzerTestOneInput once on every file named, and on every file in every directory
 * named, so the seed corpora (and saved crash reproducers) are regression tests in any
 * build. A violated invariant abort()s, as under libFuzzer. */
#include "fuzz.h"

#include <dirent.h>
#include <sys/stat.h>

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        return 1;
    }
    size_t cap = 4096, n = 0;
    uint8_t *buf = malloc(cap);
    for (;;) {
        if (!buf) abort();
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        cap *= 2;
        buf = realloc(buf, cap);
    }
    fclose(f);
    /* An exact-size copy, so ASan sees a read past the input's end. */
    uint8_t *exact = malloc(n ? n : 1);
    if (!exact) abort();
    if (n) memcpy(exact, buf, n);
    free(buf);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    return 0;
}

int main(int argc, char **argv) {
    int files = 0, bad = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "replay: no such file or directory: %s\n", argv[i]);
            return 1;
        }
        if (!S_ISDIR(st.st_mode)) {
            bad |= run_file(argv[i]);
            files++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        if (!d) return 1;
        struct dirent *de;
        while ((de = readdir(d))) {
            if (de->d_name[0] == '.') continue;
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], de->d_name);
            bad |= run_file(path);
            files++;
        }
        closedir(d);
    }
    printf("replay: %d inputs, invariants held\n", files);
    return bad || files == 0;
}
