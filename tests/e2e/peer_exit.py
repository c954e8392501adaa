"""How a rank of a DeepSpeed peer leaves: meet the other ranks, then end the process at once.

A rank that returns from its script finalizes the interpreter while torch's Gloo worker threads
still run. Under load one of them can still be destroying finished work (an asynchronous
all-gather of ZeRO-3's) whose tensors own Python objects; releasing those from that thread once
finalization has begun ends the thread inside a noexcept destructor, and the rank aborts with
"terminate called without an active exception" after it wrote its results (seen in CI, and
reproduced here with a core: ~AsyncAllgatherWork -> decref -> PyEval_AcquireThread ->
pthread_exit). Leaving through os._exit skips finalization; the barrier first makes sure that
every rank's collectives and output files are done.
"""
import os
import sys

import torch.distributed as dist


def leave(code=0):
    """Ends this rank with exit status `code` once every rank has got here."""
    sys.stdout.flush()
    sys.stderr.flush()
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    os._exit(code)
