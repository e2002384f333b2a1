#!/usr/bin/env python3
"""Two `mxmoe bench --json` files of the same run side by side: one row per (preset, split, recipe,
op) present in both, with each side's milliseconds and after/before speed (>1: after is faster),
and a last line naming the slowest row and the rows under --floor.

  python3 bench/compare_bench.py BEFORE.json AFTER.json [--labels before after] [--floor 0.97] [--out table.md]
"""
import argparse
import json


def rows(path):
    data = json.load(open(path))
    return data.get("device", "?"), {(r["preset"], r["split"], r["recipe"], r["op"]): r["ms"] for r in data["rows"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--labels", nargs=2, default=["before", "after"])
    ap.add_argument("--floor", type=float, default=0.97, help="count the rows whose speed is under this")
    ap.add_argument("--out", help="also write the table here")
    args = ap.parse_args()
    dev_b, before = rows(args.before)
    dev_a, after = rows(args.after)
    keys = [k for k in after if k in before]
    if not keys:
        raise SystemExit("compare_bench: no (preset, split, recipe, op) row is in both files")
    b, a = args.labels
    lines = [f"device: {dev_a}" + ("" if dev_a == dev_b else f" (before: {dev_b})"), "",
             f"| preset | split | recipe | op | {b} ms | {a} ms | {a}/{b} speed |", "|---|---|---|---|---:|---:|---:|"]
    for k in keys:
        lines.append(f"| {' | '.join(k)} | {before[k]:.3f} | {after[k]:.3f} | {before[k] / after[k]:.2f}x |")
    only = sorted(set(before) ^ set(after))
    if only:
        lines += ["", f"{len(only)} rows are in one file only (not compared)."]
    speed = {k: before[k] / after[k] for k in keys}
    worst = min(keys, key=speed.get)
    under = sum(v < args.floor for v in speed.values())
    lines += ["", f"slowest: {speed[worst]:.2f}x ({' '.join(worst)}); {under} of {len(keys)} rows under {args.floor}x"]
    text = "\n".join(lines)
    print(text)
    if args.out:
        open(args.out, "w").write(text + "\n")


if __name__ == "__main__":
    main()
