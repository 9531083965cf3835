#!/usr/bin/env bash
# One-go check on a GPU machine (no network, no real SmolLM2 weights): environment, deep-embedding
# throughput, extraction single process vs torchrun, curate's collectives on the GPU's backend (one rank on the
# ranks' path: equal to one process, a type clash refused, a stopped run resumed, counting only), k-means
# backends, the device/torchrun tests.
#
#     make setup model corpus && OUT=gpu_out bash benchmarks/gpu_check.sh   # from the repo root, ~10 min on an H200
#     GPU_CHECK_DEADLINE_S=340 OUT=... bash benchmarks/gpu_check.sh      # a machine lent for minutes: later steps skipped
#     GPU_CHECK_DEVICE=cpu GPU_CHECK_SMALL=1 OUT=/tmp/gpuout bash benchmarks/gpu_check.sh   # CPU dry run, tiny sizes
#     GPU_CHECK_ONLY='env|model|curate_.*' OUT=... bash benchmarks/gpu_check.sh   # only the steps named (a regex)
#
# Reads the model's small files (config.json, tokenizer files) from demo/SmolLM2-135M (`make model`) or
# from demo/smollm2_files/ (a copy of them alone, for a machine the 257 MB weights cannot reach), and
# demo/stdlib.jsonl (`make corpus`; else a corpus is cut from this Python's standard library). The model
# is built here with random weights (bf16 safetensors): throughput is measured, not embedding quality.
# PY: the Python to use (default .venv/bin/python where it exists, else python3).
# GPU_CHECK_SITE=DIR: packages installed with `pip install --target DIR` (a machine without the project's
# venv); the script then writes DIR into zz_gpu_check_site.pth in that Python's site folder so the tests'
# subprocesses see them too, and leaves it there (delete it afterwards).
#
# Every step has its own timeout (also cut to what is left of GPU_CHECK_DEADLINE_S, default: none), a
# failing step is recorded and the next one runs. Writes to $OUT: gpu_check.log (everything),
# gpu_check_summary.json (each step's exit code and seconds, plus every result), env.json, deep_512.json,
# batch_sizes.json, deep_2048.json, extract_compare.json, curate_compare.json, curate_kept_compare.json,
# curate_counts_compare.json, curate_chat_compare.json, cluster.json.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
ROOT=$PWD
: "${OUT:?set OUT to the folder the results go to}"
if [[ -z ${PY:-} ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
DEVICE=${GPU_CHECK_DEVICE:-cuda}
SMALL=${GPU_CHECK_SMALL:-0}
DEADLINE=${GPU_CHECK_DEADLINE_S:-0}  # no step runs past this many seconds from the start (0: no deadline)
WORK=${GPU_CHECK_WORK:-/tmp/gpu_check}
ONLY=${GPU_CHECK_ONLY:-}  # an extended regex of step names: the other steps are skipped (e.g. 'env|model|curate_.*')
# Where the missing wheels were installed with pip --target (e.g. /tmp/site): written into a .pth file of
# this Python's site folder so the tests' subprocesses see them too. Only where asked: it changes that Python.
SITE=${GPU_CHECK_SITE:-}
# The small files only (the weights are random): a copy that travels without the 257 MB safetensors, or
# the model folder `make model` writes, where it is here.
MODEL_FILES=${GPU_CHECK_MODEL_FILES:-demo/smollm2_files}
[[ -d $MODEL_FILES || ! -d demo/SmolLM2-135M ]] || MODEL_FILES=demo/SmolLM2-135M
CORPUS=${GPU_CHECK_CORPUS:-demo/stdlib.jsonl}
PYTEST_STOP=${GPU_CHECK_PYTEST_STOP:---maxfail=25}  # -x to stop at the first failure
TESTS=${GPU_CHECK_TESTS:-tests/test_deep.py tests/test_distributed.py tests/test_embed.py tests/test_clustering.py tests/test_formats.py::test_torchrun_on_parquet_equals_single_process}
if [[ $SMALL == 1 ]]; then
  DEEP_DOCS=24 DEEP_DOCS_LONG=12 EXTRACT_DOCS=40 CLUSTER_N=20000 TINY=--tiny BS_LIMIT="--limit 40"
else
  # On an H200 the one-document-at-a-time path is bound by kernel launches (~30 layers): ~10 ms a
  # document, so 2000 documents ~20-30 s; the batched path takes a few seconds of that.
  DEEP_DOCS=2000 DEEP_DOCS_LONG=1200 EXTRACT_DOCS=2000 CLUSTER_N=1000000 TINY= BS_LIMIT=
fi
DEEP_DOCS=${GPU_CHECK_DEEP_DOCS:-$DEEP_DOCS}
DEEP_DOCS_LONG=${GPU_CHECK_DEEP_DOCS_LONG:-$DEEP_DOCS_LONG}
EXTRACT_DOCS=${GPU_CHECK_EXTRACT_DOCS:-$EXTRACT_DOCS}
CLUSTER_N=${GPU_CHECK_CLUSTER_N:-$CLUSTER_N}

mkdir -p "$OUT" "$WORK"
rm -rf "${WORK:?}"/*
STEPS=$WORK/steps.tsv
: > "$STEPS"
LOG=$OUT/gpu_check.log
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false MPLBACKEND=Agg
export DIVERSITY_ORDER_CACHE_DIR=$WORK/registry PYTHONUNBUFFERED=1
unset DIVERSITY_ORDER_SMOLLM2  # tests that need the real model skip
T0=$(date +%s)
HELP=benchmarks/gpu_check_helpers.py
MODEL=$WORK/model

# step NAME LIMIT CMD...: run CMD under timeout (LIMIT, or what is left before DEADLINE), record rc and seconds.
# SIG=INT step ...: the timeout interrupts (pytest then still prints its counts and writes its report).
step() {
  local name=$1 limit=$2
  shift 2
  local left=$((DEADLINE - ($(date +%s) - T0)))
  if [[ -n $ONLY && ! $name =~ ^($ONLY)$ ]]; then
    printf '%s\tskipped\t0\n' "$name" >> "$STEPS"
    return 0
  fi
  ((DEADLINE > 0 && limit > left)) && limit=$left
  if ((DEADLINE > 0 && limit < 15)); then
    echo "=== [$name] SKIPPED: $left s left before the ${DEADLINE} s deadline"
    printf '%s\tskipped\t0\n' "$name" >> "$STEPS"
    return 0
  fi
  echo "=== [$name] $(date +%T) (t+$(($(date +%s) - T0)) s, timeout ${limit} s): $*"
  local started=$(date +%s.%N)
  timeout -s "${SIG:-TERM}" -k 15 "$limit" "$@"
  local rc=$?
  local seconds=$(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
  ((rc == 124 || rc == 137)) && echo "=== [$name] TIMED OUT after ${limit} s"
  echo "=== [$name] rc=$rc in ${seconds} s"
  printf '%s\t%s\t%s\n' "$name" "$rc" "$seconds" >> "$STEPS"
  return 0
}

main() {
  echo "gpu_check: device=$DEVICE small=$SMALL python=$PY deadline=${DEADLINE}s work=$WORK out=$OUT"
  # Tests start subprocesses with PYTHONPATH=<repo root>: the wheels installed with --target must be
  # found without PYTHONPATH too.
  if [[ -n $SITE && -d $SITE ]]; then
    step site_pth 30 "$PY" "$HELP" site-pth "$SITE"
  fi

  # 1. The machine.
  if command -v nvidia-smi > /dev/null; then
    step nvidia_smi 20 nvidia-smi
  fi
  step env 60 bash -c "'$PY' '$HELP' info | tee '$OUT/env.json'"

  # 2. A SmolLM2-135M-shaped model with random weights.
  step model 90 "$PY" "$HELP" model "$MODEL_FILES" "$MODEL" $TINY
  if [[ ! -s $CORPUS ]]; then
    echo "$CORPUS not here: cutting a corpus from this Python's standard library"
    CORPUS=$WORK/corpus.jsonl
    step corpus 60 "$PY" "$HELP" corpus "$CORPUS" --docs 5000
  fi
  echo "corpus: $CORPUS ($(wc -l < "$CORPUS") documents)"

  # 3. Deep-embedding throughput: batched extraction vs one document at a time (512 tokens).
  step deep_512 150 bash -c "'$PY' benchmarks/bench_deep.py --device '$DEVICE' --model '$MODEL' --corpus '$CORPUS' \
    --docs $DEEP_DOCS --max-tokens 512 > '$WORK/deep_512.txt' && '$PY' '$HELP' json-tail '$WORK/deep_512.txt' '$OUT/deep_512.json'"

  # 3a. The batch-size cap on a GPU: the whole corpus at 512 tokens, the batches' own rate per --batch-size
  #     (on an H200 64 gave 112-174K tokens/s, 1024, now the GPU default, 389-415K; 4096 less again).
  local bs logs=()
  for bs in ${GPU_CHECK_BATCH_SIZES:-64 256 1024}; do
    mkdir -p "$WORK/bs_$bs"
    step "batch_size_$bs" 120 bash -c "env DIVERSITY_ORDER_CACHE_DIR='$WORK/bs_$bs' '$PY' extract_deep_embeddings.py \
      --input '$CORPUS' --model-dir '$MODEL' --device '$DEVICE' --max-tokens 512 --batch-size $bs $BS_LIMIT --no-progress \
      --output '$WORK/bs_$bs/e.npy' 2> '$WORK/bs_$bs/log'; tail -1 '$WORK/bs_$bs/log'"
    logs+=("$bs" "$WORK/bs_$bs/log")
  done
  step batch_sizes 20 "$PY" "$HELP" batch-rates "$OUT/batch_sizes.json" "${logs[@]}"

  # 4. extract_deep_embeddings.py: one process, torchrun with 1 process (WORLD_SIZE=1: no process group
  #    is joined, the single-process path), and torchrun with the group forced (NCCL on CUDA, gloo on CPU).
  local args="--input $CORPUS --model-dir $MODEL --device $DEVICE --limit $EXTRACT_DOCS --max-tokens 512 --no-progress"
  mkdir -p "$WORK/x_single" "$WORK/x_torchrun" "$WORK/x_forced"
  step extract_single 90 env DIVERSITY_ORDER_CACHE_DIR="$WORK/x_single" \
    "$PY" extract_deep_embeddings.py $args --output "$WORK/x_single/e.npy"
  step extract_torchrun1 120 env DIVERSITY_ORDER_CACHE_DIR="$WORK/x_torchrun" \
    "$PY" -m torch.distributed.run --standalone --nproc_per_node 1 extract_deep_embeddings.py $args \
    --output "$WORK/x_torchrun/e.npy"
  step extract_torchrun1_pg 120 env DIVERSITY_ORDER_CACHE_DIR="$WORK/x_forced" \
    "$PY" -m torch.distributed.run --standalone --nproc_per_node 1 "$HELP" forced-pg -- $args \
    --output "$WORK/x_forced/e.npy"
  step extract_compare 30 "$PY" "$HELP" compare "$OUT/extract_compare.json" \
    "$WORK/x_single/e.npy" "$WORK/x_torchrun/e.npy" "$WORK/x_forced/e.npy"

  # 4b. curate_dataset.py, JSONL in, 2 Parquet shards out: one process against torchrun with the group forced
  #     (every collective of a multi-rank run, on NCCL: the Parquet columns gathered at indexing, labels and
  #     counts to rank 0, the order broadcast, each rank writing its shard); then records Parquet cannot hold
  #     must stop that run with one error line, the rank's exit 2, before embedding (torchrun's own report follows).
  local cargs="--input $CORPUS --model-dir $MODEL --device $DEVICE --output-format parquet --output-shards 2 \
    --seq-len 4096 16384 --compare-strategies --no-plot --no-progress"
  mkdir -p "$WORK/c_single" "$WORK/c_forced" "$WORK/c_clash"
  step curate_single 150 env DIVERSITY_ORDER_CACHE_DIR="$WORK/c_single" \
    "$PY" curate_dataset.py $cargs --output "$WORK/c_single/out.parquet"
  step curate_torchrun1_pg 150 env DIVERSITY_ORDER_CACHE_DIR="$WORK/c_forced" \
    "$PY" -m torch.distributed.run --standalone --nproc_per_node 1 "$HELP" forced-pg --curate -- $cargs \
    --output "$WORK/c_forced/out.parquet"
  step curate_compare 60 "$PY" "$HELP" compare-curated "$OUT/curate_compare.json" \
    "$WORK/c_single/out.parquet" "$WORK/c_forced/out.parquet"
  "$PY" -c "import json; print('\n'.join(json.dumps({'text': f'record {i}', 'e': i if i < 30 else str(i)}) for i in range(40)))" \
    > "$WORK/c_clash/clash.jsonl"
  step curate_clash_pg 90 bash -c "env DIVERSITY_ORDER_CACHE_DIR='$WORK/c_clash' '$PY' -m torch.distributed.run \
    --standalone --nproc_per_node 1 '$HELP' forced-pg --curate -- --input '$WORK/c_clash/clash.jsonl' \
    --model-dir '$MODEL' --device '$DEVICE' --n-clusters 2 --output '$WORK/c_clash/out.parquet' --no-plot --no-progress \
    2> '$WORK/c_clash/err'; rc=\$?; cat '$WORK/c_clash/err'; echo \"exit \$rc\"; [[ \$rc != 0 ]] && \
    grep -q '^error: .*cannot be one Parquet table' '$WORK/c_clash/err' && grep -q 'exitcode *: 2 ' '$WORK/c_clash/err' && \
    ! sed '/elastic.multiprocessing.api/,\$d' '$WORK/c_clash/err' | grep -q Traceback"

  # 4c. The same run stopped by SIGTERM to torchrun while embedding (a scheduler's preemption), then again: the rerun
  #     takes the rows kept and must end with the one-process run's files; then counting only (--load-embeddings of
  #     that run's vectors), which adds a barrier on the backend.
  mkdir -p "$WORK/c_kept" "$WORK/c_ext"
  step curate_stopped_pg 150 bash -c "env DIVERSITY_ORDER_CACHE_DIR='$WORK/c_kept' '$PY' -m torch.distributed.run \
    --standalone --nproc_per_node 1 '$HELP' forced-pg --curate --stop-at-batch 3 -- $cargs --embed-batch-size 256 \
    --output '$WORK/c_kept/out.parquet' 2> '$WORK/c_kept/stopped.log'; tail -3 '$WORK/c_kept/stopped.log'; \
    grep -q 'the rows the ranks embedded so far are kept in' '$WORK/c_kept/stopped.log'"
  step curate_resumed_pg 150 bash -c "env DIVERSITY_ORDER_CACHE_DIR='$WORK/c_kept' '$PY' -m torch.distributed.run \
    --standalone --nproc_per_node 1 '$HELP' forced-pg --curate -- $cargs --output '$WORK/c_kept/out.parquet' \
    2> '$WORK/c_kept/resumed.log' && grep 'kept by an interrupted torchrun run\|Embedding .* record(s) of' '$WORK/c_kept/resumed.log'"
  step curate_kept_compare 60 "$PY" "$HELP" compare-curated "$OUT/curate_kept_compare.json" \
    "$WORK/c_single/out.parquet" "$WORK/c_kept/out.parquet"
  step curate_counts_pg 150 env DIVERSITY_ORDER_CACHE_DIR="$WORK/c_ext" \
    "$PY" -m torch.distributed.run --standalone --nproc_per_node 1 "$HELP" forced-pg --curate -- $cargs \
    --load-embeddings "$WORK/c_single/out_embeddings.npy" --output "$WORK/c_ext/out.parquet"
  step curate_counts_compare 60 "$PY" "$HELP" compare-curated "$OUT/curate_counts_compare.json" \
    "$WORK/c_single/out.parquet" "$WORK/c_ext/out.parquet"

  # 4d. Conversations (--text-field messages) whose last quarter names its roles human/gpt: the roles counted
  #     at indexing travel in each rank's part of the index (gathered on the backend); the warning must name
  #     them with the first such record, and the files must equal one process's.
  mkdir -p "$WORK/c_chat"
  "$PY" "$HELP" chat-corpus "$CORPUS" "$WORK/c_chat/chat.jsonl" --docs "${GPU_CHECK_CHAT_DOCS:-600}"
  local chat="--input $WORK/c_chat/chat.jsonl --text-field messages --model-dir $MODEL --device $DEVICE \
    --output-format parquet --output-shards 2 --seq-len 4096 --no-plot --no-progress"
  local roles="grep \"roles other than .*'human' in .* (the first: .*chat.jsonl:$((${GPU_CHECK_CHAT_DOCS:-600} * 3 / 4 + 1)))\""
  step curate_chat_single 150 bash -c "env DIVERSITY_ORDER_CACHE_DIR='$WORK/c_chat/r1' '$PY' curate_dataset.py $chat \
    --output '$WORK/c_chat/single.parquet' 2> '$WORK/c_chat/single.log' && $roles '$WORK/c_chat/single.log'"
  step curate_chat_pg 150 bash -c "env DIVERSITY_ORDER_CACHE_DIR='$WORK/c_chat/r2' '$PY' -m torch.distributed.run \
    --standalone --nproc_per_node 1 '$HELP' forced-pg --curate -- $chat --output '$WORK/c_chat/ranks.parquet' \
    2> '$WORK/c_chat/ranks.log' && $roles '$WORK/c_chat/ranks.log'"
  step curate_chat_compare 60 "$PY" "$HELP" compare-curated "$OUT/curate_chat_compare.json" \
    "$WORK/c_chat/single.parquet" "$WORK/c_chat/ranks.parquet"

  # 5. The tests that touch devices and torchrun (the real-model ones are marked slow and skip).
  local xdist=""
  if "$PY" -c "import xdist" 2> /dev/null; then
    xdist="-n ${GPU_CHECK_PYTEST_WORKERS:-8}"
  fi
  # GPU_CHECK_PYTEST_CPU=1 hides the GPU from the tests (CUDA_VISIBLE_DEVICES=""): runs whose --device
  # is auto (the torchrun curate tests) then take the CPU, as on a machine without one.
  local hide=()
  [[ ${GPU_CHECK_PYTEST_CPU:-0} == 1 ]] && hide=(env CUDA_VISIBLE_DEVICES=)
  SIG=INT step pytest "${GPU_CHECK_PYTEST_TIMEOUT:-240}" ${hide[@]+"${hide[@]}"} "$PY" -m pytest -q $PYTEST_STOP -p no:cacheprovider -m "not slow" $xdist \
    --junitxml="$WORK/pytest.xml" $TESTS

  # 6. k-means: scikit-learn MiniBatchKMeans (CPU) vs the torch backend on $DEVICE, CLUSTER_N x 576, k=30.
  step cluster_base 30 "$PY" "$HELP" cluster-base "$WORK/base.npy"
  step cluster 150 "$PY" benchmarks/bench_cluster.py --n "$CLUSTER_N" --k 30 --embeddings "$WORK/base.npy" \
    --backends sklearn torch --device "$DEVICE" --out "$OUT/cluster.json"

  # 3b. Longer documents, if time is left.
  step deep_2048 120 bash -c "'$PY' benchmarks/bench_deep.py --device '$DEVICE' --model '$MODEL' --corpus '$CORPUS' \
    --docs $DEEP_DOCS_LONG --max-tokens 2048 > '$WORK/deep_2048.txt' && '$PY' '$HELP' json-tail '$WORK/deep_2048.txt' '$OUT/deep_2048.json'"

  echo "=== summary (t+$(($(date +%s) - T0)) s)"
  "$PY" "$HELP" summary "$OUT" "$STEPS" "$WORK/pytest.xml"
}

main 2>&1 | tee "$LOG"
exit "${PIPESTATUS[0]}"
