#!/usr/bin/env python3
"""Trains a small MLP on synthetic data with DistributedDataParallel on N
processes, once with the gloo backend and once with loom (Loom's
torch.distributed backend, bindings/torch), from the same seed; checks that
the two runs' losses agree step by step and prints both backends' time per
step side by side. Both models train in the same processes, one step of
each in turn, so that the two timings see the same machine.

    PYTHONPATH=<build>/bindings/torch LOOM_NCCL_LIB=<build>/libnccl.so.2 \\
        python3 examples/ddp_train.py --ranks 4 --steps 20

Under torchrun each process is one rank (env:// rendezvous):

    PYTHONPATH=<build>/bindings/torch \\
        torchrun --standalone --nproc-per-node 2 examples/ddp_train.py --backend loom

With one backend (--backend loom) the default group is loom's and the
losses are checked against a plain model trained on every rank's batch at
once (examples/train_common.py says why they agree).

Exit status: 0 when the losses agree (within --rtol/--atol) on every rank
and step, 1 when they differ, 2 when a rank failed. --min-speedup X also
fails (status 3) when loom is not X times faster per step than gloo.

Both backends run with the same torch.set_num_threads (--threads, default
1): with several processes per core, torch's intra-op threads would
otherwise compete with each other and with the backends' own threads, and
the figure would measure the scheduler. The same count goes to OpenBLAS
(OPENBLAS_NUM_THREADS, unless already set): Debian's torch calls the
system BLAS without telling it torch's thread count, so each process would
also start one OpenBLAS thread per CPU, and those spin while they wait.

SPDX-License-Identifier: Apache-2.0
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_common  # noqa: E402


class MLP:
    """The model, data and optimizer of this example (train_common's spec)."""

    def __init__(self, args):
        self.args = args

    def make_model(self, torch):
        a = self.args
        mods = [torch.nn.Linear(a.hidden, a.hidden), torch.nn.ReLU()]
        for _ in range(a.layers - 2):
            mods += [torch.nn.Linear(a.hidden, a.hidden), torch.nn.ReLU()]
        mods.append(torch.nn.Linear(a.hidden, a.out))
        self.torch = torch
        self.w_true = torch.randn(a.hidden, a.out, generator=torch.Generator().manual_seed(a.seed))
        return torch.nn.Sequential(*mods)

    def wrap(self, model, group):
        from torch.nn.parallel import DistributedDataParallel as DDP
        return DDP(model, bucket_cap_mb=self.args.bucket_mb, process_group=group,
                   gradient_as_bucket_view=self.args.bucket_view)

    def make_opt(self, params):
        return self.torch.optim.SGD(params, lr=self.args.lr, momentum=0.9)

    def batch(self, step, rank):
        """Each rank its own shard of the same stream, the same for every
        backend and for the reference."""
        a, torch = self.args, self.torch
        gen = torch.Generator().manual_seed((a.seed * 1000 + rank) * 100003 + step)
        x = torch.randn(a.batch, a.hidden, generator=gen)
        return x, torch.tanh(x @ self.w_true) + 0.01 * torch.randn(a.batch, a.out, generator=gen)

    def loss(self, out, y):
        return self.torch.nn.functional.mse_loss(out, y)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    train_common.add_common_args(ap)
    ap.add_argument("--hidden", type=int, default=1024, help="width of the hidden layers")
    ap.add_argument("--layers", type=int, default=5, help="Linear layers (5 x 1024 wide: 16 MiB of gradients)")
    ap.add_argument("--out", type=int, default=16)
    ap.add_argument("--batch", type=int, default=16, help="samples per rank per step")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--bucket-mb", type=float, default=25, help="DDP bucket_cap_mb")
    ap.add_argument("--bucket-view", action=argparse.BooleanOptionalAction, default=True,
                    help="DDP gradient_as_bucket_view (default on, both backends): gradients live in the "
                         "buckets, with no copy in and out")
    args = train_common.parse(ap)
    results = train_common.run(args, MLP(args))
    a = args
    grad_bytes = 4 * results[a.backends[0]][0]["params"]
    train_common.report(args, results, f"DDP: MLP {a.layers} x {a.hidden} wide, "
                        f"{grad_bytes / 2**20:.1f} MiB of gradients, batch {a.batch} per rank, "
                        f"bucket view {'on' if a.bucket_view else 'off'}")


if __name__ == "__main__":
    main()
