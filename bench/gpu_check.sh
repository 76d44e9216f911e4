#!/usr/bin/env bash
# For a machine with an NVIDIA GPU: oomguard's GPU probe against nvidia-smi's own numbers,
# and a real 1 GiB cudaHostAlloc. Prints the details, then one verdict line.
# Usage: bench/gpu_check.sh   (from the repository root; uses .venv if present, else PYTHONPATH=src)
set -u
cd "$(dirname "$0")/.."
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
export PYTHONPATH=src
if ! command -v nvidia-smi >/dev/null; then
  echo "VERDICT: SKIP (no nvidia-smi on this machine)"; exit 0
fi
report=$(mktemp)
start=$(date +%s%N)
$PY -m oomguard check --json --probe-pinned 1GiB >"$report" || { echo "VERDICT: FAIL (oomguard check exited $?)"; exit 1; }
ms=$(( ($(date +%s%N) - start) / 1000000 ))
smi=$(nvidia-smi --query-gpu=index,uuid,memory.total --format=csv,noheader,nounits)
echo "nvidia-smi:"; echo "$smi" | sed 's/^/  /'
$PY - "$report" "$smi" "$ms" <<'PYEOF'
import json, sys
report = json.load(open(sys.argv[1]))
smi = {}
for line in sys.argv[2].splitlines():
    idx, uuid, total = [p.strip() for p in line.split(",")]
    smi[int(idx)] = (uuid, int(total) * 1024 * 1024)
gpus, driver, pinned = report["gpus"], report["gpu_driver"], report["memlock"]["pinned_probe"]
print(f"oomguard: {len(gpus)} visible GPU(s) via {driver['source']}, driver {driver['driver_version']}, "
      f"CUDA {driver['cuda_version']}, check took {sys.argv[3]} ms (with the pinned probe)")
problems = []
for g in gpus:
    uuid, total = smi.get(g["index"], (None, None))
    same = uuid == g["uuid"] and total == g["memory_total_bytes"]
    print(f"  GPU {g['index']} {g['name']}: total {g['memory_total_bytes']} vs nvidia-smi {total}: "
          f"{'same' if same else 'DIFFERENT'}; free {g['memory_free_bytes']}")
    if not same:
        problems.append(f"GPU {g['index']} differs from nvidia-smi")
if not gpus:
    problems.append("no GPU in the report")
print(f"  pinned probe (cudaHostAlloc 1 GiB): {pinned}")
charged = pinned.get("charged") or {}
# Where CUDA's pinned memory is charged (docs/plan.md): expected RssShmem and the cgroup's shmem
# up by 1 GiB, VmLck flat (MakazhanAlpamys/Soup#655). Recorded, not judged: this settles the rule.
print(f"  charged while held: VmLck {charged.get('vm_lck_bytes')} B, RssShmem {charged.get('rss_shmem_bytes')} B, "
      f"cgroup shmem {charged.get('cgroup_shmem_bytes')} B ({charged.get('cgroup_stat_file')})")
if pinned["skipped"]:
    problems.append("pinned probe skipped: " + pinned["skipped"])
elif not pinned["ok"]:
    problems.append("cudaHostAlloc of 1 GiB failed: " + str(pinned["error"]))
warnings = [w["code"] for w in report["warnings"]]
print(f"  warnings: {warnings}")
print("VERDICT: " + ("PASS" if not problems else "FAIL (" + "; ".join(problems) + ")"))
sys.exit(1 if problems else 0)
PYEOF
