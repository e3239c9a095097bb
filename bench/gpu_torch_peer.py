#!/usr/bin/env python3
"""A GPU peer where ONNX Runtime's CUDA execution provider is not installed: PyTorch eager (cuDNN,
cuBLAS) on the same GPU, on the same architectures as the zoo's full-size models (torchvision and
transformers with random weights, not the same files). fp32 with TF32 off (nnfuse computes fp32),
batch 1, host in and host out as `nnfuse run` measures it: median of --runs after warm-up.

    python3 bench/gpu_torch_peer.py --out /tmp/gpu [--runs 50]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def models():
    import torchvision.models as tvm

    yield "resnet50", lambda: tvm.resnet50(), lambda: (torch.rand(1, 3, 224, 224),)
    yield "mobilenetv2", lambda: tvm.mobilenet_v2(), lambda: (torch.rand(1, 3, 224, 224),)
    yield "efficientnet_b0", lambda: tvm.efficientnet_b0(), lambda: (torch.rand(1, 3, 224, 224),)
    yield "vit_b16", lambda: tvm.vit_b_16(), lambda: (torch.rand(1, 3, 224, 224),)
    from transformers import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel

    yield "bert_base", lambda: BertModel(BertConfig()), lambda: (torch.randint(0, 10, (1, 128)), torch.ones(1, 128, dtype=torch.long))
    yield "gpt2", lambda: GPT2LMHeadModel(GPT2Config()), lambda: (torch.randint(0, 10, (1, 64)),)


def first_tensor(out):
    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "last_hidden_state"):
        return out.last_hidden_state
    if hasattr(out, "logits"):
        return out.logits
    return out[0]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/gpu_torch")
    ap.add_argument("--runs", type=int, default=50)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    dev = torch.device("cuda")
    rows = []
    for name, make, inputs in models():
        try:
            m = make().eval().to(dev)
            xs = inputs()
            with torch.no_grad():
                for _ in range(5):
                    first_tensor(m(*[x.to(dev) for x in xs])).cpu()
                torch.cuda.synchronize()
                t = []
                for _ in range(a.runs):
                    t0 = time.perf_counter()
                    first_tensor(m(*[x.to(dev) for x in xs])).cpu()
                    t.append((time.perf_counter() - t0) * 1e3)
            t.sort()
            rows.append({"model": name, "torch_ms": t[len(t) // 2], "torch_min_ms": t[0]})
        except Exception as e:  # a missing package or model is a row
            rows.append({"model": name, "error": str(e)[-500:]})
        print(json.dumps(rows[-1]), flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "torch_peer.json").write_text(json.dumps({"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
