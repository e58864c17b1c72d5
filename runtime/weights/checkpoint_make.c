/* checkpoint_make.c — write a ModelOpt-layout NVFP4 checkpoint of random MoE layers
 * (`moejit make-checkpoint`, and the tests' good checkpoints).
 *
 * The plan comes first and is complete before a byte is written: the output config.json
 * (the source's keys, the overrides applied), the quantization file, the config that the
 * reader will make of them (layers are generated from exactly that config, so a round trip
 * compares equal), every tensor's name, dtype and shape, which shard it goes to, each shard's
 * header and the index. So the size said beforehand is the size written, and the free-space
 * check is against it.
 *
 * Writing: a new directory beside out_dir (".NAME.tmp-PID-N"), files created O_EXCL |
 * O_NOFOLLOW in it, one layer generated at a time and its tensors appended to the shard they
 * belong to, every file fsynced, the directory renamed to out_dir, the parent fsynced. On any
 * error the files made so far and the directory are removed.
 */
#include "weights/checkpoint.h"
#include "weights/layer.h"
#include "base.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define DEFAULT_SHARD_BYTES 5000000000LL /* Hugging Face's max_shard_size "5GB" */

mj_status mj_checkpoint_layer_seed(uint64_t seed, int32_t layer, uint64_t *out) {
    if (!out || layer < 0)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_checkpoint_layer_seed: NULL out or layer %d < 0", layer);
    uint64_t state = seed + (uint64_t)(layer + 1) * 0xD1B54A32D192ED03ull;
    *out = mj_rng_next(&state);
    return MJ_OK;
}

/* ---- the plan ------------------------------------------------------------------------------ */

/* Where a tensor's bytes come from in a layer handle. */
enum { F_WEIGHT, F_SCALE, F_SCALE2, F_INPUT, F_COUNT };
static const char *const k_field[F_COUNT] = {"weight", "weight_scale", "weight_scale_2", "input_scale"};

typedef struct tsrc {
    int32_t layer;
    int32_t expert;            /* >= 0, MJ_CK_SHARED, MJ_CK_ROUTER or MJ_CK_SHARED_GATE       */
    int8_t proj;               /* 0 gate, 1 up, 2 down                                        */
    int8_t field;              /* F_*; for the router: 0 weight, 1 bias                       */
} tsrc;

typedef struct plan {
    mj_checkpoint_make_options o;
    char *config_text, *quant_text, *index_text;
    int inline_quant;          /* the source config has a quantization_config               */
    mj_moe_config cfg;
    const mj_ck_names *tnames; /* the family's tensor names                                 */
    int32_t *layers;
    int32_t n_layers;
    mj_st_entry *t;            /* [n_t] in file order                                        */
    tsrc *src;                 /* [n_t]                                                       */
    char *names;               /* the names' storage                                         */
    int64_t n_t;
    int32_t n_shards;
    int64_t *shard_first;      /* [n_shards + 1]: shard s holds tensors [first[s], first[s+1]) */
    char (*shard_name)[48];    /* [n_shards]                                                  */
    uint8_t **header;          /* [n_shards]: the first 8 + N bytes of each                   */
    uint64_t *header_len;
    int64_t tensor_bytes, total_bytes;
    char *parent, *base;       /* out_dir split: where the temporary directory goes         */
} plan;

static void plan_free(plan *p) {
    free(p->config_text), free(p->quant_text), free(p->index_text);
    free(p->layers), free(p->t), free(p->src), free(p->names), free(p->shard_first), free(p->shard_name);
    for (int32_t s = 0; p->header && s < p->n_shards; s++) free(p->header[s]);
    free(p->header), free(p->header_len), free(p->parent), free(p->base);
    memset(p, 0, sizeof *p);
}

/* The source config with the overrides applied, as text. */
static mj_status build_config(plan *p) {
    const mj_checkpoint_make_options *o = &p->o;
    char *text = NULL;
    size_t len;
    /* A path the caller names: a link is followed (base/file.c). */
    MJ_CHECK(mj_ck_read_text(AT_FDCWD, o->config_json, o->config_json, MJ_CK_CONFIG_MAX, MJ_FILE_FOLLOW, &text,
                             &len));
    json_error_t jerr;
    json_t *root = json_loadb(text, len, 0, &jerr);
    const mj_family *fam = NULL;
    mj_status st = root ? mj_family_of(text, o->config_json, &fam) : MJ_OK;
    free(text);
    if (st != MJ_OK) {
        json_decref(root);
        return st;
    }
    p->tnames = mj_family_names(fam);
    if (!root || !json_is_object(root)) {
        json_decref(root);
        return mj_set_error(MJ_ERR_PARSE, "%s: not a JSON object (line %d: %s)", o->config_json, jerr.line, jerr.text);
    }
    json_t *m = root, *tc = json_object_get(root, "text_config");
    if (!json_object_get(root, "hidden_size") && json_is_object(tc)) m = tc;
    const json_t *q1 = json_object_get(root, "quantization_config"), *q2 = json_object_get(m, "quantization_config");
    p->inline_quant = (q1 && !json_is_null(q1)) || (q2 && !json_is_null(q2));
    /* The overrides go to the keys the family reads (config.c: parse_sizes). */
    const char *ekey = fam && fam->experts_key ? fam->experts_key
                       : !json_object_get(m, "n_routed_experts") && json_object_get(m, "num_experts") ? "num_experts"
                                                                                                       : "n_routed_experts";
    const char *ikey = fam && fam->width_key ? fam->width_key : "moe_intermediate_size";
    const struct {
        const char *key;
        int32_t v;
    } ov[] = {{"hidden_size", o->hidden}, {ikey, o->intermediate}, {ekey, o->n_experts},
              {"num_experts_per_tok", o->topk}};
    int bad = 0;
    /* A gated shared expert's width (Qwen's shared_expert_intermediate_size) keeps its multiple
     * of the expert width, as n_shared_experts does elsewhere (a width that is not one is left
     * for the reader to refuse). */
    const json_t *w0 = json_object_get(m, ikey);
    if (fam && fam->shared_key && o->intermediate && json_is_integer(w0) && json_integer_value(w0) > 0) {
        const json_t *sv = json_object_get(m, fam->shared_key);
        json_int_t sw = json_is_integer(sv) ? json_integer_value(sv) : fam->shared_width, iw = json_integer_value(w0);
        if (sw >= 0 && sw % iw == 0) bad |= json_object_set_new(m, fam->shared_key, json_integer(sw / iw * o->intermediate));
    }
    for (size_t i = 0; i < sizeof ov / sizeof ov[0]; i++)
        if (ov[i].v) bad |= json_object_set_new(m, ov[i].key, json_integer(ov[i].v));
    p->config_text = bad ? NULL : json_dumps(root, JSON_INDENT(2));
    json_decref(root);
    if (!p->config_text) return mj_set_error(MJ_ERR_NOMEM, "out of memory writing config.json");
    size_t n = strlen(p->config_text);
    char *nl = realloc(p->config_text, n + 2); /* a final newline, as editors write them */
    if (!nl) return mj_set_error(MJ_ERR_NOMEM, "out of memory writing config.json");
    memcpy(nl + n, "\n", 2);
    p->config_text = nl;
    return MJ_OK;
}

static const char k_default_quant[] =
    "{\n"
    "  \"producer\": {\"name\": \"moejit\", \"version\": \"" MJ_VERSION_STRING "\"},\n"
    "  \"quantization\": {\n"
    "    \"quant_algo\": \"NVFP4\",\n"
    "    \"group_size\": 16,\n"
    "    \"kv_cache_quant_algo\": null,\n"
    "    \"exclude_modules\": [\"lm_head\", \"model.layers.*.self_attn*\", \"model.layers.*.%s.gate\"%s]\n"
    "  }\n"
    "}\n";

static mj_status build_quant_and_cfg(plan *p) {
    const mj_checkpoint_make_options *o = &p->o;
    size_t len;
    if (o->quant_json) {
        MJ_CHECK(mj_ck_read_text(AT_FDCWD, o->quant_json, o->quant_json, MJ_CK_CONFIG_MAX, MJ_FILE_FOLLOW,
                                 &p->quant_text, &len));
    } else {
        char gate[96] = ""; /* Qwen's shared-expert gate: unquantized too, as ModelOpt leaves it */
        if (p->tnames->shared_gate)
            snprintf(gate, sizeof gate, ", \"model.layers.*.%s.%s\"", p->tnames->block, p->tnames->shared_gate);
        if (asprintf(&p->quant_text, k_default_quant, p->tnames->block, gate) < 0) p->quant_text = NULL;
    }
    if (!p->quant_text) return mj_set_error(MJ_ERR_NOMEM, "out of memory");
    char label[1100];
    snprintf(label, sizeof label, "%s (with the overrides)", o->config_json);
    MJ_CHECK(mj_moe_config_parse(p->config_text, p->quant_text, label, &p->cfg));
    if (p->cfg.quant != MJ_QUANT_NVFP4)
        return mj_set_error(MJ_ERR_UNSUPPORTED, "%s: not an NVFP4 quantization; the checkpoint's tensors are NVFP4",
                            o->quant_json ? o->quant_json : "the quantization file");
    /* A quantization_config inside config.json must agree: a reader without the
     * hf_quant_config.json would go by it. */
    mj_moe_config inl;
    if (p->inline_quant &&
        (mj_moe_config_parse(p->config_text, NULL, label, &inl) != MJ_OK || inl.quant != MJ_QUANT_NVFP4))
        return mj_set_error(MJ_ERR_UNSUPPORTED, "%s: its quantization_config is not NVFP4, but the checkpoint's "
                            "tensors are: use a config without one, or an NVFP4 one", o->config_json);
    /* The kernels' own requirements (sizes multiples of 64, ...), before any work. */
    mj_status st = mj_moe_config_validate(&p->cfg, 1);
    if (st != MJ_OK) return mj_error_prefix(st, "%s", label);
    return MJ_OK;
}

static mj_status choose_layers(plan *p) {
    const mj_checkpoint_make_options *o = &p->o;
    mj_ck_layout lo;
    MJ_CHECK(mj_ck_layout_parse(p->config_text, o->config_json, &lo));
    char why[200];
    snprintf(why, sizeof why, "first_k_dense_replace %d, moe_layer_freq %d, num_hidden_layers %d%s, %d MTP layer%s",
             lo.first_k_dense_replace, lo.moe_layer_freq, lo.num_hidden_layers,
             lo.num_hidden_layers < 0 ? " (absent)" : "", lo.n_mtp, lo.n_mtp == 1 ? "" : "s");
    int32_t first = o->layer_first, last = o->layer_last;
    if (first < 0) {
        first = lo.first_k_dense_replace;
        while (first % lo.moe_layer_freq) first++;
        if (!mj_ck_layout_is_moe(&lo, first))
            return mj_set_error(MJ_ERR_CONFIG, "%s: the config has no MoE layer (%s)", o->config_json, why);
    }
    if (last < 0) last = first;
    if (last < first)
        return mj_set_error(MJ_ERR_INVALID_ARG, "layers %d-%d: the range is empty (the last is before the first)",
                            first, last);
    if (lo.num_hidden_layers >= 0 && last >= lo.num_hidden_layers + lo.n_mtp)
        return mj_set_error(MJ_ERR_INVALID_ARG, "layer %d is past the model's last layer (%s, from %s)", last, why,
                            o->config_json);
    if (!(p->layers = malloc((size_t)(last - first + 1) * sizeof *p->layers)))
        return mj_set_error(MJ_ERR_NOMEM, "out of memory");
    for (int32_t L = first; L <= last; L++)
        if (mj_ck_layout_is_moe(&lo, L)) p->layers[p->n_layers++] = L;
    if (!p->n_layers)
        return mj_set_error(MJ_ERR_INVALID_ARG, "layers %d-%d are all dense (%s, from %s): pick MoE layers", first,
                            last, why, o->config_json);
    return MJ_OK;
}

/* Every tensor, in file order (per layer: the router, its bias, experts 0..E-1 gate/up/down,
 * the shared expert, its gate), then shards: tensors in order until the next would pass
 * shard_bytes. */
static mj_status build_tensors(plan *p) {
    const mj_moe_config *c = &p->cfg;
    const int64_t H = c->hidden, I = c->intermediate, E = c->n_experts, Is = (int64_t)c->n_shared * I;
    const int64_t experts = E + (c->n_shared > 0);
    const int64_t per_layer = 1 + (c->has_correction_bias ? 1 : 0) + experts * 3 * F_COUNT + (c->shared_gate ? 1 : 0);
    p->n_t = per_layer * p->n_layers;
    p->t = calloc((size_t)p->n_t, sizeof *p->t);
    p->src = calloc((size_t)p->n_t, sizeof *p->src);
    p->names = malloc((size_t)p->n_t * MJ_CK_NAME_MAX);
    if (!p->t || !p->src || !p->names) return mj_set_error(MJ_ERR_NOMEM, "out of memory planning %lld tensors", (long long)p->n_t);
    int64_t k = 0;
    for (int32_t li = 0; li < p->n_layers; li++) {
        const int32_t L = p->layers[li];
        for (int32_t r = 0; r < 1 + (c->has_correction_bias ? 1 : 0); r++, k++) {
            char *name = p->names + k * MJ_CK_NAME_MAX;
            mj_ck_tensor_name(name, MJ_CK_NAME_MAX, p->tnames, L, MJ_CK_ROUTER, 0, r ? "e_score_correction_bias" : "weight");
            p->src[k] = (tsrc){L, MJ_CK_ROUTER, 0, (int8_t)r};
            p->t[k] = r ? (mj_st_entry){name, MJ_ST_F32, 1, {E}, (uint64_t)E * 4}
                        : (mj_st_entry){name, MJ_ST_BF16, 2, {E, H}, (uint64_t)(E * H) * 2};
        }
        for (int64_t x = 0; x < experts; x++)
            for (int proj = 0; proj < 3; proj++)
                for (int f = 0; f < F_COUNT; f++, k++) {
                    const int32_t e = x < E ? (int32_t)x : MJ_CK_SHARED;
                    const int64_t inter = x < E ? I : Is;
                    const int64_t n_out = proj < 2 ? inter : H, k_in = proj < 2 ? H : inter;
                    char *name = p->names + k * MJ_CK_NAME_MAX;
                    mj_ck_tensor_name(name, MJ_CK_NAME_MAX, p->tnames, L, e, proj, k_field[f]);
                    p->src[k] = (tsrc){L, e, (int8_t)proj, (int8_t)f};
                    if (f == F_WEIGHT)
                        p->t[k] = (mj_st_entry){name, MJ_ST_U8, 2, {n_out, k_in / 2}, (uint64_t)(n_out * (k_in / 2))};
                    else if (f == F_SCALE)
                        p->t[k] = (mj_st_entry){name, MJ_ST_F8_E4M3, 2, {n_out, k_in / MJ_NVFP4_GROUP},
                                                (uint64_t)(n_out * (k_in / MJ_NVFP4_GROUP))};
                    else /* scalars: shape [], as ModelOpt writes them */
                        p->t[k] = (mj_st_entry){name, MJ_ST_F32, 0, {0}, 4};
                }
        if (c->shared_gate) { /* a Linear(H, 1): bf16 [1, H], unquantized (ModelOpt excludes it) */
            char *name = p->names + k * MJ_CK_NAME_MAX;
            mj_ck_tensor_name(name, MJ_CK_NAME_MAX, p->tnames, L, MJ_CK_SHARED_GATE, 0, "weight");
            p->src[k] = (tsrc){L, MJ_CK_SHARED_GATE, 0, 0};
            p->t[k++] = (mj_st_entry){name, MJ_ST_BF16, 2, {1, H}, (uint64_t)H * 2};
        }
    }
    /* Shards. */
    const int64_t cap = p->o.shard_bytes > 0 ? p->o.shard_bytes : DEFAULT_SHARD_BYTES;
    if (!(p->shard_first = malloc((size_t)(p->n_t + 1) * sizeof *p->shard_first)))
        return mj_set_error(MJ_ERR_NOMEM, "out of memory planning shards");
    int64_t fill = 0;
    for (int64_t i = 0; i < p->n_t; i++) {
        if (i == 0 || (fill > 0 && fill + (int64_t)p->t[i].nbytes > cap)) {
            p->shard_first[p->n_shards++] = i;
            fill = 0;
        }
        fill += (int64_t)p->t[i].nbytes;
        p->tensor_bytes += (int64_t)p->t[i].nbytes;
    }
    p->shard_first[p->n_shards] = p->n_t;
    p->shard_name = calloc((size_t)p->n_shards, sizeof *p->shard_name);
    p->header = calloc((size_t)p->n_shards, sizeof *p->header);
    p->header_len = calloc((size_t)p->n_shards, sizeof *p->header_len);
    if (!p->shard_name || !p->header || !p->header_len) return mj_set_error(MJ_ERR_NOMEM, "out of memory planning shards");
    p->total_bytes = p->tensor_bytes + (int64_t)strlen(p->config_text) + (int64_t)strlen(p->quant_text);
    for (int32_t s = 0; s < p->n_shards; s++) {
        if (p->n_shards == 1) snprintf(p->shard_name[s], sizeof p->shard_name[s], "%s", MJ_CK_SINGLE);
        else snprintf(p->shard_name[s], sizeof p->shard_name[s], "model-%05d-of-%05d.safetensors", s + 1, p->n_shards);
        uint64_t data;
        MJ_CHECK(mj_st_build_header(p->t + p->shard_first[s], p->shard_first[s + 1] - p->shard_first[s], &p->header[s],
                                    &p->header_len[s], &data));
        p->total_bytes += (int64_t)p->header_len[s];
    }
    return MJ_OK;
}

/* model.safetensors.index.json, when there is more than one shard. */
static mj_status build_index(plan *p) {
    if (p->n_shards < 2) return MJ_OK;
    json_t *root = json_object(), *meta = json_object(), *map = json_object();
    int bad = !root || !meta || !map || json_object_set_new(meta, "total_size", json_integer(p->tensor_bytes));
    for (int32_t s = 0; !bad && s < p->n_shards; s++)
        for (int64_t i = p->shard_first[s]; !bad && i < p->shard_first[s + 1]; i++)
            bad |= json_object_set_new(map, p->t[i].name, json_string(p->shard_name[s]));
    bad = bad || json_object_set(root, "metadata", meta) || json_object_set(root, "weight_map", map);
    if (!bad) p->index_text = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(meta), json_decref(map), json_decref(root);
    if (!p->index_text) return mj_set_error(MJ_ERR_NOMEM, "out of memory writing the index");
    p->total_bytes += (int64_t)strlen(p->index_text);
    return MJ_OK;
}

/* out_dir: absent, or an empty directory (not a link to one). */
static mj_status check_destination(plan *p) {
    const char *out = p->o.out_dir;
    size_t n = strlen(out);
    while (n > 1 && out[n - 1] == '/') n--;
    const char *slash = memrchr(out, '/', n);
    p->base = strndup(slash ? slash + 1 : out, slash ? n - (size_t)(slash + 1 - out) : n);
    p->parent = slash ? strndup(out, slash == out ? 1 : (size_t)(slash - out)) : strdup(".");
    if (!p->base || !p->parent) return mj_set_error(MJ_ERR_NOMEM, "out of memory");
    if (!p->base[0] || !strcmp(p->base, ".") || !strcmp(p->base, ".."))
        return mj_set_error(MJ_ERR_INVALID_ARG, "output directory '%s': name the new directory itself", out);
    struct stat sb;
    if (lstat(out, &sb) == 0) {
        if (!S_ISDIR(sb.st_mode))
            return mj_set_error(MJ_ERR_IO, "%s exists and is not a directory (%s): refused; choose a new --out", out,
                                S_ISLNK(sb.st_mode) ? "a symbolic link" : "a file");
        DIR *d = opendir(out);
        if (!d) return mj_set_error(MJ_ERR_IO, "cannot read the directory %s: %s", out, strerror(errno));
        struct dirent *de;
        int empty = 1;
        while (empty && (de = readdir(d))) empty = !strcmp(de->d_name, ".") || !strcmp(de->d_name, "..");
        closedir(d);
        if (!empty)
            return mj_set_error(MJ_ERR_IO, "%s exists and is not empty: refused (nothing is overwritten); choose a "
                                "new --out or remove it", out);
        /* An empty directory is replaced by the rename at the end. */
    } else if (errno != ENOENT) {
        return mj_set_error(MJ_ERR_IO, "cannot check %s: %s", out, strerror(errno));
    }
    return MJ_OK;
}

/* Room for `bytes` on out_dir's file system (with a margin for its own blocks: 1% and 1 MiB). */
static mj_status check_space(const plan *p, int64_t bytes) {
    struct statvfs vs;
    if (statvfs(p->parent, &vs) != 0)
        return mj_set_error(MJ_ERR_IO, "cannot use the directory %s for %s: %s", p->parent, p->o.out_dir,
                            strerror(errno));
    uint64_t avail = (uint64_t)vs.f_bavail * (uint64_t)vs.f_frsize;
    uint64_t need = (uint64_t)bytes + (uint64_t)bytes / 100 + (1u << 20);
    if (need > avail)
        return mj_set_error(MJ_ERR_IO, "the checkpoint needs %llu bytes (%.1f GB) and %s has %llu free (%.1f GB): "
                            "it will not fit; use smaller --hidden/--intermediate/--experts, fewer --layers, or "
                            "another --out", (unsigned long long)bytes, (double)bytes / 1e9, p->parent,
                            (unsigned long long)avail, (double)avail / 1e9);
    return MJ_OK;
}

/* The tensor bytes of the plan's layers, by arithmetic (before the tensors are listed). */
static int64_t data_bytes(const plan *p) {
    const mj_moe_config *c = &p->cfg;
    const int64_t H = c->hidden, I = c->intermediate, E = c->n_experts, Is = (int64_t)c->n_shared * I;
    const int64_t router = E * H * 2 + (c->has_correction_bias ? E * 4 : 0);
    const int64_t expert = 2 * I * (H / 2 + H / MJ_NVFP4_GROUP) + H * (I / 2 + I / MJ_NVFP4_GROUP) + 6 * 4;
    const int64_t shared = Is ? 2 * Is * (H / 2 + H / MJ_NVFP4_GROUP) + H * (Is / 2 + Is / MJ_NVFP4_GROUP) + 6 * 4 : 0;
    return (router + E * expert + shared + (c->shared_gate ? H * 2 : 0)) * p->n_layers;
}

static mj_status make_plan(const mj_checkpoint_make_options *in, plan *p) {
    memset(p, 0, sizeof *p);
    const mj_checkpoint_make_options dflt = MJ_CHECKPOINT_MAKE_OPTIONS_INIT;
    p->o = dflt;
    MJ_CHECK(mj_struct_load(in, sizeof(mj_checkpoint_make_options), sizeof(mj_checkpoint_make_options), &p->o,
                            "mj_checkpoint_make_options", "MJ_CHECKPOINT_MAKE_OPTIONS_INIT"));
    const mj_checkpoint_make_options *o = &p->o;
    if (!o->config_json || !o->out_dir || !o->out_dir[0])
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_checkpoint_make: config_json and out_dir are required");
    if (o->hidden < 0 || o->intermediate < 0 || o->n_experts < 0 || o->topk < 0 || o->shard_bytes < 0 ||
        o->layer_first < -1 || o->layer_last < -1)
        return mj_set_error(MJ_ERR_INVALID_ARG, "mj_checkpoint_make: sizes must be positive (0: the source's), "
                            "layers >= 0 (-1: the default)");
    MJ_CHECK(build_config(p));
    MJ_CHECK(build_quant_and_cfg(p));
    MJ_CHECK(choose_layers(p));
    MJ_CHECK(check_destination(p));
    /* Too big for the disk is said before the (then large) list of tensors is made. */
    MJ_CHECK(check_space(p, data_bytes(p)));
    MJ_CHECK(build_tensors(p));
    MJ_CHECK(build_index(p));
    return check_space(p, p->total_bytes);
}

mj_status mj_checkpoint_make_plan(const mj_checkpoint_make_options *opts, mj_checkpoint_make_info *info) {
    if (!opts || !info) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_checkpoint_make_plan: NULL argument");
    mj_checkpoint_make_info r = MJ_CHECKPOINT_MAKE_INFO_INIT;
    MJ_CHECK(mj_struct_load(info, sizeof r, sizeof r, &r, "mj_checkpoint_make_info", "MJ_CHECKPOINT_MAKE_INFO_INIT"));
    plan p;
    mj_status st = make_plan(opts, &p);
    if (st == MJ_OK) {
        r.cfg = p.cfg;
        r.layer_first = p.layers[0];
        r.layer_last = p.layers[p.n_layers - 1];
        r.n_layers = p.n_layers;
        r.n_shards = p.n_shards;
        r.tensor_bytes = p.tensor_bytes;
        r.total_bytes = p.total_bytes;
        mj_struct_store(info, &r, sizeof r);
    }
    plan_free(&p);
    return st;
}

/* ---- writing ------------------------------------------------------------------------------- */

typedef struct writer {
    const plan *p;
    char *tmp;                 /* the temporary directory's path                             */
    int dirfd;
    const char *made[8];       /* the JSON files created in it                               */
    int n_made;
    int32_t shards_made;       /* shards 0..shards_made-1 created                            */
    int fd;                    /* the shard being written, or -1                            */
    int32_t shard;
} writer;

static mj_status write_all(writer *w, int fd, const void *buf, uint64_t len, const char *name) {
    const uint8_t *b = buf;
    while (len) {
        ssize_t k = write(fd, b, len > (1u << 30) ? (1u << 30) : (size_t)len);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            return mj_set_error(MJ_ERR_IO, "cannot write %s/%s: %s", w->p->o.out_dir, name,
                                k < 0 ? strerror(errno) : "no progress");
        b += k;
        len -= (uint64_t)k;
    }
    return MJ_OK;
}

static mj_status create_file(writer *w, const char *name, int *fd) {
    *fd = openat(w->dirfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (*fd < 0) return mj_set_error(MJ_ERR_IO, "cannot create %s/%s: %s", w->tmp, name, strerror(errno));
    return MJ_OK;
}

static mj_status close_synced(writer *w, int *fd, const char *name) {
    int bad = fsync(*fd) != 0;
    int e = errno;
    bad |= close(*fd) != 0;
    *fd = -1;
    if (bad) return mj_set_error(MJ_ERR_IO, "cannot write %s/%s: %s", w->p->o.out_dir, name, strerror(e ? e : errno));
    return MJ_OK;
}

static mj_status write_text(writer *w, const char *name, const char *text) {
    int fd;
    MJ_CHECK(create_file(w, name, &fd));
    w->made[w->n_made++] = name;
    mj_status st = write_all(w, fd, text, strlen(text), name);
    if (st != MJ_OK) {
        close(fd);
        return st;
    }
    return close_synced(w, &fd, name);
}

/* The bytes of tensor i of the plan in layer handle L. */
static void tensor_bytes(const plan *p, mj_layer_t L, int64_t i, const void **ptr) {
    const tsrc *s = &p->src[i];
    if (s->expert == MJ_CK_ROUTER) {
        *ptr = s->field ? (const void *)L->bias : (const void *)L->gate;
        return;
    }
    if (s->expert == MJ_CK_SHARED_GATE) {
        *ptr = L->shared_gate;
        return;
    }
    const mj_nvfp4_linear *w13 = s->expert == MJ_CK_SHARED ? &L->shared_w13 : &L->w13[s->expert];
    const mj_nvfp4_linear *w2 = s->expert == MJ_CK_SHARED ? &L->shared_w2 : &L->w2[s->expert];
    const mj_nvfp4_linear *l = s->proj < 2 ? w13 : w2;
    /* up_proj is w13's second half of rows. */
    const size_t rows = s->proj == 1 ? (size_t)(w13->n_out / 2) : 0;
    switch (s->field) {
    case F_WEIGHT: *ptr = l->weight + rows * (size_t)(l->k_in / 2); break;
    case F_SCALE: *ptr = l->weight_scale + rows * (size_t)(l->k_in / MJ_NVFP4_GROUP); break;
    case F_SCALE2: *ptr = &l->weight_scale_2; break;
    default: *ptr = &l->input_scale; break;
    }
}

/* Append tensor i, opening its shard (and writing the header) when it is the shard's first. */
static mj_status write_tensor(writer *w, mj_layer_t L, int64_t i) {
    const plan *p = w->p;
    if (i == p->shard_first[w->shard + 1] || w->fd < 0) {
        if (w->fd >= 0) {
            MJ_CHECK(close_synced(w, &w->fd, p->shard_name[w->shard]));
            w->shard++;
        }
        MJ_CHECK(create_file(w, p->shard_name[w->shard], &w->fd));
        w->shards_made = w->shard + 1;
        MJ_CHECK(write_all(w, w->fd, p->header[w->shard], p->header_len[w->shard], p->shard_name[w->shard]));
    }
    const void *ptr;
    tensor_bytes(p, L, i, &ptr);
    return write_all(w, w->fd, ptr, p->t[i].nbytes, p->shard_name[w->shard]);
}

/* Remove what this writer made: its files, then the directory. */
static void writer_discard(writer *w) {
    if (w->fd >= 0) close(w->fd);
    if (w->dirfd >= 0) {
        for (int i = 0; i < w->n_made; i++) unlinkat(w->dirfd, w->made[i], 0);
        for (int32_t s = 0; s < w->shards_made; s++) unlinkat(w->dirfd, w->p->shard_name[s], 0);
        close(w->dirfd);
    }
    if (w->tmp) rmdir(w->tmp);
    free(w->tmp);
}

static mj_status make_tmpdir(writer *w) {
    const plan *p = w->p;
    static int counter;
    for (int tries = 0; tries < 100; tries++) {
        free(w->tmp);
        w->tmp = NULL;
        int c = __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED);
        if (asprintf(&w->tmp, "%s/.%s.tmp-%ld-%d", p->parent, p->base, (long)getpid(), c) < 0) {
            w->tmp = NULL;
            return mj_set_error(MJ_ERR_NOMEM, "out of memory");
        }
        if (mkdir(w->tmp, 0777) == 0) {
            w->dirfd = open(w->tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (w->dirfd < 0) return mj_set_error(MJ_ERR_IO, "cannot open %s: %s", w->tmp, strerror(errno));
            return MJ_OK;
        }
        if (errno != EEXIST) {
            mj_status st = mj_set_error(MJ_ERR_IO, "cannot create a directory in %s for %s: %s", p->parent,
                                        p->o.out_dir, strerror(errno));
            free(w->tmp);
            w->tmp = NULL;
            return st;
        }
    }
    free(w->tmp);
    w->tmp = NULL;
    return mj_set_error(MJ_ERR_IO, "cannot create a temporary directory in %s: too many exist", p->parent);
}

mj_status mj_checkpoint_make(const mj_checkpoint_make_options *opts) {
    if (!opts) return mj_set_error(MJ_ERR_INVALID_ARG, "mj_checkpoint_make: NULL options");
    plan p;
    mj_status st = make_plan(opts, &p);
    writer w = {&p, NULL, -1, {NULL}, 0, 0, -1, 0};
    mj_layer_t L = NULL;
    if (st != MJ_OK) goto done;
    MJ_CHECK_GOTO(make_tmpdir(&w), st, done);
    MJ_CHECK_GOTO(write_text(&w, MJ_CK_CONFIG, p.config_text), st, done);
    MJ_CHECK_GOTO(write_text(&w, MJ_CK_QUANT, p.quant_text), st, done);
    if (p.index_text) MJ_CHECK_GOTO(write_text(&w, MJ_CK_INDEX, p.index_text), st, done);
    const int64_t per_layer = p.n_t / p.n_layers;
    for (int32_t li = 0; li < p.n_layers; li++) {
        uint64_t seed;
        MJ_CHECK_GOTO(mj_checkpoint_layer_seed(p.o.seed, p.layers[li], &seed), st, done);
        MJ_CHECK_GOTO(mj_layer_create_random(&p.cfg, seed, &L), st, done);
        for (int64_t i = li * per_layer; i < (li + 1) * per_layer; i++) MJ_CHECK_GOTO(write_tensor(&w, L, i), st, done);
        mj_layer_free(L);
        L = NULL;
    }
    MJ_CHECK_GOTO(close_synced(&w, &w.fd, p.shard_name[w.shard]), st, done);
    if (fsync(w.dirfd) != 0) {
        st = mj_set_error(MJ_ERR_IO, "cannot sync %s: %s", w.tmp, strerror(errno));
        goto done;
    }
    if (rename(w.tmp, p.o.out_dir) != 0) {
        st = mj_set_error(MJ_ERR_IO, "cannot move the finished checkpoint to %s: %s%s", p.o.out_dir, strerror(errno),
                          errno == ENOTEMPTY || errno == EEXIST ? " (something was put there meanwhile)" : "");
        goto done;
    }
    /* Done: the directory is out_dir now. Make the rename durable (best effort). */
    int pfd = open(p.parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (pfd >= 0) fsync(pfd), close(pfd);
    close(w.dirfd);
    free(w.tmp);
    plan_free(&p);
    return MJ_OK;
done:
    mj_layer_free(L);
    writer_discard(&w);
    plan_free(&p);
    return st;
}
