"""Devices and torchrun / DDP helpers. One process = plain training; WORLD_SIZE > 1 = DDP (gloo on CPU, nccl on GPU)."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def pick_device(name: str) -> torch.device:
    """``auto`` (a CUDA device when there is one, else the CPU) or a torch device name."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def world_from_env() -> tuple[int, int]:
    """(rank, world size) as torchrun announces them, before any process group exists."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def init_from_env(device: torch.device) -> bool:
    """Initialise the process group when launched by torchrun; returns True if distributed."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return dist.is_initialized()
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend=backend)
    return True


def setup(device: torch.device) -> torch.device:
    """Join the torchrun process group if launched by torchrun; the device this rank works on
    (``cuda:LOCAL_RANK`` on GPUs, else ``device``)."""
    if init_from_env(device) and device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    return device


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
