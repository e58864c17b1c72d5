/* reflect.c — mj_reflect, the build-time reflection tool: reads the kernel templates
 * with libclang and writes the registry the library is built with.
 *
 * How it works
 * ------------
 * A kernel template is a C-style CUDA file (templates/NAME.cu) that opens with declarations:
 *
 *     MJ_TEMPLATE(fixture_saxpy, "y = a*x + y ...")
 *     MJ_TARGETS("sm_80 sm_86 sm_89 sm_90a sm_100a sm_120a sm_121a")
 *     MJ_KNOB_RANGE(BLOCK, int, 32, 1024, "threads per block")
 *     MJ_KNOB_SET(VEC, int, "1 2 4", "consecutive elements per thread")
 *     MJ_KERNEL void fixture_saxpy(int n, float a, const float *MJ_RESTRICT x, ...) { ... }
 *
 * At run time NVRTC compiles the template with templates/prelude_cuda.h in front, where
 * those declarations are no-ops and each knob (BLOCK, VEC) is a #define of the value picked.
 * At build time this tool puts gen/reflect_prelude.h in front instead: there the
 * declarations become `static const int` variables carrying __attribute__((annotate(...)))
 * strings and MJ_KERNEL becomes annotate("mj_kernel"), so everything the registry needs is
 * visible in the AST that libclang (as a plain C11 parser) builds. Two passes per file:
 *
 *   pass 1  parse, tolerating errors (the knobs are not defined yet, so BLOCK is an
 *           undeclared identifier), and read the annotated variables: template name and
 *           doc, targets, knobs;
 *   pass 2  parse again with -DKNOB=<its first allowed value> for every knob; now the
 *           file must be error-free C. Read the annotated function definitions: the
 *           kernels, their parameter names and types.
 *
 * It then writes two files, byte-identical for identical inputs (templates sorted by name,
 * paths relative to --root, no timestamps):
 *
 *   mj_registry.c  the tables of gen/registry.h, with every template's text and the CUDA
 *                  and sim preludes embedded as string literals (nothing reads templates at
 *                  run time); a prelude's `#include "NAME"` lines (templates/prelude_fp.h,
 *                  which both preludes share) are replaced by NAME's text;
 *   mj_kernels.h   MJ_TPL_<template> and MJ_KERNEL_<kernel> constants, and one typed
 *                  launch wrapper per kernel, mj_launch_<kernel>(fn, dims, params...).
 *
 * Every problem is reported as one "file:line: error: ..." line on stderr, exit status 1.
 *
 * usage: mj_reflect --root SRCDIR --reflect-prelude gen/reflect_prelude.h
 *                   --prelude-cuda templates/prelude_cuda.h
 *                   [--prelude-sim templates/prelude_sim.h]
 *                   --out-c OUT/mj_registry.c --out-h OUT/mj_kernels.h TEMPLATE.cu...
 */
#if !defined(_GNU_SOURCE) && !defined(_XOPEN_SOURCE)
#define _XOPEN_SOURCE 700 /* realpath */
#endif

#include "gen.h"
#include "file.h"
#include "strbuf.h"

#include <clang-c/Index.h>

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- what one template declares ------------------------------------------------------ */

static const char *const target_names[MJ_TARGET_COUNT] = {
#define NAME_(e, name, sm, smem) name,
    MJ_TARGET_TABLE(NAME_)
#undef NAME_
};

typedef struct knob {
    char *name, *ctype, *doc;
    mj_knob_kind kind;
    int32_t lo, hi;                     /* SET: the smallest and largest value          */
    int32_t n_values;
    int32_t values[MJ_MAX_KNOB_VALUES];
    unsigned line;
} knob;

typedef struct constraint {
    char *expr, *doc;
    unsigned line;
} constraint;

typedef struct param {
    char *name;
    char *ctype;                        /* as spelled, less restrict/top-level qualifiers */
    char *wrapper_ctype;                /* what the C wrapper declares (typedefs local to
                                           the template resolved)                        */
    bool is_pointer;
    int size;                           /* bytes of the argument on the host             */
} param;

typedef struct kernel {
    char *name;
    int n_params;
    param params[MJ_MAX_PARAMS];
    unsigned line;
} kernel;

typedef struct template {
    const char *path;                   /* as given on the command line (for messages)  */
    char *rel;                          /* relative to --root (stored in the registry)  */
    char *body;                         /* the file's text                              */
    size_t body_len;
    char *name, *doc;
    unsigned name_line;
    uint32_t targets;
    bool have_targets;
    bool pdl;                           /* MJ_PDL: each kernel calls mj_grid_dep_wait()  */
    int n_knobs;
    knob knobs[MJ_MAX_KNOBS];
    int n_constraints;
    constraint constraints[MJ_MAX_CONSTRAINTS];
    int n_kernels;
    kernel *kernels;
} template;

/* ---- errors and memory ------------------------------------------------------------- */

__attribute__((noreturn, format(printf, 1, 2)))
static void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("mj_reflect: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

__attribute__((noreturn, format(printf, 3, 4)))
static void fail_at(const char *file, unsigned line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s:%u: error: ", file, line);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) fail("out of memory");
    return p;
}

static void *xrealloc(void *p, size_t n) {
    p = realloc(p, n ? n : 1);
    if (!p) fail("out of memory");
    return p;
}

static char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    return memcpy(xmalloc(n), s, n);
}

/* ---- output text (base/strbuf.c) ------------------------------------------------------ */

/* The text built in b (b empty again), or exit when memory ran out while building it. */
static char *sb_text(mj_strbuf *b) {
    char *s = mj_sb_take(b);
    if (!s) fail("out of memory");
    return s;
}

/* ---- files and paths --------------------------------------------------------------- */

/* The files named on the command line are the caller's: a symbolic link is followed (the
 * rule in base/file.c), what it leads to must be a regular file, at most 64 MiB. */
#define MJ_REFLECT_MAX_FILE (64u << 20)

static char *read_whole_file(const char *path, size_t *len_out) {
    char *text;
    size_t len;
    if (mj_file_read(AT_FDCWD, path, path, MJ_REFLECT_MAX_FILE, MJ_FILE_FOLLOW, &text, &len) != MJ_OK)
        fail("%s", mj_last_error());
    /* The text is embedded as a C string: a NUL byte would cut it short. */
    const char *nul = memchr(text, '\0', len);
    if (nul) {
        unsigned line = 1;
        for (const char *p = text; p < nul; p++) line += *p == '\n';
        fail_at(path, line, "the file contains a NUL byte");
    }
    *len_out = len;
    return text;
}

/* A prelude as it is embedded: its text with every `#include "NAME"` line replaced by the
 * text of NAME, a file in the prelude's own directory (templates/prelude_fp.h), expanded the
 * same way. NVRTC and the interpreter's compiler get the prelude as a string and read no
 * files, so nothing of it may be left to an include path; <...> includes stay (the sim's
 * host compiler resolves those; NVRTC preludes have none). Anything after the closing
 * quote on the line is dropped. */
static char *read_prelude(const char *path, size_t *len_out, int depth) {
    size_t len;
    char *text = read_whole_file(path, &len);
    const char *slash = strrchr(path, '/');
    int dir_len = slash ? (int)(slash - path) : 1;
    const char *dir = slash ? path : ".";
    mj_strbuf b = MJ_STRBUF_INIT;
    unsigned line = 1;
    for (const char *p = text, *end; p < text + len; p = end, line++) {
        const char *eol = memchr(p, '\n', (size_t)(text + len - p));
        end = eol ? eol + 1 : text + len;
        const char *q = p;
        while (q < end && (*q == ' ' || *q == '\t')) q++;
        if (q < end && *q == '#') {
            q++;
            while (q < end && (*q == ' ' || *q == '\t')) q++;
        } else {
            q = end;
        }
        if (end - q < 7 || strncmp(q, "include", 7) != 0) {
            mj_sb_append(&b, p, (size_t)(end - p));
            continue;
        }
        q += 7;
        while (q < end && (*q == ' ' || *q == '\t')) q++;
        if (q == end || *q != '"') {
            mj_sb_append(&b, p, (size_t)(end - p)); /* #include <...>: left to the compiler */
            continue;
        }
        const char *name = ++q;
        while (q < end && *q != '"' && *q != '\n') q++;
        if (q == end || *q != '"' || q == name)
            fail_at(path, line, "a malformed #include line (want #include \"NAME\")");
        int name_len = (int)(q - name);
        if (memchr(name, '/', (size_t)name_len))
            fail_at(path, line, "#include \"%.*s\": a prelude includes only files beside it", name_len, name);
        if (depth >= 8)
            fail_at(path, line, "#include \"%.*s\": includes nest deeper than 8 (a file includes itself?)",
                    name_len, name);
        size_t inc_path_len = (size_t)dir_len + (size_t)name_len + 2;
        char *inc_path = xmalloc(inc_path_len);
        snprintf(inc_path, inc_path_len, "%.*s/%.*s", dir_len, dir, name_len, name);
        FILE *f = fopen(inc_path, "rb");
        if (!f) fail_at(path, line, "#include \"%.*s\": cannot read %s: %s", name_len, name, inc_path, strerror(errno));
        fclose(f);
        size_t inc_len;
        char *inc = read_prelude(inc_path, &inc_len, depth + 1);
        mj_sb_append(&b, inc, inc_len);
        if (inc_len && inc[inc_len - 1] != '\n') mj_sb_append(&b, "\n", 1);
        free(inc);
        free(inc_path);
    }
    free(text);
    *len_out = b.len;
    char *out = mj_sb_take(&b);
    if (!out) fail("out of memory");
    return out;
}

static char *absolute_path(const char *path) {
    char *abs = realpath(path, NULL);
    if (!abs) fail("cannot find %s: %s", path, strerror(errno));
    return abs;
}

/* The path of file relative to the directory root (both resolved), or exit. */
static char *relative_to_root(const char *file, const char *root_abs) {
    char *abs = absolute_path(file);
    size_t n = strlen(root_abs);
    if (n == 1) n = 0;  /* --root / */
    if (strncmp(abs, root_abs, n) != 0 || abs[n] != '/')
        fail("template %s is not under --root %s", file, root_abs);
    char *rel = xstrdup(abs + n + 1);
    free(abs);
    return rel;
}

static void write_file(const char *path, const mj_strbuf *b) {
    if (b->oom) fail("out of memory");
    size_t tmp_len = strlen(path) + 5;
    char *tmp = xmalloc(tmp_len);
    snprintf(tmp, tmp_len, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) fail("cannot write %s: %s", tmp, strerror(errno));
    if (fwrite(b->data, 1, b->len, f) != b->len || fclose(f) != 0)
        fail("cannot write %s: %s", tmp, strerror(errno));
    if (rename(tmp, path) != 0) fail("cannot rename %s to %s: %s", tmp, path, strerror(errno));
    free(tmp);
}

/* ---- small parsers ------------------------------------------------------------------ */

static bool is_identifier(const char *s) {
    if (!(isalpha((unsigned char)*s) || *s == '_')) return false;
    for (s++; *s; s++)
        if (!(isalnum((unsigned char)*s) || *s == '_')) return false;
    return true;
}

static bool parse_int32(const char *s, int32_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end != '\0' || errno || v < INT32_MIN || v > INT32_MAX) return false;
    *out = (int32_t)v;
    return true;
}

/* Cut the next '|'-separated field off *rest (NULL when there is none left). */
static char *next_field(char **rest) {
    char *field = *rest;
    if (!field) return NULL;
    char *bar = strchr(field, '|');
    if (bar) {
        *bar = '\0';
        *rest = bar + 1;
    } else {
        *rest = NULL;
    }
    return field;
}

/* ---- libclang helpers --------------------------------------------------------------- */

static char *take_string(CXString s) {
    char *copy = xstrdup(clang_getCString(s) ? clang_getCString(s) : "");
    clang_disposeString(s);
    return copy;
}

static unsigned cursor_line(CXCursor c) {
    unsigned line = 0;
    clang_getExpansionLocation(clang_getCursorLocation(c), NULL, &line, NULL, NULL);
    return line;
}

typedef struct annotation_search {
    char *found;       /* the first annotation string starting with "mj_", or NULL */
    bool conflict;     /* a second, different one */
} annotation_search;

static enum CXChildVisitResult visit_annotation(CXCursor c, CXCursor parent, CXClientData data) {
    (void)parent;
    annotation_search *s = data;
    if (clang_getCursorKind(c) == CXCursor_AnnotateAttr) {
        char *text = take_string(clang_getCursorSpelling(c));
        if (strncmp(text, "mj_", 3) != 0) free(text);
        else if (!s->found) s->found = text;
        else {
            s->conflict |= strcmp(s->found, text) != 0;
            free(text);
        }
    }
    return CXChildVisit_Continue;
}

/* The moejit annotation on a declaration ("mj_..."), or NULL. (A redeclaration also
 * carries the annotations it inherits from the first declaration: the same one twice is
 * fine, two different ones are not.) */
static annotation_search find_annotation(CXCursor decl) {
    annotation_search s = {0};
    clang_visitChildren(decl, visit_annotation, &s);
    return s;
}

static char *mj_annotation(CXCursor decl, const char *file) {
    annotation_search s = find_annotation(decl);
    if (s.conflict)
        fail_at(file, cursor_line(decl), "a declaration carries two different moejit annotations");
    return s.found;
}

/* Parse file as C11 with the reflect prelude in front; extra_args are appended. */
static CXTranslationUnit parse_template(CXIndex index, const char *file, const char *prelude_abs,
                                        const char *const *extra_args, int n_extra,
                                        unsigned options) {
    const char *base[] = {"-x", "c", "-std=gnu11", "-w", "-ferror-limit=0",
                          "-include", "stdbool.h", "-include", prelude_abs};
    enum { N_BASE = sizeof base / sizeof base[0] };
    const char **args = xmalloc(sizeof(char *) * (N_BASE + (size_t)n_extra));
    memcpy(args, base, sizeof base);
    for (int i = 0; i < n_extra; i++) args[N_BASE + i] = extra_args[i];
    CXTranslationUnit tu = NULL;
    enum CXErrorCode err = clang_parseTranslationUnit2(index, file, args, N_BASE + n_extra,
                                                       NULL, 0, options, &tu);
    free(args);
    if (err != CXError_Success || !tu)
        fail_at(file, 1, "libclang could not parse the file (error %d)", (int)err);
    return tu;
}

/* Print every diagnostic of at least min_severity as file:line:col; return how many. */
static int report_diagnostics(CXTranslationUnit tu, enum CXDiagnosticSeverity min_severity,
                              const char *note) {
    int errors = 0;
    unsigned n = clang_getNumDiagnostics(tu);
    for (unsigned i = 0; i < n; i++) {
        CXDiagnostic d = clang_getDiagnostic(tu, i);
        if (clang_getDiagnosticSeverity(d) >= min_severity) {
            CXFile f;
            unsigned line = 0, col = 0;
            clang_getExpansionLocation(clang_getDiagnosticLocation(d), &f, &line, &col, NULL);
            char *fname = f ? take_string(clang_getFileName(f)) : xstrdup("<command line>");
            char *msg = take_string(clang_getDiagnosticSpelling(d));
            fprintf(stderr, "%s:%u:%u: error: %s%s\n", fname, line, col, msg, note);
            free(fname);
            free(msg);
            errors++;
        }
        clang_disposeDiagnostic(d);
    }
    return errors;
}

/* Visit the top-level cursors of the template file itself (not of the preludes), calling
 * fn on each. A declaration counts where its macro was expanded: the names that
 * MJ_TEMPLATE & co. paste together are spelled in clang's scratch buffer, which is why
 * clang_Location_isFromMainFile (spelling-based in libclang 14) is no use here. */
typedef void (*decl_fn)(CXCursor c, template *t);
typedef struct walk { decl_fn fn; template *t; CXFile main_file; } walk;

static enum CXChildVisitResult visit_top(CXCursor c, CXCursor parent, CXClientData data) {
    (void)parent;
    walk *w = data;
    CXFile file = NULL;
    clang_getExpansionLocation(clang_getCursorLocation(c), &file, NULL, NULL, NULL);
    if (file && clang_File_isEqual(file, w->main_file)) w->fn(c, w->t);
    return CXChildVisit_Continue;
}

static void walk_main_file(CXTranslationUnit tu, decl_fn fn, template *t) {
    walk w = {fn, t, clang_getFile(tu, t->path)};
    if (!w.main_file) fail_at(t->path, 1, "libclang lost track of the file");
    clang_visitChildren(clang_getTranslationUnitCursor(tu), visit_top, &w);
}

/* ---- pass 1: the declarations ---------------------------------------------------------- */

static void declare_template(template *t, char *rest, unsigned line) {
    char *name = next_field(&rest), *doc = rest;
    if (t->name)
        fail_at(t->path, line, "a second MJ_TEMPLATE (the first is on line %u); a file declares one",
                t->name_line);
    if (!name || !doc) fail_at(t->path, line, "malformed MJ_TEMPLATE annotation");
    if (!is_identifier(name)) fail_at(t->path, line, "MJ_TEMPLATE name '%s' is not a C identifier", name);
    if (strchr(doc, '\n')) fail_at(t->path, line, "the doc of MJ_TEMPLATE(%s) must be one line", name);
    t->name = xstrdup(name);
    t->doc = xstrdup(doc);
    t->name_line = line;
}

static int target_from_name(const char *word) {
    for (int i = 0; i < MJ_TARGET_COUNT; i++)
        if (strcmp(word, target_names[i]) == 0) return i;
    return -1;
}

static void declare_targets(template *t, char *list, unsigned line) {
    if (t->have_targets) fail_at(t->path, line, "a second MJ_TARGETS; a file declares one");
    t->have_targets = true;
    for (char *word = strtok(list, " \t"); word; word = strtok(NULL, " \t")) {
        int i = target_from_name(word);
        if (i < 0)
            fail_at(t->path, line, "unknown target '%s' in MJ_TARGETS (known: %s)", word, MJ_TARGET_LIST);
        if (t->targets & (1u << i)) fail_at(t->path, line, "target %s listed twice in MJ_TARGETS", word);
        t->targets |= 1u << i;
    }
    if (!t->targets) fail_at(t->path, line, "MJ_TARGETS lists no target");
}

/* Check that a knob's allowed values fit its C type. */
static void check_knob_values(const template *t, const knob *k) {
    int32_t lo = k->lo, hi = k->hi;
    if (strcmp(k->ctype, "bool") == 0 && (lo < 0 || hi > 1))
        fail_at(t->path, k->line, "knob %s is bool: its values must be 0 or 1", k->name);
    if (strcmp(k->ctype, "unsigned") == 0 && lo < 0)
        fail_at(t->path, k->line, "knob %s is unsigned: its values must not be negative", k->name);
}

static void parse_knob_set(const template *t, knob *k, char *list) {
    for (char *word = strtok(list, " \t"); word; word = strtok(NULL, " \t")) {
        int32_t v;
        if (!parse_int32(word, &v))
            fail_at(t->path, k->line, "knob %s: set value '%s' is not a 32-bit integer", k->name, word);
        if (k->n_values == MJ_MAX_KNOB_VALUES)
            fail_at(t->path, k->line, "knob %s: more than %d values in the set", k->name,
                    MJ_MAX_KNOB_VALUES);
        for (int i = 0; i < k->n_values; i++)
            if (k->values[i] == v)
                fail_at(t->path, k->line, "knob %s: value %d listed twice", k->name, (int)v);
        k->values[k->n_values++] = v;
        if (k->n_values == 1 || v < k->lo) k->lo = v;
        if (k->n_values == 1 || v > k->hi) k->hi = v;
    }
    if (k->n_values == 0) fail_at(t->path, k->line, "knob %s: the set of values is empty", k->name);
}

static void declare_knob(template *t, char *rest, unsigned line) {
    knob k = {.line = line};
    char *kind = next_field(&rest), *name = next_field(&rest), *ctype = next_field(&rest);
    if (!kind || !name || !ctype || !rest) fail_at(t->path, line, "malformed MJ_KNOB annotation");
    if (!is_identifier(name)) fail_at(t->path, line, "knob name '%s' is not a C identifier", name);
    k.name = name;
    if (strcmp(ctype, "int") != 0 && strcmp(ctype, "unsigned") != 0 && strcmp(ctype, "bool") != 0)
        fail_at(t->path, line, "knob %s: type '%s' is not one of int, unsigned, bool", name, ctype);
    if (strcmp(kind, "range") == 0) {
        k.kind = MJ_KNOB_KIND_RANGE;
        char *lo = next_field(&rest), *hi = next_field(&rest);
        if (!lo || !hi || !rest) fail_at(t->path, line, "malformed MJ_KNOB_RANGE annotation for %s", name);
        if (!parse_int32(lo, &k.lo))
            fail_at(t->path, line, "knob %s: LO '%s' is not a 32-bit integer", name, lo);
        if (!parse_int32(hi, &k.hi))
            fail_at(t->path, line, "knob %s: HI '%s' is not a 32-bit integer", name, hi);
        if (k.lo > k.hi) fail_at(t->path, line, "knob %s: range LO %d > HI %d", name, (int)k.lo, (int)k.hi);
    } else if (strcmp(kind, "set") == 0) {
        k.kind = MJ_KNOB_KIND_SET;
        char *values = next_field(&rest);
        if (!values || !rest) fail_at(t->path, line, "malformed MJ_KNOB_SET annotation for %s", name);
        parse_knob_set(t, &k, values);
    } else {
        fail_at(t->path, line, "knob %s: unknown kind '%s' (range or set)", name, kind);
    }
    if (strchr(rest, '\n')) fail_at(t->path, line, "knob %s: the doc must be one line", name);
    for (int i = 0; i < t->n_knobs; i++)
        if (strcmp(t->knobs[i].name, name) == 0)
            fail_at(t->path, line, "duplicate knob name %s (first on line %u)", name, t->knobs[i].line);
    if (t->n_knobs == MJ_MAX_KNOBS) fail_at(t->path, line, "more than %d knobs", MJ_MAX_KNOBS);
    k.name = xstrdup(name);
    k.ctype = xstrdup(ctype);
    k.doc = xstrdup(rest);
    check_knob_values(t, &k);
    t->knobs[t->n_knobs++] = k;
}

/* MJ_CONSTRAINT("expr", "doc"): the annotation is "mj_constraint|doc|expr" (the doc first:
 * an expression may itself contain '|'). The expression must parse and name only knobs
 * declared before it; it is checked for syntax here and evaluated at render time. */
static void declare_constraint(template *t, char *rest, unsigned line) {
    char *doc = next_field(&rest), *expr = rest;
    if (!doc || !expr) fail_at(t->path, line, "malformed MJ_CONSTRAINT annotation (a '|' in its doc?)");
    if (strchr(doc, '\n') || strchr(expr, '\n'))
        fail_at(t->path, line, "MJ_CONSTRAINT: the expression and the doc must be one line each");
    if (!*doc) fail_at(t->path, line, "MJ_CONSTRAINT(\"%s\"): say why in its doc", expr);
    if (t->n_constraints == MJ_MAX_CONSTRAINTS)
        fail_at(t->path, line, "more than %d constraints", MJ_MAX_CONSTRAINTS);
    const char *names[MJ_MAX_KNOBS + 1];
    int32_t values[MJ_MAX_KNOBS + 1];
    for (int i = 0; i < t->n_knobs; i++) names[i] = t->knobs[i].name, values[i] = 1;
    names[t->n_knobs] = "SM", values[t->n_knobs] = 1; /* the target's sm number */
    char err[512];
    /* Syntax and names only: every knob at 1 (a division by a knob cannot fault then). */
    int64_t v;
    if (mj_constraint_eval(expr, names, values, t->n_knobs + 1, &v, err, sizeof err) != 0 &&
        !strstr(err, "division by zero") && !strstr(err, "shift out of range"))
        fail_at(t->path, line, "MJ_CONSTRAINT: %s (declare the knobs it names before it)", err);
    constraint c = {xstrdup(expr), xstrdup(doc), line};
    t->constraints[t->n_constraints++] = c;
}

/* A second MJ_TEMPLATE/MJ_TARGETS/MJ_KNOB_* of the same name redeclares its variable
 * (mj_decl_knob_BLOCK, ...): say which declaration is repeated. */
static void check_not_redeclared(CXCursor c, const template *t) {
    CXCursor first = clang_getCanonicalCursor(c);
    if (clang_equalCursors(first, c)) return;
    char *var = take_string(clang_getCursorSpelling(c));
    unsigned line = cursor_line(c), first_line = cursor_line(first);
    if (strncmp(var, "mj_decl_knob_", 13) == 0)
        fail_at(t->path, line, "duplicate knob name %s (first on line %u)", var + 13, first_line);
    if (strcmp(var, "mj_decl_targets") == 0)
        fail_at(t->path, line, "a second MJ_TARGETS (the first is on line %u); a file declares one",
                first_line);
    if (strncmp(var, "mj_decl_template_", 17) == 0)
        fail_at(t->path, line, "a second MJ_TEMPLATE (the first is on line %u); a file declares one",
                first_line);
    fail_at(t->path, line, "%s is declared twice (first on line %u)", var, first_line);
}

static void pass1_declaration(CXCursor c, template *t) {
    if (clang_getCursorKind(c) != CXCursor_VarDecl) return;
    annotation_search found = find_annotation(c);
    if (!found.found) return;
    check_not_redeclared(c, t);  /* before the conflict check: the clearer message */
    unsigned line = cursor_line(c);
    if (found.conflict) fail_at(t->path, line, "a declaration carries two different moejit annotations");
    char *note = found.found, *rest = note;
    char *tag = next_field(&rest);
    if (strcmp(tag, "mj_template") == 0) declare_template(t, rest, line);
    else if (strcmp(tag, "mj_targets") == 0) declare_targets(t, rest ? rest : (char *)"", line);
    else if (strcmp(tag, "mj_knob") == 0) declare_knob(t, rest, line);
    else if (strcmp(tag, "mj_constraint") == 0) declare_constraint(t, rest, line);
    else if (strcmp(tag, "mj_pdl") == 0) t->pdl = true;
    else if (strcmp(tag, "mj_kernel") != 0) fail_at(t->path, line, "unknown moejit annotation '%s'", tag);
    free(note);
}

static void pass1(CXIndex index, template *t, const char *prelude_abs) {
    unsigned options = CXTranslationUnit_SkipFunctionBodies | CXTranslationUnit_KeepGoing;
    CXTranslationUnit tu = parse_template(index, t->path, prelude_abs, NULL, 0, options);
    /* Errors are expected here (knobs are undeclared); only fatal ones stop us. */
    if (report_diagnostics(tu, CXDiagnostic_Fatal, "") > 0) exit(1);
    walk_main_file(tu, pass1_declaration, t);
    clang_disposeTranslationUnit(tu);
    if (!t->name) fail_at(t->path, 1, "no MJ_TEMPLATE(name, doc) declaration");
    if (!t->have_targets) fail_at(t->path, 1, "no MJ_TARGETS(\"sm_...\") declaration");
}

/* ---- pass 2: the kernels ------------------------------------------------------------- */

static bool is_scalar_kind(enum CXTypeKind k) {
    return (k >= CXType_Bool && k <= CXType_LongDouble) || k == CXType_Float128 ||
           k == CXType_Half || k == CXType_Float16 || k == CXType_BFloat16;
}

/* A type's spelling without const/volatile/restrict words and with _Bool written bool. */
static char *spelling_without_qualifiers(const char *spelled, bool keep_const_volatile) {
    mj_strbuf b = MJ_STRBUF_INIT;
    char *copy = xstrdup(spelled);
    for (char *word = strtok(copy, " "); word; word = strtok(NULL, " ")) {
        if (strcmp(word, "restrict") == 0 || strcmp(word, "__restrict") == 0) continue;
        if (!keep_const_volatile && (strcmp(word, "const") == 0 || strcmp(word, "volatile") == 0)) continue;
        if (b.len) mj_sb_puts(&b, " ");
        mj_sb_puts(&b, strcmp(word, "_Bool") == 0 ? "bool" : word);
    }
    free(copy);
    return sb_text(&b);
}

/* Whether a type names a typedef that the template itself declares (a C wrapper outside
 * the template would not know it; uint32_t and friends from <stdint.h> it does know). */
static bool is_local_typedef(CXType t) {
    if (t.kind != CXType_Typedef) return false;
    CXSourceLocation loc = clang_getCursorLocation(clang_getTypeDeclaration(t));
    return !clang_Location_isInSystemHeader(loc);
}

/* Spelling of a scalar type, or of a pointer's pointee, for the registry and the wrapper. */
static void spell_type(CXType t, bool keep_qualifiers, char **ctype, char **wrapper_ctype) {
    char *spelled = take_string(clang_getTypeSpelling(t));
    *ctype = spelling_without_qualifiers(spelled, keep_qualifiers);
    free(spelled);
    if (is_local_typedef(t)) {
        spelled = take_string(clang_getTypeSpelling(clang_getCanonicalType(t)));
        *wrapper_ctype = spelling_without_qualifiers(spelled, keep_qualifiers);
        free(spelled);
    } else {
        *wrapper_ctype = xstrdup(*ctype);
    }
}

static char *append_star(char *s) {
    size_t n = strlen(s);
    s = xrealloc(s, n + 3);
    memcpy(s + n, " *", 3);
    return s;
}

static void read_param(const template *t, const kernel *k, CXCursor parm, int index, param *out) {
    unsigned line = cursor_line(parm);
    out->name = take_string(clang_getCursorSpelling(parm));
    if (!out->name[0]) fail_at(t->path, line, "kernel %s: parameter %d has no name", k->name, index + 1);
    if (strncmp(out->name, "mj_", 3) == 0)
        fail_at(t->path, line, "kernel %s: parameter %s: names starting mj_ are reserved for the "
                "generated wrapper", k->name, out->name);
    CXType type = clang_getCursorType(parm);
    char *spelled = take_string(clang_getTypeSpelling(type));
    CXType canon = clang_getCanonicalType(type);
    /* An array parameter has decayed to a pointer, but its spelling still says [..]. */
    bool ok = !strchr(spelled, '[');
    if (ok && canon.kind == CXType_Pointer) {
        CXType pointee = clang_getPointeeType(type);
        enum CXTypeKind pk = clang_getCanonicalType(pointee).kind;
        ok = pk == CXType_Void || is_scalar_kind(pk);
        if (ok) {
            spell_type(pointee, true, &out->ctype, &out->wrapper_ctype);
            out->ctype = append_star(out->ctype);
            out->wrapper_ctype = append_star(out->wrapper_ctype);
            out->is_pointer = true;
        }
    } else if (ok) {
        ok = is_scalar_kind(canon.kind);
        if (ok) spell_type(type, false, &out->ctype, &out->wrapper_ctype);
    }
    long long size = clang_Type_getSizeOf(canon);
    if (ok && (size <= 0 || size > 16))
        fail_at(t->path, line, "kernel %s: parameter %s: cannot tell the size of '%s'", k->name, out->name, spelled);
    out->size = (int)size;
    if (!ok)
        fail_at(t->path, line, "kernel %s: parameter %s has type '%s'; a kernel parameter must be "
                "an integer, floating-point or bool scalar, or a pointer to one (or void *)",
                k->name, out->name, spelled);
    free(spelled);
}

static void pass2_declaration(CXCursor c, template *t) {
    if (clang_getCursorKind(c) != CXCursor_FunctionDecl || !clang_isCursorDefinition(c)) return;
    char *note = mj_annotation(c, t->path);
    if (!note) return;
    bool is_kernel = strcmp(note, "mj_kernel") == 0;
    free(note);
    if (!is_kernel) return;
    kernel k = {.line = cursor_line(c), .name = take_string(clang_getCursorSpelling(c))};
    CXType ftype = clang_getCursorType(c);
    if (clang_getResultType(ftype).kind != CXType_Void) {
        char *ret = take_string(clang_getTypeSpelling(clang_getResultType(ftype)));
        fail_at(t->path, k.line, "kernel %s returns %s; a kernel must return void", k.name, ret);
    }
    /* "void k()" has no prototype in C but means "no parameters" in CUDA's C++: fine. */
    if (ftype.kind == CXType_FunctionProto && clang_isFunctionTypeVariadic(ftype))
        fail_at(t->path, k.line, "kernel %s is variadic", k.name);
    int n = clang_Cursor_getNumArguments(c);
    if (n > MJ_MAX_PARAMS)
        fail_at(t->path, k.line, "kernel %s has %d parameters (at most %d)", k.name, n, MJ_MAX_PARAMS);
    for (int i = 0; i < n; i++)
        read_param(t, &k, clang_Cursor_getArgument(c, (unsigned)i), i, &k.params[i]);
    k.n_params = n < 0 ? 0 : n;
    if (t->pdl) { /* MJ_PDL: the kernel's own text must wait on the grid before the one before */
        CXSourceRange ext = clang_getCursorExtent(c);
        unsigned b0 = 0, b1 = 0;
        clang_getSpellingLocation(clang_getRangeStart(ext), NULL, NULL, NULL, &b0);
        clang_getSpellingLocation(clang_getRangeEnd(ext), NULL, NULL, NULL, &b1);
        const char *call = "mj_grid_dep_wait();";
        bool found = false;
        for (size_t i = b0; !found && b1 <= t->body_len && i + strlen(call) <= b1; i++)
            found = memcmp(t->body + i, call, strlen(call)) == 0;
        if (!found)
            fail_at(t->path, k.line, "kernel %s: the template declares MJ_PDL, so the kernel must call "
                    "mj_grid_dep_wait(); before it reads or writes global memory", k.name);
    }
    t->kernels = xrealloc(t->kernels, sizeof(kernel) * (size_t)(t->n_kernels + 1));
    t->kernels[t->n_kernels++] = k;
}

static void pass2(CXIndex index, template *t, const char *prelude_abs) {
    char *defines[MJ_MAX_KNOBS];
    for (int i = 0; i < t->n_knobs; i++) {
        const knob *k = &t->knobs[i];
        int32_t v = k->kind == MJ_KNOB_KIND_SET ? k->values[0] : k->lo;
        size_t len = strlen(k->name) + 32;
        defines[i] = xmalloc(len);
        snprintf(defines[i], len, "-D%s=%d", k->name, (int)v);
    }
    CXTranslationUnit tu = parse_template(index, t->path, prelude_abs, (const char *const *)defines,
                                          t->n_knobs, CXTranslationUnit_None);
    for (int i = 0; i < t->n_knobs; i++) free(defines[i]);
    if (report_diagnostics(tu, CXDiagnostic_Error, " (with every knob at its first value)") > 0)
        exit(1);
    walk_main_file(tu, pass2_declaration, t);
    clang_disposeTranslationUnit(tu);
    if (t->n_kernels == 0) fail_at(t->path, 1, "no MJ_KERNEL function definition");
    if (t->n_kernels > MJ_MAX_KERNELS)
        fail_at(t->path, t->kernels[MJ_MAX_KERNELS].line, "template %s defines %d kernels; at most %d "
                "(MJ_MAX_KERNELS in gen/registry.h)", t->name, t->n_kernels, MJ_MAX_KERNELS);
}

/* ---- all templates together ----------------------------------------------------------- */

static int compare_templates(const void *a, const void *b) {
    return strcmp(((const template *)a)->name, ((const template *)b)->name);
}

static void check_unique_names(const template *ts, int n) {
    for (int i = 1; i < n; i++)
        if (strcmp(ts[i - 1].name, ts[i].name) == 0)
            fail_at(ts[i].path, ts[i].name_line, "template name %s is also declared in %s",
                    ts[i].name, ts[i - 1].path);
    for (int i = 0; i < n; i++)
        for (int a = 0; a < ts[i].n_kernels; a++)
            for (int j = 0; j <= i; j++)
                for (int b = 0; b < (j == i ? a : ts[j].n_kernels); b++)
                    if (strcmp(ts[i].kernels[a].name, ts[j].kernels[b].name) == 0)
                        fail_at(ts[i].path, ts[i].kernels[a].line, "kernel name %s is also used in %s:%u",
                                ts[i].kernels[a].name, ts[j].path, ts[j].kernels[b].line);
}

/* ---- writing C ---------------------------------------------------------------------- */

enum { PIECE_MAX = 1900 };  /* escaped characters per string literal piece */

/* Append text as one or more adjacent C string literals: a new piece after every
 * newline and every PIECE_MAX characters, each further piece on a new line at indent. */
static void sb_c_string(mj_strbuf *b, const char *s, size_t n, const char *indent) {
    size_t piece = 0;
    mj_sb_puts(b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        char esc[8];
        if (ch == '\\') strcpy(esc, "\\\\");
        else if (ch == '"') strcpy(esc, "\\\"");
        else if (ch == '\n') strcpy(esc, "\\n");
        else if (ch == '\t') strcpy(esc, "\\t");
        else if (ch == '\r') strcpy(esc, "\\r");
        else if (ch == '?' && i > 0 && s[i - 1] == '?') strcpy(esc, "\\?"); /* no trigraphs */
        else if (ch >= 0x20 && ch < 0x7f) { esc[0] = (char)ch; esc[1] = '\0'; }
        else snprintf(esc, sizeof esc, "\\%03o", ch);
        mj_sb_puts(b, esc);
        piece += strlen(esc);
        if (i + 1 < n && (ch == '\n' || piece >= PIECE_MAX)) {
            mj_sb_printf(b, "\"\n%s\"", indent);
            piece = 0;
        }
    }
    mj_sb_puts(b, "\"");
}

static void sb_c_str(mj_strbuf *b, const char *s) { sb_c_string(b, s, strlen(s), ""); }

static char *targets_comment(uint32_t mask) {
    mj_strbuf b = MJ_STRBUF_INIT;
    for (int i = 0; i < MJ_TARGET_COUNT; i++)
        if (mask & (1u << i)) mj_sb_printf(&b, "%s%s", b.len ? " " : "", target_names[i]);
    return sb_text(&b);
}

static void emit_knobs(mj_strbuf *b, const template *t) {
    if (t->n_knobs == 0) return;
    mj_sb_printf(b, "static const mj_knob_desc mj_knobs_%s[%d] = {\n", t->name, t->n_knobs);
    for (int i = 0; i < t->n_knobs; i++) {
        const knob *k = &t->knobs[i];
        mj_sb_puts(b, "    {.name = ");
        sb_c_str(b, k->name);
        mj_sb_puts(b, ", .ctype = ");
        sb_c_str(b, k->ctype);
        mj_sb_puts(b, ",\n     .doc = ");
        sb_c_str(b, k->doc);
        mj_sb_printf(b, ",\n     .kind = %s, .lo = %d, .hi = %d, .n_values = %d",
                  k->kind == MJ_KNOB_KIND_SET ? "MJ_KNOB_KIND_SET" : "MJ_KNOB_KIND_RANGE",
                  (int)k->lo, (int)k->hi, (int)k->n_values);
        if (k->n_values) {
            mj_sb_puts(b, ", .values = {");
            for (int v = 0; v < k->n_values; v++) mj_sb_printf(b, "%s%d", v ? ", " : "", (int)k->values[v]);
            mj_sb_puts(b, "}");
        }
        mj_sb_puts(b, "},\n");
    }
    mj_sb_puts(b, "};\n\n");
}

static void emit_kernels(mj_strbuf *b, const template *t) {
    for (int i = 0; i < t->n_kernels; i++) {
        const kernel *k = &t->kernels[i];
        if (k->n_params == 0) continue;
        mj_sb_printf(b, "static const mj_param_desc mj_params_%s[%d] = {\n", k->name, k->n_params);
        for (int p = 0; p < k->n_params; p++) {
            mj_sb_puts(b, "    {.name = ");
            sb_c_str(b, k->params[p].name);
            mj_sb_puts(b, ", .ctype = ");
            sb_c_str(b, k->params[p].ctype);
            mj_sb_printf(b, ", .size = %d},\n", k->params[p].size);
        }
        mj_sb_puts(b, "};\n\n");
    }
    mj_sb_printf(b, "static const mj_kernel_desc mj_kernels_%s[%d] = {\n", t->name, t->n_kernels);
    for (int i = 0; i < t->n_kernels; i++) {
        const kernel *k = &t->kernels[i];
        mj_sb_puts(b, "    {.name = ");
        sb_c_str(b, k->name);
        if (k->n_params) mj_sb_printf(b, ", .n_params = %d, .params = mj_params_%s},\n", k->n_params, k->name);
        else mj_sb_puts(b, ", .n_params = 0, .params = NULL},\n");
    }
    mj_sb_puts(b, "};\n\n");
}

static void emit_constraints(mj_strbuf *b, const template *t) {
    if (t->n_constraints == 0) return;
    mj_sb_printf(b, "static const mj_constraint_desc mj_constraints_%s[%d] = {\n", t->name, t->n_constraints);
    for (int i = 0; i < t->n_constraints; i++) {
        mj_sb_puts(b, "    {.expr = ");
        sb_c_str(b, t->constraints[i].expr);
        mj_sb_puts(b, ", .doc = ");
        sb_c_str(b, t->constraints[i].doc);
        mj_sb_puts(b, "},\n");
    }
    mj_sb_puts(b, "};\n\n");
}

static void emit_template_entry(mj_strbuf *b, const template *t) {
    char *targets = targets_comment(t->targets);
    mj_sb_puts(b, "    {\n        .name = ");
    sb_c_str(b, t->name);
    mj_sb_puts(b, ",\n        .doc = ");
    sb_c_str(b, t->doc);
    mj_sb_puts(b, ",\n        .file = ");
    sb_c_str(b, t->rel);
    mj_sb_printf(b, ",\n        .body = mj_body_%s,\n", t->name);
    mj_sb_printf(b, "        .targets = 0x%02xu, /* %s */\n", (unsigned)t->targets, targets);
    mj_sb_printf(b, "        .pdl = %d,\n", t->pdl ? 1 : 0);
    mj_sb_printf(b, "        .n_knobs = %d,\n", t->n_knobs);
    if (t->n_knobs) mj_sb_printf(b, "        .knobs = mj_knobs_%s,\n", t->name);
    else mj_sb_puts(b, "        .knobs = NULL,\n");
    mj_sb_printf(b, "        .n_constraints = %d,\n", t->n_constraints);
    if (t->n_constraints) mj_sb_printf(b, "        .constraints = mj_constraints_%s,\n", t->name);
    else mj_sb_puts(b, "        .constraints = NULL,\n");
    mj_sb_printf(b, "        .n_kernels = %d,\n", t->n_kernels);
    mj_sb_printf(b, "        .kernels = mj_kernels_%s,\n    },\n", t->name);
    free(targets);
}

/* The registry's C file. The library's table (`table` mj_registry) also carries the
 * preludes; an extension table (a test program's fixtures) instead registers itself at
 * start-up, numbered after the library's templates. */
static void emit_registry_c(mj_strbuf *b, const template *ts, int n, const char *table, bool extension,
                            const char *prelude_text, size_t prelude_len, const char *sim_text,
                            size_t sim_len) {
    mj_sb_printf(b, "/* %s.c — generated by gen/reflect.c (mj_reflect) from %d kernel template%s;\n"
                 " * do not edit. The tables are described in gen/registry.h. */\n"
                 "#include \"%s\"\n\n#include <stddef.h>\n\n", table, n, n == 1 ? "" : "s",
              extension ? "gen.h" : "registry.h");
    for (int i = 0; i < n; i++) {
        const template *t = &ts[i];
        mj_sb_printf(b, "/* ---- %s: %s ---- */\n\n", t->name, t->rel);
        mj_sb_printf(b, "static const char mj_body_%s[] =\n    ", t->name);
        sb_c_string(b, t->body, t->body_len, "    ");
        mj_sb_puts(b, ";\n\n");
        emit_knobs(b, t);
        emit_constraints(b, t);
        emit_kernels(b, t);
    }
    mj_sb_puts(b, "/* ---- the templates, sorted by name ---- */\n\n");
    if (n == 0) {
        mj_sb_printf(b, "/* No templates: C allows no empty array, so one unused entry. */\n"
                     "%sconst mj_template_desc %s_templates[1] = {{.name = NULL}};\n",
                  extension ? "static " : "", table);
    } else {
        mj_sb_printf(b, "%sconst mj_template_desc %s_templates[%d] = {\n", extension ? "static " : "", table, n);
        for (int i = 0; i < n; i++) emit_template_entry(b, &ts[i]);
        mj_sb_puts(b, "};\n");
    }
    if (extension) {
        mj_sb_printf(b, "\n/* Linked into a program, this table joins the library's at start-up. */\n"
                     "__attribute__((constructor)) static void %s_register(void) {\n"
                     "    mj_registry_extend(%s_templates, %d);\n}\n", table, table, n);
        return;
    }
    mj_sb_printf(b, "const int32_t %s_n_templates = %d;\n\n", table, n);
    mj_sb_puts(b, "/* ---- templates/prelude_cuda.h ---- */\n\n");
    mj_sb_printf(b, "const char %s_prelude_cuda[] =\n    ", table);
    sb_c_string(b, prelude_text, prelude_len, "    ");
    mj_sb_puts(b, ";\n");
    /* Without --prelude-sim the sim prelude is empty: rendering for the sim then fails. */
    mj_sb_puts(b, "\n/* ---- templates/prelude_sim.h ---- */\n\n");
    mj_sb_printf(b, "const char %s_prelude_sim[] =\n    ", table);
    sb_c_string(b, sim_text, sim_len, "    ");
    mj_sb_puts(b, ";\n");
}

/* "int n, float a, const float *x" for comments: no space after a '*'. */
static void sb_signature(mj_strbuf *b, const kernel *k) {
    for (int p = 0; p < k->n_params; p++) {
        const param *q = &k->params[p];
        size_t len = strlen(q->wrapper_ctype);
        bool star = len > 0 && q->wrapper_ctype[len - 1] == '*';
        mj_sb_printf(b, "%s%s%s%s", p ? ", " : "", q->wrapper_ctype, star ? "" : " ", q->name);
    }
    if (k->n_params == 0) mj_sb_puts(b, "void");
}

static void emit_wrapper(mj_strbuf *b, const template *t, int kernel_index) {
    const kernel *k = &t->kernels[kernel_index];
    mj_sb_printf(b, "/* %s(", k->name);
    sb_signature(b, k);
    mj_sb_printf(b, ") — %s */\n", t->rel);
    char head[256];
    int indent = snprintf(head, sizeof head, "static inline mj_status mj_launch_%s(", k->name);
    mj_sb_printf(b, "%sconst mj_function *mj_fn, mj_launch_dims mj_dims", head);
    int column = 1000;  /* force a new line before the first parameter */
    for (int p = 0; p < k->n_params; p++) {
        const param *q = &k->params[p];
        int width = (int)(strlen(q->wrapper_ctype) + strlen(q->name) + 3);
        if (column + width > 96) {
            mj_sb_printf(b, ",\n%*s", indent, "");
            column = indent;
        } else {
            mj_sb_puts(b, ", ");
        }
        mj_sb_printf(b, "%s %s", q->wrapper_ctype, q->name);
        column += width;
    }
    mj_sb_puts(b, ") {\n");
    if (k->n_params == 0) {
        mj_sb_printf(b, "    return mj_function_launch(mj_fn, MJ_TPL_%s, %d /* kernel index within template */, "
                     "mj_dims, NULL, 0);\n}\n\n", t->name, kernel_index);
        return;
    }
    mj_sb_printf(b, "    void *mj_args[%d] = {", k->n_params);
    for (int p = 0; p < k->n_params; p++)
        mj_sb_printf(b, "%s%s&%s", p ? ", " : "", k->params[p].is_pointer ? "(void *)" : "",
                  k->params[p].name);
    mj_sb_puts(b, "};\n");
    mj_sb_printf(b, "    return mj_function_launch(mj_fn, MJ_TPL_%s, %d /* kernel index within template */, "
                 "mj_dims, mj_args, %d);\n}\n\n", t->name, kernel_index, k->n_params);
}

/* The typed knobs of a template: a struct with one field per knob (so a launcher names
 * each value and a reordering of the declarations cannot shift them), each knob's limits, and
 * the spec filler. For router_gemm:
 *
 *   typedef struct mj_knobs_router_gemm { int32_t H, E, ROWS, NWARPS; } mj_knobs_router_gemm;
 *   #define MJ_KNOB_router_gemm_H_MIN 64
 *   #define MJ_KNOB_router_gemm_H_MAX 16384
 *   static inline void mj_spec_router_gemm(mj_context_t ctx, const mj_knobs_router_gemm *k,
 *                                          mj_spec *out);
 */
static void emit_knob_struct(mj_strbuf *b, const template *t) {
    mj_sb_printf(b, "/* ---- %s (%s) ---- */\n", t->name, t->rel);
    mj_sb_printf(b, "typedef struct mj_knobs_%s {\n", t->name);
    if (t->n_knobs == 0) mj_sb_puts(b, "    int32_t none_; /* no knobs */\n");
    for (int i = 0; i < t->n_knobs; i++) {
        const knob *k = &t->knobs[i];
        mj_sb_printf(b, "    int32_t %s; /* %s */\n", k->name, k->doc);
    }
    mj_sb_printf(b, "} mj_knobs_%s;\n", t->name);
    for (int i = 0; i < t->n_knobs; i++) {
        const knob *k = &t->knobs[i];
        mj_sb_printf(b, "#define MJ_KNOB_%s_%s_MIN %d\n#define MJ_KNOB_%s_%s_MAX %d\n", t->name, k->name,
                  (int)k->lo, t->name, k->name, (int)k->hi);
    }
    mj_sb_printf(b, "static inline void mj_spec_%s(mj_context_t mj_ctx, const mj_knobs_%s *mj_k, mj_spec *mj_out) {\n",
              t->name, t->name);
    if (t->n_knobs == 0) {
        mj_sb_printf(b, "    (void)mj_k;\n    mj_context_spec_fill(mj_ctx, MJ_TPL_%s, NULL, 0, mj_out);\n}\n\n", t->name);
        return;
    }
    mj_sb_printf(b, "    const int32_t mj_v[%d] = {", t->n_knobs);
    for (int i = 0; i < t->n_knobs; i++) mj_sb_printf(b, "%smj_k->%s", i ? ", " : "", t->knobs[i].name);
    mj_sb_printf(b, "};\n    mj_context_spec_fill(mj_ctx, MJ_TPL_%s, mj_v, %d, mj_out);\n}\n\n", t->name, t->n_knobs);
}

static void emit_kernels_h(mj_strbuf *b, const template *ts, int n, const char *guard, const char *extends) {
    mj_sb_printf(b, "/* generated by gen/reflect.c (mj_reflect) from the kernel templates; do not edit.\n"
                 " * MJ_TPL_<template> is a template's registry index; mj_knobs_<template> its knobs by\n"
                 " * name, mj_spec_<template> the specialization they select; mj_launch_<kernel> a typed\n"
                 " * launch of one kernel of a compiled mj_function. */\n"
                 "#ifndef %s\n#define %s\n\n", guard, guard);
    if (extends) mj_sb_printf(b, "#include \"%s\"\n\n", extends);
    else mj_sb_puts(b, "#include \"jit.h\"\n\n#include <stdbool.h>\n#include <stddef.h>\n#include <stdint.h>\n\n");
    mj_sb_puts(b, "enum {\n");
    for (int i = 0; i < n; i++)
        mj_sb_printf(b, "    MJ_TPL_%s = %s%d,\n", ts[i].name, extends ? "MJ_N_TEMPLATES + " : "", i);
    if (!extends) mj_sb_printf(b, "    MJ_N_TEMPLATES = %d\n", n);
    mj_sb_puts(b, "};\n\n");
    for (int i = 0; i < n; i++) emit_knob_struct(b, &ts[i]);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < ts[i].n_kernels; j++) emit_wrapper(b, &ts[i], j);
    mj_sb_puts(b, "#endif\n");
}

/* ---- the command ------------------------------------------------------------------- */

typedef struct options {
    const char *root, *reflect_prelude, *prelude_cuda, *prelude_sim, *out_c, *out_h;
    const char *table;    /* the tables' name prefix: mj_registry (the library's)          */
    const char *extends;  /* an extension (a test program's fixtures): the library's kernel
                             header, which the generated header includes                  */
    const char **templates;
    int n_templates;
} options;

__attribute__((noreturn))
static void usage(const char *problem) {
    fprintf(stderr, "mj_reflect: error: %s\n"
            "usage: mj_reflect --root SRCDIR --reflect-prelude gen/reflect_prelude.h\n"
            "                  --prelude-cuda templates/prelude_cuda.h [--prelude-sim templates/prelude_sim.h]\n"
            "                  --out-c OUT/mj_registry.c --out-h OUT/mj_kernels.h TEMPLATE.cu...\n"
            "   or: mj_reflect --root SRCDIR --reflect-prelude gen/reflect_prelude.h --table NAME\n"
            "                  --extends mj_kernels.h --out-c OUT/NAME.c --out-h OUT/NAME.h TEMPLATE.cu...\n"
            "       (an extension table: a test program's fixtures, numbered after the library's)\n",
            problem);
    exit(1);
}

static options parse_options(int argc, char **argv) {
    options o = {.templates = xmalloc(sizeof(char *) * (size_t)argc), .table = "mj_registry"};
    struct { const char *flag; const char **slot; } flags[] = {
        {"--root", &o.root}, {"--reflect-prelude", &o.reflect_prelude},
        {"--prelude-cuda", &o.prelude_cuda}, {"--prelude-sim", &o.prelude_sim},
        {"--out-c", &o.out_c}, {"--out-h", &o.out_h}, {"--table", &o.table}, {"--extends", &o.extends},
    };
    for (int i = 1; i < argc; i++) {
        bool matched = false;
        for (size_t f = 0; f < sizeof flags / sizeof flags[0] && !matched; f++) {
            if (strcmp(argv[i], flags[f].flag) != 0) continue;
            if (i + 1 >= argc) usage("an option lacks its value");
            *flags[f].slot = argv[++i];
            matched = true;
        }
        if (matched) continue;
        if (strncmp(argv[i], "--", 2) == 0) usage("unknown option");
        o.templates[o.n_templates++] = argv[i];
    }
    if (!o.root || !o.reflect_prelude || !o.out_c || !o.out_h) usage("missing option");
    if (!o.extends && !o.prelude_cuda) usage("missing --prelude-cuda");
    if (!is_identifier(o.table)) usage("--table must be a C identifier");
    if (!o.extends && strcmp(o.table, "mj_registry") != 0) usage("--table other than mj_registry needs --extends");
    return o;
}

int main(int argc, char **argv) {
    options o = parse_options(argc, argv);
    char *root_abs = absolute_path(o.root);
    char *prelude_abs = absolute_path(o.reflect_prelude);
    size_t prelude_len = 0, sim_len = 0;
    char *prelude_cuda = o.prelude_cuda ? read_prelude(o.prelude_cuda, &prelude_len, 0) : xstrdup("");
    char *prelude_sim = o.prelude_sim ? read_prelude(o.prelude_sim, &sim_len, 0) : xstrdup("");

    template *ts = xmalloc(sizeof(template) * (size_t)(o.n_templates ? o.n_templates : 1));
    CXIndex index = clang_createIndex(0, 0);
    for (int i = 0; i < o.n_templates; i++) {
        template *t = &ts[i];
        memset(t, 0, sizeof *t);
        t->path = o.templates[i];
        t->body = read_whole_file(t->path, &t->body_len);
        t->rel = relative_to_root(t->path, root_abs);
        pass1(index, t, prelude_abs);
        pass2(index, t, prelude_abs);
    }
    clang_disposeIndex(index);

    qsort(ts, (size_t)o.n_templates, sizeof(template), compare_templates);
    check_unique_names(ts, o.n_templates);

    mj_strbuf c = MJ_STRBUF_INIT, h = MJ_STRBUF_INIT;
    char guard[256];
    snprintf(guard, sizeof guard, "%s_H_", o.table);
    for (char *g = guard; *g; g++) *g = (char)toupper((unsigned char)*g);
    emit_registry_c(&c, ts, o.n_templates, o.table, o.extends != NULL, prelude_cuda, prelude_len,
                    prelude_sim, sim_len);
    emit_kernels_h(&h, ts, o.n_templates, o.extends ? guard : "MJ_KERNELS_H", o.extends);
    write_file(o.out_c, &c);
    write_file(o.out_h, &h);
    return 0;
}
