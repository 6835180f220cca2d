"""The health gate's decisions on NVML/DCGM answers for nodes we do not have, and its real
run on this CPU machine."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.support.preloaded import run_module
from tests.training.health.fake_nvml import FakeGpu, FakeNvml
from tests.training.multirank import launch_env
from training import cli
from training.contract import UNHEALTHY_PREFIX, ExitCode
from training.environment import TrainerEnv
from training.health import checks, gate
from training.health.expectation import NodeExpectation

# p4d.24xlarge as the catalog describes it.
P4D = {
    "TRAIN_EXPECT_GPUS": "8",
    "TRAIN_EXPECT_GPU_MODEL": "A100",
    "TRAIN_EXPECT_BUSBW_GBPS": "230",
    "TRAIN_MIN_DRIVER": "570.26",
}


@pytest.fixture(autouse=True)
def no_dcgm_no_efa(monkeypatch, tmp_path):
    """No dcgmi on PATH and an empty RDMA class folder, unless a test puts them there."""
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setattr(checks, "INFINIBAND_CLASS", tmp_path / "infiniband")
    monkeypatch.setattr(gate, "measure_allreduce", lambda gpus: 231.0)


def run(capsys, nvml: FakeNvml, env: dict[str, str] = P4D) -> tuple[int, list[str]]:
    parsed = TrainerEnv.from_environ(env)
    code = gate.main([], parsed.expect, parsed.min_driver, nvml=nvml)
    return code, capsys.readouterr().out.splitlines()


def line(lines: list[str], check: str) -> str:
    return next(text for text in lines if text.startswith(f"health: {check}:"))


def test_a_healthy_node_passes_with_one_line_per_check(capsys):
    code, lines = run(capsys, FakeNvml())
    assert code == ExitCode.DONE
    assert line(lines, "driver") == "health: driver: ok: 570.172.08 (threshold: >= 570.26)"
    assert line(lines, "gpus") == (
        "health: gpus: ok: 8 x NVIDIA A100-SXM4-40GB (threshold: 8 x A100)"
    )
    assert line(lines, "all-reduce") == (
        "health: all-reduce: ok: 231.0 GB/s bus bandwidth (threshold: >= 184.0 GB/s, 80% of 230)"
    )
    assert line(lines, "memory errors").startswith("health: memory errors: ok: none")
    assert line(lines, "dcgm diag") == (
        "health: dcgm diag: skipped: DCGM not installed (no dcgmi on PATH)"
    )
    assert not any(text.startswith(UNHEALTHY_PREFIX) for text in lines)


def test_uncorrected_ecc_errors_fail_the_node(capsys):
    nvml = FakeNvml()
    nvml.gpus[3] = FakeGpu(uncorrected_ecc=2)
    code, lines = run(capsys, nvml)
    assert code == ExitCode.NODE_UNHEALTHY == 69
    assert lines[-1] == (
        "unhealthy: memory errors: failed: GPU 3: 2 uncorrected ECC errors "
        "(threshold: 0 uncorrected ECC errors, nothing pending)"
    )


def test_pending_page_retirement_and_row_remapping_fail_the_node(capsys):
    nvml = FakeNvml()
    nvml.gpus[0] = FakeGpu(name="Tesla V100-SXM2-16GB", retirement_pending=True, remapped_rows=None)
    nvml.gpus[5] = FakeGpu(remapped_rows=(0, 1, True, False))
    code, lines = run(capsys, nvml, {})
    assert code == ExitCode.NODE_UNHEALTHY
    assert "GPU 0: page retirement pending; GPU 5: row remapping pending" in line(
        lines, "memory errors"
    )


def test_a_missing_gpu_fails_the_node(capsys):
    nvml = FakeNvml(gpus=[FakeGpu() for _ in range(7)])
    code, lines = run(capsys, nvml)
    assert code == ExitCode.NODE_UNHEALTHY
    assert line(lines, "gpus") == (
        "health: gpus: failed: 7 x NVIDIA A100-SXM4-40GB (threshold: 8 x A100)"
    )
    assert lines[-1].startswith("unhealthy: gpus: failed: 7 x")


def test_another_gpu_model_fails_the_node(capsys):
    code, lines = run(capsys, FakeNvml(gpus=[FakeGpu(name="NVIDIA A10G")] * 8))
    assert code == ExitCode.NODE_UNHEALTHY
    assert "8 GPUs, 8 not A100: NVIDIA A10G" in line(lines, "gpus")


def test_low_all_reduce_bandwidth_fails_the_node(capsys, monkeypatch):
    monkeypatch.setattr(gate, "measure_allreduce", lambda gpus: 120.5)
    code, lines = run(capsys, FakeNvml())
    assert code == ExitCode.NODE_UNHEALTHY
    assert lines[-1] == (
        "unhealthy: all-reduce: failed: 120.5 GB/s bus bandwidth "
        "(threshold: >= 184.0 GB/s, 80% of 230)"
    )


def test_one_gpu_has_nothing_to_reduce_across(capsys):
    code, lines = run(capsys, FakeNvml(gpus=[FakeGpu()]), {"TRAIN_EXPECT_GPUS": "1"})
    assert code == ExitCode.DONE
    assert line(lines, "all-reduce") == (
        "health: all-reduce: skipped: one GPU: nothing to reduce across"
    )


def test_an_xid_during_the_gate_fails_the_node(capsys):
    nvml = FakeNvml(xids=[79])  # 79: GPU has fallen off the bus
    code, lines = run(capsys, nvml)
    assert code == ExitCode.NODE_UNHEALTHY
    assert nvml.registered == 8  # one listener per GPU, before the all-reduce
    assert line(lines, "xid errors") == (
        "health: xid errors: failed: XID 79 (threshold: no XID during the gate)"
    )


def test_a_driver_older_than_the_image_fails_the_node(capsys):
    code, lines = run(capsys, FakeNvml(driver="550.90.07"))
    assert code == ExitCode.NODE_UNHEALTHY
    assert "NVIDIA driver 550.90.07 is older than 570.26" in line(lines, "driver")


def _fake_dcgmi(folder: Path, report: dict, exit_code: int = 0) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "dcgmi"
    script.write_text(
        f"#!{sys.executable}\nimport sys\n"
        f"assert sys.argv[1:] == {list(checks.DCGM_DIAG)!r}, sys.argv\n"
        f"print({json.dumps(json.dumps(report))})\nsys.exit({exit_code})\n"
    )
    script.chmod(0o755)


def _dcgm_report(memory_status: str) -> dict:
    # The shape of `dcgmi diag -j` (DCGM 3.x): categories of tests, each with results.
    return {
        "DCGM GPU Diagnostic": {
            "test_categories": [
                {
                    "category": "Deployment",
                    "tests": [{"name": "Denylist", "results": [{"status": "Pass"}]}],
                },
                {
                    "category": "Hardware",
                    "tests": [
                        {
                            "name": "GPU Memory",
                            "results": [{"status": memory_status, "gpu_ids": "2"}],
                        }
                    ],
                },
            ]
        }
    }


def test_a_failed_dcgm_test_fails_the_node(capsys, tmp_path):
    _fake_dcgmi(tmp_path / "bin", _dcgm_report("Fail"), exit_code=226)
    code, lines = run(capsys, FakeNvml())
    assert code == ExitCode.NODE_UNHEALTHY
    assert line(lines, "dcgm diag") == (
        "health: dcgm diag: failed: failed: GPU Memory (threshold: run level 1 passes)"
    )


def test_a_passing_dcgm_diagnostic_passes(capsys, tmp_path):
    _fake_dcgmi(tmp_path / "bin", _dcgm_report("Pass"))
    code, lines = run(capsys, FakeNvml())
    assert code == ExitCode.DONE
    assert line(lines, "dcgm diag") == (
        "health: dcgm diag: ok: all tests passed (threshold: run level 1 passes)"
    )


def _efa_devices(root: Path, count: int) -> None:
    driver = root / "bus" / "pci" / "drivers" / "efa"
    driver.mkdir(parents=True)
    for index in range(count):
        device = root / "infiniband" / f"rdmap{index}s0" / "device"
        device.mkdir(parents=True)
        (device / "driver").symlink_to(driver)
    other = root / "infiniband" / "mlx5_0" / "device"  # not EFA: not counted
    other.mkdir(parents=True)
    (other / "driver").symlink_to(root / "bus")


def test_a_missing_efa_device_fails_the_node(capsys, tmp_path):
    _efa_devices(tmp_path, 3)
    code, lines = run(capsys, FakeNvml(), {**P4D, "TRAIN_EXPECT_EFA": "4"})
    assert code == ExitCode.NODE_UNHEALTHY
    assert line(lines, "efa") == "health: efa: failed: 3 EFA devices (threshold: >= 4)"


def test_all_expected_efa_devices_pass(capsys, tmp_path):
    _efa_devices(tmp_path, 4)
    code, lines = run(capsys, FakeNvml(), {**P4D, "TRAIN_EXPECT_EFA": "4"})
    assert code == ExitCode.DONE
    assert line(lines, "efa") == "health: efa: ok: 4 EFA devices (threshold: >= 4)"


def test_bus_bandwidth_is_nccl_tests_formula():
    # One p4d, 1 GiB all-reduce in 8142.6 us: nccl-tests printed busbw 230.77 GB/s
    # (https://github.com/NVIDIA/nccl/issues/527).
    assert checks.busbw_gbps(8142.6e-6, 1 << 30, 8) == pytest.approx(230.77, abs=0.01)


def test_a_bad_expectation_is_one_line_and_exit_2(capsys, monkeypatch):
    monkeypatch.setenv("TRAIN_EXPECT_GPUS", "eight")
    code = cli.main(["health"])
    assert code == ExitCode.BAD_CONFIG
    assert capsys.readouterr().err == (
        "error: TRAIN_EXPECT_GPUS = 'eight' is not a count: give a whole number of at "
        "least 0, or leave it unset\n"
    )


def test_expectation_round_trips_through_the_environment():
    expect = NodeExpectation(
        gpus=8, gpu_model="H100", busbw_gbps=480.0, efa_devices=32, fabric_busbw_gbps=435.0
    )
    assert NodeExpectation.from_env(expect.to_env()) == expect
    assert NodeExpectation.from_env({}) == NodeExpectation()


@pytest.mark.skipif(gate.open_nvml() is not None, reason="this machine has a GPU")
def test_the_real_gate_on_this_cpu_machine_skips_the_gpu_checks():
    result = run_module(
        "training",
        ["health"],
        env=launch_env(**{k: v for k, v in os.environ.items() if not k.startswith("TRAIN_")}),
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    for check in ("driver", "gpus", "memory errors", "dcgm diag", "all-reduce", "xid errors"):
        assert line(lines, check) == f"health: {check}: skipped: no GPU"
    assert line(lines, "efa").startswith("health: efa: ok: ")
    assert lines[-1].startswith("health: node fit for training (")
