#!/usr/bin/env python3
"""Interop check: does Python DeepSpeed load the MoE checkpoints that deepspeed-cpp writes?

Not part of ctest (it needs `pip install torch deepspeed`). It builds, with DeepSpeed's own
deepspeed.moe.layer.MoE, the model of deepspeed-cpp's MoE checkpoint test:

    embed = Linear(4, 6)
    moe   = MoE(hidden_size=6, expert=ExpertMlp(), num_experts=4, ep_size=2, k=2,
                capacity_factor=1.0, drop_tokens=True, use_rts=True)
            # ExpertMlp: fc1 = Linear(6, 12); tanh; fc2 = Linear(12, 6)
    head  = Linear(6, 2)
    loss  = mse(head(h + moe(h)), y) + 0.01 * l_aux,  h = tanh(embed(x))

on 2 gloo ranks (ep_size 2, so expert-data-parallel groups of size 1) and, for one case folder
(<case>/step2 written by deepspeed-cpp after 2 steps):
  a. engine.load_checkpoint(case, tag="step2") with optimizer states;
  b. every module parameter equals the checkpoint's (dense from mp_rank_00_model_states.pt,
     experts from layer_0_expert_<global id>_mp_rank_00_model_states.pt);
  c. the optimizer state equals the saved one (ZeRO 1/2: fp32 partitions and Adam moments of the
     [bf16_]zero_pp_rank file; stage 0: the expp_rank file's 'optimizer');
  d. engine.save_checkpoint(out, tag="py") and a comparison of file names, keys, structure,
     dtypes, shapes and values of DeepSpeed's files against the case's step2 files;
  e. one training step from the loaded state.

Usage (DS_ACCELERATOR=cpu is set by the script when unset):
    python tests/e2e/deepspeed_moe_interop.py /tmp/moe_ckpts/Zero2Fp32 [--stage 2] [--bf16]
    torchrun --nproc_per_node 2 tests/e2e/deepspeed_moe_interop.py /tmp/moe_ckpts/Zero2Fp32
Without torchrun the script spawns its 2 ranks itself. The stage and bf16 default from the
case folder's name (Zero<S>Fp32 / Zero<S>Bf16). --fused-adam keeps DeepSpeed's default
FusedAdam (JIT-compiled on CPU) instead of "torch_adam": true; at stage 0 with bf16 that picks
FP16_Optimizer (fp32_groups_flat) instead of FP16_UnfusedOptimizer (fp32_groups).
--write-reference DIR trains 2 steps with DeepSpeed itself and saves DIR/step2 (a reference
checkpoint to run the checks against).
Exit status 0 only when every check passes on every rank.
"""

import argparse
import math
import os
import re
import socket
import sys
import tempfile
import traceback

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.dont_write_bytecode = True  # leave no __pycache__ in the source tree
from peer_exit import leave  # noqa: E402

WORLD = 2
EP_SIZE = 2
NUM_EXPERTS = 4
TAG = "step2"


# ----------------------------------------------------------------------------------------------
# model


class ExpertMlp(nn.Module):

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 12)
        self.fc2 = nn.Linear(12, 6)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


class MoeNet(nn.Module):

    def __init__(self):
        super().__init__()
        from deepspeed.moe.layer import MoE
        self.embed = nn.Linear(4, 6)
        self.moe = MoE(hidden_size=6,
                       expert=ExpertMlp(),
                       num_experts=NUM_EXPERTS,
                       ep_size=EP_SIZE,
                       k=2,
                       capacity_factor=1.0,
                       drop_tokens=True,
                       use_rts=True)
        self.head = nn.Linear(6, 2)

    def forward(self, x, y):
        dtype = self.embed.weight.dtype
        h = torch.tanh(self.embed(x.to(dtype)))
        m, l_aux, _ = self.moe(h)
        out = self.head(h + m)
        return F.mse_loss(out.float(), y.float()) + 0.01 * l_aux


def ds_config(stage, bf16, fused_adam):
    params = {"lr": 0.05}
    if not fused_adam:
        params["torch_adam"] = True
    cfg = {
        "train_micro_batch_size_per_gpu": 12,
        "gradient_clipping": 0.1,
        "optimizer": {
            "type": "Adam",
            "params": params
        },
        "scheduler": {
            "type": "WarmupLR",
            "params": {
                "warmup_num_steps": 3
            }
        },
        "zero_optimization": {
            "stage": stage
        },
    }
    if bf16:
        cfg["bf16"] = {"enabled": True}
    return cfg


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 + 10 * rank + step)
    x = torch.randn(12, 4, generator=g)
    y = torch.randn(12, 2, generator=g)
    return x, y


# ----------------------------------------------------------------------------------------------
# results


class Results:

    def __init__(self, rank):
        self.rank = rank
        self.items = []  # (name, ok, detail)

    def add(self, name, ok, detail=""):
        self.items.append((name, bool(ok), detail))
        status = "PASS" if ok else "FAIL"
        print(f"[rank {self.rank}] {status} {name}" + (f": {detail}" if detail else ""), flush=True)

    def info(self, text):
        print(f"[rank {self.rank}] {text}", flush=True)


def tensor_diff(a, b):
    """None when equal in dtype/shape/values, else a text."""
    if a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape):
        return f"dtype/shape {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
    if a.numel() == 0:
        return None
    if a.is_floating_point():
        if torch.equal(a, b):
            return None
        d = (a.double() - b.double()).abs()
        return f"values differ: max |diff| {d.max().item():.3e} at {int(d.argmax())} of {a.numel()}"
    return None if torch.equal(a, b) else "values differ"


# ----------------------------------------------------------------------------------------------
# structure of a saved object: path -> description (and value)


def describe(obj, path="", out=None):
    if out is None:
        out = {}
    if isinstance(obj, dict):
        keys = list(obj.keys())
        out[path] = ("dict", [repr(k) for k in keys], None)
        for k in keys:
            describe(obj[k], f"{path}[{k!r}]", out)
    elif isinstance(obj, torch.Size):
        out[path] = ("Size", tuple(obj), None)
    elif isinstance(obj, (list, tuple)) and all(x is None or isinstance(x, (bool, int, float, str)) for x in obj):
        out[path] = (type(obj).__name__, list(obj), None)  # a list of scalars: one leaf
    elif isinstance(obj, (list, tuple)):
        out[path] = (type(obj).__name__, len(obj), None)
        for i, v in enumerate(obj):
            describe(v, f"{path}[{i}]", out)
    elif torch.is_tensor(obj):
        out[path] = ("tensor", f"{obj.dtype}{tuple(obj.shape)}", obj.detach().cpu())
    elif obj is None or isinstance(obj, (bool, int, float, str)):
        out[path] = (type(obj).__name__, obj, None)
    else:
        # A Python object (e.g. a loss scaler): its class and public attributes.
        attrs = {k: v for k, v in sorted(vars(obj).items())} if hasattr(obj, "__dict__") else {}
        out[path] = ("object", type(obj).__module__ + "." + type(obj).__qualname__, None)
        for k, v in attrs.items():
            describe(v, f"{path}.{k}", out)
    return out


def compare_structures(ours, theirs, label, lines, ignore_value_paths=()):
    """Every difference between two describe() maps, appended to `lines` (below a path that is
    reported as missing or of another kind, nothing more is reported)."""
    reported = []

    def under_reported(path):
        return any(path.startswith(r) and path[len(r):len(r) + 1] in ("[", ".") for r in reported)

    for path in ours:  # kinds first, so that what lies below such a path is not reported again
        if path in theirs and ours[path][0] != theirs[path][0] and not under_reported(path):
            lines.append(f"{label}: kind differs at {path}: ours {fmt_desc(ours[path])}, "
                         f"DeepSpeed's {fmt_desc(theirs[path])}")
            reported.append(path)
    for path in ours:
        if path not in theirs and not under_reported(path):
            lines.append(f"{label}: only in ours: {path} = {fmt_desc(ours[path])}")
            reported.append(path)
    for path in theirs:
        if path not in ours and not under_reported(path):
            lines.append(f"{label}: only in DeepSpeed's: {path} = {fmt_desc(theirs[path])}")
            reported.append(path)
    for path in ours:
        if path not in theirs or under_reported(path) or path in reported:
            continue
        (ka, da, va), (kb, db, vb) = ours[path], theirs[path]
        if ka == "dict":
            if da != db:
                if sorted(da) == sorted(db) and not any(re.search(p, path) for p in ignore_value_paths):
                    lines.append(f"{label}: key order differs at {path}: ours {da}, DeepSpeed's {db}")
                # missing/extra keys are reported per path above
            continue
        if ka == "tensor":
            if da != db:
                lines.append(f"{label}: tensor at {path}: ours {da}, DeepSpeed's {db}")
            elif any(re.search(p, path) for p in ignore_value_paths):
                pass
            else:
                d = tensor_diff(va, vb)
                if d:
                    lines.append(f"{label}: tensor at {path}: {d}")
            continue
        if da != db and not any(re.search(p, path) for p in ignore_value_paths):
            lines.append(f"{label}: value at {path}: ours {da!r} ({ka}), DeepSpeed's {db!r} ({kb})")


def fmt_desc(d):
    kind, desc, _ = d
    text = repr(desc)
    if len(text) > 200:
        text = text[:200] + "..."
    return f"{kind} {text}"


def load_pt(path):
    return torch.load(path, map_location="cpu", weights_only=False)


# ----------------------------------------------------------------------------------------------
# the checks


def module_expected(case_dir, rank):
    """name -> tensor expected in this rank's module after loading."""
    tag_dir = os.path.join(case_dir, TAG)
    sd = load_pt(os.path.join(tag_dir, "mp_rank_00_model_states.pt"))
    expected = dict(sd["module"])
    local = NUM_EXPERTS // EP_SIZE
    ep_rank = rank % EP_SIZE
    prefix = "moe.deepspeed_moe.experts.deepspeed_experts."
    for i in range(local):
        gid = ep_rank * local + i
        esd = load_pt(os.path.join(tag_dir, f"layer_0_expert_{gid}_mp_rank_00_model_states.pt"))
        for k, v in esd.items():
            expected[k.replace(f"{prefix}{gid}.", f"{prefix}{i}.")] = v
    return sd, expected


def check_module(engine, case_dir, rank, res):
    _, expected = module_expected(case_dir, rank)
    bad = []
    names = set()
    for name, p in engine.module.named_parameters():
        names.add(name)
        if name not in expected:
            bad.append(f"{name}: not in the checkpoint")
            continue
        want = expected[name]
        if want.dtype != p.dtype:
            bad.append(f"{name}: checkpoint dtype {want.dtype}, module {p.dtype}")
        d = tensor_diff(p.detach().cpu(), want.to(p.dtype))
        if d:
            bad.append(f"{name}: {d}")
    extra = sorted(set(expected) - names - {k for k, _ in engine.module.named_buffers()})
    if extra:
        bad.append(f"checkpoint entries that are no parameter of the module: {extra}")
    res.add("b. module parameters == checkpoint (dense + this rank's experts)", not bad,
            "; ".join(bad) if bad else f"{len(names)} parameters")


def _base_state_of_group(base, g):
    """The saved base optimizer state of flat group g (rigid torch dict or elastic list)."""
    if isinstance(base, dict):
        st = base["state"]
        key = g if g in st else list(st.keys())[g]
        return st[key]
    return base[g]


def check_zero_optimizer(engine, case_dir, rank, bf16, res):
    opt = engine.optimizer
    dp_rank = rank
    fname = f"{'bf16_' if bf16 else ''}zero_pp_rank_{dp_rank}_mp_rank_00_optim_states.pt"
    path = os.path.join(case_dir, TAG, fname)
    saved = load_pt(path)["optimizer_state_dict"]
    # fp32 partitions
    bad = []
    sp = saved["single_partition_of_fp32_groups"]
    if len(sp) != len(opt.single_partition_of_fp32_groups):
        bad.append(f"{len(sp)} saved groups, engine has {len(opt.single_partition_of_fp32_groups)}")
    for g, (cur, s) in enumerate(zip(opt.single_partition_of_fp32_groups, sp)):
        cur = cur.detach().cpu()
        if s.numel() > cur.numel():
            bad.append(f"group {g}: saved partition has {s.numel()} elements, engine's {cur.numel()}")
            continue
        # DeepSpeed saves the partitions without padding; the engine's carries it at the end.
        d = tensor_diff(cur[:s.numel()], s.to(cur.dtype))
        if d:
            bad.append(f"group {g}: {d}")
        if cur.numel() > s.numel() and torch.count_nonzero(cur[s.numel():]) != 0:
            bad.append(f"group {g}: padding of the engine's partition is not zero")
    res.add(f"c. ZeRO fp32 partitions == {fname} single_partition_of_fp32_groups", not bad,
            "; ".join(bad) if bad else ", ".join(f"group {g}: {t.numel()} elements" for g, t in enumerate(sp)))

    # consistency of the fp32 masters with the module's (bit16 or fp32) parameters
    bad = []
    for g, fp32 in enumerate(opt.single_partition_of_fp32_groups):
        part_id = torch.distributed.get_rank(group=opt.real_dp_process_group[g])
        low = opt.parallel_partitioned_bit16_groups[g][part_id].detach().cpu()
        d = tensor_diff(fp32.detach().cpu().to(low.dtype), low)
        if d:
            bad.append(f"group {g} (partition {part_id}): {d}")
    res.add("c. fp32 partitions consistent with the module's flat parameters (same order/rounding)", not bad,
            "; ".join(bad))

    # Adam moments
    bad = []
    base = saved["base_optimizer_state"]
    for g, group in enumerate(opt.optimizer.param_groups):
        p = group["params"][0]
        state = opt.optimizer.state.get(p, {})
        try:
            want = _base_state_of_group(base, g)
        except Exception as e:  # noqa: BLE001
            bad.append(f"group {g}: saved base_optimizer_state unreadable: {e!r}")
            continue
        for key in ("exp_avg", "exp_avg_sq"):
            if key not in state:
                bad.append(f"group {g}: engine state has no {key} (keys {list(state)})")
                continue
            cur = state[key].detach().cpu()
            if torch.count_nonzero(cur) == 0:
                bad.append(f"group {g}: engine {key} is all zero")
            w = want[key]
            d = tensor_diff(cur[:w.numel()], w.to(cur.dtype)) if w.numel() <= cur.numel() else \
                f"saved {w.numel()} elements > engine {cur.numel()}"
            if d:
                bad.append(f"group {g} {key}: {d}")
        if "step" in want:
            s_cur = state.get("step", group.get("step"))
            s_want = want["step"]
            if float(s_cur) != float(s_want):
                bad.append(f"group {g}: step {s_cur} vs saved {s_want}")
    res.add(f"c. Adam exp_avg/exp_avg_sq/step == {fname} base_optimizer_state (non-zero)", not bad,
            "; ".join(bad))
    from deepspeed.runtime.fp16.loss_scaler import LossScalerBase
    scaler = opt.loss_scaler
    res.add("c. ZeRO optimizer's loss_scaler restored as a DeepSpeed loss scaler object",
            isinstance(scaler, LossScalerBase),
            f"engine.optimizer.loss_scaler is {type(scaler).__module__}.{type(scaler).__qualname__}: {scaler!r}"
            f" (the file's optimizer_state_dict['loss_scaler'] is {type(saved.get('loss_scaler')).__name__})")


def check_stage0_optimizer(engine, case_dir, rank, bf16, res):
    ep_rank = rank % EP_SIZE
    fname = f"expp_rank_{ep_rank}_mp_rank_00_optim_states.pt"
    saved = load_pt(os.path.join(case_dir, TAG, fname))["optimizer"]
    cur = engine.optimizer.state_dict()
    # Values: the inner optimizer's groups, moments and steps (and fp32 masters at 16 bits).
    bad = []
    inner_saved = saved.get("optimizer_state_dict", saved) if isinstance(saved, dict) else saved
    inner_cur = cur.get("optimizer_state_dict", cur)
    sg = [len(g["params"]) for g in inner_saved.get("param_groups", [])]
    cg = [len(g["params"]) for g in inner_cur["param_groups"]]
    if sg != cg:
        bad.append(f"param groups (parameters per group): file {sg}, engine {cg}")
    else:
        for idx, st in inner_saved.get("state", {}).items():
            cst = inner_cur["state"].get(idx)
            if cst is None:
                bad.append(f"state[{idx}] not in the engine")
                continue
            for key, v in st.items():
                w = cst.get(key)
                if torch.is_tensor(v) and v.dim() > 0:
                    d = "missing" if w is None else tensor_diff(w.detach().cpu(), v.to(w.dtype))
                    if d:
                        bad.append(f"state[{idx}][{key!r}]: {d}")
                elif float(v) != float(w):
                    bad.append(f"state[{idx}][{key!r}]: file {v}, engine {w}")
    for key in ("fp32_groups_flat", "fp32_groups"):
        if isinstance(saved, dict) and key in saved:
            if key not in cur:
                bad.append(f"file has {key}, {type(engine.optimizer).__name__} has none")
                continue
            flat_s = [t for t in (saved[key] if key == "fp32_groups_flat" else sum(saved[key], []))]
            flat_c = [t for t in (cur[key] if key == "fp32_groups_flat" else sum(cur[key], []))]
            if len(flat_s) != len(flat_c):
                bad.append(f"{key}: {len(flat_s)} tensors in the file, {len(flat_c)} in the engine")
            for i, (a, b) in enumerate(zip(flat_s, flat_c)):
                d = tensor_diff(b.detach().cpu(), a.to(b.dtype))
                if d:
                    bad.append(f"{key}[{i}]: {d}")
    res.add(f"c. stage-0 optimizer state (groups, Adam moments, steps, fp32 masters) == {fname} 'optimizer' "
            f"(engine optimizer {type(engine.optimizer).__name__})", not bad, "; ".join(bad))
    # Structure: informational (torch's Adam adds its own group keys and keeps 'step' as a tensor).
    lines = []
    compare_structures(describe(saved), describe(cur), f"{fname} 'optimizer' vs engine.optimizer.state_dict()",
                       lines)
    if lines:
        res.info("c. (info) structure of the file's 'optimizer' vs engine.optimizer.state_dict() after loading:\n    "
                 + "\n    ".join(lines))
    # moments non-zero
    inner = engine.optimizer.optimizer if hasattr(engine.optimizer, "optimizer") else engine.optimizer
    zero = []
    n = 0
    for p, st in inner.state.items():
        for key in ("exp_avg", "exp_avg_sq"):
            if key in st:
                n += 1
                if torch.count_nonzero(st[key]) == 0:
                    zero.append(key)
    res.add("c. stage-0 Adam moments present and non-zero", n > 0 and not zero,
            f"{n} moment tensors, all-zero: {zero}")
    if bf16 and hasattr(engine.optimizer, "fp32_groups_flat"):
        bad = []
        for g, (f32, low) in enumerate(zip(engine.optimizer.fp32_groups_flat, engine.optimizer.fp16_groups_flat)):
            d = tensor_diff(f32.detach().to(low.dtype), low.detach())
            if d:
                bad.append(f"group {g}: {d}")
        res.add("c. fp32_groups_flat consistent with the module's bf16 flat groups", not bad, "; ".join(bad))


def compare_saved(case_dir, out_dir, res):
    """d: DeepSpeed's files (out_dir/py) vs ours (case_dir/step2)."""
    ours_dir = os.path.join(case_dir, TAG)
    py_dir = os.path.join(out_dir, "py")
    ours_files = sorted(os.listdir(ours_dir))
    py_files = sorted(os.listdir(py_dir))
    res.info(f"d. DeepSpeed wrote {out_dir}: {sorted(os.listdir(out_dir))}; py/: {py_files}")
    res.info(f"d. ours {case_dir}: {sorted(os.listdir(case_dir))}; {TAG}/: {ours_files}")
    lines = []
    root_ours = set(os.listdir(case_dir)) - {TAG}
    root_py = set(os.listdir(out_dir)) - {"py"}
    for f in sorted(root_py - root_ours):
        lines.append(f"files: case folder lacks {f} (DeepSpeed writes it beside the tag folder)")
    for f in sorted(root_ours - root_py):
        lines.append(f"files: case folder has {f}, DeepSpeed writes no such file beside the tag folder")
    for f in sorted(set(py_files) - set(ours_files)):
        lines.append(f"files: only DeepSpeed's tag folder has {f}")
    for f in sorted(set(ours_files) - set(py_files)):
        lines.append(f"files: only our tag folder has {f}")
    if "latest" in root_ours and "latest" in root_py:
        a = open(os.path.join(case_dir, "latest")).read()
        b = open(os.path.join(out_dir, "latest")).read()
        if a.strip() != TAG:
            lines.append(f"latest: ours reads {a!r} (DeepSpeed writes the tag, here {b!r})")
    # Values that legitimately differ: the tag, versions, configs (torch_adam), paths.
    ignore = (r"^\['ds_version'\]", r"\['ds_version'\]$", r"^\['ds_config'\]")
    for f in sorted(set(py_files) & set(ours_files)):
        if not f.endswith(".pt"):
            continue
        a = load_pt(os.path.join(ours_dir, f))
        b = load_pt(os.path.join(py_dir, f))
        flines = []
        compare_structures(describe(a), describe(b), f, flines, ignore_value_paths=ignore)
        # The versions and configs, shown once.
        if isinstance(a, dict) and isinstance(b, dict):
            for k in ("ds_version", ):
                if a.get(k) != b.get(k):
                    res.info(f"d. {f}: ds_version ours {a.get(k)!r}, DeepSpeed's {b.get(k)!r} (informational)")
            if "ds_config" in a or "ds_config" in b:
                if a.get("ds_config") != b.get("ds_config"):
                    res.info(f"d. {f}: ds_config ours {a.get('ds_config')!r}, DeepSpeed's "
                             f"{b.get('ds_config')!r} (informational)")
        lines.extend(flines)
    return lines


def train_step(engine, rank, res, step_index, expected_steps_before):
    before = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
    steps_before = engine.global_steps
    if expected_steps_before is None:
        res.add("e. one training step from the loaded state", False,
                "load_checkpoint failed: not stepping from a half-loaded state")
        return
    if steps_before != expected_steps_before:
        res.add("e. one training step from the loaded state", False,
                f"global_steps is {steps_before} before the step, the checkpoint's is {expected_steps_before}")
    x, y = batch(rank, step_index)
    try:
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()
    except Exception:  # noqa: BLE001
        hint = ""
        if isinstance(getattr(engine.optimizer, "loss_scaler", None), dict):
            # DeepSpeed keeps the file's loss scaler as it is and calls methods on it.
            hint = ("\n    the ZeRO file's loss_scaler is a plain dict: write the checkpoint with "
                    "DS_CHECKPOINT_PYTHON_OBJECTS=1")
        res.add("e. one training step from the loaded state", False,
                "\n" + traceback.format_exc() + hint)
        return
    changed = sum(int(not torch.equal(before[n], p.detach())) for n, p in engine.module.named_parameters())
    ok = math.isfinite(loss.item()) and changed > 0 and engine.global_steps == steps_before + 1
    res.add("e. one training step from the loaded state", ok,
            f"loss {loss.item():.6f}, {changed}/{len(before)} parameters changed, "
            f"global_steps {steps_before} -> {engine.global_steps}, lr {engine.get_lr()}")


# ----------------------------------------------------------------------------------------------
# per rank


def build_engine(args, res):
    import deepspeed
    torch.manual_seed(1234)
    model = MoeNet()
    params = [{"params": list(model.parameters()), "name": "dense"}]
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
    groups = split_params_into_different_moe_groups_for_optimizer(params)
    engine, _, _, _ = deepspeed.initialize(model=model,
                                           model_parameters=groups,
                                           config=ds_config(args.stage, args.bf16, args.fused_adam))
    res.info(f"engine: optimizer {type(engine.optimizer).__name__}"
             f" (inner {type(getattr(engine.optimizer, 'optimizer', engine.optimizer)).__name__}),"
             f" param groups {[g.get('name') for g in engine.optimizer.param_groups]}")
    return engine


def run_rank(args):
    import deepspeed
    import datetime
    # A bounded timeout: a rank that fails a check must not leave the other hanging for 30 min.
    deepspeed.init_distributed(dist_backend="gloo", timeout=datetime.timedelta(seconds=240))
    rank = torch.distributed.get_rank()
    res = Results(rank)
    res.info(f"torch {torch.__version__}, deepspeed {deepspeed.__version__}, stage {args.stage}, "
             f"bf16 {args.bf16}, fused_adam {args.fused_adam}")
    try:
        engine = build_engine(args, res)
    except Exception:  # noqa: BLE001
        res.add("engine construction", False, "\n" + traceback.format_exc())
        return finish(res)

    if args.write_reference:
        for s in range(2):
            x, y = batch(rank, s)
            loss = engine(x, y)
            engine.backward(loss)
            engine.step()
        engine.save_checkpoint(args.write_reference, tag=TAG)
        res.add(f"wrote DeepSpeed reference checkpoint {args.write_reference}/{TAG}", True)
        return finish(res)

    case = args.case
    # a.
    try:
        load_path, client = engine.load_checkpoint(case, tag=TAG, load_optimizer_states=True,
                                                   load_lr_scheduler_states=True)
        ok = load_path is not None
        res.add("a. engine.load_checkpoint(case, tag='step2')", ok,
                f"load_path {load_path}, global_steps {engine.global_steps}, "
                f"lr_scheduler {engine.lr_scheduler.state_dict() if engine.lr_scheduler else None}, "
                f"client_state keys {sorted(client.keys()) if client else None}")
        loaded = ok
    except Exception:  # noqa: BLE001
        res.add("a. engine.load_checkpoint(case, tag='step2')", False, "\n" + traceback.format_exc())
        loaded = False
    torch.distributed.barrier()
    # b. (also after a failed load: shows what did land)
    try:
        check_module(engine, case, rank, res)
    except Exception:  # noqa: BLE001
        res.add("b. module parameters == checkpoint", False, "\n" + traceback.format_exc())
    # c.
    try:
        if args.stage in (1, 2):
            check_zero_optimizer(engine, case, rank, args.bf16, res)
        else:
            check_stage0_optimizer(engine, case, rank, args.bf16, res)
    except Exception:  # noqa: BLE001
        res.add("c. optimizer state", False, "\n" + traceback.format_exc())
    # c. by DeepSpeed's own accessors (collectives: every rank runs them in the same order)
    if args.stage in (1, 2) and loaded:
        try:
            # (safe_get_full_optimizer_state is not used: right after load_checkpoint DeepSpeed's
            # hp mappings have no optimizer fragments yet and it raises on some ranks only.)
            from deepspeed.utils import safe_get_full_fp32_param
            _, expected = module_expected(case, rank)
            bad = []
            for name, p in engine.module.named_parameters():
                full = safe_get_full_fp32_param(p)
                if full is None:
                    bad.append(f"{name}: no hp mapping")
                    continue
                d = tensor_diff(full.detach().cpu().to(p.dtype), expected[name].to(p.dtype))
                if d:
                    bad.append(f"{name}: fp32 master (to {p.dtype}) vs checkpoint: {d}")
            res.add("c. safe_get_full_fp32_param per parameter agrees with the checkpoint", not bad,
                    "; ".join(bad))
        except Exception:  # noqa: BLE001
            res.add("c. safe_get_full_fp32_param per parameter", False, "\n" + traceback.format_exc())
    torch.distributed.barrier()
    # d.
    out_dir = args.out_dir
    try:
        engine.save_checkpoint(out_dir, tag="py")
        torch.distributed.barrier()
        if rank == 0:
            lines = compare_saved(case, out_dir, res)
            # Layout differences that DeepSpeed's loader tolerates (torch.Size vs tuple, key
            # order, keys one side adds) are reported; differing tensors or values fail.
            values = [l for l in lines if ": tensor at " in l or ": value at " in l]
            for l in lines:
                if l not in values:
                    res.info(f"d. layout (informational): {l}")
            res.add("d. DeepSpeed's re-saved tensors and values equal our step2 files",
                    not values, ("\n    " + "\n    ".join(values)) if values else "")
    except Exception:  # noqa: BLE001
        res.add("d. save_checkpoint + compare", False, "\n" + traceback.format_exc())
    torch.distributed.barrier()
    # e.
    try:
        saved_steps = load_pt(os.path.join(case, TAG, "mp_rank_00_model_states.pt")).get("global_steps")
        train_step(engine, rank, res, 2, saved_steps if loaded else None)
    except Exception:  # noqa: BLE001
        res.add("e. one training step", False, "\n" + traceback.format_exc())
    return finish(res)


def finish(res):
    torch.distributed.barrier()
    everything = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(everything, res.items)
    failed = 0
    if res.rank == 0:
        print("\n==================== SUMMARY ====================", flush=True)
        for r, items in enumerate(everything):
            for name, ok, detail in items:
                first = detail.strip().splitlines()[0] if detail and detail.strip() else ""
                print(f"rank {r}: {'PASS' if ok else 'FAIL'}  {name}" +
                      (f"  [{first[:160]}]" if (not ok and first) else ""))
    failed = sum(1 for items in everything for _, ok, _ in items if not ok)
    if res.rank == 0:
        print(f"{'PASS' if failed == 0 else 'FAIL'}: {failed} failed check(s)", flush=True)
    torch.distributed.barrier()
    return 0 if failed == 0 else 1


# ----------------------------------------------------------------------------------------------
# launch


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("case", nargs="?", help="case folder holding step2/")
    ap.add_argument("--stage", type=int, default=None)
    ap.add_argument("--bf16", action="store_true", default=None)
    ap.add_argument("--fp32", dest="bf16", action="store_false")
    ap.add_argument("--fused-adam", action="store_true",
                    help="no torch_adam: DeepSpeed's FusedAdam (JIT-compiled on CPU)")
    ap.add_argument("--out-dir", default=None, help="where engine.save_checkpoint writes (default: a temp dir)")
    ap.add_argument("--write-reference", default=None, metavar="DIR")
    args = ap.parse_args(argv)
    name = os.path.basename(os.path.normpath(args.case or args.write_reference or ""))
    m = re.match(r"Zero(\d)(Fp32|Bf16)", name)
    if args.stage is None:
        if not m:
            ap.error("--stage is needed when the folder is not named Zero<S>Fp32/Zero<S>Bf16")
        args.stage = int(m.group(1))
    if args.bf16 is None:
        args.bf16 = bool(m and m.group(2) == "Bf16")
    if not args.case and not args.write_reference:
        ap.error("a case folder (or --write-reference DIR) is needed")
    if args.case and not os.path.isdir(os.path.join(args.case, TAG)):
        ap.error(f"{args.case}/{TAG} is not a folder")
    if args.out_dir is None:
        args.out_dir = tempfile.mkdtemp(prefix="ds_moe_interop_")
    return args


def _spawned(local_rank, args, port):
    os.environ.update(MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port),
                      RANK=str(local_rank),
                      LOCAL_RANK=str(local_rank),
                      WORLD_SIZE=str(WORLD),
                      LOCAL_WORLD_SIZE=str(WORLD))
    leave(run_rank(args))


def main():
    args = parse_args()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        leave(run_rank(args))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    import torch.multiprocessing as mp
    try:
        mp.spawn(_spawned, args=(args, port), nprocs=WORLD, join=True)
    except mp.ProcessExitedException as e:
        print(f"a rank failed: {e}", flush=True)
        sys.exit(1)
    sys.exit(0)


if __name__ == "__main__":
    main()
