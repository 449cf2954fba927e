#!/usr/bin/env python3
"""gpt_torch.py - the PyTorch reference of examples/gpt.lua (bench/gpt.sh; bench-only, never a runtime dependency).

Builds the same model (GPT-2's form, byte vocabulary, tied output weights) from
the initial weights our kernels wrote (examples/gpt.lua --dump-init FILE, f32 in
the layout of kernels/cpu/gpt_model.c at tp = 1), draws the same batches (the
generator of kernels/cpu/mlp_common.h, keyed as gpt_data.c keys it) and trains
with the same AdamW, clipping and learning-rate schedule.

  gpt_torch.py --weights W --steps N [--compare ours.csv]   losses; compares with our --csv
  gpt_torch.py --weights W --time 20 --threads 1            tokens/s (median of timed batches)
  gpt_torch.py --weights W --time 20 --ddp 2                 the same, N processes of 1 thread under
                                                             DistributedDataParallel over gloo (batch B per rank)
"""
import argparse
import math
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

M64 = (1 << 64) - 1
TAG_GPT_BATCH = 12
V = 256


def mix64(z):
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def rng_make(seed, purpose, a, b):
    return mix64((seed & M64) ^ mix64(purpose ^ mix64((a & M64) ^ mix64(b & M64))))


def rng_below(s, n):
    limit = M64 - M64 % n
    while True:
        s = (s + 0x9E3779B97F4A7C15) & M64
        x = mix64(s)
        if x < limit:
            return x % n


def text(d):
    names = sorted(n for n in os.listdir(d) if "." not in n and os.path.isfile(os.path.join(d, n)))
    return b"".join(open(os.path.join(d, n), "rb").read() for n in names)


def batch(data, ntrain, B, T, seed, step):
    starts = [rng_below(rng_make(seed, TAG_GPT_BATCH, step, i), ntrain - T) for i in range(B)]
    rows = np.stack([np.frombuffer(data, np.uint8, T + 1, s) for s in starts]).astype(np.int64)
    return torch.from_numpy(rows[:, :T].copy()), torch.from_numpy(rows[:, 1:].copy())


def load(path, L, C, T):
    flat = torch.from_numpy(np.fromfile(path, np.float32))
    shapes = [("wte", (V, C)), ("wpe", (T, C))]
    for l in range(L):
        shapes += [(f"{l}.{n}", s) for n, s in [("ln1g", (C,)), ("ln1b", (C,)), ("wqkv", (C, 3 * C)), ("bqkv", (3 * C,)),
                                                ("wproj", (C, C)), ("bproj", (C,)), ("ln2g", (C,)), ("ln2b", (C,)),
                                                ("wfc", (C, 4 * C)), ("bfc", (4 * C,)), ("wfc2", (4 * C, C)),
                                                ("bfc2", (C,))]]
    shapes += [("lnfg", (C,)), ("lnfb", (C,))]
    p, off = {}, 0
    for n, s in shapes:
        k = math.prod(s)
        p[n] = flat[off:off + k].view(s).clone().requires_grad_(True)
        off += k
    if off != flat.numel():
        sys.exit(f"gpt_torch.py: {path} holds {flat.numel()} floats, the model {off}")
    return p


def forward(p, x, y, L, H, C):
    B, T = x.shape
    h = p["wte"][x] + p["wpe"][:T]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for l in range(L):
        g = lambda n: p[f"{l}.{n}"]
        a = F.layer_norm(h, (C,), g("ln1g"), g("ln1b"), 1e-5) @ g("wqkv") + g("bqkv")
        q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in a.split(C, dim=2))
        att = (q @ k.transpose(-1, -2)) / math.sqrt(C // H)
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        h = h + (att @ v).transpose(1, 2).reshape(B, T, C) @ g("wproj") + g("bproj")
        f = F.gelu(F.layer_norm(h, (C,), g("ln2g"), g("ln2b"), 1e-5) @ g("wfc") + g("bfc"), approximate="tanh")
        h = h + f @ g("wfc2") + g("bfc2")
    logits = F.layer_norm(h, (C,), p["lnfg"], p["lnfb"], 1e-5) @ p["wte"].t()
    return F.cross_entropy(logits.view(-1, V), y.view(-1))


def lr_at(s, lr, warmup, total):
    if s < warmup:
        return lr * (s + 1) / warmup
    prog = min(1.0, (s - warmup) / (total - warmup if total > warmup else 1))
    return lr * 0.1 + 0.5 * (lr - lr * 0.1) * (1 + math.cos(math.pi * prog))


def adamw(params, a):
    """Our AdamW: weight decay on the matrices only."""
    decay = [t for t in params if t.dim() == 2]
    rest = [t for t in params if t.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": a.wd}, {"params": rest, "weight_decay": 0.0}],
                             lr=a.lr, betas=(0.9, 0.95), eps=1e-8)


def train_step(loss_fn, params, opt, s, a):
    """One step s: loss, clipping, the schedule's learning rate, AdamW; returns (loss, seconds)."""
    t0 = time.perf_counter()
    loss = loss_fn()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if a.clip > 0:
        torch.nn.utils.clip_grad_norm_(params, a.clip)
    for g in opt.param_groups:
        g["lr"] = lr_at(s, a.lr, a.warmup, a.steps)
    opt.step()
    return loss, time.perf_counter() - t0


def step_time(times):
    """The median step, the first two (warm-up) left out when there are enough."""
    return statistics.median(times[2:]) if len(times) > 4 else statistics.median(times)


class Net(torch.nn.Module):
    """The parameters as a Module, for DistributedDataParallel (forward() takes them by our names)."""

    def __init__(self, p, L, H, C):
        super().__init__()
        self.names, self.shape = list(p), (L, H, C)
        for i, n in enumerate(self.names):
            self.register_parameter(f"p{i}", torch.nn.Parameter(p[n].detach().clone()))

    def forward(self, x, y):
        return forward({n: getattr(self, f"p{i}") for i, n in enumerate(self.names)}, x, y, *self.shape)


def ddp_rank(rank, a, port):
    """One rank of --ddp: its slice (rank x batch ..) of every step's 2-rank batch, gradients averaged by DDP."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=a.ddp)
    data = text(a.data)
    ntrain = int(len(data) * 0.9)
    net = DistributedDataParallel(Net(load(a.weights, a.layers, a.width, a.context), a.layers, a.heads, a.width))
    params = list(net.parameters())
    opt = adamw(params, a)
    times = []
    for s in range(a.time):
        x, y = batch(data, ntrain, a.batch * a.ddp, a.context, a.seed, s)
        x, y = x[rank * a.batch:(rank + 1) * a.batch], y[rank * a.batch:(rank + 1) * a.batch]
        times.append(train_step(lambda: net(x, y), params, opt, s, a)[1])
    if rank == 0:
        print(f"torch tokens/s {a.ddp * a.batch * a.context / step_time(times):.0f} ddp {a.ddp} gloo, 1 thread each")
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    for n, d in [("layers", 4), ("heads", 4), ("width", 128), ("context", 64), ("batch", 16), ("steps", 200),
                 ("warmup", 50), ("seed", 1), ("threads", 1), ("time", 0), ("ddp", 0)]:
        ap.add_argument("--" + n, type=int, default=d)
    for n, d in [("lr", 3e-3), ("wd", 0.1), ("clip", 1.0)]:
        ap.add_argument("--" + n, type=float, default=d)
    ap.add_argument("--weights", required=True)
    ap.add_argument("--data", default="/usr/share/games/fortunes")
    ap.add_argument("--compare")
    a = ap.parse_args()
    if a.ddp:
        if not a.time:
            sys.exit("gpt_torch.py: --ddp times training: give --time N (steps)")
        import socket
        with socket.socket() as s:  # a free port for the ranks' rendezvous
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        torch.multiprocessing.spawn(ddp_rank, args=(a, port), nprocs=a.ddp)
        return
    torch.set_num_threads(a.threads)
    data = text(a.data)
    ntrain = int(len(data) * 0.9)
    p = load(a.weights, a.layers, a.width, a.context)
    params = list(p.values())
    opt = adamw(params, a)
    steps = a.time if a.time else a.steps
    losses, times = [], []
    for s in range(steps):
        x, y = batch(data, ntrain, a.batch, a.context, a.seed, s)
        loss, dt = train_step(lambda: forward(p, x, y, a.layers, a.heads, a.width), params, opt, s, a)
        times.append(dt)
        losses.append(loss.item())
    if a.time:
        print(f"torch tokens/s {a.batch * a.context / step_time(times):.0f} threads {a.threads}")
        return
    if not a.compare:
        for s, l in enumerate(losses):
            print(s + 1, f"{l:.6f}")
        return
    ours = {}
    for line in open(a.compare).read().splitlines()[1:]:
        f = line.split(",")
        ours[int(f[0])] = float(f[2])
    r1 = abs(ours[1] - losses[0]) / losses[0]
    n = min(steps, max(ours))
    rn = abs(ours[n] - losses[n - 1]) / losses[n - 1]
    # Single steps are noisy at the end; the mean of the last 10 losses is the curve there.
    mo = statistics.mean(ours[s] for s in range(n - 9, n + 1))
    mt = statistics.mean(losses[n - 10:n])
    print(f"step 1 loss: ours {ours[1]:.6f} torch {losses[0]:.6f} rel diff {r1:.2e} (target 1e-4)")
    print(f"step {n} loss: ours {ours[n]:.6f} torch {losses[n - 1]:.6f} rel diff {rn:.2e}; "
          f"mean of steps {n - 9}..{n}: ours {mo:.4f} torch {mt:.4f} rel diff {abs(mo - mt) / mt:.2e} (target 1e-2)")


if __name__ == "__main__":
    main()
