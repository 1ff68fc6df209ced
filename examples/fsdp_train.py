#!/usr/bin/env python3
"""Trains a small transformer-style language model on synthetic tokens with
FSDP2 (torch.distributed.fsdp.fully_shard) on N CPU processes, once with
the gloo backend and once with loom (Loom's torch.distributed backend,
bindings/torch), from the same seed; checks that the two runs' losses agree
step by step and prints both backends' time per step. Both models train in
the same processes, one step of each in turn, so that the two timings see
the same machine.

    PYTHONPATH=<build>/bindings/torch python3 examples/fsdp_train.py --ranks 2 --steps 10
    PYTHONPATH=<build>/bindings/torch \\
        torchrun --standalone --nproc-per-node 2 examples/fsdp_train.py --backend loom

The model: a token and a position embedding, --layers
torch.nn.TransformerEncoderLayer blocks (self-attention and an MLP,
pre-norm, no dropout), a final LayerNorm and a linear head over the
vocabulary; each block is its own FSDP unit and the root holds the
embeddings and the head, so a step all-gathers every unit's parameters in
the forward and again in the backward pass and reduce-scatters their
gradients (the gradients averaged over the ranks). The task: predict the
next token of sequences made by a fixed random rule, so the loss falls.

FSDP2 on CPU needs nothing special: a DeviceMesh of device type "cpu"
over the backend's group (DeviceMesh.from_group), and the collectives
FSDP2 calls, all_gather_into_tensor and reduce_scatter_tensor, which gloo
and loom both have. Exit status and options as examples/ddp_train.py
(train_common.py holds what they share).

SPDX-License-Identifier: Apache-2.0
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_common  # noqa: E402


class TinyLM:
    """The model, data and optimizer of this example (train_common's spec)."""

    def __init__(self, args):
        self.args = args

    def make_model(self, torch):
        a = self.args
        self.torch = torch
        nn = torch.nn

        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.tok = nn.Embedding(a.vocab, a.dim)
                self.pos = nn.Embedding(a.seq, a.dim)
                self.blocks = nn.ModuleList(
                    nn.TransformerEncoderLayer(a.dim, a.heads, a.ffn, dropout=0.0, batch_first=True,
                                               norm_first=True) for _ in range(a.layers))
                self.norm = nn.LayerNorm(a.dim)
                self.head = nn.Linear(a.dim, a.vocab)
                self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(a.seq),
                                     persistent=False)

            def forward(self, x):
                h = self.tok(x) + self.pos(torch.arange(x.shape[1]))
                for b in self.blocks:
                    h = b(h, src_mask=self.mask, is_causal=True)
                return self.head(self.norm(h))

        return Model()

    def wrap(self, model, group):
        import torch.distributed as dist
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard
        mesh = DeviceMesh.from_group(group if group is not None else dist.group.WORLD, "cpu")
        for b in model.blocks:
            fully_shard(b, mesh=mesh)
        return fully_shard(model, mesh=mesh)

    def make_opt(self, params):
        return self.torch.optim.AdamW(params, lr=self.args.lr, weight_decay=0.01)

    def batch(self, step, rank):
        """Sequences of a fixed rule (the next token: a * token + b mod the
        vocabulary, a few rules mixed), each rank its own shard."""
        a, torch = self.args, self.torch
        gen = torch.Generator().manual_seed((a.seed * 1000 + rank) * 100003 + step)
        rule = torch.randint(0, 4, (a.batch, 1), generator=gen)
        t0 = torch.randint(0, a.vocab, (a.batch, 1), generator=gen)
        seq = [t0]
        for _ in range(a.seq):
            seq.append((seq[-1] * (2 * rule + 3) + rule + 1) % a.vocab)
        s = torch.cat(seq, 1)
        return s[:, :-1], s[:, 1:]

    def loss(self, out, y):
        return self.torch.nn.functional.cross_entropy(out.flatten(0, 1), y.flatten())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    train_common.add_common_args(ap)
    ap.add_argument("--dim", type=int, default=256, help="model width")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=1024, help="the MLP's hidden width")
    ap.add_argument("--layers", type=int, default=4, help="transformer blocks")
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--seq", type=int, default=32, help="tokens per sequence")
    ap.add_argument("--batch", type=int, default=4, help="sequences per rank per step")
    ap.add_argument("--lr", type=float, default=1e-3)
    args = train_common.parse(ap)
    results = train_common.run(args, TinyLM(args))
    a = args
    mib = 4 * results[a.backends[0]][0]["params"] / 2**20
    train_common.report(args, results, f"FSDP2: {a.layers} blocks {a.dim} wide (MLP {a.ffn}, {a.heads} heads), "
                        f"vocabulary {a.vocab}, {mib:.1f} MiB of parameters, batch {a.batch} x {a.seq} "
                        f"tokens per rank")


if __name__ == "__main__":
    main()
