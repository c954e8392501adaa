"""Reference outputs of transformers for the finetune_llama parity tests.

Loads a model with transformers (a .gguf through gguf_file=, dequantised by gguf-py, or a Hugging
Face folder) and writes one JSON object with what the C++ side is compared against:
  tokens:    the ids of each text in the JSON list --encode_json (default special-token handling)
  prompt_ids: the ids of --prompt
  logits:    [T, vocab] logits of the prompt (fp32, eager attention)
  generated: the --max_new_tokens greedy next tokens after the prompt (fewer after EOS)
  score:     mean next-token loss and token count over the first --seq_len tokens of --score_file
Produced with transformers 4.47.1, gguf 0.10.0, torch 1.13 (scripts/setup_python_refs.sh).
"""
import argparse
import json
import os

import torch
import transformers.generation.utils as generation_utils

# torch 1.13's torch.distributed.fsdp does not import on Python 3.11; generate() only asks
# whether the model is FSDP-managed, which it never is here.
generation_utils.is_fsdp_managed_module = lambda module: False

from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402


def load(model_path):
    kwargs = {}
    folder = model_path
    if os.path.isfile(model_path):
        folder, kwargs["gguf_file"] = os.path.split(os.path.abspath(model_path))
    tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(
        folder, torch_dtype=torch.float32, attn_implementation="eager", **kwargs)
    model.eval()
    return tokenizer, model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--encode_json", default="")
    ap.add_argument("--prompt", default="")
    ap.add_argument("--max_new_tokens", type=int, default=20)
    ap.add_argument("--score_file", default="")
    ap.add_argument("--seq_len", type=int, default=64)
    args = ap.parse_args()

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    tokenizer, model = load(args.model)
    out = {"tokens": []}
    if args.encode_json:
        with open(args.encode_json, encoding="utf-8") as f:
            out["tokens"] = [tokenizer(t).input_ids for t in json.load(f)]
    with torch.no_grad():
        if args.prompt:
            ids = tokenizer(args.prompt, return_tensors="pt").input_ids
            out["prompt_ids"] = ids[0].tolist()
            out["logits"] = model(ids).logits[0].tolist()
            # The router logits do not take part in generation; transformers 4.47's Mixtral
            # fails to take its load-balancing loss over a cached step's attention mask.
            extra = {"output_router_logits": False} if hasattr(
                model.config, "output_router_logits") else {}
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=args.max_new_tokens, **extra)
            out["generated"] = gen[0, ids.shape[1]:].tolist()
        if args.score_file:
            with open(args.score_file, encoding="utf-8") as f:
                ids = tokenizer(f.read()).input_ids[: args.seq_len]
            ids = torch.tensor([ids])
            loss = model(ids, labels=ids).loss.item()
            out["score"] = {"loss": loss, "tokens": ids.shape[1] - 1}
    with open(args.out, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
