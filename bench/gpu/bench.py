#!/usr/bin/env python3
"""The GPU benchmark (bench/gpu/README.md), run by bench/gpu/run.sh on one GPU, inside a time budget.

Part 1, throughput: for each size in SIZES, train_gpt (ours) under ZeRO-0 and ZeRO-2, the
PyTorch peer (torch_gpt.py) and DeepSpeed (deepspeed_gpt.py) under ZeRO-0 and ZeRO-2, each for
WARMUP + STEPS optimizer steps: tokens/s (median step), MFU, peak device memory.
Part 2, the largest model: for each offload mode in OFFLOAD_MODES (cpu: ZeRO-3 + offload of
parameters and optimizer to host memory; nvme: to files under NVME_DIR), the sizes of LADDER in
ascending order, ours then DeepSpeed at each size, PROBE_STEPS steps each; a system's ladder
stops at its first failure (or timeout).

Every run is a child process with a timeout, so a failing or hanging peer is recorded and the
bench goes on. The whole bench keeps to BENCH_BUDGET_S: part 1 may use PART1_SHARE of it; a run
that would start with less than its minimum left is skipped and says so. Prints one table and
writes it, with each run's command, exit status and (on failure) its log's end, to
$OUT/gpu_bench.txt ($OUT defaults to /tmp). Per-run logs stay under WORK_DIR.

Env (defaults): TRAIN_GPT (build-cuda/bin/train_gpt), SIZES ("350M 1.3B"), STEPS (8),
WARMUP (3), MICRO (8), SEQ (1024), PEAK_TFLOPS (989: H100 SXM bf16 dense), BENCH_BUDGET_S
(300), PART1_SHARE (0.65), RUN_TIMEOUT_S (150), LADDER ("2.7B 6.7B"), OFFLOAD_MODES
("cpu nvme"), PROBE_STEPS (2), PROBE_MICRO (4), PROBE_TIMEOUT_S (180), NVME_DIR
(/tmp/gpu_bench_nvme), SKIP_OURS / SKIP_TORCH / SKIP_DEEPSPEED (0), TORCH_AUTOCAST (0: 1 adds
the PyTorch peer under autocast), PREBUILD_OPS (1: compile DeepSpeed's cpu_adam/async_io ops in
the background during part 1, niced, MAX_JOBS 4), CORPUS (a text for train_gpt; default: the
committed tests/data/austen_slice.txt repeated to 1 MB), WORK_DIR (/tmp/gpu_bench), PYTHON
(the running python3), DEVICE (cuda; cpu runs the peers on the CPU, for smoke tests).
"""
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import ds_configs  # noqa: E402  (standard library only)

# (n_layer, n_embd, n_head) as gpt_model.SIZES; repeated here so this file never imports torch.
SIZES = {"tiny": (2, 64, 2), "125M": (12, 768, 12), "350M": (24, 1024, 16),
         "1.3B": (24, 2048, 16), "2.7B": (32, 2560, 32), "6.7B": (32, 4096, 32),
         "13B": (40, 5120, 40)}
GiB = float(1 << 30)


def env(name, default):
    return os.environ.get(name, default)


def env_float(name, default):
    return float(os.environ.get(name, default))


class Budget:
    def __init__(self, total_s):
        self.start, self.total = time.monotonic(), total_s

    def elapsed(self):
        return time.monotonic() - self.start

    def left(self, share=1.0):
        return self.total * share - self.elapsed()


def num_parameters(n_layer, n_embd, vocab=ds_configs.GPT2_VOCAB, seq_len=1024):
    c = n_embd
    return vocab * c + seq_len * c + n_layer * (12 * c * c + 13 * c) + 2 * c


def model_flops_per_token(params, n_layer, n_embd, seq_len):
    # train_gpt's formula (examples/train_gpt/main.cpp, model_flops_per_token).
    return 6.0 * (params - seq_len * n_embd) + 12.0 * n_layer * n_embd * seq_len


class DeviceMonitor:
    """Polls, while a run lasts, the GPU memory its processes use (NVML's per-process figures for
    the child's process tree: CUDA context and caching allocator included; where NVML names no
    process of the tree, e.g. in a container with other PIDs, the whole device's used memory
    above what it was at the start) and the tree's RSS. Keeps the peaks."""

    def __init__(self, pid):
        self.pid, self.peak_used, self.peak_rss, self.base_used = pid, 0, 0, 0
        self.per_process = False  # whether peak_used comes from NVML's per-process figures
        self._device_peak = 0
        self._stop = threading.Event()
        self._nvml = None
        try:
            import pynvml
            pynvml.nvmlInit()
            self._nvml = (pynvml, pynvml.nvmlDeviceGetHandleByIndex(0))
            self.base_used = pynvml.nvmlDeviceGetMemoryInfo(self._nvml[1]).used
        except Exception:  # no NVML (CPU machine): GPU figures stay 0
            self._nvml = None
        try:
            import psutil
            self._proc = psutil.Process(pid)
        except Exception:
            self._proc = None
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _tree(self):
        procs = [self._proc] + self._proc.children(recursive=True) if self._proc else []
        return procs

    def _sample(self):
        procs = self._tree()
        if self._proc:
            rss = 0
            for p in procs:
                try:
                    rss += p.memory_info().rss
                except Exception:
                    pass
            self.peak_rss = max(self.peak_rss, rss)
        if self._nvml:
            pynvml, handle = self._nvml
            self._device_peak = max(self._device_peak,
                                    pynvml.nvmlDeviceGetMemoryInfo(handle).used - self.base_used)
            pids = {p.pid for p in procs} or {self.pid}
            mine = [p.usedGpuMemory or 0
                    for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle) if p.pid in pids]
            if mine:
                self.per_process = True
                self.peak_used = max(self.peak_used, sum(mine))

    def _poll(self):
        while not self._stop.is_set():
            try:
                self._sample()
            except Exception:
                pass
            self._stop.wait(0.1)

    def stop(self):
        self._stop.set()
        self._thread.join()
        # NVML there, but none of the run's processes in its list: the device-wide figure.
        self.fallback = self._nvml is not None and not self.per_process
        if self.fallback:
            self.peak_used = self._device_peak


def run_child(cmd, log_path, timeout_s, extra_env):
    """Runs cmd (its own process group) with stdout+stderr to log_path; kills the group at the
    timeout. Returns (exit status or 'timeout', wall seconds, monitor)."""
    child_env = dict(os.environ, PYTHONUNBUFFERED="1", **extra_env)
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env,
                                cwd=ROOT, start_new_session=True)
        mon = DeviceMonitor(proc.pid)
        try:
            rc = proc.wait(timeout=max(1.0, timeout_s))
        except subprocess.TimeoutExpired:
            rc = "timeout"
            for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
                try:
                    os.killpg(proc.pid, sig)
                    proc.wait(timeout=wait_s)
                    break
                except (subprocess.TimeoutExpired, ProcessLookupError):
                    continue
        finally:
            mon.stop()
    return rc, time.monotonic() - t0, mon


def log_tail(path, lines=12):
    try:
        with open(path, errors="replace") as f:
            text = f.read().splitlines()
    except OSError:
        return ""
    # The lines that say what went wrong first, then the very end.
    text = [l for l in text if not l.startswith("$ ")]  # the command: the report has it
    errors = [l for l in text if re.search(r"error|Error|out of memory|refused|Killed|Traceback",
                                           l)][:6]
    return "\n".join(["    " + l[:300] for l in errors + ["..."] + text[-lines:]])


class Bench:
    def __init__(self):
        self.python = env("PYTHON", sys.executable)
        self.train_gpt = env("TRAIN_GPT", os.path.join(ROOT, "build-cuda/bin/train_gpt"))
        if not os.path.isabs(self.train_gpt):
            self.train_gpt = os.path.join(ROOT, self.train_gpt)
        self.work = env("WORK_DIR", "/tmp/gpu_bench")
        os.makedirs(self.work, exist_ok=True)
        self.out = env("OUT", "") or "/tmp"
        self.steps, self.warmup = int(env("STEPS", 8)), int(env("WARMUP", 3))
        self.micro, self.seq = int(env("MICRO", 8)), int(env("SEQ", 1024))
        self.peak_tflops = env_float("PEAK_TFLOPS", 989.0)
        self.budget = Budget(env_float("BENCH_BUDGET_S", 300))
        self.part1_share = env_float("PART1_SHARE", 0.65)
        self.run_timeout = env_float("RUN_TIMEOUT_S", 150)
        self.probe_timeout = env_float("PROBE_TIMEOUT_S", 180)
        self.probe_steps, self.probe_micro = int(env("PROBE_STEPS", 2)), int(env("PROBE_MICRO", 4))
        self.nvme_dir = env("NVME_DIR", "/tmp/gpu_bench_nvme")
        self.device = env("DEVICE", "cuda")  # the peers' --device (cpu: smoke tests)
        self.skip = {s for s in ("ours", "torch", "deepspeed") if env(f"SKIP_{s.upper()}", "0") == "1"}
        self.rows = []      # one dict per run, in order
        # Lines for the report; run.sh passes what it worked around in BENCH_NOTES.
        self.notes = [l for l in env("BENCH_NOTES", "").splitlines() if l.strip()]
        self.port = 29600
        self.prebuild = None

    # ------------------------------------------------------------------ preparation
    def corpus(self):
        path = env("CORPUS", "")
        if path:
            return path
        # train_gpt needs text; throughput does not depend on which. Its held-out 5% must fill
        # one micro-batch (it evaluates one): at ~4 bytes a token, 120 bytes per batch token
        # leaves 50% to spare (1 MB at least: ~260k tokens).
        src = os.path.join(ROOT, "tests/data/austen_slice.txt")
        path = os.path.join(self.work, "corpus.txt")
        with open(src) as f:
            text = f.read()
        want = max(1 << 20, 120 * max(self.micro, self.probe_micro) * self.seq)
        with open(path, "w") as f:
            f.write(text * max(1, want // len(text) + 1))
        return path

    def start_prebuild(self, modes):
        """DeepSpeed JIT-compiles cpu_adam (and async_io for nvme) at its first offload run; do
        it now, niced, while part 1 measures (16 cores, MAX_JOBS 4), so part 2 does not wait."""
        if "deepspeed" in self.skip or not modes or env("PREBUILD_OPS", "1") != "1":
            return
        offload = "nvme" if "nvme" in modes else "cpu"
        cmd = ["nice", "-n", "19", self.python, os.path.join(HERE, "deepspeed_gpt.py"),
               "--build_ops_only", "--offload", offload, "--zero", "3"]
        log = os.path.join(self.work, "prebuild_ops.log")

        def build():
            rc, secs, _ = run_child(cmd, log, 900, {"MAX_JOBS": "4"})
            self.prebuild_result = (rc, secs)

        self.prebuild_result = None
        self.prebuild = threading.Thread(target=build, daemon=True)
        self.prebuild.start()
        self.notes.append(f"DeepSpeed ops ({offload}) prebuilt in the background from "
                          f"t={self.budget.elapsed():.0f}s (log {log})")

    def wait_prebuild(self, limit_s):
        if self.prebuild is None:
            return
        self.prebuild.join(timeout=max(0.0, limit_s))
        if self.prebuild.is_alive():
            self.notes.append("DeepSpeed op prebuild still running when part 2 needed it; "
                              "the DeepSpeed run compiles (or waits for) them itself")
        elif self.prebuild_result:
            rc, secs = self.prebuild_result
            self.notes.append(f"DeepSpeed op prebuild: exit {rc} after {secs:.0f} s")
        self.prebuild = None

    # ------------------------------------------------------------------ one run
    def next_port(self):
        self.port += 1
        return str(self.port)

    def ours_cmd(self, name, size, stage, offload, steps, micro):
        L, C, H = SIZES[size]
        cfg = ds_configs.make(stage, offload, micro, n_embd=C,
                              nvme_path=os.path.join(self.nvme_dir, name))
        cfg_path = os.path.join(self.work, name + ".ds_config.json")
        with open(cfg_path, "w") as f:
            json.dump(cfg, f, indent=2)
        metrics = os.path.join(self.work, name + ".metrics.jsonl")
        if os.path.exists(metrics):
            os.remove(metrics)
        cmd = [self.train_gpt, "--deepspeed_config", cfg_path, "--steps", str(steps),
               "--n_layer", str(L), "--n_embd", str(C), "--n_head", str(H),
               "--seq_len", str(self.seq), "--data", self.corpus_path, "--eval_batches", "1",
               "--metrics_file", metrics, "--peak_tflops", str(self.peak_tflops)]
        return cmd, metrics

    def peer_cmd(self, system, size, stage, offload, steps, warmup, micro, precision):
        script = "torch_gpt.py" if system == "torch" else "deepspeed_gpt.py"
        cmd = [self.python, os.path.join(HERE, script), "--size", size, "--seq_len",
               str(self.seq), "--micro_batch", str(micro), "--steps", str(steps), "--warmup",
               str(warmup), "--peak_tflops", str(self.peak_tflops), "--device", self.device]
        if system == "torch":
            cmd += ["--precision", precision]
        else:
            cmd += ["--zero", str(stage), "--offload", offload, "--nvme_path",
                    os.path.join(self.nvme_dir, f"ds_{size}_{offload}")]
        return cmd

    def run(self, part, system, size, stage=0, offload="none", precision="master"):
        """One run, recorded in self.rows. Returns the row (row['ok'] says whether it trained)."""
        probe = part == 2
        steps = self.probe_steps if probe else self.steps
        warmup = 1 if probe else self.warmup
        micro = self.probe_micro if probe else self.micro
        label = {"ours": "ours", "torch": "PyTorch", "deepspeed": "DeepSpeed"}[system]
        if system == "torch":
            config = f"{precision}" if precision != "master" else "bf16+fp32 master"
        else:
            config = f"ZeRO-{stage}" + ("" if offload == "none" else f"+{offload} offload")
        name = f"p{part}_{system}_{size}_z{stage}_{offload}" + (
            f"_{precision}" if system == "torch" else "")
        L, C, H = SIZES[size]
        row = {"part": part, "system": system, "label": label, "size": size, "config": config,
               "stage": stage, "offload": offload, "precision": precision, "name": name,
               "params": num_parameters(L, C, seq_len=self.seq), "ok": False,
               "n_layer": L, "n_embd": C, "micro": micro, "steps": steps, "warmup": warmup}
        self.rows.append(row)
        share = self.part1_share if part == 1 else 1.0
        left = self.budget.left(share)
        minimum = 45.0 if probe else 20.0
        if left < minimum:
            row["status"] = f"skipped: {left:.0f} s of the budget left for part {part}"
            print(f"[bench] {name}: {row['status']}", flush=True)
            return row
        timeout = min(self.probe_timeout if probe else self.run_timeout, self.budget.left())
        log = os.path.join(self.work, name + ".log")
        extra = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": self.next_port()}
        if system == "ours":
            cmd, metrics = self.ours_cmd(name, size, stage, offload, warmup + steps, micro)
        else:
            cmd = self.peer_cmd(system, size, stage, offload, steps, warmup, micro, precision)
            metrics = None
        if offload == "nvme":
            os.makedirs(self.nvme_dir, exist_ok=True)
        print(f"[bench] t={self.budget.elapsed():.0f}s {name}: starting (timeout {timeout:.0f} s)",
              flush=True)
        rc, wall, mon = run_child(cmd, log, timeout, extra)
        if offload == "nvme":
            subprocess.run(["rm", "-rf", self.nvme_dir])
        row.update({"cmd": " ".join(cmd), "rc": rc, "wall_s": wall, "log": log,
                    "nvml_peak_used": mon.peak_used, "nvml_fallback": mon.fallback,
                    "host_peak_rss": mon.peak_rss})
        try:
            if system == "ours":
                self.parse_ours(row, metrics, log, warmup)
            else:
                self.parse_peer(row, log)
        except Exception as e:  # a run that printed no result
            row.setdefault("reason", f"no result ({type(e).__name__}: {e})")
        row["ok"] = rc == 0 and "tokens_per_s" in row
        if not row["ok"]:
            why = f"timed out after {timeout:.0f} s" if rc == "timeout" else f"exit {rc}"
            if rc == 0:
                why += ", " + row.get("reason", "no result")
            row["status"] = f"failed ({why})"
            row["tail"] = log_tail(log)
        else:
            row["status"] = "ok"
        print(f"[bench] {name}: {row['status']} in {wall:.0f} s"
              + (f", {row['tokens_per_s']:.0f} tokens/s" if "tokens_per_s" in row else ""),
              flush=True)
        return row

    def parse_peer(self, row, log):
        result = None
        with open(log, errors="replace") as f:
            for line in f:
                if line.startswith("RESULT "):
                    result = json.loads(line[len("RESULT "):])
        if result is None:
            raise ValueError("no RESULT line")
        row.update({"tokens_per_s": result["tokens_per_s"], "mfu": result["mfu"],
                    "step_s": result["step_s_median"], "params": result["params"],
                    "peak_alloc": result["peak_device_bytes"], "loss": result["last_loss"],
                    "op_build_s": result.get("op_build_s"), "attention": result.get("attention")})

    def parse_ours(self, row, metrics, log, warmup):
        with open(metrics) as f:
            steps = [json.loads(l) for l in f if l.strip()]
        if not steps:
            raise ValueError("empty metrics file")
        timed = steps[warmup:] or steps[-1:]
        step_s = statistics.median(r["step_time_s"] for r in timed)
        tokens_per_step = steps[-1]["tokens"] / steps[-1]["step"]
        with open(log, errors="replace") as f:
            text = f.read()
        m = re.search(r"(\d+) params", text)
        params = int(m.group(1)) if m else row["params"]
        tps = tokens_per_step / step_s
        flops = model_flops_per_token(params, row["n_layer"], row["n_embd"], self.seq)
        # The engine's memory report (DeepSpeed's Max_MA: the caching allocator's peak), GiB.
        max_ma = [float(x) for x in re.findall(r"Max_MA ([\d.]+) GB", text)]
        mem = steps[-1].get("memory_bytes", {})
        peak = next((mem[k][0] for k in ("device_max_allocated", "device_peak") if k in mem), None)
        row.update({"tokens_per_s": tps, "mfu": flops * tps / (self.peak_tflops * 1e12),
                    "step_s": step_s, "params": params, "loss": steps[-1]["loss"],
                    "peak_alloc": peak if peak is not None else
                    (max(max_ma) * GiB if max_ma else None)})

    # ------------------------------------------------------------------ the two parts
    def part1(self, sizes):
        torch_precisions = ["master"] + (["autocast"] if env("TORCH_AUTOCAST", "0") == "1" else [])
        for size in sizes:
            plan = [("ours", 0), ("torch", None), ("deepspeed", 0), ("ours", 2), ("deepspeed", 2)]
            for system, stage in plan:
                if system in self.skip:
                    continue
                if system == "torch":
                    for precision in torch_precisions:
                        self.run(1, "torch", size, precision=precision)
                else:
                    self.run(1, system, size, stage=stage)

    def part2(self, ladder, modes):
        systems = [s for s in ("ours", "deepspeed") if s not in self.skip]
        for mode in modes:
            stopped = set()
            for size in ladder:
                for system in systems:
                    if system in stopped:
                        continue
                    if system == "deepspeed":
                        self.wait_prebuild(self.budget.left() - 45)
                    row = self.run(2, system, size, stage=3, offload=mode)
                    if not row["ok"]:
                        stopped.add(system)

    # ------------------------------------------------------------------ report
    def table(self):
        def gib(b):
            return f"{b / GiB:.1f}" if b else "-"

        def count(n):
            return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"

        by = {(r["part"], r["system"], r["size"], r["stage"], r["offload"], r["precision"]): r
              for r in self.rows}
        lines = []
        head = (f"{'config':46s} {'params':>8s} {'tokens/s':>9s} {'MFU':>6s} {'alloc':>6s} "
                f"{'nvml':>6s} {'hostRSS':>7s}  vs peer (tokens/s ratio ours/peer)")
        lines += [head, "-" * len(head)]
        for r in self.rows:
            name = f"{r['size']} {r['label']} {r['config']}"
            if r["part"] == 2:
                name = "[largest] " + name
            if "tokens_per_s" not in r:
                lines.append(f"{name:46s} {count(r['params']):>8s}  {r.get('status', '?')}")
                continue
            ratio = ""
            if r["system"] == "ours" and r["part"] == 1:
                peers = [("PyTorch", by.get((1, "torch", r["size"], 0, "none", "master"))),
                         (f"DeepSpeed ZeRO-{r['stage']}",
                          by.get((1, "deepspeed", r["size"], r["stage"], "none", "master")))]
                ratio = ", ".join(f"{r['tokens_per_s'] / p['tokens_per_s']:.2f}x {n}"
                                  for n, p in peers if p and p.get("tokens_per_s"))
            elif r["system"] == "ours":
                p = by.get((2, "deepspeed", r["size"], 3, r["offload"], "master"))
                if p and p.get("tokens_per_s"):
                    ratio = f"{r['tokens_per_s'] / p['tokens_per_s']:.2f}x DeepSpeed"
            flag = "" if r["ok"] else f" [{r['status']}]"
            lines.append(f"{name:46s} {count(r['params']):>8s} {r['tokens_per_s']:9.0f} "
                         f"{100 * r['mfu']:5.1f}% {gib(r.get('peak_alloc')):>6s} "
                         f"{gib(r.get('nvml_peak_used')) + ('*' if r.get('nvml_fallback') else ''):>6s} "
                         f"{gib(r.get('host_peak_rss')):>7s}  "
                         f"{ratio}{flag}")
        largest = {}
        for r in self.rows:
            if r["part"] == 2 and r["ok"]:
                key = (r["system"], r["offload"])
                if r["params"] > largest.get(key, (0, None))[0]:
                    largest[key] = (r["params"], r)
        lines.append("")
        for mode in sorted({r["offload"] for r in self.rows if r["part"] == 2}):
            for system in ("ours", "deepspeed"):
                tried = [r for r in self.rows if r["part"] == 2 and r["system"] == system
                         and r["offload"] == mode]
                if not tried:
                    continue
                if (system, mode) in largest:
                    params, r = largest[(system, mode)]
                    what = f"{r['size']} ({count(params)}) at {r['tokens_per_s']:.0f} tokens/s"
                else:
                    what = "none of the sizes tried"
                first_fail = next((r for r in tried if not r["ok"]), None)
                beyond = (f"; {first_fail['size']}: {first_fail['status']}" if first_fail else
                          "; every size tried trained")
                lines.append(f"largest with ZeRO-3 + {mode} offload, {system}: {what}{beyond}")
        return "\n".join(lines)

    def write_report(self, header):
        table = self.table()
        detail = []
        for r in self.rows:
            detail.append(f"- {r['name']}: {r.get('status')}"
                          + (f", {r['wall_s']:.0f} s wall" if "wall_s" in r else "")
                          + (f", attention {r['attention']}" if r.get("attention") else "")
                          + (f", DeepSpeed op build/load {r['op_build_s']:.0f} s"
                             if r.get("op_build_s") else "")
                          + (f", final loss {r['loss']:.3f}" if r.get("loss") is not None else ""))
            if "cmd" in r:
                detail.append(f"    $ {r['cmd']}")
            if r.get("tail"):
                detail.append(r["tail"])
        text = "\n".join(header + ["", table, "", "Notes:"] + ["- " + n for n in self.notes]
                         + ["", "Runs:"] + detail) + "\n"
        print("\n" + "=" * 100 + "\n" + text, flush=True)
        os.makedirs(self.out, exist_ok=True)
        path = os.path.join(self.out, "gpu_bench.txt")
        with open(path, "w") as f:
            f.write(text)
        print(f"[bench] wrote {path}", flush=True)


def gpu_description():
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                               "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=20).stdout.strip() or "no GPU (nvidia-smi printed nothing)"
    except (OSError, subprocess.TimeoutExpired):
        return "no nvidia-smi"


def main():
    b = Bench()
    sizes = env("SIZES", "350M 1.3B").split()
    ladder = env("LADDER", "2.7B 6.7B").split()
    modes = env("OFFLOAD_MODES", "cpu nvme").split()
    for s in sizes + ladder:
        if s not in SIZES:
            sys.exit(f"bench: unknown size {s} (known: {' '.join(SIZES)})")
    if "ours" not in b.skip and not os.access(b.train_gpt, os.X_OK):
        b.notes.append(f"ours skipped: {b.train_gpt} is not an executable (set TRAIN_GPT)")
        b.skip.add("ours")
    b.corpus_path = b.corpus()
    header = [
        f"GPU benchmark (bench/gpu): {gpu_description()}",
        f"part 1: sizes {sizes}, seq {b.seq}, micro-batch {b.micro}, {b.warmup} warm-up + "
        f"{b.steps} timed steps, median step; MFU = train_gpt's 6N + 12LCT FLOPs per token "
        f"against {b.peak_tflops:g} TFLOP/s",
        f"part 2: ZeRO-3 + offload {modes}, ladder {ladder}, micro-batch {b.probe_micro}, "
        f"1 + {b.probe_steps} steps; budget {b.budget.total:.0f} s; skipped systems: "
        f"{sorted(b.skip) or 'none'}",
        "columns: alloc = peak of the CUDA caching allocator (torch.cuda.max_memory_allocated; "
        "ours: the engine's Max_MA); nvml = peak GPU memory of the run's processes (NVML, CUDA "
        "context and cache included; marked * where NVML saw no process of the run and the "
        "device's used memory stands in); hostRSS = peak RSS of the run's processes; GiB",
    ]
    print("\n".join(header), flush=True)
    b.start_prebuild(modes if ladder else [])
    b.part1(sizes)
    b.part2(ladder, modes)
    b.wait_prebuild(0)
    b.notes.append(f"bench wall time {b.budget.elapsed():.0f} s of a {b.budget.total:.0f} s budget")
    b.write_report(header)


if __name__ == "__main__":
    main()
