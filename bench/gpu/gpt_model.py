"""The example GPT of examples/train_gpt/gpt_model.cpp in PyTorch, for the GPU peers.

Same architecture, module for module: token + position embeddings (wpe has seq_len rows, as
train_gpt sets block_size = seq_len), pre-LayerNorm blocks (eps 1e-5, with bias), causal
attention, a GELU(tanh) MLP of 4x width, every Linear with a bias, a final LayerNorm, and the
output projection tied to wte. Dropout is 0 (train_gpt's default), so there is no dropout call.
GPT-2's init: N(0, 0.02), the residual projections (c_proj) N(0, 0.02/sqrt(2*n_layer)), biases
0, LayerNorms 1/0.

Attention, as ours (deepspeed::nn::causal_attention, include/deepspeed/causal_attention.h):
"sdpa" is F.scaled_dot_product_attention(is_causal=True), the fused kernel ours calls on CUDA
with LibTorch 2.x; "manual" writes it out (q@k^T scaled, masked_fill(-inf) above the diagonal,
softmax, @v), as ours does on CPU. The peers pick by device (peer_common, --attention auto).

Each Linear and Embedding initializes itself inside its own constructor: under DeepSpeed's
zero.Init a module's parameters are partitioned as soon as its constructor returns, so an init
loop in the parent would write into empty placeholders.

bench/gpt_ddp/gpt_ddp.py holds the CPU twin of this model (same init order, for bit-identical
weights with train_gpt on CPU); this one is device-aware and zero.Init-safe instead.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

GPT2_VOCAB = 50257  # train_gpt's vocabulary without --compact_vocab (the GPT-2 tokenizer's)

# Named model sizes (n_layer, n_embd, n_head) with GPT-2's vocabulary and seq_len 1024. The
# first two are GPT-3's "Medium" and "XL" shapes (Brown et al., table 2.1); heads are 64 to
# 128 wide. The counts are GptModel.num_parameters() at seq_len 1024 (wpe included).
SIZES = {
    "tiny": (2, 64, 2),
    "125M": (12, 768, 12),
    "350M": (24, 1024, 16),   # 354.8M
    "1.3B": (24, 2048, 16),   # 1.314B
    "2.7B": (32, 2560, 32),   # 2.649B
    "6.7B": (32, 4096, 32),   # 6.654B
    "13B": (40, 5120, 40),    # 12.85B
}


def num_parameters(n_layer, n_embd, vocab=GPT2_VOCAB, seq_len=1024):
    """The parameter count of GptModel (and of train_gpt's Gpt) without building it."""
    c = n_embd
    per_block = (3 * c * c + 3 * c) + (c * c + c) + (4 * c * c + 4 * c) + (4 * c * c + c) + 4 * c
    return vocab * c + seq_len * c + n_layer * per_block + 2 * c


def model_flops_per_token(params, n_layer, n_embd, seq_len):
    """train_gpt's model_flops_per_token (examples/train_gpt/main.cpp): 6 N for the matmuls of
    N parameters, the position embedding left out (a lookup), plus 12 L C T for attention's
    q@k^T and att@v (the non-causal count, as PaLM's appendix B and nanoGPT)."""
    n = params - seq_len * n_embd
    return 6.0 * n + 12.0 * n_layer * n_embd * seq_len


class GptLinear(nn.Linear):
    def __init__(self, n_in, n_out, std):
        super().__init__(n_in, n_out)
        with torch.no_grad():
            self.weight.normal_(0.0, std)
            self.bias.zero_()


class GptEmbedding(nn.Embedding):
    def __init__(self, rows, n_embd):
        super().__init__(rows, n_embd)
        with torch.no_grad():
            self.weight.normal_(0.0, 0.02)


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, residual_std, attention):
        super().__init__()
        assert n_embd % n_head == 0, f"n_embd ({n_embd}) must be divisible by n_head ({n_head})"
        self.n_head, self.attention = n_head, attention
        self.c_attn = GptLinear(n_embd, 3 * n_embd, 0.02)
        self.c_proj = GptLinear(n_embd, n_embd, residual_std)
        self._mask = None  # [T, T] bool, True above the diagonal; made on first use, on x's device

    def causal_mask(self, T, device):
        if self._mask is None or self._mask.size(0) < T or self._mask.device != device:
            self._mask = torch.ones(T, T, dtype=torch.bool, device=device).triu(1)
        return self._mask[:T, :T]

    def forward(self, x):
        B, T, C = x.shape
        hd = C // self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, hd).transpose(1, 2)  # [B, nh, T, hd]
        k = k.view(B, T, self.n_head, hd).transpose(1, 2)
        v = v.view(B, T, self.n_head, hd).transpose(1, 2)
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
            att = att.masked_fill(self.causal_mask(T, x.device), float("-inf"))
            y = torch.matmul(torch.softmax(att, -1), v)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Mlp(nn.Module):
    def __init__(self, n_embd, residual_std):
        super().__init__()
        self.c_fc = GptLinear(n_embd, 4 * n_embd, 0.02)
        self.c_proj = GptLinear(4 * n_embd, n_embd, residual_std)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, residual_std, attention):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, residual_std, attention)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = Mlp(n_embd, residual_std)

    def forward(self, x):
        y = x + self.attn(self.ln_1(x))
        return y + self.mlp(self.ln_2(y))


class GptModel(nn.Module):
    def __init__(self, n_layer, n_embd, n_head, seq_len, vocab=GPT2_VOCAB, attention="manual"):
        super().__init__()
        residual_std = 0.02 / math.sqrt(2.0 * n_layer)
        self.wte = GptEmbedding(vocab, n_embd)
        self.wpe = GptEmbedding(seq_len, n_embd)
        self.h = nn.ModuleList(
            [Block(n_embd, n_head, residual_std, attention) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)

    def forward(self, idx, targets):
        T = idx.size(1)
        pos = torch.arange(T, dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        logits = torch.matmul(x, self.wte.weight.t())  # tied embeddings, as ours
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))

    def num_parameters(self):
        # Under zero.Init a parameter's numel() is 0 here; ds_numel is its full size.
        return sum(getattr(p, "ds_numel", p.numel()) for p in self.parameters())
