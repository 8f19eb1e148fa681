"""DDP training that survives restarts: rank 0 checkpoints into MLTRAIN_CHECKPOINT_DIR (one folder
per run, kept across its restarts), and a restarted gang resumes from the last checkpoint: rank 0
loads it and hands the model, the optimizer and the step to every rank. With [cluster] min_hosts
the gang may come back smaller, or with a spare in a lost host's place (docs/elastic.md): the
world size is read anew at each start, as under torchrun's elastic agent.

    mltrain run examples/elastic/job.toml      # rank 1 fails once at step 20; the restart resumes

At the end every rank prints a digest of its weights; DDP keeps them identical on every rank.
"""
import argparse
import hashlib
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def save(path, model, opt, step):
    """Atomically: a restart never finds half a checkpoint."""
    tmp = path + ".tmp"
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
    os.replace(tmp, path)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--every", type=int, default=5, help="checkpoint every N steps")
    p.add_argument("--step-seconds", type=float, default=0.0, help="sleep per step (a longer run)")
    p.add_argument("--fail-once-at", type=int, default=-1, help="rank 1 exits at this step, first start only")
    args = p.parse_args()

    dist.init_process_group(backend="gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    print(f"rank {rank}/{world} on {socket.gethostname()} restart {restart}", flush=True)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    # Only rank 0's host has the checkpoint: rank 0 reads it, every rank gets it from rank 0.
    ckpt_dir = os.environ.get("MLTRAIN_CHECKPOINT_DIR", "")
    path = os.path.join(ckpt_dir, "last.pt") if ckpt_dir else ""
    state = [None]
    if rank == 0 and path and os.path.exists(path):
        state[0] = torch.load(path, weights_only=False)
    dist.broadcast_object_list(state, src=0)
    start = 0
    if state[0] is not None:
        model.load_state_dict(state[0]["model"])
        opt.load_state_dict(state[0]["opt"])
        start = state[0]["step"]
        print(f"rank {rank} resumed from step {start}", flush=True)
    ddp = DDP(model)

    true_w = torch.arange(16, dtype=torch.float32) / 16
    for step in range(start, args.steps):
        if step == args.fail_once_at and restart == 0 and rank == 1:
            print(f"rank {rank} fails at step {step} (on purpose, once)", flush=True)
            os._exit(3)
        # The batch depends on the step and the rank alone: a resumed run sees what it would have.
        g = torch.Generator().manual_seed(1_000_003 * step + rank)
        x = torch.randn(64, 16, generator=g)
        y = (x @ true_w).unsqueeze(1) + 0.01 * torch.randn(64, 1, generator=g)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"rank {rank}/{world} step {step} loss {loss.item():.5f}", flush=True)
        if rank == 0 and path and (step + 1) % args.every == 0:
            save(path, model, opt, step + 1)
        if args.step_seconds:
            time.sleep(args.step_seconds)

    flat = torch.cat([q.detach().flatten() for q in model.parameters()])
    print(f"rank {rank} final weights sha256 {hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:16]}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    # Debian 12's torch 1.13 can deadlock freeing a gloo DDP model at exit (a gloo thread that
    # drops a tensor waits for the GIL the destructor holds): end here, everything written.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
