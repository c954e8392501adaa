#!/usr/bin/env python3
"""DeepSpeed's side of bench/data_sampling: its DataAnalyzer over N samples of the same metric
(one worker, one thread, batches of 1000 through a DataLoader as its docs show), then its
DeepSpeedDataSampler drawing B global batches of G samples. Prints
`analyze_s=.. sample_ms_per_batch=..` for run.sh.

usage: deepspeed_data_sampling.py WORK_DIR N G B PORT"""
import json
import os
import sys
import time

import torch


class Samples(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


def metric(samples):
    # data_sampling_bench.cpp's metric, batch-wise.
    return (samples * 2654435761) % 1000


def main():
    work, n, g, b, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), \
        sys.argv[5]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=port)
    import deepspeed
    from deepspeed.runtime.data_pipeline.data_sampling.data_analyzer import DataAnalyzer
    from deepspeed.runtime.data_pipeline.data_sampling.data_sampler import DeepSpeedDataSampler

    t0 = time.perf_counter()
    analyzer = DataAnalyzer(Samples(n), num_workers=1, worker_id=0, num_threads=1,
                            batch_size=1000, metric_names=["m"], metric_functions=[metric],
                            metric_types=["single_value_per_sample"],
                            metric_dtypes=[torch.int64], save_path=f"{work}/theirs")
    analyzer.run_map()
    analyzer.run_reduce()
    analyze_s = time.perf_counter() - t0

    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    group = torch.distributed.new_group(ranks=[0])
    config = json.load(open(f"{work}/config.json"))
    cl = config["data_sampling"]["curriculum_learning"]
    cl["data_cluster_path"] = f"{work}/their_clusters"
    for m in cl["curriculum_metrics"].values():
        m["index_to_sample_path"] = f"{work}/theirs/m/m_index_to_sample"
        m["index_to_metric_path"] = f"{work}/theirs/m/m_index_to_metric"
    sampler = DeepSpeedDataSampler(config, n, micro_batch_size=g, data_parallel_rank=0,
                                   data_parallel_size=1, data_parallel_group=group,
                                   gradient_accumulation_steps=1, global_rank=0)
    t0 = time.perf_counter()
    checksum = 0
    for _, batch in zip(range(b), iter(sampler)):
        checksum += batch[0]
    sample_s = time.perf_counter() - t0
    print(f"analyze_s={analyze_s:.4f} sample_ms_per_batch={1000 * sample_s / b:.4f} "
          f"checksum={checksum}")


if __name__ == "__main__":
    main()
