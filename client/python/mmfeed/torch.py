"""PyTorch integration: a resumable IterableDataset over an mmfeed rank, and a prefetcher to
the device.

    ds = mmfeed.torch.MmfeedDataset()
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0)
    for batch in mmfeed.torch.to_device(loader, "cuda"):
        image = mmfeed.torch.normalize(batch["image"], MEAN, STD)  # a uint8 image stage
        loss = model(image, batch["text"])
        ...
        checkpoint = {"model": ..., "data": ds.state_dict()}   # ds.load_state_dict() on restart
"""
import torch

import mmfeed


class MmfeedDataset(torch.utils.data.IterableDataset):
    """Yields one dict per batch: tensor name -> CPU tensor (zero-copy), plus "ids", "epoch"
    and "seq". Use with DataLoader(ds, batch_size=None, num_workers=0): the daemon already did
    the work of the workers. state_dict() names the position after the last batch yielded;
    load_state_dict() before iterating starts after it (the cursor is kept with the model)."""

    def __init__(self, socket=None, rank=None, reconnect_s=0, timeout_s=None):
        super().__init__()
        self._args = dict(socket=socket, rank=rank, reconnect_s=reconnect_s, timeout_s=timeout_s)
        self._cursor = None

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        if info is not None and info.num_workers > 0:
            raise RuntimeError("MmfeedDataset runs in the main process: use DataLoader(..., num_workers=0)")
        client = mmfeed.Client(resume=self._cursor, **self._args)
        for batch in client:
            out = batch.torch()
            out["ids"] = batch.ids
            out["epoch"] = batch.epoch
            out["seq"] = batch.seq
            self._cursor = batch.cursor
            del batch  # the tensors hold the lease from here on
            yield out

    def state_dict(self):
        return {"cursor": dict(self._cursor) if self._cursor else None}

    def load_state_dict(self, state):
        self._cursor = state.get("cursor")


def to_device(iterable, device, non_blocking=True):
    """Moves each batch's tensors to `device`. On CUDA, batch k+1 is copied on a side stream
    while the caller works on batch k, and the CPU tensors (and so the ring slot) are kept
    until the copy's event has completed. On CPU, batches pass through."""
    device = torch.device(device)
    if device.type != "cuda":
        yield from iterable
        return
    stream = torch.cuda.Stream(device)
    pending = None  # (batch on the device, its event, the CPU batch it came from)
    for batch in iterable:
        with torch.cuda.stream(stream):
            moved = {k: v.to(device, non_blocking=non_blocking) if torch.is_tensor(v) else v for k, v in batch.items()}
            event = torch.cuda.Event()
            event.record(stream)
        if pending is not None:
            torch.cuda.current_stream(device).wait_event(pending[1])
            yield pending[0]
            # The CPU batch (and its ring slot) goes only once its copy is done: a wait on the
            # copy stream's event, never on the stream the model works on.
            pending[1].synchronize()
        pending = (moved, event, batch)
    if pending is not None:
        torch.cuda.current_stream(device).wait_event(pending[1])
        yield pending[0]


def normalize(images, mean, std, layout="CHW", dtype=torch.float32):
    """uint8 images from an image stage with `dtype: uint8` ([N, 3, H, W] for layout CHW, [N,
    H, W, 3] for HWC) to what `dtype: float32` with the same mean and std gives: (pixel / 255 -
    mean) / std, computed where the images are (on the GPU after to_device, so the ring and the
    host-to-device copy carry 4x fewer bytes)."""
    if images.dtype != torch.uint8:
        raise TypeError(f"normalize takes uint8 images, not {images.dtype}")
    if layout not in ("CHW", "HWC"):
        raise ValueError(f"layout is CHW or HWC, not {layout!r}")
    shape = (1, 3, 1, 1) if layout == "CHW" else (1, 1, 1, 3)
    mean = torch.as_tensor(mean, dtype=dtype, device=images.device).view(shape)
    std = torch.as_tensor(std, dtype=dtype, device=images.device).view(shape)
    return (images.to(dtype) / 255 - mean) / std
