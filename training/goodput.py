"""Where a run's wall time went: goodput per start of the job (an attempt) and per run.

Wall time, from the launcher's start to the end of the attempt, is split into

    productive     training steps that moved the run forward
    startup        launch, imports, rendezvous, engine build, op build, checkpoint load
    checkpoint     training blocked by checkpoints (the copy to host memory, or a whole
                   blocking save, and waits for a save in flight)
    recomputed     steps trained again after a resume (done before the last stop, lost
                   with the state that was not committed)
    evaluation     held-out evaluation
    data_wait      waiting for the next batch
    other          the rest (metrics, status uploads, the end of the run)

Goodput is productive over wall (the definition of Google's ML goodput: "the fraction
of time spent making forward progress",
https://cloud.google.com/blog/products/ai-machine-learning/goodput-metric-as-measure-of-ml-productivity).
Rank 0 keeps every attempt's figures in <output_dir>/goodput.json, replaced at every
logging window, so the run's totals include attempts that were killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from training import startup
from training.contract import (
    GOODPUT_FIELD,
    PRICE_PER,
    RUN_USD_FIELD,
    price_field,
    price_words,
)

GOODPUT_FILE = "goodput.json"
# What a price is quoted per: (words, units in it).
PARTS = ("productive", "startup", "checkpoint", "recomputed", "evaluation", "data_wait")


@dataclass
class Attempt:
    """One start of the job, as rank 0 saw it; seconds unless named otherwise."""

    started_at: float  # the launcher's start (Unix time)
    first_step: int  # the step it resumed at
    last_step: int = 0
    wall_s: float = 0.0
    startup: dict[str, float] = field(default_factory=dict)  # by phase
    productive_s: float = 0.0
    checkpoint_s: float = 0.0
    recomputed_s: float = 0.0
    evaluation_s: float = 0.0
    data_wait_s: float = 0.0
    tokens: int = 0  # trained in productive steps (images for an image job)

    @property
    def startup_s(self) -> float:
        return sum(self.startup.values())

    @property
    def other_s(self) -> float:
        return self.wall_s - sum(getattr(self, f"{part}_s") for part in PARTS)

    @property
    def goodput(self) -> float:
        return self.productive_s / self.wall_s if self.wall_s > 0 else 0.0


@dataclass(frozen=True)
class Report:
    """Goodput and cost of some attempts together (one, or the whole run)."""

    attempts: int
    wall_s: float
    parts_s: dict[str, float]  # PARTS and "other"
    startup_s: dict[str, float]
    tokens: int
    gpus: int
    usd_per_hour: float | None

    @property
    def goodput(self) -> float:
        return self.parts_s["productive"] / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def gpu_hours(self) -> float:
        return self.gpus * self.wall_s / 3600

    @property
    def usd(self) -> float | None:
        return None if self.usd_per_hour is None else self.usd_per_hour * self.wall_s / 3600

    @property
    def tokens_per_s(self) -> float:
        """Tokens trained per second of wall time (start-up and waits included)."""
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0

    def usd_per_work(self, unit: str) -> float | None:
        """Dollars per billion tokens, or per thousand images for an image job."""
        if self.usd is None or not self.tokens:
            return None
        return self.usd / self.tokens * PRICE_PER[unit][1]

    def fields(self, unit: str) -> dict[str, float | int]:
        """Flat numeric figures, for metrics.jsonl, TensorBoard and status.json."""
        figures: dict[str, float | int] = {
            GOODPUT_FIELD: self.goodput,
            "wall_s": self.wall_s,
            **{f"{part}_s": seconds for part, seconds in self.parts_s.items()},
            **{f"startup_{_key(p)}_s": seconds for p, seconds in self.startup_s.items()},
            f"goodput_{unit}_per_s": self.tokens_per_s,
            "gpu_hours": self.gpu_hours,
        }
        if self.usd is not None:
            figures[RUN_USD_FIELD] = self.usd
        per_work = self.usd_per_work(unit)
        if per_work is not None:
            figures[price_field(unit)] = per_work
        return figures

    def describe(self, unit: str) -> str:
        """'goodput 81.2% (startup 12.0%, checkpoint 1.1%, ...), $0.42 per billion tokens'."""
        shares = ", ".join(
            f"{part.replace('_', ' ')} {100 * seconds / self.wall_s:.1f}%"
            for part, seconds in self.parts_s.items()
            if part != "productive" and self.wall_s > 0 and seconds / self.wall_s >= 0.0005
        )
        text = f"goodput {100 * self.goodput:.1f}%" + (f" ({shares})" if shares else "")
        per_work = self.usd_per_work(unit)
        if per_work is not None:
            text += f", {price_words(per_work, unit)}"
        return text


def combine(attempts: list[Attempt], *, gpus: int, usd_per_hour: float | None) -> Report:
    parts = {part: sum(getattr(a, f"{part}_s") for a in attempts) for part in PARTS}
    parts["other"] = sum(a.other_s for a in attempts)
    phases: dict[str, float] = {}
    for attempt in attempts:
        for phase, seconds in attempt.startup.items():
            phases[phase] = phases.get(phase, 0.0) + seconds
    return Report(
        attempts=len(attempts),
        wall_s=sum(a.wall_s for a in attempts),
        parts_s=parts,
        startup_s=phases,
        tokens=sum(a.tokens for a in attempts),
        gpus=gpus,
        usd_per_hour=usd_per_hour,
    )


class GoodputClock:
    """Rank 0's accountant: the trainer tells it what each stretch of time was."""

    def __init__(
        self,
        output_dir: Path,
        *,
        first_step: int,
        tokens_per_step: int,
        gpus: int,
        usd_per_hour: float | None,
        loop_started: float | None = None,
    ):
        self.path = output_dir / GOODPUT_FILE
        self.tokens_per_step = tokens_per_step
        self.gpus, self.usd_per_hour = gpus, usd_per_hour
        self.earlier = _read_attempts(self.path)
        # Steps up to the furthest an earlier attempt got are trained again.
        self.recompute_until = max((a.last_step for a in self.earlier), default=0)
        loop_started = time.time() if loop_started is None else loop_started
        launched = startup.launched_at()
        self.attempt = Attempt(
            started_at=launched,
            first_step=first_step,
            last_step=first_step,
            startup=startup.phase_durations(until=loop_started),
        )
        self._step_began = time.perf_counter()
        self._excluded = 0.0  # this step's seconds already counted under another part
        # Wall time counts on the monotonic clock from here: a step of the system clock (an
        # NTP correction, a manual change) must change neither the wall time nor the cost.
        self._since_launch = time.time() - launched
        self._anchor = time.monotonic()

    @contextlib.contextmanager
    def part(self, name: str) -> Iterator[None]:
        """Count the time of the block as ``name`` (checkpoint, evaluation, data_wait)."""
        began = time.perf_counter()
        try:
            yield
        finally:
            seconds = time.perf_counter() - began
            setattr(self.attempt, f"{name}_s", getattr(self.attempt, f"{name}_s") + seconds)
            self._excluded += seconds

    def begin_step(self) -> None:
        self._step_began, self._excluded = time.perf_counter(), 0.0

    def end_step(self, step: int) -> None:
        """The step's time, less what ``part`` counted inside it: productive or recomputed."""
        seconds = time.perf_counter() - self._step_began - self._excluded
        if step <= self.recompute_until:
            self.attempt.recomputed_s += seconds
        else:
            self.attempt.productive_s += seconds
            self.attempt.tokens += self.tokens_per_step
        self.attempt.last_step = step

    def attempt_report(self) -> Report:
        self._stamp()
        return combine([self.attempt], gpus=self.gpus, usd_per_hour=self.usd_per_hour)

    def run_report(self) -> Report:
        self._stamp()
        return combine(
            [*self.earlier, self.attempt], gpus=self.gpus, usd_per_hour=self.usd_per_hour
        )

    def spans(self) -> list[tuple[float, float]]:
        """(start, end) of each attempt so far, this one up to now (Unix time)."""
        self._stamp()
        return [(a.started_at, a.started_at + a.wall_s) for a in [*self.earlier, self.attempt]]

    def save(self, step: int | None = None) -> None:
        """Replace goodput.json with every attempt so far (a crash loses one window);
        ``step``: the step trained last, when its accounting is not over yet."""
        if step is not None:
            self.attempt.last_step = max(self.attempt.last_step, step)
        self._stamp()
        attempts = [*self.earlier, self.attempt]
        body = {
            "attempts": [asdict(a) for a in attempts],
            "run": combine(attempts, gpus=self.gpus, usd_per_hour=self.usd_per_hour).fields(
                "tokens"
            ),
        }
        tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(body, indent=1) + "\n")
        os.replace(tmp, self.path)

    def _stamp(self) -> None:
        self.attempt.wall_s = self._since_launch + time.monotonic() - self._anchor


def _read_attempts(path: Path) -> list[Attempt]:
    try:
        entries = json.loads(path.read_text())["attempts"]
        return [Attempt(**entry) for entry in entries]
    except (OSError, ValueError, KeyError, TypeError):
        return []  # a first start, or a file from an older version: counted from here


def _key(phase: str) -> str:
    return phase.replace(" ", "_")
