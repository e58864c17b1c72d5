/* registry.c — the templates a program knows: the library's product templates
 * (build/gen/mj_registry.c), then those a test program adds (its fixtures). */
#include "gen.h"

static const mj_template_desc *g_extra;
static int32_t g_n_extra;

void mj_registry_extend(const mj_template_desc *templates, int32_t n) {
    g_extra = templates;
    g_n_extra = n;
}

int32_t mj_registry_count(void) { return mj_registry_n_templates + g_n_extra; }

const mj_template_desc *mj_template_at(int32_t index) {
    if (index >= 0 && index < mj_registry_n_templates) return &mj_registry_templates[index];
    if (index >= mj_registry_n_templates && index - mj_registry_n_templates < g_n_extra)
        return &g_extra[index - mj_registry_n_templates];
    return NULL;
}

const mj_template_desc *mj_template_find(const char *name, int32_t *index) {
    for (int32_t i = 0; name && i < mj_registry_count(); i++) {
        const mj_template_desc *t = mj_template_at(i);
        if (!strcmp(t->name, name)) {
            if (index) *index = i;
            return t;
        }
    }
    return NULL;
}
