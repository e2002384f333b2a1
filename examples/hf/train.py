#!/usr/bin/env python3
"""Trains a small randomly initialised Qwen3-MoE-shaped transformers model three times from the same
weights on the same batches, once per experts_implementation: "grouped_mm" (transformers' own),
"mxmoe" (mxmoe bf16) and "mxmoe_mxfp8", and writes the three loss curves:
<out>/curves.csv, <out>/curves.json and <out>/loss_curves.png.

    PYTHONPATH=python MXMOE_TORCH_LIBRARY=build/python/libmxmoe_torch.so \\
        python3 examples/hf/train.py --device cuda --steps 500 --out out/hf

The only line mxmoe needs in a transformers script is the import that registers it, then the name:

    import mxmoe_torch.hf
    model = AutoModelForCausalLM.from_config(config, experts_implementation="mxmoe_mxfp8", dtype=torch.bfloat16)

Text: byte-level (vocabulary 256) on local text, no download: the files given with --text, or the
standard-library sources examples/moe_lm/train.py uses (the last 10% of each file held out).
--checkpoint DIR instead starts every run from a local transformers checkpoint directory (weights
and tokenizer files; nothing is fetched), tokenized with its own tokenizer.

The whole model is bf16 (AdamW on bf16 parameters, as a plain bf16 fine-tune runs). The PNG is
drawn with matplotlib when it is installed, else by examples/moe_lm/png_chart.py (no dependencies).
Prints each run's final held-out loss and its gap to grouped_mm's.
"""

import argparse
import copy
import csv
import json
import math
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "moe_lm"))

import mxmoe_torch.hf  # noqa: E402,F401  (registers "mxmoe", "mxmoe_mxfp8", ...)
import transformers  # noqa: E402
from png_chart import write_line_chart  # noqa: E402
from train import batches, load_text, split_text  # noqa: E402  (examples/moe_lm/train.py)

IMPLEMENTATIONS = ["grouped_mm", "mxmoe", "mxmoe_mxfp8"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", default="out/hf")
    p.add_argument("--text", nargs="*", help="local text files (default: standard-library sources)")
    p.add_argument("--checkpoint", help="a local transformers checkpoint directory to start from")
    p.add_argument("--implementations", nargs="+", default=IMPLEMENTATIONS)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--log-every", type=int, default=25)
    # The random model's shape (Qwen3-MoE's layout at small sizes); ignored with --checkpoint.
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--experts", type=int, default=16)
    p.add_argument("--top-k", type=int, default=4)
    p.add_argument("--moe-ffn", type=int, default=256)
    return p.parse_args(argv)


def random_model(args):
    config = transformers.Qwen3MoeConfig(
        vocab_size=256, hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=max(1, args.heads // 4), head_dim=args.hidden // args.heads,
        intermediate_size=4 * args.hidden, moe_intermediate_size=args.moe_ffn, num_experts=args.experts,
        num_experts_per_tok=args.top_k, norm_topk_prob=True, max_position_embeddings=args.seq_len,
        pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(args.seed)
    return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)


def load_data(args):
    """(train tokens, held-out tokens, a description of the text) as int64 1-D tensors."""
    if args.text:
        parts = []
        for path in args.text:
            with open(path, "rb") as f:
                parts.append(f.read())
        files = [{"path": p, "bytes": len(d)} for p, d in zip(args.text, parts)]
    else:
        parts, files = load_text()
    if args.checkpoint:
        tokenizer = transformers.AutoTokenizer.from_pretrained(args.checkpoint, local_files_only=True)
        cut = [int(len(p) * 0.9) for p in parts]
        text = [b"\n".join(p[:c] for p, c in zip(parts, cut)), b"\n".join(p[c:] for p, c in zip(parts, cut))]
        ids = [torch.tensor(tokenizer(t.decode("utf-8", "replace"))["input_ids"]) for t in text]
        return ids[0], ids[1], files
    train, held_out = split_text(parts)
    return train, held_out, files


def train_one(initial, implementation, train_data, eval_data, args):
    """Loss per step and held-out loss per log point of one run from `initial`'s weights."""
    model = copy.deepcopy(initial).to(args.device)
    model.set_experts_implementation(implementation)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)

    def loss_of(x, y):
        logits = model(input_ids=x.to(args.device)).logits
        return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.to(args.device).flatten())

    def held_out():
        with torch.no_grad():
            return sum(loss_of(x, y).item() for x, y in eval_batches) / len(eval_batches)

    eval_batches = list(batches(eval_data, args.eval_batches, args.batch_size, args.seq_len, seed=args.seed + 1))
    losses, evals = [], []
    start = time.perf_counter()
    for step, (x, y) in enumerate(batches(train_data, args.steps, args.batch_size, args.seq_len, seed=args.seed)):
        for group in opt.param_groups:  # cosine decay to 10%
            group["lr"] = args.lr * (0.55 + 0.45 * math.cos(math.pi * step / max(args.steps, 1)))
        loss = loss_of(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        last = step == args.steps - 1
        if last or (args.log_every and step % args.log_every == 0):
            evals.append((step, held_out()))
            print(f"{implementation:>12} step {step:5d}  loss {losses[-1]:.4f}  held-out {evals[-1][1]:.4f}  "
                  f"{time.perf_counter() - start:.1f}s", flush=True)
    return {"train_loss": losses, "eval": evals, "seconds": time.perf_counter() - start}


def write_outputs(out, runs, meta):
    os.makedirs(out, exist_ok=True)
    names = list(runs)
    with open(os.path.join(out, "curves.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step"] + names)
        for step in range(len(runs[names[0]]["train_loss"])):
            w.writerow([step] + [f"{runs[n]['train_loss'][step]:.6f}" for n in names])
    with open(os.path.join(out, "curves.json"), "w") as f:
        json.dump({"meta": meta, "runs": runs}, f, indent=1)
    title = f"{meta['model']}: training loss per experts_implementation"
    path = os.path.join(out, "loss_curves.png")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        series = {n: (list(range(len(r["train_loss"]))), r["train_loss"]) for n, r in runs.items()}
        write_line_chart(path, series, title=title, x_label="step", y_label="loss")
        return
    fig, ax = plt.subplots(figsize=(9, 5.4))
    for n, r in runs.items():
        ax.plot(r["train_loss"], label=n, linewidth=1)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.legend()
    fig.savefig(path, dpi=100)


def main(argv=None):
    args = parse_args(argv)
    train_data, eval_data, files = load_data(args)
    if args.checkpoint:
        initial = transformers.AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=torch.bfloat16,
                                                                    local_files_only=True)
    else:
        initial = random_model(args)
    meta = {"model": type(initial).__name__, "config": initial.config.to_diff_dict(), "text": files,
            "args": vars(args), "torch": torch.__version__, "transformers": transformers.__version__,
            "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu"}
    mxmoe_torch.hf.check_model(initial, "mxmoe_mxfp8" if "mxmoe_mxfp8" in args.implementations else "mxmoe")
    runs = {n: train_one(initial, n, train_data, eval_data, args) for n in args.implementations}
    write_outputs(args.out, runs, meta)
    base = runs[args.implementations[0]]["eval"][-1][1]
    for n, r in runs.items():
        final = r["eval"][-1][1]
        print(f"{n:>12}: final held-out loss {final:.4f} ({(final - base) / base:+.2%} vs "
              f"{args.implementations[0]}), {r['seconds']:.1f}s")
    print(f"wrote {args.out}/curves.csv, curves.json, loss_curves.png")


if __name__ == "__main__":
    main()
