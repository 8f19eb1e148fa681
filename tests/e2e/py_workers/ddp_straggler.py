"""A rank of the stock-DDP straggler test: DistributedDataParallel over gloo with no mltrain hook
(nothing of mltrain imported), for about SECS seconds of training; rank SLOW_RANK computes BUSY
seconds more before each step, so the other ranks wait for it inside DDP's allreduce (asleep: gloo
blocks). Prints "DDP-STRAGGLER-DONE <rank> <steps>" at the end."""
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

SLOW = int(os.environ.get("SLOW_RANK", "1"))
BUSY = float(os.environ.get("BUSY", "0.1"))
SECS = float(os.environ.get("SECS", "4"))

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
net = DDP(torch.nn.Linear(64, 64))
opt = torch.optim.SGD(net.parameters(), lr=0.01)
end = time.monotonic() + SECS
steps = 0
while True:
    if rank == SLOW:
        t = time.monotonic() + BUSY
        while time.monotonic() < t:  # the slow rank's extra work: its CPU, not a sleep
            pass
    loss = net(torch.randn(8, 64)).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    steps += 1
    go = torch.tensor([1 if time.monotonic() < end else 0])
    dist.all_reduce(go, op=dist.ReduceOp.MIN)  # every rank stops after the same step
    if not go.item():
        break
print(f"DDP-STRAGGLER-DONE {rank} {steps}", flush=True)
dist.destroy_process_group()
# Debian 12's torch 1.13 can deadlock freeing a gloo DDP model at exit (a gloo thread that
# drops a tensor waits for the GIL the destructor holds): end here, everything written.
sys.stdout.flush()
os._exit(0)
