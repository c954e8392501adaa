"""The ds_config of each GPU benchmark run, one source for both engines: bench.py writes it for
train_gpt, deepspeed_gpt.py hands it to deepspeed.initialize. Standard library only (bench.py
imports it without torch). Integers throughout: our parser reads sizes as integers.

bf16, global-norm clipping at 1.0, AdamW with betas 0.9/0.95, eps 1e-8, weight decay 0.1 (as
examples/train_gpt/ds_config.json), no LR schedule (a constant LR changes no cost), and ZeRO
`stage` with optional offload:
  cpu   offload_optimizer cpu (ZeRO-Offload); with stage 3 also offload_param cpu
  nvme  stage 3 only: offload_optimizer and offload_param nvme under nvme_path (ZeRO-Infinity)
`with_optimizer`: put AdamW in the config. train_gpt always needs it; DeepSpeed without offload
gets a client torch.optim.AdamW(fused=True) instead (deepspeed_gpt.py says why).
"""

GPT2_VOCAB = 50257
ADAMW = {"lr": 1e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}


def make(stage, offload="none", micro_batch=8, lr=1e-4, n_embd=1024, nvme_path="/tmp/ds_nvme",
         with_optimizer=True, steps_per_print=1, vocab=GPT2_VOCAB):
    if offload not in ("none", "cpu", "nvme"):
        raise ValueError(f"offload {offload!r}: none, cpu or nvme")
    if offload == "cpu" and stage not in (1, 2, 3):
        raise ValueError("offload cpu needs ZeRO stage 1, 2 or 3")
    if offload == "nvme" and stage != 3:
        raise ValueError("offload nvme needs ZeRO stage 3")
    zero = {"stage": stage}
    if stage == 3:
        zero.update({"stage3_max_live_parameters": 10**9, "stage3_prefetch_bucket_size": 5 * 10**7,
                     "stage3_param_persistence_threshold": 10**5})
    if offload == "cpu":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        if stage == 3:
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    elif offload == "nvme":
        # A parameter buffer must hold the largest parameter (wte: vocab x n_embd).
        zero["sub_group_size"] = 10**8
        zero["offload_optimizer"] = {"device": "nvme", "nvme_path": nvme_path, "pin_memory": True,
                                     "buffer_count": 4}
        zero["offload_param"] = {"device": "nvme", "nvme_path": nvme_path, "pin_memory": True,
                                 "buffer_count": 5, "buffer_size": max(10**8, vocab * n_embd),
                                 "max_in_cpu": 10**9}
    cfg = {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "bf16": {"enabled": True},
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": steps_per_print,
        "wall_clock_breakdown": False,
    }
    if with_optimizer:
        cfg["optimizer"] = {"type": "AdamW", "params": dict(ADAMW, lr=lr)}
    if offload == "nvme":
        cfg["aio"] = {"block_size": 1048576, "queue_depth": 8, "intra_op_parallelism": 1,
                      "single_submit": False, "overlap_events": True}
    return cfg
