#!/usr/bin/env bash
# The GPU checks of a session with a lent CUDA machine, in one go: the CUDA tests, then
# bench_gpu.py and bench_host.py, then bench_soft_sort.py (torchsort, pytopk and difftopk as peers
# where importable).
#
#   benchmarks/run_gpu.sh OUT [tests] [bench] [sort]   # from the repository root; all phases by default
#
# tests writes OUT/tests.log; bench OUT/gpu.{json,md} and OUT/host.md; sort OUT/soft_sort_cuda.md. A peer built
# on the machine (torchsort compiles a CUDA extension) can be built between the phases.
# PYTHON picks the interpreter (default python3, the one that holds a CUDA torch), WORKERS the
# test processes (default 4); SOFTTOPK_COMMIT names the commit of a copied tree (its .git may be an
# older one's). The code measured is this checkout's src/; bench_gpu.py logs each case as it
# starts, so a case that hangs shows in the log.
set -u -o pipefail
out=${1:?usage: benchmarks/run_gpu.sh OUT [tests] [bench] [sort]}
phases=" ${*:2} "
[[ $phases == "  " ]] && phases=" tests bench sort "
py=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
"$py" -c "import torch, triton; print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'triton', triton.__version__)"
if [[ $phases == *" tests "* ]]; then
    "$py" -m pytest -q -p no:cacheprovider -n "${WORKERS:-4}" -rs tests/test_cuda.py tests/test_lapsum_triton.py \
        tests/test_sparse_triton.py tests/test_networks_triton.py tests/test_neuralsort_triton.py tests/test_svm_triton.py \
        tests/test_softsort_triton.py tests/test_pav_triton.py tests/test_permutahedron_triton.py tests/test_label_select_triton.py tests/test_ce_head_triton.py tests/test_noised_triton.py tests/test_topk_ce_triton.py \
        tests/test_operators.py tests/test_networks.py tests/test_perturbed.py \
        -k "cuda or _triton" \
        2>&1 | tee "$out/tests.log"
fi
if [[ $phases == *" bench "* ]]; then
    "$py" benchmarks/bench_gpu.py --device cuda --out "$out/gpu.json"
    "$py" benchmarks/bench_host.py --device cuda --out "$out/host.md"
fi
if [[ $phases == *" sort "* ]]; then
    "$py" benchmarks/bench_soft_sort.py --device cuda --sizes 100 1000 10000 100000 --out "$out/soft_sort_cuda.md"
fi
