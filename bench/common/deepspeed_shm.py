"""DeepSpeed's CPU communication backend leaves its shared-memory buffers behind.

When every rank of a job is on one machine (LOCAL_SIZE == world size, as our launcher and
DeepSpeed's set it), DeepSpeed's CPU backend creates one all-reduce workspace per rank in
/dev/shm, named deepspeed_allreduce_buffer_<uid>_<MASTER_ADDR>_<MASTER_PORT>_<rank> (66 MiB in
0.19.8), and never unlinks it. /dev/shm is memory: a test suite that runs the peer a few dozen
times would hold gigabytes after it ends. Each rank removes its own buffer when it is done; the
other ranks mapped it at initialization, so their mappings stay valid.
"""
import atexit
import os


def own_buffer_path():
    return "/dev/shm/deepspeed_allreduce_buffer_{}_{}_{}_{}".format(
        os.getuid(), os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", ""),
        os.environ.get("RANK", "0"))


def unlink_own_buffer():
    try:
        os.unlink(own_buffer_path())
    except FileNotFoundError:
        pass


def unlink_own_buffer_at_exit():
    """Removes this rank's buffer at interpreter exit; a caller leaving through os._exit calls
    unlink_own_buffer() itself first."""
    atexit.register(unlink_own_buffer)
