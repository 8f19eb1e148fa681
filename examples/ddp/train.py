"""A stock PyTorch DDP script, exactly as torchrun would run it: env:// rendezvous, gloo on CPU
(nccl when CUDA is there). mltrain sets RANK, WORLD_SIZE, MASTER_ADDR, ... for every rank.

    mltrain run examples/ddp.toml
    mltrain run -n 4 -- /usr/bin/python3 examples/ddp/train.py --steps 50

With --mltrain-hook the gradients travel through mltrain's collectives instead of gloo: the one
line marked below (examples/ddp_mltrain.toml runs it). The `mltrain` package needs no install:
the agent of `mltrain run` puts it on every rank's PYTHONPATH.

At the end every rank prints a digest of its weights; DDP keeps them identical on every rank.
"""
import argparse
import hashlib
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--mltrain-hook", action="store_true", help="gradients through mltrain, not gloo")
    args = p.parse_args()

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend=backend, init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")

    torch.manual_seed(0)  # same initial weights everywhere (DDP also broadcasts rank 0's)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).to(device)
    ddp = DDP(model, device_ids=[local_rank] if backend == "nccl" else None)
    if args.mltrain_hook:
        import mltrain.torch
        ddp.register_comm_hook(None, mltrain.torch.allreduce_hook)  # <- the one line
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)

    # Each rank sees its own shard of a synthetic regression problem.
    g = torch.Generator().manual_seed(1234 + rank)
    true_w = torch.arange(16, dtype=torch.float32) / 16
    for step in range(args.steps):
        x = torch.randn(64, 16, generator=g)
        y = (x @ true_w).unsqueeze(1) + 0.01 * torch.randn(64, 1, generator=g)
        loss = torch.nn.functional.mse_loss(ddp(x.to(device)), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 10 == 0 or step == args.steps - 1:
            print(f"rank {rank}/{world} step {step} loss {loss.item():.5f}", flush=True)

    flat = torch.cat([p.detach().cpu().flatten() for p in model.parameters()])
    digest = hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:16]
    print(f"rank {rank} final weights sha256 {digest}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    # Debian 12's torch 1.13 can deadlock freeing a gloo DDP model at exit (a gloo thread that
    # drops a tensor waits for the GIL the destructor holds): end here, everything written.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
