"""mmfeed: zero-copy batches from the node's mmfeedd daemon.

    import mmfeed
    for batch in mmfeed.Client():            # $MMFEED_SOCKET, rank $LOCAL_RANK
        images = batch["image"]              # read-only numpy view of the ring slot
        ...                                  # the slot is freed when the last view goes

A batch is a lease: its ring slot stays held while the Batch or any array or tensor made from
it lives. `with batch:` or `batch.release()` release early (and raise if views are still alive).
Checkpoint `batch.cursor` with the model and pass it back as `resume=` to continue exactly.
An exception that lands as next() returns (a signal handler's, KeyboardInterrupt, one sent from
another thread) loses nothing: a batch the caller never used goes back to the client, and the
next next() returns it.

Built with the C++ client (client/client.h); after `bash scripts/build.sh`:
`PYTHONPATH=build/python /usr/bin/python3 -c "import mmfeed"`.
"""
from ._mmfeed import AttachError, Batch, DaemonGone, Ring, StoppedEarly, _Client

__all__ = ["AttachError", "Batch", "Client", "DaemonGone", "Ring", "StoppedEarly"]


class Client(_Client):
    """Attaches to mmfeedd for one consumer rank; iterating yields Batch objects until the
    end of the data.

    socket: the daemon's socket (default $MMFEED_SOCKET, then /run/mmfeed/mmfeed.sock, the
        service's, or /tmp/mmfeed.sock, mmfeedd's own default, whichever exists).
    rank: the consumer rank (default: the launcher's local rank, $LOCAL_RANK as torchrun sets
        it or $SLURM_LOCALID under srun, then 0). Under torchrun or srun the attach also
        declares the job's shape (nodes, trainers per node, this node's rank), which a daemon
        with `consumers: auto` adopts.
    resume: a cursor (batch.cursor of the last batch finished, or its "seq"): serve the
        batches after it.
    reconnect_s: if the daemon goes away, keep re-attaching for this long and continue after
        the last batch delivered (no gap, no duplicate).
    timeout_s: how long next() waits by default (None: forever).

    Raises AttachError (rank taken or out of range, permission, no daemon), DaemonGone,
    StoppedEarly (the daemon stopped before the end of the data), TimeoutError. A client used
    in a forked child (e.g. a DataLoader worker) raises: attach in the child instead, or use
    DataLoader(num_workers=0).
    """

    def __init__(self, socket=None, rank=None, resume=None, reconnect_s=0, timeout_s=None):
        super().__init__(socket, rank, resume, float(reconnect_s), timeout_s)

    @property
    def info(self):
        """The daemon's attach reply: rank, generation, consumers, pipeline name, ring size."""
        import json

        return json.loads(self._info)


def _torch(self):
    """The batch's tensors as CPU torch tensors, without a copy (they keep the lease alive);
    bfloat16 tensors are torch.bfloat16. They lie in a copy-on-write view of the ring: an
    in-place write (x.add_(1)) copies the pages it touches into this process, never into the
    ring, and is dropped when the batch is released."""
    import torch

    dtypes = self.dtypes
    out = {}
    for name, array in self._writable_tensors().items():
        if dtypes[name] == "bfloat16":  # its bits (torch takes no uint16 array): int16 view
            out[name] = torch.from_numpy(array.view("int16")).view(torch.bfloat16)
        else:
            out[name] = torch.from_numpy(array)
    return out


Batch.torch = _torch
