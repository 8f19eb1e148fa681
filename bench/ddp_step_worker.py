"""One rank of bench/ddp_step.py: DDP training steps of a communication-heavy model (LAYERS x
Linear(WIDTH, WIDTH), batch BATCH, SGD), gradients through gloo (DDP's own allreduce), through
mltrain (mltrain.torch.allreduce_hook), or nowhere ("none": a hook that hands DDP its bucket back at
once, so the step keeps all of DDP's own work but no communication: the floor any transport can
reach). Each step with gradient sync is followed by one under
ddp.no_sync() (the same compute, no communication): the median of the first is the step time, of
the second the compute time; their difference is the communication the step could not hide.
Rank 0 prints one line: DDP-STEP {"comm": ..., "step_s": ..., "compute_s": ...}.
"""
import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--comm", choices=["gloo", "mltrain", "none"], required=True)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    layers = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers)
    # DDP_STEP_BUCKET_VIEW=1 (a VARIANTS knob): gradients as views into DDP's buckets, PyTorch's
    # setting that skips DDP's copies between gradients and buckets.
    ddp = DDP(model, gradient_as_bucket_view=os.environ.get("DDP_STEP_BUCKET_VIEW") == "1")
    if args.comm == "mltrain" and os.environ.get("DDP_STEP_HOOK") == "sync":
        # A diagnostic row (VARIANTS="mltrain:DDP_STEP_HOOK=sync"): the hook's synchronization
        # alone, a one-element allreduce per bucket, and the bucket handed back as it is.
        import mltrain.torch
        one = torch.zeros(1)

        def sync_only(state, bucket):
            t = bucket.buffer()
            return mltrain.torch._future_of(mltrain.init().allreduce_async(one, "sum"), lambda: t)
        ddp.register_comm_hook(None, sync_only)
    elif args.comm == "mltrain":
        import mltrain.torch
        ddp.register_comm_hook(None, mltrain.torch.allreduce_hook)
    elif args.comm == "none":
        def no_communication(state, bucket):
            fut = torch.futures.Future()
            fut.set_result(bucket.buffer())
            return fut
        ddp.register_comm_hook(None, no_communication)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-4)
    x = torch.randn(args.batch, args.width)

    def step():
        opt.zero_grad(set_to_none=False)
        ddp(x).square().mean().backward()
        opt.step()

    synced, local = [], []
    for i in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        step()
        t1 = time.perf_counter()
        with ddp.no_sync():
            step()
        t2 = time.perf_counter()
        if i >= args.warmup:
            synced.append(t1 - t0)
            local.append(t2 - t1)
    dist.barrier()
    if dist.get_rank() == 0:
        print("DDP-STEP " + json.dumps({"comm": args.comm, "step_s": statistics.median(synced),
                                        "compute_s": statistics.median(local),
                                        "grad_bytes": sum(p.numel() * 4 for p in model.parameters())}),
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
