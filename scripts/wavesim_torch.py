#!/usr/bin/env python3
"""The WaveSim update in PyTorch on the GPU: the peer of `ringkernel wavesim bench --torch`.

The same scheme as the Rust engines' default medium and scripts/wavesim_numpy.py: f32
fields with a one-cell zero halo,
    u_next = (2 u + c2 * (u_n + u_s + u_w + u_e - 4 u)) - u_prev
written into the older buffer (two buffers), one step after another from the host:
  * mode=eager:   PyTorch's own kernels, several a step (slices, adds, in-place ops);
  * mode=compile: the step through torch.compile (Inductor fuses it into one Triton
                  kernel a step), skipped with the reason when it cannot compile.

    python3 scripts/wavesim_torch.py [--sizes 256 512 1024 4096] [--seconds 1.0]
                                     [--modes eager compile] [--json FILE]
Prints `torch copy GB/s=...` (a device-to-device copy of 256 MiB, read plus write: the
bandwidth bound of 12 bytes a cell and step) and one line per size and mode:
`torch n=256 mode=eager steps/s=... cells/s=... checksum=...`, where checksum is the sum
of the field after --check-steps steps from a unit impulse at the centre (the Rust bench
prints the same figure for its engine). Timing: CUDA events around whole batches of
steps after a warm-up, the best of a few batches.
"""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="*", default=[256, 512, 1024, 4096])
    ap.add_argument("--seconds", type=float, default=1.0, help="time per size and mode")
    ap.add_argument("--modes", nargs="*", default=["eager", "compile"], choices=["eager", "compile"])
    ap.add_argument("--c2", type=float, default=0.25)
    ap.add_argument("--check-steps", type=int, default=100)
    ap.add_argument("--json")
    args = ap.parse_args()
    try:
        import torch
    except ImportError as e:
        sys.exit(f"torch is not installed: {e}")
    if not torch.cuda.is_available():
        sys.exit("torch finds no CUDA device")
    dev = torch.device("cuda")
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(dev)}", flush=True)

    # Copy bandwidth: read plus write of a 256 MiB buffer, best of 10.
    n = 64 * 1024 * 1024
    src = torch.ones(n, dtype=torch.float32, device=dev)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    best = float("inf")
    for _ in range(10):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        best = min(best, a.elapsed_time(b) * 1e-3)
    copy_gbs = 2 * n * 4 / best / 1e9
    del src, dst
    print(f"torch copy GB/s={copy_gbs:.1f}", flush=True)

    c2 = args.c2

    def step(u, p):
        c = u[1:-1, 1:-1]
        lap = u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:] - 4.0 * c
        p[1:-1, 1:-1] = (2.0 * c + c2 * lap) - p[1:-1, 1:-1]

    steppers = {}
    for mode in args.modes:
        if mode == "eager":
            steppers[mode] = step
        else:
            try:
                steppers[mode] = torch.compile(step, fullgraph=True, dynamic=False)
            except Exception as e:  # no Triton, no compiler
                print(f"torch mode=compile SKIPPED ({type(e).__name__}: {e})", flush=True)

    out = {"copy_GBps": copy_gbs, "runs": []}
    for n in args.sizes:
        for mode, fn in steppers.items():
            try:
                u = torch.zeros((n + 2, n + 2), dtype=torch.float32, device=dev)
                p = torch.zeros_like(u)
                u[n // 2 + 1, n // 2 + 1] = 1.0
                p[n // 2 + 1, n // 2 + 1] = 1.0
                for _ in range(args.check_steps):
                    fn(u, p)
                    u, p = p, u
                checksum = float(u.double().sum().item())
                bufs = [u, p]

                def timed(batch):
                    # Seconds for `batch` steps (an even count keeps the buffers' roles).
                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    a.record()
                    for k in range(batch):
                        fn(bufs[k % 2], bufs[(k + 1) % 2])
                    b.record()
                    b.synchronize()
                    return a.elapsed_time(b) * 1e-3

                # Batches of steps sized to take about a tenth of the time given.
                batch = 10
                el = timed(batch)
                while el < args.seconds / 10 and batch < 1 << 20:
                    batch *= 2
                    el = timed(batch)
                best, spent = el, 0.0
                while spent < args.seconds:
                    el = timed(batch)
                    best, spent = min(best, el), spent + el
                sps = batch / best
            except Exception as e:
                print(f"torch n={n} mode={mode} FAILED ({type(e).__name__}: {e})", flush=True)
                continue
            out["runs"].append({"n": n, "mode": mode, "steps_per_s": sps, "checksum": checksum})
            print(
                f"torch n={n} mode={mode} steps/s={sps:.1f} cells/s={sps * n * n:.4e} checksum={checksum:.6e}",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f)


if __name__ == "__main__":
    main()
