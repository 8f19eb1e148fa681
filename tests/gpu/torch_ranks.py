"""The torch step of tests/gpu/run.sh: ranks sharing one GPU ([gpus] procs_per_gpu = 2), so the
comm library's `auto` picks the CPU backend. --mode gloo|hook|ps trains the same small DDP model
on the GPU (CPU where torch sees none) with gloo, mltrain.torch.allreduce_hook or
mltrain.torch.ps_hook; every rank prints a digest of its final weights, which must agree across the
three modes. Mode hook also sends a CUDA tensor through mltrain.allreduce and says what happened
(TORCH-NOTE lines). --mode hold keeps a tensor on the GPU for --seconds (the top step)."""
import argparse
import hashlib
import os
import time

import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["gloo", "hook", "ps", "hold"], required=True)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--seconds", type=float, default=20)
    a = p.parse_args()
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
    rank = int(os.environ["RANK"])
    if a.mode == "hold":
        x = torch.ones(64 << 20, device=dev)  # 256 MiB the GPU's process list shows
        print(f"TORCH-NOTE rank {rank} holds {x.numel() * 4 >> 20} MiB on {dev}", flush=True)
        time.sleep(a.seconds)
        return

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group(backend="gloo", init_method="env://")
    world = dist.get_world_size()
    import mltrain
    import mltrain.torch

    comm = mltrain.init()
    if rank == 0:
        print(f"TORCH-NOTE backend {'nccl' if comm.nccl else 'cpu'} ({comm.backend_reason}); device {dev}",
              flush=True)
    if a.mode == "hook":
        t = torch.full((1 << 20,), float(rank + 1), device=dev)
        try:
            mltrain.allreduce(t)
            ok = bool((t == world * (world + 1) / 2).all())
            print(f"TORCH-NOTE {dev.type} tensor through mltrain.allreduce: {'correct' if ok else 'WRONG'}",
                  flush=True)
        except ValueError as e:  # the CPU backend refuses device memory, saying why
            print(f"TORCH-NOTE {dev.type} tensor through mltrain.allreduce refused: {str(e)[:120]}", flush=True)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)).to(dev)
    ddp = DDP(model, device_ids=[0] if cuda else None)
    if a.mode == "hook":
        ddp.register_comm_hook(None, mltrain.torch.allreduce_hook)
    elif a.mode == "ps":
        ddp.register_comm_hook(None, mltrain.torch.ps_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for step in range(a.steps):
        g = torch.Generator().manual_seed(1000 * rank + step)
        x = torch.randn(32, 64, generator=g).to(dev)
        loss = ((ddp(x) - x.sum(1, keepdim=True)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    flat = torch.cat([q.detach().float().cpu().flatten() for q in model.parameters()])
    digest = hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:16]
    print(f"rank {rank} mode {a.mode} final weights sha256 {digest}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
