"""The training loop one worker (rank) runs: engine, data, checkpoints, stop requests, metrics.

Exit codes follow docs/contracts.md: 0 done, 75 interrupted and checkpointed.
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import resource
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import deepspeed
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

from training import inputs, rng, startup
from training.checkpoint.checkpointer import Checkpointer
from training.checkpoint.layout import write_atomically
from training.checkpoint.s3 import STATUS_NAME, S3Mirror
from training.components import build_dataset, build_eval_dataset
from training.contract import RUN_SPANS_FIELD, ExitCode
from training.data import data_workers, worker_processes
from training.engine import build_engine, mean_over_ranks, seed_everything
from training.environment import TrainerEnv
from training.evaluation import Evaluator
from training.goodput import GoodputClock
from training.interrupt import StopFlag, spot_endpoint_from_env
from training.metrics import GpuMonitor, MetricsSink, mfu, peak_tflops, run_cost
from training.oom import explain
from training.sampler import ResumableDistributedSampler, micro_batches
from training.spec.config import BatchSizes, Config, ConfigError, resolve_batch_sizes
from training.spec.parallel import layout
from training.stragglers import StragglerReport
from training.text.stream import StreamedWindows
from training.watchdog import Heartbeat

log = logging.getLogger(__name__)

# How often rank 0 replaces the status object in S3 at most: one small PUT a minute.
STATUS_EVERY_S = 60.0


@dataclass(frozen=True)
class Placement:
    """Where this worker sits, from the launcher's environment."""

    rank: int
    local_rank: int
    world_size: int

    @classmethod
    def from_env(cls, env: TrainerEnv) -> Placement:
        if env.rank is None:
            raise ValueError("a worker's environment has RANK: set by the launcher")
        return cls(rank=env.rank, local_rank=env.local_rank, world_size=env.world_size)


def flops_per_token(model: nn.Module, seq_len: int) -> int:
    """The model's own estimate if it has one, else 6N (forward + backward matmuls).

    An image model's token is the image, `seq_len` its side in pixels."""
    if hasattr(model, "flops_per_token"):
        return model.flops_per_token(seq_len)
    return 6 * sum(_full_numel(p) for p in model.parameters())


def _full_numel(param: torch.Tensor) -> int:
    return getattr(param, "ds_numel", param.numel())


@dataclass
class Job:
    """Everything the loop touches, built once per run."""

    engine: deepspeed.DeepSpeedEngine
    # Where the data stands: the sampler of an indexable dataset, or a streamed dataset
    # itself (training/text/stream.py); each has epoch, consumed and a state_dict.
    sampler: ResumableDistributedSampler | StreamedWindows
    batches: Iterator
    checkpointer: Checkpointer
    batch: BatchSizes
    device: torch.device
    model_flops: int
    evaluator: Evaluator | None = None
    step: int = 0
    # Saved with every checkpoint unchanged: a model.hf run's export metadata.
    carried: dict = field(default_factory=dict)


class Trainer:
    def __init__(
        self,
        config: Config,
        placement: Placement,
        env: TrainerEnv,
        stop: StopFlag | None = None,
    ):
        self.config = config
        self.placement = placement
        self.env = env
        self.stop = stop
        self.on_gpu = torch.cuda.is_available()
        self.is_rank0 = placement.rank == 0
        # Steps and parts of checkpoint saves, for the launcher's hang watchdog.
        self.heartbeat = Heartbeat(env.heartbeat_dir, placement.rank)
        self.data_workers = data_workers(config.data.num_workers, env.local_world_size)

    def run(self) -> int:
        """Train to train.steps (0), or until a stop request, checkpointed (75)."""
        # Listen for SIGTERM and spot notices from the start: one that arrives while the
        # engine is being built stops the job after its first step, with a checkpoint.
        stop = self.stop or StopFlag(spot_endpoint=spot_endpoint_from_env(self.env))
        stop.start()
        try:
            job = self._setup()
            if job.step >= self.config.train.steps:
                log.info(
                    "already at step %d of train.steps = %d: nothing to do",
                    job.step,
                    self.config.train.steps,
                )
                return ExitCode.DONE
            first_step = job.step
            try:
                return self._loop(job, stop)
            except torch.cuda.OutOfMemoryError:
                raise explain(
                    self.config, job.batch, step=job.step, first_step=first_step
                ) from None
            finally:
                job.checkpointer.close()
        finally:
            stop.close()

    def _setup(self) -> Job:
        config, placement = self.config, self.placement
        if self.on_gpu:
            torch.cuda.set_device(placement.local_rank)
            # fp32 matmuls on tensor cores (TF32) on Ampere and newer, as nanoGPT does.
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        startup.begin("rendezvous", f"joining {placement.world_size} rank(s)")
        deepspeed.init_distributed(dist_backend="nccl" if self.on_gpu else "gloo")
        device = torch.device("cuda", placement.local_rank) if self.on_gpu else torch.device("cpu")

        mirror_uri = self.env.s3_uri
        checkpointer = Checkpointer(
            config.checkpoint_dir,
            keep_last=config.checkpoint.keep_last,
            mirror=S3Mirror.from_uri(mirror_uri) if mirror_uri else None,
            asynchronous=config.checkpoint.asynchronous,
            node_first_rank=placement.local_rank == 0,
            ranks_per_node=self.env.local_world_size,
            on_progress=self.heartbeat.progress,
        )
        # Chosen before the engine is built, which must know whether it loads a universal
        # checkpoint (training/checkpoint/resume.py); loaded once the engine exists.
        startup.begin("checkpoint load", f"looking for checkpoints in {config.checkpoint_dir}")
        grid = layout(config, placement.world_size)
        resume_point = checkpointer.choose_resume(
            dp_world_size=grid.data,
            tensor=grid.tensor,
            sequence=grid.sequence,
            zero_stage=config.zero.stage,
        )
        startup.begin("engine build", "model, data and the DeepSpeed engine")
        batch = resolve_batch_sizes(config.train, grid.data)
        files = inputs.for_worker(config, self.env)
        engine = build_engine(
            config,
            batch,
            on_gpu=self.on_gpu,
            load_universal=resume_point is not None and resume_point.deepspeed_loads_universal,
            inputs=files,
        )
        model_flops = flops_per_token(
            engine.module, config.data.image_size if config.is_image else config.data.seq_len
        )
        # The ranks of a tensor group read the same batches (DeepSpeed asserts it), and so do
        # those of a sequence group, each keeping its slice: data is split over the
        # data-parallel ranks only. Either group is neighbouring ranks: DeepSpeed's mesh is
        # (data, tensor) (groups._init_tp_mesh_device), Ulysses' groups are ranks
        # i*sequence.. (parallel_state_sp.py).
        data_rank = placement.rank // (grid.tensor * grid.sequence)
        dataset = build_dataset(config, files, rank=data_rank, world_size=grid.data)
        sampler, batches = self._batches(dataset, batch.micro_batch_size, data_rank, grid.data)
        # Dropout and other randomness differ per rank from here on.
        seed_everything(config.run.seed + placement.rank)

        held_out = build_eval_dataset(config, files)
        evaluator = None
        if held_out is not None:
            evaluator = Evaluator(
                held_out,
                rank=data_rank,
                world_size=grid.data,
                batch_size=batch.micro_batch_size,
                num_workers=self.data_workers,
                device=device,
                # At ZeRO-3 every forward gathers parameters with the other ranks.
                same_count_per_rank=config.zero.stage == 3,
                # Ulysses' attention is built for the micro-batch's size (ulysses_sp.py).
                whole_batches=grid.sequence > 1,
            )
        job = Job(
            engine,
            sampler,
            batches,
            checkpointer,
            batch,
            device,
            model_flops,
            evaluator,
        )
        if config.is_hf:
            from training.hf.export import METADATA_KEY, metadata

            job.carried = {METADATA_KEY: metadata(config, files.model_folder)}
        startup.begin(
            "checkpoint load", f"loading {resume_point.tag}" if resume_point else "nothing to load"
        )
        state = checkpointer.resume(engine)
        if state is not None:
            job.step = state["step"]
            sampler.load_state_dict(_data_state_for_rank(state["data"], placement))
            if not rng.restore_for_rank(state["rng"], placement.rank):
                log.warning(
                    "the checkpoint has no RNG state for rank %d: seeded anew", placement.rank
                )
        return job

    def _batches(self, dataset, micro_batch: int, data_rank: int, data_ranks: int):
        """(where the data stands, this data-parallel rank's micro-batches forever)."""
        if isinstance(dataset, StreamedWindows):
            # Read in this process: the stream's position is then exactly what was used.
            loader = DataLoader(dataset, batch_size=micro_batch, num_workers=0)
            return dataset, iter(loader)
        config = self.config
        sampler = ResumableDistributedSampler(
            len(dataset), rank=data_rank, world_size=data_ranks, seed=config.run.seed
        )
        loader = DataLoader(
            dataset,
            batch_size=micro_batch,
            sampler=sampler,
            drop_last=True,
            **worker_processes(self.data_workers, dataset),
            pin_memory=self.on_gpu,
            # Its own generator: making an iterator then draws no number from the global one,
            # which dropout uses and a resumed run restores exactly.
            generator=torch.Generator().manual_seed(config.run.seed),
        )
        return sampler, micro_batches(loader, sampler)

    def _loop(self, job: Job, stop: StopFlag) -> int:
        config, placement, batch = self.config, self.placement, job.batch
        per_sample = 1 if config.is_image else config.data.seq_len
        clock = GoodputClock(
            config.output_dir,
            first_step=job.step,
            tokens_per_step=batch.global_batch_size * per_sample,
            gpus=placement.world_size,
            usd_per_hour=self.env.usd_per_hour,
        )
        metrics = StepMetrics(config, placement, job, self.env, clock) if self.is_rank0 else None
        loss_sum = torch.zeros((), device=job.device)
        stragglers = StragglerReport(
            job.engine.module, config.watchdog, job.device, job.step, self.env.node_name
        )
        job.batches = stragglers.timed(job.batches)
        try:
            while job.step < config.train.steps:
                clock.begin_step()
                for _ in range(batch.gradient_accumulation_steps):
                    with clock.part("data_wait"):
                        tensors = next(job.batches)
                    loss = job.engine(*(t.to(job.device, non_blocking=True) for t in tensors))
                    job.engine.backward(loss)
                    job.engine.step()
                    loss_sum += loss.detach().float()
                job.step += 1
                self.heartbeat.beat(job.step)

                last = job.step == config.train.steps
                scores = {}
                if job.evaluator is not None and (
                    last or job.step % config.logging.eval_every_steps == 0
                ):
                    with clock.part("evaluation"):
                        scores = job.evaluator.evaluate(job.engine.module)  # a collective
                if scores or last or job.step % config.logging.every_steps == 0:
                    # A collective: every rank takes part, rank 0 records.
                    window_loss = mean_over_ranks(loss_sum)
                    slowest = stragglers.window(job.step)  # a collective too
                    if metrics is not None:
                        metrics.record(window_loss, scores, slowest)
                    loss_sum.zero_()
                if metrics is not None:
                    metrics.tick()

                stopping = stop.should_stop()
                if stopping or last or job.step % config.checkpoint.every_steps == 0:
                    # In the background but on a stop and at the end, where the job exits next.
                    with clock.part("checkpoint"):
                        job.checkpointer.save(
                            job.engine, job.step, self._client_state(job), wait=stopping or last
                        )
                clock.end_step(job.step)
                if stopping and not last:  # at the end: done, not stopped
                    log.warning("stopped at step %d (%s); checkpoint saved", job.step, stop.reason)
                    if metrics is not None:
                        # The status first: the saved goodput, which the next start reads
                        # its spans from, then ends no earlier than the status says.
                        metrics.publish("interrupted")
                        log.info("this start: %s", metrics.goodput_line())
                    return ExitCode.INTERRUPTED
        finally:
            if metrics is not None:
                metrics.close()
        if metrics is not None:
            metrics.publish("done")
            print(metrics.summary(), flush=True)
        return ExitCode.DONE

    @staticmethod
    def _client_state(job: Job) -> dict:
        data = job.sampler.state_dict()
        if isinstance(job.sampler, StreamedWindows):  # each rank has a position of its own
            data = {STREAM_RANKS: gather_objects(data)}
        return {"step": job.step, "data": data, "rng": rng.gather_all_ranks(), **job.carried}


# In a checkpoint's data state: the streamed positions of every rank, by rank.
STREAM_RANKS = "stream_ranks"


def gather_objects(mine) -> list:
    """Every rank's object, by rank (a collective)."""
    if not dist.is_initialized():
        return [mine]
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return every


def _data_state_for_rank(state: dict, placement: Placement) -> dict:
    """The sampler's state (one for all ranks), or this rank's streamed position."""
    if STREAM_RANKS not in state:
        return state
    ranks = state[STREAM_RANKS]
    if len(ranks) != placement.world_size:
        raise ConfigError(
            f"the checkpoint was written by {len(ranks)} ranks reading a stream "
            f"(data.streaming), this run has {placement.world_size}: a streamed run resumes "
            "on the same number of ranks"
        )
    return ranks[placement.rank]


class StepMetrics:
    """Rank 0's view of the run: per-window throughput and MFU, and the end-of-run summary."""

    def __init__(
        self,
        config: Config,
        placement: Placement,
        job: Job,
        env: TrainerEnv,
        clock: GoodputClock,
    ):
        self.config, self.job, self.world_size = config, job, placement.world_size
        self.layout = layout(config, placement.world_size)
        self.clock = clock
        self.price = env.usd_per_hour
        # An image is one unit of work (its FLOPs are the model's per "token").
        self.per_sample = 1 if config.is_image else config.data.seq_len
        self.unit = "images" if config.is_image else "tokens"
        self.tokens_per_step = clock.tokens_per_step
        self.gpu = GpuMonitor(placement.local_rank)
        self.peak = peak_tflops(self.gpu.name, bf16=config.precision.bf16)
        self.sink = MetricsSink(
            config.output_dir,
            total_steps=config.train.steps,
            start_step=job.step,
            tensorboard=config.logging.tensorboard,
            progress_bar=config.logging.progress_bar,
        )
        self.first_step, self.started = job.step, time.perf_counter()
        self.window_step, self.window_start = job.step, self.started
        self.window_waited = 0.0  # the attempt's data-wait seconds at the window's start
        self.first_loss: float | None = None
        self.last_loss: float | None = None
        self.mirror = job.checkpointer.mirror
        self.status_published = -math.inf
        self.last_record: dict | None = None
        self.scores: dict[str, float] = {}

    def record(
        self, loss_sum: float, scores: dict[str, float], slowest: Mapping[str, float] | None = None
    ) -> None:
        """One record for the steps since the last; loss_sum is over their micro-batches,
        scores the held-out split's (evaluated at this step, else empty), slowest the
        straggler report's fields (training/stragglers.py)."""
        job, now = self.job, time.perf_counter()
        steps = job.step - self.window_step
        loss = loss_sum / (steps * job.batch.gradient_accumulation_steps)
        tokens_per_s = self.tokens_per_step * steps / (now - self.window_start)
        waited = self.clock.attempt.data_wait_s
        record = {
            "step": job.step,
            "loss": loss,
            "lr": job.engine.get_lr()[0],
            f"{self.unit}_per_s": tokens_per_s,
            "samples_per_s": tokens_per_s / self.per_sample,
            "tflops_per_gpu": job.model_flops * tokens_per_s / self.world_size / 1e12,
            "mfu": mfu(job.model_flops, tokens_per_s / self.world_size, self.peak),
            "step_time_s": (now - self.window_start) / steps,
            # Seconds a step waited for its batches (all its micro-batches) in this window.
            "data_wait_per_step_s": (waited - self.window_waited) / steps,
            "epoch": job.sampler.epoch,
            "samples_seen_in_epoch": job.sampler.consumed * self.layout.data,
            **scores,
            **(slowest or {}),
            **self.gpu.read(),
            # This start's goodput so far: where its wall time went.
            **self.clock.attempt_report().fields(self.unit),
        }
        if self.config.precision.fp16:
            record["loss_scale"] = float(job.engine.optimizer.loss_scale)
        self.sink.write(record)
        self.clock.save(job.step)
        self.first_loss = loss if self.first_loss is None else self.first_loss
        self.last_loss = loss
        self.scores = scores or self.scores
        self.window_step, self.window_start = job.step, now
        self.window_waited = waited
        self.last_record = record
        self.publish("training", to_store=now - self.status_published >= STATUS_EVERY_S)

    def publish(self, state: str, *, to_store: bool = True) -> None:
        """Write the job's progress, for `python -m infra status` and `jobs`: status.json in
        the run folder at every record (a job on this machine is read there), and beside its
        checkpoints in S3 when `to_store` (at most once a minute: a PUT each)."""
        if self.last_record is None:
            return
        record, total = self.last_record, self.config.train.steps
        status = {
            "state": state,  # training, done or interrupted
            "step": self.job.step,
            "total_steps": total,
            "loss": record["loss"],
            # Tokens, or images for an image job ("unit"): the metric's own name differs.
            "tokens_per_s": record[f"{self.unit}_per_s"],
            "unit": self.unit,
            "step_time_s": record["step_time_s"],
            "seconds_left": (total - self.job.step) * record["step_time_s"],
            # The whole run's, every start of the job together.
            **self.clock.run_report().fields(self.unit),
            RUN_SPANS_FIELD: [[_iso(start), _iso(end)] for start, end in self.clock.spans()],
            # A rank persistently slower than the others (training/stragglers.py), or None.
            "straggler_rank": record.get("straggler_rank"),
            "updated_at": _iso(time.time()),
        }
        write_atomically(self.config.output_dir / STATUS_NAME, json.dumps(status).encode())
        if self.mirror is None or not to_store:
            return
        self.status_published = time.perf_counter()
        try:
            self.mirror.put_status(status)
        except Exception:
            # Progress reporting must never stop training.
            log.exception("could not publish the job's status to %s", self.mirror.uri)

    def tick(self) -> None:
        self.sink.advance()

    def goodput_line(self) -> str:
        """This start's goodput, and the whole run's when the job was started before."""
        self.clock.save()
        line = self.clock.attempt_report().describe(self.unit)
        run = self.clock.run_report()
        if run.attempts > 1:
            line += f"; whole run ({run.attempts} starts): {run.describe(self.unit)}"
        return line

    def close(self) -> None:
        self.sink.close()

    def summary(self) -> str:
        took = time.perf_counter() - self.started
        steps = self.job.step - self.first_step
        rate = self.tokens_per_step * steps / took
        per_gpu = rate / self.world_size
        accuracy = (
            f"held-out loss {self.scores['val_loss']:.4f}, top-1 "
            f"{_percent(self.scores['val_accuracy'])}; "
            if self.scores
            else ""
        )
        waited = self.clock.attempt.data_wait_s / max(steps, 1)
        return (
            f"done: {steps} steps in {took:.1f} s, loss {self.first_loss:.4f} -> "
            f"{self.last_loss:.4f}, layout {self.layout.describe()}, {rate:,.0f} {self.unit}/s, "
            f"{self.job.model_flops * per_gpu / 1e12:.3g} TFLOPS/GPU, "
            f"MFU {_percent(mfu(self.job.model_flops, per_gpu, self.peak))}, "
            f"data wait {1000 * waited:.1f} ms/step, {peak_memory()} per rank, "
            f"{run_cost(took, self.world_size, self.price)}; {self.goodput_line()}; {accuracy}"
            f"checkpoints in {self.config.checkpoint_dir}, "
            f"metrics in {self.config.output_dir / 'metrics.jsonl'}"
        )


def peak_memory() -> str:
    """Rank 0's peak memory: the GPU memory its tensors held, or without a GPU the process's
    peak resident memory (ru_maxrss, KiB on Linux)."""
    if torch.cuda.is_available():
        return f"peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB"
    return f"peak host memory {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB"


def _percent(value: float | None) -> str:
    return "n/a (unknown GPU peak)" if value is None else f"{100 * value:.1f}%"


def _iso(unix_time: float) -> str:
    return datetime.datetime.fromtimestamp(unix_time, datetime.UTC).isoformat(timespec="seconds")
