"""The GPU check's reading of all_reduce_perf's JSON report (nccl-tests -J, src/util.cu at
v2.19.6: nccl_version, results[] with size and out_of_place/in_place bus_bw and nwrong,
out_of_bounds.count). The check itself needs GPUs: CI's gpu-check job runs it."""

from images.gpu_check import allreduce_perf_problems

NCCL_2_29_7 = 22907


def report(rows, wrong=0, nccl=NCCL_2_29_7):
    results = [
        {
            "size": size,
            "out_of_place": {"alg_bw": busbw / 1.75, "bus_bw": busbw, "nwrong": wrong},
            "in_place": {"alg_bw": busbw / 1.75, "bus_bw": busbw * 0.98, "nwrong": 0},
        }
        for size, busbw in rows
    ]
    return {
        "version": 1,
        "nccl_version": nccl,
        "runs": [
            {
                "results": results,
                "out_of_bounds": {"count": wrong, "okay": wrong == 0},
                "average_bus_bandwidth": {"bandwidth": 100.0, "okay": "unchecked"},
            }
        ],
    }


ROWS = [(8 << 20, 90.0), (1 << 30, 231.0), (256 << 20, 200.0)]


def test_a_clean_run_at_the_catalogs_bandwidth_passes():
    # p4d.24xlarge: 230 GB/s in infra/knowledge/data/allreduce.toml.
    assert allreduce_perf_problems(report(ROWS), NCCL_2_29_7, 230.0) == []
    assert allreduce_perf_problems(report(ROWS), NCCL_2_29_7, None) == []


def test_the_largest_size_is_held_to_80_percent_of_the_catalog():
    slow = [(8 << 20, 300.0), (1 << 30, 150.0)]  # fast small sizes do not hide a slow large one
    assert allreduce_perf_problems(report(slow), NCCL_2_29_7, 230.0) == [
        "all_reduce_perf reached 150.0 GB/s, under 80% of the expected 230 GB/s"
    ]


def test_wrong_values_and_another_nccl_are_named():
    problems = allreduce_perf_problems(report(ROWS, wrong=3, nccl=22805), NCCL_2_29_7, None)
    assert problems == [
        "all_reduce_perf ran NCCL [22805], torch loads 22907",
        "all_reduce_perf found 3 wrong values",
    ]


def test_an_empty_report_is_a_failure():
    assert allreduce_perf_problems({"nccl_version": NCCL_2_29_7}, NCCL_2_29_7, None) == [
        "all_reduce_perf reported no result"
    ]
