"""A rank of the DDP tests: a small MLP trained with DistributedDataParallel (gloo process group)
whose gradients travel through --mode:
  gloo        DDP's own allreduce (gloo)
  hook        mltrain.torch.allreduce_hook
  hook-staged the same with /dev/shm looking full to the hook: buckets stay in private memory
  hook-view   the hook with gradient_as_bucket_view=True: results written into every rank's bucket
  fixed       mltrain.torch.fixed_point_hook
  gloo-fixed  the same fixed-point reduction through gloo (torch.distributed.all_reduce on int64)
  optimizer   no DDP: mltrain.torch.broadcast_parameters + DistributedOptimizer
  twin-gloo   two DDP models of the same shape (other weights, one loss, one backward pass): gloo
  twin-hook   the same through mltrain.torch.allreduce_hook (their buckets in flight at once)
  branch-gloo gradient_as_bucket_view=True, find_unused_parameters=True and gradients set to None
              each step, where rank 1 never uses the second head (its gradients of that head's
              bucket stay None, so it cannot tell that they view the bucket): gloo
  branch-hook the same through mltrain.torch.allreduce_hook
Writes its final weights (float32 bytes) to $OUT/weights-<mode>-<rank>.bin; the hook modes print
"BUCKETS <in shared memory> OF <hook calls>" after the first step (DDP's rebuilt buckets), and
"VIEWS <calls whose bucket the gradients view> OF <hook calls>". With --kill-at K,
rank 1 SIGKILLs itself in step K between forward and backward; the others report what the
backward pass raised ("RAISED <type>: <message>") and exit 3.
"""
import argparse
import os
import signal
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import mltrain
import mltrain.torch as mt


def gloo_fixed_hook(state, bucket):
    t = bucket.buffer()
    q = mt.to_fixed(t, 32, dist.get_world_size())
    fut = dist.all_reduce(q, async_op=True).get_future()

    def finish(f):
        t.copy_(mt.from_fixed(f.value()[0], 32, dist.get_world_size(), t.dtype))
        return t
    return fut.then(finish)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--kill-at", type=int, default=-1)
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if args.kill_at >= 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # fail by themselves, not by teardown

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.Tanh(), torch.nn.Linear(128, 64),
                                torch.nn.Tanh(), torch.nn.Linear(64, 1))
    if args.mode == "optimizer":
        if rank != 0:  # other weights than rank 0's: the broadcast must bring rank 0's
            torch.manual_seed(100 + rank)
            with torch.no_grad():
                for p in model.parameters():
                    torch.nn.init.normal_(p, std=0.1)
        mltrain.init()
        mt.broadcast_parameters(model.state_dict(), root_rank=0)
        net = model
        opt = mt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
        assert isinstance(opt, torch.optim.SGD)
    elif args.mode.startswith("twin-"):
        torch.manual_seed(7)
        twin = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.Tanh(), torch.nn.Linear(128, 64),
                                   torch.nn.Tanh(), torch.nn.Linear(64, 1))
        a, b = DDP(model, bucket_cap_mb=0.01), DDP(twin, bucket_cap_mb=0.01)
        if args.mode == "twin-hook":
            a.register_comm_hook(None, mt.allreduce_hook)
            b.register_comm_hook(None, mt.allreduce_hook)
        elif args.mode != "twin-gloo":
            sys.exit(f"unknown mode {args.mode}")

        def net(x):
            return a(x) + 0.5 * b(x)
        opt = torch.optim.SGD(list(a.parameters()) + list(b.parameters()), lr=0.05, momentum=0.9)
        model = torch.nn.ModuleList([model, twin])  # both models' weights are written
    elif args.mode.startswith("branch-"):
        # Used by every rank but rank 1. Its bias (1.2 MB) alone fills DDP's first bucket (1 MiB;
        # with find_unused_parameters DDP keeps its first buckets), which rank 1 computes none of.
        head = torch.nn.Linear(1, 300000)
        inner = model

        class Branch(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.body, self.head = inner, head

            def forward(self, x):
                y = self.body(x)
                return y if rank == 1 else y + 0.1 * self.head(y).mean(dim=1, keepdim=True)
        model = Branch()
        net = DDP(model, bucket_cap_mb=0.01, gradient_as_bucket_view=True, find_unused_parameters=True)
        if args.mode == "branch-hook":
            net.register_comm_hook(None, mt.allreduce_hook)
        elif args.mode != "branch-gloo":
            sys.exit(f"unknown mode {args.mode}")
        opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    else:
        # Several buckets, several hooks per step.
        net = DDP(model, bucket_cap_mb=0.01, gradient_as_bucket_view=args.mode == "hook-view")
        if args.mode in ("hook", "hook-staged", "hook-view"):
            if args.mode == "hook-staged":
                class Full:
                    f_bavail = f_frsize = 0
                mt.os = type("os", (), {"statvfs": staticmethod(lambda path: Full)})

            def hook(state, bucket):
                fut = mt.allreduce_hook(state, bucket)
                seen.append(bucket.buffer().is_shared())  # after the hook: where it left the bucket
                views.append(mt._grads_view(bucket, bucket.buffer()))
                return fut
            net.register_comm_hook(None, hook)
        elif args.mode == "fixed":
            net.register_comm_hook(mt.FixedPoint(32), mt.fixed_point_hook)
        elif args.mode == "gloo-fixed":
            net.register_comm_hook(None, gloo_fixed_hook)
        elif args.mode != "gloo":
            sys.exit(f"unknown mode {args.mode}")
        opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)

    seen = []  # per hook call: the bucket in shared memory
    views = []  # per hook call: the gradients view the bucket
    g = torch.Generator().manual_seed(1000 + rank)
    w_true = torch.linspace(-1, 1, 32)
    for step in range(args.steps):
        x = torch.randn(16, 32, generator=g)
        y = torch.sin(x @ w_true).unsqueeze(1)
        loss = torch.nn.functional.mse_loss(net(x), y)
        opt.zero_grad(set_to_none=args.mode.startswith("branch-"))
        if step == args.kill_at and rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            loss.backward()
            opt.step()
            if step == 0:
                seen.clear()  # DDP rebuilds its buckets after the first step
                views.clear()
        except Exception as e:  # noqa: BLE001 - what a training script would see
            print(f"RAISED {type(e).__name__}: {e}", flush=True)
            sys.exit(3)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).to(torch.float32)
    with open(os.path.join(os.environ["OUT"], f"weights-{args.mode}-{rank}.bin"), "wb") as f:
        f.write(flat.numpy().tobytes())
    if args.mode.startswith("hook"):
        print(f"BUCKETS {sum(seen)} OF {len(seen)}", flush=True)
        print(f"VIEWS {sum(views)} OF {len(views)}", flush=True)
    print(f"DDP-DONE {args.mode} rank {rank} loss {loss.item():.6f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    # Debian 12's torch 1.13 can deadlock freeing a gloo DDP model at exit (a gloo thread that
    # drops a tensor waits for the GIL the destructor holds): end here, everything written.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
