"""A stock PyTorch DDP script whose gradients go through the job's parameter servers, BytePS-style:
the one line marked below registers mltrain.torch.ps_hook. DDP's own setup (the process group,
the start-up broadcast of the weights) stays gloo, from the torchrun-style environment that
`mltrain run` sets (RANK, WORLD_SIZE, MASTER_ADDR, ...).

    mltrain run examples/ps/ddp_ps.toml

Every gradient bucket is pushed to the servers and pulled back as the sum over the workers (a sync
round; buckets above [ps] partition_bytes are split across the servers), then divided by the number
of workers. Every worker pulls the same bytes, so the weights stay identical on every rank: each
prints a digest of its final weights.
"""
import argparse
import hashlib
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import mltrain.torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--lr", type=float, default=0.01)
    args = p.parse_args()

    dist.init_process_group(backend="gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)
    # 272k parameters, 1.1 MB of float32 gradients: one bucket in the first step, two once DDP
    # has rebuilt its buckets (the first holds up to 1 MB); ps_hook declares a key for each
    # (bucket, size). With examples/ps/ddp_ps.toml's partition_bytes = 256 KiB the big bucket
    # travels in 5 parts spread over the servers.
    model = torch.nn.Sequential(torch.nn.Linear(16, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                torch.nn.ReLU(), torch.nn.Linear(512, 1))
    ddp = DDP(model, bucket_cap_mb=0.25)
    ddp.register_comm_hook(None, mltrain.torch.ps_hook)  # <- the one line: gradients via the servers
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)

    g = torch.Generator().manual_seed(1234 + rank)  # each rank its own shard of the data
    true_w = torch.arange(16, dtype=torch.float32) / 16
    for step in range(args.steps):
        x = torch.randn(64, 16, generator=g)
        y = (x @ true_w).unsqueeze(1) + 0.01 * torch.randn(64, 1, generator=g)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 10 == 0 or step == args.steps - 1:
            print(f"rank {rank}/{world} step {step} loss {loss.item():.5f}", flush=True)

    flat = torch.cat([q.detach().flatten() for q in model.parameters()])
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
