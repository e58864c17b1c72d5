/* render.c — a template plus its constants becomes source, and source becomes a key.
 *
 * A rendered file reads top to bottom as what it is:
 *
 *   // moejit: fixture_saxpy for sm_120a (cuda) — from tests/fixtures/saxpy.cu
 *   // y = a*x + y with VEC consecutive elements a thread (a JIT fixture)
 *   //   BLOCK = 256   threads per block (32..1024)
 *   //   VEC   = 4     consecutive elements per thread (one of 1 2 4)
 *   #define MJ_TARGET_SM 120
 *   #define BLOCK 256
 *   #define VEC 4
 *   <the backend's prelude>
 *   #line 1 "tests/fixtures/saxpy.cu"
 *   <the template's text>
 *
 * For the sim backend (the CPU interpreter, runtime/sim/) the prelude is
 * templates/prelude_sim.h and comes before the knob #defines (it includes <math.h> and
 * friends, which must not see a knob named E or H), and after the body comes one exported
 * trampoline per kernel, which the runtime calls with the packed launch arguments:
 *
 *   // moejit: fixture_saxpy for sm_120a (sim), from tests/fixtures/saxpy.cu
 *   ...the same comment header...
 *   #define MJ_TARGET_SM 120
 *   <templates/prelude_sim.h>
 *   #define BLOCK 256
 *   #define VEC 4
 *   #line 1 "tests/fixtures/saxpy.cu"
 *   <the template's text>
 *   #line 1 "moejit sim entry points"
 *   MJ_SIM_ENTRY void mj_sim_entry_fixture_saxpy(void **args) {
 *       fixture_saxpy(*(int *)args[0], *(float *)args[1], *(const float **)args[2], ...);
 *   }
 *
 * Knob values are integers checked against the declared ranges before anything is
 * written, so no caller text ever reaches the source. Same spec, same bytes.
 */
#include "gen.h"
#include "strbuf.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- templates and knobs ------------------------------------------------------------- */

static void knob_allowed(const mj_knob_desc *k, char *buf, size_t len) {
    if (k->kind == MJ_KNOB_KIND_RANGE) {
        snprintf(buf, len, "%d..%d", k->lo, k->hi);
        return;
    }
    size_t n = (size_t)snprintf(buf, len, "one of");
    for (int32_t i = 0; i < k->n_values && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, " %d", k->values[i]);
}

static int knob_ok(const mj_knob_desc *k, int32_t v) {
    if (!strcmp(k->ctype, "bool") && v != 0 && v != 1) return 0;
    if (k->kind == MJ_KNOB_KIND_RANGE) return v >= k->lo && v <= k->hi;
    for (int32_t i = 0; i < k->n_values; i++)
        if (k->values[i] == v) return 1;
    return 0;
}

/* Every MJ_CONSTRAINT of the template must hold for these knob values on this target (the
 * name SM is the target's sm number: 120 for sm_120a). */
static mj_status check_constraints(const mj_template_desc *t, const int32_t *knobs, mj_target target) {
    const char *names[MJ_MAX_KNOBS + 1];
    int32_t values[MJ_MAX_KNOBS + 1];
    for (int32_t i = 0; i < t->n_knobs; i++) names[i] = t->knobs[i].name, values[i] = knobs[i];
    names[t->n_knobs] = "SM", values[t->n_knobs] = mj_target_sm(target);
    for (int32_t i = 0; i < t->n_constraints; i++) {
        const mj_constraint_desc *c = &t->constraints[i];
        char err[512];
        int64_t v = 0;
        if (mj_constraint_eval(c->expr, names, values, t->n_knobs + 1, &v, err, sizeof err) != 0)
            return mj_set_error(MJ_ERR_INVALID_ARG, "template %s: constraint \"%s\" cannot be checked: %s",
                                t->name, c->expr, err);
        if (!v) {
            char vals[512];
            size_t n = 0;
            vals[0] = '\0';
            for (int32_t k = 0; k < t->n_knobs && n < sizeof vals; k++)
                n += (size_t)snprintf(vals + n, sizeof vals - n, "%s%s=%d", k ? " " : "", names[k], knobs[k]);
            if (n < sizeof vals) snprintf(vals + n, sizeof vals - n, " on %s", mj_target_name(target));
            return mj_set_error(MJ_ERR_INVALID_ARG, "template %s: constraint \"%s\" does not hold (%s) for %s",
                                t->name, c->expr, c->doc, vals);
        }
    }
    return MJ_OK;
}

int mj_spec_equal(const mj_spec *a, const mj_spec *b) {
    return a->tpl == b->tpl && a->target == b->target && a->backend == b->backend &&
           !memcmp(a->knobs, b->knobs, sizeof a->knobs);
}

mj_status mj_spec_validate(const mj_spec *s) {
    if (!s) return mj_set_error(MJ_ERR_INVALID_ARG, "NULL specialization");
    const mj_template_desc *t = mj_template_at(s->tpl);
    if (!t)
        return mj_set_error(MJ_ERR_INVALID_ARG, "template index %d out of range (%d templates)",
                            s->tpl, mj_registry_count());
    if ((int)s->target < 0 || s->target >= MJ_TARGET_COUNT)
        return mj_set_error(MJ_ERR_INVALID_ARG, "template %s: bad target %d", t->name, (int)s->target);
    if (!(t->targets & (1u << s->target)))
        return mj_set_error(MJ_ERR_UNSUPPORTED, "template %s does not declare target %s (%s)",
                            t->name, mj_target_name(s->target), t->file);
    if ((int)s->backend < 0 || s->backend >= MJ_BACKEND_COUNT)
        return mj_set_error(MJ_ERR_INVALID_ARG, "template %s: bad backend %d", t->name, (int)s->backend);
    for (int32_t i = 0; i < t->n_knobs; i++) {
        const mj_knob_desc *k = &t->knobs[i];
        if (!knob_ok(k, s->knobs[i])) {
            char allowed[256];
            knob_allowed(k, allowed, sizeof allowed);
            return mj_set_error(MJ_ERR_INVALID_ARG, "template %s: knob %s = %d is not allowed (%s)",
                                t->name, k->name, s->knobs[i], allowed);
        }
    }
    for (int32_t i = t->n_knobs; i < MJ_MAX_KNOBS; i++)
        if (s->knobs[i] != 0)
            return mj_set_error(MJ_ERR_INVALID_ARG, "template %s has %d knobs; slot %d must be 0",
                                t->name, t->n_knobs, i);
    return check_constraints(t, s->knobs, s->target);
}

static const char *backend_prelude(mj_backend b) {
    return b == MJ_BACKEND_SIM ? mj_registry_prelude_sim : mj_registry_prelude_cuda;
}

static const char *backend_name(mj_backend b) {
    return b == MJ_BACKEND_CUDA ? "cuda" : b == MJ_BACKEND_SIM ? "sim" : "?";
}

/* The sim's trampolines: mj_sim_entry_<kernel>(void **args) unpacks the launch arguments
 * (each args[i] points at parameter i, typed as the registry spells it) and calls the
 * kernel. */
static void sim_entry_points(mj_strbuf *b, const mj_template_desc *t) {
    mj_sb_puts(b, "\n#line 1 \"moejit sim entry points\"\n");
    for (int32_t k = 0; k < t->n_kernels; k++) {
        const mj_kernel_desc *kd = &t->kernels[k];
        mj_sb_printf(b, "MJ_SIM_ENTRY void mj_sim_entry_%s(void **args) {\n", kd->name);
        if (kd->n_params == 0) mj_sb_puts(b, "    (void)args;\n");
        mj_sb_printf(b, "    %s(", kd->name);
        for (int32_t p = 0; p < kd->n_params; p++) {
            const char *ct = kd->params[p].ctype;
            size_t n = strlen(ct);
            int star = n > 0 && ct[n - 1] == '*';
            mj_sb_printf(b, "%s*(%s%s*)args[%d]", p ? ", " : "", ct, star ? "" : " ", p);
        }
        mj_sb_puts(b, ");\n}\n");
    }
}

mj_status mj_render(const mj_spec *s, char **source, size_t *len) {
    if (!source) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_render: NULL output");
    MJ_CHECK(mj_spec_validate(s));
    const mj_template_desc *t = mj_template_at(s->tpl);
    mj_strbuf b = MJ_STRBUF_INIT;
    mj_sb_printf(&b, "// moejit: %s for %s (%s), from %s\n", t->name, mj_target_name(s->target),
              backend_name(s->backend), t->file);
    mj_sb_printf(&b, "// %s\n", t->doc);
    size_t w = 0;
    for (int32_t i = 0; i < t->n_knobs; i++)
        if (strlen(t->knobs[i].name) > w) w = strlen(t->knobs[i].name);
    for (int32_t i = 0; i < t->n_knobs; i++) {
        char allowed[256];
        knob_allowed(&t->knobs[i], allowed, sizeof allowed);
        mj_sb_printf(&b, "//   %-*s = %-6d %s (%s %s)\n", (int)w, t->knobs[i].name, s->knobs[i],
                  t->knobs[i].doc, t->knobs[i].ctype, allowed);
    }
    const char *prelude = backend_prelude(s->backend);
    if (!prelude[0]) {
        mj_sb_free(&b);
        return mj_set_error(MJ_ERR_INTERNAL,
                            "rendering %s for the %s backend: this build has no %s prelude "
                            "(gen/reflect ran without --prelude-%s)",
                            t->name, backend_name(s->backend), backend_name(s->backend),
                            backend_name(s->backend));
    }
    int sim = s->backend == MJ_BACKEND_SIM;
    mj_sb_printf(&b, "#define MJ_TARGET_SM %d\n", mj_target_sm(s->target));
    if (sim) mj_sb_puts(&b, prelude);
    for (int32_t i = 0; i < t->n_knobs; i++)
        mj_sb_printf(&b, "#define %s %d\n", t->knobs[i].name, s->knobs[i]);
    if (!sim) mj_sb_puts(&b, prelude);
    mj_sb_printf(&b, "#line 1 \"%s\"\n", t->file);
    mj_sb_puts(&b, t->body);
    if (sim) sim_entry_points(&b, t);
    size_t n = b.len;
    char *text = mj_sb_take(&b);
    if (!text) return mj_set_error(MJ_ERR_NOMEM, "out of memory rendering %s", t->name);
    *source = text;
    if (len) *len = n;
    return MJ_OK;
}

const char *mj_spec_describe(const mj_spec *s, char *buf, size_t len) {
    const mj_template_desc *t = s ? mj_template_at(s->tpl) : NULL;
    if (!t) {
        snprintf(buf, len, "(bad specialization)");
        return buf;
    }
    size_t n = (size_t)snprintf(buf, len, "%s", t->name);
    for (int32_t i = 0; i < t->n_knobs && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, " %s=%d", t->knobs[i].name, s->knobs[i]);
    if (n < len) n += (size_t)snprintf(buf + n, len - n, " %s", mj_target_name(s->target));
    if (n < len && s->backend == MJ_BACKEND_SIM) snprintf(buf + n, len - n, " (sim)");
    return buf;
}

/* ---- JSON lines (manifests) ---------------------------------------------------------- */

mj_status mj_spec_to_json(const mj_spec *s, char **line) {
    MJ_CHECK(mj_spec_validate(s));
    const mj_template_desc *t = mj_template_at(s->tpl);
    json_t *o = json_object(), *k = json_object();
    json_object_set_new(o, "template", json_string(t->name));
    for (int32_t i = 0; i < t->n_knobs; i++) json_object_set_new(k, t->knobs[i].name, json_integer(s->knobs[i]));
    json_object_set_new(o, "knobs", k);
    json_object_set_new(o, "arch", json_string(mj_target_name(s->target)));
    /* CUDA is the default: only a sim line says its backend. */
    if (s->backend != MJ_BACKEND_CUDA) json_object_set_new(o, "backend", json_string(backend_name(s->backend)));
    *line = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    return *line ? MJ_OK : mj_set_error(MJ_ERR_NOMEM, "out of memory writing a manifest line");
}

mj_status mj_spec_from_json(const char *line, const char *where, mj_spec *out) {
    if (!line || !out) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_spec_from_json: NULL argument");
    if (!where) where = "manifest";
    json_error_t je;
    json_t *o = json_loads(line, JSON_REJECT_DUPLICATES, &je);
    if (!o) return mj_set_error(MJ_ERR_PARSE, "%s: malformed JSON at column %d: %s", where, je.column, je.text);
    mj_status st = MJ_OK;
    mj_spec s;
    memset(&s, 0, sizeof s);
    json_t *jt = json_object_get(o, "template"), *jk = json_object_get(o, "knobs"),
           *ja = json_object_get(o, "arch");
    const mj_template_desc *t;
    if (!json_is_object(o) || !json_is_string(jt)) {
        st = mj_set_error(MJ_ERR_PARSE, "%s: expected {\"template\": NAME, \"knobs\": {...}, \"arch\": ...}", where);
        goto exit;
    }
    if (!(t = mj_template_find(json_string_value(jt), &s.tpl))) {
        char name[128];
        st = mj_set_error(MJ_ERR_INVALID_ARG, "%s: unknown template '%s' (see 'moejit inspect templates')",
                          where, mj_printable(json_string_value(jt), name, sizeof name));
        goto exit;
    }
    if (!json_is_string(ja)) {
        st = mj_set_error(MJ_ERR_PARSE, "%s: missing \"arch\" (e.g. \"sm_120a\")", where);
        goto exit;
    }
    MJ_CHECK_GOTO(mj_target_parse(json_string_value(ja), &s.target), st, exit);
    if (t->n_knobs && !json_is_object(jk)) {
        st = mj_set_error(MJ_ERR_PARSE, "%s: missing \"knobs\" object for template %s", where, t->name);
        goto exit;
    }
    if (jk && json_is_object(jk) && (int32_t)json_object_size(jk) != t->n_knobs) {
        st = mj_set_error(MJ_ERR_INVALID_ARG, "%s: template %s has %d knobs, the line gives %d", where,
                          t->name, t->n_knobs, (int)json_object_size(jk));
        goto exit;
    }
    for (int32_t i = 0; i < t->n_knobs; i++) {
        json_t *v = json_object_get(jk, t->knobs[i].name);
        /* true/false only for a bool knob: "VEC": true is a mistake, not 1. */
        if ((json_is_true(v) || json_is_false(v)) && !strcmp(t->knobs[i].ctype, "bool")) {
            s.knobs[i] = json_is_true(v);
            continue;
        }
        if (!v) {
            st = mj_set_error(MJ_ERR_INVALID_ARG, "%s: knob %s of %s is missing", where, t->knobs[i].name,
                              t->name);
            goto exit;
        }
        if (!json_is_integer(v) || json_integer_value(v) < INT32_MIN || json_integer_value(v) > INT32_MAX) {
            st = mj_set_error(MJ_ERR_INVALID_ARG, "%s: knob %s of %s must be an integer%s", where,
                              t->knobs[i].name, t->name, !strcmp(t->knobs[i].ctype, "bool") ? " or a boolean" : "");
            goto exit;
        }
        s.knobs[i] = (int32_t)json_integer_value(v);
    }
    s.backend = MJ_BACKEND_CUDA;
    json_t *jb = json_object_get(o, "backend");
    if (jb) {
        const char *bn = json_is_string(jb) ? json_string_value(jb) : "";
        if (!strcmp(bn, "sim")) s.backend = MJ_BACKEND_SIM;
        else if (strcmp(bn, "cuda") != 0) {
            st = mj_set_error(MJ_ERR_INVALID_ARG, "%s: \"backend\" must be \"cuda\" or \"sim\"", where);
            goto exit;
        }
    }
    if ((st = mj_spec_validate(&s)) != MJ_OK) {
        st = mj_error_prefix(st, "%s", where);
        goto exit;
    }
    *out = s;
exit:
    json_decref(o);
    return st;
}
