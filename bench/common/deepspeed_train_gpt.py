#!/usr/bin/env python3
"""DeepSpeed peer of train_gpt on CPU: the same GPT, data and ds_config, trained by Python
DeepSpeed on Gloo, either data parallel under the config's ZeRO stage (0-3) or, with
--pipeline_parallel_size P > 1, by DeepSpeed's PipelineEngine.

Data parallel: the model is bench/gpt_ddp/gpt_ddp.py's twin of examples/train_gpt/gpt_model.cpp
(the same modules in the same order, so the same seed gives train_gpt's initial weights), handed
to deepspeed.initialize; under ZeRO-3 its tied wte.weight is registered as an external parameter
of the root module (the output projection uses it outside wte's forward).

Pipeline: a deepspeed.pipe.PipelineModule of the layers train_gpt's pipeline has
(examples/train_gpt/gpt_pipe.cpp): the token + position embedding, n_layer pre-LayerNorm
blocks (bench/gpu/gpt_model.py's Block, attention written out as on CPU), the final LayerNorm,
and the output projection tied to the embedding (TiedLayerSpec "embed"). The stages are cut as
train_gpt's are (--pipe_partition_method, default type:Block).

The token windows are train_gpt's: its token cache (<data>.gpt2.u16, written by train_gpt's
first run), --compact_vocab's renumbering, its train/held-out split and its
DistributedBatchSampler over the data-parallel replicas (bench/gpt_ddp/gpt_ddp.py). DeepSpeed
builds the optimizer from the ds_config (with `torch_adam: true` unless the config sets it:
torch.optim.AdamW, see main(); Muon as deepspeed-cpp runs it, deepspeed_muon_cpu.py).

One process per rank through our launcher, with a Python whose torch is Debian's python3-torch
(the LibTorch build train_gpt links) and deepspeed installed beside it (.venv-deepspeed, made by
scripts/setup_deepspeed_peer.sh):
    DS_ACCELERATOR=cpu build/bin/deepspeed --num_gpus 2 .venv-deepspeed/bin/python \\
        bench/common/deepspeed_train_gpt.py --deepspeed_config C --data data/austen.txt \\
        --compact_vocab --steps 20 --metrics_file peer.jsonl [--pipeline_parallel_size 2]
Writes one JSON row per step with train_gpt's keys (step, loss, lr, samples, tokens,
tokens_per_s, step_time_s, grad_norm, per-rank rss_bytes / peak_rss_bytes and
memory_bytes.rss / peak_rss, plus gpt_ddp.py's ru_maxrss_bytes), so the benches read every side
the same way. --load_dir resumes from a checkpoint (train_gpt's or DeepSpeed's) and goes on with
the windows train_gpt would read next; --save_dir saves one after the last step, or right away
when the checkpoint is at --steps already (tests/e2e/deepspeed_interop_test.cpp).
"""
import argparse
import json
import math
import os
import sys
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")
sys.dont_write_bytecode = True  # leave no __pycache__ in the source tree
here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "gpt_ddp"))
sys.path.insert(0, os.path.join(here, "..", "gpu"))

import deepspeed_shm  # noqa: E402  (this folder's) removes DeepSpeed's /dev/shm buffer
from deepspeed_muon_cpu import pin_muon  # noqa: E402  (this folder's)
import gpt_ddp  # noqa: E402  token cache, sampler, memory readings


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # train_gpt's flags and defaults, those the bench passes.
    p.add_argument("--deepspeed_config", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--steps", type=int, default=200, help="optimizer steps in all, as train_gpt")
    p.add_argument("--n_layer", type=int, default=4)
    p.add_argument("--n_head", type=int, default=4)
    p.add_argument("--n_embd", type=int, default=128)
    p.add_argument("--seq_len", type=int, default=128)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--val_fraction", type=float, default=0.05)
    p.add_argument("--compact_vocab", action="store_true")
    p.add_argument("--pipeline_parallel_size", type=int, default=1,
                   help="1: data parallel under the config's ZeRO stage")
    p.add_argument("--pipe_partition_method", default="type:Block")
    p.add_argument("--metrics_file", default="")
    p.add_argument("--load_dir", default="", help="resume from its latest checkpoint")
    p.add_argument("--save_dir", default="", help="save a checkpoint after the last step")
    p.add_argument("--local_rank", type=int, default=-1)  # appended by the launcher
    return p.parse_args()


def build_layers(vocab, a):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from deepspeed.pipe import LayerSpec, TiedLayerSpec
    from gpt_model import Block, GptEmbedding

    class GptEmbeddingPipe(nn.Module):  # train_gpt's GptEmbedding: wte(idx) + wpe(positions)
        def __init__(self):
            super().__init__()
            self.wte = GptEmbedding(vocab, a.n_embd)
            self.wpe = GptEmbedding(a.seq_len, a.n_embd)

        @property
        def weight(self):  # the tied weight: DeepSpeed's tied_weight_attr is a plain attribute
            return self.wte.weight

        def forward(self, idx):
            return self.wte(idx) + self.wpe(torch.arange(idx.size(1), dtype=torch.long))

    def head(module, x):
        return torch.matmul(x, module.weight.t())

    residual_std = 0.02 / math.sqrt(2.0 * a.n_layer)
    layers = [TiedLayerSpec("embed", GptEmbeddingPipe)]
    layers += [LayerSpec(Block, a.n_embd, a.n_head, residual_std, "manual")
               for _ in range(a.n_layer)]
    layers.append(LayerSpec(nn.LayerNorm, a.n_embd))
    layers.append(TiedLayerSpec("embed", GptEmbeddingPipe, forward_fn=head))

    def loss_fn(logits, labels):
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1))
    return layers, loss_fn


def fit_old_gloo(torch):
    """torch 1.13's Gloo has no _allgather_base, _reduce_scatter_base or reduce_scatter, yet
    DeepSpeed 0.15 calls the first two whenever torch.distributed defines them (ZeRO 1-3's flat
    all-gathers and reduce-scatters), and ZeRO-3 the third. Clearing its backend's picks makes
    DeepSpeed take its own fallbacks for older torch (list all-gathers, list reduce-scatter); the
    list reduce-scatter is then an all-reduce of which each rank keeps its chunk: the same sums,
    at twice a reduce-scatter's traffic (only ZeRO-3 calls it)."""
    if int(torch.__version__.split(".")[0]) >= 2:
        return
    import torch.distributed as dist
    from deepspeed.comm import comm
    backend = comm.cdb
    backend.all_gather_function = None
    backend.reduce_scatter_function = None

    class Done:  # what an async_op caller waits on
        def wait(self):
            return True

        def is_completed(self):
            return True

    def reduce_scatter(output, input_list, op=dist.ReduceOp.SUM, group=None, async_op=False):
        full = torch.cat([t.reshape(-1) for t in input_list])
        dist.all_reduce(full, op=backend._reduce_op(op), group=group)
        start = sum(t.numel() for t in input_list[:dist.get_rank(group)])
        output.copy_(full[start:start + output.numel()].view_as(output))
        return Done() if async_op else None
    backend.reduce_scatter = reduce_scatter

    # Without all_gather_function DeepSpeed's all_gather_into_tensor does nothing at all (and
    # returns None): deepspeed.sequence's cross-entropy would read uninitialized memory. A list
    # all-gather does the same job.
    def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
        parts = [torch.empty_like(input_tensor) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, input_tensor.contiguous(), group=group)
        output_tensor.copy_(torch.cat([t.reshape(-1) for t in parts]).view_as(output_tensor))
        return Done() if async_op else None
    backend.all_gather_into_tensor = all_gather_into_tensor

    # MiCS gathers its shards with all_gather_coalesced: on torch 1.13 a flat all-gather per
    # tensor inside a coalescing manager, which Gloo refuses. The list all-gathers above instead.
    def all_gather_coalesced(output_tensors, input_tensors, group=None, async_op=False):
        for output, input in zip(output_tensors, input_tensors):
            all_gather_into_tensor(output, input, group=group)
        return Done() if async_op else None
    backend.all_gather_coalesced = all_gather_coalesced


class SequenceParallelMpu:
    """DeepSpeed-Ulysses' groups as Megatron-DeepSpeed's mpu gives them to DeepSpeed (and as
    train_gpt's engine builds them from sequence_parallel_size): consecutive ranks share each
    sample; the data-parallel replicas are the ranks at the same position of their group; ZeRO
    and the gradient reduction span every rank (sequence-data-parallel group)."""

    def __init__(self, dist, sp):
        world, rank = dist.get_world_size(), dist.get_rank()
        self.sp_group = self.dp_group = None
        for first in range(0, world, sp):  # every rank makes every group, in the same order
            g = dist.new_group(list(range(first, first + sp)))
            if first <= rank < first + sp:
                self.sp_group = g
        for pos in range(sp):
            g = dist.new_group(list(range(pos, world, sp)))
            if rank % sp == pos:
                self.dp_group = g
        self.seq_dp_group = dist.new_group(list(range(world)))
        for r in range(world):  # no model parallelism: a group of each rank alone
            g = dist.new_group([r])
            if r == rank:
                self.mp_group = g
        self.dist = dist

    def get_sequence_parallel_group(self):
        return self.sp_group

    def get_sequence_parallel_world_size(self):
        return self.dist.get_world_size(self.sp_group)

    def get_sequence_parallel_rank(self):
        return self.dist.get_rank(self.sp_group)

    def get_sequence_data_parallel_group(self):
        return self.seq_dp_group

    def get_sequence_data_parallel_world_size(self):
        return self.dist.get_world_size(self.seq_dp_group)

    def get_sequence_data_parallel_rank(self):
        return self.dist.get_rank(self.seq_dp_group)

    def get_data_parallel_group(self):
        return self.dp_group

    def get_data_parallel_world_size(self):
        return self.dist.get_world_size(self.dp_group)

    def get_data_parallel_rank(self):
        return self.dist.get_rank(self.dp_group)

    def get_model_parallel_group(self):
        return self.mp_group

    def get_model_parallel_world_size(self):
        return 1

    def get_model_parallel_rank(self):
        return 0


def fit_mics_load():
    """DeepSpeed's engine passes param_shapes= to its ZeRO-3 optimizer's load_state_dict, which
    MiCS_Optimizer's override does not take (0.15.4, and its main branch): no MiCS checkpoint
    resumes, DeepSpeed's own included. The override only forwards to ZeRO-3's; this drops the
    argument as that forwarding does."""
    import inspect
    try:
        from deepspeed.runtime.zero.mics import MiCS_Optimizer
    except ImportError:  # a DeepSpeed build without MiCS
        return
    original = MiCS_Optimizer.load_state_dict
    if "param_shapes" in inspect.signature(original).parameters:
        return

    def load_state_dict(self, state_dict_list, *args, param_shapes=None, **kwargs):
        return original(self, state_dict_list, *args, **kwargs)
    MiCS_Optimizer.load_state_dict = load_state_dict


def use_ulysses(torch, module, sp_group, n_head):
    """Makes gpt_ddp's GPT train with DeepSpeed-Ulysses, as train_gpt's GptImpl does: each rank
    keeps its chunk of the tokens, attention runs through deepspeed.sequence's
    DistributedAttention (heads scattered, the sequence gathered, [b, s, h, d]) and the loss is
    vocab_sequence_parallel_cross_entropy's mean over the whole sequence."""
    import math
    import deepspeed.comm as ds_dist
    from deepspeed.sequence.cross_entropy import vocab_sequence_parallel_cross_entropy
    from deepspeed.sequence.layer import DistributedAttention
    sp, sp_rank = ds_dist.get_world_size(sp_group), ds_dist.get_rank(sp_group)

    def local_attention(q, k, v, *args, **kwargs):  # [b, S, h/P, d], the explicit formula
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        T, hd = q.size(2), q.size(3)
        att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)
        att = torch.softmax(att.masked_fill(mask, float("-inf")), -1)
        return torch.matmul(att, v).transpose(1, 2)

    dist_attn = DistributedAttention(local_attention, sp_group, scatter_idx=2, gather_idx=1)

    def attn_forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        shape = (B, T, n_head, C // n_head)
        y = dist_attn(q.view(shape), k.view(shape), v.view(shape), 0)
        return self.c_proj(y.contiguous().view(B, T, C))

    for block in module.h:
        block.attn.forward = attn_forward.__get__(block.attn)

    def gpt_forward(self, idx, targets):
        T = idx.size(1) // sp
        idx, targets = (t[:, sp_rank * T:(sp_rank + 1) * T] for t in (idx, targets))
        x = self.wte(idx) + self.wpe(torch.arange(sp_rank * T, (sp_rank + 1) * T,
                                                  dtype=torch.long))
        for block in self.h:
            x = block(x)
        logits = torch.matmul(self.ln_f(x), self.wte.weight.t())
        return vocab_sequence_parallel_cross_entropy(
            logits.transpose(0, 1).contiguous(), targets.transpose(0, 1).contiguous(),
            sp_group).mean()
    module.forward = gpt_forward.__get__(module)


def build_engine(deepspeed, torch, vocab, a, config):
    """(engine, data-parallel size, data-parallel rank)."""
    import torch.distributed as dist
    sp = int(config.get("sequence_parallel_size", 1))
    if sp > 1:
        mpu = SequenceParallelMpu(dist, sp)
        module = gpt_ddp.build_model(torch, vocab, a.seq_len, a.n_layer, a.n_head, a.n_embd)
        use_ulysses(torch, module, mpu.sp_group, a.n_head)
        engine, _, _, _ = deepspeed.initialize(
            model=module, model_parameters=[p for p in module.parameters() if p.requires_grad],
            config=config, mpu=mpu)
        return engine, mpu.get_data_parallel_world_size(), mpu.get_data_parallel_rank()
    if a.pipeline_parallel_size > 1:
        from deepspeed.pipe import PipelineModule
        layers, loss_fn = build_layers(vocab, a)
        module = PipelineModule(layers=layers, num_stages=a.pipeline_parallel_size,
                                loss_fn=loss_fn, partition_method=a.pipe_partition_method)
    else:
        module = gpt_ddp.build_model(torch, vocab, a.seq_len, a.n_layer, a.n_head, a.n_embd)
        if config.get("zero_optimization", {}).get("stage", 0) == 3:
            deepspeed.zero.register_external_parameter(module, module.wte.weight)
    engine, _, _, _ = deepspeed.initialize(
        model=module, model_parameters=[p for p in module.parameters() if p.requires_grad],
        config=config)
    if a.pipeline_parallel_size > 1:
        return engine, engine.grid.get_data_parallel_world_size(), \
            engine.grid.get_data_parallel_rank()
    return engine, dist.get_world_size(), dist.get_rank()


def main():
    a = parse_args()
    if not gpt_ddp.cache_is_current(a.data):
        sys.exit(f"deepspeed_train_gpt: {a.data}.gpt2.u16 is missing or stale; run train_gpt once "
                 f"(it tokenizes {a.data} and writes the cache)")
    import torch
    import torch.distributed as dist
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    deepspeed_shm.unlink_own_buffer_at_exit()
    fit_old_gloo(torch)
    fit_mics_load()
    rank, world = dist.get_rank(), dist.get_world_size()
    with open(a.deepspeed_config) as f:
        config = json.load(f)
    # torch.optim.AdamW: DeepSpeed's FusedAdam is a JIT-compiled op on CPU, and its source needs
    # C++17 where torch 1.13 compiles extensions as C++14. A config that sets torch_adam false
    # keeps DeepSpeed's choice (with offload_optimizer: DeepSpeedCPUAdam, which 16-bit master
    # weights require).
    config.setdefault("optimizer", {}).setdefault("params", {}).setdefault("torch_adam", True)
    if config["optimizer"].get("type", "").lower() == "muon":
        pin_muon(torch)

    tokens = gpt_ddp.load_tokens(torch, a.data)
    vocab = 50257
    if a.compact_vocab:  # train_gpt's compact_vocabulary: distinct ids in ascending order
        ids = torch.unique(tokens)
        tokens, vocab = torch.searchsorted(ids, tokens), ids.numel()
    n_val = int(tokens.numel() * a.val_fraction)
    train = tokens[:tokens.numel() - n_val]

    torch.manual_seed(a.seed)
    engine, replicas, replica = build_engine(deepspeed, torch, vocab, a, config)
    micro, gas = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    sampler = gpt_ddp.DistributedBatchSampler((train.numel() - 1) // a.seq_len, micro, gas,
                                              replicas, replica, a.seed)

    class Batches:  # DeepSpeed's data_iter: (inputs, labels) per micro-batch
        def __iter__(self):
            return self

        def __next__(self):
            return gpt_ddp.make_batch(torch, train, sampler.next_micro_batch(), a.seq_len)

    data = Batches()

    def train_batch():
        """One optimizer step: its loss tensor (the pipeline's is averaged over the data-parallel
        replicas already; data parallelism returns this rank's mean, see mean_loss)."""
        if a.pipeline_parallel_size > 1:
            return engine.train_batch(data_iter=data)
        total = 0.0
        for _ in range(gas):
            x, y = next(data)
            loss = engine(x, y)
            engine.backward(loss)
            engine.step()
            total += loss.item()
        return torch.tensor([total / gas], dtype=torch.float64)

    def mean_loss(loss):  # outside the timed region, as train_gpt's
        if a.pipeline_parallel_size == 1:
            dist.all_reduce(loss)
            loss /= world
        return loss.item()

    if a.load_dir:
        path, _ = engine.load_checkpoint(a.load_dir)
        if path is None:
            sys.exit(f"deepspeed_train_gpt: no checkpoint to load in {a.load_dir}")
        for _ in range(engine.global_steps * gas):  # the windows the loaded steps consumed
            sampler.next_micro_batch()
    tokens_per_step = micro * gas * replicas * a.seq_len
    if rank == 0:
        print(f"deepspeed_train_gpt: deepspeed {deepspeed.__version__}, torch {torch.__version__}, "
              f"{world} ranks = {a.pipeline_parallel_size} stages x {replicas} data-parallel, "
              f"ZeRO-{engine.zero_optimization_stage()}, "
              f"micro-batch {micro} x accumulation {gas}, vocabulary {vocab}, "
              f"blas={gpt_ddp.mapped_blas()}", flush=True)
    metrics = open(a.metrics_file, "w") if rank == 0 and a.metrics_file else None
    for step in range(engine.global_steps + 1, a.steps + 1):
        t0 = time.perf_counter()
        loss = train_batch()
        secs = time.perf_counter() - t0
        loss = mean_loss(loss)
        mem = torch.tensor(gpt_ddp.process_memory(), dtype=torch.float64)
        all_mem = [torch.empty(3, dtype=torch.float64) for _ in range(world)]
        dist.all_gather(all_mem, mem)
        if rank == 0:
            print(f"step {step} | loss {loss:.4f} | tokens/s {tokens_per_step / secs:.0f} "
                  f"| step {secs:.3f} s", flush=True)
        if metrics:
            rss, peak = [int(t[0].item()) for t in all_mem], [int(t[1].item()) for t in all_mem]
            norm = engine.get_global_grad_norm()  # None where the engine keeps none
            row = {"step": step, "loss": loss, "lr": engine.get_lr()[0],
                   "grad_norm": None if norm is None else float(norm),
                   "samples": step * micro * gas * replicas, "tokens": step * tokens_per_step,
                   "tokens_per_s": tokens_per_step / secs, "step_time_s": secs,
                   "memory_bytes": {"rss": rss, "peak_rss": peak},
                   "rss_bytes": rss, "peak_rss_bytes": peak,
                   "ru_maxrss_bytes": [int(t[2].item()) for t in all_mem]}
            metrics.write(json.dumps(row) + "\n")
            metrics.flush()
    if metrics:
        metrics.close()
    if a.save_dir:
        engine.save_checkpoint(a.save_dir)
    sys.stdout.flush()
    sys.stderr.flush()
    dist.barrier()  # Gloo teardown can hang (cpu-baselines.md): meet, then leave
    deepspeed_shm.unlink_own_buffer()
    os._exit(0)


if __name__ == "__main__":
    main()
