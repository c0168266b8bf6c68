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
import warnings

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
            out["ring"] = batch.ring  # where the tensors live: to_device registers it once
            self._cursor = batch.cursor
            del batch  # the tensors hold the lease from here on
            yield out

    def state_dict(self):
        return {"cursor": dict(self._cursor) if self._cursor else None}

    def load_state_dict(self, state):
        self._cursor = state.get("cursor")


# cudaHostRegister flags: portable, and read-only (the ring is mapped read-only).
_REGISTER_FLAGS = 0x01 | 0x08


class _Registrations:
    """The ring mappings registered with the CUDA runtime: each once, for as long as batches of
    it are in flight; a mapping no batch uses any more (a re-attach made a new one) is
    unregistered before it can be unmapped (the Ring object keeps it mapped until then)."""

    def __init__(self):
        self._rings = {}  # address -> Ring
        self.error = None  # why copies go from pageable memory, if they do

    def add(self, ring):
        if ring is None or ring.address in self._rings or self.error is not None:
            return
        err = torch.cuda.cudart().cudaHostRegister(ring.address, ring.size, _REGISTER_FLAGS)
        if int(err) != 0:
            self.error = f"cudaHostRegister of the {ring.size / 2**20:.1f} MiB ring failed ({err}); copies go from pageable memory"
            return
        self._rings[ring.address] = ring

    def drop_unused(self, in_use):
        for address in [a for a in self._rings if a not in in_use]:
            torch.cuda.cudart().cudaHostUnregister(address)
            del self._rings[address]


def _pinned_source(ring, tensor):
    """Where to copy a CPU tensor from: its bytes in the registered ring mapping when it is one
    of the batch's tensors (Batch.torch() puts them in a copy-on-write view of the ring) and
    none of its bytes was written; otherwise the tensor itself (a pageable copy)."""
    if ring is None or tensor.device.type != "cpu" or not tensor.is_contiguous() or tensor.numel() == 0:
        return tensor
    view = ring._shared_view(tensor.data_ptr(), tensor.numel() * tensor.element_size())
    if view is None:
        return tensor
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch notes the memory is not writable
        return torch.from_numpy(view).view(tensor.dtype).view(tensor.shape)


def to_device(iterable, device, non_blocking=True):
    """Moves each batch's tensors to `device`. On CUDA, each ring mapping is registered once
    with cudaHostRegister (so copies run at pinned-memory speed; a tensor written in place
    since it left the daemon is copied from its own pages instead, write included), batch k+1 is copied on a side
    stream while the caller works on batch k, and the CPU tensors (and so the ring slot) are
    kept until the copy's event has completed. On CPU, batches pass through."""
    device = torch.device(device)
    if device.type != "cuda":
        yield from iterable
        return
    stream = torch.cuda.Stream(device)
    registrations = _Registrations()
    pending = None  # (batch on the device, its event, the CPU batch it came from)
    try:
        for batch in iterable:
            ring = batch.get("ring")
            registrations.add(ring)
            with torch.cuda.stream(stream):
                moved = {k: _pinned_source(ring, v).to(device, non_blocking=non_blocking)
                         if torch.is_tensor(v) else v for k, v in batch.items()}
                event = torch.cuda.Event()
                event.record(stream)
            if pending is not None:
                torch.cuda.current_stream(device).wait_event(pending[1])
                yield pending[0]
                # The CPU batch (and its ring slot) goes only once its copy is done: a wait on
                # the copy stream's event, never on the stream the model works on.
                pending[1].synchronize()
            pending = (moved, event, batch)
            registrations.drop_unused({ring.address} if ring is not None else set())
        if pending is not None:
            torch.cuda.current_stream(device).wait_event(pending[1])
            yield pending[0]
            pending[1].synchronize()
    finally:
        stream.synchronize()
        pending = None
        registrations.drop_unused(set())


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
