"""The PyTorch grouped-MLP block of tests/peers/torch_moe_block_peer.py (torch._grouped_mm,
Qwen3-30B-A3B shape, 4096 tokens, the same routing; its make_block and block_step), forward +
backward timed two ways, to compare like with like against moe_bench's two columns:
  accumulating: the weight gradients add to those of the previous iteration (what the peer times;
                moe_bench's "+= grads" column);
  fresh:        the gradients are set to None before each iteration (a step's first micro-batch:
                autograd stores them; moe_bench's "fwd+bwd" column).
Prints one JSON line. Run on the GPU machine: python3 tests/reference/torch_moe_block_grads.py"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "peers"))
from peer_timing import median_ms  # noqa: E402
from torch_moe_block_peer import block_step, grouped_mlp, make_block  # noqa: E402

block = make_block(tokens=4096, hidden=2048, experts=128, topk=8, ffn=768)
print(json.dumps({"torch_block_fwdbwd_ms": {
    "accumulating": median_ms(lambda: block_step(block, grouped_mlp)),
    "fresh": median_ms(lambda: block_step(block, grouped_mlp, fresh_grads=True))}}))
