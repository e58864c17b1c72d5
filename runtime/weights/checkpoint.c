/* checkpoint.c — MoE layers from a Hugging Face ModelOpt NVFP4 checkpoint directory.
 *
 * mj_checkpoint_open reads config.json (+ hf_quant_config.json), the index, and every
 * shard's header; after it, each tensor name the checkpoint holds maps to a checked byte range
 * of an open shard. mj_layer_load then builds one layer handle (struct mj_layer, the one
 * mj_layer_create_random and mj_layer_shard make): it looks every tensor up, checks its dtype
 * and shape against the config before allocating anything, and reads only the bytes of the
 * requested slice (pread, through ck_copy, which counts them: the tests hold the
 * loader to "TP rank r reads rows r of n, nothing else").
 *
 * The layout of a slice is mj_layer_shard's (runtime/ref/layer.c): TP rank r of n holds gate
 * and up rows [r*I/n, (r+1)*I/n) and those columns of down, for every expert and for the
 * shared expert (n_shared * I rows, as mj_layer_create_random makes it); EP rank r holds
 * experts [r*E/n, (r+1)*E/n) whole and rank 0 the shared expert; every rank the router. A
 * shared expert's sigmoid gate (Qwen2-MoE, Qwen3-Next) is held whole wherever a slice of the
 * shared expert is: it scales the whole shared expert, whose slices the ranks sum.
 */
#include "weights/checkpoint.h"
#include "weights/layer.h"
#include "ref/ref.h"
#include "plan.h" /* mj_split_check */

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- small files --------------------------------------------------------------------------- */

mj_status mj_ck_read_text(int dirfd, const char *name, const char *label, size_t cap, unsigned flags,
                          char **text, size_t *len) {
    MJ_CHECK(mj_file_read(dirfd, name, label, cap, flags, text, len));
    if (*text && memchr(*text, '\0', *len)) {
        free(*text);
        *text = NULL;
        *len = 0;
        return mj_set_error(MJ_ERR_PARSE, "%s contains a NUL byte: not a JSON file", label);
    }
    return MJ_OK;
}

/* ---- the layer structure of config.json ----------------------------------------------------- */

static mj_status layout_int(const json_t *m, const char *key, const char *label, int32_t min, int32_t dflt,
                            int32_t *out) {
    const json_t *v = json_object_get(m, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return MJ_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > INT32_MAX)
        return mj_set_error(MJ_ERR_CONFIG, "%s: field '%s' must be an integer >= %d", label, key, (int)min);
    *out = (int32_t)json_integer_value(v);
    return MJ_OK;
}

mj_status mj_ck_layout_parse(const char *config_text, const char *label, mj_ck_layout *out) {
    json_error_t jerr;
    json_t *root = json_loads(config_text, 0, &jerr);
    if (!root || !json_is_object(root)) {
        json_decref(root);
        return mj_set_error(MJ_ERR_PARSE, "%s: not a JSON object", label);
    }
    /* As config.c reads it: multimodal configs nest the language model in text_config. */
    const json_t *m = root, *text = json_object_get(root, "text_config");
    if (!json_object_get(root, "hidden_size") && json_is_object(text)) m = text;
    mj_ck_layout lo;
    mj_status st;
    MJ_CHECK_GOTO(layout_int(m, "num_hidden_layers", label, 1, -1, &lo.num_hidden_layers), st, done);
    MJ_CHECK_GOTO(layout_int(m, "first_k_dense_replace", label, 0, 0, &lo.first_k_dense_replace), st, done);
    MJ_CHECK_GOTO(layout_int(m, "moe_layer_freq", label, 1, 1, &lo.moe_layer_freq), st, done);
    MJ_CHECK_GOTO(layout_int(m, "decoder_sparse_step", label, 1, 1, &lo.decoder_sparse_step), st, done);
    const char *mtp = json_object_get(m, "num_nextn_predict_layers") ? "num_nextn_predict_layers" : "num_mtp_layers";
    MJ_CHECK_GOTO(layout_int(m, mtp, label, 0, 0, &lo.n_mtp), st, done);
    lo.n_dense_only = 0;
    const json_t *only = json_object_get(m, "mlp_only_layers");
    if (only && !json_is_null(only)) {
        size_t i;
        const json_t *v;
        if (!json_is_array(only) || json_array_size(only) > sizeof lo.dense_only / sizeof lo.dense_only[0]) {
            st = mj_set_error(MJ_ERR_CONFIG, "%s: field 'mlp_only_layers' must be a list of at most %d layer numbers",
                              label, (int)(sizeof lo.dense_only / sizeof lo.dense_only[0]));
            goto done;
        }
        json_array_foreach(only, i, v) {
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX) {
                st = mj_set_error(MJ_ERR_CONFIG, "%s: field 'mlp_only_layers' must hold layer numbers >= 0", label);
                goto done;
            }
            lo.dense_only[lo.n_dense_only++] = (int32_t)json_integer_value(v);
        }
    }
    *out = lo;
done:
    json_decref(root);
    return st;
}

int mj_ck_layout_is_moe(const mj_ck_layout *lo, int32_t layer) {
    if (layer < lo->first_k_dense_replace) return 0;
    for (int32_t i = 0; i < lo->n_dense_only; i++)
        if (lo->dense_only[i] == layer) return 0;
    if (lo->num_hidden_layers >= 0 && layer >= lo->num_hidden_layers)
        return layer < lo->num_hidden_layers + lo->n_mtp; /* an MTP layer: its block is MoE */
    return layer % lo->moe_layer_freq == 0 && (layer + 1) % lo->decoder_sparse_step == 0;
}

const char *mj_ck_tensor_name(char *buf, size_t n, const mj_ck_names *names, int32_t layer, int32_t expert, int proj,
                              const char *field) {
    if (!names) names = &mj_ck_names_default;
    if (expert == MJ_CK_ROUTER && !strcmp(field, "e_score_correction_bias"))
        snprintf(buf, n, "model.layers.%d.%s.%s", (int)layer, names->block, names->bias);
    else if (expert == MJ_CK_ROUTER)
        snprintf(buf, n, "model.layers.%d.%s.gate.%s", (int)layer, names->block, field);
    else if (expert == MJ_CK_SHARED)
        snprintf(buf, n, "model.layers.%d.%s.%s.%s.%s", (int)layer, names->block, names->shared, names->proj[proj],
                 field);
    else if (expert == MJ_CK_SHARED_GATE)
        snprintf(buf, n, "model.layers.%d.%s.%s.%s", (int)layer, names->block,
                 names->shared_gate ? names->shared_gate : "shared_expert_gate", field);
    else
        snprintf(buf, n, "model.layers.%d.%s.experts.%d.%s.%s", (int)layer, names->block, (int)expert,
                 names->proj[proj], field);
    return buf;
}

/* ---- the handle --------------------------------------------------------------------------- */

typedef struct ck_entry {
    const char *name;          /* the shard's copy of the name                                */
    const mj_st_file *file;
    const mj_st_tensor *t;
} ck_entry;

struct mj_checkpoint {
    char *dir;
    char *where;               /* where names are looked up: the index, or model.safetensors  */
    mj_moe_config cfg;
    const mj_family *fam;      /* its model_type's family, or NULL                           */
    const mj_ck_names *names;  /* how its MoE tensors are named                               */
    mj_st_file **shards;
    int32_t n_shards;
    ck_entry *entries;         /* sorted by name                                             */
    int64_t n_entries;
    int32_t *layers;           /* MoE layers with tensors, ascending                         */
    int32_t n_layers;
    int64_t bytes_read;
    mj_ck_read_hook hook;
    void *hook_user;
};

mj_status mj_checkpoint_close(mj_checkpoint_t ck) {
    if (!ck) return MJ_OK;
    for (int32_t i = 0; i < ck->n_shards; i++) mj_st_close(ck->shards[i]);
    free(ck->shards);
    free(ck->entries);
    free(ck->layers);
    free(ck->where);
    free(ck->dir);
    free(ck);
    return MJ_OK;
}

void mj_checkpoint_set_read_hook(mj_checkpoint_t ck, mj_ck_read_hook fn, void *user) {
    ck->hook = fn;
    ck->hook_user = user;
}

int64_t mj_checkpoint_bytes_read(mj_checkpoint_t ck) { return ck ? __atomic_load_n(&ck->bytes_read, __ATOMIC_RELAXED) : 0; }

static int cmp_entry(const void *a, const void *b) {
    return strcmp(((const ck_entry *)a)->name, ((const ck_entry *)b)->name);
}

static const ck_entry *ck_lookup(mj_checkpoint_t ck, const char *name) {
    ck_entry key = {name, NULL, NULL};
    return ck->n_entries ? bsearch(&key, ck->entries, (size_t)ck->n_entries, sizeof key, cmp_entry) : NULL;
}

/* "DIR/NAME", malloc'd. */
static char *path_join(const char *dir, const char *name) {
    char *p = NULL;
    return asprintf(&p, "%s/%s", dir, name) < 0 ? NULL : p;
}

/* Open shard `name` (a file name from the index: nothing with a '/', no "." or ".."), unless
 * it is open already; its index in ck->shards into *idx. `tensor` names, in errors, the first
 * tensor the index puts there. */
static mj_status open_shard(mj_checkpoint_t ck, int dirfd, const char *name, const char *tensor, json_t *seen,
                            int32_t *idx) {
    const json_t *have = json_object_get(seen, name);
    if (have) {
        *idx = (int32_t)json_integer_value(have);
        return MJ_OK;
    }
    char pn[160], pt[160];
    mj_printable(name, pn, sizeof pn);
    mj_printable(tensor, pt, sizeof pt);
    if (!name[0] || strchr(name, '/') || !strcmp(name, ".") || !strcmp(name, ".."))
        return mj_set_error(MJ_ERR_PARSE, "%s: tensor '%s' is in shard '%s', which is not a file name inside "
                            "the checkpoint directory: refused (a shard must not be a path)", ck->where, pt, pn);
    /* The label every message names the shard by: its name as written in the index, with
     * control characters and non-ASCII bytes escaped (\x1b), whole. */
    size_t room = 4 * strlen(name) + 8;
    char *shown = malloc(room), *label = shown ? path_join(ck->dir, mj_printable(name, shown, room)) : NULL;
    free(shown);
    if (!label) return mj_set_error(MJ_ERR_NOMEM, "out of memory opening %s", ck->dir);
    struct stat sb;
    if (fstatat(dirfd, name, &sb, AT_SYMLINK_NOFOLLOW) != 0 && errno == ENOENT) {
        mj_status st = mj_set_error(MJ_ERR_IO, "%s: shard %s (holding tensor '%s') is missing: the download is "
                                    "incomplete", ck->where, label, pt);
        free(label);
        return st;
    }
    mj_st_file **grown = realloc(ck->shards, (size_t)(ck->n_shards + 1) * sizeof *grown);
    if (!grown) {
        free(label);
        return mj_set_error(MJ_ERR_NOMEM, "out of memory opening %s", ck->dir);
    }
    ck->shards = grown;
    mj_status st = mj_st_open(dirfd, name, label, &ck->shards[ck->n_shards]);
    free(label);
    if (st != MJ_OK) return st;
    *idx = ck->n_shards++;
    if (json_object_set_new(seen, name, json_integer(*idx)))
        return mj_set_error(MJ_ERR_NOMEM, "out of memory opening %s", ck->dir);
    return MJ_OK;
}

/* The index: {"metadata": {...}, "weight_map": {"tensor": "shard file", ...}}. */
static mj_status read_index(mj_checkpoint_t ck, int dirfd, const char *text, size_t len) {
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr), *seen = json_object();
    mj_status st = MJ_OK;
    if (!root) {
        st = mj_set_error(MJ_ERR_PARSE, "%s: malformed JSON at line %d, column %d: %s", ck->where, jerr.line,
                          jerr.column, jerr.text);
        goto done;
    }
    const json_t *map = json_object_get(root, "weight_map");
    if (!json_is_object(map)) {
        st = mj_set_error(MJ_ERR_PARSE, "%s: no 'weight_map' object (tensor name -> shard file)", ck->where);
        goto done;
    }
    if (!seen || !(ck->entries = malloc((json_object_size(map) + 1) * sizeof *ck->entries))) {
        st = mj_set_error(MJ_ERR_NOMEM, "out of memory reading %s", ck->where);
        goto done;
    }
    const char *name;
    json_t *v;
    json_object_foreach((json_t *)map, name, v) {
        char pt[160];
        if (!json_is_string(v)) {
            st = mj_set_error(MJ_ERR_PARSE, "%s: weight_map['%s'] is not a file name string", ck->where,
                              mj_printable(name, pt, sizeof pt));
            goto done;
        }
        int32_t idx = 0;
        MJ_CHECK_GOTO(open_shard(ck, dirfd, json_string_value(v), name, seen, &idx), st, done);
        const mj_st_tensor *t = mj_st_find(ck->shards[idx], name);
        if (!t) {
            st = mj_set_error(MJ_ERR_PARSE, "%s: tensor '%s' is said to be in %s, whose header has no such "
                              "tensor", ck->where, mj_printable(name, pt, sizeof pt), ck->shards[idx]->label);
            goto done;
        }
        ck->entries[ck->n_entries++] = (ck_entry){t->name, ck->shards[idx], t};
    }
done:
    json_decref(seen);
    json_decref(root);
    return st;
}

/* The layer number L of "model.layers.<L>.REST" (REST into *rest), else -1. */
static int32_t layer_of(const char *name, const char **rest) {
    static const char pre[] = "model.layers.";
    if (strncmp(name, pre, sizeof pre - 1)) return -1;
    const char *p = name + sizeof pre - 1;
    int64_t L = 0;
    if (*p < '0' || *p > '9' || (p[0] == '0' && p[1] >= '0' && p[1] <= '9')) return -1;
    for (; *p >= '0' && *p <= '9'; p++)
        if ((L = L * 10 + (*p - '0')) > INT32_MAX) return -1;
    *rest = p;
    return (int32_t)L;
}

/* "model.layers.<L>.BLOCK.experts." (or .BLOCK.gate.weight, .BLOCK.SHARED.): L, else -1. */
static int32_t moe_layer_of(const char *name, const mj_ck_names *names) {
    const char *p;
    int32_t L = layer_of(name, &p);
    size_t nb = strlen(names->block), ns = strlen(names->shared);
    if (L < 0 || p[0] != '.' || strncmp(p + 1, names->block, nb)) return -1;
    p += 1 + nb;
    if (!strncmp(p, ".experts.", 9) || !strcmp(p, ".gate.weight")) return L;
    if (p[0] == '.' && !strncmp(p + 1, names->shared, ns) && p[1 + ns] == '.') return L;
    return -1;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static mj_status find_layers(mj_checkpoint_t ck) {
    ck->layers = malloc((size_t)(ck->n_entries + 1) * sizeof *ck->layers);
    if (!ck->layers) return mj_set_error(MJ_ERR_NOMEM, "out of memory listing the layers of %s", ck->dir);
    int32_t n = 0;
    for (int64_t i = 0; i < ck->n_entries; i++) {
        int32_t L = moe_layer_of(ck->entries[i].name, ck->names);
        if (L >= 0) ck->layers[n++] = L;
    }
    qsort(ck->layers, (size_t)n, sizeof *ck->layers, cmp_i32);
    int32_t u = 0;
    for (int32_t i = 0; i < n; i++)
        if (!u || ck->layers[u - 1] != ck->layers[i]) ck->layers[u++] = ck->layers[i];
    ck->n_layers = u;
    return MJ_OK;
}

mj_status mj_checkpoint_open(const char *dir, mj_checkpoint_t *out) {
    if (!dir || !out) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_checkpoint_open: NULL argument");
    mj_status st = MJ_OK;
    char *cfg_text = NULL, *quant_text = NULL, *index_text = NULL, *cfg_label = NULL, *quant_label = NULL;
    size_t cfg_len = 0, quant_len = 0, index_len = 0;
    int dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dirfd < 0)
        return mj_set_error(MJ_ERR_IO, "cannot open the checkpoint directory %s: %s", dir, strerror(errno));
    mj_checkpoint_t ck = calloc(1, sizeof *ck);
    if (!ck || !(ck->dir = strdup(dir)) || !(cfg_label = path_join(dir, MJ_CK_CONFIG)) ||
        !(quant_label = path_join(dir, MJ_CK_QUANT))) {
        st = mj_set_error(MJ_ERR_NOMEM, "out of memory opening %s", dir);
        goto fail;
    }
    /* The config: the model's shape and its quantization, which must be NVFP4. */
    MJ_CHECK_GOTO(mj_ck_read_text(dirfd, MJ_CK_CONFIG, cfg_label, MJ_CK_CONFIG_MAX, 0, &cfg_text, &cfg_len), st, fail);
    MJ_CHECK_GOTO(mj_ck_read_text(dirfd, MJ_CK_QUANT, quant_label, MJ_CK_CONFIG_MAX, MJ_FILE_OPTIONAL, &quant_text,
                                  &quant_len),
                  st, fail);
    MJ_CHECK_GOTO(mj_moe_config_parse(cfg_text, quant_text, cfg_label, &ck->cfg), st, fail);
    MJ_CHECK_GOTO(mj_family_of(cfg_text, cfg_label, &ck->fam), st, fail);
    ck->names = mj_family_names(ck->fam);
    if (ck->cfg.quant != MJ_QUANT_NVFP4) {
        st = mj_set_error(MJ_ERR_UNSUPPORTED, "%s: the checkpoint is not NVFP4-quantized (no %s and no "
                          "quantization_config in config.json): moejit loads ModelOpt NVFP4 checkpoints",
                          dir, MJ_CK_QUANT);
        goto fail;
    }
    /* The tensors: through the index when there is one, else the one model.safetensors. */
    if (!(ck->where = path_join(dir, MJ_CK_INDEX))) {
        st = mj_set_error(MJ_ERR_NOMEM, "out of memory opening %s", dir);
        goto fail;
    }
    MJ_CHECK_GOTO(mj_ck_read_text(dirfd, MJ_CK_INDEX, ck->where, MJ_CK_INDEX_MAX, MJ_FILE_OPTIONAL, &index_text,
                                  &index_len),
                  st, fail);
    if (index_text) {
        MJ_CHECK_GOTO(read_index(ck, dirfd, index_text, index_len), st, fail);
    } else {
        free(ck->where);
        if (!(ck->where = path_join(dir, MJ_CK_SINGLE)) || !(ck->shards = malloc(sizeof *ck->shards))) {
            st = mj_set_error(MJ_ERR_NOMEM, "out of memory opening %s", dir);
            goto fail;
        }
        struct stat sb;
        if (fstatat(dirfd, MJ_CK_SINGLE, &sb, AT_SYMLINK_NOFOLLOW) != 0 && errno == ENOENT) {
            st = mj_set_error(MJ_ERR_IO, "%s has neither %s nor %s: not a safetensors checkpoint", dir, MJ_CK_INDEX,
                              MJ_CK_SINGLE);
            goto fail;
        }
        MJ_CHECK_GOTO(mj_st_open(dirfd, MJ_CK_SINGLE, ck->where, &ck->shards[0]), st, fail);
        ck->n_shards = 1;
        const mj_st_file *f = ck->shards[0];
        if (!(ck->entries = malloc((size_t)(f->n_tensors + 1) * sizeof *ck->entries))) {
            st = mj_set_error(MJ_ERR_NOMEM, "out of memory opening %s", dir);
            goto fail;
        }
        for (int64_t i = 0; i < f->n_tensors; i++)
            ck->entries[ck->n_entries++] = (ck_entry){f->tensors[i].name, f, &f->tensors[i]};
    }
    qsort(ck->entries, (size_t)ck->n_entries, sizeof *ck->entries, cmp_entry);
    MJ_CHECK_GOTO(find_layers(ck), st, fail);
    *out = ck;
    ck = NULL;
fail:
    mj_checkpoint_close(ck);
    close(dirfd);
    free(cfg_text), free(quant_text), free(index_text), free(cfg_label), free(quant_label);
    return st;
}

mj_status mj_checkpoint_config(mj_checkpoint_t ck, mj_moe_config *cfg) {
    if (!ck || !cfg) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_checkpoint_config: NULL argument");
    *cfg = ck->cfg;
    return MJ_OK;
}

mj_status mj_checkpoint_moe_layers(mj_checkpoint_t ck, int32_t *layers, int32_t cap, int32_t *n) {
    if (!ck || !n || cap < 0 || (cap > 0 && !layers))
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_checkpoint_moe_layers: NULL argument or cap < 0");
    for (int32_t i = 0; i < ck->n_layers && i < cap; i++) layers[i] = ck->layers[i];
    *n = ck->n_layers;
    return MJ_OK;
}

/* ---- tensors ------------------------------------------------------------------------------ */

/* A tensor found and checked: where its bytes are, and its name for messages. */
typedef struct ck_ref {
    const mj_st_file *f;
    const mj_st_tensor *t;
} ck_ref;

static mj_status ck_get(mj_checkpoint_t ck, const char *name, ck_ref *r) {
    const ck_entry *e = ck_lookup(ck, name);
    if (!e)
        return mj_set_error(MJ_ERR_PARSE, "%s: tensor '%s' is missing (a ModelOpt NVFP4 export of a %s MoE has it; "
                            "include/moejit.h, \"Checkpoints\", lists the names moejit reads)",
                            ck->where, name, ck->fam ? ck->fam->models : "DeepSeek/GLM-style");
    r->f = e->file;
    r->t = e->t;
    return MJ_OK;
}

/* "[4, 8]" */
static const char *shape_text(const mj_st_tensor *t, char *buf, size_t n) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int32_t i = 0; i < t->ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
    return buf;
}

/* dtype one of want[0..nwant), shape [d0, d1] (ndim 2), [d0] (ndim 1), or a scalar (ndim 0:
 * [] or [1]). `what` says what the config makes of it. */
static mj_status ck_expect(const ck_ref *r, const mj_st_dtype *want, int nwant, int ndim, int64_t d0, int64_t d1,
                           const char *what) {
    const mj_st_tensor *t = r->t;
    int ok = 0;
    for (int i = 0; i < nwant; i++) ok |= t->dtype == want[i];
    if (!ok)
        return mj_set_error(MJ_ERR_PARSE, "%s: tensor '%s' is %s, expected %s%s%s (%s)", r->f->label, t->name,
                            mj_st_dtype_name(t->dtype), mj_st_dtype_name(want[0]), nwant > 1 ? " or " : "",
                            nwant > 1 ? mj_st_dtype_name(want[1]) : "", what);
    if (ndim == 0) ok = t->ndim == 0 || (t->ndim == 1 && t->shape[0] == 1);
    else if (ndim == 1) ok = t->ndim == 1 && t->shape[0] == d0;
    else ok = t->ndim == 2 && t->shape[0] == d0 && t->shape[1] == d1;
    if (!ok) {
        char got[160], exp[64];
        if (ndim == 0) snprintf(exp, sizeof exp, "[] or [1]");
        else if (ndim == 1) snprintf(exp, sizeof exp, "[%lld]", (long long)d0);
        else snprintf(exp, sizeof exp, "[%lld, %lld]", (long long)d0, (long long)d1);
        return mj_set_error(MJ_ERR_PARSE, "%s: tensor '%s' has shape %s, expected %s (%s, from config.json)",
                            r->f->label, t->name, shape_text(t, got, sizeof got), exp, what);
    }
    return MJ_OK;
}

/* Copy len bytes at offset within r's tensor: the one place tensor bytes leave a shard
 * (pread: a shard cut short under us is MJ_ERR_IO naming it, never SIGBUS). */
static mj_status ck_copy(mj_checkpoint_t ck, const ck_ref *r, uint64_t offset, uint64_t len, void *dst) {
    MJ_CHECK(mj_st_read(r->f, r->t->begin + offset, len, dst));
    __atomic_fetch_add(&ck->bytes_read, (int64_t)len, __ATOMIC_RELAXED); /* ranks may load in parallel */
    if (ck->hook) ck->hook(ck->hook_user, r->t->name, offset, len);
    return MJ_OK;
}

/* The same for `rows` rows of `row_bytes`, `len` bytes at column byte `col` of each, into dst
 * packed: one read a run of rows (the rows between the slices come along: the disk's pages
 * hold them anyway), counted and reported per row as ck_copy would. */
static mj_status ck_copy_cols(mj_checkpoint_t ck, const ck_ref *r, int64_t rows, uint64_t row_bytes, uint64_t col,
                              uint64_t len, uint8_t *dst) {
    if (len == row_bytes || rows <= 1) {
        for (int64_t i = 0; i < rows; i++) MJ_CHECK(ck_copy(ck, r, (uint64_t)i * row_bytes + col, len, dst + i * len));
        return MJ_OK;
    }
    const uint64_t budget = 1u << 20;
    int64_t per = (int64_t)(budget / row_bytes);
    if (per < 1) per = 1;
    uint8_t *bounce = malloc((size_t)((uint64_t)(per - 1) * row_bytes + len));
    if (!bounce) return mj_set_error(MJ_ERR_NOMEM, "out of memory reading %s", r->t->name);
    mj_status st = MJ_OK;
    for (int64_t r0 = 0; r0 < rows && st == MJ_OK; r0 += per) {
        int64_t n = rows - r0 < per ? rows - r0 : per;
        uint64_t span = (uint64_t)(n - 1) * row_bytes + len;
        st = mj_st_read(r->f, r->t->begin + (uint64_t)r0 * row_bytes + col, span, bounce);
        for (int64_t i = 0; i < n && st == MJ_OK; i++) {
            memcpy(dst + (size_t)(r0 + i) * len, bounce + (size_t)i * row_bytes, (size_t)len);
            __atomic_fetch_add(&ck->bytes_read, (int64_t)len, __ATOMIC_RELAXED);
            if (ck->hook) ck->hook(ck->hook_user, r->t->name, (uint64_t)(r0 + i) * row_bytes + col, len);
        }
    }
    free(bounce);
    return st;
}

enum { CK_WEIGHT_SCALE_2, CK_INPUT_SCALE };

/* A scalar f32 (weight_scale_2, input_scale): finite and positive, and usable as what it
 * is. An input_scale's reciprocal is the activations' global scale (the kernels and the
 * reference quantize with 1/input_scale): it must be finite too. weight_scale_2 scales
 * weights of up to 6 (e2m1) * 448 (e4m3 block scale): 6 * 448 * weight_scale_2 must be
 * finite (ModelOpt exports amax / (6 * 448)), else the weights are infinities. */
static mj_status ck_scalar(mj_checkpoint_t ck, const ck_ref *r, int kind, float *out) {
    float v;
    MJ_CHECK(ck_copy(ck, r, 0, sizeof v, &v));
    if (!isfinite(v))
        return mj_set_error(MJ_ERR_NONFINITE, "%s: tensor '%s' is %g: a scale must be finite (a broken export?)",
                            r->f->label, r->t->name, (double)v);
    if (!(v > 0.0f))
        return mj_set_error(MJ_ERR_PARSE, "%s: tensor '%s' is %g: a scale must be positive", r->f->label, r->t->name,
                            (double)v);
    if (kind == CK_INPUT_SCALE && !isfinite(1.0f / v))
        return mj_set_error(MJ_ERR_NONFINITE,
                            "%s: tensor '%s' is %g: 1/input_scale (the activations' global scale) overflows float; "
                            "an input_scale is amax / (6 * 448) of the calibration activations (a broken export?)",
                            r->f->label, r->t->name, (double)v);
    if (kind == CK_WEIGHT_SCALE_2 && !isfinite(6.0f * 448.0f * v))
        return mj_set_error(MJ_ERR_NONFINITE,
                            "%s: tensor '%s' is %g: 6 * 448 * weight_scale_2 (the largest weight it scales) overflows "
                            "float; a weight_scale_2 is amax / (6 * 448) of the weights (a broken export?)",
                            r->f->label, r->t->name, (double)v);
    *out = v;
    return MJ_OK;
}

/* Block scales just copied (rows of k16 bytes): not the e4m3 NaN (0x7F / 0xFF), not negative
 * (the kernels read them as unsigned e4m3). `row0` is the first row's index in the tensor. */
static mj_status check_block_scales(const ck_ref *r, const uint8_t *sf, int64_t rows, int64_t k16, int64_t row0,
                                    int64_t col0) {
    const int64_t i = mj_nvfp4_scale_bad(sf, rows * k16);
    if (i < 0) return MJ_OK;
    const uint8_t b = sf[i];
    if ((b & 0x7F) == 0x7F)
        return mj_set_error(MJ_ERR_NONFINITE, "%s: tensor '%s': block scale [%lld, %lld] is NaN (e4m3 0x%02X)",
                            r->f->label, r->t->name, (long long)(row0 + i / k16), (long long)(col0 + i % k16), b);
    return mj_set_error(MJ_ERR_PARSE, "%s: tensor '%s': block scale [%lld, %lld] is negative (e4m3 0x%02X); "
                        "NVFP4 block scales are unsigned", r->f->label, r->t->name,
                        (long long)(row0 + i / k16), (long long)(col0 + i % k16), b);
}

/* ---- one projection ------------------------------------------------------------------------ */

/* The four tensors of one NVFP4 linear, checked against its shape [n_out, k_in]. */
typedef struct proj_refs {
    ck_ref w, sf, s2, in;
} proj_refs;

static mj_status proj_resolve(mj_checkpoint_t ck, int32_t layer, int32_t expert, int p, int64_t n_out,
                              int64_t k_in, proj_refs *r) {
    char name[MJ_CK_NAME_MAX], what[96];
    const mj_st_dtype u8[1] = {MJ_ST_U8}, f32[1] = {MJ_ST_F32}, e4m3[2] = {MJ_ST_F8_E4M3, MJ_ST_U8};
    const char *who = expert == MJ_CK_SHARED ? "shared expert" : "routed expert";
    const char *pn = ck->names->proj[p];
    MJ_CHECK(ck_get(ck, mj_ck_tensor_name(name, sizeof name, ck->names, layer, expert, p, "weight"), &r->w));
    mj_st_dtype dt = r->w.t->dtype;
    if (dt == MJ_ST_BF16 || dt == MJ_ST_F16 || dt == MJ_ST_F32)
        return mj_set_error(MJ_ERR_UNSUPPORTED, "%s: tensor '%s' is %s: an unquantized %s, which moejit does not "
                            "run (its kernels take NVFP4 experts only); quantize it with ModelOpt (take "
                            "'%s' out of exclude_modules) or use a checkpoint that did",
                            r->w.f->label, name, mj_st_dtype_name(dt), who,
                            expert == MJ_CK_SHARED ? (!strcmp(ck->names->shared, "shared_expert") ? "*shared_expert.*"
                                                                                                   : "*shared_experts*")
                                                   : "*experts*");
    snprintf(what, sizeof what, "%s %s: two E2M1 codes a byte", who, pn);
    MJ_CHECK(ck_expect(&r->w, u8, 1, 2, n_out, k_in / 2, what));
    MJ_CHECK(ck_get(ck, mj_ck_tensor_name(name, sizeof name, ck->names, layer, expert, p, "weight_scale"), &r->sf));
    snprintf(what, sizeof what, "%s %s: one e4m3 scale per 16 elements", who, pn);
    MJ_CHECK(ck_expect(&r->sf, e4m3, 2, 2, n_out, k_in / MJ_NVFP4_GROUP, what));
    MJ_CHECK(ck_get(ck, mj_ck_tensor_name(name, sizeof name, ck->names, layer, expert, p, "weight_scale_2"), &r->s2));
    MJ_CHECK(ck_expect(&r->s2, f32, 1, 0, 0, 0, "a per-tensor scale"));
    MJ_CHECK(ck_get(ck, mj_ck_tensor_name(name, sizeof name, ck->names, layer, expert, p, "input_scale"), &r->in));
    MJ_CHECK(ck_expect(&r->in, f32, 1, 0, 0, 0, "a per-tensor scale"));
    return MJ_OK;
}

/* What a layer's loading noticed, for the one warning it gives. */
typedef struct load_notes {
    int32_t mismatched;        /* experts (and shared) whose gate/up weight_scale_2 differ      */
    char first[96];            /* the first of them                                             */
    float first_gate, first_up;
} load_notes;

/* The fused siblings gate and up share one weight_scale_2 in w13 (the kernels apply one scale
 * to the whole [2I, H] GEMM). ModelOpt exports them equal; when a checkpoint's differ I take
 * the larger and re-express the other sibling's block scales against it:
 *     scale' = e4m3(e4m3_value(scale) * ws_small / ws_big)
 * keeping its FP4 codes. This is lossy: scale' is rounded to e4m3 (3 mantissa bits, so up
 * to 1/16 relative per block, more where it falls among the subnormals), and a non-zero scale
 * that would round to zero is kept at the smallest subnormal (0x01), as ModelOpt >= 0.45
 * quantizes a non-zero block whose scale underflows. */

/* w13 rows of one expert: gate rows [c0, c0+n) then up rows [c0, c0+n) (of [I, H] each). */
static mj_status load_w13(mj_checkpoint_t ck, const proj_refs *g, const proj_refs *u, int32_t H, int32_t c0,
                          int32_t n, const char *who, load_notes *notes, mj_nvfp4_linear *dst) {
    MJ_CHECK(mj_linear_alloc(dst, 2 * n, H));
    const uint64_t qb = (uint64_t)H / 2, sb = (uint64_t)H / MJ_NVFP4_GROUP;
    MJ_CHECK(ck_copy(ck, &g->w, (uint64_t)c0 * qb, (uint64_t)n * qb, dst->weight));
    MJ_CHECK(ck_copy(ck, &u->w, (uint64_t)c0 * qb, (uint64_t)n * qb, dst->weight + (size_t)n * qb));
    MJ_CHECK(ck_copy(ck, &g->sf, (uint64_t)c0 * sb, (uint64_t)n * sb, dst->weight_scale));
    MJ_CHECK(ck_copy(ck, &u->sf, (uint64_t)c0 * sb, (uint64_t)n * sb, dst->weight_scale + (size_t)n * sb));
    MJ_CHECK(check_block_scales(&g->sf, dst->weight_scale, n, (int64_t)sb, c0, 0));
    MJ_CHECK(check_block_scales(&u->sf, dst->weight_scale + (size_t)n * sb, n, (int64_t)sb, c0, 0));
    float gs2, us2, gin, uin;
    MJ_CHECK(ck_scalar(ck, &g->s2, CK_WEIGHT_SCALE_2, &gs2));
    MJ_CHECK(ck_scalar(ck, &u->s2, CK_WEIGHT_SCALE_2, &us2));
    MJ_CHECK(ck_scalar(ck, &g->in, CK_INPUT_SCALE, &gin));
    MJ_CHECK(ck_scalar(ck, &u->in, CK_INPUT_SCALE, &uin));
    if (gs2 != us2) {
        if (gs2 < us2) mj_nvfp4_scales_reexpress(dst->weight_scale, (int64_t)n * (int64_t)sb, gs2 / us2);
        else mj_nvfp4_scales_reexpress(dst->weight_scale + (size_t)n * sb, (int64_t)n * (int64_t)sb, us2 / gs2);
        if (!notes->mismatched++) {
            snprintf(notes->first, sizeof notes->first, "%s", who);
            notes->first_gate = gs2, notes->first_up = us2;
        }
    }
    dst->weight_scale_2 = gs2 > us2 ? gs2 : us2;
    /* One input quantization serves both siblings: the larger scale clips neither. */
    dst->input_scale = gin > uin ? gin : uin;
    return MJ_OK;
}

/* w2 columns [c0, c0+n) of one expert's [H, I] down projection (whole 16-element blocks). */
static mj_status load_w2(mj_checkpoint_t ck, const proj_refs *d, int32_t H, int32_t I, int32_t c0, int32_t n,
                         mj_nvfp4_linear *dst) {
    MJ_CHECK(mj_linear_alloc(dst, H, n));
    const uint64_t qb = (uint64_t)I / 2, sb = (uint64_t)I / MJ_NVFP4_GROUP;
    const uint64_t nq = (uint64_t)n / 2, ns = (uint64_t)n / MJ_NVFP4_GROUP;
    MJ_CHECK(ck_copy_cols(ck, &d->w, H, qb, (uint64_t)c0 / 2, nq, dst->weight));
    MJ_CHECK(ck_copy_cols(ck, &d->sf, H, sb, (uint64_t)c0 / MJ_NVFP4_GROUP, ns, dst->weight_scale));
    MJ_CHECK(check_block_scales(&d->sf, dst->weight_scale, H, (int64_t)ns, 0, c0 / MJ_NVFP4_GROUP));
    MJ_CHECK(ck_scalar(ck, &d->s2, CK_WEIGHT_SCALE_2, &dst->weight_scale_2));
    MJ_CHECK(ck_scalar(ck, &d->in, CK_INPUT_SCALE, &dst->input_scale));
    return MJ_OK;
}

/* ---- one layer ------------------------------------------------------------------------------ */

/* "3-5, 7" into buf (at most n bytes; "..." when cut). */
static const char *layer_list(mj_checkpoint_t ck, char *buf, size_t n) {
    size_t k = 0;
    buf[0] = '\0';
    if (!ck->n_layers) return "none";
    for (int32_t i = 0; i < ck->n_layers && k + 24 < n;) {
        int32_t j = i;
        while (j + 1 < ck->n_layers && ck->layers[j + 1] == ck->layers[j] + 1) j++;
        if (j > i) k += (size_t)snprintf(buf + k, n - k, "%s%d-%d", k ? ", " : "", ck->layers[i], ck->layers[j]);
        else k += (size_t)snprintf(buf + k, n - k, "%s%d", k ? ", " : "", ck->layers[i]);
        i = j + 1;
        if (i < ck->n_layers && k + 24 >= n) snprintf(buf + k, n - k, ", ...");
    }
    return buf;
}

/* The arguments and the split, with mj_layer_shard's rules and messages. */
static mj_status check_split(mj_checkpoint_t ck, int32_t layer, mj_parallel kind, int32_t rank, int32_t n_ranks) {
    const mj_moe_config *cfg = &ck->cfg;
    if (n_ranks < 1 || rank < 0 || rank >= n_ranks)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_layer_load: rank %d of %d is out of range", rank, n_ranks);
    if (kind != MJ_PAR_TP && kind != MJ_PAR_EP && kind != MJ_PAR_NONE)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_layer_load: unknown split kind %d", (int)kind);
    if (kind == MJ_PAR_NONE && n_ranks != 1)
        return mj_set_error(MJ_ERR_INVALID_ARG,
                            "mj_layer_load: MJ_PAR_NONE is one rank holding all; use TP or EP for %d", n_ranks);
    int found = 0;
    for (int32_t i = 0; i < ck->n_layers; i++) found |= ck->layers[i] == layer;
    if (!found) {
        char list[256];
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_layer_load: %s holds no tensors of MoE layer %d (its MoE layers: "
                            "%s; mj_checkpoint_moe_layers lists them)", ck->dir, layer,
                            layer_list(ck, list, sizeof list));
    }
    if (kind != MJ_PAR_NONE) MJ_CHECK(mj_split_check(cfg, (int64_t)cfg->n_shared * cfg->intermediate, kind, n_ranks));
    return MJ_OK;
}

/* ---- tensors the config makes the loader skip ----------------------------------------------- */

/* "E.PROJ.FIELD" below BLOCK.experts. (or "PROJ.FIELD" below BLOCK.shared_experts., e NULL):
 * one of the tensors the loader reads? */
static int known_proj(const char *p, const mj_ck_names *names, int32_t n_experts, int with_expert) {
    if (with_expert) {
        int64_t e = 0;
        if (*p < '0' || *p > '9') return 0;
        for (; *p >= '0' && *p <= '9'; p++)
            if ((e = e * 10 + (*p - '0')) >= n_experts) return 0;
        if (*p++ != '.') return 0;
    }
    static const char *const fields[] = {"weight", "weight_scale", "weight_scale_2", "input_scale"};
    for (int j = 0; j < 3; j++) {
        size_t n = strlen(names->proj[j]);
        if (strncmp(p, names->proj[j], n) || p[n] != '.') continue;
        for (size_t f = 0; f < sizeof fields / sizeof fields[0]; f++)
            if (!strcmp(p + n + 1, fields[f])) return 1;
    }
    return 0;
}

/* A bias stored as zeros (f32 or bf16, either sign) selects as no bias does. */
static mj_status all_zero(mj_checkpoint_t ck, const ck_ref *r, int *zero) {
    const mj_st_tensor *t = r->t;
    size_t w = t->dtype == MJ_ST_F32 ? 4 : t->dtype == MJ_ST_BF16 ? 2 : 0;
    uint64_t len = t->end - t->begin;
    *zero = 0;
    if (!w || len > (1u << 20)) return MJ_OK;
    uint8_t *b = malloc(len ? len : 1);
    if (!b) return mj_set_error(MJ_ERR_NOMEM, "out of memory reading %s", t->name);
    mj_status st = ck_copy(ck, r, 0, len, b);
    *zero = st == MJ_OK;
    for (uint64_t i = 0; st == MJ_OK && i < len; i++) /* little endian: the sign is the last byte's top bit */
        if (b[i] & ((i % w == w - 1) ? 0x7F : 0xFF)) *zero = 0;
    free(b);
    return st;
}

/* Every tensor of MoE layer `layer`'s block (model.layers.L.BLOCK.) is one the loader reads. One
 * it would skip is an error naming it, because the layer would run without it: a selection bias
 * the config's routing does not use, a shared expert (or a shared-expert gate) the config does
 * not declare, another family's shared expert, an expert past n_routed_experts, anything else. The one exception is a
 * selection bias of zeros, which selects as no bias does: a warning. */
static mj_status check_unread(mj_checkpoint_t ck, int32_t layer) {
    const mj_moe_config *cfg = &ck->cfg;
    const mj_ck_names *nm = ck->names;
    char prefix[MJ_CK_NAME_MAX], bias[MJ_CK_NAME_MAX], gate_name[MJ_CK_NAME_MAX];
    int np = snprintf(prefix, sizeof prefix, "model.layers.%d.%s.", (int)layer, nm->block);
    const size_t ns = strlen(nm->shared);
    snprintf(gate_name, sizeof gate_name, "%s.weight", nm->shared_gate ? nm->shared_gate : "");
    mj_ck_tensor_name(bias, sizeof bias, nm, layer, MJ_CK_ROUTER, 0, "e_score_correction_bias");
    int64_t lo = 0, hi = ck->n_entries; /* the first entry >= prefix */
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (strcmp(ck->entries[mid].name, prefix) < 0) lo = mid + 1;
        else hi = mid;
    }
    for (int64_t i = lo; i < ck->n_entries && !strncmp(ck->entries[i].name, prefix, (size_t)np); i++) {
        const char *name = ck->entries[i].name, *rest = name + np, *why;
        if (!strcmp(rest, "gate.weight") || (!strncmp(rest, "experts.", 8) && known_proj(rest + 8, nm, cfg->n_experts, 1)))
            continue;
        if (!strcmp(name, bias)) {
            if (cfg->has_correction_bias) continue;
            int zero;
            ck_ref r = {ck->entries[i].file, ck->entries[i].t};
            MJ_CHECK(all_zero(ck, &r, &zero));
            if (zero) {
                mj_warn("%s: tensor '%s' is a selection bias the config's routing does not use; it is all zeros, "
                        "which selects as no bias does, so it is skipped", r.f->label, name);
                continue;
            }
            why = "a selection bias (e_score_correction_bias), which the config's routing does not use (topk_method "
                  "noaux_tc uses one; MiniMax-M2's use_routing_bias false turns it off)";
        } else if (!strncmp(rest, nm->shared, ns) && rest[ns] == '.' && known_proj(rest + ns + 1, nm, 0, 0)) {
            if (cfg->n_shared > 0) continue;
            why = nm->shared_gate ? "a shared expert, which the config does not declare "
                                    "(shared_expert_intermediate_size is 0)"
                                  : "a shared expert, which the config does not declare (n_shared_experts is 0 or "
                                    "absent)";
        } else if (nm->shared_gate && !strcmp(rest, gate_name)) {
            if (cfg->shared_gate) continue;
            why = "the shared expert's sigmoid gate, which the config does not declare "
                  "(shared_expert_intermediate_size is 0)";
        } else if (!strncmp(rest, "shared_expert_gate.", 19)) {
            why = "a sigmoid gate on the shared expert (Qwen2-MoE's and Qwen3-Next's shared_expert_gate), which this "
                  "model_type's MoE block does not have";
        } else if (!strncmp(rest, "shared_expert.", 14) || !strncmp(rest, "shared_experts.", 15)) {
            why = nm->shared_gate ? "a shared expert under DeepSeek's name (shared_experts); this model_type's is "
                                    "shared_expert"
                                  : "a shared expert under Qwen-MoE's name (shared_expert); this model_type's are "
                                    "shared_experts";
        } else if (!strncmp(rest, "experts.", 8) && rest[8] >= '0' && rest[8] <= '9' &&
                   !known_proj(rest + 8, nm, INT32_MAX, 1)) {
            why = "not one of the expert tensors moejit reads";
        } else if (!strncmp(rest, "experts.", 8) && rest[8] >= '0' && rest[8] <= '9') {
            why = "an expert past n_routed_experts";
        } else {
            why = "not a tensor moejit reads of an MoE layer (a router bias, a fused or extra projection?)";
        }
        return mj_set_error(MJ_ERR_UNSUPPORTED, "%s: tensor '%s' is in MoE layer %d, but the config makes moejit skip "
                            "it: %s. The layer would run without it and give wrong outputs; fix config.json or the "
                            "checkpoint", ck->entries[i].file->label, name, (int)layer, why);
    }
    return MJ_OK;
}

mj_status mj_layer_load(mj_checkpoint_t ck, int32_t layer, mj_parallel kind, int32_t rank, int32_t n_ranks,
                        mj_layer_t *out) {
    if (!ck || !out) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_layer_load: NULL argument");
    MJ_CHECK(check_split(ck, layer, kind, rank, n_ranks));
    MJ_CHECK(check_unread(ck, layer));
    const mj_moe_config *cfg = &ck->cfg;
    const int32_t H = cfg->hidden, I = cfg->intermediate, E = cfg->n_experts, Is = cfg->n_shared * I;
    const int32_t tp = kind == MJ_PAR_TP ? n_ranks : 1;
    const int32_t n_local = kind == MJ_PAR_EP ? E / n_ranks : E, e0 = kind == MJ_PAR_EP ? rank * n_local : 0;
    const int32_t il = I / tp, isl = Is / tp, c0 = kind == MJ_PAR_TP ? rank * il : 0, cs0 = kind == MJ_PAR_TP ? rank * isl : 0;
    const int has_shared = cfg->n_shared > 0 && (kind != MJ_PAR_EP || rank == 0);
    mj_status st = MJ_OK;
    char name[MJ_CK_NAME_MAX];
    ck_ref gate, bias = {NULL, NULL}, sgate = {NULL, NULL};
    proj_refs shared[3];
    proj_refs *refs = malloc((size_t)(n_local ? n_local : 1) * 3 * sizeof *refs);
    mj_layer_t L = NULL;
    load_notes notes = {0, "", 0.0f, 0.0f};
    if (!refs) {
        st = mj_set_error(MJ_ERR_NOMEM, "out of memory loading layer %d", layer);
        goto fail;
    }

    /* First every tensor's dtype and shape (headers only), then the bytes. */
    const mj_st_dtype bf16[1] = {MJ_ST_BF16}, f32[1] = {MJ_ST_F32};
    MJ_CHECK_GOTO(ck_get(ck, mj_ck_tensor_name(name, sizeof name, ck->names, layer, MJ_CK_ROUTER, 0, "weight"), &gate), st, fail);
    MJ_CHECK_GOTO(ck_expect(&gate, bf16, 1, 2, E, H, "the router: [n_routed_experts, hidden_size]"), st, fail);
    if (cfg->has_correction_bias) {
        MJ_CHECK_GOTO(ck_get(ck, mj_ck_tensor_name(name, sizeof name, ck->names, layer, MJ_CK_ROUTER, 0, "e_score_correction_bias"),
                             &bias), st, fail);
        MJ_CHECK_GOTO(ck_expect(&bias, f32, 1, 1, E, 0, "noaux_tc's selection bias: [n_routed_experts]"), st, fail);
    }
    for (int32_t e = 0; e < n_local; e++)
        for (int p = 0; p < 3; p++)
            MJ_CHECK_GOTO(proj_resolve(ck, layer, e0 + e, p, p < 2 ? I : H, p < 2 ? H : I, &refs[e * 3 + p]), st, fail);
    if (has_shared)
        for (int p = 0; p < 3; p++)
            MJ_CHECK_GOTO(proj_resolve(ck, layer, MJ_CK_SHARED, p, p < 2 ? Is : H, p < 2 ? H : Is, &shared[p]), st, fail);
    if (has_shared && cfg->shared_gate) { /* whole on every rank that holds a slice of the shared expert */
        MJ_CHECK_GOTO(ck_get(ck, mj_ck_tensor_name(name, sizeof name, ck->names, layer, MJ_CK_SHARED_GATE, 0, "weight"),
                             &sgate), st, fail);
        MJ_CHECK_GOTO(ck_expect(&sgate, bf16, 1, 2, 1, H, "the shared expert's sigmoid gate: [1, hidden_size], "
                                "unquantized"), st, fail);
    }

    /* The handle, as mj_layer_shard lays it out. */
    MJ_CHECK_GOTO(mj_layer_new(cfg, n_local, &L), st, fail);
    L->par = kind;
    L->rank = rank;
    L->n_ranks = n_ranks;
    L->i_local = il;
    L->expert_begin = e0;
    L->has_shared = has_shared;
    L->is_local = has_shared ? isl : 0;
    MJ_CHECK_GOTO(ck_copy(ck, &gate, 0, (uint64_t)E * (uint64_t)H * 2, L->gate), st, fail);
    if (L->bias) {
        MJ_CHECK_GOTO(ck_copy(ck, &bias, 0, (uint64_t)E * sizeof(float), L->bias), st, fail);
        for (int32_t e = 0; e < E; e++)
            if (!isfinite(L->bias[e])) {
                st = mj_set_error(MJ_ERR_NONFINITE, "%s: tensor '%s': element %d is %g; the bias must be finite",
                                  bias.f->label, bias.t->name, e, (double)L->bias[e]);
                goto fail;
            }
    }
    for (int32_t e = 0; e < n_local; e++) {
        char who[48];
        snprintf(who, sizeof who, "expert %d", e0 + e);
        const proj_refs *r = &refs[e * 3];
        MJ_CHECK_GOTO(load_w13(ck, &r[0], &r[1], H, c0, il, who, &notes, &L->w13[e]), st, fail);
        MJ_CHECK_GOTO(load_w2(ck, &r[2], H, I, c0, il, &L->w2[e]), st, fail);
    }
    if (sgate.t) {
        MJ_CHECK_GOTO(mj_layer_shared_gate_alloc(L), st, fail);
        MJ_CHECK_GOTO(ck_copy(ck, &sgate, 0, (uint64_t)H * 2, L->shared_gate), st, fail);
        for (int32_t h = 0; h < H; h++)
            if (!isfinite(mj_bf16_to_f32(L->shared_gate[h]))) {
                st = mj_set_error(MJ_ERR_NONFINITE, "%s: tensor '%s': element %d is %g; the gate must be finite",
                                  sgate.f->label, sgate.t->name, h, (double)mj_bf16_to_f32(L->shared_gate[h]));
                goto fail;
            }
    }
    if (has_shared) {
        MJ_CHECK_GOTO(load_w13(ck, &shared[0], &shared[1], H, cs0, isl, "the shared expert", &notes, &L->shared_w13), st,
                      fail);
        MJ_CHECK_GOTO(load_w2(ck, &shared[2], H, Is, cs0, isl, &L->shared_w2), st, fail);
    }
    if (notes.mismatched)
        mj_warn("%s: MoE layer %d: gate_proj and up_proj have different weight_scale_2 in %d expert(s) (first: %s, "
                "%g vs %g); loaded with the larger, the other's block scales re-rounded to e4m3 against it (lossy)",
                ck->dir, layer, notes.mismatched, notes.first, (double)notes.first_gate, (double)notes.first_up);
    free(refs);
    *out = L;
    return MJ_OK;
fail:
    free(refs);
    mj_layer_free(L);
    return st;
}
