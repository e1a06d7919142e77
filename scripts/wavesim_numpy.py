#!/usr/bin/env python3
"""The WaveSim update in numpy: the peer of `ringkernel wavesim bench` on the CPU.

Same scheme as the Rust engine's default medium: f32 fields with a one-cell zero halo,
    u_next = (2 u + c2 * (u_n + u_s + u_w + u_e - 4 u)) - u_prev
written into the older buffer (two buffers), a pulse at the centre.

    python3 scripts/wavesim_numpy.py [--sizes 256 512] [--seconds 1.0] [--json FILE]
Prints one line per size: `numpy n=256 steps/s=... cells/s=... checksum=...`, where
checksum is the sum of the field after `--check-steps` steps from a unit impulse at the
centre (the Rust bench prints the same figure for its own engine).
"""
import argparse
import json
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="*", default=[256, 512, 1024, 4096])
    ap.add_argument("--seconds", type=float, default=1.0, help="time per size")
    ap.add_argument("--c2", type=float, default=0.25)
    ap.add_argument("--check-steps", type=int, default=100)
    ap.add_argument("--json")
    args = ap.parse_args()
    import numpy as np

    c2 = np.float32(args.c2)
    two = np.float32(2.0)
    four = np.float32(4.0)
    out = {}
    for n in args.sizes:
        u = np.zeros((n + 2, n + 2), dtype=np.float32)
        p = np.zeros_like(u)
        u[n // 2 + 1, n // 2 + 1] = 1.0
        p[n // 2 + 1, n // 2 + 1] = 1.0
        lap = np.empty((n, n), dtype=np.float32)
        tmp = np.empty((n, n), dtype=np.float32)

        def step(u, p):
            c = u[1:-1, 1:-1]
            np.add(u[:-2, 1:-1], u[2:, 1:-1], out=lap)
            np.add(lap, u[1:-1, :-2], out=lap)
            np.add(lap, u[1:-1, 2:], out=lap)
            np.multiply(c, four, out=tmp)
            np.subtract(lap, tmp, out=lap)
            np.multiply(lap, c2, out=lap)
            np.multiply(c, two, out=tmp)
            np.add(tmp, lap, out=tmp)
            q = p[1:-1, 1:-1]
            np.subtract(tmp, q, out=q)
            return p, u  # the new field is in p's buffer

        for _ in range(args.check_steps):
            u, p = step(u, p)
        checksum = float(u.astype(np.float64).sum())
        # Timed: as many steps as fit in the time given (at least 3).
        steps = 0
        t0 = time.perf_counter()
        while True:
            for _ in range(10 if n <= 1024 else 1):
                u, p = step(u, p)
                steps += 1
            el = time.perf_counter() - t0
            if el >= args.seconds and steps >= 3:
                break
        sps = steps / el
        out[n] = {"steps_per_s": sps, "cells_per_s": sps * n * n, "checksum": checksum}
        print(f"numpy n={n} steps/s={sps:.1f} cells/s={sps * n * n:.4e} checksum={checksum:.6e}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f)


if __name__ == "__main__":
    main()
