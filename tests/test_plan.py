"""The planner: arithmetic, binding constraints, profiles, and the plan command."""

from __future__ import annotations

import json
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
    assert proc.stderr == "oomguard: error: --require-jobs: 0 jobs fit, 1 required\n"
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
    assert short.returncode == 3 and short.stderr == "oomguard: error: --require-jobs: 9 jobs fit, 10 required\n"
    assert short.stdout.startswith("oomguard plan: 9 jobs, memory binds: 9 GiB budget / 1 GiB per job")
    assert run_oomguard("plan", "--root", tree, "--per-job", "1GiB", "--require-jobs", "9").returncode == 0


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
