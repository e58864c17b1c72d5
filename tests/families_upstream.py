#!/usr/bin/env python3
"""families_upstream.py — the family table (`moejit models --json`) against the real
transformers source it cites, downloaded from PyPI (`pip download transformers==VERSION
--no-deps`; nothing is imported: torch is not needed, the files are read as text and parsed).

usage: families_upstream.py PATH/TO/moejit DOWNLOAD_DIR

For each supported family: the router and configuration classes it cites exist; the defaults
moejit gives left-out routing keys are the configuration class's (routed_scaling_factor,
n_group, topk_group, norm_topk_prob, topk_method); its expert count and width keys are fields
of that class; its router scores with the sigmoid or softmax moejit says, uses the selection
bias when moejit does, renormalizes by the rule moejit follows (always, or under `if
self.norm_topk_prob`), and scores groups by their top-2 sum. For Mixtral and MiniMax-M2 the
checkpoint names: conversion_mapping.py renames block_sparse_moe to mlp and fuses w1 (gate)
then w3 (up), w2 as down, and MiniMax's block-level bias. A family's MoE block gates its shared
expert (Qwen2-MoE, Qwen3-Next: out = experts + sigmoid(shared_expert_gate(x)) * shared_expert(x),
shared_expert_intermediate_size wide, its configuration's default) exactly when moejit says so,
under the tensor names moejit reads; and ModelOpt (nvidia-modelopt, downloaded the same way)
leaves that gate unquantized by default, as the bf16 tensor moejit reads. For the refused
families, the upstream code does what the refusal says. A download that fails is a failure,
never a pass. The last line is "N passed, N failed".
"""
import ast
import json
import os
import re
import subprocess
import sys
import zipfile

VERSION = "5.25.0"
MODELOPT = "0.47.0"
passed = failed = 0


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL: " + what)


# model_type -> (transformers module, router class, configuration class)
UPSTREAM = {
    "deepseek_v3": ("deepseek_v3", "DeepseekV3TopkRouter", "DeepseekV3Config"),
    "kimi_k2": ("deepseek_v3", "DeepseekV3TopkRouter", "DeepseekV3Config"),
    "glm4_moe": ("glm4_moe", "Glm4MoeTopkRouter", "Glm4MoeConfig"),
    "glm_moe_dsa": ("glm_moe_dsa", "GlmMoeDsaTopkRouter", "GlmMoeDsaConfig"),
    "deepseek_v2": ("deepseek_v2", "DeepseekV2TopkRouter", "DeepseekV2Config"),
    "qwen3_moe": ("qwen3_moe", "Qwen3MoeTopKRouter", "Qwen3MoeConfig"),
    "qwen2_moe": ("qwen2_moe", "Qwen2MoeTopKRouter", "Qwen2MoeConfig"),
    "mixtral": ("mixtral", "MixtralTopKRouter", "MixtralConfig"),
    "minimax_m2": ("minimax_m2", "MiniMaxM2TopKRouter", "MiniMaxM2Config"),
    "qwen3_next": ("qwen3_next", "Qwen3NextTopKRouter", "Qwen3NextConfig"),
}
# model_type -> the MoE block class whose shared expert is gated
GATED_BLOCK = {"qwen2_moe": "Qwen2MoeSparseMoeBlock", "qwen3_next": "Qwen3NextSparseMoeBlock"}


def wheel(download_dir, project="transformers", version=VERSION, name=None):
    name = name or "%s-%s-py3-none-any.whl" % (project, version)
    path = os.path.join(download_dir, name)
    if not os.path.isfile(path):
        os.makedirs(download_dir, exist_ok=True)
        r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--disable-pip-version-check",
                            "%s==%s" % (project, version), "-d", download_dir], capture_output=True, text=True)
        if r.returncode != 0 or not os.path.isfile(path):
            print("FAIL: pip download %s==%s: %s" % (project, version, (r.stderr or r.stdout).strip()[-400:]))
            print("0 passed, 1 failed")
            sys.exit(1)
    return zipfile.ZipFile(path)


def source(zf, module, kind):
    return zf.read("transformers/models/%s/%s_%s.py" % (module, kind, module)).decode()


def class_node(text, name):
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    return None


def class_source(text, name):
    node = class_node(text, name)
    return ast.get_source_segment(text, node) if node else None


def class_defaults(text, name):
    """The class's annotated fields with a constant default: {name: value} (None kept)."""
    out = {}
    node = class_node(text, name)
    for st in node.body if node else []:
        if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
            out[st.target.id] = st.value.value if isinstance(st.value, ast.Constant) else "<expr>"
    return out


def main():
    moejit, download_dir = sys.argv[1], sys.argv[2]
    fams = json.loads(subprocess.run([moejit, "models", "--json"], check=True, capture_output=True,
                                     text=True).stdout)["families"]
    by_type = {f["model_type"]: f for f in fams}
    zf = wheel(download_dir)

    for mt, (module, router, config) in UPSTREAM.items():
        f = by_type.get(mt)
        check(f is not None and f["supported"], "%s: listed and supported" % mt)
        if not f:
            continue
        check(router in f["source"] or mt == "kimi_k2", "%s: its source names %s: %s" % (mt, router, f["source"]))
        modeling, configuration = source(zf, module, "modeling"), source(zf, module, "configuration")
        rsrc = class_source(modeling, router)
        check(rsrc is not None, "%s: transformers %s has class %s" % (mt, module, router))
        dflt = class_defaults(configuration, config)
        check(bool(dflt), "%s: transformers %s has class %s" % (mt, module, config))
        if rsrc is None or not dflt:
            continue
        d = f["defaults"]
        for key, mine in (("routed_scaling_factor", d["routed_scaling_factor"]), ("n_group", d["n_group"]),
                          ("topk_group", d["topk_group"]), ("norm_topk_prob", d["norm_topk_prob"]),
                          ("topk_method", d["topk_method"])):
            if dflt.get(key) is not None:
                check(dflt[key] == mine, "%s: %s defaults to %r in %s, moejit reads %r" % (mt, key, dflt[key], config,
                                                                                            mine))
        for key in (f["experts_key"], f["width_key"]):
            check(key in dflt, "%s: %s is a field of %s" % (mt, key, config))
        sig, soft = "sigmoid" in rsrc, "softmax" in rsrc
        check(sig == (d["scoring_func"] == "sigmoid") and soft == (d["scoring_func"] == "softmax"),
              "%s: %s scores with sigmoid %s / softmax %s, moejit with %s" % (mt, router, sig, soft, d["scoring_func"]))
        bias = "e_score_correction_bias" in rsrc
        check(bias == (d["topk_method"] == "noaux_tc"),
              "%s: %s uses e_score_correction_bias: %s, moejit's topk_method %s" % (mt, router, bias, d["topk_method"]))
        if d["topk_method"] == "noaux_tc" and f["routing_keys_read"]:
            check("topk(2" in rsrc and ".sum(dim=-1)" in rsrc, "%s: %s scores a group by its top-2 sum" % (mt, router))
        guarded = "if self.norm_topk_prob" in rsrc
        if f["renormalize"] == "always":
            check(not guarded and "norm_topk_prob" not in rsrc and re.search(r"/=\s*\w+\.sum\(", rsrc),
                  "%s: %s always renormalizes" % (mt, router))
        elif mt == "deepseek_v2":
            check("norm_topk_prob" not in rsrc, "%s: %s never reads norm_topk_prob (why true is refused)" % (mt, router))
        else:
            check(guarded, "%s: %s renormalizes under `if self.norm_topk_prob`" % (mt, router))
        # The shared expert's gate: moejit gates exactly the families whose block does.
        gated = f["shared_expert"]["gate"] == "sigmoid"
        check(gated == ("self.shared_expert_gate" in modeling),
              "%s: moejit gates the shared expert: %s; modeling_%s.py has a shared_expert_gate: %s" %
              (mt, gated, module, "self.shared_expert_gate" in modeling))
        if gated:
            blk = class_source(modeling, GATED_BLOCK[mt]) or ""
            check("self.shared_expert_gate = torch.nn.Linear(config.hidden_size, 1, bias=False)" in blk and
                  "intermediate_size=config.shared_expert_intermediate_size)" in blk,
                  "%s: %s has a Linear(H, 1) gate and a shared expert shared_expert_intermediate_size wide" % (mt, GATED_BLOCK[mt]))
            check(re.search(r"shared_expert_output = F\.sigmoid\(self\.shared_expert_gate\(\w+\)\) \* shared_expert_output",
                            blk) and "expert_output + shared_expert_output" in blk,
                  "%s: %s adds sigmoid(shared_expert_gate(x)) * shared_expert(x) to the routed experts" % (mt, GATED_BLOCK[mt]))
            sk = f["shared_expert"]["width_key"]
            check(dflt.get(sk) == f["shared_expert"]["default"],
                  "%s: %s defaults to %r in %s, moejit reads %r" % (mt, sk, dflt.get(sk), config, f["shared_expert"]["default"]))
            t = f["tensors"]
            check(t["shared_expert"].startswith("model.layers.L.mlp.shared_expert.{") and
                  t["shared_expert_gate"].startswith("model.layers.L.mlp.shared_expert_gate.weight"),
                  "%s: the block's attributes shared_expert / shared_expert_gate are the names moejit reads: %s" % (mt, t))

    # Kimi-K2: transformers reads its model_type as DeepSeek-V3's.
    kimi = source(zf, "kimi_k25", "configuration")
    check('"kimi_k2"' in kimi and '"deepseek_v3"' in kimi, "kimi_k25 maps kimi_k2 to deepseek_v3")

    # Mixtral / MiniMax-M2 checkpoint names, as transformers converts them.
    conv = zf.read("transformers/conversion_mapping.py").decode()
    mix = conv[conv.index('"mixtral": ['):][:2500]
    check('WeightRenaming(".block_sparse_moe.", ".mlp.")' in mix, "mixtral: block_sparse_moe renamed to mlp")
    w1, w3, w2 = mix.find('".experts.*.w1.weight"'), mix.find('".experts.*.w3.weight"'), mix.find('".experts.*.w2.weight"')
    check(0 <= w1 < w3 < mix.find(".experts.gate_up_proj") < w2 < mix.find(".experts.down_proj"),
          "mixtral: w1 (gate) then w3 (up) fused into gate_up_proj, w2 into down_proj")
    experts = class_source(source(zf, "mixtral", "modeling"), "MixtralExperts") or ""
    check("gate, up = " in experts and "chunk(2" in experts, "mixtral: gate_up_proj's first half is the gate")
    check('mapping["minimax_m2"] = mapping["mixtral"].copy()' in conv and
          '".block_sparse_moe.e_score_correction_bias", ".mlp.e_score_correction_bias"' in conv,
          "minimax_m2: Mixtral's names, the bias on the block")

    # The refused families do what the refusals say.
    refused = {f["model_type"]: f for f in fams if not f["supported"]}
    check(set(refused) == {"llama4", "llama4_text", "gpt_oss"}, "refused: %s" % sorted(refused))
    llama = source(zf, "llama4", "modeling")
    moe, rt = class_source(llama, "Llama4TextMoe") or "", class_source(llama, "Llama4Router") or ""
    check("sigmoid" in rt and re.search(r"routed_in = routed_in \* router_scores", moe),
          "llama4: the router's sigmoid scores scale the experts' input")
    oss = class_source(source(zf, "gpt_oss", "modeling"), "GptOssExperts") or ""
    check("_bias" in oss and ".clamp(" in oss and "(up + 1) * glu" in oss,
          "gpt_oss: biased experts with a clamped SwiGLU (up + 1)")
    check("swiglu_alpha: float = 1.702" in source(zf, "gpt_oss", "configuration"), "gpt_oss: alpha 1.702")

    # ModelOpt leaves *mlp.shared_expert_gate.* (and the router, *mlp.gate.*) unquantized by
    # default: the gate is the bf16 [1, H] weight moejit reads.
    mo = wheel(download_dir, "nvidia-modelopt", MODELOPT, "nvidia_modelopt-%s-py3-none-any.whl" % MODELOPT)
    units = mo.read("modelopt_recipes/configs/ptq/units/default_disabled_quantizers.yaml").decode()
    for pat in ("*mlp.shared_expert_gate.*", "*mlp.gate.*"):
        check(re.search(r"- quantizer_name: '%s'\s*\n\s*enable: false" % re.escape(pat), units),
              "modelopt %s: %s is left unquantized by default" % (MODELOPT, pat))

    print("%d passed, %d failed" % (passed, failed))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
