#!/usr/bin/env python3
"""The judge of moe_train's Hugging Face mapping: transformers itself (GPU machine, torch and
transformers 5, no network), from the repository root with a built tree:

    python3 tests/hf/judge.py --build build [--fixtures DIR] [--work DIR] [--models ...]
                              [--skip-cuda] [--skip-export]

(a) Import. For each fixture (tests/hf/make_fixtures.py, made fresh into WORK/fixtures unless
    --fixtures names a directory of them): `hf_convert import` into a checkpoint, then
    `moe_train --load=CKPT --finetune --dump_reference_case` of the fixture's token file on the
    CPU (f32) and on CUDA (bf16 compute); transformers computes the loss (mean cross-entropy,
    from its logits, in float64) and the gradients on the very ids and targets of our dump:
    - the dump's first micro-batch is the fixture's tokens;
    - the flags hf_convert wrote agree with the fixture's expected.json;
    - CPU: our f32 weights equal transformers' mapped ones; loss relative 1e-5; every
      parameter's gradient ||ours - theirs|| / ||theirs|| <= 1e-4;
    - CUDA: transformers in bf16 on the GPU (CUDA_HF_DTYPE); loss relative 1e-2, gradients
      5e-2. Both sides route to all experts (CUDA_ALL_EXPERTS: --moe_router_topk=E and
      num_experts_per_tok=E), so bf16 rounding cannot flip a top-k choice; the CPU check keeps
      the fixture's top-k. A line per model says how far transformers' own bf16 is from its f32.
(b) Export. moe_train trains the imported Qwen3-MoE fixture 30 steps on CUDA (--save),
    `hf_convert export` writes a Hugging Face directory in f32 and one in bf16 (its default);
    from_pretrained() loads each with no missing, unexpected or mismatched key. The f32 one:
    weights equal ours, and on a held-out token file its CPU loss equals ours
    (--dump_reference_case of the trained checkpoint on the CPU) within 1e-5, gradients within
    1e-4. The bf16 one: every weight is ours rounded to bf16 (nearest even), exactly.
One line per check, then 'judge: N passed, M failed'; exit status 1 when any failed. Every
command it runs is printed; its outputs stay under --work (default: a new temporary directory).
Paths, commands and tolerances are the constants below.
"""
import argparse
import json
import math
import os
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

import torch
import transformers
from safetensors.torch import load_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hf_common as hc  # noqa: E402

# --- what to adapt -------------------------------------------------------------------------------
MOE_TRAIN = "{build}/apps/moe_train"
HF_CONVERT = "{build}/apps/hf_convert"
IMPORT_COMMAND = ["{hf_convert}", "import", "--hf_dir={hf_dir}", "--out={ckpt}"]
EXPORT_COMMAND = ["{hf_convert}", "export", "--load={ckpt}", "--out={hf_dir}", "--dtype={dtype}"]
MODEL_FLAGS_FILE = "model.flags"  # hf_convert import writes CKPT/model.flags (a gflags flagfile)
# Without that file: the fixture's expected.json flags.
LOAD_FLAGS = ["--load={ckpt}", "--finetune"]
SEQ_LENGTH, MICRO_BATCH = 32, 2
DUMP_FLAGS = ["--moe_aux_loss_coeff=0", f"--micro_batch_size={MICRO_BATCH}",
              f"--seq_length={SEQ_LENGTH}", "--data_format=flat_u32", "--data_path={tokens}",
              f"--seed={hc.MOE_TRAIN_DEFAULT_SEED}"]
CPU_LOSS_TOL, CPU_GRAD_TOL, CPU_WEIGHT_TOL = 1e-5, 1e-4, 0.0
CUDA_LOSS_TOL, CUDA_GRAD_TOL = 1e-2, 5e-2
CUDA_HF_DTYPE = torch.bfloat16  # transformers' side of the CUDA check
CUDA_ALL_EXPERTS = True
# (b): training from the imported Qwen3-MoE fixture.
EXPORT_MODEL = "qwen3_moe"
TRAIN_DEVICE = "cuda"
TRAIN_FLAGS = ["--train_steps=30", "--micro_batch_size=4", "--global_batch_size=8",
               f"--seq_length={SEQ_LENGTH}", "--data_format=flat_u32", "--data_path={tokens}",
               "--lr=1e-3", "--min_lr=1e-4", "--warmup_steps=5", "--eval_interval=0",
               "--log_interval=10", f"--seed={hc.MOE_TRAIN_DEFAULT_SEED}"]
TRAIN_TOKENS, HELD_OUT_TOKENS = 8192, 330
EXPORT_LOSS_TOL, EXPORT_GRAD_TOL = 1e-5, 1e-4
# hf_convert export's dtypes: fp32 is judged like the import (weights, loss, gradients); bf16 (the
# default) by its weights alone, which must be ours rounded to bf16 (nearest even) exactly.
EXPORT_EXACT_DTYPE, EXPORT_ROUNDED_DTYPE = "fp32", "bf16"
COMMAND_TIMEOUT_S = 600
REFERENCE_TENSORS = "reference.safetensors"  # modules/trainer.h: kReferenceCaseTensors
NOT_PARAMETERS = ("ids", "targets", "loss", "aux_loss")
# -------------------------------------------------------------------------------------------------


class Checks:
    def __init__(self):
        self.passed, self.failed = 0, []

    def record(self, name, ok, detail=""):
        print(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)
        if ok:
            self.passed += 1
        else:
            self.failed.append(name)
        return ok


def fill(template, **values):
    return [part.format(**values) for part in template]


def run(command, log_path):
    """Runs a command (printed first), its output to log_path; (exit status, output)."""
    print("$ " + " ".join(shlex.quote(c) for c in command), flush=True)
    started = time.time()
    try:
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, errors="replace", timeout=COMMAND_TIMEOUT_S)
        status, output = done.returncode, done.stdout
    except subprocess.TimeoutExpired as error:
        status, output = 124, (error.stdout or "") + f"\n(timed out after {COMMAND_TIMEOUT_S} s)"
    except OSError as error:
        status, output = 127, repr(error)
    with open(log_path, "w") as f:
        f.write(output)
    tail = "\n".join(output.rstrip().splitlines()[-12:])
    print(f"  exit {status} after {time.time() - started:.1f} s; last lines ({log_path}):")
    print("    " + tail.replace("\n", "\n    "), flush=True)
    return status, output


def fresh(path):
    if os.path.exists(path):
        shutil.rmtree(path)
    return path


def model_flags(ckpt, expected, checks, label):
    """The flags that give moe_train the checkpoint's model: --flagfile=CKPT/model.flags when
    hf_convert wrote it (checked against expected.json), else expected.json's."""
    want = expected["moe_train_flags"]
    path = os.path.join(ckpt, MODEL_FLAGS_FILE)
    if not os.path.exists(path):
        checks.record(f"{label} {MODEL_FLAGS_FILE}", False,
                      f"{path} missing; running with expected.json's flags instead")
        flags = []
        return [hc.flag_text(name, value) for name, value in want.items() if value is not None]
    with open(path) as f:
        text = f.read()
    print(f"  {path}: " + " ".join(line.strip() for line in text.splitlines() if line.strip()))
    got = hc.parse_flagfile(text)
    wrong, missing = [], []
    for name, value in want.items():
        if value is None:
            continue
        if name not in got:
            missing.append(name)
            continue
        ok = hc.flag_value_equal(value, got[name])
        if not ok and name == "kv_channels" and got[name] == "0":  # 0: hidden / heads
            ok = value * want["num_attention_heads"] == want["hidden_size"]
        if not ok:
            wrong.append(f"--{name}={got[name]} (want {value})")
    detail = f"{len(want)} expected flags: " + (", ".join(wrong) if wrong else "none disagree")
    if missing:
        detail += f"; not in the file (so moe_train's defaults): {', '.join(missing)}"
    checks.record(f"{label} {MODEL_FLAGS_FILE}", not wrong, detail)
    return [f"--flagfile={path}"]


def dump(label, flags, ckpt, tokens, device, directory, extra=()):
    """moe_train --dump_reference_case of the checkpoint's first micro-batch of `tokens`."""
    command = [MOE_TRAIN, *flags, *fill(LOAD_FLAGS, ckpt=ckpt),
               f"--dump_reference_case={directory}", f"--device={device}",
               *fill(DUMP_FLAGS, tokens=tokens), *extra]
    status, _ = run(command, fresh(directory) + ".log")
    path = os.path.join(directory, REFERENCE_TENSORS)
    if status != 0 or not os.path.exists(path):
        return None
    return load_file(path)


def split_dump(tensors):
    ids = tensors["ids"].long().reshape(MICRO_BATCH, SEQ_LENGTH)
    targets = tensors["targets"].long().reshape(MICRO_BATCH, SEQ_LENGTH)
    weights = {n: t for n, t in tensors.items()
               if n not in NOT_PARAMETERS and not n.startswith("grad.")}
    grads = {n[len("grad."):]: t for n, t in tensors.items() if n.startswith("grad.")}
    return ids, targets, weights, grads


def compare(checks, label, ours_dump, model, device, loss_tol, grad_tol, weight_tol=None,
            expected_tokens=None):
    """Loss and every gradient of our dump against transformers' on the dump's ids and targets;
    our weights against transformers' when weight_tol is given. Returns (hf loss, hf grads)."""
    ids, targets, weights, grads = split_dump(ours_dump)
    if expected_tokens is not None:
        rows = sorted(torch.cat([ids, targets[:, -1:]], dim=1).tolist())
        consistent = bool(torch.equal(ids[:, 1:], targets[:, :-1]))
        same = rows == sorted(expected_tokens)
        checks.record(f"{label} first micro-batch", same and consistent,
                      ("the dump's ids and targets are the fixture's tokens" if same else
                       f"the dump's rows {rows} are not the fixture's {expected_tokens}") +
                      ("" if consistent else "; its targets are not its ids shifted by one"))
    hf_weights = hc.our_view(model, hc.hf_parameters(model))
    names_ok = set(hf_weights) == set(weights) == set(grads)
    checks.record(f"{label} parameter names", names_ok,
                  f"{len(weights)} ours, {len(hf_weights)} transformers'" + (
                      "" if names_ok else
                      f"; only ours: {sorted(set(weights) - set(hf_weights))}, only transformers': "
                      f"{sorted(set(hf_weights) - set(weights))}, no gradient: "
                      f"{sorted(set(weights) - set(grads))}"))
    common = sorted(set(hf_weights) & set(weights))
    if weight_tol is not None:
        worst, worst_name, shape_bad = 0.0, "", []
        for name in common:
            a, b = weights[name].double().cpu(), hf_weights[name].double().cpu()
            if a.shape != b.shape:
                shape_bad.append(f"{name} ours {list(a.shape)} transformers' {list(b.shape)}")
                continue
            diff = float((a - b).abs().max()) if a.numel() else 0.0
            if diff > worst:
                worst, worst_name = diff, name
        checks.record(f"{label} weights", not shape_bad and worst <= weight_tol,
                      "; ".join(shape_bad) if shape_bad else
                      f"{len(common)} parameters, largest |ours - transformers'| {worst:.3g}"
                      f"{' (' + worst_name + ')' if worst_name else ''} (tol {weight_tol:g})")
    hf_loss, hf_grads = hc.hf_loss_and_grads(model, ids.to(device), targets.to(device))
    hf_grads = hc.our_view(model, hf_grads)
    ours_loss = float(ours_dump["loss"].double().reshape(-1)[0])
    rel = abs(ours_loss - hf_loss) / abs(hf_loss)
    checks.record(f"{label} loss", rel <= loss_tol,
                  f"ours {ours_loss:.7f} transformers {hf_loss:.7f} rel {rel:.2e} (tol {loss_tol:g}); "
                  f"aux {float(ours_dump['aux_loss'].double().reshape(-1)[0]):.3g}")
    for name in common:
        if name not in grads:
            continue
        error = hc.relative_error(grads[name], hf_grads[name])
        checks.record(f"{label} grad {name}", error <= grad_tol,
                      f"rel {error:.2e} (tol {grad_tol:g}), |transformers'| "
                      f"{float(hf_grads[name].double().norm()):.3e}")
    return hf_loss, hf_grads


def judge_import(checks, model_type, fixture, work, cuda):
    with open(os.path.join(fixture, "expected.json")) as f:
        expected = json.load(f)
    tokens = os.path.join(fixture, "tokens.u32")
    base = fresh(os.path.join(work, model_type))
    os.makedirs(base)
    ckpt = os.path.join(base, "ckpt")
    status, _ = run(fill(IMPORT_COMMAND, hf_convert=HF_CONVERT, hf_dir=fixture, ckpt=ckpt),
                    os.path.join(base, "import.log"))
    if not checks.record(f"{model_type} hf_convert import", status == 0, f"exit {status}"):
        return None
    flags = model_flags(ckpt, expected, checks, model_type)

    ours = dump(f"{model_type} cpu", flags, ckpt, tokens, "cpu", os.path.join(base, "dump_cpu"))
    if checks.record(f"{model_type} cpu dump", ours is not None, "moe_train --dump_reference_case"):
        model, info = hc.load_hf(fixture, torch.float32, "cpu")
        problems = hc.loading_problems(info)
        checks.record(f"{model_type} fixture loads", not problems, f"{problems or 'no key problems'}")
        hf_loss, _ = compare(checks, f"{model_type} cpu", ours, model, "cpu", CPU_LOSS_TOL,
                             CPU_GRAD_TOL, weight_tol=CPU_WEIGHT_TOL,
                             expected_tokens=expected["tokens"])
        rel = abs(hf_loss - expected["loss"]) / abs(expected["loss"])
        checks.record(f"{model_type} transformers vs expected.json", rel <= 1e-6,
                      f"loss now {hf_loss:.9f}, when made {expected['loss']:.9f} rel {rel:.1e} "
                      f"(made with transformers {expected['versions']['transformers']})")
        del model
    if not cuda:
        return ckpt, flags
    experts = hc.num_experts(expected["config"])
    topk = experts if CUDA_ALL_EXPERTS else None
    extra = [f"--moe_router_topk={experts}"] if CUDA_ALL_EXPERTS else []
    ours = dump(f"{model_type} cuda", flags, ckpt, tokens, "cuda", os.path.join(base, "dump_cuda"),
                extra)
    if checks.record(f"{model_type} cuda dump", ours is not None,
                     "moe_train --dump_reference_case --device=cuda" + (" " + " ".join(extra))):
        model, _ = hc.load_hf(fixture, CUDA_HF_DTYPE, "cuda", topk=topk)
        hf_loss, hf_grads = compare(checks, f"{model_type} cuda", ours, model, "cuda",
                                    CUDA_LOSS_TOL, CUDA_GRAD_TOL)
        del model
        # How far transformers' own bf16 is from its f32 on the same GPU: the noise floor.
        reference, _ = hc.load_hf(fixture, torch.float32, "cuda", topk=topk)
        ids, targets, _, _ = split_dump(ours)
        ref_loss, ref_grads = hc.hf_loss_and_grads(reference, ids.cuda(), targets.cuda())
        ref_grads = hc.our_view(reference, ref_grads)
        worst = max(hc.relative_error(hf_grads[n], ref_grads[n]) for n in ref_grads)
        ours_worst = max(hc.relative_error(g, ref_grads[n])
                         for n, g in split_dump(ours)[3].items() if n in ref_grads)
        print(f"  context {model_type} cuda: transformers {CUDA_HF_DTYPE} vs its float32: loss rel "
              f"{abs(hf_loss - ref_loss) / abs(ref_loss):.2e}, largest gradient rel {worst:.2e}; "
              f"ours vs transformers float32: loss rel "
              f"{abs(float(ours['loss'].double().reshape(-1)[0]) - ref_loss) / abs(ref_loss):.2e}, "
              f"largest gradient rel {ours_worst:.2e}", flush=True)
        del reference
    return ckpt, flags


def token_file(path, count, seed, vocab):
    """A learnable stream: mostly a fixed successor per token, one in ten at random."""
    rng = random.Random(seed)
    successor = list(range(vocab))
    rng.shuffle(successor)
    tokens = [rng.randrange(vocab)]
    while len(tokens) < count:
        tokens.append(successor[tokens[-1]] if rng.random() < 0.9 else rng.randrange(vocab))
    hc.write_u32(path, tokens)
    return path


def judge_export(checks, fixture, imported, work):
    with open(os.path.join(fixture, "expected.json")) as f:
        expected = json.load(f)
    ckpt, flags = imported
    vocab = expected["moe_train_flags"]["vocab_size"]
    base = fresh(os.path.join(work, "export"))
    os.makedirs(base)
    train = token_file(os.path.join(base, "train.u32"), TRAIN_TOKENS, 1, vocab)
    held_out = token_file(os.path.join(base, "held_out.u32"), HELD_OUT_TOKENS, 2, vocab)
    trained = os.path.join(base, "trained")
    status, output = run([MOE_TRAIN, *flags, *fill(LOAD_FLAGS, ckpt=ckpt), f"--save={trained}",
                          f"--device={TRAIN_DEVICE}", *fill(TRAIN_FLAGS, tokens=train)],
                         os.path.join(base, "train.log"))
    steps = [line for line in output.splitlines() if line.startswith("step ")]
    if not checks.record(f"export: train {EXPORT_MODEL} on {TRAIN_DEVICE}", status == 0,
                         f"exit {status}; " + (f"{steps[0].split('|')[1].strip()} -> "
                                               f"{steps[-1].split('|')[1].strip()}" if steps else
                                               "no step line")):
        return
    ours = dump("export", flags, trained, held_out, "cpu", os.path.join(base, "dump_held_out"))
    if not checks.record("export: cpu dump of the trained checkpoint", ours is not None,
                         "held-out tokens"):
        return
    model = export_and_load(checks, expected, trained, base, EXPORT_EXACT_DTYPE)
    if model is not None:
        compare(checks, f"export {EXPORT_EXACT_DTYPE} cpu", ours, model, "cpu", EXPORT_LOSS_TOL,
                EXPORT_GRAD_TOL, weight_tol=CPU_WEIGHT_TOL)
    model = export_and_load(checks, expected, trained, base, EXPORT_ROUNDED_DTYPE)
    if model is not None:
        weights = split_dump(ours)[2]
        hf_weights = hc.our_view(model, hc.hf_parameters(model))
        unequal = sorted(n for n in weights if n not in hf_weights or not torch.equal(
            weights[n].to(torch.bfloat16).float(), hf_weights[n].float().cpu()))
        checks.record(f"export {EXPORT_ROUNDED_DTYPE} weights", not unequal and
                      set(hf_weights) == set(weights),
                      f"{len(weights)} parameters, " + (f"unequal: {unequal}" if unequal else
                                                        "each ours rounded to bf16 exactly"))


def export_and_load(checks, expected, trained, base, dtype):
    """hf_convert export --dtype=dtype of the trained checkpoint; its config.json checked against
    the fixture's; transformers' model loaded from it in f32 on the CPU (None when a step failed)."""
    exported = os.path.join(base, f"hf_{dtype}")
    status, _ = run(fill(EXPORT_COMMAND, hf_convert=HF_CONVERT, ckpt=trained, hf_dir=exported,
                         dtype=dtype), os.path.join(base, f"export_{dtype}.log"))
    if not checks.record(f"export {dtype}: hf_convert export", status == 0, f"exit {status}"):
        return None
    listing = hc.safetensors_listing(exported)
    print(f"  {exported}: {sorted(os.listdir(exported))}")
    for name, (stored, shape, file) in listing.items():
        print(f"    {name:<58} {stored} {list(shape)}  ({file})")
    with open(os.path.join(exported, "config.json")) as f:
        config = json.load(f)
    print("  config.json: " + json.dumps(config, sort_keys=True))
    def same(a, b):  # floats to f32 rounding (an exporter may keep epsilon as a float)
        if isinstance(a, float) or isinstance(b, float):
            return isinstance(a, (int, float)) and isinstance(b, (int, float)) and \
                math.isclose(a, b, rel_tol=1e-6)
        return a == b

    mismatched = {k: (config.get(k), v) for k, v in expected["config"].items()
                  if k in ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
                           "num_key_value_heads", "head_dim", "rms_norm_eps", "vocab_size",
                           "moe_intermediate_size", "num_experts_per_tok", "norm_topk_prob",
                           "tie_word_embeddings") and not same(config.get(k), v)}
    if not same(hc.rope_theta(config), hc.rope_theta(expected["config"])):
        mismatched["rotary base"] = (hc.rope_theta(config), hc.rope_theta(expected["config"]))
    try:
        if hc.num_experts(config) != hc.num_experts(expected["config"]):
            mismatched["experts"] = (hc.num_experts(config), hc.num_experts(expected["config"]))
    except KeyError as error:
        mismatched["experts"] = (str(error), hc.num_experts(expected["config"]))
    checks.record(f"export {dtype}: config.json", not mismatched,
                  f"{mismatched}" if mismatched else "the fixture's model fields (export, fixture)")
    try:
        model, info = hc.load_hf(exported, torch.float32, "cpu")
    except Exception as error:  # noqa: BLE001 - a failed check, not a crash
        checks.record(f"export {dtype}: from_pretrained", False, repr(error)[:400])
        return None
    problems = hc.loading_problems(info)
    loaded = checks.record(f"export {dtype}: from_pretrained", not problems and type(
        model).__name__ == expected["architecture"], f"{type(model).__name__}; " + (
            f"{problems}" if problems else "no missing, unexpected or mismatched key"))
    return model if loaded else None


def main():
    global MOE_TRAIN, HF_CONVERT
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", required=True, help="the build tree (build/apps/moe_train)")
    parser.add_argument("--fixtures", help="a make_fixtures.py --out directory (default: make one)")
    parser.add_argument("--work", help="where checkpoints, dumps and logs go (default: a new temp dir)")
    parser.add_argument("--models", default="qwen3_moe,mixtral,olmoe")
    parser.add_argument("--skip-cuda", action="store_true", help="only the CPU checks of (a)")
    parser.add_argument("--skip-export", action="store_true", help="leave out (b)")
    args = parser.parse_args()
    build = os.path.abspath(args.build)
    MOE_TRAIN, HF_CONVERT = MOE_TRAIN.format(build=build), HF_CONVERT.format(build=build)
    work = os.path.abspath(args.work) if args.work else tempfile.mkdtemp(prefix="hf_judge_")
    os.makedirs(work, exist_ok=True)
    cuda = not args.skip_cuda
    print(f"judge: transformers {transformers.__version__}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU'}; work {work}",
          flush=True)
    checks = Checks()
    for binary in (MOE_TRAIN, HF_CONVERT):
        checks.record(f"binary {os.path.basename(binary)}", os.access(binary, os.X_OK), binary)
    if cuda:
        checks.record("cuda available", torch.cuda.is_available(),
                      "torch sees a GPU" if torch.cuda.is_available() else
                      "no GPU: the CUDA checks fail (pass --skip-cuda to leave them out)")
        cuda = torch.cuda.is_available()
    fixtures = args.fixtures
    if fixtures is None:
        fixtures = os.path.join(work, "fixtures")
        status, _ = run([sys.executable, os.path.join(HERE, "make_fixtures.py"), "--out", fixtures,
                         "--models", args.models], os.path.join(work, "make_fixtures.log"))
        checks.record("make_fixtures.py", status == 0, f"exit {status}, into {fixtures}")
    imported = {}
    for model_type in args.models.split(","):
        fixture = os.path.join(fixtures, model_type)
        if not checks.record(f"{model_type} fixture", os.path.exists(os.path.join(fixture, "expected.json")),
                             fixture):
            continue
        try:
            imported[model_type] = judge_import(checks, model_type, fixture, work, cuda)
        except Exception as error:  # noqa: BLE001 - one model's crash fails it, not the judge
            checks.record(f"{model_type} judge", False, f"raised {error!r}"[:600])
    if not args.skip_export:
        if not cuda and TRAIN_DEVICE == "cuda":
            checks.record("export", False, "training runs on CUDA (no GPU, or --skip-cuda: "
                          "add --skip-export too)")
        elif imported.get(EXPORT_MODEL) is None:
            checks.record("export", False, f"needs the imported {EXPORT_MODEL} fixture")
        else:
            try:
                judge_export(checks, os.path.join(fixtures, EXPORT_MODEL), imported[EXPORT_MODEL], work)
            except Exception as error:  # noqa: BLE001
                checks.record("export judge", False, f"raised {error!r}"[:600])
    if checks.failed:
        print("failed: " + ", ".join(checks.failed))
    print(f"judge: {checks.passed} passed, {len(checks.failed)} failed")
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
