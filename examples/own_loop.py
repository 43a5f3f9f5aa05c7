"""An ordinary PyTorch training loop, made data-parallel by psring with one changed line (the
DistributedOptimizer), as Horovod's and BytePS's are. Run it with torchrun:

    torchrun --nproc-per-node 2 examples/own_loop.py --sync ps --out runs/own-ps
    torchrun --nproc-per-node 2 examples/own_loop.py --sync allreduce --out runs/own-ar

It trains psring's small CNN on its synthetic images (stand-ins for your model and data) for one epoch,
DistributedSampler giving each rank its part of every global batch; ``psring train --sync ps --workers 2
--model cnn --num-samples 512 --batch-size 16 --epochs 1 --seed 3`` trains the same model on the same
global batches (tests/test_own_loop.py holds the two to 1e-5).
"""
import argparse
import os

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import psring
from psring.train.datasets import build_dataset
from psring.train.models import build_model

ap = argparse.ArgumentParser()
ap.add_argument("--sync", default="allreduce")
ap.add_argument("--out", default=None)
ap.add_argument("--seed", type=int, default=3)
args = ap.parse_args()

data = build_dataset("synthetic", 512, args.seed)  # your data: here 512 images of 3x32x32
mean, std = torch.tensor(data.mean).view(1, 3, 1, 1), torch.tensor(data.std).view(1, 3, 1, 1)
images = (torch.from_numpy(data.images).float() / 255 - mean) / std
dataset = TensorDataset(images, torch.from_numpy(data.labels))
sampler = DistributedSampler(dataset, num_replicas=int(os.environ["WORLD_SIZE"]), rank=int(os.environ["RANK"]),
                             shuffle=True, seed=args.seed * 1_000_003, drop_last=True)  # torchrun's variables
loader = DataLoader(dataset, batch_size=16, sampler=sampler, drop_last=True)

model = build_model("cnn", args.seed)  # your model
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
opt = psring.DistributedOptimizer(opt, model, sync=args.sync, out=args.out)  # the one line psring adds

for epoch in range(1):
    sampler.set_epoch(epoch)
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
opt.close()
if opt.rank == 0 and args.out:
    torch.save(model.state_dict(), f"{args.out}/model.pt")
