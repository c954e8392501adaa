"""Python side of checkpoint_python_test: reads the files deepspeed-cpp writes the way Python
users (torch.load, DeepSpeed) read them, and writes files the way Python DeepSpeed does.

  check_values FILE                   values written by TorchFileInterop.PythonReadsOurValues
  check_checkpoint DIR TAG W          model states + optimizer files of a synthetic ZeRO-2 save
  check_consolidated PT ST EXPECTED   zero_to_fp32 outputs (.pt, .safetensors) vs expected .pt
  write_values FILE                   torch.save of values the C++ test checks
  write_zero2 DIR TAG W               a ZeRO-2 checkpoint laid out as DeepSpeed writes it, plus
                                      DIR/expected.pt with the full fp32 tensors
  check_engine_checkpoint DIR TAG W STAGE BF16
                                      every file an engine save wrote (and DIR/pytorch_model.bin)
                                      loads under the weights_only allowlist with DeepSpeed's
                                      keys; the fp32 partitions rebuild the module's weights
  check_universal DIR TP               ds_to_universal's output DIR: every zero/<param>/*.pt loads
                                      under weights_only as {"param": full tensor, ...}; fp32
                                      equals the TP ranks' module shards joined along cat_dim
  write_engine_zero2 DIR W            a Python-DeepSpeed ZeRO-2 checkpoint of a two-Linear model
                                      (fc1 4->8, fc2 8->2) with Adam state, plus DIR/expected.pt

Exits non-zero with a message on the first mismatch; prints OK otherwise. DeepSpeed itself is
not needed: its classes are replaced by stand-ins registered under DeepSpeed's module names.
"""
import collections
import dataclasses
import enum
import json
import math
import os
import pickle
import struct
import sys
import types

import torch

TORCH_MAJOR = int(torch.__version__.split(".")[0])

# --- stand-ins for DeepSpeed's pickled classes, under their real import paths ---------------


def _module(name):
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        sub = ".".join(parts[:i])
        if sub not in sys.modules:
            sys.modules[sub] = types.ModuleType(sub)
    return sys.modules[name]


class DynamicLossScaler:
    pass


class LossScaler:
    pass


class ZeroStageEnum(int, enum.Enum):
    disabled = 0
    optimizer_states = 1
    gradients = 2
    weights = 3


@dataclasses.dataclass
class fragment_address:
    numel: int
    start: int


for cls, mod in [(DynamicLossScaler, "deepspeed.runtime.fp16.loss_scaler"),
                 (LossScaler, "deepspeed.runtime.fp16.loss_scaler"),
                 (ZeroStageEnum, "deepspeed.runtime.zero.config"),
                 (fragment_address, "deepspeed.utils.tensor_fragment")]:
    cls.__module__ = mod
    setattr(_module(mod), cls.__name__, cls)

# --- torch.load with the weights_only allowlist of torch 2.x ----------------------------------
# torch 1.13's weights_only unpickler cannot read floats (no BINFLOAT) and its allowlist is the
# same, so files are checked against this restricted unpickler (plus real weights_only=True on
# files without floats, and on any file with torch >= 2).

_ALLOWED = {("collections", "OrderedDict"), ("torch", "Size"), ("torch", "Tensor"),
            ("torch._utils", "_rebuild_tensor_v2"), ("torch._utils", "_rebuild_parameter"),
            ("torch.nn.parameter", "Parameter")}
_ALLOWED |= {("torch", t.__name__) for t in torch._storage_classes if t.__module__ == "torch"}
_ALLOWED |= {("torch", str(d).split(".")[1]) for d in
             [torch.float16, torch.float32, torch.float64, torch.bfloat16, torch.int64]}


DEEPSPEED_CLASSES = {("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler"),
                     ("deepspeed.runtime.fp16.loss_scaler", "LossScaler"),
                     ("deepspeed.utils.tensor_fragment", "fragment_address")}


def restricted_load(path, extra=()):
    allowed = _ALLOWED | set(extra)

    class Restricted(pickle.Unpickler):
        def find_class(self, module, name):
            if (module, name) not in allowed:
                raise pickle.UnpicklingError(f"global {module}.{name} is not allowed")
            return super().find_class(module, name)

    module = types.SimpleNamespace(Unpickler=Restricted, load=pickle.load, __name__="restricted")
    return torch.load(path, pickle_module=module, weights_only=False)


def weights_only_load(path):
    return torch.load(path, weights_only=True)


def check(cond, what):
    if not cond:
        print("MISMATCH:", what)
        sys.exit(1)


# --- checks of our files ----------------------------------------------------------------------


def check_values(path):
    d = restricted_load(path)
    if TORCH_MAJOR >= 2:
        d2 = weights_only_load(path)
        check(list(d2.keys()) == list(d.keys()), "weights_only keys")
    check(list(d.keys()) == ["ints", "float", "flags", "text", "nested", "int_keys", "tuple",
                             "shape", "f32", "f16", "bf16", "i64", "b", "view", "tied_a",
                             "tied_b"], f"keys {list(d.keys())}")
    check(d["ints"] == [0, 255, 256, 65536, -1, 2**31, -2**31 - 1, 2**62], f"ints {d['ints']}")
    check(d["float"] == 0.1 and type(d["float"]) is float, "float")
    check(d["flags"] == [True, False, None], "flags")
    check(d["text"] == "h\u00e9llo", "unicode text")
    check(d["nested"] == {"a": {"b": [1, "two", 3.5]}}, f"nested {d['nested']}")
    check(d["int_keys"] == {0: "zero", 7: "seven"}, f"int keys {d['int_keys']}")
    check(d["tuple"] == (1, "x") and type(d["tuple"]) is tuple, "tuple")
    check(type(d["shape"]) is torch.Size and d["shape"] == torch.Size([3, 4]), "torch.Size")
    ref = torch.arange(12, dtype=torch.float64).reshape(3, 4) / 8 - 0.5
    for key, dtype in [("f32", torch.float32), ("f16", torch.float16), ("bf16", torch.bfloat16),
                       ("i64", torch.int64)]:
        t = d[key]
        check(t.dtype == dtype and t.shape == (3, 4), f"{key} dtype/shape {t.dtype} {t.shape}")
        check(torch.equal(t, (ref * 100 if dtype == torch.int64 else ref).to(dtype)), f"{key} values")
    check(torch.equal(d["b"], torch.tensor([True, False, True])), "bool tensor")
    check(torch.equal(d["view"], torch.arange(100, dtype=torch.float32)[10:15]), "view values")
    check(d["view"].storage().size() == 5, "view stored compactly")
    check(d["tied_a"] is d["tied_b"], "the same tensor twice loads as one object")
    print("OK")


def check_checkpoint(directory, tag, world):
    world = int(world)
    tag_dir = os.path.join(directory, tag)
    check(open(os.path.join(directory, "latest")).read() == tag, "latest holds the tag, no newline")
    path = os.path.join(tag_dir, "mp_rank_00_model_states.pt")
    m = restricted_load(path)
    m_weights_only = weights_only_load(path)  # no floats in it, so even torch 1.13 reads it
    check(list(m_weights_only.keys()) == list(m.keys()), "weights_only model states")
    check(list(m.keys()) == ["module", "buffer_names", "optimizer", "param_shapes",
                             "frozen_param_shapes", "shared_params", "frozen_param_fragments",
                             "lr_scheduler", "data_sampler", "random_ltd",
                             "sparse_tensor_module_names", "skipped_steps", "global_steps",
                             "global_samples", "dp_world_size", "mp_world_size",
                             "checkpoint_parallel_dimensions", "ds_config", "ds_version"],
          f"model state keys {list(m.keys())}")
    check(m["optimizer"] is None and m["lr_scheduler"] is None, "optimizer/lr_scheduler None")
    check(isinstance(m["sparse_tensor_module_names"], set), "sparse_tensor_module_names is a set")
    check(all(type(s) is torch.Size for g in m["param_shapes"] for s in g.values()),
          "param_shapes hold torch.Size")
    check(m["param_shapes"][0]["embed.weight"] == torch.Size([7, 5]), "embed shape")
    check(m["shared_params"] == {"head.weight": "embed.weight"}, "shared_params")
    check(m["buffer_names"] == ["norm.running_mean"], "buffer_names")
    check(m["dp_world_size"] == world and m["global_steps"] == 7, "counters")
    check(m["checkpoint_parallel_dimensions"] == {"pp_degree": 1, "tp_degree": 1}, "parallel dims")
    check(m["ds_config"]["zero_optimization"]["stage"] == 2, "ds_config")

    # DeepSpeed's own reconstruction rule (zero_to_fp32.py), written independently here.
    deepspeed_classes = DEEPSPEED_CLASSES
    partitions = []
    for r in range(world):
        o = restricted_load(os.path.join(tag_dir, f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt"),
                            deepspeed_classes)
        check(list(o.keys()) == ["optimizer_state_dict", "ds_config", "ds_version"], "optim keys")
        s = o["optimizer_state_dict"]
        check(s["zero_stage"] == 2 and s["zero_stage"] <= 2, "zero_stage")
        check(s["partition_count"] == [world, world], "partition_count")
        scaler = s["loss_scaler"]
        check(type(scaler) is DynamicLossScaler and scaler.cur_scale == 65536.0 and
              scaler.cur_hysteresis == 2 and scaler.dtype is torch.float16, "loss scaler object")
        check(all(type(a) is fragment_address for g in s["param_slice_mappings"] for a in g.values()),
              "param_slice_mappings hold fragment_address")
        check(s["base_optimizer_state"]["state"][0]["step"] == 3, "base optimizer state")
        partitions.append(s["single_partition_of_fp32_groups"])
    for g, shapes in enumerate(m["param_shapes"]):
        full = torch.cat([p[g] for p in partitions])
        offset = 0
        for name, shape in shapes.items():
            n = shape.numel()
            t = full.narrow(0, offset, n).view(shape)
            check(torch.equal(t, m["module"][name].float()), f"{name} rebuilt from partitions")
            offset += n
        align = 2 * world
        check(math.ceil(offset / align) == math.ceil(full.numel() / align), "padding alignment")
    print("OK")


def read_safetensors_by_hand(path):
    dtypes = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
              "I64": torch.int64}
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        t = torch.frombuffer(bytearray(body[begin:end]), dtype=dtypes[info["dtype"]])
        out[name] = t.reshape(info["shape"])
    return out


def check_consolidated(pt, st, expected_path):
    expected = weights_only_load(expected_path)
    got = weights_only_load(pt)  # tensors only: real weights_only=True, torch 1.13 included
    check(list(got.keys()) == list(expected.keys()), f"keys {list(got.keys())}")
    for name, t in expected.items():
        check(got[name].dtype == t.dtype and torch.equal(got[name], t), f"{name} in {pt}")
    if "head.weight" in got:
        check(got["head.weight"] is got["embed.weight"], "tied weights stay one tensor")
    readers = [("by hand", read_safetensors_by_hand)]
    try:
        from safetensors.torch import load_file
        readers.append(("safetensors", load_file))
    except ImportError:
        print("note: the safetensors package is not installed; checked by hand only")
    for how, reader in readers:
        s = reader(st)
        check(sorted(s.keys()) == sorted(expected.keys()), f"safetensors keys ({how})")
        for name, t in expected.items():
            check(torch.equal(s[name], t), f"{name} in {st} ({how})")
    print("OK")


# --- files written the Python way ---------------------------------------------------------------


def write_values(path):
    module = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    with torch.no_grad():
        for i, p in enumerate(module.parameters()):
            p.copy_(torch.arange(p.numel(), dtype=torch.float32).reshape(p.shape) + i)
    big = torch.arange(40, dtype=torch.float32)
    shared = torch.full((2, 2), 7.0)
    torch.save({
        "module": module.state_dict(),  # OrderedDict with _metadata
        "shape": torch.Size([2, 3]),
        "names": {"embed"},
        "numbers": [1.5, -2, 2**40, None, True],
        "int_keys": {3: "three"},
        "bf16": torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
        "f16": torch.tensor([0.25], dtype=torch.float16),
        "i64": torch.tensor([2**40, -1]),
        "bool": torch.tensor([True, False]),
        "transposed": torch.arange(6, dtype=torch.float32).reshape(2, 3).t(),
        "slice_a": big[5:10],   # views of one storage, stored once
        "slice_b": big[20:22],
        "tied_1": shared,
        "tied_2": shared,
        "scaler": _dynamic_scaler(1024.0),
        "stage": ZeroStageEnum.gradients,
        "fragment": fragment_address(numel=4, start=8),
    }, path)
    print("OK")


def _dynamic_scaler(scale):
    s = DynamicLossScaler()
    s.cur_scale, s.dynamic, s.cur_iter, s.last_overflow_iter = scale, True, 10, 3
    s.scale_factor, s.scale_window, s.min_scale = 2.0, 1000, 1.0
    s.delayed_shift, s.cur_hysteresis, s.consecutive_hysteresis = 2, 1, False
    s.raise_error_at_min_scale, s.dtype = True, torch.float16
    return s


def write_zero2(directory, tag, world):
    """A ZeRO-2 checkpoint as DeepSpeed's engine and stage_1_and_2.py write it (reference §6)."""
    world = int(world)
    gen = torch.Generator().manual_seed(0)
    groups = [collections.OrderedDict([("wte.weight", torch.randn(11, 4, generator=gen)),
                                       ("h.0.attn.weight", torch.randn(4, 4, generator=gen)),
                                       ("h.0.attn.bias", torch.randn(4, generator=gen))]),
              collections.OrderedDict([("ln_f.weight", torch.randn(4, generator=gen)),
                                       ("ln_f.bias", torch.randn(3, generator=gen))])]
    frozen = collections.OrderedDict([("pos.weight", torch.randn(3, 2, generator=gen).half())])
    buffers = collections.OrderedDict([("ln_f.running_mean", torch.randn(4, generator=gen))])
    tag_dir = os.path.join(directory, tag)
    os.makedirs(tag_dir, exist_ok=True)
    module = collections.OrderedDict()
    for g in groups:
        for name, t in g.items():
            module[name] = t.half()
    module.update(frozen)
    module.update(buffers)
    module._metadata = collections.OrderedDict([("", {"version": 1})])
    model_states = dict(
        module=module, buffer_names=list(buffers.keys()), optimizer=None,
        param_shapes=[collections.OrderedDict((n, t.shape) for n, t in g.items()) for g in groups],
        frozen_param_shapes=collections.OrderedDict((n, t.shape) for n, t in frozen.items()),
        shared_params={"lm_head.weight": "wte.weight"},
        frozen_param_fragments=collections.OrderedDict((n, t.clone()) for n, t in frozen.items()),
        lr_scheduler={"last_batch_iteration": 4}, data_sampler=None, random_ltd=None,
        sparse_tensor_module_names=set(), skipped_steps=0, global_steps=5, global_samples=40,
        dp_world_size=world, mp_world_size=1,
        checkpoint_parallel_dimensions={"pp_degree": 1, "tp_degree": 1},
        ds_config={"train_batch_size": 8, "fp16": {"enabled": True},
                   "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
                   "zero_optimization": {"stage": 2}},
        ds_version="0.19.6", my_client_key=[1, 2])
    torch.save(model_states, os.path.join(tag_dir, "mp_rank_00_model_states.pt"))
    for r in range(world):
        singles, paddings, mappings, state = [], [], [], {}
        for gi, g in enumerate(groups):
            flat = torch.cat([t.reshape(-1) for t in g.values()])
            align = 2 * world
            padded = math.ceil(flat.numel() / align) * align
            flat = torch.cat([flat, torch.zeros(padded - flat.numel())])
            part = padded // world
            mine = flat[r * part:(r + 1) * part]
            real = max(0, min(part, sum(t.numel() for t in g.values()) - r * part))
            singles.append(mine[:real].clone())
            paddings.append(part - real)
            mapping, offset = collections.OrderedDict(), 0
            for name, t in g.items():
                a, b = max(offset, r * part), min(offset + t.numel(), r * part + real)
                if a < b:
                    mapping[name] = fragment_address(numel=b - a, start=a - r * part)
                offset += t.numel()
            mappings.append(mapping)
            state[gi] = {"step": torch.tensor(5.0), "exp_avg": torch.zeros(part),
                         "exp_avg_sq": torch.zeros(part)}
        osd = {
            "loss_scaler": _dynamic_scaler(2.0 ** 14), "dynamic_loss_scale": True,
            "overflow": False, "clip_grad": 1.0,
            "base_optimizer_state": {"state": state, "param_groups": [
                {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0,
                 "params": [i]} for i in range(len(groups))]},
            "single_partition_of_fp32_groups": singles, "zero_stage": ZeroStageEnum.gradients,
            "group_paddings": paddings, "partition_count": [world] * len(groups),
            "ds_version": "0.19.6", "param_slice_mappings": mappings}
        torch.save({"optimizer_state_dict": osd, "ds_config": model_states["ds_config"],
                    "ds_version": "0.19.6"},
                   os.path.join(tag_dir, f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt"))
    with open(os.path.join(directory, "latest"), "w") as f:
        f.write(tag)
    expected = collections.OrderedDict((n, t.float()) for n, t in buffers.items())
    expected.update(frozen)
    for g in groups:
        expected.update(g)
    expected["lm_head.weight"] = expected["wte.weight"]
    torch.save(expected, os.path.join(directory, "expected.pt"))
    print("OK")


MODEL_STATE_KEYS = ["module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes",
                    "shared_params", "frozen_param_fragments", "lr_scheduler", "data_sampler",
                    "random_ltd", "sparse_tensor_module_names", "skipped_steps", "global_steps",
                    "global_samples", "dp_world_size", "mp_world_size",
                    "checkpoint_parallel_dimensions", "ds_config", "ds_version"]
OPTIM_KEYS = ["loss_scaler", "dynamic_loss_scale", "overflow", "clip_grad", "base_optimizer_state",
              "single_partition_of_fp32_groups", "zero_stage", "group_paddings", "partition_count",
              "ds_version", "param_slice_mappings"]


def check_engine_checkpoint(directory, tag, world, stage, bf16):
    world, stage, bf16 = int(world), int(stage), bf16 == "1"
    tag_dir = os.path.join(directory, tag)
    check(open(os.path.join(directory, "latest")).read() == tag, "latest")
    if stage == 3:
        check_engine_zero3(directory, tag_dir, world, bf16)
        return
    ms = restricted_load(os.path.join(tag_dir, "mp_rank_00_model_states.pt"))
    if TORCH_MAJOR >= 2:
        weights_only_load(os.path.join(tag_dir, "mp_rank_00_model_states.pt"))
    for key in MODEL_STATE_KEYS:
        check(key in ms, f"model states key {key}")
    check(ms["global_steps"] > 0 and ms["dp_world_size"] == world, "counters")
    check(len(ms["rng_state"]) == world and ms["rng_state"][0]["torch_rng_state"].dtype == torch.uint8,
          "rng states of every rank")
    module = ms["module"]
    if stage == 0:
        # DeepSpeed writes param_shapes None at stage 0; the engine lists the optimizer's
        # parameters there, group by group, for ds_to_universal.
        opt, groups = ms["optimizer"], ms["param_shapes"]
        check(opt is not None, "stage 0 optimizer")
        # 16-bit: FP16_Optimizer's dict (flat masters) or FP16_UnfusedOptimizer's (one master
        # per parameter), as DeepSpeed wraps the optimizer.
        wrapped = "fp32_groups_flat" in opt or "fp32_groups" in opt
        inner = opt["optimizer_state_dict"] if wrapped else opt
        check(isinstance(groups, list) and len(groups) == len(inner["param_groups"]),
              "stage 0 param_shapes: one entry per optimizer group")
        if "fp32_groups_flat" in opt:
            check([sum(s.numel() for s in g.values()) for g in groups] ==
                  [t.numel() for t in opt["fp32_groups_flat"]], "stage 0 param_shapes cut the flats")
        elif "fp32_groups" in opt:
            check([[s for s in g.values()] for g in groups] ==
                  [[t.shape for t in masters] for masters in opt["fp32_groups"]] and
                  [len(g) for g in groups] == [len(g["params"]) for g in inner["param_groups"]],
                  "stage 0 param_shapes name the per-parameter masters")
        else:
            check([len(g) for g in groups] == [len(g["params"]) for g in inner["param_groups"]]
                  and all(module[n].shape == s for g in groups for n, s in g.items()),
                  "stage 0 param_shapes name the optimizer's parameters")
        print("OK")
        return
    prefix = "bf16_" if bf16 else ""
    groups = ms["param_shapes"]
    partitions = [[] for _ in groups]
    for r in range(world):
        path = os.path.join(tag_dir, f"{prefix}zero_pp_rank_{r}_mp_rank_00_optim_states.pt")
        f = restricted_load(path)
        if TORCH_MAJOR >= 2:
            weights_only_load(path)
        check(sorted(f.keys()) == ["ds_config", "ds_version", "optimizer_state_dict"], f"{path} keys")
        osd = f["optimizer_state_dict"]
        for key in OPTIM_KEYS:
            check(key in osd, f"{path}: optimizer_state_dict key {key}")
        check(osd["zero_stage"] == stage, f"zero_stage {osd['zero_stage']}")
        check(list(osd["partition_count"]) == [world] * len(groups), "partition_count")
        for g, t in enumerate(osd["single_partition_of_fp32_groups"]):
            check(t.dtype == torch.float32, "fp32 partitions")
            partitions[g].append(t)
    # zero_to_fp32's rule: concatenate the ranks' partitions, cut by param_shapes in order; the
    # offsets rounded to 2 * world must agree.
    for g, shapes in enumerate(groups):
        full = torch.cat(partitions[g])
        offset = 0
        for name, shape in shapes.items():
            n = math.prod(shape)
            weight = full[offset:offset + n].view(shape)
            check(torch.equal(weight.to(module[name].dtype), module[name]),
                  f"{name}: fp32 partition differs from the module's weight")
            offset += n
        align = 2 * world
        check(math.ceil(offset / align) * align == math.ceil(full.numel() / align) * align,
              f"consumed {offset} of {full.numel()}")
    bin_path = os.path.join(directory, "pytorch_model.bin")
    if os.path.exists(bin_path):
        sd = restricted_load(bin_path)
        for name, t in sd.items():
            check(torch.equal(t, module[name]), f"16-bit model {name}")
    print("OK")


def check_engine_zero3(directory, tag_dir, world, bf16):
    """ZeRO-3: per-rank model states and optimizer files; zero_to_fp32's stage-3 rule (each
    parameter's ceil(numel/W) shard at the same offset of every rank's concatenated flats)
    rebuilds the weights that save_16bit_model gathered."""
    prefix = "bf16_" if bf16 else ""
    flats, shapes = [], None
    for r in range(world):
        path = os.path.join(tag_dir, f"zero_pp_rank_{r}_mp_rank_00_model_states.pt")
        ms = restricted_load(path)
        if TORCH_MAJOR >= 2:
            weights_only_load(path)
        for key in MODEL_STATE_KEYS:
            check(key in ms, f"{path}: key {key}")
        for name in ms["param_shapes"][0]:
            check(ms["module"][name].numel() == 0, f"{name} is a placeholder")
        shapes = ms["param_shapes"]
        opath = os.path.join(tag_dir, f"{prefix}zero_pp_rank_{r}_mp_rank_00_optim_states.pt")
        osd = restricted_load(opath)["optimizer_state_dict"]
        check(osd["zero_stage"] == 3 and osd["partition_count"] == world, f"{opath} stage/world")
        flats.append(torch.cat(list(osd["fp32_flat_groups"])))
    merged = collections.OrderedDict()
    for group in shapes:
        merged.update(group)
    full, offset = {}, 0
    for name, shape in merged.items():
        n = math.prod(shape)
        part = math.ceil(n / world)
        full[name] = torch.cat([f[offset:offset + part] for f in flats])[:n].view(shape)
        offset += part
    check(offset * world == world * flats[0].numel(), f"consumed {offset} of {flats[0].numel()}")
    sd = restricted_load(os.path.join(directory, "pytorch_model.bin"))
    for name, t in full.items():
        check(torch.equal(t.to(sd[name].dtype), sd[name]), f"zero_to_fp32 rule: {name} differs")
    print("OK")


def write_engine_zero2(directory, world):
    """DeepSpeed ZeRO-2 (fp32, torch Adam) files for fc1 = Linear(4, 8), fc2 = Linear(8, 2)."""
    world = int(world)
    gen = torch.Generator().manual_seed(7)
    params = collections.OrderedDict([("fc1.weight", torch.randn(8, 4, generator=gen)),
                                      ("fc1.bias", torch.randn(8, generator=gen)),
                                      ("fc2.weight", torch.randn(2, 8, generator=gen)),
                                      ("fc2.bias", torch.randn(2, generator=gen))])
    exp_avg = {n: torch.randn(t.shape, generator=gen) / 10 for n, t in params.items()}
    exp_avg_sq = {n: torch.rand(t.shape, generator=gen) / 100 for n, t in params.items()}
    tag_dir = os.path.join(directory, "global_step3")
    os.makedirs(tag_dir, exist_ok=True)
    cfg = {"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
           "zero_optimization": {"stage": 2}}
    torch.save(dict(module=collections.OrderedDict(params), buffer_names=[], optimizer=None,
                    param_shapes=[collections.OrderedDict((n, t.shape) for n, t in params.items())],
                    frozen_param_shapes=collections.OrderedDict(), shared_params={},
                    frozen_param_fragments=collections.OrderedDict(), lr_scheduler=None,
                    data_sampler=None, random_ltd=None, sparse_tensor_module_names=set(),
                    skipped_steps=0, global_steps=3, global_samples=24, dp_world_size=world,
                    mp_world_size=1, checkpoint_parallel_dimensions={"pp_degree": 1, "tp_degree": 1},
                    ds_config=cfg, ds_version="0.19.6"),
               os.path.join(tag_dir, "mp_rank_00_model_states.pt"))

    def flat(d):
        f = torch.cat([t.reshape(-1) for t in d.values()])
        padded = math.ceil(f.numel() / (2 * world)) * 2 * world
        return torch.cat([f, torch.zeros(padded - f.numel())]), f.numel()

    weights, numel = flat(params)
    m1, _ = flat(collections.OrderedDict((n, exp_avg[n]) for n in params))
    m2, _ = flat(collections.OrderedDict((n, exp_avg_sq[n]) for n in params))
    part = weights.numel() // world
    for r in range(world):
        real = max(0, min(part, numel - r * part))
        mapping, offset = collections.OrderedDict(), 0
        for name, t in params.items():
            a, b = max(offset, r * part), min(offset + t.numel(), r * part + real)
            if a < b:
                mapping[name] = fragment_address(numel=b - a, start=a - r * part)
            offset += t.numel()
        osd = {"loss_scaler": LossScaler(), "dynamic_loss_scale": False, "overflow": False,
               "clip_grad": 0.0,
               "base_optimizer_state": {
                   "state": {0: {"step": torch.tensor(3.0),
                                 "exp_avg": m1[r * part:(r + 1) * part].clone(),
                                 "exp_avg_sq": m2[r * part:(r + 1) * part].clone()}},
                   "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8,
                                     "weight_decay": 0.0, "amsgrad": False, "params": [0]}]},
               "single_partition_of_fp32_groups": [weights[r * part:r * part + real].clone()],
               "zero_stage": ZeroStageEnum.gradients, "group_paddings": [part - real],
               "partition_count": [world], "ds_version": "0.19.6",
               "param_slice_mappings": [mapping]}
        osd["loss_scaler"].__dict__.update(cur_scale=1.0, dynamic=False)
        torch.save({"optimizer_state_dict": osd, "ds_config": cfg, "ds_version": "0.19.6"},
                   os.path.join(tag_dir, f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt"))
    with open(os.path.join(directory, "latest"), "w") as f:
        f.write("global_step3")
    expected = collections.OrderedDict(params)
    for n in params:
        expected["exp_avg." + n] = exp_avg[n]
        expected["exp_avg_sq." + n] = exp_avg_sq[n]
    torch.save(expected, os.path.join(directory, "expected.pt"))
    print("OK")


def check_universal(directory, tp):
    tp = int(tp)
    mp = [restricted_load(os.path.join(directory, f"mp_rank_{m:02d}_model_states.pt"))["module"]
          for m in range(tp)]
    zero = os.path.join(directory, "zero")
    names = sorted(n for n in os.listdir(zero) if os.path.isdir(os.path.join(zero, n)))
    check(sorted(names) == sorted(mp[0].keys()), f"universal parameters {names}")
    for name in names:
        for key in ("fp32", "exp_avg", "exp_avg_sq", "step"):
            path = os.path.join(zero, name, key + ".pt")
            d = weights_only_load(path) if TORCH_MAJOR >= 2 else restricted_load(path)
            if key == "step":  # the bare count, as DeepSpeed's loader installs it
                check(torch.is_tensor(d) and d.dim() == 0 and float(d) == 2.0, f"{path}: step")
                continue
            check(isinstance(d, dict) and torch.is_tensor(d["param"]), f"{path}: param")
            if key != "fp32":
                continue
            if "cat_dim" in d:
                want = torch.cat([m[name] for m in mp], dim=d["cat_dim"])
            else:
                want = mp[0][name]
            check(d["param"].shape == want.shape and torch.equal(d["param"], want.float()),
                  f"{path}: fp32 {tuple(d['param'].shape)} vs joined shards {tuple(want.shape)}")
    state = restricted_load(os.path.join(zero, "optimizer_state.pt"), DEEPSPEED_CLASSES)
    check("param_groups" in state, "optimizer_state.pt param_groups")
    # DeepSpeed's universal load installs and calls the scaler, and asserts on ds_version.
    check(type(state["loss_scaler"]) in (LossScaler, DynamicLossScaler),
          f"optimizer_state.pt loss_scaler is {type(state['loss_scaler'])}")
    check(bool(state.get("ds_version")), "optimizer_state.pt ds_version")
    with open(os.path.join(os.path.dirname(directory.rstrip("/")), "latest_universal")) as f:
        check(f.read() == os.path.basename(directory.rstrip("/")), "latest_universal")
    print("OK")


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
