"""The start-up driver check, alone and in the launcher (driver version injected)."""

from __future__ import annotations

import pytest

from training import cli
from training.spec.selfcheck import SelfCheckError, check_driver, check_precision


def test_an_older_driver_is_refused_naming_both_versions():
    with pytest.raises(SelfCheckError) as caught:
        check_driver("560.28.03", "535.183.01")
    assert "535.183.01" in str(caught.value) and "560.28.03" in str(caught.value)


@pytest.mark.parametrize("driver", ["560.28.03", "560.35.03", "570.86.10", "1000.0"])
def test_equal_or_newer_drivers_pass(driver):
    check_driver("560.28.03", driver)


def test_versions_compare_numerically_not_as_text():
    check_driver("560.9", "560.28")  # 28 > 9
    with pytest.raises(SelfCheckError):
        check_driver("560.28", "560.9")


def test_nothing_to_check_without_minimum_or_gpu():
    check_driver(None, "400.0")
    check_driver("560.28.03", None)


def test_unparsable_version_is_an_error():
    with pytest.raises(SelfCheckError, match="not dotted numbers"):
        check_driver("abc", "560.0")


def test_launcher_refuses_to_start_on_an_old_driver(monkeypatch, capsys):
    monkeypatch.setattr(cli, "installed_driver", lambda: "525.60.13")
    monkeypatch.setenv("TRAIN_MIN_DRIVER", "560.28.03")
    monkeypatch.delenv("RANK", raising=False)
    assert cli.main(["--print-ds-config"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: NVIDIA driver 525.60.13 is older than 560.28.03")
    monkeypatch.setenv("TRAIN_MIN_DRIVER", "520.0")
    assert cli.main(["--print-ds-config"]) == 0


def test_fp16_needs_a_gpu():
    with pytest.raises(SelfCheckError, match="needs a GPU"):
        check_precision(bf16=False, fp16=True, on_gpu=False, capability=None)
    check_precision(bf16=False, fp16=True, on_gpu=True, capability=(7, 0))


def test_bf16_needs_ampere_or_newer():
    with pytest.raises(SelfCheckError, match=r"this GPU has 7\.0: use precision\.fp16"):
        check_precision(bf16=True, fp16=False, on_gpu=True, capability=(7, 0))
    check_precision(bf16=True, fp16=False, on_gpu=True, capability=(8, 0))
    check_precision(bf16=True, fp16=False, on_gpu=True, capability=(9, 0))
    check_precision(bf16=True, fp16=False, on_gpu=False, capability=None)  # CPU bf16 works


def test_launcher_refuses_fp16_on_a_cpu_machine(monkeypatch, capsys):
    monkeypatch.delenv("RANK", raising=False)
    assert cli.main(["--set", "precision.fp16=true"]) == 2
    assert capsys.readouterr().err.startswith("error: precision.fp16 = true needs a GPU")
