#!/usr/bin/env python3
"""DeepSpeed's side of deepspeed_data_sampling_interop_test: its DataAnalyzer over the same
samples and metric as the C++ test, then its DeepSpeedDataSampler over the index files the C++
DataAnalyzer wrote, for the same config. Writes WORK_DIR/deepspeed.json (stdout carries
DeepSpeed's logs): the difficulty of every global batch, the samples of each cluster file
DeepSpeed wrote, and those of each cluster file the C++ sampler wrote as DeepSpeed's
MMapIndexedDataset reads them.

Checkpoints both ways: after global batch SAVE_AT, DeepSpeed's sampler state goes to
WORK_DIR/their_state.pt (as its engine saves it, under 'data_sampler') and its cluster files as
they are then to WORK_DIR/their_clusters_at_save. A second DeepSpeed sampler resumes from the
C++ sampler's WORK_DIR/our_state.pt (over a copy of the C++ cluster files) and runs to
GLOBAL_BATCHES: deepspeed.json's "resumed_from_ours" holds its difficulties, its first batch and
its cluster positions and consumed samples after that batch.

usage: deepspeed_data_sampling_interop.py WORK_DIR NUM_SAMPLES GLOBAL_BATCHES SAVE_AT PORT"""
import json
import os
import shutil
import sys

import numpy as np
import torch

sys.dont_write_bytecode = True  # leave no __pycache__ in the source tree
from peer_exit import leave  # noqa: E402


def length(samples):
    # The C++ test's metric: (s * 37) % 23 + 5.
    return (samples * 37) % 23 + 5


def bucket_sums(samples):
    # The C++ test's accumulated metric: the sample ids summed into 10 buckets by s % 10.
    return torch.zeros(10, dtype=torch.int64).index_add_(0, samples % 10, samples)


def main():
    work, num_samples, batches, save_at, port = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]),
                                                 int(sys.argv[4]), sys.argv[5])
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=port)
    import deepspeed
    from deepspeed.runtime.data_pipeline.data_sampling.data_analyzer import DataAnalyzer
    from deepspeed.runtime.data_pipeline.data_sampling.data_sampler import DeepSpeedDataSampler
    from deepspeed.runtime.data_pipeline.data_sampling.indexed_dataset import MMapIndexedDataset

    dataset = list(range(num_samples))
    analyzer = DataAnalyzer(dataset, num_workers=1, worker_id=0, num_threads=1, batch_size=7,
                            metric_names=["len", "buckets"],
                            metric_functions=[length, bucket_sums],
                            metric_types=["single_value_per_sample",
                                          "accumulate_value_over_samples"],
                            metric_dtypes=[torch.int64, torch.int64], save_path=f"{work}/theirs")
    analyzer.run_map()
    analyzer.run_reduce()

    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    group = torch.distributed.new_group(ranks=[0])
    config = json.load(open(f"{work}/ds_data_efficiency.json"))

    def new_sampler(cluster_path):
        config["data_sampling"]["curriculum_learning"]["data_cluster_path"] = cluster_path
        return DeepSpeedDataSampler(config, num_samples, micro_batch_size=4, data_parallel_rank=0,
                                    data_parallel_size=1, data_parallel_group=group,
                                    gradient_accumulation_steps=1, global_rank=0)

    # Copied first: the resumed sampler below reshuffles its clusters' files in place.
    shutil.copytree(f"{work}/our_clusters", f"{work}/our_clusters_for_deepspeed")
    sampler = new_sampler(f"{work}/their_clusters")
    difficulties = []
    for _, _ in zip(range(batches), iter(sampler)):
        difficulties.append(dict(sampler.current_difficulties))
        if len(difficulties) == save_at:
            torch.save({"data_sampler": sampler.state_dict()}, f"{work}/their_state.pt")
            shutil.copytree(f"{work}/their_clusters", f"{work}/their_clusters_at_save")

    resumed = new_sampler(f"{work}/our_clusters_for_deepspeed")
    resumed.load_state_dict(torch.load(f"{work}/our_state.pt")["data_sampler"])
    from_ours = {"difficulties": []}
    for _, batch in zip(range(batches - save_at), iter(resumed)):
        if not from_ours["difficulties"]:
            from_ours.update(first_batch=[int(s) for s in batch],
                             paths=list(resumed.data_cluster_paths),
                             positions=[int(p) for p in resumed.data_cluster_current_position],
                             consumed_samples=int(resumed.consumed_samples) + len(batch))
        from_ours["difficulties"].append(dict(resumed.current_difficulties))

    def clusters(folder):
        out = {}
        for name in sorted(os.listdir(folder)):
            if name.endswith(".idx"):
                data = MMapIndexedDataset(f"{folder}/{name[:-4]}", skip_warmup=True)
                out[name[:-4]] = sorted(int(x) for x in np.asarray(data[0]))
        return out

    with open(f"{work}/deepspeed.json", "w") as f:
        json.dump({"difficulties": difficulties,
                   "theirs": clusters(f"{work}/their_clusters"),
                   "ours_read_by_deepspeed": clusters(f"{work}/our_clusters"),
                   "resumed_from_ours": from_ours}, f)


if __name__ == "__main__":
    main()
    leave()
