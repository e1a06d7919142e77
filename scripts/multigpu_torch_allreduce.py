#!/usr/bin/env python3
"""The PyTorch peer of examples/multi_gpu_bench.rs: NCCL all-reduce bus bandwidth.

One process per GPU (torch.multiprocessing), the nccl backend, f32 sum in place, the
same sizes, warm-up and call counts as our benchmark; the time of `iters` calls between
two synchronisations, the slowest rank's. busbw = 2 (n - 1) / n * bytes / time.
NVLink multicast stays off (NCCL_NVLS_ENABLE=0 unless set, and the spawned processes
inherit it).

    python3 scripts/multigpu_torch_allreduce.py [--gpus 2] [--quick] [--json out.json]
"""
import argparse
import json
import os
import socket
import time

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402


def sizes(quick):
    return [1 << 20, 64 << 20, 1 << 30] if quick else [1 << 20, 16 << 20, 256 << 20, 1 << 30]


def worker(rank, world, port, quick, queue):
    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    rows = []
    for nbytes in sizes(quick):
        x = torch.ones(nbytes // 4, dtype=torch.float32, device="cuda")
        warm = 5
        iters = min(max((4 << 30) // nbytes, 20), 500)
        for _ in range(warm):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        dist.barrier()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        secs = torch.tensor([(time.perf_counter() - t0) / iters], device="cuda")
        dist.all_reduce(secs, op=dist.ReduceOp.MAX)
        secs = secs.item()
        want = float(world) ** (warm + iters)
        if want < 3.0e38:
            got = x[[0, x.numel() // 2, x.numel() - 1]].tolist()
            assert all(v == want for v in got), f"rank {rank}: {got} != {want}"
        algbw = nbytes / secs / 1e9
        rows.append(
            {
                "bytes": nbytes,
                "time_us": secs * 1e6,
                "algbw_gbs": algbw,
                "busbw_gbs": algbw * 2 * (world - 1) / world,
            }
        )
        del x
    if rank == 0:
        queue.put(rows)
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(
        worker, args=(args.gpus, port, args.quick, queue), nprocs=args.gpus, start_method="spawn"
    )
    rows = queue.get()
    nccl = ".".join(str(v) for v in torch.cuda.nccl.version())
    for r in rows:
        print(
            f"torch {torch.__version__} all_reduce f32 sum, {args.gpus} GPUs, {r['bytes'] >> 20:>5} MiB: "
            f"{r['time_us']:>9.1f} us  algbw {r['algbw_gbs']:>6.1f} GB/s  busbw {r['busbw_gbs']:>6.1f} GB/s"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "nccl_version": nccl, "all_reduce": rows}, f, indent=2)


if __name__ == "__main__":
    main()
