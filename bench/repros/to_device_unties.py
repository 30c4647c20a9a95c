"""module.to("tpu") breaks parameter sharing (weight tying). Prints False; True on cpu/meta."""
import torch
import torch.nn as nn

import torchtpu  # noqa: F401

m = nn.Module()
m.a, m.b = nn.Linear(2, 2), nn.Linear(2, 2)
m.b.weight = m.a.weight
m.to("tpu")
print("tie kept after .to('tpu'):", m.a.weight is m.b.weight)
