"""The untimed warm-up before a validation test's repeats (``levels.warm_up``), on a scripted
GPU: batch times that fall while the power cap pulls the clock down, then hold."""

from __future__ import annotations

from fleetops.validation.node import levels


class Script:
    """Batch times from a list (the last repeats); the clock moves by each batch's time."""

    def __init__(self, times: list[float]) -> None:
        self.times = times
        self.now = 0.0
        self.ran = 0

    def clock(self) -> float:
        return self.now

    def batch(self) -> float:
        took = self.times[min(self.ran, len(self.times) - 1)]
        self.ran += 1
        self.now += took
        return took


# a GEMM batch: 8 ms at boost clock, slower as the clock falls, then steady at 11 ms
RAMP = [0.008, 0.008, 0.009, 0.010, 0.0105, 0.0104, 0.011, 0.011, 0.011, 0.011, 0.011]


def test_quick_warm_up_ends_once_five_batches_agree_after_the_clock_settled() -> None:
    gpu = Script(RAMP + [0.011] * 200)
    runs = levels.warm_up(gpu.batch, levels.timing("quick", "gemm"), gpu.clock)
    # batches 7-11 are the first five within 2 % of each other (10.4 ms is 5.5 % off), and
    # 0.11 s have passed by then (at least 0.1 s must)
    assert runs == 11 and gpu.now >= levels.SETTLED_MIN_S
    assert gpu.now < levels.WARMUP_S["quick"]["gemm"]


def test_quick_warm_up_that_never_settles_stops_at_its_limit() -> None:
    gpu = Script([0.010, 0.012] * 1000)  # the clock keeps swinging by 20 %
    levels.warm_up(gpu.batch, levels.timing("quick", "gemm"), gpu.clock)
    assert levels.WARMUP_S["quick"]["gemm"] <= gpu.now < levels.WARMUP_S["quick"]["gemm"] + 0.012


def test_full_warm_up_soaks_for_its_whole_time_even_when_settled() -> None:
    gpu = Script([0.3] * 1000)
    runs = levels.warm_up(gpu.batch, levels.timing("full", "gemm"), gpu.clock)
    assert gpu.now >= levels.WARMUP_S["full"]["gemm"] and runs == 34  # 10 s of 0.3 s batches


def test_quick_warm_up_goes_on_to_its_least_time_when_settled_at_once() -> None:
    gpu = Script([0.001] * 1000)  # an HBM copy of a small buffer: steady from the start
    runs = levels.warm_up(gpu.batch, levels.timing("quick", "hbm"), gpu.clock)
    assert runs == 100 and levels.SETTLED_MIN_S <= gpu.now < levels.SETTLED_MIN_S + 0.0011


def test_no_warm_up_time_runs_no_batch() -> None:
    gpu = Script([0.01])
    assert levels.warm_up(gpu.batch, levels.UNTIMED_WARMUP, gpu.clock) == 0


class Recorder:
    """A telemetry window and a GPU that write what happens, in order, to one list."""

    def __init__(self, call_s: float) -> None:
        self.events: list[str] = []
        self.call_s = call_s

    def begin(self, test: str) -> None:
        self.events.append(f"begin {test}")

    def end(self) -> None:
        self.events.append("end")

    def first(self) -> None:
        self.events.append("first")

    def elapsed(self, calls: int) -> float:
        self.events.append(f"batch {calls}")
        return calls * self.call_s


def test_time_repeats_samples_from_before_the_first_call_to_after_the_last_batch() -> None:
    gpu = Recorder(0.001)
    per_call = levels.time_repeats(gpu.elapsed, gpu.first, 3, 5, gpu, "gemm_bf16_tflops", levels.UNTIMED_WARMUP)
    assert per_call == [0.001] * 3
    assert gpu.events == ["begin gemm_bf16_tflops", "first", "batch 5", "batch 5", "batch 5", "end"]


def test_time_repeats_makes_each_full_level_repeat_last_its_least_time() -> None:
    gpu = Recorder(0.004)  # a 4 ms call: 0.3 s of GEMM is 75 calls a repeat
    timing = levels.Timing(warmup_s=0.0, repeat_s=0.3)
    per_call = levels.time_repeats(gpu.elapsed, gpu.first, 2, 5, None, "x", timing)
    assert gpu.events == ["first", "batch 1", "batch 75", "batch 75"]
    assert per_call == [0.004, 0.004]


def test_time_repeats_ends_the_window_when_the_gpu_fails() -> None:
    gpu = Recorder(0.001)

    def broken(calls: int) -> float:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    try:
        levels.time_repeats(broken, gpu.first, 3, 1, gpu, "hbm_copy_gbps", levels.UNTIMED_WARMUP)
    except RuntimeError:
        pass
    else:
        raise AssertionError("the GPU's error was swallowed")
    assert gpu.events == ["begin hbm_copy_gbps", "first", "end"]
