"""%dist_bench and nbdist bench: bus bandwidth of the raw collectives, on real kernels over loopback."""

from __future__ import annotations

import ast
import base64
import json
import math
import signal
import subprocess
import sys
import time

import pytest

from nbdist.drive import kernels
from nbdist.errors import ConfigError
from nbdist.measure import bench
from nbdist.measure.benchreport import (
    OPS,
    BenchResults,
    BenchTable,
    busbw_factor,
    element_count,
    formula,
    parse_ops,
    parse_size,
    parse_sizes,
    plot_png,
    row,
)

from .conftest import lend, pid_gone, run_in_background, shared_world

PNG = b"\x89PNG\r\n\x1a\n"
ROWS = "__import__('json').dumps(list(r))"
# Every rank must still be able to run a collective after a test (the next test's probe).
PROBE = "%%collective\nt = torch.ones(1); dist.all_reduce(t)\n"


# --- pure: flags, factors, rows, table, plot -----------------------------------------------------------
@pytest.mark.parametrize(("text", "size"), [("8", 8), ("64K", 65536), ("1M", 1 << 20), ("2G", 2 << 30),
                                            ("1KiB", 1024), ("4kb", 4096), (" 16 ", 16)])
def test_a_size_takes_k_m_g_suffixes_in_units_of_1024(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "x", "0", "1T", "-1", "1.5M", "32G"])
def test_a_bad_size_names_the_flag(text):
    with pytest.raises(ConfigError, match="--sizes"):
        parse_size(text)


def test_sizes_double_from_min_to_max_and_a_single_size_or_a_list_also_work():
    assert parse_sizes("8:64") == (8, 16, 32, 64)
    assert parse_sizes("8:64M")[-1] == 64 << 20 and len(parse_sizes("8:64M")) == 24
    assert parse_sizes("3:10") == (3, 6)  # doubling stops at MAX
    assert parse_sizes("1K") == (1024,)
    assert parse_sizes("1K,8:16") == (8, 16, 1024)
    with pytest.raises(ConfigError, match="backwards"):
        parse_sizes("64:8")


def test_ops_are_a_comma_list_of_the_six_or_all():
    assert parse_ops("all") == OPS == ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all",
                                       "send_recv")
    assert parse_ops("broadcast, all_reduce,broadcast") == ("broadcast", "all_reduce")
    with pytest.raises(ConfigError, match="'gather'"):
        parse_ops("all_reduce,gather")


# nccl-tests' factors (DESIGN-NOTES section 5), written out for n = 2, 4, 8.
EXPECTED_FACTORS = {
    2: {"all_reduce": 1.0, "all_gather": 0.5, "reduce_scatter": 0.5, "all_to_all": 0.5, "broadcast": 1.0,
        "send_recv": 1.0},
    4: {"all_reduce": 1.5, "all_gather": 0.75, "reduce_scatter": 0.75, "all_to_all": 0.75, "broadcast": 1.0,
        "send_recv": 1.0},
    8: {"all_reduce": 1.75, "all_gather": 0.875, "reduce_scatter": 0.875, "all_to_all": 0.875, "broadcast": 1.0,
        "send_recv": 1.0},
}


@pytest.mark.parametrize("n", sorted(EXPECTED_FACTORS))
def test_busbw_factors_are_nccl_tests_ones(n):
    assert {op: busbw_factor(op, n) for op in OPS} == EXPECTED_FACTORS[n]


def test_the_factor_formulas_read_as_in_nccl_tests():
    assert [formula(op) for op in OPS] == ["2(n-1)/n", "(n-1)/n", "(n-1)/n", "1", "(n-1)/n", "1"]


def test_element_counts_are_whole_elements_and_whole_chunks_for_the_ops_that_split():
    assert element_count("all_reduce", 8, 4, 4) == 2
    assert element_count("all_reduce", 2, 4, 2) == 1  # at least one element
    assert element_count("all_gather", 8, 4, 4) == 4  # one element per rank at least
    assert element_count("reduce_scatter", 40, 4, 4) == 8  # 10 elements, rounded down to whole chunks
    assert element_count("all_to_all", 1 << 20, 4, 2) == 1 << 18


def test_a_row_takes_the_slowest_ranks_median_and_busbw_is_algbw_times_the_factor():
    r = row("all_reduce", 1 << 18, 4, "float32", [0.001, 0.002, 0.0015, 0.0005])
    assert r["time_us"] == pytest.approx(2000.0)
    assert r["size"] == 1 << 20 and r["ranks"] == 4
    assert r["algbw_gbps"] == pytest.approx((1 << 20) / 0.002 / 1e9)
    assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * 1.5)
    assert r["rank_time_us"] == pytest.approx([1000.0, 2000.0, 1500.0, 500.0])


def test_results_are_a_list_of_dicts_with_a_one_line_repr():
    rows = [row(op, 256, 4, "float32", [0.001, 0.001]) for op in OPS]
    results = BenchResults(rows)
    assert isinstance(results, list) and results == rows
    assert repr(results) == "<%dist_bench results: 6 rows, 6 op(s) x 1 size(s) on 2 rank(s); a list of dicts>"
    assert json.loads(json.dumps(results)) == rows


def test_the_table_has_every_row_in_text_and_escaped_html():
    table = BenchTable([row("all_reduce", 256, 4, "float32", [0.0001, 0.0002])], "bench <title>", footer="a & b")
    text = repr(table)
    assert text.splitlines()[1].split() == ["op", "size", "count", "time", "(µs)", "algbw", "(GB/s)", "busbw",
                                            "(GB/s)"]
    assert text.splitlines()[2].split() == ["all_reduce", "1K", "256", "200.0", "0.005", "0.005"]
    html = table._repr_mimebundle_()["text/html"]
    assert "bench &lt;title&gt;" in html and "a &amp; b" in html and "<td" in html
    assert "(no size was measured)" in repr(BenchTable([], "t"))


def test_the_plot_is_a_png_made_without_pyplot():
    rows = [row(op, c, 4, "float32", [1e-4 * c / 256, 1e-4]) for op in OPS for c in (256, 1024, 4096)]
    png = plot_png(rows, "busbw")
    assert png is not None and png.startswith(PNG) and len(png) > 10_000
    code = ("import sys; from nbdist.measure.benchreport import plot_png, row; "
            "plot_png([row('all_reduce', 256, 4, 'float32', [1e-4, 1e-4])], 't'); "
            "print('matplotlib.pyplot' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"


def test_the_spec_fills_the_defaults_and_refuses_bad_flags():
    s = bench.spec(None, None, None, None, None, 2)
    assert s.ops == OPS and s.sizes == parse_sizes(bench.DEFAULT_SIZES)
    assert (s.iters, s.warmup, s.dtype) == (bench.DEFAULT_ITERS, bench.DEFAULT_WARMUP, "float32")
    assert "send_recv" not in bench.spec(None, None, None, None, None, 1).ops
    assert bench.spec(None, "8", "3", "0", "torch.half", 2).dtype == "float16"
    for args, message in [(("send_recv", None, None, None, None, 1), "send_recv needs at least 2 ranks"),
                          ((None, None, "0", None, None, 2), "--iters must be at least 1"),
                          ((None, None, None, "x", None, 2), "--warmup takes a whole number"),
                          ((None, None, None, None, "complex64", 2), "--dtype")]:
        with pytest.raises(ConfigError, match=message):
            bench.spec(*args)


def test_the_magics_help_states_the_defaults_that_bench_uses():
    from nbdist.magics import DistMagics

    text = " ".join(DistMagics.dist_bench.parser.format_help().split())
    assert f"(default {bench.DEFAULT_SIZES})" in text
    assert f"(default {bench.DEFAULT_ITERS})" in text and f"(default {bench.DEFAULT_WARMUP})" in text
    assert "(default float32)" in text and "(default: all)" in text


# --- real kernels -------------------------------------------------------------------------------------
def _rows(result: kernels.Result) -> list[dict]:
    return json.loads(ast.literal_eval(result.expression("r")))


def _check_rows(rows: list[dict], ops: tuple[str, ...], sizes: tuple[int, ...], n: int) -> None:
    assert [(r["op"], r["size"]) for r in rows] == [(op, s) for op in ops for s in sizes]
    for r in rows:
        assert r["ranks"] == n and len(r["rank_time_us"]) == n
        assert all(t > 0 for t in r["rank_time_us"]) and r["time_us"] == max(r["rank_time_us"])
        assert r["count"] * 4 == r["size"] and r["dtype"] == "float32"
        assert math.isclose(r["algbw_gbps"], r["size"] / (r["time_us"] * 1e-6) / 1e9, rel_tol=1e-9)
        assert math.isclose(r["busbw_gbps"], r["algbw_gbps"] * EXPECTED_FACTORS[n][r["op"]], rel_tol=1e-9)


@pytest.fixture(scope="module")
def shared():
    """This module's own world, in two new kernels rather than the session's: a test checks that %dist_bench
    leaves ``matplotlib.pyplot`` unimported, which a kernel that other modules drew in has imported already."""
    with shared_world(2) as world:
        yield world


@pytest.fixture
def pair(shared):
    yield from lend(shared, probe=PROBE)


@pytest.mark.timeout(120)
def test_the_bench_on_2_ranks_shows_a_table_and_a_plot_and_returns_every_op_and_size(pair):
    results = kernels.execute_all(pair, "r = %dist_bench --sizes 1K:4K --iters 3 --warmup 1\nr", timeout=90,
                                  user_expressions={"r": ROWS, "left": "'_nbdist_bench_rows' in globals()",
                                                    "pyplot": "'matplotlib.pyplot' in __import__('sys').modules"})
    for rank, result in enumerate(results):
        assert result.status == "ok", f"rank {rank}: {result.error}"
        rows = _rows(result)
        _check_rows(rows, OPS, (1024, 2048, 4096), 2)
        shown = [o for o in result.shown() if o["msg_type"] == "display_data"]
        table, plot = shown[0]["content"]["data"], shown[1]["content"]["data"]
        assert table["text/plain"].startswith("%dist_bench · 2 ranks · gloo · cpu · float32 · median of 3")
        assert all(f"\n{op} " in table["text/plain"] for op in OPS) and "<table" in table["text/html"]
        assert base64.b64decode(plot["image/png"]).startswith(PNG)
        out = [o for o in result.outputs if o["msg_type"] == "execute_result"]
        assert out[0]["content"]["data"]["text/plain"] == ("<%dist_bench results: 18 rows, 6 op(s) x 3 size(s) on "
                                                           "2 rank(s); a list of dicts>")
        assert result.expression("left") == "False" and result.expression("pyplot") == "False"
    assert _rows(results[0]) == _rows(results[1])  # every notebook shows the same figures


BLOCK_MATPLOTLIB = ("import sys as _s; _mf = _s.modules.get('matplotlib.figure'); "
                    "_s.modules['matplotlib.figure'] = None")
UNBLOCK_MATPLOTLIB = ("_s.modules.pop('matplotlib.figure') if _mf is None else _s.modules.update({'matplotlib.figure': "
                      "_mf}); del _s, _mf")


@pytest.mark.timeout(90)
def test_without_matplotlib_the_table_comes_with_a_one_line_note_instead_of_the_plot(pair):
    assert pair[0].execute(BLOCK_MATPLOTLIB).status == "ok"
    try:
        results = kernels.execute_all(pair, "%dist_bench --ops broadcast --sizes 1K --iters 2", timeout=60)
    finally:
        assert pair[0].execute(UNBLOCK_MATPLOTLIB).status == "ok"
    assert all(r.status == "ok" for r in results), [r.error for r in results]
    mine = [o["content"]["data"] for o in results[0].shown() if o["msg_type"] == "display_data"]
    assert "\nbroadcast " in mine[0]["text/plain"] and len(mine) == 2
    assert mine[1]["text/plain"] == "nbdist: no plot: matplotlib is not installed (pip install matplotlib)"
    assert "image/png" in [o for o in results[1].shown() if o["msg_type"] == "display_data"][1]["content"]["data"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("flags", "message"), [
    ("--ops all_reduce,bogus", "--ops: unknown op 'bogus'"),
    ("--sizes 1T", "--sizes: '1T' is not a size"),
    ("--iters -3", "--iters must be at least 1"),
    ("--dtype complex64", "--dtype: 'complex64' is not one of"),
    ("--bogus 1", "unrecognized arguments"),
])
def test_a_bad_flag_is_a_one_line_usage_error_and_nothing_runs(pair, flags, message):
    r = pair[0].execute(f"%dist_bench {flags}", timeout=30)
    assert r.status == "error" and r.error["ename"] == "UsageError", r.error
    assert message in r.error["evalue"] and "\n" not in r.error["evalue"]
    assert "Traceback" not in r.text()


@pytest.mark.timeout(120)
def test_the_stop_button_shows_the_sizes_measured_so_far_and_every_ranks_cell_ends(pair):
    cell = "%dist_bench --sizes 1K:16M --iters 300"
    started = [run_in_background(k, cell, timeout=110) for k in pair]
    time.sleep(4)  # the first sizes take milliseconds each; the whole bench, about a minute
    pair[0].interrupt()
    interrupted = time.monotonic()
    for thread, _ in started:
        thread.join(30)
    ended = [box for _, box in started]
    assert all("r" in box for box in ended), "a rank's cell did not end within 30 s of the stop button"
    assert max(box["t"] for box in ended) - interrupted < 15
    mine, other = ended[0]["r"], ended[1]["r"]
    assert mine.status == "error" and mine.error["ename"] == "KeyboardInterrupt", mine.error
    assert other.status == "error" and other.error["ename"] == "PeerFailedError", other.error
    assert "rank 0" in other.error["evalue"] and "interrupted its cell" in other.error["evalue"]
    for result, why in ((mine, "KeyboardInterrupt"), (other, "PeerFailedError")):
        text = result.text()
        assert f"partial ({why}: " in text, text
        measured = int(text.split(f"partial ({why}: ")[1].split(" of ")[0])
        assert 1 <= measured < 6 * 15
        assert text.count("\nall_reduce ") >= min(measured, 15)  # each measured size is a line of the table
    again = kernels.execute_all(pair, PROBE + "t.item()", timeout=60)
    assert all(r.status == "ok" and "2.0" in r.text() for r in again), [r.error for r in again]


@pytest.mark.timeout(180)
def test_the_bench_on_4_ranks_uses_the_4_rank_factors_on_every_rank(make_world):
    ks = make_world(4)
    results = kernels.execute_all(ks, "r = %dist_bench --sizes 1K,4K --iters 2 --warmup 1", timeout=150,
                                  user_expressions={"r": ROWS})
    for rank, result in enumerate(results):
        assert result.status == "ok", f"rank {rank}: {result.error}"
        _check_rows(_rows(result), OPS, (1024, 4096), 4)
        assert "%dist_bench · 4 ranks" in result.text()
    assert all(_rows(r) == _rows(results[0]) for r in results)


# --- nbdist bench ---------------------------------------------------------------------------------------
def _bench_cli(*args: str, cwd: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "nbdist", "bench", *args], cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _worker_pids(stdout: str) -> list[int]:
    line = next(line for line in stdout.splitlines() if "worker kernel pid(s)" in line)
    return [int(p) for p in line.split("pid(s) ")[1].split(" exited")[0].split(", ")]


@pytest.mark.timeout(120)
def test_nbdist_bench_prints_the_table_writes_the_plot_and_leaves_no_worker(tmp_path):
    proc = _bench_cli("--world-size", "2", "--sizes", "1K:2K", "--iters", "2", "--warmup", "1", "--plot", "out.png",
                      cwd=str(tmp_path))
    out, err = proc.communicate(timeout=110)
    assert proc.returncode == 0, err
    assert "%dist_bench · 2 ranks · gloo · cpu · float32" in out
    assert all(f"\n{op} " in out for op in OPS) and "<%dist_bench results" not in out
    assert f"plot written to {tmp_path / 'out.png'}" in out
    assert (tmp_path / "out.png").read_bytes().startswith(PNG)
    pids = _worker_pids(out)
    assert len(pids) == 1 and all(pid_gone(p) for p in pids)


@pytest.mark.timeout(120)
def test_nbdist_bench_ctrl_c_prints_the_sizes_measured_so_far_and_exits_130(tmp_path):
    proc = _bench_cli("--world-size", "2", "--sizes", "1K:16M", "--iters", "300", cwd=str(tmp_path))
    first = proc.stdout.readline()  # printed once the world has formed
    assert "a world of 2 ranks" in first, first
    time.sleep(3)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "partial (KeyboardInterrupt: " in out and "\nall_reduce " in out
    assert "the table above holds the sizes measured so far" in err
    assert not (tmp_path / "nbdist-bench.png").exists()
    assert all(pid_gone(p) for p in _worker_pids(out))


@pytest.mark.parametrize(("args", "message"), [
    (["--world-size", "1"], "--world-size must be at least 2"),
    (["--world-size", "2", "--sizes", "big"], "--sizes: 'big' is not a size"),
    (["--world-size", "2", "--ops", "gather"], "--ops: unknown op 'gather'"),
])
def test_nbdist_bench_refuses_bad_arguments_with_exit_2_before_starting_anything(tmp_path, args, message):
    proc = _bench_cli(*args, cwd=str(tmp_path))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and message in err and out == ""
