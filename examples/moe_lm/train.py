#!/usr/bin/env python3
"""Trains a small byte-level Mixture-of-Experts language model with mxmoe_torch.MoE, once with the
BF16 recipe and once with MXFP8 (same seed, same initial weights, same batches), and writes both loss
curves: <out>/curves.json and <out>/loss_curves.png.

    PYTHONPATH=python MXMOE_TORCH_LIBRARY=build/python/libmxmoe_torch.so \\
        python3 examples/moe_lm/train.py --device cuda --steps 600 --out out/moe_lm

(after `pip install --no-build-isolation .` neither variable is needed). The text is the source of a
fixed list of Python standard-library modules (TEXT_MODULES), read from the running Python's own
installation, so it needs no download and is the same on every run of one Python version (the
files differ between Python versions; curves.json records their names, sizes and SHA-256). The
last 10% of each file is held out: the final loss compared between the recipes is the mean loss
over a fixed set of held-out batches.

The model: byte embedding (256) + learned positions, `--layers` pre-norm transformer blocks of
causal self-attention and an MoE MLP (router fp32 softmax top-k with a load-balancing loss, the
experts in mxmoe's GroupedMLP), a final RMSNorm and a head tied to the embedding. Everything but the
experts is float32; the experts' weights are bf16 (mxmoe's layer), updated by AdamW.

Prints each run's final held-out loss and the relative gap (mxfp8 - bf16) / bf16. The PNG is drawn
with matplotlib when it is installed, else by png_chart.py beside this file (no dependencies).
"""

import argparse
import hashlib
import importlib.util
import json
import math
import os
import sys
import time

import torch
from torch import nn
from torch.nn import functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import mxmoe_torch  # noqa: E402
from png_chart import write_line_chart  # noqa: E402

# Pure-Python standard-library modules present in every CPython 3.9+ (Debian's libpython3.x-stdlib
# ships their .py sources): about 600 KB of real text, code with docstrings and comments.
TEXT_MODULES = ["argparse", "textwrap", "difflib", "fractions", "calendar", "string", "shlex", "inspect", "typing",
                "dataclasses"]
HELD_OUT = 0.1  # the last 10% of each file


def load_text(modules=TEXT_MODULES):
    """The source bytes of each of `modules` and a record of each file (name, path, bytes, sha256)."""
    parts, files = [], []
    for name in modules:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            raise SystemExit(f"train.py: the standard-library module {name!r} has no .py source here "
                             f"({spec.origin if spec else 'not found'})")
        with open(spec.origin, "rb") as f:
            data = f.read()
        parts.append(data)
        files.append({"module": name, "path": spec.origin, "bytes": len(data),
                      "sha256": hashlib.sha256(data).hexdigest()})
    return parts, files


def split_text(parts):
    """(train, held-out) byte tensors: the first 90% of every file, and the rest of every file."""
    cut = [int(len(p) * (1 - HELD_OUT)) for p in parts]
    train = b"\n".join(p[:c] for p, c in zip(parts, cut))
    held_out = b"\n".join(p[c:] for p, c in zip(parts, cut))
    return [torch.frombuffer(bytearray(t), dtype=torch.uint8).long() for t in (train, held_out)]


class Attention(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.proj = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x):
        B, S, H = x.shape
        q, k, v = self.qkv(x).view(B, S, 3, self.heads, H // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, S, H))


class Block(nn.Module):
    def __init__(self, args, recipe):
        super().__init__()
        self.norm1 = nn.RMSNorm(args.hidden)
        self.attn = Attention(args.hidden, args.heads)
        self.norm2 = nn.RMSNorm(args.hidden)
        self.moe = mxmoe_torch.MoE(args.hidden, args.ffn, args.experts, args.top_k, recipe=recipe,
                                   aux_loss_coef=args.aux_loss_coef, capacity_factor=args.capacity_factor)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.moe(self.norm2(x))


class MoELM(nn.Module):
    def __init__(self, args, recipe):
        super().__init__()
        self.embed = nn.Embedding(256, args.hidden)
        self.pos = nn.Embedding(args.seq_len, args.hidden)
        self.blocks = nn.ModuleList(Block(args, recipe) for _ in range(args.layers))
        self.norm = nn.RMSNorm(args.hidden)
        with torch.no_grad():
            # The tied head reads RMS-normalised states (rms 1): std 1/sqrt(H) gives logits of std ~1.
            self.embed.weight.normal_(0, 1 / math.sqrt(args.hidden))
            self.pos.weight.normal_(0, 0.02)
            for b in self.blocks:  # residual branches start small
                b.attn.proj.weight.mul_(1 / math.sqrt(2 * args.layers))
                b.moe.grouped_mlp.w2.mul_(1 / math.sqrt(2 * args.layers))

    def forward(self, tokens):
        """tokens [B, S] -> (logits [B, S, 256], the summed load-balancing loss)."""
        h = self.embed(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for b in self.blocks:
            h = b(h)
        logits = F.linear(self.norm(h), self.embed.weight)  # tied head
        aux = [b.moe.aux_loss for b in self.blocks if b.moe.aux_loss is not None]
        return logits, (sum(aux) if aux else torch.zeros((), device=tokens.device))


def batches(data, count, batch_size, seq_len, seed):
    """`count` batches of (input, target) windows [B, S] at positions from a seeded generator."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(count):
        starts = torch.randint(0, data.numel() - seq_len - 1, (batch_size,), generator=g)
        window = torch.stack([data[s:s + seq_len + 1] for s in starts.tolist()])
        yield window[:, :-1], window[:, 1:]


def lr_at(step, args):
    """Linear warm-up, then cosine decay to 10% of --lr."""
    warmup = min(args.warmup, args.steps // 10)
    if step < warmup:
        return args.lr * (step + 1) / warmup
    t = (step - warmup) / max(args.steps - warmup, 1)
    return args.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * t)))


@torch.no_grad()
def evaluate(model, val_batches, device):
    model.eval()
    total = 0.0
    for x, y in val_batches:
        logits, _ = model(x.to(device))
        total += F.cross_entropy(logits.float().flatten(0, 1), y.to(device).flatten()).item()
    model.train()
    return total / len(val_batches)


def train(recipe, args, train_data, val_batches):
    torch.manual_seed(args.seed)  # the same initial weights for every recipe
    model = MoELM(args, recipe).to(args.device)
    step_fn = torch.compile(model, backend=args.compile_backend) if args.compile else model
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    run = {"recipe": recipe, "steps": [], "train_loss": [], "aux_loss": [], "eval_steps": [], "eval_loss": []}
    start = time.time()
    for step, (x, y) in enumerate(batches(train_data, args.steps, args.batch_size, args.seq_len, args.seed + 1)):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args)
        logits, aux = step_fn(x.to(args.device))
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.to(args.device).flatten())
        opt.zero_grad(set_to_none=True)
        (loss + aux).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        run["steps"].append(step)
        run["train_loss"].append(loss.item())
        run["aux_loss"].append(aux.item())
        last = step == args.steps - 1
        if last or (args.eval_every and step % args.eval_every == 0 and step):
            run["eval_steps"].append(step)
            run["eval_loss"].append(evaluate(model, val_batches, args.device))
        if args.log_every and (step % args.log_every == 0 or last):
            print(f"[{recipe}] step {step:5d}  loss {loss.item():.4f}  aux {run['aux_loss'][-1]:.4f}  "
                  f"lr {lr_at(step, args):.2e}  {time.time() - start:6.1f}s", flush=True)
    run["seconds"] = time.time() - start
    run["final_eval_loss"] = run["eval_loss"][-1]
    tail = run["train_loss"][-max(1, args.steps // 10):]
    run["final_train_loss"] = sum(tail) / len(tail)  # mean over the last 10% of steps
    return run


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--out", default="out/moe_lm", help="folder for curves.json and loss_curves.png")
    p.add_argument("--recipes", default="bf16,mxfp8", help="comma-separated recipes to train, in order")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--hidden", type=int, default=128, help="a multiple of 32 (mxfp8)")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=128, help="a multiple of 32 (mxfp8)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--capacity-factor", type=float, default=None)
    p.add_argument("--aux-loss-coef", type=float, default=1e-2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--eval-every", type=int, default=50, help="0: evaluate at the end only")
    p.add_argument("--eval-batches", type=int, default=32)
    p.add_argument("--log-every", type=int, default=25, help="0: quiet")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--compile-backend", default="inductor")
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error(f"--steps must be >= 1, got {args.steps}")
    if args.hidden % args.heads:
        p.error(f"--hidden {args.hidden} must be a multiple of --heads {args.heads}")
    args.recipes = [r for r in args.recipes.split(",") if r]
    return args


def plot(path, runs, gap=None):
    series = {r["recipe"].upper(): (r["steps"], r["train_loss"]) for r in runs}
    markers = {r["recipe"].upper(): (r["eval_steps"], r["eval_loss"]) for r in runs}
    title = "BYTE-LEVEL MOE LM: " + " VS ".join(series) + " (LINES: TRAIN, SQUARES: HELD-OUT)"
    subtitle = "FINAL HELD-OUT LOSS: " + ", ".join(f"{r['recipe'].upper()} {r['final_eval_loss']:.4f}" for r in runs)
    if gap is not None:
        subtitle += f" (MXFP8 {100 * gap:+.2f}%)"
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        write_line_chart(path, series, title=title, x_label="step", y_label="loss", markers=markers,
                         subtitle=subtitle)
        return "png_chart.py (matplotlib is not installed)"
    fig, ax = plt.subplots(figsize=(9, 5.4), dpi=100)
    for i, (name, (xs, ys)) in enumerate(series.items()):
        line, = ax.plot(xs, ys, label=f"{name} train", lw=1.2)
        mx, my = markers[name]
        ax.plot(mx, my, "s", color=line.get_color(), label=f"{name} held-out")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/byte)")
    ax.set_title("Byte-level MoE LM (mxmoe_torch.MoE)\n" + subtitle, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return "matplotlib"


def main(argv=None):
    args = parse_args(argv)
    parts, files = load_text()
    train_data, val_data = split_text(parts)
    val_batches = list(batches(val_data, args.eval_batches, args.batch_size, args.seq_len, args.seed + 2))
    print(f"text: {sum(map(len, parts))} bytes from {', '.join(TEXT_MODULES)} (Python {sys.version.split()[0]}); "
          f"train {train_data.numel()}, held-out {val_data.numel()} (the last 10% of each file); "
          f"device {args.device}", flush=True)

    runs = [train(recipe, args, train_data, val_batches) for recipe in args.recipes]

    os.makedirs(args.out, exist_ok=True)
    result = {"args": {k: v for k, v in vars(args).items()}, "python": sys.version.split()[0],
              "torch": torch.__version__, "text_files": files, "runs": {r["recipe"]: r for r in runs}}
    by = result["runs"]
    if "bf16" in by and "mxfp8" in by:
        result["relative_gap"] = (by["mxfp8"]["final_eval_loss"] - by["bf16"]["final_eval_loss"]) / \
            by["bf16"]["final_eval_loss"]
    json_path = os.path.join(args.out, "curves.json")
    with open(json_path + ".tmp", "w") as f:
        json.dump(result, f, indent=1)
    os.replace(json_path + ".tmp", json_path)
    png_path = os.path.join(args.out, "loss_curves.png")
    drawn_with = plot(png_path, runs, result.get("relative_gap"))

    for r in runs:
        print(f"{r['recipe']:>6}: final held-out loss {r['final_eval_loss']:.4f}  "
              f"(train, last 10% of steps {r['final_train_loss']:.4f}; first step {r['train_loss'][0]:.4f}; "
              f"{r['seconds']:.1f}s)")
    if "relative_gap" in result:
        print(f"relative gap (mxfp8 - bf16) / bf16: {100 * result['relative_gap']:+.2f}%")
    print(f"wrote {json_path} and {png_path} (drawn with {drawn_with})")
    return result


if __name__ == "__main__":
    main()
