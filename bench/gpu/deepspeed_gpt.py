#!/usr/bin/env python3
"""DeepSpeed peer of train_gpt on one GPU: the example GPT (gpt_model.py) trained by the real
DeepSpeed (bench/gpu/make_bundle.sh carries its wheel), one process, no launcher. Prints a line
per step and a RESULT line (peer_common.report).

    python3 bench/gpu/deepspeed_gpt.py --size 1.3B --zero 2
    python3 bench/gpu/deepspeed_gpt.py --size 6.7B --zero 3 --offload cpu --steps 2 --warmup 1
    python3 bench/gpu/deepspeed_gpt.py --size 2.7B --zero 3 --offload nvme --nvme_path /tmp/swap

The ds_config (ds_configs.make, the one bench.py gives train_gpt; printed, and written with
--write_config) is bf16 with global-norm clipping at 1.0 and AdamW (lr --lr, betas 0.9/0.95,
eps 1e-8, weight decay 0.1):
  without offload: the optimizer is a client torch.optim.AdamW(fused=True) (a config
    optimizer would be DeepSpeed's FusedAdam, a JIT-built op). DeepSpeed then wraps it: ZeRO-0
    bf16 in its FP16_Optimizer with bf16 (fp32 master weights), ZeRO-1/2/3 in its ZeRO
    optimizers (fp32 master partitions).
  --offload cpu|nvme (ZeRO-3; --zero 2 with --offload cpu is ZeRO-Offload): the config's AdamW,
    which DeepSpeed builds as DeepSpeedCPUAdam; its op (cpu_adam), and async_io for nvme, are
    JIT-compiled on first use into $TORCH_EXTENSIONS_DIR. That time is measured apart and
    printed ("op build"). Under ZeRO-3 the model is built inside deepspeed.zero.Init
    (partitioned as it is built) and the tied wte.weight is registered as an external parameter
    of the model (its output projection uses it outside wte's forward).
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# One process, no launcher: what the launcher would set (setdefault: a launcher's values win).
for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                   ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29555")):
    os.environ.setdefault(key, value)

import torch  # noqa: E402

import ds_configs  # noqa: E402
from gpt_model import GPT2_VOCAB, GptModel  # noqa: E402
import peer_common  # noqa: E402

def ds_config(args):
    try:
        return ds_configs.make(args.zero, args.offload, args.micro_batch, args.lr, args.n_embd,
                               args.nvme_path, with_optimizer=args.offload != "none",
                               steps_per_print=10**6)
    except ValueError as e:
        peer_common.fail(str(e))


def build_ops(offload):
    """JIT-builds (or loads from $TORCH_EXTENSIONS_DIR) the ops this run needs; returns seconds."""
    if offload == "none":
        return 0.0
    from deepspeed.accelerator import get_accelerator
    names = ["CPUAdamBuilder"] + (["AsyncIOBuilder"] if offload == "nvme" else [])
    t0 = time.perf_counter()
    for name in names:
        builder = get_accelerator().create_op_builder(name)
        if name == "AsyncIOBuilder" and not builder.is_compatible(verbose=True):
            peer_common.fail("DeepSpeed's async_io op cannot build here (libaio missing: set "
                             "CFLAGS=-I<dir of libaio.h> LDFLAGS=-L<dir of libaio.so>)")
        builder.load()
    secs = time.perf_counter() - t0
    print(f"deepspeed_gpt: op build/load ({', '.join(names)}): {secs:.1f} s", flush=True)
    return secs


def main():
    p = peer_common.parser(__doc__.split("\n")[0])
    p.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=0)
    p.add_argument("--offload", choices=("none", "cpu", "nvme"), default="none")
    p.add_argument("--nvme_path", default="/tmp/ds_nvme_swap")
    p.add_argument("--write_config", default="", help="also write the ds_config here")
    p.add_argument("--build_ops_only", action="store_true",
                   help="only compile (or load) the ops --offload needs, then exit")
    args = peer_common.resolve_size(p.parse_args())
    import deepspeed  # after the environment above; slow, so after the argument check
    if args.build_ops_only:
        build_ops(args.offload)
        return
    device = peer_common.device_of(args)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    cfg = ds_config(args)
    print("deepspeed_gpt: ds_config " + json.dumps(cfg), flush=True)
    if args.write_config:
        with open(args.write_config, "w") as f:
            json.dump(cfg, f, indent=2)
    op_secs = build_ops(args.offload)
    deepspeed.init_distributed(dist_backend="nccl" if device.type == "cuda" else "gloo",
                               auto_mpi_discovery=False)
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    if args.zero == 3:
        with deepspeed.zero.Init(config_dict_or_path=cfg, dtype=torch.bfloat16):
            model = GptModel(args.n_layer, args.n_embd, args.n_head, args.seq_len,
                             attention=args.attention)
        deepspeed.zero.register_external_parameter(model, model.wte.weight)
    else:
        with device:
            model = GptModel(args.n_layer, args.n_embd, args.n_head, args.seq_len,
                             attention=args.attention)
    optimizer = None if args.offload != "none" else torch.optim.AdamW(
        model.parameters(), fused=device.type == "cuda", **dict(ds_configs.ADAMW, lr=args.lr))
    params = model.num_parameters()
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=cfg,
                                           model_parameters=model.parameters())
    init_secs = time.perf_counter() - t0
    print(f"deepspeed_gpt: {params / 1e6:.1f}M params, n_layer {args.n_layer} n_embd "
          f"{args.n_embd} n_head {args.n_head}, seq {args.seq_len} x micro-batch "
          f"{args.micro_batch}, ZeRO-{args.zero} offload {args.offload}, attention "
          f"{args.attention}, deepspeed {deepspeed.__version__}, torch {torch.__version__}; "
          f"model + initialize {init_secs:.1f} s", flush=True)

    def step(idx, targets):
        loss = engine(idx, targets)
        engine.backward(loss)
        engine.step()
        return loss

    gen = torch.Generator(device=device)
    gen.manual_seed(args.seed)
    times, losses = peer_common.timed_training(
        args, device, step, lambda: peer_common.random_batch(args, GPT2_VOCAB, device, gen))
    peer_common.report(args, "deepspeed", params, times, losses, device,
                       {"zero": args.zero, "offload": args.offload, "attention": args.attention,
                        "deepspeed": deepspeed.__version__, "op_build_s": op_secs,
                        "init_s": init_secs})


if __name__ == "__main__":
    main()
