#!/usr/bin/python3
"""PyTorch DDP peer of train_gpt: the same GPT, data and training step, in Python on Gloo.

Run one process per rank through our launcher (it sets RANK, WORLD_SIZE, MASTER_ADDR, ... and
appends --local_rank=N), with Debian's /usr/bin/python3 (python3-torch 1.13, the LibTorch build
train_gpt links):
    build/bin/deepspeed --num_gpus 2 /usr/bin/python3 bench/gpt_ddp/gpt_ddp.py --steps 30 \
        --deepspeed_config examples/train_gpt/ds_config.json --metrics_file peer.jsonl
Mirrors examples/train_gpt/{gpt_model.cpp,main.cpp} and the ZeRO-0 step of
src/runtime/engine.cpp; it does not measure anything itself beyond per-step wall time and RSS.
`--check_data` only checks the token cache against the text (no torch import, no ranks).
`--zero_redundancy` wraps AdamW in torch.distributed.optim.ZeroRedundancyOptimizer (PyTorch's
ZeRO stage-1 analogue: each rank keeps the optimizer state of its own share of the parameters);
the config must then say zero_optimization.stage 1 (bench/zero_stages/run.sh).
"""
import argparse
import hashlib
import json
import math
import os
import resource
import struct
import sys
import time

CACHE_MAGIC = b"DSTOKU16"
CACHE_VERSION = 1
CACHE_HEADER_BYTES = 96
MASK64 = (1 << 64) - 1


def parse_args():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # Same flags and defaults as train_gpt.
    p.add_argument("--deepspeed_config", default=os.path.join(root, "examples/train_gpt/ds_config.json"))
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--n_layer", type=int, default=4)
    p.add_argument("--n_head", type=int, default=4)
    p.add_argument("--n_embd", type=int, default=128)
    p.add_argument("--seq_len", type=int, default=128)
    p.add_argument("--vocab_size", type=int, default=50257)  # GPT-2's; train_gpt takes the tokenizer's
    p.add_argument("--data", default=os.path.join(root, "data/austen.txt"))
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--metrics_file", default="")
    p.add_argument("--eval_batches", type=int, default=8)
    p.add_argument("--val_fraction", type=float, default=0.05)
    p.add_argument("--local_rank", type=int, default=-1)  # appended by the launcher; RANK is used
    p.add_argument("--zero_redundancy", action="store_true",
                   help="shard AdamW's state with ZeroRedundancyOptimizer (needs a stage-1 config)")
    p.add_argument("--check_data", action="store_true",
                   help="exit 0 if <data>.gpt2.u16 matches <data>, 1 if missing or stale")
    return p.parse_args()


# ----------------------------------------------------------------------------------------------
# Data: the token cache train_gpt writes (examples/train_gpt/text/token_dataset.h) and its
# DistributedBatchSampler, reimplemented so both sides see the same windows in the same order.

def read_cache_header(path):
    with open(path, "rb") as f:
        h = f.read(CACHE_HEADER_BYTES)
    if len(h) != CACHE_HEADER_BYTES or h[:8] != CACHE_MAGIC:
        raise ValueError(f"{path}: not a deepspeed-cpp token cache (magic {h[:8]!r})")
    version, header_size, source_bytes, num_tokens = struct.unpack_from("<IIQQ", h, 8)
    if version != CACHE_VERSION or header_size != CACHE_HEADER_BYTES:
        raise ValueError(f"{path}: cache version {version} / header {header_size}; expected "
                         f"{CACHE_VERSION} / {CACHE_HEADER_BYTES}")
    return source_bytes, num_tokens, h[32:64]


def cache_is_current(text_path):
    """True when <text>.gpt2.u16 exists and was made from this exact text (size and SHA-256).
    The tokenizer-vocabulary hash in the header is not checked: only train_gpt knows it."""
    cache = text_path + ".gpt2.u16"
    if not os.path.exists(cache):
        return False
    try:
        source_bytes, num_tokens, source_sha = read_cache_header(cache)
    except ValueError:
        return False
    with open(text_path, "rb") as f:
        text = f.read()
    return (source_bytes == len(text) and source_sha == hashlib.sha256(text).digest()
            and os.path.getsize(cache) == CACHE_HEADER_BYTES + 2 * num_tokens)


def load_tokens(torch, text_path):
    cache = text_path + ".gpt2.u16"
    _, num_tokens, _ = read_cache_header(cache)
    with open(cache, "rb") as f:
        f.seek(CACHE_HEADER_BYTES)
        raw = bytearray(f.read())
    if len(raw) != 2 * num_tokens:
        raise ValueError(f"{cache}: header says {num_tokens} tokens, file holds {len(raw) // 2}")
    if sys.byteorder != "little":
        raw[0::2], raw[1::2] = raw[1::2], raw[0::2]
    # torch 1.13 has no uint16: read as int16 and undo the sign.
    return torch.frombuffer(raw, dtype=torch.int16).to(torch.int64) & 0xFFFF


def splitmix64_next(state):
    state = (state + 0x9E3779B97F4A7C15) & MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return state, z ^ (z >> 31)


def epoch_permutation(num_windows, seed, epoch):
    """DistributedBatchSampler::epoch_permutation: Fisher-Yates driven by splitmix64."""
    perm = list(range(num_windows))
    state = (seed ^ ((0x9E3779B97F4A7C15 * (epoch + 1)) & MASK64)) & MASK64
    for i in range(num_windows - 1, 0, -1):
        bound = i + 1
        threshold = ((1 << 64) - bound) % bound
        while True:
            state, r = splitmix64_next(state)
            if r >= threshold:
                break
        j = r % bound
        perm[i], perm[j] = perm[j], perm[i]
    return perm


class DistributedBatchSampler:
    """Rank r's k-th micro-batch of an epoch is perm[(k*micro + j)*world + r], j < micro."""

    def __init__(self, num_windows, micro, gas, world, rank, seed):
        self.num_windows, self.micro, self.world, self.rank, self.seed = num_windows, micro, world, rank, seed
        self.micro_per_epoch = (num_windows // (micro * gas * world)) * gas
        if self.micro_per_epoch == 0:
            raise ValueError(f"{num_windows} windows cannot fill one global batch of {micro * gas * world}")
        self.epoch, self.next_micro = 0, 0
        self.perm = epoch_permutation(num_windows, seed, 0)

    def next_micro_batch(self):
        if self.next_micro == self.micro_per_epoch:
            self.epoch, self.next_micro = self.epoch + 1, 0
            self.perm = epoch_permutation(self.num_windows, self.seed, self.epoch)
        k = self.next_micro
        self.next_micro += 1
        return [self.perm[(k * self.micro + j) * self.world + self.rank] for j in range(self.micro)]


def make_batch(torch, tokens, windows, seq_len):
    starts = torch.tensor(windows, dtype=torch.int64).mul_(seq_len).unsqueeze(1)
    idx = starts + torch.arange(seq_len, dtype=torch.int64)
    return tokens[idx], tokens[idx + 1]


# ----------------------------------------------------------------------------------------------
# Model: examples/train_gpt/gpt_model.cpp, module for module and in the same registration
# order, and GPT-2's init drawn in the same order (each block as it is built, the embeddings
# last), so the same seed gives train_gpt's weights bit for bit.

def build_model(torch, vocab_size, block_size, n_layer, n_head, n_embd):
    nn, F = torch.nn, torch.nn.functional

    class CausalSelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            assert n_embd % n_head == 0, f"n_embd ({n_embd}) must be divisible by n_head ({n_head})"
            self.c_attn = nn.Linear(n_embd, 3 * n_embd)
            self.c_proj = nn.Linear(n_embd, n_embd)
            # A plain attribute, not a buffer: DDP would broadcast a buffer every forward, and
            # Gloo cannot broadcast bool tensors (cpu-baselines.md §2.7).
            self.causal_mask = torch.ones(block_size, block_size, dtype=torch.bool).triu(1)

        def forward(self, x):
            B, T, C = x.shape
            hd = C // n_head
            q, k, v = self.c_attn(x).split(C, dim=2)
            q = q.view(B, T, n_head, hd).transpose(1, 2)
            k = k.view(B, T, n_head, hd).transpose(1, 2)
            v = v.view(B, T, n_head, hd).transpose(1, 2)
            att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
            att = att.masked_fill(self.causal_mask[:T, :T], float("-inf"))
            att = torch.softmax(att, -1)
            y = torch.matmul(att, v).transpose(1, 2).contiguous().view(B, T, C)
            return self.c_proj(y)

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc = nn.Linear(n_embd, 4 * n_embd)
            self.c_proj = nn.Linear(4 * n_embd, n_embd)

        def forward(self, x):
            return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))

    residual_std = 0.02 / math.sqrt(2.0 * n_layer)

    def init_gpt2_weights(module):  # gpt_model.cpp's init_gpt2_weights, in parameter order
        with torch.no_grad():
            for name, p in module.named_parameters():
                if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                    p.fill_(1.0)
                elif name.endswith("bias"):
                    p.zero_()
                elif name.endswith("c_proj.weight"):
                    p.normal_(0.0, residual_std)
                else:
                    p.normal_(0.0, 0.02)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(n_embd)
            self.attn = CausalSelfAttention()
            self.ln_2 = nn.LayerNorm(n_embd)
            self.mlp = Mlp()
            init_gpt2_weights(self)  # each block initializes itself, as BlockImpl's constructor

        def forward(self, x):
            y = x + self.attn(self.ln_1(x))
            return y + self.mlp(self.ln_2(y))

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(vocab_size, n_embd)
            self.wpe = nn.Embedding(block_size, n_embd)
            self.h = nn.ModuleList([Block() for _ in range(n_layer)])
            self.ln_f = nn.LayerNorm(n_embd)
            # The embeddings last, after the blocks (GptImpl's constructor).
            init_gpt2_weights(self.wte)
            init_gpt2_weights(self.wpe)

        def forward(self, idx, targets):
            T = idx.size(1)
            pos = torch.arange(T, dtype=torch.long)
            x = self.wte(idx) + self.wpe(pos)
            for block in self.h:
                x = block(x)
            x = self.ln_f(x)
            logits = torch.matmul(x, self.wte.weight.t())  # tied embeddings
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))

    return Gpt()


# ----------------------------------------------------------------------------------------------
# Training step settings from the same ds_config.json train_gpt reads.

def read_ds_config(path, world, zero_redundancy=False):
    with open(path) as f:
        cfg = json.load(f)
    micro = int(cfg.get("train_micro_batch_size_per_gpu", 1))
    gas = int(cfg.get("gradient_accumulation_steps", 1))
    if "train_batch_size" in cfg and cfg["train_batch_size"] != micro * gas * world:
        raise ValueError(f"{path}: train_batch_size {cfg['train_batch_size']} != {micro}*{gas}*{world}")
    opt = cfg.get("optimizer", {})
    if opt.get("type", "AdamW").lower() not in ("adam", "adamw"):
        raise ValueError(f"{path}: optimizer.type {opt.get('type')!r}; this peer runs Adam/AdamW only")
    op = opt.get("params", {})
    if opt.get("type", "AdamW").lower() == "adam" and op.get("adam_w_mode", True) is False:
        raise ValueError(f"{path}: adam_w_mode false (L2 Adam) is not mirrored by this peer")
    zero = cfg.get("zero_optimization", {}).get("stage", 0)
    if zero_redundancy and zero != 1:
        raise ValueError(f"{path}: zero_optimization.stage {zero}; --zero_redundancy "
                         "(ZeroRedundancyOptimizer) mirrors stage 1 only")
    if not zero_redundancy and zero != 0:
        raise ValueError(f"{path}: zero_optimization.stage {zero}; the DDP peer mirrors stage 0 only "
                         "(stage 1: --zero_redundancy)")
    sched = cfg.get("scheduler")
    if sched and sched.get("type") != "WarmupLR":
        raise ValueError(f"{path}: scheduler {sched.get('type')!r}; this peer mirrors WarmupLR only")
    betas = op.get("betas", [0.9, 0.999])
    # torch_autocast: forwards under torch.autocast, as DeepSpeed's engine runs them (its
    # default dtype on the CPU, as torch.autocast's, is bfloat16).
    amp = cfg.get("torch_autocast", {})
    if amp.get("enabled") and str(amp.get("dtype", "bfloat16")).replace("torch.", "") not in (
            "bfloat16", "bf16"):
        raise ValueError(f"{path}: torch_autocast.dtype {amp.get('dtype')!r}; this peer runs bf16")
    return {
        "micro": micro, "gas": gas,
        "lr": float(op.get("lr", 1e-3)), "betas": (float(betas[0]), float(betas[1])),
        "eps": float(op.get("eps", 1e-8)), "weight_decay": float(op.get("weight_decay", 0.01)),
        "clip": float(cfg.get("gradient_clipping", 0.0)),
        "print_every": int(cfg.get("steps_per_print", 10)),
        "sched": (sched or {}).get("params") if sched else None,
        "autocast": bool(amp.get("enabled", False)),
    }


def warmup_lr_fn(params, base_lr):
    """WarmupLR as src/runtime/optim/lr_schedules.cpp: lr(k), k = -1 at construction, +1 per step."""
    if params is None:
        return lambda k: base_lr
    lo = float(params.get("warmup_min_lr", 0.0))
    hi = float(params["warmup_max_lr"]) if params.get("warmup_max_lr") is not None else base_lr
    n = max(2, int(params.get("warmup_num_steps", 1000)))
    log_type = params.get("warmup_type", "log") == "log"

    def fn(k):
        if k < 0:
            g = 0.0
        elif k >= n:
            g = 1.0
        else:
            g = math.log(k + 1) / math.log(n) if log_type else k / n
        return lo + (hi - lo) * g
    return fn


def process_memory():
    """(VmRSS, VmHWM, ru_maxrss) in bytes. The peak is VmHWM from /proc/self/status, exactly what
    train_gpt reports (src/util/memory.cpp). ru_maxrss (KiB on Linux) is kept as a cross-check: it
    is the same high-water mark, except that it also covers the image this process exec'd from."""
    rss = hwm = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) * 1024
    return rss, hwm, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def tensor_bytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


def optimizer_state_bytes(torch, optimizer):
    """Bytes of the tensors in this rank's optimizer state (the local shard under ZeRO)."""
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer's local optimizer
    return tensor_bytes(v for st in inner.state.values() for v in st.values() if torch.is_tensor(v))


def mapped_blas():
    libs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            if "blas" in os.path.basename(path):
                libs.add(os.path.realpath(path))
    return ",".join(sorted(libs)) or "none"


def main():
    a = parse_args()
    if a.check_data:
        sys.exit(0 if cache_is_current(a.data) else 1)
    if not cache_is_current(a.data):
        sys.exit(f"gpt_ddp: {a.data}.gpt2.u16 is missing or stale; run train_gpt once "
                 f"(it tokenizes {a.data} and writes the cache)")

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")  # env://, from the launcher's MASTER_ADDR/PORT, RANK, ...
    rank, world = dist.get_rank(), dist.get_world_size()
    c = read_ds_config(a.deepspeed_config, world, a.zero_redundancy)
    micro, gas = c["micro"], c["gas"]

    tokens = load_tokens(torch, a.data)
    n_val = int(tokens.numel() * a.val_fraction)
    train, val = tokens[:tokens.numel() - n_val], tokens[tokens.numel() - n_val:]

    torch.manual_seed(a.seed)
    module = build_model(torch, a.vocab_size, a.seq_len, a.n_layer, a.n_head, a.n_embd)
    n_params = sum(p.numel() for p in module.parameters())
    model = torch.nn.parallel.DistributedDataParallel(module)  # default buckets; broadcasts rank 0
    adamw = dict(lr=c["lr"], betas=c["betas"], eps=c["eps"], weight_decay=c["weight_decay"])
    if a.zero_redundancy:
        # Default arguments: parameters assigned to ranks whole (greedy by size), updated shards
        # broadcast after each step; no overlap with DDP.
        from torch.distributed.optim import ZeroRedundancyOptimizer
        optimizer = ZeroRedundancyOptimizer(module.parameters(), optimizer_class=torch.optim.AdamW,
                                            **adamw)
    else:
        optimizer = torch.optim.AdamW(module.parameters(), **adamw)
    lr_fn = warmup_lr_fn(c["sched"], c["lr"])

    def set_lr(k):
        lr = lr_fn(k)
        for g in optimizer.param_groups:
            g["lr"] = lr
        return lr
    lr = set_lr(-1)

    sampler = DistributedBatchSampler((train.numel() - 1) // a.seq_len, micro, gas, world, rank, a.seed)
    tokens_per_step = micro * gas * world * a.seq_len
    if rank == 0:
        print(f"gpt_ddp: {a.data}: {tokens.numel()} tokens ({train.numel()} train, {val.numel()} held out), "
              f"{n_params} params, {world} ranks x micro-batch {micro} x accumulation {gas} = "
              f"{micro * gas * world} sequences of {a.seq_len} tokens per step")
        print(f"INFO gpt_ddp torch={torch.__version__} python={sys.version.split()[0]} "
              f"threads={torch.get_num_threads()} blas={mapped_blas()} "
              f"optimizer={'ZeroRedundancyOptimizer(AdamW)' if a.zero_redundancy else 'AdamW'}"
              f"{' autocast=bf16' if c['autocast'] else ''}")

    # torch_autocast in the config: every forward (training and held-out) under bf16 autocast.
    def forward_context():
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=c["autocast"])

    def held_out_loss():
        batches = min(a.eval_batches, ((val.numel() - 1) // a.seq_len) // (micro * world))
        module.eval()
        total = 0.0
        with torch.no_grad():
            for b in range(batches):
                windows = [(b * micro + j) * world + rank for j in range(micro)]
                x, y = make_batch(torch, val, windows, a.seq_len)
                with forward_context():
                    total += module(x, y).item()
        module.train()
        t = torch.tensor([total / batches], dtype=torch.float64)
        dist.all_reduce(t)
        return t.item() / world

    initial_val = held_out_loss()
    if rank == 0:
        print(f"step 0 | held-out loss {initial_val:.4f}")
    metrics = open(a.metrics_file, "w") if rank == 0 and a.metrics_file else None
    params = list(module.parameters())
    first_loss = None
    for step in range(1, a.steps + 1):
        t0 = time.perf_counter()
        loss_sum = 0.0
        for m in range(gas):
            x, y = make_batch(torch, train, sampler.next_micro_batch(), a.seq_len)
            boundary = m == gas - 1
            if boundary:
                with forward_context():
                    loss = model(x, y)
                (loss / gas if gas > 1 else loss).backward()
            else:
                with model.no_sync():
                    with forward_context():
                        loss = model(x, y)
                    (loss / gas if gas > 1 else loss).backward()
            loss_sum += loss.item()
        # Engine::step(): global norm, clip, optimizer, zero_grad (to None), scheduler.
        norm = torch.nn.utils.clip_grad_norm_(params, c["clip"]) if c["clip"] > 0 else None
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        lr_used = lr
        lr = set_lr(step - 1)
        secs = time.perf_counter() - t0

        # Outside the timed region, as in train_gpt: mean loss and every rank's memory.
        stats = torch.tensor([loss_sum / gas], dtype=torch.float64)
        dist.all_reduce(stats)
        mem = torch.tensor(process_memory(), dtype=torch.float64)
        all_mem = [torch.empty(3, dtype=torch.float64) for _ in range(world)]
        dist.all_gather(all_mem, mem)
        if step == 1:
            # AdamW allocates its state in the first step: report what each rank holds then.
            held = torch.tensor([tensor_bytes(params), optimizer_state_bytes(torch, optimizer)],
                                dtype=torch.float64)
            all_held = [torch.empty(2, dtype=torch.float64) for _ in range(world)]
            dist.all_gather(all_held, held)
            if rank == 0:
                kind = "ZeroRedundancyOptimizer" if a.zero_redundancy else "DDP"
                for r, h in enumerate(all_held):
                    print(f"gpt_ddp: memory after step 1 (rank {r}, {kind}): parameters "
                          f"{h[0].item() / 1e6:.2f} MB, optimizer states {h[1].item() / 1e6:.2f} MB")
        mean_loss = stats.item() / world
        if first_loss is None:
            first_loss = mean_loss
        if rank == 0 and (step % c["print_every"] == 0 or step == 1 or step == a.steps):
            print(f"step {step} | loss {mean_loss:.4f} | lr {lr:.3e} | tokens/s {tokens_per_step / secs:.0f} "
                  f"| step {secs:.3f} s | rss {mem[0].item() / 1048576.0:.0f} MiB")
        if metrics:
            row = {"step": step, "loss": mean_loss, "lr": lr, "lr_used": lr_used,
                   "samples": step * micro * gas * world, "tokens": step * tokens_per_step,
                   "tokens_per_s": tokens_per_step / secs, "step_time_s": secs,
                   "grad_norm": float(norm) if norm is not None else 0.0,
                   "rss_bytes": [int(t[0].item()) for t in all_mem],
                   "peak_rss_bytes": [int(t[1].item()) for t in all_mem],
                   "ru_maxrss_bytes": [int(t[2].item()) for t in all_mem]}
            metrics.write(json.dumps(row) + "\n")
            metrics.flush()

    final_val = held_out_loss()
    if rank == 0:
        print(f"gpt_ddp: done: {a.steps} steps | first training loss {first_loss:.4f} | "
              f"held-out loss {initial_val:.4f} -> {final_val:.4f}")
    if metrics:
        metrics.close()
    sys.stdout.flush()
    sys.stderr.flush()
    # Gloo teardown can hang (cpu-baselines.md §2.8): meet, then leave without destroying.
    dist.barrier()
    os._exit(0)


if __name__ == "__main__":
    main()
