"""Writes a job folder like a real one for bench/sync: FILES files, MB megabytes in all.

Most files are small source-like text (words from a fixed vocabulary: compressible, as code is);
a few large ones hold the rest of the bytes, half text-like, half random (weights, packed data).
Deterministic (seeded), so every run of the bench syncs the same tree.

    /usr/bin/python3 bench/make_tree.py DIR [FILES] [MB]
"""
import os
import random
import sys

root = sys.argv[1]
files = int(sys.argv[2]) if len(sys.argv) > 2 else 5000
mb = int(sys.argv[3]) if len(sys.argv) > 3 else 100
rng = random.Random(1234)
words = ["def", "return", "self", "import", "tensor", "grad", "model", "layer", "batch", "loss", "for",
         "in", "range", "if", "else", "torch", "nn", "optim", "step", "x", "y", "0", "1", "=", "(", ")",
         ":", "config", "data", "train", "eval", "print", "lr", "epoch", "weight", "bias"]


def text(n):
    out, size = [], 0
    while size < n:
        line = " ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) + "\n"
        out.append(line)
        size += len(line)
    return "".join(out)[:n].encode()


big = 100
small = files - big
small_bytes = min(mb << 20, small * 4096) // 2
big_each = ((mb << 20) - small_bytes) // big
os.makedirs(root, exist_ok=True)
for i in range(small):
    d = os.path.join(root, "src", f"pkg{i % 50:02d}", f"mod{i % 7}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"file{i:05d}.py"), "wb") as f:
        f.write(text(max(64, int(rng.expovariate(1 / (small_bytes / small))))))
for i in range(big):
    d = os.path.join(root, "data")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"blob{i:03d}.bin"), "wb") as f:
        f.write(rng.randbytes(big_each) if i % 2 else text(big_each))
