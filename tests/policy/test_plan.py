"""The planner: arithmetic, binding constraints, profiles, and the plan command."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oomguard import Shape, make_plan
from oomguard.errors import BadParameter, UsageError
from oomguard.policy.profiles import load_profiles, profile_values
from tests.conftest import REPO, run_oomguard
from tests.helpers.trees import make_tree

GiB = 1024**3
MiB = 1024**2
KiB = 1024


def report_with(
    budget: int | None,
    *,
    memlock: int | None = 8 * MiB,
    cap: bool = False,
    cpus: float | None = 16.0,
    known: bool = True,
) -> dict[str, Any]:
    """The parts of a report the planner reads."""
    return {
        "budget": {"bytes": budget, "source": "explicit"},
        "memory": {"effective_bytes": budget, "limited_by": "cgroup-v2"},
        "memlock": {"known": known, "soft_bytes": memlock, "cap_ipc_lock": cap},
        "cpu": {"effective_cpus": cpus},
        "gpus": [],
        "gpu_driver": {"status": "no-driver"},
        "warnings": [],
    }


def plan(report: dict[str, Any], shape: Shape) -> dict[str, Any]:
    # reports are built here as plain dicts, and the plan is indexed as one: dict[str, Any] both ways
    return cast("dict[str, Any]", make_plan(report, shape))  # type: ignore[arg-type]


def test_the_prover_example() -> None:
    p = plan(report_with(332 * GiB), Shape(14 * GiB, 70 * GiB, max_jobs=18))
    assert p["concurrency"] == 18
    assert p["binding"] == "memory"  # a tie with max_jobs: memory comes first
    assert p["capacity"] == {"memory": 18, "memlock": None, "gpu": None, "max_jobs": 18, "cpu": None}
    assert p["headroom_bytes"] == 332 * GiB - 70 * GiB - 18 * 14 * GiB
    assert p["explanation"] == "18 jobs, memory binds: (332 GiB budget - 70 GiB baseline) / 14 GiB per job"


def test_where_the_old_rule_overcommits() -> None:
    # CuZK's workers = max(2, min(budget / 14 GiB, 18)) says 2 for 20 GiB and 6 for 90 GiB.
    assert plan(report_with(20 * GiB), Shape(14 * GiB, max_jobs=18))["concurrency"] == 1
    assert plan(report_with(90 * GiB), Shape(14 * GiB, 70 * GiB, max_jobs=18))["concurrency"] == 1
    assert plan(report_with(100 * GiB), Shape(14 * GiB, 70 * GiB, max_jobs=18))["concurrency"] == 2


def test_nothing_fits() -> None:
    report = report_with(64 * GiB)
    p = plan(report, Shape(14 * GiB, 70 * GiB))
    assert (p["concurrency"], p["binding"]) == (0, "memory")
    assert p["headroom_bytes"] == -6 * GiB
    assert report["warnings"] == [
        {
            "code": "budget-too-small",
            "message": "the budget 64 GiB is below the plan's baseline 70 GiB + one job 14 GiB = 84 GiB: no job fits",
        }
    ]
    exactly = report_with(84 * GiB)  # baseline + one job fits exactly: no warning
    assert plan(exactly, Shape(14 * GiB, 70 * GiB))["concurrency"] == 1 and exactly["warnings"] == []
    p = plan(report_with(None), Shape(GiB))
    assert p["concurrency"] == 0 and p["explanation"] == "0 jobs: the budget is unknown"


def test_max_jobs_binds() -> None:
    p = plan(report_with(1000 * GiB), Shape(GiB, max_jobs=4))
    assert (p["concurrency"], p["binding"]) == (4, "max_jobs")
    assert p["explanation"] == "4 jobs, max_jobs binds: capped at 4 (memory would fit 1000)"


def test_memlock_binds_without_cap_ipc_lock() -> None:
    report = report_with(100 * GiB, memlock=64 * MiB)
    p = plan(report, Shape(GiB, pinned_per_job=16 * MiB))
    assert (p["concurrency"], p["binding"]) == (4, "memlock")
    assert "pinned-counts-against-limit" in {w["code"] for w in report["warnings"]}
    # CAP_IPC_LOCK lifts the limit; an unlimited soft limit never binds.
    assert (
        plan(report_with(100 * GiB, memlock=64 * MiB, cap=True), Shape(GiB, pinned_per_job=16 * MiB))["binding"]
        == "memory"
    )
    assert (
        plan(report_with(100 * GiB, memlock=None), Shape(GiB, pinned_per_job=16 * MiB))["capacity"]["memlock"] is None
    )
    unknown = report_with(100 * GiB, known=False, memlock=None)
    plan(unknown, Shape(GiB, pinned_per_job=16 * MiB))
    assert "memlock-unknown" in {w["code"] for w in unknown["warnings"]}


def test_a_pinned_baseline_above_memlock_fits_no_job() -> None:
    report = report_with(332 * GiB, memlock=8 * MiB)
    p = plan(report, Shape(14 * GiB, 70 * GiB, pinned_baseline=44 * GiB, max_jobs=18))
    assert (p["concurrency"], p["binding"]) == (0, "memlock")
    assert p["capacity"] == {"memory": 18, "memlock": 0, "gpu": None, "max_jobs": 18, "cpu": None}
    assert p["explanation"] == (
        "0 jobs, memlock binds: the 44 GiB pinned baseline is above RLIMIT_MEMLOCK (8 MiB) "
        "(no CAP_IPC_LOCK, pin method mlock)"
    )
    assert [w["code"] for w in report["warnings"]] == ["memlock-too-low"]
    assert report["warnings"][0]["message"].startswith(
        "RLIMIT_MEMLOCK (8 MiB) is below the 44 GiB pinned baseline: pinning it (pin method mlock) fails, "
        "so no job can run; raise it"
    )
    # with pinned memory per job too, the baseline still decides first
    p = plan(report_with(332 * GiB, memlock=8 * MiB), Shape(GiB, pinned_per_job=MiB, pinned_baseline=44 * GiB))
    assert (p["concurrency"], p["binding"]) == (0, "memlock")
    # the baseline fits: it only lowers what is left for the jobs' pinned memory
    p = plan(report_with(332 * GiB, memlock=64 * MiB), Shape(GiB, pinned_per_job=16 * MiB, pinned_baseline=32 * MiB))
    assert (p["concurrency"], p["binding"], p["capacity"]["memlock"]) == (2, "memlock", 2)
    # a baseline below the limit without --pinned-per-job does not constrain the jobs
    small = plan(report_with(100 * GiB, memlock=64 * MiB), Shape(GiB, pinned_baseline=MiB))
    assert small["capacity"]["memlock"] is None
    # CAP_IPC_LOCK, or an unlimited RLIMIT_MEMLOCK: the pinned baseline is not limited
    for kw in ({"cap": True}, {"memlock": None}):
        r = report_with(332 * GiB, **kw)
        assert plan(r, Shape(14 * GiB, 70 * GiB, pinned_baseline=44 * GiB))["concurrency"] == 18
        assert r["warnings"] == []


def test_plan_command_refuses_a_pinned_baseline_above_memlock(tmp_path: Path) -> None:
    tree = make_tree(tmp_path, limit=str(400 * GiB), mem_total_kb=512 * 1024**2)
    limits = "Limit  Soft Limit  Hard Limit  Units\nMax locked memory  8388608  8388608  bytes\n"
    (tree / "proc/self/limits").write_text(limits)
    args = ("plan", "--root", str(tree), "--per-job", "14GiB", "--pinned-baseline", "44GiB", "--require-jobs", "1")
    proc = run_oomguard(*args)
    assert proc.returncode == 3, proc
    assert proc.stderr == (
        "oomguard: error: --require-jobs: 0 jobs fit, 1 required "
        "(budget 390 GiB - 44 GiB baseline = 346 GiB / 14 GiB per job; memlock binds at 0)\n"
    )
    assert proc.stdout.startswith("oomguard plan: 0 jobs, memlock binds: the 44 GiB pinned baseline is above")
    assert "memlock-too-low: RLIMIT_MEMLOCK (8 MiB) is below the 44 GiB pinned baseline" in proc.stdout
    # the same pinned memory registered for RDMA (ibv_reg_mr) is charged to RLIMIT_MEMLOCK too
    proc = run_oomguard(*args, "--pin-method", "rdma")
    assert proc.returncode == 3, proc
    assert "pinning it (pin method rdma, ibv_reg_mr) fails" in proc.stdout


def test_the_pin_method_decides_whether_memlock_can_refuse() -> None:
    """cuda is charged to the memory cgroup, never to RLIMIT_MEMLOCK; mlock and rdma are, unless CAP_IPC_LOCK."""
    shape = {"per_job": 14 * GiB, "baseline": 70 * GiB, "pinned_baseline": 44 * GiB, "max_jobs": 18}
    for method in ("mlock", "rdma"):
        report = report_with(332 * GiB, memlock=8 * MiB)
        p = plan(report, Shape(**shape, pin_method=method))  # type: ignore[arg-type]
        assert (p["concurrency"], p["binding"], p["capacity"]["memlock"]) == (0, "memlock", 0), method
        assert p["shape"]["pin_method"] == method
        # CAP_IPC_LOCK lifts both (mm/mlock.c, drivers/infiniband/core/umem.c)
        assert plan(report_with(332 * GiB, cap=True), Shape(**shape, pin_method=method))["concurrency"] == 18  # type: ignore[arg-type]
    report = report_with(332 * GiB, memlock=8 * MiB)
    p = plan(report, Shape(**shape, pin_method="cuda"))  # type: ignore[arg-type]
    assert (p["concurrency"], p["binding"], p["capacity"]["memlock"]) == (18, "memory", None)
    assert [w["code"] for w in report["warnings"]] == []
    # per-job pinned memory through CUDA: no memlock constraint, and it is part of each job's size
    report = report_with(100 * GiB, memlock=64 * KiB)
    p = plan(report, Shape(GiB, pinned_per_job=512 * MiB, pin_method="cuda"))
    assert (p["concurrency"], p["capacity"]["memlock"]) == (100, None)
    assert [w["code"] for w in report["warnings"]] == ["pinned-counts-against-limit"]
    with pytest.raises(UsageError, match=r"^pin_method: must be one of cuda, mlock, rdma, got 'dma'$"):
        Shape(GiB, pin_method="dma")


def test_the_cuzk_profile_is_not_refused_for_memlock_alone(tmp_path: Path) -> None:
    """Docker's defaults: 8 MiB RLIMIT_MEMLOCK, no CAP_IPC_LOCK, on a 256 GiB node: the memory answer."""
    tree = make_tree(tmp_path, limit=str(256 * GiB), mem_total_kb=512 * 1024**2)
    limits = "Limit  Soft Limit  Hard Limit  Units\nMax locked memory  8388608  8388608  bytes\n"
    (tree / "proc/self/limits").write_text(limits)
    status = (tree / "proc/self/status").read_text()
    assert "CapEff:\t00000000a80425fb" in status  # Docker's default set: bit 14 (CAP_IPC_LOCK) clear
    proc = run_oomguard("plan", "--json", "--root", str(tree), "--profile", "porep-c2-32g", "--require-jobs", "1")
    assert proc.returncode == 0, proc
    out = json.loads(proc.stdout)
    # auto budget 256 GiB - 10 GiB margin = 246 GiB; (246 - 70) / 14 = 12 jobs
    assert (out["concurrency"], out["binding"], out["capacity"]["memlock"]) == (12, "memory", None)
    assert out["shape"]["pin_method"] == "cuda"
    assert "memlock-too-low" not in {w["code"] for w in out["report"]["warnings"]}
    # the report still says what RLIMIT_MEMLOCK is (for mlock and RDMA, which it does bind)
    assert (out["report"]["memlock"]["soft_bytes"], out["report"]["memlock"]["cap_ipc_lock"]) == (8 * MiB, False)
    # the same node with the old meaning asked for by hand refuses, as mlock would fail
    proc = run_oomguard("plan", "--root", str(tree), "--profile", "porep-c2-32g", "--pin-method", "mlock")
    assert proc.returncode == 0 and proc.stdout.startswith("oomguard plan: 0 jobs, memlock binds"), proc


def test_cpu_binds() -> None:
    p = plan(report_with(100 * GiB, cpus=2.5), Shape(GiB, cpus_per_job=0.5))
    assert (p["concurrency"], p["binding"]) == (5, "cpu")
    assert plan(report_with(100 * GiB, cpus=2.0), Shape(GiB))["capacity"]["cpu"] is None


def gpu(free: int, total: int = 80 * GiB) -> dict[str, Any]:
    return {"memory_free_bytes": free, "memory_total_bytes": total}


def test_gpu_constraint() -> None:
    report = report_with(100 * GiB)
    report["gpu_driver"]["status"] = "skipped"  # --no-gpu: the constraint is ignored, and it says so
    assert plan(report, Shape(GiB, gpu_per_job=GiB))["capacity"]["gpu"] is None
    assert [w["code"] for w in report["warnings"]] == ["gpu-not-probed"]
    report = report_with(100 * GiB)  # no driver: no GPU, so jobs that need one do not fit
    p = plan(report, Shape(GiB, gpu_per_job=GiB))
    assert (p["concurrency"], p["binding"]) == (0, "gpu")
    report["gpu_driver"]["status"] = "ok"
    report["gpus"] = [gpu(75 * GiB), gpu(20 * GiB)]  # 7 + 2 jobs of 10 GiB, per visible GPU
    p = plan(report, Shape(GiB, gpu_per_job=10 * GiB))
    assert (p["concurrency"], p["binding"], p["capacity"]["gpu"]) == (9, "gpu", 9)
    assert p["explanation"] == "9 jobs, gpu binds: 10 GiB of device memory per job"


def test_memlock_too_low_warns() -> None:
    report = report_with(100 * GiB, memlock=64 * MiB)
    plan(report, Shape(GiB, pinned_per_job=32 * MiB))
    codes = [w["code"] for w in report["warnings"]]
    assert "memlock-too-low" in codes and "pinned-counts-against-limit" in codes
    report = report_with(100 * GiB, memlock=64 * MiB)
    plan(report, Shape(GiB, pinned_per_job=32 * MiB, max_jobs=2))  # memlock allows 2: enough
    assert "memlock-too-low" not in [w["code"] for w in report["warnings"]]


sizes = st.integers(min_value=1, max_value=2**44)


@given(budget=st.integers(min_value=0, max_value=2**46), per_job=sizes, baseline=st.integers(0, 2**44))
def test_never_more_than_fits(budget: int, per_job: int, baseline: int) -> None:
    p = plan(report_with(budget), Shape(per_job, baseline))
    n = p["concurrency"]
    assert n >= 0
    if n:
        assert baseline + n * per_job <= budget
    assert baseline + (n + 1) * per_job > budget  # one more would not fit
    if per_job + baseline > budget:
        assert n == 0


@given(
    a=st.integers(0, 2**46),
    b=st.integers(0, 2**46),
    per_job=sizes,
    baseline=st.integers(0, 2**44),
    max_jobs=st.none() | st.integers(0, 64),
)
def test_monotonic_in_the_budget(a: int, b: int, per_job: int, baseline: int, max_jobs: int | None) -> None:
    lo, hi = sorted((a, b))
    shape = Shape(per_job, baseline, max_jobs=max_jobs)
    assert plan(report_with(lo), shape)["concurrency"] <= plan(report_with(hi), shape)["concurrency"]


def test_builtin_profiles_carry_the_provers_numbers() -> None:
    profiles = {name: profile_values(name, p) for name, p in load_profiles().items()}
    assert profiles["porep-c2-32g"] == {
        "per_job": 14 * GiB,
        "baseline": 70 * GiB,
        "pinned_baseline": 44 * GiB,
        "pin_method": "cuda",
        "max_jobs": 18,
        "consumer": "cuzk",
    }
    # every CuZK profile pins its SRS through CUDA (cudaHostAlloc), never through mlock
    assert {p["pin_method"] for p in profiles.values()} == {"cuda"}
    for name, p in load_profiles().items():  # the pinned SRS is declared as the pinned baseline
        parts = p["baseline_parts"]
        assert isinstance(parts, dict)
        assert profile_values(name, {"per_job": 1, "pinned_baseline": parts["pinned_srs"]}) == {
            "per_job": 1,
            "pinned_baseline": profiles[name]["pinned_baseline"],
        }
    assert profiles["window-post"]["baseline"] == 83 * GiB
    assert profiles["snapdeals"]["per_job"] == 9 * GiB and profiles["snapdeals"]["baseline"] == 50 * GiB
    assert profiles["winning-post"]["per_job"] == 512 * MiB
    for name, p in load_profiles().items():
        assert "Curio PR #1043" in str(p["source"]), name  # every number has its source


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--per-job", "0"], "--per-job: must be above 0"),  # Shape's per_job, named by its flag
        (["--per-job", "-1G"], "--per-job: -1G is negative (a size is 0 or more)"),
        (["--per-job=-1G"], "--per-job: -1G is negative (a size is 0 or more)"),
        (["--profile", "nope"], "--profile: unknown profile 'nope'"),
        (["--baseline", "1G"], "plan: give --per-job SIZE or --profile NAME"),
        (["--per-job", "1G", "--max-jobs", "x"], "--max-jobs: expected a whole number, got 'x'"),
        (["--per-job", "1G", "--cpus-per-job", "0"], "--cpus-per-job: must be a number above 0"),
        (["--per-job", "1G", "--require-jobs", "-2"], "--require-jobs: must not be negative, got '-2'"),
    ],
)
def test_invalid_shapes_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    proc = run_oomguard("plan", "--root", str(make_tree(tmp_path)), *args)
    assert proc.returncode == 2, proc
    assert proc.stderr == f"oomguard: error: {message}" + proc.stderr[len("oomguard: error: ") + len(message) :]
    assert proc.stderr.startswith(f"oomguard: error: {message}") and proc.stderr.count("\n") == 1


def test_plan_command_json_and_require_jobs(tmp_path: Path) -> None:
    tree = str(make_tree(tmp_path, limit=str(10 * GiB), mem_total_kb=512 * 1024**2))
    proc = run_oomguard("plan", "--json", "--root", tree, "--per-job", "1GiB", "--baseline", "2GiB")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    # 10 GiB limit - 1 GiB margin = 9 GiB budget; (9 - 2) / 1 = 7 jobs
    assert out["concurrency"] == 7 and out["binding"] == "memory" and out["headroom_bytes"] == 0
    assert out["report"]["budget"]["bytes"] == 9 * GiB
    assert out["shape"]["per_job_bytes"] == GiB
    short = run_oomguard("plan", "--root", tree, "--per-job", "1GiB", "--require-jobs", "10")
    assert short.returncode == 3
    assert short.stderr == "oomguard: error: --require-jobs: 9 jobs fit, 10 required (budget 9 GiB / 1 GiB per job)\n"
    assert short.stdout.startswith("oomguard plan: 9 jobs, memory binds: 9 GiB budget / 1 GiB per job")
    assert run_oomguard("plan", "--root", tree, "--per-job", "1GiB", "--require-jobs", "9").returncode == 0


@pytest.mark.skipif(sys.version_info < (3, 11), reason="TOML profiles need tomllib: Python >= 3.11")
def test_profile_flags_override_and_user_files(tmp_path: Path) -> None:
    tree = str(make_tree(tmp_path, limit=str(400 * GiB), mem_total_kb=512 * 1024**2))
    proc = run_oomguard("plan", "--json", "--root", tree, "--profile", "porep-c2-32g", "--max-jobs", "4")
    out = json.loads(proc.stdout)
    assert out["shape"]["profile"] == "porep-c2-32g" and out["shape"]["baseline_bytes"] == 70 * GiB
    assert (out["concurrency"], out["binding"]) == (4, "max_jobs")
    user_json = tmp_path / "p.json"
    user_json.write_text(json.dumps({"profiles": {"mine": {"per_job": "100GiB", "baseline": 0}}}))
    out = json.loads(
        run_oomguard("plan", "--json", "--root", tree, "--profiles", str(user_json), "--profile", "mine").stdout
    )
    assert out["concurrency"] == 3  # 390 GiB budget / 100 GiB
    user_toml = tmp_path / "p.toml"
    user_toml.write_text('[mine]\nper_job = "130GiB"\n')
    out = json.loads(
        run_oomguard("plan", "--json", "--root", tree, "--profiles", str(user_toml), "--profile", "mine").stdout
    )
    assert out["concurrency"] == 3
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    proc = run_oomguard("plan", "--root", tree, "--profiles", str(bad), "--profile", "x")
    assert proc.returncode == 2 and proc.stderr.startswith(f"oomguard: error: --profiles: {bad} is not valid")
    bad.write_text(json.dumps({"x": {"per_job": [1]}}))
    proc = run_oomguard("plan", "--root", tree, "--profiles", str(bad), "--profile", "x")
    assert proc.returncode == 2 and "profile 'x': per_job: expected a size" in proc.stderr
    listing = run_oomguard("plan", "--list-profiles", "--profiles", str(user_json))
    assert listing.returncode == 0 and "porep-c2-32g" in listing.stdout and "mine" in listing.stdout


@pytest.mark.skipif(sys.version_info < (3, 11), reason="TOML profiles need tomllib: Python >= 3.11")
def test_list_profiles_shows_every_field_and_nothing_dangling(tmp_path: Path) -> None:
    """``plan --list-profiles``: each profile's name and description, every shape field as the planner
    takes it (pinned_baseline and pin_method included; "(default)" where the profile leaves one out),
    its other fields as written, and no trailing ": " for a profile without a description."""
    from oomguard.policy.plan import SHAPE_FIELDS

    user = tmp_path / "p.toml"
    user.write_text('[mine]\nper_job = "100GiB"\ncpus_per_job = 0.5\npinned_per_job = 1048576\n')
    proc = run_oomguard("plan", "--list-profiles", "--profiles", str(user))
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    blocks = {b.split("\n", 1)[0].split("  ")[0]: b.split("\n") for b in proc.stdout.rstrip("\n").split("\n\n")}
    assert sorted(blocks) == sorted({*load_profiles(), "mine"})
    for name, lines in blocks.items():
        fields = [line.split()[0] for line in lines[1:]]
        assert fields[: len(SHAPE_FIELDS)] == list(SHAPE_FIELDS), name
        assert all(line == line.rstrip() and not line.endswith(":") for line in lines), name
    assert blocks["mine"] == [
        "mine",
        "  per_job          100 GiB",
        "  baseline         0 B (default)",
        "  pinned_per_job   1 MiB",
        "  pinned_baseline  0 B (default)",
        "  pin_method       mlock (default)",
        "  gpu_per_job      -",
        "  max_jobs         -",
        "  cpus_per_job     0.5",
    ]
    porep = blocks["porep-c2-32g"]
    assert porep[0] == "porep-c2-32g  PoRep C2, 32 GiB sector (10 partitions), one job per partition"
    for line in (
        "  baseline         70 GiB",
        "  pinned_baseline  44 GiB",
        "  pin_method       cuda",
        "  max_jobs         18",
        "  baseline_parts   pinned_srs 44GiB, pce 26GiB",
    ):
        assert line in porep
    assert any(line.startswith("  source           Curio PR #1043") for line in porep)
    doc = (REPO / "docs" / "plan.md").read_text()
    assert "\n".join(porep) in doc  # docs/plan.md shows this block as it is printed
    user.write_text('[mine]\nper_job = "100GiB"\npin_method = "glue"\n')
    proc = run_oomguard("plan", "--list-profiles", "--profiles", str(user))
    assert proc.returncode == 2 and "profile 'mine': pin_method: expected one of cuda, mlock, rdma" in proc.stderr


def test_shape_rejects_nonsense() -> None:
    with pytest.raises(UsageError):
        Shape(0)
    with pytest.raises(UsageError):
        Shape(GiB, cpus_per_job=float("nan"))


def test_the_plan_is_in_the_contract(tmp_path: Path) -> None:
    """A report that carries a plan (as the agent ships it) validates; any other extra key does not."""
    from importlib import resources

    import jsonschema

    from oomguard import probe
    from oomguard.sources.root import DirRoot

    schema = json.loads(resources.files("oomguard").joinpath("schema.json").read_text())
    report = probe(root=DirRoot(str(make_tree(tmp_path, limit=str(10 * GiB), mem_total_kb=512 * 1024**2))))
    jsonschema.validate(report, schema)  # plan is optional
    shape = Shape(GiB, 2 * GiB, pinned_per_job=MiB, gpu_per_job=GiB, max_jobs=5, cpus_per_job=0.5, profile="mine")
    report["plan"] = make_plan(report, shape)
    jsonschema.validate(report, schema)
    assert set(report["plan"]) == set(schema["properties"]["plan"]["required"])
    assert report["plan"]["shape"] == {
        "profile": "mine",
        "per_job_bytes": GiB,
        "baseline_bytes": 2 * GiB,
        "pinned_per_job_bytes": MiB,
        "pinned_baseline_bytes": 0,
        "pin_method": "mlock",
        "gpu_per_job_bytes": GiB,
        "max_jobs": 5,
        "cpus_per_job": 0.5,
    }
    # an older agent's plan has no pin_method: the manager must still take it (mlock is meant)
    del report["plan"]["shape"]["pin_method"]  # type: ignore[misc]
    jsonschema.validate(report, schema)
    report["plan"]["shape"]["pin_method"] = "dma"  # type: ignore[typeddict-item]  # not one of the methods
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(report, schema)
    report["plan"]["shape"]["pin_method"] = "cuda"
    report["plan"]["capacity"]["disk"] = 3  # type: ignore[typeddict-unknown-key]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(report, schema)
    del report["plan"]["capacity"]["disk"]  # type: ignore[typeddict-item]
    report["extra"] = 1  # type: ignore[typeddict-unknown-key]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(report, schema)


@pytest.mark.parametrize("cpus", [1e-320, 0.0009, 1e6 + 1, float("nan"), float("inf"), 0.0, -1.0])
def test_a_library_shape_takes_cpus_per_job_in_the_same_range_as_the_flag(cpus: float) -> None:
    """Before, ``Shape(cpus_per_job=1e-320)`` passed and planning it overflowed (CPUs / 1e-320)."""
    with pytest.raises(BadParameter, match=r"cpus_per_job: must be from 0\.001 to 1e\+06"):
        Shape(per_job=GiB, cpus_per_job=cpus)
    assert Shape(per_job=GiB, cpus_per_job=0.001).cpus_per_job == 0.001


# --- CuZK's own arithmetic (policy/cuzk.py) ---------------------------------------------------------


def cuzk_shape(name: str) -> Shape:
    fields = profile_values(name, load_profiles()[name])
    return Shape(cast("int", fields.pop("per_job")), **fields)  # type: ignore[arg-type]


def test_cuzk_workers_are_max_2_min_budget_over_14_gib_18() -> None:
    from oomguard.policy import cuzk

    # engine.rs L1413, L1433-1437: the PoRep 14 GiB for every circuit, never below 2, 18 by default
    assert [cuzk.workers(b * GiB) for b in (0, 20, 27, 28, 90, 252, 300)] == [2, 2, 2, 2, 6, 18, 18]
    assert cuzk.workers(300 * GiB, max_parallel_synthesis=4) == 4
    assert cuzk.workers(300 * GiB, max_parallel_synthesis=30) == 21  # 300 / 14


def test_cuzk_partitions_count_the_srs_and_pce_in_the_same_budget() -> None:
    from oomguard.policy import cuzk

    porep = cuzk_shape("porep-c2-32g")
    assert porep.consumer == "cuzk" and (porep.baseline, porep.per_job) == (70 * GiB, 14 * GiB)
    assert cuzk.partitions(300 * GiB, porep) == 16  # floor((300 - 70) / 14); 18 workers
    assert cuzk.partitions(224 * GiB, porep) == 11  # the jobs' share only (16 x 14): 31 % fewer
    assert cuzk.partitions(84 * GiB, porep) == 1 and cuzk.partitions(84 * GiB - 1, porep) == 0
    assert cuzk.partitions(20 * GiB, porep) == 0  # below the SRS: its acquire waits for ever
    assert cuzk.partitions(600 * GiB, porep) == 18  # 37 would fit: the 18 workers bind
    assert cuzk.partitions(300 * GiB, cuzk_shape("snapdeals")) == 18  # (300 - 50) / 9 = 27
    assert cuzk.partitions(200 * GiB, cuzk_shape("window-post")) == 8  # (200 - 83) / 14
    assert cuzk.partitions(16 * GiB, cuzk_shape("winning-post")) == 2  # 30 fit, 2 workers (16 / 14 -> 2)


@given(budget=st.integers(0, 2**45), per_job=sizes, baseline=st.integers(0, 2**43))
def test_cuzk_partitions_always_fit_beside_the_resident_parts(budget: int, per_job: int, baseline: int) -> None:
    from oomguard.policy import cuzk

    shape = Shape(per_job, baseline, consumer="cuzk")
    n = cuzk.partitions(budget, shape)
    assert 0 <= n <= cuzk.workers(budget)
    assert n == 0 or baseline + n * per_job <= budget
    assert n == cuzk.workers(budget) or baseline + (n + 1) * per_job > budget  # one more would not fit


def test_the_plan_of_a_cuzk_profile_says_cuzks_partitions(tmp_path: Path) -> None:
    tree = str(make_tree(tmp_path, limit=str(400 * GiB), mem_total_kb=512 * 1024**2))
    args = ("plan", "--root", tree, "--profile", "porep-c2-32g", "--budget", "300GiB")
    out = json.loads(run_oomguard(*args, "--json").stdout)
    assert out["cuzk"] == {
        "total_budget_bytes": 300 * GiB,
        "resident_bytes": 70 * GiB,
        "partition_bytes": 14 * GiB,
        "workers": 18,
        "partitions": 16,
    }
    assert "cuzk-no-partition" not in {w["code"] for w in out["report"]["warnings"]}
    human = run_oomguard(*args)
    assert human.returncode == 0
    assert (
        f"  cuzk       16 partitions at once with total_budget 300 GiB (= {300 * GiB}): "
        "min(floor((300 GiB - 70 GiB SRS and PCE) / 14 GiB per partition), 18 workers)\n"
    ) in human.stdout
    plain = json.loads(run_oomguard("plan", "--root", tree, "--per-job", "14GiB", "--json").stdout)
    assert plain["cuzk"] is None  # not a CuZK shape
    assert "  cuzk " not in run_oomguard("plan", "--root", tree, "--per-job", "14GiB").stdout


def test_a_cuzk_budget_below_one_partition_warns() -> None:
    report = report_with(80 * GiB)
    p = plan(report, cuzk_shape("porep-c2-32g"))
    assert p["cuzk"]["partitions"] == 0 and p["cuzk"]["workers"] == 5
    assert {
        "code": "cuzk-no-partition",
        "message": (
            "CuZK's total_budget 80 GiB holds not even its SRS + PCE 70 GiB + one partition 14 GiB = 84 GiB: "
            "its budget.acquire waits for ever and no proof starts"
        ),
    } in report["warnings"]
    enough = report_with(84 * GiB)
    assert plan(enough, cuzk_shape("porep-c2-32g"))["cuzk"]["partitions"] == 1
    assert "cuzk-no-partition" not in {w["code"] for w in enough["warnings"]}
    unknown = report_with(None)
    assert plan(unknown, cuzk_shape("porep-c2-32g"))["cuzk"] == {
        "total_budget_bytes": None,
        "resident_bytes": 70 * GiB,
        "partition_bytes": 14 * GiB,
        "workers": None,
        "partitions": None,
    }
    assert "cuzk-no-partition" not in {w["code"] for w in unknown["warnings"]}


def test_user_profiles_may_name_cuzk_or_nothing(tmp_path: Path) -> None:
    tree = str(make_tree(tmp_path, limit=str(400 * GiB), mem_total_kb=512 * 1024**2))
    user = tmp_path / "p.json"
    user.write_text(
        json.dumps(
            {"plain": {"per_job": "10GiB"}, "mine": {"per_job": "10GiB", "baseline": "40GiB", "consumer": "cuzk"}}
        )
    )
    base = ("plan", "--json", "--root", tree, "--profiles", str(user), "--budget", "100GiB", "--profile")
    assert json.loads(run_oomguard(*base, "plain").stdout)["cuzk"] is None
    mine = json.loads(run_oomguard(*base, "mine").stdout)["cuzk"]
    assert (mine["partitions"], mine["workers"]) == (6, 7)  # (100 - 40) / 10; 100 / 14
    user.write_text(json.dumps({"odd": {"per_job": "10GiB", "consumer": "llama"}}))
    proc = run_oomguard(*base, "odd")
    assert proc.returncode == 2
    assert proc.stderr == "oomguard: error: profile 'odd': consumer: expected one of cuzk, got 'llama'\n"
    with pytest.raises(BadParameter, match="consumer: must be one of cuzk, got 'llama'"):
        Shape(GiB, consumer="llama")


# --- pinned sizes are part of the memory they pin ----------------------------------------------------


def test_a_pinned_size_above_its_whole_raises_it() -> None:
    shape = Shape(GiB, pinned_baseline=8 * GiB, pin_method="cuda")
    assert (shape.baseline, shape.per_job) == (8 * GiB, GiB)
    assert shape.raised == ("baseline raised from 0 B to the 8 GiB pinned baseline",)
    shape = Shape(GiB, 2 * GiB, pinned_per_job=3 * GiB, pinned_baseline=GiB)
    assert (shape.baseline, shape.per_job) == (2 * GiB, 3 * GiB)
    assert shape.raised == ("per job raised from 1 GiB to the 3 GiB pinned per job",)
    kept = Shape(14 * GiB, 70 * GiB, pinned_per_job=GiB, pinned_baseline=44 * GiB)
    assert (kept.baseline, kept.per_job, kept.raised) == (70 * GiB, 14 * GiB, ())
    p = plan(report_with(21 * GiB), Shape(GiB, pinned_baseline=8 * GiB, pin_method="cuda"))
    assert p["concurrency"] == 13 and p["shape"]["baseline_bytes"] == 8 * GiB
    assert p["explanation"] == (
        "13 jobs, memory binds: (21 GiB budget - 8 GiB baseline) / 1 GiB per job "
        "(baseline raised from 0 B to the 8 GiB pinned baseline: pinned memory is part of the memory it pins)"
    )
    with pytest.raises(BadParameter, match="baseline: must not be negative"):
        Shape(GiB, -1)
    with pytest.raises(BadParameter, match="pinned_baseline: must not be negative"):
        Shape(GiB, pinned_baseline=-1)


READMES_EXAMPLE_MESSAGE = (
    "oomguard: error: --require-jobs: 13 jobs fit, 14 required "
    "(budget 21.19 GiB - 8 GiB baseline = 13.19 GiB / 1 GiB per job)\n"
)


def test_the_readmes_pinned_example_counts_the_pinned_baseline(tmp_path: Path) -> None:
    """``plan --per-job 1GiB --pinned-baseline 8GiB --pin-method cuda`` planned 21 jobs in 21.19 GiB."""
    tree = str(make_tree(tmp_path, limit=str(400 * GiB), mem_total_kb=512 * 1024**2))
    flags = ("--per-job", "1GiB", "--pinned-baseline", "8GiB", "--pin-method", "cuda")
    base = ("plan", "--root", tree, "--budget", "21.19GiB")
    out = json.loads(run_oomguard(*base, *flags, "--json").stdout)
    assert (out["concurrency"], out["shape"]["baseline_bytes"]) == (13, 8 * GiB)
    proc = run_oomguard(*base, *flags, "--require-jobs", "14")
    assert proc.returncode == 3 and proc.stderr == READMES_EXAMPLE_MESSAGE
    assert "(baseline raised from 0 B to the 8 GiB pinned baseline" in proc.stdout
    assert run_oomguard(*base, *flags, "--require-jobs", "13").returncode == 0
    user = tmp_path / "p.json"  # the same shape from a profile file: the same rule
    user.write_text(json.dumps({"pinned": {"per_job": "1GiB", "pinned_baseline": "8GiB", "pin_method": "cuda"}}))
    proc = run_oomguard(*base, "--profiles", str(user), "--profile", "pinned", "--require-jobs", "14")
    assert proc.returncode == 3 and proc.stderr == READMES_EXAMPLE_MESSAGE
    user.write_text(json.dumps({"pinned": {"per_job": "1GiB", "pinned_per_job": "2GiB", "pin_method": "cuda"}}))
    out = json.loads(run_oomguard(*base, "--profiles", str(user), "--profile", "pinned", "--json").stdout)
    assert (out["concurrency"], out["shape"]["per_job_bytes"]) == (10, 2 * GiB)  # 21.19 GiB / 2 GiB
    out = json.loads(run_oomguard(*base, "--per-job", "1GiB", "--pinned-per-job", "2GiB", "--json").stdout)
    assert (out["concurrency"], out["shape"]["per_job_bytes"]) == (10, 2 * GiB)


def test_require_jobs_says_the_binding_constraint_beside_the_memory_numbers(tmp_path: Path) -> None:
    tree = str(make_tree(tmp_path, limit=str(400 * GiB), mem_total_kb=512 * 1024**2))
    proc = run_oomguard("plan", "--root", tree, "--per-job", "1GiB", "--max-jobs", "3", "--require-jobs", "5")
    assert proc.returncode == 3
    assert proc.stderr == (
        "oomguard: error: --require-jobs: 3 jobs fit, 5 required "
        "(budget 390 GiB / 1 GiB per job; max_jobs binds at 3)\n"
    )
