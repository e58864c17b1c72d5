/* test_checkpoint.c — ModelOpt NVFP4 checkpoints: mj_checkpoint_make writes, mj_checkpoint_open
 * and mj_layer_load read back exactly mj_layer_create_random's layer (whole, and every TP / EP
 * slice equal to mj_layer_shard's, byte for byte and in the reference forward); a slice reads
 * only its bytes; and every malformed checkpoint (each made by editing a good one) is refused
 * with an error naming the file and the tensor, leaving *out untouched. */
#include "base.h"
#include "test.h"
#include "weights/checkpoint.h"
#include "weights/safetensors.h"
#include "weights/layer.h"
#include "ref/ref.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>

/* A small layer with GLM-5's routing: TP 4 needs I/4 % 64 == 0, EP 4 needs E % 4. */
enum { H = 128, I = 256, E = 8, TOPK = 2 };

static char *g_root;           /* this run's temporary directory */
static uint64_t g_seed;
static char *g_single, *g_sharded_good; /* the good checkpoints, once written: single() and sharded() */

/* ---- helpers -------------------------------------------------------------------------------- */

static const char *glm5_config(void) { return MJ_SOURCE_DIR "/tests/data/model/glm5_moe_config.json"; }

/* GLM-5's config with n_shared_experts set, written under the run's directory. */
static char *config_with_shared(int n_shared) {
    json_error_t err;
    json_t *root = json_load_file(glm5_config(), 0, &err);
    if (!root) abort();
    json_object_set_new(root, "n_shared_experts", json_integer(n_shared));
    char name[64];
    snprintf(name, sizeof name, "config_shared%d.json", n_shared);
    char *p = test_path(g_root, name);
    if (json_dump_file(root, p, JSON_INDENT(2))) abort();
    json_decref(root);
    return p;
}

static mj_status make_ck(const char *config, const char *out, int32_t first, int32_t last, int64_t shard_bytes) {
    mj_checkpoint_make_options o = MJ_CHECKPOINT_MAKE_OPTIONS_INIT;
    o.config_json = config;
    o.out_dir = out;
    o.seed = g_seed;
    o.layer_first = first;
    o.layer_last = last;
    o.hidden = H, o.intermediate = I, o.n_experts = E, o.topk = TOPK;
    o.shard_bytes = shard_bytes;
    return mj_checkpoint_make(&o);
}

/* The good checkpoints the cases read and edit, written on first use: GLM-5's layer 3 in one
 * file, and layers 3 and 4 in 60 KB shards (many: the tensors of one expert span two). */
static const char *single(void) {
    if (!g_single) {
        g_single = test_path(g_root, "single");
        CHECK_OK(make_ck(glm5_config(), g_single, -1, -1, 0));
    }
    return g_single;
}
static const char *sharded(void) {
    if (!g_sharded_good) {
        g_sharded_good = test_path(g_root, "sharded");
        CHECK_OK(make_ck(glm5_config(), g_sharded_good, 3, 4, 60000));
    }
    return g_sharded_good;
}

/* The layer the checkpoint's layer L must be. */
static mj_layer_t reference_layer(mj_checkpoint_t ck, int32_t L) {
    mj_moe_config cfg;
    uint64_t s;
    mj_layer_t ref = NULL;
    CHECK_OK(mj_checkpoint_config(ck, &cfg));
    CHECK_OK(mj_checkpoint_layer_seed(g_seed, L, &s));
    CHECK_OK(mj_layer_create_random(&cfg, s, &ref));
    return ref;
}

static int g_expect_differ; /* a comparison expected to fail: do not print the difference */

static int linear_equal(const mj_nvfp4_linear *a, const mj_nvfp4_linear *b, const char *what) {
    if (g_expect_differ) what = NULL;
    if (a->n_out != b->n_out || a->k_in != b->k_in) {
        if (what) fprintf(stderr, "%s: shape [%d, %d] vs [%d, %d]\n", what, a->n_out, a->k_in, b->n_out, b->k_in);
        return 0;
    }
    size_t nq = (size_t)a->n_out * (size_t)(a->k_in / 2), ns = (size_t)a->n_out * (size_t)(a->k_in / 16);
    if ((nq && memcmp(a->weight, b->weight, nq)) || (ns && memcmp(a->weight_scale, b->weight_scale, ns))) {
        if (what) fprintf(stderr, "%s: weight or weight_scale bytes differ\n", what);
        return 0;
    }
    if (memcmp(&a->weight_scale_2, &b->weight_scale_2, 4) || memcmp(&a->input_scale, &b->input_scale, 4)) {
        if (what) fprintf(stderr, "%s: scales %g/%g vs %g/%g\n", what, (double)a->weight_scale_2, (double)a->input_scale,
                (double)b->weight_scale_2, (double)b->input_scale);
        return 0;
    }
    return 1;
}

/* Every field and byte of two layer handles. */
static int layer_equal(mj_layer_t a, mj_layer_t b) {
    if (!a || !b) return 0;
    if (memcmp(&a->cfg, &b->cfg, sizeof a->cfg) || a->par != b->par || a->rank != b->rank ||
        a->n_ranks != b->n_ranks || a->i_local != b->i_local || a->expert_begin != b->expert_begin ||
        a->n_local != b->n_local || a->has_shared != b->has_shared || a->is_local != b->is_local) {
        fprintf(stderr, "layer fields differ: par %d/%d rank %d/%d i_local %d/%d begin %d/%d n_local %d/%d shared %d/%d "
                "is_local %d/%d\n", a->par, b->par, a->rank, b->rank, a->i_local, b->i_local, a->expert_begin,
                b->expert_begin, a->n_local, b->n_local, a->has_shared, b->has_shared, a->is_local, b->is_local);
        return 0;
    }
    const size_t EH = (size_t)a->cfg.n_experts * (size_t)a->cfg.hidden;
    if (memcmp(a->gate, b->gate, EH * 2)) return fprintf(stderr, "router gate differs\n"), 0;
    if (!a->bias != !b->bias || (a->bias && memcmp(a->bias, b->bias, (size_t)a->cfg.n_experts * 4)))
        return fprintf(stderr, "bias differs\n"), 0;
    for (int32_t e = 0; e < a->n_local; e++) {
        char w[64];
        snprintf(w, sizeof w, "expert %d w13", a->expert_begin + e);
        if (!linear_equal(&a->w13[e], &b->w13[e], w)) return 0;
        snprintf(w, sizeof w, "expert %d w2", a->expert_begin + e);
        if (!linear_equal(&a->w2[e], &b->w2[e], w)) return 0;
    }
    if (!a->shared_gate != !b->shared_gate ||
        (a->shared_gate && memcmp(a->shared_gate, b->shared_gate, (size_t)a->cfg.hidden * 2)))
        return fprintf(stderr, "shared expert gate differs\n"), 0;
    if (a->has_shared)
        return linear_equal(&a->shared_w13, &b->shared_w13, "shared w13") &&
               linear_equal(&a->shared_w2, &b->shared_w2, "shared w2");
    return a->shared_w13.n_out == b->shared_w13.n_out && a->shared_w2.n_out == b->shared_w2.n_out;
}

/* Reference forwards of two handles on the same tokens, in both modes: equal bits? */
static int forward_equal(mj_layer_t a, mj_layer_t b, int B) {
    const int32_t h = a->cfg.hidden;
    uint16_t *x = malloc(sizeof(uint16_t) * (size_t)(B * h));
    float *ya = malloc(sizeof(float) * (size_t)(B * h)), *yb = malloc(sizeof(float) * (size_t)(B * h));
    uint64_t rng = g_seed ^ 0x5EED;
    for (int i = 0; i < B * h; i++) x[i] = mj_f32_to_bf16((float)mj_rng_normal(&rng));
    int same = 1;
    for (int m = 0; m < 2; m++) {
        mj_weight_mode mode = m ? MJ_MODE_W4A4 : MJ_MODE_W4A16;
        memset(ya, 0xA5, sizeof(float) * (size_t)(B * h));
        memset(yb, 0x5A, sizeof(float) * (size_t)(B * h));
        CHECK_OK(mj_moe_forward_ref(a, mode, x, B, B, 0, ya, NULL));
        CHECK_OK(mj_moe_forward_ref(b, mode, x, B, B, 0, yb, NULL));
        same &= memcmp(ya, yb, sizeof(float) * (size_t)(B * h)) == 0;
    }
    free(x), free(ya), free(yb);
    return same;
}

/* max |a - b| / max |b| of the two handles' W4A16 forwards. */
static double forward_rel_diff(mj_layer_t a, mj_layer_t b, int B) {
    const int32_t h = a->cfg.hidden;
    uint16_t *x = malloc(sizeof(uint16_t) * (size_t)(B * h));
    float *ya = malloc(sizeof(float) * (size_t)(B * h)), *yb = malloc(sizeof(float) * (size_t)(B * h));
    uint64_t rng = g_seed ^ 0xF00D;
    for (int i = 0; i < B * h; i++) x[i] = mj_f32_to_bf16((float)mj_rng_normal(&rng));
    CHECK_OK(mj_moe_forward_ref(a, MJ_MODE_W4A16, x, B, B, 0, ya, NULL));
    CHECK_OK(mj_moe_forward_ref(b, MJ_MODE_W4A16, x, B, B, 0, yb, NULL));
    double d = 0, m = 0;
    for (int i = 0; i < B * h; i++) {
        d = fmax(d, fabs((double)ya[i] - yb[i]));
        m = fmax(m, fabs((double)yb[i]));
    }
    free(x), free(ya), free(yb);
    return m > 0 ? d / m : d;
}

static int count_files(const char *dir, const char *suffix) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d))) {
        size_t l = strlen(de->d_name), s = strlen(suffix);
        if (de->d_name[0] != '.' && l >= s && !strcmp(de->d_name + l - s, suffix)) n++;
    }
    if (d) closedir(d);
    return n;
}

static void copy_file(const char *src, const char *dst) {
    FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
    if (!in || !out) abort();
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, n, out) != n) abort();
    fclose(in);
    if (fclose(out)) abort();
}

/* A fresh copy of checkpoint src, named name under the run's directory (malloc'd path). */
static char *copy_ck(const char *src, const char *name) {
    char *dst = test_path(g_root, name);
    if (mkdir(dst, 0755)) abort();
    DIR *d = opendir(src);
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char *a = test_path(src, de->d_name), *b = test_path(dst, de->d_name);
        copy_file(a, b);
        free(a), free(b);
    }
    closedir(d);
    return dst;
}

/* ---- a safetensors file to edit -------------------------------------------------------------- */
typedef struct stf {
    json_t *hdr;
    uint8_t *data;
    size_t data_len;
} stf;

static void st_load(const char *path, stf *f) {
    FILE *in = fopen(path, "rb");
    uint8_t n8[8];
    if (!in || fread(n8, 1, 8, in) != 8) abort();
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | n8[i];
    char *h = malloc(n);
    if (fread(h, 1, n, in) != n) abort();
    json_error_t err;
    f->hdr = json_loadb(h, n, 0, &err);
    free(h);
    long at = ftell(in);
    fseek(in, 0, SEEK_END);
    f->data_len = (size_t)(ftell(in) - at);
    fseek(in, at, SEEK_SET);
    f->data = malloc(f->data_len + 1);
    if (!f->hdr || fread(f->data, 1, f->data_len, in) != f->data_len) abort();
    fclose(in);
}

/* Write header text (as it is) and the data back. */
static void st_save_text(const char *path, const char *text, const stf *f) {
    size_t len = strlen(text);
    FILE *out = fopen(path, "wb");
    uint8_t n8[8];
    for (int i = 0; i < 8; i++) n8[i] = (uint8_t)((uint64_t)len >> (8 * i));
    if (!out || fwrite(n8, 1, 8, out) != 8 || fwrite(text, 1, len, out) != len ||
        fwrite(f->data, 1, f->data_len, out) != f->data_len || fclose(out))
        abort();
}

static void st_save(const char *path, stf *f) {
    char *text = json_dumps(f->hdr, JSON_COMPACT);
    st_save_text(path, text, f);
    free(text);
    json_decref(f->hdr);
    free(f->data);
}

static json_t *st_entry(stf *f, const char *name) {
    json_t *e = json_object_get(f->hdr, name);
    if (!e) fprintf(stderr, "no tensor %s in the header\n", name), abort();
    return e;
}

static uint64_t st_off(stf *f, const char *name, int i) {
    return (uint64_t)json_integer_value(json_array_get(json_object_get(st_entry(f, name), "data_offsets"), (size_t)i));
}

static void st_set_off(stf *f, const char *name, uint64_t b, uint64_t e) {
    json_t *o = json_object_get(st_entry(f, name), "data_offsets");
    json_array_set_new(o, 0, json_integer((json_int_t)b));
    json_array_set_new(o, 1, json_integer((json_int_t)e));
}

static void st_set_dtype(stf *f, const char *name, const char *dtype) {
    json_object_set_new(st_entry(f, name), "dtype", json_string(dtype));
}

static void st_set_shape(stf *f, const char *name, int ndim, int64_t d0, int64_t d1) {
    json_t *s = json_array();
    if (ndim > 0) json_array_append_new(s, json_integer(d0));
    if (ndim > 1) json_array_append_new(s, json_integer(d1));
    json_object_set_new(st_entry(f, name), "shape", s);
}

static float *st_f32(stf *f, const char *name) { return (float *)(f->data + st_off(f, name, 0)); }

/* A tensor name in a ring of buffers: valid for the next 15 calls (copy one kept longer). */
static const char *tname(int32_t L, int32_t e, const char *proj, const char *field) {
    static char buf[16][MJ_CK_NAME_MAX];
    static int k;
    char *b = buf[k++ % 16];
    int pi = !proj || !strcmp(proj, "gate_proj") ? 0 : !strcmp(proj, "up_proj") ? 1 : 2;
    return mj_ck_tensor_name(b, MJ_CK_NAME_MAX, NULL, L, e, pi, field);
}

/* Open (and load layer 3 whole): the first failure's status, and its message in msg. */
static mj_status open_and_load(const char *dir, int32_t layer, char *msg, size_t n) {
    mj_checkpoint_t ck = NULL;
    mj_layer_t sentinel = (mj_layer_t)(uintptr_t)0x1234, out = sentinel;
    msg[0] = '\0';
    mj_status st = mj_checkpoint_open(dir, &ck);
    if (st == MJ_OK) {
        st = mj_layer_load(ck, layer, MJ_PAR_NONE, 0, 1, &out);
        if (st == MJ_OK) mj_layer_free(out);
        else CHECK(out == sentinel, "a failed load wrote *out");
        mj_checkpoint_close(ck);
    } else {
        CHECK(ck == NULL, "a failed open wrote *out");
    }
    snprintf(msg, n, "%s", mj_last_error());
    return st;
}

/* A malformed case: want status `want` with each of the texts in the message. */
static void expect_refused_at(const char *what, const char *dir, int32_t layer, mj_status want, const char *t1,
                              const char *t2) {
    char msg[4096];
    mj_status st = open_and_load(dir, layer, msg, sizeof msg);
    CHECK(st == want, "%s: got %s (want %s): %s", what, mj_status_string(st), mj_status_string(want), msg);
    CHECK(!t1 || strstr(msg, t1), "%s: the message lacks '%s': %s", what, t1, msg);
    CHECK(!t2 || strstr(msg, t2), "%s: the message lacks '%s': %s", what, t2, msg);
}

static void expect_refused(const char *what, const char *dir, mj_status want, const char *t1, const char *t2) {
    expect_refused_at(what, dir, 3, want, t1, t2);
}

/* ---- round trips ------------------------------------------------------------------------------ */

static void check_layer_and_slices(mj_checkpoint_t ck, int32_t L) {
    mj_layer_t ref = reference_layer(ck, L), got = NULL;
    CHECK_OK(mj_layer_load(ck, L, MJ_PAR_NONE, 0, 1, &got));
    CHECK(layer_equal(got, ref), "layer %d: loaded != mj_layer_create_random", L);
    CHECK(got && forward_equal(got, ref, 3), "layer %d: reference forwards differ", L);
    mj_layer_free(got);
    const struct { mj_parallel kind; int n; } splits[] = {{MJ_PAR_TP, 2}, {MJ_PAR_TP, 4}, {MJ_PAR_EP, 2}, {MJ_PAR_EP, 4}};
    for (size_t s = 0; s < sizeof splits / sizeof splits[0]; s++)
        for (int r = 0; r < splits[s].n; r++) {
            mj_layer_t want = NULL, have = NULL;
            CHECK_OK(mj_layer_shard(ref, splits[s].kind, r, splits[s].n, &want));
            CHECK_OK(mj_layer_load(ck, L, splits[s].kind, r, splits[s].n, &have));
            const char *k = splits[s].kind == MJ_PAR_TP ? "TP" : "EP";
            CHECK(layer_equal(have, want), "layer %d %s rank %d of %d: loaded slice != mj_layer_shard", L, k, r,
                  splits[s].n);
            CHECK(have && want && forward_equal(have, want, 3), "layer %d %s rank %d of %d: forwards differ", L, k, r,
                  splits[s].n);
            mj_layer_free(want), mj_layer_free(have);
        }
    mj_layer_free(ref);
}

static void test_round_trip_single(const char *dir) {
    mj_checkpoint_t ck = NULL;
    CHECK_OK(mj_checkpoint_open(dir, &ck));
    if (!ck) return;
    CHECK(count_files(dir, ".safetensors") == 1 && count_files(dir, ".index.json") == 0,
          "one shard, no index: %d shards", count_files(dir, ".safetensors"));
    mj_moe_config cfg;
    CHECK_OK(mj_checkpoint_config(ck, &cfg));
    CHECK(cfg.hidden == H && cfg.intermediate == I && cfg.n_experts == E && cfg.topk == TOPK && cfg.n_shared == 1 &&
              cfg.has_correction_bias == 1 && cfg.quant == MJ_QUANT_NVFP4,
          "config read back: %d %d %d %d", cfg.hidden, cfg.intermediate, cfg.n_experts, cfg.topk);
    int32_t layers[4] = {-1, -1, -1, -1}, n = -1;
    CHECK_OK(mj_checkpoint_moe_layers(ck, layers, 4, &n));
    /* GLM-5: first_k_dense_replace 3, so the default layer is 3. */
    CHECK(n == 1 && layers[0] == 3 && layers[1] == -1, "moe layers: n %d, [%d, %d]", n, layers[0], layers[1]);
    CHECK_OK(mj_checkpoint_moe_layers(ck, NULL, 0, &n));
    CHECK(n == 1, "count with cap 0: %d", n);
    check_layer_and_slices(ck, 3);
    /* The whole layer reads each of its bytes once. */
    int64_t before = mj_checkpoint_bytes_read(ck);
    mj_layer_t got = NULL;
    CHECK_OK(mj_layer_load(ck, 3, MJ_PAR_NONE, 0, 1, &got));
    const int64_t per_expert = 2 * (int64_t)I * (H / 2 + H / 16) + (int64_t)H * (I / 2 + I / 16) + 6 * 4;
    const int64_t whole = (int64_t)E * H * 2 + E * 4 + (E + 1) * per_expert;
    CHECK(mj_checkpoint_bytes_read(ck) - before == whole, "whole layer read %lld bytes, its tensors are %lld",
          (long long)(mj_checkpoint_bytes_read(ck) - before), (long long)whole);
    mj_layer_free(got);
    /* Arguments. */
    mj_layer_t sentinel = (mj_layer_t)(uintptr_t)0x99, out = sentinel;
    CHECK_STATUS(mj_layer_load(ck, 4, MJ_PAR_NONE, 0, 1, &out), MJ_ERR_INVALID_ARG);
    CHECK(strstr(mj_last_error(), "MoE layers: 3"), "names the layers there: %s", mj_last_error());
    CHECK_STATUS(mj_layer_load(ck, 3, MJ_PAR_TP, 0, 3, &out), MJ_ERR_CONFIG);
    CHECK_STATUS(mj_layer_load(ck, 3, MJ_PAR_EP, 0, 3, &out), MJ_ERR_CONFIG);
    CHECK_STATUS(mj_layer_load(ck, 3, MJ_PAR_TP, 2, 2, &out), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_layer_load(ck, 3, MJ_PAR_NONE, 0, 2, &out), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_layer_load(ck, 3, (mj_parallel)7, 0, 1, &out), MJ_ERR_INVALID_ARG);
    CHECK(out == sentinel, "failed loads left *out alone");
    CHECK_STATUS(mj_layer_load(NULL, 3, MJ_PAR_NONE, 0, 1, &out), MJ_ERR_INVALID_ARG);
    CHECK_STATUS(mj_checkpoint_moe_layers(ck, NULL, 2, &n), MJ_ERR_INVALID_ARG);
    CHECK_OK(mj_checkpoint_close(ck));
    CHECK_OK(mj_checkpoint_close(NULL));
}

static void test_round_trip_sharded(void) {
    /* One layer is ~500 KB: 60 KB shards make many, and tensors of one expert span two. */
    const char *dir = sharded();
    int shards = count_files(dir, ".safetensors");
    CHECK(shards >= 8 && count_files(dir, ".index.json") == 1, "%d shards and an index", shards);
    mj_checkpoint_t ck = NULL;
    CHECK_OK(mj_checkpoint_open(dir, &ck));
    if (ck) {
        int32_t layers[2], n;
        CHECK_OK(mj_checkpoint_moe_layers(ck, layers, 2, &n));
        CHECK(n == 2 && layers[0] == 3 && layers[1] == 4, "layers %d: %d %d", n, layers[0], layers[1]);
        mj_layer_t l3 = NULL, l4 = NULL, ref4 = reference_layer(ck, 4);
        CHECK_OK(mj_layer_load(ck, 3, MJ_PAR_NONE, 0, 1, &l3));
        CHECK_OK(mj_layer_load(ck, 4, MJ_PAR_NONE, 0, 1, &l4));
        CHECK(layer_equal(l4, ref4), "layer 4 from shards != its reference");
        CHECK(l3 && l4 && memcmp(l3->gate, l4->gate, (size_t)E * H * 2) != 0, "layers 3 and 4 have their own seeds");
        mj_layer_t want = NULL, have = NULL;
        CHECK_OK(mj_layer_shard(ref4, MJ_PAR_TP, 1, 2, &want));
        CHECK_OK(mj_layer_load(ck, 4, MJ_PAR_TP, 1, 2, &have));
        CHECK(layer_equal(have, want) && forward_equal(have, want, 2), "layer 4 TP 1/2 from shards");
        mj_layer_free(want), mj_layer_free(have), mj_layer_free(l3), mj_layer_free(l4), mj_layer_free(ref4);
        mj_checkpoint_close(ck);
    }
}

/* n_shared > 1: one shared_experts MLP of n_shared * I rows, as mj_layer_create_random has it. */
static void test_two_shared(void) {
    char *cfg = config_with_shared(2), *dir = test_path(g_root, "shared2");
    CHECK_OK(make_ck(cfg, dir, -1, -1, 0));
    mj_checkpoint_t ck = NULL;
    CHECK_OK(mj_checkpoint_open(dir, &ck));
    if (ck) {
        mj_layer_t ref = reference_layer(ck, 3), got = NULL, want = NULL, have = NULL;
        CHECK(ref->shared_w13.n_out == 2 * 2 * I, "the reference's shared w13 has %d rows", ref->shared_w13.n_out);
        CHECK_OK(mj_layer_load(ck, 3, MJ_PAR_NONE, 0, 1, &got));
        CHECK(layer_equal(got, ref), "n_shared 2: loaded != reference");
        CHECK_OK(mj_layer_shard(ref, MJ_PAR_TP, 3, 4, &want));
        CHECK_OK(mj_layer_load(ck, 3, MJ_PAR_TP, 3, 4, &have));
        CHECK(layer_equal(have, want) && forward_equal(have, want, 2), "n_shared 2: TP 3/4");
        mj_layer_free(ref), mj_layer_free(got), mj_layer_free(want), mj_layer_free(have);
        mj_checkpoint_close(ck);
    }
    free(cfg), free(dir);
}

/* ---- a slice reads only its bytes ------------------------------------------------------------- */
typedef struct trace {
    int rank, n, kind;         /* the slice loaded */
    int64_t bytes, outside;    /* bytes copied; ranges outside the slice                       */
} trace;

static int has(const char *s, const char *sub) { return strstr(s, sub) != NULL; }

static void on_read(void *user, const char *t, uint64_t off, uint64_t len) {
    trace *tr = user;
    tr->bytes += (int64_t)len;
    const int shared = has(t, "shared_experts");
    const int64_t inter = shared ? (int64_t)I : I; /* n_shared is 1 here */
    const int is_scale = has(t, ".weight_scale") && !has(t, "weight_scale_2");
    const int is_weight = has(t, "_proj.weight") && !has(t, "_proj.weight_scale");
    if (tr->kind == MJ_PAR_TP && (is_weight || is_scale)) {
        int64_t lo = inter * tr->rank / tr->n, hi = inter * (tr->rank + 1) / tr->n; /* rows / columns held */
        int64_t div = is_scale ? 16 : 2;
        if (has(t, "down_proj")) { /* columns of every row of [H, inter] */
            int64_t row = inter / div, c = (int64_t)off % row;
            tr->outside += c < lo / div || c + (int64_t)len > hi / div;
        } else { /* rows of [inter, H] */
            int64_t row = H / div;
            tr->outside += (int64_t)off < lo * row || (int64_t)(off + len) > hi * row;
        }
    }
    if (tr->kind == MJ_PAR_EP && has(t, ".experts.")) {
        int e = atoi(strstr(t, ".experts.") + 9);
        tr->outside += e < E * tr->rank / tr->n || e >= E * (tr->rank + 1) / tr->n;
    }
    if (tr->kind == MJ_PAR_EP && shared) tr->outside += tr->rank != 0;
}

static void test_slice_reads(const char *dir) {
    mj_checkpoint_t ck = NULL;
    CHECK_OK(mj_checkpoint_open(dir, &ck));
    if (!ck) return;
    const int64_t router = (int64_t)E * H * 2 + E * 4, scalars = 6 * 4;
    const struct { int kind, n, rank; } cases[] = {{MJ_PAR_TP, 2, 1}, {MJ_PAR_TP, 4, 2}, {MJ_PAR_EP, 2, 1}, {MJ_PAR_EP, 4, 0}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        trace tr = {cases[c].rank, cases[c].n, cases[c].kind, 0, 0};
        mj_checkpoint_set_read_hook(ck, on_read, &tr);
        int64_t before = mj_checkpoint_bytes_read(ck);
        mj_layer_t l = NULL;
        CHECK_OK(mj_layer_load(ck, 3, (mj_parallel)cases[c].kind, cases[c].rank, cases[c].n, &l));
        mj_layer_free(l);
        int64_t want;
        if (cases[c].kind == MJ_PAR_TP) {
            int64_t il = I / cases[c].n;
            want = router + (E + 1) * (2 * il * (H / 2 + H / 16) + (int64_t)H * (il / 2 + il / 16) + scalars);
        } else {
            int64_t whole = 2 * (int64_t)I * (H / 2 + H / 16) + (int64_t)H * (I / 2 + I / 16) + scalars;
            want = router + (E / cases[c].n + (cases[c].rank == 0)) * whole;
        }
        CHECK(tr.bytes == want && mj_checkpoint_bytes_read(ck) - before == want,
              "%s rank %d of %d read %lld bytes (counter %lld), its slice is %lld", cases[c].kind == MJ_PAR_TP ? "TP" : "EP",
              cases[c].rank, cases[c].n, (long long)tr.bytes, (long long)(mj_checkpoint_bytes_read(ck) - before),
              (long long)want);
        CHECK(tr.outside == 0, "%s rank %d of %d: %lld reads outside its slice", cases[c].kind == MJ_PAR_TP ? "TP" : "EP",
              cases[c].rank, cases[c].n, (long long)tr.outside);
    }
    mj_checkpoint_set_read_hook(ck, NULL, NULL);
    mj_checkpoint_close(ck);
}

/* Ranks as threads, loading their slices from one open checkpoint at once. */
typedef struct rank_load {
    mj_checkpoint_t ck;
    int rank;
    mj_layer_t out;
    mj_status st;
} rank_load;

static void *load_rank(void *a) {
    rank_load *r = a;
    r->st = mj_layer_load(r->ck, 3, MJ_PAR_TP, r->rank, 4, &r->out);
    return NULL;
}

static void test_parallel_load(const char *dir) {
    mj_checkpoint_t ck = NULL;
    CHECK_OK(mj_checkpoint_open(dir, &ck));
    if (!ck) return;
    rank_load r[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        r[i] = (rank_load){ck, i, NULL, MJ_ERR_INTERNAL};
        CHECK(pthread_create(&th[i], NULL, load_rank, &r[i]) == 0, "pthread_create");
    }
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    mj_layer_t ref = reference_layer(ck, 3);
    int64_t total = 0;
    for (int i = 0; i < 4; i++) {
        mj_layer_t want = NULL;
        CHECK_OK(mj_layer_shard(ref, MJ_PAR_TP, i, 4, &want));
        CHECK(r[i].st == MJ_OK && layer_equal(r[i].out, want), "rank %d of 4 loaded in parallel", i);
        mj_layer_free(want), mj_layer_free(r[i].out);
    }
    /* Four TP quarters read every expert byte once and the router four times. */
    const int64_t per_expert = 2 * (int64_t)I * (H / 2 + H / 16) + (int64_t)H * (I / 2 + I / 16);
    total = 4 * ((int64_t)E * H * 2 + E * 4 + (E + 1) * 6 * 4) + (E + 1) * per_expert;
    CHECK(mj_checkpoint_bytes_read(ck) == total, "bytes read by 4 threads: %lld, want %lld",
          (long long)mj_checkpoint_bytes_read(ck), (long long)total);
    mj_layer_free(ref);
    mj_checkpoint_close(ck);
}

/* ---- malformed checkpoints -------------------------------------------------------------------- */

static void test_malformed_single(const char *good) {
    stf f;
    char gw[MJ_CK_NAME_MAX], gu[MJ_CK_NAME_MAX], sg[MJ_CK_NAME_MAX];
    mj_ck_tensor_name(gw, sizeof gw, NULL, 3, 0, 0, "weight");
    mj_ck_tensor_name(gu, sizeof gu, NULL, 3, 0, 1, "weight");
    mj_ck_tensor_name(sg, sizeof sg, NULL, 3, MJ_CK_SHARED, 0, "weight");

    /* A tensor missing. */
    char *d = copy_ck(good, "missing_tensor"), *p = test_path(d, MJ_CK_SINGLE);
    st_load(p, &f);
    json_object_del(f.hdr, tname(3, 1, "up_proj", "weight_scale"));
    st_save(p, &f);
    expect_refused("missing tensor", d, MJ_ERR_PARSE, tname(3, 1, "up_proj", "weight_scale"), "model.safetensors");
    free(d), free(p);

    /* Wrong dtypes: a scalar as I32, a weight as I8, the router as F16. */
    const char *dt_cases[][2] = {{tname(3, 2, "down_proj", "weight_scale_2"), "I32"},
                                 {gw, "I8"},
                                 {tname(3, MJ_CK_ROUTER, NULL, "weight"), "F16"}};
    for (int i = 0; i < 3; i++) {
        char name[32];
        snprintf(name, sizeof name, "dtype%d", i);
        d = copy_ck(good, name), p = test_path(d, MJ_CK_SINGLE);
        char tn[MJ_CK_NAME_MAX];
        snprintf(tn, sizeof tn, "%s", dt_cases[i][0]);
        st_load(p, &f);
        st_set_dtype(&f, tn, dt_cases[i][1]);
        st_save(p, &f);
        expect_refused("wrong dtype", d, MJ_ERR_PARSE, tn, dt_cases[i][1]);
        free(d), free(p);
    }

    /* Wrong shapes (the same byte count, so the header itself is consistent). */
    d = copy_ck(good, "shape"), p = test_path(d, MJ_CK_SINGLE);
    st_load(p, &f);
    st_set_shape(&f, gw, 2, H / 2, I);
    st_save(p, &f);
    expect_refused("wrong shape", d, MJ_ERR_PARSE, gw, "expected [256, 64]");
    free(d), free(p);
    d = copy_ck(good, "shape_router"), p = test_path(d, MJ_CK_SINGLE);
    st_load(p, &f);
    st_set_shape(&f, tname(3, MJ_CK_ROUTER, NULL, "weight"), 2, H, E);
    st_save(p, &f);
    expect_refused("router shape", d, MJ_ERR_PARSE, "mlp.gate.weight", "n_routed_experts");
    free(d), free(p);

    /* A truncated shard. */
    d = copy_ck(good, "truncated"), p = test_path(d, MJ_CK_SINGLE);
    struct stat sb;
    stat(p, &sb);
    CHECK(truncate(p, sb.st_size - 1000) == 0, "truncate");
    expect_refused("truncated shard", d, MJ_ERR_PARSE, "model.safetensors", "run past the data area");
    free(d), free(p);

    /* The header length past the end of the file. */
    d = copy_ck(good, "header_len"), p = test_path(d, MJ_CK_SINGLE);
    stat(p, &sb);
    {
        int fd = open(p, O_WRONLY);
        uint64_t n = (uint64_t)sb.st_size;
        CHECK(pwrite(fd, &n, 8, 0) == 8, "pwrite");
        close(fd);
    }
    expect_refused("header length past the file", d, MJ_ERR_PARSE, "model.safetensors", "runs past the end");
    free(d), free(p);

    /* Offsets that lie: overlapping, out of bounds, end before begin. */
    for (int i = 0; i < 3; i++) {
        char name[32];
        snprintf(name, sizeof name, "offsets%d", i);
        d = copy_ck(good, name), p = test_path(d, MJ_CK_SINGLE);
        st_load(p, &f);
        uint64_t b = st_off(&f, gw, 0), e = st_off(&f, gw, 1);
        if (i == 0) st_set_off(&f, gu, b + 32, e + 32); /* overlaps gate's bytes */
        if (i == 1) st_set_off(&f, gu, f.data_len - (e - b) + 16, f.data_len + 16);
        if (i == 2) st_set_off(&f, gu, e, b);
        const char *want = i == 0 ? "overlap" : i == 1 ? "run past the data area" : "end before they begin";
        st_save(p, &f);
        expect_refused("offsets", d, MJ_ERR_PARSE, gu, want);
        free(d), free(p);
    }

    /* A duplicate JSON key: the gate's entry written twice. */
    d = copy_ck(good, "dupkey"), p = test_path(d, MJ_CK_SINGLE);
    st_load(p, &f);
    {
        char *entry = json_dumps(st_entry(&f, gw), JSON_COMPACT), *all = json_dumps(f.hdr, JSON_COMPACT), *text = NULL;
        if (asprintf(&text, "{\"%s\":%s,%s", gw, entry, all + 1) < 0) abort();
        st_save_text(p, text, &f);
        free(entry), free(all), free(text);
        json_decref(f.hdr), free(f.data);
    }
    expect_refused("duplicate key", d, MJ_ERR_PARSE, "model.safetensors", "duplicate");
    free(d), free(p);

    /* A shard truncated after the checkpoint was opened (cp over it in place while a server
     * loads): the load is an error naming the file (MJ_ERR_IO), never SIGBUS; the layers of a
     * TP slice (strided reads of down) and a whole one alike; and the handle stays usable. */
    for (int i = 0; i < 2; i++) {
        d = copy_ck(good, i ? "cut_while_open_tp" : "cut_while_open"), p = test_path(d, MJ_CK_SINGLE);
        mj_checkpoint_t ck = NULL;
        CHECK_OK(mj_checkpoint_open(d, &ck));
        struct stat cut;
        CHECK(stat(p, &cut) == 0 && truncate(p, cut.st_size / 3) == 0, "truncate %s", p);
        mj_layer_t out = NULL;
        mj_status st = mj_layer_load(ck, 3, i ? MJ_PAR_TP : MJ_PAR_NONE, i, i ? 2 : 1, &out);
        CHECK(st == MJ_ERR_IO && out == NULL, "load after truncation: %s", mj_status_string(st));
        CHECK(strstr(mj_last_error(), p) && strstr(mj_last_error(), "truncated"), "message: %s", mj_last_error());
        st = mj_layer_load(ck, 3, MJ_PAR_NONE, 0, 1, &out);
        CHECK(st == MJ_ERR_IO, "a second load after truncation: %s", mj_status_string(st));
        mj_checkpoint_close(ck);
        free(d), free(p);
    }

    /* Non-finite and impossible scales (a negative block scale too: the W4A16 kernels place a
     * scale byte's bits without looking at its sign, which must never reach them). */
    for (int i = 0; i < 5; i++) {
        char name[32];
        snprintf(name, sizeof name, "nonfinite%d", i);
        d = copy_ck(good, name), p = test_path(d, MJ_CK_SINGLE);
        st_load(p, &f);
        const char *t = i == 0 ? tname(3, 3, "down_proj", "input_scale")
                      : i == 1 ? tname(3, 0, "up_proj", "weight_scale")
                      : i == 2 ? tname(3, MJ_CK_ROUTER, NULL, "e_score_correction_bias")
                      : i == 3 ? tname(3, MJ_CK_SHARED, "gate_proj", "weight_scale_2")
                               : tname(3, 2, "down_proj", "weight_scale");
        char tn[MJ_CK_NAME_MAX];
        snprintf(tn, sizeof tn, "%s", t);
        if (i == 0) *st_f32(&f, tn) = NAN;
        if (i == 1) f.data[st_off(&f, tn, 0) + 5] = 0x7F; /* the e4m3 NaN */
        if (i == 2) st_f32(&f, tn)[E - 1] = INFINITY;
        if (i == 3) *st_f32(&f, tn) = -1.0f;
        if (i == 4) f.data[st_off(&f, tn, 0) + 9] = 0xB8; /* e4m3 -1 */
        st_save(p, &f);
        expect_refused("bad scale", d, i >= 3 ? MJ_ERR_PARSE : MJ_ERR_NONFINITE, tn,
                       i == 3 ? "positive" : i == 4 ? "unsigned" : NULL);
        free(d), free(p);
    }

    /* Scales that are finite and positive but unusable: an input_scale whose reciprocal (the
     * activations' global scale) overflows float (1e-45: the W4A4 kernels ran 74% off), and
     * a weight_scale_2 so large that 6 * 448 * it (the largest weight it can scale) does. */
    for (int i = 0; i < 3; i++) {
        char name[32];
        snprintf(name, sizeof name, "hugescale%d", i);
        d = copy_ck(good, name), p = test_path(d, MJ_CK_SINGLE);
        st_load(p, &f);
        const char *t = i == 0 ? tname(3, 5, "down_proj", "input_scale")
                      : i == 1 ? tname(3, MJ_CK_SHARED, "up_proj", "input_scale")
                               : tname(3, 2, "gate_proj", "weight_scale_2");
        char tn[MJ_CK_NAME_MAX];
        snprintf(tn, sizeof tn, "%s", t);
        *st_f32(&f, tn) = i == 0 ? 1e-45f : i == 1 ? 2e-39f : 3e38f;
        st_save(p, &f);
        expect_refused("unusable scale", d, MJ_ERR_NONFINITE, tn, i < 2 ? "1/input_scale" : "6 * 448");
        free(d), free(p);
    }

    /* A bf16 (unquantized) shared expert: refused, naming the tensor. */
    d = copy_ck(good, "bf16_shared"), p = test_path(d, MJ_CK_SINGLE);
    st_load(p, &f);
    st_set_dtype(&f, sg, "BF16");
    st_set_shape(&f, sg, 2, I, H / 4); /* the same bytes as [I, H/2] u8 */
    st_save(p, &f);
    expect_refused("bf16 shared expert", d, MJ_ERR_UNSUPPORTED, sg, "unquantized shared expert");
    free(d), free(p);

    /* No NVFP4 quantization: hf_quant_config.json removed (GLM-5's config has none inline). */
    d = copy_ck(good, "no_quant");
    p = test_path(d, MJ_CK_QUANT);
    unlink(p);
    expect_refused("not NVFP4", d, MJ_ERR_UNSUPPORTED, "NVFP4", NULL);
    free(d), free(p);

    /* No tensors at all. */
    d = copy_ck(good, "no_shard");
    p = test_path(d, MJ_CK_SINGLE);
    unlink(p);
    expect_refused("no shard", d, MJ_ERR_IO, "model.safetensors", "neither");
    free(d), free(p);
    expect_refused("no directory", "/nonexistent/checkpoint", MJ_ERR_IO, "/nonexistent/checkpoint", NULL);
}

/* Alternative encodings a real export may use: weight_scale stored as U8, scalars as [1]. */
static void test_alternative_encodings(const char *good) {
    char *d = copy_ck(good, "alt"), *p = test_path(d, MJ_CK_SINGLE);
    stf f;
    st_load(p, &f);
    const char *k;
    json_t *v;
    json_object_foreach(f.hdr, k, v) {
        const char *dt = json_string_value(json_object_get(v, "dtype"));
        if (dt && !strcmp(dt, "F8_E4M3")) json_object_set_new(v, "dtype", json_string("U8"));
        json_t *shape = json_object_get(v, "shape");
        if (shape && json_array_size(shape) == 0) json_array_append_new(shape, json_integer(1));
    }
    st_save(p, &f);
    mj_checkpoint_t ck = NULL;
    CHECK_OK(mj_checkpoint_open(d, &ck));
    if (ck) {
        mj_layer_t ref = reference_layer(ck, 3), got = NULL;
        CHECK_OK(mj_layer_load(ck, 3, MJ_PAR_NONE, 0, 1, &got));
        CHECK(layer_equal(got, ref), "U8 block scales and [1] scalars load as the originals");
        mj_layer_free(ref), mj_layer_free(got);
        mj_checkpoint_close(ck);
    }
    free(d), free(p);
}

/* gate and up swapped in the file: every header check passes (the shapes are the same), and
 * the reference forward shows it. */
static void test_gate_up_swapped(const char *good) {
    char *d = copy_ck(good, "swapped"), *p = test_path(d, MJ_CK_SINGLE);
    stf f;
    st_load(p, &f);
    for (int e = 0; e < E; e++)
        for (int s = 0; s < 2; s++) {
            char g[MJ_CK_NAME_MAX], u[MJ_CK_NAME_MAX];
            mj_ck_tensor_name(g, sizeof g, NULL, 3, e, 0, s ? "weight_scale" : "weight");
            mj_ck_tensor_name(u, sizeof u, NULL, 3, e, 1, s ? "weight_scale" : "weight");
            uint64_t gb = st_off(&f, g, 0), ge = st_off(&f, g, 1), ub = st_off(&f, u, 0), ue = st_off(&f, u, 1);
            st_set_off(&f, g, ub, ue);
            st_set_off(&f, u, gb, ge);
        }
    st_save(p, &f);
    mj_checkpoint_t ck = NULL;
    CHECK_OK(mj_checkpoint_open(d, &ck));
    if (ck) {
        mj_layer_t ref = reference_layer(ck, 3), got = NULL;
        CHECK_OK(mj_layer_load(ck, 3, MJ_PAR_NONE, 0, 1, &got));
        g_expect_differ = 1;
        CHECK(got && !layer_equal(got, ref), "a swapped checkpoint loads into a different layer");
        g_expect_differ = 0;
        double rel = got ? forward_rel_diff(got, ref, 4) : 0;
        CHECK(rel > 0.1, "gate/up swapped: the forward differs from the reference by %.3g (relative)", rel);
        mj_layer_free(ref), mj_layer_free(got);
        mj_checkpoint_close(ck);
    }
    free(d), free(p);
}

/* stderr into a file while f runs; the text (malloc'd). */
static char *capture_stderr(void (*fn)(void *), void *arg) {
    char *path = test_path(g_root, "stderr.txt");
    fflush(stderr);
    int saved = dup(2), fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
    dup2(fd, 2);
    close(fd);
    fn(arg);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    FILE *in = fopen(path, "r");
    char *text = calloc(1, 8192);
    if (in) {
        size_t n = fread(text, 1, 8191, in);
        text[n] = '\0';
        fclose(in);
    }
    free(path);
    return text;
}

/* Block scales re-expressed from ws_old to ws_new: each value (scale * per-tensor scale)
 * within e4m3 rounding of the original, and some bytes changed. e4m3 rounds to half an ulp
 * (1/16 relative) among the normals; among the subnormals (and for the smallest-subnormal
 * floor of an underflow) 2^-9 absolute in unit scale. */
static int reexpressed_ok(const uint8_t *now, const uint8_t *was, float ws_old, float ws_new, int64_t n) {
    int bad = 0, changed = 0;
    for (int64_t i = 0; i < n; i++) {
        double want = mj_e4m3_decode(was[i]) * (double)ws_old, have = mj_e4m3_decode(now[i]) * (double)ws_new;
        bad += fabs(have - want) > want / 16 + 0x1p-9 * ws_new;
        changed += now[i] != was[i];
    }
    if (bad || !changed) fprintf(stderr, "re-expressed scales: %d outside e4m3 rounding, %d changed\n", bad, changed);
    return !bad && changed;
}

typedef struct load_args {
    mj_checkpoint_t ck;
    mj_parallel kind;
    int rank, n;
    mj_layer_t out;
    mj_status st;
} load_args;

static void do_load(void *a) {
    load_args *la = a;
    la->st = mj_layer_load(la->ck, 3, la->kind, la->rank, la->n, &la->out);
}

/* Fused siblings with different scales: loaded with the max; the other sibling's block scales
 * re-expressed (within e4m3 rounding of the original values); one warning for the layer. */
static void test_sibling_scales(const char *good) {
    char *d = copy_ck(good, "siblings"), *p = test_path(d, MJ_CK_SINGLE);
    stf f;
    st_load(p, &f);
    char us2[MJ_CK_NAME_MAX], us2b[MJ_CK_NAME_MAX], uin[MJ_CK_NAME_MAX];
    mj_ck_tensor_name(us2, sizeof us2, NULL, 3, 1, 1, "weight_scale_2");
    mj_ck_tensor_name(us2b, sizeof us2b, NULL, 3, 5, 1, "weight_scale_2");
    mj_ck_tensor_name(uin, sizeof uin, NULL, 3, 2, 1, "input_scale");
    *st_f32(&f, us2) *= 1.5f;  /* expert 1: up's scale the larger      */
    *st_f32(&f, us2b) *= 0.5f; /* expert 5: gate's scale the larger    */
    *st_f32(&f, uin) *= 2.0f;  /* expert 2: up's input_scale the larger */
    st_save(p, &f);
    mj_checkpoint_t ck = NULL;
    CHECK_OK(mj_checkpoint_open(d, &ck));
    if (!ck) return;
    mj_layer_t ref = reference_layer(ck, 3);
    load_args la = {ck, MJ_PAR_NONE, 0, 1, NULL, MJ_OK};
    unsetenv("MOEJIT_QUIET");
    char *err = capture_stderr(do_load, &la);
    CHECK(la.st == MJ_OK, "load with differing sibling scales: %s", mj_last_error());
    CHECK(test_count(err, "warning") == 1 && strstr(err, "weight_scale_2") && strstr(err, "2 expert(s)") &&
              strstr(err, "expert 1") && strstr(err, "lossy"),
          "one warning for the layer, naming the first expert: %s", err);
    mj_layer_t got = la.out;
    if (got) {
        const int64_t sb = H / 16, qb = H / 2;
        /* Expert 1: up rows as stored (their scale is the max), gate rows re-expressed. */
        const mj_nvfp4_linear *a = &got->w13[1], *b = &ref->w13[1];
        CHECK(a->weight_scale_2 == b->weight_scale_2 * 1.5f, "w13 scale: the larger (%g vs %g)",
              (double)a->weight_scale_2, (double)b->weight_scale_2);
        CHECK(!memcmp(a->weight, b->weight, (size_t)(2 * I * qb)), "FP4 codes are kept");
        CHECK(!memcmp(a->weight_scale + I * sb, b->weight_scale + I * sb, (size_t)(I * sb)), "up's block scales kept");
        CHECK(reexpressed_ok(a->weight_scale, b->weight_scale, b->weight_scale_2, a->weight_scale_2, I * sb),
              "expert 1's gate block scales re-expressed within e4m3 rounding");
        /* Expert 5: gate's scale is the max; up's block scales are re-expressed. */
        const mj_nvfp4_linear *a5 = &got->w13[5], *b5 = &ref->w13[5];
        CHECK(a5->weight_scale_2 == b5->weight_scale_2, "expert 5 keeps gate's scale");
        CHECK(!memcmp(a5->weight_scale, b5->weight_scale, (size_t)(I * sb)), "expert 5's gate scales kept");
        CHECK(reexpressed_ok(a5->weight_scale + I * sb, b5->weight_scale + I * sb, b5->weight_scale_2 * 0.5f,
                             a5->weight_scale_2, I * sb),
              "expert 5's up block scales re-expressed within e4m3 rounding");
        /* Expert 2: the larger input_scale; the rest as stored. */
        CHECK(got->w13[2].input_scale == ref->w13[2].input_scale * 2.0f, "expert 2 input_scale: the max");
        CHECK(linear_equal(&got->w13[0], &ref->w13[0], "expert 0"), "an expert with equal siblings is as stored");
        /* A TP slice of the same checkpoint is the same slice of the whole (the fix is per row). */
        mj_layer_t want = NULL;
        load_args tp = {ck, MJ_PAR_TP, 1, 2, NULL, MJ_OK};
        char *err2 = capture_stderr(do_load, &tp);
        CHECK_OK(mj_layer_shard(got, MJ_PAR_TP, 1, 2, &want));
        CHECK(tp.st == MJ_OK && layer_equal(tp.out, want), "TP 1/2 of the fixed layer");
        mj_layer_free(want), mj_layer_free(tp.out), free(err2);
    }
    free(err);
    mj_layer_free(got), mj_layer_free(ref);
    mj_checkpoint_close(ck);
    free(d), free(p);
}

/* ---- shards and the index ---------------------------------------------------------------------- */

static char *shard_name(const char *dir, int i) {
    char name[64];
    snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", i, count_files(dir, ".safetensors"));
    return test_path(dir, name);
}

static void edit_index(const char *dir, const char *tensor, const char *shard) {
    char *p = test_path(dir, MJ_CK_INDEX);
    json_error_t err;
    json_t *root = json_load_file(p, 0, &err);
    json_t *map = json_object_get(root, "weight_map");
    if (shard) json_object_set_new(map, tensor, json_string(shard));
    else json_object_del(map, tensor);
    json_dump_file(root, p, JSON_INDENT(1));
    json_decref(root);
    free(p);
}

static void test_malformed_sharded(void) {
    const char *good = sharded();
    char gw[MJ_CK_NAME_MAX];
    mj_ck_tensor_name(gw, sizeof gw, NULL, 3, 0, 0, "weight");
    char *d, *p, *q;

    /* A tensor the index lacks; a tensor the index puts in a shard that lacks it. */
    d = copy_ck(good, "idx_missing");
    edit_index(d, tname(3, 4, "down_proj", "weight"), NULL);
    expect_refused("missing from the index", d, MJ_ERR_PARSE, tname(3, 4, "down_proj", "weight"), MJ_CK_INDEX);
    free(d);
    d = copy_ck(good, "idx_wrong_shard");
    q = shard_name(d, 2);
    edit_index(d, gw, strrchr(q, '/') + 1); /* gate's tensor is in shard 1 */
    expect_refused("index names the wrong shard", d, MJ_ERR_PARSE, gw, "whose header has no such tensor");
    free(d), free(q);

    /* Shard names that are paths: refused before anything is opened. */
    const char *bad_names[3] = {"../x.safetensors", NULL, "."};
    char *abs = shard_name(good, 1);
    bad_names[1] = abs;
    for (int i = 0; i < 3; i++) {
        char name[32];
        snprintf(name, sizeof name, "idx_path%d", i);
        d = copy_ck(good, name);
        edit_index(d, gw, bad_names[i]);
        expect_refused("shard name that is a path", d, MJ_ERR_PARSE, gw, "not a file name inside");
        free(d);
    }
    free(abs);

    /* A missing shard; a symlinked one; a FIFO (which must not block the open). */
    d = copy_ck(good, "shard_missing");
    p = shard_name(d, 3);
    unlink(p);
    expect_refused("missing shard", d, MJ_ERR_IO, strrchr(p, '/') + 1, "missing");
    free(d), free(p);
    d = copy_ck(good, "shard_symlink");
    p = shard_name(d, 2);
    q = test_path(g_root, "outside.safetensors");
    rename(p, q);
    CHECK(symlink(q, p) == 0, "symlink: %s", strerror(errno));
    expect_refused("symlinked shard", d, MJ_ERR_IO, strrchr(p, '/') + 1, "symbolic link");
    free(d), free(p), free(q);
    d = copy_ck(good, "shard_fifo");
    p = shard_name(d, 1);
    unlink(p);
    CHECK(mkfifo(p, 0600) == 0, "mkfifo: %s", strerror(errno));
    test_watchdog(20, "test_checkpoint: opening a FIFO shard");
    expect_refused("FIFO shard", d, MJ_ERR_IO, strrchr(p, '/') + 1, "FIFO");
    test_watchdog(0, NULL);
    free(d), free(p);

    /* Shard names with control characters (an escape sequence, a newline): every message that
     * names the shard shows them escaped (\x1b, \x0a), never raw. Missing; and present but a
     * FIFO (the message comes from the safetensors reader). */
    static const char evil[] = "evil\x1b[31m\nred\x07.safetensors";
    for (int i = 0; i < 2; i++) {
        d = copy_ck(good, i ? "shard_evil_fifo" : "shard_evil_missing");
        edit_index(d, gw, evil);
        if (i) {
            p = test_path(d, evil);
            CHECK(mkfifo(p, 0600) == 0, "mkfifo: %s", strerror(errno));
            free(p);
        }
        char msg[4096];
        test_watchdog(20, "test_checkpoint: opening a FIFO shard");
        mj_status st = open_and_load(d, 3, msg, sizeof msg);
        test_watchdog(0, NULL);
        CHECK(st == MJ_ERR_IO, "shard name with control characters: %s: %s", mj_status_string(st), msg);
        CHECK(strstr(msg, "evil\\x1b[31m\\x0ared\\x07.safetensors"), "the shard's name is not escaped: %s", msg);
        int raw = 0;
        for (const char *c = msg; *c; c++) raw += (unsigned char)*c < 0x20;
        CHECK(raw == 0, "the message holds %d control character(s): %s", raw, msg);
        free(d);
    }

    /* A truncated shard among several names that shard. */
    d = copy_ck(good, "shard_truncated");
    p = shard_name(d, 2);
    struct stat sb;
    stat(p, &sb);
    CHECK(truncate(p, sb.st_size / 2) == 0, "truncate");
    expect_refused("truncated shard", d, MJ_ERR_PARSE, strrchr(p, '/') + 1, "run past the data area");
    free(d), free(p);
}

/* ---- the writer --------------------------------------------------------------------------------- */

static int64_t dir_bytes(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *de;
    int64_t n = 0;
    while (d && (de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char *p = test_path(dir, de->d_name);
        struct stat sb;
        if (!stat(p, &sb)) n += sb.st_size;
        free(p);
    }
    if (d) closedir(d);
    return n;
}

/* Entries of dir (not . and ..). */
static int dir_entries(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *de;
    int n = 0;
    while (d && (de = readdir(d))) n += strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
    if (d) closedir(d);
    return n;
}

/* base/file.c's rule for the JSON files: the writer's config and quantization files are paths
 * the caller names, so a symbolic link there is followed (`make-checkpoint --config` on a
 * Hugging Face cache snapshot's config.json, a link into blobs/); a link the loader finds
 * inside a checkpoint directory is refused; a FIFO is refused at once either way. */
static void test_writer_config_links(void) {
    char *cfg_link = test_path(g_root, "config_link.json"), *quant_link = test_path(g_root, "quant_link.json");
    CHECK(symlink(glm5_config(), cfg_link) == 0, "symlink: %s", strerror(errno));
    CHECK(symlink(MJ_SOURCE_DIR "/tests/data/model/hf_quant_config.example.json", quant_link) == 0, "symlink: %s",
          strerror(errno));
    char *out = test_path(g_root, "from_links");
    mj_checkpoint_make_options o = MJ_CHECKPOINT_MAKE_OPTIONS_INIT;
    o.config_json = cfg_link, o.quant_json = quant_link, o.out_dir = out, o.seed = 5;
    o.hidden = 64, o.intermediate = 64, o.n_experts = 4, o.topk = 2;
    CHECK_OK(mj_checkpoint_make(&o));
    mj_checkpoint_t ck = NULL;
    CHECK_OK(mj_checkpoint_open(out, &ck));
    mj_checkpoint_close(ck);

    /* Inside the checkpoint directory, config.json as a link (to its own copy) is refused. */
    char *cfg = test_path(out, MJ_CK_CONFIG), *moved = test_path(g_root, "from_links_config.json");
    CHECK(rename(cfg, moved) == 0 && symlink(moved, cfg) == 0, "config.json -> a link: %s", strerror(errno));
    expect_refused("config.json a link", out, MJ_ERR_IO, "config.json", "is a symbolic link: refused");

    /* A FIFO as the writer's config, and a link to one: refused, never waited on. */
    char *fifo = test_path(g_root, "config_fifo.json"), *fifo_link = test_path(g_root, "config_fifo_link.json");
    CHECK(mkfifo(fifo, 0600) == 0 && symlink(fifo, fifo_link) == 0, "mkfifo: %s", strerror(errno));
    char *out2 = test_path(g_root, "from_fifo");
    o.out_dir = out2, o.quant_json = NULL;
    test_watchdog(20, "test_checkpoint: opening a FIFO shard");
    o.config_json = fifo;
    CHECK_STATUS(mj_checkpoint_make(&o), MJ_ERR_IO);
    CHECK(strstr(mj_last_error(), "config_fifo.json is not a regular file (a FIFO)"), "a FIFO config: %s",
          mj_last_error());
    o.config_json = fifo_link;
    CHECK_STATUS(mj_checkpoint_make(&o), MJ_ERR_IO);
    CHECK(strstr(mj_last_error(), "config_fifo_link.json is not a regular file (a FIFO)"), "a link to a FIFO: %s",
          mj_last_error());
    test_watchdog(0, NULL);
    CHECK(access(out2, F_OK) != 0, "nothing written");
    free(cfg_link), free(quant_link), free(out), free(cfg), free(moved), free(fifo), free(fifo_link), free(out2);
}

/* Which layers are MoE. The multi-token-prediction layers after the last decoder layer
 * (DeepSeek-V3's 61, GLM-4.5-Air's 46: num_nextn_predict_layers) are MoE blocks of the same
 * shape, and were refused as "past the model's last layer"; Qwen-MoE's decoder_sparse_step
 * and mlp_only_layers were not read, so a Qwen layer its config keeps dense was taken for MoE. */
static void case_layouts(void) {
    const char *air = MJ_SOURCE_DIR "/tests/data/config/families/GLM-4.5-Air.json";
    char *dir = test_path(g_root, "mtp");
    mj_checkpoint_make_options o = MJ_CHECKPOINT_MAKE_OPTIONS_INIT;
    o.config_json = air, o.out_dir = dir, o.seed = 11, o.layer_first = 46, o.layer_last = 46;
    o.hidden = 64, o.intermediate = 64, o.n_experts = 8, o.topk = 2;
    mj_checkpoint_make_info info = MJ_CHECKPOINT_MAKE_INFO_INIT;
    CHECK_OK(mj_checkpoint_make_plan(&o, &info));
    CHECK(info.n_layers == 1 && info.layer_first == 46 && info.layer_last == 46, "GLM-4.5-Air MTP layer 46: %d layers %d..%d",
          info.n_layers, info.layer_first, info.layer_last);
    CHECK_OK(mj_checkpoint_make(&o));
    mj_checkpoint_t ck = NULL;
    CHECK_OK(mj_checkpoint_open(dir, &ck));
    int32_t layers[4] = {0}, n = 0;
    if (ck) CHECK_OK(mj_checkpoint_moe_layers(ck, layers, 4, &n));
    CHECK(n == 1 && layers[0] == 46, "the checkpoint's MoE layers: %d, first %d", n, layers[0]);
    mj_layer_t L = NULL;
    if (ck) CHECK_OK(mj_layer_load(ck, 46, MJ_PAR_NONE, 0, 1, &L));
    CHECK(L && L->cfg.hidden == 64 && L->n_local == 8, "layer 46 loaded");
    mj_layer_free(L);
    mj_checkpoint_close(ck);
    /* One past the MTP layer is past the model. */
    o.layer_first = o.layer_last = 47;
    CHECK_STATUS(mj_checkpoint_make_plan(&o, &info), MJ_ERR_INVALID_ARG);
    CHECK(strstr(mj_last_error(), "past the model's last layer") && strstr(mj_last_error(), "1 MTP layer"),
          "layer 47: %s", mj_last_error());
    /* Layers 40-46: the decoder's 40-45 and the MTP layer, all MoE. */
    char *dir2 = test_path(g_root, "mtp_range");
    o.out_dir = dir2, o.layer_first = 40, o.layer_last = 46;
    CHECK_OK(mj_checkpoint_make_plan(&o, &info));
    CHECK(info.n_layers == 7, "layers 40-46: %d MoE", info.n_layers);

    /* The layout rules alone. */
    mj_ck_layout lo;
    CHECK_OK(mj_ck_layout_parse("{\"num_hidden_layers\": 8, \"decoder_sparse_step\": 2, \"mlp_only_layers\": [3]}",
                                "qwen", &lo));
    const int want_qwen[9] = {0, 1, 0, 0, 0, 1, 0, 1, 0}; /* (L + 1) % 2 == 0, 3 kept dense, 8 past */
    for (int32_t l = 0; l < 9; l++)
        CHECK(mj_ck_layout_is_moe(&lo, l) == want_qwen[l], "qwen step 2, mlp_only [3]: layer %d MoE %d", l,
              mj_ck_layout_is_moe(&lo, l));
    CHECK_OK(mj_ck_layout_parse("{\"num_hidden_layers\": 61, \"first_k_dense_replace\": 3, "
                                "\"num_nextn_predict_layers\": 1}", "deepseek_v3", &lo));
    CHECK(!mj_ck_layout_is_moe(&lo, 2) && mj_ck_layout_is_moe(&lo, 3) && mj_ck_layout_is_moe(&lo, 60) &&
              mj_ck_layout_is_moe(&lo, 61) && !mj_ck_layout_is_moe(&lo, 62),
          "DeepSeek-V3: 3..61 MoE (61 the MTP layer)");
    free(dir2);
    CHECK_OK(mj_ck_layout_parse("{\"num_hidden_layers\": 4, \"num_mtp_layers\": 2}", "mtp alias", &lo));
    CHECK(mj_ck_layout_is_moe(&lo, 5) && !mj_ck_layout_is_moe(&lo, 6), "num_mtp_layers 2: layers 4, 5");
    CHECK_STATUS(mj_ck_layout_parse("{\"mlp_only_layers\": [-1]}", "bad", &lo), MJ_ERR_CONFIG);
    CHECK_STATUS(mj_ck_layout_parse("{\"mlp_only_layers\": 3}", "bad", &lo), MJ_ERR_CONFIG);
    CHECK_STATUS(mj_ck_layout_parse("{\"decoder_sparse_step\": 0}", "bad", &lo), MJ_ERR_CONFIG);
    free(dir);
}

/* ---- families with other tensor names ---------------------------------------------------- */

/* A published family config under the run's directory, its FP8 quantization_config taken out
 * (the NVFP4 export's hf_quant_config.json replaces it). */
static char *family_config(const char *file) {
    char src[512];
    json_error_t err;
    snprintf(src, sizeof src, "%s/tests/data/config/families/%s", MJ_SOURCE_DIR, file);
    json_t *root = json_load_file(src, 0, &err);
    if (!root) abort();
    json_object_del(root, "quantization_config");
    char *p = test_path(g_root, file);
    if (json_dump_file(root, p, JSON_INDENT(2))) abort();
    json_decref(root);
    return p;
}

static int has_tensor(const char *dir, const char *name) {
    char *path = test_path(dir, MJ_CK_SINGLE);
    stf f;
    st_load(path, &f);
    int has = json_object_get(f.hdr, name) != NULL;
    json_decref(f.hdr), free(f.data), free(path);
    return has;
}

/* Mixtral and MiniMax-M2 keep a layer in block_sparse_moe: experts.E.w1 (gate), w3 (up), w2
 * (down), each with ModelOpt's weight_scale / weight_scale_2 / input_scale, the router
 * gate.weight, and MiniMax's selection bias on the block itself. make-checkpoint writes those
 * names and the loader reads them back: whole, and every TP / EP slice as mj_layer_shard's. */
static void case_families(void) {
    static const struct { const char *file; int bias; } fam[] = {
        {"Mixtral-8x7B-v0.1.json", 0}, {"MiniMax-M2.5.abridged.json", 1},
    };
    for (size_t i = 0; i < sizeof fam / sizeof fam[0]; i++) {
        char *cfg = family_config(fam[i].file), *dir = test_path(g_root, fam[i].bias ? "minimax" : "mixtral");
        CHECK_OK(make_ck(cfg, dir, -1, -1, 0));
        static const char *const names[] = {
            "model.layers.0.block_sparse_moe.gate.weight",
            "model.layers.0.block_sparse_moe.experts.0.w1.weight",
            "model.layers.0.block_sparse_moe.experts.7.w3.weight_scale",
            "model.layers.0.block_sparse_moe.experts.3.w2.weight_scale_2",
            "model.layers.0.block_sparse_moe.experts.5.w1.input_scale",
        };
        for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
            CHECK(has_tensor(dir, names[k]), "%s: no tensor %s", fam[i].file, names[k]);
        CHECK(has_tensor(dir, "model.layers.0.block_sparse_moe.e_score_correction_bias") == fam[i].bias,
              "%s: the block's selection bias", fam[i].file);
        CHECK(!has_tensor(dir, "model.layers.0.mlp.gate.weight") &&
                  !has_tensor(dir, "model.layers.0.block_sparse_moe.shared_experts.w1.weight"),
              "%s: no DeepSeek names, no shared expert", fam[i].file);
        mj_checkpoint_t ck = NULL;
        CHECK_OK(mj_checkpoint_open(dir, &ck));
        if (!ck) continue;
        mj_moe_config c;
        CHECK_OK(mj_checkpoint_config(ck, &c));
        CHECK(c.n_experts == E && c.intermediate == I && c.n_shared == 0 && c.norm_topk_prob == 1 &&
                  c.has_correction_bias == fam[i].bias,
              "%s: config read back: E %d I %d shared %d norm %d bias %d", fam[i].file, c.n_experts, c.intermediate,
              c.n_shared, c.norm_topk_prob, c.has_correction_bias);
        int32_t layers[2] = {-1, -1}, n = 0;
        CHECK_OK(mj_checkpoint_moe_layers(ck, layers, 2, &n));
        CHECK(n == 1 && layers[0] == 0, "%s: MoE layers: %d, first %d", fam[i].file, n, layers[0]);
        check_layer_and_slices(ck, 0);
        mj_checkpoint_close(ck);
        /* A missing tensor is named with the family's name for it. */
        char *cut = copy_ck(dir, fam[i].bias ? "minimax_cut" : "mixtral_cut");
        char *path = test_path(cut, MJ_CK_SINGLE);
        stf f;
        st_load(path, &f);
        json_object_del(f.hdr, "model.layers.0.block_sparse_moe.experts.2.w3.weight_scale");
        st_save(path, &f);
        expect_refused_at("missing w3 scale", cut, 0, MJ_ERR_PARSE, "block_sparse_moe.experts.2.w3.weight_scale",
                       fam[i].bias ? "MiniMax-M2" : "Mixtral");
        free(cfg), free(dir), free(cut), free(path);
    }
}

/* Add tensor `name` (dtype, 1-D of n elements, the given bytes) to a safetensors file. */
static void st_add(const char *path, const char *name, const char *dtype, int64_t n, const void *bytes, size_t len) {
    stf f;
    st_load(path, &f);
    f.data = realloc(f.data, f.data_len + len + 1);
    memcpy(f.data + f.data_len, bytes, len);
    json_t *e = json_object(), *shape = json_array(), *off = json_array();
    json_array_append_new(shape, json_integer(n));
    json_array_append_new(off, json_integer((json_int_t)f.data_len));
    json_array_append_new(off, json_integer((json_int_t)(f.data_len + len)));
    json_object_set_new(e, "dtype", json_string(dtype));
    json_object_set_new(e, "shape", shape);
    json_object_set_new(e, "data_offsets", off);
    json_object_set_new(f.hdr, name, e);
    f.data_len += len;
    st_save(path, &f);
}

/* A copy of checkpoint src (named tag) with tensor `name` added (as st_add) is refused at layer
 * 0 with MJ_ERR_UNSUPPORTED, naming the tensor and saying `needle`. */
static void expect_extra_refused(const char *src, const char *tag, const char *name, const char *dtype, int64_t n,
                                 const void *bytes, size_t len, const char *needle) {
    char *d = copy_ck(src, tag), *path = test_path(d, MJ_CK_SINGLE);
    st_add(path, name, dtype, n, bytes, len);
    expect_refused_at(name, d, 0, MJ_ERR_UNSUPPORTED, name, needle);
    free(d), free(path);
}

/* MoE tensors the config makes the loader skip are refused, naming the tensor: a selection
 * bias the routing does not use, a shared expert the config does not declare, Qwen-MoE's
 * shared-expert gate, a router bias, an expert past n_routed_experts. A selection bias of zeros
 * selects as none does: loaded, with a warning. Before, each was loaded without it. */
static void case_unread(void) {
    char *cfg = family_config("Mixtral-8x7B-v0.1.json"), *good = test_path(g_root, "unread_good");
    CHECK_OK(make_ck(cfg, good, -1, -1, 0));
    float ones[E], zeros[E];
    for (int e = 0; e < E; e++) ones[e] = 0.25f * (float)(e + 1), zeros[e] = e % 2 ? -0.0f : 0.0f;
    static const struct { const char *name, *needle; } cases[] = {
        {"model.layers.0.block_sparse_moe.e_score_correction_bias", "a selection bias"},
        {"model.layers.0.block_sparse_moe.shared_experts.w1.weight", "a shared expert, which the config does not declare"},
        {"model.layers.0.block_sparse_moe.gate.bias", "not a tensor moejit reads"},
        {"model.layers.0.block_sparse_moe.experts.8.w1.weight", "past n_routed_experts"},
        {"model.layers.0.block_sparse_moe.experts.1.w1.pre_quant_scale", "not one of the expert tensors"},
        {"model.layers.0.block_sparse_moe.shared_expert_gate.weight", "sigmoid gate"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char nm[32];
        snprintf(nm, sizeof nm, "unread%zu", i);
        expect_extra_refused(good, nm, cases[i].name, "F32", E, ones, sizeof ones, cases[i].needle);
    }
    /* All zeros (either sign): skipped, as it changes no selection. */
    char *d = copy_ck(good, "unread_zero"), *path = test_path(d, MJ_CK_SINGLE);
    st_add(path, "model.layers.0.block_sparse_moe.e_score_correction_bias", "F32", E, zeros, sizeof zeros);
    mj_checkpoint_t ck = NULL;
    CHECK_OK(mj_checkpoint_open(d, &ck));
    if (ck) check_layer_and_slices(ck, 0);
    mj_checkpoint_close(ck);
    /* The DeepSeek names: Qwen-MoE's shared expert beside GLM's. */
    char *g = copy_ck(single(), "unread_glm"), *gp = test_path(g, MJ_CK_SINGLE);
    st_add(gp, "model.layers.3.mlp.shared_expert_gate.weight", "F32", E, ones, sizeof ones);
    expect_refused("shared_expert_gate", g, MJ_ERR_UNSUPPORTED, "mlp.shared_expert_gate.weight", "sigmoid gate");
    free(cfg), free(good), free(d), free(path), free(g), free(gp);
}

/* A Qwen family's config (its FP8-free copy) with shared_expert_intermediate_size set (< 0:
 * as published), under the run's directory. */
static char *qwen_config(const char *file, int sis) {
    char src[512], name[96];
    json_error_t err;
    snprintf(src, sizeof src, "%s/tests/data/config/families/%s", MJ_SOURCE_DIR, file);
    json_t *root = json_load_file(src, 0, &err);
    if (!root) abort();
    if (sis >= 0) json_object_set_new(root, "shared_expert_intermediate_size", json_integer(sis));
    snprintf(name, sizeof name, "sis%d_%s", sis, file);
    char *p = test_path(g_root, name);
    if (json_dump_file(root, p, JSON_INDENT(2))) abort();
    json_decref(root);
    return p;
}

/* Qwen2-MoE and Qwen3-Next: one shared expert in the singular (mlp.shared_expert.*,
 * shared_expert_intermediate_size rows: 8 and 1 expert widths) and its sigmoid gate
 * mlp.shared_expert_gate.weight, bf16 [1, H]. make-checkpoint writes them, the loader reads them
 * back whole and as every TP / EP slice mj_layer_shard makes (the gate whole with every slice of
 * the shared expert: each TP rank, EP rank 0). Before, both configs were refused. */
static void case_qwen_gated(void) {
    static const struct { const char *file; int ratio; } fam[] = {
        {"Qwen2-57B-A14B.json", 8}, {"Qwen3-Next-80B-A3B-Thinking.json", 1},
    };
    for (size_t i = 0; i < sizeof fam / sizeof fam[0]; i++) {
        char *cfg = qwen_config(fam[i].file, -1), *dir = test_path(g_root, i ? "qwen3_next" : "qwen2_moe");
        CHECK_OK(make_ck(cfg, dir, 0, 0, 0));
        const char *sg = "model.layers.0.mlp.shared_expert_gate.weight";
        CHECK(has_tensor(dir, "model.layers.0.mlp.shared_expert.gate_proj.weight") &&
                  has_tensor(dir, "model.layers.0.mlp.shared_expert.down_proj.input_scale") && has_tensor(dir, sg) &&
                  !has_tensor(dir, "model.layers.0.mlp.shared_experts.gate_proj.weight"),
              "%s: Qwen's shared expert names", fam[i].file);
        char *path = test_path(dir, MJ_CK_SINGLE), *cfgp = test_path(dir, MJ_CK_CONFIG);
        stf f;
        st_load(path, &f);
        json_t *g = st_entry(&f, sg), *shape = json_object_get(g, "shape");
        CHECK(!strcmp(json_string_value(json_object_get(g, "dtype")), "BF16") && json_array_size(shape) == 2 &&
                  json_integer_value(json_array_get(shape, 0)) == 1 && json_integer_value(json_array_get(shape, 1)) == H,
              "%s: the gate is bf16 [1, H]", fam[i].file);
        json_decref(f.hdr), free(f.data);
        json_error_t err;
        json_t *written = json_load_file(cfgp, 0, &err);
        CHECK(written && json_integer_value(json_object_get(written, "shared_expert_intermediate_size")) == fam[i].ratio * I,
              "%s: the written config keeps the shared expert %d expert widths wide", fam[i].file, fam[i].ratio);
        json_decref(written);
        mj_checkpoint_t ck = NULL;
        CHECK_OK(mj_checkpoint_open(dir, &ck));
        if (ck) {
            mj_moe_config c;
            CHECK_OK(mj_checkpoint_config(ck, &c));
            CHECK(c.n_shared == fam[i].ratio && c.shared_gate == 1, "%s: %d shared, gate %d", fam[i].file, c.n_shared,
                  c.shared_gate);
            check_layer_and_slices(ck, 0);
            /* The gate goes whole with every slice of the shared expert, and nowhere else. */
            mj_layer_t whole = NULL, tp = NULL, ep0 = NULL, ep1 = NULL;
            CHECK_OK(mj_layer_load(ck, 0, MJ_PAR_NONE, 0, 1, &whole));
            CHECK_OK(mj_layer_load(ck, 0, MJ_PAR_TP, 1, 2, &tp));
            CHECK_OK(mj_layer_load(ck, 0, MJ_PAR_EP, 0, 2, &ep0));
            CHECK_OK(mj_layer_load(ck, 0, MJ_PAR_EP, 1, 2, &ep1));
            CHECK(whole && tp && ep0 && ep1 && whole->shared_gate && tp->shared_gate && ep0->shared_gate &&
                      !ep1->shared_gate && !memcmp(tp->shared_gate, whole->shared_gate, H * 2) &&
                      !memcmp(ep0->shared_gate, whole->shared_gate, H * 2),
                  "%s: the gate on TP rank 1 of 2 and EP rank 0 of 2, whole; not on EP rank 1", fam[i].file);
            mj_layer_free(whole), mj_layer_free(tp), mj_layer_free(ep0), mj_layer_free(ep1);
            mj_checkpoint_close(ck);
        }
        /* The gate's tensor as the config makes it: present, bf16, [1, H], finite. */
        static const struct { const char *what, *dtype; int nan; mj_status st; const char *needle; } bad[] = {
            {"missing", NULL, 0, MJ_ERR_PARSE, "is missing"},            /* deleted                 */
            {"f32", "F32", 0, MJ_ERR_PARSE, "expected BF16"},            /* f32 [1, H]              */
            {"1-D", "BF16", 0, MJ_ERR_PARSE, "expected [1, 128]"},       /* bf16 [H]                */
            {"NaN", "BF16", 1, MJ_ERR_NONFINITE, "the gate must be finite"}, /* element 5 a NaN     */
        };
        for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
            char nm[48];
            snprintf(nm, sizeof nm, "qwen%zu_%s", i, bad[k].what);
            char *d = copy_ck(dir, nm), *dp = test_path(d, MJ_CK_SINGLE);
            st_load(dp, &f);
            if (!bad[k].dtype || !strcmp(bad[k].dtype, "F32")) json_object_del(f.hdr, sg);
            else if (bad[k].nan) ((uint16_t *)(f.data + st_off(&f, sg, 0)))[5] = 0x7FC0;
            else st_set_shape(&f, sg, 1, H, 0);
            st_save(dp, &f);
            if (bad[k].dtype && !strcmp(bad[k].dtype, "F32")) { /* the gate as f32 [1, H] */
                float g32[H] = {0};
                st_add(dp, sg, "F32", H, g32, sizeof g32);
                st_load(dp, &f);
                st_set_shape(&f, sg, 2, 1, H);
                st_save(dp, &f);
            }
            expect_refused_at(bad[k].what, d, 0, bad[k].st, sg, bad[k].needle);
            free(d), free(dp);
        }
        free(cfg), free(dir), free(path), free(cfgp);
    }
    /* shared_expert_intermediate_size 0: no shared expert and no gate; a checkpoint that has
     * the gate (or the shared expert) anyway is refused, naming it. */
    char *cfg0 = qwen_config("Qwen2-57B-A14B.json", 0), *none = test_path(g_root, "qwen_none");
    CHECK_OK(make_ck(cfg0, none, 0, 0, 0));
    CHECK(!has_tensor(none, "model.layers.0.mlp.shared_expert_gate.weight") &&
              !has_tensor(none, "model.layers.0.mlp.shared_expert.up_proj.weight"),
          "no shared expert written for a width of 0");
    uint16_t gate[H];
    for (int h = 0; h < H; h++) gate[h] = 0x3F80;
    static const struct { const char *name, *needle; } extra[] = {
        {"model.layers.0.mlp.shared_expert_gate.weight", "the shared expert's sigmoid gate, which the config does not declare"},
        {"model.layers.0.mlp.shared_expert.up_proj.weight", "a shared expert, which the config does not declare"},
        {"model.layers.0.mlp.shared_experts.up_proj.weight", "under DeepSeek's name"},
    };
    for (size_t k = 0; k < sizeof extra / sizeof extra[0]; k++) {
        char nm[32];
        snprintf(nm, sizeof nm, "qwen_extra%zu", k);
        expect_extra_refused(none, nm, extra[k].name, "BF16", H, gate, sizeof gate, extra[k].needle);
    }
    free(cfg0), free(none);
}

static void test_writer(void) {
    /* The plan says what is written, to the byte. */
    char *dir = test_path(g_root, "planned");
    mj_checkpoint_make_options o = MJ_CHECKPOINT_MAKE_OPTIONS_INIT;
    o.config_json = glm5_config(), o.out_dir = dir, o.seed = 7, o.layer_first = 3, o.layer_last = 5;
    o.hidden = 64, o.intermediate = 64, o.n_experts = 4, o.topk = 2, o.shard_bytes = 20000;
    mj_checkpoint_make_info info = MJ_CHECKPOINT_MAKE_INFO_INIT;
    CHECK_OK(mj_checkpoint_make_plan(&o, &info));
    CHECK(info.n_layers == 3 && info.layer_first == 3 && info.layer_last == 5 && info.cfg.hidden == 64 &&
              info.n_shards > 1 && info.tensor_bytes > 0,
          "plan: %d layers %d..%d, %d shards", info.n_layers, info.layer_first, info.layer_last, info.n_shards);
    CHECK(access(dir, F_OK) != 0, "planning writes nothing");
    CHECK_OK(mj_checkpoint_make(&o));
    CHECK(dir_bytes(dir) == info.total_bytes, "wrote %lld bytes, planned %lld", (long long)dir_bytes(dir),
          (long long)info.total_bytes);
    CHECK(count_files(dir, ".safetensors") == info.n_shards, "%d shards, planned %d", count_files(dir, ".safetensors"),
          info.n_shards);

    /* An existing non-empty directory is refused and left alone; an empty one is used. */
    int before = dir_entries(dir);
    CHECK_STATUS(mj_checkpoint_make(&o), MJ_ERR_IO);
    CHECK(strstr(mj_last_error(), "not empty"), "says why: %s", mj_last_error());
    CHECK(dir_entries(dir) == before && dir_bytes(dir) == info.total_bytes, "the existing checkpoint is untouched");
    char *empty = test_path(g_root, "empty_out");
    mkdir(empty, 0755);
    o.out_dir = empty;
    CHECK_OK(mj_checkpoint_make(&o));
    CHECK(count_files(empty, ".safetensors") == info.n_shards, "an empty directory is filled");
    /* A symbolic link as out_dir is refused. */
    char *link = test_path(g_root, "link_out");
    CHECK(symlink(empty, link) == 0, "symlink");
    o.out_dir = link;
    CHECK_STATUS(mj_checkpoint_make(&o), MJ_ERR_IO);
    CHECK(strstr(mj_last_error(), "symbolic link"), "says why: %s", mj_last_error());

    /* Errors leave nothing behind: a bad override (before writing), a dense layer, and a
     * write that fails half-way (a file size limit). */
    char *fresh = test_path(g_root, "fresh");
    o.out_dir = fresh;
    int root_before = dir_entries(g_root);
    o.hidden = 100;
    CHECK_STATUS(mj_checkpoint_make(&o), MJ_ERR_CONFIG);
    CHECK(strstr(mj_last_error(), "hidden_size 100"), "names the field: %s", mj_last_error());
    o.hidden = 64, o.layer_first = 1, o.layer_last = 2;
    CHECK_STATUS(mj_checkpoint_make(&o), MJ_ERR_INVALID_ARG);
    CHECK(strstr(mj_last_error(), "first_k_dense_replace 3"), "says why: %s", mj_last_error());
    o.layer_first = 3, o.layer_last = 200;
    CHECK_STATUS(mj_checkpoint_make(&o), MJ_ERR_INVALID_ARG);
    o.layer_first = 3, o.layer_last = 5;
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = 10000; /* below a shard's size */
    signal(SIGXFSZ, SIG_IGN);
    CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0, "setrlimit");
    mj_status st = mj_checkpoint_make(&o);
    setrlimit(RLIMIT_FSIZE, &old);
    CHECK(st == MJ_ERR_IO && strstr(mj_last_error(), "cannot write"), "a failed write: %s: %s", mj_status_string(st),
          mj_last_error());
    CHECK(dir_entries(g_root) == root_before && access(fresh, F_OK) != 0, "nothing left behind (%d entries, were %d)",
          dir_entries(g_root), root_before);

    /* Too big for the file system: refused before anything is written. */
    o.hidden = 16384, o.intermediate = 16384, o.n_experts = 4096, o.layer_first = 3, o.layer_last = 77;
    CHECK_STATUS(mj_checkpoint_make(&o), MJ_ERR_IO);
    CHECK(strstr(mj_last_error(), "will not fit"), "says why: %s", mj_last_error());
    CHECK(dir_entries(g_root) == root_before, "nothing left behind");

    /* Arguments. */
    uint64_t s1, s2;
    CHECK_OK(mj_checkpoint_layer_seed(1, 3, &s1));
    CHECK_OK(mj_checkpoint_layer_seed(1, 4, &s2));
    CHECK(s1 != s2, "layer seeds differ");
    CHECK_STATUS(mj_checkpoint_layer_seed(1, -1, &s1), MJ_ERR_INVALID_ARG);
    mj_checkpoint_make_options bad = o;
    bad.struct_size = 3;
    CHECK_STATUS(mj_checkpoint_make(&bad), MJ_ERR_INVALID_ARG);
    bad = o, bad.config_json = NULL;
    CHECK_STATUS(mj_checkpoint_make(&bad), MJ_ERR_INVALID_ARG);
    free(dir), free(empty), free(link), free(fresh);
    test_writer_config_links();
}

static int setup(void) {
    g_seed = test_seed(20240611);
    g_root = test_tmpdir("ckpt");
    if (!g_root) return 1;
    setenv("MOEJIT_QUIET", "1", 1); /* the sibling test captures its warning itself */
    return 0;
}

static void teardown(void) {
    free(g_single), free(g_sharded_good);
    test_rm_rf(g_root);
    free(g_root);
}

static void case_round_trip_single(void) { test_round_trip_single(single()); }
static void case_slice_reads(void) { test_slice_reads(single()); }
static void case_parallel_load(void) { test_parallel_load(single()); }
static void case_malformed_single(void) { test_malformed_single(single()); }
static void case_alternative_encodings(void) { test_alternative_encodings(single()); }
static void case_gate_up_swapped(void) { test_gate_up_swapped(single()); }
static void case_sibling_scales(void) { test_sibling_scales(single()); }

static const test_case cases[] = {
    TEST_CASE("round_trip_single", case_round_trip_single),
    TEST_CASE("round_trip_sharded", test_round_trip_sharded),
    TEST_CASE("two_shared", test_two_shared),
    TEST_CASE("slice_reads", case_slice_reads),
    TEST_CASE("parallel_load", case_parallel_load),
    TEST_CASE("malformed_single", case_malformed_single),
    TEST_CASE("alternative_encodings", case_alternative_encodings),
    TEST_CASE("gate_up_swapped", case_gate_up_swapped),
    TEST_CASE("sibling_scales", case_sibling_scales),
    TEST_CASE("malformed_sharded", test_malformed_sharded),
    TEST_CASE("writer", test_writer),
    TEST_CASE("layouts", case_layouts),
    TEST_CASE("families", case_families),
    TEST_CASE("unread", case_unread),
    TEST_CASE("qwen_gated", case_qwen_gated),
};

int main(int argc, char **argv) { return test_main(argc, argv, cases, TEST_N(cases), setup, teardown); }
