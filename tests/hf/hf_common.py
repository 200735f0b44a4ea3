#!/usr/bin/env python3
"""What make_fixtures.py and judge.py share: moe_train's data order, Hugging Face names, flags.

Nothing here imports torch at module level, so `python3 hf_common.py --selftest` runs where
torch is absent (CI's `hf_common_selftest`, label cpu).

1. moe_train's first micro-batch from a flat token file (engine/io/flat_dataset.h,
   engine/io/dataset.h, engine/io/token_random.cc, replicated exactly): a file of N tokens holds
   floor(0.1 * N) validation tokens at its end; the other T train tokens hold (T - 1) / seq
   windows of seq + 1 tokens, window w starting at token w * seq (neighbours share one token);
   sample s of epoch 0 reads window IndexPermutation(W, StreamKey(seed, 0, 0))(s). Both splits
   must hold a window, so a file of exactly micro_batch * (seq + 1) tokens is refused (its
   validation split is too short): the fixtures use 330 tokens (9 train windows, 1 validation
   window at seq 32) and store which windows the first micro-batch reads. Loss and gradients
   are sums over the batch, so the order of its rows does not matter.

2. Hugging Face parameter names -> ours, for the three layouts transformers has used:
   - per expert, Qwen3-MoE / OLMoE style (the hub checkpoints; what transformers 5
     save_pretrained writes, reverting its load-time conversion):
       model.layers.{i}.mlp.gate.weight                       (E, H)  router
       model.layers.{i}.mlp.experts.{e}.gate_proj.weight      (F, H)
       model.layers.{i}.mlp.experts.{e}.up_proj.weight        (F, H)
       model.layers.{i}.mlp.experts.{e}.down_proj.weight      (H, F)
   - per expert, Mixtral style (hub checkpoints and 5.x save_pretrained):
       model.layers.{i}.block_sparse_moe.gate.weight          (E, H)
       model.layers.{i}.block_sparse_moe.experts.{e}.w1.weight (F, H) gate
       model.layers.{i}.block_sparse_moe.experts.{e}.w3.weight (F, H) up
       model.layers.{i}.block_sparse_moe.experts.{e}.w2.weight (H, F) down
   - stacked (transformers 5's modules in memory, for all three; also loadable from disk):
       model.layers.{i}.mlp.experts.gate_up_proj              (E, 2F, H) = per expert [gate; up]
       model.layers.{i}.mlp.experts.down_proj                 (E, H, F)
   and the rest: model.embed_tokens.weight, model.layers.{i}.input_layernorm.weight,
   self_attn.{q,k,v,o}_proj.weight, self_attn.{q,k}_norm.weight,
   post_attention_layernorm.weight, dense mlp.{gate,up,down}_proj.weight, model.norm.weight,
   lm_head.weight.
   Ours: embedding.weight, layers.{i}.attn_norm.weight, layers.{i}.attention.{q,k,v,o}_proj.weight,
   layers.{i}.attention.{q,k}_norm.weight, layers.{i}.mlp_norm.weight,
   layers.{i}.moe.router.weight (E, H), layers.{i}.moe.experts.fc1.weight (E, 2F, H) = per
   expert [gate rows; up rows], layers.{i}.moe.experts.fc2.weight (E, H, F),
   layers.{i}.mlp.fc1.weight (2F, H) / fc2.weight (H, F), final_norm.weight, lm_head.weight.
   The mapping is a plan (names only, testable without torch) applied by apply_plan (torch).

3. Keys of expected.json's "grads": NAME is one of our parameters; NAME[e] is expert e's slice
   (along dim 0) of a stacked (E, ...) parameter; NAME[e][a:b] is rows a..b-1 of that slice
   (fc1[e][0:F] the gate rows, fc1[e][F:2F] the up rows).
"""
import json
import math
import re
import struct
import sys

MOE_TRAIN_DEFAULT_SEED = 1234  # apps/moe_train/run_flags.cc: --seed
VALIDATION_FRACTION = 0.1      # engine/io/dataset.h: DataOptions::validation_fraction
MASK64 = (1 << 64) - 1


# --- moe_train's data order ----------------------------------------------------------------------

def mix64(x):
    """engine/io/token_random.cc: the SplitMix64 finaliser."""
    x &= MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def stream_key(seed, a, b):
    return mix64((mix64(mix64(seed) ^ a) + b) & MASK64)


class IndexPermutation:
    """engine/io/token_random.cc: a 4-round Feistel bijection of [0, size), cycle-walked."""

    def __init__(self, size, key):
        assert 1 <= size <= (1 << 62), size
        self.size = size
        bits = 2
        while (1 << bits) < size:
            bits += 2
        self.half_bits = bits // 2
        self.half_mask = (1 << self.half_bits) - 1
        self.round_keys = [stream_key(key, 0x5045524D, r) for r in range(4)]  # "PERM"

    def _encrypt(self, x):
        left, right = x >> self.half_bits, x & self.half_mask
        for round_key in self.round_keys:
            mixed = left ^ (mix64(round_key ^ right) & self.half_mask)
            left, right = right, mixed
        return (left << self.half_bits) | right

    def __call__(self, index):
        assert 0 <= index < self.size, index
        x = self._encrypt(index)
        while x >= self.size:
            x = self._encrypt(x)
        return x


def split_sizes(num_tokens):
    """(train tokens, validation tokens) of a flat file: C++ truncates N * 0.1 toward zero."""
    validation = int(float(num_tokens) * VALIDATION_FRACTION)
    return num_tokens - validation, validation


def first_micro_batch_windows(num_tokens, seq_length, micro_batch_size,
                              seed=MOE_TRAIN_DEFAULT_SEED):
    """Train-window indices that moe_train's first micro-batch (and --dump_reference_case) read,
    in row order; window w is tokens [w * seq_length, w * seq_length + seq_length + 1)."""
    train, validation = split_sizes(num_tokens)
    if validation < seq_length + 1:
        raise ValueError(f"{num_tokens} tokens leave {validation} validation tokens, fewer than "
                         f"one window of {seq_length + 1}: moe_train refuses the file")
    windows = (train - 1) // seq_length
    if windows < 1:
        raise ValueError(f"{train} train tokens hold no window of {seq_length + 1}")
    permutation = IndexPermutation(windows, stream_key(seed, 0, 0))  # Split::kTrain, epoch 0
    return [permutation(s % windows) for s in range(micro_batch_size)]


def write_u32(path, tokens):
    with open(path, "wb") as f:
        f.write(struct.pack(f"<{len(tokens)}I", *tokens))


def read_u32(path):
    with open(path, "rb") as f:
        data = f.read()
    return list(struct.unpack(f"<{len(data) // 4}I", data))


# --- Hugging Face names -> ours ----------------------------------------------------------------

_TOP = {
    "model.embed_tokens.weight": "embedding.weight",
    "model.norm.weight": "final_norm.weight",
    "lm_head.weight": "lm_head.weight",
}
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_MOE = r"(?:mlp|block_sparse_moe)"
_RULES = [  # (pattern on the part after model.layers.{i}., kind)
    (re.compile(r"^input_layernorm\.weight$"), "attn_norm"),
    (re.compile(r"^post_attention_layernorm\.weight$"), "mlp_norm"),
    (re.compile(r"^self_attn\.([qkvo])_proj\.weight$"), "proj"),
    (re.compile(r"^self_attn\.([qk])_norm\.weight$"), "qk_norm"),
    (re.compile(rf"^{_MOE}\.gate\.weight$"), "router"),
    (re.compile(rf"^{_MOE}\.experts\.gate_up_proj(?:\.weight)?$"), "stacked_fc1"),
    (re.compile(rf"^{_MOE}\.experts\.down_proj(?:\.weight)?$"), "stacked_fc2"),
    (re.compile(rf"^{_MOE}\.experts\.(\d+)\.(gate_proj|w1|up_proj|w3|down_proj|w2)\.weight$"),
     "expert"),
    (re.compile(r"^mlp\.(gate_proj|up_proj|down_proj)\.weight$"), "dense"),
]
_EXPERT_PART = {"gate_proj": "gate", "w1": "gate", "up_proj": "up", "w3": "up",
                "down_proj": "down", "w2": "down"}


def hf_to_ours_plan(shapes, hidden_size=None, transposed_hint=False):
    """shapes: {hf_name: shape tuple}. Returns (plan, unmapped): plan maps each of our names to
    ("copy", hf_name), ("copy_t", hf_name) (stacked experts stored (E, in, out): transpose the
    last two dims), ("experts_fc1", [gate_0..], [up_0..]), ("experts_fc2", [down_0..]) or
    ("dense_fc1", gate, up); unmapped lists the hf names that map to nothing of ours.
    Raises ValueError on an incomplete expert set or a name two sources claim."""
    plan, unmapped, experts = {}, [], {}

    def put(ours, recipe):
        if ours in plan:
            raise ValueError(f"{ours} comes from both {plan[ours]} and {recipe}")
        plan[ours] = recipe

    dense = {}
    for name in sorted(shapes):
        if name in _TOP:
            put(_TOP[name], ("copy", name))
            continue
        m = _LAYER.match(name)
        if not m:
            unmapped.append(name)
            continue
        layer, rest = int(m.group(1)), m.group(2)
        prefix = f"layers.{layer}."
        for pattern, kind in _RULES:
            r = pattern.match(rest)
            if not r:
                continue
            if kind == "attn_norm":
                put(prefix + "attn_norm.weight", ("copy", name))
            elif kind == "mlp_norm":
                put(prefix + "mlp_norm.weight", ("copy", name))
            elif kind == "proj":
                put(prefix + f"attention.{r.group(1)}_proj.weight", ("copy", name))
            elif kind == "qk_norm":
                put(prefix + f"attention.{r.group(1)}_norm.weight", ("copy", name))
            elif kind == "router":
                put(prefix + "moe.router.weight", ("copy", name))
            elif kind in ("stacked_fc1", "stacked_fc2"):
                shape = tuple(shapes[name])
                transpose = transposed_hint
                if hidden_size is not None and len(shape) == 3:
                    # ours: fc1 (E, 2F, H), fc2 (E, H, F); transposed storage has H in the
                    # other place. Decide from the shape where it is unambiguous.
                    h_last, h_mid = shape[2] == hidden_size, shape[1] == hidden_size
                    want_last = kind == "stacked_fc1"
                    if h_last != h_mid:
                        transpose = h_last != want_last
                op = "copy_t" if transpose else "copy"
                ours = "moe.experts.fc1.weight" if kind == "stacked_fc1" else "moe.experts.fc2.weight"
                put(prefix + ours, (op, name))
            elif kind == "expert":
                experts.setdefault(layer, {}).setdefault(_EXPERT_PART[r.group(2)], {})[
                    int(r.group(1))] = name
            elif kind == "dense":
                dense.setdefault(layer, {})[r.group(1)] = name
            break
        else:
            unmapped.append(name)
    for layer, parts in sorted(experts.items()):
        counts = {part: sorted(by_e) for part, by_e in parts.items()}
        e_all = counts.get("gate", [])
        if not e_all or any(counts.get(p) != list(range(len(e_all))) for p in ("gate", "up", "down")):
            raise ValueError(f"layer {layer}: per-expert weights incomplete: "
                             f"{ {p: len(v) for p, v in counts.items()} }")
        n = len(e_all)
        put(f"layers.{layer}.moe.experts.fc1.weight",
            ("experts_fc1", [parts["gate"][e] for e in range(n)], [parts["up"][e] for e in range(n)]))
        put(f"layers.{layer}.moe.experts.fc2.weight",
            ("experts_fc2", [parts["down"][e] for e in range(n)]))
    for layer, parts in sorted(dense.items()):
        if set(parts) != {"gate_proj", "up_proj", "down_proj"}:
            raise ValueError(f"layer {layer}: dense MLP incomplete: {sorted(parts)}")
        put(f"layers.{layer}.mlp.fc1.weight", ("dense_fc1", parts["gate_proj"], parts["up_proj"]))
        put(f"layers.{layer}.mlp.fc2.weight", ("copy", parts["down_proj"]))
    return plan, unmapped


def apply_plan(plan, tensors):
    """Our tensors from hf tensors ({hf_name: torch.Tensor}) by hf_to_ours_plan's plan (every
    name the plan reads must be in `tensors`: give a parameter without a gradient zeros)."""
    import torch

    out = {}
    for ours, recipe in plan.items():
        op = recipe[0]
        if op == "copy":
            out[ours] = tensors[recipe[1]]
        elif op == "copy_t":
            out[ours] = tensors[recipe[1]].transpose(-1, -2).contiguous()
        elif op == "experts_fc1":
            out[ours] = torch.stack([torch.cat([tensors[g], tensors[u]], dim=0)
                                     for g, u in zip(recipe[1], recipe[2])])
        elif op == "experts_fc2":
            out[ours] = torch.stack([tensors[d] for d in recipe[1]])
        elif op == "dense_fc1":
            out[ours] = torch.cat([tensors[recipe[1]], tensors[recipe[2]]], dim=0)
        else:
            raise ValueError(op)
    return out


_KEY = re.compile(r"^([^\[\]]+)(?:\[(\d+)\])?(?:\[(\d+):(\d+)\])?$")


def select(tensors, key):
    """expected.json's key grammar (module docstring, 3) applied to {our_name: tensor}."""
    m = _KEY.match(key)
    if not m:
        raise ValueError(f"bad key {key!r}")
    t = tensors[m.group(1)]
    if m.group(2) is not None:
        t = t[int(m.group(2))]
    if m.group(3) is not None:
        t = t[int(m.group(3)):int(m.group(4))]
    return t


# --- configs and flags ---------------------------------------------------------------------------

def rope_theta(cfg):
    """The rotary base of a config.json dict: transformers 5 keeps it in rope_parameters
    ({"rope_type": "default", "rope_theta": ...}, or one such dict per layer type), 4.x in
    rope_theta (rope_scaling holding only scaling)."""
    for key in ("rope_parameters", "rope_scaling"):
        value = cfg.get(key)
        if isinstance(value, dict):
            if "rope_theta" in value:
                return float(value["rope_theta"])
            for sub in value.values():
                if isinstance(sub, dict) and "rope_theta" in sub:
                    return float(sub["rope_theta"])
    if cfg.get("rope_theta") is not None:
        return float(cfg["rope_theta"])
    return None


def rope_type(cfg):
    for key in ("rope_parameters", "rope_scaling"):
        value = cfg.get(key)
        if isinstance(value, dict):
            kind = value.get("rope_type", value.get("type"))
            if kind is not None:
                return kind
            for sub in value.values():
                if isinstance(sub, dict) and "rope_type" in sub:
                    return sub["rope_type"]
    return "default"


def num_experts(cfg):
    for key in ("num_experts", "num_local_experts"):
        if cfg.get(key) is not None:
            return int(cfg[key])
    raise KeyError("neither num_experts nor num_local_experts in config.json")


def moe_train_flags(cfg):
    """The moe_train model flags (our names) of a Hugging Face config.json dict of model_type
    qwen3_moe, mixtral or olmoe (OLMoE's norms over whole projections: --qk_layernorm with
    --qk_layernorm_across_heads)."""
    model_type = cfg["model_type"]
    hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    head_dim = cfg.get("head_dim") or hidden // heads
    layers = int(cfg["num_hidden_layers"])
    if model_type == "qwen3_moe":
        dense = sorted(set(cfg.get("mlp_only_layers") or []))
        step = int(cfg.get("decoder_sparse_step") or 1)
        moe_layers = [i for i in range(layers) if i not in dense and (i + 1) % step == 0]
        first_dense = layers - len(moe_layers)
        if moe_layers != list(range(first_dense, layers)):
            raise ValueError(f"MoE layers {moe_layers}: only leading dense layers map to ours")
        ffn_moe, ffn_dense = cfg["moe_intermediate_size"], cfg.get("intermediate_size")
        pre_softmax, qk, across = not cfg.get("norm_topk_prob", False), True, False
    elif model_type == "mixtral":
        first_dense, ffn_moe, ffn_dense = 0, cfg["intermediate_size"], None
        pre_softmax, qk, across = False, False, False
    elif model_type == "olmoe":
        first_dense, ffn_moe, ffn_dense = 0, cfg["intermediate_size"], None
        pre_softmax, qk, across = not cfg.get("norm_topk_prob", False), True, True
    else:
        raise ValueError(f"model_type {model_type!r}: not one of qwen3_moe, mixtral, olmoe")
    flags = {
        "num_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_query_groups": int(cfg.get("num_key_value_heads") or heads),
        "kv_channels": int(head_dim),
        "qk_layernorm": qk,
        "qk_layernorm_across_heads": across,
        "rotary_base": rope_theta(cfg),
        "norm_epsilon": float(cfg["rms_norm_eps"]),
        "num_experts": num_experts(cfg),
        "moe_router_topk": int(cfg["num_experts_per_tok"]),
        "moe_ffn_hidden_size": int(ffn_moe),
        "moe_router_pre_softmax": pre_softmax,
        "first_dense_layers": first_dense,
        "vocab_size": int(cfg["vocab_size"]),
    }
    if first_dense > 0:
        flags["ffn_hidden_size"] = int(ffn_dense)
    return flags


def flag_text(name, value):
    if isinstance(value, bool):
        return f"--{name}={'true' if value else 'false'}"
    return f"--{name}={value!r}" if isinstance(value, float) else f"--{name}={value}"


def parse_flagfile(text):
    """{name: value text} of a gflags flagfile (--name=value or --name / --noname lines)."""
    flags = {}
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("--"):
            continue
        body = line[2:]
        if "=" in body:
            name, value = body.split("=", 1)
        elif body.startswith("no"):
            name, value = body[2:], "false"
        else:
            name, value = body, "true"
        flags[name] = value
    return flags


def flag_value_equal(expected, text, flags=None):
    """Whether a flagfile's text value equals an expected python value (bools, numbers)."""
    if isinstance(expected, bool):
        return text.lower() in (("true", "1", "yes") if expected else ("false", "0", "no"))
    if isinstance(expected, (int, float)):
        try:
            got = float(text)
        except ValueError:
            return False
        return math.isclose(got, float(expected), rel_tol=1e-9, abs_tol=0.0)
    return text == str(expected)


def relative_error(ours, reference):
    """||ours - reference|| / ||reference|| in float64 (inf when ours is not finite)."""
    ours, reference = ours.double().flatten().cpu(), reference.double().flatten().cpu()
    if ours.shape != reference.shape:
        return math.inf
    if not bool(ours.isfinite().all()):
        return math.inf
    denominator = float(reference.norm())
    numerator = float((ours - reference).norm())
    if denominator == 0.0:
        return 0.0 if numerator == 0.0 else math.inf
    return numerator / denominator


# --- files ---------------------------------------------------------------------------------------

def safetensors_header(path):
    """{name: {"dtype", "shape", "data_offsets"}} (and "__metadata__") of a .safetensors file,
    read from its header (8 bytes little-endian length, then JSON): no library needed."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(length))


def safetensors_listing(directory):
    """{name: (dtype, shape, file)} over every *.safetensors file of a directory."""
    import glob
    import os

    listing = {}
    for path in sorted(glob.glob(os.path.join(directory, "*.safetensors"))):
        for name, info in safetensors_header(path).items():
            if name != "__metadata__":
                listing[name] = (info["dtype"], tuple(info["shape"]), os.path.basename(path))
    return listing


# --- transformers (torch imported inside) --------------------------------------------------------

def eager_experts(model):
    """Makes transformers 5's experts run their eager per-expert loop (its default may be a
    grouped_mm kernel): the experts' forward reads config._experts_implementation at each call.
    Returns what the config holds afterwards (None where transformers has no such setting)."""
    setter = getattr(model, "set_experts_implementation", None)
    if callable(setter):
        try:
            setter("eager")
        except Exception as error:  # noqa: BLE001 - the config route below still runs
            print(f"note: set_experts_implementation('eager'): {error!r}")
    seen = set()
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is None or id(config) in seen or not hasattr(config, "_experts_implementation"):
            continue
        seen.add(id(config))
        try:
            config._experts_implementation = "eager"
        except Exception as error:  # noqa: BLE001 - reported, the run goes on
            print(f"note: config._experts_implementation = 'eager': {error!r}")
    return getattr(model.config, "_experts_implementation", None)


def load_hf(path, dtype, device="cpu", topk=None):
    """(model, loading_info) of a Hugging Face directory: eager attention and experts, eval mode
    (no dropout; gradients still flow), `topk` overriding num_experts_per_tok when given."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(path)
    if topk is not None:
        config.num_experts_per_tok = topk
    kwargs = dict(config=config, attn_implementation="eager", output_loading_info=True)
    try:
        model, info = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kwargs)
    except TypeError:  # transformers before `dtype` (4.56)
        model, info = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=dtype,
                                                                        **kwargs)
    eager_experts(model)
    model.to(device=device, dtype=dtype)
    model.eval()
    return model, info


def loading_problems(info):
    """The non-empty entries of from_pretrained's loading info (missing, unexpected, mismatched
    keys, error messages, conversion errors: whatever this transformers reports)."""
    if info is None:
        return {}
    if hasattr(info, "items"):
        items = dict(info.items())
    elif hasattr(info, "__dataclass_fields__"):
        items = {name: getattr(info, name) for name in info.__dataclass_fields__}
    else:
        items = dict(vars(info))
    return {key: value for key, value in items.items() if value}


def hf_loss_and_grads(model, ids, targets):
    """ids, targets: (B, S) int64 on the model's device. loss = mean cross-entropy of the
    model's logits for ids against targets, computed in float64 from the logits, backward
    through the model. Returns (loss, {hf_name: grad}) with zeros for a parameter that got no
    gradient."""
    import torch
    import torch.nn.functional as F

    model.zero_grad(set_to_none=True)
    ids, targets = ids.contiguous(), targets.contiguous()
    logits = model(input_ids=ids, use_cache=False).logits
    vocab = logits.shape[-1]
    loss = F.cross_entropy(logits.to(torch.float64).reshape(-1, vocab), targets.reshape(-1))
    loss.backward()
    grads = {name: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
             for name, p in model.named_parameters()}
    return float(loss.detach()), grads


def hf_parameters(model):
    return {name: p.detach() for name, p in model.named_parameters()}


def experts_transposed(model):
    """Whether transformers stores this model's stacked experts (E, in, out) (its
    use_experts_implementation(is_transposed=True)); False for the three models here."""
    return any(bool(getattr(m, "is_transposed", False)) for m in model.modules()
               if hasattr(m, "gate_up_proj"))


def our_view(model, tensors):
    """{our_name: tensor} from {hf_name: tensor} of `model`'s parameters (or their grads)."""
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    plan, unmapped = hf_to_ours_plan(shapes, hidden_size=model.config.hidden_size,
                                     transposed_hint=experts_transposed(model))
    if unmapped:
        raise ValueError(f"parameters with no name of ours: {unmapped}")
    return apply_plan(plan, tensors)


# --- self-test (no torch) ------------------------------------------------------------------------

def _selftest():
    failures = []

    def check(what, got, want):
        if got != want:
            failures.append(f"{what}: got {got}, want {want}")

    # engine/io/token_random.cc compiled and run for these (IndexPermutation(size,
    # StreamKey(seed, 0, 0)), its first 12 values).
    known = {
        (1234, 2): [0, 1], (1234, 9): [5, 0, 7, 2, 3, 8, 1, 4, 6],
        (1234, 17): [13, 12, 5, 4, 9, 11, 10, 14, 3, 1, 2, 8],
        (1234, 100): [29, 37, 31, 58, 36, 93, 80, 52, 45, 10, 62, 61],
        (0, 2): [1, 0], (0, 9): [3, 6, 8, 0, 1, 7, 4, 2, 5],
        (7, 17): [3, 7, 1, 12, 16, 14, 11, 2, 8, 6, 15, 5],
    }
    for (seed, size), want in known.items():
        p = IndexPermutation(size, stream_key(seed, 0, 0))
        check(f"permutation seed {seed} size {size}", [p(i) for i in range(min(size, 12))], want)
    check("split of 330 tokens", split_sizes(330), (297, 33))
    check("first micro-batch of 330 tokens", first_micro_batch_windows(330, 32, 2), [5, 0])
    try:
        first_micro_batch_windows(66, 32, 2)
        failures.append("66 tokens at seq 32 should be refused (no validation window)")
    except ValueError:
        pass

    shapes = {"model.embed_tokens.weight": (128, 64), "model.norm.weight": (64,),
              "lm_head.weight": (128, 64)}
    for i in range(2):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (64,),
                       p + "post_attention_layernorm.weight": (64,),
                       p + "self_attn.q_proj.weight": (128, 64), p + "self_attn.k_proj.weight": (64, 64),
                       p + "self_attn.v_proj.weight": (64, 64), p + "self_attn.o_proj.weight": (64, 128),
                       p + "self_attn.q_norm.weight": (64,), p + "self_attn.k_norm.weight": (64,)})
    per_expert = dict(shapes)
    mixtral = dict(shapes)
    stacked = dict(shapes)
    for i in range(2):
        p = f"model.layers.{i}."
        per_expert[p + "mlp.gate.weight"] = (4, 64)
        mixtral[p + "block_sparse_moe.gate.weight"] = (4, 64)
        stacked[p + "mlp.gate.weight"] = (4, 64)
        stacked[p + "mlp.experts.gate_up_proj"] = (4, 48, 64)
        stacked[p + "mlp.experts.down_proj"] = (4, 64, 24)
        for e in range(4):
            for part, shape in (("gate_proj", (24, 64)), ("up_proj", (24, 64)), ("down_proj", (64, 24))):
                per_expert[p + f"mlp.experts.{e}.{part}.weight"] = shape
            for part, shape in (("w1", (24, 64)), ("w3", (24, 64)), ("w2", (64, 24))):
                mixtral[p + f"block_sparse_moe.experts.{e}.{part}.weight"] = shape
    ours = {"embedding.weight", "final_norm.weight", "lm_head.weight"}
    for i in range(2):
        ours |= {f"layers.{i}.{n}" for n in (
            "attn_norm.weight", "mlp_norm.weight", "attention.q_proj.weight",
            "attention.k_proj.weight", "attention.v_proj.weight", "attention.o_proj.weight",
            "attention.q_norm.weight", "attention.k_norm.weight", "moe.router.weight",
            "moe.experts.fc1.weight", "moe.experts.fc2.weight")}
    for label, case in (("per-expert", per_expert), ("mixtral", mixtral), ("stacked", stacked)):
        plan, unmapped = hf_to_ours_plan(case, hidden_size=64)
        check(f"{label}: our names", sorted(plan), sorted(ours))
        check(f"{label}: unmapped", unmapped, [])
    plan, _ = hf_to_ours_plan(mixtral, hidden_size=64)
    check("mixtral fc1 recipe", plan["layers.1.moe.experts.fc1.weight"][1][2],
          "model.layers.1.block_sparse_moe.experts.2.w1.weight")
    check("mixtral fc1 up", plan["layers.1.moe.experts.fc1.weight"][2][0],
          "model.layers.1.block_sparse_moe.experts.0.w3.weight")
    plan, _ = hf_to_ours_plan(stacked, hidden_size=64)
    check("stacked fc1 op", plan["layers.0.moe.experts.fc1.weight"][0], "copy")
    transposed = dict(stacked, **{"model.layers.0.mlp.experts.gate_up_proj": (4, 64, 48),
                                  "model.layers.0.mlp.experts.down_proj": (4, 24, 64)})
    plan, _ = hf_to_ours_plan(transposed, hidden_size=64)
    check("transposed fc1 op", plan["layers.0.moe.experts.fc1.weight"][0], "copy_t")
    check("transposed fc2 op", plan["layers.0.moe.experts.fc2.weight"][0], "copy_t")
    broken = dict(per_expert)
    del broken["model.layers.1.mlp.experts.3.up_proj.weight"]
    try:
        hf_to_ours_plan(broken)
        failures.append("an incomplete expert set should be refused")
    except ValueError:
        pass
    _, unmapped = hf_to_ours_plan(dict(shapes, **{"model.layers.0.self_attn.q_proj.bias": (128,)}))
    check("bias unmapped", unmapped, ["model.layers.0.self_attn.q_proj.bias"])

    qwen = {"model_type": "qwen3_moe", "hidden_size": 64, "num_attention_heads": 2, "head_dim": 64,
            "num_key_value_heads": 1, "num_hidden_layers": 2, "rms_norm_eps": 1e-6,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
            "num_local_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
            "intermediate_size": 96, "norm_topk_prob": True, "mlp_only_layers": [],
            "decoder_sparse_step": 1, "vocab_size": 128}
    flags = moe_train_flags(qwen)
    check("qwen flags", (flags["kv_channels"], flags["rotary_base"], flags["num_experts"],
                         flags["moe_router_pre_softmax"], flags["first_dense_layers"]),
          (64, 1e6, 4, False, 0))
    flags = moe_train_flags(dict(qwen, mlp_only_layers=[0]))
    check("qwen dense layer 0", (flags["first_dense_layers"], flags["ffn_hidden_size"]), (1, 96))
    olmoe = {"model_type": "olmoe", "hidden_size": 128, "num_attention_heads": 2,
             "num_key_value_heads": 1, "num_hidden_layers": 2, "rms_norm_eps": 1e-5,
             "rope_theta": 10000.0, "num_experts": 4, "num_experts_per_tok": 2,
             "intermediate_size": 32, "norm_topk_prob": False, "vocab_size": 128}
    flags = moe_train_flags(olmoe)
    check("olmoe flags", (flags["kv_channels"], flags["rotary_base"], flags["moe_router_pre_softmax"],
                          flags["qk_layernorm_across_heads"]), (64, 10000.0, True, True))
    check("flagfile", parse_flagfile("# c\n--a=1\n--qk_layernorm\n--nob\n--c=x=y\n"),
          {"a": "1", "qk_layernorm": "true", "b": "false", "c": "x=y"})
    check("flag equal", (flag_value_equal(1e6, "1000000"), flag_value_equal(True, "true"),
                         flag_value_equal(False, "true")), (True, True, False))
    check("key grammar", _KEY.match("layers.1.moe.experts.fc1.weight[0][32:64]").groups(),
          ("layers.1.moe.experts.fc1.weight", "0", "32", "64"))
    for line in failures:
        print("FAIL " + line)
    print(f"hf_common selftest: {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--selftest"]:
        sys.exit(_selftest())
    print(json.dumps({"usage": "hf_common.py --selftest"}))
    sys.exit(2)
