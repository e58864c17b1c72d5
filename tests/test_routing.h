/* test_routing.h — a layer's reference routing as the expert and layer tests need it: the
 * router's logits, mj_route_ref's ids / weights / n_sel, and mj_route_dispatch_ref's
 * counts, offsets, active list and permutation (host memory). */
#ifndef MJ_TEST_ROUTING_H
#define MJ_TEST_ROUTING_H

#include "ref/ref.h"
#include "test.h"
#include "weights/layer.h"

typedef struct routing {
    int B, nv, k, E;
    int32_t *ids, *nsel, *cnt, *off, *act, na, *perm, *rix;
    float *w, *logits; /* logits: the router's [B, E], when route_layer made it (else NULL) */
} routing;

static inline void routing_alloc(routing *r, int B, int k, int E) {
    size_t BK = (size_t)(B ? B : 1) * k;
    r->B = B, r->k = k, r->E = E, r->logits = NULL;
    r->ids = malloc(4 * BK), r->w = malloc(4 * BK), r->nsel = malloc(4 * (size_t)(B ? B : 1));
    r->cnt = malloc(4 * (size_t)E), r->off = malloc(4 * (size_t)(E + 1)), r->act = malloc(4 * (size_t)E);
    r->perm = malloc(4 * BK), r->rix = malloc(4 * BK);
}
static inline void routing_free(routing *r) {
    free(r->ids), free(r->w), free(r->nsel), free(r->cnt), free(r->off), free(r->act), free(r->perm), free(r->rix);
    free(r->logits);
}
static inline void routing_dispatch(routing *r) {
    CHECK_OK(mj_route_dispatch_ref(r->ids, r->nsel, r->B, r->k, r->E, r->cnt, r->off, r->act, &r->na, r->perm, r->rix));
}

/* The layer's own router and routing (k0) of B tokens, nv valid, as mj_moe_forward_ref routes. */
static inline void route_layer(mj_layer_t L, const uint16_t *hidden, int B, int nv, int k0, routing *r) {
    routing_alloc(r, B, L->cfg.topk, L->cfg.n_experts);
    r->nv = nv;
    r->logits = malloc(sizeof(float) * (size_t)(B ? B : 1) * L->cfg.n_experts);
    CHECK_OK(mj_router_ref(L, hidden, B, r->logits));
    mj_route_params p;
    CHECK_OK(mj_route_params_from_config(&L->cfg, &p));
    p.k0 = k0;
    CHECK_OK(mj_route_ref(&p, r->logits, L->bias, B, nv, r->ids, r->w, r->nsel, NULL));
    routing_dispatch(r);
}

#endif
